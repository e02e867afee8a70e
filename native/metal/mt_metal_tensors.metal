// mt_metal_tensors.metal -- tensor-list kernels: zero_grad's fill.
#include "mt_metal_kernel.h"

// x[0..p.n) = +0.0
kernel void mt_k_fill_zero(device float *x [[buffer(0)]], constant mt_mtl_count_params &p [[buffer(1)]],
                           MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t k = i; k < p.n; k += stride) x[k] = 0.0f;
}
