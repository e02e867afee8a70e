/* mt_pinned.h -- the one definition of every pinned scalar routine, tree and random stream.
 *
 * Compiles as C99, CUDA and HIP (MT_HD marks functions for host and device). Kernels and the
 * CPU oracle call these instead of re-spelling arithmetic, so the identical numeric mode has one
 * source of truth. Only binary32 + - * /, sqrt and explicit fmaf appear, each correctly
 * rounded; the build turns contraction off for the identical numeric mode (see Makefile). The
 * contracts in native/contracts/ describe, in words, what this file computes.
 */
#ifndef MT_PINNED_H
#define MT_PINNED_H

/* Byte order: the cards, saved states, Philox counters and the Python layer read every buffer as
 * little-endian bytes, so a big-endian host is refused here rather than left to give other bits. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "mojo_train: big-endian hosts are not supported (cards, saved states and the Python layer read little-endian bytes); build on a little-endian host"
#endif

#include <stdint.h>
#include <math.h>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif
/* MT_HD, always inlined on the host (mt_erff, mt_tanhf): as a call, a routine that long is
 * compiled once for the baseline x86-64 target, where fmaf is a libm call, instead of inside the
 * CPU oracle's vectorized target clones, which have hardware fma. */
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__)
#define MT_HD_INLINE static inline __attribute__((always_inline))
#else
#define MT_HD_INLINE MT_HD
#endif

#define MT_MODE_IDENTICAL 0
#define MT_MODE_DETERMINISTIC 1
#define MT_MODE_FAST 2
#ifndef MT_NUMERIC_MODE
#define MT_NUMERIC_MODE MT_MODE_IDENTICAL
#endif

/* a*b + c: two roundings in the identical numeric mode, one (fused) elsewhere. */
#if MT_NUMERIC_MODE == MT_MODE_IDENTICAL
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
/* make SABOTAGE=schedule (native/common/mt_schedule.c, host code): a warmup value is rounded
 * twice, RN(RN(peak / W) * t) in float32, instead of once from the exact peak * t / W. */
#ifdef MT_SABOTAGE_SCHEDULE
#define MT_SAB_SCHEDULE 1
#else
#define MT_SAB_SCHEDULE 0
#endif
/* make SABOTAGE=clip: the clip's chunk folds (2-norm and 1-norm) walk their rows backwards. */
#ifdef MT_SABOTAGE_CLIP
#define MT_SAB_CLIP 1
#else
#define MT_SAB_CLIP 0
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
MT_HD_INLINE float mt_chunk_sumsq(const float *x, int64_t n) {   /* inlined: its fmaf an instruction in the CPU clones */
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

/* The max norm's step (clip.md): |x| replaces acc when larger or NaN. Exact, so any order of
 * steps gives the same value; a NaN, once in, stays (as torch's max; fmaxf would drop it). */
MT_HD float mt_max_abs(float acc, float x) {
    float a = fabsf(x);
    return (a > acc || a != a) ? a : acc;
}

/* The largest |x_i| of x[0..n) by mt_max_abs from +0.0 (+0.0 for n == 0); NaN if any x_i is. */
MT_HD float mt_maxabs(const float *x, int64_t n) {
    float acc[MT_LANES], m = 0.0f;
    for (int l = 0; l < MT_LANES; ++l) acc[l] = 0.0f;
    int64_t full = n / MT_LANES;
    for (int64_t r = 0; r < full; ++r)
        for (int l = 0; l < MT_LANES; ++l) acc[l] = mt_max_abs(acc[l], x[r * MT_LANES + l]);
    for (int64_t l = 0; l < n - full * MT_LANES; ++l) acc[l] = mt_max_abs(acc[l], x[full * MT_LANES + l]);
    for (int l = 0; l < MT_LANES; ++l) m = mt_max_abs(m, acc[l]);
    return m;
}

/* x, or the canonical quiet NaN 0x7fc00000 when x is a NaN (vendors' NaNs differ in sign and
 * payload; clip.md writes every NaN as this one). */
MT_HD float mt_canonical_nan(float x) { return x != x ? mt_bits_f32(0x7fc00000u) : x; }

/* The clip's applied coefficient (clip.md): c = max_norm / (total + 1e-6); 1 when c >= 1, else c
 * (a NaN c, from a NaN total, stays NaN as in torch.clamp(c, max=1)). The division is rounded to
 * nearest in every numeric mode: nvcc's --use_fast_math (the fast mode) makes `/` an approximate
 * division that returns 0 for a divisor above 2**126, which would zero every gradient of a finite
 * total there (an inf-norm of 1e38); one division per call costs nothing. */
MT_HD float mt_clip_applied(float max_norm, float total) {
#if defined(__CUDA_ARCH__)
    float c = __fdiv_rn(max_norm, total + 1e-6f);
#else
    float c = max_norm / (total + 1e-6f);
#endif
    return c >= 1.0f ? 1.0f : mt_canonical_nan(c);
}

#if defined(__CUDACC__) || defined(__HIPCC__)
/* The same tree on a 32-thread warp: thread t holds lanes 4t..4t+3, so a row of 128 lanes is
 * one float4 per thread and the lane tree's first five levels are shuffles. */
#if defined(__HIPCC__)
#define MT_WARP_DOWN(v, d) __shfl_down((v), (d), 32)
#define MT_WARP_XOR(v, d) __shfl_xor((v), (d), 32)
#else
#define MT_WARP_DOWN(v, d) __shfl_down_sync(0xffffffffu, (v), (d), 32)
#define MT_WARP_XOR(v, d) __shfl_xor_sync(0xffffffffu, (v), (d), 32)
#endif

/* Four consecutive floats at p: one 16-byte load when VEC (p 16-byte aligned), else four. */
template <bool VEC>
__device__ __forceinline__ float4 mt_load4(const float *p) {
    if (VEC) return *(const float4 *)p;
    return make_float4(p[0], p[1], p[2], p[3]);
}

/* The chunk fold of clip.md on one warp, for any step: n <= MT_CHUNK elements of one chunk,
 * K quantities folded side by side over the same lanes. The step F is a functor with
 *   F::V             what one row of four lanes reads (a float4, or several);
 *   f.load(i)        reads elements i .. i+3 (lanes 4t .. 4t+3 of one row);
 *   f.step(acc, v, i) folds them into acc[k][0..3] (and may write element-wise results);
 *   f.one(acc, q, i) reads and folds element i into acc[k][q] (the short last row).
 * Rows are walked in ascending order, loads issued MT_FOLD_BATCH rows ahead of their steps, or
 * descending when `reversed` (a sabotage switch; pass a constant). Then the lane tree (h = 64
 * .. 4 by shuffles, 2 and 1 in registers); out[k] is valid in thread 0. The C forms are
 * mt_chunk_sumsq and MT_DEFINE_CHUNK_FOLD. */
#define MT_FOLD_BATCH 4
template <int K, class F>
__device__ __forceinline__ void mt_warp_chunk_fold(float (&out)[K], const F &f, int64_t n, int t, bool reversed) {
    float a[K][4];
#pragma unroll
    for (int k = 0; k < K; ++k) a[k][0] = a[k][1] = a[k][2] = a[k][3] = 0.0f;
    int full = (int)(n / MT_LANES), l = 4 * t;
    if (reversed) {
        for (int r = full - 1; r >= 0; --r) f.step(a, f.load(r * MT_LANES + l), r * MT_LANES + l);
    } else {
        int r = 0;
        for (; r + MT_FOLD_BATCH <= full; r += MT_FOLD_BATCH) {
            typename F::V v[MT_FOLD_BATCH];
#pragma unroll
            for (int u = 0; u < MT_FOLD_BATCH; ++u) v[u] = f.load((r + u) * MT_LANES + l);
#pragma unroll
            for (int u = 0; u < MT_FOLD_BATCH; ++u) f.step(a, v[u], (r + u) * MT_LANES + l);
        }
        for (; r < full; ++r) f.step(a, f.load(r * MT_LANES + l), r * MT_LANES + l);
    }
    int rest = (int)(n - (int64_t)full * MT_LANES);
#pragma unroll
    for (int q = 0; q < 4; ++q)
        if (l + q < rest) f.one(a, q, full * MT_LANES + l + q);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        for (int d = 16; d >= 1; d >>= 1) {      /* lane tree, h = 64 .. 4 */
            a[k][0] = a[k][0] + MT_WARP_DOWN(a[k][0], d); a[k][1] = a[k][1] + MT_WARP_DOWN(a[k][1], d);
            a[k][2] = a[k][2] + MT_WARP_DOWN(a[k][2], d); a[k][3] = a[k][3] + MT_WARP_DOWN(a[k][3], d);
        }
        a[k][0] = a[k][0] + a[k][2]; a[k][1] = a[k][1] + a[k][3];   /* h = 2 */
        out[k] = a[k][0] + a[k][1];                                 /* h = 1 */
    }
}

