"""Generator: Philox draws, Box-Muller normals, initializers and dropout (native/contracts/random.md).

Contract under test: a value is a pure function of (seed, stream, stream element) -- the same
bytes for any thread count, launch geometry, call or split of a draw into pieces at matching
offsets; every draw takes one stream id from the counter, and a refused call takes none;
normals are Box-Muller of the stated words (u1 in (0, 1], element 2j the cosine, 2j + 1 the
sine) through the pinned sin/cos of pi*x, whose error is within the stated 0.549 ulp; dropout
keeps element i iff the uniform of stream element offset + i is >= p (exactly the value
Generator.uniform draws there), scales by float32 1 / (1 - p), writes +0.0 where it drops,
and its backward replays the mask from the key; initializer bounds are torch.nn.init's.

Statistical checks use fixed seeds, so they are deterministic; their bounds are 5 sigma of
the sampling distribution (a correct generator passes them with probability ~1 - 6e-7 for a
fresh seed, and the seeds here were not chosen).
"""
import array
import math
import os
import subprocess

import pytest

import mojo_train
from mojo_train import DeviceArray
from mojo_train._native import ffi
from mojo_train.random import DropoutKey, Generator

from _helpers import c_compiler, EINVAL, portable_calls, REPO, bits, f32, f32_array, from_bits, raw

INCLUDE = os.path.join(REPO, "native", "include")
SINCOS_BOUND = 0.549   # ulp, random.md


def floats(a):
    return array.array("f", raw(a))


def host(a):
    return a.to_host() if isinstance(a, DeviceArray) else a


# ---- the generator's state --------------------------------------------------------------
def test_every_draw_takes_one_stream_and_a_named_stream_takes_none(random_mode):
    g = Generator(7, numeric_mode=random_mode.numeric_mode)
    g.uniform(3)
    g.normal(3)
    g.kaiming_uniform((2, 2), fan_in=2)
    g.dropout(array.array("f", [1.0, 2.0]), 0.5)
    assert g.counter == 4
    assert g.next_stream() == 4 and g.counter == 5
    g.normal(3, stream=99)
    g.dropout(array.array("f", [1.0]), 0.5, stream=123)
    assert g.state_dict() == {"seed": 7, "counter": 5}


def test_a_draw_is_the_draw_of_its_stream_id(random_identical):
    g = Generator(11, numeric_mode=random_identical.numeric_mode)
    first, second = g.normal(100), g.normal(100)
    again = Generator(11, numeric_mode=random_identical.numeric_mode)
    assert raw(again.normal(100, stream=1)) == raw(second)
    assert raw(again.normal(100, stream=0)) == raw(first)
    assert raw(first) != raw(second)


def test_state_dict_round_trip_resumes_the_same_draws(random_identical):
    g = Generator(2**64 - 1, numeric_mode=random_identical.numeric_mode)
    g.normal(10)
    state = g.state_dict()
    expected = raw(g.normal(1000)), raw(g.uniform(77))
    h = Generator(0, numeric_mode=random_identical.numeric_mode)
    h.load_state_dict(state)
    assert (raw(h.normal(1000)), raw(h.uniform(77))) == expected


@pytest.mark.parametrize("seed, exc", [(-1, ValueError), (2**64, ValueError), (1.0, TypeError), (True, TypeError),
                                       ("1", TypeError), (None, TypeError)])
def test_the_seed_is_refused_by_name_outside_uint64(seed, exc):
    with pytest.raises(exc, match=r"Generator: seed"):
        Generator(seed)


@pytest.mark.parametrize("state", [{"seed": 1}, {"seed": 1, "counter": -1}, {"seed": 1, "counter": 2**64},
                                   {"seed": 1.5, "counter": 0}, {"seed": 1, "counter": 0, "extra": 1}, [1, 2]])
def test_load_state_dict_refuses_bad_state_and_changes_nothing(state):
    g = Generator(5)
    g.next_stream()
    with pytest.raises((ValueError, TypeError), match=r"load_state_dict"):
        g.load_state_dict(state)
    assert g.state_dict() == {"seed": 5, "counter": 1}


# ---- determinism --------------------------------------------------------------------------
def _draws(g, n):
    x = f32_array(n, 3, -2.0, 2.0)
    y, key = g.dropout(x, 0.3, offset=5)
    return [raw(g.normal(n, offset=3)), raw(g.uniform(n)), raw(g.kaiming_normal(n, fan_in=9)), raw(y),
            raw(g.dropout_backward(x, key))]


