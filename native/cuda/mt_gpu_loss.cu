/* mt_gpu_loss.cu -- cross-entropy on a GPU (contract: native/contracts/loss.md); the same bits
 * as the CPU oracle (native/cpu_oracle/mt_cpu_loss.c) in the identical numeric mode.
 *
 * A call is three kernels on the calling thread's stream and one synchronization:
 *  1. k_ce_targets (one block) reads every target once: the smallest refused row and the
 *     count of rows not ignored (block trees of min and sum; no atomics) go to device scratch
 *     with the scalars (g = 1 / count for a counted mean, one division as on the host).
 *  2. k_ce_rows: each block takes rows in turn. A row is staged once into shared memory (or,
 *     when it does not fit, read from global memory each pass), then: pass A, the max, the
 *     min and the largest |x| bit pattern (NaN or inf shows there); the smoothing sum by the
 *     chunk tree; every e_j formed in place of x_j by the whole block (mt_expf_mid when the
 *     row's min - max allows), then their sum by the chunk tree, one warp per 4096-chunk
 *     (mt_warp_chunk_fold); pass C, dlogits from the kept e_j. With 16-byte rows the next
 *     row's copy into shared memory is issued slot by slot during pass C (cp.async; the row's
 *     L2 prefetch was issued at the top of the current row). Thread 0 writes the row's loss and finiteness
 *     flag. Nothing is written when a target was refused.
 *  3. k_ce_finish (one block): the first non-finite row, the token rule over the row losses,
 *     the mean's division; loss_out (a device pointer) is written only when nothing is
 *     refused, and everything is reported through mapped memory.
 * Refusals follow the oracle: arguments first (a dlogits over the logits or targets among
 * them, mt_check_ce_dlogits), then targets (nothing written), then
 * non-finite logits (dlogits and row_loss may have been written: undefined, mojo_train.h).
 * Host buffers are staged through device memory and downloaded only on success.
 *
 * mt_cross_entropy_nd (the full form: a class weight, probability targets, positions) runs the
 * same kernels with a KIND: k_cend_prep replaces k_ce_targets (the weight's finiteness, the
 * targets, a weighted mean's divisor by the token rule, Wm); with positions the logits and
 * probabilities are first transposed to rows of vocab in scratch (k_ce_transpose: values move,
 * no arithmetic) and the gradient transposed back; k_ce_rows folds the row's extra sums (SW;
 * C and CX side by side) beside the max and the softmax sum, and its gradient pass forms
 * fma(p, a, -y) * g; k_ce_finish makes every NaN canonical and refuses probabilities after logits.
 */
#include <map>
#include <math.h>
#include <mutex>
#include <stdlib.h>
#include "mt_gpu_rows.cuh"
#include "mt_loss_args.h"
#if !defined(MT_HIP) && !defined(__HIPCC__)
#define MT_CE_CLUSTERS 1      /* rows shared by a cluster of blocks (k_ce_rows_cluster) */
#include <cooperative_groups.h>
#else
#define MT_CE_CLUSTERS 0
#endif

uint64_t mt_loss_features(void) { return MT_FEATURE_LOSS; }

namespace {

/* Warps of a row block: a warp per ~CE_FLOATS_PER_WARP floats of the row (staging, the
 * e_j and gradient passes share the row evenly; more warps keep more loads in flight and
 * hide the exp's latency), at least one per chunk (the fold), at most the cap. At V = 50304
 * a staged block is 16 warps, where 13 (one per chunk) left 3.25 warps per scheduler on an
 * H200 (ncu: 0.43 instructions issued per cycle); 32 warps (64 registers each) ran the
 * 8192 x 50304 benchmark 0.05-0.08 ms slower than 16. */
#ifndef CE_SMEM_WARPS
#define CE_SMEM_WARPS 16
#endif
#define CE_GLOBAL_WARPS 32
#define CE_FLOATS_PER_WARP 512
#define CE_ONE_BLOCK 1024     /* threads of the two one-block kernels (a power of two) */

/* The mean T / D; with no row counted (D = 0) the canonical NaN of math.md, as the oracle
 * writes it (the bits of a NaN from 0 / 0 differ between vendors). */
__host__ __device__ __forceinline__ float ce_mean(float total, float divisor) {
    return divisor != 0.0f ? total / divisor : mt_bits_f32(MT_MATH_QNAN);
}

/* Device scratch written by k_ce_targets (or k_cend_prep). A refused weight sets first_bad to
 * 0 (every later kernel then stands still) and weight_bad to its class. */
struct ce_dev {
    int64_t first_bad, bad_value, count, weight_bad;
    float divisor, wm;
    mt_ce_scalars sc;
};

/* The kinds of rows (loss.md): class indices (the first sections), the same with a weight,
 * probabilities. */
enum { CE_PLAIN = 0, CE_WEIGHTED = 1, CE_PROBS = 2 };

__device__ __forceinline__ int64_t ce_target(const void *targets, int32_t bytes, int64_t i) {
    return bytes == 4 ? (int64_t)((const int32_t *)targets)[i] : ((const int64_t *)targets)[i];
}

/* Block tree over one int64 per thread (min or sum; exact in any order). s: blockDim int64. */
template <bool MIN>
__device__ __forceinline__ int64_t ce_block_reduce(int64_t v, int64_t *s) {
    s[threadIdx.x] = v;
    __syncthreads();
    for (int h = blockDim.x / 2; h >= 1; h >>= 1) {
        if ((int)threadIdx.x < h) {
            int64_t o = s[threadIdx.x + h];
            s[threadIdx.x] = MIN ? (o < s[threadIdx.x] ? o : s[threadIdx.x]) : s[threadIdx.x] + o;
        }
        __syncthreads();
    }
    v = s[0];
    __syncthreads();
    return v;
}

__global__ void __launch_bounds__(CE_ONE_BLOCK) k_ce_targets(const void *targets, int32_t bytes, int64_t n, int64_t vocab,
                                                            int64_t ignore, mt_ce_scalars sc, float divisor,
                                                            int32_t counted_mean, ce_dev *dev) {
    __shared__ int64_t s[CE_ONE_BLOCK];
    int64_t bad = n, count = 0;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
        int64_t t = ce_target(targets, bytes, r);
        if (t == ignore && ignore != MT_NO_IGNORE_INDEX) continue;
        if (t < 0 || t >= vocab) {
            bad = r;      /* this thread's rows ascend: its first bad one is its smallest */
            break;
        }
        ++count;
    }
    bad = ce_block_reduce<true>(bad, s);
    count = ce_block_reduce<false>(count, s);
    if (threadIdx.x == 0) {
        dev->first_bad = bad;
        dev->bad_value = bad < n ? ce_target(targets, bytes, bad) : 0;
        dev->count = count;
        dev->weight_bad = -1;
        dev->wm = 0.0f;
        if (counted_mean) {            /* D = the count, rounded to nearest; g = 1 / D */
            divisor = (float)count;
            sc.g = 1.0f / divisor;
        }
        dev->divisor = divisor;
        dev->sc = sc;
    }
}

/* e^v by mt_expf, or by mt_expf_mid (the same bits) when the caller knows v is in its range. */
template <bool MID>
__device__ __forceinline__ float ce_exp(float v) { return MID ? mt_expf_mid(v) : mt_expf(v); }

