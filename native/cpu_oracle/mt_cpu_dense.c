/* mt_cpu_dense.c -- linear, RMSNorm and ReLU on the CPU oracle (contract: dense.md).
 *
 * Every entry checks its arguments (pointers, sizes, eps), then refuses a NaN or infinity in
 * any input, naming it, before any output is written (a pre-pass), then computes:
 *   linear:  out = chains over k (+ bias); da = chains over n; dweight and dbias by the token
 *            rule over the m rows (mt_cpu_gemm.h's GEMM and accumulators);
 *   RMSNorm: per row, the chunk tree of squares (and of g*x backward) and the pinned scalar
 *            steps of mt_pinned.h; dweight by the token rule over rows;
 *   ReLU:    elementwise.
 * Optional outputs (linear_backward's da, dweight, dbias; rms_norm_backward's dx, dweight)
 * are skipped when NULL. RMSNorm without weight (NULL) has no affine step, and then dweight
 * must be NULL too (there is no weight to differentiate). MT_ENOMEM may leave outputs
 * partly written (callers treat them as undefined); refusals never do.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <string.h>

uint64_t mt_dense_features(void) { return MT_FEATURE_DENSE; }

/* ---- argument checks ---------------------------------------------------------------------- */
#define MT_MAX_ELEMS ((int64_t)1 << 60)   /* so that every byte count fits in int64 */

static int check_count(int64_t v, const char *name) {
    if (v < 0) return mt_fail(MT_EINVAL, "%s must be >= 0, got %lld", name, (long long)v);
    return MT_OK;
}

static int check_product(int64_t x, int64_t y, const char *what) {
    if (x && y > MT_MAX_ELEMS / x)
        return mt_fail(MT_EINVAL, "%s = %lld x %lld elements is too large", what, (long long)x, (long long)y);
    return MT_OK;
}

/* A pointer that must be given when its tensor holds any element. */
static int check_tensor(const void *p, int64_t elems, const char *name) {
    return elems > 0 && !p ? mt_fail(MT_EINVAL, "%s is NULL", name) : MT_OK;
}

static int refuse_nonfinite(const float *x, int64_t n, const char *name) {
    if (x && n > 0 && mt_cpu_nonfinite(x, n))
        return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", name);
    return MT_OK;
}

static int check_mnk(int64_t m, int64_t n, int64_t k) {
    int rc;
    if ((rc = check_count(m, "m")) || (rc = check_count(n, "n")) || (rc = check_count(k, "k")) ||
        (rc = check_product(m, k, "a (m x k)")) || (rc = check_product(n, k, "weight (n x k)")) ||
        (rc = check_product(m, n, "out (m x n)")))
        return rc;
    return MT_OK;
}

static void fill_zero(float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) x[i] = 0.0f;
}

/* ---- linear ------------------------------------------------------------------------------- */
MT_NOINLINE static int linear_forward_body(float *out, const float *a, const float *weight,
                                           const float *bias, int64_t m, int64_t n, int64_t k) {
    int rc;
    if ((rc = check_mnk(m, n, k)) || (rc = check_tensor(out, m * n, "out")) ||
        (rc = check_tensor(a, m * k, "a")) || (rc = check_tensor(weight, n * k, "weight")) ||
        (rc = refuse_nonfinite(a, m * k, "a")) || (rc = refuse_nonfinite(weight, n * k, "weight")) ||
        (rc = refuse_nonfinite(bias, n, "bias")))
        return rc;
    /* out(i,j) = chain over p of (a[i,p], weight[j,p]): B(p,j) = weight[j*k + p]. */
    return mt_cpu_gemm(out, n, a, k, 1, weight, 1, k, m, n, k, 0, bias);
}

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m,
                      int64_t n, int64_t k) {
    mt_fp_env env;
    mt_fp_begin(&env);
    int rc = linear_forward_body(out, a, weight, bias, m, n, k);
    mt_fp_end(&env);
    return rc;
}

