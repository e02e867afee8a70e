/* mt_metal_loss.h -- what the LM head (mt_metal_lm_head.c) takes from the Metal cross-entropy
 * (mt_metal_loss.c): the loss of rows it bound itself, and the token rule's total. */
#ifndef MT_METAL_LOSS_H
#define MT_METAL_LOSS_H
#include "mt_metal_host.h"

/* The plain cross-entropy (index targets, no class weight, no positions) of `rows` rows of
 * `vocab` logits bound in x, their targets in t: the rows' losses into rl and the gradient into
 * d (NULL: none; it may be x itself), with the mean's divisor `items` (the whole LM head's D, so
 * g = 1 / D is the unsplit one). A non-finite row is refused before either is written. */
int mt_mtl_ce_rows(mt_mtl_call *call, const mt_mtl_arg *x, const mt_mtl_arg *t, const mt_mtl_arg *rl,
                   const mt_mtl_arg *d, int64_t rows, int64_t vocab, int32_t target_bytes, int64_t ignore_index,
                   int32_t reduction, float label_smoothing, int64_t items);
/* lo (one float) <- the token rule over the n floats of v: as it is ('sum'), or divided by
 * `divisor` ('mean'; a zero divisor gives the canonical NaN). */
int mt_mtl_ce_total(mt_mtl_call *call, const mt_mtl_arg *lo, const mt_mtl_arg *v, int64_t n, int32_t reduction,
                    float divisor);
#endif
