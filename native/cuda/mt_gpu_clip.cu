/* mt_gpu_clip.cu -- clip_grad_norm_ and the per-tensor norms on a GPU (contract:
 * native/contracts/clip.md): the norm kernels, which follow the tree with one warp per
 * 4096-element chunk (the 2-norm and the 1-norm; the max norm is exact and takes any order),
 * the scale pass, and mt_gpu_norms, which the steps that clip call too (mt_gpu_optim.cu, the
 * 2-norm), so a clip here and a clip inside a step give the same bits.
 *
 * A clip stages the gradients, runs the norms (the total, the coefficient and, with
 * error_if_nonfinite, the non-finite refusal land in the device status), then the scale
 * kernel, which does nothing when the status says refused; the status download and the staged
 * outputs are the steps' own (mt_step_finish). Every NaN written is the canonical one.
 */
#include <mutex>
#include "mt_gpu_optim.cuh"

uint64_t mt_clip_features(void) { return MT_FEATURE_CLIP; }

/* ---- the norm of one kind (MT_NORM_KIND_*), as device pieces ---- */
/* One chunk's partial on one warp: the 2-norm's or the 1-norm's chunk fold (valid in thread 0),
 * or the chunk's largest |x| (exact, so lanes meet in any order; valid in every thread). */
template <int KIND>
__device__ __forceinline__ float mt_warp_partial(const float *x, int64_t n, int t) {
    if (KIND == MT_NORM_KIND_L2) return mt_warp_chunk_sumsq(x, n, t);
    if (KIND == MT_NORM_KIND_L1) return mt_warp_chunk_sumabs(x, n, t);
    float m = 0.0f;
    for (int64_t i = t; i < n; i += 32) m = mt_max_abs(m, x[i]);
    for (int d = 16; d >= 1; d >>= 1) m = mt_max_abs(m, MT_WARP_XOR(m, d));
    return m;
}

/* The largest of m partials at src (each >= 0 or NaN) on a whole block (every thread calls it,
 * after a barrier that published src); valid in every thread. */
__device__ __forceinline__ float mt_block_maxabs(const float *src, int64_t m) {
    __shared__ float part[MT_MAX_THREADS / 32];
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    float v = 0.0f;
    for (int64_t i = threadIdx.x; i < m; i += blockDim.x) v = mt_max_abs(v, src[i]);
    for (int d = 16; d >= 1; d >>= 1) v = mt_max_abs(v, MT_WARP_XOR(v, d));
    if (t == 0) part[w] = v;
    __syncthreads();
    v = 0.0f;
    for (int k = 0; k < nw; ++k) v = mt_max_abs(v, part[k]);
    __syncthreads();
    return v;
}

/* A vector's norm from its m chunk partials at src, on a whole block: the pairwise tree (a, b
 * its scratch, as mt_block_tree_fold) and sqrt for the 2-norm, or the max; valid in thread 0. */
template <int KIND>
__device__ __forceinline__ float mt_block_norm(const float *src, int64_t m, float *a, float *b) {
    if (KIND == MT_NORM_KIND_INF) return mt_block_maxabs(src, m);
    float s = mt_block_tree_fold(src, m, a, b);
    return KIND == MT_NORM_KIND_L2 ? sqrtf(s) : s;
}

/* ---- kernels ---- */
/* One warp per chunk: partials[c] = the chunk's partial (clip.md). Empty tensors own no chunk. */
template <int KIND>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_chunk_partials(float *const *tab, const int32_t *offs,
                                                                      const int64_t *cstart, int32_t n,
                                                                      int64_t chunks, float *partials) {
    const int t = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t c = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; c < chunks; c += warps) {
        int32_t lo = 0, hi = n - 1;              /* the last tensor starting at or before chunk c */
        while (lo < hi) {
            int32_t mid = lo + (hi - lo + 1) / 2;
            if (cstart[mid] <= c) lo = mid; else hi = mid - 1;
        }
        int64_t cc = c - cstart[lo], len = (int64_t)(offs[lo + 1] - offs[lo]) - cc * MT_CHUNK;
        float s = mt_warp_partial<KIND>(tab[lo] + cc * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) partials[c] = s;
    }
}

/* Block j: norms[j] = the norm from tensor j's chunk partials (0 for an empty tensor). */
template <int KIND>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_tensor_norms(const float *partials, const int64_t *cstart,
                                                                    float *norms, int64_t half) {
    extern __shared__ float buf[];
    int64_t m = cstart[blockIdx.x + 1] - cstart[blockIdx.x];
    float root = mt_block_norm<KIND>(partials + cstart[blockIdx.x], m, buf, buf + half);
    if (threadIdx.x == 0) norms[blockIdx.x] = mt_canonical_nan(root);
}

/* One block: the total (the same norm over the vector of norms), the applied coefficient, and
 * with `error` the refusal of a non-finite total. */
