/* mt_cpu_tensors.c -- what the CPU oracle's ops share over tensor lists (see mt_cpu.h): flat
 * ranges as per-tensor segments, the finiteness pre-pass, and the norms of the pinned tree that
 * clip_grad_norm_ (mt_cpu_clip.c) and the steps that clip (mt_cpu_optim.c) both use. */
#include "mt_cpu.h"
#include "mt_pool.h"
#include "mt_pinned.h"
#include "mojo_train.h"
#include "mt_host.h"
#include <stdlib.h>

static int32_t tensor_of(const int32_t *offsets, int32_t n_tensors, int64_t i) {
    int32_t lo = 0, hi = n_tensors - 1;           /* last j with offsets[j] <= i */
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (offsets[mid] <= i) lo = mid; else hi = mid - 1;
    }
    return lo;
}

void mt_for_segments(const int32_t *offsets, int32_t n_tensors, int64_t b, int64_t e,
                     mt_segment_fn fn, void *ctx) {
    for (int32_t j = tensor_of(offsets, n_tensors, b); j < n_tensors && b < e; ++j) {
        int64_t end = offsets[j + 1] < e ? offsets[j + 1] : e;
        if (end > b) fn(ctx, j, b, b - offsets[j], end - b);
        b = end;
    }
}

typedef struct { const int32_t *offsets; int32_t n; mt_segment_fn fn; void *ctx; } seg_job;

static void seg_range(void *p, int64_t b, int64_t e) {
    seg_job *job = (seg_job *)p;
    mt_for_segments(job->offsets, job->n, b, e, job->fn, job->ctx);
}

void mt_parallel_segments(const int32_t *offsets, int32_t n_tensors, mt_segment_fn fn, void *ctx) {
    seg_job job = {offsets, n_tensors, fn, ctx};
    mt_parallel_for(offsets[n_tensors], 1024, seg_range, &job);
}

/* ---- finiteness ---- */
/* The largest exponent field seen: all ones means a NaN or an infinity. */
MT_SIMD int mt_cpu_any_nonfinite(const float *x, int64_t n) {
    const uint32_t *u = (const uint32_t *)x;
    uint32_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t e = u[i] & 0x7f800000u;
        top = e > top ? e : top;
    }
    return top == 0x7f800000u;
}

/* The same over two arrays read side by side (one pass, two streams). */
MT_SIMD static int any_nonfinite2(const float *x, const float *y, int64_t n) {
    const uint32_t *u = (const uint32_t *)x, *w = (const uint32_t *)y;
    uint32_t top = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint32_t e = u[i] & 0x7f800000u, f = w[i] & 0x7f800000u;
        e = e > f ? e : f;
        top = e > top ? e : top;
    }
    return top == 0x7f800000u;
}

typedef struct {
    const float *a, *b;
    void (*fn)(void *, int64_t, int64_t);
    void *ctx;
    int bad;
} checked_job;

enum { CHECKED_BLOCK = 4096 };           /* floats an input block holds: 16 KB, in L1 when mapped */

static void checked_range(void *p, int64_t lo, int64_t hi) {
    checked_job *job = (checked_job *)p;
    for (int64_t b = lo; b < hi; b += CHECKED_BLOCK) {
        int64_t e = hi - b < CHECKED_BLOCK ? hi : b + CHECKED_BLOCK;
        if (mt_cpu_any_nonfinite(job->a + b, e - b) || (job->b && mt_cpu_any_nonfinite(job->b + b, e - b))) {
            __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
            return;                      /* the output is undefined after a refusal */
        }
        job->fn(job->ctx, b, e);
    }
}

int mt_cpu_parallel_checked(int64_t n, int64_t grain, const float *a, const float *b,
                            void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx) {
    checked_job job = {a, b == a ? 0 : b, fn, ctx, 0};
    if (n > 0) mt_parallel_for(n, grain, checked_range, &job);
    return job.bad;
}

typedef struct { float *const *a, *const *b; int bad; } finite_job;

static void finite_segment(void *p, int32_t j, int64_t flat, int64_t local, int64_t count) {
    finite_job *job = (finite_job *)p;
    (void)flat;
    int bad = job->b ? any_nonfinite2(job->a[j] + local, job->b[j] + local, count)
                     : mt_cpu_any_nonfinite(job->a[j] + local, count);
    if (bad) __atomic_store_n(&job->bad, 1, __ATOMIC_RELAXED);
}

static int32_t first_bad(float *const *table, const int32_t *offsets, int32_t n_tensors) {
    for (int32_t j = 0; j < n_tensors; ++j)            /* error path: find which tensor */
        if (mt_cpu_any_nonfinite(table[j], offsets[j + 1] - offsets[j])) return j;
    return -1;
}

int mt_nonfinite_pair(int32_t *bad_a, int32_t *bad_b, float *const *a, float *const *b, const int32_t *offsets,
                      int32_t n_tensors) {
    finite_job job = {a, b, 0};
    mt_parallel_segments(offsets, n_tensors, finite_segment, &job);
    *bad_a = job.bad ? first_bad(a, offsets, n_tensors) : -1;
    *bad_b = job.bad && b ? first_bad(b, offsets, n_tensors) : -1;
    return job.bad;
}

