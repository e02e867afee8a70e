/* mojo_train.h -- the whole C ABI of mojo_train, one header for every vendor.
 *
 * Every function returns int: 0 (MT_OK) or an error code, and on error leaves a message
 * for mt_last_error() (thread-local). A refused call never writes an input or a caller's
 * state (optimizer moments, step counts); it writes no output either, except that the ops
 * whose finiteness check rides along their one pass (below: losses, dense layers, LayerNorm, embedding,
 * LM head, accumulation) leave outputs that are not also inputs undefined after a NaN or inf.
 * Arguments: outputs first, then inputs, then scalars, sizes last; gradients start with d.
 * A tensor list is a pointer table plus an int32 offsets registry: tensor j holds
 * offsets[j+1] - offsets[j] floats at table[j]; offsets[0] == 0, strictly ascending,
 * offsets[n_tensors] <= 2^31 - 1. Per-element optimizer state (exp_avg, ...) is one flat
 * buffer indexed by the same offsets in the flat optimizer calls, a pointer table like the
 * params' in the grouped ones (mt_sgd_step_groups, mt_adam_step_groups).
 *
 * The block between MT_CDEF_BEGIN and MT_CDEF_END is plain declarations only: the Python
 * layer hands it to cffi verbatim (mojo_train/_native.py), so keep it free of macros.
 */
#ifndef MOJO_TRAIN_H
#define MOJO_TRAIN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The ABI's version, for the preprocessor of C hosts; mt_abi_version() reports the library's.
 * 3: feature bits named by family (LINEAR, RMS_NORM; RANDOM covers fills and dropout, bit 12
 * retired), MT_NO_IGNORE_INDEX, mt_find_bad_state.
 * 4: param groups and AMSGrad (mt_sgd_step_groups, mt_adam_step_groups, mt_optim_flag and the
 * group structs; the flat steps are one group of them), clip norm types and torch's
 * error_if_nonfinite (mt_clip_grad_norm, mt_grad_norms gain arguments), mt_cross_entropy_nd
 * (class weights, probability targets, (N, C, d1, ...) inputs); empty tensors in tensor lists.
 * 5: attention (MT_FEATURE_ATTENTION), LayerNorm (MT_FEATURE_LAYER_NORM), GELU (elementwise).
 * 6: the maps (SiLU, GELU, add, dropout) take `uint32_t flags` last (MT_MAP_OUT_FRESH: the
 * finiteness check fused into the one pass for an output declared fresh); an optimizer step
 * no longer refuses a non-finite parameter (optim.md step 3).
 * 7: attention takes dropout: (dropout_p, seed, stream, offset) last (attention.md, "Dropout").
 * 8: deferred refusals (mt_set_deferred_refusals, mt_deferred_refusals; contracts/README.md).
 * 9: mt_embedding_forward takes the maps' `uint32_t flags` last (MT_MAP_OUT_FRESH: the ids'
 * range check fused into the gather for an output declared fresh).
 * 10: mt_device_release_cache (freed device blocks kept idle for reuse, given back on request). */
#define MT_ABI_VERSION 10

/* ignore_index meaning "no row is ignored": with it, every target must be in [0, vocab) and a
 * target equal to INT64_MIN is refused as out of range like any other (never ignored). */
#define MT_NO_IGNORE_INDEX INT64_MIN

#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif
/* MT_CDEF_BEGIN */
/* The constants, declared once, as enums (C hosts and cffi read the same lines). */
enum mt_error_code {
    MT_OK = 0,
    MT_EINVAL = 1,        /* an argument was refused (message names it) */
    MT_ENONFINITE = 2,    /* NaN or inf in an input that must be finite */
    MT_ENOMEM = 3,        /* allocation failed */
    MT_EDEVICE = 4,       /* the vendor runtime failed or is absent */
    MT_EUNSUPPORTED = 5   /* not built into this library */
};

enum mt_schedule_kind {   /* learning-rate schedules (mt_lr_values) */
    MT_SCHEDULE_CONSTANT = 0,
    MT_SCHEDULE_WARMUP_LINEAR = 1,
    MT_SCHEDULE_WARMUP_COSINE = 2
};

enum mt_reduction {       /* cross-entropy and LM-head reductions */
    MT_REDUCTION_NONE = 0,
    MT_REDUCTION_SUM = 1,
    MT_REDUCTION_MEAN = 2
};

