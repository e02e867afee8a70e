/* mt_gpu_rms_norm.cu -- RMSNorm on a GPU (contract: native/contracts/rms_norm.md); the same
 * bits as the CPU oracle (native/cpu_oracle/mt_cpu_rms_norm.c) in the identical numeric mode.
 *
 * RMSNorm forward, one kernel: each block takes rows in turn, stages the row in shared memory
 * (cp.async where aligned: RMS_FWD_ASYNC; or, when it does not fit, reads it from global memory
 * twice), folds the squares by the
 * chunk tree (one warp per 4096-chunk, mt_warp_chunk_fold, then mt_block_tree_fold), forms
 * r = mt_rms_rstd and writes y.
 * Backward, up to three kernels: k_rms_backward stages x and dy, folds the squares and the
 * row dot of (dy * w, x) in one walk, writes dx (mt_rms_dx) and keeps r per row; with dweight,
 * k_rms_dweight_leaves runs the token rule's leaves (one thread per column walks a leaf's rows
 * in ascending order: acc = fma(dy, x * r, acc), coalesced across columns) into partials laid
 * out (column, leaf), and k_rms_dweight_fold folds each column's partials (mt_token_tree).
 * Where it applies, one kernel replaces the first two: k_rms_backward_leaves (the default, one
 * read of x and dy, a leaf's blocks in lockstep), or k_rms_backward_relay (opt-in, row blocks
 * handing r to column walkers). Each is described at its code; all give the same bits.
 * Finiteness rides along (no pre-pass): kernels raise per-input flags, the host refuses after
 * the synchronization; y and dx are undefined then (mojo_train.h), dweight is never written
 * (its fold kernel reads the flags first). Argument checks and refusal order follow the
 * oracle. Host buffers are staged through device memory and downloaded only on success (the
 * host side LayerNorm shares: mt_gpu_norm.cuh).
 */
#include "mt_gpu_norm.cuh"

uint64_t mt_rms_norm_features(void) { return MT_FEATURE_RMS_NORM; }

