/* mt_ftz.h -- the flush rule of the identical_ftz numeric mode (native/contracts/ftz.md), as
 * functions of IEEE binary32 arithmetic with gradual underflow.
 *
 * The rule, at every float32 operation: an input whose magnitude is below FLT_MIN = 2^-126 (a
 * subnormal) is read as a zero of its own sign; a result whose EXACT value is nonzero and below
 * FLT_MIN in magnitude is a zero of the exact value's sign (tininess before rounding: a product
 * that rounds up to FLT_MIN is flushed too); every other result is the correctly rounded one.
 * Comparisons, min/max, negation, fabs, rounding to an integer value and conversions read their
 * inputs flushed; a conversion from double flushes its result by the same rule; loads, stores,
 * copies, selects and copysign move bits and flush nothing.
 *
 * These functions are the rule's one definition. The CPU oracle's identical_ftz library is its
 * ordinary C compiled to LLVM IR with every float operation replaced by a call of one of these
 * (native/cpu_oracle/mt_ftz_ir.py), so no operation can be missed; they themselves must be
 * compiled as plain IEEE code (no flush-to-zero hardware mode, no fast math, no contraction).
 * MT_FTZ_FN decides their linkage (static inline unless the includer says otherwise). */
#ifndef MT_FTZ_H
#define MT_FTZ_H

#include <math.h>
#include <stdint.h>

#ifndef MT_FTZ_FN
#define MT_FTZ_FN static inline
#endif

#define MT_FTZ_MIN 1.17549435082228750796873653722224568e-38f   /* FLT_MIN = 2^-126 */

/* An input: a subnormal reads as a zero of its sign (NaN, inf, zeros, normals unchanged). */
MT_FTZ_FN float mt_ftz_in(float x) { return fabsf(x) < MT_FTZ_MIN ? copysignf(0.0f, x) : x; }

/* A correctly rounded result r whose exact value v has |v| < FLT_MIN exactly when |r| < FLT_MIN
 * (sums, differences, square roots): a zero of r's sign then (r keeps the sign of v). */
static inline float mt_ftz_tiny_out(float r) { return fabsf(r) < MT_FTZ_MIN ? copysignf(0.0f, r) : r; }

MT_FTZ_FN float mt_ftz_add(float a, float b) { return mt_ftz_tiny_out(mt_ftz_in(a) + mt_ftz_in(b)); }
MT_FTZ_FN float mt_ftz_sub(float a, float b) { return mt_ftz_tiny_out(mt_ftz_in(a) - mt_ftz_in(b)); }

/* |a b| < FLT_MIN exactly, for a product whose rounding is +-FLT_MIN: fma(|a|, |b|, -FLT_MIN)
 * is RN(|a b| - FLT_MIN), which keeps the sign of that exact difference (+0 when it is 0). */
static inline int mt_ftz_product_below(float a, float b) { return signbit(fmaf(fabsf(a), fabsf(b), -MT_FTZ_MIN)) != 0; }

MT_FTZ_FN float mt_ftz_mul(float a, float b) {
    float a1 = mt_ftz_in(a), b1 = mt_ftz_in(b), r = a1 * b1, m = fabsf(r);
    if (m < MT_FTZ_MIN || (m == MT_FTZ_MIN && mt_ftz_product_below(a1, b1))) return copysignf(0.0f, r);
    return r;
}

/* |a / b| < FLT_MIN exactly iff |a| - FLT_MIN |b| < 0: one fma, rounded with its sign kept. */
MT_FTZ_FN float mt_ftz_div(float a, float b) {
    float a1 = mt_ftz_in(a), b1 = mt_ftz_in(b), r = a1 / b1, m = fabsf(r);
    if (m < MT_FTZ_MIN || (m == MT_FTZ_MIN && signbit(fmaf(-MT_FTZ_MIN, fabsf(b1), fabsf(a1))))) return copysignf(0.0f, r);
    return r;
}

/* The square root of a flushed input is 0 or at least 2^-63: never tiny. */
MT_FTZ_FN float mt_ftz_sqrt(float a) { return sqrtf(mt_ftz_in(a)); }

/* The sign of the exact sum of n <= 4 floats, by Shewchuk's growing expansion (every step an
 * exact two-sum; no term here overflows): -1, 0 or 1. */
static inline int mt_ftz_sum_sign(const float *t, int n) {
    float e[5];
    int len = 0;
    for (int j = 0; j < n; ++j) {
        float q = t[j];
        int k = 0;
        for (int i = 0; i < len; ++i) {
            float s = q + e[i], bv = s - q, err = (q - (s - bv)) + (e[i] - bv);
            if (err != 0.0f) e[k++] = err;
            q = s;
        }
        e[k++] = q;
        len = k;
    }
    for (int i = len; i-- > 0;)
        if (e[i] != 0.0f) return e[i] > 0.0f ? 1 : -1;
    return 0;
}

