/* mt_cpu_layer_norm.c -- LayerNorm (forward and backward) on the CPU oracle (contract:
 * layer_norm.md).
 *
 * Every entry checks its arguments (RMSNorm's checks: rows, dim, eps, pointers), then refuses a
 * NaN or infinity in any input, naming it: found row by row during the pass that writes y (dx),
 * which is then undefined, dweight and dbias never written; or by a pre-pass before anything is
 * written when an output overlaps an input (or dx overlaps dweight or dbias), when the weight or
 * bias is not finite, and for a backward without dx. It computes per row the chunk trees of x
 * and of (x - mu)^2 (and, backward, of g and g * xhat) and the pinned scalar steps of
 * mt_pinned.h (mt_ln_mean, mt_rms_rstd, mt_ln_y, mt_ln_dx);
 * dweight and dbias by the token rule over rows. Without weight (NULL) there is no scale and
 * dweight must be NULL too; without bias no shift (the backward never reads a bias). The
 * backward's outputs (dx, dweight, dbias) are skipped when NULL. MT_ENOMEM may leave outputs
 * partly written (callers treat them as undefined); a refusal leaves y or dx undefined, never an
 * input or dweight/dbias.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <string.h>

uint64_t mt_layer_norm_features(void) { return MT_FEATURE_LAYER_NORM; }

/* One row's operands for its folds: x, and for the backward dy, w (or NULL), mu and r. */
typedef struct { const float *x, *dy, *w; float mu, r; } ln_row;
enum { LN_SUM, LN_DEVSQ, LN_G, LN_GX };

MT_SIMD MT_FLAT static float chunk_sum(const float *x, int64_t n) { return mt_chunk_ln_sum(n, x); }
MT_SIMD MT_FLAT static float chunk_devsq(const float *x, int64_t n, float mu) { return mt_chunk_ln_devsq(n, x, mu); }
MT_SIMD MT_FLAT static float chunk_g(const float *dy, const float *w, int64_t n) { return mt_chunk_ln_g(n, dy, w); }
MT_SIMD MT_FLAT static float chunk_gx(const float *dy, const float *w, const float *x, float mu, float r, int64_t n) {
    return mt_chunk_ln_gx(n, dy, w, x, mu, r);
}

static float ln_chunk(int kind, const ln_row *a, int64_t c0, int64_t n) {
    const float *w = a->w ? a->w + c0 : NULL;
    switch (kind) {
    case LN_SUM: return chunk_sum(a->x + c0, n);
    case LN_DEVSQ: return chunk_devsq(a->x + c0, n, a->mu);
    case LN_G: return chunk_g(a->dy + c0, w, n);
    default: return chunk_gx(a->dy + c0, w, a->x + c0, a->mu, a->r, n);
    }
}

/* The chunk tree (clip.md) of one quantity over a row of dim elements. */
static float ln_fold(int kind, const ln_row *a, int64_t dim) {
    mt_row_tree t;
    t.depth = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += MT_CHUNK)
        mt_row_tree_push(&t, ln_chunk(kind, a, c0, dim - c0 < MT_CHUNK ? dim - c0 : MT_CHUNK));
    return mt_row_tree_root(&t);
}

/* mu and r of a row (two passes: the sum, then the squared deviations from mu). */
static ln_row ln_stats(const float *x, int64_t dim, float dimf, float eps) {
    ln_row a = {x, NULL, NULL, 0.0f, 0.0f};
    a.mu = mt_ln_mean(ln_fold(LN_SUM, &a, dim), dimf);
    a.r = mt_rms_rstd(ln_fold(LN_DEVSQ, &a, dim), dimf, eps);
    return a;
}

typedef struct {
    float *y; const float *x, *dy, *w, *b; float *stats; float eps, dimf; int64_t dim;
    int check;      /* refuse by row, fused: a row of x (or dy) holding NaN or inf raises bad */
    int bad;
} ln_job;

/* Whether the row's inputs (x; dy too when given) hold NaN or inf, read while the row is
 * fetched into the cache that its folds then hit (with job->check; else 0: a pre-pass ran). */
static int ln_row_refused(ln_job *job, const float *x, const float *dy) {
    if (!job->check || !(mt_cpu_nonfinite(x, job->dim) || (dy && mt_cpu_nonfinite(dy, job->dim)))) return 0;
    __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
    return 1;
}

/* Whether [a, a + na) and [b, b + nb) share a float (NULL or empty: no). */
static int ln_overlap(const float *a, int64_t na, const float *b, int64_t nb) {
    return mt_bytes_overlap(a, 4 * na, b, 4 * nb);
}

