/* mt_optim_groups.c -- see mt_optim_groups.h. Host code every vendor links: the checks of a
 * grouped step (each message names the argument as the header spells it, e.g.
 * "groups[1].lr"), the per-tensor host scalars by mt_pinned.h's routines, and the flat calls
 * (mt_sgd_step, mt_adam_step, mt_adamw_step), defined here once for every vendor as one group
 * of the vendor's grouped call. */
#include <stdio.h>
#include <stdlib.h>
#include "mt_optim_groups.h"
#include "mt_host.h"

int mt_check_group_registry(float *const *table, const int32_t *offsets, int32_t n_tensors, const char *name) {
    if (n_tensors < 1) return mt_fail(MT_EINVAL, "n_tensors must be >= 1 (got %d) for %s", (int)n_tensors, name);
    if (!table) return mt_fail(MT_EINVAL, "%s is NULL", name);
    if (!offsets) return mt_fail(MT_EINVAL, "offsets of %s is NULL", name);
    if (offsets[0] != 0) return mt_fail(MT_EINVAL, "offsets[0] of %s must be 0, got %d", name, (int)offsets[0]);
    for (int32_t j = 0; j < n_tensors; ++j) {
        if (offsets[j + 1] < offsets[j])
            return mt_fail(MT_EINVAL, "offsets of %s must not decrease (tensor %d has a negative size)", name, (int)j);
        if (offsets[j + 1] > offsets[j] && !table[j]) return mt_fail(MT_EINVAL, "%s[%d] is NULL", name, (int)j);
    }
    return MT_OK;
}

int mt_adam_uses_max(const mt_adam_group *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t j) {
    return (groups[tensor_group[j]].flags & MT_OPTIM_AMSGRAD) && offsets[j + 1] > offsets[j];
}

int mt_sgd_uses_buf(const mt_sgd_group *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t j) {
    return groups[tensor_group[j]].momentum != 0.0f && offsets[j + 1] > offsets[j];
}

/* A state table: entry j non-NULL where uses(j) (every tensor holding elements when uses is
 * NULL); the table itself may be NULL only when no tensor uses it. */
typedef int (*uses_fn)(const void *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t j);

static int check_state(float *const *table, const char *name, uses_fn uses, const void *groups,
                       const int32_t *tensor_group, const int32_t *offsets, int32_t n) {
    for (int32_t j = 0; j < n; ++j) {
        int used = uses ? uses(groups, tensor_group, offsets, j) : offsets[j + 1] > offsets[j];
        if (!used) continue;
        if (!table)
            return mt_fail(MT_EINVAL, "%s is NULL, but tensor %d %s", name, (int)j,
                           uses ? "is in a group that uses it" : "holds elements");
        if (!table[j]) return mt_fail(MT_EINVAL, "%s[%d] is NULL", name, (int)j);
    }
    return MT_OK;
}

static int adam_uses_max(const void *g, const int32_t *tg, const int32_t *offsets, int32_t j) {
    return mt_adam_uses_max((const mt_adam_group *)g, tg, offsets, j);
}

static int sgd_uses_buf(const void *g, const int32_t *tg, const int32_t *offsets, int32_t j) {
    return mt_sgd_uses_buf((const mt_sgd_group *)g, tg, offsets, j);
}

/* The group table, tensor_group and, when clipping, max_norm and norm_out. */
static int check_tensor_groups(const void *groups, const int32_t *tensor_group, const float *norm_out,
                               int32_t clip, float max_norm, int32_t n_groups, int32_t n_tensors) {
    int rc;
    if (n_groups < 1) return mt_fail(MT_EINVAL, "n_groups must be >= 1, got %d", (int)n_groups);
    if ((rc = mt_check_ptr(groups, "groups")) || (rc = mt_check_ptr(tensor_group, "tensor_group"))) return rc;
    for (int32_t j = 0; j < n_tensors; ++j)
        if (tensor_group[j] < 0 || tensor_group[j] >= n_groups)
            return mt_fail(MT_EINVAL, "tensor_group[%d] is %d; a group index is in [0, n_groups = %d)", (int)j,
                           (int)tensor_group[j], (int)n_groups);
    if (clip && ((rc = mt_check_ptr(norm_out, "norm_out")) || (rc = mt_check_nonneg(max_norm, "max_norm")))) return rc;
    return MT_OK;
}

