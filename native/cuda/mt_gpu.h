/* mt_gpu.h -- the project's GPU portability header: CUDA spellings or HIP spellings of the
 * few runtime calls and intrinsics the kernels and host glue use. The kernel sources in
 * native/cuda/ include only this, so native/hip/ compiles the very same files with hipcc.
 */
#ifndef MT_GPU_H
#define MT_GPU_H

#if defined(__HIPCC__) || defined(MT_HIP)
#include <hip/hip_runtime.h>
#define MT_GPU_VENDOR "hip"
typedef hipError_t gpuError_t;
typedef hipStream_t gpuStream_t;
typedef hipEvent_t gpuEvent_t;
#define gpuStreamCreateWithFlags hipStreamCreateWithFlags
#define gpuStreamNonBlocking hipStreamNonBlocking
#define gpuStreamDestroy hipStreamDestroy
#define gpuStreamWaitEvent hipStreamWaitEvent
#define gpuEventCreateWithFlags hipEventCreateWithFlags
#define gpuEventDisableTiming hipEventDisableTiming
#define gpuEventRecord hipEventRecord
#define gpuEventDestroy hipEventDestroy
#define gpuSuccess hipSuccess
#define gpuErrorMemoryAllocation hipErrorOutOfMemory
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMallocAsync hipMallocAsync
#define gpuFreeAsync hipFreeAsync
#define gpuMallocHost hipHostMalloc
#define gpuFreeHost hipHostFree
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuFuncSetAttribute hipFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#define gpuMemcpy hipMemcpy
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuMemsetAsync hipMemsetAsync
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuStreamPerThread hipStreamPerThread
#define gpuPointerAttributes hipPointerAttribute_t
#define gpuPointerGetAttributes hipPointerGetAttributes
#define gpuMemoryTypeDevice hipMemoryTypeDevice
#if HIP_VERSION_MAJOR >= 6
#define gpuMemoryTypeManaged hipMemoryTypeManaged
#define MT_PTR_TYPE(attr) ((attr).type)
#else
/* HIP 5 (Debian's 5.2): the field is memoryType and managed memory is only the isManaged flag
 * (no hipMemoryTypeManaged), so a managed pointer reads as the otherwise unused Unified type. */
#define gpuMemoryTypeManaged hipMemoryTypeUnified
#define MT_PTR_TYPE(attr) ((attr).isManaged ? hipMemoryTypeUnified : (attr).memoryType)
#endif
/* A wave may hold 64 lanes on AMD: every shuffle names its 32-wide segment explicitly. */
#define MT_SHFL_DOWN(v, d) __shfl_down((v), (d), 32)
#define MT_SHFL_IDX(v, l) __shfl((v), (l), 32)
#else
#include <cuda_runtime.h>
#define MT_GPU_VENDOR "cuda"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
typedef cudaEvent_t gpuEvent_t;
#define gpuStreamCreateWithFlags cudaStreamCreateWithFlags
#define gpuStreamNonBlocking cudaStreamNonBlocking
#define gpuStreamDestroy cudaStreamDestroy
#define gpuStreamWaitEvent cudaStreamWaitEvent
#define gpuEventCreateWithFlags cudaEventCreateWithFlags
#define gpuEventDisableTiming cudaEventDisableTiming
#define gpuEventRecord cudaEventRecord
#define gpuEventDestroy cudaEventDestroy
#define gpuSuccess cudaSuccess
#define gpuErrorMemoryAllocation cudaErrorMemoryAllocation
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMallocAsync cudaMallocAsync
#define gpuFreeAsync cudaFreeAsync
#define gpuMallocHost cudaMallocHost
#define gpuFreeHost cudaFreeHost
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuMemsetAsync cudaMemsetAsync
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuStreamPerThread cudaStreamPerThread
#define gpuPointerAttributes cudaPointerAttributes
#define gpuPointerGetAttributes cudaPointerGetAttributes
#define gpuMemoryTypeDevice cudaMemoryTypeDevice
#define gpuMemoryTypeManaged cudaMemoryTypeManaged
#define MT_PTR_TYPE(attr) ((attr).type)
#define MT_SHFL_DOWN(v, d) __shfl_down_sync(0xffffffffu, (v), (d), 32)
#define MT_SHFL_IDX(v, l) __shfl_sync(0xffffffffu, (v), (l), 32)
#endif