/* The step functor of one input x and one quantity: acc = OP::step(acc, element). */
template <bool VEC, class OP>
struct mt_fold_one {
    typedef float4 V;
    const float *x;
    __device__ __forceinline__ V load(int64_t i) const { return mt_load4<VEC>(x + i); }
    __device__ __forceinline__ void step(float (&a)[1][4], const V &q, int64_t) const {
        a[0][0] = OP::step(a[0][0], q.x); a[0][1] = OP::step(a[0][1], q.y);
        a[0][2] = OP::step(a[0][2], q.z); a[0][3] = OP::step(a[0][3], q.w);
    }
    __device__ __forceinline__ void one(float (&a)[1][4], int q, int64_t i) const { a[0][q] = OP::step(a[0][q], x[i]); }
};

/* The clip step: acc = fma(x, x, acc). */
struct mt_step_sumsq {
    static __device__ __forceinline__ float step(float acc, float x) { return fmaf(x, x, acc); }
};

/* The clip's 1-norm step: acc = acc + |x| (|x| exact). */
struct mt_step_sumabs {
    static __device__ __forceinline__ float step(float acc, float x) { return acc + fabsf(x); }
};

/* One chunk (n <= MT_CHUNK floats at x) folded by the clip step OP (16-byte loads when x is
 * aligned); the result is valid in thread 0. */
template <class OP>
__device__ __forceinline__ float mt_warp_chunk_clip(const float *x, int64_t n, int t) {
    float out[1];
    if (((uintptr_t)x & 15u) == 0) {
        mt_fold_one<true, OP> f = {x};
        mt_warp_chunk_fold<1>(out, f, n, t, MT_SAB_CLIP);
    } else {
        mt_fold_one<false, OP> f = {x};
        mt_warp_chunk_fold<1>(out, f, n, t, MT_SAB_CLIP);
    }
    return out[0];
}

