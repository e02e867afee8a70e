"""The flush rule of the identical_ftz numeric mode (native/contracts/ftz.md).

Three things: the rule's functions (native/include/mt_ftz.h, compiled here by the C compiler)
against exact rational arithmetic on operands built to straddle FLT_MIN; the IR rewrite that puts
them under every float32 operation of the CPU oracle (native/cpu_oracle/mt_ftz_ir.py), on IR
written here; and the CPU oracle's identical_ftz library through the public API, beside its
identical library, on the boundary cases the contract names.
"""
import os
import random
import shutil
import struct
import subprocess
import sys
from fractions import Fraction

import pytest

import mojo_train as mt
from mojo_train import _native
from _helpers import c_compiler

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
INCLUDE = os.path.join(REPO, "native", "include")
sys.path.insert(0, os.path.join(REPO, "native", "cpu_oracle"))
import mt_ftz_ir  # noqa: E402

FLT_MIN = 2.0 ** -126
OPS = ("add", "sub", "mul", "div", "fma", "sqrt", "max", "min", "in", "from_double", "neg", "abs", "floor", "ceil",
       "trunc", "rint", "round")

HARNESS = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "mt_ftz.h"
static float f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t u(float x) { uint32_t v; memcpy(&v, &x, 4); return v; }
/* stdin: lines "<op> <hex> <hex> <hex>" (unused operands 0); stdout: the result's bits in hex.
   op 9 (from_double): the two words are a double's high and low halves. */
int main(void) {
    int op; unsigned a, b, c;
    while (scanf("%d %x %x %x", &op, &a, &b, &c) == 4) {
        float r = 0.0f;
        switch (op) {
        case 0: r = mt_ftz_add(f(a), f(b)); break;
        case 1: r = mt_ftz_sub(f(a), f(b)); break;
        case 2: r = mt_ftz_mul(f(a), f(b)); break;
        case 3: r = mt_ftz_div(f(a), f(b)); break;
        case 4: r = mt_ftz_fma(f(a), f(b), f(c)); break;
        case 5: r = mt_ftz_sqrt(f(a)); break;
        case 6: r = mt_ftz_max(f(a), f(b)); break;
        case 7: r = mt_ftz_min(f(a), f(b)); break;
        case 8: r = mt_ftz_in(f(a)); break;
        case 9: { uint64_t w = ((uint64_t)a << 32) | b; double d; memcpy(&d, &w, 8); r = mt_ftz_from_double(d); break; }
        case 10: r = mt_ftz_neg(f(a)); break;
        case 11: r = mt_ftz_abs(f(a)); break;
        case 12: r = mt_ftz_floor(f(a)); break;
        case 13: r = mt_ftz_ceil(f(a)); break;
        case 14: r = mt_ftz_trunc(f(a)); break;
        case 15: r = mt_ftz_rint(f(a)); break;
        case 16: r = mt_ftz_round(f(a)); break;
        default: return 2;
        }
        printf("%08x\n", u(r));
    }
    return 0;
}
"""


# ---- exact reference --------------------------------------------------------------------------
def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def flt(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def flushed(x):
    return (-0.0 if str(x).startswith("-") else 0.0) if 0 < abs(x) < FLT_MIN else x


def round32(v):
    """The float32 nearest the nonzero Fraction v (ties to even), for |v| >= FLT_MIN."""
    sign, m = (-1 if v < 0 else 1), abs(v)
    e = m.numerator.bit_length() - m.denominator.bit_length()
    if Fraction(2) ** e > m:
        e -= 1
    elif Fraction(2) ** (e + 1) <= m:
        e += 1
    scaled = m / Fraction(2) ** (e - 23)             # in [2^23, 2^24)
    q, r = divmod(scaled.numerator, scaled.denominator)
    twice = 2 * r
    if twice > scaled.denominator or (twice == scaled.denominator and q % 2 == 1):
        q += 1
    return sign * (float("inf") if e > 127 or (e == 127 and q == 2 ** 24) else q * 2.0 ** (e - 23))


def zero_sum_sign(x, y):
    """The sign of IEEE's exact zero x + y (both zero or cancelling), round to nearest."""
    neg = lambda z: str(z).startswith("-")
    return -0.0 if (x == 0 and y == 0 and neg(x) and neg(y)) else 0.0


