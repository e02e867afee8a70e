/* mt_metal_random.c -- uniform and normal fills and dropout on Metal (contract:
 * native/contracts/random.md; kernel: mt_metal_random.metal). The host checks as the oracle
 * does (native/common), rounds the double scalars as it does, and launches one kernel per
 * stretch of the stream: a span that wraps past element 2^64 - 1 (a uniform fill may) is two. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_elementwise.h"
#include "mt_pinned.h"

uint64_t mt_random_features(void) { return MT_FEATURE_RANDOM; }

/* out (n elements, staged) for stream elements offset.., the x of dropout beside it. */
static int draw(float *out, const float *x, mt_mtl_random_params p, const char *xname) {
    int rc;
    if ((rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[4];
    const int64_t n = p.n;
    int bad[2] = {0, 0};
    if ((x && (rc = mt_mtl_stage(&call, &args[1], x, n * 4, MT_MTL_IN, NULL))) ||
        (rc = mt_mtl_stage(&call, &args[0], out, n * 4, MT_MTL_OUT, NULL)))
        goto done;
    if (x) {
        if ((rc = mt_mtl_prepass(&call, &args[1], NULL, n, &args[2], bad))) goto done;
        if (bad[0]) {
            rc = mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", xname, MT_REFUSED_CLEAN);
            goto done;
        }
    } else {
        args[1] = args[0];
        if ((rc = mt_mtl_scratch(&call, &args[2], 8, NULL))) goto done;
    }
    /* Elements past 2^64 - 1 wrap to 0: the first stretch ends there. */
    uint64_t room = p.offset ? (uint64_t)0 - p.offset : UINT64_MAX;
    int64_t first = (uint64_t)n > room ? (int64_t)room : n;
    for (int part = 0; part < 2 && rc == MT_OK; ++part) {
        int64_t count = part ? n - first : first, at = part ? first : 0;
        if (count <= 0) continue;
        mt_mtl_random_params q = p;
        q.offset = part ? 0 : p.offset;
        q.n = count;
        mt_mtl_arg a[4] = {args[0], args[1], args[2]};
        a[0].offset += at * 4;
        if (x) a[1].offset += at * 4;
        rc = mt_mtl_launch_with("mt_k_random", a, 4, &q, sizeof q, (count + 3) / 4 + 1);
    }
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_uniform_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double low, double high,
                    int64_t n) {
    float width, lo;
    int rc = mt_check_uniform_args(&width, &lo, out, offset, low, high, n);
    if (rc || n == 0) return rc;
    mt_mtl_random_params p = {seed, stream, offset, n, lo, width, MT_MTL_UNIFORM, 0};
    return draw(out, NULL, p, NULL);
}

/* mean and std rounded to float32 under IEEE defaults (out of line, see mt_host.h). */
MT_NOINLINE static void normal_scalars(float *mean32, float *std32, double mean, double std) {
    *mean32 = mt_host_round(mean);
    *std32 = mt_host_round(std);
}

int mt_normal_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std, int64_t n) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_span(offset, n))) return rc;
    float m, s;
    mt_fp_env env;
    mt_fp_begin(&env);
    normal_scalars(&m, &s, mean, std);
    mt_fp_end(&env);
    if (!mt_is_finite(m)) return mt_fail(MT_EINVAL, "mean must be finite in float32, got %g", mean);
    if (!mt_is_finite(s) || s < 0.0f) return mt_fail(MT_EINVAL, "std must be finite in float32 and >= 0, got %g", std);
    if (n == 0) return MT_OK;
    mt_mtl_random_params p = {seed, stream, offset, n, m, s, MT_MTL_NORMAL, 0};
    return draw(out, NULL, p, NULL);
}

static int dropout_call(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                        int64_t n, uint32_t flags, const char *yname, const char *xname) {
    int rc = mt_check_dropout_args(y, x, p, offset, n, flags, yname, xname);
    if (rc || n == 0) return rc;
    mt_fp_env env;
    mt_fp_begin(&env);
    float scale = mt_host_dropout_scale(p);   /* once, on the host, as the oracle forms it */
    mt_fp_end(&env);
    mt_mtl_random_params q = {seed, stream, offset, n, p, scale, MT_MTL_DROPOUT, 0};
    return draw(y, x, q, xname);
}

int mt_dropout_forward(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n,
                       uint32_t flags) {
    return dropout_call(y, x, p, seed, stream, offset, n, flags, "y", "x");
}

int mt_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, uint64_t stream, uint64_t offset,
                        int64_t n, uint32_t flags) {
    return dropout_call(dx, dy, p, seed, stream, offset, n, flags, "dx", "dy");
}
