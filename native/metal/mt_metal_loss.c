/* mt_metal_loss.c -- cross-entropy on Metal (contract: native/contracts/loss.md; kernels:
 * mt_metal_loss.metal and the chunk folds of mt_metal_clip.metal). The oracle's order
 * (native/cpu_oracle/mt_cpu_loss.c): the argument checks, the weight's finiteness, the targets
 * (read on the host through the buffers' host addresses: shared storage, integers only), then
 * every row's max and finiteness; a NaN or inf in the logits (then in the probabilities) is
 * refused, naming the first such row, before anything of the caller's is written. Then, with
 * positions, the logits and probabilities are transposed to rows of vocab (bits moved), the
 * mean's divisor and the host scalars are formed as the oracle forms them, the row sums are
 * chunk trees (mt_mtl_row_scalar), and the row losses, the gradient (transposed back) and the
 * token rule over the row losses follow. Index targets without a weight and without positions
 * are one kind among three here (the oracle's mt_cross_entropy), so mt_cross_entropy_nd of that
 * form gives mt_cross_entropy's bits by construction. A dlogits exactly on the logits is taken,
 * as CUDA takes it: every read of a logit by another thread (the max, the sums, x_t of the row
 * losses) is done before mt_k_ce_grad, whose thread reads its own element before writing it. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_loss_args.h"
#include "mt_metal_loss.h"
#include "mt_metal_rows.h"
#include "mt_pinned.h"

uint64_t mt_loss_features(void) { return MT_FEATURE_LOSS; }

/* A call's inputs and outputs as the caller gave them. */
typedef struct {
    float *loss_out, *row_loss, *dlogits;
    const float *logits, *probs, *weight;
    const void *targets;
    int32_t target_bytes, reduction, kind;
    int64_t batch, vocab, inner, rows, ignore_index, num_items, kept;
    float eps;
} ce_call;

/* The loss of no rows: 'sum' 0, 'mean' 0 / D (D = num_items, or 0 counted: the canonical NaN). */
static void empty_loss(const ce_call *c) {
    if (c->reduction == MT_REDUCTION_NONE) return;
    const float d = (float)c->num_items;
    *c->loss_out = c->reduction == MT_REDUCTION_SUM ? 0.0f : d != 0.0f ? 0.0f / d : mt_bits_f32(MT_MATH_QNAN);
}

/* dst <- the batch matrices of rows x cols of src, each transposed. */
static int transpose(const mt_mtl_arg *dst, const mt_mtl_arg *src, int64_t batch, int64_t rows, int64_t cols) {
    mt_mtl_transpose_params p = {batch, rows, cols};
    mt_mtl_arg args[3] = {*dst, *src};
    return mt_mtl_launch_with("mt_k_ce_transpose", args, 3, &p, sizeof p, batch * rows * cols);
}

/* *out (a scratch of one float, read by the host) <- the token rule over the n floats of v, then
 * mt_k_ce_total's reduction by p->op (kind and divisor as p's). */
static int token_total(mt_mtl_call *call, const mt_mtl_arg *out, const mt_mtl_arg *v, int64_t n,
                       mt_mtl_ce_params p) {
    const int64_t leaves = mt_token_leaves(n);
    mt_mtl_arg partials;
    mt_mtl_count_params count = {n};
    int rc = mt_mtl_scratch(call, &partials, (leaves ? leaves : 1) * 4, NULL);
    if (rc) return rc;
    mt_mtl_arg args[3] = {*v, partials};
    if (leaves > 0 && (rc = mt_mtl_launch_with("mt_k_token_leaves", args, 3, &count, sizeof count, leaves))) return rc;
    p.rows = n;
    mt_mtl_arg total[3] = {partials, *out};
    return mt_mtl_launch_with("mt_k_ce_total", total, 3, &p, sizeof p, 1);
}

/* The first refused row after the max pass (logits first, then probabilities), or MT_OK. */
static int refuse_rows(const ce_call *c, const int32_t *flags) {
    for (int32_t flag = 1; flag <= 2; ++flag)
        for (int64_t r = 0; r < c->rows; ++r)
            if (flags[r] == flag) return mt_fail_nonfinite_nd(flag == 2, r, c->inner, NULL);
    return MT_OK;
}

/* D: num_items, the count (index targets), the row count (probabilities) or the token rule over
 * the rows' target weights (a weight), as the oracle's. */