def expected(op, a, b=0.0, c=0.0):
    """The rule's result for finite float32 operands (and from_double's double a)."""
    if op == "from_double":
        return flushed(a) if abs(a) < FLT_MIN else struct.unpack("<f", struct.pack("<f", a))[0]
    a, b, c = flushed(a), flushed(b), flushed(c)
    if op == "in":
        return a
    if op in ("neg", "abs"):
        return -a if op == "neg" else abs(a)
    if op in ("floor", "ceil", "trunc", "rint", "round"):
        import math
        if op == "rint":
            return math.copysign(float(round(a)), a) if abs(a) < 2 ** 23 else a     # ties to even, sign kept
        if op == "round":
            r = math.floor(abs(a) + 0.5) if abs(a) < 2 ** 23 else abs(a)
            return math.copysign(float(r), a)
        r = {"floor": math.floor, "ceil": math.ceil, "trunc": math.trunc}[op](a) if abs(a) < 2 ** 23 else a
        return math.copysign(float(r), a)      # a zero result keeps the operand's sign
    if op in ("max", "min"):
        if a == b:           # two zeros: max is +0, min is -0 (ftz.md)
            neg = str(a).startswith("-") and str(b).startswith("-") if op == "max" else \
                str(a).startswith("-") or str(b).startswith("-")
            return -0.0 if neg else 0.0
        return (max if op == "max" else min)(a, b)
    A, B, C = Fraction(a), Fraction(b), Fraction(c)
    if op == "sqrt":
        return f32(a ** 0.5) if a > 0 else a    # never tiny; sqrt(+-0) = +-0 (a is >= 0 here)
    if op == "div":
        v = A / B
        if v == 0:
            return -0.0 if (str(a).startswith("-") != str(b).startswith("-")) else 0.0
    elif op == "fma":
        v = A * B + C
        if v == 0:       # a zero product adds its signed zero to c; a nonzero one cancelled c: +0
            p = -0.0 if str(a).startswith("-") != str(b).startswith("-") else 0.0
            return zero_sum_sign(p, c) if A * B == 0 else 0.0
    elif op == "mul":
        v = A * B
        if v == 0:
            return -0.0 if str(a).startswith("-") != str(b).startswith("-") else 0.0
    else:
        v = A + B if op == "add" else A - B
        if v == 0:
            return zero_sum_sign(a, b if op == "add" else -b)
    if abs(v) < Fraction(FLT_MIN):
        return -0.0 if v < 0 else 0.0
    return round32(v)


