/* mt_pinned_math.h -- part of mt_pinned.h (the one definition of every pinned routine): exp, log, log1p, erf, tanh and 1 + erf, float32 only (contract: native/contracts/math.md).
 * Included by mt_pinned.h after its core (bits, trees, optimizer updates, Philox), in the order
 * math, layers, elementwise, each part using only what comes before it; including a part alone
 * includes mt_pinned.h first. */
#ifndef MT_PINNED_MATH_H
#define MT_PINNED_MATH_H
#include "mt_pinned.h"

/* GPU device code (mt_math_k reads k from bits there). */
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MT_MATH_GPU_DEVICE 1
#else
#define MT_MATH_GPU_DEVICE 0
#endif

/* CUDA device code of the exact modes: x / d and sqrt(v) on known ranges without the range
 * check (mt_math_div_by below). */
#if MT_CUDA_DEVICE && MT_NUMERIC_MODE != MT_MODE_FAST
#define MT_MATH_UNGUARDED 1
#else
#define MT_MATH_UNGUARDED 0
#endif

/* ==== pinned exp, log, log1p, erf, tanh (contract: native/contracts/math.md) ===============
 * Float32-only (no double: Metal has none), no libm call but fmaf, every step a correctly
 * rounded binary32 + - * / or fmaf in the order written, IEEE gradual underflow. Measured by
 * the exhaustive sweep `make math-sweep` (bench/results/math_sweep.md) over all 2^32 inputs:
 * max error 0.5203 ulp (exp), 0.5419 (log), 0.5551 (log1p) -- stated bounds 0.521, 0.542,
 * 0.556 ulp (math.md) -- and correctly rounded for 99.993% to 99.995% of inputs; erf, tanh
 * and 1 + erf (at the end of the section, for GELU) have their own bounds in math.md. Special
 * values are deterministic on every vendor; every NaN result is the one canonical quiet NaN
 * 0x7fc00000 (a vendor's own NaN bits differ).
 * Coefficients: weighted least squares on Chebyshev points in 60-digit mpmath, each rounded
 * to the nearest float in turn with the rest refitted; tests/test_pinned_math.py re-derives
 * them. Literals are exact decimal expansions of the floats (hex bits in the comments). */

#define MT_MATH_QNAN 0x7fc00000u
#define MT_MATH_PINF 0x7f800000u
#define MT_MATH_NINF 0xff800000u

/* 2^k for -126 <= k <= 127, built in the exponent field. */
MT_HD float mt_math_pow2i(int k) { return mt_bits_f32((uint32_t)(k + 127) << 23); }

/* c ? a : b on the bits (c is 0 or 1): a select without a branch, which compilers keep as
 * one (a chain of ?: on floats may become jumps that block vectorizing). */
MT_HD float mt_math_pick(int c, float a, float b) {
    uint32_t mask = 0u - (uint32_t)c;
    return mt_bits_f32((mt_f32_bits(a) & mask) | (mt_f32_bits(b) & ~mask));
}

/* The integer k of a round-to-integer by the shift t = v + 1.5 * 2^23 (so kf = t - 1.5 * 2^23 and
 * |k| < 2^22): t = 1.5 * 2^23 + k exactly, so k is t's bits less 0x4b400000 -- the value of
 * (int)kf by an integer subtraction instead of a float-to-int conversion (a quarter-rate
 * instruction on a GPU, F2I), which the exp's scaling then turns into bits with one more. */
MT_HD int mt_math_shifted_int(float t) { return (int)(mt_f32_bits(t) - 0x4b400000u); }

/* k of that round-to-integer, t the shifted sum and kf = t - 1.5 * 2^23: from t's bits in GPU
 * device code (no F2I), as (int)kf elsewhere -- a CPU's vectorized loops convert as cheaply, and
 * GELU's CPU loop measured ~3% slower from the bits (twenty-eighth session). One integer. */
MT_HD int mt_math_k(float t, float kf) {
#if MT_MATH_GPU_DEVICE
    return mt_math_shifted_int(t);   /* kf unused here, t unused below: same integer */
#else
    return (int)kf;
#endif
}

