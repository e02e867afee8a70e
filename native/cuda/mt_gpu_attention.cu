/* mt_gpu_attention.cu -- attention on a GPU (contract: native/contracts/attention.md): the host
 * half. The ABI's two entries (native/common/mt_attention_args.c, one copy for every vendor)
 * check the arguments and call mt_attention_run here, which puts every tensor on the device
 * (host buffers staged), enqueues the finiteness checks of the inputs and the kernels of
 * mt_gpu_attention_kernels.cuh, synchronizes once, and then refuses a non-finite input by name
 * in the oracle's order (outputs are undefined after such a refusal, as for every GPU op) or
 * downloads the staged outputs.
 */
#include <mutex>
#include "mt_gpu_attention_kernels.cuh"
#include "mt_gpu_rows.cuh"
#include "mt_host.h"

/* HIP compiles these kernels but cannot launch them: their tiles need more shared memory than
 * the 64 KB of an AMD workgroup (attention.md); the library declares no attention there. */
#if defined(MT_HIP) || defined(__HIPCC__)
#define MT_ATTN_RUNS 0
uint64_t mt_attention_features(void) { return 0; }
#else
#define MT_ATTN_RUNS 1
uint64_t mt_attention_features(void) { return MT_FEATURE_ATTENTION; }
#endif

namespace {

/* *flag = 1 when p[0..n) holds NaN or +inf, or -inf unless neg_inf_ok. */
__global__ void k_attn_nonfinite(const float *p, int64_t n, int32_t *flag, int neg_inf_ok) {
    bool bad = false;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float x = p[i];
        bad |= !mt_is_finite(x) && !(neg_inf_ok && mt_f32_bits(x) == 0xff800000u);   /* bits: fast-math keeps it */
    }
    if (bad) *flag = 1;
}

/* *flag = 1 when a float mask element the strides reach is NaN or +inf (each reached once:
 * a dimension of stride 0 counts once). */
__global__ void k_attn_mask_check(mt_attn_args a, int32_t *flag) {
    const int64_t nb = a.sb ? a.B : 1, nh = a.sh ? a.H : 1, ni = a.si ? a.Tq : 1, nj = a.sj ? a.Tk : 1;
    const float *m = (const float *)a.mask;
    bool bad = false;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < nb * nh * ni * nj;
         e += (int64_t)gridDim.x * blockDim.x) {
        int64_t j = e % nj, i = e / nj % ni, h = e / (nj * ni) % nh, b = e / (nj * ni * nh);
        float x = m[b * a.sb + h * a.sh + i * a.si + j * a.sj];
        bad |= !mt_is_finite(x) && mt_f32_bits(x) != 0xff800000u;
    }
    if (bad) *flag = 1;
}

/* The calling thread's refusal flags in mapped pinned memory (the check kernels write them
 * directly; no transfer), or NULL with the error set. */
int32_t *mapped_flags() {
    struct mem {
        int32_t *p = nullptr;
        ~mem() {
            if (p) {
                gpuFreeHost(p);
                mt_mem_count(-MT_ATTN_FLAGS * 4);
            }
        }
    };
    static thread_local mem m;
    if (!m.p) {
        if (gpuMallocHost((void **)&m.p, MT_ATTN_FLAGS * 4) != gpuSuccess) {
            gpuGetLastError();
            m.p = nullptr;
            mt_fail(MT_ENOMEM, "cannot allocate %d bytes of pinned memory for the call's flags", MT_ATTN_FLAGS * 4);
            return nullptr;
        }
        mt_mem_count(MT_ATTN_FLAGS * 4);
    }
    for (int i = 0; i < MT_ATTN_FLAGS; ++i) m.p[i] = 0;
    return m.p;
}

/* The call's tensors on the device: dev.a holds device pointers; s_*: the host outputs staged
 * (to download). */
struct attn_bufs {
    mt_arena arena;
    mt_attn_dev dev{};
    bool s_out = false, s_lse = false, s_dq = false, s_dk = false, s_dv = false;
};

template <class T>
int to_device(T **dst, mt_arena *arena, T *src, int64_t bytes, bool upload, bool *staged) {
    bool st = false;
    if (!src || bytes <= 0) return MT_OK;
    void *p = nullptr;
    int rc = mt_buf_to_device(&p, &st, arena, (void *)src, bytes, upload);
    if (rc) return rc;
    *dst = (T *)p;
    if (staged) *staged = st;
    return MT_OK;
}