/* Sum of squares (mt_chunk_sumsq) and of absolute values (mt_chunk_sumabs) of one chunk. */
__device__ __forceinline__ float mt_warp_chunk_sumsq(const float *x, int64_t n, int t) {
    return mt_warp_chunk_clip<mt_step_sumsq>(x, n, t);
}
__device__ __forceinline__ float mt_warp_chunk_sumabs(const float *x, int64_t n, int t) {
    return mt_warp_chunk_clip<mt_step_sumabs>(x, n, t);
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

/* mt_tree_fold of m partials at src on a whole block (every thread calls it, after a barrier
 * that published src): aligned groups of 32 are complete subtrees of five levels, folded by
 * mt_warp_fold32, so each round leaves ceil(m / 32) partials, written alternately to a and b
 * (each with room for ceil(m / 32) floats; b may be src itself, which is then overwritten from
 * the second round on, else src is only read). The one block tree of every GPU kernel: the
 * clip norms (a, b: two halves of shared memory), the row folds and the token leaves (b = src).
 * Returns the root (0 for m == 0) in every thread; memory may be shared or global. */
__device__ __forceinline__ float mt_block_tree_fold(const float *src, int64_t m, float *a, float *b) {
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    const float *cur = src;
    float *out = a, *spare = b;
    while (m > 1) {
        int64_t groups = (m + 31) / 32;
        for (int64_t g = w; g < groups; g += nw) {
            int64_t at = g * 32 + t;
            int valid = (int)(m - g * 32 < 32 ? m - g * 32 : 32);
            float r = mt_warp_fold32(at < m ? cur[at] : 0.0f, t, valid);
            if (t == 0) out[g] = r;
        }
        __syncthreads();
        float *done = out;
        cur = done;
        out = spare;
        spare = done;
        m = groups;
    }
    float root = m == 1 ? cur[0] : 0.0f;
    __syncthreads();
    return root;
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

/* ---- optimizer element updates (contract: native/contracts/optim.md) ------------------ */
typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float one_minus_beta1, one_minus_beta2, step_size, sqrt_bias2, decay, grad_sign;
    int32_t coupled;   /* Adam with weight_decay != 0: g + weight_decay * p */
    int32_t amsgrad;   /* the denominator from max_exp_avg_sq (set by the caller; 0 here) */
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
    s.amsgrad = 0;
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
 * clipping: an exact identity). `coupled` and `amsgrad` are s->coupled and s->amsgrad, passed
 * separately so that loops can be specialised on them. With amsgrad, *w (max_exp_avg_sq)
 * becomes max(w, v') -- w on a tie, as torch.maximum(w, v') -- and the denominator is taken
 * from it; w is not touched (may be NULL) without. */
MT_HD void mt_adam_elem(float *p, float *m, float *v, float *w, float g, const mt_adam_scalars *s,
                        int coupled, int amsgrad) {
    float pv = *p * s->decay;
    g = g * s->grad_sign;
    if (coupled) g = MT_MADD(s->weight_decay, pv, g);
    float mv = MT_MADD(s->one_minus_beta1, g - *m, *m);
    float vv = MT_OPT_MADD(s->one_minus_beta2, g * g, *v * s->beta2);
    float vd = vv;
    if (amsgrad) {
        float wv = *w;
        vd = vv > wv ? vv : wv;
        *w = vd;
    }
    float denom = sqrtf(vd) / s->sqrt_bias2 + s->eps;
    /* A NaN can only come from what torch also allows (eps = 0 with a zero denominator: 0/0, or
     * moments overflowed to inf); vendors' NaN bits differ, so each written NaN is 0x7fc00000. */
    *p = mt_canonical_nan(pv - s->step_size * (mv / denom));
    *m = mt_canonical_nan(mv);
    *v = mt_canonical_nan(vv);
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
        *buf = mt_canonical_nan(b);
        g = s->nesterov ? MT_MADD(s->momentum, b, g) : b;
    }
    *p = mt_canonical_nan(MT_OPT_MADD(-s->lr, g, pv));     /* lr = 0 times an overflowed g: 0 * inf */
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

/* ==== pinned exp, log, log1p, erf, tanh (contract: native/contracts/math.md) ===============
 * Float32-only (no double: Metal has none), no libm call but fmaf, every step a correctly
 * rounded binary32 + - * / or fmaf in the order written, IEEE gradual underflow. Measured by
 * the exhaustive sweep `make math-sweep` (bench/results/math_sweep.md) over all 2^32 inputs:
 * max error 0.5203 ulp (exp), 0.5419 (log), 0.5551 (log1p) -- stated bounds 0.521, 0.542,
 * 0.556 ulp (math.md) -- and correctly rounded for 99.993% to 99.995% of inputs; erf and
 * tanh (at the end of the section, for GELU) have their own bounds in math.md. Special
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

/* ln 2 = MT_LN2_HI + MT_LN2_LO: the nearest float, then the nearest float to the rest. */
#define MT_LN2_HI 0.693147182464599609375f                      /* 0x3f317218 */
#define MT_LN2_LO -1.9046542121259335544891655445098876953125e-9f /* 0xb102e308 */

/* Steps 1-2 of math.md's mt_expf for a clamped x (-104 <= x <= 89): k (as the float kf,
 * an integer value) and e^r as the unevaluated pair s2 + *lo, so that e^x = (s2 + lo) 2^k.
 * The one definition both mt_expf and mt_expf_mid round. */
MT_HD float mt_math_exp_pair(float xs, float *kf_out, float *lo_out) {
    const float INV_LN2 = 1.44269502162933349609375f;   /* 0x3fb8aa3b */
    const float SHIFT = 12582912.0f;                   /* 0x4b400000 = 1.5 * 2^23 */
    const float P0 = 0.16666667163372039794921875f;          /* 0x3e2aaaab */
    const float P1 = 0.0416666679084300994873046875f;        /* 0x3d2aaaab */
    const float P2 = 0.008333198726177215576171875f;         /* 0x3c0887f8 */
    const float P3 = 0.001388860284350812435150146484375f;   /* 0x3ab60a6b */
    const float P4 = 0.000199524001800455152988433837890625f; /* 0x39513751 */
    const float P5 = 0.000024987515644170343875885009765625f; /* 0x37d19c48 */
    float kf = fmaf(xs, INV_LN2, SHIFT) - SHIFT;     /* round to nearest integer, -150 <= k <= 128 */
    float rhi = fmaf(-kf, MT_LN2_HI, xs);            /* exact */
    float corr = -kf * MT_LN2_LO;
    float s = 1.0f + rhi;
    float e0 = (1.0f - s) + rhi;                     /* 1 + rhi = s + e0 */
    float r2 = rhi * rhi;
    float r2lo = fmaf(rhi, rhi, -r2);                /* rhi^2 = r2 + r2lo */
    float h = 0.5f * r2;
    float s2 = s + h;
    float e1 = h - (s2 - s);                         /* s + h = s2 + e1 */
    float p = P5;
    p = fmaf(p, rhi, P4);
    p = fmaf(p, rhi, P3);
    p = fmaf(p, rhi, P2);
    p = fmaf(p, rhi, P1);
    p = fmaf(p, rhi, P0);
    float lo = (r2 * rhi) * p + (0.5f * r2lo + (e0 + e1));
    *lo_out = lo + corr * (s2 + lo);
    *kf_out = kf;
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
    float s2 = mt_math_exp_pair(xs, &kf, &lo);
    int k = (int)kf;
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
    float s2 = mt_math_exp_pair(x, &kf, &lo);
    return (s2 + lo) * mt_math_pow2i((int)kf);
}

/* e * ln2 + log1p(f + flo), the core of mt_logf and mt_log1pf: e an integer-valued float
 * (|e| <= 149), f + flo in [sqrt(1/2) - 1, sqrt(2) - 1] with f a float, flo = 0 or
 * |flo| <= half an ulp of 1 + f (so |f| >= |flo| unless f == 0).
 * log1p(g) = 2 atanh(sv), sv = g / (2 + g) = shi + slo (|sv| <= 0.1716): shi = fl(num / den)
 * and slo from the exact fmaf remainder; 2 atanh(sv) = 2 shi + 2 slo + shi^3 Q(shi^2),
 * Q ~ (2 atanh(s) - 2 s) / s^3 in z = s^2 of degree 3 on 0 <= z <= 0.0295. e * ln2 =
 * ahi + alo (ahi = e * MT_LN2_HI, its rounding error by fmaf, plus e * MT_LN2_LO);
 * ahi + 2 shi = sum + err exactly (Fast2Sum); the result is sum + (small terms), one
 * final rounding of an error of a few 2^-30 relative. */
MT_HD float mt_math_log_core(float e, float f, float flo) {
    const float Q0 = 0.66666662693023681640625f;       /* 0x3f2aaaaa */
    const float Q1 = 0.400008141994476318359375f;      /* 0x3ecccdde */
    const float Q2 = 0.28513240814208984375f;          /* 0x3e91fce0 */
    const float Q3 = 0.23964299261569976806640625f;    /* 0x3e7564f9 */
    float nhi = f + flo;
    float nlo = flo - (nhi - f);                     /* f + flo = nhi + nlo */
    float dhi = 2.0f + f;
    float dlo = ((2.0f - dhi) + f) + flo;            /* 2 + f + flo = dhi + dlo (to 2^-48) */
    float shi = nhi / dhi;
    float rem = fmaf(-shi, dhi, nhi);                /* exact remainder */
    float slo = (rem + (nlo - shi * dlo)) / dhi;
    float z = shi * shi;
    float q = Q3;
    q = fmaf(q, z, Q2);
    q = fmaf(q, z, Q1);
    q = fmaf(q, z, Q0);
    float t = (shi * z) * q;
    float ahi = e * MT_LN2_HI;
    float alo = fmaf(e, MT_LN2_HI, -ahi) + e * MT_LN2_LO;
    float b = 2.0f * shi;
    float sum = ahi + b;
    float err = b - (sum - ahi);                     /* ahi + b = sum + err (|ahi| >= |b| or ahi == 0) */
    return sum + (((t + 2.0f * slo) + alo) + err);
}

/* Splits a positive normal float v as 2^e * m with m in [sqrt(1/2), sqrt(2)) (bits
 * 0x3f3504f3 .. 0x3fb504f2): integer arithmetic on the bits only. */
MT_HD float mt_math_split(float v, int *e) {
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
    return mt_math_log_core((float)(e + eoff), m - 1.0f, 0.0f);
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

/* ---- erf and tanh (math.md, "mt_erff", "mt_tanhf") -------------------------------------
 * Both are odd: computed on a = |x| and given x's sign bit (exact, so f(-x) = -f(x) bit for
 * bit and f(-0) = -0). Branch-free like mt_expf: both pieces are formed and mt_math_pick
 * chooses, so that a loop of them vectorizes. Their tails take e^v as the unevaluated pair
 * of mt_math_exp_pair (2^-31 relative) rather than a rounded mt_expf, so the one rounding that
 * matters is the last. */

/* erf(x). Special: NaN -> NaN; +-inf -> +-1; a = |x| is clamped to 4 first, where the tail gives
 * exactly 1 (erf a rounds to 1 from 3.9192059; this gives 1 from 3.9223275 on, and 1 or
 * 1 - 2^-24 between, both within its bound). a < 0.6875: erf = a + a p (one fmaf), p = EA(s)
 * ~ erf(a)/a - 1 in s = a*a of degree 5, plus slo * (EA1 + 2 EA2 s) for the rounding error
 * slo of s. a >= 0.6875: erf = 1 - e^(-s - slo) R(a), R ~ e^(a^2) erfc(a) of degree 10 in
 * d = a - 1 (exact), with e^-s a pair from mt_math_exp_pair, R's last Horner step split
 * exactly into rh + rl, their product a pair, and 1 - product by Fast2Sum: one final
 * rounding. Measured: < 0.625 ulp (math.md). */
MT_HD_INLINE float mt_erff(float x) {
    const float EA0 = 0.128379166126251220703125f;          /* 0x3e0375d4 */
    const float EA1 = -0.37612628936767578125f;             /* 0xbec093a0 */
    const float EA2 = 0.11283566057682037353515625f;        /* 0x3de71662 */
    const float EA3 = -0.02684639580547809600830078125f;    /* 0xbcdbecf9 */
    const float EA4 = 0.0051435814239084720611572265625f;   /* 0x3ba88b7d */
    const float EA5 = -0.0007000532350502908229827880859375f; /* 0xba3783c7 */
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
    float p = EA5;                                   /* a < 0.6875 */
    p = fmaf(p, s, EA4);
    p = fmaf(p, s, EA3);
    p = fmaf(p, s, EA2);
    p = fmaf(p, s, EA1);
    p = fmaf(p, s, EA0);
    p = fmaf(slo, fmaf(2.0f * EA2, s, EA1), p);
    float ysmall = fmaf(a, p, a);
    float kf, lo;                                    /* a >= 0.6875: e^-s = (s2 + lo) 2^k */
    float s2 = mt_math_exp_pair(-s, &kf, &lo);
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
    float sc = mt_math_pow2i((int)kf);               /* 2^k, -23 <= k <= 0: exact scalings */
    ph = ph * sc;
    pl = pl * sc;
    float th = 1.0f - ph;
    float terr = (1.0f - th) - ph;                   /* 1 - ph = th + terr */
    float ytail = th + (terr - pl);
    float y = mt_math_pick(a < 0.6875f, ysmall, ytail);
    y = mt_bits_f32(mt_f32_bits(y) | (u & 0x80000000u));
    return mt_math_pick(is_nan, mt_bits_f32(MT_MATH_QNAN), y);
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
    float s2 = mt_math_exp_pair(2.0f * a, &kf, &lo);
    float sc = mt_math_pow2i((int)kf);               /* 2^k, 0 <= k <= 29 */
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

/* ==== losses and dense layers (contracts: native/contracts/loss.md, linear.md, rms_norm.md)
 * The per-element arithmetic every vendor shares. Loop schedules (which thread folds which
 * lane, which block owns which leaf) belong to the vendors; the trees they must realise are
 * the chunk tree above (along a row) and the token rule below (across rows). */

/* Sabotage switches of these ops (make SABOTAGE=loss|linear|rms_norm|lm_head): 1 reverses
 * an order or contracts where the contract forbids it; a switch in a shared step (e.g. the dot
 * step of linear) reaches every op that uses that step (RMSNorm's dweight, the LM head). */
#ifdef MT_SABOTAGE_LOSS
#define MT_SAB_LOSS 1
#else
#define MT_SAB_LOSS 0
#endif
#ifdef MT_SABOTAGE_RMS_NORM
#define MT_SAB_RMS_NORM 1
#else
#define MT_SAB_RMS_NORM 0
#endif
#ifdef MT_SABOTAGE_LM_HEAD
#define MT_SAB_LM_HEAD 1
#else
#define MT_SAB_LM_HEAD 0
#endif

/* One step of every dot-product chain (GEMMs, token contractions): acc = fma(a, b, acc),
 * one rounding. The linear sabotage rounds the product first. */
#ifdef MT_SABOTAGE_LINEAR
#define MT_DOT_STEP(a, b, acc) ((a) * (b) + (acc))
#else
#define MT_DOT_STEP(a, b, acc) fmaf((a), (b), (acc))
#endif

/* A chunk fold (n <= MT_CHUNK elements): lane l folds elements l, l + MT_LANES, ... from
 * +0.0 with STEP(acc, i), then the lane tree. REVERSED (a sabotage switch) walks the rows
 * backwards. Defines `MT_HD_INLINE float NAME(int64_t n, ARGS...)`: inlined, so the CPU
 * oracle's target clones run its fmaf as an instruction (as a call compiled for the baseline
 * x86-64 it was a libm call per element: 6x slower RMSNorm, the same bits). */
#define MT_DEFINE_CHUNK_FOLD(NAME, REVERSED, STEP, ...)                                   \
    MT_HD_INLINE float NAME(int64_t n, __VA_ARGS__) {                                            \
        float acc[MT_LANES];                                                                \
        for (int l = 0; l < MT_LANES; ++l) acc[l] = 0.0f;                                   \
        int64_t full = n / MT_LANES;                                                        \
        for (int64_t rr = 0; rr < full; ++rr) {                                             \
            int64_t r = (REVERSED) ? full - 1 - rr : rr;                                    \
            for (int l = 0; l < MT_LANES; ++l) STEP(acc[l], r * MT_LANES + l);              \
        }                                                                                   \
        for (int64_t l = 0; l < n - full * MT_LANES; ++l) STEP(acc[l], full * MT_LANES + l); \
        return mt_lane_tree(acc);                                                           \
    }

/* sum of e^(x_i - m): the softmax denominator of one chunk of a row. Each term also goes to
 * e[i] unless e is NULL; mid (every x_i - m in mt_expf_mid's range) takes mt_expf_mid, the
 * same bits. Call it with e and mid known (a constant, or under a test of them) so that the
 * compiler folds both out of the loop: each case then vectorizes on its own. */
MT_HD float mt_exp_term(float v, float *e, int64_t i, int mid) {
    float t = mid ? mt_expf_mid(v) : mt_expf(v);
    if (e) e[i] = t;
    return t;
}
#define MT_STEP_SUM_EXP(acc, i) (acc) = (acc) + mt_exp_term(x[i] - m, e, i, mid)
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_exp, MT_SAB_LOSS, MT_STEP_SUM_EXP, const float *x, float m, float *e, int mid)
/* sum of x_i (label smoothing's mean logit) */
#define MT_STEP_SUM(acc, i) (acc) = (acc) + x[i]
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum, MT_SAB_LOSS, MT_STEP_SUM, const float *x)
/* sum of x_i^2 (RMSNorm's mean square): fma(x, x, acc) as in the clip tree */
#define MT_STEP_SUMSQ(acc, i) (acc) = fmaf(x[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sumsq_rms, MT_SAB_RMS_NORM, MT_STEP_SUMSQ, const float *x)
/* sum of |x_i| (the clip's 1-norm, clip.md): the clip tree with acc + |x| */
#define MT_STEP_SUMABS(acc, i) (acc) = (acc) + fabsf(x[i])
MT_DEFINE_CHUNK_FOLD(mt_chunk_sumabs, MT_SAB_CLIP, MT_STEP_SUMABS, const float *x)
/* sum of (dy_i * w_i) * x_i (RMSNorm backward's row dot); w may be NULL (all ones) */
#define MT_STEP_GDOT(acc, i) (acc) = fmaf(w ? dy[i] * w[i] : dy[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_rms_dot, MT_SAB_RMS_NORM, MT_STEP_GDOT, const float *dy, const float *w,
                     const float *x)