# ---- operands ---------------------------------------------------------------------------------
def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def near_min_cases(rng):
    """(op, a, b, c) tuples built to straddle FLT_MIN, plus random ones across the exponent range."""
    cases, step = [], lambda x, k: flt(bits(x) + k)
    tiny = lambda: flt(rng.randrange(1, 0x800000)) * rng.choice((1, -1))
    for _ in range(3000):
        a = f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-100, 20)) * rng.choice((1, -1))
        b0 = f32(FLT_MIN / abs(a))
        d = f32(rng.uniform(1, 2) * 2.0 ** rng.randint(0, 20)) * rng.choice((1, -1))
        n0 = f32(FLT_MIN * abs(d))           # n0 / d is FLT_MIN within 2^-24: either side, either rounding
        for k in range(-3, 4):               # products and quotients at FLT_MIN and a few ulps either side
            b = step(b0, k) * rng.choice((1, -1))
            cases += [("mul", a, b, 0.0), ("fma", a, b, 0.0), ("div", step(n0, k) * rng.choice((1, -1)), d, 0.0)]
        # fma: a b tiny beside c at +-FLT_MIN (and its neighbours), and a b cancelling c to near FLT_MIN
        x = f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-126, -60)) * rng.choice((1, -1))
        y = f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-126, -60)) * rng.choice((1, -1))
        for cm in (FLT_MIN, step(FLT_MIN, 1), step(FLT_MIN, -1), step(FLT_MIN, 2)):
            cases.append(("fma", x, y, cm * rng.choice((1, -1))))
        p = Fraction(x) * Fraction(y)
        for target in (FLT_MIN, -FLT_MIN):
            c = f32(float(Fraction(target) - p))
            if abs(c) >= FLT_MIN:
                cases += [("fma", x, y, step(c, k)) for k in (-1, 0, 1)]
        s1, s2 = tiny(), rng.choice((tiny(), step(FLT_MIN, rng.randint(0, 3)) * rng.choice((1, -1))))
        cases += [("add", s1, s2, 0.0), ("sub", s1, s2, 0.0), ("add", step(FLT_MIN, 1), -FLT_MIN, 0.0),
                  ("sqrt", abs(s1), 0.0, 0.0), ("max", s1, s2, 0.0), ("min", s1, s2, 0.0), ("in", s1, 0.0, 0.0)]
    for _ in range(3000):                    # random operands over the whole exponent range
        r = [f32(rng.uniform(1, 2) * 2.0 ** rng.randint(-149, 100)) * rng.choice((1, -1)) for _ in range(3)]
        op = rng.choice(("add", "sub", "mul", "div", "fma"))
        cases.append((op, r[0], r[1], r[2] if op == "fma" else 0.0))
    tie = float.fromhex("0x1.fffffep-64")   # tie * 2^-63 rounds up to FLT_MIN from below
    cases += [("mul", tie, 2.0 ** -63, 0.0), ("mul", -tie, 2.0 ** -63, 0.0), ("fma", tie, 2.0 ** -63, 0.0),
              ("fma", tie, 2.0 ** -63, -0.0), ("mul", 2.0 ** -63, 2.0 ** -63, 0.0), ("add", 0.0, -0.0, 0.0),
              ("sub", -0.0, 0.0, 0.0), ("fma", -0.0, 1.0, -0.0), ("div", 0.0, -3.0, 0.0)]
    for x in (2.0 ** -140, -(2.0 ** -140), 0.0, -0.0, -2.5, 2.5, -0.5, 0.5, 1.5, -(2.0 ** -126), 3e38):
        cases += [(op, x, 0.0, 0.0) for op in ("neg", "abs", "floor", "ceil", "trunc", "rint", "round")]
    for x in (0.0, -0.0, 2.0 ** -140, -(2.0 ** -140)):
        for y in (0.0, -0.0, 2.0 ** -140, -(2.0 ** -140)):
            cases += [("max", x, y, 0.0), ("min", x, y, 0.0)]
    return [(op, a, b, c) for op, a, b, c in cases if not (op == "div" and flushed(b) == 0)]   # 0/0: not the rule's


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    cc = c_compiler()
    if not cc:
        pytest.skip("no C compiler: mt_ftz.h is not compiled here")
    work = tmp_path_factory.mktemp("ftz")
    src, exe = work / "ftz.c", work / "ftz"
    src.write_text(HARNESS)
    subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-fno-fast-math", "-I", INCLUDE, str(src), "-o",
                    str(exe), "-lm"], check=True)

    def run(rows):
        text = "".join("%d %08x %08x %08x\n" % r for r in rows)
        out = subprocess.run([str(exe)], input=text, capture_output=True, text=True, check=True).stdout.split()
        return [flt(int(w, 16)) for w in out]
    return run


def same(x, y):
    return bits(x) == bits(y)


def test_every_function_of_the_rule_gives_the_exact_results_flushed_before_rounding(harness):
    cases = near_min_cases(random.Random(20261204))
    got = harness([(OPS.index(op), bits(a), bits(b), bits(c)) for op, a, b, c in cases])
    bad = [(op, a.hex(), b.hex(), c.hex(), g.hex(), expected(op, a, b, c).hex())
           for (op, a, b, c), g in zip(cases, got) if not same(g, expected(op, a, b, c))]
    assert not bad, "%d of %d differ from the exact rule, e.g. %s" % (len(bad), len(cases), bad[:5])
    # the cases reach the rule's every branch: flushed products, kept ones, and FLT_MIN exactly
    kinds = {(op, bits(abs(expected(op, a, b, c))) == 0, abs(expected(op, a, b, c)) == FLT_MIN)
             for op, a, b, c in cases if op in ("mul", "div", "fma")}
    assert all((op, True, False) in kinds and (op, False, True) in kinds for op in ("mul", "div", "fma"))


def test_a_product_that_rounds_up_to_flt_min_is_flushed_with_its_sign(harness):
    tie = float.fromhex("0x1.fffffep-64")
    got = harness([(2, bits(tie), bits(2.0 ** -63), 0), (2, bits(-tie), bits(2.0 ** -63), 0),
                   (2, bits(2.0 ** -63), bits(2.0 ** -63), 0)])
    assert [bits(g) for g in got] == [0x00000000, 0x80000000, bits(FLT_MIN)]   # exactly FLT_MIN is kept


def test_a_double_just_below_flt_min_flushes_though_it_rounds_to_flt_min(harness):
    d = FLT_MIN * (1 - 2.0 ** -30)
    hi, lo = struct.unpack("<II", struct.pack("<d", d))[::-1]
    neg_hi, neg_lo = struct.unpack("<II", struct.pack("<d", -d))[::-1]
    got = harness([(9, hi, lo, 0), (9, neg_hi, neg_lo, 0)])
    assert [bits(g) for g in got] == [0x00000000, 0x80000000]
    assert bits(struct.unpack("<f", struct.pack("<f", d))[0]) == bits(FLT_MIN)    # plain rounding keeps it


