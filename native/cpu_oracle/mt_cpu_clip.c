/* mt_cpu_clip.c -- clip_grad_norm_ and the per-tensor norms on the CPU oracle (contract:
 * native/contracts/clip.md).
 *
 * The norms and the refusal of a non-finite total are mt_cpu_norms_of / mt_cpu_clip_total_of
 * (mt_cpu_tensors.c), the code the steps that clip run too (mt_cpu_optim.c, the 2-norm), so a
 * clip here and a clip inside a step give the same bits. With error_if_nonfinite, gradients are
 * scaled only after the total is known to be finite: a refusal writes nothing. Without it (torch's
 * default) a non-finite total scales them by its coefficient, as torch does.
 */
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"

uint64_t mt_clip_features(void) { return MT_FEATURE_CLIP; }

typedef struct { float *const *table; float coef; } scale_job;

/* x * coef, a NaN product written as the canonical NaN (clip.md). */
MT_SIMD static void scale_run(float *restrict x, int64_t n, float coef) {
    for (int64_t i = 0; i < n; ++i) x[i] = mt_canonical_nan(x[i] * coef);
}

static void scale_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    scale_job *job = (scale_job *)ctx;
    (void)flat;
    scale_run(job->table[j] + local, count, job->coef);
}

static int check_clip_list(float *const *grads, const int32_t *offsets, float norm_type, int32_t n_tensors,
                           int *kind) {
    int rc;
    if ((rc = mt_check_registry_empty_ok(grads, offsets, n_tensors, "grads"))) return rc;
    return mt_check_norm_type(norm_type, kind);
}

MT_NOINLINE static int clip_body(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm,
                                 float norm_type, int32_t error_if_nonfinite, int32_t n_tensors) {
    int rc, kind;
    if ((rc = check_clip_list(grads, offsets, norm_type, n_tensors, &kind)) ||
        (rc = mt_check_ptr(norm_out, "norm_out")) || (rc = mt_check_nonneg(max_norm, "max_norm")))
        return rc;
    float total = 0.0f;
    if (error_if_nonfinite) {
        if ((rc = mt_cpu_clip_total_of(kind, &total, grads, offsets, n_tensors))) return rc;
    } else if (mt_cpu_norms_of(kind, 0, &total, grads, offsets, n_tensors)) {
        return mt_fail(MT_ENOMEM, "out of memory for norm partials");
    }
    float coef = mt_clip_coefficient(max_norm, total);
    if (coef != 1.0f) {                 /* c < 1, or NaN (a NaN total) */
        scale_job sj = {grads, coef};
        mt_parallel_segments(offsets, n_tensors, scale_segment, &sj);
    }
    norm_out[0] = total;
    norm_out[1] = coef;
    return MT_OK;
}

MT_NOINLINE static int grad_norms_body(float *tensor_norms, float *total_norm, float *const *grads,
                                       const int32_t *offsets, float norm_type, int32_t n_tensors) {
    int rc, kind;
    if ((rc = check_clip_list(grads, offsets, norm_type, n_tensors, &kind)) ||
        (rc = mt_check_ptr(tensor_norms, "tensor_norms")) || (rc = mt_check_ptr(total_norm, "total_norm")))
        return rc;
    if (mt_cpu_norms_of(kind, tensor_norms, total_norm, grads, offsets, n_tensors))
        return mt_fail(MT_ENOMEM, "out of memory for norm partials");
    return MT_OK;
}

int mt_clip_grad_norm(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm, float norm_type,
                      int32_t error_if_nonfinite, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(clip_body(grads, norm_out, offsets, max_norm, norm_type, error_if_nonfinite, n_tensors));
}

int mt_grad_norms(float *tensor_norms, float *total_norm, float *const *grads, const int32_t *offsets,
                  float norm_type, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(grad_norms_body(tensor_norms, total_norm, grads, offsets, norm_type, n_tensors));
}
