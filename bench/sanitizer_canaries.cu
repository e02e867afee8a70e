// sanitizer_canaries.cu -- one planted defect per compute-sanitizer tool, so that
// `make sanitize-cuda` proves each tool is live on this machine before it reports zero findings
// over the library. `sanitizer_canaries <tool>` runs the defect that tool must report, and a
// clean run of the same kernel shape with `sanitizer_canaries clean`.
//   memcheck   a global write one element past a cudaMalloc'd buffer
//   racecheck  every thread of a block writes one shared word, then reads it without a barrier
//   initcheck  a kernel reads device memory nothing ever wrote
//   synccheck  __syncwarp with a full mask reached by half of the warp only
#include <cstdio>
#include <cstring>
#include <cuda_runtime.h>

static const int N = 256;

__global__ void write_past_end(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;            // i == n is one past the end
}

__global__ void shared_race(float *out) {
    __shared__ float word;
    word = (float)threadIdx.x;            // every thread writes the same word ...
    out[threadIdx.x] = word;              // ... and reads it back with no __syncthreads between
}

__global__ void copy(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

__global__ void divergent_syncwarp(float *out) {
    if (threadIdx.x < 16) __syncwarp(0xffffffffu);   // lanes 16-31 never arrive
    out[threadIdx.x] = 0.0f;
}

int main(int argc, char **argv) {
    const char *tool = argc > 1 ? argv[1] : "clean";
    float *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, N * sizeof(float)) != cudaSuccess || cudaMalloc(&b, N * sizeof(float)) != cudaSuccess) {
        std::fprintf(stderr, "cudaMalloc failed\n");
        return 2;
    }
    cudaMemset(a, 0, N * sizeof(float));
    if (!std::strcmp(tool, "memcheck")) write_past_end<<<1, N + 32>>>(a, N);
    else if (!std::strcmp(tool, "racecheck")) shared_race<<<1, N>>>(a);
    else if (!std::strcmp(tool, "initcheck")) copy<<<1, N>>>(a, b, N);       // b was never written
    else if (!std::strcmp(tool, "synccheck")) divergent_syncwarp<<<1, 32>>>(a);
    else {                                                                     // clean: the same shapes, no defect
        cudaMemset(b, 0, N * sizeof(float));
        write_past_end<<<1, N>>>(a, N - 1);
        copy<<<1, N>>>(a, b, N);
    }
    cudaError_t err = cudaDeviceSynchronize();
    std::printf("canary %s ran: %s\n", tool, cudaGetErrorString(err));
    cudaFree(a);
    cudaFree(b);
    return 0;
}