def test_the_bytes_do_not_depend_on_the_thread_count_or_launch_geometry(random_mode):
    lib = random_mode.backend.lib
    n = 2**18 + 7
    before = lib.mt_num_threads()   # threads per block (cpu: threads) that later launches take; not the
    results = []                    # last launch's (mt_launch_geometry: 0 before a process's first)
    try:
        for threads, blocks in ((1, 1), (2, 3), (3, 0), (64, 7), (256, 0)):
            if lib.mt_set_launch_geometry(threads, blocks) != 0:
                continue
            results.append(_draws(Generator(123, numeric_mode=random_mode.numeric_mode), n))
    finally:
        assert lib.mt_set_launch_geometry(before, 0) == 0
    assert len(results) >= 2 and all(r == results[0] for r in results)


def test_the_bytes_are_the_same_call_after_call(random_mode):
    nm = random_mode.numeric_mode
    assert _draws(Generator(9, numeric_mode=nm), 4099) == _draws(Generator(9, numeric_mode=nm), 4099)


@pytest.mark.parametrize("n, cuts", [(1023, [1]), (1023, [2, 3]), (4099, [1000, 2001, 2002]), (17, [4, 8, 9])])
def test_a_draw_split_at_matching_offsets_is_the_unsplit_draw(random_mode, n, cuts):
    g = Generator(31, numeric_mode=random_mode.numeric_mode)
    base = 10**12 + 1
    whole_normal = raw(g.normal(n, 0.25, 3.0, stream=4, offset=base))
    whole_uniform = raw(g.uniform(n, -1.0, 2.0, stream=4, offset=base))
    x = f32_array(n, 8)
    y, key = g.dropout(x, 0.2, offset=base, stream=6)
    whole_dx = raw(g.dropout_backward(x, key))
    edges = [0] + cuts + [n]
    pieces_n, pieces_u, pieces_y, pieces_dx = b"", b"", b"", b""
    for lo, hi in zip(edges, edges[1:]):
        pieces_n += raw(g.normal(hi - lo, 0.25, 3.0, stream=4, offset=base + lo))
        pieces_u += raw(g.uniform(hi - lo, -1.0, 2.0, stream=4, offset=base + lo))
        part = x[lo:hi]
        yp, kp = g.dropout(part, 0.2, offset=base + lo, stream=6)
        pieces_y += raw(yp)
        pieces_dx += raw(g.dropout_backward(part, kp))
    assert (pieces_n, pieces_u, pieces_y, pieces_dx) == (whole_normal, whole_uniform, raw(y), whole_dx)


# ---- normal: the mapping and its statistics -----------------------------------------------
def _philox_words(lib, seed, stream, block):
    out, ctr, key = ffi.new("uint32_t[4]"), ffi.new("uint32_t[4]"), ffi.new("uint32_t[2]")
    ctr[0:4] = [block & 0xFFFFFFFF, block >> 32, stream & 0xFFFFFFFF, stream >> 32]
    key[0:2] = [seed & 0xFFFFFFFF, seed >> 32]
    assert lib.mt_philox4x32_10(out, ctr, key) == 0
    return list(out)


def test_normals_are_box_muller_of_the_stated_words(random_identical):
    seed, stream, offset, n = 77, 5, 2**33 + 2, 4001
    z = floats(Generator(seed, numeric_mode=random_identical.numeric_mode).normal(n, stream=stream, offset=offset))
    lib = random_identical.backend.lib
    for i in range(n):
        j = offset + i
        w = _philox_words(lib, seed, stream, j >> 2)
        pair = (j & 3) >> 1
        u1 = ((w[2 * pair] >> 8) + 1) * 2.0**-24
        u2 = (w[2 * pair + 1] >> 8) * 2.0**-24
        rad = math.sqrt(-2.0 * math.log(u1))
        ref = rad * (math.sin if j & 1 else math.cos)(2.0 * math.pi * u2)
        assert abs(z[i] - ref) <= 1e-6 * max(1.0, rad), (i, z[i], ref)


def test_normal_mean_and_std_are_within_5_sigma(random_identical):
    n = 2**20
    z = floats(Generator(2024, numeric_mode=random_identical.numeric_mode).normal(n))
    mean = math.fsum(z) / n
    var = math.fsum((v - mean) ** 2 for v in z) / n
    # sampling sd: of the mean 1/sqrt(n), of the sample sd ~ 1/sqrt(2n) (normal parent)
    assert abs(mean) < 5 / math.sqrt(n)
    assert abs(math.sqrt(var) - 1.0) < 5 / math.sqrt(2 * n)
    for k, p in ((1, 0.6826894921370859), (2, 0.9544997361036416), (3, 0.9973002039367398)):
        frac = sum(1 for v in z if abs(v) < k) / n
        assert abs(frac - p) < 5 * math.sqrt(p * (1 - p) / n), (k, frac)
    assert max(abs(v) for v in z) <= 5.7683


