/* mt_gpu_attention_kernels.cuh -- the kernels of attention on a GPU (contract:
 * native/contracts/attention.md, "A flash-style GPU kernel") and the order they are enqueued in.
 * Host glue (staging, refusals) is mt_gpu_attention.cu's; this file holds only what runs on the
 * device and the launch plan, so tests/c/attn_gpu_emulate.cc compiles the very same kernels as
 * C++ on CPU threads and compares their bytes with the oracle's.
 *
 * Every block has 256 threads, tid = 16*ty + tx. A tile pairs 64 rows of one kind ("own" rows:
 * query rows in the forward and dq kernels, keys in the dk/dv kernel) with 64 of the other;
 * thread (ty, tx) owns rows 4*ty .. 4*ty+3 and the other rows tx, tx+16, tx+32, tx+48. Tiles of
 * (rows, D) sit in shared memory row-major with a padded stride (DS), so the chains over d load
 * four consecutive d at once; a tile of per-pair values (p or ds) sits with the own rows
 * contiguous, so the chains over pairs load four own rows at once. (The forward built with
 * MT_ATTN_FWD_ROWS=8, an A/B variant: 128 own rows a tile at D <= 64, rows 8*ty .. 8*ty+7.)
 *
 * Every chain is serial in the thread that owns its output, in the contract's order:
 *   scores, dp   over d ascending (16 chains of a thread side by side; 32 with MT_ATTN_FWD_ROWS=8);
 *   out (acc)    over the keys of a block ascending, continued across blocks in ascending order;
 *   l            the same, summed by one thread per row (threads 0-63; 0-127 with MT_ATTN_FWD_ROWS=8);
 *   dq           over the keys ascending (key blocks in ascending order): in the dq kernel, or
 *                carried from key block to key block by the dk/dv kernel's relay (relay_dq);
 *   dk, dv       over (query head of the group, query row) ascending.
 * A masked pair's value is stored as the bit pattern MASKED (a NaN no arithmetic writes: live
 * NaNs are canonical), and a chain step of a tile holding any masked pair is a select on it, so
 * a masked pair takes part in nothing; tiles without one run plain fmas. The row maximum is
 * exact (mt_attn_max), taken by a butterfly over the 16 threads sharing a row. No atomic
 * arithmetic on floats: the relay's block counter and per-tile words are its only atomics.
 */
#ifndef MT_GPU_ATTENTION_KERNELS_CUH
#define MT_GPU_ATTENTION_KERNELS_CUH

#include <stddef.h>
#include <stdint.h>
#if defined(__CUDACC__) || defined(__HIPCC__)
#include "mt_gpu.h"          /* the runtime header (HIP needs it before mt_pinned.h) */
#endif
#include "mojo_train.h"
#include "mt_attention_args.h"
#include "mt_pinned.h"

/* A butterfly step among 32 lanes (HIP: a 32-wide segment of the wave, as mt_gpu.h's shuffles). */
#ifndef MT_ATTN_SHFL_XOR
#if defined(__HIPCC__) || defined(MT_HIP)
#define MT_ATTN_SHFL_XOR(v, x) __shfl_xor((v), (x), 32)
#else
#define MT_ATTN_SHFL_XOR(v, x) __shfl_xor_sync(0xffffffffu, (v), (x), 32)
#endif
#endif

#ifndef MT_ATTN_SMEM_DECL
#define MT_ATTN_SMEM_DECL(name) extern __shared__ __align__(16) float name[]
#endif

#include "mt_gpu_attention_relay.cuh"   /* mt_attn_dev, the dq relay's handoffs, the flags */

namespace mt_attn {

constexpr int NT = 256;              /* threads of a block */
constexpr int TR = 64;               /* rows of a tile, either kind (= MT_ATTN_KEY_BLOCK) */
constexpr int PS = TR + 4;           /* stride of a per-pair tile */
constexpr uint32_t MASKED = 0xffffffffu;

static_assert(TR == MT_ATTN_KEY_BLOCK, "the forward's key block is the tile");

/* The padded row stride of a (rows, D) tile: NCG groups of 64 columns. */
template <int NCG>
struct geom {
    static constexpr int DS = 64 * NCG + 4;
};

/* The stride of a per-pair tile whose own rows are a block's 16 * R (R own rows a thread). */
template <int R>
struct pair_tile {
    static constexpr int stride = 16 * R + 4;
};
static_assert(pair_tile<4>::stride == PS, "four own rows a thread: the tiles of TR rows");

/* Own rows a thread of the forward: 4 (query tiles of TR rows, the backward's shape) or 8 (tiles
 * of 2 * TR query rows, each key block's K and V tiles read by twice the rows; D <= 64 only, its
 * shared memory above 227 KiB at D = 128). Every chain is the same either way: the choice moves
 * no bit (tests/test_attention_emulated.py runs both). MT_ATTN_FWD_ROWS: the A/B's switch. 8
 * measured slower on an H100 (thirty-seventh session: forward 0.64 -> 0.84 ms at B=8 H=12
 * T=1024, 2.07 -> 2.26 ms at T=4096; the same bits, cards and tests passed): one block of 8
 * warps an SM at 255 registers does not hide what two blocks of 8 did. Kept as a switch for
 * another architecture's A/B. */
#ifndef MT_ATTN_FWD_ROWS
#define MT_ATTN_FWD_ROWS 4
#endif
static_assert(MT_ATTN_FWD_ROWS == 4 || MT_ATTN_FWD_ROWS == 8, "MT_ATTN_FWD_ROWS is 4 or 8");
template <int NCG>
struct fwd_shape {
    static constexpr int R = NCG == 1 ? MT_ATTN_FWD_ROWS : 4;   /* own rows a thread */
    static constexpr int QR = 16 * R;                            /* query rows a block */
};

__device__ __forceinline__ bool live_bits(float x) { return __float_as_uint(x) != MASKED; }
__device__ __forceinline__ float masked_value() { return __uint_as_float(MASKED); }

/* Rows [r0, r0 + n) of a (rows, D) tensor into a tile of stride DS (rows past n untouched). The
 * thread's elements are e = tid + k*NT of the rows' n*D floats, or of their n*D/4 float4 groups
 * where D is a multiple of 4 and the tensor 16-byte aligned (then every row starts aligned): one
 * division for the thread's first (row, column), then each next one by carrying NT's quotient
 * and remainder (a division per element was a fifth of a key block's instructions). ASYNC: the
 * groups are cp.async copies (mt_gpu.h), visible after mt_cp_async_wait and a barrier; the
 * single floats are copied at once either way. */
template <bool ASYNC = false>
__device__ __forceinline__ void load_rows(float *tile, int DS, const float *src, int64_t r0, int n, int D) {
    const bool groups = (D & 3) == 0 && ((uintptr_t)src & 15) == 0;
    const int W = groups ? D >> 2 : D, total = n * W, step_r = NT / W, step_c = NT - step_r * W;
    int e = threadIdx.x, r = e / W, c = e - r * W;
    if (groups) {
        const float4 *s = (const float4 *)(src + r0 * D);
        for (; e < total; e += NT) {
            if (ASYNC)
                mt_cp_async16(tile + r * DS + 4 * c, (const float *)(s + e), 16);
            else
                *(float4 *)(tile + r * DS + 4 * c) = s[e];
            r += step_r, c += step_c;
            if (c >= W) c -= W, ++r;
        }
    } else {
        const float *s = src + r0 * D;
        for (; e < total; e += NT) {
            tile[r * DS + c] = s[e];
            r += step_r, c += step_c;
            if (c >= W) c -= W, ++r;
        }
    }
}

/* c[u][w] = chain over d ascending of (x[own u][d], y[other w][d]) from +0: x rows R*ty+u of a
 * tile (R own rows a thread: 4, or the forward's 8 of fwd_shape), y rows tx+16w of another, both
 * of stride DS. The loop walks two pointers (at R = 4: 4 instructions an iteration beside its 8
 * loads and 64 fmas; recomputing the rows' addresses from tid took 10); it stays a loop: unrolled
 * by 2 it spilled at 128 registers (R = 4). DF: D when it is known at compile
 * time (a constant trip count, no tail), else 0. */
template <int DF, int R>
__device__ __forceinline__ void chains_over_d_of(float (&c)[R][4], const float *x, const float *y, int DS, int D) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15, Dn = DF ? DF : D;
    const float *xr = x + R * ty * DS, *yr = y + tx * DS;
#pragma unroll
    for (int u = 0; u < R; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) c[u][w] = 0.0f;
    int d = 0;
#pragma unroll 1
    for (const float *xe = xr + (Dn & ~3); xr < xe; xr += 4, yr += 4) {
        float4 a[R], b[4];
#pragma unroll
        for (int u = 0; u < R; ++u) a[u] = *(const float4 *)(xr + u * DS);
#pragma unroll
        for (int w = 0; w < 4; ++w) b[w] = *(const float4 *)(yr + 16 * w * DS);
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                c[u][w] = MT_DOT_STEP(a[u].x, b[w].x, c[u][w]);
                c[u][w] = MT_DOT_STEP(a[u].y, b[w].y, c[u][w]);
                c[u][w] = MT_DOT_STEP(a[u].z, b[w].z, c[u][w]);
                c[u][w] = MT_DOT_STEP(a[u].w, b[w].w, c[u][w]);
            }
    }
    if (DF == 0)
        for (; d < (Dn & 3); ++d)
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) c[u][w] = MT_DOT_STEP(xr[u * DS + d], yr[16 * w * DS + d], c[u][w]);
}

