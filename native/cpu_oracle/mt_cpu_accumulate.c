/* mt_cpu_accumulate.c -- gradient accumulation on the cpu vendor (contract:
 * native/contracts/accumulate.md).
 *
 * out[i] = the pairwise tree of clip.md step 4 over parts[0][i], ..., parts[A-1][i]. It is
 * built on the fly with a stack of complete subtrees: part k is pushed, then the two top
 * subtrees merge (left + right) once per trailing one bit of k; at the end the stack folds
 * from its top, S[j] + (S[j+1] + ...). That is the same tree (the pairwise tree is "the
 * largest power of two on the left as a perfect tree, the tree of the rest on the right").
 * Elements are independent, so blocks of 256 run on the thread pool; a finiteness flag is
 * gathered on the outputs (an infinite or NaN input, or an overflowing sum, gives a
 * non-finite output) and refuses the call, leaving out undefined and every part untouched.
 * make SABOTAGE=accumulate (MT_SAB_ACCUMULATE) folds the final stack from its bottom.
 */
#include <string.h>
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

#define ACC_BLOCK 256
#define ACC_DEPTH 32          /* n_parts < 2^31: at most 31 complete subtrees plus one */

uint64_t mt_accumulate_features(void) { return MT_FEATURE_ACCUMULATE; }

typedef struct {
    float *out;
    const float *const *parts;
    int32_t n_parts;
    int bad;
} acc_job;

MT_SIMD static void add_into(float *restrict dst, const float *restrict a, const float *restrict b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
}

/* dst = dst + b (dst the left operand) and dst = a + dst (dst the right one). */
MT_SIMD static void add_left(float *restrict dst, const float *restrict b, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = dst[i] + b[i];
}

MT_SIMD static void add_right(float *restrict dst, const float *restrict a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) dst[i] = a[i] + dst[i];
}

/* out[b, b+len) from the parts' same elements. */
static void acc_block(const acc_job *job, int64_t b, int64_t len, float buf[ACC_DEPTH][ACC_BLOCK]) {
    const float *slot[ACC_DEPTH];
    int top = 0;
    for (int32_t k = 0; k < job->n_parts; ++k) {
        const float *v = job->parts[k] + b;
        for (uint32_t c = (uint32_t)k + 1; !(c & 1); c >>= 1) {      /* merge complete pairs */
            --top;
            if (slot[top] == buf[top]) add_left(buf[top], v, len);
            else add_into(buf[top], slot[top], v, len);
            v = buf[top];
        }
        slot[top++] = v;
    }
    float *out = job->out + b;
    if (top == 1) {
        memcpy(out, slot[0], (size_t)len * 4);
        return;
    }
    /* make SABOTAGE=accumulate: the stack reversed, so the fold below runs from its bottom,
     * ((S_0 + S_1) + S_2) + ... (IEEE addition commutes). */
    for (int j = 0; MT_SAB_ACCUMULATE && j < top / 2; ++j) {
        const float *t = slot[j];
        slot[j] = slot[top - 1 - j];
        slot[top - 1 - j] = t;
    }
    add_into(out, slot[top - 2], slot[top - 1], len);
    for (int j = top - 3; j >= 0; --j) add_right(out, slot[j], len);
}

static void acc_range(void *ctx, int64_t b, int64_t e) {
    acc_job *job = (acc_job *)ctx;
    float buf[ACC_DEPTH][ACC_BLOCK];
    int bad = 0;
    for (int64_t i = b; i < e; i += ACC_BLOCK) {
        int64_t len = e - i < ACC_BLOCK ? e - i : ACC_BLOCK;
        acc_block(job, i, len, buf);
        bad |= mt_cpu_any_nonfinite(job->out + i, len);
    }
    if (bad) __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
}

MT_NOINLINE static int accumulate_body(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    int rc = mt_check_accumulate_args(out, parts, n_parts, n);
    if (rc || n == 0) return rc;
    acc_job job = {out, parts, n_parts, 0};
    mt_parallel_for_work(n, ACC_BLOCK, n * n_parts, acc_range, &job);
    if (!job.bad) return MT_OK;
    for (int32_t k = 0; k < n_parts; ++k)            /* error path: name the culprit */
        if (mt_cpu_any_nonfinite(parts[k], n)) return mt_fail(MT_ENONFINITE, "parts[%d] holds NaN or inf", (int)k);
    return mt_fail(MT_ENONFINITE, "the sum overflows float32 (inf) although every part is finite");
}

int mt_accumulate(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    MT_RETURN_IN_FP_ENV(accumulate_body(out, parts, n_parts, n));
}