/* Step of the softmax denominator: acc = acc + e, e = mt_expf(x - m) (MT_STEP_SUM_EXP), and
 * e written to `e` (dlogits; NULL: not kept). */
template <bool VEC, bool MID>
struct ce_sum_exp {
    typedef float4 V;
    const float *x;
    float *e;
    float m;
    __device__ __forceinline__ V load(int64_t i) const { return mt_load4<VEC>(x + i); }
    __device__ __forceinline__ void step(float (&a)[1][4], const V &q, int64_t i) const {
        float4 v = make_float4(ce_exp<MID>(q.x - m), ce_exp<MID>(q.y - m), ce_exp<MID>(q.z - m), ce_exp<MID>(q.w - m));
        a[0][0] = a[0][0] + v.x; a[0][1] = a[0][1] + v.y;
        a[0][2] = a[0][2] + v.z; a[0][3] = a[0][3] + v.w;
        if (!e) return;
        if (VEC) *(float4 *)(e + i) = v;
        else { e[i] = v.x; e[i + 1] = v.y; e[i + 2] = v.z; e[i + 3] = v.w; }
    }
    __device__ __forceinline__ void one(float (&a)[1][4], int q, int64_t i) const {
        float v = ce_exp<MID>(x[i] - m);
        a[0][q] = a[0][q] + v;
        if (e) e[i] = v;
    }
};

/* e_j = mt_expf(x_j - m) over a row staged in shared memory, in place. Every term is
 * independent of the others, so the block's threads share the row evenly in float4 groups
 * (the fold that adds them up afterwards keeps the contract's lanes); the padding up to a
 * multiple of 4 is computed on and never read. */
template <bool MID>
__device__ __forceinline__ void ce_exp_row(float *x, int64_t n, float m) {
    float4 *x4 = (float4 *)x;
    const int n4 = (int)((n + 3) / 4);
#pragma unroll 2
    for (int q = threadIdx.x; q < n4; q += blockDim.x) {
        float4 v = x4[q];
        x4[q] = make_float4(ce_exp<MID>(v.x - m), ce_exp<MID>(v.y - m), ce_exp<MID>(v.z - m), ce_exp<MID>(v.w - m));
    }
}

/* Step of label smoothing's sum of the logits, and of the sum of kept e_j: the C fold's
 * MT_STEP_SUM, acc + x. */
struct ce_step_sum {
    static __device__ __forceinline__ float step(float acc, float v) {
        const float *x = &v;
        MT_STEP_SUM(acc, 0);
        return acc;
    }
};
template <bool VEC>
using ce_sum = mt_fold_one<VEC, ce_step_sum>;

/* The full form's sums on one element each: SW's MT_STEP_SUM_WX, and C's and CX's
 * MT_STEP_SUM_COEF and MT_STEP_SUM_COEF_X (c = mt_ce_coef of the probability y and weight w). */
__device__ __forceinline__ float ce_step_wx(float acc, float wv, float xv) {
    const float *x = &xv, *w = &wv;
    MT_STEP_SUM_WX(acc, 0);
    return acc;
}
__device__ __forceinline__ void ce_step_coef(float &acc_c, float &acc_cx, float yv, float wv, float xv, bool has_w,
                                             const mt_ce_scalars *c) {
    const float *x = &xv, *y = &yv, *w = has_w ? &wv : nullptr;
    float a = acc_c, b = acc_cx;
    MT_STEP_SUM_COEF(a, 0);
    MT_STEP_SUM_COEF_X(b, 0);
    acc_c = a;
    acc_cx = b;
}

/* SW: the fold of w_j x_j (a weighted row with smoothing). */
template <bool VEC>
struct ce_sum_wx {
    struct V { float4 x, w; };
    const float *x, *w;
    __device__ __forceinline__ V load(int64_t i) const { return V{mt_load4<VEC>(x + i), mt_load4<VEC>(w + i)}; }
    __device__ __forceinline__ void step(float (&a)[1][4], const V &q, int64_t) const {
        a[0][0] = ce_step_wx(a[0][0], q.w.x, q.x.x); a[0][1] = ce_step_wx(a[0][1], q.w.y, q.x.y);
        a[0][2] = ce_step_wx(a[0][2], q.w.z, q.x.z); a[0][3] = ce_step_wx(a[0][3], q.w.w, q.x.w);
    }
    __device__ __forceinline__ void one(float (&a)[1][4], int q, int64_t i) const { a[0][q] = ce_step_wx(a[0][q], w[i], x[i]); }
};

/* C and CX side by side (K = 2) over a row of probabilities y (w NULL: no weight). */
template <bool VEC>
struct ce_sum_coef {
    struct V { float4 x, y, w; };
    const float *x, *y, *w;
    const mt_ce_scalars *sc;
    __device__ __forceinline__ V load(int64_t i) const {
        return V{mt_load4<VEC>(x + i), mt_load4<VEC>(y + i), w ? mt_load4<VEC>(w + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f)};
    }
    __device__ __forceinline__ void step(float (&a)[2][4], const V &q, int64_t) const {
        const bool hw = w != nullptr;
        ce_step_coef(a[0][0], a[1][0], q.y.x, q.w.x, q.x.x, hw, sc);
        ce_step_coef(a[0][1], a[1][1], q.y.y, q.w.y, q.x.y, hw, sc);
        ce_step_coef(a[0][2], a[1][2], q.y.z, q.w.z, q.x.z, hw, sc);
        ce_step_coef(a[0][3], a[1][3], q.y.w, q.w.w, q.x.w, hw, sc);
    }
    __device__ __forceinline__ void one(float (&a)[2][4], int q, int64_t i) const {
        ce_step_coef(a[0][q], a[1][q], y[i], w ? w[i] : 1.0f, x[i], w != nullptr, sc);
    }
};

/* What a row of the full form reads besides its logits: the weight (NULL: none), the row's
 * probabilities (CE_PROBS), Wm = W / V. */
struct ce_more {
    const float *w, *y;
    float wm;
};

/* e / s, correctly rounded, for 0 <= e <= 1 <= s < 2^24 with y = 1 / s (correctly rounded,
 * once per row): q = e * y is within an ulp of e / s, the remainder e - q s is exact under
 * fmaf, and q + (e - q s) y rounded once is the correctly rounded quotient (Markstein's
 * theorem; checked against IEEE division for all 2^24 significands of e at 96 divisors, no
 * difference). Quotients that may be subnormal take the plain division. mt_ce_grad then
 * gets (q, 1): q / 1 == q exactly, so the gradient's arithmetic stays the pinned one. */
__device__ __forceinline__ bool ce_tiny(float e) { return mt_f32_bits(e) - 1u < 0x0d7fffffu; }   /* 0 < e < 2^-100 */

__device__ __forceinline__ float ce_quotient(float e, float s, float y) {
    if (ce_tiny(e)) return e / s;
    float q = e * y;
    return fmaf(fmaf(-q, s, e), y, q);
}

