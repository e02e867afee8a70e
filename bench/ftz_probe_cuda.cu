// bench/ftz_probe_cuda.cu -- the float-behaviour probe of native/metal/mt_ftz_probe.metal, on an
// NVIDIA GPU with the identical_ftz library's device flags (nvcc -ftz=true --fmad=false
// -prec-div=true -prec-sqrt=true): does the hardware's flush follow native/contracts/ftz.md
// (tininess before rounding, negation and fabs flushed, ...)? The same cases and the same JSON
// report as the Metal probe (native/metal/mt_ftz_probe_cases.c), so the two vendors' answers
// compare line by line. Build: make native/build/ftz_probe_cuda; run it on the GPU machine
// (bash bench/device_steps.sh ftz_probe). Exit status 0 when every case follows the rule.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cuda_runtime.h>
extern "C" {
#include "mt_ftz_probe_cases.h"
}
#include "mt_ftz_probe_ops.h"

__global__ void probe(const unsigned *cases, unsigned *out, unsigned count) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const unsigned op = cases[4 * i];
    const float a = __uint_as_float(cases[4 * i + 1]), b = __uint_as_float(cases[4 * i + 2]);
    const float c = __uint_as_float(cases[4 * i + 3]);
    float r = 0.0f;
    unsigned bits = 0;
    bool as_bits = false;
    switch (op) {
    case MT_PROBE_ADD: r = a + b; break;
    case MT_PROBE_SUB: r = a - b; break;
    case MT_PROBE_MUL: r = a * b; break;
    case MT_PROBE_DIV: r = a / b; break;
    case MT_PROBE_FMA: r = fmaf(a, b, c); break;
    case MT_PROBE_SQRT: r = sqrtf(a); break;
    case MT_PROBE_GT0: bits = a > 0.0f ? 1u : 0u; as_bits = true; break;
    case MT_PROBE_EQ0: bits = a == 0.0f ? 1u : 0u; as_bits = true; break;
    case MT_PROBE_COPY: r = a; break;
    case MT_PROBE_SELECT: r = (c > 0.5f) ? a : b; break;
    case MT_PROBE_MAX: r = fmaxf(a, b); break;
    case MT_PROBE_MIN: r = fminf(a, b); break;
    case MT_PROBE_ABS: r = fabsf(a); break;
    case MT_PROBE_NEG: r = -a; break;
    case MT_PROBE_TO_INT: bits = (unsigned)(int)a; as_bits = true; break;
    case MT_PROBE_FLOOR: r = floorf(a); break;
    case MT_PROBE_MULADD: r = a * b + c; break;
    default: bits = 0xffffffffu; as_bits = true; break;
    }
    out[i] = as_bits ? bits : __float_as_uint(r);
}

static int check(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    fprintf(stderr, "ftz_probe_cuda: %s: %s\n", what, cudaGetErrorString(e));
    exit(2);
}

int main() {
    const unsigned n = (unsigned)mt_probe_count;
    unsigned *host = (unsigned *)malloc(16 * n), *out = (unsigned *)malloc(4 * n), *dc, *dout;
    for (unsigned k = 0; k < n; ++k) {
        host[4 * k] = mt_probe_cases[k].op;
        host[4 * k + 1] = mt_probe_cases[k].a;
        host[4 * k + 2] = mt_probe_cases[k].b;
        host[4 * k + 3] = mt_probe_cases[k].c;
    }
    check(cudaMalloc(&dc, 16 * n), "cudaMalloc");
    check(cudaMalloc(&dout, 4 * n), "cudaMalloc");
    check(cudaMemcpy(dc, host, 16 * n, cudaMemcpyHostToDevice), "copy in");
    probe<<<(n + 31) / 32, 32>>>(dc, dout, n);
    check(cudaGetLastError(), "launch");
    check(cudaMemcpy(out, dout, 4 * n, cudaMemcpyDeviceToHost), "copy out");
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "device properties");
    int differ = mt_probe_report(stdout, out, (unsigned)prop.warpSize, prop.name);
    return differ < 0 ? 2 : differ ? 1 : 0;
}