/* groups[g].<field> as a name for the messages of mt_host.c's checks. */
static const char *field(char *buf, size_t size, int32_t g, const char *name) {
    snprintf(buf, size, "groups[%d].%s", (int)g, name);
    return buf;
}

static int check_flags(int32_t flags, int32_t allowed, int32_t g, const char *taken) {
    if (flags & ~allowed)
        return mt_fail(MT_EINVAL, "groups[%d].flags has unknown bits 0x%x (this step takes %s)", (int)g,
                       (unsigned)(flags & ~allowed), taken);
    return MT_OK;
}

/* The fast test of a group's values; the named checks below run only to say what is wrong. */
static int nonneg(float x) { return mt_is_finite(x) && x >= 0.0f; }
static int beta(float x) { return x >= 0.0f && x < 1.0f; }

static int check_adam_group(const void *groups, int32_t g) {
    const mt_adam_group *a = (const mt_adam_group *)groups + g;
    const int32_t allowed = MT_OPTIM_MAXIMIZE | MT_OPTIM_AMSGRAD | MT_OPTIM_DECOUPLED;
    if (nonneg(a->lr) && beta(a->beta1) && beta(a->beta2) && nonneg(a->eps) && nonneg(a->weight_decay) &&
        !(a->flags & ~allowed))
        return MT_OK;
    char b[64];
    int rc;
    if ((rc = mt_check_nonneg(a->lr, field(b, sizeof b, g, "lr"))) ||
        (rc = mt_check_beta(a->beta1, field(b, sizeof b, g, "beta1"))) ||
        (rc = mt_check_beta(a->beta2, field(b, sizeof b, g, "beta2"))) ||
        (rc = mt_check_nonneg(a->eps, field(b, sizeof b, g, "eps"))) ||
        (rc = mt_check_nonneg(a->weight_decay, field(b, sizeof b, g, "weight_decay"))))
        return rc;
    return check_flags(a->flags, allowed, g, "MT_OPTIM_MAXIMIZE, MT_OPTIM_AMSGRAD, MT_OPTIM_DECOUPLED");
}

static int check_sgd_group(const void *groups, int32_t g) {
    const mt_sgd_group *s = (const mt_sgd_group *)groups + g;
    char b[64];
    int rc;
    if ((rc = mt_check_nonneg(s->lr, field(b, sizeof b, g, "lr"))) ||
        (rc = mt_check_nonneg(s->momentum, field(b, sizeof b, g, "momentum"))) ||
        (rc = mt_check_finite_scalar(s->dampening, field(b, sizeof b, g, "dampening"))) ||
        (rc = mt_check_nonneg(s->weight_decay, field(b, sizeof b, g, "weight_decay"))) ||
        (rc = check_flags(s->flags, MT_OPTIM_MAXIMIZE | MT_OPTIM_NESTEROV, g, "MT_OPTIM_MAXIMIZE, MT_OPTIM_NESTEROV")))
        return rc;
    if ((s->flags & MT_OPTIM_NESTEROV) && (s->momentum == 0.0f || s->dampening != 0.0f))
        return mt_fail(MT_EINVAL, "groups[%d]: nesterov needs momentum > 0 and dampening == 0 (got momentum %g, "
                       "dampening %g)", (int)g, (double)s->momentum, (double)s->dampening);
    return MT_OK;
}

/* What both steps check first: the registries, tensor_group, each group (check_group), clipping. */
static int check_lists(float *const *params, float *const *grads, const float *norm_out, const int32_t *offsets,
                       const void *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                       int32_t n_groups, int32_t n, int (*check_group)(const void *, int32_t)) {
    int rc;
    if ((rc = mt_check_group_registry(params, offsets, n, "params")) ||
        (rc = mt_check_group_registry(grads, offsets, n, "grads")) ||
        (rc = check_tensor_groups(groups, tensor_group, norm_out, clip, max_norm, n_groups, n)))
        return rc;
    for (int32_t g = 0; g < n_groups; ++g)
        if ((rc = check_group(groups, g))) return rc;
    return MT_OK;
}