namespace {

#define RMS_MIN_WARPS 4
#define RMS_MAX_WARPS 16
#define RMS_COL_THREADS 256   /* columns per block of the dweight kernels */
#define RMS_ROW_BATCH 16      /* rows whose loads a dweight thread has in flight */
enum { BAD_X = 0, BAD_DY = 1, BAD_W = 2 };

/* Both RMSNorm steps of a row of four lanes: squares (MT_STEP_SUMSQ) and, with dy, the row dot
 * of (dy * w, x) (MT_STEP_GDOT). x and dy may be shared memory (VEC: 16-byte aligned rows);
 * w is global (or NULL; WVEC: 16-byte aligned). */
template <bool VEC, bool WVEC, int K>
struct rms_step {
    struct V { float4 x, dy, w; };
    const float *x, *dy, *w;
    __device__ __forceinline__ V load(int64_t i) const {
        V v;
        v.x = mt_load4<VEC>(x + i);
        if constexpr (K == 2) {
            v.dy = mt_load4<VEC>(dy + i);
            v.w = w ? mt_load4<WVEC>(w + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        return v;
    }
    __device__ __forceinline__ void step(float (&a)[K][4], const V &v, int64_t) const {
        const float xv[4] = {v.x.x, v.x.y, v.x.z, v.x.w};
        const float *x = xv;
#pragma unroll
        for (int k = 0; k < 4; ++k) MT_STEP_SUMSQ(a[0][k], k);
        if constexpr (K == 2) {
            const float dv[4] = {v.dy.x, v.dy.y, v.dy.z, v.dy.w}, wv[4] = {v.w.x, v.w.y, v.w.z, v.w.w};
            const float *dy = dv, *w = this->w ? wv : nullptr;
#pragma unroll
            for (int k = 0; k < 4; ++k) MT_STEP_GDOT(a[K - 1][k], k);
        }
    }
    __device__ __forceinline__ void one(float (&a)[K][4], int q, int64_t i) const {
        MT_STEP_SUMSQ(a[0][q], i);
        if constexpr (K == 2) MT_STEP_GDOT(a[K - 1][q], i);
    }
};

/* RMS_FWD_ASYNC 1: the forward stages an aligned row with every copy in flight at once
 * (mt_rows_stage_async) instead of mt_rows_stage's batches of loads (0; a compile-time A/B
 * switch: the same bits). On the H200 the forward went 0.161-0.164 -> 0.153-0.157 ms at
 * 16384 x 4096 (fortieth session, bench/results/NOTES.md). */
#ifndef RMS_FWD_ASYNC
#define RMS_FWD_ASYNC 1
#endif

template <bool STAGED, bool VEC>
__global__ void __launch_bounds__(32 * RMS_MAX_WARPS)
    k_rms_forward(float *y, const float *x, const float *w, float eps, int64_t rows, int64_t dim, int32_t *bad) {
    extern __shared__ float4 smem4[];
    const int64_t pitch = (dim + 3) / 4 * 4;
    float *row = (float *)smem4, *part = row + (STAGED ? pitch : 0), *part2 = part + mt_chunk_count(dim);
    const float dimf = (float)dim;
    bool bx = false, bw = false;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *src = x + r * dim;
        float *out = y + r * dim;
        if (STAGED && VEC && RMS_FWD_ASYNC) {
            mt_rows_stage_async(row, src, dim);
            mt_cp_async_commit();
            mt_cp_async_wait<0>();
            __syncthreads();
        } else if (STAGED) {
            mt_rows_stage<VEC>(row, src, dim);
            __syncthreads();
        }
        const float *xr = STAGED ? row : src;
        float ss[1];
        mt_rows_fold<1>(ss, dim, [&](int64_t c) { return rms_step<STAGED || VEC, VEC, 1>{xr + c * MT_CHUNK, nullptr, nullptr}; },
                        part, part2, MT_SAB_RMS_NORM);
        const float rs = mt_rms_rstd(ss[0], dimf, eps);
        /* Finiteness, as the one-pass backward: a NaN or inf in x makes the row's sum of squares
         * NaN or inf, so x is looked at one by one only in a row whose sum is not (finite values
         * can overflow it too); w, the same for every row, in the block's first row only. */
        const bool look_x = !mt_is_finite(ss[0]), look_w = r == (int64_t)blockIdx.x;
        mt_rows_walk<VEC>(
            dim,
            [&](int64_t i) {
                float4 q = *(const float4 *)(xr + i), o;
                if (look_x) bx |= mt_norm_bad4(q);
                if (w) {
                    float4 g = *(const float4 *)(w + i);
                    if (look_w) bw |= mt_norm_bad4(g);
                    o = make_float4(mt_rms_y(q.x, rs, g.x), mt_rms_y(q.y, rs, g.y), mt_rms_y(q.z, rs, g.z),
                                    mt_rms_y(q.w, rs, g.w));
                } else {
                    o = make_float4(mt_rms_y(q.x, rs, 1.0f), mt_rms_y(q.y, rs, 1.0f), mt_rms_y(q.z, rs, 1.0f),
                                    mt_rms_y(q.w, rs, 1.0f));
                }
                MT_STCS((float4 *)(out + i), o);
            },
            [&](int64_t i) {
                float v = xr[i];
                if (look_x) bx |= !mt_is_finite(v);
                if (w) {
                    if (look_w) bw |= !mt_is_finite(w[i]);
                    out[i] = mt_rms_y(v, rs, w[i]);
                } else {
                    out[i] = mt_rms_y(v, rs, 1.0f);
                }
            });
        __syncthreads();   /* the row's shared memory is free again */
    }
    if (bx) bad[BAD_X] = 1;   /* every writer stores the same value: no atomic needed */
    if (bw) bad[BAD_W] = 1;
}

/* One row's backward from xr and dyr (shared memory, or global when not STAGED): its two
 * sums by the chunk tree, r to rstd[r] (thread 0; rstd NULL: not kept), dx (NULL: not written),
 * and the finiteness of what it read raised in bx, bdy, bw. Ends with the row's shared memory
 * still in use: the caller's barrier frees it. */
template <bool STAGED, bool VEC>
__device__ __forceinline__ void rms_backward_row(int64_t r, const float *xr, const float *dyr, float *dx, float *rstd,
                                                 const float *w, float eps, int64_t dim, float *part, float *part2,
                                                 bool &bx, bool &bdy, bool &bw) {
    float sums[2];
    mt_rows_fold<2>(sums, dim, [&](int64_t c) {
        return rms_step<STAGED || VEC, VEC, 2>{xr + c * MT_CHUNK, dyr + c * MT_CHUNK, w ? w + c * MT_CHUNK : nullptr};
    }, part, part2, MT_SAB_RMS_NORM);
    const float dimf = (float)dim, rs = mt_rms_rstd(sums[0], dimf, eps), k = mt_rms_k(sums[1], dimf, rs);
    if (rstd && threadIdx.x == 0) rstd[r] = rs;
    float *out = dx ? dx + r * dim : nullptr;
    mt_rows_walk<VEC>(
        dim,
        [&](int64_t i) {
            float4 q = *(const float4 *)(xr + i), g = *(const float4 *)(dyr + i);
            float4 wv = w ? *(const float4 *)(w + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
            bx |= mt_norm_bad4(q);
            bdy |= mt_norm_bad4(g);
            bw |= mt_norm_bad4(wv);
            if (out)
                MT_STCS((float4 *)(out + i),
                        make_float4(mt_rms_dx(g.x, wv.x, q.x, rs, k), mt_rms_dx(g.y, wv.y, q.y, rs, k),
                                    mt_rms_dx(g.z, wv.z, q.z, rs, k), mt_rms_dx(g.w, wv.w, q.w, rs, k)));
        },
        [&](int64_t i) {
            float q = xr[i], g = dyr[i], wv = w ? w[i] : 1.0f;
            bx |= !mt_is_finite(q);
            bdy |= !mt_is_finite(g);
            bw |= !mt_is_finite(wv);
            if (out) out[i] = mt_rms_dx(g, wv, q, rs, k);
        });
}

/* dx (or NULL) and r per row (or NULL) of every row; flags to both the device copy (read by
 * the dweight fold) and the mapped status. */
template <bool STAGED, bool VEC>
__global__ void __launch_bounds__(32 * RMS_MAX_WARPS)
    k_rms_backward(float *dx, float *rstd, const float *dy, const float *x, const float *w, float eps, int64_t rows,
                   int64_t dim, int32_t *bad_dev, int32_t *bad) {
    extern __shared__ float4 smem4[];
    const int64_t pitch = (dim + 3) / 4 * 4;
    float *xs = (float *)smem4, *dys = xs + (STAGED ? pitch : 0), *part = dys + (STAGED ? pitch : 0);
    float *part2 = part + 2 * mt_chunk_count(dim);
    bool bx = false, bdy = false, bw = false;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xg = x + r * dim, *dyg = dy + r * dim;
        if (STAGED) {
            mt_rows_stage<VEC>(xs, xg, dim);
            mt_rows_stage<VEC>(dys, dyg, dim);
            __syncthreads();
        }
        rms_backward_row<STAGED, VEC>(r, STAGED ? xs : xg, STAGED ? dys : dyg, dx, rstd, w, eps, dim, part, part2, bx,
                                      bdy, bw);
        __syncthreads();
    }
    if (bx) bad[BAD_X] = bad_dev[BAD_X] = 1;
    if (bdy) bad[BAD_DY] = bad_dev[BAD_DY] = 1;
    if (bw) bad[BAD_W] = bad_dev[BAD_W] = 1;
}

/* The token rule's leaves: partial (column c, leaf l) = chain over the leaf's rows, ascending,
 * of (dy, x * r) -- MT_DOT_STEP. RMS_ROW_BATCH rows' loads go out ahead of their steps. */
__global__ void __launch_bounds__(RMS_COL_THREADS, 4)
    k_rms_dweight_leaves(float *__restrict__ part, const float *__restrict__ dy, const float *__restrict__ x,
                         const float *__restrict__ rstd, int64_t rows, int64_t dim, int64_t leaves) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    for (int64_t l = blockIdx.y; l < leaves; l += gridDim.y) {
        int64_t r0 = l * MT_TOKEN_LEAF, r1 = r0 + MT_TOKEN_LEAF < rows ? r0 + MT_TOKEN_LEAF : rows;
        float acc = 0.0f;
        int64_t r = r0;
        for (; r + RMS_ROW_BATCH <= r1; r += RMS_ROW_BATCH) {
            float a[RMS_ROW_BATCH], b[RMS_ROW_BATCH], s[RMS_ROW_BATCH];
#pragma unroll
            for (int u = 0; u < RMS_ROW_BATCH; ++u) {
                a[u] = dy[(r + u) * dim + c];
                b[u] = x[(r + u) * dim + c];
                s[u] = rstd[r + u];
            }
#pragma unroll
            for (int u = 0; u < RMS_ROW_BATCH; ++u) acc = MT_DOT_STEP(a[u], b[u] * s[u], acc);
        }
        for (; r < r1; ++r) acc = MT_DOT_STEP(dy[r * dim + c], x[r * dim + c] * rstd[r], acc);
        part[c * leaves + l] = acc;
    }
}

/* dweight[c] = the pairwise tree of column c's leaf partials -- unless an input was refused. */
__global__ void __launch_bounds__(RMS_COL_THREADS)
    k_rms_dweight_fold(float *dweight, float *part, int64_t dim, int64_t leaves, const int32_t *bad_dev) {
    if (bad_dev[BAD_X] | bad_dev[BAD_DY] | bad_dev[BAD_W]) return;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c < dim) dweight[c] = mt_canonical_nan(mt_token_tree(part + c * leaves, leaves, 0));
}

