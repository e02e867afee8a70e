/* mt_cpu.h -- helpers the CPU oracle's ops share: walking a tensor list by flat ranges,
 * the finiteness pre-pass, and the per-tensor norms of the pinned tree. */
#ifndef MT_CPU_H
#define MT_CPU_H
#include <stdint.h>

/* Runtime dispatch: hot loops get an x86-64-v3 (AVX2 + FMA) clone beside the default one.
 * Vector code keeps the bits: each element's arithmetic is the same sequence of IEEE
 * operations, whichever width computes it. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MT_NO_CLONES)
#define MT_SIMD __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MT_SIMD
#endif
/* On an MT_SIMD wrapper of a pinned routine gcc will not inline on its own (a chunk fold):
 * inline everything it calls, so that each clone compiles the routine for its own ISA
 * (vectorized lane loops, fmaf as an instruction rather than a libm call). */
#if defined(__GNUC__) && !defined(__clang__)
#define MT_FLAT __attribute__((flatten))
#else
#define MT_FLAT
#endif

/* The chunk tree of one row (clip.md), streamed: chunk partials, pushed in order, meet in
 * mt_tree_fold's pairwise tree, built with a stack of complete subtrees (equal-sized
 * neighbours merge as they appear). RMSNorm's and LayerNorm's row folds. */
typedef struct { float s[64]; int64_t size[64]; int depth; } mt_row_tree;

static inline void mt_row_tree_push(mt_row_tree *t, float v) {
    int64_t size = 1;
    while (t->depth > 0 && t->size[t->depth - 1] == size) {
        v = t->s[--t->depth] + v;
        size *= 2;
    }
    t->s[t->depth] = v;
    t->size[t->depth++] = size;
}

static inline float mt_row_tree_root(const mt_row_tree *t) {
    float v = t->s[t->depth - 1];
    for (int d = t->depth - 2; d >= 0; --d) v = t->s[d] + v;
    return v;
}

/* RMSNorm's refusals, which LayerNorm's begin with (mt_cpu_rms_norm.c): the argument checks,
 * then NaN or inf in x and weight (forward) or in dy, x and weight (backward), in that order,
 * named; MT_OK when nothing is refused. */
int mt_cpu_rms_norm_forward_refusals(const float *y, const float *x, const float *weight, float eps, int64_t rows,
                                     int64_t dim);
int mt_cpu_rms_norm_backward_refusals(const float *dweight, const float *dy, const float *x, const float *weight,
                                      float eps, int64_t rows, int64_t dim);

/* fn(ctx, j, flat, local, count): tensor j, its elements local..local+count-1, which are
 * flat elements flat..flat+count-1 of the registry. */
typedef void (*mt_segment_fn)(void *ctx, int32_t j, int64_t flat, int64_t local, int64_t count);

/* Visit the flat range [b, e) of a registry as per-tensor segments, in ascending order. */
void mt_for_segments(const int32_t *offsets, int32_t n_tensors, int64_t b, int64_t e,
                     mt_segment_fn fn, void *ctx);

/* Visit the whole registry, split over the thread pool. */
void mt_parallel_segments(const int32_t *offsets, int32_t n_tensors, mt_segment_fn fn, void *ctx);

/* One pass over two registries (b may be NULL): the first tensor of each holding a NaN or
 * inf, or -1; returns nonzero when either holds one. */
int mt_nonfinite_pair(int32_t *bad_a, int32_t *bad_b, float *const *a, float *const *b, const int32_t *offsets,
                      int32_t n_tensors);

/* Whether x[0..n) holds a NaN or an infinity (one thread; the largest exponent field). */
int mt_cpu_any_nonfinite(const float *x, int64_t n);
/* fn(ctx, begin, end) over [0, n) in parallel (mt_parallel_for, grain `grain`) with the
 * finiteness check of a[0..n) and b[0..n) (b NULL or a: one input) fused in, block by block:
 * each block of the inputs is checked, then mapped while it is in cache. Returns 1 when a NaN
 * or inf was found (the output is then partly written), else 0. */
int mt_cpu_parallel_checked(int64_t n, int64_t grain, const float *a, const float *b,
                            void (*fn)(void *ctx, int64_t begin, int64_t end), void *ctx);

/* Index of the first tensor holding a NaN or inf, or -1. */
int32_t mt_first_nonfinite(float *const *table, const int32_t *offsets, int32_t n_tensors);

/* Per-tensor L2 norms by the pinned tree, and the norm of those norms (same tree).
 * Returns MT_OK or MT_ENOMEM. norms may be NULL. */
int mt_cpu_norms(float *norms, float *total, float *const *table, const int32_t *offsets,
                 int32_t n_tensors);
/* The same for the norm `kind` (MT_NORM_KIND_* of mt_host.h: 2, 1 or inf, clip.md); a tensor
 * may be empty (norm 0, never read); a NaN norm or total is written as 0x7fc00000. */
int mt_cpu_norms_of(int kind, float *norms, float *total, float *const *table, const int32_t *offsets,
                    int32_t n_tensors);

/* The total norm of grads (mt_cpu_norms) into *total; a non-finite total is refused
 * (MT_ENONFINITE, naming the first tensor holding NaN or inf, else the overflow). */
int mt_cpu_clip_total(float *total, float *const *grads, const int32_t *offsets, int32_t n_tensors);
int mt_cpu_clip_total_of(int kind, float *total, float *const *grads, const int32_t *offsets, int32_t n_tensors);

/* The clip coefficient of the contract: max_norm / (total + 1e-6), clamped to 1 (NaN stays NaN,
 * written as 0x7fc00000). */
float mt_clip_coefficient(float max_norm, float total);
#endif
