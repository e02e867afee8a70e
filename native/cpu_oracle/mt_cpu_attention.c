/* mt_cpu_attention.c -- scaled dot-product attention on the CPU oracle (contract: attention.md).
 *
 * Every entry checks its arguments (mt_check_attention_args, shared with the GPU vendors), then
 * refuses a NaN or infinity in any input, naming it, before any output is written (a pre-pass;
 * a float mask may hold -inf, lse may hold -inf), then computes:
 *   forward   jobs of (b, h, tile of QT query rows): key blocks of MT_ATTN_KEY_BLOCK in
 *             ascending order, each row's online-softmax step (m, l, acc), then out and lse;
 *   backward  delta per row; dk and dv in jobs of (b, kv head, key block), their chains running
 *             over the group's query heads and rows in ascending order; dq in jobs of (b, h,
 *             tile of query rows), its chains over the keys in ascending order. With at
 *             least two (b, kv head) items per thread, one fused job per (b, kv head) walks
 *             its key blocks in ascending order and feeds dq's chains as it goes (the same
 *             chains, the pairs computed once instead of twice).
 * Scores, p, dp and ds are recomputed where needed, so nothing of size Tq x Tk is stored; the
 * extra memory is delta (B*H*Tq floats) and per-thread stack tiles. Vector code runs several
 * independent chains side by side (keys of a block, columns of a row): each chain's own order
 * is the contract's, whatever the width. A refused call writes nothing; MT_ENOMEM may leave
 * outputs partly written (callers treat them as undefined).
 */
#include "mt_attention_args.h"
#include "mt_cpu.h"
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
#include "mt_pool.h"
#include <math.h>
#include <string.h>

uint64_t mt_attention_features(void) { return MT_FEATURE_ATTENTION; }

#define KB MT_ATTN_KEY_BLOCK
#define QT 64                      /* query rows of one tile */
#define MAXD MT_ATTN_MAX_D

/* The AVX-512 forms below run where the GEMM's kernel choice is AVX-512 (MOJO_TRAIN_CPU_GEMM can
 * force the portable ones, as for the GEMM). They are the same chains as the portable C, one
 * fused multiply-add a step per lane (ATTN_DOT: MT_DOT_STEP's vector form, the linear
 * sabotage's unfused step included); only the layout in registers differs. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(MT_NO_CLONES)
#include <immintrin.h>
#define ATTN_AVX512 1
#ifdef MT_SABOTAGE_LINEAR
#define ATTN_DOT(x, y, acc) _mm512_add_ps(_mm512_mul_ps((x), (y)), (acc))
#else
#define ATTN_DOT(x, y, acc) _mm512_fmadd_ps((x), (y), (acc))
#endif
static int use_avx512(void) {
    static int chosen = -1;                 /* the GEMM's choice is made once too */
    int c = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
    if (c < 0) __atomic_store_n(&chosen, c = !strcmp(mt_cpu_gemm_kernel(), "avx512"), __ATOMIC_RELAXED);
    return c;
}
#endif
#define NEG_INF (-INFINITY)

/* ---- scores of a tile of query rows against one key block ----------------------------------- */

/* kt[d*KB + jj] = x[jj*D + d] for the block's nk keys, +0 in the padding: one block transposed. */
static void transpose_block(float *restrict kt, const float *restrict x, int64_t nk, int64_t D) {
    for (int64_t d = 0; d < D; ++d) {
        float *row = kt + d * KB;
        for (int64_t jj = 0; jj < nk; ++jj) row[jj] = x[jj * D + d];
        for (int64_t jj = nk; jj < KB; ++jj) row[jj] = 0.0f;
    }
}

/* S[r*KB + jj] = chain over d of (x[r*D + d], kt[d][jj]) from +0.0, for the n rows of x and
 * every jj of the block: KB chains per row side by side, four rows sharing each load of kt. */
