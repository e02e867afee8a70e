/* mt_metal_token_stack.c -- the pairwise tree over whole arrays, built on the fly (see
 * mt_metal_token_stack.h). The gradient accumulation and the LM head's weight and bias
 * gradients build their trees with it. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_token_stack.h"

int mt_mtl_add2(const mt_mtl_arg *dst, const mt_mtl_arg *a, const mt_mtl_arg *b, int64_t n) {
    mt_mtl_count_params p = {n};
    mt_mtl_arg args[4] = {*dst, *a, *b};
    return mt_mtl_launch_with("mt_k_add2", args, 4, &p, sizeof p, n);
}

int mt_mtl_copy(const mt_mtl_arg *dst, const mt_mtl_arg *src, int64_t n) {
    mt_mtl_count_params p = {n};
    mt_mtl_arg args[3] = {*dst, *src};
    return mt_mtl_launch_with("mt_k_copy", args, 3, &p, sizeof p, n);
}

void mt_mtl_stack_init(mt_mtl_token_stack *s, mt_mtl_call *call, int64_t n, int merge) {
    s->call = call;
    s->top = s->have = 0;
    s->merge = merge;
    s->n = n;
    s->pushed = 0;
}

int mt_mtl_stack_slot(mt_mtl_token_stack *s, mt_mtl_arg *leaf) {
    if (s->top == MT_MTL_STACK_DEPTH)
        return mt_fail(MT_ENOMEM, "the token tree holds %d subtrees, its most", MT_MTL_STACK_DEPTH);
    if (s->top == s->have) {
        int rc = mt_mtl_scratch(s->call, &s->slot[s->top], s->n * 4, NULL);
        if (rc) return rc;
        ++s->have;
    }
    *leaf = s->slot[s->top];
    return MT_OK;
}

int mt_mtl_stack_push(mt_mtl_token_stack *s, const mt_mtl_arg *src) {
    uint64_t c = (uint64_t)++s->pushed;
    int rc;
    if (s->merge && !(c & 1)) {       /* a right leaf: added into its left neighbour at once */
        mt_mtl_arg leaf = s->slot[s->top];
        if ((rc = mt_mtl_add2(&s->slot[s->top - 1], &s->slot[s->top - 1], src ? src : &leaf, s->n))) return rc;
        for (c >>= 1; !(c & 1); c >>= 1) {      /* then one merge per further trailing zero bit */
            if ((rc = mt_mtl_add2(&s->slot[s->top - 2], &s->slot[s->top - 2], &s->slot[s->top - 1], s->n))) return rc;
            --s->top;
        }
        return MT_OK;
    }
    mt_mtl_arg leaf;
    if ((rc = mt_mtl_stack_slot(s, &leaf)) || (src && (rc = mt_mtl_copy(&leaf, src, s->n)))) return rc;
    ++s->top;
    return MT_OK;
}

int mt_mtl_stack_finish(mt_mtl_token_stack *s, const mt_mtl_arg *out) {
    if (s->top == 0) {          /* no leaf: the empty tree, +0.0 (a new slot is a zeroed scratch) */
        mt_mtl_arg zeros;
        int rc = mt_mtl_stack_slot(s, &zeros);
        return rc ? rc : mt_mtl_copy(out, &zeros, s->n);
    }
    if (s->top == 1) return mt_mtl_copy(out, &s->slot[0], s->n);
    int rc = mt_mtl_add2(out, &s->slot[s->top - 2], &s->slot[s->top - 1], s->n);
    for (int j = s->top - 3; j >= 0 && rc == MT_OK; --j) rc = mt_mtl_add2(out, &s->slot[j], out, s->n);
    return rc;
}
