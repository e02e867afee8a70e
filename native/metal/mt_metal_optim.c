/* mt_metal_optim.c -- SGD, Adam and AdamW steps, grouped (the flat calls are one group:
 * native/common/mt_optim_groups.c), on Metal (contract: native/contracts/optim.md; kernels:
 * mt_metal_optim.metal). The oracle's order (native/cpu_oracle/mt_cpu_optim.c): the checks; when
 * clipping, the 2-norm's total (mt_metal_clip.h, the clip's own code) and the refusal of a
 * non-finite one, else the refusal of a non-finite gradient; the host scalars; only then one
 * launch per tensor, which writes the gradient (when clipped), the parameter and the state. */
#include <stdlib.h>
#include "mt_host.h"
#include "mt_metal_clip.h"
#include "mt_optim_groups.h"

uint64_t mt_optim_features(void) { return MT_FEATURE_OPTIM; }

/* *coef and *scale of the step (coef 1, scale 0 without clipping), or its refusal. */
static int prepare(float *coef, int32_t *scale, float *norm_out, float *const *grads, const int32_t *offsets,
                   int32_t n, int32_t clip, float max_norm) {
    int rc;
    *coef = 1.0f;
    *scale = 0;
    if (clip) {
        float total;
        if ((rc = mt_mtl_clip_total(MT_NORM_KIND_L2, &total, grads, offsets, n))) return rc;
        *coef = mt_clip_applied(max_norm, total);
        *scale = *coef < 1.0f;
        if (norm_out) {
            norm_out[0] = total;
            norm_out[1] = *coef;
        }
        return MT_OK;
    }
    int32_t bad;
    if ((rc = mt_mtl_first_nonfinite(&bad, grads, offsets, n))) return rc;
    if (bad >= 0) return mt_fail(MT_ENONFINITE, "grads[%d] holds NaN or inf; nothing was written", (int)bad);
    return MT_OK;
}

/* One tensor's launch: its buffers staged (the gradient read, and written back when scaled). */
static int step_tensor(const char *kernel, float *const bufs[5], int n_bufs, int32_t scale, int64_t n,
                       const void *params, int32_t params_size) {
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[6];
    int rc = MT_OK;
    for (int b = 0; b < n_bufs && rc == MT_OK; ++b) {
        int mode = b == 1 ? (scale ? MT_MTL_INOUT : MT_MTL_IN) : MT_MTL_INOUT;
        rc = mt_mtl_stage(&call, &args[b], bufs[b], bufs[b] ? n * 4 : 0, mode, NULL);
    }
    if (rc == MT_OK) {
        mt_mtl_bytes(&args[n_bufs], params, params_size);
        rc = mt_mtl_launch(kernel, args, n_bufs + 1, n);
    }
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

MT_NOINLINE static int adam_body(float *const *params, float *const *grads, float *const *exp_avg,
                                 float *const *exp_avg_sq, float *const *max_exp_avg_sq, int64_t *steps,
                                 float *norm_out, const int32_t *offsets, const mt_adam_group *groups,
                                 const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                                 int32_t n) {
    int rc;
    if ((rc = mt_check_adam_groups(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets,
                                   groups, tensor_group, clip, max_norm, n_groups, n)) ||
        (rc = mt_mtl_open()))
        return rc;
    float coef;
    int32_t scale;
    if ((rc = prepare(&coef, &scale, norm_out, grads, offsets, n, clip, max_norm))) return rc;
    char *plan = (char *)malloc((size_t)n * (sizeof(mt_adam_scalars) + sizeof(int32_t)));
    if (!plan) return mt_fail(MT_ENOMEM, "out of memory for the host scalars of %d tensors", (int)n);
    mt_adam_scalars *variants = (mt_adam_scalars *)plan;
    int32_t *variant_of = (int32_t *)(variants + n);
    mt_adam_plan(variants, variant_of, groups, tensor_group, steps, n);
    for (int32_t j = 0; j < n && rc == MT_OK; ++j) {
        int64_t len = (int64_t)offsets[j + 1] - offsets[j];
        if (len == 0) continue;
        mt_mtl_adam_params p;
        p.n = len;
        p.s = variants[variant_of[j]];
        p.coef = coef;
        p.scale = scale;
        float *const bufs[5] = {params[j], grads[j], exp_avg[j], exp_avg_sq[j],
                                p.s.amsgrad ? max_exp_avg_sq[j] : NULL};
        rc = step_tensor("mt_k_adam", bufs, 5, scale, len, &p, sizeof p);
    }
    free(plan);
    if (rc == MT_OK) mt_adam_advance(steps, n);
    return rc;
}

int mt_adam_step_groups(float *const *params, float *const *grads, float *const *exp_avg, float *const *exp_avg_sq,
                        float *const *max_exp_avg_sq, int64_t *steps, float *norm_out, const int32_t *offsets,
                        const mt_adam_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                        int32_t n_groups, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(adam_body(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets,
                                  groups, tensor_group, clip, max_norm, n_groups, n_tensors));
}

MT_NOINLINE static int sgd_body(float *const *params, float *const *grads, float *const *momentum_buffer,
                                int32_t *buf_initialized, float *norm_out, const int32_t *offsets,
                                const mt_sgd_group *groups, const int32_t *tensor_group, int32_t clip,
                                float max_norm, int32_t n_groups, int32_t n) {
    int rc;
    if ((rc = mt_check_sgd_groups(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups,
                                  tensor_group, clip, max_norm, n_groups, n)) ||
        (rc = mt_mtl_open()))
        return rc;
    float coef;
    int32_t scale;
    if ((rc = prepare(&coef, &scale, norm_out, grads, offsets, n, clip, max_norm))) return rc;
    mt_sgd_scalars *scalars = (mt_sgd_scalars *)malloc((size_t)n_groups * sizeof(mt_sgd_scalars));
    if (!scalars) return mt_fail(MT_ENOMEM, "out of memory for the host scalars of %d groups", (int)n_groups);
    mt_sgd_plan(scalars, groups, n_groups);
    for (int32_t j = 0; j < n && rc == MT_OK; ++j) {
        int64_t len = (int64_t)offsets[j + 1] - offsets[j];
        if (len == 0) continue;
        mt_mtl_sgd_params p;
        p.n = len;
        p.s = scalars[tensor_group[j]];
        p.coef = coef;
        p.scale = scale;
        p.has_buf = p.s.momentum != 0.0f;
        p.initialized = p.has_buf && buf_initialized[j];
        float *const bufs[5] = {params[j], grads[j], p.has_buf ? momentum_buffer[j] : NULL};
        rc = step_tensor("mt_k_sgd", bufs, 3, scale, len, &p, sizeof p);
    }
    free(scalars);
    if (rc == MT_OK) mt_sgd_mark(buf_initialized, groups, tensor_group, n);
    return rc;
}

int mt_sgd_step_groups(float *const *params, float *const *grads, float *const *momentum_buffer,
                       int32_t *buf_initialized, float *norm_out, const int32_t *offsets, const mt_sgd_group *groups,
                       const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                       int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(sgd_body(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups,
                                 tensor_group, clip, max_norm, n_groups, n_tensors));
}
