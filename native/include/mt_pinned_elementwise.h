/* mt_pinned_elementwise.h -- part of mt_pinned.h (the one definition of every pinned routine): random draws (sin/cos of pi x, Box-Muller, dropout) and the elementwise ops (SiLU, the residual add, GELU).
 * Included by mt_pinned.h after its core (bits, trees, optimizer updates, Philox), in the order
 * math, layers, elementwise, each part using only what comes before it; including a part alone
 * includes mt_pinned.h first. */
#ifndef MT_PINNED_ELEMENTWISE_H
#define MT_PINNED_ELEMENTWISE_H
#include "mt_pinned.h"

/* ==== random draws and elementwise ops (contracts: native/contracts/random.md, elementwise.md)
 * Normal draws (Box-Muller through mt_logf, sqrtf and the pinned sin/cos of pi*x below),
 * dropout's keep rule and scaling, SiLU and its gradient through mt_expf, the residual add,
 * GELU and its gradient through mt_one_plus_erf_exp (1 + erf and e^-(u^2)) / mt_tanhf.
 * Every value is a function of (seed, stream, element index) and the element's own inputs:
 * never of threads, blocks or launch geometry. Host checks live here too, so that every
 * vendor refuses the same arguments in the same words. */

/* Sabotage switches (make SABOTAGE=random|elementwise): each changes bits where the contract
 * pins them, in that family alone. random: the sin/cos core drops pi's low part, dropout
 * divides by 1 - p instead of multiplying by the rounded scale. elementwise: SiLU multiplies
 * by a rounded reciprocal, its gradient fuses 1 + x*t, the add flushes subnormal sums, GELU
 * divides by sqrt(2) and fuses its a*b + c steps. */
#ifdef MT_SABOTAGE_RANDOM
#define MT_SAB_RANDOM 1
#else
#define MT_SAB_RANDOM 0
#endif
#ifdef MT_SABOTAGE_ELEMENTWISE
#define MT_SAB_ELEMENTWISE 1
#define MT_ELT_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MT_SAB_ELEMENTWISE 0
#define MT_ELT_MADD(a, b, c) MT_MADD(a, b, c)
#endif

/* The four words of counter block `block` of the stream (seed, stream): stream elements
 * 4*block .. 4*block + 3 (see mt_philox_word). */
