/* mt_cpu_loss.c -- cross-entropy on the CPU oracle (contract: native/contracts/loss.md).
 *
 * Order of a call: check the arguments; read every target (the smallest bad row is named)
 * and count the rows that are not ignored. Pass 1, rows in parallel, writes only our
 * scratch: each row's max (exact, so any order) and whether it holds a NaN or an infinity,
 * in one read; without a gradient also, the row now in cache, its softmax denominator and
 * smoothing sum by the chunk tree (mt_chunk_sum_exp, mt_chunk_sum). The first non-finite row
 * is refused. Only then is anything written. With a gradient, pass 2 (rows in parallel)
 * forms the sums there instead, keeping each e_j = mt_expf(x_j - m) in the dlogits row as
 * it is folded, then turns the row into (e_j / s - y_j) * g in place (mt_ce_grad): one exp
 * per logit, two reads of the logits and one write of dlogits in all. Then the row losses
 * (mt_ce_row_loss) and the token rule over them; loss_out is written last.
 * With reduction NONE, loss_out (if given) is not written and dlogits must be NULL. The mean
 * of no rows (every row ignored) is 0/0: written as the canonical NaN 0x7fc00000 of
 * math.md, since the bits of a NaN from 0/0 differ between vendors.
 */
#include <string.h>

#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

uint64_t mt_loss_features(void) { return MT_FEATURE_LOSS; }

/* The fold wrappers inline every pinned routine they call (mt_chunk_sum_exp is too large for
 * gcc to inline on its own), so each target_clones copy compiles it for its own ISA: that is
 * what lets the lane loops vectorize (mt_expf is branch-free for this). */
#if defined(__GNUC__) && !defined(__clang__)
#define CE_FLAT __attribute__((flatten))
#else
#define CE_FLAT
#endif

#define CE_MAX_VOCAB (INT64_C(1) << 24)
#define CE_MAX_CHUNKS (CE_MAX_VOCAB / MT_CHUNK)

typedef struct {
    const float *logits;
    const void *targets;
    int32_t target_bytes;
    int64_t n_rows, vocab, ignore_index;
    float *row_max;    /* (n_rows) pass 1: the max, or NaN for a row holding NaN or inf */
    float *row_min;    /* (n_rows) pass 1: the min (min - max >= MT_EXPF_MID_LO: mt_expf_mid) */
    float *row_sum;    /* (n_rows): the softmax denominator s of each row not ignored */
    float *row_x;      /* (n_rows): the tree sum of its logits (smoothing only) */
    float *row_loss;   /* (n_rows): the caller's row_loss or our scratch */
    float *dlogits;    /* (n_rows * vocab) or NULL */
    mt_ce_scalars c;
} ce_job;


/* ---- pass 1 (reads only): per row, the max and its finiteness in one read ----
 * The max runs on integer keys that order like the floats (negative ones with their
 * magnitude bits flipped), so it vectorizes as an integer max; NaN and inf show as an
 * all-ones exponent field. Without a gradient, the row's sums follow while it is in cache. */
static uint32_t order_key(uint32_t b) { return b ^ ((uint32_t)((int32_t)b >> 31) >> 1); }

CE_FLAT MT_SIMD static float row_max(const float *x, int64_t n, float *min_out) {
    const uint32_t *u = (const uint32_t *)x;
    int32_t top = INT32_MIN, bottom = INT32_MAX;
    uint32_t exp_top = 0;
    for (int64_t i = 0; i < n; ++i) {
        int32_t key = (int32_t)order_key(u[i]);
        uint32_t e = u[i] & 0x7f800000u;
        top = key > top ? key : top;
        bottom = key < bottom ? key : bottom;
        exp_top = e > exp_top ? e : exp_top;
    }
    *min_out = mt_bits_f32(order_key((uint32_t)bottom));
    if (exp_top == 0x7f800000u) return mt_bits_f32(MT_MATH_QNAN);
    return mt_bits_f32(order_key((uint32_t)top));
}

