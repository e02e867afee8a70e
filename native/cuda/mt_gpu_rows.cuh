/* mt_gpu_rows.cuh -- what the row kernels of cross-entropy (mt_gpu_loss.cu) and RMSNorm
 * (mt_gpu_rms_norm.cu) share, and ReLU (mt_gpu_elementwise.cu) with them: the status they report
 * through mapped memory and its reading after the call (mt_rows_finish), launch sizing, row
 * staging into shared memory, the block max, and the chunk-fold steps they hand to
 * mt_warp_chunk_fold (mt_pinned.h). Arithmetic comes from mt_pinned.h only; these helpers
 * decide where data lives and which thread touches it, never an order of operations.
 *
 * Only inline device functions and inline host helpers live here (no kernels), so every
 * translation unit can include it.
 */
#ifndef MT_GPU_ROWS_CUH
#define MT_GPU_ROWS_CUH

#include <mutex>
#include <stdint.h>
#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

/* What a call's last kernel tells the host (mapped pinned memory, one per host thread; the
 * host clears it before the first launch and reads it after the synchronization). */
struct mt_rows_status {
    int64_t first_bad;       /* cross-entropy: smallest row whose target is refused (n_rows: none) */
    int64_t bad_value;       /* that row's target */
    int64_t first_nonfinite; /* cross-entropy: smallest row holding NaN or inf (n_rows: none) */
    float loss;              /* cross-entropy: the reduced loss */
    int32_t bad[3];          /* RMSNorm, ReLU: NaN or inf seen in input 0, 1, 2 (see each op) */
};

struct mt_rows_mapped_mem {
    mt_rows_status *p = nullptr;
    ~mt_rows_mapped_mem() {
        if (p) {
            gpuFreeHost(p);
            mt_mem_count(-(int64_t)sizeof(mt_rows_status));
        }
    }
};

/* The calling thread's status (counted by mt_mem_count), or NULL with the error set. */
inline mt_rows_status *mt_rows_mapped(void) {
    static thread_local mt_rows_mapped_mem m;
    if (!m.p) {
        if (gpuMallocHost((void **)&m.p, sizeof(mt_rows_status)) != gpuSuccess) {
            gpuGetLastError();
            m.p = nullptr;
            mt_fail(MT_ENOMEM, "cannot allocate %d bytes of pinned memory for the call's status",
                    (int)sizeof(mt_rows_status));
            return nullptr;
        }
        mt_mem_count((int64_t)sizeof(mt_rows_status));
    }
    return m.p;
}

/* The calling thread's status, cleared for a new call, or NULL with the error set. */
inline mt_rows_status *mt_rows_begin(void) {
    mt_rows_status *st = mt_rows_mapped();
    if (st) *st = mt_rows_status{0, 0, 0, 0.0f, {0, 0, 0}};
    return st;
}

/* Multiprocessors and the opt-in shared-memory limit of a block, read once. */
#ifndef MT_HIP_LDS_BYTES
#define MT_HIP_LDS_BYTES (64 * 1024)   /* the LDS of one workgroup on AMD */
#endif
struct mt_rows_device {
    int sms = 1;
    int smem_optin = 48 * 1024;
};

inline const mt_rows_device &mt_rows_limits(void) {
    static mt_rows_device d;
    static std::once_flag once;
    std::call_once(once, [] {
        int v = 0;
#if defined(MT_HIP) || defined(__HIPCC__)
        if (hipDeviceGetAttribute(&v, hipDeviceAttributeMultiprocessorCount, 0) == hipSuccess && v > 0) d.sms = v;
        d.smem_optin = MT_HIP_LDS_BYTES;
#else
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess && v > 0) d.sms = v;
        if (cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0) == cudaSuccess && v > 0)
            d.smem_optin = v;
#endif
        gpuGetLastError();
    });
    return d;
}

/* Lets `kernel` take up to the device's opt-in limit of dynamic shared memory, less its static
 * shared memory (once). */