enum mt_feature {         /* mt_features() bits: one per op family, then capabilities */
    MT_FEATURE_OPTIM = 1 << 0,          /* SGD / Adam / AdamW steps */
    MT_FEATURE_CLIP = 1 << 1,           /* global-norm clipping */
    MT_FEATURE_RANDOM = 1 << 2,         /* Philox streams, uniform and normal fills, dropout */
    MT_FEATURE_LOSS = 1 << 3,           /* cross_entropy */
    MT_FEATURE_LINEAR = 1 << 4,         /* linear forward / backward */
    MT_FEATURE_LM_HEAD = 1 << 5,        /* the chunked LM head / linear_cross_entropy */
    MT_FEATURE_SCHEDULE = 1 << 6,       /* exact learning-rate schedules */
    MT_FEATURE_EMBEDDING = 1 << 7,      /* embedding forward / backward */
    MT_FEATURE_ACCUMULATE = 1 << 11,    /* gradient accumulation by the token tree */
    MT_FEATURE_ELEMENTWISE = 1 << 13,   /* SiLU, GELU, ReLU, residual add */
    MT_FEATURE_RMS_NORM = 1 << 14,      /* RMSNorm forward / backward */
    MT_FEATURE_LAYER_NORM = 1 << 15,    /* LayerNorm forward / backward */
    MT_FEATURE_ATTENTION = 1 << 19,     /* scaled dot-product attention forward / backward */
    MT_FEATURE_HOST_BUFFERS = 1 << 8,   /* accepts host pointers */
    MT_FEATURE_DEVICE_BUFFERS = 1 << 9, /* accepts device pointers */
    MT_FEATURE_THREADS = 1 << 10,       /* thread pool */
    MT_FEATURE_PINNED_MATH = 1 << 16,   /* pinned routines (identical numeric mode) */
    MT_FEATURE_CONTRACTION = 1 << 17,   /* fma contraction allowed (deterministic, fast) */
    MT_FEATURE_APPROXIMATE = 1 << 18,   /* approximate division/sqrt, flushed subnormals (GPU fast) */
    MT_FEATURE_FLUSH_RULE = 1 << 20,    /* the identical_ftz numeric mode's stated flush of subnormals */
    MT_FEATURE_DEFERRED_REFUSALS = 1 << 21 /* device-buffer calls queue and report a refusal later when
                                              deferring (mt_set_deferred_refusals); without it, at once */
};

int mt_abi_version(void);
const char *mt_vendor(void);
const char *mt_numeric_mode(void);
uint64_t mt_features(void);
const char *mt_last_error(void);
int mt_num_threads(void);
int mt_set_num_threads(int32_t n_threads);

int mt_sgd_step(float *const *params /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                float *const *grads /* like params; scaled in place when clip != 0 */,
                float *momentum_buffer /* (offsets[n_tensors]); unused when momentum == 0 */,
                int32_t *buf_initialized /* (n_tensors) */,
                float *norm_out /* (2): total norm, applied coefficient; may be NULL when clip == 0 */,
                const int32_t *offsets /* (n_tensors + 1) */,
                float lr, float momentum, float dampening, float weight_decay,
                int32_t nesterov, int32_t maximize, int32_t clip, float max_norm,
                int32_t n_tensors);

int mt_adam_step(float *const *params /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                 float *const *grads /* like params; scaled in place when clip != 0 */,
                 float *exp_avg /* (offsets[n_tensors]) */,
                 float *exp_avg_sq /* (offsets[n_tensors]) */,
                 float *norm_out /* (2); may be NULL when clip == 0 */,
                 const int32_t *offsets /* (n_tensors + 1) */,
                 float lr, float beta1, float beta2, float eps, float weight_decay,
                 int32_t maximize, int32_t clip, float max_norm, int64_t step,
                 int32_t n_tensors);

int mt_adamw_step(float *const *params /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                  float *const *grads /* like params; scaled in place when clip != 0 */,
                  float *exp_avg /* (offsets[n_tensors]) */,
                  float *exp_avg_sq /* (offsets[n_tensors]) */,
                  float *norm_out /* (2); may be NULL when clip == 0 */,
                  const int32_t *offsets /* (n_tensors + 1) */,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  int32_t maximize, int32_t clip, float max_norm, int64_t step,
                  int32_t n_tensors);

