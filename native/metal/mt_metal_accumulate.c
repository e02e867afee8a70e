/* mt_metal_accumulate.c -- gradient accumulation on Metal (contract: native/contracts/
 * accumulate.md). out[i] is the pairwise tree over parts[0][i] .. parts[A-1][i], built as the
 * oracle builds it (native/cpu_oracle/mt_cpu_accumulate.c) with a stack of complete subtrees,
 * here whole arrays: part k is copied onto the stack, or added into its top (left + right) and
 * the two top subtrees merged once per further trailing one bit of k + 1; at the end the stack
 * folds from its top, S[j] + (S[j+1] + ...). Each step is one launch of mt_k_add2 / mt_k_copy
 * (mt_metal_accumulate.metal) over every element. A non-finite output refuses the call naming
 * the first non-finite part (out is then undefined; a host out is not written). */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_elementwise.h"
#include "mt_pinned.h"

#define ACC_DEPTH 32   /* n_parts < 2^31: at most 31 complete subtrees plus one */

uint64_t mt_accumulate_features(void) { return MT_FEATURE_ACCUMULATE; }

static int add2(const mt_mtl_arg *dst, const mt_mtl_arg *a, const mt_mtl_arg *b, int64_t n) {
    mt_mtl_count_params p = {n};
    mt_mtl_arg args[4] = {*dst, *a, *b};
    return mt_mtl_launch_with("mt_k_add2", args, 4, &p, sizeof p, n);
}

static int copy(const mt_mtl_arg *dst, const mt_mtl_arg *src, int64_t n) {
    mt_mtl_count_params p = {n};
    mt_mtl_arg args[3] = {*dst, *src};
    return mt_mtl_launch_with("mt_k_copy", args, 3, &p, sizeof p, n);
}

/* Part k pushed onto the stack (its own staging: parts may be many host buffers). */
static int push_part(mt_mtl_arg *stack, int *top, int *have, mt_mtl_call *call, const float *part, int32_t k, int64_t n) {
    mt_mtl_call one;
    mt_mtl_begin(&one);
    mt_mtl_arg v;
    int rc = mt_mtl_stage(&one, &v, part, n * 4, MT_MTL_IN, NULL);
    uint32_t c = (uint32_t)k + 1;
    if (rc == MT_OK && !(c & 1)) {
        rc = add2(&stack[*top - 1], &stack[*top - 1], &v, n);     /* S[top-1] + part k */
        for (c >>= 1; rc == MT_OK && !(c & 1); c >>= 1) {        /* then the further merges */
            rc = add2(&stack[*top - 2], &stack[*top - 2], &stack[*top - 1], n);
            --*top;
        }
    } else if (rc == MT_OK) {
        if (*top == *have) {
            if ((rc = mt_mtl_scratch(call, &stack[*top], n * 4, NULL)) == MT_OK) ++*have;
        }
        if (rc == MT_OK && (rc = copy(&stack[*top], &v, n)) == MT_OK) ++*top;
    }
    mt_mtl_end(&one, 0);
    return rc;
}

MT_NOINLINE static int accumulate_body(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    int rc = mt_check_accumulate_args(out, parts, n_parts, n);
    if (rc || n == 0 || (rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg stack[ACC_DEPTH], o, words;
    int top = 0, have = 0, bad[2] = {0, 0};
    if ((rc = mt_mtl_stage(&call, &o, out, n * 4, MT_MTL_OUT, NULL))) goto done;
    for (int32_t k = 0; k < n_parts && rc == MT_OK; ++k) rc = push_part(stack, &top, &have, &call, parts[k], k, n);
    if (rc) goto done;
    /* make SABOTAGE=accumulate: the stack reversed, so the fold runs from its bottom. */
    for (int j = 0; MT_SAB_ACCUMULATE && j < top / 2; ++j) {
        mt_mtl_arg t = stack[j];
        stack[j] = stack[top - 1 - j];
        stack[top - 1 - j] = t;
    }
    if (top == 1) {
        rc = copy(&o, &stack[0], n);
    } else {
        rc = add2(&o, &stack[top - 2], &stack[top - 1], n);
        for (int j = top - 3; j >= 0 && rc == MT_OK; --j) rc = add2(&o, &stack[j], &o, n);
    }
    if (rc || (rc = mt_mtl_prepass(&call, &o, NULL, n, &words, bad))) goto done;
    if (bad[0]) {
        for (int32_t k = 0; k < n_parts && rc == MT_OK; ++k) {   /* error path: name the culprit */
            mt_mtl_call one;
            mt_mtl_begin(&one);
            mt_mtl_arg v, w;
            int pb[2] = {0, 0};
            if (!(rc = mt_mtl_stage(&one, &v, parts[k], n * 4, MT_MTL_IN, NULL)) &&
                !(rc = mt_mtl_prepass(&one, &v, NULL, n, &w, pb)) && pb[0])
                rc = mt_fail(MT_ENONFINITE, "parts[%d] holds NaN or inf", (int)k);
            mt_mtl_end(&one, 0);
        }
        if (rc == MT_OK) rc = mt_fail(MT_ENONFINITE, "the sum overflows float32 (inf) although every part is finite");
    }
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_accumulate(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    MT_RETURN_IN_FP_ENV(accumulate_body(out, parts, n_parts, n));
}
