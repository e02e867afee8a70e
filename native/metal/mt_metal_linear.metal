// mt_metal_linear.metal -- linear forward and backward (contract: native/contracts/linear.md):
// every GEMM output one chain (MT_DOT_STEP from +0.0 in ascending index), a thread an output;
// dweight and dbias by the token rule: a thread per (leaf, output) folds the leaf's rows, then
// mt_k_linear_tree joins each output's leaf partials by the pairwise tree.
#include "mt_metal_kernel.h"

// out[i * n + j] = chain over p < k of (a[i * k + p], w[j * k + p]) (+ bias[j], one addition);
// op DA: da[i * k + p] = chain over j < n of (dc[i * n + j], w[j * k + p]) (a is dc, n and k as
// the call's: the output is m x k).
kernel void mt_k_linear_chain(device float *out [[buffer(0)]], device const float *a [[buffer(1)]],
                              device const float *w [[buffer(2)]], device const float *bias [[buffer(3)]],
                              constant mt_mtl_linear_params &p [[buffer(4)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t cols = p.op == MT_MTL_LINEAR_DA ? p.k : p.n, total = p.m * cols;
    for (int64_t e = i; e < total; e += stride) {
        const int64_t r = e / cols, c = e % cols;
        float acc = 0.0f;
        if (p.op == MT_MTL_LINEAR_DA) {
            for (int64_t j = 0; j < p.n; ++j) acc = MT_DOT_STEP(a[r * p.n + j], w[j * p.k + c], acc);
        } else {
            for (int64_t q = 0; q < p.k; ++q) acc = MT_DOT_STEP(a[r * p.k + q], w[c * p.k + q], acc);
            if (p.has_bias) acc = acc + bias[c];
        }
        out[e] = acc;
    }
}

// partials[o * leaves + l] for output o of leaf l: op DW, o = j * k + q: the chain over the leaf's
// rows i of (dc[i * n + j], a[i * k + q]); op DB, o = j: acc + dc[i * n + j]; each from +0.0,
// or (p.resume, one leaf) from the partial already there.
kernel void mt_k_linear_leaves(device const float *dc [[buffer(0)]], device const float *a [[buffer(1)]],
                               device float *partials [[buffer(2)]], constant mt_mtl_linear_params &p [[buffer(3)]],
                               MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.m), outs = p.op == MT_MTL_LINEAR_DB ? p.n : p.n * p.k;
    const int64_t total = leaves * outs;
    for (int64_t t = i; t < total; t += stride) {
        const int64_t l = t / outs, o = t % outs, r0 = l * MT_TOKEN_LEAF;
        const int64_t r1 = r0 + MT_TOKEN_LEAF < p.m ? r0 + MT_TOKEN_LEAF : p.m;
        float acc = p.resume ? partials[o * leaves + l] : 0.0f;
        if (p.op == MT_MTL_LINEAR_DB) {
            for (int64_t r = r0; r < r1; ++r) acc = acc + dc[r * p.n + o];
        } else {
            const int64_t j = o / p.k, q = o % p.k;
            for (int64_t r = r0; r < r1; ++r) acc = MT_DOT_STEP(dc[r * p.n + j], a[r * p.k + q], acc);
        }
        partials[o * leaves + l] = acc;
    }
}

// out[o] = the pairwise tree over output o's leaf partials (consumed); leaves in the op's count.
kernel void mt_k_linear_tree(device float *partials [[buffer(0)]], device float *out [[buffer(1)]],
                             constant mt_mtl_linear_params &p [[buffer(2)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.m), outs = p.op == MT_MTL_LINEAR_DB ? p.n : p.n * p.k;
    for (int64_t o = i; o < outs; o += stride) out[o] = mt_tree_fold_device(partials + o * leaves, leaves);
}
