/* mt_gpu_optim.cu -- host glue of SGD, Adam, AdamW, clipping and the fills on a GPU.
 *
 * A step is: stage (host buffers are uploaded; device buffers are used in place), norms when
 * clipping, the finiteness pre-pass, the update kernel (which does nothing if the device
 * status says refused), one synchronizing download of the status, and -- only on success --
 * the download of staged host outputs. Argument checks run on the host before any of it.
 */
#include <mutex>
#include "mt_gpu_kernels.cuh"

#define MT_SMALL_TILES 8   /* up to 8 tiles (32K elements at 256 threads): one block, one launch */

namespace {

/* Out of line, so that nothing of it moves across the floating-point environment switch. */
MT_NOINLINE mt_adam_scalars host_adam_scalars(float lr, float beta1, float beta2, float eps, float wd,
                                              int32_t maximize, int32_t decoupled, int64_t step) {
    return mt_adam_scalars_for(lr, beta1, beta2, eps, wd, maximize, decoupled, step);
}

MT_NOINLINE mt_sgd_scalars host_sgd_scalars(float lr, float momentum, float dampening, float wd,
                                            int32_t nesterov, int32_t maximize) {
    return mt_sgd_scalars_for(lr, momentum, dampening, wd, nesterov, maximize);
}

int launch_check(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

/* Blocks for an element kernel over `list`, launched with list.threads (the thread count its
 * tiles were cut for, read once when it was staged). */
int elem_blocks(const mt_dev_list &list) {
    int blocks = mt_gpu_blocks(list.tiles, 1);
    mt_gpu_record_launch(list.threads, blocks);
    return blocks;
}

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

/* Norms by the tree: tensor norms into dev_norms (J floats), total/coef into st. */
int gpu_norms(mt_arena *arena, const mt_dev_list *g, const int32_t *offsets, mt_status *st, float *dev_norms,
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
    if ((rc = launch_check("norm partials"))) return rc;
    int64_t half = (max_m + 31) / 32;
    size_t smem = (size_t)(2 * half) * 4;
    if ((rc = allow_shared_memory(smem))) return rc;
    mt_k_tensor_norms<<<n, threads, smem, MT_STREAM>>>(partials, dcs, dev_norms, half);
    if ((rc = launch_check("tensor norms"))) return rc;
    int64_t tchunks = mt_chunk_count(n);
    mt_k_total<<<1, threads, (size_t)(2 * ((tchunks + 31) / 32)) * 4 + 8, MT_STREAM>>>(dev_norms, n, scratch, st,
                                                                                      clip, max_norm);
    return launch_check("total norm");
}

struct step_ctx {
    mt_arena arena;
    mt_dev_list p, g;
    mt_status *st = nullptr;
    float *norms = nullptr;
};

/* A zeroed status on the device (no transfer). */
int stage_status(step_ctx *c) {
    int rc = c->arena.alloc((void **)&c->st, sizeof(mt_status));
    if (rc) return rc;
    MT_GPU_CHECK(gpuMemsetAsync(c->st, 0, sizeof(mt_status), MT_STREAM), "status reset");
    return MT_OK;
}

/* Stage lists and status, run the norms (clip) and the finiteness pre-pass. Staged uploads
 * travel in one copy (flush) before the first kernel. */
int prepare(step_ctx *c, float *const *params, float *const *grads, const int32_t *offsets, int32_t n,
            int32_t clip, float max_norm, bool fused_check = false) {
    int rc;
    if ((rc = mt_gpu_ready()) || (rc = mt_list_to_device(&c->p, &c->arena, params, offsets, n, true, nullptr)) ||
        (rc = mt_list_to_device(&c->g, &c->arena, grads, offsets, n, true, &c->p)) ||
        (!fused_check && (rc = stage_status(c))) || (rc = c->arena.alloc((void **)&c->norms, (int64_t)n * 4)))
        return rc;
    if (clip && (rc = gpu_norms(&c->arena, &c->g, offsets, c->st, c->norms, clip, max_norm))) return rc;
    if ((rc = c->arena.flush())) return rc;
    if (fused_check) return MT_OK;     /* the update kernel runs the pre-pass itself */
    int threads = c->p.threads, blocks = elem_blocks(c->p);
    mt_k_nonfinite<<<blocks, threads, 0, MT_STREAM>>>(c->p.table, clip ? nullptr : c->g.table, c->p.offsets,
                                                      c->p.tstart, n, &c->st->bad_params, &c->st->bad_grads);
    return launch_check("finiteness pre-pass");
}

/* Download the status; refuse (nothing written back) or finish: norm_out, staged outputs. */
int finish(step_ctx *c, const int32_t *offsets, int32_t clip, float *norm_out, bool grads_written) {
    mt_status st;
    if (c->st == mt_mapped_status()) {          /* the kernel wrote it across the bus itself */
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "step");
        st = *c->st;   /* pinned memory; the stream synchronized after the kernel wrote it */
    } else {
        MT_GPU_CHECK(gpuMemcpyAsync(&st, c->st, sizeof st, gpuMemcpyDefault, MT_STREAM), "status download");
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "step");
    }
    mt_gpu_count_d2h(sizeof st);
    if (st.nonfinite_total || st.bad_grads) {
        return st.bad_grads ? mt_fail(MT_ENONFINITE, "grads hold NaN or inf; nothing was written")
                            : mt_fail(MT_ENONFINITE, "the total gradient norm is not finite (NaN/inf in grads, "
                                                     "or squares overflow float32); nothing was written");
    }
    if (st.bad_params) return mt_fail(MT_ENONFINITE, "params hold NaN or inf; nothing was written");
    int rc;
    if ((rc = mt_list_to_host(&c->p, offsets))) return rc;
    if (grads_written && st.scale && (rc = mt_list_to_host(&c->g, offsets))) return rc;
    if (clip && norm_out) {
        norm_out[0] = st.total;
        norm_out[1] = st.coef;
    }
    return MT_OK;
}