/* |a b + c| < FLT_MIN exactly, for flushed a, b, c whose fma rounds to r = +-FLT_MIN.
 * v = a b + c. With a or b zero, v = c, a normal: not below. With c zero, the product's test.
 * Given that RN(v) = +-FLT_MIN: if |RN(a b)| > 2^-79 or |c| >= 2^-78, then |a b| and |c| are
 * both near each other and far above FLT_MIN, so their last bits (a product's 48 bits, c's 24) are
 * multiples of 2^-126, v is a multiple of FLT_MIN and equals r: not below. Otherwise
 * a = A 2^ea, b = B 2^eb with A, B in [1, 2), and, scaled by 2^S (S = -(ea + eb), 79 <= S <= 252),
 * A B = ph + pl exactly (no underflow), c 2^S and FLT_MIN 2^S stay finite: the sign of
 * sign(r) (ph + pl + c 2^S) - FLT_MIN 2^S is then computed exactly. */
static inline uint32_t mt_ftz_bits(float x) { union { float f; uint32_t u; } v; v.f = x; return v.u; }
static inline float mt_ftz_float(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }
/* 2^k, -126 <= k <= 127 */
static inline float mt_ftz_pow2(int k) { return mt_ftz_float((uint32_t)(k + 127) << 23); }

static inline int mt_ftz_fma_below(float a, float b, float c, float r) {
    if (a == 0.0f || b == 0.0f) return 0;
    if (c == 0.0f) return mt_ftz_product_below(a, b);
    if (fabsf(a * b) > 0x1p-79f || fabsf(c) >= 0x1p-78f) return 0;
    uint32_t ua = mt_ftz_bits(a) & 0x7fffffffu, ub = mt_ftz_bits(b) & 0x7fffffffu;   /* normal: flushed */
    int ea = (int)(ua >> 23) - 127, eb = (int)(ub >> 23) - 127;
    float A = mt_ftz_float((ua & 0x7fffffu) | 0x3f800000u), B = mt_ftz_float((ub & 0x7fffffu) | 0x3f800000u);
    int S = -(ea + eb), half = S / 2;     /* a b = A B 2^-S; 79 <= S <= 252 here */
    float sgn = signbit(r) ? -1.0f : 1.0f, ps = (signbit(a) != signbit(b)) ? -1.0f : 1.0f;
    float ph = A * B, pl = fmaf(A, B, -ph);                              /* A B exactly */
    float cs = (c * mt_ftz_pow2(half)) * mt_ftz_pow2(S - half);          /* c 2^S, exact */
    float lim = mt_ftz_pow2(half) * mt_ftz_pow2(S - half - 126);         /* FLT_MIN 2^S */
    float t[4] = {-lim, sgn * cs, sgn * ps * ph, sgn * ps * pl};
    return mt_ftz_sum_sign(t, 4) < 0;
}

MT_FTZ_FN float mt_ftz_fma(float a, float b, float c) {
    float a1 = mt_ftz_in(a), b1 = mt_ftz_in(b), c1 = mt_ftz_in(c), r = fmaf(a1, b1, c1), m = fabsf(r);
    if (m < MT_FTZ_MIN || (m == MT_FTZ_MIN && mt_ftz_fma_below(a1, b1, c1, r))) return copysignf(0.0f, r);
    return r;
}

/* max and min of flushed inputs: a NaN loses to a number, and of two zeros max is +0 and min is
 * -0 (IEEE 754-2019 maximumNumber / minimumNumber; C's fmaxf leaves that zero to the compiler). */
MT_FTZ_FN float mt_ftz_max(float a, float b) {
    float x = mt_ftz_in(a), y = mt_ftz_in(b);
    if (x != x) return y;
    if (y != y || x > y) return x;
    return (x == y && !signbit(x)) ? x : y;
}
MT_FTZ_FN float mt_ftz_min(float a, float b) {
    float x = mt_ftz_in(a), y = mt_ftz_in(b);
    if (x != x) return y;
    if (y != y || x < y) return x;
    return (x == y && signbit(x)) ? x : y;
}

/* Negation and absolute value read their operand flushed (GPUs' flush modes treat them as
 * arithmetic: PTX neg.ftz / abs.ftz), then move its sign bit. */
MT_FTZ_FN float mt_ftz_neg(float a) { return -mt_ftz_in(a); }
MT_FTZ_FN float mt_ftz_abs(float a) { return fabsf(mt_ftz_in(a)); }

/* Integer-valued rounding of a flushed input (floor(-2^-140) would be -1; of -0, -0). */
MT_FTZ_FN float mt_ftz_floor(float a) { return floorf(mt_ftz_in(a)); }
MT_FTZ_FN float mt_ftz_ceil(float a) { return ceilf(mt_ftz_in(a)); }
MT_FTZ_FN float mt_ftz_trunc(float a) { return truncf(mt_ftz_in(a)); }
MT_FTZ_FN float mt_ftz_rint(float a) { return rintf(mt_ftz_in(a)); }
MT_FTZ_FN float mt_ftz_round(float a) { return roundf(mt_ftz_in(a)); }

/* A double rounded to float32: a zero of its sign when |d| < FLT_MIN (an exact comparison). */
MT_FTZ_FN float mt_ftz_from_double(double d) { return fabs(d) < (double)MT_FTZ_MIN ? copysignf(0.0f, (float)d) : (float)d; }
/* A float32 widened to double (the input flushed; the widening is exact). */
MT_FTZ_FN double mt_ftz_to_double(float a) { return (double)mt_ftz_in(a); }

#endif /* MT_FTZ_H */
