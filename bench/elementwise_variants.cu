// bench/elementwise_variants.cu -- which walk of memory lets a float4 map (the residual add) reach
// the H200's bandwidth: the library's grid-stride walk against others, same arithmetic (a + b,
// every element once), timed by CUDA events in one process.
//
//     nvcc -O3 -gencode arch=compute_90,code=sm_90 -o native/build/elementwise_variants bench/elementwise_variants.cu
//     native/build/elementwise_variants [log2n=28] [reps=30]
//
// Variants (each checks every output against a + b on the device and prints the median ms):
//   stride4   mt_k_elt's walk: a thread loads 4 float4 groups a grid stride apart, then stores;
//             16 blocks of 256 threads an SM (mt_gpu_blocks' cap), grid-stride loop
//   window4   the same 4 groups per thread, but adjacent: a block's trip covers 4 x 256 groups
//             in one piece, so the resident blocks read and write one contiguous window
//   flat1     one float4 group per thread, a block per 256 groups, no loop (torch's shape)
//   flat4     4 adjacent groups per thread (a block per 1,024 groups), no loop
//   copy      stride4's walk reading one input (the copy yardstick, 8 bytes an element)
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1); } } while (0)

__device__ __forceinline__ float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

__global__ void __launch_bounds__(256) stride4(float4 *out, const float4 *a, const float4 *b, long groups) {
    const long stride = (long)gridDim.x * blockDim.x;
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; g + 3 * stride < groups; g += 4 * stride) {
        float4 qa[4], qb[4];
#pragma unroll
        for (int u = 0; u < 4; u++) { qa[u] = a[g + u * stride]; qb[u] = b[g + u * stride]; }
        asm volatile("" ::: "memory");
#pragma unroll
        for (int u = 0; u < 4; u++) out[g + u * stride] = add4(qa[u], qb[u]);
    }
    for (; g < groups; g += stride) out[g] = add4(a[g], b[g]);
}

__global__ void __launch_bounds__(256) window4(float4 *out, const float4 *a, const float4 *b, long groups) {
    const long tile = 4L * blockDim.x;
    for (long base = (long)blockIdx.x * tile; base < groups; base += (long)gridDim.x * tile) {
        const long g = base + threadIdx.x;
        if (base + tile <= groups) {
            float4 qa[4], qb[4];
#pragma unroll
            for (int u = 0; u < 4; u++) { qa[u] = a[g + u * blockDim.x]; qb[u] = b[g + u * blockDim.x]; }
            asm volatile("" ::: "memory");
#pragma unroll
            for (int u = 0; u < 4; u++) out[g + u * blockDim.x] = add4(qa[u], qb[u]);
        } else {
            for (int u = 0; u < 4; u++)
                if (g + u * blockDim.x < groups) out[g + u * blockDim.x] = add4(a[g + u * blockDim.x], b[g + u * blockDim.x]);
        }
    }
}

__global__ void __launch_bounds__(256) flat1(float4 *out, const float4 *a, const float4 *b, long groups) {
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (g < groups) out[g] = add4(a[g], b[g]);
}

__global__ void __launch_bounds__(256) flat4(float4 *out, const float4 *a, const float4 *b, long groups) {
    const long g = (long)blockIdx.x * 4 * blockDim.x + threadIdx.x;
    float4 qa[4], qb[4];
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (g + u * blockDim.x < groups) { qa[u] = a[g + u * blockDim.x]; qb[u] = b[g + u * blockDim.x]; }
    asm volatile("" ::: "memory");
#pragma unroll
    for (int u = 0; u < 4; u++)
        if (g + u * blockDim.x < groups) out[g + u * blockDim.x] = add4(qa[u], qb[u]);
}

__global__ void __launch_bounds__(256) copy4(float4 *out, const float4 *a, const float4 *, long groups) {
    const long stride = (long)gridDim.x * blockDim.x;
    long g = (long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; g + 3 * stride < groups; g += 4 * stride) {
        float4 q[4];
#pragma unroll
        for (int u = 0; u < 4; u++) q[u] = a[g + u * stride];
        asm volatile("" ::: "memory");
#pragma unroll
        for (int u = 0; u < 4; u++) out[g + u * stride] = q[u];
    }
    for (; g < groups; g += stride) out[g] = a[g];
}

__global__ void fill(float *x, long n, float k) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        x[i] = (float)((i * 2654435761u) % 1000003u) * k;
}

__global__ void check(const float *out, const float *a, const float *b, long n, int copy, int *bad) {
    for (long i = (long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long)gridDim.x * blockDim.x)
        if (out[i] != (copy ? a[i] : a[i] + b[i])) *bad = 1;
}

typedef void (*kernel_t)(float4 *, const float4 *, const float4 *, long);

int main(int argc, char **argv) {
    const int log2n = argc > 1 ? atoi(argv[1]) : 28, reps = argc > 2 ? atoi(argv[2]) : 30;
    const long n = 1L << log2n, groups = n / 4;
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    float *a, *b, *out;
    int *bad;
    CK(cudaMalloc(&a, n * 4)); CK(cudaMalloc(&b, n * 4)); CK(cudaMalloc(&out, n * 4)); CK(cudaMalloc(&bad, 4));
    fill<<<sms * 8, 256>>>(a, n, 1e-3f);
    fill<<<sms * 8, 256>>>(b, n, -7e-4f);
    struct V { const char *name; kernel_t k; long blocks; int copy; double bytes; };
    const long capped = (long)sms * 16;
    std::vector<V> vs = {
        {"stride4", stride4, std::min(capped, (groups + 255) / 256), 0, 12.0 * n},
        {"window4", window4, std::min(capped, (groups + 1023) / 1024), 0, 12.0 * n},
        {"flat1", flat1, (groups + 255) / 256, 0, 12.0 * n},
        {"flat4", flat4, (groups + 1023) / 1024, 0, 12.0 * n},
        {"copy", copy4, std::min(capped, (groups + 255) / 256), 1, 8.0 * n},
    };
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    for (int round = 0; round < 2; round++)
        for (auto &v : vs) {
            std::vector<float> ms;
            for (int r = 0; r < reps + 3; r++) {
                CK(cudaEventRecord(e0));
                v.k<<<(unsigned)v.blocks, 256>>>((float4 *)out, (const float4 *)a, (const float4 *)b, groups);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                float t;
                CK(cudaEventElapsedTime(&t, e0, e1));
                if (r >= 3) ms.push_back(t);
            }
            std::sort(ms.begin(), ms.end());
            CK(cudaMemset(bad, 0, 4));
            check<<<sms * 8, 256>>>(out, a, b, n, v.copy, bad);
            int h = 0;
            CK(cudaMemcpy(&h, bad, 4, cudaMemcpyDeviceToHost));
            double med = ms[ms.size() / 2];
            printf("round %d %-8s blocks %8ld  median %.4f ms  min %.4f ms  %.2f TB/s  %s\n", round, v.name, v.blocks, med,
                   ms[0], v.bytes / (med * 1e-3) / 1e12, h ? "WRONG" : "ok");
        }
    return 0;
}
