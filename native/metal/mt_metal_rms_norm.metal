// mt_metal_rms_norm.metal -- RMSNorm (contract: native/contracts/rms_norm.md). The row sums are the
// chunk folds of mt_metal_clip.metal (fma(x, x, acc), and fma(g, x, acc) for the backward's c);
// these kernels finish each row from its chunk partials (the pairwise tree, then mt_rms_rstd or
// mt_rms_k), write y or dx element by element, and form dweight by the token rule (linear.md):
// a chain over each leaf of MT_TOKEN_LEAF rows per column, then the pairwise tree over leaves.
#include "mt_metal_kernel.h"

// out[r] for each row r from partials[r * chunks ..] (consumed): op RSTD: mt_rms_rstd(sum, dimf,
// eps) (LayerNorm's r too); op K: mt_rms_k(sum, dimf, rstd[r]); op LN_MEAN: mt_ln_mean(sum, dimf);
// op ROW_SUM: the sum itself.
kernel void mt_k_rms_rows(device float *partials [[buffer(0)]], device const float *rstd [[buffer(1)]],
                          device float *out [[buffer(2)]], constant mt_mtl_rms_params &p [[buffer(3)]],
                          MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t r = i; r < p.rows; r += stride) {
        const float sum = mt_tree_fold_device(partials + r * p.chunks, p.chunks);
        out[r] = p.op == MT_MTL_RMS_RSTD ? mt_rms_rstd(sum, p.dimf, p.eps)
               : p.op == MT_MTL_LN_MEAN ? mt_ln_mean(sum, p.dimf)
               : p.op == MT_MTL_ROW_SUM ? sum : mt_rms_k(sum, p.dimf, rstd[r]);
    }
}

// op 0: y = mt_rms_y(x, r, w); op 1: dx = mt_rms_dx(dy, w, x, r, k) (w = 1 without weight).
kernel void mt_k_rms_elems(device float *out [[buffer(0)]], device const float *x [[buffer(1)]],
                           device const float *dy [[buffer(2)]], device const float *w [[buffer(3)]],
                           device const float *rstd [[buffer(4)]], device const float *k [[buffer(5)]],
                           constant mt_mtl_rms_params &p [[buffer(6)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.rows * p.dim;
    for (int64_t e = i; e < total; e += stride) {
        const int64_t r = e / p.dim, c = e % p.dim;
        const float wc = p.has_w ? w[c] : 1.0f;
        out[e] = p.op == 0 ? mt_rms_y(x[e], rstd[r], wc) : mt_rms_dx(dy[e], wc, x[e], rstd[r], k[r]);
    }
}

// partials[c * leaves + l] = the chain over leaf l's rows of MT_DOT_STEP(dy, x * r, acc) from +0.0
// for column c: a thread per (leaf, column); columns hold their leaves side by side for the tree.
kernel void mt_k_rms_dweight_leaves(device const float *dy [[buffer(0)]], device const float *x [[buffer(1)]],
                                    device const float *rstd [[buffer(2)]], device float *partials [[buffer(3)]],
                                    constant mt_mtl_rms_params &p [[buffer(4)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.rows), total = leaves * p.dim;
    for (int64_t t = i; t < total; t += stride) {
        const int64_t l = t / p.dim, c = t % p.dim, r0 = l * MT_TOKEN_LEAF;
        const int64_t r1 = r0 + MT_TOKEN_LEAF < p.rows ? r0 + MT_TOKEN_LEAF : p.rows;
        float acc = 0.0f;
        for (int64_t r = r0; r < r1; ++r) acc = MT_DOT_STEP(dy[r * p.dim + c], x[r * p.dim + c] * rstd[r], acc);
        partials[c * leaves + l] = acc;
    }
}

// dweight[c] = the pairwise tree over column c's leaf partials (consumed), its NaN canonical
// (LayerNorm's dweight and dbias too).
kernel void mt_k_rms_dweight_tree(device float *partials [[buffer(0)]], device float *dweight [[buffer(1)]],
                                  constant mt_mtl_rms_params &p [[buffer(2)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.rows);
    for (int64_t c = i; c < p.dim; c += stride)
        dweight[c] = mt_canonical_nan(mt_tree_fold_device(partials + c * leaves, leaves));
}
