/* mt_metal_elementwise.c -- SiLU, GELU, the residual add and ReLU on Metal (contract:
 * native/contracts/elementwise.md; kernels: mt_metal_elementwise.metal), and the finiteness
 * pre-pass the maps and dropout share.
 *
 * A call: the oracle's argument checks (native/common); the inputs bound (device buffers in
 * place, host ones staged); the pre-pass, whose words the host reads after the wait; a refusal
 * then writes nothing anywhere (a staged output is never downloaded, a device output never
 * touched); else the map, and the download of a staged output. The output may be an input
 * itself (in place). Every map is one pinned routine per element, as on every vendor. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_elementwise.h"
#include "mt_pinned.h"

uint64_t mt_elementwise_features(void) { return MT_FEATURE_ELEMENTWISE; }

int mt_mtl_prepass(mt_mtl_call *call, const mt_mtl_arg *a, const mt_mtl_arg *b, int64_t n, mt_mtl_arg *words,
                   int bad[2]) {
    int32_t *w;
    int rc = mt_mtl_scratch(call, words, 8, (void **)&w);
    if (rc) return rc;
    mt_mtl_nonfinite_params p = {n, b != NULL, 0};
    mt_mtl_arg args[4] = {*a, b ? *b : *a, *words};
    if ((rc = mt_mtl_launch_with("mt_k_nonfinite", args, 4, &p, sizeof p, n))) return rc;
    bad[0] = w[0] != 0;
    bad[1] = w[1] != 0;
    return MT_OK;
}

/* out = op(a[, b]) for n elements, names {out, a, b}; b unread by the unary ops. A NaN or inf
 * input is refused naming it, the message ending `ending` (the op's own on every vendor). */
static int run_map(float *out, const float *a, const float *b, int64_t n, int32_t op, const char *const names[3],
                   const char *ending) {
    const int unary = op == MT_MTL_SILU || op == MT_MTL_GELU || op == MT_MTL_GELU_TANH || op == MT_MTL_RELU;
    int rc;
    if ((rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[5];
    int bad[2] = {0, 0};
    const int two = !unary && b != a;
    if ((rc = mt_mtl_stage(&call, &args[1], a, n * 4, MT_MTL_IN, NULL)) ||
        (two && (rc = mt_mtl_stage(&call, &args[2], b, n * 4, MT_MTL_IN, NULL))) ||
        (rc = mt_mtl_stage(&call, &args[0], out, n * 4, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_prepass(&call, &args[1], two ? &args[2] : NULL, n, &args[3], bad)))
        goto done;
    if (!two) args[2] = args[1];
    if (bad[0] || bad[1]) {
        rc = mt_fail(MT_ENONFINITE, "%s holds NaN or inf; %s", bad[0] ? names[1] : names[2], ending);
        goto done;
    }
    mt_mtl_map_params p = {n, op, 0};
    rc = mt_mtl_launch_with("mt_k_map", args, 5, &p, sizeof p, n);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

static int map_call(float *out, const float *a, const float *b, int64_t n, int32_t op, uint32_t flags,
                    const char *const names[3]) {
    int rc = mt_check_map_args(out, a, b, n, names);
    if (rc || (rc = mt_check_map_flags(flags)) || n == 0) return rc;
    return run_map(out, a, b, n, op, names, "refused " MT_REFUSED_CLEAN);
}

int mt_silu_forward(float *y, const float *x, int64_t n, uint32_t flags) {
    const char *const names[3] = {"y", "x", "x"};
    return map_call(y, x, x, n, MT_MTL_SILU, flags, names);
}

int mt_silu_backward(float *dx, const float *dy, const float *x, int64_t n, uint32_t flags) {
    const char *const names[3] = {"dx", "dy", "x"};
    return map_call(dx, dy, x, n, MT_MTL_SILU_GRAD, flags, names);
}

int mt_add(float *out, const float *a, const float *b, int64_t n, uint32_t flags) {
    const char *const names[3] = {"out", "a", "b"};
    return map_call(out, a, b, n, MT_MTL_ADD, flags, names);
}

int mt_gelu_forward(float *y, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    const char *const names[3] = {"y", "x", "x"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return map_call(y, x, x, n, approximate == MT_GELU_TANH ? MT_MTL_GELU_TANH : MT_MTL_GELU, flags, names);
}

int mt_gelu_backward(float *dx, const float *dy, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    const char *const names[3] = {"dx", "dy", "x"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return map_call(dx, dy, x, n, approximate == MT_GELU_TANH ? MT_MTL_GELU_TANH_GRAD : MT_MTL_GELU_GRAD, flags, names);
}

/* ReLU keeps the checks it has beside linear on every vendor: counts, pointers, then dy's and
 * x's finiteness (one pre-pass reads both; dy is named first). */
static int relu_call(float *out, const float *dy, const float *x, int64_t n) {
    int rc;
    if ((rc = mt_check_count(n, "n")) || (rc = mt_check_tensor(out, n, dy ? "dx" : "y")) ||
        (rc = mt_check_tensor(x, n, "x")) || n == 0)
        return rc;
    const char *const names[3] = {dy ? "dx" : "y", dy ? "dy" : "x", "x"};
    return run_map(out, dy ? dy : x, x, n, dy ? MT_MTL_RELU_GRAD : MT_MTL_RELU, names, "nothing was written");
}

int mt_relu_forward(float *y, const float *x, int64_t n) { return relu_call(y, NULL, x, n); }

int mt_relu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    if (n > 0 && !dy) return mt_fail(MT_EINVAL, "dy is NULL");
    return relu_call(dx, dy, x, n);
}