/* ---- the backward with dweight in one pass over x and dy (CUDA) ----------------------------
 * The three kernels above read x and dy twice: the row kernel owns whole rows (a row's two
 * sums come before any of its dx), the dweight leaves own whole columns of a leaf. Here a block
 * owns a leaf's rows for one lane group: lanes 16 s .. 16 s + 15 of every chunk, i.e. the
 * 64-byte pieces at columns 128 j + 16 s (dim % 128 == 0: every lane of every chunk has
 * whole steps). Its lanes' chains over those columns (the chunk fold's own chains, whole) are
 * computed from shared memory and published; the RMS_GROUPS blocks of a leaf wait for each
 * other's lanes, window by window, and each then runs the lane tree, the tree over chunks and
 * r, k of every row itself (the same arithmetic in every block), writes its columns of dx and
 * carries its columns' dweight chains down the leaf in shared memory:
 * acc = fma(dy, x * r, acc), rows ascending. Same bits as the three kernels, one read of x
 * and dy. Windows of W rows are staged by cp.async RMS_TILES deep: window w + RMS_AHEAD's lanes
 * are published before window w's wait: a block's lanes go out with one release at gpu scope
 * (after a barrier: cumulative) on the window's counter, and thread 0 of each reader acquires
 * it before a barrier. (Every thread's fence instead: 417 us; each lane tagged with its window
 * in one 64-bit store, no counter: 421 us; this: 380 us; the release by a warp that stores no
 * dx: no faster. With the nineteenth session's diet -- finiteness from the sums, padded rows,
 * 32-bit walks, four barriers a window -- 440 us against 468 under ncu's base clocks; what
 * holds it now is the lockstep of a leaf's blocks: bench/results/NOTES.md.)
 * A cooperative launch keeps every block resident (a block spins on its group); the grid is
 * RMS_GROUPS x the leaves at once, each group walking leaves g, g + groups, ...
 * 16 groups of 8 lanes (32-byte pieces, two blocks an SM) measured slower (492 us against
 * 417 on the H200) and were dropped. */
#if !defined(MT_HIP) && !defined(__HIPCC__)
#define RMS_FUSED 1
#else
#define RMS_FUSED 0
#endif
#define RMS_GROUPS 8                            /* blocks of one leaf */
#define RMS_GLANES (MT_LANES / RMS_GROUPS)      /* lanes of one block: 64-byte pieces */
#define RMS_FUSED_THREADS 512                   /* a window's lane chains: one job a thread at W = 16 */
/* The slack between a leaf's blocks: RMS_TILES windows of x and dy staged in shared memory,
 * of which a block publishes up to RMS_AHEAD windows beyond the one it waits on (so a peer
 * holds it up only when RMS_AHEAD windows behind); the rest are loads in flight. The lanes'
 * ring then needs 2 RMS_AHEAD + 2 slots: a block publishing window w + A has seen every peer
 * publish w - 1, so a peer may still read window w - 1 - A's slot, not an older one. */
#ifndef RMS_TILES
#define RMS_TILES 3
#endif
#ifndef RMS_AHEAD
#define RMS_AHEAD 1
#endif
static_assert(RMS_AHEAD >= 1 && RMS_AHEAD + 2 <= RMS_TILES, "RMS_AHEAD windows published ahead need loads behind them");
#define RMS_RING (2 * RMS_AHEAD + 2)            /* windows of lanes in flight per group */
#define RMS_FUSED_MIN_LEAVES 8                  /* fewer leaves would leave most SMs idle */
#ifndef RMS_FUSED_MAX_W
#define RMS_FUSED_MAX_W 32
#endif

#if RMS_FUSED
struct rms_fused_args {
    float *dx, *part, *pub;   /* pub: RMS_RING windows of lanes per group */
    const float *dy, *x, *w;
    int32_t *count, *bad_dev, *bad;   /* count: blocks that published each window (leaf, window) */
    float eps;
    int64_t rows, dim, leaves;
    int wrows;          /* W: rows a window, a power of two dividing MT_TOKEN_LEAF */
};

/* A row of a window in shared memory: the block's columns, and 16 floats more where they are
 * a multiple of 32, so that the two half-warps of a publish job (rows i and i + 1) read
 * opposite halves of the banks. */
__host__ __device__ inline int64_t rms_fused_pitch(int64_t dim) {
    const int64_t cols = dim / MT_LANES * RMS_GLANES;
    return cols % 32 ? cols : cols + 16;
}

/* Shared floats of one block: RMS_TILES windows of x and dy, w and the chains of its columns, r
 * and k of a window's rows, their chunk roots, and a window's flag (below). */
__host__ __device__ inline int64_t rms_fused_floats(int64_t dim, int64_t wrows) {
    int64_t cols = dim / MT_LANES * RMS_GLANES;
    return RMS_TILES * 2 * wrows * rms_fused_pitch(dim) + 2 * cols + 2 * wrows + 2 * wrows * mt_chunk_count(dim) + 1;
}

