/* mt_cpu_elementwise.c -- SiLU, GELU, the residual add and ReLU on the cpu vendor (contract:
 * native/contracts/elementwise.md).
 *
 * Each output element is one pinned function of its inputs (mt_silu, mt_silu_grad,
 * mt_gelu_erf, mt_gelu_tanh and their gradients, mt_add_elem in mt_pinned.h); the thread pool
 * only splits the range. A refused call writes
 * nothing: an output that partly overlaps an input is refused before anything is read, and a
 * NaN or inf in any input by a finiteness pre-pass (one read of each input, mt_cpu_nonfinite)
 * before the one pass that writes the output. The output may be an input itself (in place).
 * An output the caller declares fresh (MT_MAP_OUT_FRESH) and that is no input gets the check
 * fused into the pass instead (mt_cpu_parallel_checked): undefined after a refusal.
 * ReLU (at the end) keeps the checks it had beside linear: counts, pointers, the pre-pass.
 */
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <stddef.h>

uint64_t mt_elementwise_features(void) { return MT_FEATURE_ELEMENTWISE; }

enum { OP_SILU, OP_SILU_GRAD, OP_ADD, OP_GELU, OP_GELU_GRAD, OP_GELU_TANH, OP_GELU_TANH_GRAD };

/* out = op(a[, b]); for the gradients a is dy and b is x. */
typedef struct { float *out; const float *a, *b; int op; } elt_job;

MT_SIMD static void silu_range(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = mt_silu(x[i]);
}

MT_SIMD static void silu_grad_range(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = mt_silu_grad(dy[i], x[i]);
}

MT_SIMD static void add_range(float *out, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = mt_add_elem(a[i], b[i]);
}

MT_SIMD static void gelu_range(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = mt_gelu_erf(x[i]);
}

MT_SIMD static void gelu_grad_range(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = mt_gelu_erf_grad(dy[i], x[i]);
}

MT_SIMD static void gelu_tanh_range(float *y, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] = mt_gelu_tanh(x[i]);
}

MT_SIMD static void gelu_tanh_grad_range(float *dx, const float *dy, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dx[i] = mt_gelu_tanh_grad(dy[i], x[i]);
}

static void run_range(void *ctx, int64_t lo, int64_t hi) {
    elt_job *job = (elt_job *)ctx;
    float *out = job->out + lo;
    const float *a = job->a + lo, *b = job->b ? job->b + lo : 0;
    int64_t n = hi - lo;
    switch (job->op) {
    case OP_SILU: silu_range(out, a, n); break;
    case OP_SILU_GRAD: silu_grad_range(out, a, b, n); break;
    case OP_GELU: gelu_range(out, a, n); break;
    case OP_GELU_GRAD: gelu_grad_range(out, a, b, n); break;
    case OP_GELU_TANH: gelu_tanh_range(out, a, n); break;
    case OP_GELU_TANH_GRAD: gelu_tanh_grad_range(out, a, b, n); break;
    default: add_range(out, a, b, n); break;
    }
}

/* The map with its refusal: a pre-pass over the inputs, or -- a fresh output that is no input
 * (MT_MAP_OUT_FRESH) -- the check fused into the pass (mt_cpu_parallel_checked), the output
 * then undefined after a refusal. */
static int run(float *out, const float *a, const float *b, int64_t n, int op, uint32_t flags, const char *const names[3]) {
    int rc = mt_check_map_args(out, a, b, n, names);
    if (rc || (rc = mt_check_map_flags(flags))) return rc;
    int unary = op == OP_SILU || op == OP_GELU || op == OP_GELU_TANH;
    int fused = (flags & MT_MAP_OUT_FRESH) && out != a && out != b;
    elt_job job = {out, a, unary ? 0 : b, op};
    const char *bad = 0;
    if (!fused)
        bad = mt_cpu_nonfinite(a, n) ? names[1] : b != a && mt_cpu_nonfinite(b, n) ? names[2] : 0;
    if (bad) return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", bad, MT_REFUSED_CLEAN);
    mt_fp_env env;
    mt_fp_begin(&env);
    if (!fused)
        mt_parallel_for(n, 16, run_range, &job);
    else if (mt_cpu_parallel_checked(n, 16, a, b, run_range, &job))
        bad = mt_cpu_nonfinite(a, n) ? names[1] : names[2];
    mt_fp_end(&env);
    if (bad) return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", bad, MT_REFUSED_DIRTY);
    return MT_OK;
}

int mt_silu_forward(float *y, const float *x, int64_t n, uint32_t flags) {
    const char *names[3] = {"y", "x", "x"};
    return run(y, x, x, n, OP_SILU, flags, names);
}

int mt_silu_backward(float *dx, const float *dy, const float *x, int64_t n, uint32_t flags) {
    const char *names[3] = {"dx", "dy", "x"};
    return run(dx, dy, x, n, OP_SILU_GRAD, flags, names);
}

int mt_add(float *out, const float *a, const float *b, int64_t n, uint32_t flags) {
    const char *names[3] = {"out", "a", "b"};
    return run(out, a, b, n, OP_ADD, flags, names);
}

int mt_gelu_forward(float *y, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    const char *names[3] = {"y", "x", "x"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return run(y, x, x, n, approximate == MT_GELU_TANH ? OP_GELU_TANH : OP_GELU, flags, names);
}

int mt_gelu_backward(float *dx, const float *dy, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    const char *names[3] = {"dx", "dy", "x"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return run(dx, dy, x, n, approximate == MT_GELU_TANH ? OP_GELU_TANH_GRAD : OP_GELU_GRAD, flags, names);
}

/* ---- ReLU ------------------------------------------------------------------------------------ */
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
    if ((rc = mt_check_count(n, "n")) || (rc = mt_check_tensor(out, n, dy ? "dx" : "y")) ||
        (rc = mt_check_tensor(x, n, "x")) || (rc = mt_cpu_refuse_nonfinite(dy, n, "dy")) ||
        (rc = mt_cpu_refuse_nonfinite(x, n, "x")))
        return rc;
    relu_job job = {out, dy, x};
    mt_parallel_for(n, 4096, relu_range, &job);
    return MT_OK;
}

static int relu_common(float *out, const float *dy, const float *x, int64_t n) {
    MT_RETURN_IN_FP_ENV(relu_body(out, dy, x, n));
}

int mt_relu_forward(float *y, const float *x, int64_t n) { return relu_common(y, NULL, x, n); }

int mt_relu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    if (n > 0 && !dy) return mt_fail(MT_EINVAL, "dy is NULL");
    return relu_common(dx, dy, x, n);
}