def test_normal_applies_mean_and_std_in_two_roundings(random_identical):
    g = Generator(4, numeric_mode=random_identical.numeric_mode)
    z = floats(g.normal(1000, stream=0))
    m, s = f32(-1.5), f32(0.1)
    y = floats(g.normal(1000, -1.5, 0.1, stream=0))
    assert all(y[i] == f32(m + f32(s * z[i])) for i in range(1000))
    assert raw(g.normal(1000, 3.0, 0.0, stream=0)) == raw(array.array("f", [3.0] * 1000))


# ---- the pinned sin/cos of pi*x -------------------------------------------------------------
SINCOS_C = r"""
#include "mt_pinned.h"
#include <stdio.h>
int main(int argc, char **argv) {
    FILE *in = fopen(argv[1], "rb"), *out = fopen(argv[2], "wb");
    uint32_t u;
    if (!in || !out) return 3;
    while (fread(&u, 4, 1, in) == 1) {
        float s, c;
        mt_sincospif(mt_bits_f32(u), &s, &c);
        uint32_t r[2] = {mt_f32_bits(s), mt_f32_bits(c)};
        if (fwrite(r, 4, 2, out) != 2) return 4;
    }
    return fclose(out) == 0 ? 0 : 5;
}
"""


def _sincos_inputs():
    xs = list(range(0, 1 << 24, 13))
    pats = [bits(k * 2.0**-23) for k in xs]                              # Box-Muller's 2*u2 grid
    pats += list(range(0, 0x4B800000, 4093))                             # every binade below 2^24
    mirrored = list(range(0x3E000000, 0x40000000, 65537))
    pats += mirrored + [p | 0x80000000 for p in mirrored]                 # x and -x
    specials = [0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000, 0x1F7FFFFF, 0x1F800000,
                0x3E800000, 0x3F000000, 0x3F400000, 0x3F800000, 0x3FC00000, 0x40000000, 0x4B000001,
                0x4B7FFFFF, 0x4B800000, 0x4B800001, 0x7F7FFFFF, 0xCB7FFFFF, 0x7F800000, 0xFF800000,
                0x7FC00000, 0xFFFFFFFF, 0x7F800001]
    return array.array("I", pats + specials)


@pytest.fixture(scope="module")
def sincos(tmp_path_factory):
    cc = c_compiler()
    if not cc:
        pytest.skip("no C compiler: the pinned sin/cos is not compiled here")
    work = tmp_path_factory.mktemp("sincospi")
    src, inp = work / "sincos.c", work / "in.bin"
    src.write_text(SINCOS_C)
    xs = _sincos_inputs()
    inp.write_bytes(xs.tobytes())

    def run(flags):
        exe, outp = work / ("sincos" + "".join(flags).replace("=", "_")), work / "out.bin"
        subprocess.run([cc, "-std=c99", *flags, "-I", INCLUDE, str(src), "-o", str(exe), "-lm"], check=True)
        subprocess.run([str(exe), str(inp), str(outp)], check=True)
        return outp.read_bytes()

    return xs, run, run(["-O2", "-ffp-contract=off"])


def _ulp(v):
    if v == 0:
        return 2.0**-149
    return 2.0 ** (max(math.frexp(abs(v))[1] - 1, -126) - 23)


def _ref_sincospi(x):
    """sin(pi x), cos(pi x) in double: x reduced exactly (x mod 2, then the nearest half)."""
    a = abs(x)
    xm = math.fmod(a, 2.0)
    k = round(2.0 * xm)
    r = xm - k / 2.0
    s, c = math.sin(math.pi * r), math.cos(math.pi * r)
    s, c = ((s, c), (c, -s), (-s, -c), (-c, s))[k & 3]
    return (-s if x < 0 else s), c


def test_sincospi_is_within_its_stated_bound_on_a_large_sample(sincos):
    xs, _, out = sincos
    res = array.array("I", out)
    worst = [0.0, 0.0]
    for i, u in enumerate(xs):
        x = from_bits(u)
        if not math.isfinite(x):
            assert res[2 * i] == res[2 * i + 1] == 0x7FC00000, hex(u)
            continue
        for w, (ours, ref) in enumerate(zip((from_bits(res[2 * i]), from_bits(res[2 * i + 1])), _ref_sincospi(x))):
            if ref == 0.0:
                assert ours == 0.0, hex(u)
                continue
            worst[w] = max(worst[w], abs(ours - ref) / _ulp(ref))
    assert len(xs) > 1_500_000
    assert max(worst) <= SINCOS_BOUND, worst


