/* mt_pinned.h -- the one definition of every pinned scalar routine, tree and random stream.
 *
 * Compiles as C99, CUDA and HIP (MT_HD marks functions for host and device). Kernels and the
 * CPU oracle call these instead of re-spelling arithmetic, so the identical numeric mode has one
 * source of truth. Only binary32 + - * /, sqrt and explicit fmaf appear, each correctly
 * rounded; the build turns contraction off for the identical numeric mode (see Makefile). The
 * contracts in native/contracts/ describe, in words, what this file computes. This file holds the
 * core (bits, the length-only tree, double-float host scalars, optimizer updates, Philox) and
 * includes the rest by concern: mt_pinned_math.h, mt_pinned_layers.h, mt_pinned_elementwise.h.
 */
#ifndef MT_PINNED_H
#define MT_PINNED_H

/* Byte order: the cards, saved states, Philox counters and the Python layer read every buffer as
 * little-endian bytes, so a big-endian host is refused here rather than left to give other bits. */
#if defined(__BYTE_ORDER__) && defined(__ORDER_BIG_ENDIAN__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
#error "mojo_train: big-endian hosts are not supported (cards, saved states and the Python layer read little-endian bytes); build on a little-endian host"
#endif

/* Metal (Apple's compiler, or native/metal/shim/metal_stdlib on other machines): the kernel
 * source includes <metal_stdlib> first, which gives the fixed-width integer names; there is no
 * libm, no double, no union punning, `half` is a type, and every pointer names its address space. MT_THREAD marks the pointer parameters of these routines,
 * which always point at the calling thread's own variables (a kernel copies device data into
 * locals first); routines that walk device arrays or return host strings are host/CUDA only. */
#if defined(__METAL_VERSION__) || defined(MT_METAL_SHIM)
#define MT_METAL 1
#define MT_THREAD thread

#define fmaf(a, b, c) metal::fma((float)(a), (float)(b), (float)(c))
#define sqrtf(x) metal::precise::sqrt((float)(x))
#define fabsf(x) metal::fabs((float)(x))
#define fmaxf(a, b) metal::fmax((float)(a), (float)(b))
#ifndef UINT64_MAX
#define UINT64_MAX 0xffffffffffffffffUL
#endif
#else
#define MT_METAL 0
#define MT_THREAD
#include <stdint.h>
#include <math.h>
#endif

#if defined(__CUDACC__) || defined(__HIPCC__)
#define MT_HD __host__ __device__ __forceinline__
#else
#define MT_HD static inline
#endif
/* MT_HD, always inlined on the host (mt_erff, mt_tanhf, mt_one_plus_erff, the GELU functions
 * that call them): as a call, a routine that long is
 * compiled once for the baseline x86-64 target, where fmaf is a libm call, instead of inside the
 * CPU oracle's vectorized target clones, which have hardware fma. */
#if defined(__GNUC__) && !defined(__CUDACC__) && !defined(__HIPCC__) && !MT_METAL
#define MT_HD_INLINE static inline __attribute__((always_inline))
#else
#define MT_HD_INLINE MT_HD
#endif

#if !MT_METAL
/* Whether p is 16-byte aligned: a float4 or uint4 access may use it (host and device code). */
MT_HD int mt_gpu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }
#endif

#define MT_MODE_IDENTICAL 0
#define MT_MODE_DETERMINISTIC 1
#define MT_MODE_FAST 2
/* identical_ftz: the identical mode's arithmetic, every float32 operation under the flush rule
 * of native/contracts/ftz.md (the CPU oracle applies it to its compiled IR: mt_ftz.h) */
#define MT_MODE_IDENTICAL_FTZ 3
#ifndef MT_NUMERIC_MODE
#define MT_NUMERIC_MODE MT_MODE_IDENTICAL
#endif
/* The pinned arithmetic of the identical contract (identical and identical_ftz). */
#define MT_PINNED_ARITHMETIC (MT_NUMERIC_MODE == MT_MODE_IDENTICAL || MT_NUMERIC_MODE == MT_MODE_IDENTICAL_FTZ)

/* a*b + c: two roundings in the identical numeric modes, one (fused) elsewhere. */
#if MT_PINNED_ARITHMETIC
#define MT_MADD(a, b, c) ((a) * (b) + (c))
#else
#define MT_MADD(a, b, c) fmaf((a), (b), (c))
#endif

/* NVIDIA device code (nvcc's device pass; never HIP's): where the routines below may spell an
 * operation in the GPU's own instructions for the same result. */
#if defined(__CUDA_ARCH__) && !defined(__HIPCC__) && !defined(MT_HIP)
#define MT_CUDA_DEVICE 1
#else
#define MT_CUDA_DEVICE 0
#endif

/* a * b, the product of an exact split (p = a * b, then fmaf(a, b, -p) its error), with b a
 * constant. CUDA device code of the pinned modes spells it __fmul_rn: nvcc folds the plain
 * product's negation into the constant (-p = a * -b), a second multiply, where the intrinsic's
 * is a negated fma operand. The same bits. */
#if MT_PINNED_ARITHMETIC && MT_CUDA_DEVICE
#define MT_MUL_SPLIT(a, b) __fmul_rn((a), (b))
#else
#define MT_MUL_SPLIT(a, b) ((a) * (b))
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

#if MT_METAL
MT_HD uint32_t mt_f32_bits(float x) { return as_type<uint32_t>(x); }
MT_HD float mt_bits_f32(uint32_t u) { return as_type<float>(u); }
#else
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
#endif

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