/* The same for any D, with D = 64 * NCG (the full width of the tiles) as a constant. */
template <int NCG, int R>
__device__ __forceinline__ void chains_over_d(float (&c)[R][4], const float *x, const float *y, int D) {
    if (D == 64 * NCG)
        chains_over_d_of<64 * NCG>(c, x, y, geom<NCG>::DS, D);
    else
        chains_over_d_of<0>(c, x, y, geom<NCG>::DS, D);
}

/* The two score chains of the backward side by side (q.k and dout.v over the same d). */
template <int NCG>
__device__ __forceinline__ void two_chains_over_d(float (&s)[4][4], float (&dp)[4][4], const float *x1,
                                                  const float *y1, const float *x2, const float *y2, int D) {
    chains_over_d<NCG>(s, x1, y1, D);
    chains_over_d<NCG>(dp, x2, y2, D);
}

/* acc[u][4g + c] = chain over t in [0, n) ascending of (cv[t][R*ty + u], rows[t][64g + 4tx + c]),
 * continued from acc: cv a per-pair tile (stride pair_tile<R>::stride, own rows contiguous), rows a
 * (n, D) tile of stride DS. SEL: a step whose coefficient is MASKED is skipped. FULL: n is a whole tile (TR),
 * the loop unrolled by 8 with immediate offsets. */
template <int NCG, bool SEL, bool FULL, int R>
__device__ __forceinline__ void chains_over_pairs(float (&acc)[R][4 * NCG], const float *cv, const float *rows,
                                                  int n) {
    constexpr int DS = geom<NCG>::DS, CS = pair_tile<R>::stride;
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15, nn = FULL ? TR : n;
    const float *cp = cv + R * ty, *rp = rows + 4 * tx;
    constexpr int UNROLL = FULL ? 8 : 2;
#pragma unroll UNROLL
    for (int t = 0; t < nn; ++t) {
        float4 cf[R / 4];
        float co[R];
#pragma unroll
        for (int k = 0; k < R / 4; ++k) cf[k] = *(const float4 *)(cp + t * CS + 4 * k);
        memcpy(co, cf, sizeof co);    /* (built element by element, dkv_kernel<1, true>'s code moved) */
#pragma unroll
        for (int g = 0; g < NCG; ++g) {
            float4 rf = *(const float4 *)(rp + t * DS + 64 * g);
            const float rv[4] = {rf.x, rf.y, rf.z, rf.w};
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    float nv = MT_DOT_STEP(co[u], rv[c], acc[u][4 * g + c]);
                    acc[u][4 * g + c] = (!SEL || live_bits(co[u])) ? nv : acc[u][4 * g + c];
                }
        }
    }
}

template <int NCG, int R>
__device__ __forceinline__ void chains_over_pairs_sel(float (&acc)[R][4 * NCG], const float *cv, const float *rows,
                                                      int n, bool any_masked) {
    if (any_masked)
        chains_over_pairs<NCG, true, false>(acc, cv, rows, n);
    else if (n == TR)
        chains_over_pairs<NCG, false, true>(acc, cv, rows, n);
    else
        chains_over_pairs<NCG, false, false>(acc, cv, rows, n);
}

/* The score of query row i against key j (both in range) from its chain and its mask element
 * mv (a float mask's element; a bool mask's byte as a float, 0 masking; unused without a mask):
 * chain * scale, then the mask or causality; -inf marks a masked pair. (A float mask's NaN and
 * +inf are refused by the host's check kernel.) */
__device__ __forceinline__ float score(const mt_attn_args &a, float chain, float mv, int64_t i, int64_t j) {
    float s = chain * a.scale;
    if (a.mask_kind == MT_ATTENTION_MASK_FLOAT) {
        s = s + mv;
    } else if (a.mask_kind == MT_ATTENTION_MASK_BOOL) {
        if (mv == 0.0f) s = -INFINITY;
    } else if (a.is_causal && j > i) {
        s = -INFINITY;
    }
    return s;
}

