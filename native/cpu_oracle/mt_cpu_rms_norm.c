/* mt_cpu_rms_norm.c -- RMSNorm (forward and backward) on the CPU oracle (contract: rms_norm.md).
 *
 * Every entry checks its arguments (rows, dim, eps, pointers), then refuses a NaN or infinity
 * in any input, naming it, before any output is written (a pre-pass), then computes per row
 * the chunk tree of squares (and, backward, of g*x) and the pinned scalar steps of
 * mt_pinned.h (mt_rms_rstd, mt_rms_k, mt_rms_dx); dweight by the token rule over rows.
 * Without weight (NULL) there is no affine step, and then dweight must be NULL too (there is
 * no weight to differentiate). The backward's outputs (dx, dweight) are skipped when NULL.
 * MT_ENOMEM may leave outputs partly written (callers treat them as undefined); refusals
 * never do.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <string.h>

uint64_t mt_rms_norm_features(void) { return MT_FEATURE_RMS_NORM; }

MT_SIMD static float chunk_sumsq(const float *x, int64_t n) { return mt_chunk_sumsq_rms(n, x); }

MT_SIMD static float chunk_gdot(const float *dy, const float *w, const float *x, int64_t n) {
    return mt_chunk_rms_dot(n, dy, w, x);
}

static float row_sumsq(const float *x, int64_t dim) {
    mt_row_tree t;
    t.depth = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += MT_CHUNK)
        mt_row_tree_push(&t, chunk_sumsq(x + c0, dim - c0 < MT_CHUNK ? dim - c0 : MT_CHUNK));
    return mt_row_tree_root(&t);
}

static float row_gdot(const float *dy, const float *w, const float *x, int64_t dim) {
    mt_row_tree t;
    t.depth = 0;
    for (int64_t c0 = 0; c0 < dim; c0 += MT_CHUNK)
        mt_row_tree_push(&t, chunk_gdot(dy + c0, w ? w + c0 : NULL, x + c0,
                                     dim - c0 < MT_CHUNK ? dim - c0 : MT_CHUNK));
    return mt_row_tree_root(&t);
}

typedef struct {
    float *y; const float *x, *dy, *w; float *rstd; float eps, dimf; int64_t dim;
    int bad;        /* the forward's pass 1: a row of x held NaN or inf */
} rms_job;

MT_SIMD static void rms_scale_row(float *restrict y, const float *restrict x, const float *restrict w,
                                  float r, int64_t n) {
    if (w) for (int64_t i = 0; i < n; ++i) y[i] = mt_rms_y(x[i], r, w[i]);
    else for (int64_t i = 0; i < n; ++i) y[i] = mt_rms_y(x[i], r, 1.0f);
}

/* The forward's pass 1, rows in parallel: each row's finiteness and r, reading the row once
 * from memory (its second read, the sum of squares, hits the cache). A row holding NaN or inf
 * raises job->bad; nothing is written to y until pass 2. */
static void rms_row_scales_range(void *ctx, int64_t b, int64_t e) {
    rms_job *job = (rms_job *)ctx;
    for (int64_t i = b; i < e; ++i) {
        const float *x = job->x + i * job->dim;
        if (mt_cpu_nonfinite(x, job->dim)) {
            __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
            job->rstd[i] = 0.0f;
            continue;
        }
        job->rstd[i] = mt_rms_rstd(row_sumsq(x, job->dim), job->dimf, job->eps);
    }
}

/* Pass 2: y = (x * r) * w, row by row. */
static void rms_forward_range(void *ctx, int64_t b, int64_t e) {
    rms_job *job = (rms_job *)ctx;
    for (int64_t i = b; i < e; ++i)
        rms_scale_row(job->y + i * job->dim, job->x + i * job->dim, job->w, job->rstd[i], job->dim);
}

int mt_cpu_rms_norm_forward_refusals(const float *y, const float *x, const float *weight, float eps, int64_t rows,
                                     int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_forward_args(y, x, eps, rows, dim)) ||
        (rc = mt_cpu_refuse_nonfinite(x, rows * dim, "x")) || (rc = mt_cpu_refuse_nonfinite(weight, dim, "weight")))
        return rc;
    return MT_OK;
}

