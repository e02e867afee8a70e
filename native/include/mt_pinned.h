/* mt_pinned.h -- the one definition of every pinned scalar routine, tree and random stream.
 *
 * Compiles as C99, CUDA and HIP (MT_HD marks functions for host and device). Kernels and the
 * CPU oracle call these instead of re-spelling arithmetic, so the identical tier has one
 * source of truth. Only binary32 + - * /, sqrt and explicit fmaf appear, each correctly
 * rounded; the build turns contraction off for the identical tier (see Makefile). The
 * contracts in native/contracts/ describe, in words, what this file computes.
 */
#ifndef MT_PINNED_H
#define MT_PINNED_H

#include <stdint.h>
#include <math.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif

#define MT_TIER_IDENTICAL 0
#define MT_TIER_DETERMINISTIC 1
#define MT_TIER_FAST 2
#ifndef MT_TIER
#define MT_TIER MT_TIER_IDENTICAL
#endif

/* a*b + c: two roundings in the identical tier, one (fused) elsewhere. */
#if MT_TIER == MT_TIER_IDENTICAL
#define MT_MADD(a, b, c) ((a) * (b) + (c))
#else
#define MT_MADD(a, b, c) fmaf((a), (b), (c))
#endif

/* Sabotage builds (make SABOTAGE=<op>) break one op's pinned arithmetic on purpose, so the
 * cards can prove they notice. Never defined in a real build. */
#ifdef MT_SABOTAGE_OPTIM
#define MT_OPT_MADD(a, b, c) fmaf((a), (b), (c))
#else
#define MT_OPT_MADD(a, b, c) MT_MADD(a, b, c)
#endif

/* ---- bits ------------------------------------------------------------------------------ */

MT_HD uint32_t mt_f32_bits(float x) {
    union { float f; uint32_t u; } c;
    c.f = x;
    return c.u;
}

MT_HD float mt_bits_f32(uint32_t u) {
    union { float f; uint32_t u; } c;
    c.u = u;
    return c.f;
}

/* NaN and +-inf have an all-ones exponent. */
MT_HD int mt_is_finite(float x) { return (mt_f32_bits(x) & 0x7f800000u) != 0x7f800000u; }

/* ---- the length-only reduction tree (contract: native/contracts/clip.md) ----------------
 * A vector of n floats is cut into chunks of MT_CHUNK. Inside a chunk, lane l of MT_LANES
 * folds elements l, l + MT_LANES, ... in ascending order starting from +0.0; the lanes meet
 * in a balanced tree (lane l += lane l + h for h = MT_LANES/2 .. 1); the chunk partials meet
 * in the pairwise tree of mt_tree_fold. Nothing depends on threads, blocks or devices. */
#define MT_LANES 128
#define MT_CHUNK 4096
#define MT_ROWS (MT_CHUNK / MT_LANES)

MT_HD float mt_lane_tree(float *acc /* (MT_LANES), consumed */) {
    for (int h = MT_LANES / 2; h >= 1; h >>= 1)
        for (int l = 0; l < h; ++l) acc[l] = acc[l] + acc[l + h];
    return acc[0];
}

/* Sum of squares of one chunk: x holds n <= MT_CHUNK floats. Each step is fma(x, x, acc). */
MT_HD float mt_chunk_sumsq(const float *x, int64_t n) {
    float acc[MT_LANES];
    for (int l = 0; l < MT_LANES; ++l) acc[l] = 0.0f;
    int64_t full = n / MT_LANES;
#ifdef MT_SABOTAGE_CLIP
    for (int64_t r = full - 1; r >= 0; --r)
#else
    for (int64_t r = 0; r < full; ++r)
#endif
        for (int l = 0; l < MT_LANES; ++l) acc[l] = fmaf(x[r * MT_LANES + l], x[r * MT_LANES + l], acc[l]);
    for (int64_t l = 0; l < n - full * MT_LANES; ++l)
        acc[l] = fmaf(x[full * MT_LANES + l], x[full * MT_LANES + l], acc[l]);
    return mt_lane_tree(acc);
}

/* Pairwise tree over m partials, in place: each level adds neighbours (2k, 2k+1) in
 * ascending order; an odd last partial rises unchanged. Returns the root (0 for m == 0). */
MT_HD float mt_tree_fold(float *s, int64_t m) {
    if (m <= 0) return 0.0f;
    while (m > 1) {
        int64_t half = m / 2;
        for (int64_t k = 0; k < half; ++k) s[k] = s[2 * k] + s[2 * k + 1];
        if (m & 1) s[half] = s[m - 1];
        m = half + (m & 1);
    }
    return s[0];
}

MT_HD int64_t mt_chunk_count(int64_t n) { return (n + MT_CHUNK - 1) / MT_CHUNK; }

