/* mt_metal_params.h -- what the host passes a Metal kernel besides its buffers: one small struct
 * a kernel (set with setBytes), in plain C that Metal reads alike (fixed-width fields, 64-bit
 * ones first, so the layouts agree), and the op codes of the kernels that serve several ops.
 * Included by the host ops (C) and, after mt_pinned.h, by the kernels (mt_metal_kernel.h). */
#ifndef MT_METAL_PARAMS_H
#define MT_METAL_PARAMS_H
#if !defined(__METAL_VERSION__) && !defined(MT_METAL_SHIM)
#include <stdint.h>
#endif
#include "mt_pinned.h"

/* A kernel over n elements and nothing more. */
typedef struct {
    int64_t n;
} mt_mtl_count_params;

/* The maps (mt_metal_elementwise.metal): out[i] = op(a[i], b[i]); for gradients a is dy, b x. */
enum { MT_MTL_SILU, MT_MTL_SILU_GRAD, MT_MTL_ADD, MT_MTL_GELU, MT_MTL_GELU_GRAD, MT_MTL_GELU_TANH,
       MT_MTL_GELU_TANH_GRAD, MT_MTL_RELU, MT_MTL_RELU_GRAD };
typedef struct {
    int64_t n;
    int32_t op;
    int32_t check;     /* 1: return at once when bad[0] or bad[1] is set (the pre-pass found NaN/inf) */
} mt_mtl_map_params;

/* The finiteness pre-pass: bad[0] = 1 when a holds NaN/inf, bad[1] when b does (has_b). */
typedef struct {
    int64_t n;
    int32_t has_b, pad;
} mt_mtl_nonfinite_params;

/* The random fills and dropout (mt_metal_random.metal): stream elements offset .. offset + n. */
enum { MT_MTL_UNIFORM, MT_MTL_NORMAL, MT_MTL_DROPOUT };
typedef struct {
    uint64_t seed, stream, offset;
    int64_t n;
    float a, b;        /* uniform: low, width; normal: mean, std; dropout: p, 1 / (1 - p) */
    int32_t kind, check;
} mt_mtl_random_params;


/* The chunk folds (mt_metal_clip.metal): the norms' kinds as native/common/mt_host.h's
 * MT_NORM_KIND_*, and RMSNorm's g.x (GDOT). */
enum { MT_MTL_NORM_L2 = 0, MT_MTL_NORM_L1 = 1, MT_MTL_NORM_INF = 2, MT_MTL_FOLD_GDOT = 3, MT_MTL_FOLD_LN_G = 4,
       MT_MTL_FOLD_LN_GX = 5, MT_MTL_FOLD_SUM = 6, MT_MTL_FOLD_DEVSQ = 7, MT_MTL_FOLD_EXP = 8,
       MT_MTL_FOLD_WX = 9, MT_MTL_FOLD_YX = 10 };
typedef struct {
    int64_t n;      /* folds: a row's elements; finish: the number of vectors */
    int64_t at;     /* where the first result goes in the output */
    int64_t rows;   /* folds: rows of n elements, one after another */
    int32_t kind;
    int32_t reversed;   /* walk each chunk's full rows backwards (a sabotage build's switch) */
    int32_t has_w;      /* GDOT: g = dy * w */
    int32_t pad;
} mt_mtl_norm_params;

/* RMSNorm and LayerNorm (mt_metal_rms_norm.metal): a row's scalar from its chunk tree (the
 * tree itself: ROW_SUM, cross-entropy's sums). */
enum { MT_MTL_RMS_RSTD, MT_MTL_RMS_K, MT_MTL_LN_MEAN, MT_MTL_ROW_SUM };
typedef struct {
    int64_t rows, dim, chunks;
    float dimf, eps;
    int32_t op;         /* rows: MT_MTL_RMS_*, MT_MTL_LN_MEAN; elements: whether to write y (0) or dx (1) */
    int32_t has_w;
    int32_t has_b, pad;
} mt_mtl_rms_params;

typedef struct {
    int64_t n;
    float coef;
    int32_t pad;
} mt_mtl_scale_params;

/* The optimizer steps (mt_metal_optim.metal): one tensor, its host scalars. */
typedef struct {
    int64_t n;
    mt_adam_scalars s;
    float coef;            /* the clip's coefficient (1: not clipping) */
    int32_t scale;         /* write g * coef back into the gradient */
} mt_mtl_adam_params;

typedef struct {
    int64_t n;
    mt_sgd_scalars s;
    float coef;
    int32_t scale, has_buf, initialized;
} mt_mtl_sgd_params;

/* Cross-entropy (mt_metal_loss.metal): rows of vocab logits, the targets' kind, the call's
 * scalars (mt_ce_scalars_for), Wm (a weight with smoothing) and the mean's divisor. */
enum { MT_MTL_CE_PLAIN, MT_MTL_CE_WEIGHTED, MT_MTL_CE_PROBS };
enum { MT_MTL_CE_SUM, MT_MTL_CE_MEAN };
typedef struct {
    int64_t rows, vocab, ignore_index;
    mt_ce_scalars c;
    float wm, divisor;
    int32_t kind, target_bytes, has_w, op;
} mt_mtl_ce_params;

/* Attention (mt_metal_attention.metal): the call's sizes, the mask's strides (elements) and
 * kind (MT_MTL_MASK_*: mojo_train.h's MT_ATTENTION_MASK_*), scale, dropout (p = 0: none) and
 * which outputs the call has. */
enum { MT_MTL_MASK_NONE, MT_MTL_MASK_BOOL, MT_MTL_MASK_FLOAT };
typedef struct {
    int64_t B, H, Hkv, Tq, Tk, D, sb, sh, si, sj;
    uint64_t seed, stream, offset;
    float scale, dropout_p, dropout_scale;
    int32_t mask_kind, is_causal, has_lse, has_dk, has_dv;
} mt_mtl_attn_params;

/* Linear (mt_metal_linear.metal): a (m, k), weight (n, k), dc (m, n); what a kernel forms;
 * resume: the leaves kernel continues the chains it finds in its output (m <= one leaf: the
 * LM head's leaf that a chunk boundary cut). */
enum { MT_MTL_LINEAR_OUT, MT_MTL_LINEAR_DA, MT_MTL_LINEAR_DW, MT_MTL_LINEAR_DB };
typedef struct {
    int64_t m, n, k;
    int32_t op, has_bias, resume;
} mt_mtl_linear_params;

/* batch matrices of rows x cols, each transposed (mt_k_ce_transpose). */
typedef struct {
    int64_t batch, rows, cols;
} mt_mtl_transpose_params;

/* The embedding (mt_metal_embedding.metal). */
typedef struct {
    int64_t n_ids, vocab, dim;
    int32_t id_bytes;       /* 4 or 8: ids as 32-bit words, an id of 8 bytes two of them (little-endian) */
    int32_t accumulate;     /* backward: dweight = dweight + new where a row has terms */
    int32_t reversed;       /* a sabotage build's switch: each leaf's terms in descending order */
    int32_t pad;
} mt_mtl_emb_params;
#endif
