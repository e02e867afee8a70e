/* mt_cpu_embedding.c -- the embedding on the CPU oracle (contract: native/contracts/embedding.md).
 *
 * Forward: check every id, then copy rows (memcpy: every bit kept), split over the pool.
 * Backward: checks, then (sort plan) a stable counting sort of the positions by id, so each
 * row's terms lie in ascending order; rows without terms are zeroed (or left, accumulating);
 * then units of (a range of rows holding ~1/64 of the terms) x (a block of MT_EMB_COLS
 * columns) run on the pool: each row's leaves are folded serially and pushed on the leaf
 * stack of mt_embedding.h. The scan plan walks all positions for every row instead (no
 * scratch). Who computes which row never changes a bit.
 */
#include <string.h>
#include "mt_cpu.h"
#include "mt_embedding.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"

#define MT_EMB_COLS 64    /* columns per unit: a row block of the stack stays in L1 */
#define MT_EMB_PARTS 64   /* row ranges of the sort plan, balanced by their number of terms */
#define MT_EMB_CHECKS 256 /* chunks of the finiteness pre-pass */

uint64_t mt_embedding_features(void) { return MT_FEATURE_EMBEDDING; }

/* ---- the finiteness pre-pass: the first NaN/inf of x (rows of dim), chunked over the pool ---- */
typedef struct {
    const float *x;
    int64_t n, chunk;
    int64_t bad[MT_EMB_CHECKS];
} finite_job;

static void finite_range(void *ctx, int64_t b, int64_t e) {
    finite_job *job = (finite_job *)ctx;
    for (int64_t c = b; c < e; ++c) {
        int64_t lo = c * job->chunk, hi = lo + job->chunk < job->n ? lo + job->chunk : job->n;
        int64_t i = lo < hi ? mt_emb_first_nonfinite(job->x + lo, hi - lo) : -1;
        job->bad[c] = i < 0 ? -1 : lo + i;
    }
}

static int64_t first_nonfinite(const float *x, int64_t n) {
    finite_job job;
    job.x = x;
    job.n = n;
    job.chunk = (n + MT_EMB_CHECKS - 1) / MT_EMB_CHECKS;
    if (job.chunk < 1) job.chunk = 1;
    int64_t chunks = (n + job.chunk - 1) / job.chunk;
    mt_parallel_for_work(chunks, 1, n, finite_range, &job);
    for (int64_t c = 0; c < chunks; ++c)
        if (job.bad[c] >= 0) return job.bad[c];
    return -1;
}

/* ---- forward ---- */
typedef struct {
    float *out;
    const float *weight;
    const void *ids;
    int32_t id_bytes;
    int64_t dim;
} gather_job;

static void gather_range(void *ctx, int64_t b, int64_t e) {
    gather_job *job = (gather_job *)ctx;
    size_t row = (size_t)job->dim * sizeof(float);
    for (int64_t n = b; n < e; ++n)
        memcpy(job->out + n * job->dim, job->weight + mt_emb_id(job->ids, job->id_bytes, n) * job->dim, row);
}

int mt_embedding_forward(float *out, const float *weight, const void *ids, int32_t id_bytes, int64_t n_ids,
                         int64_t vocab, int64_t dim, uint32_t flags) {
    /* The ids are checked before any row is copied; MT_MAP_OUT_FRESH changes only a refusal's
     * words (out undefined, as a GPU that checks inside its gather says: one message everywhere) */
    int rc = mt_emb_check_forward(out, weight, ids, id_bytes, n_ids, vocab, dim, flags);
    if (rc) return rc;
    int64_t bad = mt_emb_first_bad_id(ids, id_bytes, n_ids, vocab);
    if (bad >= 0) return mt_emb_bad_id(ids, id_bytes, bad, vocab, (flags & MT_MAP_OUT_FRESH) != 0);
    gather_job job = {out, weight, ids, id_bytes, dim};
    mt_parallel_for_work(n_ids, 1, n_ids * dim, gather_range, &job);
    return MT_OK;
}

/* ---- backward: one row's columns [c0, c0 + w) ---- */
typedef struct {
    float *dweight;
    const float *dy;
    const void *ids;
    int32_t id_bytes, accumulate;
    int64_t n_ids, vocab, dim, pad;
    const int64_t *row;   /* sort plan: row v's terms are perm[row[v] .. row[v+1]) */
    const int32_t *perm;
    int64_t cut[MT_EMB_PARTS + 1];   /* sort plan: part p holds rows cut[p] .. cut[p+1]-1 */
    int64_t blocks;                  /* column blocks of MT_EMB_COLS */
} bwd_job;

/* The leaf stack over rows of w floats (values in val[k][0..w)). */
typedef struct {
    float val[MT_EMB_STACK][MT_EMB_COLS];
    int64_t first[MT_EMB_STACK];
    int depth;
} row_stack;