#if defined(__CUDACC__) || defined(__HIPCC__)
/* The same tree on a 32-thread warp: thread t holds lanes 4t..4t+3, so a row of 128 lanes is
 * one float4 per thread and the lane tree's first five levels are shuffles. */
#if defined(__HIPCC__)
#define MT_WARP_DOWN(v, d) __shfl_down((v), (d), 32)
#else
#define MT_WARP_DOWN(v, d) __shfl_down_sync(0xffffffffu, (v), (d), 32)
#endif

/* Sum of squares of one chunk (n <= MT_CHUNK floats at x); the result is valid in thread 0. */
__device__ __forceinline__ float mt_warp_chunk_sumsq(const float *x, int64_t n, int t) {
    float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
    int64_t full = n / MT_LANES;
    bool vec = ((uintptr_t)x & 15u) == 0;
#ifdef MT_SABOTAGE_CLIP
    for (int64_t r = full - 1; r >= 0; --r) {
#else
#pragma unroll 8
    for (int64_t r = 0; r < full; ++r) {
#endif
        const float *row = x + r * MT_LANES + 4 * t;
        float4 q;
        if (vec) q = *(const float4 *)row;
        else q = make_float4(row[0], row[1], row[2], row[3]);
        a0 = fmaf(q.x, q.x, a0); a1 = fmaf(q.y, q.y, a1);
        a2 = fmaf(q.z, q.z, a2); a3 = fmaf(q.w, q.w, a3);
    }
    int64_t rest = n - full * MT_LANES, l = 4 * t;
    const float *row = x + full * MT_LANES;
    if (l + 0 < rest) a0 = fmaf(row[l + 0], row[l + 0], a0);
    if (l + 1 < rest) a1 = fmaf(row[l + 1], row[l + 1], a1);
    if (l + 2 < rest) a2 = fmaf(row[l + 2], row[l + 2], a2);
    if (l + 3 < rest) a3 = fmaf(row[l + 3], row[l + 3], a3);
    for (int d = 16; d >= 1; d >>= 1) {          /* lane tree, h = 64 .. 4 */
        a0 = a0 + MT_WARP_DOWN(a0, d); a1 = a1 + MT_WARP_DOWN(a1, d);
        a2 = a2 + MT_WARP_DOWN(a2, d); a3 = a3 + MT_WARP_DOWN(a3, d);
    }
    a0 = a0 + a2; a1 = a1 + a3;                  /* h = 2 */
    return a0 + a1;                              /* h = 1 */
}

/* One level-group of mt_tree_fold: 32 aligned partials (n_valid of them real) folded
 * pairwise with the odd one rising; the group's root is valid in thread 0. */
__device__ __forceinline__ float mt_warp_fold32(float x, int t, int n_valid) {
    for (int d = 1; d < 32; d <<= 1) {
        float y = MT_WARP_DOWN(x, d);
        if ((t & (2 * d - 1)) == 0 && t + d < n_valid) x = x + y;
    }
    return x;
}
#endif

/* ---- double-float host scalars ------------------------------------------------------------
 * Bias corrections 1 - beta^t are formed as an unevaluated float pair (hi + lo, ~48 bits),
 * by binary powering with exact products from fmaf, then rounded once to float32. */
typedef struct { float hi, lo; } mt_df;

MT_HD mt_df mt_df_mul(mt_df a, mt_df b) {
    float p = a.hi * b.hi;
    float e = fmaf(a.hi, b.hi, -p);
    float cross = a.hi * b.lo + a.lo * b.hi;
    e = e + cross;
    float s = p + e;
    mt_df r;
    r.hi = s;
    r.lo = e - (s - p);
    return r;
}

MT_HD float mt_one_minus_pow_f32(float base, int64_t t) {
    mt_df r = {1.0f, 0.0f}, b = {base, 0.0f};
    while (t > 0) {
        if (t & 1) r = mt_df_mul(r, b);
        b = mt_df_mul(b, b);
        t >>= 1;
    }
    float s = 1.0f - r.hi;           /* two-sum of 1 and -hi */
    float bb = s - 1.0f;
    float err = (1.0f - (s - bb)) + (-r.hi - bb);
    return s + (err - r.lo);
}

/* ---- optimizer element updates (contract: native/contracts/optimizer.md) -------------- */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float one_minus_beta1, one_minus_beta2, step_size, sqrt_bias2, decay, grad_sign;
    int32_t coupled;   /* Adam with weight_decay != 0: g + weight_decay * p */
} mt_adam_scalars;

typedef struct {
    float lr, momentum, dampening, weight_decay, one_minus_dampening, grad_sign;
    int32_t coupled, nesterov;
} mt_sgd_scalars;

/* Host side, once per step: every vendor runs exactly this. decay is exactly 1 unless
 * decoupled (AdamW); grad_sign is -1 under maximize (x * -1 is an exact negation). */
