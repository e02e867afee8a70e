/* mt_metal_linear.c -- linear forward and backward on Metal (contract: native/contracts/
 * linear.md; kernels: mt_metal_linear.metal). The oracle's order (native/cpu_oracle/
 * mt_cpu_linear.c): sizes and pointers, then a NaN or infinity in any input refused by name
 * before any output is written, then out (chains over k, + bias), da (chains over n), dweight
 * and dbias (the token rule over the m rows: leaf chains, then the pairwise tree). An output
 * that overlaps an input (out on a, say: the oracle takes it and gives the bits of a separate
 * buffer) is computed into a scratch and copied over it once every output is formed: staging would
 * otherwise give both one twin, and device memory is one buffer, so threads would read inputs
 * that others had overwritten. */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_rows.h"
#include "mt_metal_token_stack.h"
#include "mt_pinned.h"

uint64_t mt_linear_features(void) { return MT_FEATURE_LINEAR; }

/* The n floats of the caller's output `host`, bound in *dst; *into is what the kernel writes:
 * *dst itself, or a scratch of the call when `host` overlaps one of the inputs (ins[j], bytes[j]). */
static int stage_output(mt_mtl_call *call, mt_mtl_arg *dst, mt_mtl_arg *into, const float *host, int64_t n,
                        const void *const *ins, const int64_t *bytes, int n_in) {
    int rc = mt_mtl_stage(call, dst, host, n * 4, MT_MTL_OUT, NULL);
    *into = *dst;
    for (int j = 0; !rc && j < n_in; ++j)
        if (ins[j] && mt_bytes_overlap(host, n * 4, ins[j], bytes[j])) return mt_mtl_scratch(call, into, n * 4, NULL);
    return rc;
}

/* dst <- into's n floats when they are apart (stage_output's scratch). */
static int settle_output(const mt_mtl_arg *dst, const mt_mtl_arg *into, int64_t n) {
    if (dst->buffer == into->buffer && dst->offset == into->offset) return MT_OK;
    return mt_mtl_copy(dst, into, n);
}

static int launch_linear(const char *kernel, mt_mtl_arg *args, int32_t n_args, mt_mtl_linear_params p, int op,
                         int64_t work) {
    p.op = op;
    return mt_mtl_launch_with(kernel, args, n_args, &p, sizeof p, work);
}

MT_NOINLINE static int forward_body(float *out, const float *a, const float *weight, const float *bias, int64_t m,
                                    int64_t n, int64_t k) {
    int rc;
    if ((rc = mt_check_linear_sizes(m, n, k)) || (rc = mt_check_tensor(out, m * n, "out")) ||
        (rc = mt_check_tensor(a, m * k, "a")) || (rc = mt_check_tensor(weight, n * k, "weight")) ||
        (rc = mt_mtl_open()))
        return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[5];
    if ((rc = mt_mtl_stage(&call, &args[1], a, m * k * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &args[2], weight, n * k * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &args[3], bias, bias ? n * 4 : 0, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &args[1], m * k, "a")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &args[2], n * k, "weight")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, bias ? &args[3] : NULL, n, "bias")))
        goto done;
    if (m * n > 0) {
        mt_mtl_linear_params p = {m, n, k, 0, bias != NULL};
        const void *ins[3] = {a, weight, bias};
        const int64_t bytes[3] = {m * k * 4, n * k * 4, n * 4};
        mt_mtl_arg dst;
        if ((rc = stage_output(&call, &dst, &args[0], out, m * n, ins, bytes, 3)) ||
            (rc = launch_linear("mt_k_linear_chain", args, 5, p, MT_MTL_LINEAR_OUT, m * n)))
            goto done;
        rc = settle_output(&dst, &args[0], m * n);
    }
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m, int64_t n,
                      int64_t k) {
    MT_RETURN_IN_FP_ENV(forward_body(out, a, weight, bias, m, n, k));
}

/* dweight (op DW, n x k) or dbias (op DB, n) by the token rule over the m rows. */
static int token_rule(mt_mtl_call *call, const mt_mtl_arg *out, const mt_mtl_arg *dc, const mt_mtl_arg *a,
                      mt_mtl_linear_params p, int op) {
    const int64_t leaves = mt_token_leaves(p.m), outs = op == MT_MTL_LINEAR_DB ? p.n : p.n * p.k;
    mt_mtl_arg leaf[4] = {*dc, *a}, tree[3];
    int rc = mt_mtl_scratch(call, &leaf[2], (leaves ? leaves : 1) * outs * 4, NULL);
    if (rc) return rc;
    /* no rows: every output's tree is empty, +0.0 (the scratch's zeros) */
    if (leaves > 0 && (rc = launch_linear("mt_k_linear_leaves", leaf, 4, p, op, leaves * outs))) return rc;
    tree[0] = leaf[2];
    tree[1] = *out;
    return launch_linear("mt_k_linear_tree", tree, 3, p, op, outs);
}

MT_NOINLINE static int backward_body(float *da, float *dweight, float *dbias, const float *dc, const float *a,
                                     const float *weight, int64_t m, int64_t n, int64_t k) {
    int rc;
    if ((rc = mt_check_linear_sizes(m, n, k)) || (rc = mt_check_tensor(dc, m * n, "dc")) ||
        (rc = mt_check_tensor(a, m * k, "a")) || (rc = mt_check_tensor(weight, n * k, "weight")) ||
        (rc = mt_check_linear_outputs(da, dweight, dbias, m, n, k)) || (rc = mt_mtl_open()))
        return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg adc, aa, aw, out[3], into[3];
    mt_mtl_linear_params p = {m, n, k, 0, 0};
    const void *ins[3] = {dc, a, weight};
    const int64_t bytes[3] = {m * n * 4, m * k * 4, n * k * 4};
    if ((rc = mt_mtl_stage(&call, &adc, dc, m * n * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aa, a, m * k * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &aw, weight, n * k * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &adc, m * n, "dc")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &aa, m * k, "a")) ||
        (rc = mt_mtl_refuse_nonfinite(&call, &aw, n * k, "weight")))
        goto done;
    const int64_t count[3] = {da ? m * k : 0, dweight ? n * k : 0, dbias ? n : 0};
    float *const host[3] = {da, dweight, dbias};
    for (int o = 0; o < 3; ++o)
        if (count[o] > 0 && (rc = stage_output(&call, &out[o], &into[o], host[o], count[o], ins, bytes, 3))) goto done;
    if (count[0] > 0) {
        mt_mtl_arg args[5] = {into[0], adc, aw, aw};
        if ((rc = launch_linear("mt_k_linear_chain", args, 5, p, MT_MTL_LINEAR_DA, m * k))) goto done;
    }
    if ((count[1] > 0 && (rc = token_rule(&call, &into[1], &adc, &aa, p, MT_MTL_LINEAR_DW))) ||
        (count[2] > 0 && (rc = token_rule(&call, &into[2], &adc, &aa, p, MT_MTL_LINEAR_DB))))
        goto done;
    for (int o = 0; o < 3; ++o)     /* every output formed before any over an input is written */
        if (count[o] > 0 && (rc = settle_output(&out[o], &into[o], count[o]))) goto done;
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a, const float *weight,
                       int64_t m, int64_t n, int64_t k) {
    MT_RETURN_IN_FP_ENV(backward_body(da, dweight, dbias, dc, a, weight, m, n, k));
}
