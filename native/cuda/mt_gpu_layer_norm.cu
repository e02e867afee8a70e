/* mt_gpu_layer_norm.cu -- LayerNorm on a GPU (contract: native/contracts/layer_norm.md); the
 * same bits as the CPU oracle (native/cpu_oracle/mt_cpu_layer_norm.c) in the identical numeric
 * mode. Built as mt_gpu_rms_norm.cu is, with its row helpers (mt_gpu_rows.cuh) and the host
 * side the two share (mt_gpu_norm.cuh).
 *
 * Forward, one kernel: each block takes rows in turn, stages the row in shared memory (or, when
 * it does not fit, reads it from global memory each time), folds the sum by the chunk tree (one
 * warp per 4096-chunk, mt_warp_chunk_fold, then mt_block_tree_fold), forms mu = mt_ln_mean,
 * folds the squared deviations, forms r = mt_rms_rstd and writes y = mt_ln_y.
 * Backward, up to three kernels: k_ln_backward stages x and dy, folds the sums of x and of
 * g = dy * w in one walk, then the squared deviations, then g * xhat, writes dx (mt_ln_dx) and
 * keeps (mu, r) per row; with dweight or dbias, k_ln_param_leaves runs the token rule's leaves
 * (one thread per column walks a leaf's rows in ascending order: fma(dy, xhat, acc) and
 * acc + dy, coalesced across columns) into partials laid out (column, leaf), and
 * k_ln_param_fold folds each column's partials (mt_token_tree).
 * Finiteness rides along (no pre-pass): kernels raise per-input flags, the host refuses after
 * the synchronization; y and dx are undefined then (mojo_train.h), dweight and dbias are never
 * written (the fold kernel reads the flags first). Argument checks and refusal order follow
 * the oracle. Host buffers are staged through device memory and downloaded only on success.
 */
#include "mt_gpu_norm.cuh"

uint64_t mt_layer_norm_features(void) { return MT_FEATURE_LAYER_NORM; }