MT_HD void mt_philox_words(MT_THREAD uint32_t *out /* (4) */, uint64_t seed, uint64_t stream, uint64_t block) {
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream, (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    mt_philox4x32_10_block(out, ctr, key);
}

/* ---- sin(pi x), cos(pi x) ----------------------------------------------------------------
 * Float32 only, no table, no libm call but fmaf. Coefficients by weighted least squares on
 * 400 Chebyshev points of z = r^2 in [0, 1/16] (60-digit mpmath), each rounded to float32
 * in turn with the rest refitted (as math.md's). Measured exhaustively over every float
 * with |x| < 2^24 (contracts/random.md): sin 0.5410 ulp, cos 0.5419 ulp at most; stated
 * bound 0.55 ulp. */
#define MT_PI_HI 3.1415927410125732421875f                         /* 0x40490fdb */
#define MT_PI_LO -8.74227765734758577309548854827880859375e-08f     /* 0xb3bbbd2e */

/* sin(pi r) for 2^-64 <= |r| <= 1/4 (mt_sinpi_core's main path): pi r + r^3 (S0 + z S1(z)),
 * z = r^2, carried as exact pairs (r^2 = z + zl, r^3 = c + cl, r * MT_PI_HI = ah + al,
 * c * S0 = m + ml) and summed by Fast2Sum (|ah| >= |m|) with one final rounding. */
MT_HD float mt_sinpi_main(float r) {
    const float S0 = -5.167712688446044921875f;          /* 0xc0a55de7 */
    const float S1 = 2.550152301788330078125f;           /* 0x402335b2 */
    const float S2 = -0.598763287067413330078125f;       /* 0xbf19488d */
    const float S3 = 0.073389939963817596435546875f;     /* 0x3d964d77 */
    const float S4 = 0.0465819649398326873779296875f;    /* 0x3d3eccbb */
    float z = r * r;
    float zl = fmaf(r, r, -z);
    float c = r * z;
    float cl = fmaf(r, z, -c) + r * zl;
    float p = S4;
    p = fmaf(p, z, S3);
    p = fmaf(p, z, S2);
    p = fmaf(p, z, S1);
    float n = (c * z) * p;
    float m = MT_MUL_SPLIT(c, S0);
    float ml = fmaf(c, S0, -m);
    float ah = MT_MUL_SPLIT(r, MT_PI_HI);
    float al = fmaf(r, MT_PI_HI, -ah);
#if MT_SAB_RANDOM
    float lo = al;
#else
    float lo = al + r * MT_PI_LO;
#endif
    float sum = ah + m;
    float err = m - (sum - ah);                      /* ah + m = sum + err */
    return sum + (((n + (ml + cl * S0)) + lo) + err);
}

/* sin(pi r) for |r| <= 1/4: the main path, or for |r| < 2^-64 the same sum pi r scaled by
 * 2^64 and rounded once onto the (possibly subnormal) grid. */
MT_HD float mt_sinpi_core(float r) {
    const float UP = 18446744073709551616.0f;            /* 2^64 */
    const float DOWN = 5.42101086242752217003726400434970855712890625e-20f;   /* 2^-64 */
    float y = mt_sinpi_main(r);
    float rs = r * UP;                               /* exact */
    float big = MT_MUL_SPLIT(rs, MT_PI_HI);
    float bigl = fmaf(rs, MT_PI_HI, -big);
    float ty = big * DOWN;                           /* the rounding onto the grid */
    float terr = big - ty * UP;                      /* exact */
    float tiny = fmaf(terr + (bigl + rs * MT_PI_LO), DOWN, ty);
    return mt_math_pick((mt_f32_bits(r) & 0x7fffffffu) < 0x1f800000u, tiny, y);
}

/* cos(pi r) for |r| <= 1/4: 1 + C1 z + z^2 Q(z), C1 = -pi^2/2 = MT_C1_HI + MT_C1_LO, with
 * C1_HI * z exact as ph + pl and 1 + ph = s + e exact (Fast2Sum): s + (e + small terms). */
MT_HD float mt_cospi_core(float r) {
    const float C1_HI = -4.93480205535888671875f;                        /* 0xc09de9e6 */
    const float C1_LO = -1.45185794053759309463202953338623046875e-07f;  /* 0xb41be45e */
    const float Q0 = 4.058712005615234375f;              /* 0x4081e0f8 */
    const float Q1 = -1.335254192352294921875f;          /* 0xbfaae99c */
    const float Q2 = 0.23513281345367431640625f;         /* 0x3e70c6a8 */
    const float Q3 = -0.02421933598816394805908203125f;  /* 0xbcc667a1 */
    float z = r * r;
    float zl = fmaf(r, r, -z);
    float ph = MT_MUL_SPLIT(z, C1_HI);
    float pl = fmaf(C1_HI, z, -ph);
    float q = Q3;
    q = fmaf(q, z, Q2);
    q = fmaf(q, z, Q1);
    q = fmaf(q, z, Q0);
    float small = pl + (C1_HI * zl + (C1_LO * z + (z * z) * q));
    float s = 1.0f + ph;
    float e = ph - (s - 1.0f);                       /* 1 + ph = s + e */
    return s + (e + small);
}

/* sin(pi x) and cos(pi x) for any float x. On a = |x| (a >= 2^24, an even integer, counts as
 * 0): a = 2t + xm with t = trunc(a/2) (xm in [0, 2), exact), xm = k/2 + r with k the
 * integer nearest 2 xm (ties to even) and r in [-1/4, 1/4] (exact); quadrant q = k mod 4
 * swaps and negates the cores, negation as 0 - v (a zero result is +0). Then sin takes x's
 * sign (sin(-x) = -sin(x) bit for bit). NaN and +-inf give the canonical NaN for both. */
MT_HD void mt_sincospif(float x, MT_THREAD float *sin_out, MT_THREAD float *cos_out) {
    const float SHIFT = 12582912.0f;                 /* 0x4b400000 = 1.5 * 2^23 */
    uint32_t u = mt_f32_bits(x), ax = u & 0x7fffffffu;
    float a = mt_math_pick(ax >= 0x4b800000u, 0.0f, mt_bits_f32(ax));
    float xm = a - 2.0f * (float)(int32_t)(a * 0.5f);
    float shifted = 2.0f * xm + SHIFT;
    float kf = shifted - SHIFT;
    int q = mt_math_k(shifted, kf) & 3;
    float r = xm - 0.5f * kf;
    float s = mt_sinpi_core(r), c = mt_cospi_core(r);
    float ss = mt_math_pick(q & 1, c, s), cc = mt_math_pick(q & 1, s, c);
    ss = mt_math_pick(q >= 2, 0.0f - ss, ss);
    cc = mt_math_pick(q == 1 || q == 2, 0.0f - cc, cc);
    ss = mt_bits_f32(mt_f32_bits(ss) ^ (u & 0x80000000u));
    int bad = ax >= 0x7f800000u;
    *sin_out = mt_math_pick(bad, mt_bits_f32(MT_MATH_QNAN), ss);
    *cos_out = mt_math_pick(bad, mt_bits_f32(MT_MATH_QNAN), cc);
}

/* mt_sincospif(x) for Box-Muller's angle x = 2 u2 = k 2^-23, 0 <= k < 2^24: the same bits in
 * fewer operations. Such an x lies in [0, 2), so it is its own reduced value xm (no sign, no
 * truncation, no NaN); r = xm - kf/2 is a multiple of 2^-23, +0 or at least 2^-23 in
 * magnitude, where mt_sinpi_core's tiny path is not taken (at +0 both give +0). Checked against
 * mt_sincospif for every k by bench/box_muller_identity.c (tests/test_random.py). */
MT_HD void mt_sincospif_angle(float x, MT_THREAD float *sin_out, MT_THREAD float *cos_out) {
    const float SHIFT = 12582912.0f;                 /* 0x4b400000 = 1.5 * 2^23 */
    float shifted = 2.0f * x + SHIFT;
    float kf = shifted - SHIFT;
    int q = mt_math_k(shifted, kf) & 3;
    float r = x - 0.5f * kf;
    float s = mt_sinpi_main(r), c = mt_cospi_core(r);
    float ss = mt_math_pick(q & 1, c, s), cc = mt_math_pick(q & 1, s, c);
    *sin_out = mt_math_pick(q >= 2, 0.0f - ss, ss);
    *cos_out = mt_math_pick(q == 1 || q == 2, 0.0f - cc, cc);
}

/* mt_logf(x) for a positive normal finite x (Box-Muller's u1 = m 2^-24, 1 <= m <= 2^24): the
 * same bits without the special cases' tests. Checked for every such u1 with mt_sincospif_angle. */
MT_HD float mt_logf_normal(float x) {
    int e;
    float m = mt_math_split(x, &e);
    return mt_math_log_core_f((float)e, m - 1.0f);
}

/* sqrt(v): IEEE's bits where v is +0 or a normal float of at least 2^-100 (the sequence gives
 * NaN at +0, picked away). */
MT_HD float mt_math_sqrt_pos(float v) {
#if MT_MATH_UNGUARDED
    float r;
    asm("rsqrt.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(v));
    float y = __fmul_rn(v, r);
    float s = __fmaf_rn(__fmaf_rn(-y, y, v), __fmul_rn(r, 0.5f), y);
    return v > 0.0f ? s : v;
#else
    return sqrtf(v);
#endif
}

/* ---- normal draws (Box-Muller) ----------------------------------------------------------
 * Stream elements 2j and 2j + 1 (words w0, w1 of one Philox block's pair j mod 2):
 * u1 = ((w0 >> 8) + 1) * 2^-24 in (0, 1], u2 = (w1 >> 8) * 2^-24 in [0, 1) (both exact),
 * rad = sqrtf(0 - 2 * mt_logf(u1)) (2 * log exact; rad = +0 when u1 = 1; rad <= 5.7683),
 * (s, c) = mt_sincospif(2 * u2), element 2j = rad * c, element 2j + 1 = rad * s. The root's
 * operand is +0 or in [2^-23, 33.3] (u1 <= 1 - 2^-24 gives -2 ln u1 >= 2^-23): the range of
 * mt_math_sqrt_pos. */
MT_HD_INLINE void mt_box_muller(uint32_t w0, uint32_t w1, MT_THREAD float *z0, MT_THREAD float *z1) {
    float u1 = (float)((w0 >> 8) + 1u) * 5.9604644775390625e-08f;
    float u2 = mt_u01(w1);
    float rad = mt_math_sqrt_pos(0.0f - 2.0f * mt_logf_normal(u1));   /* = mt_logf(u1): u1 is normal */
    float s, c;
    mt_sincospif_angle(2.0f * u2, &s, &c);                 /* = mt_sincospif(2 u2) */
    *z0 = rad * c;
    *z1 = rad * s;
}

/* The four standard normals of counter block `block` (stream elements 4*block + k). */
MT_HD_INLINE void mt_normal_block(MT_THREAD float *z /* (4) */, uint64_t seed, uint64_t stream, uint64_t block) {
    uint32_t w[4];
    mt_philox_words(w, seed, stream, block);
    mt_box_muller(w[0], w[1], &z[0], &z[1]);
    mt_box_muller(w[2], w[3], &z[2], &z[3]);
}

/* mean + std * z: two roundings in the identical numeric mode. */
MT_HD float mt_normal_value(float mean, float std, float z) { return MT_MADD(std, z, mean); }

/* ---- dropout ----------------------------------------------------------------------------
 * Element i uses stream element offset + i (the word mt_uniform_fill would draw there):
 * kept iff mt_u01(word) >= p, i.e. (word >> 8) >= ceil(p * 2^24). Kept: x * scale with
 * scale = 1 / (1 - p) (two float32 roundings, once on the host); dropped: +0. p = 0 keeps
 * every element and scale = 1, so y = x bit for bit. */
MT_HD float mt_dropout_scale(float p) { return 1.0f / (1.0f - p); }

MT_HD float mt_dropout_elem(float x, uint32_t word, float p, float scale) {
#if MT_SAB_RANDOM
    float kept = x / (1.0f - p);
#else
    float kept = x * scale;
#endif
    return mt_math_pick(mt_u01(word) >= p, kept, 0.0f);
}

/* Attention's dropout (attention.md, "Dropout"): the value x of the pair whose stream element
 * is `element` (MT_ATTN_PAIR_ELEMENT), kept as x * scale or dropped to +0 by dropout's rule. */
MT_HD float mt_attn_drop(float x, uint64_t seed, uint64_t stream, uint64_t element, float p, float scale) {
    return mt_dropout_elem(x, mt_philox_word(seed, stream, element), p, scale);
}

/* mt_expf(x), the same bits for every x (mt_expf_mid is mt_expf on its range, checked for
 * every float there by bench/expf_identity.c). GPU device code takes the branch: a warp whose
 * lanes all lie in the range -- almost every warp of real data -- skips the clamp and the
 * subnormal scaling. The CPU keeps the branch-free mt_expf, which its loops vectorize. */
MT_HD int mt_expf_in_mid(float x) { return x >= MT_EXPF_MID_LO && x <= MT_EXPF_MID_HI; }

MT_HD float mt_expf_ranged(float x) { return mt_expf_in_mid(x) ? mt_expf_mid(x) : mt_expf(x); }
#if defined(__CUDA_ARCH__) || defined(__HIP_DEVICE_COMPILE__)
#define MT_ELT_EXPF mt_expf_ranged
#else
#define MT_ELT_EXPF mt_expf
#endif

/* ---- SiLU and the residual add ----------------------------------------------------------
 * silu(x) = x / d with d = 1 + mt_expf(-x) (= x * sigmoid(x); e = +inf for x < -88.72
 * gives -0, never NaN). Gradient: dy * (s * (1 + x * t)) with s = 1 / d and t = 1 - s,
 * formed as e * s for x > 0 (no cancellation) and as 1 - s otherwise. The _of forms take e
 * from the caller: mt_expf(-x), or mt_expf_mid(-x) where mt_expf_in_mid(-x) (the GPU maps
 * test a float4 group's four arguments once). */
/* SiLU given e = mt_expf(-x) (from any routine with its bits). */
MT_HD float mt_silu_of(float x, float e) {
    float d = 1.0f + e;
#if MT_SAB_ELEMENTWISE
    return x * (1.0f / d);
#else
    return x / d;
#endif
}

MT_HD float mt_silu(float x) { return mt_silu_of(x, MT_ELT_EXPF(-x)); }

/* SiLU's gradient given e = mt_expf(-x) and s = 1 / (1 + e) (a GPU map forms s its own way
 * where it has the same bits). */
MT_HD float mt_silu_grad_of_s(float dy, float x, float e, float s) {
    float t = mt_math_pick(x > 0.0f, e * s, 1.0f - s);
    return dy * (s * MT_ELT_MADD(x, t, 1.0f));
}

/* SiLU's gradient given e = mt_expf(-x). */
MT_HD float mt_silu_grad_of(float dy, float x, float e) { return mt_silu_grad_of_s(dy, x, e, 1.0f / (1.0f + e)); }

MT_HD float mt_silu_grad(float dy, float x) { return mt_silu_grad_of(dy, x, MT_ELT_EXPF(-x)); }

/* a + b, one rounding (subnormal sums kept). */
MT_HD float mt_add_elem(float a, float b) {
    float r = a + b;
#if MT_SAB_ELEMENTWISE
    if ((mt_f32_bits(r) & 0x7f800000u) == 0u) r = mt_bits_f32(mt_f32_bits(r) & 0x80000000u);
#endif
    return r;
}

/* ---- GELU (elementwise.md, "GELU"): torch's formulas in torch's order, these constants -----
 * approximate='none' (contract version 3): u = x * SQRT1_2, c = mt_one_plus_erf_exp(u, &ex)
 *   (1 + erf u, and ex = e^-(u * u)), y = (x * 0.5) * c; dx = dy * (cdf + x * pdf),
 *   cdf = 0.5 * c, pdf = PDF * ex.
 * approximate='tanh': v = BETA * (x + KAPPA * ((x * x) * x)), t = mt_tanhf(v),
 *   y = (0.5 * x) * (1 + t); dx = dy * (0.5 * (1 + t) + ((0.5 * x) * (1 - t * t)) *
 *   (BETA * (1 + KAPPA3 * (x * x)))), the last product taken as +0 where 1 - t * t is 0 (the
 *   same bits as the product wherever it is finite; 0 * inf = NaN once x * x overflows).
 * Each a*b + c is MT_ELT_MADD (two roundings in the identical mode). make SABOTAGE=elementwise
 * divides by float(sqrt 2) instead of multiplying by SQRT1_2 and fuses every a*b + c. */
#define MT_GELU_SQRT1_2 0.707106769084930419921875f    /* 0x3f3504f3: float(1/sqrt(2)) */
#define MT_GELU_PDF 0.398942291736602783203125f        /* 0x3ecc422a: float(1/sqrt(2 pi)) */
#define MT_GELU_BETA 0.79788458347320556640625f        /* 0x3f4c422a: float(sqrt(2/pi)) */
#define MT_GELU_KAPPA 0.0447149984538555145263671875f  /* 0x3d372713: float(0.044715) */
#define MT_GELU_KAPPA3 0.1341449916362762451171875f    /* 0x3e095d4e: float(3 * KAPPA), rounded */

MT_HD float mt_gelu_u(float x) {
#if MT_SAB_ELEMENTWISE
    return x / 1.41421353816986083984375f;
#else
    return x * MT_GELU_SQRT1_2;
#endif
}

/* 1 + erf(u) without mt_one_plus_erff's NaN canonicalization: GELU refuses a NaN x. */
MT_HD_INLINE float mt_gelu_erf(float x) {
    float ex;
    return (x * 0.5f) * mt_one_plus_erf_exp(mt_gelu_u(x), &ex);
}

/* The gradient takes its pdf from the e^-(u^2) that 1 + erf(u) forms (u = x * SQRT1_2, so
 * u^2 ~ x^2 / 2): one exp an element, +0 past the clamp |u| >= 4 (where |x * pdf| < 2.6e-7). */
MT_HD_INLINE float mt_gelu_erf_grad(float dy, float x) {
    float ex;
    float cdf = 0.5f * mt_one_plus_erf_exp(mt_gelu_u(x), &ex);
    float pdf = MT_GELU_PDF * ex;
    return dy * MT_ELT_MADD(x, pdf, cdf);
}

MT_HD float mt_gelu_tanh_t(float x, float xx) {
    return mt_tanhf(MT_GELU_BETA * MT_ELT_MADD(MT_GELU_KAPPA, xx * x, x));
}

MT_HD float mt_gelu_tanh(float x) { return (0.5f * x) * (1.0f + mt_gelu_tanh_t(x, x * x)); }

MT_HD float mt_gelu_tanh_grad(float dy, float x) {
    float xx = x * x;
    float t = mt_gelu_tanh_t(x, xx);
    float left_d = 0.5f * (1.0f + t);
    float tanh_d = MT_ELT_MADD(-t, t, 1.0f);
    float inner_d = MT_GELU_BETA * MT_ELT_MADD(MT_GELU_KAPPA3, xx, 1.0f);
    float right_d = mt_math_pick(tanh_d > 0.0f, ((0.5f * x) * tanh_d) * inner_d, 0.0f);
    return dy * (left_d + right_d);
}

#if !MT_METAL   /* host code: strings */
/* ---- host checks every vendor shares: NULL when fine, else what is wrong ---------------- */
/* The two endings of a non-finite refusal: a pre-pass decided (in place, or a staged host
 * output never downloaded), or the one pass already wrote the output. */
#define MT_REFUSED_CLEAN "before anything was written"
#define MT_REFUSED_DIRTY "(the output's contents are undefined; no input was written)"
MT_HD const char *mt_span_problem(uint64_t offset, int64_t n) {
    if (n < 0) return "n must be >= 0";
    if ((uint64_t)n > UINT64_MAX - offset) return "offset + n must be <= 2^64 - 1";
    return 0;
}

MT_HD const char *mt_dropout_problem(float p) {
    return (p >= 0.0f && p < 1.0f) ? 0 : "p must be in [0, 1)";
}

/* GELU's approximate: 0 (MT_GELU_NONE, erf) or 1 (MT_GELU_TANH). */
MT_HD const char *mt_gelu_approximate_problem(int32_t approximate) {
    return (approximate == 0 || approximate == 1) ? 0 : "approximate must be 0 (none) or 1 (tanh)";
}
#endif
/* ==== end of random draws and elementwise ops =========================================== */

#endif /* MT_PINNED_ELEMENTWISE_H */
