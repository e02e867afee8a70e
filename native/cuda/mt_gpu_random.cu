/* mt_gpu_random.cu -- uniform and normal fills and dropout on a GPU (contract:
 * native/contracts/random.md).
 *
 * Element i of an output is stream element offset + i, whatever the grid. A uniform fill is
 * one element per thread. Normals and dropout: one thread computes one Philox counter block
 * (four stream elements) at a time and writes the elements of it that the call covers; with
 * offset a multiple of 4 and 16-byte aligned buffers a whole block is one float4 load and
 * store, otherwise element by element. Dropout runs through mt_gpu_map
 * (mt_gpu_elementwise.cu): the finiteness pre-pass reads x, then one pass reads x and writes
 * y unless the pre-pass refused -- or, for a staged host y or one declared fresh that is not
 * x, the one pass checks x itself; y partly overlapping x is refused first.
 */
#include "mt_gpu_map.h"

uint64_t mt_random_features(void) { return MT_FEATURE_RANDOM; }

namespace {

#define MT_RNG_UNROLL 4   /* counter blocks a thread loads before it computes any */

/* Stream elements [offset, offset + n) as counter blocks: relative block t holds output
 * elements 4t - head .. 4t - head + 3 (those in [0, n)). */
struct span {
    uint64_t seed, stream, first_block;
    int64_t n, blocks;
    int head;
};

span span_of(uint64_t seed, uint64_t stream, uint64_t offset, int64_t n) {
    span s;
    s.seed = seed;
    s.stream = stream;
    s.first_block = offset >> 2;
    s.head = (int)(offset & 3);
    s.n = n;
    s.blocks = (int64_t)(((offset + (uint64_t)n - 1) >> 2) - s.first_block + 1);
    return s;
}

/* Whole block t in range and aligned: one float4 (VEC requires head == 0). */
template <int VEC>
__device__ __forceinline__ bool whole(const span &s, int64_t t) { return VEC && 4 * t + 3 < s.n; }

template <int VEC>
__device__ __forceinline__ float4 load4(const float *x, const span &s, int64_t t) {
    if (whole<VEC>(s, t)) return *(const float4 *)(x + 4 * t);
    float v[4];
    for (int k = 0; k < 4; ++k) {
        int64_t j = 4 * t + k - s.head;
        v[k] = (t < s.blocks && j >= 0 && j < s.n) ? x[j] : 0.0f;
    }
    return make_float4(v[0], v[1], v[2], v[3]);
}

template <int VEC>
__device__ __forceinline__ void store4(float *y, const span &s, int64_t t, float4 q) {
    if (whole<VEC>(s, t)) {
        *(float4 *)(y + 4 * t) = q;
        return;
    }
    float v[4] = {q.x, q.y, q.z, q.w};
    for (int k = 0; k < 4; ++k) {
        int64_t j = 4 * t + k - s.head;
        if (j >= 0 && j < s.n) y[j] = v[k];
    }
}

/* Uniform: one counter block a thread (the four stream elements of one Philox block), as the
 * normal fill; grid-stride. */
template <int VEC>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_uniform(float *out, span s, float low, float width) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < s.blocks; t += stride) {
        uint32_t w[4];
        mt_philox_words(w, s.seed, s.stream, s.first_block + (uint64_t)t);
        store4<VEC>(out, s, t, make_float4(mt_uniform_at(low, width, w[0]), mt_uniform_at(low, width, w[1]),
                                           mt_uniform_at(low, width, w[2]), mt_uniform_at(low, width, w[3])));
    }
}

/* mean + std * z; UNIT_STD (std == 1): z + mean, the same bits in every mode (1 * z is z,
 * and fmaf(1, z, mean) rounds z + mean once): one multiply fewer an element of randn's fill. */
template <bool UNIT_STD>
__device__ __forceinline__ float normal_value(float mean, float std, float z) {
    return UNIT_STD ? z + mean : mt_normal_value(mean, std, z);
}

