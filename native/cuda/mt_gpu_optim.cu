/* mt_gpu_optim.cu -- SGD, Adam and AdamW steps, flat and grouped (contract:
 * native/contracts/optim.md), and zero_grad's fill on a GPU: the kernels and their host glue.
 *
 * Every step is a grouped one (the flat calls, native/common/mt_optim_groups.c, are one group):
 * one update launch covers every tensor of every group, each tile reading its tensor's host
 * scalars from a small device table (per (group, step) run for Adam, per group for SGD) staged
 * with the step's other uploads, the state tables and tensor map in one cached upload.
 * A step is: stage the grads (host buffers are uploaded; device buffers are used in place),
 * norms when clipping (mt_gpu_norms, mt_gpu_clip.cu) or the finiteness pre-pass, then -- while
 * the GPU runs those -- stage the params, the state and the tables (a second flush), the update
 * kernel (which does nothing if the device status says refused), one synchronizing download of
 * the status, and -- only on success -- the download of staged host outputs. Argument checks run on the
 * host before any of it. The tile walk and the staging/finishing glue are shared with
 * clip_grad_norm_ through mt_gpu_optim.cuh.
 */
#include <string.h>
#include "mt_gpu_optim.cuh"
#include "mt_optim_groups.h"

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

/* What an update kernel reads besides the status: the device tables of a grouped step. The
 * state tables hold NULL where a tensor does not use that state; var[var_of[j]] is tensor j's
 * host scalars (Adam: per (group, step) run; SGD: per group, var_of = tensor_group). */
struct mt_step_tabs {
    float *const *p, *const *g, *const *m, *const *v, *const *w;
    const int32_t *offs, *var_of, *init;
    const int64_t *tstart;
    const void *var;
    int32_t n;
};

/* One Adam tile: a whole aligned tile with float4 loads issued first, else element by element. */
template <int COUPLED, int AMS>
__device__ __forceinline__ void mt_tile_adam(const mt_tile &tl, const mt_step_tabs &a, const mt_adam_scalars &s,
                                             float coef, bool scale) {
    float *p = a.p[tl.j] + tl.local, *g = a.g[tl.j] + tl.local, *mm = a.m[tl.j] + tl.local;
    float *vv = a.v[tl.j] + tl.local, *ww = AMS ? a.w[tl.j] + tl.local : nullptr;
    if (MT_WHOLE(tl) && mt_aligned16(p) && mt_aligned16(g) && mt_aligned16(mm) && mt_aligned16(vv) &&
        (!AMS || mt_aligned16(ww))) {
        float4 qp[MT_UNROLL], qg[MT_UNROLL], qm[MT_UNROLL], qv[MT_UNROLL], qw[MT_UNROLL];
        MT_PRAGMA_UNROLL
        for (int u = 0; u < MT_UNROLL; ++u) {
            int64_t e = MT_VEC_INDEX(u);
            qp[u] = *(float4 *)(p + e); qg[u] = *(float4 *)(g + e);
            qm[u] = *(float4 *)(mm + e); qv[u] = *(float4 *)(vv + e);
            if (AMS) qw[u] = *(float4 *)(ww + e);
        }
        MT_PRAGMA_UNROLL
        for (int u = 0; u < MT_UNROLL; ++u) {
            int64_t e = MT_VEC_INDEX(u);
            float4 gs = make_float4(qg[u].x * coef, qg[u].y * coef, qg[u].z * coef, qg[u].w * coef);
            mt_adam_elem(&qp[u].x, &qm[u].x, &qv[u].x, &qw[u].x, gs.x, &s, COUPLED, AMS);
            mt_adam_elem(&qp[u].y, &qm[u].y, &qv[u].y, &qw[u].y, gs.y, &s, COUPLED, AMS);
            mt_adam_elem(&qp[u].z, &qm[u].z, &qv[u].z, &qw[u].z, gs.z, &s, COUPLED, AMS);
            mt_adam_elem(&qp[u].w, &qm[u].w, &qv[u].w, &qw[u].w, gs.w, &s, COUPLED, AMS);
            *(float4 *)(p + e) = qp[u]; *(float4 *)(mm + e) = qm[u]; *(float4 *)(vv + e) = qv[u];
            if (AMS) *(float4 *)(ww + e) = qw[u];
            if (scale) *(float4 *)(g + e) = gs;
        }
    } else {
        for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) {
            float gi = g[e] * coef;
            if (scale) g[e] = gi;
            mt_adam_elem(&p[e], &mm[e], &vv[e], AMS ? &ww[e] : nullptr, gi, &s, COUPLED, AMS);
        }
    }
}

