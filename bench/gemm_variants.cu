// gemm_variants.cu -- the chain GEMM of native/cuda/mt_gpu_gemm.cuh alone, for tuning its tiling
// without building the whole library once per variant (8 MB each; a device call carries 64 MB).
// Each variant is this file compiled with the header's -D flags (bench/gemm_variants.py builds
// them). For each of eight products it prints one line:
//   <name> <m>x<n>x<k> <layouts> slices=<s> ms=<median> tflops=<rate> fnv=<hash of C's bytes>
// The hash is the check: every tiling runs the same chains (the contract), so every variant must
// print the default's hash for every product; a tiling that changed bits prints another.
// Inputs are uniform in [-1, 1) from a counter hash (the same on every run), C is filled with
// NaN bits before the checked call (an output a tiling forgot stays NaN and changes the hash).
// Usage: <exe> NAME [REPEAT] [kk|kr|rr|sanitize]: the eight products timed; or one big product run
// once (for ncu); or small products for compute-sanitizer, run once: each loader kind's
// unguarded and guarded copies, interior whole tiles, edges, short last tiles and leaves (not
// accumulate, bias, or a 16-byte row with fewer than four columns left).
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mt_gpu_gemm.cuh"

// The two host functions the header calls, here rather than linked: native/common/mt_host.c's
// mt_fail would pull in every op's feature table, i.e. the whole library.
int mt_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return code;
}

int mt_gpu_error(gpuError_t err, const char *what) {
    fprintf(stderr, "%s: %s\n", what, gpuGetErrorString(err));
    return MT_EDEVICE;
}

#define CHECK(x)                                                                              \
    do {                                                                                      \
        cudaError_t e_ = (x);                                                                 \
        if (e_ != cudaSuccess) {                                                              \
            fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                          \
        }                                                                                     \
    } while (0)

__global__ void fill_uniform(float *x, int64_t n, uint32_t seed) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 0x9e3779b9u ^ seed ^ (uint32_t)(i >> 32) * 0x85ebca6bu;
        h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
        x[i] = (float)(h >> 8) * (2.0f / 16777216.0f) - 1.0f;
    }
}

static uint64_t fnv(const float *d, int64_t n) {
    std::vector<unsigned char> h((size_t)n * 4);
    CHECK(cudaMemcpy(h.data(), d, (size_t)n * 4, cudaMemcpyDeviceToHost));
    uint64_t x = 1469598103934665603ull;
    for (unsigned char c : h) x = (x ^ c) * 1099511628211ull;
    return x;
}

// One product: layouts "kk" (forward: A, B contraction-contiguous), "kr" (da: B output-contiguous),
// "rr" (dweight leaves: both output-contiguous, `slices` slices of 1024 steps).
static void run(const char *name, int64_t m, int64_t n, int64_t k, const char *lay, int repeat) {
    using namespace mt_gemm;
    const bool a_r = lay[0] == 'r', b_r = lay[1] == 'r';
    const int64_t slices = (a_r && b_r) ? (k + 1023) / 1024 : 1;
    float *A, *B, *C;
    CHECK(cudaMalloc(&A, m * k * 4));
    CHECK(cudaMalloc(&B, n * k * 4));
    CHECK(cudaMalloc(&C, slices * m * n * 4));
    fill_uniform<<<1024, 256>>>(A, m * k, 1u);
    fill_uniform<<<1024, 256>>>(B, n * k, 2u);
    CHECK(cudaMemset(C, 0xff, slices * m * n * 4));
    desc d = make_desc(C, n, operand{A, a_r ? m : k, a_r ? MT_RMAJOR : MT_KMAJOR},
                       operand{B, b_r ? n : k, b_r ? MT_RMAJOR : MT_KMAJOR}, m, n, k);
    d.stream = 0;
    if (slices > 1) {
        d.k_slice = 1024;
        d.slices = slices;
        d.c_slice = m * n;
    }
    if (gemm(d)) exit(3);
    CHECK(cudaDeviceSynchronize());
    const uint64_t h = fnv(C, slices * m * n);
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int w = 0; w < 2; ++w) gemm(d);
    std::vector<float> ms;
    for (int r = 0; r < repeat; ++r) {
        CHECK(cudaEventRecord(e0));
        gemm(d);
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float t;
        CHECK(cudaEventElapsedTime(&t, e0, e1));
        ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    const double med = ms[ms.size() / 2];
    printf("%s %lldx%lldx%lld %s slices=%lld ms=%.4f tflops=%.2f fnv=%016llx\n", name, (long long)m, (long long)n,
           (long long)k, lay, (long long)slices, med, 2.0 * m * n * k / (med * 1e-3) / 1e12, (unsigned long long)h);
    fflush(stdout);
    CHECK(cudaFree(A));
    CHECK(cudaFree(B));
    CHECK(cudaFree(C));
}

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "gemm";
    const int repeat = argc > 2 ? atoi(argv[2]) : 10;
    const char *only = argc > 3 ? argv[3] : "";   // kk, kr or rr: that product alone (for ncu)
    if (!strcmp(only, "kk")) run(name, 8192, 8192, 8192, "kk", 1);
    if (!strcmp(only, "kr")) run(name, 8192, 4096, 4096, "kr", 1);
    if (!strcmp(only, "rr")) run(name, 4096, 4096, 8192, "rr", 1);
    if (!strcmp(only, "sanitize")) {   // small products for compute-sanitizer (see the top)
        run(name, 256, 384, 64, "kk", 1);     // interior tiles, whole tiles: the unguarded pipeline
        run(name, 256, 256, 64, "kr", 1);
        run(name, 256, 256, 2064, "rr", 1);   // three leaves, the last 16 steps
        run(name, 200, 300, 1050, "rr", 1);   // the 16-byte loader at a column edge, a 26-step last leaf
        run(name, 200, 300, 50, "kk", 1);     // edges and a short last tile
        run(name, 130, 130, 37, "kr", 1);     // ld 130: the 4-byte output-contiguous loader
        run(name, 200, 300, 100, "kr", 1);    // 3 whole tiles of 32 and 4 steps: a stage reused, then a short tile
        run(name, 130, 130, 100, "kr", 1);    // the same through the 4-byte loader
        run(name, 130, 66, 1030, "rr", 1);
        run(name, 130, 256, 1030, "rr", 1);   // A 4-byte, B 16-byte-able: the <1, 2> kernel (B swapped, 4-byte)
        run(name, 256, 130, 1030, "rr", 1);   // A 16-byte, B 4-byte: <2, 1>
        run(name, 1, 1, 1, "kk", 1);
    }
    if (*only) return 0;
    run(name, 8192, 8192, 8192, "kk", repeat);   // linear forward 8192^3
    run(name, 4096, 11008, 4096, "kk", repeat);
    run(name, 8192, 4096, 4096, "kr", repeat);   // da of the backward 8192x4096x4096
    run(name, 4096, 4096, 8192, "rr", repeat);   // dweight's 8 leaves of the same
    // the LM head's two products of one 2048-row chunk (mt_gpu_lm_head.cu builds the `lm_head`
    // variant's tiling, not the `library` one)
    run(name, 2048, 768, 50304, "kr", repeat);  // d_hidden: 96 tiles, K = 50,304
    run(name, 50304, 768, 1024, "rr", repeat);  // a d_weight leaf
    run(name, 1000, 1000, 1000, "kk", repeat);   // edges: partial tiles and a short last tile
    run(name, 777, 1029, 2049, "rr", repeat);
    return 0;
}