/* The scores of a thread's 4R pairs (u, w) of a tile that is not plain, in place of their
 * chains s: pair (u, w) is query row i0 + qrow(u, w) and key j0 + key(u, w), -inf where either
 * lies past the tile's rows (n, nk). A mask's elements are loaded a row's four (one u) at a
 * time, four scalar loads in flight together: loaded pair by pair, each inside its pair's branch,
 * they were waited for one after another. (All 16 at once made the dk/dv kernel spill 36 bytes
 * in the plain tiles' path as first written, 3f12bf6; not measured since.) */
template <int R, class QRow, class Key>
__device__ __forceinline__ void tile_scores(const mt_attn_args &a, float (&s)[R][4], int64_t b, int64_t h, int64_t i0,
                                            int n, int64_t j0, int nk, QRow qrow, Key key) {
    auto at = [&](int u, int w) { return b * a.sb + h * a.sh + (i0 + qrow(u, w)) * a.si + (j0 + key(u, w)) * a.sj; };
    auto in = [&](int u, int w) { return qrow(u, w) < n && key(u, w) < nk; };
#pragma unroll
    for (int u = 0; u < R; ++u) {
        float mv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (a.mask_kind == MT_ATTENTION_MASK_FLOAT) {
#pragma unroll
            for (int w = 0; w < 4; ++w)
                if (in(u, w)) mv[w] = ((const float *)a.mask)[at(u, w)];
        } else if (a.mask_kind == MT_ATTENTION_MASK_BOOL) {
#pragma unroll
            for (int w = 0; w < 4; ++w)
                if (in(u, w)) mv[w] = (float)((const uint8_t *)a.mask)[at(u, w)];
        }
#pragma unroll
        for (int w = 0; w < 4; ++w)
            s[u][w] = in(u, w) ? score(a, s[u][w], mv[w], i0 + qrow(u, w), j0 + key(u, w)) : -INFINITY;
    }
}

/* Rows of the tile starting at row `start` of `total`: TR, or what is left. */
__device__ __forceinline__ int tile_rows(int64_t total, int64_t start) {
    return (int)(total - start < TR ? total - start : TR);
}

/* Whether every pair of a whole tile (n = rows query rows, nk = TR keys) takes score()'s first
 * step only (chain * scale): no mask, and under causality every key at or before every query row.
 * A block-uniform test, so the tile's pairs skip score()'s per-pair tests (the same values). */
__device__ __forceinline__ bool plain_tile(const mt_attn_args &a, int64_t i0, int n, int64_t j0, int nk,
                                           int rows = TR) {
    return a.mask_kind == MT_ATTENTION_MASK_NONE && n == rows && nk == TR && (!a.is_causal || j0 + TR - 1 <= i0);
}

/* Key blocks a query tile [i0, i0 + n) reaches: all, or under causality up to its last row's. */
__device__ __forceinline__ int64_t key_blocks(const mt_attn_args &a, int64_t i0, int n) {
    int64_t all = (a.Tk + TR - 1) / TR;
    if (!a.is_causal) return all;
    int64_t last = (i0 + n - 1) / TR + 1;
    return last < all ? last : all;
}

__device__ __forceinline__ int64_t kv_head(const mt_attn_args &a, int64_t h) { return h / (a.H / a.Hkv); }

/* A query tile: batch b, head h, rows i0 .. i0+n-1 (row0 their first row of q), and the first
 * key row kv0 of its kv head. */
struct query_tile {
    int64_t b, h, i0, row0, kv0;
    int n;
};

/* This block's query tile of `rows` rows (a multiple of TR): blocks walk the heaviest tiles (the
 * last, under causality) first. */
__device__ __forceinline__ query_tile query_tile_of_block(const mt_attn_args &a, int rows = TR) {
    int64_t tiles = (a.Tq + rows - 1) / rows, bh_count = a.B * a.H, idx = blockIdx.x;
    int64_t t = tiles - 1 - idx / bh_count, bh = idx % bh_count;
    query_tile q;
    q.b = bh / a.H;
    q.h = bh % a.H;
    q.i0 = t * rows;
    q.n = (int)(a.Tq - q.i0 < rows ? a.Tq - q.i0 : rows);
    q.row0 = (q.b * a.H + q.h) * a.Tq + q.i0;
    q.kv0 = (q.b * a.Hkv + kv_head(a, q.h)) * a.Tk;
    return q;
}

/* Key block kb of a query tile's kv head into Ks and Vs (after a barrier: the last block's
 * tiles are read; before one: these are visible); *j0 its first key, the count returned. */
__device__ __forceinline__ int load_key_block(float *Ks, float *Vs, int DS, const mt_attn_args &a, int64_t kv0,
                                              int64_t kb, int64_t *j0) {
    *j0 = kb * TR;
    const int nk = tile_rows(a.Tk, *j0);
    __syncthreads();
    load_rows(Ks, DS, a.k, kv0 + *j0, nk, (int)a.D);
    load_rows(Vs, DS, a.v, kv0 + *j0, nk, (int)a.D);
    __syncthreads();
    return nk;
}

/* Key block kb of a query tile's kv head, copied (asynchronously where it can be) into buffer
 * kb % 2 of KV (each buffer a K tile then a V tile), and committed as one group. */
__device__ __forceinline__ void stage_key_block(float *KV, int DS, const mt_attn_args &a, int64_t kv0, int64_t kb) {
    const int64_t j0 = kb * TR;
    const int nk = tile_rows(a.Tk, j0);
    float *Ks = KV + (kb & 1) * 2 * TR * DS;
    load_rows<true>(Ks, DS, a.k, kv0 + j0, nk, (int)a.D);
    load_rows<true>(Ks + TR * DS, DS, a.v, kv0 + j0, nk, (int)a.D);
    mt_cp_async_commit();
}

/* A query tile's rows of q and dout into Qs and dOs, and their lse and delta into Lse and Delta
 * (ASYNC: as copies committed as one group, visible after mt_cp_async_wait and a barrier). */