__device__ __forceinline__ float4 ce_quotient4(float4 e, float s, float y) {
    float4 q = make_float4(e.x * y, e.y * y, e.z * y, e.w * y);
    q = make_float4(fmaf(fmaf(-q.x, s, e.x), y, q.x), fmaf(fmaf(-q.y, s, e.y), y, q.y),
                    fmaf(fmaf(-q.z, s, e.z), y, q.z), fmaf(fmaf(-q.w, s, e.w), y, q.w));
    if (ce_tiny(e.x) | ce_tiny(e.y) | ce_tiny(e.z) | ce_tiny(e.w))
        q = make_float4(ce_quotient(e.x, s, y), ce_quotient(e.y, s, y), ce_quotient(e.z, s, y), ce_quotient(e.w, s, y));
    return q;
}

/* The gradient of four classes of a plain row from their kept e_j (s: the row's sum, y = 1 / s);
 * `to_target` = t - (the first class's index): the target's element, when one of the four,
 * again as the target. */
__device__ __forceinline__ float4 ce_plain_grad4(float4 e, float s, float y, int to_target, const mt_ce_scalars &sc) {
    float4 p = ce_quotient4(e, s, y);
    float4 g = make_float4(mt_ce_grad(p.x, 1.0f, 0, &sc), mt_ce_grad(p.y, 1.0f, 0, &sc),
                           mt_ce_grad(p.z, 1.0f, 0, &sc), mt_ce_grad(p.w, 1.0f, 0, &sc));
    unsigned j = (unsigned)to_target;
    if (j < 4u) {
        g.x = j == 0 ? mt_ce_grad(p.x, 1.0f, 1, &sc) : g.x;
        g.y = j == 1 ? mt_ce_grad(p.y, 1.0f, 1, &sc) : g.y;
        g.z = j == 2 ? mt_ce_grad(p.z, 1.0f, 1, &sc) : g.z;
        g.w = j == 3 ? mt_ce_grad(p.w, 1.0f, 1, &sc) : g.w;
    }
    return g;
}

/* Shared floats of a row block: the staged row (SMEM), the fold's partials (k sums side by
 * side: 2 for probabilities), 96 for pass A. */
__host__ __device__ __forceinline__ int64_t ce_smem_floats(bool staged, int64_t vocab, int k = 1) {
    return (staged ? (vocab + 3) / 4 * 4 : 0) + mt_rows_fold_floats(k, vocab) + 96;
}

/* Pass A's view of the logits: the max, the min (mn - m >= MT_EXPF_MID_LO lets every e_j
 * take mt_expf_mid: x_j - m >= mn - m, rounding being monotonic), and the largest |x| bit
 * pattern (a pattern >= inf's is NaN or inf), fed by the staging loads or by a walk of the row. */
struct ce_scan {
    float m = -INFINITY, mn = INFINITY;
    uint32_t top = 0;
    __device__ __forceinline__ void operator()(float v) {
        m = fmaxf(m, v);
        mn = fminf(mn, v);
        top = max(top, mt_f32_bits(v) & 0x7fffffffu);
    }
    __device__ __forceinline__ void operator()(const float4 &q) {
        m = fmaxf(fmaxf(m, q.x), fmaxf(q.y, fmaxf(q.z, q.w)));
        mn = fminf(fminf(mn, q.x), fminf(q.y, fminf(q.z, q.w)));
        uint32_t a = mt_f32_bits(q.x) & 0x7fffffffu, b = mt_f32_bits(q.y) & 0x7fffffffu;
        uint32_t c = mt_f32_bits(q.z) & 0x7fffffffu, g = mt_f32_bits(q.w) & 0x7fffffffu;
        top = max(max(top, a), max(max(b, c), g));
    }
    /* All three over the block, in every thread (red: 96 words of shared memory). */
    __device__ __forceinline__ void block(uint32_t *red) {
        for (int d = 16; d >= 1; d >>= 1) {
            m = fmaxf(m, MT_WARP_XOR(m, d));
            mn = fminf(mn, MT_WARP_XOR(mn, d));
            top = max(top, (uint32_t)MT_WARP_XOR(top, d));
        }
        const int w = threadIdx.x / 32, nw = blockDim.x / 32;
        if ((threadIdx.x & 31) == 0) {
            red[w] = mt_f32_bits(m);
            red[32 + w] = top;
            red[64 + w] = mt_f32_bits(mn);
        }
        __syncthreads();
        for (int k = 0; k < nw; ++k) {
            m = fmaxf(m, mt_bits_f32(red[k]));
            top = max(top, red[32 + k]);
            mn = fminf(mn, mt_bits_f32(red[64 + k]));
        }
        __syncthreads();
    }
};

/* The full form's gradient of a row not ignored, from the kept e_j: fma(p_j, a, -y_j) * g with
 * a = A and y_j = off * w_j (y_t = kt + off * w_t) for a weighted row, a = C and y_j = c_j for
 * probabilities (loss.md); csum: C. VEC: e and d (and the weight, probabilities) aligned. */
template <int KIND, bool VEC, class Next>
__device__ __forceinline__ void ce_full_grad(const float *e, float *d, int64_t vocab, int64_t t, float s, float csum,
                                             const mt_ce_scalars &sc, const ce_more &more, const Next &next) {
    const float inv = 1.0f / s;
    float a = csum, yt = 0.0f;
    if (KIND == CE_WEIGHTED) {
        const float wt = more.w[t], kt = sc.keep * wt;
        a = mt_ce_factor_w(kt, more.wm, &sc);
        yt = mt_ce_target_w(kt, wt, &sc);
    }
    auto grad = [&](float ej, int64_t j) {
        float y = KIND == CE_WEIGHTED ? (j == t ? yt : sc.off * more.w[j]) : mt_ce_coef(more.y, more.w, j, &sc);
        return mt_ce_grad_nd(ce_quotient(ej, s, inv), 1.0f, a, y, sc.g);
    };
    mt_rows_walk<VEC>(
        vocab,
        [&](int64_t i) {
            float4 q = *(const float4 *)(e + i);
            MT_STCS((float4 *)(d + i), make_float4(grad(q.x, i), grad(q.y, i + 1), grad(q.z, i + 2), grad(q.w, i + 3)));
            next.slot(i);
        },
        [&](int64_t i) { d[i] = grad(e[i], i); });
}

/* One row: x (shared or global) holds the logits, e receives e_j (x itself when staged, or
 * the dlogits row, or NULL), d the dlogits row (or NULL); `scan` has seen this thread's share
 * of the row already when `scanned` (the staging loads), else the row is walked here. Returns
 * the row's loss; *bad: 1 the row's logits hold NaN or inf, 2 its probabilities do. XV: x (and
 * e) 16-byte aligned rows; DV: d, and the full form's weight and probabilities, too. KIND: the
 * rows of loss.md's first sections, or of its full form (a weight: SW with smoothing, the
 * weighted loss and gradient; probabilities: C and CX, fma(p, C, -c) * g); more: what they read. */