int adam_common(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n, int32_t decoupled) {
    int rc;
    if ((rc = mt_check_registry(params, offsets, n, "params")) || (rc = mt_check_registry(grads, offsets, n, "grads")) ||
        (rc = mt_check_ptr(exp_avg, "exp_avg")) || (rc = mt_check_ptr(exp_avg_sq, "exp_avg_sq")) ||
        (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_adam_args(lr, beta1, beta2, eps, weight_decay, clip, max_norm, step)))
        return rc;
    step_ctx c;
    int64_t tile = mt_tile_elems(), tiles = 0;
    for (int32_t j = 0; j < n; ++j) tiles += (offsets[j + 1] - offsets[j] + tile - 1) / tile;
    mt_status *mapped = mt_mapped_status();
    bool small = !clip && tiles <= MT_SMALL_TILES && mapped;
    if ((rc = prepare(&c, params, grads, offsets, n, clip, max_norm, small))) return rc;
    int64_t bytes = (int64_t)offsets[n] * 4;
    float *m = nullptr, *v = nullptr;
    bool sm = false, sv = false;
    if ((rc = mt_buf_to_device((void **)&m, &sm, &c.arena, exp_avg, bytes, true)) ||
        (rc = mt_buf_to_device((void **)&v, &sv, &c.arena, exp_avg_sq, bytes, true)))
        return rc;
    mt_fp_env env;                  /* host scalars in IEEE defaults, whatever the caller set */
    mt_fp_begin(&env);
    mt_adam_scalars s = host_adam_scalars(lr, beta1, beta2, eps, weight_decay, maximize != 0, decoupled, step);
    mt_fp_end(&env);
    int threads = c.p.threads, blocks = elem_blocks(c.p);
    if (small) {
        mt_gpu_record_launch(threads, 1);
        *mapped = mt_status{0, 0, 0, 0, 0.0f, 0.0f};
        if (s.coupled)
            mt_k_adam_small<1><<<1, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, m, v, s, mapped);
        else
            mt_k_adam_small<0><<<1, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, m, v, s, mapped);
        c.st = mapped;
    } else if (s.coupled)
        mt_k_adam<1><<<blocks, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, m, v, s, c.st);
    else
        mt_k_adam<0><<<blocks, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, m, v, s, c.st);
    if ((rc = launch_check("adam update")) || (rc = finish(&c, offsets, clip, norm_out, true))) return rc;
    if ((sm && (rc = mt_buf_to_host(exp_avg, m, bytes))) || (sv && (rc = mt_buf_to_host(exp_avg_sq, v, bytes))))
        return rc;
    if (sm || sv || c.p.any_staged() || c.g.any_staged()) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

}  // namespace

extern "C" {

int mt_adam_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                 const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                 int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n_tensors) {
    return adam_common(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps, weight_decay,
                       maximize, clip, max_norm, step, n_tensors, 0);
}

int mt_adamw_step(float *const *params, float *const *grads, float *exp_avg, float *exp_avg_sq, float *norm_out,
                  const int32_t *offsets, float lr, float beta1, float beta2, float eps, float weight_decay,
                  int32_t maximize, int32_t clip, float max_norm, int64_t step, int32_t n_tensors) {
    return adam_common(params, grads, exp_avg, exp_avg_sq, norm_out, offsets, lr, beta1, beta2, eps, weight_decay,
                       maximize, clip, max_norm, step, n_tensors, 1);
}