/* dweight (n x k): the token rule over rows of chains of (dc[i,j], a[i,p]). A leaf's partial is
 * one GEMM: A(j,i) = dc[i*n + j], B(i,p) = a[i*k + p], chains over the leaf's rows. */
static int linear_dweight(float *dweight, const float *dc, const float *a, int64_t m, int64_t n,
                          int64_t k) {
    int64_t leaves = mt_token_leaves(m);
    if (leaves == 0) { fill_zero(dweight, n * k); return MT_OK; }
    if (leaves == 1) return mt_cpu_gemm(dweight, k, dc, 1, n, a, k, 1, n, k, m, 0, NULL);
    mt_token_acc acc;
    int rc = mt_token_acc_init(&acc, n * k, 0);
    for (int64_t l = 0; !rc && l < leaves; ++l) {
        int64_t r0 = l * MT_TOKEN_LEAF, len = m - r0 < MT_TOKEN_LEAF ? m - r0 : MT_TOKEN_LEAF;
        float *partial = mt_token_acc_leaf(&acc);
        if (!partial) { rc = MT_ENOMEM; break; }
        if ((rc = mt_cpu_gemm(partial, k, dc + r0 * n, 1, n, a + r0 * k, k, 1, n, k, len, 0, NULL))) break;
        mt_token_acc_push(&acc);
    }
    if (!rc) mt_token_acc_finish(&acc, dweight);
    mt_token_acc_free(&acc);
    return rc;
}

/* dbias (n): the token rule over rows of acc = acc + dc[i,j]; leaf partials side by side. */
typedef struct { float *partials; const float *dc; int64_t m, n; } colsum_job;

MT_SIMD static void add_row(float *restrict acc, const float *restrict row, int64_t n) {
    for (int64_t j = 0; j < n; ++j) acc[j] = acc[j] + row[j];
}

static void colsum_range(void *ctx, int64_t l0, int64_t l1) {
    colsum_job *job = (colsum_job *)ctx;
    for (int64_t l = l0; l < l1; ++l) {
        float *acc = job->partials + l * job->n;
        int64_t r0 = l * MT_TOKEN_LEAF, r1 = r0 + MT_TOKEN_LEAF < job->m ? r0 + MT_TOKEN_LEAF : job->m;
        fill_zero(acc, job->n);
        for (int64_t i = r0; i < r1; ++i) add_row(acc, job->dc + i * job->n, job->n);
    }
}

static int linear_dbias(float *dbias, const float *dc, int64_t m, int64_t n) {
    int64_t leaves = mt_token_leaves(m), bytes = leaves * n * (int64_t)sizeof(float);
    if (leaves <= 1) {
        colsum_job job = {dbias, dc, m, n};
        if (leaves == 0) fill_zero(dbias, n); else colsum_range(&job, 0, 1);
        return MT_OK;
    }
    float *partials = (float *)mt_scratch_alloc(bytes, "dbias leaf partials");
    if (!partials) return MT_ENOMEM;
    colsum_job job = {partials, dc, m, n};
    mt_parallel_for_work(leaves, 1, m * n, colsum_range, &job);
    mt_token_fold_rows(partials, leaves, n);
    memcpy(dbias, partials, (size_t)n * sizeof(float));
    mt_scratch_free(partials, bytes);
    return MT_OK;
}

