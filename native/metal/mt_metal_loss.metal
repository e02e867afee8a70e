// mt_metal_loss.metal -- cross-entropy (contract: native/contracts/loss.md). The host
// (mt_metal_loss.c) runs, over rows of vocab contiguous logits (positions transposed there first
// by mt_k_ce_transpose: values move, no arithmetic): mt_k_ce_row_max (each row's max, exact, and
// whether it or its probabilities hold NaN or inf), the row sums as chunk folds
// (mt_metal_clip.metal's mt_k_fold_lanes: the softmax denominator acc + mt_expf(x - m), the
// smoothing sums, the probability coefficients' folds), mt_k_ce_row_loss (a thread a row),
// mt_k_ce_grad (a thread an element, e_j formed again: mt_expf is a pure function) and the token
// rule over the row losses (mt_k_token_leaves, then mt_k_ce_total).
#include "mt_metal_kernel.h"

// The scalars of a call, as a thread's own copy (the pinned routines take thread pointers).
static inline mt_ce_scalars mt_mtl_ce_scalars(constant mt_mtl_ce_params &p) {
    mt_ce_scalars c = p.c;
    return c;
}

// The max's order: a float's bits as an integer key that orders like the float (a negative
// one's magnitude bits flipped), so -0.0 < +0.0 and a subnormal is its own value whatever the
// flush: the oracle's max (mt_cpu_loss.c), bit for bit.
static inline int32_t mt_mtl_order_key(uint b) { return (int32_t)(b ^ ((uint)((int32_t)b >> 31) >> 1)); }

