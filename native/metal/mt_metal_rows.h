/* mt_metal_rows.h -- what RMSNorm and LayerNorm on Metal share: their kernels' parameters, a row
 * scalar from a chunk fold of every row (mt_metal_clip.h's folds, then mt_k_rms_rows), and the
 * refusal of a non-finite input before anything is written (mt_metal_rows.c). */
#ifndef MT_METAL_ROWS_H
#define MT_METAL_ROWS_H
#include "mt_metal_host.h"

mt_mtl_rms_params mt_mtl_rows_params(int64_t rows, int64_t dim, float eps, int has_w, int has_b);
/* out[r] (a scratch of the call): the fold `kind` of row r (x; dy, w and the per-row ra, rb where
 * the kind reads them), its chunk rows walked backwards when `reversed`, finished by `op`
 * (MT_MTL_RMS_*, MT_MTL_LN_MEAN; op K reads rstd = ra). */
int mt_mtl_row_scalar(mt_mtl_call *call, mt_mtl_arg *out, int kind, int op, int reversed, const mt_mtl_arg *x,
                      const mt_mtl_arg *dy, const mt_mtl_arg *w, const mt_mtl_arg *ra, const mt_mtl_arg *rb,
                      mt_mtl_rms_params p);
/* "<name> holds NaN or inf; nothing was written" when the n elements bound in `in` (NULL: none)
 * hold one. */
int mt_mtl_refuse_nonfinite(mt_mtl_call *call, const mt_mtl_arg *in, int64_t n, const char *name);
#endif