template <bool ASYNC>
__device__ __forceinline__ void stage_query_tile(float *Qs, float *dOs, float *Lse, float *Delta, int DS,
                                                 const mt_attn_dev &d, int64_t row0, int n) {
    const mt_attn_args &a = d.a;
    load_rows<ASYNC>(Qs, DS, a.q, row0, n, (int)a.D);
    load_rows<ASYNC>(dOs, DS, a.dout, row0, n, (int)a.D);
    if (threadIdx.x < n) {
        if (ASYNC) {
            mt_cp_async4(Lse + threadIdx.x, a.lse_in + row0 + threadIdx.x, 4);
            mt_cp_async4(Delta + threadIdx.x, d.delta + row0 + threadIdx.x, 4);
        } else {
            Lse[threadIdx.x] = a.lse_in[row0 + threadIdx.x];
            Delta[threadIdx.x] = d.delta[row0 + threadIdx.x];
        }
    }
    if (ASYNC) mt_cp_async_commit();
}

/* Whether a tile's own rows fill whole 16-byte groups at dst: n = rows rows of D = 64 * NCG
 * columns, dst 16-byte aligned (block-uniform). */
template <int NCG>
__device__ __forceinline__ bool whole_rows16(const float *dst, int n, int D, int rows = TR) {
    return n == rows && D == 64 * NCG && ((uintptr_t)dst & 15) == 0;
}

/* dst[r * D + col] = value(acc[u][4g + c], r) for the thread's own rows r = R*ty + u below n and
 * its columns col = 64g + 4tx + c below D (16 bytes at a time where whole_rows16). */
template <int NCG, int R, class F>
__device__ __forceinline__ void store_own_rows(float *dst, const float (&acc)[R][4 * NCG], int n, int D, F value) {
    const int ty = threadIdx.x >> 4, tx = threadIdx.x & 15;
    if (whole_rows16<NCG>(dst, n, D, 16 * R)) {
#pragma unroll
        for (int u = 0; u < R; ++u) {
            const int r = R * ty + u;
#pragma unroll
            for (int g = 0; g < NCG; ++g) {
                const float *v = acc[u] + 4 * g;
                *(float4 *)(dst + (int64_t)r * D + 64 * g + 4 * tx) =
                    make_float4(value(v[0], r), value(v[1], r), value(v[2], r), value(v[3], r));
            }
        }
        return;
    }
#pragma unroll
    for (int u = 0; u < R; ++u) {
        const int r = R * ty + u;
        if (r >= n) continue;
#pragma unroll
        for (int g = 0; g < NCG; ++g)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int col = 64 * g + 4 * tx + c;
                if (col < D) dst[(int64_t)r * D + col] = value(acc[u][4 * g + c], r);
            }
    }
}

/* ---- forward -------------------------------------------------------------------------------- */

/* A block a query tile of QR = 16 * R rows (R = fwd_shape<NCG>::R: thread (ty, tx) owns query rows
 * R*ty .. R*ty+R-1 and keys tx + 16w of each key block of TR). */
template <int NCG>
__global__ void __launch_bounds__(NT, fwd_shape<NCG>::R == 4 ? 3 - NCG : 1) fwd_kernel(mt_attn_dev d) {
    constexpr int DS = geom<NCG>::DS, R = fwd_shape<NCG>::R, QR = fwd_shape<NCG>::QR, PSR = pair_tile<R>::stride;
    MT_ATTN_SMEM_DECL(smem);
    /* two buffers of a key block's K and V tiles: block kb + 1's copy runs under block kb's work */
    float *Qs = smem, *KV = Qs + QR * DS, *Pt = KV + 4 * TR * DS, *Alpha = Pt + TR * PSR;
    const mt_attn_args &a = d.a;
    const int D = (int)a.D, tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const query_tile qt = query_tile_of_block(a, QR);
    const int64_t b = qt.b, h = qt.h, i0 = qt.i0, row0 = qt.row0;
    const int n = qt.n;
    /* the l of row tid, kept by the threads of the first QR / 32 warps (whole warps: the others
     * issue none of its steps) */
    const int lrow = tid;
    const bool lsum = tid < QR;
    float l = 0.0f, m[R], acc[R][4 * NCG];
#pragma unroll
    for (int u = 0; u < R; ++u) {
        m[u] = -INFINITY;
#pragma unroll
        for (int c = 0; c < 4 * NCG; ++c) acc[u][c] = 0.0f;
    }
    load_rows(Qs, DS, a.q, row0, n, D);
    const int64_t nb = key_blocks(a, i0, n);
    if (nb > 0) stage_key_block(KV, DS, a, qt.kv0, 0);
    for (int64_t kb = 0; kb < nb; ++kb) {
        const int64_t j0 = kb * TR;
        const int nk = tile_rows(a.Tk, j0);
        mt_cp_async_wait<0>();
        __syncthreads();                /* block kb's tiles are visible; block kb - 1's (and Pt) are read */
        if (kb + 1 < nb) stage_key_block(KV, DS, a, qt.kv0, kb + 1);
        const float *Ks = KV + (kb & 1) * 2 * TR * DS, *Vs = Ks + TR * DS;
        float s[R][4], pv[R][4];
        chains_over_d<NCG>(s, Qs, Ks, D);
        int masked = 0;
        const bool plain = plain_tile(a, i0, n, j0, nk, QR);
        if (plain)
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) s[u][w] = s[u][w] * a.scale;
        else
            tile_scores(a, s, b, h, i0, n, j0, nk, [&](int u, int) { return R * ty + u; },
                        [&](int, int w) { return tx + 16 * w; });
        float mb[R];
#pragma unroll
        for (int u = 0; u < R; ++u) {
            const int r = R * ty + u;
            mb[u] = -INFINITY;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int jj = tx + 16 * w;
                const bool in = r < n && jj < nk;
                masked |= in && s[u][w] == -INFINITY;
                mb[u] = mt_attn_max(mb[u], s[u][w]);
            }
        }
#pragma unroll
        for (int x = 1; x < 16; x <<= 1)                    /* the R rows' butterflies side by side */
#pragma unroll
            for (int u = 0; u < R; ++u) mb[u] = mt_attn_max(mb[u], MT_ATTN_SHFL_XOR(mb[u], x));
        /* A row with a live pair in this block (mb > -inf) moves its maximum to mnew and scales its
         * chains by alpha = e^(m - mnew). Branch-free where each row's exponent is -inf (its first
         * live block: e^-inf = +0), in mt_expf_mid's range, or the row has no live pair (alpha 1);
         * else row by row, as mt_expf_ranged takes each. The same bits either way. */
        float alpha[R];
        int alphas_mid = 1;
