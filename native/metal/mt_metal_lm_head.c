/* mt_metal_lm_head.c -- the chunked LM head (mt_lm_head_loss) on Metal (contract:
 * native/contracts/lm_head.md): the oracle's plan (native/cpu_oracle/mt_cpu_lm_head.c) with the
 * Metal linear's kernels (mt_metal_linear.metal) and cross-entropy (mt_metal_loss.h). The
 * checks come first, in the oracle's order: the arguments, the targets (read on the host), then
 * NaN or inf in hidden, weight or bias, before anything is written. Per chunk of rows: logits =
 * mt_k_linear_chain (+ bias) into one scratch; the chunk's cross-entropy with the whole call's
 * divisor writes the rows' losses and, in place, dlogits; d_hidden rows = dlogits . weight
 * (mt_k_linear_chain's DA); the weight and bias gradients continue each token leaf's chain
 * across chunk boundaries (mt_k_linear_leaves resuming) and push every finished leaf onto a
 * stack of complete subtrees (mt_metal_token_stack.h), so log2(leaves) + 2 partial gradients
 * are alive. The loss is the token rule over every row's loss, divided once by D for the mean. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_loss.h"
#include "mt_metal_rows.h"
#include "mt_metal_token_stack.h"
#include "mt_pinned.h"

#define LM_CHUNK_FLOATS ((int64_t)1 << 23)   /* the default chunk: about 32 MB of logits */

uint64_t mt_lm_head_features(void) { return MT_FEATURE_LM_HEAD; }

/* A call's bound buffers (b: bias, t: targets, dh, dw, db: the gradients, x: a chunk of logits,
 * then of dlogits; losses: every row's loss) and its gradients' token stacks. */
typedef struct {
    const mt_lm_args *a;
    mt_mtl_call *call;
    mt_mtl_arg hidden, weight, b, t, dh, dw, db, x, losses;
    mt_mtl_token_stack dw_tree, db_tree;
    int64_t items;   /* the mean's divisor D (0 for 'sum') */
} lm_run;

static mt_mtl_arg at(mt_mtl_arg arg, int64_t bytes) {
    arg.offset += bytes;
    return arg;
}

/* The leaf rows [r, end) of op DW or DB (dlogits from chunk row r - r0) into the tree's slot;
 * fresh: the leaf's first rows; done: its last. */
static int leaf_rows(lm_run *s, mt_mtl_token_stack *tree, int op, int64_t r, int64_t r0, int64_t end, int fresh,
                     int done) {
    const mt_lm_args *a = s->a;
    mt_mtl_arg args[4] = {at(s->x, (r - r0) * a->vocab * 4), at(s->hidden, r * a->width * 4)};
    mt_mtl_linear_params p = {end - r, a->vocab, a->width, op, 0, !fresh};
    int rc = mt_mtl_stack_slot(tree, &args[2]);
    if (rc || (rc = mt_mtl_launch_with("mt_k_linear_leaves", args, 4, &p, sizeof p,
                                       op == MT_MTL_LINEAR_DB ? p.n : p.n * p.k)))
        return rc;
    return done ? mt_mtl_stack_push(tree, NULL) : MT_OK;
}

/* One chunk, rows [r0, r0 + n): logits, the rows' losses and dlogits, d_hidden, then the
 * weight and bias gradients leaf by leaf. */
static int run_chunk(lm_run *s, int64_t r0, int64_t n) {
    const mt_lm_args *a = s->a;
    const int64_t v = a->vocab, w = a->width;
    const int want_grad = a->d_hidden || a->d_weight || a->d_bias;
    mt_mtl_arg fwd[5] = {s->x, at(s->hidden, r0 * w * 4), s->weight, s->b};
    mt_mtl_linear_params p = {n, v, w, MT_MTL_LINEAR_OUT, a->bias != NULL, 0};
    int rc = mt_mtl_launch_with("mt_k_linear_chain", fwd, 5, &p, sizeof p, n * v);
    if (rc) return rc;
    mt_mtl_arg t = at(s->t, r0 * a->target_bytes), rl = at(s->losses, r0 * 4);
    mt_mtl_call chunk;      /* the loss's scratch, released with the chunk */
    mt_mtl_begin(&chunk);
    mt_logits_of_lm_head(r0, a->bias != NULL);   /* a non-finite logit is an overflow of hidden @ weight.T */
    rc = mt_mtl_ce_rows(&chunk, &s->x, &t, &rl, want_grad ? &s->x : NULL, n, v, a->target_bytes, a->ignore_index,
                        a->reduction, a->label_smoothing, s->items);
    mt_logits_of_lm_head(-1, 0);
    mt_mtl_end(&chunk, 0);
    if (rc) return rc;
    if (a->d_hidden && w > 0) {
        mt_mtl_arg bwd[5] = {at(s->dh, r0 * w * 4), s->x, s->weight, s->weight};
        mt_mtl_linear_params q = {n, v, w, MT_MTL_LINEAR_DA, 0, 0};
        if ((rc = mt_mtl_launch_with("mt_k_linear_chain", bwd, 5, &q, sizeof q, n * w))) return rc;
    }
    for (int64_t r = r0; r < r0 + n;) {
        const int64_t leaf_end = (r / MT_TOKEN_LEAF + 1) * MT_TOKEN_LEAF, end = leaf_end < r0 + n ? leaf_end : r0 + n;
        const int fresh = r % MT_TOKEN_LEAF == 0, done = end == leaf_end || end == a->rows;
        if (a->d_weight && w > 0 && (rc = leaf_rows(s, &s->dw_tree, MT_MTL_LINEAR_DW, r, r0, end, fresh, done)))
            return rc;
        if (a->d_bias && (rc = leaf_rows(s, &s->db_tree, MT_MTL_LINEAR_DB, r, r0, end, fresh, done))) return rc;
        r = end;
    }
    return MT_OK;
}