MT_SIMD static void tile_chains_c(float *restrict S, const float *restrict x, int64_t n, const float *restrict kt,
                                int64_t D) {
    int64_t r = 0;
    for (; r + 4 <= n; r += 4) {
        float c0[KB], c1[KB], c2[KB], c3[KB];
        const float *x0 = x + r * D, *x1 = x0 + D, *x2 = x1 + D, *x3 = x2 + D;
        for (int jj = 0; jj < KB; ++jj) c0[jj] = c1[jj] = c2[jj] = c3[jj] = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            const float *row = kt + d * KB, a0 = x0[d], a1 = x1[d], a2 = x2[d], a3 = x3[d];
            for (int jj = 0; jj < KB; ++jj) {
                c0[jj] = MT_DOT_STEP(a0, row[jj], c0[jj]);
                c1[jj] = MT_DOT_STEP(a1, row[jj], c1[jj]);
                c2[jj] = MT_DOT_STEP(a2, row[jj], c2[jj]);
                c3[jj] = MT_DOT_STEP(a3, row[jj], c3[jj]);
            }
        }
        float *s = S + r * KB;
        for (int jj = 0; jj < KB; ++jj) s[jj] = c0[jj], s[KB + jj] = c1[jj], s[2 * KB + jj] = c2[jj], s[3 * KB + jj] = c3[jj];
    }
    for (; r < n; ++r) {
        float c[KB];
        for (int jj = 0; jj < KB; ++jj) c[jj] = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
            const float xd = x[r * D + d], *row = kt + d * KB;
            for (int jj = 0; jj < KB; ++jj) c[jj] = MT_DOT_STEP(xd, row[jj], c[jj]);
        }
        for (int jj = 0; jj < KB; ++jj) S[r * KB + jj] = c[jj];
    }
}

#ifdef ATTN_AVX512
/* Four rows at a time (a short last group repeats its last row and stores only its own), the
 * block's 64 chains of each in four registers: 16 accumulators across the walk over d. */
__attribute__((target("avx512f"))) static void tile_chains_avx512(float *S, const float *x, int64_t n,
                                                                  const float *kt, int64_t D) {
    for (int64_t r = 0; r < n; r += 4) {
        const float *x0 = x + r * D, *x1 = x + (r + 1 < n ? r + 1 : r) * D;
        const float *x2 = x + (r + 2 < n ? r + 2 : r) * D, *x3 = x + (r + 3 < n ? r + 3 : r) * D;
        __m512 c[4][4];
        for (int u = 0; u < 4; ++u)
            for (int v = 0; v < 4; ++v) c[u][v] = _mm512_setzero_ps();
        for (int64_t d = 0; d < D; ++d) {
            const float *row = kt + d * KB;
            const __m512 k0 = _mm512_loadu_ps(row), k1 = _mm512_loadu_ps(row + 16);
            const __m512 k2 = _mm512_loadu_ps(row + 32), k3 = _mm512_loadu_ps(row + 48);
            const __m512 a[4] = {_mm512_set1_ps(x0[d]), _mm512_set1_ps(x1[d]), _mm512_set1_ps(x2[d]),
                                 _mm512_set1_ps(x3[d])};
            for (int u = 0; u < 4; ++u) {
                c[u][0] = ATTN_DOT(a[u], k0, c[u][0]);
                c[u][1] = ATTN_DOT(a[u], k1, c[u][1]);
                c[u][2] = ATTN_DOT(a[u], k2, c[u][2]);
                c[u][3] = ATTN_DOT(a[u], k3, c[u][3]);
            }
        }
        for (int u = 0; u < 4 && r + u < n; ++u)
            for (int v = 0; v < 4; ++v) _mm512_storeu_ps(S + (r + u) * KB + 16 * v, c[u][v]);
    }
}
#endif

static void tile_chains(float *S, const float *x, int64_t n, const float *kt, int64_t D) {
#ifdef ATTN_AVX512
    if (use_avx512()) {
        tile_chains_avx512(S, x, n, kt, D);
        return;
    }
#endif
    tile_chains_c(S, x, n, kt, D);
}

/* The largest live score of a block (mt_attn_max: NaN greatest; padding and masked pairs are
 * -inf). Exact, so any order gives it, up to the sign of a zero maximum, which no output
 * depends on (attention.md). */
MT_SIMD static float block_max_c(const float *restrict s) {
    float mx[16];
    int nan = 0;
    for (int u = 0; u < 16; ++u) mx[u] = NEG_INF;
    for (int c = 0; c < KB; c += 16)
        for (int u = 0; u < 16; ++u) {
            float x = s[c + u];
            mx[u] = x > mx[u] ? x : mx[u];
            nan |= x != x;
        }
    float m = NEG_INF;
    for (int u = 0; u < 16; ++u) m = mt_attn_max(m, mx[u]);
    return nan ? NAN : m;
}

#ifdef ATTN_AVX512
__attribute__((target("avx512f"))) static float block_max_avx512(const float *s) {
    const __m512 a = _mm512_loadu_ps(s), b = _mm512_loadu_ps(s + 16);
    const __m512 c = _mm512_loadu_ps(s + 32), d = _mm512_loadu_ps(s + 48);
    if (_mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q)) return NAN;
    return _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(a, b), _mm512_max_ps(c, d)));
}
#endif

