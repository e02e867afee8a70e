/* mt_cpu_misc.c -- the CPU vendor's identity bits, thread control and Philox fills. */
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

uint64_t mt_vendor_features(void) { return MT_FEATURE_HOST_BUFFERS | MT_FEATURE_THREADS; }

int mt_num_threads(void) { return mt_pool_threads(); }

int mt_set_num_threads(int32_t n_threads) {
    if (mt_pool_set_threads(n_threads) != 0)
        return mt_fail(MT_EINVAL, "n_threads must be in 1..64, got %d", (int)n_threads);
    return MT_OK;
}

typedef struct { float *out; uint64_t seed, stream, offset; float low, width; } uniform_job;

static void uniform_range(void *ctx, int64_t b, int64_t e) {
    uniform_job *job = (uniform_job *)ctx;
    for (int64_t i = b; i < e; ++i)
        job->out[i] = mt_uniform_at(job->low, job->width,
                                    mt_philox_word(job->seed, job->stream, job->offset + (uint64_t)i));
}

int mt_uniform_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, float low, float high,
                    int64_t n) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_finite_scalar(low, "low")) ||
        (rc = mt_check_finite_scalar(high, "high")))
        return rc;
    if (!(low < high)) return mt_fail(MT_EINVAL, "low must be < high (got %g, %g)", (double)low, (double)high);
    float width = high - low;
    if (!mt_is_finite(width)) return mt_fail(MT_EINVAL, "high - low overflows float32");
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    uniform_job job = {out, seed, stream, offset, low, width};
    mt_parallel_for(n, 4, uniform_range, &job);
    return MT_OK;
}