/* The caller's buffers bound, the inputs' finiteness checked, the chunks run, the trees and
 * the loss finished. */
static int lm_run_call(lm_run *s, int64_t kept) {
    const mt_lm_args *a = s->a;
    mt_mtl_call *call = s->call;
    const int64_t v = a->vocab, w = a->width, rows = a->rows;
    int rc;
    if ((rc = mt_mtl_stage(call, &s->hidden, a->hidden, rows * w * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, &s->weight, a->weight, v * w * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, &s->b, a->bias, a->bias ? v * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, &s->t, a->targets, rows * a->target_bytes, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(call, &s->hidden, rows * w, "hidden")) ||
        (rc = mt_mtl_refuse_nonfinite(call, &s->weight, v * w, "weight")) ||
        (rc = mt_mtl_refuse_nonfinite(call, a->bias ? &s->b : NULL, v, "bias")) ||
        (rc = mt_mtl_stage(call, &s->dh, a->d_hidden, a->d_hidden ? rows * w * 4 : 0, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_stage(call, &s->dw, a->d_weight, a->d_weight ? v * w * 4 : 0, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_stage(call, &s->db, a->d_bias, a->d_bias ? v * 4 : 0, MT_MTL_OUT, NULL)))
        return rc;
    if (rows > 0 &&
        ((rc = a->reduction == MT_REDUCTION_NONE ? mt_mtl_stage(call, &s->losses, a->row_loss, rows * 4, MT_MTL_OUT, NULL)
                                                 : mt_mtl_scratch(call, &s->losses, rows * 4, NULL)) ||
         (rc = mt_mtl_scratch(call, &s->x, a->chunk * v * 4, NULL))))
        return rc;
    mt_mtl_stack_init(&s->dw_tree, call, v * w, !MT_SAB_LM_HEAD);
    mt_mtl_stack_init(&s->db_tree, call, v, !MT_SAB_LM_HEAD);
    for (int64_t r0 = 0; r0 < rows && !rc; r0 += a->chunk) rc = run_chunk(s, r0, rows - r0 < a->chunk ? rows - r0 : a->chunk);
    if (rc || (a->d_weight && v * w > 0 && (rc = mt_mtl_stack_finish(&s->dw_tree, &s->dw))) ||
        (a->d_bias && (rc = mt_mtl_stack_finish(&s->db_tree, &s->db))) || a->reduction == MT_REDUCTION_NONE)
        return rc;
    const float divisor = (float)(a->num_items ? a->num_items : kept);
    if (rows == 0) {     /* the token rule over no rows is +0.0 */
        *a->loss_out = a->reduction != MT_REDUCTION_MEAN ? 0.0f : divisor == 0.0f ? mt_bits_f32(MT_MATH_QNAN) : 0.0f / divisor;
        return MT_OK;
    }
    mt_mtl_arg lo;
    return (rc = mt_mtl_stage(call, &lo, a->loss_out, 4, MT_MTL_OUT, NULL)) ? rc
           : mt_mtl_ce_total(call, &lo, &s->losses, rows, a->reduction, divisor);
}

int mt_lm_head_run(mt_lm_args *a) {
    int rc;
    int64_t kept = 0;
    if ((rc = mt_check_targets(&kept, a->targets, a->target_bytes, a->rows, a->vocab, a->ignore_index)) ||
        (rc = mt_mtl_open()))
        return rc;
    if (!a->chunk) a->chunk = LM_CHUNK_FLOATS / a->vocab > 0 ? LM_CHUNK_FLOATS / a->vocab : 1;
    if (a->chunk > a->rows) a->chunk = a->rows;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    lm_run s = {a, &call};
    s.items = a->reduction == MT_REDUCTION_MEAN ? (a->num_items ? a->num_items : kept) : 0;
    rc = lm_run_call(&s, kept);
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}
