/* mt_metal_token_stack.h -- the pairwise tree over whole arrays, built on the fly: a stack of
 * complete subtrees (linear.md's token rule; accumulate.md's tree over microbatches). Leaf k is
 * pushed onto the stack, then the two top subtrees merge (left + right, one mt_k_add2) once per
 * trailing zero bit of k + 1; the end folds the stack from its top, S[j] + (S[j+1] + ...), which
 * is mt_tree_fold over the leaves. Each array is n floats, a scratch of the call. */
#ifndef MT_METAL_TOKEN_STACK_H
#define MT_METAL_TOKEN_STACK_H
#include "mt_metal_host.h"

#define MT_MTL_STACK_DEPTH 40   /* leaves < 2^39 with merging; without (sabotage) as many leaves */

typedef struct {
    mt_mtl_call *call;
    mt_mtl_arg slot[MT_MTL_STACK_DEPTH];
    int top, have, merge;   /* merge 0: leaves stay apart, so the end folds them right to left */
    int64_t n, pushed;
} mt_mtl_token_stack;

void mt_mtl_stack_init(mt_mtl_token_stack *s, mt_mtl_call *call, int64_t n, int merge);
/* *leaf <- the buffer the next leaf is written into (its contents undefined until written). */
int mt_mtl_stack_slot(mt_mtl_token_stack *s, mt_mtl_arg *leaf);
/* Push the next leaf: `src` (n floats), or (src NULL) what was written into the slot. */
int mt_mtl_stack_push(mt_mtl_token_stack *s, const mt_mtl_arg *src);
/* out <- the tree over every pushed leaf (none: +0.0). */
int mt_mtl_stack_finish(mt_mtl_token_stack *s, const mt_mtl_arg *out);
/* dst <- a + b, and dst <- src, over n floats (mt_k_add2, mt_k_copy). */
int mt_mtl_add2(const mt_mtl_arg *dst, const mt_mtl_arg *a, const mt_mtl_arg *b, int64_t n);
int mt_mtl_copy(const mt_mtl_arg *dst, const mt_mtl_arg *src, int64_t n);
#endif
