/* mt_pinned_layers.h -- part of mt_pinned.h (the one definition of every pinned routine): the per-element steps of the losses and dense layers: the token rule's folds, cross-entropy, RMSNorm, LayerNorm, ReLU, attention.
 * Included by mt_pinned.h after its core (bits, trees, optimizer updates, Philox), in the order
 * math, layers, elementwise, each part using only what comes before it; including a part alone
 * includes mt_pinned.h first. */
#ifndef MT_PINNED_LAYERS_H
#define MT_PINNED_LAYERS_H
#include "mt_pinned.h"

/* ==== losses and dense layers (contracts: native/contracts/loss.md, linear.md, rms_norm.md)
 * The per-element arithmetic every vendor shares. Loop schedules (which thread folds which
 * lane, which block owns which leaf) belong to the vendors; the trees they must realise are
 * the chunk tree above (along a row) and the token rule below (across rows). */

/* Sabotage switches of these ops (make SABOTAGE=loss|linear|rms_norm|lm_head): 1 reverses
 * an order or contracts where the contract forbids it; a switch in a shared step (e.g. the dot
 * step of linear) reaches every op that uses that step (RMSNorm's dweight, the LM head). */
#ifdef MT_SABOTAGE_LOSS
#define MT_SAB_LOSS 1
#else
#define MT_SAB_LOSS 0
#endif
#ifdef MT_SABOTAGE_RMS_NORM
#define MT_SAB_RMS_NORM 1
#else
#define MT_SAB_RMS_NORM 0
#endif
#ifdef MT_SABOTAGE_LM_HEAD
#define MT_SAB_LM_HEAD 1
#else
#define MT_SAB_LM_HEAD 0
#endif

/* One step of every dot-product chain (GEMMs, token contractions): acc = fma(a, b, acc),
 * one rounding. The linear sabotage rounds the product first. */
#ifdef MT_SABOTAGE_LINEAR
#define MT_DOT_STEP(a, b, acc) ((a) * (b) + (acc))
#else
#define MT_DOT_STEP(a, b, acc) fmaf((a), (b), (acc))
#endif

/* A chunk fold (n <= MT_CHUNK elements): lane l folds elements l, l + MT_LANES, ... from
 * +0.0 with STEP(acc, i), then the lane tree. REVERSED (a sabotage switch) walks the rows
 * backwards. Defines `MT_HD_INLINE float NAME(int64_t n, ARGS...)`: inlined, so the CPU
 * oracle's target clones run its fmaf as an instruction (as a call compiled for the baseline
 * x86-64 it was a libm call per element: 6x slower RMSNorm, the same bits). */
#if MT_METAL   /* the folds walk the caller's arrays: Metal's kernels fold device memory themselves */
#define MT_DEFINE_CHUNK_FOLD(NAME, REVERSED, STEP, ...)
#else
#define MT_DEFINE_CHUNK_FOLD(NAME, REVERSED, STEP, ...)                                   \
    MT_HD_INLINE float NAME(int64_t n, __VA_ARGS__) {                                            \
        float acc[MT_LANES];                                                                \
        for (int l = 0; l < MT_LANES; ++l) acc[l] = 0.0f;                                   \
        int64_t full = n / MT_LANES;                                                        \
        for (int64_t rr = 0; rr < full; ++rr) {                                             \
            int64_t r = (REVERSED) ? full - 1 - rr : rr;                                    \
            for (int l = 0; l < MT_LANES; ++l) STEP(acc[l], r * MT_LANES + l);              \
        }                                                                                   \
        for (int64_t l = 0; l < n - full * MT_LANES; ++l) STEP(acc[l], full * MT_LANES + l); \
        return mt_lane_tree(acc);                                                           \
    }
#endif

/* sum of e^(x_i - m): the softmax denominator of one chunk of a row. Each term also goes to
 * e[i] unless e is NULL; mid (every x_i - m in mt_expf_mid's range) takes mt_expf_mid, the
 * same bits. Call it with e and mid known (a constant, or under a test of them) so that the
 * compiler folds both out of the loop: each case then vectorizes on its own. */
