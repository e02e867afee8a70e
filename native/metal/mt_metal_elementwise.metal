// mt_metal_elementwise.metal -- SiLU, GELU, the residual add and ReLU (contract:
// native/contracts/elementwise.md) and the finiteness pre-pass every map shares. Each output
// element is one pinned routine of its inputs (mt_pinned.h), as on every vendor; the host
// (mt_metal_elementwise.c) decides refusals from the pre-pass's words before the map runs.
#include "mt_metal_kernel.h"

// bad[0] = 1 when a[0..n) holds a NaN or inf, bad[1] when b does (has_b).
kernel void mt_k_nonfinite(device const float *a [[buffer(0)]], device const float *b [[buffer(1)]],
                           device int *bad [[buffer(2)]], constant mt_mtl_nonfinite_params &p [[buffer(3)]],
                           MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    bool fa = false, fb = false;
    for (int64_t k = i; k < p.n; k += stride) {
        fa = fa || !mt_is_finite(a[k]);
        if (p.has_b) fb = fb || !mt_is_finite(b[k]);
    }
    if (fa) bad[0] = 1;
    if (fb) bad[1] = 1;
}

static inline float mt_mtl_map_one(int32_t op, float a, float b) {
    switch (op) {
    case MT_MTL_SILU: return mt_silu(a);
    case MT_MTL_SILU_GRAD: return mt_silu_grad(a, b);
    case MT_MTL_ADD: return mt_add_elem(a, b);
    case MT_MTL_GELU: return mt_gelu_erf(a);
    case MT_MTL_GELU_GRAD: return mt_gelu_erf_grad(a, b);
    case MT_MTL_GELU_TANH: return mt_gelu_tanh(a);
    case MT_MTL_GELU_TANH_GRAD: return mt_gelu_tanh_grad(a, b);
    case MT_MTL_RELU: return mt_relu(a);
    default: return mt_relu_grad(a, b);
    }
}

// out[k] = op(a[k], b[k]) (b unread by the unary ops); with p.check, nothing when a bad word is set.
kernel void mt_k_map(device float *out [[buffer(0)]], device const float *a [[buffer(1)]],
                     device const float *b [[buffer(2)]], device const int *bad [[buffer(3)]],
                     constant mt_mtl_map_params &p [[buffer(4)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    if (p.check && (bad[0] | bad[1])) return;
    const int32_t op = p.op;
    const bool unary = op == MT_MTL_SILU || op == MT_MTL_GELU || op == MT_MTL_GELU_TANH || op == MT_MTL_RELU;
    for (int64_t k = i; k < p.n; k += stride) out[k] = mt_mtl_map_one(op, a[k], unary ? 0.0f : b[k]);
}