/* ---- the token rule (every contraction over tokens/rows) ----------------------------------
 * Tokens are cut into leaves of MT_TOKEN_LEAF (the last may be short). A leaf's partial
 * starts at +0.0 and folds its tokens in ascending order (MT_DOT_STEP for products, + for
 * single terms); the partials meet in the pairwise tree of mt_tree_fold. That tree equals
 * "split off the largest power of two on the left, recurse on the rest", so it can also be
 * built on the fly with a stack of complete subtrees (mt_token_stack) in log2 memory. */
#define MT_TOKEN_LEAF 1024

MT_HD int64_t mt_token_leaves(int64_t tokens) { return (tokens + MT_TOKEN_LEAF - 1) / MT_TOKEN_LEAF; }

/* The pairwise tree over leaf partials; `reversed` (a sabotage switch) folds leaves
 * right to left, which must change bits. */
MT_HD float mt_token_tree(float *s, int64_t m, int reversed) {
    if (reversed) {
        float acc = m > 0 ? s[m - 1] : 0.0f;
        for (int64_t k = m - 2; k >= 0; --k) acc = s[k] + acc;
        return acc;
    }
    return mt_tree_fold(s, m);
}

/* make SABOTAGE=accumulate (contract: native/contracts/accumulate.md): the stack of complete
 * subtrees over microbatches folds from its bottom, ((S_0 + S_1) + S_2) + ..., instead of
 * from its top; a count with three or more one bits (7, 11, 13, ...) must change bits. */