MT_HD float mt_exp_term(float v, MT_THREAD float *e, int64_t i, int mid) {
    float t = mid ? mt_expf_mid(v) : mt_expf(v);
    if (e) e[i] = t;
    return t;
}
#define MT_STEP_SUM_EXP(acc, i) (acc) = (acc) + mt_exp_term(x[i] - m, e, i, mid)
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_exp, MT_SAB_LOSS, MT_STEP_SUM_EXP, const float *x, float m, float *e, int mid)
/* sum of x_i (label smoothing's mean logit) */
#define MT_STEP_SUM(acc, i) (acc) = (acc) + x[i]
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum, MT_SAB_LOSS, MT_STEP_SUM, const float *x)
/* sum of x_i^2 (RMSNorm's mean square): fma(x, x, acc) as in the clip tree */
#define MT_STEP_SUMSQ(acc, i) (acc) = fmaf(x[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sumsq_rms, MT_SAB_RMS_NORM, MT_STEP_SUMSQ, const float *x)
/* sum of |x_i| (the clip's 1-norm, clip.md): the clip tree with acc + |x| */
#define MT_STEP_SUMABS(acc, i) (acc) = (acc) + fabsf(x[i])
MT_DEFINE_CHUNK_FOLD(mt_chunk_sumabs, MT_SAB_CLIP, MT_STEP_SUMABS, const float *x)
/* sum of (dy_i * w_i) * x_i (RMSNorm backward's row dot); w may be NULL (all ones) */
#define MT_STEP_GDOT(acc, i) (acc) = fmaf(w ? dy[i] * w[i] : dy[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_rms_dot, MT_SAB_RMS_NORM, MT_STEP_GDOT, const float *dy, const float *w,
                     const float *x)

/* ---- the token rule (every contraction over tokens/rows) ----------------------------------
 * Tokens are cut into leaves of MT_TOKEN_LEAF (the last may be short). A leaf's partial
 * starts at +0.0 and folds its tokens in ascending order (MT_DOT_STEP for products, + for
 * single terms); the partials meet in the pairwise tree of mt_tree_fold. That tree equals
 * "split off the largest power of two on the left, recurse on the rest", so it can also be
 * built on the fly with a stack of complete subtrees (mt_token_stack) in log2 memory. */
#define MT_TOKEN_LEAF 1024

MT_HD int64_t mt_token_leaves(int64_t tokens) { return (tokens + MT_TOKEN_LEAF - 1) / MT_TOKEN_LEAF; }

/* The pairwise tree over leaf partials; `reversed` (a sabotage switch) folds leaves
 * right to left, which must change bits. */
MT_HD float mt_token_tree(MT_THREAD float *s, int64_t m, int reversed) {
    if (reversed) {
        float acc = m > 0 ? s[m - 1] : 0.0f;
        for (int64_t k = m - 2; k >= 0; --k) acc = s[k] + acc;
        return acc;
    }
    return mt_tree_fold(s, m);
}

/* make SABOTAGE=accumulate (contract: native/contracts/accumulate.md): the stack of complete
 * subtrees over microbatches folds from its bottom, ((S_0 + S_1) + S_2) + ..., instead of
 * from its top; a count with three or more one bits (7, 11, 13, ...) must change bits. */
#ifdef MT_SABOTAGE_ACCUMULATE
#define MT_SAB_ACCUMULATE 1
#else
#define MT_SAB_ACCUMULATE 0
#endif

/* ---- cross-entropy ------------------------------------------------------------------------ */
typedef struct {
    float g;      /* gradient scale: 1 (sum) or 1 / D (mean) */
    float off;    /* smoothed target of a non-target class: eps / V (0 without smoothing) */
    float hit;    /* smoothed target of the target class: (1 - eps) + off */
    float keep;   /* 1 - eps */
    float eps;
    float vocab;  /* V as a float (V < 2^24, exact) */
} mt_ce_scalars;

/* Host side, once per call. divisor is D for the mean (any value for the other reductions). */
MT_HD mt_ce_scalars mt_ce_scalars_for(float eps, int64_t vocab, int32_t mean, float divisor) {
    mt_ce_scalars c;
    c.eps = eps;
    c.vocab = (float)vocab;
    c.keep = 1.0f - eps;
    c.off = eps / c.vocab;
    c.hit = c.keep + c.off;
    c.g = mean ? 1.0f / divisor : 1.0f;
    return c;
}

/* A row's loss from its max m, softmax denominator s, target logit xt and (smoothing only)
 * the tree sum of its logits. */
MT_HD float mt_ce_row_loss(float m, float s, float xt, float sum_x, MT_THREAD const mt_ce_scalars *c) {
    float lse = m + mt_logf(s);
    float nll = lse - xt;
    if (c->eps == 0.0f) return nll;
    float smooth = lse - sum_x / c->vocab;
    return c->keep * nll + c->eps * smooth;
}

/* d loss / d x_j of a non-ignored row: e = e^(x_j - m) as in the denominator's fold. */
MT_HD float mt_ce_grad(float e, float s, int is_target, MT_THREAD const mt_ce_scalars *c) {
    float p = e / s;
    return (p - (is_target ? c->hit : c->off)) * c->g;
}

/* ---- cross-entropy with a class weight or probability targets (mt_cross_entropy_nd; loss.md,
 * "Weights, probability targets and positions"). Every NaN these write is the canonical one
 * (mt_canonical_nan). */