template <int KIND>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_total(const float *norms, int32_t n, float *scratch,
                                                             mt_status *st, int32_t clip, float max_norm,
                                                             int32_t error) {
    extern __shared__ float buf[];
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    int64_t chunks = mt_chunk_count(n);
    for (int64_t c = w; c < chunks; c += nw) {
        int64_t len = n - c * MT_CHUNK;
        float s = mt_warp_partial<KIND>(norms + c * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) scratch[c] = s;
    }
    __syncthreads();
    float root = mt_block_norm<KIND>(scratch, chunks, buf, buf + (chunks + 31) / 32);
    if (threadIdx.x == 0) {
        float total = mt_canonical_nan(root);
        float applied = mt_clip_applied(max_norm, total);
        st->total = total;
        st->nonfinite_total = error && !mt_is_finite(total);
        st->coef = applied;
        st->scale = clip && applied != 1.0f;     /* c < 1, or NaN (a NaN total) */
    }
}

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_scale(float *const *tab, const int32_t *offs, const int64_t *tstart, int32_t n,
                           const mt_status *st) {
    if (mt_refused(st) || !st->scale) return;
    const float c = st->coef;
    MT_FOR_TILES_DOWN(offs, tstart, n, tl, {
        float *x = tab[tl.j] + tl.local;
        if (MT_WHOLE(tl) && mt_aligned16(x)) {
            float4 q[MT_UNROLL];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) q[u] = *(float4 *)(x + MT_VEC_INDEX(u));
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u)
                *(float4 *)(x + MT_VEC_INDEX(u)) =
                    make_float4(mt_canonical_nan(q[u].x * c), mt_canonical_nan(q[u].y * c),
                                mt_canonical_nan(q[u].z * c), mt_canonical_nan(q[u].w * c));
        } else {
            for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) x[e] = mt_canonical_nan(x[e] * c);
        }
    })
}