#pragma unroll
        for (int u = 0; u < R; ++u) {
            const float e = m[u] - mt_attn_max(m[u], mb[u]);
            alphas_mid &= (mb[u] == -INFINITY) | (e == -INFINITY) | mt_expf_in_mid(e);
        }
        if (alphas_mid) {
#pragma unroll
            for (int u = 0; u < R; ++u) {
                const float mnew = mt_attn_max(m[u], mb[u]), e = m[u] - mnew;
                const float ex = mt_expf_mid(mt_expf_in_mid(e) ? e : 0.0f);
                alpha[u] = mb[u] == -INFINITY ? 1.0f : e == -INFINITY ? 0.0f : ex;
                m[u] = mb[u] == -INFINITY ? m[u] : mnew;
            }
        } else {
#pragma unroll
            for (int u = 0; u < R; ++u) {
                alpha[u] = 1.0f;
                if (mb[u] != -INFINITY) {
                    const float mnew = mt_attn_max(m[u], mb[u]);
                    alpha[u] = mt_expf_ranged(m[u] - mnew);
                    m[u] = mnew;
                }
            }
        }
#pragma unroll
        for (int u = 0; u < R; ++u) {
            if (tx == 0) Alpha[R * ty + u] = alpha[u];
#pragma unroll
            for (int c = 0; c < 4 * NCG; ++c) acc[u][c] = acc[u][c] * alpha[u];
        }
        /* p = e^(s - m): where all 4R exponents of the thread lie in mt_expf_mid's range (a NaN or
         * an infinity fails the test) every s is live and finite and every p finite and positive,
         * so mt_expf_mid alone gives the per-pair expression's bits without its branches */
        int mid = 1;
#pragma unroll
        for (int u = 0; u < R; ++u)
#pragma unroll
            for (int w = 0; w < 4; ++w) mid &= mt_expf_in_mid(s[u][w] - m[u]);
        if (mid) {
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) pv[u][w] = mt_expf_mid(s[u][w] - m[u]);
        } else {
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w)
                    pv[u][w] = s[u][w] == -INFINITY ? masked_value() : mt_canonical_nan(mt_expf_ranged(s[u][w] - m[u]));
        }
#pragma unroll
        for (int w = 0; w < 4; ++w)                         /* the thread's rows side by side, four at a time */
#pragma unroll
            for (int k = 0; k < R / 4; ++k)
                *(float4 *)(Pt + (tx + 16 * w) * PSR + R * ty + 4 * k) =
                    make_float4(pv[4 * k][w], pv[4 * k + 1][w], pv[4 * k + 2][w], pv[4 * k + 3][w]);
        const bool any_masked = __syncthreads_or(masked);
        if (lsum) {                                         /* l = l * alpha, then + p_j ascending */
            l = l * Alpha[lrow];
            int jj = 0;
            for (; jj + 8 <= nk; jj += 8) {                 /* eight loads in flight, then their adds */
                float p[8];
#pragma unroll
                for (int k = 0; k < 8; ++k) p[k] = Pt[(jj + k) * PSR + lrow];
#pragma unroll
                for (int k = 0; k < 8; ++k)
                    if (live_bits(p[k])) l = l + p[k];
            }
            for (; jj < nk; ++jj) {
                float p = Pt[jj * PSR + lrow];
                if (live_bits(p)) l = l + p;
            }
        }
        if (a.dropout_p > 0.0f) {                           /* the acc chains take p after dropout */
            __syncthreads();                                /* every l has read Pt */
#pragma unroll
            for (int u = 0; u < R; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w)
                    if (live_bits(pv[u][w]))
                        Pt[(tx + 16 * w) * PSR + R * ty + u] = mt_canonical_nan(mt_attn_drop(
                            pv[u][w], a.seed, a.stream, MT_ATTN_PAIR_ELEMENT(a, b, h, i0 + R * ty + u, j0 + tx + 16 * w),
                            a.dropout_p, a.dropout_scale));
            __syncthreads();
        }
        chains_over_pairs_sel<NCG>(acc, Pt, Vs, nk, any_masked);
    }
    __syncthreads();
    if (lsum) Alpha[lrow] = l;                              /* Alpha now holds each row's l */
    __syncthreads();
    store_own_rows<NCG>(a.out + row0 * D, acc, n, D, [&](float x, int r) { return mt_attn_out(x, Alpha[r]); });
    if (tx == 0 && a.lse) {
#pragma unroll
        for (int u = 0; u < R; ++u)
            if (R * ty + u < n) a.lse[row0 + R * ty + u] = mt_attn_lse(m[u], Alpha[R * ty + u]);
    }
}

/* ---- backward ------------------------------------------------------------------------------- */

/* delta of every query row: the chain over d of (dout, out), one thread a row. */
__global__ void __launch_bounds__(NT) delta_kernel(mt_attn_dev d) {
    const mt_attn_args &a = d.a;
    const int64_t row = (int64_t)blockIdx.x * NT + threadIdx.x, rows = a.B * a.H * a.Tq;
    if (row >= rows) return;
    const float *x = a.dout + row * a.D, *y = a.out_in + row * a.D;
    float acc = 0.0f;
    for (int64_t k = 0; k < a.D; ++k) acc = MT_DOT_STEP(x[k], y[k], acc);
    d.delta[row] = acc;
}

/* The backward's per-pair values of a pair whose q.k chain is s (plain: a plain tile's pair,
 * whose score is s * scale; else s is its score, tile_scores') and dout.v chain dp: p (after
 * dropout: dv's chains take it) and ds = p (dp after dropout - delta), both MASKED when the pair
 * is masked. */
__device__ __forceinline__ void pair_values(const mt_attn_dev &d, float s, float dp, float lse, float delta, int64_t b,
                                            int64_t h, int64_t i, int64_t j, bool in, bool plain, float *p_out,
                                            float *ds_out, int *masked) {
    const float sc = plain ? s * d.a.scale : s;
    if (sc == -INFINITY) {
        *masked |= in;
        *p_out = *ds_out = masked_value();
        return;
    }
    const float p = mt_expf_ranged(sc - lse);
    float pd = p, dpd = dp;
    const mt_attn_args &a = d.a;
    if (a.dropout_p > 0.0f) {
        const uint32_t word = mt_philox_word(a.seed, a.stream, MT_ATTN_PAIR_ELEMENT(a, b, h, i, j));
        pd = mt_dropout_elem(p, word, a.dropout_p, a.dropout_scale);
        dpd = mt_dropout_elem(dp, word, a.dropout_p, a.dropout_scale);
    }
    *p_out = mt_canonical_nan(pd);
    *ds_out = mt_canonical_nan(mt_attn_ds(p, dpd, delta));
}

/* Whether pair_values may run branch-free for the 16 pairs of a thread: a plain tile without
 * dropout whose exponents x = s * scale - lse all lie in mt_expf_mid's range (a NaN or an
 * infinity fails the test). The score is then finite, p = mt_expf_mid(x) is finite and positive
 * (its own canonical form) and ds is pair_values's: mid_pair_values gives the same bits. Rows:
 * the pair (u, w) takes lse[u] (LSE_U: the dq kernel, whose own rows are query rows) or lse[w]
 * (the dk/dv kernel). */
