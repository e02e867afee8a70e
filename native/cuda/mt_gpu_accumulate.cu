/* mt_gpu_accumulate.cu -- gradient accumulation on a GPU (contract: native/contracts/accumulate.md).
 *
 * out[i] = the pairwise tree over parts[0][i], ..., parts[A-1][i] (clip.md step 4), built per
 * element with the stack of complete subtrees (mt_cpu_accumulate.c says why it is the same
 * tree). One thread per element, grid-stride; part k is read by every thread at once, so each
 * read is coalesced. Host parts are uploaded, a host out is staged and downloaded only when
 * the call succeeds; device pointers are used in place. A non-finite output (NaN/inf in a
 * part, or an overflowing sum) sets a flag that every writer sets to the same value (no
 * atomics) and refuses the call: a device out is then undefined, a host out untouched.
 * make SABOTAGE=accumulate (MT_SAB_ACCUMULATE) folds the final stack from its bottom.
 */
#include <vector>
#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

#define MT_ACC_DEPTH 32

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_accumulate(float *out, const float *const *parts,
                                                                  int32_t n_parts, int64_t n, int32_t *bad) {
    bool any = false;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float st[MT_ACC_DEPTH];
        int top = 0;
        for (int32_t k = 0; k < n_parts; ++k) {
            float v = parts[k][i];
            for (uint32_t c = (uint32_t)k + 1; !(c & 1); c >>= 1) v = st[--top] + v;
            st[top++] = v;
        }
        float acc;
        if (MT_SAB_ACCUMULATE) {                 /* sabotage: fold the stack from its bottom */
            acc = st[0];
            for (int j = 1; j < top; ++j) acc = acc + st[j];
        } else {
            acc = st[--top];
            while (top > 0) acc = st[--top] + acc;
        }
        out[i] = acc;
        any |= !mt_is_finite(acc);
    }
    if (any) *bad = 1;   /* every writer stores the same value: no atomic needed */
}

uint64_t mt_accumulate_features(void) { return MT_FEATURE_ACCUMULATE; }

namespace {

/* Error path: the first part holding NaN or inf (read back to the host), or -1. */
int first_bad_part(const std::vector<const float *> &dev, int64_t n, int32_t *which) {
    *which = -1;
    std::vector<float> host((size_t)(n < 65536 ? n : 65536));
    for (size_t k = 0; k < dev.size() && *which < 0; ++k) {
        for (int64_t b = 0; b < n && *which < 0; b += (int64_t)host.size()) {
            int64_t len = n - b < (int64_t)host.size() ? n - b : (int64_t)host.size();
            MT_GPU_CHECK(gpuMemcpyAsync(host.data(), dev[k] + b, (size_t)len * 4, gpuMemcpyDefault, MT_STREAM),
                         "download");
            MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "accumulate");
            mt_gpu_count_d2h(len * 4);
            for (int64_t i = 0; i < len; ++i)
                if (!mt_is_finite(host[(size_t)i])) { *which = (int32_t)k; break; }
        }
    }
    return MT_OK;
}

}  // namespace

extern "C" int mt_accumulate(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    int rc;
    if ((rc = mt_check_accumulate_args(out, parts, n_parts, n))) return rc;
    if (n == 0) return MT_OK;
    if ((rc = mt_gpu_ready())) return rc;
    mt_arena arena;
    std::vector<const float *> dev((size_t)n_parts);
    for (int32_t k = 0; k < n_parts; ++k) {
        void *d = nullptr;
        bool staged = false;
        if ((rc = mt_buf_to_device(&d, &staged, &arena, (void *)parts[k], n * 4, true))) return rc;
        dev[(size_t)k] = (const float *)d;
    }
    float *dout = nullptr;
    bool out_staged = false;
    int32_t *bad = nullptr;
    const float *const *table = nullptr;
    if ((rc = mt_buf_to_device((void **)&dout, &out_staged, &arena, out, n * 4, false)) ||
        (rc = arena.alloc((void **)&bad, 4)) ||
        (rc = mt_cached_upload((const void **)&table, dev.data(), (int64_t)n_parts * 8)) || (rc = arena.flush()))
        return rc;
    MT_GPU_CHECK(gpuMemsetAsync(bad, 0, 4, MT_STREAM), "status reset");
    int threads = mt_gpu_threads(), blocks = mt_gpu_blocks(n, threads);
    mt_gpu_record_launch(threads, blocks);
    mt_k_accumulate<<<blocks, threads, 0, MT_STREAM>>>(dout, table, n_parts, n, bad);
    MT_GPU_CHECK(gpuGetLastError(), "accumulate");
    int32_t flag = 0;
    MT_GPU_CHECK(gpuMemcpyAsync(&flag, bad, 4, gpuMemcpyDefault, MT_STREAM), "status download");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "accumulate");
    mt_gpu_count_d2h(4);
    if (flag) {
        int32_t which = -1;
        if ((rc = first_bad_part(dev, n, &which))) return rc;
        if (which >= 0) return mt_fail(MT_ENONFINITE, "parts[%d] holds NaN or inf", (int)which);
        return mt_fail(MT_ENONFINITE, "the sum overflows float32 (inf) although every part is finite");
    }
    if (out_staged) {
        if ((rc = mt_buf_to_host(out, dout, n * 4))) return rc;
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "accumulate");
    }
    return MT_OK;
}