namespace {

#define LN_MIN_WARPS 4
#define LN_MAX_WARPS 16
#define LN_COL_THREADS 256   /* columns per block of the parameter-gradient kernels */
#define LN_ROW_BATCH 16      /* rows whose loads a leaf thread has in flight */
/* Flag slots: slot 1 is dy in the backward and the bias in the forward (which has no dy). */
enum { BAD_X = 0, BAD_DY = 1, BAD_B = 1, BAD_W = 2 };

/* The folds of a row, four lanes at a time, through the pinned steps of mt_pinned.h:
 *   SUM    K=1  x                     (MT_STEP_LN_SUM)
 *   DEVSQ  K=1  (x - mu)^2            (MT_STEP_LN_DEVSQ)
 *   XG     K=2  x and g = dy * w      (MT_STEP_LN_SUM, MT_STEP_LN_G)
 *   GX     K=1  g * xhat              (MT_STEP_LN_GX)
 * x and dy may be shared memory (VEC: 16-byte aligned rows); w is global (or NULL; WVEC:
 * 16-byte aligned). */
enum { SUM, DEVSQ, XG, GX };

template <bool VEC, bool WVEC, int KIND>
struct ln_step {
    static constexpr int K = KIND == XG ? 2 : 1;
    static constexpr bool USES_DY = KIND == XG || KIND == GX;
    struct V { float4 x, dy, w; };
    const float *x, *dy, *w;
    float mu, rstd;
    __device__ __forceinline__ V load(int64_t i) const {
        V v;
        v.x = mt_load4<VEC>(x + i);
        if constexpr (USES_DY) {
            v.dy = mt_load4<VEC>(dy + i);
            v.w = w ? mt_load4<WVEC>(w + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        }
        return v;
    }
    /* Element k of four loaded ones (x, dy, w arrays of four; w NULL: no weight). */
    __device__ __forceinline__ void fold(float (&a)[K][4], const float *x, const float *dy, const float *w,
                                         int k) const {
        const float mu = this->mu, rstd = this->rstd;
        (void)dy; (void)w; (void)mu; (void)rstd;
        if constexpr (KIND == SUM) MT_STEP_LN_SUM(a[0][k], k);
        if constexpr (KIND == DEVSQ) MT_STEP_LN_DEVSQ(a[0][k], k);
        if constexpr (KIND == XG) {
            MT_STEP_LN_SUM(a[0][k], k);
            MT_STEP_LN_G(a[1][k], k);
        }
        if constexpr (KIND == GX) MT_STEP_LN_GX(a[0][k], k);
    }
    __device__ __forceinline__ void step(float (&a)[K][4], const V &v, int64_t) const {
        const float xv[4] = {v.x.x, v.x.y, v.x.z, v.x.w};
        const float dv[4] = {v.dy.x, v.dy.y, v.dy.z, v.dy.w}, wv[4] = {v.w.x, v.w.y, v.w.z, v.w.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) fold(a, xv, dv, w ? wv : nullptr, k);
    }
    __device__ __forceinline__ void one(float (&a)[K][4], int q, int64_t i) const {
        const float xv[1] = {x[i]}, dv[1] = {USES_DY ? dy[i] : 0.0f}, wv[1] = {USES_DY && w ? w[i] : 0.0f};
        float b[K][4];
#pragma unroll
        for (int k = 0; k < K; ++k) b[k][0] = a[k][q];
        fold(b, xv, dv, w ? wv : nullptr, 0);
#pragma unroll
        for (int k = 0; k < K; ++k) a[k][q] = b[k][0];
    }
};

/* The K roots of fold KIND over a row (every thread gets them). */
template <int KIND, bool VEC, bool WVEC, int K = (KIND == XG ? 2 : 1)>
__device__ __forceinline__ void ln_fold(float (&root)[K], const float *x, const float *dy, const float *w, float mu,
                                        float rstd, int64_t dim, float *part, float *part2) {
    static_assert(K == ln_step<VEC, WVEC, KIND>::K, "one K per fold");
    mt_rows_fold<K>(root, dim, [&](int64_t c) {
        int64_t o = c * MT_CHUNK;
        return ln_step<VEC, WVEC, KIND>{x + o, dy ? dy + o : nullptr, w ? w + o : nullptr, mu, rstd};
    }, part, part2, MT_SAB_LAYER_NORM);
}

template <bool STAGED, bool VEC>
__global__ void __launch_bounds__(32 * LN_MAX_WARPS)
    k_ln_forward(float *y, const float *x, const float *w, const float *b, float eps, int64_t rows, int64_t dim,
                 int32_t *bad) {
    extern __shared__ float4 smem4[];
    const int64_t pitch = (dim + 3) / 4 * 4;
    float *row = (float *)smem4, *part = row + (STAGED ? pitch : 0), *part2 = part + mt_chunk_count(dim);
    const float dimf = (float)dim;
    bool bx = false, bw = false, bb = false;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *src = x + r * dim;
        float *out = y + r * dim;
        if (STAGED) {
            mt_rows_stage<VEC>(row, src, dim);
            __syncthreads();
        }
        const float *xr = STAGED ? row : src;
        float s[1], q[1];
        ln_fold<SUM, STAGED || VEC, VEC>(s, xr, nullptr, nullptr, 0.0f, 0.0f, dim, part, part2);
        const float mu = mt_ln_mean(s[0], dimf);
        ln_fold<DEVSQ, STAGED || VEC, VEC>(q, xr, nullptr, nullptr, mu, 0.0f, dim, part, part2);
        const float rs = mt_rms_rstd(q[0], dimf, eps);
        mt_rows_walk<VEC>(
            dim,
            [&](int64_t i) {
                float4 v = *(const float4 *)(xr + i);
                float4 g = w ? *(const float4 *)(w + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                float4 h = b ? *(const float4 *)(b + i) : make_float4(-0.0f, -0.0f, -0.0f, -0.0f);
                bx |= mt_norm_bad4(v);
                bw |= mt_norm_bad4(g);
                bb |= mt_norm_bad4(h);
                MT_STCS((float4 *)(out + i),
                        make_float4(mt_ln_y(v.x, mu, rs, g.x, h.x), mt_ln_y(v.y, mu, rs, g.y, h.y),
                                    mt_ln_y(v.z, mu, rs, g.z, h.z), mt_ln_y(v.w, mu, rs, g.w, h.w)));
            },
            [&](int64_t i) {
                float v = xr[i], g = w ? w[i] : 1.0f, h = b ? b[i] : -0.0f;
                bx |= !mt_is_finite(v);
                bw |= !mt_is_finite(g);
                bb |= !mt_is_finite(h);
                out[i] = mt_ln_y(v, mu, rs, g, h);
            });
        __syncthreads();   /* the row's shared memory is free again */
    }
    if (bx) bad[BAD_X] = 1;   /* every writer stores the same value: no atomic needed */
    if (bw) bad[BAD_W] = 1;
    if (bb) bad[BAD_B] = 1;
}

/* dx (or NULL) and (mu, r) per row (or NULL) of every row; flags to both the device copy (read
 * by the parameter fold) and the mapped status. (Bounds with one block: under nvcc 13 the
 * default register target of 64 spilled ~200 bytes in the vector forms; with it, 96-126
 * registers and no spill, about RMSNorm's backward's 92: not yet measured on a GPU.) */
template <bool STAGED, bool VEC>
__global__ void __launch_bounds__(32 * LN_MAX_WARPS, 1)
    k_ln_backward(float *dx, float *stats, const float *dy, const float *x, const float *w, float eps, int64_t rows,
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
        float sums[2], q[1], c[1];
        ln_fold<XG, STAGED || VEC, VEC>(sums, xr, dyr, w, 0.0f, 0.0f, dim, part, part2);
        const float mu = mt_ln_mean(sums[0], dimf), mg = mt_ln_mean(sums[1], dimf);
        ln_fold<DEVSQ, STAGED || VEC, VEC>(q, xr, nullptr, nullptr, mu, 0.0f, dim, part, part2);
        const float rs = mt_rms_rstd(q[0], dimf, eps);
        ln_fold<GX, STAGED || VEC, VEC>(c, xr, dyr, w, mu, rs, dim, part, part2);
        const float mgx = mt_ln_mean(c[0], dimf);
        if (stats && threadIdx.x == 0) {
            stats[2 * r] = mu;
            stats[2 * r + 1] = rs;
        }
        float *out = dx ? dx + r * dim : nullptr;
        mt_rows_walk<VEC>(
            dim,
            [&](int64_t i) {
                float4 v = *(const float4 *)(xr + i), g = *(const float4 *)(dyr + i);
                float4 wv = w ? *(const float4 *)(w + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
                bx |= mt_norm_bad4(v);
                bdy |= mt_norm_bad4(g);
                bw |= mt_norm_bad4(wv);
                if (out)
                    MT_STCS((float4 *)(out + i),
                            make_float4(mt_ln_dx(g.x, wv.x, v.x, mu, rs, mg, mgx),
                                        mt_ln_dx(g.y, wv.y, v.y, mu, rs, mg, mgx),
                                        mt_ln_dx(g.z, wv.z, v.z, mu, rs, mg, mgx),
                                        mt_ln_dx(g.w, wv.w, v.w, mu, rs, mg, mgx)));
            },
            [&](int64_t i) {
                float v = xr[i], g = dyr[i], wv = w ? w[i] : 1.0f;
                bx |= !mt_is_finite(v);
                bdy |= !mt_is_finite(g);
                bw |= !mt_is_finite(wv);
                if (out) out[i] = mt_ln_dx(g, wv, v, mu, rs, mg, mgx);
            });
        __syncthreads();
    }
    if (bx) bad[BAD_X] = bad_dev[BAD_X] = 1;
    if (bdy) bad[BAD_DY] = bad_dev[BAD_DY] = 1;
    if (bw) bad[BAD_W] = bad_dev[BAD_W] = 1;
}

/* The token rule's leaves: partials (column c, leaf l) = chains over the leaf's rows, ascending,
 * of fma(dy, xhat, acc) (pw) and acc + dy (pb); either may be NULL. LN_ROW_BATCH rows' loads go
 * out ahead of their steps. */
__global__ void __launch_bounds__(LN_COL_THREADS, 4)
    k_ln_param_leaves(float *__restrict__ pw, float *__restrict__ pb, const float *__restrict__ dy,
                      const float *__restrict__ x, const float *__restrict__ stats, int64_t rows, int64_t dim,
                      int64_t leaves) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    const bool want_w = pw != nullptr;
    for (int64_t l = blockIdx.y; l < leaves; l += gridDim.y) {
        int64_t r0 = l * MT_TOKEN_LEAF, r1 = r0 + MT_TOKEN_LEAF < rows ? r0 + MT_TOKEN_LEAF : rows;
        float accw = 0.0f, accb = 0.0f;
        int64_t r = r0;
        for (; r + LN_ROW_BATCH <= r1; r += LN_ROW_BATCH) {
            float a[LN_ROW_BATCH], h[LN_ROW_BATCH];
#pragma unroll
            for (int u = 0; u < LN_ROW_BATCH; ++u) {
                a[u] = dy[(r + u) * dim + c];
                if (want_w) h[u] = mt_ln_xhat(x[(r + u) * dim + c], stats[2 * (r + u)], stats[2 * (r + u) + 1]);
            }
#pragma unroll
            for (int u = 0; u < LN_ROW_BATCH; ++u) {
                if (want_w) accw = MT_DOT_STEP(a[u], h[u], accw);
                accb = accb + a[u];
            }
        }
        for (; r < r1; ++r) {
            float a = dy[r * dim + c];
            if (want_w) accw = MT_DOT_STEP(a, mt_ln_xhat(x[r * dim + c], stats[2 * r], stats[2 * r + 1]), accw);
            accb = accb + a;
        }
        if (pw) pw[c * leaves + l] = accw;
        if (pb) pb[c * leaves + l] = accb;
    }
}

/* dweight[c], dbias[c] = the pairwise trees of column c's leaf partials -- unless an input was
 * refused. */
__global__ void __launch_bounds__(LN_COL_THREADS)
    k_ln_param_fold(float *dweight, float *dbias, float *pw, float *pb, int64_t dim, int64_t leaves,
                    const int32_t *bad_dev) {
    if (bad_dev[BAD_X] | bad_dev[BAD_DY] | bad_dev[BAD_W]) return;
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= dim) return;
    if (dweight) dweight[c] = mt_canonical_nan(mt_token_tree(pw + c * leaves, leaves, 0));
    if (dbias) dbias[c] = mt_canonical_nan(mt_token_tree(pb + c * leaves, leaves, 0));
}