/* x / d and sqrt(v) without the GPU's range checks, where the caller knows its operands lie far
 * from the float range's ends (each caller says why). CUDA's IEEE quotient and square root are
 * a hardware estimate refined by fmas -- for x / d: r = rcp(d) and one Newton step, q = x r, then
 * one remainder correction; for sqrt(v): y = v rsqrt(v), then one correction -- behind a range
 * check (FCHK for the quotient, an exponent test for the root) that branches to a slow path near
 * zero, the subnormals, the overflow threshold and the specials. These are the same instructions
 * as nvcc's own fast paths (sm_90), which give IEEE's result wherever the check passes; inside
 * the callers' ranges it would, and no intermediate is subnormal there, so the .ftz forms that
 * identical_ftz's flags give the fmas change nothing either. So the sequence alone gives the
 * same bits without the check, its branch and its reconvergence: CUDA device code of the exact
 * modes takes it (MT_MATH_UNGUARDED; the root, mt_math_sqrt_pos, is Box-Muller's, in
 * mt_pinned_elementwise.h); every other build (CPU, HIP, Metal, the fast mode, whose operators
 * are approximate) the IEEE operators. Exactness rests on the estimates' actual accuracy (a
 * worse estimate within PTX's stated bound could miss by an ulp), so it is checked on the GPU
 * for every input each caller can receive (bench/unguarded_sweep_cuda.cu,
 * bench/silu_division_sweep.py), on sm_90; a newer architecture that JIT-compiles the PTX runs
 * the sweeps again. */

/* What mt_math_div_by takes for the divisor d: its refined reciprocal on the GPU sequence, d
 * itself elsewhere. Formed once for quotients that share d. */
MT_HD float mt_math_divisor(float d) {
#if MT_MATH_UNGUARDED
    float y;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(d));
    return __fmaf_rn(y, __fmaf_rn(-d, y, 1.0f), y);
#else
    return d;
#endif
}

/* x / d with r = mt_math_divisor(d): IEEE's bits where d is normal in [2^-60, 2^100] in
 * magnitude, x is +0 or |x| >= 2^-100 (a remainder that needs correcting is then at least
 * |x| 2^-26: normal and exact), and 2^-126 <= |x / d| < 2^127 (x = -0 would give +0). */
MT_HD float mt_math_div_by(float x, float d, float r) {
#if MT_MATH_UNGUARDED
    float q = __fmul_rn(x, r);
    return __fmaf_rn(__fmaf_rn(-d, q, x), r, q);
#else
    (void)r;
    return x / d;
#endif
}

/* ln 2 = MT_LN2_HI + MT_LN2_LO: the nearest float, then the nearest float to the rest. */
#define MT_LN2_HI 0.693147182464599609375f                      /* 0x3f317218 */
#define MT_LN2_LO -1.9046542121259335544891655445098876953125e-9f /* 0xb102e308 */

/* Steps 1-2 of math.md's mt_expf for a clamped x (-104 <= x <= 89): k (as the float kf,
 * an integer value, and as the int *k_out) and e^r as the unevaluated pair s2 + *lo, so that
 * e^x = (s2 + lo) 2^k. The one definition both mt_expf and mt_expf_mid round. */
MT_HD float mt_math_exp_pair(float xs, MT_THREAD float *kf_out, MT_THREAD int *k_out, MT_THREAD float *lo_out) {
    const float INV_LN2 = 1.44269502162933349609375f;   /* 0x3fb8aa3b */
    const float SHIFT = 12582912.0f;                   /* 0x4b400000 = 1.5 * 2^23 */
    const float P0 = 0.16666667163372039794921875f;          /* 0x3e2aaaab */
    const float P1 = 0.0416666679084300994873046875f;        /* 0x3d2aaaab */
    const float P2 = 0.008333198726177215576171875f;         /* 0x3c0887f8 */
    const float P3 = 0.001388860284350812435150146484375f;   /* 0x3ab60a6b */
    const float P4 = 0.000199524001800455152988433837890625f; /* 0x39513751 */
    const float P5 = 0.000024987515644170343875885009765625f; /* 0x37d19c48 */
    float shifted = fmaf(xs, INV_LN2, SHIFT);
    float kf = shifted - SHIFT;                      /* round to nearest integer, -150 <= k <= 128 */
    float rhi = fmaf(-kf, MT_LN2_HI, xs);            /* exact */
    float corr = -kf * MT_LN2_LO;
    float s = 1.0f + rhi;
    float e0 = (1.0f - s) + rhi;                     /* 1 + rhi = s + e0 */
    float r2 = rhi * rhi;
    float r2lo = fmaf(rhi, rhi, -r2);                /* rhi^2 = r2 + r2lo */
    /* h = 0.5 r2 never formed: s2 = s + h, e1 = h - (s2 - s) and 0.5 r2lo + (e0 + e1) each as
     * one fmaf of the halving, the same bits as math.md's separate steps: the halving is exact
     * unless r2 or r2lo is below 2^-125 (a tiny rhi), and there the half lies far below half an ulp
     * of what it meets (s >= 0.65; e0 + e1 = rhi) or is the result itself (e1 = h when s2 = s).
     * bench/expf_identity.c checks every float. Two operations fewer an exp. */
    float s2 = fmaf(0.5f, r2, s);                    /* s + h */
    float e1 = fmaf(0.5f, r2, s - s2);               /* s + h = s2 + e1 (s - s2 exact) */
    float p = P5;
    p = fmaf(p, rhi, P4);
    p = fmaf(p, rhi, P3);
    p = fmaf(p, rhi, P2);
    p = fmaf(p, rhi, P1);
    p = fmaf(p, rhi, P0);
    float lo = (r2 * rhi) * p + fmaf(0.5f, r2lo, e0 + e1);
    *lo_out = lo + corr * (s2 + lo);
    *kf_out = kf;
    *k_out = mt_math_k(shifted, kf);
    return s2;
}