template <int KIND, bool STAGED_ROW, bool XV, bool DV, class Next>
__device__ __forceinline__ float ce_row(const float *x, float *e, float *d, int64_t vocab, int64_t t, bool ignored,
                                        const mt_ce_scalars &sc, const ce_more &more, float *part, float *part2,
                                        float *red, ce_scan scan, bool scanned, int *bad, const Next &next) {
    if (!scanned) mt_rows_walk<XV>(vocab, [&](int64_t i) { scan(*(const float4 *)(x + i)); }, [&](int64_t i) { scan(x[i]); });
    float xt = (!ignored && threadIdx.x == 0) ? x[t] : 0.0f;   /* before e_j replaces x_j */
    scan.block((uint32_t *)red);
    const float m = scan.m;
    *bad = scan.top >= 0x7f800000u;
    if (KIND == CE_PROBS) {
        bool ybad = false;
        mt_rows_walk<false>(vocab, [&](int64_t) {}, [&](int64_t i) {
            ybad |= (mt_f32_bits(more.y[i]) & 0x7f800000u) == 0x7f800000u;
        });
        *bad |= __syncthreads_or(ybad) ? 2 : 0;
    }
    float s = 0.0f, sum_x = 0.0f, sum_cx = 0.0f;   /* sum_x: S, SW or C; sum_cx: CX */
    if (!ignored) {
        float root[1];
        if (KIND == CE_PLAIN && sc.eps != 0.0f) {
            mt_rows_fold<1>(root, vocab, [&](int64_t c) { return ce_sum<XV>{x + c * MT_CHUNK}; }, part, part2, MT_SAB_LOSS);
            sum_x = root[0];
        }
        if (KIND == CE_WEIGHTED && sc.eps != 0.0f) {
            mt_rows_fold<1>(root, vocab, [&](int64_t c) { return ce_sum_wx<DV>{x + c * MT_CHUNK, more.w + c * MT_CHUNK}; },
                            part, part2, MT_SAB_LOSS);
            sum_x = root[0];
        }
        if (KIND == CE_PROBS) {
            float both[2];
            mt_rows_fold<2>(both, vocab, [&](int64_t c) {
                return ce_sum_coef<DV>{x + c * MT_CHUNK, more.y + c * MT_CHUNK, more.w ? more.w + c * MT_CHUNK : nullptr, &sc};
            }, part, part2, MT_SAB_LOSS);
            sum_x = both[0];
            sum_cx = both[1];
        }
        const bool mid = scan.mn - m >= MT_EXPF_MID_LO;
        if (STAGED_ROW) {       /* x in shared memory: every e_j first, in place, then their sum
                                   (not a pointer test: an in-place call has e == x in global memory) */
            if (mid) ce_exp_row<true>(e, vocab, m);
            else ce_exp_row<false>(e, vocab, m);
            __syncthreads();
            mt_rows_fold<1>(root, vocab, [&](int64_t c) { return ce_sum<XV>{e + c * MT_CHUNK}; }, part, part2,
                            MT_SAB_LOSS);
        } else if (mid) {
            mt_rows_fold<1>(root, vocab, [&](int64_t c) {
                return ce_sum_exp<XV, true>{x + c * MT_CHUNK, e ? e + c * MT_CHUNK : nullptr, m};
            }, part, part2, MT_SAB_LOSS);
        } else {
            mt_rows_fold<1>(root, vocab, [&](int64_t c) {
                return ce_sum_exp<XV, false>{x + c * MT_CHUNK, e ? e + c * MT_CHUNK : nullptr, m};
            }, part, part2, MT_SAB_LOSS);
        }
        s = root[0];
    }
    if (d) {
        if (ignored) {
            mt_rows_walk<DV>(vocab, [&](int64_t i) {
                MT_STCS((float4 *)(d + i), make_float4(0.0f, 0.0f, 0.0f, 0.0f));
                next.slot(i);
            }, [&](int64_t i) { d[i] = 0.0f; });
        } else if (KIND == CE_PLAIN) {
            const float y = 1.0f / s;
            const int tt = (int)t;   /* row-local indices fit in int: vocab < 2^24 */
            mt_rows_walk<DV && XV>(
                vocab,
                [&](int64_t i) {
                    MT_STCS((float4 *)(d + i), ce_plain_grad4(*(const float4 *)(e + i), s, y, tt - (int)i, sc));
                    next.slot(i);     /* this thread's float4 of the row is free: the next row's comes in */
                },
                [&](int64_t i) { d[i] = mt_ce_grad(ce_quotient(e[i], s, y), 1.0f, (int)i == tt, &sc); });
        } else {
            ce_full_grad<KIND, DV && XV>(e, d, vocab, t, s, sum_x, sc, more, next);
        }
    }
    if (!d) next.all();       /* no gradient pass: after the folds' barriers, every slot is free */
    if (ignored) return 0.0f;
    /* used by thread 0 only */
    if (KIND == CE_WEIGHTED) return mt_ce_row_loss_w(m, s, xt, more.w[t], sum_x, more.wm, &sc);
    if (KIND == CE_PROBS) return mt_ce_row_loss_p(m, s, sum_x, sum_cx);
    return mt_ce_row_loss(m, s, xt, sum_x, &sc);
}

/* The next row of a pipelined staged block, copied asynchronously into the float4 slots of
 * shared memory that each thread owns in the elementwise passes (slot q = thread + k *
 * blockDim: the same map as ce_exp_row and mt_rows_walk), each as soon as this thread has
 * read the slot for the last time (its gradient). No other thread touches a slot between
 * the folds' barriers and the next row's barrier, so the copies need no barrier of their
 * own; the block waits for its copies before scanning its slots. src NULL: no next row. */
struct ce_next {
    float *row;
    const float *src;
    int64_t n4;
    __device__ __forceinline__ void slot(int64_t i) const {
        if (src) mt_cp_async16(row + i, src + i, 16);
    }
    __device__ __forceinline__ void all() const {
        for (int64_t q = threadIdx.x; q < n4; q += blockDim.x) slot(4 * q);
    }
};

struct ce_no_next {
    __device__ __forceinline__ void slot(int64_t) const {}
    __device__ __forceinline__ void all() const {}
};

/* STAGED: rows go through shared memory (one read of the logits); else every pass reads them
 * from global memory and e_j is kept in dlogits. VEC: logits and dlogits rows (and the weight
 * and probabilities) are 16-byte aligned (vocab % 4 == 0 and aligned bases). KIND: see ce_row;
 * weight (or NULL) and probs (rows of vocab, CE_PROBS) are the full form's. */
