/* mt_cpu_lm_head.c -- the chunked LM head (mt_lm_head_loss) on the CPU oracle.
 *
 * Contract: the bits of linear_forward -> cross_entropy -> linear_backward run separately
 * (loss.md, linear.md), with at most chunk_rows rows of logits alive. Per chunk of rows:
 * logits = the forward GEMM (+ bias); mt_cross_entropy on the chunk with the whole call's
 * divisor (so g = 1 / D is the unsplit one) gives the rows' losses and dlogits;
 * d_hidden rows = dlogits . weight; the weight and bias gradients continue each token leaf's
 * chain across chunk boundaries (the GEMM's accumulate mode) and push every finished leaf onto
 * a stack of complete subtrees (mt_token_acc), which ends as the pairwise tree over leaves.
 * The loss is the token rule over all rows' losses, divided by D for the mean.
 */
#include <string.h>
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"

#define LM_CHUNK_FLOATS ((int64_t)1 << 23)   /* default chunk: about 32 MB of logits */

uint64_t mt_lm_head_features(void) { return MT_FEATURE_LM_HEAD; }

typedef struct {
    mt_gemm_b fwd, bwd;              /* weight packed for logits and for d_hidden */
    mt_token_acc dw, db;             /* running token trees of the weight and bias gradients */
    float *logits, *dlogits, *losses, *partials;   /* dlogits: mt_cross_entropy does not write in place */
    int64_t kept;
} lm_state;

/* Targets in range (or ignored), the count D of kept rows, and finite inputs. */
static int check_lm_inputs(const mt_lm_args *a, int64_t *kept) {
    int rc = mt_check_targets(kept, a->targets, a->target_bytes, a->rows, a->vocab, a->ignore_index);
    if (rc) return rc;
    if (mt_cpu_nonfinite(a->hidden, a->rows * a->width))
        return mt_fail(MT_ENONFINITE, "hidden holds NaN or inf; nothing was written");
    if (mt_cpu_nonfinite(a->weight, a->vocab * a->width))
        return mt_fail(MT_ENONFINITE, "weight holds NaN or inf; nothing was written");
    if (a->bias && mt_cpu_nonfinite(a->bias, a->vocab))
        return mt_fail(MT_ENONFINITE, "bias holds NaN or inf; nothing was written");
    return MT_OK;
}

static void free_state(lm_state *s, const mt_lm_args *a) {
    mt_cpu_gemm_free_b(&s->fwd);
    mt_cpu_gemm_free_b(&s->bwd);
    mt_token_acc_free(&s->dw);
    mt_token_acc_free(&s->db);
    mt_scratch_free(s->logits, a->chunk * a->vocab * (int64_t)sizeof(float));
    mt_scratch_free(s->dlogits, a->chunk * a->vocab * (int64_t)sizeof(float));
    mt_scratch_free(s->losses, a->rows * (int64_t)sizeof(float));
    mt_scratch_free(s->partials, mt_token_leaves(a->rows) * (int64_t)sizeof(float));
}

static int init_state(lm_state *s, const mt_lm_args *a) {
    memset(s, 0, sizeof *s);
    int rc;
    int64_t v = a->vocab, w = a->width;
    if ((rc = mt_cpu_gemm_pack_b(&s->fwd, a->weight, 1, w, w, v))) return rc;            /* B(p,j) = W[j,p] */
    if (a->d_hidden && (rc = mt_cpu_gemm_pack_b(&s->bwd, a->weight, w, 1, v, w))) return rc; /* B(p,j) = W[p,j] */
    if ((rc = mt_token_acc_init(&s->dw, v * w, MT_SAB_LM_HEAD)) || (rc = mt_token_acc_init(&s->db, v, MT_SAB_LM_HEAD)))
        return rc;
    s->logits = (float *)mt_scratch_alloc(a->chunk * v * (int64_t)sizeof(float), "a chunk of logits");
    if (a->d_hidden || a->d_weight || a->d_bias)
        s->dlogits = (float *)mt_scratch_alloc(a->chunk * v * (int64_t)sizeof(float), "a chunk of dlogits");
    s->losses = (float *)mt_scratch_alloc(a->rows * (int64_t)sizeof(float), "the rows' losses");
    s->partials = (float *)mt_scratch_alloc(mt_token_leaves(a->rows) * (int64_t)sizeof(float), "loss partials");
    if ((a->chunk && (!s->logits || ((a->d_hidden || a->d_weight || a->d_bias) && !s->dlogits))) || (a->rows && (!s->losses || !s->partials))) return MT_ENOMEM;
    return MT_OK;
}