int mt_sgd_step(float *const *params, float *const *grads, float *momentum_buffer, int32_t *buf_initialized,
                float *norm_out, const int32_t *offsets, float lr, float momentum, float dampening,
                float weight_decay, int32_t nesterov, int32_t maximize, int32_t clip, float max_norm,
                int32_t n_tensors) {
    int rc;
    int32_t n = n_tensors;
    if ((rc = mt_check_registry(params, offsets, n, "params")) || (rc = mt_check_registry(grads, offsets, n, "grads")) ||
        (momentum != 0.0f && (rc = mt_check_ptr(momentum_buffer, "momentum_buffer"))) ||
        (rc = mt_check_ptr(buf_initialized, "buf_initialized")) || (clip && (rc = mt_check_ptr(norm_out, "norm_out"))) ||
        (rc = mt_check_sgd_args(lr, momentum, dampening, weight_decay, nesterov, clip, max_norm)))
        return rc;
    step_ctx c;
    if ((rc = prepare(&c, params, grads, offsets, n, clip, max_norm))) return rc;
    int64_t bytes = (int64_t)offsets[n] * 4;
    float *buf = nullptr;
    bool sb = false;
    int32_t *init = nullptr;
    bool has_buf = momentum != 0.0f;
    if (has_buf && ((rc = mt_buf_to_device((void **)&buf, &sb, &c.arena, momentum_buffer, bytes, true)) ||
                    (rc = c.arena.upload((void **)&init, buf_initialized, (int64_t)n * 4))))
        return rc;
    mt_fp_env env;
    mt_fp_begin(&env);
    mt_sgd_scalars s = host_sgd_scalars(lr, momentum, dampening, weight_decay, nesterov != 0, maximize != 0);
    mt_fp_end(&env);
    int threads = c.p.threads, blocks = elem_blocks(c.p);
#define MT_SGD_LAUNCH(C, B)                                                                                    \
    mt_k_sgd<C, B><<<blocks, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, buf, init, s, \
                                                      c.st)
    if (s.coupled && has_buf) MT_SGD_LAUNCH(1, 1);
    else if (s.coupled) MT_SGD_LAUNCH(1, 0);
    else if (has_buf) MT_SGD_LAUNCH(0, 1);
    else MT_SGD_LAUNCH(0, 0);
#undef MT_SGD_LAUNCH
    if ((rc = launch_check("sgd update")) || (rc = finish(&c, offsets, clip, norm_out, true))) return rc;
    if (sb && (rc = mt_buf_to_host(momentum_buffer, buf, bytes))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    if (has_buf)
        for (int32_t j = 0; j < n; ++j) buf_initialized[j] = 1;
    return MT_OK;
}

int mt_clip_grad_norm(float *const *grads, float *norm_out, const int32_t *offsets, float max_norm,
                      int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(grads, offsets, n_tensors, "grads")) || (rc = mt_check_ptr(norm_out, "norm_out")) ||
        (rc = mt_check_nonneg(max_norm, "max_norm")) || (rc = mt_gpu_ready()))
        return rc;
    step_ctx c;
    if ((rc = mt_list_to_device(&c.g, &c.arena, grads, offsets, n_tensors, true, nullptr)) ||
        (rc = stage_status(&c)) || (rc = c.arena.alloc((void **)&c.norms, (int64_t)n_tensors * 4)))
        return rc;
    if ((rc = gpu_norms(&c.arena, &c.g, offsets, c.st, c.norms, 1, max_norm))) return rc;
    int threads = c.g.threads, blocks = elem_blocks(c.g);
    mt_k_scale<<<blocks, threads, 0, MT_STREAM>>>(c.g.table, c.g.offsets, c.g.tstart, n_tensors, c.st);
    if ((rc = launch_check("clip scale"))) return rc;
    c.p.n = 0;   /* no params in a clip */
    if ((rc = finish(&c, offsets, 1, norm_out, true))) return rc;
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
    step_ctx c;
    if ((rc = mt_list_to_device(&c.g, &c.arena, grads, offsets, n_tensors, true, nullptr)) ||
        (rc = stage_status(&c)) || (rc = c.arena.alloc((void **)&c.norms, (int64_t)n_tensors * 4)))
        return rc;
    if ((rc = gpu_norms(&c.arena, &c.g, offsets, c.st, c.norms, 0, 0.0f))) return rc;
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

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(tensors, offsets, n_tensors, "tensors")) || (rc = mt_gpu_ready())) return rc;
    mt_arena arena;
    mt_dev_list t;
    if ((rc = mt_list_to_device(&t, &arena, tensors, offsets, n_tensors, false, nullptr)) || (rc = arena.flush()))
        return rc;
    int threads = t.threads, blocks = elem_blocks(t);
    mt_k_zero<<<blocks, threads, 0, MT_STREAM>>>(t.table, t.offsets, t.tstart, n_tensors);
    if ((rc = launch_check("fill zero")) || (rc = mt_list_to_host(&t, offsets))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "fill zero");
    return MT_OK;
}

int mt_uniform_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double low, double high,
                    int64_t n) {
    float width, lo;
    int rc = mt_check_uniform_args(&width, &lo, out, low, high, n);
    if (rc) return rc;
    if (n == 0) return MT_OK;
    if ((rc = mt_gpu_ready())) return rc;
    mt_arena arena;
    float *dev = nullptr;
    bool staged = false;
    if ((rc = mt_buf_to_device((void **)&dev, &staged, &arena, out, n * 4, false))) return rc;
    int threads = mt_gpu_threads(), blocks = mt_gpu_blocks(n, threads);
    mt_gpu_record_launch(threads, blocks);
    mt_k_uniform<<<blocks, threads, 0, MT_STREAM>>>(dev, n, seed, stream, offset, lo, width);
    if ((rc = launch_check("uniform fill")) || (staged && (rc = mt_buf_to_host(out, dev, n * 4)))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "uniform fill");
    return MT_OK;
}

}  /* extern "C" */
