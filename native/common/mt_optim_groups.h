/* mt_optim_groups.h -- what every vendor's grouped optimizer steps share on the host (contract:
 * native/contracts/optim.md, "Param groups"): the checks of a grouped call's arguments, run
 * before any work so that a refused call writes nothing, and the host scalars of its tensors.
 * The flat calls (mt_sgd_step, mt_adam_step, mt_adamw_step) are defined in mt_optim_groups.c for
 * every vendor, as one group of the vendor's mt_*_step_groups.
 */
#ifndef MT_OPTIM_GROUPS_H
#define MT_OPTIM_GROUPS_H
#include <stdint.h>
#include "mojo_train.h"
#include "mt_pinned.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A registry whose tensors may be empty: n_tensors >= 1, offsets[0] == 0 and non-decreasing,
 * table[j] non-NULL wherever tensor j holds elements. */
int mt_check_group_registry(float *const *table, const int32_t *offsets, int32_t n_tensors, const char *name);

/* Every argument of mt_adam_step_groups / mt_sgd_step_groups, in one order for every vendor. */
int mt_check_adam_groups(float *const *params, float *const *grads, float *const *exp_avg,
                         float *const *exp_avg_sq, float *const *max_exp_avg_sq, const int64_t *steps,
                         const float *norm_out, const int32_t *offsets, const mt_adam_group *groups,
                         const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                         int32_t n_tensors);
int mt_check_sgd_groups(float *const *params, float *const *grads, float *const *momentum_buffer,
                        const int32_t *buf_initialized, const float *norm_out, const int32_t *offsets,
                        const mt_sgd_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                        int32_t n_groups, int32_t n_tensors);

/* Whether tensor j uses an optional state table: its group asks for it and it holds elements. */
int mt_adam_uses_max(const mt_adam_group *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t j);
int mt_sgd_uses_buf(const mt_sgd_group *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t j);

/* The host scalars of an Adam step: variants[k] for each run of consecutive tensors with the same
 * (group, step), variant_of[j] = the run of tensor j; returns the number of runs (<= n_tensors).
 * Callers bracket it with mt_fp_begin / mt_fp_end (it is out of line). */
int32_t mt_adam_plan(mt_adam_scalars *variants /* (n_tensors) */, int32_t *variant_of /* (n_tensors) */,
                     const mt_adam_group *groups, const int32_t *tensor_group, const int64_t *steps,
                     int32_t n_tensors);
/* SGD's: one set per group. */
void mt_sgd_plan(mt_sgd_scalars *out /* (n_groups) */, const mt_sgd_group *groups, int32_t n_groups);

/* After a successful step: steps[j] += 1 (Adam); buf_initialized[j] = 1 where the group has
 * momentum (SGD). */
void mt_adam_advance(int64_t *steps, int32_t n_tensors);
void mt_sgd_mark(int32_t *buf_initialized, const mt_sgd_group *groups, const int32_t *tensor_group,
                 int32_t n_tensors);

#ifdef __cplusplus
}
#endif
#endif
