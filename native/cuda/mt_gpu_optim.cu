/* mt_gpu_optim.cu -- SGD, Adam and AdamW steps (contract: native/contracts/optim.md) and
 * zero_grad's fill on a GPU: the kernels and their host glue.
 *
 * A step is: stage (host buffers are uploaded; device buffers are used in place), norms when
 * clipping (mt_gpu_norms, mt_gpu_clip.cu), the finiteness pre-pass, the update kernel (which
 * does nothing if the device status says refused), one synchronizing download of the status,
 * and -- only on success -- the download of staged host outputs. Argument checks run on the
 * host before any of it. The tile walk and the staging/finishing glue are shared with
 * clip_grad_norm_ through mt_gpu_optim.cuh.
 */
#include "mt_gpu_optim.cuh"

uint64_t mt_optim_features(void) { return MT_FEATURE_OPTIM; }

#define MT_SMALL_TILES 8   /* up to 8 tiles (32K elements at 256 threads): one block, one launch */

/* ---- kernels ---- */
__device__ __forceinline__ bool mt_bad4(float4 q) {
    return !(mt_is_finite(q.x) & mt_is_finite(q.y) & mt_is_finite(q.z) & mt_is_finite(q.w));
}

/* Finiteness of params and (when gtab is given) grads over this block's tiles. */
__device__ __forceinline__ void mt_tiles_nonfinite(float *const *ptab, float *const *gtab, const int32_t *offs,
                                                   const int64_t *tstart, int32_t n, bool &bp, bool &bg) {
    MT_FOR_TILES(offs, tstart, n, tl, {
        const float *p = ptab[tl.j] + tl.local;
        const float *g = gtab ? gtab[tl.j] + tl.local : p;
        if (MT_WHOLE(tl) && mt_aligned16(p) && mt_aligned16(g)) {
            float4 qp[MT_UNROLL], qg[MT_UNROLL];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) {
                qp[u] = *(const float4 *)(p + MT_VEC_INDEX(u));
                qg[u] = gtab ? *(const float4 *)(g + MT_VEC_INDEX(u)) : qp[u];
            }
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) { bp |= mt_bad4(qp[u]); bg |= mt_bad4(qg[u]); }
        } else {
            for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) {
                bp |= !mt_is_finite(p[e]);
                bg |= !mt_is_finite(g[e]);
            }
        }
    })
    bg = bg && gtab;
}

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_nonfinite(float *const *ptab, float *const *gtab, const int32_t *offs, const int64_t *tstart,
                               int32_t n, int32_t *flag_p, int32_t *flag_g) {
    bool bp = false, bg = false;
    mt_tiles_nonfinite(ptab, gtab, offs, tstart, n, bp, bg);
    if (bp) *flag_p = 1;   /* every writer stores the same value: no atomic needed */
    if (bg) *flag_g = 1;
}

/* Adam over this block's tiles: whole aligned tiles with float4 loads issued first. */
template <int COUPLED>
__device__ __forceinline__ void mt_tiles_adam(float *const *ptab, float *const *gtab, const int32_t *offs,
                                              const int64_t *tstart, int32_t n, float *m, float *v,
                                              const mt_adam_scalars &s, float coef, bool scale) {
    MT_FOR_TILES(offs, tstart, n, tl, {
        float *p = ptab[tl.j] + tl.local, *g = gtab[tl.j] + tl.local, *mm = m + tl.flat, *vv = v + tl.flat;
        if (MT_WHOLE(tl) && mt_aligned16(p) && mt_aligned16(g) && mt_aligned16(mm) && mt_aligned16(vv)) {
            float4 qp[MT_UNROLL], qg[MT_UNROLL], qm[MT_UNROLL], qv[MT_UNROLL];
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) {
                int64_t e = MT_VEC_INDEX(u);
                qp[u] = *(float4 *)(p + e); qg[u] = *(float4 *)(g + e);
                qm[u] = *(float4 *)(mm + e); qv[u] = *(float4 *)(vv + e);
            }
            MT_PRAGMA_UNROLL
            for (int u = 0; u < MT_UNROLL; ++u) {
                int64_t e = MT_VEC_INDEX(u);
                float4 gs = make_float4(qg[u].x * coef, qg[u].y * coef, qg[u].z * coef, qg[u].w * coef);
                mt_adam_elem(&qp[u].x, &qm[u].x, &qv[u].x, gs.x, &s, COUPLED);
                mt_adam_elem(&qp[u].y, &qm[u].y, &qv[u].y, gs.y, &s, COUPLED);
                mt_adam_elem(&qp[u].z, &qm[u].z, &qv[u].z, gs.z, &s, COUPLED);
                mt_adam_elem(&qp[u].w, &qm[u].w, &qv[u].w, gs.w, &s, COUPLED);
                *(float4 *)(p + e) = qp[u]; *(float4 *)(mm + e) = qm[u]; *(float4 *)(vv + e) = qv[u];
                if (scale) *(float4 *)(g + e) = gs;
            }
        } else {
            for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) {
                float gi = g[e] * coef;
                if (scale) g[e] = gi;
                mt_adam_elem(&p[e], &mm[e], &vv[e], gi, &s, COUPLED);
            }
        }
    })
}