static inline void add_into(float *restrict acc, const float *restrict x, int64_t w) {
    for (int64_t j = 0; j < w; ++j) acc[j] = acc[j] + x[j];
}

/* Make room for `leaf`: combine what the stack rule says, then hand out the leaf's partial,
 * +0.0 in every column, as the new top entry. */
static float *stack_open(row_stack *s, int64_t leaf, int64_t w) {
    for (int m = mt_emb_merges(s->first, s->depth, leaf); m > 0; --m, --s->depth)
        add_into(s->val[s->depth - 2], s->val[s->depth - 1], w);
    s->first[s->depth] = leaf;
    float *acc = s->val[s->depth++];
    for (int64_t j = 0; j < w; ++j) acc[j] = 0.0f;
    return acc;
}

/* Finish the stack and store its root into dst (w floats): dst = root, or dst + root. */
static void stack_store(row_stack *s, float *restrict dst, int64_t w, int accumulate) {
    for (; s->depth >= 2; --s->depth) add_into(s->val[s->depth - 2], s->val[s->depth - 1], w);
    if (accumulate) add_into(dst, s->val[0], w);
    else memcpy(dst, s->val[0], (size_t)w * sizeof(float));
}

/* Sort plan: row v's terms perm[k0..k1) (ascending positions), leaf by leaf. */
static void fold_sorted(const bwd_job *job, row_stack *s, int64_t k0, int64_t k1, const float *dy, int64_t w) {
    for (int64_t k = k0; k < k1;) {
        int64_t leaf = job->perm[k] / MT_TOKEN_LEAF, e = k + 1;
        while (e < k1 && job->perm[e] / MT_TOKEN_LEAF == leaf) ++e;
        float *acc = stack_open(s, leaf, w);
        for (int64_t q = 0; q < e - k; ++q)
            add_into(acc, dy + (int64_t)job->perm[MT_SAB_EMBEDDING ? e - 1 - q : k + q] * job->dim, w);
        k = e;
    }
}

/* Scan plan: every position of every leaf is looked at; returns whether v had a term. */
static int fold_scan(const bwd_job *job, row_stack *s, int64_t v, const float *dy, int64_t w) {
    int64_t leaves = mt_token_leaves(job->n_ids);
    for (int64_t leaf = 0; leaf < leaves; ++leaf) {
        int64_t lo = leaf * MT_TOKEN_LEAF, hi = lo + MT_TOKEN_LEAF < job->n_ids ? lo + MT_TOKEN_LEAF : job->n_ids;
        float *acc = 0;
        for (int64_t q = 0; q < hi - lo; ++q) {
            int64_t n = MT_SAB_EMBEDDING ? hi - 1 - q : lo + q;
            if (mt_emb_id(job->ids, job->id_bytes, n) != v) continue;
            if (!acc) acc = stack_open(s, leaf, w);
            add_into(acc, dy + n * job->dim, w);
        }
    }
    return s->depth > 0;
}

static void zero_row(float *dst, int64_t w) { memset(dst, 0, (size_t)w * sizeof(float)); }

/* Unit u of a plan: item u / blocks (a part or a row) and its column block [*c0, *c0 + w). */
static int64_t unit_of(const bwd_job *job, int64_t u, int64_t *c0, int64_t *w) {
    *c0 = (u % job->blocks) * MT_EMB_COLS;
    *w = job->dim - *c0 < MT_EMB_COLS ? job->dim - *c0 : MT_EMB_COLS;
    return u / job->blocks;
}

/* The sort plan's units: a part (rows cut[p] .. cut[p+1]-1) x a column block. */
MT_SIMD static void sorted_units(void *ctx, int64_t b, int64_t e) {
    const bwd_job *job = (const bwd_job *)ctx;
    row_stack s;
    for (int64_t u = b; u < e; ++u) {
        int64_t c0, w, p = unit_of(job, u, &c0, &w);
        for (int64_t v = job->cut[p]; v < job->cut[p + 1]; ++v) {
            if (job->row[v] == job->row[v + 1]) continue;
            s.depth = 0;
            fold_sorted(job, &s, job->row[v], job->row[v + 1], job->dy + c0, w);
            stack_store(&s, job->dweight + v * job->dim + c0, w, job->accumulate);
        }
    }
}

/* Rows without terms (and the padding row), when overwriting: +0.0. */
static void zero_rows(void *ctx, int64_t b, int64_t e) {
    const bwd_job *job = (const bwd_job *)ctx;
    for (int64_t v = b; v < e; ++v)
        if (job->row[v] == job->row[v + 1]) zero_row(job->dweight + v * job->dim, job->dim);
}