/* y = fma(xhat, w, b); no weight: w = 1, no bias: b = -0.0 (layer_norm.md). */
MT_SIMD MT_FLAT static void ln_y_row(float *restrict y, const float *restrict x, const float *restrict w,
                                     const float *restrict b, float mu, float r, int64_t n) {
    if (w && b) for (int64_t i = 0; i < n; ++i) y[i] = mt_ln_y(x[i], mu, r, w[i], b[i]);
    else if (w) for (int64_t i = 0; i < n; ++i) y[i] = mt_ln_y(x[i], mu, r, w[i], -0.0f);
    else if (b) for (int64_t i = 0; i < n; ++i) y[i] = mt_ln_y(x[i], mu, r, 1.0f, b[i]);
    else for (int64_t i = 0; i < n; ++i) y[i] = mt_ln_y(x[i], mu, r, 1.0f, -0.0f);
}

static void ln_forward_range(void *ctx, int64_t b, int64_t e) {
    ln_job *job = (ln_job *)ctx;
    for (int64_t i = b; i < e; ++i) {
        const float *x = job->x + i * job->dim;
        if (ln_row_refused(job, x, NULL)) continue;
        ln_row a = ln_stats(x, job->dim, job->dimf, job->eps);
        ln_y_row(job->y + i * job->dim, x, job->w, job->b, a.mu, a.r, job->dim);
    }
}

/* The refusal of a NaN or infinity in x rides along with the one pass (layer_norm.md,
 * "Refusals": y is then undefined, as on a GPU) when y overlaps no input and weight and bias
 * are finite; otherwise a pre-pass refuses, in the order x, weight, bias, before y is written. */
MT_NOINLINE static int ln_forward_body(float *y, const float *x, const float *weight, const float *bias, float eps,
                                       int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_forward_args(y, x, eps, rows, dim))) return rc;
    int64_t n = rows * dim;
    int fused = !ln_overlap(y, n, x, n) && !ln_overlap(y, n, weight, dim) && !ln_overlap(y, n, bias, dim) &&
                !(weight && mt_cpu_nonfinite(weight, dim)) && !(bias && mt_cpu_nonfinite(bias, dim));
    if (!fused && ((rc = mt_cpu_rms_norm_forward_refusals(y, x, weight, eps, rows, dim)) ||
                   (rc = mt_cpu_refuse_nonfinite(bias, dim, "bias"))))
        return rc;
    ln_job job = {y, x, NULL, weight, bias, NULL, eps, (float)dim, dim, fused, 0};
    mt_parallel_for_work(rows, 1, n, ln_forward_range, &job);
    if (job.bad) return mt_fail(MT_ENONFINITE, "x holds NaN or inf; refused %s", MT_REFUSED_DIRTY);
    return MT_OK;
}

int mt_layer_norm_forward(float *y, const float *x, const float *weight, const float *bias, float eps, int64_t rows,
                          int64_t dim) {
    MT_RETURN_IN_FP_ENV(ln_forward_body(y, x, weight, bias, eps, rows, dim));
}

MT_SIMD MT_FLAT static void ln_dx_row(float *restrict dx, const float *restrict dy, const float *restrict w,
                                      const float *restrict x, float mu, float r, float mg, float mgx, int64_t n) {
    if (w) for (int64_t i = 0; i < n; ++i) dx[i] = mt_ln_dx(dy[i], w[i], x[i], mu, r, mg, mgx);
    else for (int64_t i = 0; i < n; ++i) dx[i] = mt_ln_dx(dy[i], 1.0f, x[i], mu, r, mg, mgx);
}

/* Row i of the backward: its mu and r (returned; kept in job->stats when that is not NULL) and,
 * unless job->y (dx) is NULL, its dx. */
static ln_row ln_backward_row(ln_job *job, int64_t i) {
    int64_t dim = job->dim;
    const float *x = job->x + i * dim, *dy = job->dy + i * dim;
    if (ln_row_refused(job, x, dy)) return (ln_row){x, dy, job->w, 0.0f, 0.0f};
    ln_row a = ln_stats(x, dim, job->dimf, job->eps);
    if (job->stats) {
        job->stats[2 * i] = a.mu;
        job->stats[2 * i + 1] = a.r;
    }
    if (job->y) {
        a.dy = dy;
        a.w = job->w;
        float mg = mt_ln_mean(ln_fold(LN_G, &a, dim), job->dimf), mgx = mt_ln_mean(ln_fold(LN_GX, &a, dim), job->dimf);
        ln_dx_row(job->y + i * dim, dy, job->w, x, a.mu, a.r, mg, mgx, dim);
    }
    return a;
}

/* Rows in parallel: dx and (mu, r) of each row (the first of two passes). */
static void ln_backward_range(void *ctx, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) ln_backward_row((ln_job *)ctx, i);
}