#ifdef MT_SABOTAGE_ACCUMULATE
#define MT_SAB_ACCUMULATE 1
#else
#define MT_SAB_ACCUMULATE 0
#endif

/* ---- cross-entropy ------------------------------------------------------------------------ */
typedef struct {
    float g;      /* gradient scale: 1 (sum) or 1 / D (mean) */
    float off;    /* smoothed target of a non-target class: eps / V (0 without smoothing) */
    float hit;    /* smoothed target of the target class: (1 - eps) + off */
    float keep;   /* 1 - eps */
    float eps;
    float vocab;  /* V as a float (V < 2^24, exact) */
} mt_ce_scalars;

/* Host side, once per call. divisor is D for the mean (any value for the other reductions). */
MT_HD mt_ce_scalars mt_ce_scalars_for(float eps, int64_t vocab, int32_t mean, float divisor) {
    mt_ce_scalars c;
    c.eps = eps;
    c.vocab = (float)vocab;
    c.keep = 1.0f - eps;
    c.off = eps / c.vocab;
    c.hit = c.keep + c.off;
    c.g = mean ? 1.0f / divisor : 1.0f;
    return c;
}

/* A row's loss from its max m, softmax denominator s, target logit xt and (smoothing only)
 * the tree sum of its logits. */
MT_HD float mt_ce_row_loss(float m, float s, float xt, float sum_x, const mt_ce_scalars *c) {
    float lse = m + mt_logf(s);
    float nll = lse - xt;
    if (c->eps == 0.0f) return nll;
    float smooth = lse - sum_x / c->vocab;
    return c->keep * nll + c->eps * smooth;
}

