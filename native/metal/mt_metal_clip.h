/* mt_metal_clip.h -- the norms of clip.md on Metal, shared by clip_grad_norm_, the per-tensor
 * norms and the optimizer steps that clip (so a clip here and a clip inside a step give the same
 * bits), and the finiteness checks of a tensor list. */
#ifndef MT_METAL_CLIP_H
#define MT_METAL_CLIP_H
#include "mt_metal_host.h"

/* *total (and norms[j] when norms is not NULL) of the norm `kind` (MT_NORM_KIND_*) of the list,
 * NaNs canonical. Reads the tensors, writes nothing of the caller's but norms and total. */
int mt_mtl_norms(int kind, float *norms, float *total, float *const *table, const int32_t *offsets, int32_t n);
/* The total, or the refusal of a non-finite one naming the first bad gradient. */
int mt_mtl_clip_total(int kind, float *total, float *const *grads, const int32_t *offsets, int32_t n);
/* The first tensor of the list holding NaN or inf, or -1. */
int mt_mtl_first_nonfinite(int32_t *first, float *const *table, const int32_t *offsets, int32_t n);
/* The chunk partials of p->rows rows of p->n elements (x; dy, w and the per-row ra, rb where the
 * kind reads them, else NULL) into partials[p->at ..] (row r's chunk c at r * chunks + c), by
 * p->kind; lanes in a scratch of `call`. */
int mt_mtl_fold_rows(mt_mtl_call *call, const mt_mtl_arg *x, const mt_mtl_arg *dy, const mt_mtl_arg *w,
                     const mt_mtl_arg *ra, const mt_mtl_arg *rb, const mt_mtl_arg *partials,
                     const mt_mtl_norm_params *p);
/* Each tensor x = x * coef (canonical NaNs). */
int mt_mtl_scale_list(float *const *table, const int32_t *offsets, int32_t n, float coef);
#endif