template <class K>
inline int mt_rows_allow_smem(K kernel, std::once_flag &once) {
    gpuError_t err = gpuSuccess;
#if defined(MT_HIP) || defined(__HIPCC__)
    (void)kernel;
    (void)once;
#else
    std::call_once(once, [&] {
        /* the opt-in ceiling covers static and dynamic shared memory together: a kernel with
         * static arrays may ask only for the rest (the twenty-seventh session's first kernel
         * with both was refused the whole ceiling) */
        cudaFuncAttributes fa;
        err = cudaFuncGetAttributes(&fa, kernel);
        if (err == cudaSuccess)
            err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       mt_rows_limits().smem_optin - (int)fa.sharedSizeBytes);
    });
#endif
    MT_GPU_CHECK(err, "shared memory size");
    return MT_OK;
}

/* Blocks for a persistent row kernel: every row gets a block in turn, as many at once as fit
 * on the device (occupancy), capped by mt_set_launch_geometry's max_blocks. */
template <class K>
inline int mt_rows_grid(int *grid, K kernel, int threads, size_t smem, int64_t rows) {
    int per_sm = 0;
#if defined(MT_HIP) || defined(__HIPCC__)
    MT_GPU_CHECK(hipOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), "occupancy");
#else
    MT_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem), "occupancy");
#endif
    if (per_sm < 1) return mt_fail(MT_EDEVICE, "a row block of %d threads and %lld bytes of shared memory does not fit",
                                   threads, (long long)smem);
    int64_t resident = (int64_t)per_sm * mt_rows_limits().sms, g = mt_gpu_blocks(rows, 1);
    *grid = (int)(g < resident ? g : resident);
    return MT_OK;
}

