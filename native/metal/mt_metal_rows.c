/* mt_metal_rows.c -- see mt_metal_rows.h. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_clip.h"
#include "mt_metal_elementwise.h"
#include "mt_metal_rows.h"
#include "mt_pinned.h"

mt_mtl_rms_params mt_mtl_rows_params(int64_t rows, int64_t dim, float eps, int has_w, int has_b) {
    mt_mtl_rms_params p;
    p.rows = rows;
    p.dim = dim;
    p.chunks = mt_chunk_count(dim);
    p.dimf = (float)dim;
    p.eps = eps;
    p.op = 0;
    p.has_w = has_w;
    p.has_b = has_b;
    p.pad = 0;
    return p;
}

int mt_mtl_row_scalar(mt_mtl_call *call, mt_mtl_arg *out, int kind, int op, int reversed, const mt_mtl_arg *x,
                      const mt_mtl_arg *dy, const mt_mtl_arg *w, const mt_mtl_arg *ra, const mt_mtl_arg *rb,
                      mt_mtl_rms_params p) {
    mt_mtl_arg partials;
    int rc;
    if ((rc = mt_mtl_scratch(call, &partials, p.rows * p.chunks * 4, NULL)) ||
        (rc = mt_mtl_scratch(call, out, p.rows * 4, NULL)))
        return rc;
    mt_mtl_norm_params f = {p.dim, 0, p.rows, kind, reversed, p.has_w, 0};
    if ((rc = mt_mtl_fold_rows(call, x, dy, w, ra, rb, &partials, &f))) return rc;
    p.op = op;
    mt_mtl_arg args[4] = {partials, ra ? *ra : *out, *out};
    return mt_mtl_launch_with("mt_k_rms_rows", args, 4, &p, sizeof p, p.rows);
}

int mt_mtl_refuse_nonfinite(mt_mtl_call *call, const mt_mtl_arg *in, int64_t n, const char *name) {
    if (!in || n == 0) return MT_OK;
    mt_mtl_arg words;
    int bad[2] = {0, 0};
    int rc = mt_mtl_prepass(call, in, NULL, n, &words, bad);
    if (rc) return rc;
    return bad[0] ? mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", name) : MT_OK;
}
