/* mt_gpu_linear.cu -- linear (forward and backward) on a GPU: host glue around the chain GEMM
 * of mt_gpu_gemm.cuh (contract: native/contracts/linear.md).
 *
 * A call: argument checks on the host; staging (host buffers are uploaded, device buffers
 * used in place, outputs of host buffers get device twins); the finiteness pre-pass over
 * every input, which sets a device word; the products, whose kernels do nothing when that
 * word is set; one synchronizing read of the word; then either the refusal (nothing written,
 * host or device) or the download of staged outputs.
 *   forward   out = a . weight^T (+ bias)                 one chain per output
 *   da        = dc . weight                                one chain per output (over n)
 *   dweight   = token rule over rows of dc^T . a          leaf chains + the pairwise tree
 *   dbias     = token rule over rows of dc                 leaf sums + the pairwise tree
 * Scratch (device, counted through the arena): dweight with more than one leaf holds
 * leaves * n * k partial floats (+ ceil(leaves / 32) * n * k past 32 leaves); dbias
 * leaves * n floats.
 */
#include "mt_gpu_gemm.cuh"

uint64_t mt_linear_features(void) { return MT_FEATURE_LINEAR; }

namespace {

#define MT_FLAGS 5   /* [0] any input non-finite, [1 + b] input b */

struct dense_call {
    mt_arena arena;
    int32_t *flags = nullptr;
    struct out_buf {
        void *host;
        float *dev;
        int64_t bytes;
    };
    out_buf outs[3];
    int n_outs = 0;

    int begin() {
        int rc = arena.alloc((void **)&flags, MT_FLAGS * 4);
        if (rc) return rc;
        MT_GPU_CHECK(gpuMemsetAsync(flags, 0, MT_FLAGS * 4, MT_STREAM), "status reset");
        return MT_OK;
    }
    /* Device twins of the caller's buffers (NULL for an empty or absent one). */
    int input(const float **dev, const float *p, int64_t elems) {
        bool staged = false;
        *dev = nullptr;
        if (!p || elems <= 0) return MT_OK;
        return mt_buf_to_device((void **)dev, &staged, &arena, (void *)p, elems * 4, true);
    }
    int output(float **dev, float *p, int64_t elems) {
        bool staged = false;
        *dev = nullptr;
        if (!p || elems <= 0) return MT_OK;
        int rc = mt_buf_to_device((void **)dev, &staged, &arena, p, elems * 4, false);
        if (!rc && staged) outs[n_outs++] = out_buf{p, *dev, elems * 4};
        return rc;
    }
    /* Read the flags; refuse naming the first non-finite input, or download the outputs. */
    int finish(const char *const *names) {
        int32_t host[MT_FLAGS];
        MT_GPU_CHECK(gpuMemcpyAsync(host, flags, sizeof host, gpuMemcpyDefault, MT_STREAM), "status download");
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "linear");
        mt_gpu_count_d2h(sizeof host);
        if (host[0]) {
            for (int b = 0; b < MT_FLAGS - 1; ++b)
                if (host[1 + b] && names[b])
                    return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", names[b]);
            return mt_fail(MT_ENONFINITE, "an input holds NaN or inf; nothing was written");
        }
        int rc;
        for (int i = 0; i < n_outs; ++i)
            if ((rc = mt_buf_to_host(outs[i].host, outs[i].dev, outs[i].bytes))) return rc;
        if (n_outs) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
        return MT_OK;
    }
};

/* The oracle's checks, in its order: sizes, then a pointer for every tensor holding an element
 * (mn: the m x n tensor, out of a forward or dc of a backward, named mn_name), then a backward's
 * outputs apart from each other (da, dw, db; NULL for a forward); then a GPU. */
int linear_checks(const float *mn, const char *mn_name, const float *a, const float *weight, int64_t m, int64_t n,
                  int64_t k, const float *da = nullptr, const float *dw = nullptr, const float *db = nullptr) {
    int rc;
    if ((rc = mt_check_linear_sizes(m, n, k)) || (rc = mt_check_tensor(mn, m * n, mn_name)) ||
        (rc = mt_check_tensor(a, m * k, "a")) || (rc = mt_check_tensor(weight, n * k, "weight")) ||
        (rc = mt_check_linear_outputs(da, dw, db, m, n, k)))
        return rc;
    return mt_gpu_ready();
}

}  // namespace

extern "C" {

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m, int64_t n,
                      int64_t k) {
    int rc = linear_checks(out, "out", a, weight, m, n, k);
    if (rc) return rc;
    dense_call c;
    const float *da = nullptr, *dw = nullptr, *db = nullptr;
    float *dout = nullptr;
    if ((rc = c.begin()) || (rc = c.input(&da, a, m * k)) || (rc = c.input(&dw, weight, n * k)) ||
        (rc = c.input(&db, bias, n)) || (rc = c.output(&dout, out, m * n)))
        return rc;
    const float *ptrs[3] = {da, dw, db};
    const int64_t counts[3] = {m * k, n * k, n};
    if ((rc = mt_gemm::finite_check(c.flags, ptrs, counts, 3))) return rc;
    mt_gemm::desc g = mt_gemm::make_desc(dout, n, {da, k, mt_gemm::MT_KMAJOR}, {dw, k, mt_gemm::MT_KMAJOR}, m, n, k,
                                         c.flags);
    g.bias = db;
    if ((rc = mt_gemm::gemm(g))) return rc;
    static const char *const names[] = {"a", "weight", "bias", nullptr};
    return c.finish(names);
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a,
                       const float *weight, int64_t m, int64_t n, int64_t k) {
    int rc = linear_checks(dc, "dc", a, weight, m, n, k, da, dweight, dbias);
    if (rc) return rc;
    dense_call c;
    const float *ddc = nullptr, *dA = nullptr, *dW = nullptr;
    float *o_da = nullptr, *o_dw = nullptr, *o_db = nullptr;
    if ((rc = c.begin()) || (rc = c.input(&ddc, dc, m * n)) || (rc = c.input(&dA, a, m * k)) ||
        (rc = c.input(&dW, weight, n * k)) || (rc = c.output(&o_da, da, m * k)) ||
        (rc = c.output(&o_dw, dweight, n * k)) || (rc = c.output(&o_db, dbias, n)))
        return rc;
    const float *ptrs[3] = {ddc, dA, dW};
    const int64_t counts[3] = {m * n, m * k, n * k};
    if ((rc = mt_gemm::finite_check(c.flags, ptrs, counts, 3))) return rc;
    if (o_da) {   /* da(m, k) = dc(m, n) . weight(n, k): chains over n */
        mt_gemm::desc g = mt_gemm::make_desc(o_da, k, {ddc, n, mt_gemm::MT_KMAJOR}, {dW, k, mt_gemm::MT_RMAJOR}, m, k,
                                             n, c.flags);
        if ((rc = mt_gemm::gemm(g))) return rc;
    }
    if (o_dw) {   /* dweight(n, k) = token rule over the m rows of dc(i, j) * a(i, p) */
        mt_gemm::desc g = mt_gemm::make_desc(o_dw, k, {ddc, n, mt_gemm::MT_RMAJOR}, {dA, k, mt_gemm::MT_RMAJOR}, n, k,
                                             m, c.flags);
        if ((rc = mt_gemm::gemm_tokens(g, &c.arena))) return rc;
    }
    if (o_db && (rc = mt_gemm::token_col_sums(o_db, ddc, m, n, &c.arena, c.flags))) return rc;
    static const char *const names[] = {"dc", "a", "weight", nullptr};
    return c.finish(names);
}

}  /* extern "C" */
