/* mt_cpu_optim.c -- SGD, Adam and AdamW steps, flat and grouped (contract:
 * native/contracts/optim.md), and zero_grad's fill on the CPU oracle.
 *
 * Order of every step: check the arguments (mt_optim_groups.c); if clipping, form the norms
 * (the pinned tree, which also reads every gradient: mt_cpu_clip_total in mt_cpu_tensors.c,
 * shared with clip_grad_norm_ in mt_cpu_clip.c) and refuse a non-finite total; without clipping
 * check the grads for NaN/inf (parameters are not read before the update: a non-finite one is
 * stepped as IEEE arithmetic says, optim.md); only then run one fused pass over every tensor of
 * every group that scales the gradient, writes it back when clipped, and updates params and
 * state by mt_pinned.h's element routines with the tensor's own host scalars. The flat calls
 * (native/common/mt_optim_groups.c) are one group whose state tables point into the flat buffers.
 */
#include <stdlib.h>
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_optim_groups.h"
#include "mt_pinned.h"

uint64_t mt_optim_features(void) { return MT_FEATURE_OPTIM; }

typedef struct {
    float *const *params, *const *grads, *const *m, *const *v, *const *w;
    const int32_t *initialized, *variant_of;
    float coef;
    int32_t scale;
    const mt_adam_scalars *adam;    /* per variant (mt_adam_plan) */
    const mt_sgd_scalars *sgd;      /* per group */
} step_job;

/* The loops are specialised on the structural flags (constants after inlining), so the
 * compiler vectorizes a branch-free body. */
static inline void adam_loop(float *restrict p, float *restrict g, float *restrict m, float *restrict v,
                             float *restrict w, int64_t n, float coef, const mt_adam_scalars *s, int scale,
                             int coupled, int amsgrad) {
    for (int64_t i = 0; i < n; ++i) {
        float gi = g[i] * coef;
        if (scale) g[i] = gi;
        mt_adam_elem(&p[i], &m[i], &v[i], amsgrad ? &w[i] : 0, gi, s, coupled, amsgrad);
    }
}

#define MT_ADAM_LOOP(SC, CO, AM) adam_loop(p, g, m, v, w, n, coef, &s, SC, CO, AM)
MT_SIMD static void adam_run(float *restrict p, float *restrict g, float *restrict m, float *restrict v,
                             float *restrict w, int64_t n, int32_t scale, float coef, const mt_adam_scalars *sp) {
    mt_adam_scalars s = *sp;
    switch ((scale ? 4 : 0) | (s.coupled ? 2 : 0) | (s.amsgrad ? 1 : 0)) {
    case 0: MT_ADAM_LOOP(0, 0, 0); break;
    case 1: MT_ADAM_LOOP(0, 0, 1); break;
    case 2: MT_ADAM_LOOP(0, 1, 0); break;
    case 3: MT_ADAM_LOOP(0, 1, 1); break;
    case 4: MT_ADAM_LOOP(1, 0, 0); break;
    case 5: MT_ADAM_LOOP(1, 0, 1); break;
    case 6: MT_ADAM_LOOP(1, 1, 0); break;
    default: MT_ADAM_LOOP(1, 1, 1); break;
    }
}
#undef MT_ADAM_LOOP

static void adam_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    step_job *job = (step_job *)ctx;
    const mt_adam_scalars *s = &job->adam[job->variant_of[j]];
    (void)flat;
    adam_run(job->params[j] + local, job->grads[j] + local, job->m[j] + local, job->v[j] + local,
             s->amsgrad ? job->w[j] + local : 0, count, job->scale, job->coef, s);
}

static inline void sgd_loop(float *restrict p, float *restrict g, float *restrict buf, int64_t n,
                            float coef, const mt_sgd_scalars *s, int scale, int coupled,
                            int has_buf, int initialized) {
    for (int64_t i = 0; i < n; ++i) {
        float gi = g[i] * coef;
        if (scale) g[i] = gi;
        mt_sgd_elem(&p[i], has_buf ? &buf[i] : &p[i], gi, s, coupled, has_buf, initialized);
    }
}

MT_SIMD static void sgd_run(float *restrict p, float *restrict g, float *restrict buf,
                            int32_t initialized, int64_t n, int32_t scale, float coef,
                            const mt_sgd_scalars *sp) {
    mt_sgd_scalars s = *sp;
    int has_buf = buf != 0, c = s.coupled;
    if (!has_buf) {
        if (scale) sgd_loop(p, g, buf, n, coef, &s, 1, c, 0, 0);
        else sgd_loop(p, g, buf, n, coef, &s, 0, c, 0, 0);
    } else if (initialized) {
        if (scale) sgd_loop(p, g, buf, n, coef, &s, 1, c, 1, 1);
        else sgd_loop(p, g, buf, n, coef, &s, 0, c, 1, 1);
    } else {
        if (scale) sgd_loop(p, g, buf, n, coef, &s, 1, c, 1, 0);
        else sgd_loop(p, g, buf, n, coef, &s, 0, c, 1, 0);
    }
}