template <bool STAGED, bool VEC, int KIND>
__global__ void __launch_bounds__(32 * (STAGED ? CE_SMEM_WARPS : CE_GLOBAL_WARPS))
    k_ce_rows(const float *logits, float *dlogits, float *losses, uint8_t *flags, const void *targets, int32_t bytes,
              int64_t n, int64_t vocab, int64_t ignore, const ce_dev *dev, const float *weight, const float *probs) {
    extern __shared__ float4 smem4[];
    if (dev->first_bad < n) return;
    const mt_ce_scalars sc = dev->sc;
    constexpr int K = KIND == CE_PROBS ? 2 : 1;     /* sums folded side by side */
    float *row = (float *)smem4, *part = row + (STAGED ? (vocab + 3) / 4 * 4 : 0);
    float *part2 = part + K * mt_chunk_count(vocab), *red = part + mt_rows_fold_floats(K, vocab);
    const float wm = KIND == CE_PLAIN ? 0.0f : dev->wm;
    /* STAGED && VEC pipelines the rows: a row's copy into shared memory is issued while the
     * previous row's gradient is written (ce_next), and arrives from L2 (prefetched a row
     * ahead); the other kernels stage each row with loads once the previous one is done. */
    constexpr bool PIPE = STAGED && VEC;
    const int64_t n4 = vocab / 4;
    if (PIPE && blockIdx.x < n) {
        ce_next{row, logits + blockIdx.x * vocab, n4}.all();
        mt_cp_async_commit();
    }
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *src = logits + r * vocab;
        float *d = dlogits ? dlogits + r * vocab : nullptr;
        ce_scan scan;
        if (PIPE) {
            mt_cp_async_wait<0>();
            for (int64_t q = threadIdx.x; q < n4; q += blockDim.x) scan(((const float4 *)row)[q]);
        } else if (STAGED) {
            mt_rows_stage<VEC>(row, src, vocab, [&](const auto &v) { scan(v); });
        }
        if (STAGED) {
            if (r + gridDim.x < n) mt_rows_prefetch_l2(src + gridDim.x * vocab, vocab);
            __syncthreads();
        }
        const int64_t t = KIND == CE_PROBS ? 0 : ce_target(targets, bytes, r);
        const bool ignored = KIND != CE_PROBS && t == ignore;
        const ce_more more{weight, KIND == CE_PROBS ? probs + r * vocab : nullptr, wm};
        int bad;
        float loss;
        if (PIPE) {
            ce_next next{row, r + gridDim.x < n ? src + gridDim.x * vocab : nullptr, n4};
            loss = ce_row<KIND, true, true, VEC>(row, row, d, vocab, t, ignored, sc, more, part, part2, red, scan, true,
                                                 &bad, next);
            mt_cp_async_commit();
        } else if (STAGED) {
            loss = ce_row<KIND, true, true, VEC>(row, row, d, vocab, t, ignored, sc, more, part, part2, red, scan, true,
                                                 &bad, ce_no_next{});
        } else {
            loss = ce_row<KIND, false, VEC, VEC>(src, d, d, vocab, t, ignored, sc, more, part, part2, red, scan, false,
                                                 &bad, ce_no_next{});
        }
        if (threadIdx.x == 0) {
            losses[r] = loss;
            flags[r] = (uint8_t)bad;
        }
        __syncthreads();   /* the row's shared memory is free again */
    }
}

#include "mt_gpu_loss_cluster.cuh"   /* k_ce_rows_cluster and its launch */

/* acc = acc + x[r] for r = begin .. end-1 in order, from +0.0, by one whole warp: lanes load
 * 8 x 32 consecutive values at once (coalesced, all in flight) and every lane then runs the
 * same chain through shuffles. The chain is the token rule's leaf, unchanged; a thread
 * walking it alone waited for every load in turn (48 us for 8 leaves of 1024 rows). */
__device__ __forceinline__ float ce_warp_chain(const float *x, int64_t begin, int64_t end) {
    const int lane = threadIdx.x & 31;
    float acc = 0.0f;
    for (int64_t r = begin; r < end; r += 256) {
        float v[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) v[k] = r + 32 * k + lane < end ? x[r + 32 * k + lane] : 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k)
            for (int u = 0; u < 32; ++u) {
                float y = MT_SHFL_IDX(v[k], u);
                if (r + 32 * k + u < end) acc = acc + y;
            }
    }
    return acc;
}

/* The token rule over x[0..n) on a whole block (every thread calls it): each warp folds leaves
 * of MT_TOKEN_LEAF rows by ce_warp_chain into leaves[], then the block tree (leaves holds
 * mt_token_leaves(n) + its tree's scratch). The root in every thread. */
__device__ __forceinline__ float ce_token_sum(const float *x, int64_t n, float *leaves) {
    int64_t nl = mt_token_leaves(n);
    for (int64_t l = threadIdx.x / 32; l < nl; l += blockDim.x / 32) {
        int64_t end = (l + 1) * MT_TOKEN_LEAF < n ? (l + 1) * MT_TOKEN_LEAF : n;
        float acc = ce_warp_chain(x, l * MT_TOKEN_LEAF, end);
        if ((threadIdx.x & 31) == 0) leaves[l] = acc;
    }
    __syncthreads();
    return mt_block_tree_fold(leaves, nl, leaves + nl, leaves);
}

/* The smallest row whose flag has `bit` (n: none), on the whole block. */
__device__ __forceinline__ int64_t ce_first_flag(const uint8_t *flags, int64_t n, int bit, int64_t *s) {
    int64_t first = n;
    for (int64_t r = threadIdx.x; r < n; r += blockDim.x)
        if (flags[r] & bit) { first = r; break; }   /* ascending: this thread's smallest */
    return ce_block_reduce<true>(first, s);
}

/* full: a call of the full form with a weight or probabilities (loss.md: every NaN it writes is
 * the canonical one; a row's probabilities may be flagged, bit 2, after every logits row). */
__global__ void __launch_bounds__(CE_ONE_BLOCK) k_ce_finish(const float *losses, const uint8_t *flags, int64_t n,
                                                           int32_t reduction, const ce_dev *dev, float *loss_dev,
                                                           float *leaves, mt_rows_status *st, int32_t full) {
    __shared__ int64_t s[CE_ONE_BLOCK];
    if (dev->first_bad < n) {
        if (threadIdx.x == 0) {
            st->first_bad = dev->first_bad;
            st->bad_value = dev->weight_bad >= 0 ? dev->weight_bad : dev->bad_value;
            st->bad[1] = dev->weight_bad >= 0;
            st->first_nonfinite = n;
        }
        return;
    }
    int64_t first = ce_first_flag(flags, n, 1, s), first_y = full && first == n ? ce_first_flag(flags, n, 2, s) : n;
    if (first == n && first_y == n && reduction != MT_REDUCTION_NONE) {
        float total = ce_token_sum(losses, n, leaves);
        float loss = reduction == MT_REDUCTION_MEAN ? (full ? total / dev->divisor : ce_mean(total, dev->divisor)) : total;
        if (full) loss = mt_canonical_nan(loss);
        if (threadIdx.x == 0) {
            st->loss = loss;
            if (loss_dev) *loss_dev = loss;
        }
    }
    if (threadIdx.x == 0) {
        st->first_bad = n;
        st->first_nonfinite = first < n ? first : first_y;
        st->bad[0] = first == n && first_y < n;
    }
}

/* The full form's first kernel (one block; it replaces k_ce_targets): the weight's smallest
 * non-finite class (a refusal: first_bad = 0 stops every later kernel), the targets as
 * k_ce_targets reads them, the divisor of a counted mean (the count; with a weight the token
 * rule over the rows' target weights, written to row_w first), g = 1 / D, and Wm = W / V (W:
 * the chunk tree of the weight, on the block's warps, partials in dynamic shared memory). */