MT_NOINLINE static int linear_backward_body(float *da, float *dweight, float *dbias, const float *dc,
                                            const float *a, const float *weight, int64_t m, int64_t n,
                                            int64_t k) {
    int rc;
    if ((rc = check_mnk(m, n, k)) || (rc = check_tensor(dc, m * n, "dc")) ||
        (rc = check_tensor(a, m * k, "a")) || (rc = check_tensor(weight, n * k, "weight")) ||
        (rc = refuse_nonfinite(dc, m * n, "dc")) || (rc = refuse_nonfinite(a, m * k, "a")) ||
        (rc = refuse_nonfinite(weight, n * k, "weight")))
        return rc;
    /* da(i,p) = chain over j of (dc[i,j], weight[j,p]): A = dc, B(j,p) = weight[j*k + p]. */
    if (da && (rc = mt_cpu_gemm(da, k, dc, n, 1, weight, k, 1, m, k, n, 0, NULL))) return rc;
    if (dweight && n * k > 0 && (rc = linear_dweight(dweight, dc, a, m, n, k))) return rc;
    if (dbias && n > 0 && (rc = linear_dbias(dbias, dc, m, n))) return rc;
    return MT_OK;
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a,
                       const float *weight, int64_t m, int64_t n, int64_t k) {
    mt_fp_env env;
    mt_fp_begin(&env);
    int rc = linear_backward_body(da, dweight, dbias, dc, a, weight, m, n, k);
    mt_fp_end(&env);
    return rc;
}

/* ---- RMSNorm ------------------------------------------------------------------------------ */
/* The chunk tree of one row, streamed: chunk partials meet in mt_tree_fold's pairwise tree,
 * built with a stack of complete subtrees (equal-sized neighbours merge as they appear). */
typedef struct { float s[64]; int64_t size[64]; int depth; } row_tree;

static void row_tree_push(row_tree *t, float v) {
    int64_t size = 1;
    while (t->depth > 0 && t->size[t->depth - 1] == size) {
        v = t->s[--t->depth] + v;
        size *= 2;
    }
    t->s[t->depth] = v;
    t->size[t->depth++] = size;
}

static float row_tree_root(const row_tree *t) {
    float v = t->s[t->depth - 1];
    for (int d = t->depth - 2; d >= 0; --d) v = t->s[d] + v;
    return v;
}

MT_SIMD static float chunk_sumsq(const float *x, int64_t n) { return mt_chunk_sumsq_rms(n, x); }

MT_SIMD static float chunk_gdot(const float *dy, const float *w, const float *x, int64_t n) {
    return mt_chunk_rms_dot(n, dy, w, x);
}

static float row_sumsq(const float *x, int64_t dim) {
    row_tree t;
    t.depth = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += MT_CHUNK)
        row_tree_push(&t, chunk_sumsq(x + c0, dim - c0 < MT_CHUNK ? dim - c0 : MT_CHUNK));
    return row_tree_root(&t);
}

static float row_gdot(const float *dy, const float *w, const float *x, int64_t dim) {
    row_tree t;
    t.depth = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += MT_CHUNK)
        row_tree_push(&t, chunk_gdot(dy + c0, w ? w + c0 : NULL, x + c0,
                                     dim - c0 < MT_CHUNK ? dim - c0 : MT_CHUNK));
    return row_tree_root(&t);
}

static int check_rms(float eps, int64_t rows, int64_t dim) {
    int rc;
    if (dim < 1) return mt_fail(MT_EINVAL, "dim must be >= 1, got %lld", (long long)dim);
    if ((rc = check_count(rows, "rows")) || (rc = check_product(rows, dim, "x (rows x dim)")) ||
        (rc = mt_check_nonneg(eps, "eps")))
        return rc;
    return MT_OK;
}

typedef struct {
    float *y; const float *x, *dy, *w; float *rstd; float eps, dimf; int64_t dim;
} rms_job;

MT_SIMD static void rms_scale_row(float *restrict y, const float *restrict x, const float *restrict w,
                                  float r, int64_t n) {
    if (w) for (int64_t i = 0; i < n; ++i) y[i] = (x[i] * r) * w[i];
    else for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r;
}

static void rms_forward_range(void *ctx, int64_t b, int64_t e) {
    rms_job *job = (rms_job *)ctx;
    for (int64_t i = b; i < e; ++i) {
        const float *x = job->x + i * job->dim;
        float r = mt_rms_rstd(row_sumsq(x, job->dim), job->dimf, job->eps);
        rms_scale_row(job->y + i * job->dim, x, job->w, r, job->dim);
    }
}