/* `#pragma unroll` inside a macro argument (the bodies of MT_FOR_TILES) is refused by clang
 * (HIP); the _Pragma operator spells the same pragma for nvcc and clang alike. */
#define MT_PRAGMA_UNROLL _Pragma("unroll")

/* Asynchronous global -> shared copies (the tile loads of mt_gpu_gemm.cuh). On CUDA (sm_80+)
 * they are cp.async: `src_bytes` of the source are copied and the rest of the 4 or 16 bytes
 * is zero-filled (src_bytes == 0 reads nothing); a group of copies is committed, and
 * waiting for all but the newest N groups precedes the barrier that publishes them. On HIP
 * (and older CUDA targets) the same calls are plain loads and stores, and commit and wait do
 * nothing: the barrier after them is all the ordering a synchronous copy needs. */
#ifndef MT_CP_ASYNC
#if defined(__HIPCC__) || defined(MT_HIP) || (defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800)
#define MT_CP_ASYNC 0
#else
#define MT_CP_ASYNC 1
#endif
#endif

__device__ __forceinline__ void mt_cp_async4(float *smem, const float *gmem, int src_bytes /* 0 or 4 */) {
#if MT_CP_ASYNC
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#else
    *smem = src_bytes ? *gmem : 0.0f;
#endif
}

/* smem and gmem 16-byte aligned; src_bytes a multiple of 4 in 0..16. */
__device__ __forceinline__ void mt_cp_async16(float *smem, const float *gmem, int src_bytes) {
#if MT_CP_ASYNC
    unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_bytes) : "memory");
#else
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (src_bytes == 16) {
        v = *(const float4 *)gmem;
    } else {
        if (src_bytes > 0) v.x = gmem[0];
        if (src_bytes > 4) v.y = gmem[1];
        if (src_bytes > 8) v.z = gmem[2];
    }
    *(float4 *)smem = v;
#endif
}

/* x's value hidden from the compiler: it stays in a register instead of being recomputed where
 * used (nvcc rematerializes threadIdx-derived offsets under register pressure, each time an
 * S2R with its long latency). Nothing on HIP. */
__device__ __forceinline__ void mt_opaque(int &x) {
#if defined(__HIPCC__) || defined(MT_HIP)
    (void)x;
#else
    asm volatile("" : "+r"(x));
#endif
}

__device__ __forceinline__ void mt_cp_async_commit() {
#if MT_CP_ASYNC
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void mt_cp_async_wait() {
#if MT_CP_ASYNC
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* Words that order one block's writes before another block's reads of them, at device scope:
 * a block's writes, then a barrier (cumulative), then one thread's release (a store or an add)
 * on the word; the reader's thread 0 loads it with acquire until it says enough, then a barrier,
 * then the block reads the data through L2 (__ldcg: never a stale L1 line). Used by the
 * attention's dq relay and RMSNorm's one-pass windows. */
#if defined(__HIPCC__) || defined(MT_HIP)
__device__ __forceinline__ int32_t mt_load_acquire_gpu(const int32_t *word) {
    return __hip_atomic_load(word, __ATOMIC_ACQUIRE, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void mt_store_release_gpu(int32_t *word, int32_t value) {
    __hip_atomic_store(word, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void mt_add_release_gpu(int32_t *word, int32_t value) {
    __hip_atomic_fetch_add(word, value, __ATOMIC_RELEASE, __HIP_MEMORY_SCOPE_AGENT);
}
__device__ __forceinline__ void mt_spin_pause() { __builtin_amdgcn_s_sleep(1); }
#else
__device__ __forceinline__ int32_t mt_load_acquire_gpu(const int32_t *word) {
    int32_t seen;
    asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(word) : "memory");
    return seen;
}
__device__ __forceinline__ void mt_store_release_gpu(int32_t *word, int32_t value) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
}
__device__ __forceinline__ void mt_add_release_gpu(int32_t *word, int32_t value) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(word), "r"(value) : "memory");
}
__device__ __forceinline__ void mt_spin_pause() { __nanosleep(20); }
#endif

#endif /* MT_GPU_H */