/* d loss / d x_j of a non-ignored row: e = e^(x_j - m) as in the denominator's fold. */
MT_HD float mt_ce_grad(float e, float s, int is_target, const mt_ce_scalars *c) {
    float p = e / s;
    return (p - (is_target ? c->hit : c->off)) * c->g;
}

/* ---- cross-entropy with a class weight or probability targets (mt_cross_entropy_nd; loss.md,
 * "Weights, probability targets and positions"). Every NaN these write is the canonical one
 * (mt_canonical_nan). */

/* c_i = w_i * y'_i of a probability target: y'_i = y_i, or keep * y_i + off with smoothing;
 * w NULL: no weight (a product by 1 would be exact). */
MT_HD float mt_ce_coef(const float *y, const float *w, int64_t i, const mt_ce_scalars *c) {
    float v = c->eps != 0.0f ? c->keep * y[i] + c->off : y[i];
    return w ? w[i] * v : v;
}
/* sum of w_i x_i, fma steps (weighted smoothing); sum of c_i; sum of c_i x_i, fma steps */
#define MT_STEP_SUM_WX(acc, i) (acc) = fmaf(w[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_wx, MT_SAB_LOSS, MT_STEP_SUM_WX, const float *x, const float *w)
#define MT_STEP_SUM_COEF(acc, i) (acc) = (acc) + mt_ce_coef(y, w, (i), c)
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_coef, MT_SAB_LOSS, MT_STEP_SUM_COEF, const float *y, const float *w,
                     const mt_ce_scalars *c)
#define MT_STEP_SUM_COEF_X(acc, i) (acc) = fmaf(mt_ce_coef(y, w, (i), c), x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_coef_x, MT_SAB_LOSS, MT_STEP_SUM_COEF_X, const float *x, const float *y,
                     const float *w, const mt_ce_scalars *c)

/* A row's loss, index target t with weight: wt = w_t, sw = the fold of w_j x_j (smoothing
 * only), wm = W / V (+0.0 without smoothing). */
MT_HD float mt_ce_row_loss_w(float m, float s, float xt, float wt, float sw, float wm, const mt_ce_scalars *c) {
    float lse = m + mt_logf(s);
    float wnll = wt * (lse - xt);
    if (c->eps == 0.0f) return mt_canonical_nan(wnll);
    float smooth = fmaf(lse, wm, -(sw / c->vocab));
    return mt_canonical_nan(c->keep * wnll + c->eps * smooth);
}

/* A row's loss, probability targets: fma(lse, C, -CX) with C, CX the folds of c_j, c_j x_j. */
MT_HD float mt_ce_row_loss_p(float m, float s, float csum, float cx) {
    return mt_canonical_nan(fmaf(m + mt_logf(s), csum, -cx));
}

/* The softmax factor A of a weighted index row and its target's y_t, from kt = keep * w_t. */
MT_HD float mt_ce_factor_w(float kt, float wm, const mt_ce_scalars *c) { return kt + c->eps * wm; }
MT_HD float mt_ce_target_w(float kt, float wt, const mt_ce_scalars *c) { return kt + c->off * wt; }

/* d loss / d x_j: fma(e / s, a, -y) * g (weighted index: a = A, y = y_j; probabilities: a = C,
 * y = c_j); e as in the denominator's fold. */
