/* mt_gpu_elementwise.cu -- SiLU, GELU, the residual add and ReLU on a GPU (contract:
 * native/contracts/elementwise.md), and the call shape every one-pass map shares
 * (mt_gpu_map; dropout uses it too; ReLU, at the end, keeps its own).
 *
 * A call: argument checks on the host (aliasing included: an output is an input itself or
 * disjoint from it); staging (host inputs uploaded, device buffers used in place, a host
 * output gets a device twin); the finiteness pre-pass (one read of each input), which sets a
 * refusal word per input; the map kernel, which writes nothing when a word is set; one
 * synchronizing read of the words; then the refusal (nothing written anywhere) or the
 * download of a staged output. When the output is no input and no caller data -- a host
 * output's device twin, or a device output declared fresh (MT_MAP_OUT_FRESH) -- there is no
 * pre-pass: the map kernel checks what it reads and raises the words itself (fused), and a
 * refusal leaves the twin undownloaded (the fresh output undefined). Kernels read float4 where every pointer is 16-byte aligned;
 * the arithmetic is mt_pinned.h's, one element at a time.
 */
#include "mt_gpu_map.h"
#include "mt_gpu_rows.cuh"

uint64_t mt_elementwise_features(void) { return MT_FEATURE_ELEMENTWISE; }

/* ---- the refusal words and the pre-pass ---- */
int mt_gpu_flag_init(mt_gpu_flag *f, mt_arena *arena, mt_status *slot) {
    int rc = arena->alloc((void **)&f->dev, 8);
    if (rc) return rc;
    f->mapped = slot ? slot : mt_mapped_status();
    if (f->mapped) f->mapped->bad_params = f->mapped->bad_grads = 0;   /* pinned host memory */
    /* A fused kernel only stores 1 into the device words, and the host reads the mapped ones:
     * only a checked call (its kernel reads them) or one without mapped words clears them. */
    if (!f->fused || !f->mapped) MT_GPU_CHECK(gpuMemsetAsync(f->dev, 0, 8, MT_STREAM), "refusal words reset");
    return MT_OK;
}

int mt_gpu_flag_read(const mt_gpu_flag *f, int bad[2]) {
    int32_t v[2] = {0, 0};
    if (!f->mapped) MT_GPU_CHECK(gpuMemcpyAsync(v, f->dev, 8, gpuMemcpyDefault, MT_STREAM), "refusal words");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "map");
    if (f->mapped) v[0] = f->mapped->bad_params, v[1] = f->mapped->bad_grads;
    mt_gpu_count_d2h(8);
    bad[0] = v[0] != 0;
    bad[1] = v[1] != 0;
    return MT_OK;
}

static __device__ __forceinline__ bool any_bad4(float4 q) {
    return !(mt_is_finite(q.x) & mt_is_finite(q.y) & mt_is_finite(q.z) & mt_is_finite(q.w));
}

/* bad[0] = 1 when a[0..n) holds a NaN or inf, bad[1] when b does (b NULL: not read). VEC:
 * float4 groups (both pointers 16-byte aligned), then the tail one by one. */
template <int VEC>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_nonfinite2(const float *a, const float *b, int64_t n,
                                                              int32_t *bad) {
    bool fa = false, fb = false;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t groups = VEC ? n / 4 : 0;
    for (int64_t g = start; g < groups; g += stride) {
        fa |= any_bad4(((const float4 *)a)[g]);
        if (b) fb |= any_bad4(((const float4 *)b)[g]);
    }
    for (int64_t i = 4 * groups + start; i < n; i += stride) {
        fa |= !mt_is_finite(a[i]);
        if (b) fb |= !mt_is_finite(b[i]);
    }
    if (fa) bad[0] = 1;
    if (fb) bad[1] = 1;
}