/* e^x. Special: NaN -> NaN; x > 88.72283172607421875 (the largest x with a finite
 * result; +inf included) -> +inf; x < -103.972076416015625 (every smaller float has
 * e^x < 2^-150; -inf included) -> +0; |x| < 2^-25 -> 1 (e^x rounds to 1 there).
 * Otherwise k = nearest integer to x / ln2 and rhi = x - k * MT_LN2_HI, exact under fmaf
 * (|rhi| <= 0.3466, a multiple of 2^-25); corr = -k * MT_LN2_LO. e^rhi is carried as the
 * unevaluated sum s2 + lo: 1 + rhi = s + e0 and s + rhi^2/2 = s2 + e1 exactly (Fast2Sum,
 * rhi^2 split exactly by fmaf), lo = rhi^3 P(rhi) + (rhi^2 rounding error / 2 + (e0 + e1)),
 * P ~ (e^r - 1 - r - r^2/2) / r^3 of degree 5 on |r| <= 0.35; then e^(rhi + corr) adds
 * corr * (s2 + lo) to lo. y0 = s2 + lo is rounded once, then scaled by 2^k exactly in two
 * normal steps, 2 then 2^(k - 1), so k = 128 overflows correctly. When k < -125 the result
 * may be subnormal: the pair is scaled by 2^(k+64) exactly, rounded once onto the subnormal
 * grid by * 2^-64, and that rounding's exact error is added back under one fmaf: one
 * rounding in all.
 * Branch-free, so that a loop of it vectorizes: x is clamped to [-104, 89] first (a NaN
 * becomes -104), and the special results then come out of the main path itself: e^x of a
 * clamped 89 overflows to +inf, of a clamped -104 rounds to +0, and for |x| < 2^-25 the
 * pair rounds to 1. Both scalings are formed, each with an exponent that is valid in every
 * lane, and mt_math_pick chooses; a NaN input picks the canonical NaN last. The same bits as
 * the branching form this contract was measured with, for all 2^32 inputs, scalar and
 * vectorized (bench/expf_identity.c). */
MT_HD float mt_expf(float x) {
    int is_nan = (mt_f32_bits(x) & 0x7fffffffu) > 0x7f800000u;
    float xs = x > -104.0f ? x : -104.0f;            /* NaN and -inf too */
    xs = xs < 89.0f ? xs : 89.0f;
    float kf, lo;
    int k;
    float s2 = mt_math_exp_pair(xs, &kf, &k, &lo);
    int sub = k < -125;                              /* subnormal or near: one rounding */
    int keep_k = sub - 1;                            /* 0 when sub, all ones otherwise */
    float sc = mt_math_pow2i((k + 64) & ~keep_k);    /* 2^(k+64) when sub, else 1 */
    float sm = s2 * sc;                              /* exact */
    float smlo = lo * sc;
    float sy = sm * mt_math_pow2i(-64);              /* the rounding onto the grid */
    float serr = sm - sy * mt_math_pow2i(64);        /* exact */
    float ysub = fmaf(serr + smlo, mt_math_pow2i(-64), sy);
    float y0 = s2 + lo;
    float ynorm = (y0 * 2.0f) * mt_math_pow2i((k & keep_k) - 1);   /* exact, or overflow */
    return mt_math_pick(is_nan, mt_bits_f32(MT_MATH_QNAN), mt_math_pick(sub, ysub, ynorm));
}

/* mt_expf(x) for MT_EXPF_MID_LO <= x <= MT_EXPF_MID_HI, the same bits in fewer operations:
 * there k lies in [-125, 127], so no clamp, no NaN and no subnormal scaling is needed, and
 * y0 * 2^k (one exact product: y0 in [0.70, 1.42], the result normal and finite) equals
 * mt_expf's (y0 * 2) * 2^(k - 1). Outside that range the result is unspecified: callers
 * test the range first (a softmax row tests min - max once). Checked against mt_expf for
 * every float of the range by bench/expf_identity.c (tests/test_pinned_math.py). */