__global__ void __launch_bounds__(RMS_FUSED_THREADS, 1) k_rms_backward_leaves(const rms_fused_args A) {
    extern __shared__ float4 smem4[];
    const int s = blockIdx.x % RMS_GROUPS, group = blockIdx.x / RMS_GROUPS, groups = gridDim.x / RMS_GROUPS;
    const int W = A.wrows, lw = __ffs(W) - 1, tid = threadIdx.x, nt = blockDim.x;
    const int64_t dim = A.dim;
    /* 32-bit sizes (dim < 2^22 here: a window's shared memory bounds it) */
    const int segs = (int)(dim / MT_LANES), cols = segs * RMS_GLANES, chunks = (int)mt_chunk_count(dim), q4 = cols / 4;
    const int pitch = (int)rms_fused_pitch(dim), tile = 2 * W * pitch, ring = W * 2 * chunks * MT_LANES;
    float *tiles = (float *)smem4, *ws = tiles + RMS_TILES * tile, *acc = ws + cols, *rsv = acc + cols, *kv = rsv + W,
          *roots = kv + W;
    int *suspect = (int *)(roots + 2 * W * chunks);   /* a row of the window has a sum that is not finite */
    const float dimf = (float)dim;
    bool bx = false, bdy = false, bw = false;
    /* A thread's float4 of a window: rows my_i, my_i + rpp, ..., float4 columns my_k, my_k + kstep, ... */
    const int rpp = q4 >= nt ? 1 : nt / q4, kstep = q4 >= nt ? nt : q4;
    const int my_i = q4 >= nt ? 0 : tid / q4, my_k = q4 >= nt ? tid : tid % q4;
    const bool walks = my_i < rpp;
    /* column k of the block (k = 16 j + o) is the global column 128 j + 16 s + o */
    auto gcol = [&](int k) { return (int64_t)(k / RMS_GLANES) * MT_LANES + RMS_GLANES * s + k % RMS_GLANES; };
    /* the global column of the thread's first float4, and how far the next one is */
    const int64_t my_gcol = gcol(4 * my_k);
    const int64_t gstep = (int64_t)(4 * kstep / RMS_GLANES) * MT_LANES;   /* 4 kstep is a multiple of RMS_GLANES */
    const int64_t rstep = (int64_t)rpp * dim;                            /* global floats between a thread's rows */
    const int my_s = my_i * pitch + 4 * my_k;                             /* its first float4 in a tile */
    for (int k = tid; k < cols; k += nt) {
        float v = A.w[gcol(k)];
        bw |= !mt_is_finite(v);
        ws[k] = v;
        acc[k] = 0.0f;
    }
    int64_t seq = 0;   /* windows the group walked before this leaf: window w's lanes sit in ring slot (seq + w) % RMS_RING */
    for (int64_t L = group; L < A.leaves; L += groups) {
        const int64_t r_leaf = L * MT_TOKEN_LEAF;
        const int n_leaf = (int)(A.rows - r_leaf < MT_TOKEN_LEAF ? A.rows - r_leaf : MT_TOKEN_LEAF);
        const int nwin = (n_leaf + W - 1) / W;
        int32_t *count = A.count + L * (MT_TOKEN_LEAF / W);
        auto rows_of = [&](int w) { return n_leaf - w * W < W ? n_leaf - w * W : W; };
        auto lanes_of = [&](int w) { return A.pub + ((int64_t)group * RMS_RING + (seq + w) % RMS_RING) * ring; };
        /* the offset of the thread's first float of window w in x, dy and dx */
        auto first = [&](int w) { return (r_leaf + (int64_t)w * W + my_i) * dim + my_gcol; };
        auto issue = [&](int w) {   /* window w's x and dy into its tile (one cp.async group) */
            if (w < nwin && walks) {
                float *t = tiles + (w % RMS_TILES) * tile + my_s;
                const int n = rows_of(w);
                const float *xr = A.x + first(w), *dr = A.dy + first(w);
                for (int i = my_i; i < n; i += rpp, xr += rstep, dr += rstep, t += rpp * pitch) {
                    const float *xq = xr, *dq = dr;
                    for (int k4 = 0; k4 < q4 - my_k; k4 += kstep, xq += gstep, dq += gstep) {
                        mt_cp_async16(t + 4 * k4, xq, 16);
                        mt_cp_async16(t + W * pitch + 4 * k4, dq, 16);
                    }
                }
            }
            mt_cp_async_commit();
        };
        auto publish = [&](int w) {   /* window w's lane chains: RMS_GLANES threads per (sum, chunk, row) */
            const float *xs = tiles + (w % RMS_TILES) * tile, *dys = xs + W * pitch;
            float *pub = lanes_of(w);
            const int n = rows_of(w), o = tid % RMS_GLANES;
            /* rows vary fastest: a warp's two jobs are rows i and i + 1 (conflict-free by the pitch)
             * of one sum (no divergence) */
            for (int u = tid / RMS_GLANES; u < 2 * chunks * W; u += nt / RMS_GLANES) {
                const int i = u & (W - 1), qc = u >> lw, q = qc >= chunks, c = qc - q * chunks;
                if (i >= n) continue;
                const int j0 = c * MT_ROWS, steps = segs - j0 < MT_ROWS ? segs - j0 : MT_ROWS;
                const int at = i * pitch + j0 * RMS_GLANES + o;
                const float *xr = xs + at, *dr = dys + at, *wr = ws + j0 * RMS_GLANES + o;
                float a = 0.0f;
                if (q)
                    for (int v = 0; v < steps; ++v) {
                        const int j = (MT_SAB_RMS_NORM ? steps - 1 - v : v) * RMS_GLANES;
                        a = fmaf(dr[j] * wr[j], xr[j], a);   /* MT_STEP_GDOT */
                    }
                else
                    for (int v = 0; v < steps; ++v) {
                        const int j = (MT_SAB_RMS_NORM ? steps - 1 - v : v) * RMS_GLANES;
                        a = fmaf(xr[j], xr[j], a);           /* MT_STEP_SUMSQ */
                    }
                pub[((i * 2 + q) * chunks + c) * MT_LANES + RMS_GLANES * s + o] = a;
            }
            __syncthreads();   /* then one release at gpu scope publishes the block's writes (cumulative) */
            if (tid == 0) mt_add_release_gpu(count + w, 1);
        };
        auto stats = [&](int w) {   /* r and k of window w's rows (a warp a row), once every block published */
            if (tid == 0) {   /* an acquire at gpu scope, then the barrier orders everyone's reads after it */
                while (mt_load_acquire_gpu(count + w) < RMS_GROUPS) mt_spin_pause();
                *suspect = 0;   /* the last window's apply read it before its barrier */
            }
            __syncthreads();
            const float *pub = lanes_of(w);
            const int n = rows_of(w), lane = tid & 31;
            for (int i = tid / 32; i < n; i += nt / 32) {
                float *rt = roots + 2 * i * chunks;   /* the row's chunk roots: squares, then the dot */
                for (int item = 0; item < 2 * chunks; ++item) {
                    const float4 v = __ldcg((const float4 *)(pub + (2 * i * chunks + item) * MT_LANES) + lane);   /* L2: never a stale L1 line */
                    float a[4] = {v.x, v.y, v.z, v.w};
                    const float root = mt_warp_lane_tree(a);
                    if (lane == 0) rt[item] = root;
                }
                if (lane == 0) {   /* the roots it folds are its own writes */
                    const float ss = mt_tree_fold(rt, chunks), gd = mt_tree_fold(rt + chunks, chunks);
                    const float r = mt_rms_rstd(ss, dimf, A.eps);
                    rsv[i] = r;
                    kv[i] = mt_rms_k(gd, dimf, r);
                    if (!(mt_is_finite(ss) & mt_is_finite(gd))) *suspect = 1;
                }
            }
            __syncthreads();
        };
        /* Finiteness of x and dy: a NaN or inf in a row's x makes its sum of squares NaN or inf,
         * one in its dy (w finite or not) its dot with dy * w (a product with inf is inf or NaN,
         * and both stay so through the chains and trees). So a window whose sums are all finite
         * holds only finite x and dy, and only another window's values are looked at one by one
         * (a sum can also overflow from finite values). */
        auto look = [&](const float *xs, const float *dys, int n) {
            for (int i = 0; i < n; ++i)
                for (int k = tid; k < cols; k += nt) {
                    bx |= !mt_is_finite(xs[i * pitch + k]);
                    bdy |= !mt_is_finite(dys[i * pitch + k]);
                }
        };
        auto apply = [&](int w) {   /* window w's dx, and its rows' steps of the dweight chains */
            const float *xs = tiles + (w % RMS_TILES) * tile, *dys = xs + W * pitch;
            const int n = rows_of(w);
            if (*suspect) look(xs, dys, n);
            if (A.dx && walks) {
                float *dxr = A.dx + first(w);
                const float *xt = xs + my_s;
                for (int i = my_i; i < n; i += rpp, dxr += rstep, xt += rpp * pitch) {
                    const float r = rsv[i], kk = kv[i];
                    float *dq = dxr;
                    for (int k4 = 0; k4 < q4 - my_k; k4 += kstep, dq += gstep) {
                        const float4 q = *(const float4 *)(xt + 4 * k4), g = *(const float4 *)(xt + W * pitch + 4 * k4);
                        const float4 wv = *(const float4 *)(ws + 4 * (my_k + k4));
                        MT_STCS((float4 *)dq,
                                make_float4(mt_rms_dx(g.x, wv.x, q.x, r, kk), mt_rms_dx(g.y, wv.y, q.y, r, kk),
                                            mt_rms_dx(g.z, wv.z, q.z, r, kk), mt_rms_dx(g.w, wv.w, q.w, r, kk)));
                    }
                }
            }
            for (int k = tid; k < cols; k += nt) {
                float a = acc[k];
                for (int i = 0; i < n; ++i) a = MT_DOT_STEP(dys[i * pitch + k], xs[i * pitch + k] * rsv[i], a);
                acc[k] = a;
            }
            /* window w + A + 1 (the next publish's): the groups issued after it may stay out */
            mt_cp_async_wait<RMS_TILES - RMS_AHEAD - 2>();
            __syncthreads();   /* ... is in for everyone, and window w's tile is free */
        };
        /* Four barriers a window: publish's (before its release), two in stats, apply's last.
         * Windows 0..A in first; the loop publishes w + A, waits on w, applies w and reloads
         * w's tile with w + RMS_TILES (an empty group past the leaf's end keeps the count). */
        for (int w = 0; w <= RMS_AHEAD; ++w) issue(w);
        mt_cp_async_wait<0>();
        __syncthreads();
        for (int w = 0; w < RMS_AHEAD && w < nwin; ++w) publish(w);
        for (int w = RMS_AHEAD + 1; w < RMS_TILES; ++w) issue(w);
        for (int w = 0; w < nwin; ++w) {
            if (w + RMS_AHEAD < nwin) publish(w + RMS_AHEAD);
            stats(w);
            apply(w);
            issue(w + RMS_TILES);   /* into the tile w used */
        }
        for (int k = tid; k < cols; k += nt) {
            A.part[gcol(k) * A.leaves + L] = acc[k];
            acc[k] = 0.0f;
        }
        seq += nwin;
    }
    mt_cp_async_wait<0>();
    if (bx) A.bad[BAD_X] = A.bad_dev[BAD_X] = 1;
    if (bdy) A.bad[BAD_DY] = A.bad_dev[BAD_DY] = 1;
    if (bw) A.bad[BAD_W] = A.bad_dev[BAD_W] = 1;
}