static float block_max(const float *s) {
#ifdef ATTN_AVX512
    if (use_avx512()) return block_max_avx512(s);
#endif
    return block_max_c(s);
}

/* The scores of query row i (head h of batch b) against keys j0 .. j0+nk-1: chain * scale, then
 * the mask; -inf for masked pairs and the padding. Returns whether any pair is live. */
MT_SIMD static int row_scores(float *restrict s, const mt_attn_args *a, int64_t b, int64_t h, int64_t i, int64_t j0,
                      int64_t nk) {
    for (int jj = 0; jj < KB; ++jj) s[jj] = s[jj] * a->scale;
    int64_t base = b * a->sb + h * a->sh + i * a->si + j0 * a->sj;
    if (a->mask_kind == MT_ATTENTION_MASK_FLOAT) {
        const float *m = (const float *)a->mask + base;
        for (int64_t jj = 0; jj < nk; ++jj) s[jj] = s[jj] + m[jj * a->sj];
    } else if (a->mask_kind == MT_ATTENTION_MASK_BOOL) {
        const uint8_t *m = (const uint8_t *)a->mask + base;
        for (int64_t jj = 0; jj < nk; ++jj)
            if (!m[jj * a->sj]) s[jj] = NEG_INF;
    }
    int64_t end = nk;
    if (a->is_causal && i - j0 + 1 < end) end = i - j0 + 1 < 0 ? 0 : i - j0 + 1;
    for (int64_t jj = end; jj < KB; ++jj) s[jj] = NEG_INF;
    int live = 0;
    for (int jj = 0; jj < KB; ++jj) live |= s[jj] != NEG_INF;
    return live;
}

/* Dropout (attention.md, "Dropout"): x[jj] of the live pairs of query row i against keys j0 ..
 * j0+nk-1, after dropout (kept: x * dropout_scale, dropped: +0); masked pairs keep theirs (they
 * take part in nothing). Nothing without dropout. */
static void drop_row(float *x, const float *s, const mt_attn_args *a, int64_t b, int64_t h, int64_t i, int64_t j0,
                     int64_t nk) {
    if (a->dropout_p == 0.0f) return;
    for (int64_t jj = 0; jj < nk; ++jj)
        if (s[jj] != NEG_INF)
            x[jj] = mt_attn_drop(x[jj], a->seed, a->stream, MT_ATTN_PAIR_ELEMENT(*a, b, h, i, j0 + jj), a->dropout_p,
                                 a->dropout_scale);
}

/* p[jj] = e^(s[jj] - m) for live pairs, +0 for masked ones: mt_expf, or mt_expf_mid (the same
 * bits) when every live argument lies in its range. */
MT_SIMD static void block_exps(float *restrict p, const float *restrict s, float m) {
    int mid = 1;
    for (int jj = 0; jj < KB; ++jj) {
        float x = s[jj] - m;
        mid &= (s[jj] == NEG_INF) | ((x >= MT_EXPF_MID_LO) & (x <= MT_EXPF_MID_HI));
    }
    if (mid) {
        for (int jj = 0; jj < KB; ++jj) {
            float x = s[jj] - m;
            float e = mt_expf_mid(x >= MT_EXPF_MID_LO && x <= MT_EXPF_MID_HI ? x : 0.0f);
            p[jj] = s[jj] == NEG_INF ? 0.0f : e;
        }
    } else {
        for (int jj = 0; jj < KB; ++jj) {
            float e = mt_expf(s[jj] - m);
            p[jj] = s[jj] == NEG_INF ? 0.0f : e;
        }
    }
}

/* acc[d] = fma(c[t*cs], x[t*D + d], acc[d]) for t = 0 .. n-1 in ascending order, skipping the
 * terms whose score s[t*cs] is -inf (masked): D chains side by side, continued from acc. The
 * AVX-512 form holds 64 columns in registers for the whole walk over t; the portable form
 * updates acc in memory. Both are the same chains, one fused multiply-add a step (MT_DOT_STEP;
 * the linear sabotage's unfused step too). */