# ---- the IR rewrite -----------------------------------------------------------------------------
IR = """define float @f(float %0, float %1, double %2) {
  %4 = fmul float %0, %1
  %5 = fadd float %4, 1.000000e+00
  %6 = fcmp olt float %5, %0
  %7 = call float @llvm.fma.f32(float %0, float %1, float %5)
  %8 = fptrunc double %2 to float
  %9 = fneg float %8
  %10 = call float @llvm.fabs.f32(float %9)
  %11 = select i1 %6, float %7, float %10
  ret float %11
}
declare float @llvm.fma.f32(float, float, float)
declare float @llvm.fabs.f32(float)
"""


def test_the_ir_rewrite_puts_every_float_operation_under_the_rule_and_leaves_bit_operations():
    out = mt_ftz_ir.rewrite(IR)
    assert "call float @mt_ftz_mul(float %0, float %1)" in out
    assert "call float @mt_ftz_add(float %4, float 1.000000e+00)" in out
    assert "call float @mt_ftz_fma(float %0, float %1, float %5)" in out
    assert "call float @mt_ftz_from_double(double %2)" in out
    assert "%6 = fcmp olt float %ftz.1, %ftz.2" in out and "%ftz.1 = call float @mt_ftz_in(float %5)" in out
    assert "%9 = call float @mt_ftz_neg(float %8)" in out and "%10 = call float @mt_ftz_abs(float %9)" in out
    assert "select i1 %6, float %7, float %10" in out          # a select moves bits
    for op in ("fmul float", "fadd float", "fneg float", "@llvm.fma.f32(float %0", "@llvm.fabs", "fptrunc"):
        assert op not in out.split("declare")[0]
    assert "declare float @mt_ftz_in(float)" in out


@pytest.mark.parametrize("line, why", [
    ("  %3 = fadd <4 x float> %1, %2", "vector"),
    ("  %3 = frem float %1, %2", "does not cover"),
    ("  %3 = call float @llvm.exp.f32(float %1)", "intrinsic"),
    ("  %3 = atomicrmw fadd float* %p, float 1.0 seq_cst", "does not cover"),
    ("  %3 = fpext float %1 to x86_fp80", "form"),
    ("  %3 = fptrunc x86_fp80 %1 to float", "form"),
    ("  %3 = fptrunc float %1 to half", "form"),
    ("  %3 = call float @mt_ftz_add(float %1, float 0x3800000000000000)", "below FLT_MIN"),   # 2^-127, folded
])
def test_the_ir_rewrite_refuses_what_it_cannot_map(line, why):
    with pytest.raises(mt_ftz_ir.Refused, match=why):
        mt_ftz_ir.rewrite("define void @g() {\n%s\n  ret void\n}\n" % line)


def test_the_ir_rewrite_reads_instructions_with_debug_metadata():
    out = mt_ftz_ir.rewrite("define float @h(double %0, float %1) {\n"
                            "  %3 = fptrunc double %0 to float, !dbg !7\n"
                            "  %4 = fpext float %1 to double, !dbg !8\n"
                            "  %5 = fadd float %3, %1, !dbg !9\n"
                            "  ret float %5\n}\n")
    assert "call float @mt_ftz_from_double(double %0)" in out and "call double @mt_ftz_to_double(float %1)" in out
    assert "%5 = call float @mt_ftz_add(float %3, float %1)" in out


def test_the_linked_check_refuses_an_external_function_of_float():
    text = "define void @g() {\n  ret void\n}\ndeclare float @expf(float)\ndeclare i32 @puts(i8*)\n"
    with pytest.raises(mt_ftz_ir.Refused, match="expf"):
        mt_ftz_ir.check_linked(text)
    mt_ftz_ir.check_linked(text.replace("declare float @expf(float)\n", ""))


# ---- the library -------------------------------------------------------------------------------
def _cpu(mode):
    try:
        return _native.load(mode, "cpu")
    except _native.BackendError:
        pytest.skip("the cpu oracle's %s numeric mode is not built (make)" % mode)


def test_the_ftz_library_says_what_it_is():
    ftz = _cpu("identical_ftz")
    assert ftz.numeric_mode == "identical_ftz" and ftz.has("flush_rule") and ftz.has("pinned_math")
    assert not _cpu("identical").has("flush_rule")