MT_HD float mt_ce_grad_nd(float e, float s, float a, float y, float g) {
    return mt_canonical_nan(fmaf(e / s, a, -y) * g);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */
/* 1 / sqrt(ss / dim + eps) from a row's sum of squares: three roundings and a division. */
MT_HD float mt_rms_rstd(float ss, float dimf, float eps) { return 1.0f / sqrtf(ss / dimf + eps); }

/* dx_i = r * g_i - k * x_i with g_i = dy_i * w_i and k = (c / dim) * (r * r * r). */
MT_HD float mt_rms_k(float c, float dimf, float r) { return (c / dimf) * ((r * r) * r); }
MT_HD float mt_rms_dx(float dy, float w, float x, float r, float k) { return r * (dy * w) - k * x; }

/* ---- LayerNorm (contract: native/contracts/layer_norm.md) --------------------------------
 * Per row: mu = (chunk tree of x) / D; var = (chunk tree of fma(x - mu, x - mu, acc)) / D
 * (two-pass); r = mt_rms_rstd(var's sum, D, eps); xhat = (x - mu) * r; y = fma(xhat, w, b),
 * w = 1 and b = -0.0 where there is no weight / bias (fma(xhat, 1, b) = xhat + b and
 * fma(xhat, w, -0.0) = xhat * w, bit for bit). make SABOTAGE=layer_norm walks the row
 * chunks' lane rows backwards. */
#ifdef MT_SABOTAGE_LAYER_NORM
#define MT_SAB_LAYER_NORM 1
#else
#define MT_SAB_LAYER_NORM 0
#endif
MT_HD float mt_ln_mean(float s, float dimf) { return s / dimf; }
MT_HD float mt_ln_xhat(float x, float mu, float r) { return (x - mu) * r; }
MT_HD float mt_ln_y(float x, float mu, float r, float w, float b) { return fmaf(mt_ln_xhat(x, mu, r), w, b); }
/* dx_i = r * ((g_i - mg) - xhat_i * mgx), g_i = dy_i * w_i, mg = sum(g) / D, mgx = sum(g xhat) / D */
MT_HD float mt_ln_dx(float dy, float w, float x, float mu, float r, float mg, float mgx) {
    return r * ((dy * w - mg) - mt_ln_xhat(x, mu, r) * mgx);
}
/* The row folds: sum of x; of (x - mu)^2 by fma; of g = dy * w (w NULL: dy); of g * xhat by fma. */
#define MT_STEP_LN_SUM(acc, i) (acc) = (acc) + x[i]
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_sum, MT_SAB_LAYER_NORM, MT_STEP_LN_SUM, const float *x)
#define MT_STEP_LN_DEVSQ(acc, i) (acc) = fmaf(x[i] - mu, x[i] - mu, (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_devsq, MT_SAB_LAYER_NORM, MT_STEP_LN_DEVSQ, const float *x, float mu)
#define MT_STEP_LN_G(acc, i) (acc) = (acc) + (w ? dy[i] * w[i] : dy[i])
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_g, MT_SAB_LAYER_NORM, MT_STEP_LN_G, const float *dy, const float *w)
/* (rstd, not r: the fold's own row index is r) */
#define MT_STEP_LN_GX(acc, i) (acc) = fmaf(w ? dy[i] * w[i] : dy[i], mt_ln_xhat(x[i], mu, rstd), (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_gx, MT_SAB_LAYER_NORM, MT_STEP_LN_GX, const float *dy, const float *w,
                     const float *x, float mu, float rstd)

/* ---- ReLU --------------------------------------------------------------------------------- */
MT_HD float mt_relu(float x) { return x > 0.0f ? x : 0.0f; }
MT_HD float mt_relu_grad(float dy, float x) { return x > 0.0f ? dy : 0.0f; }
/* ---- attention (contract: native/contracts/attention.md) ---------------------------------
 * The scalar steps of the online softmax and of its backward; the chains (scores, dp, delta,
 * out, dq, dk, dv: MT_DOT_STEP in a stated order) and the block walk are the vendors'.
 * Keys come in blocks of MT_ATTN_KEY_BLOCK; a pair whose score is -inf is masked and takes
 * part in nothing. make SABOTAGE=attention divides through a rounded reciprocal (out) and
 * distributes p over (dp - delta) (ds): each adds a rounding the contract does not have. */
#ifdef MT_SABOTAGE_ATTENTION
#define MT_SAB_ATTENTION 1
#else
#define MT_SAB_ATTENTION 0
#endif
#define MT_ATTN_KEY_BLOCK 64
#define MT_ATTN_MAX_D 128

/* The running maximum with NaN greatest: a NaN score makes its row's maximum NaN whatever
 * order the maxima are taken in (any NaN counts the same; its bits are never written). */
MT_HD float mt_attn_max(float m, float s) { return (s > m || s != s) ? s : m; }

/* out = acc / l, one division; +0 for a fully masked row (l = 0: no live key). */
MT_HD float mt_attn_out(float acc, float l) {
#if MT_SAB_ATTENTION
    float o = acc * (1.0f / l);
#else
    float o = acc / l;
#endif
    return mt_canonical_nan(l == 0.0f ? 0.0f : o);
}

/* lse = m + log(l): -inf + log(0) = -inf for a fully masked row. */
MT_HD float mt_attn_lse(float m, float l) { return mt_canonical_nan(m + mt_logf(l)); }

/* ds = p * (dp - delta), two roundings. */
MT_HD float mt_attn_ds(float p, float dp, float delta) {
#if MT_SAB_ATTENTION
    return p * dp - p * delta;
#else
    return p * (dp - delta);
#endif
}
/* ==== end of losses and dense layers ==================================================== */

/* ==== random draws and elementwise ops (contracts: native/contracts/random.md, elementwise.md)
 * Normal draws (Box-Muller through mt_logf, sqrtf and the pinned sin/cos of pi*x below),
 * dropout's keep rule and scaling, SiLU and its gradient through mt_expf, the residual add,
 * GELU and its gradient through mt_erff / mt_tanhf.
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
MT_HD void mt_philox_words(uint32_t out[4], uint64_t seed, uint64_t stream, uint64_t block) {
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

/* sin(pi r) for |r| <= 1/4: pi r + r^3 (S0 + z S1(z)), z = r^2, carried as exact pairs
 * (r^2 = z + zl, r^3 = c + cl, r * MT_PI_HI = ah + al, c * S0 = m + ml) and summed by
 * Fast2Sum (|ah| >= |m|) with one final rounding. |r| < 2^-64: the same sum pi r scaled by
 * 2^64 and rounded once onto the (possibly subnormal) grid. */