template <int VEC, bool UNIT_STD>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_normal(float *out, span s, float mean, float std) {
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < s.blocks; t += stride) {
        float z[4];
        mt_normal_block(z, s.seed, s.stream, s.first_block + (uint64_t)t);
        store4<VEC>(out, s, t,
                    make_float4(normal_value<UNIT_STD>(mean, std, z[0]), normal_value<UNIT_STD>(mean, std, z[1]),
                                normal_value<UNIT_STD>(mean, std, z[2]), normal_value<UNIT_STD>(mean, std, z[3])));
    }
}

/* Dropout: MT_RNG_UNROLL blocks' loads are issued before any Philox is computed. FUSED: no
 * pre-pass ran; the kernel checks what it loads (mt_gpu_map.h, mt_map_report). */
template <int VEC, bool FUSED>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_dropout(float *y, const float *x, span s, float p, float scale,
                                                           mt_gpu_flag flag) {
    if (!FUSED && mt_map_refused(flag)) return;
    bool bad = false;
    const int64_t tile = (int64_t)blockDim.x * MT_RNG_UNROLL;
    for (int64_t base = (int64_t)blockIdx.x * tile; base < s.blocks; base += (int64_t)gridDim.x * tile) {
        float4 q[MT_RNG_UNROLL];
        MT_PRAGMA_UNROLL
        for (int u = 0; u < MT_RNG_UNROLL; ++u) q[u] = load4<VEC>(x, s, base + (int64_t)u * blockDim.x + threadIdx.x);
        MT_PRAGMA_UNROLL
        for (int u = 0; u < MT_RNG_UNROLL; ++u) {
            int64_t t = base + (int64_t)u * blockDim.x + threadIdx.x;
            if (t < s.blocks) {
                if (FUSED) bad |= !(mt_is_finite(q[u].x) & mt_is_finite(q[u].y) & mt_is_finite(q[u].z) &
                                    mt_is_finite(q[u].w));
                uint32_t w[4];
                mt_philox_words(w, s.seed, s.stream, s.first_block + (uint64_t)t);
                store4<VEC>(y, s, t, make_float4(mt_dropout_elem(q[u].x, w[0], p, scale),
                                                 mt_dropout_elem(q[u].y, w[1], p, scale),
                                                 mt_dropout_elem(q[u].z, w[2], p, scale),
                                                 mt_dropout_elem(q[u].w, w[3], p, scale)));
            }
        }
    }
    if (FUSED) mt_map_report(flag, bad, false);
}

/* A fill of n floats at out: nothing for n == 0; out staged when it is host memory (written
 * only), launch(dev) on the stream, then the staged output copied back. */
template <class Launch>
int run_fill(float *out, int64_t n, const char *what, Launch launch) {
    if (n == 0) return MT_OK;
    int rc;
    if ((rc = mt_gpu_ready())) return rc;
    mt_arena arena;
    float *dev = nullptr;
    bool staged = false;
    if ((rc = mt_buf_to_device((void **)&dev, &staged, &arena, out, n * 4, false))) return rc;
    launch(dev);
    MT_GPU_CHECK(gpuGetLastError(), what);
    if (staged && (rc = mt_buf_to_host(out, dev, n * 4))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), what);
    return MT_OK;
}

MT_NOINLINE void host_normal_scalars(float *mean32, float *std32, double mean, double std) {
    *mean32 = mt_host_round(mean);
    *std32 = mt_host_round(std);
}

MT_NOINLINE float host_dropout_scale(float p) { return mt_dropout_scale(p); }

struct dropout_ctx {
    uint64_t seed, stream, offset;
    float p, scale;
};

int launch_dropout(void *vctx, float *y, const float *x, const float *, int64_t n, mt_gpu_flag flag) {
    const dropout_ctx *c = (const dropout_ctx *)vctx;
    span s = span_of(c->seed, c->stream, c->offset, n);
    int threads = mt_gpu_threads();
    int blocks = mt_gpu_blocks((s.blocks + MT_RNG_UNROLL - 1) / MT_RNG_UNROLL, threads);
    mt_gpu_record_launch(threads, blocks);
    bool vec = s.head == 0 && mt_gpu_aligned16(y) && mt_gpu_aligned16(x);
    if (flag.fused) {
        if (vec) mt_k_dropout<1, true><<<blocks, threads, 0, MT_STREAM>>>(y, x, s, c->p, c->scale, flag);
        else mt_k_dropout<0, true><<<blocks, threads, 0, MT_STREAM>>>(y, x, s, c->p, c->scale, flag);
    } else {
        if (vec) mt_k_dropout<1, false><<<blocks, threads, 0, MT_STREAM>>>(y, x, s, c->p, c->scale, flag);
        else mt_k_dropout<0, false><<<blocks, threads, 0, MT_STREAM>>>(y, x, s, c->p, c->scale, flag);
    }
    return MT_OK;
}