/* Adam over this block's tiles; each tile reads its tensor's scalars (the same for every
 * thread of the block, so the branch on its flags never diverges). */
__device__ __forceinline__ void mt_tiles_adam(const mt_step_tabs &a, float coef, bool scale) {
    const mt_adam_scalars *var = (const mt_adam_scalars *)a.var;
    MT_FOR_TILES_DOWN(a.offs, a.tstart, a.n, tl, {
        const mt_adam_scalars s = var[a.var_of[tl.j]];
        switch ((s.coupled ? 2 : 0) | (s.amsgrad ? 1 : 0)) {
        case 0: mt_tile_adam<0, 0>(tl, a, s, coef, scale); break;
        case 1: mt_tile_adam<0, 1>(tl, a, s, coef, scale); break;
        case 2: mt_tile_adam<1, 0>(tl, a, s, coef, scale); break;
        default: mt_tile_adam<1, 1>(tl, a, s, coef, scale); break;
        }
    })
}

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_adam(mt_step_tabs a, const mt_status *st) {
    if (mt_refused(st)) return;
    mt_tiles_adam(a, st->scale ? st->coef : 1.0f, st->scale != 0);
}

/* Small steps without clipping, in one launch of one block: the pre-pass over every tile of
 * the grads (optim.md step 3: parameters are not read before the update), a block-wide vote,
 * then the update (or nothing). */
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_adam_small(mt_step_tabs a, mt_status *st) {
    bool bg = false, unused = false;
    mt_tiles_nonfinite(a.g, nullptr, a.offs, a.tstart, a.n, bg, unused);
    if (__syncthreads_or(bg)) {
        if (threadIdx.x == 0) st->bad_grads = 1;
        return;
    }
    mt_tiles_adam(a, 1.0f, false);
}

template <int COUPLED, int HAS_BUF>
__device__ __forceinline__ void mt_tile_sgd(const mt_tile &tl, const mt_step_tabs &a, const mt_sgd_scalars &s,
                                            float coef, bool scale) {
    float *p = a.p[tl.j] + tl.local, *g = a.g[tl.j] + tl.local;
    float *b = HAS_BUF ? a.m[tl.j] + tl.local : p;
    int init = HAS_BUF ? a.init[tl.j] : 0;
    for (int64_t e = threadIdx.x; e < tl.len; e += blockDim.x) {
        float gi = g[e] * coef;
        if (scale) g[e] = gi;
        mt_sgd_elem(&p[e], &b[e], gi, &s, COUPLED, HAS_BUF, init);
    }
}

