"""Pinned scalar routines exported through the C ABI: Philox4x32-10, the uniform fill built on
it, and the float32 bias correction 1 - base**t.

Contract under test: Philox matches Random123's known answers and a pure-Python Philox; a
uniform fill is a pure function of (seed, stream, index) -- offsets and thread counts do not
matter -- with values in the closed [low, high] (native/contracts/random.md: the last rounding
can reach high); mt_one_minus_pow is within 1 ulp of the exact rational
(measured here: correctly rounded in every case tried).
"""
import random
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mojo_train._native import ffi

from _helpers import EINVAL, bits, f32, round_f32, ulps_apart

M32 = 0xFFFFFFFF


def philox_py(counter, key):
    """Philox4x32-10 in pure Python (Salmon et al. 2011, Random123's round constants)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _ in range(10):
        p0 = 0xD2511F53 * c0
        p1 = 0xCD9E8D57 * c2
        c0, c1, c2, c3 = ((p1 >> 32) ^ c1 ^ k0, p1 & M32, (p0 >> 32) ^ c3 ^ k1, p0 & M32)
        k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
    return [c0, c1, c2, c3]


def philox(lib, counter, key):
    out = ffi.new("uint32_t[4]")
    assert lib.mt_philox4x32_10(out, ffi.new("uint32_t[4]", counter), ffi.new("uint32_t[2]", key)) == 0
    return list(out)


def word_py(seed, stream, i):
    """The stream's element i, as mt_pinned.h defines it."""
    block = i >> 2
    ctr = [block & M32, block >> 32, stream & M32, stream >> 32]
    return philox_py(ctr, [seed & M32, seed >> 32])[i & 3]


def fill(lib, n, seed=0, stream=0, offset=0, low=0.0, high=1.0):
    out = ffi.new("float[]", max(n, 1))
    rc = lib.mt_uniform_fill(out, seed, stream, offset, low, high, n)
    assert rc == 0, ffi.string(lib.mt_last_error())
    return bytes(ffi.buffer(out, 4 * n))


def floats(raw):
    return memoryview(raw).cast("f").tolist()


def one_minus_pow(lib, base, t):
    out = ffi.new("float[1]")
    rc = lib.mt_one_minus_pow(out, base, t)
    assert rc == 0, ffi.string(lib.mt_last_error())
    return out[0]


@pytest.fixture
def random_lib(mode):
    if not mode.has("random"):
        pytest.skip("no Philox in this library")
    return mode.backend.lib


# ---- Philox4x32-10 --------------------------------------------------------------------------

KNOWN_ANSWERS = [
    ([0, 0, 0, 0], [0, 0], [0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8]),
    ([M32] * 4, [M32, M32], [0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD]),
    ([0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344], [0xA4093822, 0x299F31D0],
     [0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1]),
]


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS, ids=["zeros", "ones", "pi"])
def test_philox_matches_random123_known_answers(random_lib, counter, key, expected):
    assert philox(random_lib, counter, key) == expected
    assert philox_py(counter, key) == expected


@settings(max_examples=200, deadline=None)
@given(counter=st.lists(st.integers(0, M32), min_size=4, max_size=4),
       key=st.lists(st.integers(0, M32), min_size=2, max_size=2))
def test_philox_matches_a_pure_python_philox(counter, key):
    from mojo_train._native import load
    assert philox(load("identical").lib, counter, key) == philox_py(counter, key)


def test_philox_refuses_null_pointers_and_writes_nothing(random_lib):
    out = ffi.new("uint32_t[4]", [7, 7, 7, 7])
    assert random_lib.mt_philox4x32_10(out, ffi.NULL, ffi.new("uint32_t[2]")) == EINVAL
    assert b"counter" in ffi.string(random_lib.mt_last_error())
    assert list(out) == [7, 7, 7, 7]


# ---- uniform fill -----------------------------------------------------------------------------

@pytest.mark.parametrize("low, high", [(0.0, 1.0), (-1.0, 1.0), (-3.5, -3.25), (1e-3, 2e3), (-1e6, 1e6)])
def test_uniform_fill_values_lie_in_the_closed_range_low_high(random_lib, low, high):
    values = floats(fill(random_lib, 100_000, seed=11, stream=3, low=low, high=high))
    assert min(values) >= f32(low) and max(values) <= f32(high)
    assert len(set(values)) > 1000 or high - low < 1.0


def test_uniform_fill_is_the_stated_map_of_the_philox_stream(identical):
    """identical numeric mode: element i is low + (high - low) * (word_i >> 8) * 2**-24, each rounded."""
    lib = identical.backend.lib
    seed, stream, offset, low, high = 2**40 + 5, 2**33 + 9, 2**34 - 3, -0.75, 2.5
    got = floats(fill(lib, 64, seed, stream, offset, low, high))
    width = f32(high - low)
    want = [f32(low + f32(width * ((word_py(seed, stream, offset + i) >> 8) * 2.0**-24))) for i in range(64)]
    assert got == want


@pytest.mark.parametrize("offset", [1, 3, 4, 1000, 65537])
def test_uniform_fill_at_an_offset_equals_the_slice_of_a_longer_fill(random_lib, offset):
    long = fill(random_lib, 200_000, seed=5, stream=2, low=-2.0, high=3.0)
    part = fill(random_lib, 100_000, seed=5, stream=2, offset=offset, low=-2.0, high=3.0)
    assert part == long[4 * offset:4 * offset + 400_000]


