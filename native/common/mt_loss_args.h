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

/* The refusal of weight[j] (NaN or inf): MT_ENONFINITE. */
int mt_fail_nonfinite_weight(int64_t j);

/* The refusal of row r whose logits (probs 0) or probabilities (probs 1) hold NaN or inf:
 * MT_ENONFINITE; with inner 1 and logits, mt_cross_entropy's message. */
int mt_fail_nonfinite_nd(int probs, int64_t row, int64_t inner);

/* The first j < n with x[j] NaN or inf (a host buffer), or -1. */
int64_t mt_first_nonfinite_float(const float *x, int64_t n);

#ifdef __cplusplus
}
#endif
#endif
