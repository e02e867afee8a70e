/* mt_host.h -- host-side glue every vendor shares: the thread-local error message, argument
 * checks that run before any work (so a refused call writes nothing), and the identity of the
 * build. Vendors compile mt_host.c into their library beside their own kernels. */
#ifndef MT_HOST_H
#define MT_HOST_H
#include <stdint.h>
#include "mojo_train.h"

#ifndef MT_VENDOR_NAME
#define MT_VENDOR_NAME "cpu"
#endif

#ifdef __cplusplus
extern "C" {
#endif

int mt_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
void mt_clear_error(void);

/* Checks: return MT_OK or the code mt_fail returned. `name` is the argument's name. */
int mt_check_registry(float *const *table, const int32_t *offsets, int32_t n_tensors,
                      const char *name);
/* The same, but a tensor may be empty (offsets[j+1] == offsets[j]; its pointer may then be
 * NULL): the clip's lists (clip.md, "0-element tensors"). */
int mt_check_registry_empty_ok(float *const *table, const int32_t *offsets, int32_t n_tensors,
                               const char *name);
/* The norms of clip.md: torch's norm_type 2, 1 or inf as a kind, else a refusal. */
enum { MT_NORM_KIND_L2 = 0, MT_NORM_KIND_L1 = 1, MT_NORM_KIND_INF = 2 };
int mt_check_norm_type(float norm_type, int *kind);
int mt_check_ptr(const void *p, const char *name);
/* A count (rows, n): v >= 0. A tensor of `elems` elements: a pointer when it holds any. */
int mt_check_count(int64_t v, const char *name);
int mt_check_tensor(const void *p, int64_t elems, const char *name);
/* The sizes of linear (m, n, k >= 0; a, weight and out at most 2^60 elements each, so that
 * every byte count fits in int64), in the oracle's order, for every vendor. */
int mt_check_linear_sizes(int64_t m, int64_t n, int64_t k);
/* RMSNorm's (and LayerNorm's) arguments, in the oracle's order, for every vendor: dim >= 1,
 * rows >= 0, x at most 2^60 elements, eps finite and >= 0, then the pointers of the tensors
 * that hold elements (and, backward, no dweight without a weight). */
int mt_check_rms_norm_forward_args(const float *y, const float *x, float eps, int64_t rows, int64_t dim);
int mt_check_rms_norm_backward_args(const float *dweight, const float *dy, const float *x, const float *weight,
                                    float eps, int64_t rows, int64_t dim);
/* A map's flags (mojo_train.h, enum mt_map_flags): only MT_MAP_OUT_FRESH may be set. */
int mt_check_map_flags(uint32_t flags);
/* A map's pointers, n and aliasing (names: out, a, b): out may be a or b itself, never part of
 * one; b == a is one input. */
int mt_check_map_args(const float *out, const float *a, const float *b, int64_t n, const char *const names[3]);
/* A stream span: offset + n <= 2^64 - 1, n >= 0. */
int mt_check_span(uint64_t offset, int64_t n);
/* Dropout's: pointers, the span, p in [0, 1), aliasing (y may be x itself), flags. */
int mt_check_dropout_args(const float *y, const float *x, float p, uint64_t offset, int64_t n, uint32_t flags,
                          const char *yname, const char *xname);
/* Whether [a, a + a_bytes) and [b, b + b_bytes) share a byte (NULL or empty: no). */
int mt_bytes_overlap(const void *a, int64_t a_bytes, const void *b, int64_t b_bytes);
/* One tensor of a call: its name, address, bytes, and whether the call writes it. */
typedef struct {
    const char *name;
    const void *p;
    int64_t bytes;
    int out;
} mt_named_buf;
/* MT_EINVAL naming the first pair in which an output shares a byte with another buffer of the
 * call (an input, or another output): "X and Y overlap; X must be a buffer of its own". */
int mt_check_outputs_apart(const mt_named_buf *bufs, int n);
/* linear_backward's outputs (da m x k, dweight n x k, dbias n; each may be NULL): none may
 * overlap another (each may lie over an input: linear.md). */
int mt_check_linear_outputs(const float *da, const float *dweight, const float *dbias, int64_t m, int64_t n,
                            int64_t k);
/* out and in, n floats each (host or device addresses): MT_OK when they are disjoint, or the
 * very same buffer (out == in) and in_place_ok; any other overlap is MT_EINVAL naming both. */
int mt_check_alias(const float *out, const float *in, int64_t n, int in_place_ok, const char *out_name,
                   const char *in_name);
int mt_check_finite_scalar(float x, const char *name);
int mt_check_nonneg(float x, const char *name);
int mt_check_beta(float beta, const char *name);
int mt_check_adam_args(float lr, float beta1, float beta2, float eps, float weight_decay,
                       int32_t clip, float max_norm, int64_t step);
int mt_check_sgd_args(float lr, float momentum, float dampening, float weight_decay,
                      int32_t nesterov, int32_t clip, float max_norm);

/* mt_uniform_fill's arguments; on success *low32 and *high32 are low and high rounded to
 * float32 under IEEE defaults, and *width = high32 - low32 (rounded once). */
int mt_check_uniform_args(float *width, float *low32, const float *out, uint64_t offset, double low, double high,
                          int64_t n);

/* The floating-point environment every op runs in: round to nearest, no flush-to-zero or
 * denormals-are-zero, whatever the calling process set (torch.set_flush_denormal, code built
 * with -ffast-math). mt_fp_begin saves the caller's and sets ours; mt_fp_end restores. */
typedef struct { unsigned saved; } mt_fp_env;
/* Work done between mt_fp_begin and mt_fp_end must sit in a function that is not inlined:
 * compilers do not order arithmetic against control-register writes on their own. */
#if defined(__GNUC__)
#define MT_NOINLINE __attribute__((noinline))
#else
#define MT_NOINLINE
#endif
void mt_fp_begin(mt_fp_env *env);
void mt_fp_end(const mt_fp_env *env);
/* `return CALL;` with CALL (an int-returning call of an MT_NOINLINE body) run in our
 * environment: the one wrapper of the entry points whose whole body needs it. */
#define MT_RETURN_IN_FP_ENV(CALL)                                                               \
    do {                                                                                        \
        mt_fp_env env_;                                                                         \
        mt_fp_begin(&env_);                                                                     \
        int rc_ = (CALL);                                                                       \
        mt_fp_end(&env_);                                                                       \
        return rc_;                                                                             \
    } while (0)
unsigned mt_fp_current(void);
void mt_fp_set(unsigned control);

/* Host scalars of a step, computed out of line (see MT_NOINLINE); callers bracket them with
 * mt_fp_begin / mt_fp_end. */
float mt_host_one_minus_pow(float base, int64_t exponent);
float mt_host_round(double x);
float mt_host_dropout_scale(float p);   /* 1 / (1 - p), mt_pinned.h's mt_dropout_scale */

/* The vendor's feature bits beyond the numeric mode's (defined by each vendor), and those of each op
 * family, defined beside the family's code (0 until it is built on that vendor). */
uint64_t mt_vendor_features(void);
uint64_t mt_optim_features(void);
uint64_t mt_clip_features(void);
uint64_t mt_loss_features(void);
uint64_t mt_linear_features(void);
uint64_t mt_rms_norm_features(void);
uint64_t mt_layer_norm_features(void);
uint64_t mt_attention_features(void);
uint64_t mt_lm_head_features(void);
uint64_t mt_embedding_features(void);
uint64_t mt_random_features(void);
uint64_t mt_accumulate_features(void);
uint64_t mt_elementwise_features(void);
uint64_t mt_schedule_features(void);

/* mt_cross_entropy's argument checks, in the oracle's order, for every vendor. */
int mt_check_ce_args(const float *loss_out, const float *row_loss, const float *dlogits,
                     const float *logits, const void *targets, int32_t target_bytes, int64_t n_rows,
                     int64_t vocab, int32_t reduction, float label_smoothing, int64_t num_items);

/* mt_lm_head_loss's argument checks, for every vendor (pointers may be device pointers). */
int mt_check_lm_head_args(const float *loss_out, const float *row_loss, const float *d_hidden,
                          const float *d_weight, const float *d_bias, const float *hidden,
                          const float *weight, const float *bias, const void *targets,
                          int32_t target_bytes, int64_t rows, int64_t vocab, int64_t width,
                          int32_t reduction, float label_smoothing, int64_t num_items,
                          int64_t chunk_rows);
/* mt_lm_head_loss's arguments as every vendor carries them (chunk: chunk_rows). */
typedef struct {
    float *loss_out, *row_loss, *d_hidden, *d_weight, *d_bias;
    const float *hidden, *weight, *bias;
    const void *targets;
    int32_t target_bytes, reduction;
    int64_t rows, vocab, width, ignore_index, num_items, chunk;
    float label_smoothing;
} mt_lm_args;
/* Each vendor's LM head, called by the one mt_lm_head_loss (mt_lm_head_args.c) once the
 * arguments passed mt_check_lm_head_args, inside the library's floating-point environment. */
int mt_lm_head_run(mt_lm_args *a);

/* Host targets: each is ignore_index or in [0, vocab) (else refused naming the first bad
 * row); *kept counts those not ignored. ignore_index MT_NO_IGNORE_INDEX ignores no row. */
int mt_check_targets(int64_t *kept, const void *targets, int32_t bytes, int64_t rows, int64_t vocab,
                     int64_t ignore_index);

/* The refusal of targets[row] = value (outside [0, vocab), not ignored): one message for
 * every vendor. Returns MT_EINVAL. */
int mt_fail_target(int64_t row, int64_t value, int64_t vocab, int64_t ignore_index);

/* The refusal of a non-finite logits row (MT_ENONFINITE), one message for every vendor. While
 * an LM head runs cross-entropy on logits it computed itself, it says so first with
 * mt_logits_of_lm_head(first row of the chunk, has bias) and afterwards with row0 = -1: the
 * message then names the caller's hidden row and the overflow of hidden @ weight.T (the
 * caller passed finite inputs and no logits). Thread-local, like the message. */
void mt_logits_of_lm_head(int64_t row0, int has_bias);
int mt_fail_nonfinite_logits(int64_t row);
/* The same after a pass that wrote `written` (e.g. "dlogits"), left undefined. */
int mt_fail_nonfinite_logits_after(int64_t row, const char *written);

/* The token rule over rows of single terms (linear.md): each leaf of MT_TOKEN_LEAF rows folds
 * acc + x[r] from +0.0, the leaves meet in the pairwise tree. partials holds
 * mt_token_leaves(rows) floats of scratch. */
float mt_token_sum(const float *x, int64_t rows, float *partials);

/* mt_accumulate's arguments (every vendor): n >= 0, n_parts >= 1, no NULL, out overlapping
 * no part. */
int mt_check_accumulate_args(const float *out, const float *const *parts, int32_t n_parts, int64_t n);

/* Element i of an index buffer of signed 4- or 8-byte integers (targets, ids). */
static inline int64_t mt_index_at(const void *ids, int32_t bytes, int64_t i) {
    return bytes == 8 ? ((const int64_t *)ids)[i] : (int64_t)((const int32_t *)ids)[i];
}

/* The library's own scratch memory, counted for mt_memory_stats: vendors report every
 * allocation they make for an op (bytes > 0) and its release (bytes < 0). mt_scratch_alloc
 * and mt_scratch_free are counted host malloc/free (NULL on failure, with the error set). */
void mt_mem_count(int64_t bytes);
void *mt_scratch_alloc(int64_t bytes, const char *what);
void mt_scratch_free(void *p, int64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