int mt_check_adam_groups(float *const *params, float *const *grads, float *const *exp_avg,
                         float *const *exp_avg_sq, float *const *max_exp_avg_sq, const int64_t *steps,
                         const float *norm_out, const int32_t *offsets, const mt_adam_group *groups,
                         const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                         int32_t n) {
    int rc;
    if ((rc = check_lists(params, grads, norm_out, offsets, groups, tensor_group, clip, max_norm, n_groups, n,
                          check_adam_group)) ||
        (rc = mt_check_ptr(steps, "steps")))
        return rc;
    for (int32_t j = 0; j < n; ++j)
        if (steps[j] < 0 || steps[j] == INT64_MAX)
            return mt_fail(MT_EINVAL, "steps[%d] is %lld; the steps a tensor has taken are in [0, 2^63 - 1)", (int)j,
                           (long long)steps[j]);
    if ((rc = check_state(exp_avg, "exp_avg", 0, groups, tensor_group, offsets, n)) ||
        (rc = check_state(exp_avg_sq, "exp_avg_sq", 0, groups, tensor_group, offsets, n)) ||
        (rc = check_state(max_exp_avg_sq, "max_exp_avg_sq", adam_uses_max, groups, tensor_group, offsets, n)))
        return rc;
    return MT_OK;
}

int mt_check_sgd_groups(float *const *params, float *const *grads, float *const *momentum_buffer,
                        const int32_t *buf_initialized, const float *norm_out, const int32_t *offsets,
                        const mt_sgd_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                        int32_t n_groups, int32_t n) {
    int rc;
    if ((rc = check_lists(params, grads, norm_out, offsets, groups, tensor_group, clip, max_norm, n_groups, n,
                          check_sgd_group)) ||
        (rc = mt_check_ptr(buf_initialized, "buf_initialized")) ||
        (rc = check_state(momentum_buffer, "momentum_buffer", sgd_uses_buf, groups, tensor_group, offsets, n)))
        return rc;
    return MT_OK;
}

MT_NOINLINE int32_t mt_adam_plan(mt_adam_scalars *variants, int32_t *variant_of, const mt_adam_group *groups,
                                 const int32_t *tensor_group, const int64_t *steps, int32_t n_tensors) {
    int32_t k = 0;
    for (int32_t j = 0; j < n_tensors; ++j) {
        if (j == 0 || tensor_group[j] != tensor_group[j - 1] || steps[j] != steps[j - 1]) {
            const mt_adam_group *a = &groups[tensor_group[j]];
            variants[k] = mt_adam_scalars_for(a->lr, a->beta1, a->beta2, a->eps, a->weight_decay,
                                              (a->flags & MT_OPTIM_MAXIMIZE) != 0,
                                              (a->flags & MT_OPTIM_DECOUPLED) != 0, steps[j] + 1);
            variants[k].amsgrad = (a->flags & MT_OPTIM_AMSGRAD) != 0;
            ++k;
        }
        variant_of[j] = k - 1;
    }
    return k;
}

MT_NOINLINE void mt_sgd_plan(mt_sgd_scalars *out, const mt_sgd_group *groups, int32_t n_groups) {
    for (int32_t g = 0; g < n_groups; ++g) {
        const mt_sgd_group *s = &groups[g];
        out[g] = mt_sgd_scalars_for(s->lr, s->momentum, s->dampening, s->weight_decay,
                                    (s->flags & MT_OPTIM_NESTEROV) != 0, (s->flags & MT_OPTIM_MAXIMIZE) != 0);
    }
}

void mt_adam_advance(int64_t *steps, int32_t n_tensors) {
    for (int32_t j = 0; j < n_tensors; ++j) steps[j] += 1;
}

void mt_sgd_mark(int32_t *buf_initialized, const mt_sgd_group *groups, const int32_t *tensor_group,
                 int32_t n_tensors) {
    for (int32_t j = 0; j < n_tensors; ++j)
        if (groups[tensor_group[j]].momentum != 0.0f) buf_initialized[j] = 1;
}

/* A flat call as one group: a pointer per tensor into each flat state buffer (NULL tables
 * for NULL buffers), every tensor at step `step`, in one allocation. */
