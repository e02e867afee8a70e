/* mt_embedding.h -- what the embedding's CPU oracle and GPU code share (contract:
 * native/contracts/embedding.md): the flags word, the sabotage switch, reading an id, the
 * leaf stack that builds the token rule's pairwise tree over the leaves holding a row's
 * terms, and the argument checks with their messages (so every vendor refuses alike).
 * Compiles as C99, CUDA and HIP; the checks are host code only.
 */
#ifndef MT_EMBEDDING_H
#define MT_EMBEDDING_H
/* mt_pinned.h brings <stdint.h> outside Metal */
#include "mt_pinned.h"

/* make SABOTAGE=embedding: fold each leaf's terms in descending position order. */
#ifdef MT_SABOTAGE_EMBEDDING
#define MT_SAB_EMBEDDING 1
#else
#define MT_SAB_EMBEDDING 0
#endif

/* The flags word (mt_embedding_backward's `accumulate`): bit 0 accumulate, bits 1-2 plan. */
#define MT_EMB_ACCUMULATE 1
#define MT_EMB_PLAN_SHIFT 1
#define MT_EMB_PLAN_AUTO 0
#define MT_EMB_PLAN_SCAN 1
#define MT_EMB_PLAN_SORT 2
#define MT_EMB_AUTO_SCAN_MAX ((int64_t)1 << 20)   /* auto: scan for one leaf of ids and vocab * n_ids <= this */

/* Positions are < 2^31, so leaves are < 2^21: at most 22 distinct meet levels, plus the
 * entry being pushed. */
#define MT_EMB_STACK 24

#if !MT_METAL   /* Metal's kernels read ids from device memory themselves */
MT_HD int64_t mt_emb_id(const void *ids, int32_t id_bytes, int64_t n) {
    return id_bytes == 4 ? (int64_t)((const int32_t *)ids)[n] : ((const int64_t *)ids)[n];
}
#endif

/* The level at which leaves a and b join in the pairwise tree: the bit length of a ^ b
 * (the parent of node k is k >> 1 at every level of mt_tree_fold). */
MT_HD int mt_emb_meet(int64_t a, int64_t b) {
    uint64_t x = (uint64_t)(a ^ b);
    int h = 0;
    while (x) {
        ++h;
        x >>= 1;
    }
    return h;
}

/* How many times the top two entries of the stack (first[k] = the first leaf of entry k,
 * `depth` entries) must be combined, s + t, before `leaf` is pushed: while the top pair
 * joins below the level at which the top joins `leaf`. */
MT_HD int mt_emb_merges(MT_THREAD const int64_t *first, int depth, int64_t leaf) {
    int m = 0;
    while (depth - m >= 2 &&
           mt_emb_meet(first[depth - m - 2], first[depth - m - 1]) < mt_emb_meet(first[depth - m - 1], leaf))
        ++m;
    return m;
}

/* The stack of k columns at once (the GPU's per-thread form): column j's entries are
 * val[j * MT_EMB_STACK + e]; first[] and depth are shared. Push leaf partials x[0..k). */
MT_HD void mt_emb_push(MT_THREAD float *val, int k, MT_THREAD int64_t *first, MT_THREAD int *depth, int64_t leaf,
                        MT_THREAD const float *x) {
    int d = *depth, m = mt_emb_merges(first, d, leaf);
    for (int j = 0; j < k; ++j) {
        MT_THREAD float *s = val + j * MT_EMB_STACK;
        for (int t = d; t > d - m; --t) s[t - 2] = s[t - 2] + s[t - 1];
        s[d - m] = x[j];
    }
    first[d - m] = leaf;
    *depth = d - m + 1;
}

/* The root of column j's stack (the top pairs combined first). */
MT_HD float mt_emb_root(MT_THREAD float *val, int j, int depth) {
    MT_THREAD float *s = val + j * MT_EMB_STACK;
    for (int t = depth; t >= 2; --t) s[t - 2] = s[t - 2] + s[t - 1];
    return s[0];
}

/* ---- host checks (shared by every vendor, so refusals read alike) ---- */
#if !MT_METAL
#include "mt_host.h"