__global__ void __launch_bounds__(CE_ONE_BLOCK) k_cend_prep(const void *targets, int32_t bytes, const float *weight,
                                                           int64_t n, int64_t vocab, int64_t ignore, mt_ce_scalars sc,
                                                           float divisor, int32_t kind, int32_t counted_mean,
                                                           float *row_w, float *leaves, ce_dev *dev) {
    extern __shared__ float4 smem4[];
    __shared__ int64_t s[CE_ONE_BLOCK];
    int64_t wbad = vocab, bad = n, count = 0;
    if (weight)
        for (int64_t j = threadIdx.x; j < vocab; j += blockDim.x)
            if ((mt_f32_bits(weight[j]) & 0x7f800000u) == 0x7f800000u) { wbad = j; break; }
    wbad = ce_block_reduce<true>(wbad, s);
    if (wbad == vocab && kind != CE_PROBS)
        for (int64_t r = threadIdx.x; r < n; r += blockDim.x) {
            int64_t t = ce_target(targets, bytes, r);
            bool ignored = t == ignore && ignore != MT_NO_IGNORE_INDEX;
            if (!ignored && (t < 0 || t >= vocab)) {
                bad = r;      /* this thread's rows ascend: its first bad one is its smallest */
                break;
            }
            if (row_w) row_w[r] = ignored ? 0.0f : weight[t];
            count += !ignored;
        }
    bad = ce_block_reduce<true>(bad, s);       /* its barriers publish row_w to the block */
    count = ce_block_reduce<false>(count, s);
    float wm = 0.0f;
    if (wbad == vocab && bad == n) {
        if (counted_mean) {
            divisor = kind == CE_WEIGHTED ? ce_token_sum(row_w, n, leaves) : (float)count;
            sc.g = 1.0f / divisor;
        }
        if (kind == CE_WEIGHTED && sc.eps != 0.0f) {
            float root[1], *part = (float *)smem4;
            mt_rows_fold<1>(root, vocab, [&](int64_t c) { return ce_sum<false>{weight + c * MT_CHUNK}; }, part,
                            part + mt_chunk_count(vocab), MT_SAB_LOSS);
            wm = root[0] / sc.vocab;
        }
    }
    if (threadIdx.x == 0) {
        dev->weight_bad = wbad < vocab ? wbad : -1;
        dev->first_bad = wbad < vocab ? 0 : bad;
        dev->bad_value = bad < n ? ce_target(targets, bytes, bad) : 0;
        dev->count = count;
        dev->divisor = divisor;
        dev->wm = wm;
        dev->sc = sc;
    }
}

/* dst = src with each of `batch` (rows, cols) matrices transposed to (cols, rows), by 32 x 32
 * tiles through shared memory (blocks of 32 x 8 threads): the full form's logits and
 * probabilities (B, V, P) -> (B, P, V), and its gradient back. Moves values only. dev (or
 * NULL): stand still when the call was refused (n: its rows), so nothing is written then. */
__global__ void __launch_bounds__(256) k_ce_transpose(float *dst, const float *src, int64_t batch, int64_t rows,
                                                      int64_t cols, const ce_dev *dev, int64_t n) {
    __shared__ float tile[32][33];
    if (dev && dev->first_bad < n) return;
    const int64_t tr = (rows + 31) / 32, tc = (cols + 31) / 32, per = tr * tc;
    for (int64_t k = blockIdx.x; k < batch * per; k += gridDim.x) {
        const int64_t b = k / per, r0 = (k % per) / tc * 32, c0 = (k % per) % tc * 32;
        const float *sb = src + b * rows * cols;
        float *db = dst + b * rows * cols;
        for (int i = threadIdx.y; i < 32; i += 8)
            if (r0 + i < rows && c0 + threadIdx.x < cols) tile[i][threadIdx.x] = sb[(r0 + i) * cols + c0 + threadIdx.x];
        __syncthreads();
        for (int i = threadIdx.y; i < 32; i += 8)
            if (c0 + i < cols && r0 + threadIdx.x < rows) db[(c0 + i) * rows + r0 + threadIdx.x] = tile[threadIdx.x][i];
        __syncthreads();
    }
}

/* ---- host ---- */

/* Out of line, so that nothing of it moves across the floating-point environment switch. The
 * divisor is num_items rounded to nearest; a counted mean gets its divisor and g on the device
 * (k_ce_targets: the same two roundings, (float)count and 1 / D). */
MT_NOINLINE mt_ce_scalars host_ce_scalars(float eps, int64_t vocab, int32_t mean, int64_t num_items, float *divisor) {
    *divisor = (float)(num_items ? num_items : 1);
    return mt_ce_scalars_for(eps, vocab, mean, *divisor);
}

MT_NOINLINE float host_empty_loss(int32_t mean, int64_t num_items) {
    float total = 0.0f, divisor = (float)num_items;   /* no rows: the count is 0 */
    return mean ? ce_mean(total, divisor) : total;
}

/* No rows: loss_out only (sum 0, mean 0 / D). */
int ce_empty(float *loss_out, int32_t reduction, int64_t num_items) {
    if (reduction == MT_REDUCTION_NONE) return MT_OK;
    mt_fp_env env;
    mt_fp_begin(&env);
    float loss = host_empty_loss(reduction == MT_REDUCTION_MEAN, num_items);
    mt_fp_end(&env);
    if (!mt_gpu_is_device(loss_out)) {
        *loss_out = loss;
        return MT_OK;
    }
    MT_GPU_CHECK(gpuMemcpyAsync(loss_out, &loss, 4, gpuMemcpyDefault, MT_STREAM), "upload");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "cross_entropy");
    mt_gpu_count_h2d(4);
    return MT_OK;
}

/* Device pointers of a call's buffers (staged: a host buffer the call copied). The full form
 * adds the weight, the probabilities, the rows' target weights (a weighted mean), and with
 * positions the transposed logits (xt), probabilities (yt) and gradient (dt). */
struct ce_bufs {
    mt_arena arena;
    float *logits = nullptr, *dlogits = nullptr, *rows = nullptr, *leaves = nullptr;
    float *weight = nullptr, *probs = nullptr, *row_w = nullptr, *xt = nullptr, *yt = nullptr, *dt = nullptr;
    void *targets = nullptr;
    uint8_t *flags = nullptr;
    ce_dev *dev = nullptr;
    bool s_logits = false, s_targets = false, s_dlogits = false, s_rows = false, loss_on_device = false;
    bool s_weight = false, s_probs = false;
};

/* The full form's inputs beyond mt_cross_entropy's. */
struct ce_full {
    const float *probs, *weight;
    int64_t inner;
    int kind;
};

int ce_stage_full(ce_bufs *b, const ce_full &f, int64_t n, int64_t vocab, bool grad) {
    int rc;
    int64_t bytes = n * vocab * 4;
    if ((f.probs && (rc = mt_buf_to_device((void **)&b->probs, &b->s_probs, &b->arena, (void *)f.probs, bytes, true))) ||
        (f.weight &&
         (rc = mt_buf_to_device((void **)&b->weight, &b->s_weight, &b->arena, (void *)f.weight, vocab * 4, true))) ||
        (f.kind == CE_WEIGHTED && (rc = b->arena.alloc((void **)&b->row_w, n * 4))) ||
        (f.inner > 1 && (rc = b->arena.alloc((void **)&b->xt, bytes))) ||
        (f.inner > 1 && f.probs && (rc = b->arena.alloc((void **)&b->yt, bytes))) ||
        (f.inner > 1 && grad && (rc = b->arena.alloc((void **)&b->dt, bytes))))
        return rc;
    return MT_OK;
}