int dropout_common(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n,
                   uint32_t flags, const char *const names[4]) {
    int rc;
    const char *why = mt_dropout_problem(p);
    if ((rc = mt_check_ptr(y, names[0])) || (rc = mt_check_ptr(x, names[1])) || (rc = mt_check_span(offset, n)))
        return rc;
    if (why) return mt_fail(MT_EINVAL, "%s, got %g", why, (double)p);
    if ((rc = mt_check_alias(y, x, n, 1, names[0], names[1]))) return rc;
    dropout_ctx c = {seed, stream, offset, p, 0.0f};
    mt_fp_env env;
    mt_fp_begin(&env);
    c.scale = host_dropout_scale(p);
    mt_fp_end(&env);
    return mt_gpu_map(y, x, nullptr, n, flags, names, launch_dropout, &c);
}

}  // namespace

extern "C" {

int mt_uniform_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double low, double high,
                    int64_t n) {
    float width, lo;
    int rc = mt_check_uniform_args(&width, &lo, out, offset, low, high, n);
    if (rc) return rc;
    return run_fill(out, n, "uniform fill", [&](float *dev) {
        span s = span_of(seed, stream, offset, n);
        int threads = mt_gpu_threads(), blocks = mt_gpu_blocks(s.blocks, threads);
        mt_gpu_record_launch(threads, blocks);
        if (s.head == 0 && mt_gpu_aligned16(dev)) mt_k_uniform<1><<<blocks, threads, 0, MT_STREAM>>>(dev, s, lo, width);
        else mt_k_uniform<0><<<blocks, threads, 0, MT_STREAM>>>(dev, s, lo, width);
    });
}

int mt_normal_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std, int64_t n) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_span(offset, n))) return rc;
    float mean32, std32;
    mt_fp_env env;
    mt_fp_begin(&env);
    host_normal_scalars(&mean32, &std32, mean, std);
    mt_fp_end(&env);
    if (!mt_is_finite(mean32)) return mt_fail(MT_EINVAL, "mean must be finite in float32, got %g", mean);
    if (!mt_is_finite(std32) || std32 < 0.0f)
        return mt_fail(MT_EINVAL, "std must be finite in float32 and >= 0, got %g", std);
    return run_fill(out, n, "normal fill", [&](float *dev) {
        span s = span_of(seed, stream, offset, n);
        int threads = mt_gpu_threads(), blocks = mt_gpu_blocks(s.blocks, threads);
        mt_gpu_record_launch(threads, blocks);
        bool vec = s.head == 0 && mt_gpu_aligned16(dev), unit = std32 == 1.0f;
        if (vec && unit) mt_k_normal<1, true><<<blocks, threads, 0, MT_STREAM>>>(dev, s, mean32, std32);
        else if (vec) mt_k_normal<1, false><<<blocks, threads, 0, MT_STREAM>>>(dev, s, mean32, std32);
        else if (unit) mt_k_normal<0, true><<<blocks, threads, 0, MT_STREAM>>>(dev, s, mean32, std32);
        else mt_k_normal<0, false><<<blocks, threads, 0, MT_STREAM>>>(dev, s, mean32, std32);
    });
}

int mt_dropout_forward(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n,
                       uint32_t flags) {
    static const char *const names[4] = {"y", "x", "x", "mt_dropout_forward"};
    return dropout_common(y, x, p, seed, stream, offset, n, flags, names);
}

int mt_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                        int64_t n, uint32_t flags) {
    static const char *const names[4] = {"dx", "dy", "dy", "mt_dropout_backward"};
    return dropout_common(dx, dy, p, seed, stream, offset, n, flags, names);
}

}  /* extern "C" */
