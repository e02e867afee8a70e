"""Exact learning-rate schedules: ConstantLR, WarmupLinearLR, WarmupCosineLR.

Contract under test (native/contracts/schedule.md): lr_at(t), t one-based, is the float32
nearest (ties to even) the exact real value of the schedule for its arguments read as exact
binary64 numbers. The reference here is independent of the library's method: the schedule's
formulas written directly in Fractions, and for the cosine an interval enclosure from
mpmath.iv (outward-rounded interval arithmetic) refined until both ends round to the same
float32 -- which then is the answer, because rounding is monotone. Cases that land within
2^-88 of a rounding boundary (where the library's fast estimate must decline) and exact ties
are built on purpose. A C probe measures the fast estimate's error against its stated bound.
The schedules are host code, identical on every vendor and numeric mode; they are tested through the
default library.
"""
import array
import os
import pickle
import random
import re
import shutil
import struct
import subprocess
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train import ConstantLR, WarmupCosineLR, WarmupLinearLR
from mojo_train._native import ffi, load

from _helpers import EINVAL, REPO, bits, f32, from_bits

mpmath = pytest.importorskip("mpmath")
iv = mpmath.iv

FLT_MAX = float.fromhex("0x1.fffffep+127")
CLASSES = {"constant": ConstantLR, "warmup_linear": WarmupLinearLR, "warmup_cosine": WarmupCosineLR}
KIND_CODES = {"constant": 0, "warmup_linear": 1, "warmup_cosine": 2}
NIVEN = {Fraction(1, 3): Fraction(1, 2), Fraction(1, 2): Fraction(0), Fraction(2, 3): Fraction(-1, 2)}

pytestmark = pytest.mark.skipif(not load().has("schedule"), reason="the loaded library has no schedules")


# ---- the reference ---------------------------------------------------------------------------

def round_f32(q):
    """The float32 nearest the rational q >= 0 (ties to even; finite candidates only)."""
    q = Fraction(q)
    u = bits(f32(float(q)))
    best = None
    for c in (u - 1, u, u + 1):
        if c < 0 or c >= 0x7f800000:
            continue
        key = (abs(Fraction(from_bits(c)) - q), c & 1)
        if best is None or key < best[0]:
            best = (key, from_bits(c))
    return best[1]


def exact(kind, peak, min_lr, w, total, t):
    """The schedule's exact value at step t: a Fraction, or ("cos", q, P, M) meaning
    M + (P - M) * (1 + cos(pi q)) / 2 with cos(pi q) irrational."""
    P, M = Fraction(peak), Fraction(min_lr)
    if t <= w:
        return P * t / w
    if kind == "constant":
        return P
    if t >= total:
        return M
    if kind == "warmup_linear":
        return M + (P - M) * Fraction(total - t, total - w)
    q = Fraction(t - w, total - w)
    if q in NIVEN:
        return M + (P - M) * (1 + NIVEN[q]) / 2
    return ("cos", q, P, M)


def _fraction(raw):
    sign, man, exp, _ = raw
    v = Fraction(man) * (Fraction(2) ** exp)
    return -v if sign else v


def cos_bounds(q, P, M, prec):
    """[lo, hi] (Fractions) holding M + (P - M) (1 + cos(pi q)) / 2, from mpmath.iv."""
    old = iv.prec
    iv.prec = prec
    try:
        c = iv.cos(iv.pi * iv.mpf(q.numerator) / iv.mpf(q.denominator))
        v = iv.mpf(float(M)) + (iv.mpf(float(P)) - iv.mpf(float(M))) * (1 + c) / 2
    finally:
        iv.prec = old
    a, b = v._mpi_
    return _fraction(a), _fraction(b)