MT_SIMD static void chain_rows_c(float *restrict acc, const float *restrict c, const float *restrict s, int64_t cs,
                                 const float *restrict x, int64_t n, int64_t D) {
    for (int64_t t = 0; t < n; ++t) {
        if (s[t * cs] == NEG_INF) continue;
        const float ct = c[t * cs], *xr = x + t * D;
        for (int64_t d = 0; d < D; ++d) acc[d] = MT_DOT_STEP(ct, xr[d], acc[d]);
    }
}

#ifdef ATTN_AVX512
/* The lane masks of columns d0 .. d0+63 of D, four groups of 16: the columns past D off. */
static inline void column_masks(__mmask16 m[4], int64_t D, int64_t d0) {
    for (int u = 0; u < 4; ++u) {
        int64_t left = D - d0 - 16 * u;
        m[u] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? (__mmask16)0 : (__mmask16)((1u << left) - 1u);
    }
}

__attribute__((target("avx512f"))) static void chain_rows_avx512(float *acc, const float *c, const float *s,
                                                                 int64_t cs, const float *x, int64_t n, int64_t D) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        __mmask16 m[4];
        column_masks(m, D, d0);
        float *a = acc + d0;
        __m512 r0 = _mm512_maskz_loadu_ps(m[0], a), r1 = _mm512_maskz_loadu_ps(m[1], a + 16);
        __m512 r2 = _mm512_maskz_loadu_ps(m[2], a + 32), r3 = _mm512_maskz_loadu_ps(m[3], a + 48);
        for (int64_t t = 0; t < n; ++t) {
            if (s[t * cs] == NEG_INF) continue;
            const __m512 ct = _mm512_set1_ps(c[t * cs]);
            const float *xr = x + t * D + d0;
            r0 = ATTN_DOT(ct, _mm512_maskz_loadu_ps(m[0], xr), r0);
            r1 = ATTN_DOT(ct, _mm512_maskz_loadu_ps(m[1], xr + 16), r1);
            r2 = ATTN_DOT(ct, _mm512_maskz_loadu_ps(m[2], xr + 32), r2);
            r3 = ATTN_DOT(ct, _mm512_maskz_loadu_ps(m[3], xr + 48), r3);
        }
        _mm512_mask_storeu_ps(a, m[0], r0);
        _mm512_mask_storeu_ps(a + 16, m[1], r1);
        _mm512_mask_storeu_ps(a + 32, m[2], r2);
        _mm512_mask_storeu_ps(a + 48, m[3], r3);
    }
}
#endif

#ifdef ATTN_AVX512
/* Two sets of chains over the same x rows (two output rows, or two keys): 8 accumulators in
 * flight instead of 4, each x load serving both. */
__attribute__((target("avx512f"))) static void chain_pair_avx512(float *acc0, float *acc1, const float *c0,
                                                                 const float *c1, const float *s0, const float *s1,
                                                                 int64_t cs, const float *x, int64_t n, int64_t D) {
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
        __mmask16 m[4];
        column_masks(m, D, d0);
        float *a = acc0 + d0, *b = acc1 + d0;
        __m512 r[4], q[4];
        for (int u = 0; u < 4; ++u) r[u] = _mm512_maskz_loadu_ps(m[u], a + 16 * u), q[u] = _mm512_maskz_loadu_ps(m[u], b + 16 * u);
        for (int64_t t = 0; t < n; ++t) {
            const float *xr = x + t * D + d0;
            const __m512 x0 = _mm512_maskz_loadu_ps(m[0], xr), x1 = _mm512_maskz_loadu_ps(m[1], xr + 16);
            const __m512 x2 = _mm512_maskz_loadu_ps(m[2], xr + 32), x3 = _mm512_maskz_loadu_ps(m[3], xr + 48);
            if (s0[t * cs] != NEG_INF) {
                const __m512 ct = _mm512_set1_ps(c0[t * cs]);
                r[0] = ATTN_DOT(ct, x0, r[0]), r[1] = ATTN_DOT(ct, x1, r[1]);
                r[2] = ATTN_DOT(ct, x2, r[2]), r[3] = ATTN_DOT(ct, x3, r[3]);
            }
            if (s1[t * cs] != NEG_INF) {
                const __m512 ct = _mm512_set1_ps(c1[t * cs]);
                q[0] = ATTN_DOT(ct, x0, q[0]), q[1] = ATTN_DOT(ct, x1, q[1]);
                q[2] = ATTN_DOT(ct, x2, q[2]), q[3] = ATTN_DOT(ct, x3, q[3]);
            }
        }
        for (int u = 0; u < 4; ++u) _mm512_mask_storeu_ps(a + 16 * u, m[u], r[u]), _mm512_mask_storeu_ps(b + 16 * u, m[u], q[u]);
    }
}
#endif

