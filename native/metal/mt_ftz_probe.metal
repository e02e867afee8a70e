// mt_ftz_probe.metal -- asks an Apple GPU how its float32 arithmetic treats subnormals, case by
// case, so that the first run on Apple hardware confirms or corrects native/contracts/ftz.md.
//
// Each thread runs one case of mt_ftz_probe_cases.h (an op code and up to three operands, as
// float32 bits) and writes the result's bits; the host (mt_ftz_probe.m) compares them with the
// rule's result (native/include/mt_ftz.h on the CPU) and with IEEE's. Compiled without fast math
// and without contraction, as the library's kernels will be. Also compiled as C++ on Linux
// through native/metal/shim/ (tests/test_metal_shim.py), so a typo cannot land unseen.
#include <metal_stdlib>
using namespace metal;
#pragma METAL fp contract(off)

#include "mt_ftz_probe_ops.h"

kernel void mt_ftz_probe(device const uint *cases [[buffer(0)]],     // 4 words a case: op, a, b, c
                         device uint *out [[buffer(1)]],
                         constant uint &count [[buffer(2)]],
                         uint i [[thread_position_in_grid]]) {
    if (i >= count) return;
    const uint op = cases[4 * i];
    const float a = as_type<float>(cases[4 * i + 1]);
    const float b = as_type<float>(cases[4 * i + 2]);
    const float c = as_type<float>(cases[4 * i + 3]);
    float r = 0.0f;
    uint bits_out = 0;
    bool as_bits = false;
    switch (op) {
    case MT_PROBE_ADD: r = a + b; break;
    case MT_PROBE_SUB: r = a - b; break;
    case MT_PROBE_MUL: r = a * b; break;
    case MT_PROBE_DIV: r = a / b; break;
    case MT_PROBE_FMA: r = fma(a, b, c); break;
    case MT_PROBE_SQRT: r = sqrt(a); break;
    case MT_PROBE_GT0: bits_out = a > 0.0f ? 1u : 0u; as_bits = true; break;
    case MT_PROBE_EQ0: bits_out = a == 0.0f ? 1u : 0u; as_bits = true; break;
    case MT_PROBE_COPY: r = a; break;
    case MT_PROBE_SELECT: r = (c > 0.5f) ? a : b; break;
    case MT_PROBE_MAX: r = fmax(a, b); break;
    case MT_PROBE_MIN: r = fmin(a, b); break;
    case MT_PROBE_ABS: r = fabs(a); break;
    case MT_PROBE_NEG: r = -a; break;
    case MT_PROBE_TO_INT: bits_out = as_type<uint>(int(a)); as_bits = true; break;
    case MT_PROBE_FLOOR: r = floor(a); break;
    case MT_PROBE_MULADD: r = a * b + c; break;
    default: bits_out = 0xffffffffu; as_bits = true; break;
    }
    out[i] = as_bits ? bits_out : as_type<uint>(r);
}

// The SIMD width the hardware runs this kernel with (threadExecutionWidth, seen from inside).
kernel void mt_ftz_probe_simd_width(device uint *out [[buffer(0)]],
                                    uint lane [[thread_index_in_simdgroup]],
                                    uint width [[threads_per_simdgroup]]) {
    if (lane == 0) out[0] = width;
}
