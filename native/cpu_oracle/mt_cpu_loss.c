/* mt_cpu_loss.c -- cross-entropy on the CPU oracle (contract: native/contracts/loss.md).
 *
 * Order of a call: check the arguments; read every target (the smallest bad row is named)
 * and count the rows that are not ignored; a dlogits overlapping the logits or the targets is
 * refused (the oracle never computes in place). Without a gradient, one pass, rows in
 * parallel, writes only our scratch: each row's max (exact, so any order) and whether it
 * holds a NaN or an infinity, then, the row now in cache, its softmax denominator and
 * smoothing sum by the chunk tree (mt_chunk_sum_exp, mt_chunk_sum). With a gradient, the one
 * pass (rows in parallel) takes each row's max and finiteness the same way, skips a row
 * holding NaN or inf, and forms the sums keeping each e_j = mt_expf(x_j - m) in the dlogits
 * row as it is folded, then turns the row into (e_j / s - y_j) * g in place (mt_ce_grad):
 * one exp per logit, one read of the logits and one write of dlogits in all. Then the first
 * non-finite row is refused (dlogits undefined, as loss.md allows; row_loss and loss_out not
 * yet written); else the row losses (mt_ce_row_loss) and the token rule over them;
 * loss_out is written last.
 * With reduction NONE, loss_out (if given) is not written and dlogits must be NULL. The mean
 * of no rows (every row ignored) is 0/0: written as the canonical NaN 0x7fc00000 of
 * math.md, since the bits of a NaN from 0/0 differ between vendors.
 */
#include <string.h>

#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_loss_args.h"
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
    float *row_max;    /* (n_rows): the max, or NaN for a row holding NaN or inf */
    float *row_min;    /* (n_rows): the min (min - max >= MT_EXPF_MID_LO: mt_expf_mid) */
    float *row_sum;    /* (n_rows): the softmax denominator s of each row not ignored */
    float *row_x;      /* (n_rows): the tree sum of its logits (smoothing only) */
    float *row_loss;   /* (n_rows): the caller's row_loss or our scratch */
    float *dlogits;    /* (n_rows * vocab) or NULL */
    mt_ce_scalars c;
} ce_job;


/* ---- per row, the max and its finiteness in one read ----
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
        if (mt_is_finite(job->row_max[i]) && !row_ignored(job, i)) row_sums(job, i, 0);
    }
}

/* ---- the gradient rows, then the row losses ---- */
/* e_j (kept in d) becomes (e_j / s - off) * g: every class as a non-target. */
CE_FLAT MT_SIMD static void grad_from_kept(float *d, int64_t n, float s, const mt_ce_scalars *cp) {
    mt_ce_scalars c = *cp;
    for (int64_t j = 0; j < n; ++j) d[j] = mt_ce_grad(d[j], s, 0, &c);
}

/* Rows b..e: each row's max first, a row holding NaN or inf skipped (its max tells the
 * refusal after the pass); then the row's e_j, kept in its dlogits row, and its gradient. */