template <bool LSE_U>
__device__ __forceinline__ bool mid_pairs(const mt_attn_args &a, bool plain, const float (&s)[4][4], const float (&lse)[4],
                                          float (&x)[4][4]) {
    if (!plain || a.dropout_p > 0.0f) return false;
    int mid = 1;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            x[u][w] = s[u][w] * a.scale - lse[LSE_U ? u : w];
            mid &= mt_expf_in_mid(x[u][w]);
        }
    return mid;
}

/* pair_values of a pair that mid_pairs admitted, from its exponent x. */
__device__ __forceinline__ void mid_pair_values(float x, float dp, float delta, float *p_out, float *ds_out) {
    const float p = mt_expf_mid(x);
    *p_out = p;
    *ds_out = mt_canonical_nan(mt_attn_ds(p, dp, delta));
}

/* mid_pairs for a tile that is not plain, from its pairs' scores sc (tile_scores'): a masked
 * pair (sc = -inf) is not tested and its exponent x is 0 (a harmless argument, its value
 * selected afterwards); every other pair's sc - lse must lie in mt_expf_mid's range. No
 * dropout. Rows as mid_pairs'. */
template <bool LSE_U>
__device__ __forceinline__ bool masked_mid_pairs(const mt_attn_args &a, const float (&sc)[4][4], const float (&lse)[4],
                                                 float (&x)[4][4]) {
    if (a.dropout_p > 0.0f) return false;
    int mid = 1;
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const bool live = sc[u][w] != -INFINITY;
            const float e = sc[u][w] - lse[LSE_U ? u : w];
            x[u][w] = live ? e : 0.0f;
            mid &= !live | mt_expf_in_mid(e);
        }
    return mid;
}

/* pair_values of a pair that masked_mid_pairs admitted, from its score sc and exponent x. */
__device__ __forceinline__ void masked_mid_pair_values(float sc, float x, float dp, float delta, bool in, float *p_out,
                                                       float *ds_out, int *masked) {
    const bool live = sc != -INFINITY;
    const float p = mt_expf_mid(x);
    *p_out = live ? p : masked_value();
    *ds_out = live ? mt_canonical_nan(mt_attn_ds(p, dp, delta)) : masked_value();
    *masked |= in & !live;
}

/* dq of a query tile: chains over the keys ascending, times scale at the end. */
template <int NCG>
__global__ void __launch_bounds__(NT, 3 - NCG) dq_kernel(mt_attn_dev d) {
    constexpr int DS = geom<NCG>::DS;
    MT_ATTN_SMEM_DECL(smem);
    float *Qs = smem, *dOs = Qs + TR * DS, *Ks = dOs + TR * DS, *Vs = Ks + TR * DS, *dSt = Vs + TR * DS;
    float *Lse = dSt + TR * PS, *Delta = Lse + TR;
    const mt_attn_args &a = d.a;
    const int D = (int)a.D, tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const query_tile qt = query_tile_of_block(a);
    const int64_t b = qt.b, h = qt.h, i0 = qt.i0, row0 = qt.row0;
    const int n = qt.n;
    float acc[4][4 * NCG];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int c = 0; c < 4 * NCG; ++c) acc[u][c] = 0.0f;
    load_rows(Qs, DS, a.q, row0, n, D);
    load_rows(dOs, DS, a.dout, row0, n, D);
    if (tid < n) {
        Lse[tid] = a.lse_in[row0 + tid];
        Delta[tid] = d.delta[row0 + tid];
    }
    for (int64_t kb = 0, nb = key_blocks(a, i0, n); kb < nb; ++kb) {
        int64_t j0;
        const int nk = load_key_block(Ks, Vs, DS, a, qt.kv0, kb, &j0);   /* the last block's dSt read too */
        float s[4][4], dp[4][4];
        two_chains_over_d<NCG>(s, dp, Qs, Ks, dOs, Vs, D);
        int masked = 0;
        const bool plain = plain_tile(a, i0, n, j0, nk);
        float lse[4], delta[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int r = 4 * ty + u;
            lse[u] = r < n ? Lse[r] : 0.0f, delta[u] = r < n ? Delta[r] : 0.0f;
        }
        float x[4][4];
        if (mid_pairs<true>(a, plain, s, lse, x)) {         /* the same bits as pair_values, branch-free */
#pragma unroll
            for (int u = 0; u < 4; ++u)
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    float p, ds;
                    mid_pair_values(x[u][w], dp[u][w], delta[u], &p, &ds);
                    dSt[(tx + 16 * w) * PS + 4 * ty + u] = ds;
                }
        } else {
            if (!plain)
                tile_scores(a, s, b, h, i0, n, j0, nk, [&](int u, int) { return 4 * ty + u; },
                            [&](int, int w) { return tx + 16 * w; });
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int r = 4 * ty + u;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const int jj = tx + 16 * w;
                    float p, ds;
                    pair_values(d, s[u][w], dp[u][w], lse[u], delta[u], b, h, i0 + r, j0 + jj, r < n && jj < nk,
                                plain, &p, &ds, &masked);
                    dSt[jj * PS + r] = ds;
                }
            }
        }
        const bool any_masked = __syncthreads_or(masked);
        chains_over_pairs_sel<NCG>(acc, dSt, Ks, nk, any_masked);
    }
    store_own_rows<NCG>(a.dq + row0 * D, acc, n, D, [&](float x, int) { return mt_canonical_nan(a.scale * x); });
}

/* The dq relay's step of key block kb for the query tile at i0 (n rows) of head h, after a
 * barrier past every chain's reads of Ps: ds (dSs, query rows by keys) transposed into Ps, block
 * kb - 1's part of the chains read back from dq, continued over this block's nk keys, and
 * written back (times scale where kb is the tile's last key block), then handed on. */
