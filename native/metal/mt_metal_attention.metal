// mt_metal_attention.metal -- scaled dot-product attention (contract: native/contracts/
// attention.md), a thread per chain owner: the forward and dq a query row each, dk and dv a key
// each, delta a row each. Each walks its pairs in the contract's order (key blocks ascending,
// then keys; or the group's query heads, then rows, ascending), recomputing scores where needed,
// so nothing of size Tq x Tk is stored. A masked pair (score -inf) takes part in nothing. No
// tiles and nothing shared between threads: the oracle's order.
#include "mt_metal_kernel.h"

#define MT_MTL_NEG_INF mt_bits_f32(0xff800000u)

// The score of query row i (head h, batch b; its D floats at qi) and key j (at kj): the chain
// over d, times scale, then the mask; -inf where masked (bool mask false, causal j > i).
static inline float mt_mtl_attn_score(device const float *qi, device const float *kj, device const uchar *mask,
                                      constant mt_mtl_attn_params &p, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (p.is_causal && j > i) return MT_MTL_NEG_INF;
    float c = 0.0f;
    for (int64_t d = 0; d < p.D; ++d) c = MT_DOT_STEP(qi[d], kj[d], c);
    float s = c * p.scale;
    const int64_t at = b * p.sb + h * p.sh + i * p.si + j * p.sj;
    if (p.mask_kind == MT_MTL_MASK_FLOAT) s = s + ((device const float *)mask)[at];
    else if (p.mask_kind == MT_MTL_MASK_BOOL && !mask[at]) s = MT_MTL_NEG_INF;
    return s;
}

// x after dropout for the live pair (b, h, i, j) (attention.md, "Dropout"); x itself without.
static inline float mt_mtl_attn_drop(float x, constant mt_mtl_attn_params &p, int64_t b, int64_t h, int64_t i,
                                     int64_t j) {
    if (p.dropout_p == 0.0f) return x;
    const uint64_t e = p.offset + (uint64_t)(((b * p.H + h) * p.Tq + i) * p.Tk + j);
    return mt_attn_drop(x, p.seed, p.stream, e, p.dropout_p, p.dropout_scale);
}

// Query row r = (b, h, i): the online softmax over key blocks ascending (a block without a live
// pair skipped), then out = acc / l and lse = m + log(l).
kernel void mt_k_attn_forward(device float *out [[buffer(0)]], device float *lse [[buffer(1)]],
                              device const float *q [[buffer(2)]], device const float *k [[buffer(3)]],
                              device const float *v [[buffer(4)]], device const uchar *mask [[buffer(5)]],
                              constant mt_mtl_attn_params &p [[buffer(6)]], MT_ID_GRID(t), MT_ID_GRID_SIZE(stride)) {
    const int64_t rows = p.B * p.H * p.Tq, D = p.D;
    for (int64_t r = t; r < rows; r += stride) {
        const int64_t i = r % p.Tq, bh = r / p.Tq, h = bh % p.H, b = bh / p.H;
        const int64_t kv = (b * p.Hkv + h / (p.H / p.Hkv)) * p.Tk * D;
        device const float *qi = q + r * D;
        float m = MT_MTL_NEG_INF, l = 0.0f, acc[MT_ATTN_MAX_D], s[MT_ATTN_KEY_BLOCK];
        for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
        for (int64_t j0 = 0; j0 < p.Tk && !(p.is_causal && j0 > i); j0 += MT_ATTN_KEY_BLOCK) {
            const int64_t nk = p.Tk - j0 < MT_ATTN_KEY_BLOCK ? p.Tk - j0 : MT_ATTN_KEY_BLOCK;
            float mb = MT_MTL_NEG_INF;
            uint64_t live = 0;      // bit jj: key j0 + jj is live
            for (int64_t jj = 0; jj < nk; ++jj) {
                s[jj] = mt_mtl_attn_score(qi, k + kv + (j0 + jj) * D, mask, p, b, h, i, j0 + jj);
                if (s[jj] != MT_MTL_NEG_INF) {
                    live |= (uint64_t)1 << jj;
                    mb = mt_attn_max(mb, s[jj]);
                }
            }
            if (!live) continue;
            const float mnew = mt_attn_max(m, mb), alpha = mt_expf(m - mnew);
            l = l * alpha;
            for (int64_t jj = 0; jj < nk; ++jj)
                if ((live >> jj) & 1) {
                    s[jj] = mt_expf(s[jj] - mnew);      // p_j
                    l = l + s[jj];
                }
            for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * alpha;
            for (int64_t jj = 0; jj < nk; ++jj) {
                if (!((live >> jj) & 1)) continue;
                const float pj = mt_mtl_attn_drop(s[jj], p, b, h, i, j0 + jj);
                device const float *vj = v + kv + (j0 + jj) * D;
                for (int64_t d = 0; d < D; ++d) acc[d] = MT_DOT_STEP(pj, vj[d], acc[d]);
            }
            m = mnew;
        }
        for (int64_t d = 0; d < D; ++d) out[r * D + d] = mt_attn_out(acc[d], l);
        if (p.has_lse) lse[r] = mt_attn_lse(m, l);
    }
}

// delta[r] = the chain over d of (dout[r, d], out[r, d]).
kernel void mt_k_attn_delta(device float *delta [[buffer(0)]], device const float *dout [[buffer(1)]],
                            device const float *out [[buffer(2)]], constant mt_mtl_attn_params &p [[buffer(3)]],
                            MT_ID_GRID(t), MT_ID_GRID_SIZE(stride)) {
    const int64_t rows = p.B * p.H * p.Tq;
    for (int64_t r = t; r < rows; r += stride) {
        float acc = 0.0f;
        for (int64_t d = 0; d < p.D; ++d) acc = MT_DOT_STEP(dout[r * p.D + d], out[r * p.D + d], acc);
        delta[r] = acc;
    }
}