/* Sizes and the ids pointer (contract "Refusals" step 1). */
static inline int mt_emb_check_sizes(const void *ids, int32_t id_bytes, int64_t n_ids, int64_t vocab,
                                     int64_t dim) {
    int rc;
    if (n_ids > 0 && (rc = mt_check_ptr(ids, "ids"))) return rc;
    if (id_bytes != 4 && id_bytes != 8)
        return mt_fail(MT_EINVAL, "id_bytes must be 4 (int32 ids) or 8 (int64 ids), got %d", (int)id_bytes);
    if (n_ids < 0 || n_ids > INT32_MAX)
        return mt_fail(MT_EINVAL, "n_ids must be in 0..2^31-1, got %lld", (long long)n_ids);
    if (vocab < 1 || vocab > INT32_MAX)
        return mt_fail(MT_EINVAL, "vocab must be in 1..2^31-1, got %lld", (long long)vocab);
    if (dim < 1 || dim > ((int64_t)1 << 61) / vocab || (n_ids > 0 && dim > ((int64_t)1 << 61) / n_ids))
        return mt_fail(MT_EINVAL, "dim must be >= 1 with vocab*dim and n_ids*dim below 2^61, got dim %lld",
                       (long long)dim);
    return MT_OK;
}

static inline int mt_emb_check_forward(const float *out, const float *weight, const void *ids, int32_t id_bytes,
                                       int64_t n_ids, int64_t vocab, int64_t dim, uint32_t flags) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_check_ptr(weight, "weight")) || (rc = mt_check_map_flags(flags)))
        return rc;
    return mt_emb_check_sizes(ids, id_bytes, n_ids, vocab, dim);
}

/* mt_emb_check_sizes, dweight, dy, padding_idx and the flags word; *plan gets the plan
 * (auto resolved). */
static inline int mt_emb_check_backward(int *plan, const float *dweight, const float *dy, const void *ids,
                                        int32_t id_bytes, int64_t n_ids, int64_t vocab, int64_t dim,
                                        int64_t padding_idx, int32_t flags) {
    int rc;
    if ((rc = mt_check_ptr(dweight, "dweight")) || (n_ids > 0 && (rc = mt_check_ptr(dy, "dy"))) ||
        (rc = mt_emb_check_sizes(ids, id_bytes, n_ids, vocab, dim)))
        return rc;
    if (padding_idx >= vocab)
        return mt_fail(MT_EINVAL, "padding_idx must be < vocab (%lld), got %lld (negative: none)", (long long)vocab,
                       (long long)padding_idx);
    int p = (flags >> MT_EMB_PLAN_SHIFT) & 3;
    if ((flags & ~7) || p == 3)
        return mt_fail(MT_EINVAL, "accumulate (the flags word) must be bit 0 = accumulate | plan << 1 with plan "
                       "0 auto, 1 scan, 2 sort; got %d", (int)flags);
    if (p == MT_EMB_PLAN_AUTO)
        p = n_ids <= MT_TOKEN_LEAF && vocab * n_ids <= MT_EMB_AUTO_SCAN_MAX ? MT_EMB_PLAN_SCAN : MT_EMB_PLAN_SORT;
    *plan = p;
    return MT_OK;
}

/* The first position whose id is outside [0, vocab), or -1 (serial: the error path and the
 * CPU's O(n) passes). */
static inline int64_t mt_emb_first_bad_id(const void *ids, int32_t id_bytes, int64_t n_ids, int64_t vocab) {
    for (int64_t n = 0; n < n_ids; ++n) {
        int64_t id = mt_emb_id(ids, id_bytes, n);
        if (id < 0 || id >= vocab) return n;
    }
    return -1;
}

/* The words of a refused id (position, id, vocab as long long): the waiting call's message and
 * a deferred call's (native/cuda/mt_gpu_deferred.cu). */
#define MT_EMB_BAD_ID_WORDS "ids[%lld] = %lld is outside [0, %lld) (vocab)"

/* The refusal of the id at position n. fresh: the forward's output was declared fresh
 * (MT_MAP_OUT_FRESH), so every vendor says it is undefined (a GPU may have gathered the other
 * rows into it); else nothing was written. */
static inline int mt_emb_bad_id(const void *ids, int32_t id_bytes, int64_t n, int64_t vocab, int fresh) {
    return mt_fail(MT_EINVAL, MT_EMB_BAD_ID_WORDS "; %s", (long long)n, (long long)mt_emb_id(ids, id_bytes, n),
                   (long long)vocab,
                   fresh ? "out's contents are undefined (declared fresh); no input was written" : "nothing was written");
}

/* The first NaN/inf of x (n floats), or -1. */
static inline int64_t mt_emb_first_nonfinite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (!mt_is_finite(x[i])) return i;
    return -1;
}

static inline int mt_emb_nonfinite(const char *name, int64_t flat, int64_t dim) {
    return mt_fail(MT_ENONFINITE, "%s[%lld, %lld] is NaN or inf; nothing was written", name,
                   (long long)(flat / dim), (long long)(flat % dim));
}
#endif /* !MT_METAL */
#endif