def test_uniform_fill_streams_and_seeds_are_different_sequences(random_lib):
    base = fill(random_lib, 1000, seed=1, stream=0)
    assert fill(random_lib, 1000, seed=1, stream=1) != base
    assert fill(random_lib, 1000, seed=2, stream=0) != base
    assert fill(random_lib, 1000, seed=1, stream=0) == base


def test_uniform_fill_does_not_depend_on_the_thread_count(mode):
    if not (mode.has("random") and mode.has("threads")):
        pytest.skip("needs Philox and a thread pool")
    lib = mode.backend.lib
    before = lib.mt_num_threads()
    try:
        results = []
        for n_threads in (1, 2, 3):
            assert lib.mt_set_num_threads(n_threads) == 0
            assert lib.mt_num_threads() == n_threads
            results.append(fill(lib, 1 << 20, seed=99, stream=7, offset=13, low=-1.0, high=1.0))
    finally:
        assert lib.mt_set_num_threads(before) == 0
    assert results[0] == results[1] == results[2]


def test_uniform_fill_reaches_high_where_the_sum_rounds_up_as_the_contract_states(identical):
    """random.md: the range is the closed [low, high]. Philox word ffffff45 sits at index
    9320226 of (seed 0, stream 0): 1 + (1 - 2**-24) rounds (to even) to 2.0 exactly; in
    [2**24 - 1, 2**24) every draw >= 0.5 rounds to 2**24."""
    lib = identical.backend.lib
    assert word_py(0, 0, 9320226) >> 8 == 0xFFFFFF
    assert floats(fill(lib, 1, seed=0, stream=0, offset=9320226, low=1.0, high=2.0)) == [2.0]
    values = floats(fill(lib, 1000, low=16777215.0, high=16777216.0))
    assert set(values) == {16777215.0, 16777216.0}


@pytest.mark.parametrize("low, high, n", [(1.0, 1.0, 4), (2.0, 1.0, 4), (float("nan"), 1.0, 4),
                                          (0.0, float("inf"), 4), (-3e38, 3e38, 4), (0.0, 1.0, -1)])
def test_uniform_fill_refuses_bad_arguments_and_writes_nothing(random_lib, low, high, n):
    out = ffi.new("float[4]", [9.0] * 4)
    assert random_lib.mt_uniform_fill(out, 0, 0, 0, low, high, n) == EINVAL
    assert ffi.string(random_lib.mt_last_error())
    assert list(out) == [9.0] * 4


# ---- 1 - base**t --------------------------------------------------------------------------------

def exact_one_minus_pow(base, t):
    """The float32 nearest 1 - base**t for the float32 ``base``; exact rationals while they
    stay small, else 80 significant decimal digits (far finer than any float32 midpoint)."""
    if t <= 20000:
        return round_f32(1 - Fraction(base) ** t)
    with localcontext() as ctx:
        ctx.prec = 80
        return round_f32(Fraction(1 - Decimal(base) ** t))


BETAS = (0.9, 0.999, 0.95, 0.5)
STEPS = tuple(range(1, 11)) + (100, 1000, 4321, 10000, 10**6, 10**9, 2**62)


def test_one_minus_pow_is_within_one_ulp_and_correctly_rounded_for_the_usual_betas(mode):
    lib = mode.backend.lib
    cases = [(f32(b), t) for b in BETAS + (0.99, 0.9999, 0.9999999) for t in STEPS]
    off = []
    for base, t in cases:
        got, want = one_minus_pow(lib, base, t), exact_one_minus_pow(base, t)
        assert ulps_apart(got, want) <= 1, (base, t, got, want)
        if got != want:
            off.append((base, t, got, want))
    assert len(off) <= len(cases) // 100, off


def test_one_minus_pow_is_correctly_rounded_over_a_sweep_of_steps_and_bases(mode):
    lib = mode.backend.lib
    rng = random.Random(3)
    bases = [f32(b) for b in BETAS] + [f32(rng.uniform(0.5, 1.0)) for _ in range(6)]
    total, off = 0, []
    for base in bases:
        num, den = Fraction(base).as_integer_ratio()
        pn, pd = 1, 1
        for t in range(1, 301):
            pn, pd = pn * num, pd * den
            got, want = one_minus_pow(lib, base, t), round_f32(1 - Fraction(pn, pd))
            assert ulps_apart(got, want) <= 1, (base, t, got, want)
            total += 1
            if got != want:
                off.append((base, t))
    assert len(off) <= total // 100, off


@pytest.mark.parametrize("base, t, want", [(0.9, 0, 0.0), (0.0, 5, 1.0), (1.0, 7, 0.0), (0.5, 1, 0.5),
                                           (-0.5, 3, 1.125), (0.5, 2**63 - 1, 1.0)])
def test_one_minus_pow_edge_values(mode, base, t, want):
    assert bits(one_minus_pow(mode.backend.lib, base, t)) == bits(want)


def test_one_minus_pow_never_reports_success_with_a_nan(mode):
    """A base above 1 overflows: the answer is -inf (correctly rounded) or a refusal, never NaN."""
    lib = mode.backend.lib
    out = ffi.new("float[1]", [5.0])
    rc = lib.mt_one_minus_pow(out, 2.0, 200)
    assert (rc != 0 and out[0] == 5.0) or (rc == 0 and out[0] == float("-inf")), (rc, out[0])


@pytest.mark.parametrize("base, t", [(float("nan"), 1), (float("inf"), 1), (0.9, -1)])
def test_one_minus_pow_refuses_bad_arguments(mode, base, t):
    out = ffi.new("float[1]", [5.0])
    assert mode.backend.lib.mt_one_minus_pow(out, base, t) == EINVAL
    assert out[0] == 5.0
    assert ffi.string(mode.backend.lib.mt_last_error())