/* ---- the backward with dweight as a relay: row blocks hand r to column walkers -------------
 * One cooperative kernel, two roles. Row blocks run k_rms_backward's row (the same function:
 * both sums, r, dx) over rows in window-major order -- window v (RMS_RELAY_W rows) of every
 * leaf before window v + 1 of any -- and after each row thread 0, which wrote its r, releases
 * the window's counter at gpu scope. Walker blocks own a leaf's columns, four a thread, and
 * carry k_rms_dweight_leaves' chains down the leaf (acc = fma(dy, x * r, acc), rows ascending):
 * they wait for a window's counter (thread 0's acquire, then a barrier), then read its r through
 * L2 and its x and dy, which the row blocks read a moment before (loaded into L2 with normal
 * priority here, not streamed: the walkers' reads are meant to hit there). Row blocks never
 * wait, so nothing waits on a walker; the launch is cooperative because walkers spin on row
 * blocks that must be resident. The same arithmetic in the same order as the three kernels:
 * the card's bits. Against the lockstep above, no block waits for a peer's lanes: a walker
 * trails the rows by the window, and x and dy come from DRAM once if L2 holds that lag.
 * Measured slower on an H200 (fortieth session: backward 0.455-0.465 ms against the lockstep's
 * 0.391-0.393 at 16384 x 4096), most likely because the walkers miss L2 (not yet profiled):
 * kept opt-in, the same bits, for the profile that says why (bench/results/NOTES.md). */
#ifndef RMS_RELAY_W
#define RMS_RELAY_W 16          /* rows a window: the walkers' unit of waiting */
#endif
#ifndef RMS_RELAY_BATCH
#define RMS_RELAY_BATCH 8       /* rows whose loads a walker thread has in flight */
#endif
#ifndef RMS_RELAY_ROWS_PER_SM
#define RMS_RELAY_ROWS_PER_SM 0 /* row blocks an SM at most (0: as many as fit) */
#endif
static_assert(MT_TOKEN_LEAF % RMS_RELAY_W == 0 && RMS_RELAY_W % RMS_RELAY_BATCH == 0, "whole windows and batches");