static void chain_rows(float *acc, const float *c, const float *s, int64_t cs, const float *x, int64_t n, int64_t D) {
#ifdef ATTN_AVX512
    if (use_avx512()) {
        chain_rows_avx512(acc, c, s, cs, x, n, D);
        return;
    }
#endif
    chain_rows_c(acc, c, s, cs, x, n, D);
}

/* chain_rows for pairs of chain sets: set p takes acc + p*acc_step, c + p*c_step, s + p*c_step,
 * for p = 0 .. count-1, each the chain_rows of its own (two at a time where AVX-512 runs). */
static void chain_sets(float *acc, int64_t acc_step, const float *c, const float *s, int64_t c_step, int64_t cs,
                       const float *x, int64_t n, int64_t D, int64_t count) {
    int64_t p = 0;
#ifdef ATTN_AVX512
    if (use_avx512())
        for (; p + 2 <= count; p += 2)
            chain_pair_avx512(acc + p * acc_step, acc + (p + 1) * acc_step, c + p * c_step, c + (p + 1) * c_step,
                              s + p * c_step, s + (p + 1) * c_step, cs, x, n, D);
#endif
    for (; p < count; ++p) chain_rows(acc + p * acc_step, c + p * c_step, s + p * c_step, cs, x, n, D);
}

/* The serial chain over d of (x[d], y[d]) from +0.0 (delta). */
MT_SIMD static float dot_chain(const float *x, const float *y, int64_t D) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc = MT_DOT_STEP(x[d], y[d], acc);
    return acc;
}

/* ---- where things are ------------------------------------------------------------------------ */

typedef struct {
    const mt_attn_args *a;
    int64_t tiles;      /* query tiles per (b, h) */
    int64_t blocks;     /* key blocks per (b, kv head) */
    float *delta;       /* (B*H*Tq), the backward's */
} attn_job;

static int64_t q_row(const mt_attn_args *a, int64_t b, int64_t h, int64_t i) { return (b * a->H + h) * a->Tq + i; }
static int64_t kv_base(const mt_attn_args *a, int64_t b, int64_t h) {
    return (b * a->Hkv + h / (a->H / a->Hkv)) * a->Tk * a->D;
}

static int64_t min64(int64_t x, int64_t y) { return x < y ? x : y; }

/* Key blocks a tile of rows i0 .. i0+n-1 reaches: all of them, or under is_causal those up to
 * the last row's diagonal (the rest hold no live pair). */
static int64_t blocks_for(const attn_job *J, int64_t i0, int64_t n) {
    if (!J->a->is_causal) return J->blocks;
    return min64(J->blocks, (i0 + n - 1) / KB + 1);
}

/* ---- forward --------------------------------------------------------------------------------- */

typedef struct { float m[QT], l[QT], alpha[QT]; int live[QT]; float acc[QT * MAXD]; } fwd_state;

/* One key block for every row of the tile: the online-softmax step of attention.md. */
MT_SIMD static void fwd_block(fwd_state *st, float *S, float *P, const float *q, const float *kt, const float *vb,
                      const mt_attn_args *a, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t j0, int64_t nk) {
    int64_t D = a->D;
    tile_chains(S, q, n, kt, D);
    for (int64_t r = 0; r < n; ++r) {
        float *s = S + r * KB;
        st->live[r] = row_scores(s, a, b, h, i0 + r, j0, nk);
        st->alpha[r] = 1.0f;
        if (!st->live[r]) { memset(P + r * KB, 0, KB * sizeof(float)); continue; }
        float mnew = mt_attn_max(st->m[r], block_max(s));
        st->alpha[r] = mt_expf(st->m[r] - mnew);
        st->m[r] = mnew;
        block_exps(P + r * KB, s, mnew);
    }
    /* l = l * alpha, then + p_j in ascending j (masked p = +0 changes nothing; a row without a
     * live pair keeps l: alpha 1, every p +0); the rows' chains side by side. */
    for (int64_t r = 0; r < n; ++r) st->l[r] = st->l[r] * st->alpha[r];
    for (int jj = 0; jj < KB; ++jj)
        for (int64_t r = 0; r < n; ++r) st->l[r] = st->l[r] + P[r * KB + jj];
    for (int64_t r = 0; r < n; ++r) {          /* a row without a live pair: alpha 1, exact */
        float *acc = st->acc + r * D;
        for (int64_t d = 0; d < D; ++d) acc[d] = acc[d] * st->alpha[r];
        if (st->live[r]) drop_row(P + r * KB, S + r * KB, a, b, h, i0 + r, j0, nk);   /* the acc chains' p */
    }
    chain_sets(st->acc, D, P, S, KB, 1, vb, nk, D, n);   /* every term of a dead row is skipped */
}