MT_NOINLINE static int rms_forward_body(float *y, const float *x, const float *weight, float eps,
                                        int64_t rows, int64_t dim) {
    int rc;
    if ((rc = check_rms(eps, rows, dim)) || (rc = check_tensor(y, rows * dim, "y")) ||
        (rc = check_tensor(x, rows * dim, "x")) || (rc = refuse_nonfinite(x, rows * dim, "x")) ||
        (rc = refuse_nonfinite(weight, dim, "weight")))
        return rc;
    rms_job job = {y, x, NULL, weight, NULL, eps, (float)dim, dim};
    mt_parallel_for_work(rows, 1, rows * dim, rms_forward_range, &job);
    return MT_OK;
}

int mt_rms_norm_forward(float *y, const float *x, const float *weight, float eps, int64_t rows,
                        int64_t dim) {
    mt_fp_env env;
    mt_fp_begin(&env);
    int rc = rms_forward_body(y, x, weight, eps, rows, dim);
    mt_fp_end(&env);
    return rc;
}

MT_SIMD static void rms_dx_row(float *restrict dx, const float *restrict dy, const float *restrict w,
                               const float *restrict x, float r, float k, int64_t n) {
    if (w) for (int64_t i = 0; i < n; ++i) dx[i] = mt_rms_dx(dy[i], w[i], x[i], r, k);
    else for (int64_t i = 0; i < n; ++i) dx[i] = mt_rms_dx(dy[i], 1.0f, x[i], r, k);
}

/* Pass 1, rows in parallel: r of every row (kept when dweight needs it) and dx. */
static void rms_backward_range(void *ctx, int64_t b, int64_t e) {
    rms_job *job = (rms_job *)ctx;
    int64_t dim = job->dim;
    for (int64_t i = b; i < e; ++i) {
        const float *x = job->x + i * dim, *dy = job->dy + i * dim;
        float r = mt_rms_rstd(row_sumsq(x, dim), job->dimf, job->eps);
        if (job->rstd) job->rstd[i] = r;
        if (!job->y) continue;
        float k = mt_rms_k(row_gdot(dy, job->w, x, dim), job->dimf, r);
        rms_dx_row(job->y + i * dim, dy, job->w, x, r, k, dim);
    }
}

/* Pass 2: leaf partials of dweight, items of (leaf, block of columns): a chain over the
 * leaf's rows of (dy_i, x_i * r) for each column. */
#define RMS_COLS 512
typedef struct { float *partials; const float *dy, *x, *rstd; int64_t rows, dim, blocks; } rms_dw_job;

MT_SIMD static void rms_dw_row(float *restrict acc, const float *restrict dy, const float *restrict x,
                               float r, int64_t n) {
    for (int64_t i = 0; i < n; ++i) acc[i] = MT_DOT_STEP(dy[i], x[i] * r, acc[i]);
}

static void rms_dw_range(void *ctx, int64_t b, int64_t e) {
    rms_dw_job *job = (rms_dw_job *)ctx;
    for (int64_t item = b; item < e; ++item) {
        int64_t l = item / job->blocks, c0 = (item % job->blocks) * RMS_COLS;
        int64_t nc = job->dim - c0 < RMS_COLS ? job->dim - c0 : RMS_COLS;
        int64_t r0 = l * MT_TOKEN_LEAF, r1 = r0 + MT_TOKEN_LEAF < job->rows ? r0 + MT_TOKEN_LEAF : job->rows;
        float *acc = job->partials + l * job->dim + c0;
        fill_zero(acc, nc);
        for (int64_t i = r0; i < r1; ++i)
            rms_dw_row(acc, job->dy + i * job->dim + c0, job->x + i * job->dim + c0, job->rstd[i], nc);
    }
}

