/* mt_gpu_kernels.cuh -- the GPU kernels of the optimizer and clip ops. Every piece of
 * arithmetic comes from mt_pinned.h (element updates, the tree); these kernels only decide
 * which thread computes which element, and no result depends on that choice.
 *
 * Element kernels walk the flat registry in tiles of MT_UNROLL * blockDim elements; a tile's
 * first tensor is found by binary search on the offsets, later ones by stepping.
 */
#ifndef MT_GPU_KERNELS_CUH
#define MT_GPU_KERNELS_CUH

#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

#define MT_UNROLL 8

__device__ __forceinline__ int32_t mt_dev_tensor_of(const int32_t *offs, int32_t n, int64_t k) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (offs[mid] <= k) lo = mid; else hi = mid - 1;
    }
    return lo;
}

/* fn(j, k, local) for every flat element k of the registry, tile by tile. */
template <typename F>
__device__ __forceinline__ void mt_for_elements(const int32_t *offs, int32_t n, F fn) {
    const int64_t total = offs[n];
    const int64_t tile = (int64_t)blockDim.x * MT_UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * tile; base < total; base += (int64_t)gridDim.x * tile) {
        int32_t j = mt_dev_tensor_of(offs, n, base);
#pragma unroll
        for (int u = 0; u < MT_UNROLL; ++u) {
            int64_t k = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (k >= total) break;
            while (k >= offs[j + 1]) ++j;
            fn(j, k, k - offs[j]);
        }
    }
}

__global__ void mt_k_nonfinite(float *const *tab, const int32_t *offs, int32_t n, int32_t *flag) {
    bool bad = false;
    mt_for_elements(offs, n, [&](int32_t j, int64_t k, int64_t i) { bad |= !mt_is_finite(tab[j][i]); });
    if (bad) *flag = 1;   /* every writer stores the same value: no atomic needed */
}

/* One warp per chunk: partials[c] = the chunk's sum of squares (clip.md). */
__global__ void mt_k_chunk_sumsq(float *const *tab, const int32_t *offs, const int64_t *cstart, int32_t n,
                                 int64_t chunks, float *partials) {
    const int t = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t c = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; c < chunks; c += warps) {
        int32_t lo = 0, hi = n - 1;
        while (lo < hi) {
            int32_t mid = lo + (hi - lo + 1) / 2;
            if (cstart[mid] <= c) lo = mid; else hi = mid - 1;
        }
        int64_t cc = c - cstart[lo], len = (int64_t)(offs[lo + 1] - offs[lo]) - cc * MT_CHUNK;
        float s = mt_warp_chunk_sumsq(tab[lo] + cc * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) partials[c] = s;
    }
}

/* Fold m partials at src with the pairwise tree; all warps of the block cooperate, levels
 * ping-pong through shared memory (buf: two halves of `half` floats). Valid in thread 0. */
__device__ float mt_block_fold(const float *src, int64_t m, float *buf, int64_t half) {
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    const float *cur = src;
    float *out = buf;
    while (m > 1) {
        int64_t groups = (m + 31) / 32;
        for (int64_t g = w; g < groups; g += nw) {
            int64_t at = g * 32 + t;
            int valid = (int)(m - g * 32 < 32 ? m - g * 32 : 32);
            float r = mt_warp_fold32(at < m ? cur[at] : 0.0f, t, valid);
            if (t == 0) out[g] = r;
        }
        __syncthreads();
        cur = out;
        out = (out == buf) ? buf + half : buf;
        m = groups;
    }
    float root = cur[0];
    __syncthreads();
    return root;
}

/* Block j: norms[j] = sqrt(fold of tensor j's chunk partials). */
__global__ void mt_k_tensor_norms(const float *partials, const int64_t *cstart, float *norms, int64_t half) {
    extern __shared__ float buf[];
    int64_t m = cstart[blockIdx.x + 1] - cstart[blockIdx.x];
    float root = mt_block_fold(partials + cstart[blockIdx.x], m, buf, half);
    if (threadIdx.x == 0) norms[blockIdx.x] = sqrtf(root);
}

/* One block: the total norm (the same tree over the norms), the clip coefficient, refusal. */
__global__ void mt_k_total(const float *norms, int32_t n, float *scratch, mt_status *st, int32_t clip,
                           float max_norm) {
    extern __shared__ float buf[];
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    int64_t chunks = mt_chunk_count(n);
    for (int64_t c = w; c < chunks; c += nw) {
        int64_t len = n - c * MT_CHUNK;
        float s = mt_warp_chunk_sumsq(norms + c * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) scratch[c] = s;
    }
    __syncthreads();
    float sq = mt_block_fold(scratch, chunks, buf, (chunks + 31) / 32);
    if (threadIdx.x == 0) {
        float total = sqrtf(sq);
        st->total = total;
        st->nonfinite_total = !mt_is_finite(total);
        float c = max_norm / (total + 1e-6f);
        st->coef = c < 1.0f ? c : 1.0f;
        st->scale = clip && c < 1.0f;
    }
}

__device__ __forceinline__ bool mt_refused(const mt_status *st) {
    return st->bad_params | st->bad_grads | st->nonfinite_total;
}

template <int COUPLED>
__global__ void mt_k_adam(float *const *ptab, float *const *gtab, const int32_t *offs, int32_t n, float *m,
                          float *v, mt_adam_scalars s, const mt_status *st) {
    if (mt_refused(st)) return;
    const float coef = st->scale ? st->coef : 1.0f;
    const bool scale = st->scale;
    mt_for_elements(offs, n, [&](int32_t j, int64_t k, int64_t i) {
        float g = gtab[j][i] * coef;
        if (scale) gtab[j][i] = g;
        mt_adam_elem(&ptab[j][i], &m[k], &v[k], g, &s, COUPLED);
    });
}

template <int COUPLED, int HAS_BUF>
__global__ void mt_k_sgd(float *const *ptab, float *const *gtab, const int32_t *offs, int32_t n, float *buf,
                         const int32_t *initialized, mt_sgd_scalars s, const mt_status *st) {
    if (mt_refused(st)) return;
    const float coef = st->scale ? st->coef : 1.0f;
    const bool scale = st->scale;
    mt_for_elements(offs, n, [&](int32_t j, int64_t k, int64_t i) {
        float g = gtab[j][i] * coef;
        if (scale) gtab[j][i] = g;
        float *b = HAS_BUF ? &buf[k] : &ptab[j][i];
        mt_sgd_elem(&ptab[j][i], b, g, &s, COUPLED, HAS_BUF, HAS_BUF ? initialized[j] : 0);
    });
}

__global__ void mt_k_scale(float *const *tab, const int32_t *offs, int32_t n, const mt_status *st) {
    if (mt_refused(st) || !st->scale) return;
    const float coef = st->coef;
    mt_for_elements(offs, n, [&](int32_t j, int64_t k, int64_t i) { tab[j][i] = tab[j][i] * coef; });
}

__global__ void mt_k_zero(float *const *tab, const int32_t *offs, int32_t n) {
    mt_for_elements(offs, n, [&](int32_t j, int64_t k, int64_t i) { tab[j][i] = 0.0f; });
}

__global__ void mt_k_uniform(float *out, int64_t n, uint64_t seed, uint64_t stream, uint64_t offset, float low,
                             float width) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[i] = mt_uniform_at(low, width, mt_philox_word(seed, stream, offset + (uint64_t)i));
}

#endif