/* One row's steps of both chains (aw or ab NULL: that chain is not wanted), dy read once. */
MT_SIMD MT_FLAT static void ln_param_row(float *restrict aw, float *restrict ab, const float *restrict dy,
                                         const float *restrict x, float mu, float r, int64_t n) {
    if (aw && ab) {
        for (int64_t i = 0; i < n; ++i) {
            aw[i] = MT_DOT_STEP(dy[i], mt_ln_xhat(x[i], mu, r), aw[i]);
            ab[i] = ab[i] + dy[i];
        }
    } else if (aw) {
        for (int64_t i = 0; i < n; ++i) aw[i] = MT_DOT_STEP(dy[i], mt_ln_xhat(x[i], mu, r), aw[i]);
    } else {
        for (int64_t i = 0; i < n; ++i) ab[i] = ab[i] + dy[i];
    }
}

/* The token rule's leaf partials of dweight (chains of (dy, xhat)) and dbias (sums of dy):
 * leaf l's are pw/pb + l * dim (NULL: not wanted), in the outputs themselves for one leaf. */
typedef struct {
    float *pw, *pb, *scratch; int64_t leaves, bytes;
} ln_params;

static int ln_params_begin(ln_params *p, float *dweight, float *dbias, int64_t rows, int64_t dim) {
    p->leaves = mt_token_leaves(rows);
    p->bytes = p->leaves > 1 ? 2 * p->leaves * dim * (int64_t)sizeof(float) : 0;
    p->scratch = p->bytes ? (float *)mt_scratch_alloc(p->bytes, "LayerNorm leaf partials") : NULL;
    if (p->bytes && !p->scratch) return MT_ENOMEM;
    p->pw = !dweight ? NULL : p->scratch ? p->scratch : dweight;
    p->pb = !dbias ? NULL : p->scratch ? p->scratch + p->leaves * dim : dbias;
    return MT_OK;
}

/* out (or nothing, NULL) = the token tree of `leaves` partial rows at part. */
static void fold_into(float *out, float *part, int64_t leaves, int64_t dim) {
    if (!out) return;
    if (leaves == 0) {
        memset(out, 0, (size_t)dim * sizeof(float));
        return;
    }
    mt_token_fold_rows(part, leaves, dim);
    for (int64_t c = 0; c < dim; ++c) out[c] = mt_canonical_nan(part[c]);
}

static void ln_params_end(ln_params *p, float *dweight, float *dbias, int64_t dim) {
    fold_into(dweight, p->pw, p->leaves, dim);
    fold_into(dbias, p->pb, p->leaves, dim);
    mt_scratch_free(p->scratch, p->bytes);
}

/* Two passes (rows first, then the leaves): items of (leaf, block of LN_COLS columns), each
 * walking the leaf's rows in ascending order with the (mu, r) pass 1 kept. */
#define LN_COLS 512
typedef struct {
    const ln_params *p; const float *dy, *x, *stats; int64_t rows, dim, blocks;
} ln_leaf_job;

static void leaf_rows(int64_t l, int64_t rows, int64_t *r0, int64_t *r1) {
    *r0 = l * MT_TOKEN_LEAF;
    *r1 = *r0 + MT_TOKEN_LEAF < rows ? *r0 + MT_TOKEN_LEAF : rows;
}

static void ln_leaf_blocks_range(void *ctx, int64_t b, int64_t e) {
    const ln_leaf_job *job = (const ln_leaf_job *)ctx;
    for (int64_t item = b; item < e; ++item) {
        int64_t l = item / job->blocks, c0 = (item % job->blocks) * LN_COLS, r0, r1;
        int64_t nc = job->dim - c0 < LN_COLS ? job->dim - c0 : LN_COLS;
        float *aw = job->p->pw ? job->p->pw + l * job->dim + c0 : NULL;
        float *ab = job->p->pb ? job->p->pb + l * job->dim + c0 : NULL;
        if (aw) memset(aw, 0, (size_t)nc * sizeof(float));
        if (ab) memset(ab, 0, (size_t)nc * sizeof(float));
        leaf_rows(l, job->rows, &r0, &r1);
        for (int64_t i = r0; i < r1; ++i) {
            const float *s = job->stats ? job->stats + 2 * i : NULL;
            ln_param_row(aw, ab, job->dy + i * job->dim + c0, job->x + i * job->dim + c0, s ? s[0] : 0.0f,
                         s ? s[1] : 0.0f, nc);
        }
    }
}

/* (A row refused in pass 1 raises job->bad and pass 2, the only writer of dweight and dbias
 * here, does not run.) */