#define MT_EXPF_MID_LO -86.5f
#define MT_EXPF_MID_HI 88.0f
MT_HD float mt_expf_mid(float x) {
    float kf, lo;
    int k;
    float s2 = mt_math_exp_pair(x, &kf, &k, &lo);
    return (s2 + lo) * mt_math_pow2i(k);
}

/* e * ln2 + log1p(f + flo), the core of mt_logf and mt_log1pf: e an integer-valued float
 * (|e| <= 149), f + flo in [sqrt(1/2) - 1, sqrt(2) - 1] with f a float, flo = 0 or
 * |flo| <= half an ulp of 1 + f (so |f| >= |flo| unless f == 0).
 * log1p(g) = 2 atanh(sv), sv = g / (2 + g) = shi + slo (|sv| <= 0.1716): shi = fl(num / den)
 * and slo from the exact fmaf remainder; 2 atanh(sv) = 2 shi + 2 slo + shi^3 Q(shi^2),
 * Q ~ (2 atanh(s) - 2 s) / s^3 in z = s^2 of degree 3 on 0 <= z <= 0.0295. e * ln2 =
 * ahi + alo (ahi = e * MT_LN2_HI, its rounding error by fmaf, plus e * MT_LN2_LO);
 * ahi + 2 shi = sum + err exactly (Fast2Sum); the result is sum + (small terms), one
 * final rounding of an error of a few 2^-30 relative. mt_math_log_finish is the part after
 * the quotient. */
MT_HD float mt_math_log_finish(float e, float shi, float slo) {
    const float Q0 = 0.66666662693023681640625f;       /* 0x3f2aaaaa */
    const float Q1 = 0.400008141994476318359375f;      /* 0x3ecccdde */
    const float Q2 = 0.28513240814208984375f;          /* 0x3e91fce0 */
    const float Q3 = 0.23964299261569976806640625f;    /* 0x3e7564f9 */
    float z = shi * shi;
    float q = Q3;
    q = fmaf(q, z, Q2);
    q = fmaf(q, z, Q1);
    q = fmaf(q, z, Q0);
    float t = (shi * z) * q;
    float ahi = MT_MUL_SPLIT(e, MT_LN2_HI);
    float alo = fmaf(e, MT_LN2_HI, -ahi) + e * MT_LN2_LO;
    float b = 2.0f * shi;
    float sum = ahi + b;
    float err = b - (sum - ahi);                     /* ahi + b = sum + err (|ahi| >= |b| or ahi == 0) */
    return sum + (((t + 2.0f * slo) + alo) + err);
}

MT_HD float mt_math_log_core(float e, float f, float flo) {
    float nhi = f + flo;
    float nlo = flo - (nhi - f);                     /* f + flo = nhi + nlo */
    float dhi = 2.0f + f;
    float dlo = ((2.0f - dhi) + f) + flo;            /* 2 + f + flo = dhi + dlo (to 2^-48) */
    float shi = nhi / dhi;
    float rem = fmaf(-shi, dhi, nhi);                /* exact remainder */
    float slo = (rem + (nlo - shi * dlo)) / dhi;
    return mt_math_log_finish(e, shi, slo);
}

/* mt_math_log_core(e, f, 0) for f != -0, the same bits in fewer operations: with flo = +0,
 * nhi = f + 0 = f (f is not -0), nlo = 0 - (f - f) = +0, dlo's + 0 changes no value (the sum
 * before it is never -0: 2 - dhi is not), and rem + (0 - p) = rem - p (they could differ only
 * for rem = -0, p = +0, but an exact fmaf remainder of f != -0 is never -0). The two quotients
 * (mt_math_log_quotients) share dhi, and take the unguarded GPU sequence where f = m - 1 of a
 * split (mt_math_split): then f is 0 or a multiple of 2^-24 of magnitude at least 2^-24, dhi
 * lies in [1.70, 2.42], and rem - p is +0 or at least 2^-68 in magnitude (a reviewer's
 * exhaustive count), inside mt_math_div_by's range (bench/unguarded_sweep_cuda.cu compares
 * both quotients with IEEE's on the GPU for every such f). */
MT_HD void mt_math_log_quotients(float f, MT_THREAD float *shi_out, MT_THREAD float *slo_out) {
    float dhi = 2.0f + f;
    float dlo = (2.0f - dhi) + f;                    /* 2 + f = dhi + dlo exactly */
    float r = mt_math_divisor(dhi);
    float shi = mt_math_div_by(f, dhi, r);
    float rem = fmaf(-shi, dhi, f);                  /* exact remainder */
    *shi_out = shi;
    *slo_out = mt_math_div_by(rem - shi * dlo, dhi, r);
}