MT_HD float mt_lane_tree(MT_THREAD float *acc /* (MT_LANES), consumed */) {
    for (int h = MT_LANES / 2; h >= 1; h >>= 1)
        for (int l = 0; l < h; ++l) acc[l] = acc[l] + acc[l + h];
    return acc[0];
}

#if !MT_METAL   /* walks an array in the caller's memory (Metal's kernels fold device memory themselves) */
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

#endif

/* Pairwise tree over m partials, in place: each level adds neighbours (2k, 2k+1) in
 * ascending order; an odd last partial rises unchanged. Returns the root (0 for m == 0).
 * MT_DEFINE_TREE_FOLD(NAME, SPACE) defines it over partials in the address space SPACE: Metal
 * folds device memory with the very same steps (mt_tree_fold_device). */
#define MT_DEFINE_TREE_FOLD(NAME, SPACE)                                              \
    MT_HD float NAME(SPACE float *s, int64_t m) {                                     \
        if (m <= 0) return 0.0f;                                                      \
        while (m > 1) {                                                               \
            int64_t pairs = m / 2;                                                    \
            for (int64_t k = 0; k < pairs; ++k) s[k] = s[2 * k] + s[2 * k + 1];      \
            if (m & 1) s[pairs] = s[m - 1];                                           \
            m = pairs + (m & 1);                                                      \
        }                                                                             \
        return s[0];                                                                  \
    }
MT_DEFINE_TREE_FOLD(mt_tree_fold, MT_THREAD)
#if MT_METAL
MT_DEFINE_TREE_FOLD(mt_tree_fold_device, device)
#endif

MT_HD int64_t mt_chunk_count(int64_t n) { return (n + MT_CHUNK - 1) / MT_CHUNK; }

/* The max norm's step (clip.md): |x| replaces acc when larger or NaN. Exact, so any order of
 * steps gives the same value; a NaN, once in, stays (as torch's max; fmaxf would drop it). */
MT_HD float mt_max_abs(float acc, float x) {
    float a = fabsf(x);
    return (a > acc || a != a) ? a : acc;
}

#if !MT_METAL
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

#endif

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

/* mt_lane_tree on one warp: thread t holds lanes 4t .. 4t+3 in a[0..3] (consumed); h = 64 .. 4
 * by shuffles, 2 and 1 in registers. The root is valid in thread 0. */
__device__ __forceinline__ float mt_warp_lane_tree(float (&a)[4]) {
    for (int d = 16; d >= 1; d >>= 1) {
        a[0] = a[0] + MT_WARP_DOWN(a[0], d); a[1] = a[1] + MT_WARP_DOWN(a[1], d);
        a[2] = a[2] + MT_WARP_DOWN(a[2], d); a[3] = a[3] + MT_WARP_DOWN(a[3], d);
    }
    a[0] = a[0] + a[2]; a[1] = a[1] + a[3];   /* h = 2 */
    return a[0] + a[1];                       /* h = 1 */
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
    for (int k = 0; k < K; ++k) out[k] = mt_warp_lane_tree(a[k]);
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
MT_HD void mt_adam_elem(MT_THREAD float *p, MT_THREAD float *m, MT_THREAD float *v, MT_THREAD float *w, float g,
                        MT_THREAD const mt_adam_scalars *s,
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
MT_HD void mt_sgd_elem(MT_THREAD float *p, MT_THREAD float *buf, float g, MT_THREAD const mt_sgd_scalars *s, int coupled,
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
/* a * c as 64 bits. CUDA device code spells it as PTX's mul.wide.u32: nvcc compiles the plain
 * 64-bit product to the same wide multiply plus an add of a zero register to its high word (20
 * adds a Philox block, ~4 instructions an element of a normal fill). The same integer. */
MT_HD uint64_t mt_mul_wide_u32(uint32_t a, uint32_t c) {
#if MT_CUDA_DEVICE
    uint64_t p;
    asm("mul.wide.u32 %0, %1, %2;" : "=l"(p) : "r"(a), "r"(c));
    return p;
#else
    return (uint64_t)a * c;
#endif
}

MT_HD void mt_philox4x32_10_block(MT_THREAD uint32_t *out /* (4) */, MT_THREAD const uint32_t *ctr /* (4) */,
                                  MT_THREAD const uint32_t *key /* (2) */) {
    uint32_t c0 = ctr[0], c1 = ctr[1], c2 = ctr[2], c3 = ctr[3];
    uint32_t k0 = key[0], k1 = key[1];
    for (int round = 0; round < 10; ++round) {
        uint64_t p0 = mt_mul_wide_u32(0xD2511F53u, c0);
        uint64_t p1 = mt_mul_wide_u32(0xCD9E8D57u, c2);
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
    return (i & 2) ? ((i & 1) ? out[3] : out[2]) : ((i & 1) ? out[1] : out[0]);   /* out[i & 3], no indexed load */
}

/* The top 24 bits of a word as a float in [0, 1): exact, spacing 2^-24. */
MT_HD float mt_u01(uint32_t word) { return (float)(word >> 8) * 5.9604644775390625e-08f; }

/* low + width * u, width = high - low formed once by the caller (two roundings). */
MT_HD float mt_uniform_at(float low, float width, uint32_t word) { return low + width * mt_u01(word); }

/* The rest of the pinned routines, by concern (each file's section markers are the contracts'
 * references): */
#include "mt_pinned_math.h"
#include "mt_pinned_layers.h"
#include "mt_pinned_elementwise.h"

#endif /* MT_PINNED_H */