/* ---- the call shape ---- */
namespace {

int prepass(const float *da, const float *db, int64_t n, const mt_gpu_flag &flag) {
    int threads = mt_gpu_threads();
    bool vec = mt_gpu_aligned16(da) && (!db || mt_gpu_aligned16(db));
    int blocks = mt_gpu_blocks(vec ? (n + 3) / 4 : n, threads);
    if (vec) mt_k_nonfinite2<1><<<blocks, threads, 0, MT_STREAM>>>(da, db, n, flag.dev);
    else mt_k_nonfinite2<0><<<blocks, threads, 0, MT_STREAM>>>(da, db, n, flag.dev);
    MT_GPU_CHECK(gpuGetLastError(), "finiteness pre-pass");
    return MT_OK;
}

}  // namespace

int mt_gpu_map(float *out, const float *a, const float *b, int64_t n, uint32_t flags, const char *const names[4],
               mt_map_launch launch, void *ctx) {
    int rc = mt_check_map_flags(flags);
    if (rc || n == 0) return rc;
    if ((rc = mt_gpu_ready_deferring())) return rc;
    mt_arena arena;
    const float *da = nullptr, *db = nullptr;
    float *dout = nullptr;
    bool sa = false, sb = false, sout = false;
    if ((rc = mt_buf_to_device((void **)&da, &sa, &arena, (void *)a, n * 4, true))) return rc;
    if (b && b != a && (rc = mt_buf_to_device((void **)&db, &sb, &arena, (void *)b, n * 4, true))) return rc;
    if (b == a) db = da;
    bool in_place = out == a || (b && out == b);
    if (in_place) dout = (float *)(out == a ? da : db), sout = out == a ? sa : sb;
    else if ((rc = mt_buf_to_device((void **)&dout, &sout, &arena, out, n * 4, false))) return rc;
    /* Deferred (mt_gpu_deferred.h) when the thread defers and nothing is staged: no
     * synchronization, the refusal words go to a slot, and the kernels read the poison word. */
    bool defer = mt_deferred_on() && !sa && !sb && !sout;
    if (!defer && (rc = mt_deferred_flush())) return rc;
    mt_gpu_flag flag;
    flag.fused = !in_place && (sout || (flags & MT_MAP_OUT_FRESH));
    mt_deferred_slot *slot = nullptr;
    if (defer && (rc = mt_deferred_take(&slot, &flag.poison, MT_DEFER_MAP, names[3], names[1], names[2], 0))) return rc;
    int bad[2] = {0, 0};
    if ((rc = mt_gpu_flag_init(&flag, &arena, slot ? &slot->st : nullptr)) ||
        (!flag.fused && (rc = prepass(da, b && b != a ? db : nullptr, n, flag))) ||
        (rc = launch(ctx, dout, da, db, n, flag)))
        return rc;
    MT_GPU_CHECK(gpuGetLastError(), names[0]);
    if (defer) return MT_OK;
    if ((rc = mt_gpu_flag_read(&flag, bad))) return rc;
    if (bad[0] || bad[1])   /* a staged twin is never downloaded: the caller's host output is untouched */
        return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; refused %s", bad[0] ? names[1] : names[2],
                       flag.fused && !sout ? MT_REFUSED_DIRTY : MT_REFUSED_CLEAN);
    if (sout) {
        if ((rc = mt_buf_to_host(out, dout, n * 4))) return rc;
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    }
    return MT_OK;
}

