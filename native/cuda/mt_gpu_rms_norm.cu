/* mt_gpu_rms_norm.cu -- RMSNorm on a GPU (contract: native/contracts/rms_norm.md); the same
 * bits as the CPU oracle (native/cpu_oracle/mt_cpu_rms_norm.c) in the identical numeric mode.
 *
 * RMSNorm forward, one kernel: each block takes rows in turn, stages the row in shared memory
 * (or, when it does not fit, reads it from global memory twice), folds the squares by the
 * chunk tree (one warp per 4096-chunk, mt_warp_chunk_fold, then mt_block_tree_fold), forms
 * r = mt_rms_rstd and writes y.
 * Backward, up to three kernels: k_rms_backward stages x and dy, folds the squares and the
 * row dot of (dy * w, x) in one walk, writes dx (mt_rms_dx) and keeps r per row; with dweight,
 * k_rms_dweight_leaves runs the token rule's leaves (one thread per column walks a leaf's rows
 * in ascending order: acc = fma(dy, x * r, acc), coalesced across columns) into partials laid
 * out (column, leaf), and k_rms_dweight_fold folds each column's partials (mt_token_tree).
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
        if (STAGED) {
            mt_rows_stage<VEC>(row, src, dim);
            __syncthreads();
        }
        const float *xr = STAGED ? row : src;
        float ss[1];
        mt_rows_fold<1>(ss, dim, [&](int64_t c) { return rms_step<STAGED || VEC, VEC, 1>{xr + c * MT_CHUNK, nullptr, nullptr}; },
                        part, part2, MT_SAB_RMS_NORM);
        const float rs = mt_rms_rstd(ss[0], dimf, eps);
        mt_rows_walk<VEC>(
            dim,
            [&](int64_t i) {
                float4 q = *(const float4 *)(xr + i), o;
                bx |= mt_norm_bad4(q);
                if (w) {
                    float4 g = *(const float4 *)(w + i);
                    bw |= mt_norm_bad4(g);
                    o = make_float4((q.x * rs) * g.x, (q.y * rs) * g.y, (q.z * rs) * g.z, (q.w * rs) * g.w);
                } else {
                    o = make_float4(q.x * rs, q.y * rs, q.z * rs, q.w * rs);
                }
                MT_STCS((float4 *)(out + i), o);
            },
            [&](int64_t i) {
                float v = xr[i];
                bx |= !mt_is_finite(v);
                if (w) {
                    bw |= !mt_is_finite(w[i]);
                    out[i] = (v * rs) * w[i];
                } else {
                    out[i] = v * rs;
                }
            });
        __syncthreads();   /* the row's shared memory is free again */
    }
    if (bx) bad[BAD_X] = 1;   /* every writer stores the same value: no atomic needed */
    if (bw) bad[BAD_W] = 1;
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
    const float dimf = (float)dim;
    bool bx = false, bdy = false, bw = false;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xg = x + r * dim, *dyg = dy + r * dim;
        if (STAGED) {
            mt_rows_stage<VEC>(xs, xg, dim);
            mt_rows_stage<VEC>(dys, dyg, dim);
            __syncthreads();
        }
        const float *xr = STAGED ? xs : xg, *dyr = STAGED ? dys : dyg;
        float sums[2];
        mt_rows_fold<2>(sums, dim, [&](int64_t c) {
            return rms_step<STAGED || VEC, VEC, 2>{xr + c * MT_CHUNK, dyr + c * MT_CHUNK, w ? w + c * MT_CHUNK : nullptr};
        }, part, part2, MT_SAB_RMS_NORM);
        const float rs = mt_rms_rstd(sums[0], dimf, eps), k = mt_rms_k(sums[1], dimf, rs);
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
    if (c < dim) dweight[c] = mt_token_tree(part + c * leaves, leaves, 0);
}

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

/* The backward's kernels (b.stats: r per row; b.pw: dweight's leaf partials). */
int rms_bwd_launch(const mt_norm_bwd_bufs &b, float eps, int64_t rows, int64_t dim, mt_rows_status *st) {
    static std::once_flag once[4];
    mt_norm_plan p = mt_norm_plan_rows(2, 2, dim, RMS_MIN_WARPS, RMS_MAX_WARPS);
    bool vec = mt_norm_bwd_vec(b, dim);
    auto kernel = p.staged ? (vec ? k_rms_backward<true, true> : k_rms_backward<true, false>)
                           : (vec ? k_rms_backward<false, true> : k_rms_backward<false, false>);
    int rc, grid = 0;
    if ((rc = mt_norm_launch_rows(kernel, once[2 * p.staged + vec], p, rows, &grid))) return rc;
    kernel<<<grid, p.threads, p.smem, MT_STREAM>>>(b.dx, b.stats, b.dy, b.x, b.w, eps, rows, dim, b.flags, st->bad);
    if ((rc = mt_rows_launched("rms_norm backward")) || !b.dweight) return rc;
    int64_t leaves = mt_token_leaves(rows);
    dim3 g = mt_norm_leaf_grid(dim, leaves, RMS_COL_THREADS);
    k_rms_dweight_leaves<<<g, RMS_COL_THREADS, 0, MT_STREAM>>>(b.pw, b.dy, b.x, b.stats, rows, dim, leaves);
    if ((rc = mt_rows_launched("rms_norm dweight leaves"))) return rc;
    k_rms_dweight_fold<<<g.x, RMS_COL_THREADS, 0, MT_STREAM>>>(b.dweight, b.pw, dim, leaves, b.flags);
    return mt_rows_launched("rms_norm dweight fold");
}

MT_NOINLINE int rms_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight, float eps,
                 int64_t rows, int64_t dim) {
    int rc;
    mt_rows_status *st = nullptr;
    mt_norm_bwd_bufs b;
    if ((rc = mt_norm_begin(mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim), &st)) ||
        (rc = mt_norm_bwd_stage(&b, dx, dweight, nullptr, dy, x, weight, rows, dim, 1)) ||
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