/* c_i = w_i * y'_i of a probability target: y'_i = y_i, or keep * y_i + off with smoothing;
 * w NULL: no weight (a product by 1 would be exact). */
#if !MT_METAL
MT_HD float mt_ce_coef(const float *y, const float *w, int64_t i, MT_THREAD const mt_ce_scalars *c) {
    float v = c->eps != 0.0f ? c->keep * y[i] + c->off : y[i];
    return w ? w[i] * v : v;
}
#endif
/* sum of w_i x_i, fma steps (weighted smoothing); sum of c_i; sum of c_i x_i, fma steps */
#define MT_STEP_SUM_WX(acc, i) (acc) = fmaf(w[i], x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_wx, MT_SAB_LOSS, MT_STEP_SUM_WX, const float *x, const float *w)
#define MT_STEP_SUM_COEF(acc, i) (acc) = (acc) + mt_ce_coef(y, w, (i), c)
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_coef, MT_SAB_LOSS, MT_STEP_SUM_COEF, const float *y, const float *w,
                     MT_THREAD const mt_ce_scalars *c)
#define MT_STEP_SUM_COEF_X(acc, i) (acc) = fmaf(mt_ce_coef(y, w, (i), c), x[i], (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_sum_coef_x, MT_SAB_LOSS, MT_STEP_SUM_COEF_X, const float *x, const float *y,
                     const float *w, MT_THREAD const mt_ce_scalars *c)

/* A row's loss, index target t with weight: wt = w_t, sw = the fold of w_j x_j (smoothing
 * only), wm = W / V (+0.0 without smoothing). */
MT_HD float mt_ce_row_loss_w(float m, float s, float xt, float wt, float sw, float wm, MT_THREAD const mt_ce_scalars *c) {
    float lse = m + mt_logf(s);
    float wnll = wt * (lse - xt);
    if (c->eps == 0.0f) return mt_canonical_nan(wnll);
    float smooth = fmaf(lse, wm, -(sw / c->vocab));
    return mt_canonical_nan(c->keep * wnll + c->eps * smooth);
}

/* A row's loss, probability targets: fma(lse, C, -CX) with C, CX the folds of c_j, c_j x_j. */
MT_HD float mt_ce_row_loss_p(float m, float s, float csum, float cx) {
    return mt_canonical_nan(fmaf(m + mt_logf(s), csum, -cx));
}

/* The softmax factor A of a weighted index row and its target's y_t, from kt = keep * w_t. */
MT_HD float mt_ce_factor_w(float kt, float wm, MT_THREAD const mt_ce_scalars *c) { return kt + c->eps * wm; }
MT_HD float mt_ce_target_w(float kt, float wt, MT_THREAD const mt_ce_scalars *c) { return kt + c->off * wt; }

/* d loss / d x_j: fma(e / s, a, -y) * g (weighted index: a = A, y = y_j; probabilities: a = C,
 * y = c_j); e as in the denominator's fold. */