static int divisor_of(mt_mtl_call *call, const ce_call *c, const mt_mtl_arg *targets, const mt_mtl_arg *w,
                      mt_mtl_ce_params p, float *divisor) {
    if (c->num_items || c->kind != MT_MTL_CE_WEIGHTED) {
        *divisor = (float)(c->num_items ? c->num_items : c->kind == MT_MTL_CE_PROBS ? c->rows : c->kept);
        return MT_OK;
    }
    mt_mtl_arg v, out;
    float *host;
    int rc;
    if ((rc = mt_mtl_scratch(call, &v, c->rows * 4, NULL)) || (rc = mt_mtl_scratch(call, &out, 4, (void **)&host)))
        return rc;
    mt_mtl_arg args[4] = {*targets, *w, v};
    if ((rc = mt_mtl_launch_with("mt_k_ce_target_weights", args, 4, &p, sizeof p, c->rows))) return rc;
    p.kind = MT_MTL_CE_PLAIN;      /* the sum as it is: no division, no NaN rewritten */
    p.op = MT_MTL_CE_SUM;
    if ((rc = token_total(call, &out, &v, c->rows, p))) return rc;
    *divisor = *host;
    return MT_OK;
}

/* The rows' sums of the call's kind: s (the softmax denominator) always; sa: the logits' sum
 * (smoothing), SW (a weight, smoothing) or C (probabilities); sb: CX (probabilities). */
static int row_sums(mt_mtl_call *call, const ce_call *c, const mt_mtl_arg *x, const mt_mtl_arg *w,
                    const mt_mtl_arg *coef, const mt_mtl_arg *max, mt_mtl_arg *s, mt_mtl_arg *sa, mt_mtl_arg *sb) {
    mt_mtl_rms_params p = mt_mtl_rows_params(c->rows, c->vocab, 0.0f, 0, 0);
    int rc = mt_mtl_row_scalar(call, s, MT_MTL_FOLD_EXP, MT_MTL_ROW_SUM, MT_SAB_LOSS, x, NULL, NULL, max, NULL, p);
    if (rc) return rc;
    *sa = *sb = *s;    /* unread placeholders where the kind has no such sum */
    if (c->kind == MT_MTL_CE_PROBS) {
        if ((rc = mt_mtl_row_scalar(call, sa, MT_MTL_FOLD_SUM, MT_MTL_ROW_SUM, MT_SAB_LOSS, coef, NULL, NULL, NULL,
                                    NULL, p)))
            return rc;
        return mt_mtl_row_scalar(call, sb, MT_MTL_FOLD_YX, MT_MTL_ROW_SUM, MT_SAB_LOSS, x, coef, NULL, NULL, NULL, p);
    }
    if (c->eps == 0.0f) return MT_OK;
    return mt_mtl_row_scalar(call, sa, c->kind == MT_MTL_CE_WEIGHTED ? MT_MTL_FOLD_WX : MT_MTL_FOLD_SUM,
                             MT_MTL_ROW_SUM, MT_SAB_LOSS, x, NULL, w, NULL, NULL, p);
}

/* W / V of a weight with smoothing (the chunk tree over the weight, then one division), else +0.0. */
static int weight_mean(mt_mtl_call *call, const ce_call *c, const mt_mtl_arg *w, float vocab, float *wm) {
    *wm = 0.0f;
    if (c->kind != MT_MTL_CE_WEIGHTED || c->eps == 0.0f) return MT_OK;
    mt_mtl_arg sum;
    mt_mtl_rms_params p = mt_mtl_rows_params(1, c->vocab, 0.0f, 0, 0);
    int rc = mt_mtl_row_scalar(call, &sum, MT_MTL_FOLD_SUM, MT_MTL_ROW_SUM, MT_SAB_LOSS, w, NULL, NULL, NULL, NULL, p);
    if (rc) return rc;
    *wm = *(const float *)mt_mtl_contents(call, &sum) / vocab;
    return MT_OK;
}

/* Everything of a call after its checks that read no tensor and the targets' check (c->kept
 * counted), its buffers bound: x, y, w, t as the kind reads them; the rows' losses into rl, the
 * gradient into d (NULL: none; it may be x itself), the loss into lo (NULL: none). Refusals
 * come before any of them is written. */