def test_sincospi_exact_values_signs_and_symmetry(sincos):
    xs, _, out = sincos
    res = array.array("I", out)
    got = {u: (res[2 * i], res[2 * i + 1]) for i, u in enumerate(xs)}
    assert got[0x00000000] == (0x00000000, 0x3F800000)          # sin(+0) = +0, cos = 1
    assert got[0x80000000] == (0x80000000, 0x3F800000)          # sin(-0) = -0
    assert got[0x3F000000] == (0x3F800000, 0x00000000)          # x = 1/2: 1, +0
    assert got[0x3F800000] == (0x00000000, 0xBF800000)          # x = 1: +0, -1
    assert got[0x3FC00000] == (0xBF800000, 0x00000000)          # x = 3/2: -1, +0
    assert got[0x4B800001] == (0x00000000, 0x3F800000)          # even integers above 2^24
    for u in range(0x3E000000, 0x40000000, 65537):
        s, c = got[u]
        ns, nc = got[u | 0x80000000]
        assert ns == s ^ 0x80000000 and nc == c                  # sin odd, cos even, bit for bit


@pytest.mark.parametrize("flags", [["-O0"], ["-O3", "-march=native", "-ffp-contract=off"]])
def test_sincospi_bits_do_not_depend_on_optimisation(sincos, flags):
    xs, run, out = sincos
    assert run(flags) == out


@pytest.mark.parametrize("flags", [["-O2", "-ffp-contract=off"], ["-O3", "-march=native", "-ffp-contract=off"]])
def test_box_mullers_shortcuts_give_the_general_routines_bits_on_every_input(tmp_path, flags):
    """mt_sincospif_angle and mt_logf_normal (the normal draws' shortcuts) against mt_sincospif
    and mt_logf on all 2^24 angles 2 u2 and all 2^24 values of u1, and mt_logf's shortened core
    against the general one on every f of a split (bench/box_muller_identity.c)."""
    cc = c_compiler()
    if not cc:
        pytest.skip("no C compiler: the pinned sin/cos is not compiled here")
    exe = str(tmp_path / "box_muller_identity")
    src = os.path.join(REPO, "bench", "box_muller_identity.c")
    subprocess.run([cc, *flags, "-I", INCLUDE, src, "-o", exe, "-lm"], check=True)
    done = subprocess.run([exe], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == (
        "angles: 16777216 inputs, 0 differing; logs: 16777216 inputs, 0 differing; "
        "cores: 16777216 inputs, 0 differing"
    ), done.stdout


def test_the_random_section_uses_no_libm_and_no_double():
    text = open(os.path.join(INCLUDE, "mt_pinned_elementwise.h")).read()
    start = text.index("/* ==== random draws and elementwise ops")
    calls = portable_calls(text[start:text.index("/* ==== end of random draws")]) - {
        "if", "return", "float", "int", "int32_t", "uint32_t", "uint64_t", "defined"}
    assert {c for c in calls if not c.startswith("mt_") and not c.startswith("MT_")} <= {"fmaf", "sqrtf"}, calls


# ---- dropout --------------------------------------------------------------------------------
def _scale(p):
    return f32(1.0 / f32(1.0 - f32(p)))


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5, 0.9, 1e-7])
def test_dropout_keeps_exactly_where_the_streams_uniform_is_at_least_p(random_mode, p):
    n, offset = 70001, 3
    g = Generator(99, numeric_mode=random_mode.numeric_mode)
    x = f32_array(n, 1, -3.0, 3.0)
    y, key = g.dropout(x, p, offset=offset, stream=12)
    u = floats(g.uniform(n, stream=12, offset=offset))
    y = floats(host(y))
    p32, scale = f32(p), _scale(p)
    for i in range(n):
        want = f32(x[i] * scale) if u[i] >= p32 else 0.0
        assert bits(y[i]) == bits(want), (i, x[i], u[i], y[i])
    assert key == DropoutKey(99, 12, offset, p32, n, (n,))


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_dropout_keep_fraction_is_within_5_sigma(random_identical, p):
    n = 2**20
    y, _ = Generator(5, numeric_mode=random_identical.numeric_mode).dropout(array.array("f", [1.0]) * n, p)
    kept = sum(1 for v in floats(y) if v != 0.0) / n
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)


def test_dropout_writes_positive_zero_where_it_drops():
    x = array.array("f", [-1.0, -2.0, -0.0, -3.5] * 500)
    y, _ = Generator(1).dropout(x, 0.5)
    dropped = [bits(v) for v, a in zip(floats(y), x) if v == 0.0 and a != 0.0]
    assert dropped and set(dropped) == {0}


