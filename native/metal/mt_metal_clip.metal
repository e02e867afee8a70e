// mt_metal_clip.metal -- the norms of clip.md (the 2-, 1- and inf-norm) by the length-only tree,
// the row folds RMSNorm shares with them, and the clip's scaling. The host (mt_metal_clip.c)
// launches mt_k_fold_lanes and mt_k_fold_lane_tree once per tensor (a thread per lane of each
// chunk of MT_CHUNK elements, then a thread per chunk), then mt_k_norm_finish (a thread per
// tensor over its chunk partials); the tensor norms are then one more vector, folded by the same
// kernels into the total. mt_metal_rms_norm.c folds rows with the first two. Lane l folds elements l, l + MT_LANES, ... in
// ascending order from +0.0, the lanes meet in mt_lane_tree, the chunk partials in the pairwise
// tree (mt_tree_fold_device): the very steps of the oracle's mt_chunk_sumsq / mt_tree_fold.
#include "mt_metal_kernel.h"

static inline float mt_mtl_fold_step(int32_t kind, float acc, float x) {
    return kind == MT_MTL_NORM_L2 ? fmaf(x, x, acc) : kind == MT_MTL_NORM_L1 ? acc + fabsf(x)
         : kind == MT_MTL_FOLD_SUM ? acc + x : mt_max_abs(acc, x);
}

// lanes[(r * chunks + c) * MT_LANES + l] = lane l's fold of chunk c of row r (p.rows rows of p.n
// elements; chunks = mt_chunk_count(p.n)): a thread per (row, chunk, lane). With g = dy * w (w:
// p.has_w) or dy: GDOT folds fma(g, x, acc) (RMSNorm), LN_G acc + g, LN_GX fma(g, xhat, acc)
// (xhat = mt_ln_xhat(x, ra[row], rb[row])), DEVSQ fma(x - ra[row], x - ra[row], acc); the
// cross-entropy's EXP acc + mt_expf(x - ra[row]), WX fma(w, x, acc), YX fma(dy, x, acc); the
// other kinds their step of x alone.
kernel void mt_k_fold_lanes(device const float *x [[buffer(0)]], device const float *dy [[buffer(1)]],
                            device const float *w [[buffer(2)]], device const float *ra [[buffer(3)]],
                            device const float *rb [[buffer(4)]], device float *lanes [[buffer(5)]],
                            constant mt_mtl_norm_params &p [[buffer(6)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t chunks = mt_chunk_count(p.n), total = p.rows * chunks * MT_LANES;
    for (int64_t t = i; t < total; t += stride) {
        const int64_t row = t / (chunks * MT_LANES), c = (t / MT_LANES) % chunks, l = t % MT_LANES;
        const int64_t start = c * MT_CHUNK, base = row * p.n;
        const int64_t n = p.n - start < MT_CHUNK ? p.n - start : MT_CHUNK, full = n / MT_LANES;
        float acc = 0.0f;
        for (int64_t rr = 0; rr <= full; ++rr) {
            const int64_t r = rr == full ? full : (p.reversed ? full - 1 - rr : rr);   // the short row last
            const int64_t e = start + r * MT_LANES + l;
            if (r == full && l >= n - full * MT_LANES) break;
            if (p.kind >= MT_MTL_FOLD_GDOT && p.kind <= MT_MTL_FOLD_LN_GX) {
                const float g = p.has_w ? dy[base + e] * w[e] : dy[base + e];
                acc = p.kind == MT_MTL_FOLD_GDOT ? MT_DOT_STEP(g, x[base + e], acc)
                    : p.kind == MT_MTL_FOLD_LN_G ? acc + g : fmaf(g, mt_ln_xhat(x[base + e], ra[row], rb[row]), acc);
            } else if (p.kind == MT_MTL_FOLD_DEVSQ) {
                const float d = x[base + e] - ra[row];
                acc = fmaf(d, d, acc);
            } else if (p.kind == MT_MTL_FOLD_EXP) {
                acc = acc + mt_expf(x[base + e] - ra[row]);
            } else if (p.kind == MT_MTL_FOLD_WX) {
                acc = fmaf(w[e], x[base + e], acc);
            } else if (p.kind == MT_MTL_FOLD_YX) {
                acc = fmaf(dy[base + e], x[base + e], acc);
            } else {
                acc = mt_mtl_fold_step(p.kind, acc, x[base + e]);
            }
        }
        lanes[t] = acc;
    }
}

// partials[p.at + q] = the partial of chunk q (q < p.rows * chunks) from its MT_LANES lanes: the
// lane tree (the max for the inf-norm); a thread per chunk.
kernel void mt_k_fold_lane_tree(device const float *lanes [[buffer(0)]], device float *partials [[buffer(1)]],
                                constant mt_mtl_norm_params &p [[buffer(2)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t count = p.rows * mt_chunk_count(p.n);
    for (int64_t c = i; c < count; c += stride) {
        float a[MT_LANES];
        for (int k = 0; k < MT_LANES; ++k) a[k] = lanes[c * MT_LANES + k];
        float r = 0.0f;
        if (p.kind == MT_MTL_NORM_INF) {
            for (int k = 0; k < MT_LANES; ++k) r = mt_max_abs(r, a[k]);
        } else {
            r = mt_lane_tree(a);
        }
        partials[p.at + c] = r;
    }
}

// out[j] = the norm of tensor j from its chunk partials partials[start[j] .. start[j + 1])
// (consumed): the pairwise tree (sqrt for the 2-norm) or the max; a thread per tensor.
kernel void mt_k_norm_finish(device float *partials [[buffer(0)]], device const int64_t *start [[buffer(1)]],
                             device float *out [[buffer(2)]], constant mt_mtl_norm_params &p [[buffer(3)]],
                             MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t j = i; j < p.n; j += stride) {
        device float *s = partials + start[j];
        const int64_t m = start[j + 1] - start[j];
        float r;
        if (p.kind == MT_MTL_NORM_INF) {
            r = 0.0f;
            for (int64_t k = 0; k < m; ++k) r = mt_max_abs(r, s[k]);
        } else {
            r = mt_tree_fold_device(s, m);
            if (p.kind == MT_MTL_NORM_L2) r = sqrtf(r);
        }
        out[p.at + j] = r;
    }
}

// x = x * coef, a NaN product written as the canonical NaN (clip.md).
kernel void mt_k_scale(device float *x [[buffer(0)]], constant mt_mtl_scale_params &p [[buffer(1)]],
                       MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t k = i; k < p.n; k += stride) x[k] = mt_canonical_nan(x[k] * p.coef);
}