int ce_stage(ce_bufs *b, float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets,
             int32_t target_bytes, int64_t n, int64_t vocab, const ce_full *full = nullptr) {
    int rc;
    int64_t bytes = n * vocab * 4, leaves = mt_token_leaves(n);
    if ((rc = mt_buf_to_device((void **)&b->logits, &b->s_logits, &b->arena, (void *)logits, bytes, true)) ||
        (targets &&
         (rc = mt_buf_to_device(&b->targets, &b->s_targets, &b->arena, (void *)targets, n * target_bytes, true))) ||
        (full && (rc = ce_stage_full(b, *full, n, vocab, dlogits != nullptr))) ||
        (dlogits && (rc = mt_buf_to_device((void **)&b->dlogits, &b->s_dlogits, &b->arena, dlogits, bytes, false))) ||
        (row_loss && (rc = mt_buf_to_device((void **)&b->rows, &b->s_rows, &b->arena, row_loss, n * 4, false))) ||
        (!row_loss && (rc = b->arena.alloc((void **)&b->rows, n * 4))) ||
        (rc = b->arena.alloc((void **)&b->flags, n)) || (rc = b->arena.alloc((void **)&b->dev, sizeof(ce_dev))) ||
        (rc = b->arena.alloc((void **)&b->leaves, (leaves + (leaves + 31) / 32 + 1) * 4)))
        return rc;
    b->loss_on_device = loss_out && mt_gpu_is_device(loss_out);
    return b->arena.flush();
}


/* The row kernel for this vocab: staged in shared memory when the row fits. logits and dlogits
 * are rows of vocab (the caller's, or the full form's transposed scratch); weight and probs
 * (KIND's, or NULL) are the full form's. */
template <int KIND>
int ce_launch_rows(const ce_bufs &b, const void *targets, int32_t target_bytes, int64_t n, int64_t vocab,
                   int64_t ignore_index, const float *logits, float *dlogits, const float *weight, const float *probs) {
    static std::once_flag once[4];
    bool vec = vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0 && ((uintptr_t)dlogits & 15u) == 0 &&
               ((uintptr_t)weight & 15u) == 0 && ((uintptr_t)probs & 15u) == 0;
    const int k = KIND == CE_PROBS ? 2 : 1;
    size_t smem = (size_t)ce_smem_floats(true, vocab, k) * 4;
    /* MOJO_TRAIN_CE_GLOBAL=1 (read once) forces the global-memory rows: an A/B switch, same bits. */
    static const bool force_global = getenv("MOJO_TRAIN_CE_GLOBAL") && getenv("MOJO_TRAIN_CE_GLOBAL")[0] == '1';
    bool staged = !force_global && smem <= (size_t)mt_rows_limits().smem_optin;
    const size_t one_row = smem;     /* a staged block's bytes, fitting or not */
    if (!staged) smem = (size_t)ce_smem_floats(false, vocab, k) * 4;
    int64_t chunks = mt_chunk_count(vocab), cap = staged ? CE_SMEM_WARPS : CE_GLOBAL_WARPS;
    int64_t warps = (vocab + CE_FLOATS_PER_WARP - 1) / CE_FLOATS_PER_WARP;
    warps = warps < chunks ? chunks : warps;
    int threads = 32 * (int)(warps < cap ? warps : cap);
    void (*kernel)(const float *, float *, float *, uint8_t *, const void *, int32_t, int64_t, int64_t, int64_t,
                   const ce_dev *, const float *, const float *) =
        staged ? (vec ? k_ce_rows<true, true, KIND> : k_ce_rows<true, false, KIND>)
               : (vec ? k_ce_rows<false, true, KIND> : k_ce_rows<false, false, KIND>);
    int rc, grid = 0;
#if MT_CE_CLUSTERS
    /* MOJO_TRAIN_CE_CLUSTER=1 (read once) shares each row among a cluster: opt-in, same bits.
     * Measured on the H200 (0c60b6c, 8192 x 50304): it reads the logits once (1.65 GB against
     * the one-block rows' 2.86) yet takes 1.54 ms against their 1.17 (bench/results/NOTES.md). */
    static const bool no_cluster = !(getenv("MOJO_TRAIN_CE_CLUSTER") && getenv("MOJO_TRAIN_CE_CLUSTER")[0] == '1');
    /* Only where a staged row leaves no room for a second block on an SM (or does not fit at
     * all): smaller rows already overlap one block's copy with another block's exps. */
    int cs = 0;
    int64_t share = KIND == CE_PLAIN && vec && !force_global && !no_cluster &&
                            2 * one_row > (size_t)mt_rows_limits().smem_optin
                        ? ce_cluster_plan(vocab, mt_rows_limits().smem_optin, &cs) : 0;
    if (share > 0 &&
        (rc = ce_launch_cluster(b.rows, b.flags, b.dev, targets, target_bytes, n, vocab, ignore_index, logits,
                                 dlogits, cs, share)) != -1)
        return rc;
#endif
    if ((rc = mt_rows_allow_smem(kernel, once[2 * staged + vec])) ||
        (rc = mt_rows_grid(&grid, kernel, threads, smem, n)))
        return rc;
    kernel<<<grid, threads, smem, MT_STREAM>>>(logits, dlogits, b.rows, b.flags, targets, target_bytes, n, vocab,
                                               ignore_index, b.dev, weight, probs);
    return mt_rows_launched("cross_entropy rows");
}

/* The full form's transposes (k_ce_transpose): every tile once, as many blocks as keep the
 * device busy. */
int ce_transpose(float *dst, const float *src, int64_t batch, int64_t rows, int64_t cols, const ce_dev *dev, int64_t n) {
    int64_t tiles = batch * ((rows + 31) / 32) * ((cols + 31) / 32), cap = 32 * (int64_t)mt_rows_limits().sms;
    k_ce_transpose<<<(int)(tiles < cap ? tiles : cap), dim3(32, 8), 0, MT_STREAM>>>(dst, src, batch, rows, cols, dev, n);
    return mt_rows_launched("cross_entropy transpose");
}

/* Read the status: refuse (in the oracle's order: the weight, a target, non-finite logits, then
 * probabilities), or download staged outputs and write a host loss_out. inner: the positions. */
int ce_finish(ce_bufs *b, const mt_rows_status *st, float *loss_out, float *row_loss, float *dlogits, int64_t n,
              int64_t vocab, int64_t ignore_index, int32_t reduction, int64_t inner = 1) {
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "cross_entropy");
    mt_gpu_count_d2h((int64_t)sizeof *st);
    if (st->bad[1]) return mt_fail_nonfinite_weight(st->bad_value);
    if (st->first_bad < n) return mt_fail_target(st->first_bad, st->bad_value, vocab, ignore_index);
    if (st->first_nonfinite < n)   /* a staged twin is never downloaded: only device outputs were written */
        return mt_fail_nonfinite_nd(st->bad[0], st->first_nonfinite, inner,
                                    mt_ce_written(dlogits && !b->s_dlogits, row_loss && !b->s_rows));
    int rc;
    if ((b->s_dlogits && (rc = mt_buf_to_host(dlogits, b->dlogits, n * vocab * 4))) ||
        (b->s_rows && (rc = mt_buf_to_host(row_loss, b->rows, n * 4))))
        return rc;
    if (b->s_dlogits || b->s_rows) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    if (reduction != MT_REDUCTION_NONE && !b->loss_on_device) *loss_out = st->loss;
    return MT_OK;
}

}  // namespace