MT_HD mt_adam_scalars mt_adam_scalars_for(float lr, float beta1, float beta2, float eps,
                                          float weight_decay, int32_t maximize,
                                          int32_t decoupled, int64_t step) {
    mt_adam_scalars s;
    s.lr = lr; s.beta1 = beta1; s.beta2 = beta2; s.eps = eps; s.weight_decay = weight_decay;
    s.one_minus_beta1 = 1.0f - beta1;
    s.one_minus_beta2 = 1.0f - beta2;
    s.step_size = lr / mt_one_minus_pow_f32(beta1, step);
    s.sqrt_bias2 = sqrtf(mt_one_minus_pow_f32(beta2, step));
    s.decay = decoupled ? 1.0f - lr * weight_decay : 1.0f;
    s.grad_sign = maximize ? -1.0f : 1.0f;
    s.coupled = !decoupled && weight_decay != 0.0f;
    return s;
}

MT_HD mt_sgd_scalars mt_sgd_scalars_for(float lr, float momentum, float dampening,
                                        float weight_decay, int32_t nesterov, int32_t maximize) {
    mt_sgd_scalars s;
    s.lr = lr; s.momentum = momentum; s.dampening = dampening; s.weight_decay = weight_decay;
    s.one_minus_dampening = 1.0f - dampening;
    s.grad_sign = maximize ? -1.0f : 1.0f;
    s.coupled = weight_decay != 0.0f;
    s.nesterov = nesterov;
    return s;
}

/* One Adam / AdamW element; g is the gradient after clipping (g * coef, coef 1 when not
 * clipping: an exact identity). `coupled` is s->coupled, passed separately so that loops
 * can be specialised on it. */
MT_HD void mt_adam_elem(float *p, float *m, float *v, float g, const mt_adam_scalars *s,
                        int coupled) {
    float pv = *p * s->decay;
    g = g * s->grad_sign;
    if (coupled) g = MT_MADD(s->weight_decay, pv, g);
    float mv = MT_MADD(s->one_minus_beta1, g - *m, *m);
    float vv = MT_OPT_MADD(s->one_minus_beta2, g * g, *v * s->beta2);
    float denom = sqrtf(vv) / s->sqrt_bias2 + s->eps;
    *p = pv - s->step_size * (mv / denom);
    *m = mv;
    *v = vv;
}

/* One SGD element. With momentum (has_buf), buf is read when initialized and always
 * written; torch's first step copies the gradient into the buffer. */
MT_HD void mt_sgd_elem(float *p, float *buf, float g, const mt_sgd_scalars *s, int coupled,
                       int has_buf, int initialized) {
    float pv = *p;
    g = g * s->grad_sign;
    if (coupled) g = MT_MADD(s->weight_decay, pv, g);
    if (has_buf) {
        float b = initialized ? MT_MADD(s->one_minus_dampening, g, *buf * s->momentum) : g;
        *buf = b;
        g = s->nesterov ? MT_MADD(s->momentum, b, g) : b;
    }
    *p = MT_OPT_MADD(-s->lr, g, pv);
}

/* ---- Philox4x32-10 (Salmon et al. 2011; Random123's constants) ------------------------ */
MT_HD void mt_philox4x32_10_block(uint32_t out[4], const uint32_t ctr[4], const uint32_t key[2]) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = (uint64_t)0xD2511F53u * c0;
        uint64_t p1 = (uint64_t)0xCD9E8D57u * c2;
        uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
        uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
        c1 = (uint32_t)p1;
        c3 = (uint32_t)p0;
        c0 = n0;
        c2 = n2;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    out[0] = c0; out[1] = c1; out[2] = c2; out[3] = c3;
}

/* The stream of (seed, stream): element i is word i % 4 of the block at counter
 * (i / 4 low, i / 4 high, stream low, stream high) under key (seed low, seed high). */
MT_HD uint32_t mt_philox_word(uint64_t seed, uint64_t stream, uint64_t i) {
    uint64_t block = i >> 2;
    uint32_t ctr[4] = {(uint32_t)block, (uint32_t)(block >> 32), (uint32_t)stream,
                       (uint32_t)(stream >> 32)};
    uint32_t key[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    uint32_t out[4];
    mt_philox4x32_10_block(out, ctr, key);
    return out[i & 3];
}

/* The top 24 bits of a word as a float in [0, 1): exact, spacing 2^-24. */
MT_HD float mt_u01(uint32_t word) { return (float)(word >> 8) * 5.9604644775390625e-08f; }

/* low + width * u, width = high - low formed once by the caller (two roundings). */
MT_HD float mt_uniform_at(float low, float width, uint32_t word) { return low + width * mt_u01(word); }

#endif /* MT_PINNED_H */