template <int NCG>
__device__ __forceinline__ void relay_dq(const mt_attn_dev &d, float *Ps, const float *dSs, const float *Ks, int nk,
                                         int64_t b, int64_t h, int64_t i0, int n, int64_t kb, bool any_masked) {
    const mt_attn_args &a = d.a;
    const int D = (int)a.D, tid = threadIdx.x;
    const int64_t qtile = (b * a.H + h) * ((a.Tq + TR - 1) / TR) + i0 / TR, row0 = (b * a.H + h) * a.Tq + i0;
    const bool last = kb + 1 == key_blocks(a, i0, n);
    int32_t *word = d.relay + qtile;
    for (int e = tid; e < TR * TR / 4; e += NT) {
        const int r = e & (TR - 1), jj = 4 * (e >> 6);  /* r: the query row, jj: its first of four keys */
        const float4 v = *(const float4 *)(dSs + r * PS + jj);
        Ps[jj * PS + r] = v.x, Ps[(jj + 1) * PS + r] = v.y, Ps[(jj + 2) * PS + r] = v.z, Ps[(jj + 3) * PS + r] = v.w;
    }
    if (tid == 0 && kb > 0) mt_relay_wait(word, (int32_t)kb);
    __syncthreads();                                    /* Ps is whole; block kb - 1's part is visible */
    float acc[4][4 * NCG];
    const int ty = tid >> 4, tx = tid & 15;
    float *dq = a.dq + row0 * D;
    if (kb > 0 && whole_rows16<NCG>(dq, n, D)) {         /* 16 bytes at a time */
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int g = 0; g < NCG; ++g) {
                const float4 v = mt_relay_load4(dq + (int64_t)(4 * ty + u) * D + 64 * g + 4 * tx);
                acc[u][4 * g] = v.x, acc[u][4 * g + 1] = v.y, acc[u][4 * g + 2] = v.z, acc[u][4 * g + 3] = v.w;
            }
    } else {
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int g = 0; g < NCG; ++g)
#pragma unroll
                for (int c = 0; c < 4; ++c) {
                    const int r = 4 * ty + u, col = 64 * g + 4 * tx + c;
                    acc[u][4 * g + c] = kb > 0 && r < n && col < D ? mt_relay_load(dq + (int64_t)r * D + col) : 0.0f;
                }
    }
    chains_over_pairs_sel<NCG>(acc, Ps, Ks, nk, any_masked);
    if (last)
        store_own_rows<NCG>(dq, acc, n, D, [&](float x, int) { return mt_canonical_nan(a.scale * x); });
    else
        store_own_rows<NCG>(dq, acc, n, D, [](float x, int) { return x; });
    __syncthreads();                                    /* every part of the tile is written */
    if (tid == 0 && !last) mt_relay_publish(word, (int32_t)(kb + 1));
}

/* dk and dv of a key block of one kv head: chains over (query head of the group, row)
 * ascending; dk times scale at the end. Blocks walk the key blocks in ascending order (under
 * causality the first ones see the most rows). DQ: the block also carries the dq relay
 * (mt_attn_relay_words): for each query tile it continues the tile's dq chains over its keys
 * from what block kb - 1 left in dq (from +0 at the first key block), and the last key block of
 * the tile writes scale times them -- the dq kernel's chains, in its order, without its second
 * pass over s and dp. Its block index is taken at its start (mt_relay_take), so the block it
 * waits on has started before it. */
template <int NCG, bool DQ>
__global__ void __launch_bounds__(NT, 3 - NCG) dkv_kernel(mt_attn_dev d) {
    constexpr int DS = geom<NCG>::DS;
    MT_ATTN_SMEM_DECL(smem);
    float *Ks = smem, *Vs = Ks + TR * DS, *Qs = Vs + TR * DS, *dOs = Qs + TR * DS, *Ps = dOs + TR * DS;
    float *dSs = Ps + TR * PS, *Lse = dSs + TR * PS, *Delta = Lse + TR;
    const mt_attn_args &a = d.a;
    const int D = (int)a.D, tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
    const int64_t bg_count = a.B * a.Hkv, qtiles = (a.Tq + TR - 1) / TR;
    int64_t idx = blockIdx.x;
    if (DQ) {
        if (tid == 0) ((int32_t *)Delta)[TR] = mt_relay_take(d.relay + a.B * a.H * qtiles);
        __syncthreads();
        idx = ((const int32_t *)Delta)[TR];
    }
    const int64_t kb = idx / bg_count, bg = idx % bg_count;
    const int64_t b = bg / a.Hkv, g = bg % a.Hkv, group = a.H / a.Hkv, j0 = kb * TR;
    const int nk = tile_rows(a.Tk, j0);
    const int64_t kv0 = bg * a.Tk + j0;
    float dk[4][4 * NCG], dv[4][4 * NCG];
#pragma unroll
    for (int u = 0; u < 4; ++u)
#pragma unroll
        for (int c = 0; c < 4 * NCG; ++c) dk[u][c] = dv[u][c] = 0.0f;
    load_rows(Ks, DS, a.k, kv0, nk, D);
    load_rows(Vs, DS, a.v, kv0, nk, D);
    const int64_t first = a.is_causal ? j0 / TR * TR : 0;  /* rows above j0 see no key of the block */
    const int64_t h_end = (g + 1) * group;
    bool staged = false;                                /* the tile's rows are in flight already */
    for (int64_t h = g * group; h < h_end; ++h) {
        for (int64_t i0 = first; i0 < a.Tq; i0 += TR) {
            const int n = tile_rows(a.Tq, i0);
            const int64_t row0 = (b * a.H + h) * a.Tq + i0;
            if (!staged) {
                __syncthreads();                        /* the last tile's rows are read */
                stage_query_tile<false>(Qs, dOs, Lse, Delta, DS, d, row0, n);
            }
            mt_cp_async_wait<0>();
            __syncthreads();
            float s[4][4], dp[4][4];                    /* own rows: keys; other rows: query rows */
            two_chains_over_d<NCG>(s, dp, Ks, Qs, Vs, dOs, D);
            int masked = 0;
            const bool plain = plain_tile(a, i0, n, j0, nk);
            float lse[4], delta[4];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const int r = tx + 16 * w;
                lse[w] = r < n ? Lse[r] : 0.0f, delta[w] = r < n ? Delta[r] : 0.0f;
            }
            /* the thread's four keys of query row r side by side: one 16-byte store each (four
             * 4-byte ones at stride PS met in 8 of the 32 banks: a 4-way conflict, ncu, call 1) */
            auto store_row = [&](int r, const float (&p)[4], const float (&ds)[4]) {
                *(float4 *)(Ps + r * PS + 4 * ty) = make_float4(p[0], p[1], p[2], p[3]);
                *(float4 *)(dSs + r * PS + 4 * ty) = make_float4(ds[0], ds[1], ds[2], ds[3]);
            };
            float x[4][4];
            if (mid_pairs<false>(a, plain, s, lse, x)) {    /* the same bits as pair_values, branch-free */
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    float p[4], ds[4];
#pragma unroll
                    for (int u = 0; u < 4; ++u)
                        mid_pair_values(x[u][w], dp[u][w], delta[w], &p[u], &ds[u]);
                    store_row(tx + 16 * w, p, ds);
                }
            } else {
                if (!plain)
                    tile_scores(a, s, b, h, i0, n, j0, nk, [&](int, int w) { return tx + 16 * w; },
                                [&](int u, int) { return 4 * ty + u; });
                if (!plain && masked_mid_pairs<false>(a, s, lse, x)) {   /* the same bits, branch-free */
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        const int r = tx + 16 * w;
                        float p[4], ds[4];
#pragma unroll
                        for (int u = 0; u < 4; ++u)
                            masked_mid_pair_values(s[u][w], x[u][w], dp[u][w], delta[w], r < n && 4 * ty + u < nk,
                                                   &p[u], &ds[u], &masked);
                        store_row(r, p, ds);
                    }
                } else {
#pragma unroll
                    for (int w = 0; w < 4; ++w) {
                        const int r = tx + 16 * w;
                        float p[4], ds[4];
#pragma unroll
                        for (int u = 0; u < 4; ++u) {
                            const int jj = 4 * ty + u;
                            pair_values(d, s[u][w], dp[u][w], lse[w], delta[w], b, h, i0 + r, j0 + jj,
                                        r < n && jj < nk, plain, &p[u], &ds[u], &masked);
                        }
                        store_row(r, p, ds);
                    }
                }
            }
            const bool any_masked = __syncthreads_or(masked);
            if (a.dv) chains_over_pairs_sel<NCG>(dv, Ps, dOs, n, any_masked);
            if (a.dk) chains_over_pairs_sel<NCG>(dk, dSs, Qs, n, any_masked);
            if (DQ) {
                __syncthreads();                        /* every chain has read Ps, Qs and dOs */
                /* the next tile's rows copied under the relay's step (Qs, dOs, Lse and Delta are
                 * free now): its wait and its chains hide their latency */
                const bool more_rows = i0 + TR < a.Tq;
                staged = more_rows || h + 1 < h_end;
                if (staged) {
                    const int64_t h2 = more_rows ? h : h + 1, i2 = more_rows ? i0 + TR : first;
                    stage_query_tile<true>(Qs, dOs, Lse, Delta, DS, d, (b * a.H + h2) * a.Tq + i2,
                                           tile_rows(a.Tq, i2));
                }
                relay_dq<NCG>(d, Ps, dSs, Ks, nk, b, h, i0, n, kb, any_masked);
            }
        }
    }
    if (a.dk) store_own_rows<NCG>(a.dk + kv0 * D, dk, nk, D, [&](float x, int) { return mt_canonical_nan(a.scale * x); });
    if (a.dv) store_own_rows<NCG>(a.dv + kv0 * D, dv, nk, D, [](float x, int) { return mt_canonical_nan(x); });
}