__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_sgd(mt_step_tabs a, const mt_status *st) {
    if (mt_refused(st)) return;
    const float coef = st->scale ? st->coef : 1.0f;
    const bool scale = st->scale;
    const mt_sgd_scalars *var = (const mt_sgd_scalars *)a.var;
    MT_FOR_TILES_DOWN(a.offs, a.tstart, a.n, tl, {
        const mt_sgd_scalars s = var[a.var_of[tl.j]];
        switch ((s.coupled ? 2 : 0) | (s.momentum != 0.0f ? 1 : 0)) {
        case 0: mt_tile_sgd<0, 0>(tl, a, s, coef, scale); break;
        case 1: mt_tile_sgd<0, 1>(tl, a, s, coef, scale); break;
        case 2: mt_tile_sgd<1, 0>(tl, a, s, coef, scale); break;
        default: mt_tile_sgd<1, 1>(tl, a, s, coef, scale); break;
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

/* A grouped step's staging: params and grads (the context shared with clip_grad_norm_) and
 * the state lists; every device table but the params' and grads' travels in one cached upload. */
struct mt_group_step {
    mt_step_ctx c;
    mt_dev_list m, v, w;
    const void *dev[5] = {};   /* device copies: state tables, then int32 tables, in upload order */
};

/* Whether every entry of `used` points into one device allocation of ours at the registry's
 * offsets (the flat, resident state of mojo_train's own optimizers): then one lookup classifies
 * them all, where a table of separate tensors costs one lookup per tensor. */
bool device_flat(mt_dev_list *out, const std::vector<float *> &used, const int32_t *offsets, int32_t n) {
    uintptr_t base = 0;
    const float *first = nullptr;
    int32_t last = -1;
    for (int32_t j = 0; j < n; ++j) {
        if (!used[j]) continue;
        uintptr_t b = (uintptr_t)used[j] - (uintptr_t)offsets[j] * 4;
        if (first && b != base) return false;
        if (!first) { base = b; first = used[j]; }
        last = j;
    }
    if (!first || !mt_gpu_own_range(first, (int64_t)((uintptr_t)(used[last] + (offsets[last + 1] - offsets[last])) -
                                                    (uintptr_t)first)))
        return false;
    out->n = n;
    out->total = offsets[n];
    out->host_ptr = used;
    out->dev_ptr = used;
    out->staged.assign(n, 0);
    return true;
}

/* Stage the state `table` of the tensors with uses[j] (entries of the others, and a NULL table,
 * stay NULL: never read, never staged). */
int stage_state(mt_dev_list *out, mt_arena *arena, float *const *table, const int32_t *offsets, int32_t n,
                const std::vector<char> &uses) {
    std::vector<float *> used(n, nullptr);
    for (int32_t j = 0; j < n; ++j)
        if (table && uses[j]) used[j] = table[j];
    if (device_flat(out, used, offsets, n)) return MT_OK;
    return mt_list_stage(out, arena, used.data(), offsets, n, true);
}

/* One cached upload of the device state tables (n pointers each) and of int32 tables (n each). */
int upload_tables(mt_group_step *s, std::initializer_list<const mt_dev_list *> lists,
                  std::initializer_list<const int32_t *> ints, int32_t n) {
    std::vector<char> blob((lists.size() * 8 + ints.size() * 4) * (size_t)n);
    std::vector<size_t> at;
    size_t pos = 0;
    for (const mt_dev_list *l : lists) {
        memcpy(blob.data() + pos, l->dev_ptr.data(), (size_t)n * 8);
        at.push_back(pos);
        pos += (size_t)n * 8;
    }
    for (const int32_t *x : ints) {
        memcpy(blob.data() + pos, x, (size_t)n * 4);
        at.push_back(pos);
        pos += (size_t)n * 4;
    }
    const char *dev = nullptr;
    int rc = mt_cached_upload((const void **)&dev, blob.data(), (int64_t)blob.size());
    if (rc) return rc;
    for (size_t k = 0; k < at.size(); ++k) s->dev[k] = dev + at[k];
    return MT_OK;
}

/* Stage the grads first: their list carries the tiles and offsets every list of the step
 * shares, so the checks over them (run_checks) go out before the params and the state are
 * staged, and the GPU runs the pre-pass while the host stages the rest (stage_params). */
int stage_grads(mt_step_ctx *c, float *const *grads, const int32_t *offsets, int32_t n) {
    int rc;
    if ((rc = mt_gpu_ready()) || (rc = mt_list_to_device(&c->g, &c->arena, grads, offsets, n, true, nullptr)))
        return rc;
    return MT_OK;
}

int stage_params(mt_step_ctx *c, float *const *params, const int32_t *offsets, int32_t n) {
    return mt_list_to_device(&c->p, &c->arena, params, offsets, n, true, &c->g);
}

/* A failure once the checks are launched (staging after them ran out of memory): the call
 * still returns with nothing of its own running on the stream (mt_gpu_runtime.h). */
int drained(int rc) {
    if (rc) {
        gpuStreamSynchronize(MT_STREAM);
        gpuGetLastError();
    }
    return rc;
}

/* The status, the norms when clipping, a flush of what is staged so far, then, without
 * clipping, the finiteness pre-pass over the grads (clipping's norms refuse a non-finite grad;
 * parameters are not read before the update, optim.md step 3). Only the grads are staged yet
 * (stage_grads). `fused` (the small kernel votes itself, never with clipping): nothing here
 * but the norms' room; the grads go up with the params in the step's one flush. */
int run_checks(mt_step_ctx *c, const int32_t *offsets, int32_t n, int32_t clip, float max_norm, bool fused) {
    int rc;
    if ((!fused && (rc = mt_stage_status(c))) || (rc = c->arena.alloc((void **)&c->norms, (int64_t)n * 4))) return rc;
    if (fused) return MT_OK;   /* nothing to launch yet: the one flush after the params serves (one upload) */
    if (clip && (rc = mt_gpu_norms(&c->arena, &c->g, offsets, c->st, c->norms, clip, max_norm))) return rc;
    if ((rc = c->arena.flush())) return rc;
    if (clip) return MT_OK;
    int threads = c->g.threads, blocks = mt_elem_blocks(c->g);
    mt_k_nonfinite<<<blocks, threads, 0, MT_STREAM>>>(c->g.table, nullptr, c->g.offsets, c->g.tstart, n,
                                                      &c->st->bad_grads, &c->st->bad_params);
    return mt_launch_check("finiteness pre-pass");
}

/* After the update kernel: the status (refusal: nothing written back), then the staged state
 * lists to the host; one synchronization covers every download. */
int finish(mt_group_step *s, const int32_t *offsets, int32_t clip, float *norm_out, const char *what) {
    int rc;
    if ((rc = mt_launch_check(what)) || (rc = mt_step_finish(&s->c, offsets, clip, norm_out, true)) ||
        (rc = mt_list_to_host(&s->m, offsets)) || (rc = mt_list_to_host(&s->v, offsets)) ||
        (rc = mt_list_to_host(&s->w, offsets)))
        return rc;
    if (s->c.p.any_staged() || s->c.g.any_staged() || s->m.any_staged() || s->v.any_staged() || s->w.any_staged())
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

std::vector<char> tensors_that(int (*uses)(const void *, const int32_t *, const int32_t *, int32_t),
                               const void *groups, const int32_t *tensor_group, const int32_t *offsets, int32_t n) {
    std::vector<char> out(n);
    for (int32_t j = 0; j < n; ++j)
        out[j] = uses ? uses(groups, tensor_group, offsets, j) : offsets[j + 1] > offsets[j];
    return out;
}

int uses_max(const void *g, const int32_t *tg, const int32_t *offsets, int32_t j) {
    return mt_adam_uses_max((const mt_adam_group *)g, tg, offsets, j);
}

int uses_buf(const void *g, const int32_t *tg, const int32_t *offsets, int32_t j) {
    return mt_sgd_uses_buf((const mt_sgd_group *)g, tg, offsets, j);
}

/* The host scalars of every (group, step) run, in IEEE defaults whatever the caller set. */
int32_t adam_plan(std::vector<mt_adam_scalars> *var, std::vector<int32_t> *var_of, const mt_adam_group *groups,
                  const int32_t *tensor_group, const int64_t *steps, int32_t n) {
    var->resize(n);
    var_of->resize(n);
    mt_fp_env env;
    mt_fp_begin(&env);
    int32_t k = mt_adam_plan(var->data(), var_of->data(), groups, tensor_group, steps, n);
    mt_fp_end(&env);
    return k;
}

int adam_groups(float *const *params, float *const *grads, float *const *exp_avg, float *const *exp_avg_sq,
                float *const *max_exp_avg_sq, int64_t *steps, float *norm_out, const int32_t *offsets,
                const mt_adam_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                int32_t n_groups, int32_t n) {
    int rc;
    if ((rc = mt_check_adam_groups(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets, groups,
                                   tensor_group, clip, max_norm, n_groups, n)) ||
        (rc = mt_gpu_ready()))
        return rc;
    mt_group_step s;
    mt_step_ctx &c = s.c;
    std::vector<char> all = tensors_that(nullptr, groups, tensor_group, offsets, n);
    std::vector<mt_adam_scalars> var;
    std::vector<int32_t> var_of;
    int32_t k = adam_plan(&var, &var_of, groups, tensor_group, steps, n);
    void *dvar = nullptr;
    if ((rc = stage_grads(&c, grads, offsets, n))) return rc;
    mt_status *mapped = mt_mapped_status();
    bool small = !clip && c.g.tiles <= MT_SMALL_TILES && mapped;
    if ((rc = run_checks(&c, offsets, n, clip, max_norm, small))) return drained(rc);
    if ((rc = stage_params(&c, params, offsets, n)) || (rc = stage_state(&s.m, &c.arena, exp_avg, offsets, n, all)) ||
        (rc = stage_state(&s.v, &c.arena, exp_avg_sq, offsets, n, all)) ||
        (rc = stage_state(&s.w, &c.arena, max_exp_avg_sq, offsets, n,
                          tensors_that(uses_max, groups, tensor_group, offsets, n))) ||
        (rc = upload_tables(&s, {&s.m, &s.v, &s.w}, {var_of.data()}, n)) ||
        (rc = c.arena.stage(&dvar, var.data(), (int64_t)k * (int64_t)sizeof(mt_adam_scalars))) ||
        (rc = c.arena.flush()))
        return drained(rc);
    mt_step_tabs a = {c.p.table, c.g.table, (float *const *)s.dev[0], (float *const *)s.dev[1],
                      (float *const *)s.dev[2], c.p.offsets, (const int32_t *)s.dev[3], nullptr, c.p.tstart, dvar, n};
    int threads = c.p.threads;
    if (small) {
        mt_gpu_record_launch(threads, 1);
        *mapped = mt_status{0, 0, 0, 0, 0.0f, 0.0f};
        mt_k_adam_small<<<1, threads, 0, MT_STREAM>>>(a, mapped);
        c.st = mapped;
    } else {
        mt_k_adam<<<mt_elem_blocks(c.p), threads, 0, MT_STREAM>>>(a, c.st);
    }
    if ((rc = finish(&s, offsets, clip, norm_out, "adam update"))) return rc;
    mt_adam_advance(steps, n);
    return MT_OK;
}

int sgd_groups(float *const *params, float *const *grads, float *const *momentum_buffer, int32_t *buf_initialized,
               float *norm_out, const int32_t *offsets, const mt_sgd_group *groups, const int32_t *tensor_group,
               int32_t clip, float max_norm, int32_t n_groups, int32_t n) {
    int rc;
    if ((rc = mt_check_sgd_groups(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups,
                                  tensor_group, clip, max_norm, n_groups, n)) ||
        (rc = mt_gpu_ready()))
        return rc;
    mt_group_step s;
    mt_step_ctx &c = s.c;
    std::vector<mt_sgd_scalars> var(n_groups);
    mt_fp_env env;
    mt_fp_begin(&env);
    mt_sgd_plan(var.data(), groups, n_groups);
    mt_fp_end(&env);
    void *dvar = nullptr;
    if ((rc = stage_grads(&c, grads, offsets, n))) return rc;
    if ((rc = run_checks(&c, offsets, n, clip, max_norm, false))) return drained(rc);
    if ((rc = stage_params(&c, params, offsets, n)) ||
        (rc = stage_state(&s.m, &c.arena, momentum_buffer, offsets, n,
                          tensors_that(uses_buf, groups, tensor_group, offsets, n))) ||
        (rc = upload_tables(&s, {&s.m}, {tensor_group, buf_initialized}, n)) ||
        (rc = c.arena.stage(&dvar, var.data(), (int64_t)n_groups * (int64_t)sizeof(mt_sgd_scalars))) ||
        (rc = c.arena.flush()))
        return drained(rc);
    mt_step_tabs a = {c.p.table, c.g.table, (float *const *)s.dev[0], nullptr, nullptr, c.p.offsets,
                      (const int32_t *)s.dev[1], (const int32_t *)s.dev[2], c.p.tstart, dvar, n};
    mt_k_sgd<<<mt_elem_blocks(c.p), c.p.threads, 0, MT_STREAM>>>(a, c.st);
    if ((rc = finish(&s, offsets, clip, norm_out, "sgd update"))) return rc;
    mt_sgd_mark(buf_initialized, groups, tensor_group, n);
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
    } else if (mt_status *pin = mt_mapped_status()) {   /* free in this call: a copy into pinned memory is a */
        MT_GPU_CHECK(gpuMemcpyAsync(pin, c->st, sizeof st, gpuMemcpyDefault, MT_STREAM), "status download");
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "step");   /* plain DMA, no pageable staging */
        st = *pin;
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

int mt_adam_step_groups(float *const *params, float *const *grads, float *const *exp_avg, float *const *exp_avg_sq,
                        float *const *max_exp_avg_sq, int64_t *steps, float *norm_out, const int32_t *offsets,
                        const mt_adam_group *groups, const int32_t *tensor_group, int32_t clip, float max_norm,
                        int32_t n_groups, int32_t n_tensors) {
    return adam_groups(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, norm_out, offsets, groups,
                       tensor_group, clip, max_norm, n_groups, n_tensors);
}

int mt_sgd_step_groups(float *const *params, float *const *grads, float *const *momentum_buffer,
                       int32_t *buf_initialized, float *norm_out, const int32_t *offsets, const mt_sgd_group *groups,
                       const int32_t *tensor_group, int32_t clip, float max_norm, int32_t n_groups,
                       int32_t n_tensors) {
    return sgd_groups(params, grads, momentum_buffer, buf_initialized, norm_out, offsets, groups, tensor_group, clip,
                      max_norm, n_groups, n_tensors);
}

int mt_fill_zero(float *const *tensors, const int32_t *offsets, int32_t n_tensors) {
    int rc;
    if ((rc = mt_check_group_registry(tensors, offsets, n_tensors, "tensors")) || (rc = mt_gpu_ready())) return rc;
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