/* The scan plan's units: a row x a column block. */
MT_SIMD static void scan_units(void *ctx, int64_t b, int64_t e) {
    const bwd_job *job = (const bwd_job *)ctx;
    row_stack s;
    for (int64_t u = b; u < e; ++u) {
        int64_t c0, w, v = unit_of(job, u, &c0, &w);
        float *dst = job->dweight + v * job->dim + c0;
        s.depth = 0;
        if (v != job->pad && fold_scan(job, &s, v, job->dy + c0, w)) stack_store(&s, dst, w, job->accumulate);
        else if (!job->accumulate) zero_row(dst, w);
    }
}

/* The stable counting sort: row[v] .. row[v+1] index perm, ascending positions within a row;
 * padding positions are left out. row has vocab + 1 entries. */
static void counting_sort(bwd_job *job, int64_t *row, int32_t *perm) {
    memset(row, 0, (size_t)(job->vocab + 1) * sizeof(int64_t));
    for (int64_t n = 0; n < job->n_ids; ++n) {
        int64_t id = mt_emb_id(job->ids, job->id_bytes, n);
        if (id != job->pad) row[id]++;
    }
    int64_t total = 0;
    for (int64_t v = 0; v < job->vocab; ++v) row[v] = total += row[v];   /* row[v] = end of v */
    row[job->vocab] = total;
    for (int64_t n = job->n_ids - 1; n >= 0; --n) {
        int64_t id = mt_emb_id(job->ids, job->id_bytes, n);
        if (id != job->pad) perm[--row[id]] = (int32_t)n;                  /* now row[v] = start */
    }
    for (int p = 0; p <= MT_EMB_PARTS; ++p) {     /* part p: rows whose terms start from p/PARTS */
        int64_t target = total * p / MT_EMB_PARTS, lo = 0, hi = job->vocab;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (row[mid] < target) lo = mid + 1; else hi = mid;
        }
        job->cut[p] = p == MT_EMB_PARTS ? job->vocab : lo;
    }
    job->row = row;
    job->perm = perm;
}

static int run_sorted(bwd_job *job) {
    int64_t rbytes = (job->vocab + 1) * (int64_t)sizeof(int64_t), pbytes = job->n_ids * (int64_t)sizeof(int32_t);
    int64_t *row = (int64_t *)mt_scratch_alloc(rbytes, "the embedding's row index");
    int32_t *perm = row ? (int32_t *)mt_scratch_alloc(pbytes, "the embedding's sorted positions") : 0;
    if (!row || (pbytes && !perm)) {
        mt_scratch_free(row, rbytes);
        return MT_ENOMEM;
    }
    counting_sort(job, row, perm);
    if (!job->accumulate) mt_parallel_for_work(job->vocab, 64, job->vocab * job->dim, zero_rows, job);
    mt_parallel_for_work(MT_EMB_PARTS * job->blocks, 1, job->n_ids * job->dim, sorted_units, job);
    mt_scratch_free(perm, pbytes);
    mt_scratch_free(row, rbytes);
    return MT_OK;
}

MT_NOINLINE static int backward_body(float *dweight, const float *dy, const void *ids, int32_t id_bytes,
                                     int64_t n_ids, int64_t vocab, int64_t dim, int64_t padding_idx,
                                     int32_t flags) {
    int rc, plan = MT_EMB_PLAN_SORT;
    if ((rc = mt_emb_check_backward(&plan, dweight, dy, ids, id_bytes, n_ids, vocab, dim, padding_idx, flags)))
        return rc;
    int64_t bad = mt_emb_first_bad_id(ids, id_bytes, n_ids, vocab);
    if (bad >= 0) return mt_emb_bad_id(ids, id_bytes, bad, vocab, 0);
    if ((bad = first_nonfinite(dy, n_ids * dim)) >= 0) return mt_emb_nonfinite("dy", bad, dim);
    int accumulate = flags & MT_EMB_ACCUMULATE;
    if (accumulate && (bad = first_nonfinite(dweight, vocab * dim)) >= 0)
        return mt_emb_nonfinite("dweight (the gradient accumulated into)", bad, dim);
    bwd_job job;
    memset(&job, 0, sizeof job);
    job.dweight = dweight;
    job.dy = dy;
    job.ids = ids;
    job.id_bytes = id_bytes;
    job.accumulate = accumulate;
    job.n_ids = n_ids;
    job.vocab = vocab;
    job.dim = dim;
    job.pad = padding_idx < 0 ? -1 : padding_idx;
    job.blocks = (dim + MT_EMB_COLS - 1) / MT_EMB_COLS;
    if (plan == MT_EMB_PLAN_SORT) return run_sorted(&job);
    mt_parallel_for_work(vocab * job.blocks, 1, vocab * dim, scan_units, &job);
    return MT_OK;
}

int mt_embedding_backward(float *dweight, const float *dy, const void *ids, int32_t id_bytes, int64_t n_ids,
                          int64_t vocab, int64_t dim, int64_t padding_idx, int32_t accumulate) {
    MT_RETURN_IN_FP_ENV(backward_body(dweight, dy, ids, id_bytes, n_ids, vocab, dim, padding_idx, accumulate));
}