typedef struct {
    float **m, **v;
    int64_t *steps;
    int32_t *tensor_group;
    void *block;
} flat_tables;

static int flat_tables_for(flat_tables *out, float *m, float *v, const int32_t *offsets, int32_t n_tensors,
                           int64_t step) {
    size_t n = (size_t)n_tensors;
    char *block = (char *)malloc(n * (2 * sizeof(float *) + sizeof(int64_t) + sizeof(int32_t)));
    out->block = block;
    if (!block) return mt_fail(MT_ENOMEM, "out of memory for the state tables of %d tensors", (int)n_tensors);
    out->steps = (int64_t *)block;
    out->m = (float **)(block + n * sizeof(int64_t));
    out->v = out->m + n;
    out->tensor_group = (int32_t *)(out->v + n);
    for (size_t j = 0; j < n; ++j) {
        out->steps[j] = step - 1;
        out->m[j] = m ? m + offsets[j] : 0;
        out->v[j] = v ? v + offsets[j] : 0;
        out->tensor_group[j] = 0;
    }
    if (!m) out->m = 0;
    if (!v) out->v = 0;
    return MT_OK;
}

static int adam_flat(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                     const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                     int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n, int32_t decoupled) {
    int rc;
    if ((rc = mt_check_registry(params, offsets, n, "params")) ||
        (rc = mt_check_registry(grads, offsets, n, "grads")) ||
        (rc = mt_check_ptr(exp_avg, "exp_avg")) || (rc = mt_check_ptr(exp_avg_sq, "exp_avg_sq")) ||
        (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_adam_args(lr, beta1, beta2, eps, weight_decay, clip, max_norm, step)))
        return rc;
    flat_tables t;
    if ((rc = flat_tables_for(&t, exp_avg, exp_avg_sq, offsets, n, step))) return rc;
    mt_adam_group group = {lr, beta1, beta2, eps, weight_decay,
                           (maximize ? MT_OPTIM_MAXIMIZE : 0) | (decoupled ? MT_OPTIM_DECOUPLED : 0)};
    rc = mt_adam_step_groups(params, grads, t.m, t.v, 0, t.steps, norm_out, offsets, &group, t.tensor_group, clip,
                             max_norm, 1, n);
    free(t.block);
    return rc;
}

/* The flat calls of every vendor: their own checks (their messages, as before param groups),
 * then the vendor's grouped call over one group whose state tables point into the flat buffers. */
int mt_sgd_step(float *const *params, float *const *grads, float *momentum_buffer, int32_t *buf_initialized,
                float *norm_out, const int32_t *offsets, float lr, float momentum, float dampening,
                float weight_decay, int32_t nesterov, int32_t maximize, int32_t clip, float max_norm, int32_t n) {
    int rc;
    if ((rc = mt_check_registry(params, offsets, n, "params")) ||
        (rc = mt_check_registry(grads, offsets, n, "grads")) ||
        (momentum != 0.0f && (rc = mt_check_ptr(momentum_buffer, "momentum_buffer"))) ||
        (rc = mt_check_ptr(buf_initialized, "buf_initialized")) ||
        (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_sgd_args(lr, momentum, dampening, weight_decay, nesterov, clip, max_norm)))
        return rc;
    flat_tables t;
    if ((rc = flat_tables_for(&t, momentum != 0.0f ? momentum_buffer : 0, 0, offsets, n, 1))) return rc;
    mt_sgd_group group = {lr, momentum, dampening, weight_decay,
                          (nesterov ? MT_OPTIM_NESTEROV : 0) | (maximize ? MT_OPTIM_MAXIMIZE : 0)};
    rc = mt_sgd_step_groups(params, grads, t.m, buf_initialized, norm_out, offsets, &group, t.tensor_group, clip,
                            max_norm, 1, n);
    free(t.block);
    return rc;
}

int mt_adam_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                 const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                 int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n_tensors) {
    return adam_flat(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps, weight_decay,
                     maximize, clip, max_norm, step, n_tensors, 0);
}

int mt_adamw_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                  const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n_tensors) {
    return adam_flat(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps, weight_decay,
                     maximize, clip, max_norm, step, n_tensors, 1);
}
