/* mt_cpu_random.c -- uniform and normal fills and dropout on the cpu vendor (contract:
 * native/contracts/random.md).
 *
 * Every value is a pure function of (seed, stream, stream element), computed by mt_pinned.h;
 * the thread pool only decides who computes which elements. Loops walk Philox counter blocks
 * (four stream elements each), so each block is computed once per range.
 * A refused dropout writes nothing: an output that partly overlaps its input is refused
 * first, and a NaN or inf in the input by a finiteness pre-pass (one read of it,
 * mt_cpu_nonfinite) before the one pass that writes. The output may be the input (in place).
 * An output declared fresh (MT_MAP_OUT_FRESH) that is not the input gets the check fused
 * into the pass (mt_cpu_parallel_checked) and is undefined after a refusal.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

uint64_t mt_random_features(void) { return MT_FEATURE_RANDOM; }

/* The elements [offset + b, offset + e) of a stream, walked by Philox counter block (four
 * elements each, so each block is computed once): DRAW runs once per block `block`, then EACH
 * once per element of the range in it, with k its word in the block and i its index in the
 * output (the element - offset). */
#define MT_FOR_RANGE(offset, b, e, block, k, i, DRAW, ...)                                       \
    for (uint64_t first_ = (offset) + (uint64_t)(b), last_ = (offset) + (uint64_t)(e),          \
                  block = first_ >> 2;                                                          \
         first_ < last_ && block <= (last_ - 1) >> 2; ++block) {                                \
        DRAW;                                                                                   \
        for (int k = 0; k < 4; ++k) {                                                           \
            uint64_t i = 4 * block + (uint64_t)k;                                               \
            if (i >= first_ && i < last_) {                                                     \
                i -= (offset);                                                                  \
                __VA_ARGS__;                                                                    \
            }                                                                                   \
        }                                                                                       \
    }

/* ---- uniform fill (the draw every card input comes from) ---- */
typedef struct { float *out; uint64_t seed, stream, offset; float low, width; } uniform_job;

static void uniform_range(void *ctx, int64_t b, int64_t e) {
    uniform_job *job = (uniform_job *)ctx;
    for (int64_t i = b; i < e; ++i)
        job->out[i] = mt_uniform_at(job->low, job->width,
                                    mt_philox_word(job->seed, job->stream, job->offset + (uint64_t)i));
}

int mt_uniform_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double low, double high,
                    int64_t n) {
    float width, lo;
    int rc = mt_check_uniform_args(&width, &lo, out, offset, low, high, n);
    if (rc) return rc;
    uniform_job job = {out, seed, stream, offset, lo, width};
    mt_fp_env env;
    mt_fp_begin(&env);
    mt_parallel_for(n, 4, uniform_range, &job);   /* out of line: the ranges run behind a call */
    mt_fp_end(&env);
    return MT_OK;
}

/* ---- normal fill ---- */
typedef struct { float *out; uint64_t seed, stream, offset; float mean, std; } normal_job;

MT_SIMD static void normal_range(void *ctx, int64_t b, int64_t e) {
    normal_job *job = (normal_job *)ctx;
    float z[4];
    MT_FOR_RANGE(job->offset, b, e, block, k, i, mt_normal_block(z, job->seed, job->stream, block),
                 job->out[i] = mt_normal_value(job->mean, job->std, z[k]));
}

/* mean and std rounded to float32 under IEEE defaults (out of line, see mt_host.h). */
MT_NOINLINE static void normal_scalars(float *mean32, float *std32, double mean, double std) {
    *mean32 = mt_host_round(mean);
    *std32 = mt_host_round(std);
}

int mt_normal_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std, int64_t n) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_span(offset, n))) return rc;
    normal_job job = {out, seed, stream, offset, 0.0f, 0.0f};
    mt_fp_env env;
    mt_fp_begin(&env);
    normal_scalars(&job.mean, &job.std, mean, std);
    mt_fp_end(&env);
    if (!mt_is_finite(job.mean)) return mt_fail(MT_EINVAL, "mean must be finite in float32, got %g", mean);
    if (!mt_is_finite(job.std) || job.std < 0.0f)
        return mt_fail(MT_EINVAL, "std must be finite in float32 and >= 0, got %g", std);
    mt_fp_begin(&env);
    mt_parallel_for(n, 4, normal_range, &job);
    mt_fp_end(&env);
    return MT_OK;
}

/* ---- dropout (forward and backward are the same map of their input) ---- */
typedef struct { float *y; const float *x; uint64_t seed, stream, offset; float p, scale; } dropout_job;

MT_SIMD static void dropout_range(void *ctx, int64_t b, int64_t e) {
    dropout_job *job = (dropout_job *)ctx;
    uint32_t w[4];
    MT_FOR_RANGE(job->offset, b, e, block, k, i, mt_philox_words(w, job->seed, job->stream, block),
                 job->y[i] = mt_dropout_elem(job->x[i], w[k], job->p, job->scale));
}

/* The refusal as the elementwise maps': a pre-pass, or for a fresh output that is not x
 * (MT_MAP_OUT_FRESH) the check fused into the pass. */
static int dropout_common(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                          int64_t n, uint32_t flags, const char *yname, const char *xname) {
    int rc = mt_check_dropout_args(y, x, p, offset, n, flags, yname, xname);
    if (rc) return rc;
    int fused = (flags & MT_MAP_OUT_FRESH) && y != x;
    if (!fused && mt_cpu_nonfinite(x, n))
        return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", xname, MT_REFUSED_CLEAN);
    dropout_job job = {y, x, seed, stream, offset, p, 0.0f};
    mt_fp_env env;
    mt_fp_begin(&env);
    job.scale = mt_host_dropout_scale(p);
    int bad = 0;
    if (fused) bad = mt_cpu_parallel_checked(n, 4, x, 0, dropout_range, &job);
    else mt_parallel_for(n, 4, dropout_range, &job);
    mt_fp_end(&env);
    if (bad) return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", xname, MT_REFUSED_DIRTY);
    return MT_OK;
}

int mt_dropout_forward(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n,
                       uint32_t flags) {
    return dropout_common(y, x, p, seed, stream, offset, n, flags, "y", "x");
}

int mt_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                        int64_t n, uint32_t flags) {
    return dropout_common(dx, dy, p, seed, stream, offset, n, flags, "dx", "dy");
}