def test_dropout_with_p_zero_returns_x_bit_for_bit_and_a_key(random_mode):
    if random_mode.has("approximate"):
        pytest.skip("IEEE-exact arithmetic is not this numeric mode's promise (approximate division, flushed subnormals)")
    x = array.array("f", [1.0, -0.0, 2.0**-149, -3e38, 0.1] * 300)
    # x times the scale 1: under identical_ftz's rule the product reads 2^-149 as +0 (ftz.md)
    want = raw(array.array("f", [1.0, -0.0, 0.0, -3e38, 0.1] * 300)) if random_mode.has("flush_rule") else raw(x)
    g = Generator(3, numeric_mode=random_mode.numeric_mode)
    y, key = g.dropout(x, 0.0)
    assert raw(host(y)) == want and key.p == 0.0 and g.counter == 1
    assert raw(host(g.dropout_backward(x, key))) == want


def test_dropout_backward_replays_the_mask_on_dy(random_mode):
    n = 10007
    g = Generator(8, numeric_mode=random_mode.numeric_mode)
    x, dy = f32_array(n, 2), f32_array(n, 3, -5.0, 5.0)
    y, key = g.dropout(x, 0.4, offset=11)
    dx = floats(host(g.dropout_backward(dy, key)))
    y = floats(host(y))
    scale = _scale(0.4)
    for i in range(n):
        assert bits(dx[i]) == bits(f32(dy[i] * scale) if y[i] != 0.0 else 0.0), i
    assert g.counter == 1


def test_dropout_in_place_through_out_matches_and_refuses_nonfinite_without_writing(random_mode):
    g = Generator(6, numeric_mode=random_mode.numeric_mode)
    x = f32_array(4099, 4)
    expected, _ = g.dropout(x, 0.25, stream=0)
    y, _ = g.dropout(x, 0.25, stream=0, out=x)
    assert y is x and raw(x) == raw(host(expected))
    poisoned = f32_array(4099, 4)
    poisoned[4000] = float("nan")
    before = raw(poisoned)
    with pytest.raises(ValueError, match=r"dropout: x holds NaN or inf; refused before anything was written"):
        g.dropout(poisoned, 0.25, out=poisoned)
    assert raw(poisoned) == before and g.counter == 0


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_dropout_refuses_nonfinite_input_by_name_and_takes_no_stream(random_mode, bad):
    g = Generator(6, numeric_mode=random_mode.numeric_mode)
    x = f32_array(1000, 4)
    x[999] = bad
    with pytest.raises(ValueError, match=r"Generator.dropout: x holds NaN or inf"):
        g.dropout(x, 0.25)
    assert g.counter == 0
    y, key = g.dropout(f32_array(1000, 4), 0.25)
    dy = f32_array(1000, 5)
    dy[0] = bad
    with pytest.raises(ValueError, match=r"dropout_backward: dy holds NaN or inf"):
        g.dropout_backward(dy, key)


@pytest.mark.parametrize("p", [-0.1, 1.0, 0.99999999, 2.0, float("nan"), float("inf"), 1e39])
def test_dropout_refuses_p_outside_0_1_by_name(p):
    with pytest.raises(ValueError, match=r"Generator.dropout: p"):
        Generator(1).dropout(array.array("f", [1.0]), p)


def test_dropout_refuses_what_it_does_not_take_by_name():
    g = Generator(1)
    with pytest.raises(TypeError, match=r"x has dtype float64"):
        g.dropout(array.array("d", [1.0]), 0.5)
    with pytest.raises(TypeError, match=r"p must be a real number"):
        g.dropout(array.array("f", [1.0]), "0.5")
    with pytest.raises(ValueError, match=r"offset must be in \[0, 2\*\*64\)"):
        g.dropout(array.array("f", [1.0]), 0.5, offset=-1)
    with pytest.raises(ValueError, match=r"offset \+ n must be <= 2\^64 - 1"):
        g.dropout(array.array("f", [1.0, 2.0]), 0.5, offset=2**64 - 1)
    with pytest.raises(ValueError, match=r"out has shape \(2,\); the result's shape is \(1,\)"):
        g.dropout(array.array("f", [1.0]), 0.5, out=array.array("f", [0.0, 0.0]))
    _, key = g.dropout(array.array("f", [1.0, 2.0]), 0.5)
    with pytest.raises(ValueError, match=r"dy has shape \(3,\), the forward's x had shape \(2,\)"):
        g.dropout_backward(array.array("f", [1.0] * 3), key)
    with pytest.raises(ValueError, match=r"dy has 3 elements, the key's forward had 2"):
        g.dropout_backward(array.array("f", [1.0] * 3), key._replace(shape=None))   # a key built by hand
    with pytest.raises(TypeError, match=r"key.shape must be None or a tuple of ints \(the forward's shape\), got 5"):
        g.dropout_backward(array.array("f", [1.0] * 2), key._replace(shape=5))
    for size in (4.5, float("nan"), True):      # a hand-built key's count, formatted with %d before
        with pytest.raises(TypeError, match=r"key.size must be an int \(the forward's element count\), got"):
            g.dropout_backward(array.array("f", [1.0] * 2), key._replace(shape=None, size=size))
    with pytest.raises(TypeError, match=r"key must be the DropoutKey"):
        g.dropout_backward(array.array("f", [1.0] * 2), {"seed": 1})
    assert g.counter == 1