struct rms_relay_args {
    float *dx, *rstd, *part;
    const float *dy, *x, *w;
    int32_t *count, *bad_dev, *bad;   /* count: rows done of each (leaf, window) */
    float eps;
    int64_t rows, dim, leaves;
    int walkers, per_leaf;            /* walker blocks (the first ones), and of one leaf */
};

__device__ __forceinline__ int64_t rms_relay_rows_of(int64_t rows, int64_t leaf, int64_t win) {
    const int64_t first = leaf * MT_TOKEN_LEAF + win * RMS_RELAY_W, n = rows - first;
    return n < RMS_RELAY_W ? n : RMS_RELAY_W;
}

__global__ void __launch_bounds__(32 * RMS_MAX_WARPS) k_rms_backward_relay(const rms_relay_args A) {
    extern __shared__ float4 smem4[];
    const int64_t dim = A.dim, wins = MT_TOKEN_LEAF / RMS_RELAY_W;
    const int tid = threadIdx.x, nt = blockDim.x;
    if ((int)blockIdx.x < A.walkers) {
        const int64_t leaf = blockIdx.x / A.per_leaf, c = ((int64_t)(blockIdx.x % A.per_leaf) * nt + tid) * 4;
        const int64_t r0 = leaf * MT_TOKEN_LEAF, n_leaf = A.rows - r0 < MT_TOKEN_LEAF ? A.rows - r0 : MT_TOKEN_LEAF;
        const bool mine = c < dim;   /* dim % 4 == 0: whole float4 */
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int64_t v = 0; v * RMS_RELAY_W < n_leaf; ++v) {
            const int64_t n = rms_relay_rows_of(A.rows, leaf, v), ra = r0 + v * RMS_RELAY_W;
            if (tid == 0)
                while (mt_load_acquire_gpu(A.count + leaf * wins + v) < n) mt_spin_pause();
            __syncthreads();
            if (!mine) continue;
            const float *xp = A.x + ra * dim + c, *dp = A.dy + ra * dim + c;
            int64_t i = 0;
            for (; i + RMS_RELAY_BATCH <= n; i += RMS_RELAY_BATCH) {
                float4 xv[RMS_RELAY_BATCH], dv[RMS_RELAY_BATCH];
                float s[RMS_RELAY_BATCH];
#pragma unroll
                for (int u = 0; u < RMS_RELAY_BATCH; ++u) {
                    xv[u] = __ldcs((const float4 *)(xp + (i + u) * dim));
                    dv[u] = __ldcs((const float4 *)(dp + (i + u) * dim));
                    s[u] = __ldcg(A.rstd + ra + i + u);   /* L2: never a stale L1 line */
                }
#pragma unroll
                for (int u = 0; u < RMS_RELAY_BATCH; ++u) {
                    acc.x = MT_DOT_STEP(dv[u].x, xv[u].x * s[u], acc.x);
                    acc.y = MT_DOT_STEP(dv[u].y, xv[u].y * s[u], acc.y);
                    acc.z = MT_DOT_STEP(dv[u].z, xv[u].z * s[u], acc.z);
                    acc.w = MT_DOT_STEP(dv[u].w, xv[u].w * s[u], acc.w);
                }
            }
            for (; i < n; ++i) {
                const float4 xv = __ldcs((const float4 *)(xp + i * dim)), dv = __ldcs((const float4 *)(dp + i * dim));
                const float s = __ldcg(A.rstd + ra + i);
                acc.x = MT_DOT_STEP(dv.x, xv.x * s, acc.x);
                acc.y = MT_DOT_STEP(dv.y, xv.y * s, acc.y);
                acc.z = MT_DOT_STEP(dv.z, xv.z * s, acc.z);
                acc.w = MT_DOT_STEP(dv.w, xv.w * s, acc.w);
            }
        }
        if (mine) {
            A.part[c * A.leaves + leaf] = acc.x;
            A.part[(c + 1) * A.leaves + leaf] = acc.y;
            A.part[(c + 2) * A.leaves + leaf] = acc.z;
            A.part[(c + 3) * A.leaves + leaf] = acc.w;
        }
        return;
    }
    /* a row block: k_rms_backward's staged, aligned row, its copies all in flight at once */
    float *xs = (float *)smem4, *dys = xs + dim, *part = dys + dim, *part2 = part + 2 * mt_chunk_count(dim);
    bool bx = false, bdy = false, bw = false;
    const int64_t producers = gridDim.x - A.walkers, tasks = A.leaves * MT_TOKEN_LEAF;
    for (int64_t t = blockIdx.x - A.walkers; t < tasks; t += producers) {
        const int64_t i = t % RMS_RELAY_W, lv = t / RMS_RELAY_W, leaf = lv % A.leaves, v = lv / A.leaves;
        const int64_t r = leaf * MT_TOKEN_LEAF + v * RMS_RELAY_W + i;
        if (r >= A.rows) continue;   /* the last leaf's missing rows: the same for the whole block */
        mt_rows_stage_async(xs, A.x + r * dim, dim);
        mt_rows_stage_async(dys, A.dy + r * dim, dim);
        mt_cp_async_commit();
        mt_cp_async_wait<0>();
        __syncthreads();
        rms_backward_row<true, true>(r, xs, dys, A.dx, A.rstd, A.w, A.eps, dim, part, part2, bx, bdy, bw);
        __syncthreads();   /* the row's shared memory is free; thread 0 wrote r before it */
        if (tid == 0) mt_add_release_gpu(A.count + leaf * wins + v, 1);
    }
    if (bx) A.bad[BAD_X] = A.bad_dev[BAD_X] = 1;
    if (bdy) A.bad[BAD_DY] = A.bad_dev[BAD_DY] = 1;
    if (bw) A.bad[BAD_W] = A.bad_dev[BAD_W] = 1;
}
#endif

/* ---- host ---- */

const char *const RMS_NAMES[3] = {"x", "dy", "weight"};