def reference_bits(kind, peak, min_lr, w, total, t):
    v = exact(kind, peak, min_lr, w, total, t)
    if isinstance(v, Fraction):
        return bits(round_f32(v))
    _, q, P, M = v
    prec = 128
    while prec <= 1 << 15:
        lo, hi = cos_bounds(q, P, M, prec)
        a, b = bits(round_f32(lo)), bits(round_f32(hi))
        if a == b:
            return a
        prec *= 2
    raise AssertionError("the reference could not decide (%r)" % (v,))


def make(kind, peak, min_lr, w, total):
    if kind == "constant":
        return ConstantLR(peak, warmup_steps=w)
    return CLASSES[kind](peak, warmup_steps=w, total_steps=total, min_lr=min_lr)


def native_bits(kind, peak, min_lr, w, total, t):
    """mt_lr_values for one step, straight from the library."""
    backend = load()
    out = ffi.new("float[1]")
    backend.check(backend.lib.mt_lr_values(out, KIND_CODES[kind], peak, min_lr, w, total or 0, t, 1), "lr")
    return bits(out[0])


def distance_to_boundary(kind, peak, min_lr, w, total, t):
    """|v - nearest float32 rounding boundary| / v, as a float (for the built cases)."""
    v = exact(kind, peak, min_lr, w, total, t)
    if not isinstance(v, Fraction):
        lo, hi = cos_bounds(v[1], v[2], v[3], 512)
        v = (lo + hi) / 2
    c = round_f32(v)
    u = bits(c)
    ups = struct.unpack("<f", struct.pack("<I", u + 1))[0]
    dns = struct.unpack("<f", struct.pack("<I", u - 1))[0] if u else -ups
    mids = [(Fraction(c) + Fraction(ups)) / 2, (Fraction(c) + Fraction(dns)) / 2]
    return float(min(abs(v - m) for m in mids) / v)


# ---- hypothesis: arbitrary arguments, boundary steps -----------------------------------------

def _floats_up_to(limit):
    return st.one_of(
        st.floats(0.0, limit, allow_nan=False, allow_infinity=False),
        st.sampled_from([x for x in (1e-3, 3e-4, 6e-4, 1.0, 0.1, 2.0 ** -149, 2.0 ** -126, 1e-40, 5e-324,
                                     FLT_MAX, 3.4028235e38 / 7) if x <= limit]))


@st.composite
def schedules(draw):
    kind = draw(st.sampled_from(sorted(CLASSES)))
    peak = draw(_floats_up_to(FLT_MAX))
    frac = draw(st.one_of(st.just(0.0), st.just(1.0), st.floats(0.0, 1.0), st.sampled_from([0.1, 0.5, 1e-30])))
    min_lr = 0.0 if kind == "constant" else min(peak, peak * frac)
    w = draw(st.one_of(st.integers(0, 5), st.integers(0, 10 ** 6), st.just(2 ** 53 - 7)))
    total = None
    if kind != "constant":
        span = draw(st.one_of(st.integers(1, 10), st.integers(1, 10 ** 7), st.integers(1, 2 ** 53 - w)))
        total = min(w + span, 2 ** 53)
        if total <= w:
            w, total = 2 ** 53 - 7, 2 ** 53
    return kind, peak, min_lr, w, total