/* ---- host ---- */

const char *const LN_FWD_NAMES[3] = {"x", "bias", "weight"};
const char *const LN_BWD_NAMES[3] = {"x", "dy", "weight"};

int ln_forward_launch(const mt_norm_fwd_bufs &f, float eps, int64_t rows, int64_t dim, mt_rows_status *st) {
    static std::once_flag once[4];
    mt_norm_plan p = mt_norm_plan_rows(1, 1, dim, LN_MIN_WARPS, LN_MAX_WARPS);
    bool vec = mt_norm_fwd_vec(f, dim);
    auto kernel = p.staged ? (vec ? k_ln_forward<true, true> : k_ln_forward<true, false>)
                           : (vec ? k_ln_forward<false, true> : k_ln_forward<false, false>);
    int rc, grid = 0;
    if ((rc = mt_norm_launch_rows(kernel, once[2 * p.staged + vec], p, rows, &grid))) return rc;
    kernel<<<grid, p.threads, p.smem, MT_STREAM>>>(f.y, f.x, f.w, f.b, eps, rows, dim, st->bad);
    return mt_rows_launched("layer_norm forward");
}

MT_NOINLINE int ln_forward(float *y, const float *x, const float *weight, const float *bias, float eps, int64_t rows,
                           int64_t dim) {
    int rc;
    mt_rows_status *st = nullptr;
    mt_norm_fwd_bufs f;
    if ((rc = mt_norm_begin(mt_check_rms_norm_forward_args(y, x, eps, rows, dim), &st)) ||
        (rc = mt_norm_fwd_stage(&f, y, x, weight, bias, rows, dim)))
        return rc;
    if (rows == 0) {
        if ((rc = mt_norm_check_param(f.w, dim, &st->bad[BAD_W], "weight finiteness")) ||
            (rc = mt_norm_check_param(f.b, dim, &st->bad[BAD_B], "bias finiteness")))
            return rc;
    } else if ((rc = ln_forward_launch(f, eps, rows, dim, st))) {
        return rc;
    }
    static const int order[3] = {BAD_X, BAD_W, BAD_B};
    return mt_rows_finish(st, order, 3, LN_FWD_NAMES, f.sy ? y : nullptr, f.y, rows * dim * 4, nullptr, nullptr, 0);
}