static void fwd_tile(const attn_job *J, int64_t b, int64_t h, int64_t i0, int64_t n) {
    const mt_attn_args *a = J->a;
    int64_t D = a->D, row0 = q_row(a, b, h, i0);
    const float *q = a->q + row0 * D, *k = a->k + kv_base(a, b, h), *v = a->v + kv_base(a, b, h);
    fwd_state st;
    float kt[MAXD * KB], S[QT * KB], P[QT * KB];
    for (int64_t r = 0; r < n; ++r) { st.m[r] = NEG_INF; st.l[r] = 0.0f; }
    memset(st.acc, 0, (size_t)(n * D) * sizeof(float));
    for (int64_t kb = 0, nb = blocks_for(J, i0, n); kb < nb; ++kb) {
        int64_t j0 = kb * KB, nk = min64(KB, a->Tk - j0);
        transpose_block(kt, k + j0 * D, nk, D);
        fwd_block(&st, S, P, q, kt, v + j0 * D, a, b, h, i0, n, j0, nk);
    }
    for (int64_t r = 0; r < n; ++r) {
        float *o = a->out + (row0 + r) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = mt_attn_out(st.acc[r * D + d], st.l[r]);
        if (a->lse) a->lse[row0 + r] = mt_attn_lse(st.m[r], st.l[r]);
    }
}

static void fwd_range(void *ctx, int64_t begin, int64_t end) {
    const attn_job *J = (const attn_job *)ctx;
    for (int64_t item = begin; item < end; ++item) {
        int64_t bh = item / J->tiles, i0 = (item % J->tiles) * QT;
        fwd_tile(J, bh / J->a->H, bh % J->a->H, i0, min64(QT, J->a->Tq - i0));
    }
}

/* ---- backward -------------------------------------------------------------------------------- */

/* The backward's per-pair values of a tile against one key block: S (scores), P, and dS;
 * returns whether any pair of the tile is live. dout rows, q rows: the tile's. */
MT_SIMD static int bwd_block(float *S, float *P, float *dS, const float *q, const float *dout, const float *kt,
                     const float *vt, const attn_job *J, int64_t b, int64_t h, int64_t i0, int64_t n, int64_t j0,
                     int64_t nk) {
    const mt_attn_args *a = J->a;
    int64_t D = a->D, row0 = q_row(a, b, h, i0);
    int any = 0;
    tile_chains(S, q, n, kt, D);
    tile_chains(dS, dout, n, vt, D);                      /* dp, made ds below */
    for (int64_t r = 0; r < n; ++r) {
        float *s = S + r * KB, *p = P + r * KB, *ds = dS + r * KB;
        if (!row_scores(s, a, b, h, i0 + r, j0, nk)) continue;
        any = 1;
        block_exps(p, s, a->lse_in[row0 + r]);
        float delta = J->delta[row0 + r];
        drop_row(ds, s, a, b, h, i0 + r, j0, nk);        /* dp after dropout */
        for (int jj = 0; jj < KB; ++jj) ds[jj] = mt_attn_ds(p[jj], ds[jj], delta);
        drop_row(p, s, a, b, h, i0 + r, j0, nk);         /* dv's chains take p after dropout */
    }
    return any;
}

static void delta_range(void *ctx, int64_t begin, int64_t end) {
    const attn_job *J = (const attn_job *)ctx;
    int64_t D = J->a->D;
    for (int64_t row = begin; row < end; ++row)
        J->delta[row] = dot_chain(J->a->dout + row * D, J->a->out_in + row * D, D);
}

/* dk and dv of one key block of kv head g: chains over (query head of the group, row) in
 * ascending order; dk's chain is multiplied by scale once at the end. With dq_too, each row's
 * dq chain (held unscaled in dq) takes this block's keys too: called for the blocks in
 * ascending order, that is dq's chain over the keys. */