def boundary_steps(w, total, extra):
    end = total if total is not None else w + 1
    steps = {1, 2, w, w + 1, w + 2, end - 1, end, end + 1, 2 * end + 3, extra}
    if total is not None:
        d = total - w
        steps |= {w + d // 2, w + d // 3, w + (2 * d) // 3, w + d // 4}
    return sorted(t for t in steps if 1 <= t <= 2 ** 62)


@settings(max_examples=int(os.environ.get("MT_SCHEDULE_EXAMPLES", "250")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=schedules(), extra=st.integers(1, 2 ** 40))
def test_every_step_is_the_float32_nearest_the_exact_value(case, extra):
    kind, peak, min_lr, w, total = case
    sched = make(kind, peak, min_lr, w, total)
    for t in boundary_steps(w, total, extra):
        want = reference_bits(kind, peak, min_lr, w, total, t)
        assert sched.bits_at(t) == want, (case, t)
        assert native_bits(kind, peak, min_lr, w, total, t) == want, (case, t)


@pytest.mark.parametrize("kind", ["warmup_linear", "warmup_cosine"])
def test_a_whole_short_run_matches_the_reference_step_by_step(kind):
    peak, min_lr, w, total = 3e-4, 3e-5, 17, 250
    sched = make(kind, peak, min_lr, w, total)
    got = sched.lr_values(total + 5)
    want = [reference_bits(kind, peak, min_lr, w, total, t) for t in range(1, total + 6)]
    assert [bits(x) for x in got] == want


# ---- built cases: near rounding boundaries, exact ties ---------------------------------------

def _midpoint(rng):
    """A random float32 rounding boundary (exact), normal range around 1e-6 .. 1."""
    mc = rng.randrange(1 << 23, 1 << 24)
    ec = rng.randrange(-45, -23)
    return Fraction(2 * mc + 1) * Fraction(2) ** (ec - 1)


def _next(x, up):
    u = struct.unpack("<Q", struct.pack("<d", x))[0]
    return struct.unpack("<d", struct.pack("<Q", u + (1 if up else -1)))[0]


def near_boundary_cosine(rng):
    """A cosine case whose exact value lies within ~2^-100 of a float32 rounding boundary:
    peak makes peak * cos^2 land just below the boundary, min fills most of the gap."""
    while True:
        w = rng.randrange(0, 1000)
        total = w + rng.randrange(10, 10 ** 6)
        t = rng.randrange(w + 1, total)
        q = Fraction(t - w, total - w)
        if q in NIVEN:
            continue
        mid = _midpoint(rng)
        with mpmath.workprec(400):
            x = mpmath.cos(mpmath.pi * q.numerator / q.denominator)
            c2 = (1 + x) / 2
            if c2 < mpmath.mpf(2) ** -40 or c2 > 1 - mpmath.mpf(2) ** -40:
                continue
            peak = float(mpmath.mpf(mid.numerator) / mid.denominator / c2)
            while mpmath.mpf(peak) * c2 >= mpmath.mpf(mid.numerator) / mid.denominator:
                peak = _next(peak, False)
            gap = mpmath.mpf(mid.numerator) / mid.denominator - mpmath.mpf(peak) * c2
            min_lr = float(gap / (1 - c2))
        if 0.0 <= min_lr <= peak:
            return "warmup_cosine", peak, min_lr, w, total, t


def test_cosine_values_within_2_to_the_minus_100_of_a_boundary_are_decided_exactly(probe):
    rng = random.Random(20240605)
    cases = [near_boundary_cosine(rng) for _ in range(60)]
    text = "".join("2 %s %s %d %d %d\n" % (p.hex(), m.hex(), w, total, t) for _, p, m, w, total, t in cases)
    picks = subprocess.run([probe, "pick"], input=text, capture_output=True, text=True, check=True).stdout.split()
    for i, (kind, peak, min_lr, w, total, t) in enumerate(cases):
        assert distance_to_boundary(kind, peak, min_lr, w, total, t) < 2.0 ** -95
        assert int(picks[2 * i]) == -1                  # the fast estimate declined: the exact route decided
        want = reference_bits(kind, peak, min_lr, w, total, t)
        assert int(picks[2 * i + 1]) == want
        assert native_bits(kind, peak, min_lr, w, total, t) == want
        assert make(kind, peak, min_lr, w, total).bits_at(t) == want


def test_rational_values_exactly_on_a_boundary_round_to_even_and_neighbours_round_away():
    rng = random.Random(7)
    for _ in range(200):
        mid = _midpoint(rng)
        peak = float(2 * mid)                          # exact: mid has 25 bits
        d = 2 * rng.randrange(1, 10 ** 6)
        w = rng.randrange(0, 1000)
        cases = [("warmup_linear", w, w + d, w + d // 2),       # (peak*b + 0*a)/d, b = d/2
                 ("warmup_cosine", w, w + d, w + d // 2),       # cos^2(pi/4) = 1/2
                 ("constant", d, None, d // 2)]                  # warmup: peak * t / w
        for kind, ww, total, t in cases:
            for p in (peak, _next(peak, True), _next(peak, False)):
                v = exact(kind, p, 0.0, ww, total, t)
                assert isinstance(v, Fraction)
                want = bits(round_f32(v))
                assert native_bits(kind, p, 0.0, ww, total, t) == want, (kind, p, ww, total, t)
                if p == peak:
                    assert v == mid and want & 1 == 0


def test_the_cosines_rational_points_are_exact_ties_when_built_so():
    # a/d = 1/3: v = (3 peak + min) / 4; a/d = 2/3: v = (peak + 3 min) / 4
    rng = random.Random(11)
    done = 0
    while done < 100:
        mid = _midpoint(rng)
        peak = float(mid * Fraction(4, 3) * (1 + Fraction(rng.randrange(1, 1000), 10 ** 6)))
        for third, (ca, cb) in ((1, (3, 1)), (2, (1, 3))):
            m = (4 * mid - ca * Fraction(peak)) / cb
            if not 0 <= m <= Fraction(peak) or Fraction(float(m)) != m:
                continue
            w = rng.randrange(0, 100)
            d = 3 * rng.randrange(1, 10 ** 5)
            t = w + third * d // 3
            assert exact("warmup_cosine", peak, float(m), w, w + d, t) == mid
            assert native_bits("warmup_cosine", peak, float(m), w, w + d, t) == bits(round_f32(mid))
            done += 1


def test_the_exact_only_route_gives_the_same_bits(monkeypatch):
    cases = [("warmup_cosine", 3e-4, 3e-5, 200, 2200), ("warmup_cosine", 1.0, 0.0, 0, 3000),
             ("warmup_linear", 6e-4, 1e-5, 100, 3100), ("constant", 1e-3, 0.0, 1500, None)]
    fast = [make(*c).lr_values(3200).tobytes() for c in cases]
    monkeypatch.setenv("MOJO_TRAIN_LR_EXACT_ONLY", "1")
    exact_only = [make(*c).lr_values(3200).tobytes() for c in cases]
    assert fast == exact_only


# ---- the fast estimate's error, measured ------------------------------------------------------

PROBE_C = r"""
#include <stdio.h>
#include <string.h>
#include "mt_host.h"
int mt_fail(int code, const char *fmt, ...) { (void)fmt; return code; }
void mt_fp_begin(mt_fp_env *e) { (void)e; }
void mt_fp_end(const mt_fp_env *e) { (void)e; }
#include "mt_schedule.c"
int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "pick")) {   /* the fast decision (-1: declined) and the value */
        int kind;
        long long w, total, t;
        double peak, min;
        while (scanf("%d %la %la %lld %lld %lld", &kind, &peak, &min, &w, &total, &t) == 6) {
            lr_form f = form_at(kind, peak, min, w, total, t);
            long long fast;
            if (f.cosine) {
                int scale;
                dw v = cos_estimate(&f, peak, min, &scale);
                fast = fast_pick(v.h * pow2d(-scale), v.l * pow2d(-scale), -90);
            } else {
                fast = -2;   /* rationals: not probed here */
            }
            printf("%lld %lld\n", fast, (long long)value_at(kind, peak, min, w, total, t, 0));
        }
        return 0;
    }
    unsigned long long a, b;
    double peak, min;
    while (scanf("%llu %llu %la %la", &a, &b, &peak, &min) == 4) {
        lr_form f = {1, 0, 0, 0, a, b, a + b};
        int scale;
        dw v = cos_estimate(&f, peak, min, &scale);
        printf("%a %a %d\n", v.h, v.l, scale);
    }
    return 0;
}
"""


def _compiler():
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return shutil.which(name)
    pytest.skip("no C compiler for the schedule probe")


def build_probe(workdir, flags):
    src = os.path.join(str(workdir), "probe.c")
    with open(src, "w") as f:
        f.write(PROBE_C)
    exe = os.path.join(str(workdir), "probe")
    inc = ["-I", os.path.join(REPO, "native", "include"), "-I", os.path.join(REPO, "native", "common")]
    done = subprocess.run([_compiler(), "-std=c11", "-D_GNU_SOURCE"] + flags + inc + [src, "-o", exe, "-lm"],
                          capture_output=True, text=True)
    if done.returncode and "-march=native" in flags:
        pytest.skip("the compiler does not take -march=native")
    assert done.returncode == 0, done.stderr
    return exe


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    return build_probe(tmp_path_factory.mktemp("schedule_probe"), ["-O2", "-ffp-contract=off"])


def _probe_inputs():
    rng = random.Random(5)
    rows = []
    for i in range(3000):
        d = rng.choice([rng.randrange(2, 100), rng.randrange(2, 10 ** 6), rng.randrange(2, 2 ** 53)])
        a = rng.choice([1, d - 1, rng.randrange(1, d)])
        peak = rng.choice([2.0 ** rng.uniform(-149, 127), rng.uniform(0, 1e-2), 1.0, FLT_MAX])
        min_lr = rng.choice([0.0, peak, peak * rng.random(), peak * 2.0 ** -rng.randrange(0, 1100)])
        rows.append((a, d - a, max(peak, 2.0 ** -149), min(min_lr, peak)))
    return rows


def _probe_run(exe, rows):
    text = "".join("%d %d %s %s\n" % (a, b, p.hex(), m.hex()) for a, b, p, m in rows)
    return subprocess.run([exe], input=text, capture_output=True, text=True, check=True).stdout.split("\n")


def test_the_fast_cosine_estimate_stays_within_its_stated_bound(probe):
    rows = _probe_inputs()
    out = _probe_run(probe, rows)
    worst = 0.0
    with mpmath.workprec(600):
        for (a, b, peak, min_lr), line in zip(rows, out):
            h, l, scale = line.split()
            got = mpmath.mpf(float.fromhex(h)) + mpmath.mpf(float.fromhex(l))
            theta = mpmath.pi * a / (2 * (a + b))
            v = (mpmath.mpf(peak) * mpmath.cos(theta) ** 2 + mpmath.mpf(min_lr) * mpmath.sin(theta) ** 2) \
                * mpmath.mpf(2) ** int(scale)
            worst = max(worst, float(abs(got - v) / v))
    assert worst < 2.0 ** -90, "relative error %r = 2^%.1f" % (worst, mpmath.log(worst, 2))


def test_contraction_flags_do_not_reach_the_schedule_arithmetic(probe, tmp_path):
    # the deterministic and fast numeric modes compile with -ffp-contract=fast; the file turns it off
    exe = build_probe(tmp_path, ["-O3", "-ffp-contract=fast", "-march=native"])
    rows = _probe_inputs()[:500]
    assert _probe_run(exe, rows) == _probe_run(probe, rows)


def test_every_loaded_library_gives_the_same_schedule_bits(mode):
    backend = mode.backend
    if not backend.has("schedule"):
        pytest.skip("no schedules in %r" % mode)
    out = ffi.new("float[3000]")
    backend.check(backend.lib.mt_lr_values(out, 2, 3e-4, 3e-5, 100, 2900, 1, 3000), "lr")
    ref = load().lib
    want = ffi.new("float[3000]")
    assert ref.mt_lr_values(want, 2, 3e-4, 3e-5, 100, 2900, 1, 3000) == 0
    assert ffi.buffer(out) == ffi.buffer(want)


def _c_table(text, name):
    body = text[text.index(name):]
    body = body[body.index("{") + 1:body.index("};")]
    return [float.fromhex(x) for x in re.findall(r"-?0x[0-9a-f.]+p[-+]?\d+", body)]


def test_the_series_and_pi_constants_are_the_nearest_double_words():
    with open(os.path.join(REPO, "native", "common", "mt_schedule.c")) as f:
        text = f.read()

    def dw(x):
        hi = float(x)
        return [hi, float(x - mpmath.mpf(hi))]

    with mpmath.workprec(400):
        want = [v for k in range(8) for v in dw((-1) ** k / mpmath.factorial(2 * k + 1))]
        assert _c_table(text, "SIN_DW[") == want
        want = [float((-1) ** k / mpmath.factorial(2 * k + 1)) for k in range(8, 15)]
        assert _c_table(text, "SIN_TAIL[") == want
        pi = [float.fromhex(re.search(r"#define PI_%s (\S+)" % n, text).group(1)) for n in ("HI", "LO")]
        assert pi == dw(mpmath.pi)


# ---- lr_at, lr_values, bits_at ----------------------------------------------------------------

def test_lr_at_is_one_based_and_the_warmup_starts_at_peak_over_warmup_steps():
    s = WarmupCosineLR(0.25, warmup_steps=4, total_steps=8)
    assert [s.lr_at(t) for t in (1, 2, 3, 4)] == [0.0625, 0.125, 0.1875, 0.25]
    assert s.lr_at(6) == 0.125          # the cosine's midpoint: (peak + min) / 2
    assert s.lr_at(8) == s.lr_at(9) == s.lr_at(2 ** 62) == 0.0


def test_linear_decay_reaches_min_lr_at_total_steps_and_stays():
    s = WarmupLinearLR(1.0, warmup_steps=0, total_steps=4, min_lr=0.5)
    assert [s.lr_at(t) for t in range(1, 7)] == [0.875, 0.75, 0.625, 0.5, 0.5, 0.5]


def test_constant_is_peak_after_the_warmup_and_the_warmup_is_linear():
    s = ConstantLR(3.0, warmup_steps=3)
    assert [s.lr_at(t) for t in range(1, 6)] == [1.0, 2.0, 3.0, 3.0, 3.0]
    assert ConstantLR(0.1).lr_at(1) == struct.unpack("<f", struct.pack("<f", 0.1))[0]


def test_lr_values_is_lr_at_of_every_step_and_crosses_cache_blocks():
    s = WarmupCosineLR(1e-3, warmup_steps=1000, total_steps=3000, min_lr=1e-4)
    vals = s.lr_values(3100)
    assert isinstance(vals, array.array) and vals.typecode == "f" and len(vals) == 3100
    assert list(vals) == [s.lr_at(t) for t in range(1, 3101)]
    assert [s.lr_at(t) for t in (3000, 1, 2048, 1025, 1024)] == [vals[2999], vals[0], vals[2047], vals[1024], vals[1023]]
    assert s.lr_values(0).tobytes() == b""


def test_bits_at_is_the_float32_bit_pattern():
    s = WarmupLinearLR(3e-4, warmup_steps=10, total_steps=100, min_lr=1e-5)
    for t in (1, 10, 55, 100, 1000):
        assert s.bits_at(t) == struct.unpack("<I", struct.pack("<f", s.lr_at(t)))[0]


@pytest.mark.parametrize("t, exc", [(0, ValueError), (-1, ValueError), (2 ** 62 + 1, ValueError),
                                    (1.0, TypeError), (True, TypeError), ("3", TypeError), (None, TypeError)])
def test_lr_at_refuses_steps_that_are_not_one_based_ints(t, exc):
    with pytest.raises(exc, match=r"t must"):
        WarmupCosineLR(1e-3, total_steps=10).lr_at(t)


def test_subnormal_and_huge_peaks_round_like_any_other_value():
    assert WarmupCosineLR(2.0 ** -149, total_steps=3).lr_at(1) == 2.0 ** -149
    assert WarmupCosineLR(2.0 ** -150, total_steps=3).lr_at(1) == 0.0     # a tie, to even
    assert ConstantLR(5e-324).lr_at(1) == 0.0
    assert WarmupLinearLR(FLT_MAX, total_steps=2).lr_at(1) == FLT_MAX / 2


# ---- arguments ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [WarmupLinearLR, WarmupCosineLR])
@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(peak_lr=-1e-3, total_steps=10), ValueError, "peak_lr"),
    (dict(peak_lr=float("nan"), total_steps=10), ValueError, "peak_lr"),
    (dict(peak_lr=float("inf"), total_steps=10), ValueError, "peak_lr"),
    (dict(peak_lr=4e38, total_steps=10), ValueError, "largest float32"),
    (dict(peak_lr="1e-3", total_steps=10), TypeError, "peak_lr"),
    (dict(peak_lr=1e-3, total_steps=10, min_lr=2e-3), ValueError, "min_lr"),
    (dict(peak_lr=1e-3, total_steps=10, min_lr=-1e-9), ValueError, "min_lr"),
    (dict(peak_lr=1e-3, total_steps=10, warmup_steps=-1), ValueError, "warmup_steps"),
    (dict(peak_lr=1e-3, total_steps=10, warmup_steps=10), ValueError, "total_steps must be > warmup_steps"),
    (dict(peak_lr=1e-3, total_steps=10, warmup_steps=2.0), TypeError, "warmup_steps"),
    (dict(peak_lr=1e-3, total_steps=True), TypeError, "total_steps"),
    (dict(peak_lr=1e-3, total_steps=2 ** 53 + 1), ValueError, "total_steps"),
    (dict(peak_lr=1e-3), ValueError, "total_steps is required"),
])
def test_decaying_schedules_refuse_bad_arguments_by_name(cls, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        cls(**kwargs)


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(total_steps=100), TypeError, "no decay"),
    (dict(min_lr=0.0), TypeError, "no decay"),
    (dict(warmup_steps=-3), ValueError, "warmup_steps"),
])
def test_constant_refuses_what_it_would_ignore(kwargs, exc, match):
    with pytest.raises(exc, match=match):
        ConstantLR(1e-3, **kwargs)


@pytest.mark.parametrize("cls, kwargs, say", [
    (ConstantLR, dict(factor=0.5), "factor"), (ConstantLR, dict(total_iters=5), "warmup_steps="),
    (ConstantLR, dict(last_epoch=-1), "last_epoch"), (WarmupCosineLR, dict(T_max=100), "total_steps="),
    (WarmupCosineLR, dict(eta_min=0.0, total_steps=10), "min_lr="), (WarmupLinearLR, dict(start_factor=0.1), "linearly"),
    (WarmupLinearLR, dict(verbose=True, total_steps=10), "verbose"), (WarmupCosineLR, dict(bogus=1), "bogus"),
])
def test_torch_scheduler_arguments_are_refused_saying_what_to_pass(cls, kwargs, say):
    with pytest.raises(TypeError, match=say):
        cls(1e-3, **kwargs)


@pytest.mark.parametrize("cls", [ConstantLR, WarmupLinearLR, WarmupCosineLR])
def test_an_optimizer_as_first_argument_is_refused_as_torchs_calling_convention(cls):
    opt = mt.SGD(array.array("f", [1.0]), lr=0.1)
    with pytest.raises(TypeError, match="not torch's scheduler"):
        cls(opt, total_steps=10) if cls is not ConstantLR else cls(opt)


def test_docstrings_say_they_are_not_torchs_schedulers():
    for cls in (ConstantLR, WarmupLinearLR, WarmupCosineLR):
        assert "lr_schedule=" in cls.__doc__ and "Not torch's" in cls.__doc__


# ---- config, repr, equality --------------------------------------------------------------------

@pytest.mark.parametrize("sched", [ConstantLR(1e-3, warmup_steps=7), WarmupLinearLR(3e-4, 10, 100, 1e-5),
                                   WarmupCosineLR(0.1, warmup_steps=0, total_steps=5, min_lr=0.1)])
def test_config_round_trips_and_repr_names_the_arguments(sched):
    cfg = sched.config()
    again = type(sched).from_config(dict(cfg))
    assert again == sched and again.config() == cfg and hash(again) == hash(sched)
    assert mt.schedule._Schedule.from_config(cfg) == sched
    assert again.lr_values(120).tobytes() == sched.lr_values(120).tobytes()
    assert pickle.loads(pickle.dumps(sched)) == sched
    r = repr(sched)
    assert r.startswith(type(sched).__name__ + "(") and "peak_lr=%r" % sched.peak_lr in r


def test_from_config_refuses_a_config_of_another_kind_or_with_unknown_keys():
    cfg = WarmupCosineLR(1e-3, total_steps=10).config()
    with pytest.raises(ValueError, match="not a WarmupLinearLR"):
        WarmupLinearLR.from_config(cfg)
    with pytest.raises(ValueError, match="unknown keys"):
        WarmupCosineLR.from_config(dict(cfg, gamma=0.1))
    with pytest.raises(ValueError, match="kind"):
        WarmupCosineLR.from_config(dict(cfg, kind="step"))


# ---- the C entry point's own checks --------------------------------------------------------------

@pytest.mark.parametrize("args, match", [
    ((3, 1e-3, 0.0, 0, 10, 1, 1), "kind"),
    ((2, 1e-3, 2e-3, 0, 10, 1, 1), "min_lr"),
    ((2, 1e-3, 0.0, 5, 5, 1, 1), "total_steps"),
    ((0, 1e-3, 1e-4, 0, 0, 1, 1), "constant schedule"),
    ((2, 1e-3, 0.0, 0, 10, 0, 1), "first_step"),
    ((2, 1e-3, 0.0, 0, 10, 1, -1), "n must"),
    ((2, 1e-3, 0.0, 0, 10, 2 ** 62, 2), "n must"),
])
def test_mt_lr_values_refuses_bad_arguments_and_writes_nothing(args, match):
    backend = load()
    out = ffi.new("float[2]", [7.0, 7.0])
    rc = backend.lib.mt_lr_values(out, *args)
    assert rc == EINVAL and match in ffi.string(backend.lib.mt_last_error()).decode()
    assert list(out) == [7.0, 7.0]


# ---- optimizers ------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [mt.SGD, mt.Adam, mt.AdamW])
def test_an_optimizer_steps_with_the_schedules_float32_lr(mode, cls):
    sched = WarmupCosineLR(0.05, warmup_steps=2, total_steps=6, min_lr=0.01)
    p1, p2 = array.array("f", [1.0, -2.0, 0.5]), array.array("f", [1.0, -2.0, 0.5])
    a = cls(p1, lr_schedule=sched, numeric_mode=mode.numeric_mode)
    b = cls(p2, numeric_mode=mode.numeric_mode)
    for t in range(1, 8):
        g = array.array("f", [0.1 * t, -0.2, 0.3])
        a.step(g)
        b.lr = sched.lr_at(t)
        b.step(array.array("f", g))
        assert a.lr_ == sched.lr_at(t)
    assert p1.tobytes() == p2.tobytes()


@pytest.mark.parametrize("n", [2 ** 61, 2 ** 62])
def test_lr_values_too_many_to_hold_is_a_memory_error_naming_n(n):
    """n up to 2**62 is in lr_values' range, but 4 n bytes past sys.maxsize are in no machine's
    memory: a MemoryError that says so and names the call (a bare OverflowError before; a
    smaller n that fails to allocate, such as 2**40 here, gets the same message)."""
    with pytest.raises(MemoryError, match=r"^mojo_train\.WarmupCosineLR\.lr_values: n=%d values need %d bytes"
                                          % (n, 4 * n)):
        WarmupCosineLR(1e-3, warmup_steps=10, total_steps=100).lr_values(n)
