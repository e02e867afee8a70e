// mt_metal_accumulate.metal -- the two element kernels gradient accumulation is built from
// (mt_metal_accumulate.c walks the microbatches' pairwise tree with them).
#include "mt_metal_kernel.h"

// dst = a + b (dst may be a itself: the tree's left operand updated in place).
kernel void mt_k_add2(device float *dst [[buffer(0)]], device const float *a [[buffer(1)]],
                      device const float *b [[buffer(2)]], constant mt_mtl_count_params &p [[buffer(3)]],
                      MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t k = i; k < p.n; k += stride) dst[k] = a[k] + b[k];
}

// dst = src, bit for bit.
kernel void mt_k_copy(device float *dst [[buffer(0)]], device const float *src [[buffer(1)]],
                      constant mt_mtl_count_params &p [[buffer(2)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t k = i; k < p.n; k += stride) dst[k] = src[k];
}
