/* mt_attention_args.c -- the ABI's attention entries (they pack their arguments and call the
 * vendor's mt_attention_run), the argument checks and the refusal messages of attention (see
 * mt_attention_args.h), linked by every vendor. */
#include "mt_attention_args.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include <stddef.h>
#include <string.h>

#define ATTN_MAX_ELEMS ((int64_t)1 << 60)

/* x * y for counts in [0, 2^60]: -1 when the product exceeds 2^60. */
static int64_t capped_product(int64_t x, int64_t y) {
    if (x && y > ATTN_MAX_ELEMS / x) return -1;
    return x * y;
}

static int check_sizes(const mt_attn_args *a) {
    int rc;
    if ((rc = mt_check_count(a->B, "B")) || (rc = mt_check_count(a->Tq, "Tq")) || (rc = mt_check_count(a->Tk, "Tk")))
        return rc;
    if (a->H < 1) return mt_fail(MT_EINVAL, "H must be >= 1, got %lld", (long long)a->H);
    if (a->Hkv < 1) return mt_fail(MT_EINVAL, "Hkv must be >= 1, got %lld", (long long)a->Hkv);
    if (a->H % a->Hkv)
        return mt_fail(MT_EINVAL, "H must be a multiple of Hkv (each kv head serves H / Hkv query heads), got H=%lld, "
                       "Hkv=%lld", (long long)a->H, (long long)a->Hkv);
    if (a->D < 1 || a->D > MT_ATTN_MAX_D)
        return mt_fail(MT_EINVAL, "D must be in [1, %d], got %lld", MT_ATTN_MAX_D, (long long)a->D);
    /* B*H and B*Hkv are capped even when Tq or Tk is 0 (the kernels' grids and row counts form
     * them first), so B = 2^62 with Tq = 0 is refused though every tensor is empty */
    int64_t rows = capped_product(capped_product(a->B, a->H), a->Tq);
    int64_t keys = capped_product(capped_product(a->B, a->Hkv), a->Tk);
    if (rows < 0 || capped_product(rows, a->D) < 0 || keys < 0 || capped_product(keys, a->D) < 0 ||
        capped_product(rows, a->Tk) < 0)
        return mt_fail(MT_EINVAL, "B=%lld, H=%lld, Hkv=%lld, Tq=%lld, Tk=%lld, D=%lld are too large (B*H, B*Hkv, each "
                       "tensor and B*H*Tq*Tk at most 2^60 elements)", (long long)a->B, (long long)a->H, (long long)a->Hkv,
                       (long long)a->Tq, (long long)a->Tk, (long long)a->D);
    return MT_OK;
}

static int check_options(const mt_attn_args *a) {
    if (!mt_is_finite(a->scale)) return mt_fail(MT_EINVAL, "scale must be finite, got %g", (double)a->scale);
    const char *why = mt_dropout_problem(a->dropout_p);
    if (why) return mt_fail(MT_EINVAL, "dropout_p: %s, got %g", why, (double)a->dropout_p);
    if (a->dropout_p > 0.0f && (why = mt_span_problem(a->offset, a->B * a->H * a->Tq * a->Tk)))
        return mt_fail(MT_EINVAL, "dropout: %s (offset %llu, B*H*Tq*Tk = %lld pairs)", why,
                       (unsigned long long)a->offset, (long long)(a->B * a->H * a->Tq * a->Tk));
    if (a->is_causal != 0 && a->is_causal != 1)
        return mt_fail(MT_EINVAL, "is_causal must be 0 or 1, got %d", (int)a->is_causal);
    if (a->mask_kind < MT_ATTENTION_MASK_NONE || a->mask_kind > MT_ATTENTION_MASK_FLOAT)
        return mt_fail(MT_EINVAL, "mask_kind must be MT_ATTENTION_MASK_NONE, _BOOL or _FLOAT (0, 1, 2), got %d",
                       (int)a->mask_kind);
    if (a->is_causal && a->mask_kind != MT_ATTENTION_MASK_NONE)
        return mt_fail(MT_EINVAL, "is_causal=1 needs mask_kind MT_ATTENTION_MASK_NONE (torch refuses is_causal "
                       "together with attn_mask); fold the causal pattern into the mask instead");
    return MT_OK;
}