MT_HD float mt_math_log_core_f(float e, float f) {
    float shi, slo;
    mt_math_log_quotients(f, &shi, &slo);
    return mt_math_log_finish(e, shi, slo);
}

/* Splits a positive normal float v as 2^e * m with m in [sqrt(1/2), sqrt(2)) (bits
 * 0x3f3504f3 .. 0x3fb504f2): integer arithmetic on the bits only. */
MT_HD float mt_math_split(float v, MT_THREAD int *e) {
    uint32_t d = mt_f32_bits(v) - 0x3f3504f3u + 0x40000000u;   /* + 128 << 23: stays >= 0 */
    *e = (int)(d >> 23) - 128;
    return mt_bits_f32((d & 0x7fffffu) + 0x3f3504f3u);
}

/* ln x. Special: NaN -> NaN; x < 0 (-inf, -0 excluded) -> NaN; +-0 -> -inf; +inf -> +inf;
 * 1 -> +0. A subnormal x = n * 2^-149 is read as the float n (exact, integer conversion of
 * the bits: no subnormal arithmetic) with 149 taken off e. x = 2^e * m, f = m - 1 (exact). */
MT_HD float mt_logf(float x) {
    uint32_t u = mt_f32_bits(x);
    int e, eoff = 0;
    if (u >= 0x7f800000u) {                          /* +inf, NaN, or sign bit set */
        if (u == 0x7f800000u) return x;
        if (u == 0x80000000u) return mt_bits_f32(MT_MATH_NINF);
        return mt_bits_f32(MT_MATH_QNAN);
    }
    if (u == 0u) return mt_bits_f32(MT_MATH_NINF);
    if (u < 0x00800000u) {
        x = (float)(int32_t)u;
        eoff = -149;
    }
    float m = mt_math_split(x, &e);
    return mt_math_log_core_f((float)(e + eoff), m - 1.0f);
}

/* ln(1 + x). Special: NaN -> NaN; x < -1 (-inf included) -> NaN; -1 -> -inf; +inf -> +inf;
 * |x| < 2^-24 -> x (log1p(x) rounds to x there; +-0 and subnormals keep their bits).
 * For sqrt(1/2) - 1 < x < sqrt(2) - 1 (bits bounds 0xbe95f619 <= x < 0x3ed413cd): the core
 * with e = 0, f = x exactly. Otherwise 1 + x = v + c exactly (2Sum), v = 2^e * m, and
 * flo = c * 2^-e (two exact power-of-two steps; subnormal only when e >= 127, where it
 * cannot matter), the core with f = m - 1. */
MT_HD float mt_log1pf(float x) {
    uint32_t u = mt_f32_bits(x), ax = u & 0x7fffffffu;
    if (ax > 0x7f800000u) return mt_bits_f32(MT_MATH_QNAN);
    if (ax < 0x33800000u) return x;                              /* |x| < 2^-24 */
    if (u == 0x7f800000u) return x;
    if (u >= 0xbf800000u) return mt_bits_f32(u == 0xbf800000u ? MT_MATH_NINF : MT_MATH_QNAN);
    if (x >= -0.2928932011127471923828125f && x < 0.4142135679721832275390625f)
        return mt_math_log_core(0.0f, x, 0.0f);
    float v = 1.0f + x;
    float bv = v - 1.0f;
    float c = (1.0f - (v - bv)) + (x - bv);          /* 1 + x = v + c (Knuth's 2Sum) */
    int e;
    float m = mt_math_split(v, &e);
    int e1 = e / 2;
    float flo = (c * mt_math_pow2i(-e1)) * mt_math_pow2i(e1 - e);
    return mt_math_log_core((float)e, m - 1.0f, flo);
}

/* ---- erf, tanh and 1 + erf (math.md, "mt_erff", "mt_tanhf", "mt_one_plus_erff") --------
 * erf and tanh are odd: computed on a = |x| and given x's sign bit (exact, so f(-x) = -f(x) bit for
 * bit and f(-0) = -0). Branch-free like mt_expf: both pieces are formed and mt_math_pick
 * chooses, so that a loop of them vectorizes. Their tails take e^v as the unevaluated pair
 * of mt_math_exp_pair (2^-31 relative) rather than a rounded mt_expf, so the one rounding that
 * matters is the last. mt_one_plus_erff (GELU's 1 + erf) is neither odd nor carried in pairs:
 * one formula, no pieces, held to an absolute error, at about a third of mt_erff's cost. */

/* erf(a)/a - 1 ~ EA(s), s = a*a, a < 0.6875: the polynomial piece of mt_erff, degree 5 by
 * Horner with fmaf (math.md, "mt_erff" step 2). */
