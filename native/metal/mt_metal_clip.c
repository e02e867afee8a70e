/* mt_metal_clip.c -- clip_grad_norm_ and the per-tensor norms on Metal (contract:
 * native/contracts/clip.md; kernels: mt_metal_clip.metal), and the norms every step that clips
 * shares (mt_metal_clip.h). The checks, the order of refusals and the coefficient are the
 * oracle's (native/cpu_oracle/mt_cpu_clip.c): with error_if_nonfinite nothing is scaled until the
 * total is known finite; without it a non-finite total scales by its coefficient, as torch does. */
#include <stdlib.h>
#include "mt_host.h"
#include "mt_metal_clip.h"
#include "mt_metal_elementwise.h"

_Static_assert((int)MT_MTL_NORM_L2 == (int)MT_NORM_KIND_L2 && (int)MT_MTL_NORM_L1 == (int)MT_NORM_KIND_L1 &&
                   (int)MT_MTL_NORM_INF == (int)MT_NORM_KIND_INF, "the kernels' norm kinds are the host's");

uint64_t mt_clip_features(void) { return MT_FEATURE_CLIP; }

int mt_mtl_fold_rows(mt_mtl_call *call, const mt_mtl_arg *x, const mt_mtl_arg *dy, const mt_mtl_arg *w,
                     const mt_mtl_arg *ra, const mt_mtl_arg *rb, const mt_mtl_arg *partials,
                     const mt_mtl_norm_params *p) {
    const int64_t chunks = p->rows * mt_chunk_count(p->n), lanes = chunks * MT_LANES;
    if (chunks == 0) return MT_OK;
    mt_mtl_arg args[7] = {*x, dy ? *dy : *x, w ? *w : *x, ra ? *ra : *x, rb ? *rb : *x};
    mt_mtl_bytes(&args[6], p, sizeof *p);
    int rc = mt_mtl_scratch(call, &args[5], lanes * 4, NULL);
    if (rc || (rc = mt_mtl_launch("mt_k_fold_lanes", args, 7, lanes))) return rc;
    mt_mtl_arg tree[3] = {args[5], *partials};
    mt_mtl_bytes(&tree[2], p, sizeof *p);
    return mt_mtl_launch("mt_k_fold_lane_tree", tree, 3, chunks);
}

/* The chunk partials of x (n elements, bound in `x`) into partials[at ..]. */
static int chunk_partials(mt_mtl_call *call, const mt_mtl_arg *x, const mt_mtl_arg *partials, int64_t n, int64_t at,
                          int kind) {
    if (n == 0) return MT_OK;
    mt_mtl_norm_params p = {n, at, 1, kind, MT_SAB_CLIP, 0, 0};
    return mt_mtl_fold_rows(call, x, NULL, NULL, NULL, NULL, partials, &p);
}

/* out[at + j] = the norm of vector j from partials[start[j] .. start[j + 1]), j < count. */
static int finish(const mt_mtl_arg *partials, const mt_mtl_arg *start, const mt_mtl_arg *out, int64_t count,
                  int64_t at, int kind) {
    mt_mtl_norm_params p = {count, at, 1, kind, 0, 0, 0};
    mt_mtl_arg args[4] = {*partials, *start, *out};
    return mt_mtl_launch_with("mt_k_norm_finish", args, 4, &p, sizeof p, count);
}

int mt_mtl_norms(int kind, float *norms, float *total, float *const *table, const int32_t *offsets, int32_t n) {
    int rc;
    if ((rc = mt_mtl_open())) return rc;
    int64_t chunks = 0;
    for (int32_t j = 0; j < n; ++j) chunks += mt_chunk_count((int64_t)offsets[j + 1] - offsets[j]);
    const int64_t own_chunks = mt_chunk_count(n);
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg partials, start, own, own_partials, own_start;
    float *own_host;
    int64_t *start_host, *own_start_host;
    if ((rc = mt_mtl_scratch(&call, &partials, (chunks ? chunks : 1) * 4, NULL)) ||
        (rc = mt_mtl_scratch(&call, &start, ((int64_t)n + 1) * 8, (void **)&start_host)) ||
        (rc = mt_mtl_scratch(&call, &own, (int64_t)n * 4, (void **)&own_host)) ||
        (rc = mt_mtl_scratch(&call, &own_partials, (own_chunks ? own_chunks : 1) * 4, NULL)) ||
        (rc = mt_mtl_scratch(&call, &own_start, 16, (void **)&own_start_host)))
        goto done;
    start_host[0] = 0;
    for (int32_t j = 0; j < n; ++j) {
        int64_t len = (int64_t)offsets[j + 1] - offsets[j];
        start_host[j + 1] = start_host[j] + mt_chunk_count(len);
        if (len == 0) continue;
        mt_mtl_call one;
        mt_mtl_begin(&one);
        mt_mtl_arg x;
        if (!(rc = mt_mtl_stage(&one, &x, table[j], len * 4, MT_MTL_IN, NULL)))
            rc = chunk_partials(&one, &x, &partials, len, start_host[j], kind);
        mt_mtl_end(&one, 0);
        if (rc) goto done;
    }
    own_start_host[0] = 0;
    own_start_host[1] = own_chunks;
    if ((rc = finish(&partials, &start, &own, n, 0, kind)) ||
        (rc = chunk_partials(&call, &own, &own_partials, n, 0, kind)))
        goto done;
    float *total_dev;
    mt_mtl_arg total_arg;
    if ((rc = mt_mtl_scratch(&call, &total_arg, 4, (void **)&total_dev)) ||
        (rc = finish(&own_partials, &own_start, &total_arg, 1, 0, kind)))
        goto done;
    *total = mt_canonical_nan(*total_dev);
    if (norms)
        for (int32_t j = 0; j < n; ++j) norms[j] = mt_canonical_nan(own_host[j]);
done:
    mt_mtl_end(&call, 0);
    return rc;
}

