/* mt_metal_layer_norm.c -- LayerNorm forward and backward on Metal (contract: native/contracts/
 * layer_norm.md; kernels: mt_metal_layer_norm.metal, the chunk folds of mt_metal_clip.metal and
 * the row scalars and leaf trees of mt_metal_rms_norm.metal). The checks are RMSNorm's; then a
 * pre-pass refuses a NaN or infinity in an input (forward x, weight, bias; backward dy, x,
 * weight), naming it, before anything is written (the oracle's order when it does not fuse the
 * check into its pass; the contract lets y and dx be undefined after a refusal, and they are not
 * even written here). Per row mu = mt_ln_mean(sum) and r = mt_rms_rstd(sum of (x - mu)^2); the
 * backward's mg, mgx the means of g and g * xhat; dweight and dbias by the token rule. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_clip.h"
#include "mt_metal_rows.h"
#include "mt_pinned.h"

uint64_t mt_layer_norm_features(void) { return MT_FEATURE_LAYER_NORM; }

/* mu and r of every row. */
static int row_stats(mt_mtl_call *call, mt_mtl_arg *mu, mt_mtl_arg *r, const mt_mtl_arg *x, mt_mtl_rms_params p) {
    int rc = mt_mtl_row_scalar(call, mu, MT_MTL_FOLD_SUM, MT_MTL_LN_MEAN, MT_SAB_LAYER_NORM, x, NULL, NULL, NULL, NULL, p);
    return rc ? rc : mt_mtl_row_scalar(call, r, MT_MTL_FOLD_DEVSQ, MT_MTL_RMS_RSTD, MT_SAB_LAYER_NORM, x, NULL, NULL, mu,
                                       NULL, p);
}

static int elems(int op, const mt_mtl_arg *out, const mt_mtl_arg *x, const mt_mtl_arg *dy, const mt_mtl_arg *w,
                 const mt_mtl_arg *b, const mt_mtl_arg *mu, const mt_mtl_arg *r, const mt_mtl_arg *mg,
                 const mt_mtl_arg *mgx, mt_mtl_rms_params p) {
    p.op = op;
    mt_mtl_arg args[10] = {*out, *x, *dy, *w, *b, *mu, *r, *mg, *mgx};
    return mt_mtl_launch_with("mt_k_ln_elems", args, 10, &p, sizeof p, p.rows * p.dim);
}

MT_NOINLINE static int forward_body(float *y, const float *x, const float *weight, const float *bias, float eps,
                                    int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_forward_args(y, x, eps, rows, dim)) || (rc = mt_mtl_open())) return rc;
    const int64_t n = rows * dim;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg ax, aw, ab, ay, mu, r;
    if ((rc = mt_mtl_stage(&call, &ax, x, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aw, weight, weight ? dim * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &ab, bias, bias ? dim * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &ax, n, "x")) || (rc = mt_mtl_refuse_nonfinite(&call, weight ? &aw : NULL, dim, "weight")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, bias ? &ab : NULL, dim, "bias")) || n == 0)
        goto done;
    mt_mtl_rms_params p = mt_mtl_rows_params(rows, dim, eps, weight != NULL, bias != NULL);
    if ((rc = mt_mtl_stage(&call, &ay, y, n * 4, MT_MTL_OUT, NULL)) || (rc = row_stats(&call, &mu, &r, &ax, p)))
        goto done;
    rc = elems(0, &ay, &ax, &ax, &aw, &ab, &mu, &r, &r, &r, p);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_layer_norm_forward(float *y, const float *x, const float *weight, const float *bias, float eps, int64_t rows,
                          int64_t dim) {
    MT_RETURN_IN_FP_ENV(forward_body(y, x, weight, bias, eps, rows, dim));
}

MT_NOINLINE static int backward_body(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                                     const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim)) || (rc = mt_mtl_open()))
        return rc;
    const int64_t n = rows * dim;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg ady, ax, aw, adx, adw, adb, mu, r, mg, mgx;
    if ((rc = mt_mtl_stage(&call, &ady, dy, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &ax, x, n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aw, weight, weight ? dim * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &ady, n, "dy")) || (rc = mt_mtl_refuse_nonfinite(&call, &ax, n, "x")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, weight ? &aw : NULL, dim, "weight")))
        goto done;
    if (!dx && !dweight && !dbias) goto done;
    mt_mtl_rms_params p = mt_mtl_rows_params(rows, dim, eps, weight != NULL, 0);
    if (n > 0 && (rc = row_stats(&call, &mu, &r, &ax, p))) goto done;
    if (dx && n > 0) {
        if ((rc = mt_mtl_stage(&call, &adx, dx, n * 4, MT_MTL_OUT, NULL)) ||
            (rc = mt_mtl_row_scalar(&call, &mg, MT_MTL_FOLD_LN_G, MT_MTL_LN_MEAN, MT_SAB_LAYER_NORM, &ax, &ady, &aw,
                                    NULL, NULL, p)) ||
            (rc = mt_mtl_row_scalar(&call, &mgx, MT_MTL_FOLD_LN_GX, MT_MTL_LN_MEAN, MT_SAB_LAYER_NORM, &ax, &ady, &aw,
                                    &mu, &r, p)) ||
            (rc = elems(1, &adx, &ax, &ady, &aw, &aw, &mu, &r, &mg, &mgx, p)))
            goto done;
    }
    if (dweight || dbias) {
        const int64_t leaves = mt_token_leaves(rows), size = (leaves ? leaves : 1) * dim * 4;
        mt_mtl_arg pw, pb;
        if ((dweight && (rc = mt_mtl_stage(&call, &adw, dweight, dim * 4, MT_MTL_OUT, NULL))) ||
            (dbias && (rc = mt_mtl_stage(&call, &adb, dbias, dim * 4, MT_MTL_OUT, NULL))) ||
            (rc = mt_mtl_scratch(&call, &pw, size, NULL)) || (rc = mt_mtl_scratch(&call, &pb, size, NULL)))
            goto done;
        mt_mtl_rms_params q = p;
        q.has_w = dweight != NULL;
        q.has_b = dbias != NULL;
        if (leaves > 0) {   /* no rows: every column's tree is empty, +0.0 (the scratch's zeros) */
            mt_mtl_arg args[7] = {ady, ax, mu, r, pw, pb};
            if ((rc = mt_mtl_launch_with("mt_k_ln_param_leaves", args, 7, &q, sizeof q, leaves * dim))) goto done;
        }
        for (int k = 0; k < 2 && rc == MT_OK; ++k) {
            if (!(k ? dbias : dweight)) continue;
            mt_mtl_arg tree[3] = {k ? pb : pw, k ? adb : adw};
            rc = mt_mtl_launch_with("mt_k_rms_dweight_tree", tree, 3, &q, sizeof q, dim);
        }
    }
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_layer_norm_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                           const float *weight, float eps, int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(backward_body(dx, dweight, dbias, dy, x, weight, eps, rows, dim));
}