MT_HD_INLINE float mt_math_erf_small(float s) {
    const float EA0 = 0.128379166126251220703125f;          /* 0x3e0375d4 */
    const float EA1 = -0.37612628936767578125f;             /* 0xbec093a0 */
    const float EA2 = 0.11283566057682037353515625f;        /* 0x3de71662 */
    const float EA3 = -0.02684639580547809600830078125f;    /* 0xbcdbecf9 */
    const float EA4 = 0.0051435814239084720611572265625f;   /* 0x3ba88b7d */
    const float EA5 = -0.0007000532350502908229827880859375f; /* 0xba3783c7 */
    float p = EA5;
    p = fmaf(p, s, EA4);
    p = fmaf(p, s, EA3);
    p = fmaf(p, s, EA2);
    p = fmaf(p, s, EA1);
    return fmaf(p, s, EA0);
}

/* erf(x). Special: NaN -> NaN; +-inf -> +-1; a = |x| is clamped to 4 first, where the tail gives
 * exactly 1 (erf a rounds to 1 from 3.9192059; this gives 1 from 3.9223275 on, and 1 or
 * 1 - 2^-24 between, both within its bound). a < 0.6875: erf = a + a p (one fmaf), p = EA(s)
 * ~ erf(a)/a - 1 in s = a*a of degree 5, plus slo * (EA1 + 2 EA2 s) for the rounding error
 * slo of s. a >= 0.6875: erf = 1 - e^(-s - slo) R(a), R ~ e^(a^2) erfc(a) of degree 10 in
 * d = a - 1 (exact), with e^-s a pair from mt_math_exp_pair, R's last Horner step split
 * exactly into rh + rl, their product a pair, and 1 - product by Fast2Sum: one final
 * rounding. Measured: < 0.625 ulp (math.md). */
MT_HD_INLINE float mt_erff(float x) {
    const float EB0 = 0.42758357524871826171875f;           /* 0x3edaec3c */
    const float EB1 = -0.2732120454311370849609375f;        /* 0xbe8be273 */
    const float EB2 = 0.15437136590480804443359375f;        /* 0x3e1e1387 */
    const float EB3 = -0.0792253911495208740234375f;        /* 0xbda240ec */
    const float EB4 = 0.0375766940414905548095703125f;      /* 0x3d19ea05 */
    const float EB5 = -0.0166875831782817840576171875f;     /* 0xbc88b466 */
    const float EB6 = 0.0069728852249681949615478515625f;   /* 0x3be47ccd */
    const float EB7 = -0.002646744251251220703125f;         /* 0xbb2d7500 */
    const float EB8 = 0.0008121918071992695331573486328125f; /* 0x3a54e945 */
    const float EB9 = -0.0001647035242058336734771728515625f; /* 0xb92cb444 */
    const float EB10 = 0.00001548634099890477955341339111328125f; /* 0x3781e8aa */
    uint32_t u = mt_f32_bits(x);
    int is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    float a = mt_bits_f32(u & 0x7fffffffu);
    a = mt_math_pick(a < 4.0f, a, 4.0f);             /* NaN and inf too; a select, not a branch */
    float s = a * a;
    float slo = fmaf(a, a, -s);                      /* a^2 = s + slo */
    float p = mt_math_erf_small(s);                  /* a < 0.6875 */
    const float EA1 = -0.37612628936767578125f;             /* 0xbec093a0: mt_math_erf_small's */
    const float EA2 = 0.11283566057682037353515625f;        /* 0x3de71662 */
    p = fmaf(slo, fmaf(2.0f * EA2, s, EA1), p);
    float ysmall = fmaf(a, p, a);
    float kf, lo;                                    /* a >= 0.6875: e^-s = (s2 + lo) 2^k */
    int k;
    float s2 = mt_math_exp_pair(-s, &kf, &k, &lo);
    float eh = s2 + lo;
    float el = (s2 - eh) + lo;                       /* s2 + lo = eh + el */
    el = fmaf(-eh, slo, el);                         /* times e^-slo = 1 - slo */
    float d = a - 1.0f;                              /* exact */
    float r = EB10;
    r = fmaf(r, d, EB9);
    r = fmaf(r, d, EB8);
    r = fmaf(r, d, EB7);
    r = fmaf(r, d, EB6);
    r = fmaf(r, d, EB5);
    r = fmaf(r, d, EB4);
    r = fmaf(r, d, EB3);
    r = fmaf(r, d, EB2);
    r = fmaf(r, d, EB1);
    float t = r * d;
    float tl = fmaf(r, d, -t);                       /* r d = t + tl */
    float rh = EB0 + t;
    float rl = ((EB0 - rh) + t) + tl;                /* EB0 + r d = rh + rl (|t| <= 0.29 < EB0) */
    float ph = eh * rh;
    float pl = fmaf(eh, rh, -ph) + (eh * rl + el * rh);
    float sc = mt_math_pow2i(k);                     /* 2^k, -23 <= k <= 0: exact scalings */
    ph = ph * sc;
    pl = pl * sc;
    float th = 1.0f - ph;
    float terr = (1.0f - th) - ph;                   /* 1 - ph = th + terr */
    float ytail = th + (terr - pl);
    float y = mt_math_pick(a < 0.6875f, ysmall, ytail);
    y = mt_bits_f32(mt_f32_bits(y) | (u & 0x80000000u));
    return mt_math_pick(is_nan, mt_bits_f32(MT_MATH_QNAN), y);
}

