/* unguarded_sweep_cuda.cu -- proof on an NVIDIA GPU that the pinned routines' unguarded quotient and
 * square root (mt_math_div_by in native/include/mt_pinned_math.h, mt_math_sqrt_pos in
 * mt_pinned_elementwise.h) give the IEEE operators' bits on every input their callers can receive,
 * under the device flags of the numeric mode it is built with (identical or identical_ftz):
 *   1. logs: both quotients of mt_math_log_quotients(f) (the unguarded sequence) against IEEE's
 *      f / dhi and (rem - shi dlo) / dhi, and mt_math_log_core_f(e, f) against
 *      mt_math_log_core(e, f, 0) at e = 0 and -24, for every f = m - 1 of a split (m's bits
 *      0x3f3504f3..0x3fb504f2: 2^23 values; mt_logf and Box-Muller's log reach the core through
 *      these only);
 *   2. roots: mt_math_sqrt_pos(v) against sqrtf(v) for Box-Muller's v = 0 - 2 ln u1, every u1
 *      (u1 = m 2^-24, 1 <= m <= 2^24);
 *   3. draws: mt_box_muller on the GPU against the same routine on this host (the CPU's IEEE
 *      operators) for every w0 >> 8 (2^24 values), w1 a multiplicative hash of it: both outputs.
 * Exit status 0 only if nothing differs. `make native/build/unguarded_sweep_cuda_identical` (and
 * _identical_ftz) builds it; `bash bench/device_steps.sh unguarded_sweep` runs both there.
 */
#include "mt_pinned.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#if defined(__CUDA_ARCH__) && !MT_MATH_UNGUARDED
#error "built without the unguarded sequences: nothing to check (an exact mode's flags are needed)"
#endif

#define SPLIT_FIRST 0x3f3504f3u
#define SPLIT_COUNT 0x800000u /* m's bits 0x3f3504f3 .. 0x3fb504f2 */
#define DRAWS (1u << 24)

struct tally {
    unsigned long long bad;
    unsigned first; /* the first differing input's index (as found: some differing index) */
};

__device__ void note(tally *t, unsigned i) {
    if (atomicAdd(&t->bad, 1ull) == 0ull) t->first = i;
}

__global__ void k_logs(tally *t) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= SPLIT_COUNT) return;
    float f = mt_bits_f32(SPLIT_FIRST + i) - 1.0f;
    float shi, slo;
    mt_math_log_quotients(f, &shi, &slo);
    float dhi = 2.0f + f, dlo = (2.0f - dhi) + f;
    float shi_ieee = f / dhi;
    float slo_ieee = (fmaf(-shi_ieee, dhi, f) - shi_ieee * dlo) / dhi;
    bool bad = mt_f32_bits(shi) != mt_f32_bits(shi_ieee) || mt_f32_bits(slo) != mt_f32_bits(slo_ieee);
    const float es[2] = {0.0f, -24.0f};
    for (int k = 0; k < 2; ++k)
        bad |= mt_f32_bits(mt_math_log_core_f(es[k], f)) != mt_f32_bits(mt_math_log_core(es[k], f, 0.0f));
    if (bad) note(t, i);
}

__global__ void k_roots(tally *t) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= DRAWS) return;
    float u1 = (float)(i + 1u) * 5.9604644775390625e-08f;
    float v = 0.0f - 2.0f * mt_logf_normal(u1);
    if (mt_f32_bits(mt_math_sqrt_pos(v)) != mt_f32_bits(sqrtf(v))) note(t, i);
}

__host__ __device__ uint32_t second_word(uint32_t i) { return i * 2654435761u; }

__global__ void k_draws(float *z) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= DRAWS) return;
    mt_box_muller(i << 8, second_word(i), &z[2 * i], &z[2 * i + 1]);
}

static int check(cudaError_t e, const char *what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
        exit(2);
    }
    return 0;
}

int main(void) {
    tally *t;
    check(cudaMallocManaged(&t, 2 * sizeof(tally)), "cudaMallocManaged");
    t[0] = t[1] = tally{0, 0};
    k_logs<<<(SPLIT_COUNT + 255) / 256, 256>>>(&t[0]);
    k_roots<<<(DRAWS + 255) / 256, 256>>>(&t[1]);
    float *dz;
    check(cudaMalloc(&dz, 2ull * DRAWS * sizeof(float)), "cudaMalloc");
    k_draws<<<(DRAWS + 255) / 256, 256>>>(dz);
    check(cudaGetLastError(), "launch");
    check(cudaDeviceSynchronize(), "kernels");
    std::vector<float> z(2ull * DRAWS);
    check(cudaMemcpy(z.data(), dz, z.size() * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    unsigned long long draws_bad = 0;
    unsigned draws_first = 0;
    for (uint32_t i = 0; i < DRAWS; ++i) {
        float a, b;
        mt_box_muller(i << 8, second_word(i), &a, &b);
        if (mt_f32_bits(a) != mt_f32_bits(z[2 * i]) || mt_f32_bits(b) != mt_f32_bits(z[2 * i + 1]))
            if (draws_bad++ == 0) draws_first = i;
    }
    printf("{\"mode\": %d, \"logs\": [%u, %llu, %u], \"roots\": [%u, %llu, %u], \"draws\": [%u, %llu, %u]}\n",
           MT_NUMERIC_MODE, SPLIT_COUNT, t[0].bad, t[0].first, DRAWS, t[1].bad, t[1].first, DRAWS, draws_bad,
           draws_first);
    printf("# [inputs, differing, first differing index] of each check\n");
    return (t[0].bad || t[1].bad || draws_bad) ? 1 : 0;
}