# (n, position, value): sizes that take one, several and many ranges of the thread pool
_POISON = [(1, 0, math.nan), (1, 0, math.inf), (1000, 0, -math.inf), (1000, 500, math.nan), (1000, 999, math.inf),
           (100003, 0, math.inf), (100003, 50001, -math.inf), (100003, 100002, math.nan)]


def _sentinel(n):
    """n float32 slots holding a pattern dropout never writes: signalling-NaN bits and 0xDEADBEEF."""
    words = array.array("I", [0x7FA5A5A5, 0xDEADBEEF] * (n // 2 + 1))[:n]
    return array.array("f", words.tobytes())


def _sides(mode):
    return ("host", "device") if mode.has("device_buffers") else ("host",)


def _on(side, buf, mode):
    return mojo_train.to_device(buf, numeric_mode=mode.numeric_mode) if side == "device" else buf


def _bytes(buf):
    return raw(host(buf))


@pytest.mark.parametrize("n, at, bad", _POISON)
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_dropout_refuses_nonfinite_by_name_and_leaves_out_byte_identical(random_mode, direction, n, at, bad):
    name = "x" if direction == "forward" else "dy"
    for side in _sides(random_mode):
        g = Generator(6, numeric_mode=random_mode.numeric_mode)
        _, key = g.dropout(f32_array(n, 4), 0.25, offset=3)
        inp = f32_array(n, 5)
        inp[at] = bad
        inp, out = _on(side, inp, random_mode), _on(side, _sentinel(n), random_mode)
        before = (_bytes(inp), _bytes(out), g.counter)
        with pytest.raises(ValueError, match=r"mojo_train\.Generator\.%s: %s holds NaN or inf; refused before "
                                             r"anything was written" % ("dropout" if name == "x" else
                                                                        "dropout_backward", name)):
            if direction == "forward":
                g.dropout(inp, 0.25, out=out)
            else:
                g.dropout_backward(inp, key, out=out)
        assert (_bytes(inp), _bytes(out), g.counter) == before, side


@pytest.mark.parametrize("shift", [1, -1, 37, -999])
@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_dropout_refuses_an_out_partly_overlapping_its_input_naming_both(random_mode, direction, shift):
    n, base = 1000, 1000
    store = f32_array(3000, 7)
    inp, out = memoryview(store)[base:base + n], memoryview(store)[base + shift:base + shift + n]
    g = Generator(6, numeric_mode=random_mode.numeric_mode)
    _, key = g.dropout(f32_array(n, 4), 0.25)
    before = (raw(store), g.counter)
    name = "x" if direction == "forward" else "dy"
    with pytest.raises(ValueError, match=r"out and %s overlap in memory without being the same buffer \(out starts "
                                         r"%d bytes %s %s\); pass %s itself as out"
                                         % (name, 4 * abs(shift), "after" if shift > 0 else "before", name, name)):
        if direction == "forward":
            g.dropout(inp, 0.25, out=out)
        else:
            g.dropout_backward(inp, key, out=out)
    assert (raw(store), g.counter) == before


def test_dropout_in_place_gives_the_out_of_place_bits_forward_and_backward(random_mode):
    for side in _sides(random_mode):
        g = Generator(6, numeric_mode=random_mode.numeric_mode)
        x, dy = _on(side, f32_array(4099, 4), random_mode), _on(side, f32_array(4099, 5), random_mode)
        y, key = g.dropout(x, 0.25, stream=0, offset=1)
        dx = g.dropout_backward(dy, key)
        assert g.dropout(x, 0.25, stream=0, offset=1, out=x)[0] is x and _bytes(x) == _bytes(y), side
        assert g.dropout_backward(dy, key, out=dy) is dy and _bytes(dy) == _bytes(dx), side


def test_the_c_abi_refuses_dropout_output_partly_overlapping_its_input(random_mode):
    lib, n = random_mode.backend.lib, 1000
    for side in _sides(random_mode):
        store = _on(side, f32_array(n + 8, 8), random_mode)
        p = ffi.cast("float *", store.ptr if side == "device" else ffi.from_buffer(store))
        before = _bytes(store)
        for fn, y, x, names in (("mt_dropout_forward", p + 1, p, "y and x"), ("mt_dropout_forward", p, p + 7, "y and x"),
                                ("mt_dropout_backward", p + 2, p, "dx and dy")):
            for flags in (0, 1):
                assert getattr(lib, fn)(y, x, 0.5, 1, 1, 0, n, flags) == EINVAL, (fn, side, flags)
            assert ("%s overlap without being the same buffer" % names) in ffi.string(lib.mt_last_error()).decode()
        assert _bytes(store) == before, side
        assert lib.mt_dropout_forward(p + 3, p + 3, 0.5, 1, 1, 0, n, 0) == 0      # in place


def test_dropout_backward_and_out_refuse_other_shapes_of_one_element_count(random_mode):
    g = Generator(6, numeric_mode=random_mode.numeric_mode)
    x = mojo_train.Array.from_list([1.0] * 6).reshape(2, 3)
    _, key = g.dropout(x, 0.5)
    assert key.shape == (2, 3) and key.size == 6
    with pytest.raises(ValueError, match=r"dropout_backward: dy has shape \(3, 2\), the forward's x had shape "
                                         r"\(2, 3\); dy must have x's shape"):
        g.dropout_backward(x.reshape(3, 2), key)
    out = _sentinel(6)
    before = raw(out)
    with pytest.raises(ValueError, match=r"Generator\.dropout: out has shape \(6,\); the result's shape is "
                                         r"\(2, 3\)"):
        g.dropout(x, 0.5, out=out)
    with pytest.raises(ValueError, match=r"dropout_backward: out has shape \(6,\); the result's shape is \(2, 3\)"):
        g.dropout_backward(x, key, out=out)
    assert raw(out) == before and g.counter == 1


def test_dropout_of_an_empty_tensor_is_empty():
    y, key = Generator(1).dropout(array.array("f"), 0.5)
    assert y.size == 0 and key.size == 0


# ---- draws: arguments ---------------------------------------------------------------------
@pytest.mark.parametrize("call, match", [
    (lambda g: g.normal(3, std=-1.0), r"std must be finite in float32 and >= 0"),
    (lambda g: g.normal(3, mean=1e39), r"mean must be finite in float32"),
    (lambda g: g.normal(3, mean=float("nan")), r"mean must be finite"),
    (lambda g: g.uniform(3, 1.0, 1.0), r"low must be < high"),
    (lambda g: g.uniform((2, -1)), r"shape must hold ints >= 0"),
    (lambda g: g.uniform(3, stream=-1), r"stream must be in \[0, 2\*\*64\)"),
    (lambda g: g.normal(3, offset=2**64 - 2), r"offset \+ n must be <= 2\^64 - 1"),
    (lambda g: g.uniform(3, offset=2**64 - 2), r"offset \+ n must be <= 2\^64 - 1"),
    (lambda g: g.kaiming_uniform(3, fan_in=0), r"fan_in must be a positive int"),
    (lambda g: g.xavier_normal(3, fan_in=2, fan_out=2.5), r"fan_out must be a positive int"),
    (lambda g: g.xavier_uniform(3, fan_in=2, fan_out=2, gain=0), r"gain must be > 0"),
    (lambda g: g.kaiming_normal(3, fan_in=2, a=float("inf")), r"a must be finite"),
    # past a double (sqrt of 2**1100 overflowed) or float32 (packing the bound overflowed)
    (lambda g: g.kaiming_normal(3, fan_in=2 ** 1100), r"kaiming_normal: fan_in must be a positive int below 2\*\*63"),
    (lambda g: g.xavier_uniform(3, fan_in=2, fan_out=2 ** 63), r"fan_out must be a positive int below 2\*\*63"),
    (lambda g: g.xavier_uniform(3, fan_in=2, fan_out=2, gain=1e39),
     r"xavier_uniform: the bound .* is beyond float32's range; gain is too large"),
    (lambda g: g.xavier_normal(3, fan_in=2, fan_out=2, gain=1e39),
     r"xavier_normal: the std .* is beyond float32's range; gain is too large"),
])
def test_draws_refuse_bad_arguments_by_name_and_take_no_stream(call, match):
    g = Generator(1)
    with pytest.raises((ValueError, TypeError), match=match):
        call(g)
    assert g.counter == 0


def test_draws_take_shapes_and_return_float32_arrays_of_them(random_mode):
    g = Generator(1, numeric_mode=random_mode.numeric_mode)
    for shape, want in ((5, (5,)), ((2, 3), (2, 3)), ((), ()), ((0, 4), (0, 4))):
        a = g.normal(shape)
        assert a.shape == want and a.dtype == "float32"


def test_device_draws_equal_host_draws_and_stay_on_the_device(random_mode):
    if not random_mode.has("device_buffers"):
        pytest.skip("the loaded vendor takes no device buffers")
    g = Generator(17, numeric_mode=random_mode.numeric_mode)
    d = g.normal((33, 31), 1.0, 2.0, stream=0, offset=1, device=True)
    assert isinstance(d, DeviceArray) and d.shape == (33, 31)
    assert raw(d.to_host()) == raw(g.normal((33, 31), 1.0, 2.0, stream=0, offset=1))
    x = f32_array(4099, 2)
    y, key = g.dropout(mojo_train.to_device(x), 0.3, stream=1, offset=2)
    assert isinstance(y, DeviceArray)
    assert raw(y.to_host()) == raw(g.dropout(x, 0.3, stream=1, offset=2)[0])


def test_device_true_is_refused_on_the_cpu_vendor(random_mode):
    if random_mode.vendor != "cpu":
        pytest.skip("a GPU vendor takes device=True")
    with pytest.raises(ValueError, match=r"Generator.uniform: device=True but the loaded vendor is cpu"):
        Generator(1, numeric_mode=random_mode.numeric_mode).uniform(3, device=True)


# ---- initializers -------------------------------------------------------------------------
def _torch_bounds(fan_in, fan_out, a, gain):
    """torch.nn.init's scalars, by torch's own calculate_gain and its formulas."""
    torch = pytest.importorskip("torch")
    k_gain = torch.nn.init.calculate_gain("leaky_relu", a)
    k_std = k_gain / math.sqrt(fan_in)
    x_std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return {"kaiming_uniform": math.sqrt(3.0) * k_std, "kaiming_normal": k_std,
            "xavier_uniform": math.sqrt(3.0) * x_std, "xavier_normal": x_std}


@pytest.mark.parametrize("fan_in, fan_out, a, gain", [(64, 256, math.sqrt(5.0), 1.0), (1, 1, 0.0, 5.0),
                                                      (3, 1000, 0.01, math.sqrt(2.0)), (4096, 11008, 1.0, 0.5),
                                                      (7, 3, 2.5, 1.0)])
def test_initializers_draw_with_torchs_bounds(random_identical, fan_in, fan_out, a, gain):
    ref = _torch_bounds(fan_in, fan_out, a, gain)
    shape = (3, 1001)
    for name, scalar in ref.items():
        g, h = (Generator(5, numeric_mode=random_identical.numeric_mode) for _ in range(2))
        if name.startswith("kaiming"):
            got = getattr(g, name)(shape, fan_in, a)
        else:
            got = getattr(g, name)(shape, fan_in, fan_out, gain)
        want = h.uniform(shape, -scalar, scalar) if name.endswith("uniform") else h.normal(shape, 0.0, scalar)
        assert raw(got) == raw(want), name
        if name.endswith("uniform"):
            assert max(abs(v) for v in floats(got)) <= f32(scalar)


def test_kaiming_uniform_defaults_to_nn_linears_init(random_identical):
    g, h = (Generator(2, numeric_mode=random_identical.numeric_mode) for _ in range(2))
    w = g.kaiming_uniform((64, 48), 48)
    assert raw(w) == raw(h.kaiming_uniform((64, 48), 48, a=math.sqrt(5.0)))
    # nn.Linear's bound gain * sqrt(3 / fan_in) with a = sqrt(5) is 1 / sqrt(fan_in)
    top = max(abs(v) for v in floats(w))
    assert 0.99 / math.sqrt(48) < top <= f32(1 / math.sqrt(48)) * (1 + 2.0**-22)


# ---- the C ABI ----------------------------------------------------------------------------
def test_the_c_abi_refuses_without_writing(random_mode):
    lib = random_mode.backend.lib
    out = array.array("f", [7.0] * 8)
    ptr = ffi.cast("float *", ffi.from_buffer(out))
    assert lib.mt_normal_fill(ffi.NULL, 1, 1, 0, 0.0, 1.0, 8) == EINVAL
    assert lib.mt_normal_fill(ptr, 1, 1, 0, 0.0, 1.0, -1) == EINVAL
    assert lib.mt_normal_fill(ptr, 1, 1, 0, 0.0, -1.0, 8) == EINVAL
    assert b"std" in ffi.string(lib.mt_last_error())
    assert lib.mt_normal_fill(ptr, 1, 1, 2**64 - 4, 0.0, 1.0, 8) == EINVAL
    assert lib.mt_dropout_forward(ptr, ptr, 1.0, 1, 1, 0, 8, 0) == EINVAL
    assert b"p must be in [0, 1)" in ffi.string(lib.mt_last_error())
    assert lib.mt_dropout_backward(ptr, ffi.NULL, 0.5, 1, 1, 0, 8, 0) == EINVAL
    assert b"dy is NULL" in ffi.string(lib.mt_last_error())
    assert list(out) == [7.0] * 8
    assert lib.mt_normal_fill(ptr, 1, 1, 2**64 - 9, 0.0, 1.0, 8) == 0   # the last elements of a stream