static void sgd_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    step_job *job = (step_job *)ctx;
    const mt_sgd_scalars *s = &job->sgd[job->variant_of[j]];
    (void)flat;
    sgd_run(job->params[j] + local, job->grads[j] + local, s->momentum != 0.0f ? job->m[j] + local : 0,
            job->initialized[j], count, job->scale, job->coef, s);
}

/* Norms (when clipping) and the finiteness refusals. On success job->scale/coef are set. */
static int prepare(step_job *job, float *norm_out, const int32_t *offsets, int32_t n,
                   int32_t clip, float max_norm) {
    job->scale = 0;
    job->coef = 1.0f;
    float total = 0.0f;
    if (clip) {
        int rc = mt_cpu_clip_total(&total, job->grads, offsets, n);
        if (rc) return rc;
        job->coef = mt_clip_coefficient(max_norm, total);
        job->scale = job->coef < 1.0f;
    }
    if (!clip) {                         /* the grads (clipping's norms have read them already) */
        int32_t bg = mt_first_nonfinite(job->grads, offsets, n);
        if (bg >= 0) return mt_fail(MT_ENONFINITE, "grads[%d] holds NaN or inf; nothing was written", (int)bg);
    }
    if (clip && norm_out) { norm_out[0] = total; norm_out[1] = job->coef; }
    return MT_OK;
}

MT_NOINLINE static int adam_groups_body(float *const *params, float *const *grads, float *const *exp_avg,
                                        float *const *exp_avg_sq, float *const *max_exp_avg_sq, int64_t *steps,
                                        float *norm_out, const int32_t *offsets, const mt_adam_group *groups,
                                        const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                                        int32_t n) {
    int rc;
    if ((rc = mt_check_adam_groups(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets,
                                   groups, tensor_group, clip, max_norm, n_groups, n)))
        return rc;
    step_job job = {params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, 0, 0, 1.0f, 0, 0, 0};
    if ((rc = prepare(&job, norm_out, offsets, n, clip, max_norm))) return rc;
    enum { LOCAL = 16 };               /* a few tensors: no allocation */
    mt_adam_scalars local[LOCAL];
    int32_t local_of[LOCAL];
    char *plan = n > LOCAL ? (char *)malloc((size_t)n * (sizeof(mt_adam_scalars) + sizeof(int32_t))) : 0;
    if (n > LOCAL && !plan) return mt_fail(MT_ENOMEM, "out of memory for the host scalars of %d tensors", (int)n);
    mt_adam_scalars *variants = plan ? (mt_adam_scalars *)plan : local;
    int32_t *variant_of = plan ? (int32_t *)(variants + n) : local_of;
    mt_adam_plan(variants, variant_of, groups, tensor_group, steps, n);
    job.adam = variants;
    job.variant_of = variant_of;
    mt_parallel_segments(offsets, n, adam_segment, &job);
    free(plan);
    mt_adam_advance(steps, n);
    return MT_OK;
}

int mt_adam_step_groups(float *const *params, float *const *grads, float *const *exp_avg, float *const *exp_avg_sq,
                        float *const *max_exp_avg_sq, int64_t *steps, float *norm_out, const int32_t *offsets,
                        const mt_adam_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                        int32_t n_groups, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(adam_groups_body(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets,
                                         groups, tensor_group, clip, max_norm, n_groups, n_tensors));
}

MT_NOINLINE static int sgd_groups_body(float *const *params, float *const *grads, float *const *momentum_buffer,
                                       int32_t *buf_initialized, float *norm_out, const int32_t *offsets,
                                       const mt_sgd_group *groups, const int32_t *tensor_group, int32_t clip,
                                       float max_norm, int32_t n_groups, int32_t n) {
    int rc;
    if ((rc = mt_check_sgd_groups(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups,
                                  tensor_group, clip, max_norm, n_groups, n)))
        return rc;
    step_job job = {params, grads, momentum_buffer, 0, 0, buf_initialized, tensor_group, 1.0f, 0, 0, 0};
    if ((rc = prepare(&job, norm_out, offsets, n, clip, max_norm))) return rc;
    mt_sgd_scalars *scalars = (mt_sgd_scalars *)malloc((size_t)n_groups * sizeof(mt_sgd_scalars));
    if (!scalars) return mt_fail(MT_ENOMEM, "out of memory for the host scalars of %d groups", (int)n_groups);
    mt_sgd_plan(scalars, groups, n_groups);
    job.sgd = scalars;
    mt_parallel_segments(offsets, n, sgd_segment, &job);
    free(scalars);
    mt_sgd_mark(buf_initialized, groups, tensor_group, n);
    return MT_OK;
}

int mt_sgd_step_groups(float *const *params, float *const *grads, float *const *momentum_buffer,
                       int32_t *buf_initialized, float *norm_out, const int32_t *offsets, const mt_sgd_group *groups,
                       const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                       int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(sgd_groups_body(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups,
                                        tensor_group, clip, max_norm, n_groups, n_tensors));
}

static void zero_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    float *const *table = (float *const *)ctx;
    (void)flat;
    float *x = table[j] + local;
    for (int64_t i = 0; i < count; ++i) x[i] = 0.0f;
}

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_group_registry(tensors, offsets, n_tensors, "tensors"))) return rc;
    mt_parallel_segments(offsets, n_tensors, zero_segment, (void *)tensors);
    return MT_OK;
}