/* 1 + erf(x) = erfc(-x), GELU's cdf doubled, and e^-(a^2) beside it (math.md,
 * "mt_one_plus_erff", version 3): Abramowitz and Stegun 7.1.26, the form torch's own CPU
 * erf takes, held to an absolute error. Special: NaN -> NaN; a = |x| >= 4 (+-inf too) -> 2
 * for x > 0, +0 for x < 0, and *ex = +0. Otherwise t = 1 / (1 + P a) (fmaf, one IEEE
 * division), q = A1 + t (A2 + t (A3 + t (A4 + t A5))) by Horner with fmaf, s = a * a,
 * e^-s as 2^k e^r with k = nearest integer to -s / ln2 (in [-23, 0] for s < 16),
 * r = -s - k ln2 (two fmaf steps with MT_LN2_HI and MT_LN2_LO), e^r = 1 + r (1 + r X(r)),
 * X of degree 4 (GX, fitted to (e^r - 1 - r) / r^2), scaled by 2^k exactly;
 * erfc(a) ~ (q * t) * e^-s, and the result erfc (x < 0) or 2 - erfc (x >= 0).
 * P and A1..A5 are the published constants, each rounded to the nearest float32.
 * Measured over every float (bench/math_sweep.c): within 11.21 ulp of max(1 + erf x, 1/4) (at most 6.4e-7 absolute);
 * relative to erfc(a) within 0.28% where x < 0. *ex is e^-s (what GELU's gradient takes for
 * its pdf), +0 past the clamp. Past the clamp only e is cut to +0 (erfc = (q * t) * 0), so
 * that a loop takes two selects: mt_one_plus_erf_exp gives a NaN (its payload unspecified)
 * for a NaN x, which GELU, refusing NaN, never returns; mt_one_plus_erff makes it canonical. */
MT_HD_INLINE float mt_one_plus_erf_exp(float x, MT_THREAD float *ex) {
    const float P = 0.3275910913944244384765625f;       /* 0x3ea7ba05: float(0.3275911) */
    const float A1 = 0.2548295855522155761718750f;      /* 0x3e827906: float(0.254829592) */
    const float A2 = -0.2844967246055603027343750f;     /* 0xbe91a98e: float(-0.284496736) */
    const float A3 = 1.4214137792587280273437500f;      /* 0x3fb5f0e3: float(1.421413741) */
    const float A4 = -1.4531520605087280273437500f;     /* 0xbfba00e3: float(-1.453152027) */
    const float A5 = 1.0614054203033447265625000f;      /* 0x3f87dc22: float(1.061405429) */
    const float GX0 = 0.5f; /* 0x3f000000 */
    const float GX1 = 0.16666509211063385009765625f; /* 0x3e2aaa41 */
    const float GX2 = 0.041666448116302490234375f; /* 0x3d2aaa70 */
    const float GX3 = 0.008369930088520050048828125f; /* 0x3c092208 */
    const float GX4 = 0.001393659971654415130615234375f; /* 0x3ab6ab78 */
    const float INV_LN2 = 1.44269502162933349609375f;   /* 0x3fb8aa3b */
    const float SHIFT = 12582912.0f;                   /* 0x4b400000 = 1.5 * 2^23 */
    uint32_t u = mt_f32_bits(x);
    float a = mt_bits_f32(u & 0x7fffffffu);
    int inside = a < 4.0f;                           /* false for inf and NaN */
    float t = 1.0f / fmaf(P, a, 1.0f);               /* +0 for inf; no clamp needed here */
    float q = A5;
    q = fmaf(q, t, A4);
    q = fmaf(q, t, A3);
    q = fmaf(q, t, A2);
    q = fmaf(q, t, A1);
    float s = mt_math_pick(inside, a * a, 16.0f);    /* the exp's input stays in range */
    float shifted = fmaf(-s, INV_LN2, SHIFT);
    float kf = shifted - SHIFT;                      /* k in [-23, 0] (s <= 16) */
    float r = fmaf(-kf, MT_LN2_HI, -s);              /* exact */
    r = fmaf(-kf, MT_LN2_LO, r);
    float xr = GX4;
    xr = fmaf(xr, r, GX3);
    xr = fmaf(xr, r, GX2);
    xr = fmaf(xr, r, GX1);
    xr = fmaf(xr, r, GX0);
    xr = fmaf(xr, r, 1.0f);
    xr = fmaf(xr, r, 1.0f);                          /* e^r */
    float e = mt_math_pick(inside, xr * mt_math_pow2i(mt_math_k(shifted, kf)), 0.0f);   /* e^-(a^2), exact scaling */
    float erfc = (q * t) * e;                        /* +0 past the clamp (NaN for a NaN x) */
    *ex = e;
    /* erfc (x < 0) or 2 - erfc, as 0 + erfc or 2 + (-erfc): the same one rounding, no select */
    float base = mt_bits_f32(((u >> 31) - 1u) & 0x40000000u);
    return base + mt_bits_f32(mt_f32_bits(erfc) ^ (~u & 0x80000000u));
}

