/* mt_gpu_clip.cu -- clip_grad_norm_ and the per-tensor norms on a GPU (contract:
 * native/contracts/clip.md): the norm kernels, which follow the tree with one warp per
 * 4096-element chunk, the scale pass, and mt_gpu_norms, which the steps that clip call too
 * (mt_gpu_optim.cu), so a clip here and a clip inside a step give the same bits.
 *
 * A clip stages the gradients, runs the norms (the total, the coefficient and the non-finite
 * refusal land in the device status), then the scale kernel, which does nothing when the
 * status says refused; the status download and the staged outputs are the steps' own
 * (mt_step_finish).
 */
#include <mutex>
#include "mt_gpu_optim.cuh"

uint64_t mt_clip_features(void) { return MT_FEATURE_CLIP; }

/* ---- kernels ---- */
/* One warp per chunk: partials[c] = the chunk's sum of squares (clip.md). */
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_chunk_sumsq(float *const *tab, const int32_t *offs, const int64_t *cstart, int32_t n,
                                 int64_t chunks, float *partials) {
    const int t = threadIdx.x & 31;
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x / 32);
    for (int64_t c = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; c < chunks; c += warps) {
        int32_t lo = 0, hi = n - 1;
        while (lo < hi) {
            int32_t mid = lo + (hi - lo + 1) / 2;
            if (cstart[mid] <= c) lo = mid; else hi = mid - 1;
        }
        int64_t cc = c - cstart[lo], len = (int64_t)(offs[lo + 1] - offs[lo]) - cc * MT_CHUNK;
        float s = mt_warp_chunk_sumsq(tab[lo] + cc * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) partials[c] = s;
    }
}

/* Block j: norms[j] = sqrt(fold of tensor j's chunk partials). */
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_tensor_norms(const float *partials, const int64_t *cstart, float *norms, int64_t half) {
    extern __shared__ float buf[];
    int64_t m = cstart[blockIdx.x + 1] - cstart[blockIdx.x];
    float root = mt_block_tree_fold(partials + cstart[blockIdx.x], m, buf, buf + half);
    if (threadIdx.x == 0) norms[blockIdx.x] = sqrtf(root);
}

/* One block: the total norm (the same tree over the norms), the clip coefficient, refusal. */
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_total(const float *norms, int32_t n, float *scratch, mt_status *st, int32_t clip,
                           float max_norm) {
    extern __shared__ float buf[];
    const int t = threadIdx.x & 31, w = threadIdx.x / 32, nw = blockDim.x / 32;
    int64_t chunks = mt_chunk_count(n);
    for (int64_t c = w; c < chunks; c += nw) {
        int64_t len = n - c * MT_CHUNK;
        float s = mt_warp_chunk_sumsq(norms + c * MT_CHUNK, len < MT_CHUNK ? len : MT_CHUNK, t);
        if (t == 0) scratch[c] = s;
    }
    __syncthreads();
    float sq = mt_block_tree_fold(scratch, chunks, buf, buf + (chunks + 31) / 32);
    if (threadIdx.x == 0) {
        float total = sqrtf(sq);
        st->total = total;
        st->nonfinite_total = !mt_is_finite(total);
        float c = max_norm / (total + 1e-6f);
        st->coef = c < 1.0f ? c : 1.0f;
        st->scale = clip && c < 1.0f;
    }
}

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_scale(float *const *tab, const int32_t *offs, const int64_t *tstart, int32_t n,
                           const mt_status *st) {
    if (mt_refused(st) || !st->scale) return;
    const float c = st->coef;
    MT_FOR_TILES(offs, tstart, n, tl, {
        float *x = tab[tl.j] + tl.local;
        if (MT_WHOLE(tl) && mt_aligned16(x)) {
            float4 q[MT_UNROLL];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) q[u] = *(float4 *)(x + MT_VEC_INDEX(u));
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u)
                *(float4 *)(x + MT_VEC_INDEX(u)) = make_float4(q[u].x * c, q[u].y * c, q[u].z * c, q[u].w * c);
        } else {
            for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) x[e] = x[e] * c;
        }
    })
}