/* The softmax denominator's chunk fold (mt_chunk_sum_exp), each e_j also kept in `keep`
 * unless NULL, through mt_expf_mid when `mid`: four calls with both known, so that each
 * inlined copy loses the tests and vectorizes for its own case. */
CE_FLAT MT_SIMD static float chunk_sum_exp(const float *x, int64_t n, float m, float *keep, int mid) {
    if (mid) return keep ? mt_chunk_sum_exp(n, x, m, keep, 1) : mt_chunk_sum_exp(n, x, m, 0, 1);
    return keep ? mt_chunk_sum_exp(n, x, m, keep, 0) : mt_chunk_sum_exp(n, x, m, 0, 0);
}
CE_FLAT MT_SIMD static float chunk_sum(const float *x, int64_t n) { return mt_chunk_sum(n, x); }

/* Asks for the next floats while a chunk computes: a compute-heavy loop issues its loads too
 * slowly for the hardware prefetcher to keep a memory stream going. */
static void prefetch_floats(const float *p, const float *end, int64_t n) {
#if defined(__GNUC__)
    if (end - p < n) n = end - p;
    for (int64_t k = 0; k < n; k += 64 / (int64_t)sizeof(float)) __builtin_prefetch(p + k, 0, 3);
#else
    (void)p; (void)end; (void)n;
#endif
}

/* The chunk tree (clip.md) over a row: sum of e^(x_j - m) (kept in `keep` unless NULL), or
 * of x_j when m is NULL. `end` bounds the prefetch of what follows each chunk; `mid`: every
 * x_j - m is in mt_expf_mid's range. */
static float row_tree(const float *x, int64_t vocab, const float *m, float *keep, const float *end, int mid) {
    float part[CE_MAX_CHUNKS];
    int64_t chunks = mt_chunk_count(vocab);
    for (int64_t c = 0; c < chunks; ++c) {
        int64_t len = vocab - c * MT_CHUNK < MT_CHUNK ? vocab - c * MT_CHUNK : MT_CHUNK;
        const float *xc = x + c * MT_CHUNK;
        if (keep) prefetch_floats(xc + len, end, MT_CHUNK);
        part[c] = m ? chunk_sum_exp(xc, len, *m, keep ? keep + c * MT_CHUNK : 0, mid) : chunk_sum(xc, len);
    }
    return mt_tree_fold(part, chunks);
}

static int row_ignored(const ce_job *job, int64_t i) {
    return mt_index_at(job->targets, job->target_bytes, i) == job->ignore_index;
}

/* One row's sums into the scratch; `keep` (or NULL) receives the row's e_j. */
static void row_sums(ce_job *job, int64_t i, float *keep) {
    const float *x = job->logits + i * job->vocab, *end = job->logits + job->n_rows * job->vocab;
    /* x_j - m >= min - m (rounding is monotonic): one test for the whole row */
    int mid = job->row_min[i] - job->row_max[i] >= MT_EXPF_MID_LO;
    job->row_sum[i] = row_tree(x, job->vocab, &job->row_max[i], keep, end, mid);
    if (job->c.eps != 0.0f) job->row_x[i] = row_tree(x, job->vocab, 0, 0, end, 0);
}

static void max_rows(void *ctx, int64_t b, int64_t e) {
    ce_job *job = (ce_job *)ctx;
    for (int64_t i = b; i < e; ++i) {
        job->row_max[i] = row_max(job->logits + i * job->vocab, job->vocab, &job->row_min[i]);
        if (!job->dlogits && mt_is_finite(job->row_max[i]) && !row_ignored(job, i)) row_sums(job, i, 0);
    }
}

/* ---- pass 2 (after every refusal): the gradient rows, then the row losses ---- */
/* e_j (kept in d) becomes (e_j / s - off) * g: every class as a non-target. */
CE_FLAT MT_SIMD static void grad_from_kept(float *d, int64_t n, float s, const mt_ce_scalars *cp) {
    mt_ce_scalars c = *cp;
    for (int64_t j = 0; j < n; ++j) d[j] = mt_ce_grad(d[j], s, 0, &c);
}

