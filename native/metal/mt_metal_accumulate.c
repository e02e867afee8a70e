/* mt_metal_accumulate.c -- gradient accumulation on Metal (contract: native/contracts/
 * accumulate.md). out[i] is the pairwise tree over parts[0][i] .. parts[A-1][i], built as the
 * oracle builds it (native/cpu_oracle/mt_cpu_accumulate.c) with a stack of complete subtrees,
 * here whole arrays (mt_metal_token_stack.h): part k is copied onto the stack, or added into
 * its top (left + right) and the two top subtrees merged once per further trailing zero bit of
 * k + 1; at the end the stack folds from its top, S[j] + (S[j+1] + ...). Each step is one
 * launch of mt_k_add2 / mt_k_copy (mt_metal_accumulate.metal) over every element. A non-finite output refuses the call naming
 * the first non-finite part (out is then undefined; a host out is not written). */
#include <stddef.h>
#include "mt_host.h"
#include "mt_metal_elementwise.h"
#include "mt_metal_token_stack.h"
#include "mt_pinned.h"

uint64_t mt_accumulate_features(void) { return MT_FEATURE_ACCUMULATE; }

/* Part k pushed onto the stack (its own staging: parts may be many host buffers). */
static int push_part(mt_mtl_token_stack *stack, const float *part, int64_t n) {
    mt_mtl_call one;
    mt_mtl_begin(&one);
    mt_mtl_arg v;
    int rc = mt_mtl_stage(&one, &v, part, n * 4, MT_MTL_IN, NULL);
    if (rc == MT_OK) rc = mt_mtl_stack_push(stack, &v);
    mt_mtl_end(&one, 0);
    return rc;
}

MT_NOINLINE static int accumulate_body(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    int rc = mt_check_accumulate_args(out, parts, n_parts, n);
    if (rc || n == 0 || (rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg o, words;
    mt_mtl_token_stack stack;
    int bad[2] = {0, 0};
    mt_mtl_stack_init(&stack, &call, n, 1);
    if ((rc = mt_mtl_stage(&call, &o, out, n * 4, MT_MTL_OUT, NULL))) goto done;
    for (int32_t k = 0; k < n_parts && rc == MT_OK; ++k) rc = push_part(&stack, parts[k], n);
    if (rc) goto done;
    /* make SABOTAGE=accumulate: the stack reversed, so the fold runs from its bottom. */
    for (int j = 0; MT_SAB_ACCUMULATE && j < stack.top / 2; ++j) {
        mt_mtl_arg t = stack.slot[j];
        stack.slot[j] = stack.slot[stack.top - 1 - j];
        stack.slot[stack.top - 1 - j] = t;
    }
    if ((rc = mt_mtl_stack_finish(&stack, &o)) || (rc = mt_mtl_prepass(&call, &o, NULL, n, &words, bad))) goto done;
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