static void dkv_block(const attn_job *J, int64_t b, int64_t g, int64_t kb, int dq_too) {
    const mt_attn_args *a = J->a;
    int64_t D = a->D, group = a->H / a->Hkv, j0 = kb * KB, nk = min64(KB, a->Tk - j0);
    int64_t kv0 = ((b * a->Hkv + g) * a->Tk + j0) * D;
    float kt[MAXD * KB], vt[MAXD * KB], S[QT * KB], P[QT * KB], dS[QT * KB];
    float *dk = a->dk ? a->dk + kv0 : NULL, *dv = a->dv ? a->dv + kv0 : NULL;
    if (dk) memset(dk, 0, (size_t)(nk * D) * sizeof(float));
    if (dv) memset(dv, 0, (size_t)(nk * D) * sizeof(float));
    transpose_block(kt, a->k + kv0, nk, D);
    transpose_block(vt, a->v + kv0, nk, D);
    for (int64_t h = g * group; h < (g + 1) * group; ++h) {
        for (int64_t i0 = a->is_causal ? j0 : 0; i0 < a->Tq; i0 += QT) {   /* rows above j0 see no key here */
            int64_t n = min64(QT, a->Tq - i0), row0 = q_row(a, b, h, i0);
            const float *q = a->q + row0 * D, *dout = a->dout + row0 * D;
            if (!bwd_block(S, P, dS, q, dout, kt, vt, J, b, h, i0, n, j0, nk)) continue;
            if (dv) chain_sets(dv, D, P, S, 1, KB, dout, n, D, nk);
            if (dk) chain_sets(dk, D, dS, S, 1, KB, q, n, D, nk);
            if (dq_too) chain_sets(a->dq + row0 * D, D, dS, S, KB, 1, a->k + kv0, nk, D, n);
        }
    }
    for (int64_t x = 0; x < nk * D; ++x) {
        if (dk) dk[x] = mt_canonical_nan(a->scale * dk[x]);
        if (dv) dv[x] = mt_canonical_nan(dv[x]);
    }
}

static void dkv_range(void *ctx, int64_t begin, int64_t end) {
    const attn_job *J = (const attn_job *)ctx;
    for (int64_t item = begin; item < end; ++item) {
        int64_t bg = item / J->blocks;
        dkv_block(J, bg / J->a->Hkv, bg % J->a->Hkv, item % J->blocks, 0);
    }
}

/* Everything of kv head g of batch b in one pass: its key blocks in ascending order, each
 * adding its keys to the dq chains of the group's rows, so no pair is computed twice. Used
 * when there are enough (b, g) items to share out; the bits are the two passes'. */
static void fused_range(void *ctx, int64_t begin, int64_t end) {
    const attn_job *J = (const attn_job *)ctx;
    const mt_attn_args *a = J->a;
    int64_t n = (a->H / a->Hkv) * a->Tq * a->D;  /* the group's heads are consecutive in dq */
    for (int64_t bg = begin; bg < end; ++bg) {
        float *dq = a->dq + bg * n;
        memset(dq, 0, (size_t)n * sizeof(float));
        for (int64_t kb = 0; kb < J->blocks; ++kb) dkv_block(J, bg / a->Hkv, bg % a->Hkv, kb, 1);
        for (int64_t x = 0; x < n; ++x) dq[x] = mt_canonical_nan(a->scale * dq[x]);
    }
}

/* dq of a tile of rows: chains over the keys in ascending order, times scale at the end. */
static void dq_tile(const attn_job *J, int64_t b, int64_t h, int64_t i0, int64_t n) {
    const mt_attn_args *a = J->a;
    int64_t D = a->D, row0 = q_row(a, b, h, i0);
    const float *q = a->q + row0 * D, *dout = a->dout + row0 * D;
    const float *k = a->k + kv_base(a, b, h), *v = a->v + kv_base(a, b, h);
    float kt[MAXD * KB], vt[MAXD * KB], S[QT * KB], P[QT * KB], dS[QT * KB], acc[QT * MAXD];
    memset(acc, 0, (size_t)(n * D) * sizeof(float));
    for (int64_t kb = 0, nb = blocks_for(J, i0, n); kb < nb; ++kb) {
        int64_t j0 = kb * KB, nk = min64(KB, a->Tk - j0);
        transpose_block(kt, k + j0 * D, nk, D);
        transpose_block(vt, v + j0 * D, nk, D);
        if (!bwd_block(S, P, dS, q, dout, kt, vt, J, b, h, i0, n, j0, nk)) continue;
        chain_sets(acc, D, dS, S, KB, 1, k + j0 * D, nk, D, n);
    }
    float *dq = a->dq + row0 * D;
    for (int64_t x = 0; x < n * D; ++x) dq[x] = mt_canonical_nan(a->scale * acc[x]);
}

