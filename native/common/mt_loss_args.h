/* mt_loss_args.h -- mt_cross_entropy_nd's argument checks and refusal messages, one copy for
 * every vendor (contract: native/contracts/loss.md, "Weights, probability targets and
 * positions"). Pointers may be device pointers: only their values are compared. */
#ifndef MT_LOSS_ARGS_H
#define MT_LOSS_ARGS_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Every argument check of mt_cross_entropy_nd that reads no tensor, in the oracle's order; on
 * success *rows = n_batch * inner. */
int mt_check_ce_nd_args(int64_t *rows, const float *loss_out, const float *row_loss, const float *dlogits,
                        const float *logits, const void *targets, const float *target_probs, const float *weight,
                        int32_t target_bytes, int64_t n_batch, int64_t vocab, int64_t inner, int32_t reduction,
                        float label_smoothing, int64_t num_items);

/* mt_cross_entropy's dlogits (NULL: MT_OK) against the logits and the targets, every vendor:
 * on the logits exactly is MT_OK only with in_place_ok (a GPU computes it in place; the oracle
 * refuses it), any other overlap is MT_EINVAL naming it. */
int mt_check_ce_dlogits(const float *dlogits, const float *logits, const void *targets, int32_t target_bytes,
                        int64_t n_rows, int64_t vocab, int in_place_ok);

/* The refusal of weight[j] (NaN or inf): MT_ENONFINITE. */
int mt_fail_nonfinite_weight(int64_t j);

/* What a call refused after its one pass may have left written of the caller's own buffers,
 * named in the refusal: "dlogits and row_loss", one of them, or NULL (nothing: neither was
 * passed, or a GPU computed them in device twins of host buffers that it never downloads). */
const char *mt_ce_written(int dlogits, int row_loss);

/* The refusal of row r whose logits (probs 0) or probabilities (probs 1) hold NaN or inf:
 * MT_ENONFINITE; with inner 1 and logits, mt_cross_entropy's message. `written`: as
 * mt_ce_written's (NULL: "nothing was written"). */
int mt_fail_nonfinite_nd(int probs, int64_t row, int64_t inner, const char *written);

/* The first j < n with x[j] NaN or inf (a host buffer), or -1. */
int64_t mt_first_nonfinite_float(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