/* The backward's kernels (b.stats: (mu, r) per row; b.pw, b.pb: dweight's and dbias's leaf
 * partials). */
int ln_bwd_launch(const mt_norm_bwd_bufs &b, float eps, int64_t rows, int64_t dim, mt_rows_status *st) {
    static std::once_flag once[4];
    mt_norm_plan p = mt_norm_plan_rows(2, 2, dim, LN_MIN_WARPS, LN_MAX_WARPS);
    bool vec = mt_norm_bwd_vec(b, dim);
    auto kernel = p.staged ? (vec ? k_ln_backward<true, true> : k_ln_backward<true, false>)
                           : (vec ? k_ln_backward<false, true> : k_ln_backward<false, false>);
    int rc, grid = 0;
    if ((rc = mt_norm_launch_rows(kernel, once[2 * p.staged + vec], p, rows, &grid))) return rc;
    kernel<<<grid, p.threads, p.smem, MT_STREAM>>>(b.dx, b.stats, b.dy, b.x, b.w, eps, rows, dim, b.flags, st->bad);
    if ((rc = mt_rows_launched("layer_norm backward")) || !(b.dweight || b.dbias)) return rc;
    int64_t leaves = mt_token_leaves(rows);
    dim3 g = mt_norm_leaf_grid(dim, leaves, LN_COL_THREADS);
    k_ln_param_leaves<<<g, LN_COL_THREADS, 0, MT_STREAM>>>(b.pw, b.pb, b.dy, b.x, b.stats, rows, dim, leaves);
    if ((rc = mt_rows_launched("layer_norm parameter leaves"))) return rc;
    k_ln_param_fold<<<g.x, LN_COL_THREADS, 0, MT_STREAM>>>(b.dweight, b.dbias, b.pw, b.pb, dim, leaves, b.flags);
    return mt_rows_launched("layer_norm parameter fold");
}