MT_HD_INLINE float mt_one_plus_erff(float x) {
    float ex;
    float c = mt_one_plus_erf_exp(x, &ex);
    return mt_math_pick((mt_f32_bits(x) & 0x7fffffffu) > 0x7f800000u, mt_bits_f32(MT_MATH_QNAN), c);
}

/* tanh(x). Special: NaN -> NaN; +-inf -> +-1; a = |x| >= 9.0109133 rounds to 1 (a is clamped to
 * 10). a < 0.25: tanh = a + a p (one fmaf), p = s TH(s) + slo TH(s), TH ~ (tanh(a)/a - 1)/s
 * of degree 3 in s = a*a. a >= 0.25: tanh = 1 - 2 / (1 + e^(2a)) with every step carried as a
 * pair: e^(2a) = (s2 + lo) 2^k from mt_math_exp_pair (2a exact), 1 + e^(2a) = dh + dl
 * (Fast2Sum), 2 / (dh + dl) = qh + ql (the exact remainder fmaf(-qh, dh, 2)), 1 - qh = th + te
 * (Fast2Sum), result th + (te - ql): one final rounding. Measured: < 0.529 ulp (math.md). */
MT_HD_INLINE float mt_tanhf(float x) {
    const float TH0 = -0.333333313465118408203125f;         /* 0xbeaaaaaa */
    const float TH1 = 0.13333104550838470458984375f;        /* 0x3e0887ef */
    const float TH2 = -0.0538785047829151153564453125f;     /* 0xbd5cafb5 */
    const float TH3 = 0.02039768733084201812744140625f;     /* 0x3ca7190d */
    uint32_t u = mt_f32_bits(x);
    int is_nan = (u & 0x7fffffffu) > 0x7f800000u;
    float a = mt_bits_f32(u & 0x7fffffffu);
    a = mt_math_pick(a < 10.0f, a, 10.0f);           /* NaN and inf too */
    float s = a * a;
    float slo = fmaf(a, a, -s);
    float q = TH3;                                   /* a < 0.25 */
    q = fmaf(q, s, TH2);
    q = fmaf(q, s, TH1);
    q = fmaf(q, s, TH0);
    float ysmall = fmaf(a, fmaf(q, s, q * slo), a);
    float kf, lo;                                    /* a >= 0.25 */
    int k;
    float s2 = mt_math_exp_pair(2.0f * a, &kf, &k, &lo);
    float sc = mt_math_pow2i(k);                     /* 2^k, 0 <= k <= 29 */
    float eh = s2 + lo;
    float el = (s2 - eh) + lo;
    eh = eh * sc;
    el = el * sc;
    float dh = 1.0f + eh;
    float dl = ((eh - dh) + 1.0f) + el;              /* 1 + eh + el = dh + dl (eh >= 1) */
    float qh = 2.0f / dh;
    float rem = fmaf(-qh, dh, 2.0f);                 /* exact */
    float ql = (rem - qh * dl) / dh;                 /* 2 / (dh + dl) = qh + ql */
    float th = 1.0f - qh;
    float te = (1.0f - th) - qh;                     /* 1 - qh = th + te */
    float ylarge = th + (te - ql);
    float y = mt_math_pick(a < 0.25f, ysmall, ylarge);
    y = mt_bits_f32(mt_f32_bits(y) | (u & 0x80000000u));
    return mt_math_pick(is_nan, mt_bits_f32(MT_MATH_QNAN), y);
}
/* ==== end of pinned exp, log, log1p ==================================================== */

#endif /* MT_PINNED_MATH_H */