// ds of the live pair (b, h, i, j) (s its score, lse_i, delta_i the row's): p * (dp - delta),
// dp the chain over d of (dout[i, d], v[j, d]) after dropout. *pd <- p after dropout (dv's).
static inline float mt_mtl_attn_pair_ds(float s, float lse_i, float delta_i, device const float *douti,
                                        device const float *vj, constant mt_mtl_attn_params &p, int64_t b, int64_t h,
                                        int64_t i, int64_t j, thread float *pd) {
    const float pij = mt_expf(s - lse_i);
    float dp = 0.0f;
    for (int64_t d = 0; d < p.D; ++d) dp = MT_DOT_STEP(douti[d], vj[d], dp);
    *pd = mt_mtl_attn_drop(pij, p, b, h, i, j);
    return mt_attn_ds(pij, mt_mtl_attn_drop(dp, p, b, h, i, j), delta_i);
}

// dq of query row r = (b, h, i): scale * (the chain over the live keys, ascending, of (ds, k)).
kernel void mt_k_attn_dq(device float *dq [[buffer(0)]], device const float *delta [[buffer(1)]],
                         device const float *q [[buffer(2)]], device const float *k [[buffer(3)]],
                         device const float *v [[buffer(4)]], device const float *dout [[buffer(5)]],
                         device const float *lse [[buffer(6)]], device const uchar *mask [[buffer(7)]],
                         constant mt_mtl_attn_params &p [[buffer(8)]], MT_ID_GRID(t), MT_ID_GRID_SIZE(stride)) {
    const int64_t rows = p.B * p.H * p.Tq, D = p.D;
    for (int64_t r = t; r < rows; r += stride) {
        const int64_t i = r % p.Tq, bh = r / p.Tq, h = bh % p.H, b = bh / p.H;
        const int64_t kv = (b * p.Hkv + h / (p.H / p.Hkv)) * p.Tk * D;
        float acc[MT_ATTN_MAX_D], pd;
        for (int64_t d = 0; d < D; ++d) acc[d] = 0.0f;
        const int64_t keys = p.is_causal && i + 1 < p.Tk ? i + 1 : p.Tk;   // causal: the later keys are masked
        for (int64_t j = 0; j < keys; ++j) {
            device const float *kj = k + kv + j * D;
            const float s = mt_mtl_attn_score(q + r * D, kj, mask, p, b, h, i, j);
            if (s == MT_MTL_NEG_INF) continue;
            const float ds = mt_mtl_attn_pair_ds(s, lse[r], delta[r], dout + r * D, v + kv + j * D, p, b, h, i, j, &pd);
            for (int64_t d = 0; d < D; ++d) acc[d] = MT_DOT_STEP(ds, kj[d], acc[d]);
        }
        for (int64_t d = 0; d < D; ++d) dq[r * D + d] = mt_canonical_nan(p.scale * acc[d]);
    }
}

// dk and dv of key e = (b, g, j): chains over the live pairs of the group's query heads in
// ascending order and, in each, its rows ascending (one chain across the heads); dk times
// scale once at the end.
kernel void mt_k_attn_dkv(device float *dk [[buffer(0)]], device float *dv [[buffer(1)]],
                          device const float *delta [[buffer(2)]], device const float *q [[buffer(3)]],
                          device const float *k [[buffer(4)]], device const float *v [[buffer(5)]],
                          device const float *dout [[buffer(6)]], device const float *lse [[buffer(7)]],
                          device const uchar *mask [[buffer(8)]], constant mt_mtl_attn_params &p [[buffer(9)]],
                          MT_ID_GRID(t), MT_ID_GRID_SIZE(stride)) {
    const int64_t keys = p.B * p.Hkv * p.Tk, D = p.D, group = p.H / p.Hkv;
    for (int64_t e = t; e < keys; e += stride) {
        const int64_t j = e % p.Tk, bg = e / p.Tk, g = bg % p.Hkv, b = bg / p.Hkv;
        device const float *kj = k + e * D, *vj = v + e * D;
        float ak[MT_ATTN_MAX_D], av[MT_ATTN_MAX_D], pd;
        for (int64_t d = 0; d < D; ++d) ak[d] = av[d] = 0.0f;
        for (int64_t h = g * group; h < (g + 1) * group; ++h)
            for (int64_t i = p.is_causal ? j : 0; i < p.Tq; ++i) {   // rows above j see no key here
                const int64_t r = (b * p.H + h) * p.Tq + i;
                const float s = mt_mtl_attn_score(q + r * D, kj, mask, p, b, h, i, j);
                if (s == MT_MTL_NEG_INF) continue;
                const float ds = mt_mtl_attn_pair_ds(s, lse[r], delta[r], dout + r * D, vj, p, b, h, i, j, &pd);
                for (int64_t d = 0; d < D; ++d) {
                    av[d] = MT_DOT_STEP(pd, dout[r * D + d], av[d]);
                    ak[d] = MT_DOT_STEP(ds, q[r * D + d], ak[d]);
                }
            }
        for (int64_t d = 0; d < D; ++d) {
            if (p.has_dk) dk[e * D + d] = mt_canonical_nan(p.scale * ak[d]);
            if (p.has_dv) dv[e * D + d] = mt_canonical_nan(av[d]);
        }
    }
}