MT_NOINLINE int rms_forward(float *y, const float *x, const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    mt_rows_status *st = nullptr;
    mt_norm_fwd_bufs f;
    if ((rc = mt_norm_begin(mt_check_rms_norm_forward_args(y, x, eps, rows, dim), &st)) ||
        (rc = mt_norm_fwd_stage(&f, y, x, weight, nullptr, rows, dim)))
        return rc;
    if (rows == 0) {
        if ((rc = mt_norm_check_param(f.w, dim, &st->bad[BAD_W], "weight finiteness"))) return rc;
    } else {
        static std::once_flag once[4];
        mt_norm_plan p = mt_norm_plan_rows(1, 1, dim, RMS_MIN_WARPS, RMS_MAX_WARPS);
        bool vec = mt_norm_fwd_vec(f, dim);
        auto kernel = p.staged ? (vec ? k_rms_forward<true, true> : k_rms_forward<true, false>)
                               : (vec ? k_rms_forward<false, true> : k_rms_forward<false, false>);
        int grid = 0;
        if ((rc = mt_norm_launch_rows(kernel, once[2 * p.staged + vec], p, rows, &grid))) return rc;
        kernel<<<grid, p.threads, p.smem, MT_STREAM>>>(f.y, f.x, f.w, eps, rows, dim, st->bad);
        if ((rc = mt_rows_launched("rms_norm forward"))) return rc;
    }
    static const int order[2] = {BAD_X, BAD_W};
    return mt_rows_finish(st, order, 2, RMS_NAMES, f.sy ? y : nullptr, f.y, rows * dim * 4, nullptr, nullptr, 0);
}

/* dweight from its leaf partials (b.pw), unless an input was refused. */
int rms_dweight_fold(const mt_norm_bwd_bufs &b, int64_t dim, int64_t leaves) {
    k_rms_dweight_fold<<<mt_norm_leaf_grid(dim, leaves, RMS_COL_THREADS).x, RMS_COL_THREADS, 0, MT_STREAM>>>(
        b.dweight, b.pw, dim, leaves, b.flags);
    return mt_rows_launched("rms_norm dweight fold");
}

#if RMS_FUSED
/* A one-pass backward kernel launched cooperatively (its only argument: *args), then dweight's
 * fold; *done says whether it ran. A launch the device refuses for its size (e.g. another
 * device than the one sized for) leaves *done false: the other paths instead. */
template <class Args>
int rms_cooperative_then_fold(const void *kernel, int blocks, int threads, Args *args, size_t smem,
                              const mt_norm_bwd_bufs &b, int64_t dim, int64_t leaves, const char *what, bool *done) {
    void *argv[1] = {args};
    cudaError_t err = cudaLaunchCooperativeKernel(kernel, dim3((unsigned)blocks), dim3(threads), argv, smem, MT_STREAM);
    if (err == cudaErrorCooperativeLaunchTooLarge || err == cudaErrorNotSupported) {
        gpuGetLastError();
        return MT_OK;
    }
    MT_GPU_CHECK(err, what);
    mt_gpu_record_launch(threads, blocks);   /* what mt_launch_geometry reads back */
    int rc;
    if ((rc = rms_dweight_fold(b, dim, leaves))) return rc;
    *done = true;
    return MT_OK;
}

/* Whether the device can launch cooperative kernels (asked once). */
bool mt_rows_cooperative() {
    static int cooperative = -1;
    if (cooperative < 0) {
        int v = 0, dev = 0;
        cooperative = cudaGetDevice(&dev) == cudaSuccess &&
                      cudaDeviceGetAttribute(&v, cudaDevAttrCooperativeLaunch, dev) == cudaSuccess && v;
        gpuGetLastError();
    }
    return cooperative;
}
#endif

/* The one-pass backward (k_rms_backward_leaves) when it applies: *done says whether it ran.
 * It needs dweight, dim % 128 == 0, 16-byte aligned rows, at least RMS_FUSED_MIN_LEAVES leaves
 * and shared memory for a window; MOJO_TRAIN_RMS_ONE_PASS=0 switches it off (an A/B switch:
 * the same bits either way). */
int rms_bwd_one_pass(mt_norm_bwd_bufs &b, float eps, int64_t rows, int64_t dim, mt_rows_status *st, bool *done) {
    *done = false;
#if RMS_FUSED
    static const bool off = getenv("MOJO_TRAIN_RMS_ONE_PASS") && getenv("MOJO_TRAIN_RMS_ONE_PASS")[0] == '0';
    const int64_t leaves = mt_token_leaves(rows);
    if (off || !b.dweight || !b.w || dim % MT_LANES || !mt_norm_bwd_vec(b, dim) || leaves < RMS_FUSED_MIN_LEAVES)
        return MT_OK;
    const size_t optin = (size_t)mt_rows_limits().smem_optin;
    int wrows = RMS_FUSED_MAX_W;
    while (wrows > 1 && (size_t)rms_fused_floats(dim, wrows) * 4 > optin) wrows /= 2;
    const size_t smem = (size_t)rms_fused_floats(dim, wrows) * 4;
    if (smem > optin) return MT_OK;
    static std::once_flag once;
    if (!mt_rows_cooperative()) return MT_OK;
    int rc, per_sm = 0;
    if ((rc = mt_rows_allow_smem(k_rms_backward_leaves, once))) return rc;
    MT_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_rms_backward_leaves, RMS_FUSED_THREADS, smem),
                 "occupancy");
    int64_t groups = (int64_t)per_sm * mt_rows_limits().sms / RMS_GROUPS, cap = mt_gpu_blocks(INT64_MAX / 2, 1) / RMS_GROUPS;
    if (groups > cap) groups = cap;
    if (groups > leaves) groups = leaves;
    if (groups < 1) return MT_OK;
    rms_fused_args a;
    a.dx = b.dx; a.part = b.pw; a.dy = b.dy; a.x = b.x; a.w = b.w;
    a.bad_dev = b.flags; a.bad = st->bad; a.eps = eps; a.rows = rows; a.dim = dim; a.leaves = leaves; a.wrows = wrows;
    const int64_t windows = leaves * (MT_TOKEN_LEAF / wrows);
    if ((rc = b.arena.alloc((void **)&a.pub, groups * RMS_RING * (int64_t)wrows * 2 * mt_chunk_count(dim) * MT_LANES * 4)) ||
        (rc = b.arena.alloc((void **)&a.count, windows * 4)))
        return rc;
    MT_GPU_CHECK(gpuMemsetAsync(a.count, 0, (size_t)windows * 4, MT_STREAM), "window counters");
    return rms_cooperative_then_fold((const void *)k_rms_backward_leaves, (int)(groups * RMS_GROUPS), RMS_FUSED_THREADS,
                                     &a, smem, b, dim, leaves, "rms_norm backward (one pass)", done);
#else
    (void)b; (void)eps; (void)rows; (void)dim; (void)st;
#endif
    return MT_OK;
}