inline int mt_rows_launched(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

/* Refuse on the first raised flag of st->bad, in `order`; names[i] names input i. */
inline int mt_rows_refuse(const mt_rows_status *st, const int *order, int n, const char *const *names) {
    for (int i = 0; i < n; ++i)
        if (st->bad[order[i]])
            return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", names[order[i]]);
    return MT_OK;
}

/* One synchronization, then the flags: a refusal, or the downloads of staged outputs (a host
 * output and its device twin; NULL host_out: none). */
inline int mt_rows_finish(const mt_rows_status *st, const int *order, int n, const char *const *names,
                          void *host_out, const void *dev_out, int64_t bytes, void *host_out2, const void *dev_out2,
                          int64_t bytes2) {
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "synchronize");
    int rc;
    if ((rc = mt_rows_refuse(st, order, n, names))) return rc;
    if ((host_out && (rc = mt_buf_to_host(host_out, dev_out, bytes))) ||
        (host_out2 && (rc = mt_buf_to_host(host_out2, dev_out2, bytes2))))
        return rc;
    if (host_out || host_out2) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

/* ---- device side ------------------------------------------------------------------------- */

/* Streaming accesses: a row read for the last time, outputs nobody reads back soon. */
#if defined(MT_HIP) || defined(__HIPCC__)
#define MT_LDCS(p) (*(p))
#define MT_STCS(p, v) (*(p) = (v))
#else
#define MT_LDCS(p) __ldcs(p)
#define MT_STCS(p, v) __stcs((p), (v))
#endif

__device__ __forceinline__ int64_t mt_rows_round4(int64_t n) { return (n + 3) & ~(int64_t)3; }

/* Every thread of the block walks its share of elements [0, n): f4(i) for whole aligned
 * groups of four (i a multiple of 4) when VEC, f1(i) for the rest. */
template <bool VEC, class F4, class F1>
__device__ __forceinline__ void mt_rows_walk(int64_t n, F4 f4, F1 f1) {
    int64_t i = threadIdx.x, step = blockDim.x;
    if (VEC) {
        int64_t n4 = n / 4;
#pragma unroll 4
        for (int64_t q = i; q < n4; q += step) f4(4 * q);
        i += 4 * n4;
    }
    for (; i < n; i += step) f1(i);
}

/* Copy a row of n floats into shared memory (dst 16-byte aligned; src too when VEC), showing
 * every value to see4(float4) / see1(float) on the way. Loads go out MT_STAGE_BATCH per
 * thread before their stores, so that many are in flight. */
#define MT_STAGE_BATCH 8
struct mt_rows_see_nothing {
    __device__ __forceinline__ void operator()(const float4 &) const {}
    __device__ __forceinline__ void operator()(float) const {}
};

/* The copy loop of mt_rows_stage over n elements of T (float4 or float), from index i in
 * strides of step, B loads per thread in flight before their stores; returns where it stopped
 * (B = 1 finishes the rest). */
template <int B, class T, class See>
__device__ __forceinline__ int64_t mt_rows_copy(T *dst, const T *src, int64_t n, int64_t i, int64_t step,
                                                See see) {
    for (; i + (B - 1) * step < n; i += B * step) {
        T v[B];
#pragma unroll
        for (int u = 0; u < B; ++u) v[u] = MT_LDCS(src + i + u * step);
#pragma unroll
        for (int u = 0; u < B; ++u) {
            dst[i + u * step] = v[u];
            see(v[u]);
        }
    }
    return i;
}

template <bool VEC, class See = mt_rows_see_nothing>
__device__ __forceinline__ void mt_rows_stage(float *dst, const float *src, int64_t n, See see = See()) {
    const int64_t step = blockDim.x;
    int64_t i = threadIdx.x;
    if (VEC) {
        const int64_t n4 = n / 4;
        const float4 *s4 = (const float4 *)src;
        float4 *d4 = (float4 *)dst;
        i = mt_rows_copy<MT_STAGE_BATCH>(d4, s4, n4, i, step, see);
        mt_rows_copy<1>(d4, s4, n4, i, step, see);
        i = 4 * n4 + threadIdx.x;
    } else {
        i = mt_rows_copy<4 * MT_STAGE_BATCH>(dst, src, n, i, step, see);
    }
    mt_rows_copy<1>(dst, src, n, i, step, see);
}

/* Issue the copy of a row of n floats (n % 4 == 0; dst and src 16-byte aligned) into shared
 * memory, every piece in flight at once (cp.async; a plain copy where there is none); the
 * caller then commits, waits and holds a barrier. One round trip of the memory for every row
 * issued before the wait, where mt_rows_stage takes one per batch of MT_STAGE_BATCH loads a
 * thread; no registers or shared stores on the way, and the data lands in L2 with normal
 * priority (mt_rows_stage's loads are evict-first). */
__device__ __forceinline__ void mt_rows_stage_async(float *dst, const float *src, int64_t n) {
    for (int64_t q = threadIdx.x; q < n / 4; q += blockDim.x) mt_cp_async16(dst + 4 * q, src + 4 * q, 16);
}

/* Ask L2 for the n floats at p (one request per 128-byte line, spread over the block), so
 * that a block's next row arrives while it computes on this one. A hint: CUDA only. */
__device__ __forceinline__ void mt_rows_prefetch_l2(const float *p, int64_t n) {
#if !defined(MT_HIP) && !defined(__HIPCC__)
    uintptr_t a = ((uintptr_t)p & ~(uintptr_t)127) + (uintptr_t)threadIdx.x * 128, end = (uintptr_t)(p + n);
    for (; a < end; a += (uintptr_t)blockDim.x * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
#else
    (void)p;
    (void)n;
#endif
}

/* Every chunk of a row (n elements at the fold's base) folded by the block's warps in turn,
 * partials into part[chunk], then mt_block_tree_fold (part2: scratch). K quantities at once;
 * `make(c)` builds the step functor of chunk c. Every thread gets the K roots. */
template <int K, class Make>
__device__ __forceinline__ void mt_rows_fold(float (&root)[K], int64_t n, Make make, float *part, float *part2,
                                             bool reversed) {
    const int t = threadIdx.x & 31, nw = blockDim.x / 32;
    const int64_t chunks = mt_chunk_count(n);
    for (int64_t c = threadIdx.x / 32; c < chunks; c += nw) {
        int64_t len = n - c * MT_CHUNK < MT_CHUNK ? n - c * MT_CHUNK : MT_CHUNK;
        float out[K];
        mt_warp_chunk_fold<K>(out, make(c), len, t, reversed);
        if (t == 0)
#pragma unroll
            for (int k = 0; k < K; ++k) part[k * chunks + c] = out[k];
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < K; ++k) root[k] = mt_block_tree_fold(part + k * chunks, chunks, part2, part + k * chunks);
}

/* Shared floats mt_rows_fold needs for K quantities over a row of n. */
__host__ __device__ __forceinline__ int64_t mt_rows_fold_floats(int K, int64_t n) {
    int64_t chunks = (n + MT_CHUNK - 1) / MT_CHUNK;
    return K * chunks + (chunks + 31) / 32 + 1;
}

#endif /* MT_GPU_ROWS_CUH */
