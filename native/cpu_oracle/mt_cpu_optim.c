/* mt_cpu_optim.c -- SGD, Adam, AdamW steps (contract: native/contracts/optim.md) and zero_grad's
 * fill on the CPU oracle.
 *
 * Order of every step: check the arguments; if clipping, form the norms (the pinned tree,
 * which also reads every gradient: mt_cpu_clip_total in mt_cpu_tensors.c, shared with
 * clip_grad_norm_ in mt_cpu_clip.c) and refuse a non-finite total; check params (and, without
 * clipping, grads) for NaN/inf; only then run one fused pass that scales the gradient, writes
 * it back when clipped, and updates params and state by mt_pinned.h's element routines.
 */
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"

uint64_t mt_optim_features(void) { return MT_FEATURE_OPTIM; }

typedef struct {
    float *const *params, *const *grads;
    float *m, *v;
    const int32_t *initialized;
    float coef;
    int32_t scale;
    mt_adam_scalars adam;
    mt_sgd_scalars sgd;
} step_job;

/* The loops are specialised on the structural flags (constants after inlining), so the
 * compiler vectorizes a branch-free body. */
static inline void adam_loop(float *restrict p, float *restrict g, float *restrict m,
                             float *restrict v, int64_t n, float coef, const mt_adam_scalars *s,
                             int scale, int coupled) {
    for (int64_t i = 0; i < n; ++i) {
        float gi = g[i] * coef;
        if (scale) g[i] = gi;
        mt_adam_elem(&p[i], &m[i], &v[i], gi, s, coupled);
    }
}

MT_SIMD static void adam_run(float *restrict p, float *restrict g, float *restrict m,
                             float *restrict v, int64_t n, int32_t scale, float coef,
                             const mt_adam_scalars *sp) {
    mt_adam_scalars s = *sp;
    if (scale && s.coupled) adam_loop(p, g, m, v, n, coef, &s, 1, 1);
    else if (scale) adam_loop(p, g, m, v, n, coef, &s, 1, 0);
    else if (s.coupled) adam_loop(p, g, m, v, n, coef, &s, 0, 1);
    else adam_loop(p, g, m, v, n, coef, &s, 0, 0);
}

static void adam_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    step_job *job = (step_job *)ctx;
    adam_run(job->params[j] + local, job->grads[j] + local, job->m + flat, job->v + flat, count,
             job->scale, job->coef, &job->adam);
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
    sgd_run(job->params[j] + local, job->grads[j] + local, job->m ? job->m + flat : 0,
            job->initialized[j], count, job->scale, job->coef, &job->sgd);
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
    int32_t bp, bg;                      /* params (and, without clipping, grads): one pass */
    mt_nonfinite_pair(&bp, &bg, job->params, clip ? 0 : job->grads, offsets, n);
    if (bg >= 0) return mt_fail(MT_ENONFINITE, "grads[%d] holds NaN or inf; nothing was written", (int)bg);
    if (bp >= 0) return mt_fail(MT_ENONFINITE, "params[%d] holds NaN or inf; nothing was written", (int)bp);
    if (clip && norm_out) { norm_out[0] = total; norm_out[1] = job->coef; }
    return MT_OK;
}

MT_NOINLINE static int adam_body(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq,
                       float *norm_out, const int32_t *offsets, float lr, float beta1, float beta2,
                       float eps, float weight_decay, int32_t maximize, int32_t clip, float max_norm,
                       int64_t step, int32_t n, int32_t decoupled) {
    int rc;
    if ((rc = mt_check_registry(params, offsets, n, "params")) ||
        (rc = mt_check_registry(grads, offsets, n, "grads")) ||
        (rc = mt_check_ptr(exp_avg, "exp_avg")) || (rc = mt_check_ptr(exp_avg_sq, "exp_avg_sq")) ||
        (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_adam_args(lr, beta1, beta2, eps, weight_decay, clip, max_norm, step)))
        return rc;
    step_job job = {params, grads, exp_avg, exp_avg_sq, 0, 1.0f, 0};
    if ((rc = prepare(&job, norm_out, offsets, n, clip, max_norm))) return rc;
    job.adam = mt_adam_scalars_for(lr, beta1, beta2, eps, weight_decay, maximize != 0, decoupled, step);
    mt_parallel_segments(offsets, n, adam_segment, &job);
    return MT_OK;
}

static int adam_common(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq,
                       float *norm_out, const int32_t *offsets, float lr, float beta1, float beta2,
                       float eps, float weight_decay, int32_t maximize, int32_t clip, float max_norm,
                       int64_t step, int32_t n, int32_t decoupled) {
    MT_RETURN_IN_FP_ENV(adam_body(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps,
                                  weight_decay, maximize, clip, max_norm, step, n, decoupled));
}

int mt_adam_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq,
                 float *norm_out, const int32_t *offsets, float lr, float beta1, float beta2,
                 float eps, float weight_decay, int32_t maximize, int32_t clip, float max_norm,
                 int64_t step, int32_t n_tensors) {
    return adam_common(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps,
                       weight_decay, maximize, clip, max_norm, step, n_tensors, 0);
}

int mt_adamw_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq,
                  float *norm_out, const int32_t *offsets, float lr, float beta1, float beta2,
                  float eps, float weight_decay, int32_t maximize, int32_t clip, float max_norm,
                  int64_t step, int32_t n_tensors) {
    return adam_common(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps,
                       weight_decay, maximize, clip, max_norm, step, n_tensors, 1);
}

MT_NOINLINE static int sgd_step_body(float *const *params, float *const *grads, float *momentum_buffer,
                int32_t *buf_initialized, float *norm_out, const int32_t *offsets, float lr,
                float momentum, float dampening, float weight_decay, int32_t nesterov,
                int32_t maximize, int32_t clip, float max_norm, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(params, offsets, n_tensors, "params")) ||
        (rc = mt_check_registry(grads, offsets, n_tensors, "grads")) ||
        (momentum != 0.0f && (rc = mt_check_ptr(momentum_buffer, "momentum_buffer"))) ||
        (rc = mt_check_ptr(buf_initialized, "buf_initialized")) ||
        (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_sgd_args(lr, momentum, dampening, weight_decay, nesterov, clip, max_norm)))
        return rc;
    step_job job = {params, grads, momentum != 0.0f ? momentum_buffer : 0, 0, buf_initialized, 1.0f, 0};
    if ((rc = prepare(&job, norm_out, offsets, n_tensors, clip, max_norm))) return rc;
    job.sgd = mt_sgd_scalars_for(lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0);
    mt_parallel_segments(offsets, n_tensors, sgd_segment, &job);
    if (momentum != 0.0f)
        for (int32_t j = 0; j < n_tensors; ++j) buf_initialized[j] = 1;
    return MT_OK;
}

static void zero_segment(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count) {
    float *const *table = (float *const *)ctx;
    (void)flat;
    float *x = table[j] + local;
    for (int64_t i = 0; i < count; ++i) x[i] = 0.0f;
}

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(tensors, offsets, n_tensors, "tensors"))) return rc;
    mt_parallel_segments(offsets, n_tensors, zero_segment, (void *)tensors);
    return MT_OK;
}

int mt_sgd_step(float *const *params, float *const *grads, float *momentum_buffer, int32_t *buf_initialized,
                float *norm_out, const int32_t *offsets, float lr, float momentum, float dampening,
                float weight_decay, int32_t nesterov, int32_t maximize, int32_t clip, float max_norm,
                int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(sgd_step_body(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, lr, momentum,
                                      dampening, weight_decay, nesterov, maximize, clip, max_norm, n_tensors));
}
