/* mt_metal_rms_norm.c -- RMSNorm forward and backward on Metal (contract: native/contracts/
 * rms_norm.md; kernels: mt_metal_rms_norm.metal and the chunk folds of mt_metal_clip.metal). The
 * oracle's order (native/cpu_oracle/mt_cpu_rms_norm.c): the argument checks, then the refusal of
 * a NaN or infinity in an input (x, then weight; backward dy, x, weight), naming it, before any
 * output is written; then per row the chunk tree and the pinned scalar steps, and dweight by the
 * token rule over rows. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_clip.h"
#include "mt_metal_rows.h"
#include "mt_pinned.h"

uint64_t mt_rms_norm_features(void) { return MT_FEATURE_RMS_NORM; }

static int elems(const mt_mtl_arg *out, const mt_mtl_arg *x, const mt_mtl_arg *dy, const mt_mtl_arg *w,
                 const mt_mtl_arg *rstd, const mt_mtl_arg *k, int op, mt_mtl_rms_params p) {
    p.op = op;
    mt_mtl_arg args[7] = {*out, *x, *dy, *w, *rstd, *k};
    return mt_mtl_launch_with("mt_k_rms_elems", args, 7, &p, sizeof p, p.rows * p.dim);
}

MT_NOINLINE static int forward_body(float *y, const float *x, const float *weight, float eps, int64_t rows,
                                    int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_forward_args(y, x, eps, rows, dim)) || (rc = mt_mtl_open())) return rc;
    const int64_t n = rows * dim;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg ax, aw, ay, r;
    if ((rc = mt_mtl_stage(&call, &ax, x, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aw, weight, weight ? dim * 4 : 0, MT_MTL_IN, NULL)))
        goto done;
    if ((rc = mt_mtl_refuse_nonfinite(&call, &ax, n, "x")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, weight ? &aw : NULL, dim, "weight")))
        goto done;
    if (n == 0) goto done;
    if ((rc = mt_mtl_stage(&call, &ay, y, n * 4, MT_MTL_OUT, NULL))) goto done;
    mt_mtl_rms_params p = mt_mtl_rows_params(rows, dim, eps, weight != NULL, 0);
    if ((rc = mt_mtl_row_scalar(&call, &r, MT_MTL_NORM_L2, MT_MTL_RMS_RSTD, MT_SAB_RMS_NORM, &ax, NULL, &aw, NULL, NULL,
                                p)))
        goto done;
    rc = elems(&ay, &ax, &ax, &aw, &r, &r, 0, p);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_rms_norm_forward(float *y, const float *x, const float *weight, float eps, int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(forward_body(y, x, weight, eps, rows, dim));
}

MT_NOINLINE static int backward_body(float *dx, float *dweight, const float *dy, const float *x, const float *weight,
                                     float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim)) || (rc = mt_mtl_open()))
        return rc;
    const int64_t n = rows * dim;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg ady, ax, aw, adx, adw, r, k;
    if ((rc = mt_mtl_stage(&call, &ady, dy, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &ax, x, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aw, weight, weight ? dim * 4 : 0, MT_MTL_IN, NULL)))
        goto done;
    if ((rc = mt_mtl_refuse_nonfinite(&call, &ady, n, "dy")) || (rc = mt_mtl_refuse_nonfinite(&call, &ax, n, "x")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, weight ? &aw : NULL, dim, "weight")))
        goto done;
    if (!dx && !dweight) goto done;
    mt_mtl_rms_params p = mt_mtl_rows_params(rows, dim, eps, weight != NULL, 0);
    if (dweight && (rc = mt_mtl_stage(&call, &adw, dweight, dim * 4, MT_MTL_OUT, NULL))) goto done;
    if (n > 0 && (rc = mt_mtl_row_scalar(&call, &r, MT_MTL_NORM_L2, MT_MTL_RMS_RSTD, MT_SAB_RMS_NORM, &ax, NULL, &aw, NULL, NULL, p))) goto done;
    if (dx && n > 0) {
        if ((rc = mt_mtl_stage(&call, &adx, dx, n * 4, MT_MTL_OUT, NULL)) ||
            (rc = mt_mtl_row_scalar(&call, &k, MT_MTL_FOLD_GDOT, MT_MTL_RMS_K, MT_SAB_RMS_NORM, &ax, &ady, &aw, &r, NULL, p)) ||
            (rc = elems(&adx, &ax, &ady, &aw, &r, &k, 1, p)))
            goto done;
    }
    if (dweight) {
        const int64_t leaves = mt_token_leaves(rows);
        mt_mtl_arg partials;
        if ((rc = mt_mtl_scratch(&call, &partials, (leaves ? leaves : 1) * dim * 4, NULL))) goto done;
        if (leaves > 0) {   /* no rows: every column's tree is empty, +0.0 (the scratch's zeros) */
            mt_mtl_arg args[5] = {ady, ax, r, partials};
            if ((rc = mt_mtl_launch_with("mt_k_rms_dweight_leaves", args, 5, &p, sizeof p, leaves * dim))) goto done;
        }
        mt_mtl_arg tree[3] = {partials, adw};
        rc = mt_mtl_launch_with("mt_k_rms_dweight_tree", tree, 3, &p, sizeof p, dim);
    }
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_rms_norm_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight, float eps,
                         int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(backward_body(dx, dweight, dy, x, weight, eps, rows, dim));
}