/* Shared memory of each kernel, in bytes. */
template <int NCG>
constexpr size_t fwd_smem() {
    constexpr int QR = fwd_shape<NCG>::QR;
    return (size_t)((QR + 4 * TR) * geom<NCG>::DS + TR * pair_tile<fwd_shape<NCG>::R>::stride + QR) * 4;
}
template <int NCG>
constexpr size_t dq_smem() { return (size_t)(4 * TR * geom<NCG>::DS + TR * PS + 2 * TR) * 4; }
template <int NCG>
constexpr size_t dkv_smem() { return (size_t)(4 * TR * geom<NCG>::DS + 2 * TR * PS + 2 * TR + 4) * 4; }  /* + the work index */

template <int NCG, class Launch>
int enqueue(const mt_attn_dev &d, int backward, Launch &&launch) {
    const mt_attn_args &a = d.a;
    const int64_t qtiles = (a.Tq + TR - 1) / TR, kblocks = (a.Tk + TR - 1) / TR, rows = a.B * a.H * a.Tq;
    const int64_t qgrid = a.B * a.H * qtiles, kvgrid = a.B * a.Hkv * kblocks, fwd_qr = fwd_shape<NCG>::QR;
    int rc;
    if (!backward) {
        const int64_t fwd_grid = a.B * a.H * ((a.Tq + fwd_qr - 1) / fwd_qr);
        return fwd_grid ? launch(fwd_kernel<NCG>, (unsigned)fwd_grid, (unsigned)NT, fwd_smem<NCG>(), d) : 0;
    }
    if (rows && (a.dq || a.dk || a.dv) &&
        (rc = launch(delta_kernel, (unsigned)((rows + NT - 1) / NT), (unsigned)NT, (size_t)0, d)))
        return rc;
    if (a.dq && d.relay && kvgrid && qgrid)             /* dq by the relay, in the dk/dv kernel */
        return launch(dkv_kernel<NCG, true>, (unsigned)kvgrid, (unsigned)NT, dkv_smem<NCG>(), d);
    if (a.dq && qgrid && (rc = launch(dq_kernel<NCG>, (unsigned)qgrid, (unsigned)NT, dq_smem<NCG>(), d))) return rc;
    if ((a.dk || a.dv) && kvgrid &&
        (rc = launch(dkv_kernel<NCG, false>, (unsigned)kvgrid, (unsigned)NT, dkv_smem<NCG>(), d)))
        return rc;
    return 0;
}

}  // namespace mt_attn

/* The grids a call needs are below 2^31 blocks (the host checks: mt_attn_grid_fits). */
inline bool mt_attn_grid_fits(const mt_attn_args &a) {
    const int64_t lim = ((int64_t)1 << 31) - 1, tr = mt_attn::TR;
    return a.B * a.H * ((a.Tq + tr - 1) / tr) <= lim && a.B * a.Hkv * ((a.Tk + tr - 1) / tr) <= lim &&
           (a.B * a.H * a.Tq + mt_attn::NT - 1) / mt_attn::NT <= lim;
}

/* The most dynamic shared memory a call's kernels ask for, in bytes. */
inline size_t mt_attn_smem_need(const mt_attn_args &a, int backward) {
    using namespace mt_attn;
    if (a.D <= 64) return backward ? (dkv_smem<1>() > dq_smem<1>() ? dkv_smem<1>() : dq_smem<1>()) : fwd_smem<1>();
    return backward ? (dkv_smem<2>() > dq_smem<2>() ? dkv_smem<2>() : dq_smem<2>()) : fwd_smem<2>();
}

/* Enqueue the forward (backward = 0) or the backward's kernels: launch(kernel, grid, threads,
 * smem_bytes, d) for each, in order (a nonzero return stops). D <= 64 takes one group of 64
 * columns per tile, D <= 128 two. */
template <class Launch>
int mt_attn_enqueue(const mt_attn_dev &d, int backward, Launch &&launch) {
    return d.a.D <= 64 ? mt_attn::enqueue<1>(d, backward, launch) : mt_attn::enqueue<2>(d, backward, launch);
}

#endif /* MT_GPU_ATTENTION_KERNELS_CUH */