/* Param groups (contract: native/contracts/optim.md, "Param groups"): one call steps every
 * tensor of every group (one launch on a GPU). Tensor j takes the hyper-parameters of
 * groups[tensor_group[j]]; its state is a pointer per tensor (exp_avg[j] holds as many floats
 * as params[j]: a tensor per parameter as torch keeps it, or pointers into one flat buffer).
 * Tensors may be empty (offsets[j+1] == offsets[j]; their pointers may then be NULL).
 * groups, tensor_group, steps and buf_initialized are host memory on every vendor; the float
 * tensors are host or, on a GPU vendor, device memory. On success Adam adds 1 to every
 * steps[j] and SGD sets buf_initialized[j] = 1 where tensor j's group has momentum != 0; a
 * refused call writes nothing (neither those nor any tensor). The flat calls above are the
 * case of one group whose tensors all stand at step `step`, bit for bit. */
enum mt_optim_flag {      /* mt_sgd_group.flags, mt_adam_group.flags */
    MT_OPTIM_MAXIMIZE = 1 << 0,   /* ascend: the gradient's sign is flipped */
    MT_OPTIM_NESTEROV = 1 << 1,   /* SGD: Nesterov momentum (needs momentum > 0, dampening 0) */
    MT_OPTIM_AMSGRAD = 1 << 2,    /* Adam: the denominator from max_exp_avg_sq */
    MT_OPTIM_DECOUPLED = 1 << 3   /* Adam: decoupled weight decay p * (1 - lr * wd), i.e. AdamW */
};

typedef struct {
    float lr, momentum, dampening, weight_decay;
    int32_t flags;
} mt_sgd_group;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    int32_t flags;
} mt_adam_group;

int mt_sgd_step_groups(float *const *params /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                       float *const *grads /* like params; scaled in place when clip != 0 */,
                       float *const *momentum_buffer /* like params; read where the group has momentum; may be NULL if none */,
                       int32_t *buf_initialized /* (n_tensors), host: 0 or 1 */,
                       float *norm_out /* (2); may be NULL when clip == 0 */,
                       const int32_t *offsets /* (n_tensors + 1), non-decreasing */,
                       const mt_sgd_group *groups /* (n_groups), host */,
                       const int32_t *tensor_group /* (n_tensors), host: each in [0, n_groups) */,
                       int32_t clip, float max_norm, int32_t n_groups, int32_t n_tensors);

int mt_adam_step_groups(float *const *params /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                        float *const *grads /* like params; scaled in place when clip != 0 */,
                        float *const *exp_avg /* like params */,
                        float *const *exp_avg_sq /* like params */,
                        float *const *max_exp_avg_sq /* like params; read for MT_OPTIM_AMSGRAD groups; may be NULL if none */,
                        int64_t *steps /* (n_tensors), host: steps each tensor has taken, >= 0 */,
                        float *norm_out /* (2); may be NULL when clip == 0 */,
                        const int32_t *offsets /* (n_tensors + 1), non-decreasing */,
                        const mt_adam_group *groups /* (n_groups), host */,
                        const int32_t *tensor_group /* (n_tensors), host: each in [0, n_groups) */,
                        int32_t clip, float max_norm, int32_t n_groups, int32_t n_tensors);

/* Clip (contract: native/contracts/clip.md). norm_type is torch's: 2, 1 or INFINITY. Here a
 * tensor of the list may be empty (offsets[j+1] == offsets[j], its pointer then may be NULL):
 * its norm is 0. error_if_nonfinite != 0 refuses a NaN/inf total (nothing written); 0 (torch's
 * default) scales by the coefficient anyway, as torch; every NaN written is 0x7fc00000. */
int mt_clip_grad_norm(float *const *grads /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                      float *norm_out /* (2): total norm, applied coefficient */,
                      const int32_t *offsets /* (n_tensors + 1) */,
                      float max_norm, float norm_type, int32_t error_if_nonfinite, int32_t n_tensors);

int mt_grad_norms(float *tensor_norms /* (n_tensors) */, float *total_norm /* (1) */,
                  float *const *grads /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                  const int32_t *offsets /* (n_tensors + 1) */, float norm_type, int32_t n_tensors);