MT_HD float mt_ce_grad_nd(float e, float s, float a, float y, float g) {
    return mt_canonical_nan(fmaf(e / s, a, -y) * g);
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */
/* 1 / sqrt(ss / dim + eps) from a row's sum of squares: three roundings and a division. */
MT_HD float mt_rms_rstd(float ss, float dimf, float eps) { return 1.0f / sqrtf(ss / dimf + eps); }

/* dx_i = r * g_i - k * x_i with g_i = dy_i * w_i and k = (c / dim) * (r * r * r). Outputs are
 * written through mt_canonical_nan: finite inputs can still give a NaN (r = inf on a zero row with
 * eps = 0; inf - inf when r**3 overflows), and the vendors' NaNs differ in sign and payload. */
MT_HD float mt_rms_k(float c, float dimf, float r) { return (c / dimf) * ((r * r) * r); }
MT_HD float mt_rms_dx(float dy, float w, float x, float r, float k) { return mt_canonical_nan(r * (dy * w) - k * x); }
MT_HD float mt_rms_y(float x, float r, float w) { return mt_canonical_nan((x * r) * w); }   /* no weight: w = 1 */

/* ---- LayerNorm (contract: native/contracts/layer_norm.md) --------------------------------
 * Per row: mu = (chunk tree of x) / D; var = (chunk tree of fma(x - mu, x - mu, acc)) / D
 * (two-pass); r = mt_rms_rstd(var's sum, D, eps); xhat = (x - mu) * r; y = fma(xhat, w, b),
 * w = 1 and b = -0.0 where there is no weight / bias (fma(xhat, 1, b) = xhat + b and
 * fma(xhat, w, -0.0) = xhat * w, bit for bit). make SABOTAGE=layer_norm walks the row
 * chunks' lane rows backwards. */
#ifdef MT_SABOTAGE_LAYER_NORM
#define MT_SAB_LAYER_NORM 1
#else
#define MT_SAB_LAYER_NORM 0
#endif
MT_HD float mt_ln_mean(float s, float dimf) { return s / dimf; }
MT_HD float mt_ln_xhat(float x, float mu, float r) { return (x - mu) * r; }
/* y and dx are written through mt_canonical_nan (RMSNorm's rule: eps = 0 on a constant row gives
 * 0 * inf) */
MT_HD float mt_ln_y(float x, float mu, float r, float w, float b) {
    return mt_canonical_nan(fmaf(mt_ln_xhat(x, mu, r), w, b));
}
/* dx_i = r * ((g_i - mg) - xhat_i * mgx), g_i = dy_i * w_i, mg = sum(g) / D, mgx = sum(g xhat) / D */
MT_HD float mt_ln_dx(float dy, float w, float x, float mu, float r, float mg, float mgx) {
    return mt_canonical_nan(r * ((dy * w - mg) - mt_ln_xhat(x, mu, r) * mgx));
}
/* The row folds: sum of x; of (x - mu)^2 by fma; of g = dy * w (w NULL: dy); of g * xhat by fma. */
#define MT_STEP_LN_SUM(acc, i) (acc) = (acc) + x[i]
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_sum, MT_SAB_LAYER_NORM, MT_STEP_LN_SUM, const float *x)
#define MT_STEP_LN_DEVSQ(acc, i) (acc) = fmaf(x[i] - mu, x[i] - mu, (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_devsq, MT_SAB_LAYER_NORM, MT_STEP_LN_DEVSQ, const float *x, float mu)
#define MT_STEP_LN_G(acc, i) (acc) = (acc) + (w ? dy[i] * w[i] : dy[i])
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_g, MT_SAB_LAYER_NORM, MT_STEP_LN_G, const float *dy, const float *w)
/* (rstd, not r: the fold's own row index is r) */
#define MT_STEP_LN_GX(acc, i) (acc) = fmaf(w ? dy[i] * w[i] : dy[i], mt_ln_xhat(x[i], mu, rstd), (acc))
MT_DEFINE_CHUNK_FOLD(mt_chunk_ln_gx, MT_SAB_LAYER_NORM, MT_STEP_LN_GX, const float *dy, const float *w,
                     const float *x, float mu, float rstd)

/* ---- ReLU --------------------------------------------------------------------------------- */
MT_HD float mt_relu(float x) { return x > 0.0f ? x : 0.0f; }
MT_HD float mt_relu_grad(float dy, float x) { return x > 0.0f ? dy : 0.0f; }
/* ---- attention (contract: native/contracts/attention.md) ---------------------------------
 * The scalar steps of the online softmax and of its backward; the chains (scores, dp, delta,
 * out, dq, dk, dv: MT_DOT_STEP in a stated order) and the block walk are the vendors'.
 * Keys come in blocks of MT_ATTN_KEY_BLOCK; a pair whose score is -inf is masked and takes
 * part in nothing. make SABOTAGE=attention divides through a rounded reciprocal (out) and
 * distributes p over (dp - delta) (ds): each adds a rounding the contract does not have. */
#ifdef MT_SABOTAGE_ATTENTION
#define MT_SAB_ATTENTION 1
#else
#define MT_SAB_ATTENTION 0
#endif
#define MT_ATTN_KEY_BLOCK 64
#define MT_ATTN_MAX_D 128

/* The running maximum with NaN greatest: a NaN score makes its row's maximum NaN whatever
 * order the maxima are taken in (any NaN counts the same; its bits are never written). */
MT_HD float mt_attn_max(float m, float s) { return (s > m || s != s) ? s : m; }

/* out = acc / l, one division; +0 for a fully masked row (l = 0: no live key). */
MT_HD float mt_attn_out(float acc, float l) {
#if MT_SAB_ATTENTION
    float o = acc * (1.0f / l);
#else
    float o = acc / l;
#endif
    return mt_canonical_nan(l == 0.0f ? 0.0f : o);
}

/* lse = m + log(l): -inf + log(0) = -inf for a fully masked row. */
MT_HD float mt_attn_lse(float m, float l) { return mt_canonical_nan(m + mt_logf(l)); }

/* ds = p * (dp - delta), two roundings. */
MT_HD float mt_attn_ds(float p, float dp, float delta) {
#if MT_SAB_ATTENTION
    return p * dp - p * delta;
#else
    return p * (dp - delta);
#endif
}
/* ==== end of losses and dense layers ==================================================== */

#endif /* MT_PINNED_LAYERS_H */