static int ce_bound(mt_mtl_call *call, const ce_call *c, const mt_mtl_arg *x, const mt_mtl_arg *y,
                    const mt_mtl_arg *w, const mt_mtl_arg *t, const mt_mtl_arg *rl, const mt_mtl_arg *d,
                    const mt_mtl_arg *lo) {
    int rc;
    const int64_t n = c->rows * c->vocab;
    mt_mtl_arg max, flags, coef, s, sa, sb, xr = *x, yr = *y, dr;
    int32_t *hflags;
    const int probs = c->kind == MT_MTL_CE_PROBS, positions = c->inner > 1;
    if ((rc = mt_mtl_scratch(call, &max, c->rows * 4, NULL)) ||
        (rc = mt_mtl_scratch(call, &flags, c->rows * 4, (void **)&hflags)))
        return rc;
    if (positions && ((rc = mt_mtl_scratch(call, &xr, n * 4, NULL)) || (rc = transpose(&xr, x, c->batch, c->vocab, c->inner)) ||
                      (probs && ((rc = mt_mtl_scratch(call, &yr, n * 4, NULL)) ||
                                 (rc = transpose(&yr, y, c->batch, c->vocab, c->inner))))))
        return rc;
    mt_mtl_ce_params p = {c->rows, c->vocab, c->ignore_index, {0}, 0.0f, 1.0f, c->kind, c->target_bytes,
                          c->weight != NULL, c->reduction == MT_REDUCTION_MEAN ? MT_MTL_CE_MEAN : MT_MTL_CE_SUM};
    {
        mt_mtl_arg args[5] = {xr, yr, max, flags};
        if ((rc = mt_mtl_launch_with("mt_k_ce_row_max", args, 5, &p, sizeof p, c->rows)) || (rc = refuse_rows(c, hflags)))
            return rc;
    }
    if ((rc = divisor_of(call, c, t, w, p, &p.divisor))) return rc;
    p.c = mt_ce_scalars_for(c->eps, c->vocab, c->reduction == MT_REDUCTION_MEAN, p.divisor);
    if ((rc = weight_mean(call, c, w, p.c.vocab, &p.wm))) return rc;
    coef = xr;
    if (probs) {
        if ((rc = mt_mtl_scratch(call, &coef, n * 4, NULL))) return rc;
        mt_mtl_arg args[4] = {yr, *w, coef};
        if ((rc = mt_mtl_launch_with("mt_k_ce_coef", args, 4, &p, sizeof p, n))) return rc;
    }
    if ((rc = row_sums(call, c, &xr, w, &coef, &max, &s, &sa, &sb))) return rc;
    {
        mt_mtl_arg args[9] = {xr, *t, *w, max, s, sa, sb, *rl};
        if ((rc = mt_mtl_launch_with("mt_k_ce_row_loss", args, 9, &p, sizeof p, c->rows))) return rc;
    }
    if (d) {
        dr = *d;
        if (positions && (rc = mt_mtl_scratch(call, &dr, n * 4, NULL))) return rc;
        mt_mtl_arg args[9] = {xr, *t, *w, coef, max, s, sa, dr};
        if ((rc = mt_mtl_launch_with("mt_k_ce_grad", args, 9, &p, sizeof p, n)) ||
            (positions && (rc = transpose(d, &dr, c->batch, c->inner, c->vocab))))
            return rc;
    }
    return lo ? token_total(call, lo, rl, c->rows, p) : MT_OK;
}

