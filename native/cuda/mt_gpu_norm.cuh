/* mt_gpu_norm.cuh -- what RMSNorm (mt_gpu_rms_norm.cu) and LayerNorm (mt_gpu_layer_norm.cu) share
 * beyond mt_gpu_rows.cuh: on the device, the finiteness test of four loaded floats and the
 * kernel that checks a parameter alone (a call with no rows); on the host, the plan of a row
 * kernel (staged or not, threads, shared memory) and its launch geometry, the staging of a
 * forward's and a backward's buffers, the grid of the leaf kernels, and the backward with no
 * rows. No op's arithmetic lives here: each op's kernels, folds and order of operations are in
 * its own file.
 *
 * Everything has internal linkage (an unnamed namespace, as in mt_gpu_gemm.cuh): each file that
 * includes it gets its own copy.
 */
#ifndef MT_GPU_NORM_CUH
#define MT_GPU_NORM_CUH

#include "mt_gpu_rows.cuh"

namespace {

/* Whether any of four floats is NaN or inf. */
__device__ __forceinline__ bool mt_norm_bad4(float4 q) {
    return !(mt_is_finite(q.x) & mt_is_finite(q.y) & mt_is_finite(q.z) & mt_is_finite(q.w));
}

/* A NaN/inf anywhere in p[0..n) raises *flag (a parameter of a call with no rows). */
__global__ void k_norm_nonfinite(const float *p, int64_t n, int32_t *flag) {
    bool b = false;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        b |= !mt_is_finite(p[i]);
    if (b) *flag = 1;
}

/* ---- host ---- */

/* A call's start, after the op's argument checks returned rc: the GPU ready, then the calling
 * thread's status, cleared (*st). */
inline int mt_norm_begin(int rc, mt_rows_status **st) {
    if (rc || (rc = mt_gpu_ready())) return rc;
    return (*st = mt_rows_begin()) ? MT_OK : MT_ENOMEM;
}

/* Threads and shared memory of a row kernel; staged when its rows fit in shared memory. */
struct mt_norm_plan {
    bool staged;
    int threads;
    size_t smem;
};

/* Shared floats of a row block: the staged rows (n_staged of them), the folds of k quantities,
 * 32 spare. */
inline int64_t mt_norm_smem_floats(int n_staged, int k, int64_t dim) {
    return n_staged * ((dim + 3) / 4 * 4) + mt_rows_fold_floats(k, dim) + 32;
}

/* The plan of a row kernel that stages n_staged rows of dim (when they fit) and folds k
 * quantities: a warp per chunk, between min_warps and max_warps. */
inline mt_norm_plan mt_norm_plan_rows(int n_staged, int k, int64_t dim, int64_t min_warps, int64_t max_warps) {
    mt_norm_plan p;
    p.smem = (size_t)mt_norm_smem_floats(n_staged, k, dim) * 4;
    p.staged = p.smem <= (size_t)mt_rows_limits().smem_optin;
    if (!p.staged) p.smem = (size_t)mt_norm_smem_floats(0, k, dim) * 4;
    int64_t w = mt_chunk_count(dim), hi = max_warps;
    w = w < min_warps ? min_warps : w > hi ? hi : w;
    p.threads = 32 * (int)w;
    return p;
}

inline bool mt_norm_aligned(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* p[0..dim) (NULL: nothing to check) raises *flag if it holds NaN or inf; `what` names the
 * launch in an error. */
inline int mt_norm_check_param(const float *p, int64_t dim, int32_t *flag, const char *what) {
    if (!p) return MT_OK;
    k_norm_nonfinite<<<mt_gpu_blocks(dim, 256), 256, 0, MT_STREAM>>>(p, dim, flag);
    return mt_rows_launched(what);
}

/* `kernel` may take the plan's shared memory (once per form: `once`); *grid its blocks. */
template <class K>
inline int mt_norm_launch_rows(K kernel, std::once_flag &once, const mt_norm_plan &p, int64_t rows, int *grid) {
    int rc;
    if ((rc = mt_rows_allow_smem(kernel, once)) || (rc = mt_rows_grid(grid, kernel, p.threads, p.smem, rows)))
        return rc;
    return MT_OK;
}

/* Device buffers of a forward call (staged: a host buffer the call copied). */
struct mt_norm_fwd_bufs {
    mt_arena arena;
    float *y = nullptr, *x = nullptr, *w = nullptr, *b = nullptr;
    bool sy = false, sx = false, sw = false, sb = false;
};

/* x and y (when there are rows), then weight and bias (NULL: none) on the device. */
inline int mt_norm_fwd_stage(mt_norm_fwd_bufs *f, float *y, const float *x, const float *weight, const float *bias,
                             int64_t rows, int64_t dim) {
    int rc;
    int64_t bytes = rows * dim * 4;
    if ((rows && ((rc = mt_buf_to_device((void **)&f->x, &f->sx, &f->arena, (void *)x, bytes, true)) ||
                  (rc = mt_buf_to_device((void **)&f->y, &f->sy, &f->arena, y, bytes, false)))) ||
        (weight && (rc = mt_buf_to_device((void **)&f->w, &f->sw, &f->arena, (void *)weight, dim * 4, true))) ||
        (bias && (rc = mt_buf_to_device((void **)&f->b, &f->sb, &f->arena, (void *)bias, dim * 4, true))))
        return rc;
    return MT_OK;
}

/* Whether a forward's row kernel may load float4 (every row and parameter 16-byte aligned). */
inline bool mt_norm_fwd_vec(const mt_norm_fwd_bufs &f, int64_t dim) {
    return dim % 4 == 0 && mt_norm_aligned(f.x) && mt_norm_aligned(f.y) && mt_norm_aligned(f.w) &&
           mt_norm_aligned(f.b);
}

/* Device buffers of a backward call (staged: a host buffer the call copied): the gradients,
 * the inputs, per-row statistics, the leaf partials of dweight (pw) and dbias (pb), 4 flags. */
struct mt_norm_bwd_bufs {
    mt_arena arena;
    float *dx = nullptr, *dweight = nullptr, *dbias = nullptr, *dy = nullptr, *x = nullptr, *w = nullptr,
          *stats = nullptr, *pw = nullptr, *pb = nullptr;
    int32_t *flags = nullptr;
    bool sdx = false, sdw = false, sdb = false, sdy = false, sx = false, sw = false;
};

/* dy, x and dx (when there are rows), weight, dweight and dbias (each NULL: none) on the
 * device; with rows and dweight, stat_floats statistics per row (0: none, the caller allocates
 * them if it needs them) and dweight's leaf partials;
 * with rows and dbias, dbias's; the flags, zeroed. */
inline int mt_norm_bwd_stage(mt_norm_bwd_bufs *b, float *dx, float *dweight, float *dbias, const float *dy,
                             const float *x, const float *weight, int64_t rows, int64_t dim, int stat_floats) {
    int rc;
    int64_t bytes = rows * dim * 4, leaves = mt_token_leaves(rows);
    if ((rows && ((rc = mt_buf_to_device((void **)&b->dy, &b->sdy, &b->arena, (void *)dy, bytes, true)) ||
                  (rc = mt_buf_to_device((void **)&b->x, &b->sx, &b->arena, (void *)x, bytes, true)) ||
                  (dx && (rc = mt_buf_to_device((void **)&b->dx, &b->sdx, &b->arena, dx, bytes, false))))) ||
        (weight && (rc = mt_buf_to_device((void **)&b->w, &b->sw, &b->arena, (void *)weight, dim * 4, true))) ||
        (dweight && (rc = mt_buf_to_device((void **)&b->dweight, &b->sdw, &b->arena, dweight, dim * 4, false))) ||
        (dbias && (rc = mt_buf_to_device((void **)&b->dbias, &b->sdb, &b->arena, dbias, dim * 4, false))) ||
        (dweight && rows && ((stat_floats && (rc = b->arena.alloc((void **)&b->stats, rows * 4 * stat_floats))) ||
                             (rc = b->arena.alloc((void **)&b->pw, leaves * dim * 4)))) ||
        (dbias && rows && (rc = b->arena.alloc((void **)&b->pb, leaves * dim * 4))) ||
        (rc = b->arena.alloc((void **)&b->flags, 16)))
        return rc;
    MT_GPU_CHECK(gpuMemsetAsync(b->flags, 0, 16, MT_STREAM), "flags reset");
    return MT_OK;
}

/* Whether a backward's row kernel may load float4. */
inline bool mt_norm_bwd_vec(const mt_norm_bwd_bufs &b, int64_t dim) {
    return dim % 4 == 0 && mt_norm_aligned(b.dx) && mt_norm_aligned(b.dy) && mt_norm_aligned(b.x) &&
           mt_norm_aligned(b.w);
}

/* The grid of a leaf kernel: blocks of col_threads columns across, the leaves (at most 65535
 * at once) down. */
inline dim3 mt_norm_leaf_grid(int64_t dim, int64_t leaves, int col_threads) {
    int64_t cols = (dim + col_threads - 1) / col_threads;
    return dim3((unsigned)cols, (unsigned)(leaves < 65535 ? leaves : 65535));
}

/* A backward with no rows: the weight is still checked (*w_flag, mapped); dweight and dbias
 * (where wanted) are zeros. */
inline int mt_norm_bwd_no_rows(const mt_norm_bwd_bufs &b, int64_t dim, int32_t *w_flag) {
    int rc;
    if ((rc = mt_norm_check_param(b.w, dim, w_flag, "weight finiteness"))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "synchronize");
    if (*w_flag) return mt_fail(MT_ENONFINITE, "weight holds NaN or inf; nothing was written");
    if (b.dweight) MT_GPU_CHECK(gpuMemsetAsync(b.dweight, 0, (size_t)dim * 4, MT_STREAM), "dweight zero");
    if (b.dbias) MT_GPU_CHECK(gpuMemsetAsync(b.dbias, 0, (size_t)dim * 4, MT_STREAM), "dbias zero");
    return MT_OK;
}

}  // namespace

#endif /* MT_GPU_NORM_CUH */
