// sanitizer_canaries.cu -- one planted defect per compute-sanitizer tool, so that
// `make sanitize-cuda` proves each tool is live on this machine before it reports zero findings
// over the library. `sanitizer_canaries <tool>` runs the defect that tool must report, and a
// clean run of the same kernel shape with `sanitizer_canaries clean`.
//   memcheck   a global write one element past a cudaMalloc'd buffer of 250 floats (inside the
//              allocator's rounding, so only the checker's bounds can see it)
//   racecheck  each thread writes a shared word, then reads another warp's without a barrier
//   initcheck  a kernel reads device memory nothing ever wrote
//   synccheck  __syncthreads reached by the first warp of a two-warp block only; __syncwarp
//              with a mask that leaves out the calling lane; __syncwarp(full) in half a warp
// `sanitizer_canaries <tool> <k>` (memcheck, racecheck, initcheck; the tests of launch windows):
// k clean launches, that tool's one defective launch (launch k, counting from 0), then two more
// clean launches. synccheck has no such form: its defect may hang when run unchecked.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>

static const int N = 250;   // 1000 bytes: not a multiple of any allocation granule

__global__ void write_past_end(float *out, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) out[i] = 1.0f;            // i == n is one past the end
}

__global__ void shared_race(float *out) {
    __shared__ float words[128];
    words[threadIdx.x] = (float)threadIdx.x;           // each thread writes its word ...
    out[threadIdx.x] = words[(threadIdx.x + 32) % 128]; // ... and reads another warp's, no barrier
}

__global__ void copy(float *out, const float *in, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}

__global__ void divergent_barrier(float *out) {
    if (threadIdx.x < 32) __syncthreads();           // the second warp never arrives
    out[threadIdx.x] = 0.0f;
}

__global__ void bad_syncwarp_masks(float *out) {
    if (threadIdx.x == 0) __syncwarp(0x2u);          // lane 0 names lane 1 only, not itself
    if (threadIdx.x < 16) __syncwarp(0xffffffffu);   // lanes 16-31 never arrive
    out[threadIdx.x] = 0.0f;
}

int main(int argc, char **argv) {
    const char *tool = argc > 1 ? argv[1] : "clean";
    float *a = nullptr, *b = nullptr;
    cudaError_t got = cudaMalloc(&a, N * sizeof(float));
    if (got == cudaSuccess) got = cudaMalloc(&b, N * sizeof(float));
    if (got != cudaSuccess) {   /* the runtime's words: sanitize_cuda.py reads "busy or unavailable" */
        std::fprintf(stderr, "cudaMalloc failed: %s\n", cudaGetErrorString(got));
        return 2;
    }
    cudaMemset(a, 0, N * sizeof(float));
    int at = argc > 2 ? std::atoi(argv[2]) : 0;
    if (argc > 2 && (at < 0 || !std::strcmp(tool, "synccheck") || !std::strcmp(tool, "clean"))) {
        std::fprintf(stderr, "usage: sanitizer_canaries memcheck|racecheck|initcheck <clean launches before>\n");
        return 2;
    }
    for (int i = 0; i < at; ++i) write_past_end<<<1, N>>>(a, N - 1);             // clean: in bounds, no shared
    if (!std::strcmp(tool, "memcheck")) write_past_end<<<1, N + 6>>>(a, N);
    else if (!std::strcmp(tool, "racecheck")) shared_race<<<1, 128>>>(a);
    else if (!std::strcmp(tool, "initcheck")) copy<<<1, N>>>(a, b, N);       // b was never written
    else if (!std::strcmp(tool, "synccheck")) {
        divergent_barrier<<<1, 64>>>(a);
        cudaDeviceSynchronize();
        bad_syncwarp_masks<<<1, 32>>>(a);
    }
    else {                                                                     // clean: the same shapes, no defect
        cudaMemset(b, 0, N * sizeof(float));
        write_past_end<<<1, N + 6>>>(a, N - 1);
        copy<<<1, N + 6>>>(a, b, N);
        divergent_barrier<<<1, 32>>>(a);                                       // one warp: all arrive
    }
    if (argc > 2)
        for (int i = 0; i < 2; ++i) write_past_end<<<1, N>>>(a, N - 1);
    cudaError_t err = cudaDeviceSynchronize();
    std::printf("canary %s ran: %s\n", tool, cudaGetErrorString(err));
    cudaFree(a);
    cudaFree(b);
    return 0;
}