/* (n - 1) * stride, or -1 past 2^60. */
static int64_t span(int64_t n, int64_t stride) { return n > 1 ? capped_product(n - 1, stride) : 0; }

static int check_mask(const mt_attn_args *a) {
    if (a->mask_kind == MT_ATTENTION_MASK_NONE)
        return a->mask ? mt_fail(MT_EINVAL, "mask must be NULL with mask_kind MT_ATTENTION_MASK_NONE") : MT_OK;
    const int64_t st[4] = {a->sb, a->sh, a->si, a->sj};
    const char *names[4] = {"mask_sb", "mask_sh", "mask_si", "mask_sj"};
    for (int d = 0; d < 4; ++d)
        if (st[d] < 0) return mt_fail(MT_EINVAL, "%s must be >= 0 (0 broadcasts), got %lld", names[d], (long long)st[d]);
    const int64_t n[4] = {a->B, a->H, a->Tq, a->Tk};
    for (int d = 0; d < 4; ++d)
        if (span(n[d], st[d]) < 0)
            return mt_fail(MT_EINVAL, "%s = %lld reaches past 2^60 elements", names[d], (long long)st[d]);
    int64_t reach = 0;                       /* each span is below 2^60: the sum of four fits */
    for (int d = 0; d < 4; ++d) reach += span(n[d], st[d]);
    if (reach > ATTN_MAX_ELEMS)
        return mt_fail(MT_EINVAL, "the mask's strides reach past 2^60 elements together (mask_sb=%lld, mask_sh=%lld, "
                       "mask_si=%lld, mask_sj=%lld)", (long long)a->sb, (long long)a->sh, (long long)a->si,
                       (long long)a->sj);
    if (a->B * a->H * a->Tq * a->Tk > 0 && !a->mask) return mt_fail(MT_EINVAL, "mask is NULL");
    return MT_OK;
}

int64_t mt_attn_mask_bytes(const mt_attn_args *a) {
    if (a->mask_kind == MT_ATTENTION_MASK_NONE || a->B * a->H * a->Tq * a->Tk == 0) return 0;
    int64_t last = span(a->B, a->sb) + span(a->H, a->sh) + span(a->Tq, a->si) + span(a->Tk, a->sj);
    return (last + 1) * (a->mask_kind == MT_ATTENTION_MASK_FLOAT ? 4 : 1);
}

static int check_buffers(const mt_named_buf *bufs, int n) {
    int rc;
    for (int i = 0; i < n; ++i)
        if (!bufs[i].out && (rc = mt_check_tensor(bufs[i].p, bufs[i].bytes, bufs[i].name))) return rc;
    return mt_check_outputs_apart(bufs, n);
}

int64_t mt_attn_q_elems(const mt_attn_args *a) { return a->B * a->H * a->Tq * a->D; }
int64_t mt_attn_kv_elems(const mt_attn_args *a) { return a->B * a->Hkv * a->Tk * a->D; }
int64_t mt_attn_rows(const mt_attn_args *a) { return a->B * a->H * a->Tq; }

int mt_check_attention_args(const mt_attn_args *a, int backward) {
    int rc;
    if ((rc = check_sizes(a)) || (rc = check_options(a)) || (rc = check_mask(a))) return rc;
    int64_t qb = mt_attn_q_elems(a) * 4, kvb = mt_attn_kv_elems(a) * 4, rb = mt_attn_rows(a) * 4;
    if (!backward) {
        if (!a->out && qb > 0) return mt_fail(MT_EINVAL, "out is NULL");
        mt_named_buf bufs[] = {{"out", a->out, qb, 1}, {"lse", a->lse, rb, 1}, {"q", a->q, qb, 0}, {"k", a->k, kvb, 0},
                           {"v", a->v, kvb, 0}, {"mask", a->mask, mt_attn_mask_bytes(a), 0}};
        return check_buffers(bufs, (int)(sizeof bufs / sizeof bufs[0]));
    }
    mt_named_buf bufs[] = {{"dq", a->dq, qb, 1}, {"dk", a->dk, kvb, 1}, {"dv", a->dv, kvb, 1},
                       {"dout", a->dout, qb, 0}, {"q", a->q, qb, 0}, {"k", a->k, kvb, 0}, {"v", a->v, kvb, 0},
                       {"out", a->out_in, qb, 0}, {"lse", a->lse_in, rb, 0}, {"mask", a->mask, mt_attn_mask_bytes(a), 0}};
    return check_buffers(bufs, (int)(sizeof bufs / sizeof bufs[0]));
}