/* Downloads of the staged parameter gradients (after mt_rows_finish synchronized: no refusal). */
int ln_bwd_params_home(const mt_norm_bwd_bufs &b, float *dweight, float *dbias, int64_t dim) {
    int rc;
    if ((b.sdw && (rc = mt_buf_to_host(dweight, b.dweight, dim * 4))) ||
        (b.sdb && (rc = mt_buf_to_host(dbias, b.dbias, dim * 4))))
        return rc;
    if (b.sdw || b.sdb) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

MT_NOINLINE int ln_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                            const float *weight, float eps, int64_t rows, int64_t dim) {
    int rc;
    mt_rows_status *st = nullptr;
    mt_norm_bwd_bufs b;
    static const int order[3] = {BAD_DY, BAD_X, BAD_W};
    if ((rc = mt_norm_begin(mt_check_rms_norm_backward_args(dweight, dy, x, weight, eps, rows, dim), &st)) ||
        (rc = mt_norm_bwd_stage(&b, dx, dweight, dbias, dy, x, weight, rows, dim, 2)) ||
        (rc = rows == 0 ? mt_norm_bwd_no_rows(b, dim, &st->bad[BAD_W]) : ln_bwd_launch(b, eps, rows, dim, st)) ||
        (rc = mt_rows_finish(st, order, 3, LN_BWD_NAMES, b.sdx ? dx : nullptr, b.dx, rows * dim * 4, nullptr, nullptr,
                             0)))
        return rc;
    return ln_bwd_params_home(b, dweight, dbias, dim);
}

}  // namespace

extern "C" {

int mt_layer_norm_forward(float *y, const float *x, const float *weight, const float *bias, float eps, int64_t rows,
                          int64_t dim) {
    /* eps's check compares floats: IEEE defaults, as the oracle */
    MT_RETURN_IN_FP_ENV(ln_forward(y, x, weight, bias, eps, rows, dim));
}

int mt_layer_norm_backward(float *dx, float *dweight, float *dbias, const float *dy, const float *x,
                           const float *weight, float eps, int64_t rows, int64_t dim) {
    MT_RETURN_IN_FP_ENV(ln_backward(dx, dweight, dbias, dy, x, weight, eps, rows, dim));
}

}  /* extern "C" */
