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
#define gpuSuccess hipSuccess
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
#else
#include <cuda_runtime.h>
#define MT_GPU_VENDOR "cuda"
typedef cudaError_t gpuError_t;
typedef cudaStream_t gpuStream_t;
#define gpuSuccess cudaSuccess
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
#endif

/* `#pragma unroll` inside a macro argument (the bodies of MT_FOR_TILES) is refused by clang
 * (HIP); the _Pragma operator spells the same pragma for nvcc and clang alike. */
#define MT_PRAGMA_UNROLL _Pragma("unroll")

#endif /* MT_GPU_H */