def test_the_ftz_library_flushes_where_the_identical_one_keeps_subnormals():
    from mojo_train.linear import linear_forward
    _cpu("identical_ftz")
    tie = float.fromhex("0x1.fffffep-64")
    a = mt.Array.from_list([tie, -tie, 2.0 ** -63], "float32").reshape(3, 1)
    w = mt.Array.from_list([2.0 ** -63], "float32").reshape(1, 1)
    keep = [bits(v) for v in linear_forward(a, w, None, numeric_mode="identical").reshape(3).tolist()]
    flush = [bits(v) for v in linear_forward(a, w, None, numeric_mode="identical_ftz").reshape(3).tolist()]
    assert keep == [bits(FLT_MIN), bits(-FLT_MIN), bits(FLT_MIN)]
    assert flush == [0x00000000, 0x80000000, bits(FLT_MIN)]
    x = mt.Array.from_list([2.0 ** -130, -(2.0 ** -130), 1.0], "float32")
    y = mt.Array.from_list([2.0 ** -131, 0.0, 2.0 ** -140], "float32")
    # 2^-130 reads +0, -2^-130 reads -0, and -0 + +0 is +0 (IEEE's exact zero); 2^-140 reads 0 too
    assert [bits(v) for v in mt.add(x, y, numeric_mode="identical_ftz").tolist()] == [0, 0, bits(1.0)]
    assert [bits(v) for v in mt.add(x, y, numeric_mode="identical").tolist()][:2] == [
        bits(2.0 ** -130 + 2.0 ** -131), bits(-(2.0 ** -130))]


def test_a_move_keeps_subnormal_bits_and_a_comparison_reads_them_flushed():
    from mojo_train.elementwise import relu_forward
    from mojo_train.embedding import embedding_forward
    _cpu("identical_ftz")
    table = mt.Array.from_list([2.0 ** -140, -(2.0 ** -149), 1.0, 2.0], "float32").reshape(2, 2)
    got = embedding_forward(table, [0, 1, 0], numeric_mode="identical_ftz")
    assert [bits(v) for v in got.reshape(6).tolist()] == [bits(v) for v in (2.0 ** -140, -(2.0 ** -149), 1.0, 2.0,
                                                                             2.0 ** -140, -(2.0 ** -149))]
    x = mt.Array.from_list([2.0 ** -140, -(2.0 ** -140), 3.0], "float32")
    assert [bits(v) for v in relu_forward(x, numeric_mode="identical").tolist()][0] == bits(2.0 ** -140)
    # under the rule x > 0 reads +0 > 0: false, so the ReLU of a positive subnormal is 0
    assert bits(relu_forward(x, numeric_mode="identical_ftz").tolist()[0]) in (0x00000000,)


# ---- the CUDA library's flags ---------------------------------------------------------------
_F32_ARITH = r"^\s+(add|sub|mul|fma|div|sqrt|rcp|neg|abs|min|max|setp\.[a-z]+|cvt\.r[a-z]+i?)(\.r[nzmp])?(\.ftz)?\.f32\b"


def test_the_cuda_identical_ftz_flags_put_ftz_on_every_float32_instruction(tmp_path):
    """nvcc with the Makefile's NVCC_MODE_identical_ftz gives every float32 arithmetic, comparison
    and rounding instruction its .ftz form (PTX: subnormal inputs and results flushed), negation and
    abs included (ftz.md rule 5), and selects none (selp moves bits). Whether the hardware's flush
    judges tininess before rounding is the GPU's to answer (bench/ftz_probe_cuda.cu)."""
    import re
    nvcc = shutil.which("nvcc")
    if not nvcc:
        pytest.skip("nvcc is not installed")
    with open(os.path.join(REPO, "Makefile")) as f:
        flags = re.search(r"^NVCC_MODE_identical_ftz := (.*)$", f.read(), re.M).group(1).split()
    ptx = tmp_path / "probe.ptx"
    subprocess.run([nvcc, "-ptx", "-O2", "-arch=sm_90", "-I", INCLUDE, "-I", os.path.join(REPO, "native", "metal"),
                    *flags, os.path.join(REPO, "bench", "ftz_probe_cuda.cu"), "-o", str(ptx)], check=True)
    ops = re.findall(_F32_ARITH, ptx.read_text(), re.M)
    assert ops and all(ftz for _, _, ftz in ops), ops
    kinds = {op.split(".")[0] for op, _, _ in ops}
    assert {"add", "mul", "fma", "div", "sqrt", "neg", "abs", "max", "min", "setp", "cvt"} <= kinds