int mt_fill_zero(float *const *tensors /* (n_tensors) -> (offsets[j+1]-offsets[j]) */,
                 const int32_t *offsets /* (n_tensors + 1) */, int32_t n_tensors);

int mt_philox4x32_10(uint32_t *out /* (4) */, const uint32_t *counter /* (4) */,
                     const uint32_t *key /* (2) */);

int mt_uniform_fill(float *out /* (n) */, uint64_t seed, uint64_t stream, uint64_t offset,
                    double low /* rounded to float32 inside */, double high, int64_t n);

int mt_one_minus_pow(float *out /* (1) */, float base, int64_t exponent);

/* Loss and dense layers (contracts: native/contracts/loss.md, linear.md, rms_norm.md; ReLU:
 * elementwise.md). Every pointer is a host pointer, or on a GPU vendor a device pointer;
 * results land where the outputs are.
 * Targets are signed integers of target_bytes (4 or 8) each. On refusal nothing the caller
 * passed is written except, after a non-finite input is found, outputs the caller must
 * treat as undefined (dlogits, row_loss, d_hidden, d_weight, d_bias, y, dx, out); loss_out and
 * every input are never touched then. The Python layer allocates those outputs itself. */
int mt_cross_entropy(float *loss_out /* (1); may be NULL when reduction is NONE */,
                     float *row_loss /* (n_rows) or NULL; required when reduction is NONE */,
                     float *dlogits /* (n_rows*vocab) or NULL: no gradient */,
                     const float *logits /* (n_rows*vocab) */,
                     const void *targets /* (n_rows) */, int32_t target_bytes,
                     int64_t n_rows, int64_t vocab, int64_t ignore_index, int32_t reduction,
                     float label_smoothing, int64_t num_items /* mean's divisor; 0: non-ignored count */);

/* Cross-entropy in full (loss.md, "Weights, probability targets and positions"): logits of
 * (n_batch, vocab, inner), the class dimension strided by inner (torch's (N, C, d1, ...) with
 * inner = d1 * ...; 1 for (N, C)); its rows are the n_batch * inner positions in row-major order.
 * Targets are class indices (targets, target_bytes 4 or 8; target_probs NULL) or probabilities
 * of the logits' shape (target_probs; targets NULL, target_bytes 0; ignore_index unused).
 * weight: (vocab) class weights, or NULL. num_items: the mean's divisor; 0: the sum of the
 * target weights (the non-ignored count without weight), or n_batch * inner for probabilities.
 * Index targets, no weight and inner 1 give mt_cross_entropy's bits. */
int mt_cross_entropy_nd(float *loss_out /* (1); may be NULL when reduction is NONE */,
                        float *row_loss /* (n_batch*inner) or NULL; required when reduction is NONE */,
                        float *dlogits /* (n_batch*vocab*inner) or NULL: no gradient */,
                        const float *logits /* (n_batch*vocab*inner) */,
                        const void *targets /* (n_batch*inner) or NULL */,
                        const float *target_probs /* (n_batch*vocab*inner) or NULL */,
                        const float *weight /* (vocab) or NULL */, int32_t target_bytes,
                        int64_t n_batch, int64_t vocab, int64_t inner, int64_t ignore_index,
                        int32_t reduction, float label_smoothing, int64_t num_items);

int mt_linear_forward(float *out /* (m*n) */, const float *a /* (m*k) */,
                      const float *weight /* (n*k) */, const float *bias /* (n) or NULL */,
                      int64_t m, int64_t n, int64_t k);

int mt_linear_backward(float *da /* (m*k) or NULL */, float *dweight /* (n*k) or NULL */,
                       float *dbias /* (n) or NULL */, const float *dc /* (m*n) */,
                       const float *a /* (m*k) */, const float *weight /* (n*k) */,
                       int64_t m, int64_t n, int64_t k);

int mt_rms_norm_forward(float *y /* (rows*dim) */, const float *x /* (rows*dim) */,
                        const float *weight /* (dim) or NULL */, float eps, int64_t rows, int64_t dim);

int mt_rms_norm_backward(float *dx /* (rows*dim) or NULL */, float *dweight /* (dim) or NULL */,
                         const float *dy /* (rows*dim) */, const float *x /* (rows*dim) */,
                         const float *weight /* (dim) or NULL */, float eps, int64_t rows, int64_t dim);