int stage(attn_bufs *w, const mt_attn_args *a, int backward) {
    const int64_t qb = mt_attn_q_elems(a) * 4, kvb = mt_attn_kv_elems(a) * 4, rb = mt_attn_rows(a) * 4;
    mt_attn_args &d = w->dev.a;
    d = *a;
    int rc;
    if ((rc = to_device(&d.q, &w->arena, a->q, qb, true, nullptr)) ||
        (rc = to_device(&d.k, &w->arena, a->k, kvb, true, nullptr)) ||
        (rc = to_device(&d.v, &w->arena, a->v, kvb, true, nullptr)) ||
        (rc = to_device(&d.mask, &w->arena, a->mask, mt_attn_mask_bytes(a), true, nullptr)))
        return rc;
    if (!backward) {
        if ((rc = to_device(&d.out, &w->arena, a->out, qb, false, &w->s_out)) ||
            (rc = to_device(&d.lse, &w->arena, a->lse, rb, false, &w->s_lse)))
            return rc;
    } else {
        if ((rc = to_device(&d.dout, &w->arena, a->dout, qb, true, nullptr)) ||
            (rc = to_device(&d.out_in, &w->arena, a->out_in, qb, true, nullptr)) ||
            (rc = to_device(&d.lse_in, &w->arena, a->lse_in, rb, true, nullptr)) ||
            (rc = to_device(&d.dq, &w->arena, a->dq, qb, false, &w->s_dq)) ||
            (rc = to_device(&d.dk, &w->arena, a->dk, kvb, false, &w->s_dk)) ||
            (rc = to_device(&d.dv, &w->arena, a->dv, kvb, false, &w->s_dv)))
            return rc;
        if (rb && (a->dq || a->dk || a->dv) && (rc = w->arena.alloc((void **)&w->dev.delta, rb))) return rc;
        if (a->dq && rb && a->Tk > 0) {     /* the dq relay's words, zero (mt_gpu_attention_kernels.cuh) */
            const int64_t relay_bytes = mt_attn_relay_words(*a) * 4;
            if ((rc = w->arena.alloc((void **)&w->dev.relay, relay_bytes))) return rc;
            MT_GPU_CHECK(gpuMemsetAsync(w->dev.relay, 0, (size_t)relay_bytes, MT_STREAM), "attention relay words");
        }
    }
    return (w->dev.flags = mapped_flags()) ? MT_OK : MT_ENOMEM;
}

/* The finiteness checks of the call's inputs, each raising its flag. */
int enqueue_checks(const attn_bufs &w, int backward) {
    const mt_attn_args &a = w.dev.a;
    const int64_t nq = mt_attn_q_elems(&a), nkv = mt_attn_kv_elems(&a), rows = mt_attn_rows(&a);
    struct { const float *p; int64_t n; int flag, neg_inf_ok; } in[] = {
        {a.q, nq, MT_ATTN_FLAG_Q, 0},
        {a.k, nkv, MT_ATTN_FLAG_K, 0},
        {a.v, nkv, MT_ATTN_FLAG_V, 0},
        {backward ? a.dout : nullptr, nq, MT_ATTN_FLAG_DOUT, 0},
        {backward ? a.out_in : nullptr, nq, MT_ATTN_FLAG_OUT, 0},
        {backward ? a.lse_in : nullptr, rows, MT_ATTN_FLAG_LSE, 1},
    };
    for (const auto &c : in) {
        if (!c.p || c.n <= 0) continue;
        k_attn_nonfinite<<<mt_gpu_blocks(c.n, 256), 256, 0, MT_STREAM>>>(c.p, c.n, w.dev.flags + c.flag, c.neg_inf_ok);
        MT_GPU_CHECK(gpuGetLastError(), "attention input check");
    }
    if (a.mask_kind == MT_ATTENTION_MASK_FLOAT && a.B * a.H * a.Tq * a.Tk > 0) {
        const int64_t n = (a.sb ? a.B : 1) * (a.sh ? a.H : 1) * (a.si ? a.Tq : 1) * (a.sj ? a.Tk : 1);
        k_attn_mask_check<<<mt_gpu_blocks(n, 256), 256, 0, MT_STREAM>>>(a, w.dev.flags + MT_ATTN_FLAG_MASK);
        MT_GPU_CHECK(gpuGetLastError(), "attention mask check");
    }
    return MT_OK;
}

