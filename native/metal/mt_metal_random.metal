// mt_metal_random.metal -- the uniform and normal fills and dropout (contract:
// native/contracts/random.md). Every value is a pure function of (seed, stream, stream element)
// by mt_pinned.h's routines; a thread computes the whole Philox counter blocks (four stream
// elements) its grid stride gives it, so each block is drawn once.
#include "mt_metal_kernel.h"

// out[j] for stream elements offset + j, j < n; dropout reads x (p.a = p, p.b = the host's scale
// 1 / (1 - p)). With p.check, nothing when bad[0] is set.
kernel void mt_k_random(device float *out [[buffer(0)]], device const float *x [[buffer(1)]],
                        device const int *bad [[buffer(2)]], constant mt_mtl_random_params &p [[buffer(3)]],
                        MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    if (p.check && bad[0]) return;
    if (p.n <= 0) return;
    const uint64_t first = p.offset, last = p.offset + (uint64_t)(p.n - 1);   // the last element: no wrap
    const uint64_t b0 = first >> 2, b1 = last >> 2;
    for (uint64_t block = b0 + i; block <= b1 && block >= b0; block += stride) {
        uint32_t w[4];
        float z[4];
        if (p.kind == MT_MTL_NORMAL) mt_normal_block(z, p.seed, p.stream, block);
        else mt_philox_words(w, p.seed, p.stream, block);
        for (int k = 0; k < 4; ++k) {
            uint64_t e = 4 * block + (uint64_t)k;
            if (e < first || e > last) continue;
            uint64_t j = e - first;
            if (p.kind == MT_MTL_UNIFORM) out[j] = mt_uniform_at(p.a, p.b, w[k]);
            else if (p.kind == MT_MTL_NORMAL) out[j] = mt_normal_value(p.a, p.b, z[k]);
            else out[j] = mt_dropout_elem(x[j], w[k], p.a, p.b);
        }
    }
}