/* LayerNorm over the last dimension (contract: native/contracts/layer_norm.md); bias is never
 * read by the backward (dbias does not depend on it). After a NaN or inf, y and dx are
 * undefined and dweight, dbias never written; the CPU checks an output overlapping an input
 * first, a GPU given device buffers does not (an input aliased by y or dx is then undefined). */
int mt_layer_norm_forward(float *y /* (rows*dim) */, const float *x /* (rows*dim) */,
                          const float *weight /* (dim) or NULL */, const float *bias /* (dim) or NULL */,
                          float eps, int64_t rows, int64_t dim);

int mt_layer_norm_backward(float *dx /* (rows*dim) or NULL */, float *dweight /* (dim) or NULL */,
                           float *dbias /* (dim) or NULL */, const float *dy /* (rows*dim) */,
                           const float *x /* (rows*dim) */, const float *weight /* (dim) or NULL */,
                           float eps, int64_t rows, int64_t dim);

/* Scaled dot-product attention (contract: native/contracts/attention.md). q, dq, out, dout:
 * (B, H, Tq, D); k, v, dk, dv: (B, Hkv, Tk, D), query head h reading kv head h / (H / Hkv);
 * lse: (B, H, Tq), the forward's row log-sum-exp, which the backward takes with out. The mask
 * is NULL (kind NONE) or bool bytes (BOOL: nonzero keeps a pair) or float32 added to the scores
 * (FLOAT: finite, or -inf to mask); element (b, h, i, j) at b*mask_sb + h*mask_sh + i*mask_si
 * + j*mask_sj (strides in elements, >= 0; 0 broadcasts). is_causal (0 or 1, never with a mask)
 * keeps key j for query i iff j <= i. scale: the scores' factor (torch's default 1/sqrt(D) is
 * the caller's to round: attention.md). lse, dq, dk, dv may be NULL (not computed).
 * dropout_p in [0, 1): 0 is no dropout; above, pair (b, h, i, j) is kept or dropped by the
 * dropout rule of random.md at stream element offset + ((b*H + h)*Tq + i)*Tk + j of (seed,
 * stream), the forward's and the backward's the same (attention.md, "Dropout"). */
enum mt_attention_mask_kind {
    MT_ATTENTION_MASK_NONE = 0,
    MT_ATTENTION_MASK_BOOL = 1,
    MT_ATTENTION_MASK_FLOAT = 2
};

int mt_attention_forward(float *out /* (B*H*Tq*D) */, float *lse /* (B*H*Tq) or NULL */,
                         const float *q /* (B*H*Tq*D) */, const float *k /* (B*Hkv*Tk*D) */,
                         const float *v /* (B*Hkv*Tk*D) */, const void *mask /* strided, or NULL */,
                         int32_t mask_kind, int64_t mask_sb, int64_t mask_sh, int64_t mask_si,
                         int64_t mask_sj, int32_t is_causal, float scale, int64_t B, int64_t H,
                         int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, float dropout_p, uint64_t seed,
                         uint64_t stream, uint64_t offset);

int mt_attention_backward(float *dq /* (B*H*Tq*D) or NULL */, float *dk /* (B*Hkv*Tk*D) or NULL */,
                          float *dv /* (B*Hkv*Tk*D) or NULL */, const float *dout /* (B*H*Tq*D) */,
                          const float *q /* (B*H*Tq*D) */, const float *k /* (B*Hkv*Tk*D) */,
                          const float *v /* (B*Hkv*Tk*D) */, const float *out /* (B*H*Tq*D) */,
                          const float *lse /* (B*H*Tq) */, const void *mask /* strided, or NULL */,
                          int32_t mask_kind, int64_t mask_sb, int64_t mask_sh, int64_t mask_si,
                          int64_t mask_sj, int32_t is_causal, float scale, int64_t B, int64_t H,
                          int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D, float dropout_p, uint64_t seed,
                          uint64_t stream, uint64_t offset);

int mt_relu_forward(float *y /* (n) */, const float *x /* (n) */, int64_t n);
int mt_relu_backward(float *dx /* (n) */, const float *dy /* (n) */, const float *x /* (n) */, int64_t n);