static void grad_rows(void *ctx, int64_t b, int64_t e) {
    ce_job *job = (ce_job *)ctx;
    int64_t v = job->vocab;
    for (int64_t i = b; i < e; ++i) {
        float *d = job->dlogits + i * v;
        job->row_max[i] = row_max(job->logits + i * v, v, &job->row_min[i]);
        if (!mt_is_finite(job->row_max[i])) continue;
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
        (rc = mt_check_ce_dlogits(dlogits, logits, targets, target_bytes, n_rows, vocab, 0)) ||
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
    /* One pass; its finiteness check refuses after it (loss.md: dlogits and row_loss are then
     * undefined), the first non-finite row by index whichever thread found it. */
    mt_parallel_for_work(n_rows, 1, n_rows * vocab, dlogits ? grad_rows : max_rows, &job);
    int64_t bad = first_nonfinite_row(job.row_max, n_rows);
    if (bad >= 0) {
        mt_scratch_free(scratch, (int64_t)sizeof(float) * floats);
        return dlogits ? mt_fail_nonfinite_logits_after(bad, "dlogits") : mt_fail_nonfinite_logits(bad);
    }
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

/* ==== mt_cross_entropy_nd (loss.md, "Weights, probability targets and positions") ============
 * Before any row: the arguments, the weight's finiteness, the targets, the divisor D (with a
 * weight: the token rule over the target weights) and Wm = W / V. Then the rows in parallel:
 * with inner > 1, tiles of ND_TILE positions of one batch entry, whose logits (and
 * probabilities) are gathered into contiguous scratch (one cache line serves the tile's 16
 * positions of a class) and whose gradient is scattered back: values move, the arithmetic does
 * not. Each row: its max and finiteness, then as mt_cross_entropy (e_j kept in the gradient
 * row), the sums of its kind, its loss, its gradient in place. A row holding NaN or inf is
 * flagged and skipped; the first one is refused after the pass (dlogits and row_loss are then
 * undefined, loss_out untouched). Then the token rule over the row losses. Index targets
 * without a weight and inner 1 are mt_cross_entropy itself. */

#define ND_TILE 16

enum { ND_PLAIN, ND_WEIGHTED, ND_PROBS };            /* index targets, the same with a weight, probabilities */
enum { FOLD_X, FOLD_WX, FOLD_COEF, FOLD_COEF_X };    /* the sums of a row: x_j, w_j x_j, c_j, c_j x_j */

typedef struct {
    const float *logits, *probs, *weight;
    const void *targets;
    int32_t target_bytes, kind;
    int64_t vocab, inner, ignore_index;
    float wm;              /* W / V with a weight and smoothing, else +0.0 */
    mt_ce_scalars c;
    float *row_loss, *dlogits;
    uint8_t *flags;        /* (rows): 1 the logits, 2 the probabilities hold NaN or inf */
    int nomem;             /* a worker could not allocate its tile */
} nd_job;

CE_FLAT MT_SIMD static float nd_chunk(int fold, const float *x, const float *y, const float *w, const mt_ce_scalars *c,
                                      int64_t n) {
    switch (fold) {
    case FOLD_X: return mt_chunk_sum(n, x);
    case FOLD_WX: return mt_chunk_sum_wx(n, x, w);
    case FOLD_COEF: return w ? mt_chunk_sum_coef(n, y, w, c) : mt_chunk_sum_coef(n, y, 0, c);
    default: return w ? mt_chunk_sum_coef_x(n, x, y, w, c) : mt_chunk_sum_coef_x(n, x, y, 0, c);
    }
}

/* The chunk tree (clip.md) of one of a row's sums over its v classes (x, y, w: NULL if unused). */
static float nd_tree(int fold, const float *x, const float *y, const float *w, const mt_ce_scalars *c, int64_t v) {
    float part[CE_MAX_CHUNKS];
    int64_t chunks = mt_chunk_count(v);
    for (int64_t k = 0; k < chunks; ++k) {
        int64_t o = k * MT_CHUNK, len = v - o < MT_CHUNK ? v - o : MT_CHUNK;
        part[k] = nd_chunk(fold, x ? x + o : 0, y ? y + o : 0, w ? w + o : 0, c, len);
    }
    return mt_tree_fold(part, chunks);
}

/* e_j (kept in d) becomes fma(e_j / s, a, -y_j) * g: y_j = off * w_j (weighted), or c_j (probabilities). */
CE_FLAT MT_SIMD static void grad_weighted(float *d, int64_t n, float s, float a, const float *w, const mt_ce_scalars *cp) {
    mt_ce_scalars c = *cp;
    for (int64_t j = 0; j < n; ++j) d[j] = mt_ce_grad_nd(d[j], s, a, c.off * w[j], c.g);
}
CE_FLAT MT_SIMD static void grad_probs(float *d, int64_t n, float s, float csum, const float *y, const float *w,
                                       const mt_ce_scalars *cp) {
    mt_ce_scalars c = *cp;
    for (int64_t j = 0; j < n; ++j) d[j] = mt_ce_grad_nd(d[j], s, csum, mt_ce_coef(y, w, j, &c), c.g);
}

/* Loss and gradient of a row not ignored, given m and s (e_j kept in d when d is given). */
static float nd_row_tail(const nd_job *job, const float *x, const float *y, float *d, int64_t t, float m, float s) {
    const mt_ce_scalars *c = &job->c;
    const float *w = job->weight;
    int64_t v = job->vocab;
    if (job->kind == ND_PROBS) {
        float csum = nd_tree(FOLD_COEF, 0, y, w, c, v), cx = nd_tree(FOLD_COEF_X, x, y, w, c, v);
        if (d) grad_probs(d, v, s, csum, y, w, c);
        return mt_ce_row_loss_p(m, s, csum, cx);
    }
    float et = d ? d[t] : 0.0f;
    if (job->kind == ND_PLAIN) {
        float sx = c->eps != 0.0f ? nd_tree(FOLD_X, x, 0, 0, c, v) : 0.0f;
        if (d) {
            grad_from_kept(d, v, s, c);
            d[t] = mt_ce_grad(et, s, 1, c);
        }
        return mt_ce_row_loss(m, s, x[t], sx, c);
    }
    float wt = w[t], kt = c->keep * wt, a = mt_ce_factor_w(kt, job->wm, c);
    float sw = c->eps != 0.0f ? nd_tree(FOLD_WX, x, 0, w, c, v) : 0.0f;
    if (d) {
        grad_weighted(d, v, s, a, w, c);
        d[t] = mt_ce_grad_nd(et, s, a, mt_ce_target_w(kt, wt, c), c->g);
    }
    return mt_ce_row_loss_w(m, s, x[t], wt, sw, job->wm, c);
}

/* Row r: x, y (probabilities or NULL) and d (gradient or NULL) are contiguous rows of vocab. */
static void nd_row(nd_job *job, int64_t r, const float *x, const float *y, float *d) {
    int64_t v = job->vocab, t = 0;
    float mn, m = row_max(x, v, &mn);
    if (!mt_is_finite(m) || (y && mt_cpu_any_nonfinite(y, v))) {
        job->flags[r] = mt_is_finite(m) ? 2 : 1;
        return;
    }
    if (job->kind != ND_PROBS && (t = mt_index_at(job->targets, job->target_bytes, r)) == job->ignore_index) {
        job->row_loss[r] = 0.0f;
        if (d) memset(d, 0, sizeof(float) * (size_t)v);     /* +0.0 is all zero bits */
        return;
    }
    /* x_j - m >= min - m (rounding is monotonic): one test for the whole row */
    float s = row_tree(x, v, &m, d, x + v, mn - m >= MT_EXPF_MID_LO);
    job->row_loss[r] = nd_row_tail(job, x, y, d, t, m, s);
}

/* dst[k * v + j] = src[j * inner + k] for k < len (a tile of positions), and back. */
static void nd_gather(float *dst, const float *src, int64_t v, int64_t inner, int64_t len) {
    for (int64_t j = 0; j < v; ++j)
        for (int64_t k = 0; k < len; ++k) dst[k * v + j] = src[j * inner + k];
}
static void nd_scatter(float *dst, const float *src, int64_t v, int64_t inner, int64_t len) {
    for (int64_t j = 0; j < v; ++j)
        for (int64_t k = 0; k < len; ++k) dst[j * inner + k] = src[k * v + j];
}

/* Items [b, e): rows when inner is 1, else tiles (ND_TILE positions of one batch entry). */
static void nd_rows(void *ctx, int64_t b, int64_t e) {
    nd_job *job = (nd_job *)ctx;
    int64_t v = job->vocab, p = job->inner;
    if (p == 1) {
        for (int64_t r = b; r < e; ++r)
            nd_row(job, r, job->logits + r * v, job->probs ? job->probs + r * v : 0,
                   job->dlogits ? job->dlogits + r * v : 0);
        return;
    }
    int64_t per = (p + ND_TILE - 1) / ND_TILE, tile = ND_TILE * v;
    int64_t bufs = 1 + (job->probs != 0) + (job->dlogits != 0), bytes = (int64_t)sizeof(float) * tile * bufs;
    float *x = (float *)mt_scratch_alloc(bytes, "cross_entropy tile");
    if (!x) {
        __atomic_store_n(&job->nomem, 1, __ATOMIC_RELAXED);
        return;
    }
    float *y = job->probs ? x + tile : 0, *d = job->dlogits ? x + (bufs - 1) * tile : 0;
    for (int64_t k = b; k < e; ++k) {
        int64_t n = k / per, i0 = (k % per) * ND_TILE, len = p - i0 < ND_TILE ? p - i0 : ND_TILE;
        int64_t base = n * v * p + i0;
        nd_gather(x, job->logits + base, v, p, len);
        if (y) nd_gather(y, job->probs + base, v, p, len);
        for (int64_t q = 0; q < len; ++q) nd_row(job, n * p + i0 + q, x + q * v, y ? y + q * v : 0, d ? d + q * v : 0);
        if (d) nd_scatter(job->dlogits + base, d, v, p, len);
    }
    mt_scratch_free(x, bytes);
}

/* D without num_items: the count (index targets), the token rule over the target weights
 * (into `v`, rows floats of scratch; partials: its leaves), or the row count (probabilities). */
static float nd_divisor(const nd_job *job, int64_t rows, int64_t kept, float *v, float *partials) {
    if (job->kind == ND_PLAIN) return (float)kept;      /* rounded to nearest */
    if (job->kind == ND_PROBS) return (float)rows;
    for (int64_t r = 0; r < rows; ++r) {
        int64_t t = mt_index_at(job->targets, job->target_bytes, r);
        v[r] = t == job->ignore_index ? 0.0f : job->weight[t];
    }
    return mt_token_sum(v, rows, partials);
}

/* The first refused row after the pass: logits first, then probabilities. */
static int nd_refusal(const nd_job *job, int64_t rows, const char *written) {
    if (job->nomem) return mt_fail(MT_ENOMEM, "cannot allocate the tiles of cross_entropy (%lld floats each)",
                                   (long long)(ND_TILE * job->vocab));
    for (int flag = 1; flag <= 2; ++flag)
        for (int64_t r = 0; r < rows; ++r)
            if (job->flags[r] == flag) return mt_fail_nonfinite_nd(flag == 2, r, job->inner, written);
    return MT_OK;
}

/* The sum or mean of the row losses (loss.md: NaN canonical with a weight or probabilities). */
static float nd_reduce(const nd_job *job, int64_t rows, int32_t reduction, float divisor, float *partials) {
    float total = mt_token_sum(job->row_loss, rows, partials);
    if (job->kind == ND_PLAIN)
        return reduction != MT_REDUCTION_MEAN ? total : divisor != 0.0f ? total / divisor : mt_bits_f32(MT_MATH_QNAN);
    return mt_canonical_nan(reduction == MT_REDUCTION_MEAN ? total / divisor : total);
}

MT_NOINLINE static int ce_nd_body(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                                  const void *targets, const float *probs, const float *weight, int32_t target_bytes,
                                  int64_t n_batch, int64_t vocab, int64_t inner, int64_t ignore_index,
                                  int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    int64_t rows = 0, kept = 0, bad;
    if ((rc = mt_check_ce_nd_args(&rows, loss_out, row_loss, dlogits, logits, targets, probs, weight, target_bytes,
                                  n_batch, vocab, inner, reduction, label_smoothing, num_items)))
        return rc;
    if (rows > 0 && weight && (bad = mt_first_nonfinite_float(weight, vocab)) >= 0) return mt_fail_nonfinite_weight(bad);
    if (target_bytes && !weight && inner == 1)
        return ce_body(loss_out, row_loss, dlogits, logits, targets, target_bytes, rows, vocab, ignore_index, reduction,
                       label_smoothing, num_items);
    if (target_bytes && (rc = mt_check_targets(&kept, targets, target_bytes, rows, vocab, ignore_index))) return rc;
    if (rows == 0) {       /* 'sum' 0; 'mean' 0 / D: the canonical NaN without num_items */
        if (reduction != MT_REDUCTION_NONE)
            *loss_out = reduction == MT_REDUCTION_SUM ? 0.0f : mt_canonical_nan(0.0f / (float)num_items);
        return MT_OK;
    }
    nd_job job = {logits, probs, weight, targets, target_bytes, !target_bytes ? ND_PROBS : weight ? ND_WEIGHTED : ND_PLAIN,
                  vocab, inner, ignore_index, 0.0f, {0}, row_loss, dlogits, 0, 0};
    int64_t leaves = mt_token_leaves(rows), floats = (row_loss ? 0 : rows) + (job.kind == ND_WEIGHTED ? rows : 0) + leaves;
    int64_t bytes = (int64_t)sizeof(float) * floats + rows;
    float *scratch = (float *)mt_scratch_alloc(bytes, "cross_entropy row scratch"), *partials = scratch + floats - leaves;
    if (bytes > 0 && !scratch) return MT_ENOMEM;
    job.flags = (uint8_t *)(scratch + floats);
    memset(job.flags, 0, (size_t)rows);
    if (!row_loss) job.row_loss = scratch;
    float divisor = num_items ? (float)num_items : nd_divisor(&job, rows, kept, scratch + (row_loss ? 0 : rows), partials);
    job.c = mt_ce_scalars_for(label_smoothing, vocab, reduction == MT_REDUCTION_MEAN, divisor);
    if (job.kind == ND_WEIGHTED && label_smoothing != 0.0f) job.wm = nd_tree(FOLD_X, weight, 0, 0, 0, vocab) / job.c.vocab;
    int64_t items = inner == 1 ? rows : n_batch * ((inner + ND_TILE - 1) / ND_TILE);
    mt_parallel_for_work(items, 1, rows * vocab, nd_rows, &job);
    if (!(rc = nd_refusal(&job, rows, mt_ce_written(dlogits != NULL, row_loss != NULL))) && reduction != MT_REDUCTION_NONE)
        *loss_out = nd_reduce(&job, rows, reduction, divisor, partials);
    mt_scratch_free(scratch, bytes);
    return rc;
}

int mt_cross_entropy_nd(float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets,
                        const float *target_probs, const float *weight, int32_t target_bytes, int64_t n_batch,
                        int64_t vocab, int64_t inner, int64_t ignore_index, int32_t reduction, float label_smoothing,
                        int64_t num_items) {
    MT_RETURN_IN_FP_ENV(ce_nd_body(loss_out, row_loss, dlogits, logits, targets, target_probs, weight, target_bytes,
                                   n_batch, vocab, inner, ignore_index, reduction, label_smoothing, num_items));
}