template <int COUPLED>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_adam(float *const *ptab, float *const *gtab, const int32_t *offs, const int64_t *tstart,
                          int32_t n, float *m, float *v, mt_adam_scalars s, const mt_status *st) {
    if (mt_refused(st)) return;
    mt_tiles_adam<COUPLED>(ptab, gtab, offs, tstart, n, m, v, s, st->scale ? st->coef : 1.0f, st->scale != 0);
}

/* Small steps without clipping, in one launch of one block: the pre-pass over every tile,
 * a block-wide vote, then the update (or nothing). */
template <int COUPLED>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_adam_small(float *const *ptab, float *const *gtab, const int32_t *offs, const int64_t *tstart,
                                int32_t n, float *m, float *v, mt_adam_scalars s, mt_status *st) {
    bool bp = false, bg = false;
    mt_tiles_nonfinite(ptab, gtab, offs, tstart, n, bp, bg);
    int any_p = __syncthreads_or(bp), any_g = __syncthreads_or(bg);
    if (any_p | any_g) {
        if (threadIdx.x == 0) { st->bad_params = any_p != 0; st->bad_grads = any_g != 0; }
        return;
    }
    mt_tiles_adam<COUPLED>(ptab, gtab, offs, tstart, n, m, v, s, 1.0f, false);
}

template <int COUPLED, int HAS_BUF>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_sgd(float *const *ptab, float *const *gtab, const int32_t *offs, const int64_t *tstart,
                         int32_t n, float *buf, const int32_t *initialized, mt_sgd_scalars s, const mt_status *st) {
    if (mt_refused(st)) return;
    const float coef = st->scale ? st->coef : 1.0f;
    const bool scale = st->scale;
    MT_FOR_TILES(offs, tstart, n, tl, {
        float *p = ptab[tl.j] + tl.local, *g = gtab[tl.j] + tl.local;
        float *b = HAS_BUF ? buf + tl.flat : p;
        int init = HAS_BUF ? initialized[tl.j] : 0;
        for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) {
            float gi = g[e] * coef;
            if (scale) g[e] = gi;
            mt_sgd_elem(&p[e], &b[e], gi, &s, COUPLED, HAS_BUF, init);
        }
    })
}

__global__ void mt_k_zero(float *const *tab, const int32_t *offs, const int64_t *tstart, int32_t n) {
    MT_FOR_TILES(offs, tstart, n, tl, {
        float *x = tab[tl.j] + tl.local;
        for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) x[e] = 0.0f;
    })
}

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

/* Stage lists and status, run the norms (clip) and the finiteness pre-pass. Staged uploads
 * travel in one copy (flush) before the first kernel. */