namespace {

/* Raise the tensor-norm kernel's dynamic shared memory limit to at least `smem` bytes; the
 * limit only grows, under a lock, so concurrent calls never lower it under each other. */
int allow_shared_memory(size_t smem) {
    static std::mutex lock;
    static size_t allowed = 48 * 1024;
    std::lock_guard<std::mutex> hold(lock);
    if (smem <= allowed) return MT_OK;
#if !defined(MT_HIP) && !defined(__HIPCC__)
    MT_GPU_CHECK(cudaFuncSetAttribute(mt_k_tensor_norms, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                 "shared memory size");
#endif
    allowed = smem;
    return MT_OK;
}

}  // namespace

/* Norms by the tree: tensor norms into dev_norms (J floats), total/coef into st (declared in
 * mt_gpu_optim.cuh: the steps that clip call it too). */
int mt_gpu_norms(mt_arena *arena, const mt_dev_list *g, const int32_t *offsets, mt_status *st, float *dev_norms,
                 int32_t clip, float max_norm) {
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
    int threads = mt_gpu_threads();
    int blocks = mt_gpu_blocks(chunks, threads / 32);
    mt_k_chunk_sumsq<<<blocks, threads, 0, MT_STREAM>>>(g->table, g->offsets, dcs, n, chunks, partials);
    if ((rc = mt_launch_check("norm partials"))) return rc;
    int64_t half = (max_m + 31) / 32;
    size_t smem = (size_t)(2 * half) * 4;
    if ((rc = allow_shared_memory(smem))) return rc;
    mt_k_tensor_norms<<<n, threads, smem, MT_STREAM>>>(partials, dcs, dev_norms, half);
    if ((rc = mt_launch_check("tensor norms"))) return rc;
    int64_t tchunks = mt_chunk_count(n);
    mt_k_total<<<1, threads, (size_t)(2 * ((tchunks + 31) / 32)) * 4 + 8, MT_STREAM>>>(dev_norms, n, scratch, st,
                                                                                      clip, max_norm);
    return mt_launch_check("total norm");
}

extern "C" {

int mt_clip_grad_norm(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm,
                      int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(grads, offsets, n_tensors, "grads")) || (rc = mt_check_ptr(norm_out, "norm_out")) ||
        (rc = mt_check_nonneg(max_norm, "max_norm")) || (rc = mt_gpu_ready()))
        return rc;
    mt_step_ctx c;
    if ((rc = mt_list_to_device(&c.g, &c.arena, grads, offsets, n_tensors, true, nullptr)) ||
        (rc = mt_stage_status(&c)) || (rc = c.arena.alloc((void **)&c.norms, (int64_t)n_tensors * 4)))
        return rc;
    if ((rc = mt_gpu_norms(&c.arena, &c.g, offsets, c.st, c.norms, 1, max_norm))) return rc;
    int threads = c.g.threads, blocks = mt_elem_blocks(c.g);
    mt_k_scale<<<blocks, threads, 0, MT_STREAM>>>(c.g.table, c.g.offsets, c.g.tstart, n_tensors, c.st);
    if ((rc = mt_launch_check("clip scale"))) return rc;
    c.p.n = 0;   /* no params in a clip */
    if ((rc = mt_step_finish(&c, offsets, 1, norm_out, true))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

int mt_grad_norms(float *tensor_norms, float *total_norm, float *const *grads, const int32_t *offsets,
                  int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(grads, offsets, n_tensors, "grads")) ||
        (rc = mt_check_ptr(tensor_norms, "tensor_norms")) || (rc = mt_check_ptr(total_norm, "total_norm")) ||
        (rc = mt_gpu_ready()))
        return rc;
    mt_step_ctx c;
    if ((rc = mt_list_to_device(&c.g, &c.arena, grads, offsets, n_tensors, true, nullptr)) ||
        (rc = mt_stage_status(&c)) || (rc = c.arena.alloc((void **)&c.norms, (int64_t)n_tensors * 4)))
        return rc;
    if ((rc = mt_gpu_norms(&c.arena, &c.g, offsets, c.st, c.norms, 0, 0.0f))) return rc;
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