/* Launch one kernel of the plan (its shared memory allowed once per kernel). */
struct gpu_launch {
    int operator()(void (*kernel)(mt_attn_dev), unsigned grid, unsigned threads, size_t smem,
                   const mt_attn_dev &d) const {
        if (smem > 48 * 1024) {
            static std::mutex mu;
            static void *allowed[16];       /* 8 kernels ask for more than 48 KB today */
            std::lock_guard<std::mutex> lock(mu);
            bool known = false;
            for (void *k : allowed) known |= k == (void *)kernel;
            if (!known) {
                MT_GPU_CHECK(gpuFuncSetAttribute((const void *)kernel, gpuFuncAttributeMaxDynamicSharedMemorySize,
                                                 (int)smem),
                             "attention shared memory");
                for (void *&k : allowed)
                    if (!k) { k = (void *)kernel; break; }
            }
        }
        kernel<<<grid, threads, smem, MT_STREAM>>>(d);
        MT_GPU_CHECK(gpuGetLastError(), "attention kernel");
        return MT_OK;
    }
};

/* The refusal of the first raised flag in the oracle's order, or MT_OK. */
int refuse(const int32_t *flags, int backward) {
    static const int fwd[] = {MT_ATTN_FLAG_Q, MT_ATTN_FLAG_K, MT_ATTN_FLAG_V, MT_ATTN_FLAG_MASK};
    static const int bwd[] = {MT_ATTN_FLAG_DOUT, MT_ATTN_FLAG_Q, MT_ATTN_FLAG_K, MT_ATTN_FLAG_V,
                              MT_ATTN_FLAG_OUT, MT_ATTN_FLAG_LSE, MT_ATTN_FLAG_MASK};
    static const char *const names[] = {"q", "k", "v", "dout", "out"};
    const int *order = backward ? bwd : fwd;
    const int n = backward ? 7 : 4;
    for (int i = 0; i < n; ++i) {
        if (!flags[order[i]]) continue;
        if (order[i] == MT_ATTN_FLAG_MASK) return mt_fail_attention_mask();
        if (order[i] == MT_ATTN_FLAG_LSE) return mt_fail_attention_lse();
        return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", names[order[i]]);
    }
    return MT_OK;
}

int download(const attn_bufs &w, const mt_attn_args *a) {
    const int64_t qb = mt_attn_q_elems(a) * 4, kvb = mt_attn_kv_elems(a) * 4, rb = mt_attn_rows(a) * 4;
    const mt_attn_args &d = w.dev.a;
    int rc;
    if ((w.s_out && (rc = mt_buf_to_host(a->out, d.out, qb))) || (w.s_lse && (rc = mt_buf_to_host(a->lse, d.lse, rb))) ||
        (w.s_dq && (rc = mt_buf_to_host(a->dq, d.dq, qb))) || (w.s_dk && (rc = mt_buf_to_host(a->dk, d.dk, kvb))) ||
        (w.s_dv && (rc = mt_buf_to_host(a->dv, d.dv, kvb))))
        return rc;
    if (w.s_out || w.s_lse || w.s_dq || w.s_dk || w.s_dv) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    return MT_OK;
}

MT_NOINLINE int attention(const mt_attn_args *a, int backward) {
    int rc;
    if ((rc = mt_check_attention_args(a, backward))) return rc;
    if (!MT_ATTN_RUNS)
        return mt_fail(MT_EUNSUPPORTED, "attention does not run on %s: its tiles need more shared memory than a "
                       "workgroup has (no MT_FEATURE_ATTENTION); the cpu oracle has it", MT_VENDOR_NAME);
    if ((rc = mt_gpu_ready())) return rc;
    if (!mt_attn_grid_fits(*a))
        return mt_fail(MT_EINVAL, "B=%lld, H=%lld, Tq=%lld, Tk=%lld need more than 2^31 - 1 blocks",
                       (long long)a->B, (long long)a->H, (long long)a->Tq, (long long)a->Tk);
    const size_t need = mt_attn_smem_need(*a, backward);
    if (need > (size_t)mt_rows_limits().smem_optin)
        return mt_fail(MT_EUNSUPPORTED, "attention with D=%lld needs %lld bytes of shared memory per block; this "
                       "GPU offers %d (the H100 and H200 offer 232448); the cpu oracle has no such limit",
                       (long long)a->D, (long long)need, mt_rows_limits().smem_optin);
    attn_bufs w;
    if ((rc = stage(&w, a, backward))) return rc;
    if ((rc = enqueue_checks(w, backward)) || (rc = mt_attn_enqueue(w.dev, backward, gpu_launch{}))) {
        gpuStreamSynchronize(MT_STREAM);      /* nothing of this call still runs when the next one starts */
        gpuGetLastError();
        return rc;
    }
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "synchronize");
    if ((rc = refuse(w.dev.flags, backward))) return rc;
    return download(w, a);
}

}  // namespace

int mt_attention_run(const mt_attn_args *a, int backward) { MT_RETURN_IN_FP_ENV(attention(a, backward)); }