static int rms_dweight(float *dweight, const float *dy, const float *x, const float *rstd, int64_t rows,
                       int64_t dim) {
    int64_t leaves = mt_token_leaves(rows), blocks = (dim + RMS_COLS - 1) / RMS_COLS;
    int64_t bytes = leaves * dim * (int64_t)sizeof(float);
    if (leaves == 0) { fill_zero(dweight, dim); return MT_OK; }
    float *partials = leaves == 1 ? dweight : (float *)mt_scratch_alloc(bytes, "dweight leaf partials");
    if (!partials) return MT_ENOMEM;
    rms_dw_job job = {partials, dy, x, rstd, rows, dim, blocks};
    mt_parallel_for_work(leaves * blocks, 1, rows * dim, rms_dw_range, &job);
    if (leaves > 1) {
        mt_token_fold_rows(partials, leaves, dim);
        memcpy(dweight, partials, (size_t)dim * sizeof(float));
        mt_scratch_free(partials, bytes);
    }
    return MT_OK;
}

MT_NOINLINE static int rms_backward_body(float *dx, float *dweight, const float *dy, const float *x,
                                         const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = check_rms(eps, rows, dim)) || (rc = check_tensor(dy, rows * dim, "dy")) ||
        (rc = check_tensor(x, rows * dim, "x")))
        return rc;
    if (dweight && !weight)
        return mt_fail(MT_EINVAL, "dweight was asked for but weight is NULL (no affine weight, no gradient)");
    if ((rc = refuse_nonfinite(dy, rows * dim, "dy")) || (rc = refuse_nonfinite(x, rows * dim, "x")) ||
        (rc = refuse_nonfinite(weight, dim, "weight")))
        return rc;
    if (!dx && !dweight) return MT_OK;
    int64_t rbytes = dweight ? rows * (int64_t)sizeof(float) : 0;
    float *rstd = rbytes ? (float *)mt_scratch_alloc(rbytes, "RMSNorm row scales") : NULL;
    if (rbytes && !rstd) return MT_ENOMEM;
    rms_job job = {dx, x, dy, weight, rstd, eps, (float)dim, dim};
    mt_parallel_for_work(rows, 1, rows * dim * 2, rms_backward_range, &job);
    if (dweight) rc = rms_dweight(dweight, dy, x, rstd, rows, dim);
    mt_scratch_free(rstd, rbytes);
    return rc;
}

int mt_rms_norm_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight,
                         float eps, int64_t rows, int64_t dim) {
    mt_fp_env env;
    mt_fp_begin(&env);
    int rc = rms_backward_body(dx, dweight, dy, x, weight, eps, rows, dim);
    mt_fp_end(&env);
    return rc;
}

/* ---- ReLU --------------------------------------------------------------------------------- */
typedef struct { float *out; const float *dy, *x; } relu_job;

MT_SIMD static void relu_run(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = mt_relu(x[i]);
}

MT_SIMD static void relu_grad_run(float *out, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = mt_relu_grad(dy[i], x[i]);
}

static void relu_range(void *ctx, int64_t b, int64_t e) {
    relu_job *job = (relu_job *)ctx;
    if (job->dy) relu_grad_run(job->out + b, job->dy + b, job->x + b, e - b);
    else relu_run(job->out + b, job->x + b, e - b);
}

MT_NOINLINE static int relu_body(float *out, const float *dy, const float *x, int64_t n) {
    int rc;
    if ((rc = check_count(n, "n")) || (rc = check_tensor(out, n, dy ? "dx" : "y")) ||
        (rc = check_tensor(x, n, "x")) || (rc = refuse_nonfinite(dy, n, "dy")) ||
        (rc = refuse_nonfinite(x, n, "x")))
        return rc;
    relu_job job = {out, dy, x};
    mt_parallel_for(n, 4096, relu_range, &job);
    return MT_OK;
}

static int relu_common(float *out, const float *dy, const float *x, int64_t n) {
    mt_fp_env env;
    mt_fp_begin(&env);
    int rc = relu_body(out, dy, x, n);
    mt_fp_end(&env);
    return rc;
}

int mt_relu_forward(float *y, const float *x, int64_t n) { return relu_common(y, NULL, x, n); }

int mt_relu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    if (n > 0 && !dy) return mt_fail(MT_EINVAL, "dy is NULL");
    return relu_common(dx, dy, x, n);
}