/* A call of some rows: its buffers bound (the caller's, or their twins), then ce_bound. */
static int ce_run(const ce_call *c) {
    int rc;
    if (c->rows == 0) {
        empty_loss(c);
        return MT_OK;
    }
    if ((rc = mt_mtl_open())) return rc;
    const int64_t n = c->rows * c->vocab;
    const int probs = c->kind == MT_MTL_CE_PROBS;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg x, y, w, t, d, rl, lo;
    if ((rc = mt_mtl_stage(&call, &x, c->logits, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &y, c->probs, probs ? n * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &w, c->weight, c->weight ? c->vocab * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &t, c->targets, probs ? 0 : c->rows * c->target_bytes, MT_MTL_IN, NULL)) ||
        (rc = c->row_loss ? mt_mtl_stage(&call, &rl, c->row_loss, c->rows * 4, MT_MTL_OUT, NULL)
                          : mt_mtl_scratch(&call, &rl, c->rows * 4, NULL)) ||
        (c->dlogits && (rc = mt_mtl_stage(&call, &d, c->dlogits, n * 4, MT_MTL_OUT, NULL))) ||
        (c->reduction != MT_REDUCTION_NONE && (rc = mt_mtl_stage(&call, &lo, c->loss_out, 4, MT_MTL_OUT, NULL))))
        goto done;
    rc = ce_bound(&call, c, &x, &y, &w, &t, &rl, c->dlogits ? &d : NULL, c->reduction != MT_REDUCTION_NONE ? &lo : NULL);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_mtl_ce_rows(mt_mtl_call *call, const mt_mtl_arg *x, const mt_mtl_arg *t, const mt_mtl_arg *rl,
                   const mt_mtl_arg *d, int64_t rows, int64_t vocab, int32_t target_bytes, int64_t ignore_index,
                   int32_t reduction, float label_smoothing, int64_t items) {
    ce_call c = {NULL, NULL, NULL, NULL, NULL, NULL, NULL, target_bytes, reduction, MT_MTL_CE_PLAIN,
                 rows, vocab, 1, rows, ignore_index, items, items, label_smoothing};
    mt_mtl_arg w;
    int rc = mt_mtl_stage(call, &w, NULL, 0, MT_MTL_IN, NULL);
    return rc ? rc : ce_bound(call, &c, x, x, &w, t, rl, d, NULL);
}

int mt_mtl_ce_total(mt_mtl_call *call, const mt_mtl_arg *lo, const mt_mtl_arg *v, int64_t n, int32_t reduction,
                    float divisor) {
    mt_mtl_ce_params p = {n, 1, 0, {0}, 0.0f, divisor, MT_MTL_CE_PLAIN, 4, 0,
                          reduction == MT_REDUCTION_MEAN ? MT_MTL_CE_MEAN : MT_MTL_CE_SUM};
    return token_total(call, lo, v, n, p);
}

MT_NOINLINE static int ce_body(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                               const void *targets, int32_t target_bytes, int64_t n_rows, int64_t vocab,
                               int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    ce_call c = {loss_out, row_loss, dlogits, logits, NULL, NULL, targets, target_bytes, reduction, MT_MTL_CE_PLAIN,
                 n_rows, vocab, 1, n_rows, ignore_index, num_items, 0, label_smoothing};
    if ((rc = mt_check_ce_args(loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab, reduction,
                               label_smoothing, num_items)) ||
        (rc = mt_check_ce_dlogits(dlogits, logits, targets, target_bytes, n_rows, vocab, 1)) ||
        (rc = mt_check_targets(&c.kept, targets, target_bytes, n_rows, vocab, ignore_index)))
        return rc;
    return ce_run(&c);
}

int mt_cross_entropy(float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets,
                     int32_t target_bytes, int64_t n_rows, int64_t vocab, int64_t ignore_index, int32_t reduction,
                     float label_smoothing, int64_t num_items) {
    MT_RETURN_IN_FP_ENV(ce_body(loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab, ignore_index,
                                reduction, label_smoothing, num_items));
}

MT_NOINLINE static int ce_nd_body(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                                  const void *targets, const float *probs, const float *weight, int32_t target_bytes,
                                  int64_t n_batch, int64_t vocab, int64_t inner, int64_t ignore_index,
                                  int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    int64_t rows = 0, bad;
    if ((rc = mt_check_ce_nd_args(&rows, loss_out, row_loss, dlogits, logits, targets, probs, weight, target_bytes,
                                  n_batch, vocab, inner, reduction, label_smoothing, num_items)))
        return rc;
    if (rows > 0 && weight && (bad = mt_first_nonfinite_float(weight, vocab)) >= 0) return mt_fail_nonfinite_weight(bad);
    if (target_bytes && !weight && inner == 1)
        return ce_body(loss_out, row_loss, dlogits, logits, targets, target_bytes, rows, vocab, ignore_index, reduction,
                       label_smoothing, num_items);
    ce_call c = {loss_out, row_loss, dlogits, logits, probs, weight, targets, target_bytes, reduction,
                 !target_bytes ? MT_MTL_CE_PROBS : weight ? MT_MTL_CE_WEIGHTED : MT_MTL_CE_PLAIN,
                 n_batch, vocab, inner, rows, ignore_index, num_items, 0, label_smoothing};
    if (target_bytes && (rc = mt_check_targets(&c.kept, targets, target_bytes, rows, vocab, ignore_index))) return rc;
    if (rows == 0) {       /* 'sum' 0; 'mean' 0 / D: the canonical NaN without num_items */
        if (reduction != MT_REDUCTION_NONE)
            *loss_out = reduction == MT_REDUCTION_SUM ? 0.0f : mt_canonical_nan(0.0f / (float)num_items);
        return MT_OK;
    }
    return ce_run(&c);
}

int mt_cross_entropy_nd(float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets,
                        const float *target_probs, const float *weight, int32_t target_bytes, int64_t n_batch,
                        int64_t vocab, int64_t inner, int64_t ignore_index, int32_t reduction, float label_smoothing,
                        int64_t num_items) {
    MT_RETURN_IN_FP_ENV(ce_nd_body(loss_out, row_loss, dlogits, logits, targets, target_probs, weight, target_bytes,
                                   n_batch, vocab, inner, ignore_index, reduction, label_smoothing, num_items));
}