/* ---- SiLU, GELU and add ---- */
namespace {

enum { OP_SILU, OP_SILU_GRAD, OP_ADD, OP_GELU, OP_GELU_GRAD, OP_GELU_TANH, OP_GELU_TANH_GRAD };

/* The maps of one input (x); the others read two (dy and x, or a and b). */
__host__ __device__ constexpr bool unary(int op) { return op == OP_SILU || op == OP_GELU || op == OP_GELU_TANH; }

template <int OP>
__device__ __forceinline__ float elt(float a, float b) {
    switch (OP) {
    case OP_SILU: return mt_silu(a);
    case OP_SILU_GRAD: return mt_silu_grad(a, b);
    case OP_GELU: return mt_gelu_erf(a);
    case OP_GELU_GRAD: return mt_gelu_erf_grad(a, b);
    case OP_GELU_TANH: return mt_gelu_tanh(a);
    case OP_GELU_TANH_GRAD: return mt_gelu_tanh_grad(a, b);
    default: return mt_add_elem(a, b);
    }
}

/* SiLU and its gradient (the maps whose exp is of -x, x being a or b) when a float4 group's
 * four arguments all lie in mt_expf_mid's range: mt_expf_mid itself (mt_expf_ranged's choice
 * there, so the same bits). One test a group instead of a branch an element (ncu at 23a8bb1:
 * six of SiLU's 55 instructions an element were its two branch regions). */
__host__ __device__ constexpr bool exp_map(int op) { return op == OP_SILU || op == OP_SILU_GRAD; }

template <int OP>
__device__ __forceinline__ float elt_mid(float a, float b) {
    return OP == OP_SILU ? mt_silu_of(a, mt_expf_mid(-a)) : mt_silu_grad_of(a, b, mt_expf_mid(-b));
}

/* SiLU's quotients without div.rn's range check (mt_math_div_by, mt_pinned_math.h). Where a
 * float4 group's four x all lie in [2^-64, 64] in magnitude (silu_fast: false for NaN and inf,
 * so the group is finite, and -x lies in mt_expf_mid's range), d = 1 + e^-x lies in [1, 2^93]
 * and every operand and result is normal, so the refined sequence alone is taken: the same bits
 * as the IEEE quotient, checked for every float x of that range on the GPU
 * (bench/silu_division_sweep.py: the fast groups against the per-element path of an unaligned
 * call, forward and backward, in each exact mode). About five of SiLU's ~52 instructions an
 * element go (FCHK, the branch and its reconvergence), and the group's finiteness check of x
 * (known finite). HIP, the sabotaged build and the fast mode (whose division is approximate:
 * --use_fast_math) keep their operators. */
#define MT_SILU_FAST (MT_MATH_UNGUARDED && !MT_SAB_ELEMENTWISE)
#define MT_SILU_FAST_LO 5.42101086242752217003726400434970855712890625e-20f  /* 2^-64 */
#define MT_SILU_FAST_HI 64.0f

__device__ __forceinline__ bool silu_fast(float x) {
    float a = fabsf(x);
    return a >= MT_SILU_FAST_LO && a <= MT_SILU_FAST_HI;
}

/* x / d for d in [1, 2^93] and x normal (or 1), |x| <= 64: mt_math_div_by's range. */
__device__ __forceinline__ float div_unguarded(float x, float d) { return mt_math_div_by(x, d, mt_math_divisor(d)); }

template <int OP>
__device__ __forceinline__ float elt_fast(float a, float b) {
    if (OP == OP_SILU) return div_unguarded(a, 1.0f + mt_expf_mid(-a));
    float e = mt_expf_mid(-b);
    return mt_silu_grad_of_s(a, b, e, div_unguarded(1.0f, 1.0f + e));
}

/* A float4 group of the map, with (FUSED) the finiteness check of what it reads. */
template <int OP, bool FUSED>
__device__ __forceinline__ float4 elt4(float4 qa, float4 qb, bool &bad_a, bool &bad_b) {
    if (exp_map(OP)) {
        const float4 x = OP == OP_SILU ? qa : qb;
        if (MT_SILU_FAST && silu_fast(x.x) & silu_fast(x.y) & silu_fast(x.z) & silu_fast(x.w)) {
            if (FUSED && OP == OP_SILU_GRAD) bad_a |= any_bad4(qa);   /* dy; x is finite here */
            return make_float4(elt_fast<OP>(qa.x, qb.x), elt_fast<OP>(qa.y, qb.y), elt_fast<OP>(qa.z, qb.z),
                               elt_fast<OP>(qa.w, qb.w));
        }
    }
    if (FUSED) {
        bad_a |= any_bad4(qa);
        if (!unary(OP)) bad_b |= any_bad4(qb);
    }
    if (exp_map(OP)) {
        const float4 x = OP == OP_SILU ? qa : qb;
        if (mt_expf_in_mid(-x.x) & mt_expf_in_mid(-x.y) & mt_expf_in_mid(-x.z) & mt_expf_in_mid(-x.w))
            return make_float4(elt_mid<OP>(qa.x, qb.x), elt_mid<OP>(qa.y, qb.y), elt_mid<OP>(qa.z, qb.z),
                               elt_mid<OP>(qa.w, qb.w));
    }
    return make_float4(elt<OP>(qa.x, qb.x), elt<OP>(qa.y, qb.y), elt<OP>(qa.z, qb.z), elt<OP>(qa.w, qb.w));
}

/* The elements [i, n) a grid stride apart, one by one (the tail past the float4 groups). */
template <int OP, bool FUSED>
__device__ __forceinline__ void elt_tail(float *out, const float *a, const float *b, int64_t i, int64_t n,
                                         int64_t stride, bool &bad_a, bool &bad_b) {
    for (; i < n; i += stride) {
        float x = a[i], y = unary(OP) ? x : b[i];
        if (FUSED) {
            bad_a |= !mt_is_finite(x);
            if (!unary(OP)) bad_b |= !mt_is_finite(y);
        }
        out[i] = elt<OP>(x, y);
    }
}

/* float4 groups first (VEC: every pointer 16-byte aligned), then the tail one by one. A
 * thread of the capped grid (not LEAN) loads MT_MAP_UNROLL groups (a grid stride apart, so a
 * warp's loads stay coalesced) before it computes and stores any: the compiler cannot move a
 * load above a store to `out` (it may alias an input), so one group per trip would leave one
 * load in flight per thread, too few to cover the memory latency at this kernel's register
 * count (LEAN: a thread a group, and many more threads). Each element is still read before the same thread
 * writes it, so an in-place call (out == a) reads what it was given. The empty asm statement
 * after the loads stops the compiler from sinking each load to its first use. */
/* FUSED: no pre-pass ran; the kernel checks what it reads (mt_map_report). LEAN: no unrolled
 * loop, for the memory-bound maps (add, and SiLU with its gradient since their fast groups),
 * launched with a thread per group (lean_map): a kernel of few registers then keeps most of
 * 2,048 threads an SM with their loads in flight, which bench/elementwise_variants.cu measured at
 * 4.35 TB/s against the capped, unrolled walk's 4.05. (GELU stays on that walk: issue-bound, as
 * SiLU was when a thread per group of the unrolled kernel, 47-64 registers, made it 36% slower:
 * the NOTES' twentieth session.) */
#ifndef MT_MAP_UNROLL
#define MT_MAP_UNROLL 4
#endif
template <int OP, int VEC, bool FUSED, bool LEAN>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_elt(float *out, const float *a, const float *b, int64_t n,
                                                       mt_gpu_flag flag) {
    if (!FUSED && mt_map_refused(flag)) return;
    bool bad_a = false, bad_b = false;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t groups = VEC ? n / 4 : 0;
    int64_t g = start;
    for (; !LEAN && g + (MT_MAP_UNROLL - 1) * stride < groups; g += MT_MAP_UNROLL * stride) {
        float4 qa[MT_MAP_UNROLL], qb[MT_MAP_UNROLL];
#pragma unroll
        for (int u = 0; u < MT_MAP_UNROLL; u++) {
            qa[u] = ((const float4 *)a)[g + u * stride];
            qb[u] = unary(OP) ? qa[u] : ((const float4 *)b)[g + u * stride];
        }
        asm volatile("" ::: "memory");   /* keeps the loads ahead of the arithmetic (nvcc sinks them) */
#pragma unroll
        for (int u = 0; u < MT_MAP_UNROLL; u++)
            ((float4 *)out)[g + u * stride] = elt4<OP, FUSED>(qa[u], qb[u], bad_a, bad_b);
    }
    for (; g < groups; g += stride) {
        float4 qa = ((const float4 *)a)[g];
        float4 qb = unary(OP) ? qa : ((const float4 *)b)[g];
        ((float4 *)out)[g] = elt4<OP, FUSED>(qa, qb, bad_a, bad_b);
    }
    elt_tail<OP, FUSED>(out, a, b, 4 * groups + start, n, stride, bad_a, bad_b);
    if (FUSED) mt_map_report(flag, bad_a, bad_b);
}

/* The ring walk (GELU 'none' and its gradient: ring_map below; MOJO_TRAIN_MAP_RING puts every
 * map of launch_elt on it, or none; the same bits every way). A grid over the data once, each
 * block a contiguous span of tiles (a tile: a float4 group a thread), and each thread keeps its
 * next MT_MAP_RING_DEPTH groups in flight in a ring of registers while it computes on the
 * current one: the load of group i + D is issued before group i's arithmetic and store. The
 * lean launch has a load in flight only while a thread waits for it, and pays its per-thread
 * set-up for every group, where here it is paid once a span. A whole span steps its pointers;
 * a part span's offsets are 32-bit. Each element is read before the same thread writes it, so
 * an in-place call reads what it was given. On an H100 (forty-first and forty-second
 * sessions): SiLU's kernel issues 171 warp instructions a float4 group here (192 before whole
 * spans were unrolled) against the lean kernel's 209 and runs level with it (both at ~89% of
 * DRAM's bandwidth), GELU 'none' 3-9% faster than its unrolled walk; a depth of 4 ran GELU
 * 7-15% slower (74-85 registers); earlier forms -- cp.async copies into shared memory, in a
 * resident grid or in spans -- were 3-15% slower or level, with three placeholder
 * instructions a cp.async. */
#ifndef MT_MAP_RING_DEPTH
/* groups in flight a thread (ptxas, identical: SiLU and GELU 40 registers, the gradients 52-61) */
#define MT_MAP_RING_DEPTH 2
#endif
#ifndef MT_MAP_RING_SPAN
#define MT_MAP_RING_SPAN 8   /* tiles a block */
#endif
template <int OP, bool FUSED>
__global__ void __launch_bounds__(MT_MAX_THREADS) mt_k_elt_ring(float *out, const float *a, const float *b, int64_t n,
                                                             mt_gpu_flag flag, int span) {
    if (!FUSED && mt_map_refused(flag)) return;
    constexpr int D = MT_MAP_RING_DEPTH;
    const int bd = blockDim.x;
    bool bad_a = false, bad_b = false;
    const int64_t groups = n / 4, mine = (int64_t)blockIdx.x * span * bd + threadIdx.x;
    /* my groups: mine + i * bd for i < trips (a span's tiles, fewer in the last block) */
    const int64_t left = groups - mine;
    const int trips = left <= 0 ? 0 : left >= (int64_t)span * bd ? span : (int)((left + bd - 1) / bd);
    const int64_t first = trips ? mine : 0;   /* no pointer past the end for a thread with no groups */
    const float4 *pa = (const float4 *)a + first, *pb = (const float4 *)b + first;
    float4 *po = (float4 *)out + first;
    if (trips == MT_MAP_RING_SPAN) {
        /* a thread with a whole span of groups (at 2^28 floats, every thread but the last
         * block's): each index known when compiled, so no bound test, no ring copy, and pointers
         * stepped a block's threads at a time inside the span */
        constexpr int S = MT_MAP_RING_SPAN;
        float4 qa[S], qb[S];
        const float4 *la = pa, *lb = pb;
#pragma unroll
        for (int i = -D; i < S; i++) {
            if (i + D < S) {
                qa[i + D] = *la;
                if (!unary(OP)) qb[i + D] = *lb;
                if (i + D + 1 < S) la += bd, lb += bd;
            }
            if (i < 0) continue;
            asm volatile("" ::: "memory");   /* the next load stays ahead of this group's work */
            *po = elt4<OP, FUSED>(qa[i], unary(OP) ? qa[i] : qb[i], bad_a, bad_b);
            if (i + 1 < S) po += bd;
        }
    } else {
        /* any other count of groups (a short last block, spans under 8 tiles in a small grid,
         * longer ones under a test's launch cap): the ring's D registers reloaded as they are
         * freed, each index tested against the thread's count */
        float4 ra[D], rb[D];
#pragma unroll
        for (int k = 0; k < D; k++)
            if (k < trips) {
                ra[k] = pa[k * bd];
                if (!unary(OP)) rb[k] = pb[k * bd];
            }
        for (int t = 0; t < trips; t += D) {
#pragma unroll
            for (int k = 0; k < D; k++) {
                const int i = t + k;
                if (i >= trips) break;
                const float4 qa = ra[k], qb = unary(OP) ? qa : rb[k];
                if (i + D < trips) {
                    ra[k] = pa[(i + D) * bd];
                    if (!unary(OP)) rb[k] = pb[(i + D) * bd];
                }
                asm volatile("" ::: "memory");   /* the next load stays ahead of this group's work */
                po[i * bd] = elt4<OP, FUSED>(qa, qb, bad_a, bad_b);
            }
        }
    }
    const int64_t stride = (int64_t)gridDim.x * blockDim.x, start = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    elt_tail<OP, FUSED>(out, a, b, 4 * groups + start, n, stride, bad_a, bad_b);
    if (FUSED) mt_map_report(flag, bad_a, bad_b);
}

/* The ring's launch: a grid of spans of MT_MAP_RING_SPAN tiles (a test's launch cap makes the
 * spans longer, never leaves a group out); false when a span's offsets would not fit 32 bits
 * (then the caller launches the lean or unrolled kernel). */
template <int OP, bool FUSED>
bool launch_ring(float *out, const float *a, const float *b, int64_t n, mt_gpu_flag flag) {
    const int threads = mt_gpu_threads();
    const int64_t tiles = (n / 4 + threads - 1) / threads;
    const int blocks = mt_gpu_blocks_each(tiles, MT_MAP_RING_SPAN);
    const int64_t span = (tiles + blocks - 1) / blocks;
    if ((span + MT_MAP_RING_DEPTH) * threads > INT32_MAX) return false;
    mt_gpu_record_launch(threads, blocks);
    mt_k_elt_ring<OP, FUSED><<<blocks, threads, 0, MT_STREAM>>>(out, a, b, n, flag, (int)span);
    return true;
}

/* The memory-bound maps take the lean kernel (above). */
/* SiLU and its gradient take the lean launch too since their fast groups (above) made them
 * memory-bound: on an H100 SiLU's kernel went from 90-92% of the copy yardstick on the unrolled
 * walk (50 and 64 registers) to 94-95% on the lean one (34 and 32), 0.81 -> 0.77 ms at 2^28
 * (bench/results/NOTES.md, twenty-eighth session). 0 keeps them on the unrolled walk. */
#ifndef MT_MAP_LEAN_SILU
#define MT_MAP_LEAN_SILU 1
#endif
/* add likewise (0: the unrolled walk; an A/B switch for the card that wants more bytes in
 * flight a thread, as the H200 may: NOTES, thirty-fourth session). */
#ifndef MT_MAP_LEAN_ADD
#define MT_MAP_LEAN_ADD 1
#endif
__host__ __device__ constexpr bool lean_map(int op) {
    return (MT_MAP_LEAN_ADD && op == OP_ADD) || (MT_MAP_LEAN_SILU && exp_map(op));
}

/* GELU 'none' and its gradient take the ring walk: on an H100 it ran them 3-9% faster than the
 * capped, unrolled walk, where SiLU, its gradient and add were level and GELU 'tanh' 1-7%
 * slower (bench/results/NOTES.md, forty-second and forty-third sessions). 0 keeps them on the
 * unrolled walk. */
#ifndef MT_MAP_RING_GELU
#define MT_MAP_RING_GELU 1
#endif
__host__ __device__ constexpr bool ring_map(int op) {
    return MT_MAP_RING_GELU && (op == OP_GELU || op == OP_GELU_GRAD);
}

/* MOJO_TRAIN_MAP_RING (read once): "1" puts every map on the ring walk, "0" none, unset each
 * map where ring_map puts it (an A/B switch; the same bits every way). */
bool ring_walk(bool by_default) {
    static const int set = [] {
        const char *v = getenv("MOJO_TRAIN_MAP_RING");
        return v ? v[0] == '1' : -1;
    }();
    return set < 0 ? by_default : set == 1;
}

template <int OP>
int launch_elt(void *, float *out, const float *a, const float *b, int64_t n, mt_gpu_flag flag) {
    constexpr bool LEAN = lean_map(OP);
    int threads = mt_gpu_threads();
    bool vec = mt_gpu_aligned16(out) && mt_gpu_aligned16(a) && (unary(OP) || mt_gpu_aligned16(b));
    if (ring_walk(ring_map(OP)) && vec &&
        (flag.fused ? launch_ring<OP, true>(out, a, b, n, flag) : launch_ring<OP, false>(out, a, b, n, flag)))
        return MT_OK;
    int64_t items = vec ? (n + 3) / 4 : n;
    int blocks = LEAN ? mt_gpu_blocks_each(items, threads) : mt_gpu_blocks(items, threads);
    mt_gpu_record_launch(threads, blocks);
    if (flag.fused) {
        if (vec) mt_k_elt<OP, 1, true, LEAN><<<blocks, threads, 0, MT_STREAM>>>(out, a, b, n, flag);
        else mt_k_elt<OP, 0, true, LEAN><<<blocks, threads, 0, MT_STREAM>>>(out, a, b, n, flag);
    } else {
        if (vec) mt_k_elt<OP, 1, false, LEAN><<<blocks, threads, 0, MT_STREAM>>>(out, a, b, n, flag);
        else mt_k_elt<OP, 0, false, LEAN><<<blocks, threads, 0, MT_STREAM>>>(out, a, b, n, flag);
    }
    return MT_OK;
}

int run(float *out, const float *a, const float *b, int64_t n, uint32_t flags, const char *const names[4],
        mt_map_launch launch) {
    int rc;
    if ((rc = mt_check_ptr(out, names[0])) || (rc = mt_check_ptr(a, names[1])) || (rc = mt_check_ptr(b, names[2])))
        return rc;
    if (n < 0) return mt_fail(MT_EINVAL, "n must be >= 0, got %lld", (long long)n);
    if ((rc = mt_check_alias(out, a, n, 1, names[0], names[1])) ||
        (b != a && (rc = mt_check_alias(out, b, n, 1, names[0], names[2]))))
        return rc;
    return mt_gpu_map(out, a, b, n, flags, names, launch, nullptr);
}

}  // namespace