static void grad_rows(void *ctx, int64_t b, int64_t e) {
    ce_job *job = (ce_job *)ctx;
    int64_t v = job->vocab;
    for (int64_t i = b; i < e; ++i) {
        float *d = job->dlogits + i * v;
        if (row_ignored(job, i)) {
            memset(d, 0, sizeof(float) * (size_t)v);   /* +0.0 is all zero bits */
            continue;
        }
        int64_t t = mt_index_at(job->targets, job->target_bytes, i);
        row_sums(job, i, d);
        float et = d[t], s = job->row_sum[i];
        grad_from_kept(d, v, s, &job->c);
        d[t] = mt_ce_grad(et, s, 1, &job->c);
    }
}

static void loss_rows(const ce_job *job) {
    for (int64_t i = 0; i < job->n_rows; ++i) {
        int64_t t = mt_index_at(job->targets, job->target_bytes, i);
        const float *x = job->logits + i * job->vocab;
        job->row_loss[i] = t == job->ignore_index ? 0.0f
                         : mt_ce_row_loss(job->row_max[i], job->row_sum[i], x[t],
                                          job->c.eps != 0.0f ? job->row_x[i] : 0.0f, &job->c);
    }
}

/* ---- refusals ---- */
static int64_t first_nonfinite_row(const float *row_max, int64_t n_rows) {
    for (int64_t i = 0; i < n_rows; ++i)
        if (!mt_is_finite(row_max[i])) return i;
    return -1;
}

MT_NOINLINE static int ce_body(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                               const void *targets, int32_t target_bytes, int64_t n_rows, int64_t vocab,
                               int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    int64_t kept = 0;
    if ((rc = mt_check_ce_args(loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab, reduction,
                         label_smoothing, num_items)) ||
        (rc = mt_check_targets(&kept, targets, target_bytes, n_rows, vocab, ignore_index)))
        return rc;
    int64_t leaves = mt_token_leaves(n_rows);
    int64_t floats = 4 * n_rows + (row_loss ? 0 : n_rows) + leaves;
    float *scratch = (float *)mt_scratch_alloc((int64_t)sizeof(float) * floats, "cross_entropy row scratch");
    if (floats > 0 && !scratch) return MT_ENOMEM;
    float divisor = (float)(num_items ? num_items : kept);   /* rounded to nearest */
    ce_job job = {logits, targets, target_bytes, n_rows, vocab, ignore_index, scratch, scratch + 3 * n_rows,
                  scratch + n_rows, scratch + 2 * n_rows, row_loss ? row_loss : scratch + 4 * n_rows, dlogits,
                  mt_ce_scalars_for(label_smoothing, vocab, reduction == MT_REDUCTION_MEAN, divisor)};
    mt_parallel_for_work(n_rows, 1, n_rows * vocab, max_rows, &job);
    int64_t bad = first_nonfinite_row(job.row_max, n_rows);
    if (bad >= 0) {
        mt_scratch_free(scratch, (int64_t)sizeof(float) * floats);
        return mt_fail_nonfinite_logits(bad);
    }
    if (dlogits) mt_parallel_for_work(n_rows, 1, n_rows * vocab, grad_rows, &job);
    loss_rows(&job);
    if (reduction != MT_REDUCTION_NONE) {
        float total = mt_token_sum(job.row_loss, n_rows, scratch + floats - leaves);
        if (reduction == MT_REDUCTION_MEAN)   /* no row counted: 0/0, as the canonical NaN */
            total = divisor != 0.0f ? total / divisor : mt_bits_f32(MT_MATH_QNAN);
        *loss_out = total;
    }
    mt_scratch_free(scratch, (int64_t)sizeof(float) * floats);
    return MT_OK;
}

int mt_cross_entropy(float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets,
                     int32_t target_bytes, int64_t n_rows, int64_t vocab, int64_t ignore_index, int32_t reduction,
                     float label_smoothing, int64_t num_items) {
    MT_RETURN_IN_FP_ENV(ce_body(loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab, ignore_index,
                                reduction, label_smoothing, num_items));
}
