// mt_metal_layer_norm.metal -- LayerNorm's element and leaf kernels (contract:
// native/contracts/layer_norm.md). The row scalars come from the chunk folds of mt_metal_clip.metal
// (sum; fma(x - mu, x - mu, acc); g; fma(g, xhat, acc)) finished by mt_k_rms_rows; dweight and
// dbias by the token rule: chains over each leaf's rows per column here, the tree over leaves by
// mt_k_rms_dweight_tree.
#include "mt_metal_kernel.h"

// op 0: y = mt_ln_y(x, mu, r, w, b) (w = 1 and b = -0.0 where absent); op 1: dx = mt_ln_dx(dy, w,
// x, mu, r, mg, mgx).
kernel void mt_k_ln_elems(device float *out [[buffer(0)]], device const float *x [[buffer(1)]],
                          device const float *dy [[buffer(2)]], device const float *w [[buffer(3)]],
                          device const float *b [[buffer(4)]], device const float *mu [[buffer(5)]],
                          device const float *r [[buffer(6)]], device const float *mg [[buffer(7)]],
                          device const float *mgx [[buffer(8)]], constant mt_mtl_rms_params &p [[buffer(9)]],
                          MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.rows * p.dim;
    for (int64_t e = i; e < total; e += stride) {
        const int64_t row = e / p.dim, c = e % p.dim;
        const float wc = p.has_w ? w[c] : 1.0f;
        out[e] = p.op == 0 ? mt_ln_y(x[e], mu[row], r[row], wc, p.has_b ? b[c] : -0.0f)
                           : mt_ln_dx(dy[e], wc, x[e], mu[row], r[row], mg[row], mgx[row]);
    }
}

// pw[c * leaves + l] = the chain over leaf l's rows of MT_DOT_STEP(dy, xhat, acc), pb[c * leaves +
// l] = their sum of dy, each from +0.0 (p.has_w / p.has_b: which are wanted); a thread per (leaf,
// column).
kernel void mt_k_ln_param_leaves(device const float *dy [[buffer(0)]], device const float *x [[buffer(1)]],
                                 device const float *mu [[buffer(2)]], device const float *r [[buffer(3)]],
                                 device float *pw [[buffer(4)]], device float *pb [[buffer(5)]],
                                 constant mt_mtl_rms_params &p [[buffer(6)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.rows), total = leaves * p.dim;
    for (int64_t t = i; t < total; t += stride) {
        const int64_t l = t / p.dim, c = t % p.dim, r0 = l * MT_TOKEN_LEAF;
        const int64_t r1 = r0 + MT_TOKEN_LEAF < p.rows ? r0 + MT_TOKEN_LEAF : p.rows;
        float aw = 0.0f, ab = 0.0f;
        for (int64_t row = r0; row < r1; ++row) {
            const float g = dy[row * p.dim + c];
            if (p.has_w) aw = MT_DOT_STEP(g, mt_ln_xhat(x[row * p.dim + c], mu[row], r[row]), aw);
            if (p.has_b) ab = ab + g;
        }
        if (p.has_w) pw[c * leaves + l] = aw;
        if (p.has_b) pb[c * leaves + l] = ab;
    }
}