int prepare(mt_step_ctx *c, float *const *params, float *const *grads, const int32_t *offsets, int32_t n,
            int32_t clip, float max_norm, bool fused_check = false) {
    int rc;
    if ((rc = mt_gpu_ready()) || (rc = mt_list_to_device(&c->p, &c->arena, params, offsets, n, true, nullptr)) ||
        (rc = mt_list_to_device(&c->g, &c->arena, grads, offsets, n, true, &c->p)) ||
        (!fused_check && (rc = mt_stage_status(c))) || (rc = c->arena.alloc((void **)&c->norms, (int64_t)n * 4)))
        return rc;
    if (clip && (rc = mt_gpu_norms(&c->arena, &c->g, offsets, c->st, c->norms, clip, max_norm))) return rc;
    if ((rc = c->arena.flush())) return rc;
    if (fused_check) return MT_OK;     /* the update kernel runs the pre-pass itself */
    int threads = c->p.threads, blocks = mt_elem_blocks(c->p);
    mt_k_nonfinite<<<blocks, threads, 0, MT_STREAM>>>(c->p.table, clip ? nullptr : c->g.table, c->p.offsets,
                                                      c->p.tstart, n, &c->st->bad_params, &c->st->bad_grads);
    return mt_launch_check("finiteness pre-pass");
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
    mt_step_ctx c;
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
    int threads = c.p.threads, blocks = mt_elem_blocks(c.p);
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
    if ((rc = mt_launch_check("adam update")) || (rc = mt_step_finish(&c, offsets, clip, norm_out, true))) return rc;
    if ((sm && (rc = mt_buf_to_host(exp_avg, m, bytes))) || (sv && (rc = mt_buf_to_host(exp_avg_sq, v, bytes))))
        return rc;
    if (sm || sv || c.p.any_staged() || c.g.any_staged()) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

}  // namespace

/* ---- host glue shared with clip_grad_norm_ (declared in mt_gpu_optim.cuh) ---- */
int mt_launch_check(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

/* Blocks for an element kernel over `list`, launched with list.threads (the thread count its
 * tiles were cut for, read once when it was staged). */
int mt_elem_blocks(const mt_dev_list &list) {
    int blocks = mt_gpu_blocks(list.tiles, 1);
    mt_gpu_record_launch(list.threads, blocks);
    return blocks;
}

/* A zeroed status on the device (no transfer). */
int mt_stage_status(mt_step_ctx *c) {
    int rc = c->arena.alloc((void **)&c->st, sizeof(mt_status));
    if (rc) return rc;
    MT_GPU_CHECK(gpuMemsetAsync(c->st, 0, sizeof(mt_status), MT_STREAM), "status reset");
    return MT_OK;
}

/* Download the status; refuse (nothing written back) or finish: norm_out, staged outputs. */
int mt_step_finish(mt_step_ctx *c, const int32_t *offsets, int32_t clip, float *norm_out, bool grads_written) {
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
    mt_step_ctx c;
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
    int threads = c.p.threads, blocks = mt_elem_blocks(c.p);
#define MT_SGD_LAUNCH(C, B)                                                                                    \
    mt_k_sgd<C, B><<<blocks, threads, 0, MT_STREAM>>>(c.p.table, c.g.table, c.p.offsets, c.p.tstart, n, buf, init, s, \
                                                      c.st)
    if (s.coupled && has_buf) MT_SGD_LAUNCH(1, 1);
    else if (s.coupled) MT_SGD_LAUNCH(1, 0);
    else if (has_buf) MT_SGD_LAUNCH(0, 1);
    else MT_SGD_LAUNCH(0, 0);
#undef MT_SGD_LAUNCH
    if ((rc = mt_launch_check("sgd update")) || (rc = mt_step_finish(&c, offsets, clip, norm_out, true))) return rc;
    if (sb && (rc = mt_buf_to_host(momentum_buffer, buf, bytes))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    if (has_buf)
        for (int32_t j = 0; j < n; ++j) buf_initialized[j] = 1;
    return MT_OK;
}

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_registry(tensors, offsets, n_tensors, "tensors")) || (rc = mt_gpu_ready())) return rc;
    mt_arena arena;
    mt_dev_list t;
    if ((rc = mt_list_to_device(&t, &arena, tensors, offsets, n_tensors, false, nullptr)) || (rc = arena.flush()))
        return rc;
    int threads = t.threads, blocks = mt_elem_blocks(t);
    mt_k_zero<<<blocks, threads, 0, MT_STREAM>>>(t.table, t.offsets, t.tstart, n_tensors);
    if ((rc = mt_launch_check("fill zero")) || (rc = mt_list_to_host(&t, offsets))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "fill zero");
    return MT_OK;
}

}  /* extern "C" */
