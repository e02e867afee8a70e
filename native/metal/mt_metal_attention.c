/* mt_metal_attention.c -- scaled dot-product attention on Metal (contract: native/contracts/
 * attention.md; kernels: mt_metal_attention.metal). The oracle's order (native/cpu_oracle/
 * mt_cpu_attention.c): the shared argument checks (mt_check_attention_args), then a NaN or
 * infinity in an input refused by name before anything is written -- q, k, v (forward); dout, q,
 * k, v, out, then lse (NaN or +inf; -inf is a fully masked row's) (backward); then a float mask
 * (NaN or +inf, over the elements the strides reach, only when the call has pairs). lse and the
 * mask are read on the host through shared storage, by bit tests. Then the forward (a thread per
 * query row), or delta, dk and dv (a thread per key), dq (a thread per query row). */
#include <stddef.h>
#include "mt_attention_args.h"
#include "mt_host.h"
#include "mt_metal_rows.h"
#include "mt_pinned.h"

uint64_t mt_attention_features(void) { return MT_FEATURE_ATTENTION; }

static mt_mtl_attn_params params_of(const mt_attn_args *a) {
    mt_mtl_attn_params p = {a->B, a->H, a->Hkv, a->Tq, a->Tk, a->D, a->sb, a->sh, a->si, a->sj,
                            a->seed, a->stream, a->offset, a->scale, a->dropout_p, a->dropout_scale,
                            a->mask_kind, a->is_causal, a->lse != NULL, a->dk != NULL, a->dv != NULL};
    return p;
}

/* The inputs both passes read, bound: q, k, v and the mask. */
static int stage_inputs(mt_mtl_call *call, const mt_attn_args *a, mt_mtl_arg *q, mt_mtl_arg *k, mt_mtl_arg *v,
                        mt_mtl_arg *mask) {
    const int64_t nq = mt_attn_q_elems(a), nkv = mt_attn_kv_elems(a);
    int rc;
    if ((rc = mt_mtl_stage(call, q, a->q, nq * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, k, a->k, nkv * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, v, a->v, nkv * 4, MT_MTL_IN, NULL)))
        return rc;
    return mt_mtl_stage(call, mask, a->mask, mt_attn_mask_bytes(a), MT_MTL_IN, NULL);
}

static int forward_run(mt_mtl_call *call, const mt_attn_args *a) {
    const int64_t nq = mt_attn_q_elems(a), nkv = mt_attn_kv_elems(a), rows = mt_attn_rows(a);
    mt_mtl_arg args[7];
    int rc;
    if ((rc = stage_inputs(call, a, &args[2], &args[3], &args[4], &args[5])) ||
        (rc = mt_mtl_refuse_nonfinite(call, &args[2], nq, "q")) ||
        (rc = mt_mtl_refuse_nonfinite(call, &args[3], nkv, "k")) ||
        (rc = mt_mtl_refuse_nonfinite(call, &args[4], nkv, "v")))
        return rc;
    if (mt_attn_float_mask_bad(a)) return mt_fail_attention_mask();
    if (rows == 0) return MT_OK;
    mt_mtl_attn_params p = params_of(a);
    if ((rc = mt_mtl_stage(call, &args[0], a->out, nq * 4, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_stage(call, &args[1], a->lse, a->lse ? rows * 4 : 0, MT_MTL_OUT, NULL)))
        return rc;
    return mt_mtl_launch_with("mt_k_attn_forward", args, 7, &p, sizeof p, rows);
}

static int backward_run(mt_mtl_call *call, const mt_attn_args *a) {
    const int64_t nq = mt_attn_q_elems(a), nkv = mt_attn_kv_elems(a), rows = mt_attn_rows(a);
    mt_mtl_arg q, k, v, mask, dout, out, lse, delta, dq, dk, dv;
    int rc;
    if ((rc = mt_mtl_stage(call, &dout, a->dout, nq * 4, MT_MTL_IN, NULL)) ||
        (rc = stage_inputs(call, a, &q, &k, &v, &mask)) ||
        (rc = mt_mtl_stage(call, &out, a->out_in, nq * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(call, &lse, a->lse_in, rows * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_refuse_nonfinite(call, &dout, nq, "dout")) || (rc = mt_mtl_refuse_nonfinite(call, &q, nq, "q")) ||
        (rc = mt_mtl_refuse_nonfinite(call, &k, nkv, "k")) || (rc = mt_mtl_refuse_nonfinite(call, &v, nkv, "v")) ||
        (rc = mt_mtl_refuse_nonfinite(call, &out, nq, "out")))
        return rc;
    if (rows && mt_attn_lse_bad(a->lse_in, rows)) return mt_fail_attention_lse();
    if (mt_attn_float_mask_bad(a)) return mt_fail_attention_mask();
    mt_mtl_attn_params p = params_of(a);
    if ((rc = mt_mtl_scratch(call, &delta, (rows ? rows : 1) * 4, NULL)) ||
        (rc = mt_mtl_stage(call, &dq, a->dq, a->dq ? nq * 4 : 0, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_stage(call, &dk, a->dk, a->dk ? nkv * 4 : 0, MT_MTL_OUT, NULL)) ||
        (rc = mt_mtl_stage(call, &dv, a->dv, a->dv ? nkv * 4 : 0, MT_MTL_OUT, NULL)))
        return rc;
    if (rows > 0 && (a->dq || a->dk || a->dv)) {
        mt_mtl_arg args[4] = {delta, dout, out};
        if ((rc = mt_mtl_launch_with("mt_k_attn_delta", args, 4, &p, sizeof p, rows))) return rc;
    }
    if ((a->dk || a->dv) && nkv > 0) {     /* no query rows: every chain empty, dk = scale * +0, dv = +0 */
        mt_mtl_arg args[10] = {dk, dv, delta, q, k, v, dout, lse, mask};
        if ((rc = mt_mtl_launch_with("mt_k_attn_dkv", args, 10, &p, sizeof p, nkv / a->D))) return rc;
    }
    if (a->dq && rows > 0) {
        mt_mtl_arg args[9] = {dq, delta, q, k, v, dout, lse, mask};
        if ((rc = mt_mtl_launch_with("mt_k_attn_dq", args, 9, &p, sizeof p, rows))) return rc;
    }
    return MT_OK;
}

MT_NOINLINE static int attention_body(const mt_attn_args *a, int backward) {
    int rc;
    if ((rc = mt_check_attention_args(a, backward)) || (rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    rc = backward ? backward_run(&call, a) : forward_run(&call, a);
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_attention_run(const mt_attn_args *a, int backward) { MT_RETURN_IN_FP_ENV(attention_body(a, backward)); }
