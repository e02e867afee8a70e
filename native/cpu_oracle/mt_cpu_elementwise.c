/* mt_cpu_elementwise.c -- SiLU and the residual add on the cpu vendor (contract:
 * native/contracts/elementwise.md).
 *
 * Each output element is one pinned function of its inputs (mt_silu, mt_silu_grad,
 * mt_add_elem in mt_pinned.h); the thread pool only splits the range. A NaN or inf in any
 * input is refused: the check rides along the one pass, so after a refusal the output (never
 * an input) holds undefined values; when the output is one of the inputs (in place), a
 * separate pre-pass decides before anything is written.
 */
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

uint64_t mt_elementwise_features(void) { return MT_FEATURE_ELEMENTWISE; }

enum { OP_SILU, OP_SILU_GRAD, OP_ADD };

/* out = op(a[, b]); for OP_SILU_GRAD a is dy and b is x. */
typedef struct { float *out; const float *a, *b; int op, bad; } elt_job;

MT_SIMD static int silu_range(float *y, const float *x, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        bad |= !mt_is_finite(x[i]);
        y[i] = mt_silu(x[i]);
    }
    return bad;
}

MT_SIMD static int silu_grad_range(float *dx, const float *dy, const float *x, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        bad |= !(mt_is_finite(dy[i]) & mt_is_finite(x[i]));
        dx[i] = mt_silu_grad(dy[i], x[i]);
    }
    return bad;
}

MT_SIMD static int add_range(float *out, const float *a, const float *b, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
        bad |= !(mt_is_finite(a[i]) & mt_is_finite(b[i]));
        out[i] = mt_add_elem(a[i], b[i]);
    }
    return bad;
}

MT_SIMD static int nonfinite_range(const float *a, const float *b, int64_t n) {
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad |= !(mt_is_finite(a[i]) & mt_is_finite(b ? b[i] : 0.0f));
    return bad;
}

static void run_range(void *ctx, int64_t lo, int64_t hi) {
    elt_job *job = (elt_job *)ctx;
    int bad;
    if (job->op == OP_SILU) bad = silu_range(job->out + lo, job->a + lo, hi - lo);
    else if (job->op == OP_SILU_GRAD) bad = silu_grad_range(job->out + lo, job->a + lo, job->b + lo, hi - lo);
    else bad = add_range(job->out + lo, job->a + lo, job->b + lo, hi - lo);
    if (bad) job->bad = 1;   /* every writer stores the same value */
}

static void check_range(void *ctx, int64_t lo, int64_t hi) {
    elt_job *job = (elt_job *)ctx;
    if (nonfinite_range(job->a + lo, job->b ? job->b + lo : 0, hi - lo)) job->bad = 1;
}

static int run(float *out, const float *a, const float *b, int64_t n, int op, const char *names[3]) {
    int rc;
    if ((rc = mt_check_ptr(out, names[0])) || (rc = mt_check_ptr(a, names[1])) ||
        (b != a && (rc = mt_check_ptr(b, names[2]))))
        return rc;
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    elt_job job = {out, a, op == OP_SILU ? 0 : b, op, 0};
    int in_place = out == a || (job.b && out == job.b);
    mt_fp_env env;
    mt_fp_begin(&env);
    if (in_place) mt_parallel_for(n, 1024, check_range, &job);
    if (!job.bad) mt_parallel_for(n, 16, run_range, &job);
    mt_fp_end(&env);
    if (job.bad)
        return mt_fail(MT_ENONFINITE, "%s%s%s holds NaN or inf; refused %s", names[1], job.b ? " or " : "",
                       job.b ? names[2] : "", in_place ? MT_REFUSED_CLEAN : MT_REFUSED_DIRTY);
    return MT_OK;
}

int mt_silu_forward(float *y, const float *x, int64_t n) {
    const char *names[3] = {"y", "x", "x"};
    return run(y, x, x, n, OP_SILU, names);
}

int mt_silu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    const char *names[3] = {"dx", "dy", "x"};
    return run(dx, dy, x, n, OP_SILU_GRAD, names);
}

int mt_add(float *out, const float *a, const float *b, int64_t n) {
    const char *names[3] = {"out", "a", "b"};
    return run(out, a, b, n, OP_ADD, names);
}