int mt_mtl_first_nonfinite(int32_t *first, float *const *table, const int32_t *offsets, int32_t n) {
    int rc = MT_OK;
    *first = -1;
    for (int32_t j = 0; j < n && *first < 0 && rc == MT_OK; ++j) {
        int64_t len = (int64_t)offsets[j + 1] - offsets[j];
        if (len == 0) continue;
        mt_mtl_call call;
        mt_mtl_begin(&call);
        mt_mtl_arg x, words;
        int bad[2] = {0, 0};
        if (!(rc = mt_mtl_stage(&call, &x, table[j], len * 4, MT_MTL_IN, NULL)) &&
            !(rc = mt_mtl_prepass(&call, &x, NULL, len, &words, bad)) && bad[0])
            *first = j;
        mt_mtl_end(&call, 0);
    }
    return rc;
}

int mt_mtl_clip_total(int kind, float *total, float *const *grads, const int32_t *offsets, int32_t n) {
    int rc = mt_mtl_norms(kind, NULL, total, grads, offsets, n);
    if (rc || mt_is_finite(*total)) return rc;
    int32_t j;
    if ((rc = mt_mtl_first_nonfinite(&j, grads, offsets, n))) return rc;
    if (j >= 0) return mt_fail(MT_ENONFINITE, "grads[%d] holds NaN or inf; nothing was written", (int)j);
    return mt_fail(MT_ENONFINITE, "the total gradient norm overflows float32 (inf); nothing was written");
}

int mt_mtl_scale_list(float *const *table, const int32_t *offsets, int32_t n, float coef) {
    int rc = MT_OK;
    for (int32_t j = 0; j < n && rc == MT_OK; ++j) {
        int64_t len = (int64_t)offsets[j + 1] - offsets[j];
        if (len == 0) continue;
        mt_mtl_call call;
        mt_mtl_begin(&call);
        mt_mtl_arg args[2];
        mt_mtl_scale_params p = {len, coef, 0};
        mt_mtl_bytes(&args[1], &p, sizeof p);
        if (!(rc = mt_mtl_stage(&call, &args[0], table[j], len * 4, MT_MTL_INOUT, NULL)))
            rc = mt_mtl_launch("mt_k_scale", args, 2, len);
        mt_mtl_end(&call, rc == MT_OK);
    }
    return rc;
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
    rc = error_if_nonfinite ? mt_mtl_clip_total(kind, &total, grads, offsets, n_tensors)
                            : mt_mtl_norms(kind, NULL, &total, grads, offsets, n_tensors);
    if (rc) return rc;
    float coef = mt_clip_applied(max_norm, total);
    if (coef != 1.0f && (rc = mt_mtl_scale_list(grads, offsets, n_tensors, coef))) return rc;
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
    return mt_mtl_norms(kind, tensor_norms, total_norm, grads, offsets, n_tensors);
}

int mt_clip_grad_norm(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm, float norm_type,
                      int32_t error_if_nonfinite, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(clip_body(grads, norm_out, offsets, max_norm, norm_type, error_if_nonfinite, n_tensors));
}

int mt_grad_norms(float *tensor_norms, float *total_norm, float *const *grads, const int32_t *offsets,
                  float norm_type, int32_t n_tensors) {
    MT_RETURN_IN_FP_ENV(grad_norms_body(tensor_norms, total_norm, grads, offsets, norm_type, n_tensors));
}
