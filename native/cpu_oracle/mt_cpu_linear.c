/* mt_cpu_linear.c -- linear (forward and backward) on the CPU oracle (contract: linear.md).
 *
 * Every entry checks its arguments (counts, sizes, pointers), then refuses a NaN or infinity
 * in any input, naming it, before any output is written (a pre-pass), then computes
 * out = chains over k (+ bias); da = chains over n; dweight and dbias by the token rule over
 * the m rows (mt_cpu_gemm.h's GEMM and accumulators). The optional outputs of the backward
 * (da, dweight, dbias) are skipped when NULL. MT_ENOMEM may leave outputs partly written
 * (callers treat them as undefined); refusals never do.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <string.h>

uint64_t mt_linear_features(void) { return MT_FEATURE_LINEAR; }

MT_NOINLINE static int linear_forward_body(float *out, const float *a, const float *weight,
                                           const float *bias, int64_t m, int64_t n, int64_t k) {
    int rc;
    if ((rc = mt_check_linear_sizes(m, n, k)) || (rc = mt_check_tensor(out, m * n, "out")) ||
        (rc = mt_check_tensor(a, m * k, "a")) || (rc = mt_check_tensor(weight, n * k, "weight")) ||
        (rc = mt_cpu_refuse_nonfinite(a, m * k, "a")) || (rc = mt_cpu_refuse_nonfinite(weight, n * k, "weight")) ||
        (rc = mt_cpu_refuse_nonfinite(bias, n, "bias")))
        return rc;
    /* out(i,j) = chain over p of (a[i,p], weight[j,p]): B(p,j) = weight[j*k + p]. */
    return mt_cpu_gemm(out, n, a, k, 1, weight, 1, k, m, n, k, 0, bias);
}

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m,
                      int64_t n, int64_t k) {
    MT_RETURN_IN_FP_ENV(linear_forward_body(out, a, weight, bias, m, n, k));
}

/* dweight (n x k): the token rule over rows of chains of (dc[i,j], a[i,p]). A leaf's partial is
 * one GEMM: A(j,i) = dc[i*n + j], B(i,p) = a[i*k + p], chains over the leaf's rows. */
static int linear_dweight(float *dweight, const float *dc, const float *a, int64_t m, int64_t n,
                          int64_t k) {
    int64_t leaves = mt_token_leaves(m);
    if (leaves == 0) { memset(dweight, 0, (size_t)(n * k) * sizeof(float)); return MT_OK; }
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
        memset(acc, 0, (size_t)job->n * sizeof(float));
        for (int64_t i = r0; i < r1; ++i) add_row(acc, job->dc + i * job->n, job->n);
    }
}

static int linear_dbias(float *dbias, const float *dc, int64_t m, int64_t n) {
    int64_t leaves = mt_token_leaves(m), bytes = leaves * n * (int64_t)sizeof(float);
    if (leaves <= 1) {      /* one leaf folds straight into dbias (never over dc: see backward_outputs) */
        colsum_job job = {dbias, dc, m, n};
        if (leaves == 0) memset(dbias, 0, (size_t)n * sizeof(float)); else colsum_range(&job, 0, 1);
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

/* Where each of the backward's outputs is formed: into[o] = out[o], or a scratch when out[o]
 * overlaps an input (copied over it once every output is formed, so that each output gets the
 * bits of a separate buffer however the outputs and inputs lie). */
static int backward_outputs(float **into, float *const *out, const int64_t *count, const float *dc, const float *a,
                            const float *weight, int64_t m, int64_t n, int64_t k) {
    const void *ins[3] = {dc, a, weight};
    const int64_t in_bytes[3] = {m * n * 4, m * k * 4, n * k * 4};
    for (int o = 0; o < 3; ++o) into[o] = out[o];
    for (int o = 0; o < 3; ++o)
        for (int j = 0; out[o] && count[o] > 0 && j < 3; ++j)
            if (mt_bytes_overlap(out[o], count[o] * 4, ins[j], in_bytes[j])) {
                if (!(into[o] = (float *)mt_scratch_alloc(count[o] * 4, "an output over an input"))) {
                    into[o] = out[o];
                    return MT_ENOMEM;
                }
                break;
            }
    return MT_OK;
}

MT_NOINLINE static int linear_backward_body(float *da, float *dweight, float *dbias, const float *dc,
                                            const float *a, const float *weight, int64_t m, int64_t n,
                                            int64_t k) {
    int rc;
    if ((rc = mt_check_linear_sizes(m, n, k)) || (rc = mt_check_tensor(dc, m * n, "dc")) ||
        (rc = mt_check_tensor(a, m * k, "a")) || (rc = mt_check_tensor(weight, n * k, "weight")) ||
        (rc = mt_check_linear_outputs(da, dweight, dbias, m, n, k)) || (rc = mt_cpu_refuse_nonfinite(dc, m * n, "dc")) || (rc = mt_cpu_refuse_nonfinite(a, m * k, "a")) ||
        (rc = mt_cpu_refuse_nonfinite(weight, n * k, "weight")))
        return rc;
    float *out[3] = {da, dweight, dbias}, *into[3];
    const int64_t count[3] = {da ? m * k : 0, dweight ? n * k : 0, dbias ? n : 0};
    if ((rc = backward_outputs(into, out, count, dc, a, weight, m, n, k)) == MT_OK) {
        /* da(i,p) = chain over j of (dc[i,j], weight[j,p]): A = dc, B(j,p) = weight[j*k + p]. */
        if (da && (rc = mt_cpu_gemm(into[0], k, dc, n, 1, weight, k, 1, m, k, n, 0, NULL))) goto done;
        if (dweight && n * k > 0 && (rc = linear_dweight(into[1], dc, a, m, n, k))) goto done;
        if (dbias && n > 0 && (rc = linear_dbias(into[2], dc, m, n))) goto done;
        for (int o = 0; o < 3; ++o)
            if (into[o] != out[o]) memcpy(out[o], into[o], (size_t)count[o] * sizeof(float));
    }
done:
    for (int o = 0; o < 3; ++o)
        if (into[o] != out[o]) mt_scratch_free(into[o], count[o] * (int64_t)sizeof(float));
    return rc;
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a,
                       const float *weight, int64_t m, int64_t n, int64_t k) {
    MT_RETURN_IN_FP_ENV(linear_backward_body(da, dweight, dbias, dc, a, weight, m, n, k));
}