/* The relay backward (k_rms_backward_relay) when it applies: *done says whether it ran. It needs
 * dweight, 16-byte aligned rows, a staged row pair that fits, at least RMS_FUSED_MIN_LEAVES
 * leaves, a cooperative launch, and room for every walker and some row blocks at once. Opt-in,
 * being slower than the lockstep kernel where measured: MOJO_TRAIN_RMS_RELAY=1 (an A/B switch:
 * the same bits either way). */
int rms_bwd_relay(mt_norm_bwd_bufs &b, float eps, int64_t rows, int64_t dim, mt_rows_status *st, bool *done) {
    *done = false;
#if RMS_FUSED
    static const bool on = getenv("MOJO_TRAIN_RMS_RELAY") && getenv("MOJO_TRAIN_RMS_RELAY")[0] == '1';
    const int64_t leaves = mt_token_leaves(rows);
    if (!on || !b.dweight || !mt_norm_bwd_vec(b, dim) || leaves < RMS_FUSED_MIN_LEAVES) return MT_OK;
    const mt_norm_plan p = mt_norm_plan_rows(2, 2, dim, RMS_MIN_WARPS, RMS_MAX_WARPS);
    if (!p.staged || !mt_rows_cooperative()) return MT_OK;
    static std::once_flag once;
    int rc, per_sm = 0;
    if ((rc = mt_rows_allow_smem(k_rms_backward_relay, once))) return rc;
    MT_GPU_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k_rms_backward_relay, p.threads, p.smem),
                 "occupancy");
    const int64_t sms = mt_rows_limits().sms, per_leaf = (dim / 4 + p.threads - 1) / p.threads, walkers = leaves * per_leaf;
    int64_t producers = (int64_t)per_sm * sms - walkers, cap = mt_gpu_blocks(INT64_MAX / 2, 1) - walkers;
    if (RMS_RELAY_ROWS_PER_SM > 0 && producers > RMS_RELAY_ROWS_PER_SM * sms) producers = RMS_RELAY_ROWS_PER_SM * sms;
    if (producers > cap) producers = cap;
    if (producers < 1 || walkers + producers > INT32_MAX) return MT_OK;
    rms_relay_args a;
    a.dx = b.dx; a.part = b.pw; a.dy = b.dy; a.x = b.x; a.w = b.w;
    a.bad_dev = b.flags; a.bad = st->bad; a.eps = eps; a.rows = rows; a.dim = dim; a.leaves = leaves;
    a.walkers = (int)walkers; a.per_leaf = (int)per_leaf;
    const int64_t windows = leaves * (MT_TOKEN_LEAF / RMS_RELAY_W);
    if ((rc = b.arena.alloc((void **)&a.rstd, rows * 4)) || (rc = b.arena.alloc((void **)&a.count, windows * 4)))
        return rc;
    MT_GPU_CHECK(gpuMemsetAsync(a.count, 0, (size_t)windows * 4, MT_STREAM), "window counters");
    return rms_cooperative_then_fold((const void *)k_rms_backward_relay, (int)(walkers + producers), p.threads, &a, p.smem,
                                     b, dim, leaves, "rms_norm backward (relay)", done);
#else
    (void)b; (void)eps; (void)rows; (void)dim; (void)st;
#endif
    return MT_OK;
}

/* The backward's kernels (b.pw: dweight's leaf partials; the three kernels' b.stats, r per row,
 * allocated here: the one-pass kernel keeps r in shared memory). */
int rms_bwd_launch(mt_norm_bwd_bufs &b, float eps, int64_t rows, int64_t dim, mt_rows_status *st) {
    bool done = false;
    int rc0 = rms_bwd_relay(b, eps, rows, dim, st, &done);
    if (!rc0 && !done) rc0 = rms_bwd_one_pass(b, eps, rows, dim, st, &done);
    if (rc0 || done) return rc0;
    static std::once_flag once[4];
    mt_norm_plan p = mt_norm_plan_rows(2, 2, dim, RMS_MIN_WARPS, RMS_MAX_WARPS);
    bool vec = mt_norm_bwd_vec(b, dim);
    auto kernel = p.staged ? (vec ? k_rms_backward<true, true> : k_rms_backward<true, false>)
                           : (vec ? k_rms_backward<false, true> : k_rms_backward<false, false>);
    int rc, grid = 0;
    if ((b.dweight && (rc = b.arena.alloc((void **)&b.stats, rows * 4))) ||   /* r per row, for the leaves */
        (rc = mt_norm_launch_rows(kernel, once[2 * p.staged + vec], p, rows, &grid)))
        return rc;
    kernel<<<grid, p.threads, p.smem, MT_STREAM>>>(b.dx, b.stats, b.dy, b.x, b.w, eps, rows, dim, b.flags, st->bad);
    if ((rc = mt_rows_launched("rms_norm backward")) || !b.dweight) return rc;
    int64_t leaves = mt_token_leaves(rows);
    dim3 g = mt_norm_leaf_grid(dim, leaves, RMS_COL_THREADS);
    k_rms_dweight_leaves<<<g, RMS_COL_THREADS, 0, MT_STREAM>>>(b.pw, b.dy, b.x, b.stats, rows, dim, leaves);
    if ((rc = mt_rows_launched("rms_norm dweight leaves"))) return rc;
    return rms_dweight_fold(b, dim, leaves);
}

MT_NOINLINE int rms_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight, float eps,
                 int64_t rows, int64_t dim) {
    int rc;
    mt_rows_status *st = nullptr;
    mt_norm_bwd_bufs b;
    if ((rc = mt_norm_begin(mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim), &st)) ||
        (rc = mt_norm_bwd_stage(&b, dx, dweight, nullptr, dy, x, weight, rows, dim, 0)) ||
        (rc = rows == 0 ? mt_norm_bwd_no_rows(b, dim, &st->bad[BAD_W]) : rms_bwd_launch(b, eps, rows, dim, st)))
        return rc;
    static const int order[3] = {BAD_DY, BAD_X, BAD_W};
    return mt_rows_finish(st, order, 3, RMS_NAMES, b.sdx ? dx : nullptr, b.dx, rows * dim * 4,
                          b.sdw ? dweight : nullptr, b.dweight, dim * 4);
}

}  // namespace

extern "C" {

int mt_rms_norm_forward(float *y, const float *x, const float *weight, float eps, int64_t rows, int64_t dim) {
    /* eps's check compares floats: IEEE defaults, as the oracle */
    MT_RETURN_IN_FP_ENV(rms_forward(y, x, weight, eps, rows, dim));
}

int mt_rms_norm_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight, float eps,
                         int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(rms_backward(dx, dweight, dy, x, weight, eps, rows, dim));
}

}  /* extern "C" */