int mt_lm_head_loss(float *loss_out /* (1); may be NULL when reduction is NONE */,
                    float *row_loss /* (rows) or NULL; required when reduction is NONE */,
                    float *d_hidden /* (rows*width) or NULL */, float *d_weight /* (vocab*width) or NULL */,
                    float *d_bias /* (vocab) or NULL */, const float *hidden /* (rows*width) */,
                    const float *weight /* (vocab*width) */, const float *bias /* (vocab) or NULL */,
                    const void *targets /* (rows) */, int32_t target_bytes, int64_t rows,
                    int64_t vocab, int64_t width, int64_t ignore_index, int32_t reduction,
                    float label_smoothing, int64_t num_items, int64_t chunk_rows /* 0: library's choice */);

/* Embedding, random streams, schedules, accumulation, elementwise ops (contracts:
 * native/contracts/embedding.md, random.md, schedule.md, accumulate.md, elementwise.md).
 * As above: a refused call leaves inputs untouched. Dropout and the elementwise maps write
 * nothing at all when they refuse (their finiteness check is a pre-pass; an output is an input
 * itself, in place, or disjoint from every input: a partial overlap is refused by name), unless
 * the caller declares the output fresh (MT_MAP_OUT_FRESH, below). For
 * the others, an output that is not also an input is undefined after a non-finite input was
 * found (the check is fused into the one pass), while an output that aliases an input (in
 * place) is checked first and never written on refusal. */
/* flags: 0, or MT_MAP_OUT_FRESH (below) when `out` is not the caller's data: then a GPU may
 * check the ids inside the gather (one launch fewer), and after a refused id `out` holds
 * anything; without it a refusal writes nothing. Other bits are refused. */
int mt_embedding_forward(float *out /* (n_ids*dim) */, const float *weight /* (vocab*dim) */,
                         const void *ids /* (n_ids) */, int32_t id_bytes, int64_t n_ids,
                         int64_t vocab, int64_t dim, uint32_t flags);
int mt_embedding_backward(float *dweight /* (vocab*dim) */, const float *dy /* (n_ids*dim) */,
                          const void *ids /* (n_ids) */, int32_t id_bytes, int64_t n_ids,
                          int64_t vocab, int64_t dim, int64_t padding_idx /* < 0: none */,
                          int32_t accumulate /* bit 0: dweight += new; bits 1-2: plan 0 auto, 1 scan, 2 sort */);

int mt_normal_fill(float *out /* (n) */, uint64_t seed, uint64_t stream, uint64_t offset,
                   double mean /* rounded to float32 inside */, double std, int64_t n);
/* The maps (dropout, SiLU, GELU, add) take `flags`: 0, or MT_MAP_OUT_FRESH when the output is
 * not the caller's data (a buffer just allocated for this result and dropped on a refusal).
 * Then, unless the output is an input itself (in place), the finiteness check may ride along
 * in the one pass instead of a pre-pass (one read of each input fewer), and after a refusal
 * the output holds anything; without it a refusal writes nothing. Other bits are refused. */
enum mt_map_flags { MT_MAP_OUT_FRESH = 1 };
int mt_dropout_forward(float *y /* (n) */, const float *x /* (n) */, float p, uint64_t seed,
                       uint64_t stream, uint64_t offset, int64_t n, uint32_t flags);
int mt_dropout_backward(float *dx /* (n) */, const float *dy /* (n) */, float p, uint64_t seed,
                        uint64_t stream, uint64_t offset, int64_t n, uint32_t flags);

/* out[i] = the learning rate of step first_step + i (one-based), the float32 nearest the
 * exact value of the schedule for these arguments (taken as exact binary64 values). Host
 * memory only, on every vendor. */
int mt_lr_values(float *out /* (n) */, int32_t kind, double peak_lr, double min_lr,
                 int64_t warmup_steps, int64_t total_steps, int64_t first_step, int64_t n);

/* out = the pairwise tree (clip.md step 4) over parts[0..n_parts), elementwise. */
int mt_accumulate(float *out /* (n) */, const float *const *parts /* (n_parts) -> (n) */,
                  int32_t n_parts, int64_t n);