extern "C" int mt_cross_entropy(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                                const void *targets, int32_t target_bytes, int64_t n_rows, int64_t vocab,
                                int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    if ((rc = mt_check_ce_args(loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab, reduction,
                         label_smoothing, num_items)) ||
        (rc = mt_check_ce_dlogits(dlogits, logits, targets, target_bytes, n_rows, vocab, 1)) ||
        (rc = mt_gpu_ready()))
        return rc;
    if (n_rows == 0) return ce_empty(loss_out, reduction, num_items);
    mt_rows_status *st = mt_rows_mapped();
    if (!st) return MT_ENOMEM;
    ce_bufs b;
    if ((rc = ce_stage(&b, loss_out, row_loss, dlogits, logits, targets, target_bytes, n_rows, vocab))) return rc;
    int32_t mean = reduction == MT_REDUCTION_MEAN, counted = mean && num_items == 0;
    mt_fp_env env;                  /* host scalars in IEEE defaults, whatever the caller set */
    mt_fp_begin(&env);
    float divisor;
    mt_ce_scalars sc = host_ce_scalars(label_smoothing, vocab, mean, num_items, &divisor);
    mt_fp_end(&env);
    *st = mt_rows_status{n_rows, 0, n_rows, 0.0f, {0, 0, 0}};
    k_ce_targets<<<1, CE_ONE_BLOCK, 0, MT_STREAM>>>(b.targets, target_bytes, n_rows, vocab, ignore_index, sc, divisor,
                                                    counted, b.dev);
    if ((rc = mt_rows_launched("cross_entropy targets")) ||
        (rc = ce_launch_rows<CE_PLAIN>(b, b.targets, target_bytes, n_rows, vocab, ignore_index, b.logits, b.dlogits,
                                       nullptr, nullptr)))
        return rc;
    k_ce_finish<<<1, CE_ONE_BLOCK, 0, MT_STREAM>>>(b.rows, b.flags, n_rows, reduction, b.dev,
                                                   b.loss_on_device ? loss_out : nullptr, b.leaves, st, 0);
    if ((rc = mt_rows_launched("cross_entropy finish"))) return rc;
    return ce_finish(&b, st, loss_out, row_loss, dlogits, n_rows, vocab, ignore_index, reduction);
}

/* The full form (loss.md, "Weights, probability targets and positions"): index targets without
 * a weight and without positions are mt_cross_entropy itself. Otherwise k_cend_prep (the weight,
 * the targets, D, Wm), the transposes of the logits and probabilities to rows of vocab when
 * there are positions, the row kernel of the call's kind, the gradient transposed back, and
 * k_ce_finish; one synchronization, as mt_cross_entropy. */
extern "C" int mt_cross_entropy_nd(float *loss_out, float *row_loss, float *dlogits, const float *logits,
                                   const void *targets, const float *target_probs, const float *weight,
                                   int32_t target_bytes, int64_t n_batch, int64_t vocab, int64_t inner,
                                   int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items) {
    int rc;
    int64_t n = 0;
    if ((rc = mt_check_ce_nd_args(&n, loss_out, row_loss, dlogits, logits, targets, target_probs, weight, target_bytes,
                                  n_batch, vocab, inner, reduction, label_smoothing, num_items)) ||
        (rc = mt_gpu_ready()))
        return rc;
    if (target_bytes && !weight && inner == 1)
        return mt_cross_entropy(loss_out, row_loss, dlogits, logits, targets, target_bytes, n, vocab, ignore_index,
                                reduction, label_smoothing, num_items);
    if (n == 0) return ce_empty(loss_out, reduction, num_items);
    mt_rows_status *st = mt_rows_mapped();
    if (!st) return MT_ENOMEM;
    const int kind = !target_bytes ? CE_PROBS : weight ? CE_WEIGHTED : CE_PLAIN;
    const ce_full full{target_probs, weight, inner, kind};
    ce_bufs b;
    if ((rc = ce_stage(&b, loss_out, row_loss, dlogits, logits, targets, target_bytes, n, vocab, &full))) return rc;
    int32_t mean = reduction == MT_REDUCTION_MEAN, counted = mean && num_items == 0 && kind != CE_PROBS;
    mt_fp_env env;                  /* host scalars in IEEE defaults, whatever the caller set */
    mt_fp_begin(&env);
    float divisor;                  /* probabilities: num_items or the row count, rounded to nearest */
    mt_ce_scalars sc = host_ce_scalars(label_smoothing, vocab, mean, num_items || kind != CE_PROBS ? num_items : n,
                                       &divisor);
    mt_fp_end(&env);
    *st = mt_rows_status{n, 0, n, 0.0f, {0, 0, 0}};
    k_cend_prep<<<1, CE_ONE_BLOCK, (size_t)mt_rows_fold_floats(1, vocab) * 4, MT_STREAM>>>(
        b.targets, target_bytes, b.weight, n, vocab, ignore_index, sc, divisor, kind, counted, b.row_w, b.leaves, b.dev);
    if ((rc = mt_rows_launched("cross_entropy prep"))) return rc;
    const float *x = b.logits, *y = b.probs;
    float *d = b.dlogits;
    if (inner > 1) {
        if ((rc = ce_transpose(b.xt, b.logits, n_batch, vocab, inner, nullptr, n)) ||
            (y && (rc = ce_transpose(b.yt, b.probs, n_batch, vocab, inner, nullptr, n))))
            return rc;
        x = b.xt;
        y = b.yt;
        d = b.dt;
    }
    rc = kind == CE_PLAIN ? ce_launch_rows<CE_PLAIN>(b, b.targets, target_bytes, n, vocab, ignore_index, x, d, nullptr,
                                                     nullptr)
       : kind == CE_WEIGHTED ? ce_launch_rows<CE_WEIGHTED>(b, b.targets, target_bytes, n, vocab, ignore_index, x, d,
                                                            b.weight, nullptr)
                             : ce_launch_rows<CE_PROBS>(b, nullptr, 0, n, vocab, ignore_index, x, d, b.weight, y);
    if (rc || (inner > 1 && dlogits && (rc = ce_transpose(b.dlogits, b.dt, n_batch, inner, vocab, b.dev, n)))) return rc;
    k_ce_finish<<<1, CE_ONE_BLOCK, 0, MT_STREAM>>>(b.rows, b.flags, n, reduction, b.dev,
                                                   b.loss_on_device ? loss_out : nullptr, b.leaves, st,
                                                   kind != CE_PLAIN);
    if ((rc = mt_rows_launched("cross_entropy finish"))) return rc;
    return ce_finish(&b, st, loss_out, row_loss, dlogits, n, vocab, ignore_index, reduction, inner);
}