MT_HD float mt_sinpi_core(float r) {
    const float S0 = -5.167712688446044921875f;          /* 0xc0a55de7 */
    const float S1 = 2.550152301788330078125f;           /* 0x402335b2 */
    const float S2 = -0.598763287067413330078125f;       /* 0xbf19488d */
    const float S3 = 0.073389939963817596435546875f;     /* 0x3d964d77 */
    const float S4 = 0.0465819649398326873779296875f;    /* 0x3d3eccbb */
    const float UP = 18446744073709551616.0f;            /* 2^64 */
    const float DOWN = 5.42101086242752217003726400434970855712890625e-20f;   /* 2^-64 */
    float z = r * r;
    float zl = fmaf(r, r, -z);
    float c = r * z;
    float cl = fmaf(r, z, -c) + r * zl;
    float p = S4;
    p = fmaf(p, z, S3);
    p = fmaf(p, z, S2);
    p = fmaf(p, z, S1);
    float n = (c * z) * p;
    float m = c * S0;
    float ml = fmaf(c, S0, -m);
    float ah = r * MT_PI_HI;
    float al = fmaf(r, MT_PI_HI, -ah);
#if MT_SAB_RANDOM
    float lo = al;
#else
    float lo = al + r * MT_PI_LO;
#endif
    float sum = ah + m;
    float err = m - (sum - ah);                      /* ah + m = sum + err */
    float y = sum + (((n + (ml + cl * S0)) + lo) + err);
    float rs = r * UP;                               /* exact */
    float big = rs * MT_PI_HI;
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
    float ph = C1_HI * z;
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
MT_HD void mt_sincospif(float x, float *sin_out, float *cos_out) {
    const float SHIFT = 12582912.0f;                 /* 0x4b400000 = 1.5 * 2^23 */
    uint32_t u = mt_f32_bits(x), ax = u & 0x7fffffffu;
    float a = mt_math_pick(ax >= 0x4b800000u, 0.0f, mt_bits_f32(ax));
    float xm = a - 2.0f * (float)(int32_t)(a * 0.5f);
    float kf = (2.0f * xm + SHIFT) - SHIFT;
    int q = (int)kf & 3;
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

/* ---- normal draws (Box-Muller) ----------------------------------------------------------
 * Stream elements 2j and 2j + 1 (words w0, w1 of one Philox block's pair j mod 2):
 * u1 = ((w0 >> 8) + 1) * 2^-24 in (0, 1], u2 = (w1 >> 8) * 2^-24 in [0, 1) (both exact),
 * rad = sqrtf(0 - 2 * mt_logf(u1)) (2 * log exact; rad = +0 when u1 = 1; rad <= 5.7683),
 * (s, c) = mt_sincospif(2 * u2), element 2j = rad * c, element 2j + 1 = rad * s. */
MT_HD_INLINE void mt_box_muller(uint32_t w0, uint32_t w1, float *z0, float *z1) {
    float u1 = (float)((w0 >> 8) + 1u) * 5.9604644775390625e-08f;
    float u2 = mt_u01(w1);
    float rad = sqrtf(0.0f - 2.0f * mt_logf(u1));
    float s, c;
    mt_sincospif(2.0f * u2, &s, &c);
    *z0 = rad * c;
    *z1 = rad * s;
}

/* The four standard normals of counter block `block` (stream elements 4*block + k). */
MT_HD_INLINE void mt_normal_block(float z[4], uint64_t seed, uint64_t stream, uint64_t block) {
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

/* ---- SiLU and the residual add ----------------------------------------------------------
 * silu(x) = x / d with d = 1 + mt_expf(-x) (= x * sigmoid(x); e = +inf for x < -88.72
 * gives -0, never NaN). Gradient: dy * (s * (1 + x * t)) with s = 1 / d and t = 1 - s,
 * formed as e * s for x > 0 (no cancellation) and as 1 - s otherwise. */
MT_HD float mt_silu(float x) {
    float d = 1.0f + mt_expf(-x);
#if MT_SAB_ELEMENTWISE
    return x * (1.0f / d);
#else
    return x / d;
#endif
}

MT_HD float mt_silu_grad(float dy, float x) {
    float e = mt_expf(-x);
    float s = 1.0f / (1.0f + e);
    float t = mt_math_pick(x > 0.0f, e * s, 1.0f - s);
    return dy * (s * MT_ELT_MADD(x, t, 1.0f));
}

/* a + b, one rounding (subnormal sums kept). */
MT_HD float mt_add_elem(float a, float b) {
    float r = a + b;
#if MT_SAB_ELEMENTWISE
    if ((mt_f32_bits(r) & 0x7f800000u) == 0u) r = mt_bits_f32(mt_f32_bits(r) & 0x80000000u);
#endif
    return r;
}

/* ---- GELU (elementwise.md, "GELU"): torch's formulas in torch's order, these constants -----
 * approximate='none': u = x * SQRT1_2, y = (x * 0.5) * (1 + mt_erff(u));
 *   dx = dy * (cdf + x * pdf), cdf = 0.5 * (1 + mt_erff(u)), pdf = PDF * mt_expf((x * x) * -0.5).
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

MT_HD float mt_gelu_erf(float x) { return (x * 0.5f) * (1.0f + mt_erff(mt_gelu_u(x))); }

MT_HD float mt_gelu_erf_grad(float dy, float x) {
    float cdf = 0.5f * (1.0f + mt_erff(mt_gelu_u(x)));
    float pdf = MT_GELU_PDF * mt_expf((x * x) * -0.5f);
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
/* ==== end of random draws and elementwise ops =========================================== */

#endif /* MT_PINNED_H */