int32_t mt_first_nonfinite(float *const *table, const int32_t *offsets, int32_t n_tensors) {
    int32_t bad, unused;
    mt_nonfinite_pair(&bad, &unused, table, 0, offsets, n_tensors);
    return bad;
}

/* ---- norms by the pinned tree ---- */
typedef struct {
    float *const *table; const int32_t *offsets; const int64_t *chunk_start; int32_t n; float *partials; int kind;
} norm_job;

MT_SIMD static float chunk_sumsq(const float *x, int64_t n) { return mt_chunk_sumsq(x, n); }
MT_SIMD static float chunk_sumabs(const float *x, int64_t n) { return mt_chunk_sumabs(n, x); }
MT_SIMD static float maxabs(const float *x, int64_t n) { return mt_maxabs(x, n); }

/* One chunk's partial of clip.md for the norm `kind` (MT_NORM_KIND_*). */
static float chunk_partial(int kind, const float *x, int64_t n) {
    return kind == MT_NORM_KIND_L2 ? chunk_sumsq(x, n) : kind == MT_NORM_KIND_L1 ? chunk_sumabs(x, n) : maxabs(x, n);
}

/* The norm of a vector from its m chunk partials s (consumed): the pairwise tree (and sqrt for
 * the 2-norm), or the max. */
static float finish_norm(int kind, float *s, int64_t m) {
    if (kind == MT_NORM_KIND_INF) return maxabs(s, m);
    float sum = mt_tree_fold(s, m);
    return kind == MT_NORM_KIND_L2 ? sqrtf(sum) : sum;
}

static void norm_range(void *p, int64_t b, int64_t e) {
    norm_job *job = (norm_job *)p;
    int32_t j = 0;
    while (job->chunk_start[j + 1] <= b) ++j;
    for (int64_t k = b; k < e; ++k) {
        while (job->chunk_start[j + 1] <= k) ++j;
        int64_t c = k - job->chunk_start[j];
        int64_t len = job->offsets[j + 1] - job->offsets[j] - c * MT_CHUNK;
        job->partials[k] = chunk_partial(job->kind, job->table[j] + c * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK);
    }
}

int mt_cpu_norms(float *norms, float *total, float *const *table, const int32_t *offsets,
                 int32_t n_tensors) {
    return mt_cpu_norms_of(MT_NORM_KIND_L2, norms, total, table, offsets, n_tensors);
}

int mt_cpu_norms_of(int kind, float *norms, float *total, float *const *table, const int32_t *offsets,
                    int32_t n_tensors) {
    int64_t *chunk_start = (int64_t *)malloc(sizeof(int64_t) * (size_t)(n_tensors + 1));
    float *own = (float *)malloc(sizeof(float) * (size_t)n_tensors * 2);
    int64_t chunks = 0;
    if (!chunk_start || !own) { free(chunk_start); free(own); return MT_ENOMEM; }
    for (int32_t j = 0; j < n_tensors; ++j) {
        chunk_start[j] = chunks;
        chunks += mt_chunk_count(offsets[j + 1] - offsets[j]);
    }
    chunk_start[n_tensors] = chunks;
    float *partials = (float *)malloc(sizeof(float) * (size_t)(chunks ? chunks : 1));   /* empty tensors only: 0 */
    if (!partials) { free(chunk_start); free(own); return MT_ENOMEM; }
    norm_job job = {table, offsets, chunk_start, n_tensors, partials, kind};
    mt_parallel_for_work(chunks, 1, chunks * MT_CHUNK, norm_range, &job);   /* inline only when small */
    for (int32_t j = 0; j < n_tensors; ++j)
        own[j] = finish_norm(kind, partials + chunk_start[j], chunk_start[j + 1] - chunk_start[j]);
    for (int64_t c = 0; c < mt_chunk_count(n_tensors); ++c) {   /* the norms are one more vector */
        int64_t len = n_tensors - c * MT_CHUNK;
        own[n_tensors + c] = chunk_partial(kind, own + c * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK);
    }
    *total = mt_canonical_nan(finish_norm(kind, own + n_tensors, mt_chunk_count(n_tensors)));
    if (norms) for (int32_t j = 0; j < n_tensors; ++j) norms[j] = mt_canonical_nan(own[j]);
    free(partials); free(chunk_start); free(own);
    return MT_OK;
}

/* The total norm, or the refusal of a non-finite one (naming the first bad gradient). */
int mt_cpu_clip_total(float *total, float *const *grads, const int32_t *offsets, int32_t n_tensors) {
    return mt_cpu_clip_total_of(MT_NORM_KIND_L2, total, grads, offsets, n_tensors);
}

int mt_cpu_clip_total_of(int kind, float *total, float *const *grads, const int32_t *offsets, int32_t n_tensors) {
    if (mt_cpu_norms_of(kind, 0, total, grads, offsets, n_tensors))
        return mt_fail(MT_ENOMEM, "out of memory for norm partials");
    if (mt_is_finite(*total)) return MT_OK;
    int32_t j = mt_first_nonfinite(grads, offsets, n_tensors);
    if (j >= 0) return mt_fail(MT_ENONFINITE, "grads[%d] holds NaN or inf; nothing was written", (int)j);
    return mt_fail(MT_ENONFINITE, "the total gradient norm overflows float32 (inf); nothing was written");
}

float mt_clip_coefficient(float max_norm, float total) { return mt_clip_applied(max_norm, total); }
