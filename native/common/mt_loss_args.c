/* mt_loss_args.c -- mt_cross_entropy_nd's argument checks and refusal messages (see
 * mt_loss_args.h), linked by every vendor. */
#include <stdio.h>
#include <string.h>

#include "mt_host.h"
#include "mt_loss_args.h"

/* Exactly one kind of targets, named by target_bytes. */
static int check_target_kind(const void *targets, const float *target_probs, int32_t target_bytes) {
    if (target_bytes == 0) {
        if (targets)
            return mt_fail(MT_EINVAL, "targets must be NULL with target_bytes 0 (probabilities are read from "
                                      "target_probs); pass one kind of targets");
        return MT_OK;
    }
    if (target_bytes != 4 && target_bytes != 8)
        return mt_fail(MT_EINVAL, "target_bytes must be 4 or 8 (class indices in targets) or 0 (probabilities "
                                  "in target_probs), got %d", (int)target_bytes);
    if (target_probs)
        return mt_fail(MT_EINVAL, "target_probs must be NULL with class indices (target_bytes %d); pass one kind "
                                  "of targets", (int)target_bytes);
    return MT_OK;
}

static int overlaps(const float *out, const float *in, int64_t n) {
    return mt_bytes_overlap(out, n * (int64_t)sizeof(float), in, n * (int64_t)sizeof(float));
}

int mt_check_ce_nd_args(int64_t *rows, const float *loss_out, const float *row_loss, const float *dlogits,
                        const float *logits, const void *targets, const float *target_probs, const float *weight,
                        int32_t target_bytes, int64_t n_batch, int64_t vocab, int64_t inner, int32_t reduction,
                        float label_smoothing, int64_t num_items) {
    int rc;
    if ((rc = check_target_kind(targets, target_probs, target_bytes))) return rc;
    if (n_batch < 0) return mt_fail(MT_EINVAL, "n_batch must be >= 0, got %lld", (long long)n_batch);
    if (inner < 1) return mt_fail(MT_EINVAL, "inner must be >= 1 (the product of the positions' sizes), got %lld",
                                  (long long)inner);
    if (n_batch > 0 && inner > INT64_MAX / 4 / n_batch)
        return mt_fail(MT_EINVAL, "n_batch * inner overflows (%lld x %lld)", (long long)n_batch, (long long)inner);
    int64_t n = n_batch * inner;
    if (n > 0 && !target_bytes && !target_probs) return mt_fail(MT_EINVAL, "target_probs is NULL");
    /* the rest as mt_cross_entropy's, over the n rows (the probabilities stand where targets are read) */
    if ((rc = mt_check_ce_args(loss_out, row_loss, dlogits, logits, target_bytes ? targets : (const void *)target_probs,
                               target_bytes ? target_bytes : 4, n, vocab, reduction, label_smoothing, num_items)))
        return rc;
    int64_t elems = n * vocab;
    if (overlaps(dlogits, logits, elems) || overlaps(dlogits, target_probs, elems) || overlaps(dlogits, weight, vocab))
        return mt_fail(MT_EINVAL, "dlogits overlaps %s; dlogits must be a separate buffer",
                       overlaps(dlogits, logits, elems) ? "logits" : overlaps(dlogits, weight, vocab) ? "weight"
                                                                                                  : "target_probs");
    if (target_bytes && mt_bytes_overlap(dlogits, elems * (int64_t)sizeof(float), targets, n * (int64_t)target_bytes))
        return mt_fail(MT_EINVAL, "dlogits overlaps targets; dlogits must be a separate buffer");
    *rows = n;
    return MT_OK;
}

int mt_check_ce_dlogits(const float *dlogits, const float *logits, const void *targets, int32_t target_bytes,
                        int64_t n_rows, int64_t vocab, int in_place_ok) {
    int rc;
    if (!dlogits) return MT_OK;
    if ((rc = mt_check_alias(dlogits, logits, n_rows * vocab, in_place_ok, "dlogits", "logits"))) return rc;
    if (mt_bytes_overlap(dlogits, (int64_t)sizeof(float) * n_rows * vocab, targets, n_rows * (int64_t)target_bytes))
        return mt_fail(MT_EINVAL, "dlogits overlaps targets; pass a buffer of its own for dlogits");
    return MT_OK;
}

int mt_fail_nonfinite_weight(int64_t j) {
    return mt_fail(MT_ENONFINITE, "weight[%lld] is NaN or inf (every class weight must be finite); nothing was "
                   "written", (long long)j);
}

const char *mt_ce_written(int dlogits, int row_loss) {
    return dlogits && row_loss ? "dlogits and row_loss" : dlogits ? "dlogits" : row_loss ? "row_loss" : NULL;
}

/* After the one pass that finds it (the oracle's and a GPU's): what `written` names may hold
 * partial results, loss_out was not written. */
int mt_fail_nonfinite_nd(int probs, int64_t row, int64_t inner, const char *written) {
    const char *what = probs ? "target_probs" : "logits";
    char tail[80];
    if (written) snprintf(tail, sizeof tail, "%s left undefined, loss_out not written", written);
    else snprintf(tail, sizeof tail, "nothing was written");
    if (inner == 1) {
        if (!probs) return mt_fail_nonfinite_logits_after(row, written);
        return mt_fail(MT_ENONFINITE, "%s row %lld holds NaN or inf (every probability must be finite); %s", what,
                       (long long)row, tail);
    }
    return mt_fail(MT_ENONFINITE, "%s[%lld, :, %lld] holds NaN or inf (batch entry %lld, position %lld of %lld, "
                   "positions flattened in row-major order; every value must be finite); %s",
                   what, (long long)(row / inner), (long long)(row % inner), (long long)(row / inner),
                   (long long)(row % inner), (long long)inner, tail);
}

int64_t mt_first_nonfinite_float(const float *x, int64_t n) {
    for (int64_t j = 0; j < n; ++j) {     /* bit tests: no float operation */
        uint32_t u;
        memcpy(&u, x + j, sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u) return j;
    }
    return -1;
}