extern "C" {

int mt_silu_forward(float *y, const float *x, int64_t n, uint32_t flags) {
    static const char *const names[4] = {"y", "x", "x", "mt_silu_forward"};
    return run(y, x, x, n, flags, names, launch_elt<OP_SILU>);
}

int mt_silu_backward(float *dx, const float *dy, const float *x, int64_t n, uint32_t flags) {
    static const char *const names[4] = {"dx", "dy", "x", "mt_silu_backward"};
    return run(dx, dy, x, n, flags, names, launch_elt<OP_SILU_GRAD>);
}

int mt_add(float *out, const float *a, const float *b, int64_t n, uint32_t flags) {
    static const char *const names[4] = {"out", "a", "b", "mt_add"};
    return run(out, a, b, n, flags, names, launch_elt<OP_ADD>);
}

int mt_gelu_forward(float *y, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    static const char *const names[4] = {"y", "x", "x", "mt_gelu_forward"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return run(y, x, x, n, flags, names, approximate == MT_GELU_TANH ? launch_elt<OP_GELU_TANH> : launch_elt<OP_GELU>);
}

int mt_gelu_backward(float *dx, const float *dy, const float *x, int64_t n, int32_t approximate, uint32_t flags) {
    static const char *const names[4] = {"dx", "dy", "x", "mt_gelu_backward"};
    const char *bad = mt_gelu_approximate_problem(approximate);
    if (bad) return mt_fail(MT_EINVAL, "%s, got %d", bad, (int)approximate);
    return run(dx, dy, x, n, flags, names,
               approximate == MT_GELU_TANH ? launch_elt<OP_GELU_TANH_GRAD> : launch_elt<OP_GELU_GRAD>);
}

}  /* extern "C" */

/* ---- ReLU: one element kernel (mt_relu, mt_relu_grad) ---- */
/* Unlike the maps above, finiteness rides along (no pre-pass): the kernel raises per-input
 * flags in the mapped status of mt_gpu_rows.cuh and the host refuses after the
 * synchronization, so y and dx are undefined after a refusal (mojo_train.h); a host output's
 * twin is downloaded only on success. Checks and refusal order follow the oracle. */
namespace {

enum { BAD_X = 0, BAD_DY = 1 };

template <bool VEC>
__global__ void k_relu(float *out, const float *dy, const float *x, int64_t n, int32_t *bad) {
    bool bx = false, bdy = false;
    int64_t step = (int64_t)gridDim.x * blockDim.x, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (VEC) {
        for (; 4 * i + 3 < n; i += step) {
            float4 q = ((const float4 *)x)[i], o;
            bx |= any_bad4(q);
            if (dy) {
                float4 g = ((const float4 *)dy)[i];
                bdy |= any_bad4(g);
                o = make_float4(mt_relu_grad(g.x, q.x), mt_relu_grad(g.y, q.y), mt_relu_grad(g.z, q.z), mt_relu_grad(g.w, q.w));
            } else {
                o = make_float4(mt_relu(q.x), mt_relu(q.y), mt_relu(q.z), mt_relu(q.w));
            }
            ((float4 *)out)[i] = o;
        }
        i = 4 * (n / 4) + (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    }
    for (; i < n; i += step) {
        float q = x[i];
        bx |= !mt_is_finite(q);
        if (dy) {
            bdy |= !mt_is_finite(dy[i]);
            out[i] = mt_relu_grad(dy[i], q);
        } else {
            out[i] = mt_relu(q);
        }
    }
    if (bx) bad[BAD_X] = 1;
    if (bdy) bad[BAD_DY] = 1;
}

int relu(float *out, const float *dy, const float *x, int64_t n) {
    int rc;
    if ((rc = mt_check_count(n, "n")) || (rc = mt_check_tensor(out, n, dy ? "dx" : "y")) ||
        (rc = mt_check_tensor(x, n, "x")))
        return rc;
    if (n == 0) return MT_OK;
    if ((rc = mt_gpu_ready())) return rc;
    mt_rows_status *st = mt_rows_mapped();
    if (!st) return MT_ENOMEM;
    *st = mt_rows_status{0, 0, 0, 0.0f, {0, 0, 0}};
    mt_arena arena;
    float *d_out = nullptr, *d_x = nullptr, *d_dy = nullptr;
    bool so = false, sx = false, sdy = false;
    if ((rc = mt_buf_to_device((void **)&d_x, &sx, &arena, (void *)x, n * 4, true)) ||
        (dy && (rc = mt_buf_to_device((void **)&d_dy, &sdy, &arena, (void *)dy, n * 4, true))) ||
        (rc = mt_buf_to_device((void **)&d_out, &so, &arena, out, n * 4, false)))
        return rc;
    int threads = mt_gpu_threads(), blocks = mt_gpu_blocks(n, (int64_t)threads * 16);
    mt_gpu_record_launch(threads, blocks);
    if (mt_gpu_aligned16(d_out) && mt_gpu_aligned16(d_x) && mt_gpu_aligned16(d_dy))
        k_relu<true><<<blocks, threads, 0, MT_STREAM>>>(d_out, d_dy, d_x, n, st->bad);
    else
        k_relu<false><<<blocks, threads, 0, MT_STREAM>>>(d_out, d_dy, d_x, n, st->bad);
    if ((rc = mt_rows_launched("relu"))) return rc;
    static const int order[2] = {BAD_DY, BAD_X};
    static const char *const names[3] = {"x", "dy", "unused"};
    return mt_rows_finish(st, order, 2, names, so ? out : nullptr, d_out, n * 4, nullptr, nullptr, 0);
}

}  // namespace

extern "C" {

int mt_relu_forward(float *y, const float *x, int64_t n) { return relu(y, nullptr, x, n); }

int mt_relu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    if (n > 0 && !dy) return mt_fail(MT_EINVAL, "dy is NULL");
    return relu(dx, dy, x, n);
}

}  /* extern "C" */