/* Two passes over x instead of three: the finiteness pre-pass (nothing written on a refusal)
 * rides along with the sums of squares, whose r per row are kept (rows floats) for pass 2. The
 * refusals and their order are mt_cpu_rms_norm_forward_refusals' (x, then weight). */
MT_NOINLINE static int rms_forward_body(float *y, const float *x, const float *weight, float eps,
                                        int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_forward_args(y, x, eps, rows, dim))) return rc;
    int64_t rbytes = rows * (int64_t)sizeof(float);
    float *rstd = rbytes ? (float *)mt_scratch_alloc(rbytes, "RMSNorm row scales") : NULL;
    if (rbytes && !rstd) return MT_ENOMEM;
    rms_job job = {y, x, NULL, weight, rstd, eps, (float)dim, dim, 0};
    mt_parallel_for_work(rows, 1, rows * dim, rms_row_scales_range, &job);
    if (job.bad) rc = mt_cpu_refuse_nonfinite(x, rows * dim, "x");
    if (!rc) rc = mt_cpu_refuse_nonfinite(weight, dim, "weight");
    if (!rc) mt_parallel_for_work(rows, 1, rows * dim, rms_forward_range, &job);
    mt_scratch_free(rstd, rbytes);
    return rc;
}

int mt_rms_norm_forward(float *y, const float *x, const float *weight, float eps, int64_t rows,
                        int64_t dim) {
    MT_RETURN_IN_FP_ENV(rms_forward_body(y, x, weight, eps, rows, dim));
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
        memset(acc, 0, (size_t)nc * sizeof(float));
        for (int64_t i = r0; i < r1; ++i)
            rms_dw_row(acc, job->dy + i * job->dim + c0, job->x + i * job->dim + c0, job->rstd[i], nc);
    }
}

static int rms_dweight(float *dweight, const float *dy, const float *x, const float *rstd, int64_t rows,
                       int64_t dim) {
    int64_t leaves = mt_token_leaves(rows), blocks = (dim + RMS_COLS - 1) / RMS_COLS;
    int64_t bytes = leaves * dim * (int64_t)sizeof(float);
    if (leaves == 0) { memset(dweight, 0, (size_t)dim * sizeof(float)); return MT_OK; }
    float *partials = leaves == 1 ? dweight : (float *)mt_scratch_alloc(bytes, "dweight leaf partials");
    if (!partials) return MT_ENOMEM;
    rms_dw_job job = {partials, dy, x, rstd, rows, dim, blocks};
    mt_parallel_for_work(leaves * blocks, 1, rows * dim, rms_dw_range, &job);
    if (leaves > 1) {
        mt_token_fold_rows(partials, leaves, dim);
        memcpy(dweight, partials, (size_t)dim * sizeof(float));
        mt_scratch_free(partials, bytes);
    }
    for (int64_t c = 0; c < dim; ++c) dweight[c] = mt_canonical_nan(dweight[c]);
    return MT_OK;
}

int mt_cpu_rms_norm_backward_refusals(const float *dweight, const float *dy, const float *x, const float *weight,
                                      float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim)) ||
        (rc = mt_cpu_refuse_nonfinite(dy, rows * dim, "dy")) || (rc = mt_cpu_refuse_nonfinite(x, rows * dim, "x")) ||
        (rc = mt_cpu_refuse_nonfinite(weight, dim, "weight")))
        return rc;
    return MT_OK;
}

MT_NOINLINE static int rms_backward_body(float *dx, float *dweight, const float *dy, const float *x,
                                         const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    if ((rc = mt_cpu_rms_norm_backward_refusals(dweight, dy, x, weight, eps, rows, dim))) return rc;
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
    MT_RETURN_IN_FP_ENV(rms_backward_body(dx, dweight, dy, x, weight, eps, rows, dim));
}
