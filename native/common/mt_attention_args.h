/* mt_attention_args.h -- the arguments of mt_attention_forward / mt_attention_backward as every
 * vendor carries them, and their checks, one copy for every vendor (contract:
 * native/contracts/attention.md, "Refusals"). Pointers may be device pointers: the checks only
 * compare their values; nothing here reads a tensor. */
#ifndef MT_ATTENTION_ARGS_H
#define MT_ATTENTION_ARGS_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    float *out, *lse;                          /* forward outputs (lse may be NULL) */
    float *dq, *dk, *dv;                       /* backward outputs (each may be NULL) */
    const float *q, *k, *v, *dout, *out_in, *lse_in;   /* out_in, lse_in: the backward's saved forward */
    const void *mask;
    int32_t mask_kind, is_causal;
    int64_t sb, sh, si, sj;                    /* the mask's strides in elements */
    float scale;
    int64_t B, H, Hkv, Tq, Tk, D;
    float dropout_p, dropout_scale;            /* p in [0, 1) and 1 / (1 - p) (mt_dropout_scale) */
    uint64_t seed, stream, offset;             /* pair (b, h, i, j): stream element offset + ((b H + h) Tq + i) Tk + j */
} mt_attn_args;

/* The stream element of pair (b, h, i, j) of a call (attention.md, "Dropout"). */
#define MT_ATTN_PAIR_ELEMENT(a, b, h, i, j) \
    ((a).offset + (uint64_t)((((int64_t)(b) * (a).H + (h)) * (a).Tq + (i)) * (a).Tk + (j)))

/* Every argument check of the forward (backward = 0) or the backward (1), in the oracle's
 * order: sizes, scale, is_causal and the mask's kind, the mask's strides and pointer, the
 * tensors' pointers, then overlaps of an output with any other buffer. MT_OK or MT_EINVAL. */
int mt_check_attention_args(const mt_attn_args *a, int backward);

/* Element counts of the (B, H, Tq, D), (B, Hkv, Tk, D) and (B, H, Tq) tensors (after the checks). */
int64_t mt_attn_q_elems(const mt_attn_args *a);
int64_t mt_attn_kv_elems(const mt_attn_args *a);
int64_t mt_attn_rows(const mt_attn_args *a);
/* Bytes of the mask the strides reach (0 without a mask or without pairs). */
int64_t mt_attn_mask_bytes(const mt_attn_args *a);
/* Host buffers only: a float mask holding NaN or +inf in an element the strides reach (0
 * without a float mask or without pairs), and n values of lse holding NaN or +inf -- by their
 * bits, no float arithmetic (the CPU oracle's and Metal's refusals). */
int mt_attn_float_mask_bad(const mt_attn_args *a);
int mt_attn_lse_bad(const float *lse, int64_t n);

/* The vendor's attention: the forward (backward = 0) or the backward (1) of the call packed in a.
 * Each vendor defines it; mt_attention_forward / mt_attention_backward (mt_attention_args.c,
 * one copy for every vendor) pack the ABI's arguments and call it. */
int mt_attention_run(const mt_attn_args *a, int backward);

/* The refusals of non-finite inputs, one message for every vendor (MT_ENONFINITE): a float
 * mask holding NaN or +inf; an lse holding NaN or +inf. */
int mt_fail_attention_mask(void);
int mt_fail_attention_lse(void);

#ifdef __cplusplus
}
#endif
#endif