/* The bias gradient of rows [r0, r1) of one leaf, continuing its chain: acc + dlogits[r, v]. */
static void bias_leaf_rows(float *acc, const float *dlogits, int64_t n, int64_t vocab, int fresh) {
    if (fresh) memset(acc, 0, (size_t)vocab * sizeof(float));
    for (int64_t r = 0; r < n; ++r)
        for (int64_t v = 0; v < vocab; ++v) acc[v] = acc[v] + dlogits[r * vocab + v];
}

/* Weight and bias gradients of chunk rows [r0, r0 + n), leaf by leaf. */
static int gradients_of_chunk(lm_state *s, const mt_lm_args *a, int64_t r0, int64_t n) {
    int64_t v = a->vocab, w = a->width;
    for (int64_t r = r0; r < r0 + n;) {
        int64_t leaf_end = (r / MT_TOKEN_LEAF + 1) * MT_TOKEN_LEAF;
        int64_t end = leaf_end < r0 + n ? leaf_end : r0 + n;
        int fresh = r % MT_TOKEN_LEAF == 0, done = end == leaf_end || end == a->rows;
        const float *dl = s->dlogits + (r - r0) * v;
        if (a->d_weight && w > 0) {     /* width 0: d_weight holds nothing */
            float *acc = mt_token_acc_leaf(&s->dw);
            if (!acc) return MT_ENOMEM;
            int rc = mt_cpu_gemm(acc, w, dl, 1, v, a->hidden + r * w, w, 1, v, w, end - r, !fresh, NULL);
            if (rc) return rc;
            if (done) mt_token_acc_push(&s->dw);
        }
        if (a->d_bias) {
            float *acc = mt_token_acc_leaf(&s->db);
            if (!acc) return MT_ENOMEM;
            bias_leaf_rows(acc, dl, end - r, v, fresh);
            if (done) mt_token_acc_push(&s->db);
        }
        r = end;
    }
    return MT_OK;
}

/* One chunk: logits, the rows' losses and dlogits, then the gradients. */
static int run_chunk(lm_state *s, const mt_lm_args *a, int64_t r0, int64_t n) {
    int64_t v = a->vocab, w = a->width;
    int want_grad = a->d_hidden || a->d_weight || a->d_bias;
    int rc = mt_cpu_gemm_packed(s->logits, v, a->hidden + r0 * w, w, 1, &s->fwd, n, 0, a->bias);
    if (rc) return rc;
    const char *t = (const char *)a->targets + r0 * a->target_bytes;
    float ignored;
    int32_t red = a->reduction == MT_REDUCTION_NONE ? MT_REDUCTION_NONE : a->reduction;
    mt_logits_of_lm_head(r0, a->bias != NULL);   /* a non-finite logit is an overflow of hidden @ weight.T */
    rc = mt_cross_entropy(&ignored, s->losses + r0, want_grad ? s->dlogits : NULL, s->logits, t, a->target_bytes,
                          n, v, a->ignore_index, red, a->label_smoothing,
                          a->reduction == MT_REDUCTION_MEAN ? (a->num_items ? a->num_items : s->kept) : 0);
    mt_logits_of_lm_head(-1, 0);
    if (rc) return rc;
    if (a->d_hidden && (rc = mt_cpu_gemm_packed(a->d_hidden + r0 * w, w, s->dlogits, v, 1, &s->bwd, n, 0, NULL)))
        return rc;
    return gradients_of_chunk(s, a, r0, n);
}

int mt_lm_head_run(mt_lm_args *a) {
    int rc;
    int64_t kept = 0;
    if ((rc = check_lm_inputs(a, &kept))) return rc;
    if (!a->chunk) a->chunk = LM_CHUNK_FLOATS / a->vocab > 0 ? LM_CHUNK_FLOATS / a->vocab : 1;
    if (a->chunk > a->rows) a->chunk = a->rows;
    lm_state s;
    if ((rc = init_state(&s, a))) goto out;
    s.kept = kept;
    for (int64_t r0 = 0; r0 < a->rows && !rc; r0 += a->chunk)
        rc = run_chunk(&s, a, r0, a->rows - r0 < a->chunk ? a->rows - r0 : a->chunk);
    if (rc) goto out;
    if (a->d_weight && a->width > 0) mt_token_acc_finish(&s.dw, a->d_weight);
    if (a->d_bias) mt_token_acc_finish(&s.db, a->d_bias);
    if (a->reduction == MT_REDUCTION_NONE) {
        if (a->rows) memcpy(a->row_loss, s.losses, (size_t)a->rows * sizeof(float));   /* 0 rows: no buffer */
    } else {
        float total = mt_token_sum(s.losses, a->rows, s.partials);
        float divisor = (float)(a->num_items ? a->num_items : kept);
        *a->loss_out = a->reduction != MT_REDUCTION_MEAN ? total
                       : divisor == 0.0f ? mt_bits_f32(MT_MATH_QNAN) : total / divisor;
    }
out:
    free_state(&s, a);
    return rc;
}