int mt_silu_forward(float *y /* (n) */, const float *x /* (n) */, int64_t n, uint32_t flags);
int mt_silu_backward(float *dx /* (n) */, const float *dy /* (n) */, const float *x /* (n) */, int64_t n,
                     uint32_t flags);
int mt_add(float *out /* (n) */, const float *a /* (n) */, const float *b /* (n) */, int64_t n, uint32_t flags);
/* GELU (elementwise.md): approximate is MT_GELU_NONE (0, erf) or MT_GELU_TANH (1); the aliasing
 * and non-finite rules are SiLU's. */
enum mt_gelu_approximate { MT_GELU_NONE = 0, MT_GELU_TANH = 1 };
int mt_gelu_forward(float *y /* (n) */, const float *x /* (n) */, int64_t n, int32_t approximate,
                    uint32_t flags);
int mt_gelu_backward(float *dx /* (n) */, const float *dy /* (n) */, const float *x /* (n) */, int64_t n,
                     int32_t approximate, uint32_t flags);

/* Validation of a host buffer of optimizer state before it is loaded (every vendor; x is a
 * host pointer): *first_bad is the index of the first element that is NaN or inf -- with
 * nonnegative != 0 (a second moment), NaN or below zero (-inf too; -0.0 is not), +inf being
 * what a step writes when a gradient's square overflows -- or -1 when there is none. */
int mt_find_bad_state(int64_t *first_bad /* (1) */, const float *x /* (n) */, int64_t n, int32_t nonnegative);

/* Bytes the library holds for its own scratch (not caller buffers): out[0] now, out[1] the
 * peak since the last reset (reset != 0 sets the peak to the current value after reading). */
int mt_memory_stats(int64_t *out /* (2) */, int32_t reset);

/* Devices and memory. On the cpu vendor there is no device: mt_device_count reports 0,
 * mt_device_alloc refuses, mt_memcpy is a host copy. Every op above accepts host pointers on
 * every vendor; GPU vendors also accept their device pointers (and stage host ones). */
int mt_device_count(int32_t *out /* (1) */);
int mt_device_alloc(void **out /* (1) */, int64_t nbytes);
int mt_device_free(void *ptr);
/* A GPU vendor's mt_device_free keeps a block it freed after the device was idle for the next
 * mt_device_alloc of the same size (at most 32 blocks and 2 GiB): no runtime call or
 * synchronization then (a block is taken only on the device current when it was freed). This
 * gives every such block back to the vendor's pool, and on CUDA the current device's pool's
 * unused memory back to the device once the calling thread's stream is done
 * (torch.cuda.empty_cache's job); like every GPU call it first reports a deferred refusal queued
 * on the calling thread (the blocks go back either way). keep_none_after != 0:
 * no block is kept idle from then on -- what a host calls before it exits, so that a leak
 * checker (compute-sanitizer's memcheck) finds every block freed; the Python package does.
 * The cpu vendor and Metal keep nothing: there it does nothing. */
int mt_device_release_cache(int32_t keep_none_after);
int mt_memcpy(void *dst /* (nbytes) */, const void *src /* (nbytes) */, int64_t nbytes);
int mt_synchronize(void);
/* Deferred refusals (contracts/README.md, "Deferred refusals"), for the calling thread: with
 * on = 1, the maps (SiLU, GELU, add, dropout) and the embedding forward on device buffers
 * return without waiting for the GPU, and a refusal of theirs is reported later -- by
 * mt_synchronize, mt_memcpy, any other GPU call, or mt_set_deferred_refusals(0) -- naming the
 * call and its argument; the refused call and every deferred call after it write nothing to a
 * caller's buffer. On the cpu vendor every call reports at once (the switch is kept). */
int mt_set_deferred_refusals(int32_t on);
int mt_deferred_refusals(int32_t *out /* (1) */);
int mt_is_device_pointer(int32_t *out /* (1) */, const void *ptr);
int mt_transfer_bytes(int64_t *out /* (2): host to device, device to host, since load */);
int mt_set_launch_geometry(int32_t threads_per_block, int32_t max_blocks);
int mt_launch_geometry(int32_t *out /* (2): threads per block, blocks of the last launch */);
/* MT_CDEF_END */
#if defined(__GNUC__)
#pragma GCC visibility pop
#endif

#ifdef __cplusplus
}
#endif
#endif /* MOJO_TRAIN_H */