static void dq_range(void *ctx, int64_t begin, int64_t end) {
    const attn_job *J = (const attn_job *)ctx;
    for (int64_t item = begin; item < end; ++item) {
        int64_t bh = item / J->tiles, i0 = (item % J->tiles) * QT;
        dq_tile(J, bh / J->a->H, bh % J->a->H, i0, min64(QT, J->a->Tq - i0));
    }
}

/* ---- the pre-pass and the entries ------------------------------------------------------------- */

/* The pool's measure of a pass (pairs times D, capped: it only decides inline or parallel). */
static int64_t attn_work(const mt_attn_args *a) {
    int64_t pairs = mt_attn_rows(a) * a->Tk;
    return (pairs < ((int64_t)1 << 50) ? pairs : ((int64_t)1 << 50)) * a->D;
}

static attn_job job_of(const mt_attn_args *a) {
    attn_job J = {a, (a->Tq + QT - 1) / QT, (a->Tk + KB - 1) / KB, NULL};
    return J;
}

MT_NOINLINE static int attn_forward_body(const mt_attn_args *a) {
    int rc = mt_check_attention_args(a, 0);   /* first: the counts below are products of checked sizes */
    if (rc) return rc;
    int64_t nq = mt_attn_q_elems(a), nkv = mt_attn_kv_elems(a);
    if ((rc = mt_cpu_refuse_nonfinite(a->q, nq, "q")) ||
        (rc = mt_cpu_refuse_nonfinite(a->k, nkv, "k")) || (rc = mt_cpu_refuse_nonfinite(a->v, nkv, "v")))
        return rc;
    if (mt_attn_float_mask_bad(a)) return mt_fail_attention_mask();
    attn_job J = job_of(a);
    mt_parallel_for_work(a->B * a->H * J.tiles, 1, 2 * attn_work(a), fwd_range, &J);
    return MT_OK;
}

MT_NOINLINE static int attn_backward_body(const mt_attn_args *a) {
    int rc = mt_check_attention_args(a, 1);   /* first: the counts below are products of checked sizes */
    if (rc) return rc;
    int64_t nq = mt_attn_q_elems(a), nkv = mt_attn_kv_elems(a), rows = mt_attn_rows(a);
    if ((rc = mt_cpu_refuse_nonfinite(a->dout, nq, "dout")) ||
        (rc = mt_cpu_refuse_nonfinite(a->q, nq, "q")) || (rc = mt_cpu_refuse_nonfinite(a->k, nkv, "k")) ||
        (rc = mt_cpu_refuse_nonfinite(a->v, nkv, "v")) || (rc = mt_cpu_refuse_nonfinite(a->out_in, nq, "out")))
        return rc;
    if (rows && mt_attn_lse_bad(a->lse_in, rows)) return mt_fail_attention_lse();
    if (mt_attn_float_mask_bad(a)) return mt_fail_attention_mask();
    attn_job J = job_of(a);
    int64_t bytes = rows * (int64_t)sizeof(float);
    if (bytes && (a->dq || a->dk || a->dv)) {
        if (!(J.delta = (float *)mt_scratch_alloc(bytes, "attention row deltas"))) return MT_ENOMEM;
        mt_parallel_for_work(rows, 1, rows * a->D, delta_range, &J);
    }
    int64_t groups = a->B * a->Hkv;
    if (J.delta && a->dq && groups >= 2 * (int64_t)mt_pool_threads()) {   /* enough items: one pass */
        mt_parallel_for_work(groups, 1, 5 * attn_work(a), fused_range, &J);
        mt_scratch_free(J.delta, bytes);
        return MT_OK;
    }
    if (a->dk || a->dv) {
        if (J.delta) mt_parallel_for_work(groups * J.blocks, 1, 4 * attn_work(a), dkv_range, &J);
        else {   /* no query rows: every chain is empty */
            for (int64_t x = 0; x < nkv; ++x) {
                if (a->dk) a->dk[x] = a->scale * 0.0f;
                if (a->dv) a->dv[x] = 0.0f;
            }
        }
    }
    if (a->dq && J.delta) mt_parallel_for_work(a->B * a->H * J.tiles, 1, 3 * attn_work(a), dq_range, &J);
    mt_scratch_free(J.delta, J.delta ? bytes : 0);
    return MT_OK;
}

int mt_attention_run(const mt_attn_args *a, int backward) {
    MT_RETURN_IN_FP_ENV(backward ? attn_backward_body(a) : attn_forward_body(a));
}