// max[r] = the max of row r (exact: any order); flags[r] = 1 when the row's logits hold NaN or
// inf, else 2 when its probabilities (p.kind PROBS) do, else 0.
kernel void mt_k_ce_row_max(device const uint *x [[buffer(0)]], device const uint *y [[buffer(1)]],
                            device float *max [[buffer(2)]], device int32_t *flags [[buffer(3)]],
                            constant mt_mtl_ce_params &p [[buffer(4)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t r = i; r < p.rows; r += stride) {
        int32_t top = -2147483647 - 1, bad = 0;
        for (int64_t j = 0; j < p.vocab; ++j) {
            const uint b = x[r * p.vocab + j];
            const int32_t key = mt_mtl_order_key(b);
            top = key > top ? key : top;
            bad |= (b & 0x7f800000u) == 0x7f800000u;
        }
        if (!bad && p.kind == MT_MTL_CE_PROBS)
            for (int64_t j = 0; j < p.vocab; ++j) bad |= (y[r * p.vocab + j] & 0x7f800000u) == 0x7f800000u ? 2 : 0;
        max[r] = as_type<float>((uint)mt_mtl_order_key((uint)top));
        flags[r] = bad;
    }
}

// coef[r * vocab + j] = c_j of row r: w_j * y'_j, y'_j = keep * y_j + off with smoothing, else y_j
// (the oracle's mt_ce_coef; no weight: y'_j).
kernel void mt_k_ce_coef(device const float *y [[buffer(0)]], device const float *w [[buffer(1)]],
                         device float *coef [[buffer(2)]], constant mt_mtl_ce_params &p [[buffer(3)]],
                         MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.rows * p.vocab;
    for (int64_t e = i; e < total; e += stride) {
        const float v = p.c.eps != 0.0f ? p.c.keep * y[e] + p.c.off : y[e];
        coef[e] = p.has_w ? w[e % p.vocab] * v : v;
    }
}

// loss[r] of each row from its max m, denominator s and the sums of its kind (sa: the logits'
// sum or SW with smoothing, C for probabilities; sb: CX), +0.0 for an ignored row.
kernel void mt_k_ce_row_loss(device const float *x [[buffer(0)]], device const uint *targets [[buffer(1)]],
                             device const float *w [[buffer(2)]], device const float *m [[buffer(3)]],
                             device const float *s [[buffer(4)]], device const float *sa [[buffer(5)]],
                             device const float *sb [[buffer(6)]], device float *loss [[buffer(7)]],
                             constant mt_mtl_ce_params &p [[buffer(8)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    mt_ce_scalars c = mt_mtl_ce_scalars(p);
    for (int64_t r = i; r < p.rows; r += stride) {
        if (p.kind == MT_MTL_CE_PROBS) {
            loss[r] = mt_ce_row_loss_p(m[r], s[r], sa[r], sb[r]);
            continue;
        }
        const int64_t t = mt_mtl_index(targets, p.target_bytes, r);
        const float xt = t == p.ignore_index ? 0.0f : x[r * p.vocab + t];
        loss[r] = t == p.ignore_index ? 0.0f
                : p.kind == MT_MTL_CE_PLAIN ? mt_ce_row_loss(m[r], s[r], xt, c.eps != 0.0f ? sa[r] : 0.0f, &c)
                : mt_ce_row_loss_w(m[r], s[r], xt, w[t], c.eps != 0.0f ? sa[r] : 0.0f, p.wm, &c);
    }
}

// d[r * vocab + j] of every row: (e / s - y) * g (plain), fma(e / s, a, -y) * g (a weight,
// probabilities), e = mt_expf(x - m) as in the denominator's fold; +0.0 in an ignored row.
// coef: the probabilities' c_j (else unread).
kernel void mt_k_ce_grad(device const float *x [[buffer(0)]], device const uint *targets [[buffer(1)]],
                         device const float *w [[buffer(2)]], device const float *coef [[buffer(3)]],
                         device const float *m [[buffer(4)]], device const float *s [[buffer(5)]],
                         device const float *csum [[buffer(6)]], device float *d [[buffer(7)]],
                         constant mt_mtl_ce_params &p [[buffer(8)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    mt_ce_scalars c = mt_mtl_ce_scalars(p);
    const int64_t total = p.rows * p.vocab;
    for (int64_t k = i; k < total; k += stride) {
        const int64_t r = k / p.vocab, j = k % p.vocab;
        const float e = mt_expf(x[k] - m[r]);
        if (p.kind == MT_MTL_CE_PROBS) {
            d[k] = mt_ce_grad_nd(e, s[r], csum[r], coef[k], c.g);
            continue;
        }
        const int64_t t = mt_mtl_index(targets, p.target_bytes, r);
        if (t == p.ignore_index) {
            d[k] = 0.0f;
        } else if (p.kind == MT_MTL_CE_PLAIN) {
            d[k] = mt_ce_grad(e, s[r], j == t, &c);
        } else {
            const float wt = w[t], kt = c.keep * wt, a = mt_ce_factor_w(kt, p.wm, &c);
            d[k] = mt_ce_grad_nd(e, s[r], a, j == t ? mt_ce_target_w(kt, wt, &c) : c.off * w[j], c.g);
        }
    }
}

// dst[(b * cols + c) * rows + q] = src[(b * rows + q) * cols + c] for p.batch matrices of p.rows
// x p.cols: (B, V, P) to rows of V and back, bits moved.
kernel void mt_k_ce_transpose(device uint *dst [[buffer(0)]], device const uint *src [[buffer(1)]],
                              constant mt_mtl_transpose_params &p [[buffer(2)]], MT_ID_GRID(i),
                              MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.batch * p.rows * p.cols;
    for (int64_t e = i; e < total; e += stride) {
        const int64_t b = e / (p.rows * p.cols), q = (e / p.cols) % p.rows, c = e % p.cols;
        dst[(b * p.cols + c) * p.rows + q] = src[e];
    }
}

// v[r] = w[t_r] for a row not ignored, +0.0 for an ignored one (a weighted mean's divisor's terms).
kernel void mt_k_ce_target_weights(device const uint *targets [[buffer(0)]], device const float *w [[buffer(1)]],
                                   device float *v [[buffer(2)]], constant mt_mtl_ce_params &p [[buffer(3)]],
                                   MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    for (int64_t r = i; r < p.rows; r += stride) {
        const int64_t t = mt_mtl_index(targets, p.target_bytes, r);
        v[r] = t == p.ignore_index ? 0.0f : w[t];
    }
}

// partials[l] = the chain over leaf l's terms (MT_TOKEN_LEAF of them, the last leaf short) of
// acc + v[r] from +0.0: the token rule's leaves (linear.md) over p.n terms.
kernel void mt_k_token_leaves(device const float *v [[buffer(0)]], device float *partials [[buffer(1)]],
                              constant mt_mtl_count_params &p [[buffer(2)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t leaves = mt_token_leaves(p.n);
    for (int64_t l = i; l < leaves; l += stride) {
        const int64_t r1 = (l + 1) * MT_TOKEN_LEAF < p.n ? (l + 1) * MT_TOKEN_LEAF : p.n;
        float acc = 0.0f;
        for (int64_t r = l * MT_TOKEN_LEAF; r < r1; ++r) acc = acc + v[r];
        partials[l] = acc;
    }
}

// out[0] = the pairwise tree over the p.rows leaf partials (consumed), divided by p.divisor for
// a mean (the canonical NaN for 0 / 0 without a weight or probabilities); with them (p.kind not
// PLAIN) every NaN canonical. One thread.
kernel void mt_k_ce_total(device float *partials [[buffer(0)]], device float *out [[buffer(1)]],
                          constant mt_mtl_ce_params &p [[buffer(2)]], MT_ID_GRID(i)) {
    if (i != 0) return;
    const float total = mt_tree_fold_device(partials, mt_token_leaves(p.rows));
    if (p.kind != MT_MTL_CE_PLAIN) {
        out[0] = mt_canonical_nan(p.op == MT_MTL_CE_MEAN ? total / p.divisor : total);
    } else if (p.op == MT_MTL_CE_MEAN) {
        out[0] = p.divisor != 0.0f ? total / p.divisor : mt_bits_f32(MT_MATH_QNAN);
    } else {
        out[0] = total;
    }
}