int mt_fail_attention_mask(void) {
    return mt_fail(MT_ENONFINITE, "mask holds NaN or +inf (a float mask is added to the scores: finite values, or "
                   "-inf to leave a pair out); nothing was written");
}

int mt_fail_attention_lse(void) {
    return mt_fail(MT_ENONFINITE, "lse holds NaN or +inf (the forward's log-sum-exp is finite, or -inf for a fully "
                   "masked row); nothing was written");
}

/* The dropout scale, formed once on the host by the pinned routine (a p outside [0, 1) is
 * refused by the checks before it is used). */
MT_NOINLINE static float dropout_scale_of(float p) {
    return p >= 0.0f && p < 1.0f ? mt_dropout_scale(p) : 1.0f;
}

/* A call without a mask reads no stride (they are not checked then): zeros, so that no vendor's
 * index arithmetic multiplies the caller's values (a fuzzer's INT64_MAX overflowed there). */
static mt_attn_args *unmasked_strides(mt_attn_args *a) {
    if (a->mask_kind == MT_ATTENTION_MASK_NONE) a->sb = a->sh = a->si = a->sj = 0;
    return a;
}

int mt_attention_forward(float *out, float *lse, const float *q, const float *k, const float *v, const void *mask,
                         int32_t mask_kind, int64_t mask_sb, int64_t mask_sh, int64_t mask_si, int64_t mask_sj,
                         int32_t is_causal, float scale, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk,
                         int64_t D, float dropout_p, uint64_t seed, uint64_t stream, uint64_t offset) {
    mt_attn_args a = {out, lse, NULL, NULL, NULL, q, k, v, NULL, NULL, NULL, mask, mask_kind, is_causal,
                      mask_sb, mask_sh, mask_si, mask_sj, scale, B, H, Hkv, Tq, Tk, D,
                      dropout_p, dropout_scale_of(dropout_p), seed, stream, offset};
    return mt_attention_run(unmasked_strides(&a), 0);
}

int mt_attention_backward(float *dq, float *dk, float *dv, const float *dout, const float *q, const float *k,
                          const float *v, const float *out, const float *lse, const void *mask, int32_t mask_kind,
                          int64_t mask_sb, int64_t mask_sh, int64_t mask_si, int64_t mask_sj, int32_t is_causal,
                          float scale, int64_t B, int64_t H, int64_t Hkv, int64_t Tq, int64_t Tk, int64_t D,
                          float dropout_p, uint64_t seed, uint64_t stream, uint64_t offset) {
    mt_attn_args a = {NULL, NULL, dq, dk, dv, q, k, v, dout, out, lse, mask, mask_kind, is_causal,
                      mask_sb, mask_sh, mask_si, mask_sj, scale, B, H, Hkv, Tq, Tk, D,
                      dropout_p, dropout_scale_of(dropout_p), seed, stream, offset};
    return mt_attention_run(unmasked_strides(&a), 1);
}

/* Whether the float at p is NaN or +inf (its bits). */
static int nan_or_plus_inf(const float *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (u & 0x7fffffffu) > 0x7f800000u || u == 0x7f800000u;
}

int mt_attn_float_mask_bad(const mt_attn_args *a) {
    if (a->mask_kind != MT_ATTENTION_MASK_FLOAT || a->B * a->H * a->Tq * a->Tk == 0) return 0;
    const float *m = (const float *)a->mask;
    const int64_t nb = a->sb ? a->B : 1, nh = a->sh ? a->H : 1, ni = a->si ? a->Tq : 1, nj = a->sj ? a->Tk : 1;
    for (int64_t b = 0; b < nb; ++b)
        for (int64_t h = 0; h < nh; ++h)
            for (int64_t i = 0; i < ni; ++i)
                for (int64_t j = 0; j < nj; ++j)
                    if (nan_or_plus_inf(m + b * a->sb + h * a->sh + i * a->si + j * a->sj)) return 1;
    return 0;
}

int mt_attn_lse_bad(const float *lse, int64_t n) {
    for (int64_t i = 0; i < n; ++i)
        if (nan_or_plus_inf(lse + i)) return 1;
    return 0;
}