namespace {

/* Raise the tensor-norm kernel's dynamic shared memory limit to at least `smem` bytes; the
 * limit only grows, under a lock, so concurrent calls never lower it under each other. */
template <int KIND>
int allow_shared_memory(size_t smem) {
    static std::mutex lock;
    static size_t allowed = 48 * 1024;
    std::lock_guard<std::mutex> hold(lock);
    if (smem <= allowed) return MT_OK;
#if !defined(MT_HIP) && !defined(__HIPCC__)
    MT_GPU_CHECK(cudaFuncSetAttribute(mt_k_tensor_norms<KIND>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "shared memory size");
#endif
    allowed = smem;
    return MT_OK;
}

/* The three launches of the norms of one kind (see norms below). */
template <int KIND>
int launch_norms(const mt_dev_list *g, const int64_t *dcs, int64_t chunks, int64_t max_m, float *partials,
                 float *scratch, mt_status *st, float *dev_norms, int32_t clip, float max_norm, int32_t error) {
    int32_t n = g->n;
    int threads = mt_gpu_threads();
    int blocks = mt_gpu_blocks(chunks, threads / 32);
    mt_k_chunk_partials<KIND><<<blocks, threads, 0, MT_STREAM>>>(g->table, g->offsets, dcs, n, chunks, partials);
    int rc;
    if ((rc = mt_launch_check("norm partials"))) return rc;
    int64_t half = (max_m + 31) / 32;
    size_t smem = (size_t)(2 * half) * 4;
    if ((rc = allow_shared_memory<KIND>(smem))) return rc;
    mt_k_tensor_norms<KIND><<<n, threads, smem, MT_STREAM>>>(partials, dcs, dev_norms, half);
    if ((rc = mt_launch_check("tensor norms"))) return rc;
    int64_t tchunks = mt_chunk_count(n);
    mt_k_total<KIND><<<1, threads, (size_t)(2 * ((tchunks + 31) / 32)) * 4 + 8, MT_STREAM>>>(dev_norms, n, scratch, st,
                                                                                           clip, max_norm, error);
    return mt_launch_check("total norm");
}

/* Norms of the kind by the tree: tensor norms into dev_norms (J floats), total/coef into st;
 * `error` refuses a non-finite total through st. */
int norms(mt_arena *arena, const mt_dev_list *g, const int32_t *offsets, mt_status *st, float *dev_norms, int kind,
          int32_t clip, float max_norm, int32_t error) {
    int32_t n = g->n;
    std::vector<int64_t> cstart(n + 1);
    int64_t chunks = 0, max_m = 1;
    for (int32_t j = 0; j < n; ++j) {
        cstart[j] = chunks;
        int64_t m = mt_chunk_count(offsets[j + 1] - offsets[j]);
        chunks += m;
        if (m > max_m) max_m = m;
    }
    cstart[n] = chunks;
    int64_t *dcs = nullptr;
    float *partials = nullptr, *scratch = nullptr;
    int rc;
    if ((rc = mt_cached_upload((const void **)&dcs, cstart.data(), (int64_t)(n + 1) * 8)) ||
        (rc = arena->alloc((void **)&partials, chunks * 4)) ||
        (rc = arena->alloc((void **)&scratch, (mt_chunk_count(n) + 1) * 4)))
        return rc;
    if (kind == MT_NORM_KIND_L1)
        return launch_norms<MT_NORM_KIND_L1>(g, dcs, chunks, max_m, partials, scratch, st, dev_norms, clip, max_norm,
                                             error);
    if (kind == MT_NORM_KIND_INF)
        return launch_norms<MT_NORM_KIND_INF>(g, dcs, chunks, max_m, partials, scratch, st, dev_norms, clip, max_norm,
                                              error);
    return launch_norms<MT_NORM_KIND_L2>(g, dcs, chunks, max_m, partials, scratch, st, dev_norms, clip, max_norm,
                                         error);
}

/* Checks shared by the two exports: the list (empty tensors allowed) and the norm type. */
int check_list(float *const *grads, const int32_t *offsets, float norm_type, int32_t n_tensors, int *kind) {
    int rc;
    if ((rc = mt_check_registry_empty_ok(grads, offsets, n_tensors, "grads"))) return rc;
    return mt_check_norm_type(norm_type, kind);
}

/* Stage the status, then the gradients, an empty tensor's pointer (NULL allowed) replaced by the
 * status word: device memory, never read (0 elements), so an empty tensor is neither staged nor
 * copied back; then room for the tensor norms. */
int stage(mt_step_ctx *c, float *const *grads, const int32_t *offsets, int32_t n) {
    int rc;
    if ((rc = mt_stage_status(c))) return rc;
    std::vector<float *> table(grads, grads + n);
    for (int32_t j = 0; j < n; ++j)
        if (offsets[j + 1] == offsets[j]) table[j] = (float *)c->st;
    if ((rc = mt_list_to_device(&c->g, &c->arena, table.data(), offsets, n, true, nullptr))) return rc;
    return c->arena.alloc((void **)&c->norms, (int64_t)n * 4);
}

}  // namespace

/* The steps' clip (declared in mt_gpu_optim.cuh): the 2-norm, a non-finite total refused. */
int mt_gpu_norms(mt_arena *arena, const mt_dev_list *g, const int32_t *offsets, mt_status *st, float *dev_norms,
                 int32_t clip, float max_norm) {
    return norms(arena, g, offsets, st, dev_norms, MT_NORM_KIND_L2, clip, max_norm, 1);
}

extern "C" {

int mt_clip_grad_norm(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm, float norm_type,
                      int32_t error_if_nonfinite, int32_t n_tensors) {
    int rc, kind;
    if ((rc = check_list(grads, offsets, norm_type, n_tensors, &kind)) || (rc = mt_check_ptr(norm_out, "norm_out")) ||
        (rc = mt_check_nonneg(max_norm, "max_norm")) || (rc = mt_gpu_ready()))
        return rc;
    mt_step_ctx c;
    if ((rc = stage(&c, grads, offsets, n_tensors)) ||
        (rc = norms(&c.arena, &c.g, offsets, c.st, c.norms, kind, 1, max_norm, error_if_nonfinite != 0)))
        return rc;
    int threads = c.g.threads, blocks = mt_elem_blocks(c.g);
    mt_k_scale<<<blocks, threads, 0, MT_STREAM>>>(c.g.table, c.g.offsets, c.g.tstart, n_tensors, c.st);
    if ((rc = mt_launch_check("clip scale"))) return rc;
    c.p.n = 0;   /* no params in a clip */
    if ((rc = mt_step_finish(&c, offsets, 1, norm_out, true))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

int mt_grad_norms(float *tensor_norms, float *total_norm, float *const *grads, const int32_t *offsets,
                  float norm_type, int32_t n_tensors) {
    int rc, kind;
    if ((rc = check_list(grads, offsets, norm_type, n_tensors, &kind)) ||
        (rc = mt_check_ptr(tensor_norms, "tensor_norms")) || (rc = mt_check_ptr(total_norm, "total_norm")) ||
        (rc = mt_gpu_ready()))
        return rc;
    mt_step_ctx c;
    if ((rc = stage(&c, grads, offsets, n_tensors)) ||
        (rc = norms(&c.arena, &c.g, offsets, c.st, c.norms, kind, 0, 0.0f, 0)))
        return rc;
    std::vector<float> host(n_tensors);
    mt_status st;
    MT_GPU_CHECK(gpuMemcpyAsync(host.data(), c.norms, (size_t)n_tensors * 4, gpuMemcpyDefault, MT_STREAM), "download");
    MT_GPU_CHECK(gpuMemcpyAsync(&st, c.st, sizeof st, gpuMemcpyDefault, MT_STREAM), "download");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "norms");
    mt_gpu_count_d2h((int64_t)n_tensors * 4 + (int64_t)sizeof st);
    for (int32_t j = 0; j < n_tensors; ++j) tensor_norms[j] = host[j];
    *total_norm = st.total;
    return MT_OK;
}

}  /* extern "C" */