static int ln_two_passes(ln_job *job, const ln_params *p, int64_t rows) {
    int64_t dim = job->dim, sbytes = p->pw ? 2 * rows * (int64_t)sizeof(float) : 0;
    float *stats = sbytes ? (float *)mt_scratch_alloc(sbytes, "LayerNorm row means and scales") : NULL;
    if (sbytes && !stats) return MT_ENOMEM;
    job->stats = stats;
    if (job->y || stats) mt_parallel_for_work(rows, 1, rows * dim * 2, ln_backward_range, job);
    job->stats = NULL;
    ln_leaf_job leaf = {p, job->dy, job->x, stats, rows, dim, (dim + LN_COLS - 1) / LN_COLS};
    if (!job->bad) mt_parallel_for_work(p->leaves * leaf.blocks, 1, rows * dim, ln_leaf_blocks_range, &leaf);
    mt_scratch_free(stats, sbytes);
    return MT_OK;
}

/* One pass, leaves in parallel (when there are leaves for every thread): each leaf's rows in
 * ascending order, dx and both chains while the row is in cache. The same bits: only who
 * computes what differs. */
typedef struct { ln_job *job; const ln_params *p; int64_t rows; } ln_fused_job;

static void ln_fused_range(void *ctx, int64_t b, int64_t e) {
    const ln_fused_job *f = (const ln_fused_job *)ctx;
    int64_t dim = f->job->dim, r0, r1;
    for (int64_t l = b; l < e; ++l) {
        float *aw = f->p->pw ? f->p->pw + l * dim : NULL, *ab = f->p->pb ? f->p->pb + l * dim : NULL;
        if (aw) memset(aw, 0, (size_t)dim * sizeof(float));
        if (ab) memset(ab, 0, (size_t)dim * sizeof(float));
        leaf_rows(l, f->rows, &r0, &r1);
        for (int64_t i = r0; i < r1; ++i) {
            ln_row a = ln_backward_row(f->job, i);
            ln_param_row(aw, ab, f->job->dy + i * dim, f->job->x + i * dim, a.mu, a.r, dim);
        }
    }
}

/* After a pass with the fused refusal: the refusal of the first input found holding NaN or inf
 * (dy, then x, the pre-pass's order), dx undefined, dweight and dbias not written. */
static int ln_backward_refusal(const ln_job *job, int64_t rows, int params) {
    if (!job->bad) return MT_OK;
    const char *name = mt_cpu_nonfinite(job->dy, rows * job->dim) ? "dy" : "x";
    return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused%s %s", name,
                   params ? "; dweight and dbias were not written" : "", MT_REFUSED_DIRTY);
}

/* The refusal of a NaN or infinity in dy or x rides along with the pass that computes dx when
 * there is a dx overlapping no input and the weight is finite (layer_norm.md, "Refusals"): dx is
 * then undefined after a refusal, as on a GPU, and dweight and dbias are written only after the
 * pass. Otherwise a pre-pass refuses (dy, x, weight) before anything is written. */
MT_NOINLINE static int ln_backward_body(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                                        const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim))) return rc;
    int64_t n = rows * dim;
    int fused = dx && !ln_overlap(dx, n, dy, n) && !ln_overlap(dx, n, x, n) && !ln_overlap(dx, n, weight, dim) &&
                !ln_overlap(dx, n, dweight, dim) && !ln_overlap(dx, n, dbias, dim) &&
                !(weight && mt_cpu_nonfinite(weight, dim));
    if (!fused && (rc = mt_cpu_rms_norm_backward_refusals(dweight, dy, x, weight, eps, rows, dim))) return rc;
    ln_job job = {dx, x, dy, weight, NULL, NULL, eps, (float)dim, dim, fused, 0};
    if (!dweight && !dbias) {
        if (dx) mt_parallel_for_work(rows, 1, n * 2, ln_backward_range, &job);
        return ln_backward_refusal(&job, rows, 0);
    }
    ln_params p;
    if ((rc = ln_params_begin(&p, dweight, dbias, rows, dim))) return rc;
    /* One leaf without scratch writes its chains into dweight/dbias during the pass: only
     * without the fused refusal. */
    if (p.leaves >= mt_pool_threads() && (p.scratch || !fused)) {
        ln_fused_job f = {&job, &p, rows};
        mt_parallel_for_work(p.leaves, 1, n * 3, ln_fused_range, &f);
    } else if ((rc = ln_two_passes(&job, &p, rows))) {
        mt_scratch_free(p.scratch, p.bytes);
        return rc;
    }
    if (job.bad) {
        mt_scratch_free(p.scratch, p.bytes);
        return ln_backward_refusal(&job, rows, 1);
    }
    ln_params_end(&p, dweight, dbias, dim);
    return MT_OK;
}

int mt_layer_norm_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                           const float *weight, float eps, int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(ln_backward_body(dx, dweight, dbias, dy, x, weight, eps, rows, dim));
}
