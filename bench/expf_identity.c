/* expf_identity.c -- proof that the branch-free mt_expf of native/include/mt_pinned.h gives
 * the same bits as the branching mt_expf that math v1 was measured with (bench/math_sweep.c,
 * bench/results/math_sweep.md), for all 2^32 float32 inputs, scalar and vectorized.
 *
 *   gcc -O3 -ffp-contract=off -Inative/include -pthread bench/expf_identity.c -o /tmp/expf_identity -lm
 *   /tmp/expf_identity [-t THREADS] [-s STEP]
 *
 * Every input goes through four builds of the current mt_expf: a scalar call (noinline), and
 * a loop of it compiled for the default ISA, x86-64-v3 (AVX2 + FMA) and x86-64-v4 (AVX-512),
 * the ISAs of the CPU oracle's target_clones (mt_cpu.h's MT_SIMD); the v3/v4 loops run where
 * the CPU has them, and the program reports whether gcc vectorized them (it must, or the
 * speed of cross_entropy is lost: build with -fopt-info-vec-optimized to see the loops).
 * The reference is ref_expf_v1 below: the branching mt_expf as committed in 15363ce, copied
 * verbatim (only renamed). Inputs in [MT_EXPF_MID_LO, MT_EXPF_MID_HI] also go through
 * mt_expf_mid (the softmax rows' shortcut), which must give the same bits there; every input
 * also goes through mt_expf_ranged (mt_pinned_elementwise.h: mt_expf_mid inside that range,
 * mt_expf outside, the GPU maps' exp), scalar, on the host; and mt_math_exp_pair's unrounded
 * pair is compared with v1's, and under the identical_ftz flush rule (below). Exit status 0
 * only if every input agrees in every build.
 * -s STEP > 1 checks only the first BLOCK inputs of every STEP-th block (a quick run); the
 * default is the exhaustive one (about 4 minutes on 2 idle cores).
 * Run 2026-11-30 on the 2-core development machine (gcc 12.2, AVX-512), with the branch-free
 * mt_expf of this tree: 4294967296 inputs, 0 differing in each of the four builds.
 * Run 2026-12-01, same machine, with mt_expf on the shared mt_math_exp_pair and mt_expf_mid:
 * 4294967296 inputs, 0 differing in each of the four builds, and mt_expf_mid 0 differing on
 * all 2237464578 inputs of [-86.5, 88] (3.5 minutes).
 * Run 2026-12-02 (sixth session, an Intel Xeon with AVX-512), with mt_expf_ranged added: 4294967296
 * inputs, 0 differing in each of the six builds (11.6 minutes, the machine shared with a build).
 * Run 2026-12-07 (thirty-ninth session) with the pair's halvings folded into fmafs: 4294967296
 * inputs, 0 differing in each of the six builds (6 min 46 s). The pair checks (the unrounded s2,
 * lo and k against v1's steps; v1's and the folded steps under the flush rule's emulation)
 * were added after that run; see the record of their first run in bench/results/NOTES.md.
 * Run 2026-12-07 (fortieth session, an AMD EPYC with AVX-512, gcc 12.2), the program with the
 * pair checks, exhaustive: 4294967296 inputs, 0 differing in each of the six builds; the pair
 * (s2, lo, k) 0 differing on every input; flushed 0 differing on every 61st input and the
 * 100663296 with |x| in [2^-66, 2^-60) (7 min 37 s, the machine shared with an nvcc build).
 */
#include "mt_pinned.h"
#include "mt_ftz.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reference: mt_expf of math v1 at 15363ce, verbatim --------------------------- */
static float ref_expf_v1(float x) {
    const float INV_LN2 = 1.44269502162933349609375f;   /* 0x3fb8aa3b */
    const float SHIFT = 12582912.0f;                   /* 0x4b400000 = 1.5 * 2^23 */
    const float P0 = 0.16666667163372039794921875f;          /* 0x3e2aaaab */
    const float P1 = 0.0416666679084300994873046875f;        /* 0x3d2aaaab */
    const float P2 = 0.008333198726177215576171875f;         /* 0x3c0887f8 */
    const float P3 = 0.001388860284350812435150146484375f;   /* 0x3ab60a6b */
    const float P4 = 0.000199524001800455152988433837890625f; /* 0x39513751 */
    const float P5 = 0.000024987515644170343875885009765625f; /* 0x37d19c48 */
    uint32_t ax = mt_f32_bits(x) & 0x7fffffffu;
    if (ax > 0x7f800000u) return mt_bits_f32(MT_MATH_QNAN);
    if (ax < 0x33000000u) return 1.0f;                             /* |x| < 2^-25 */
    if (x > 88.72283172607421875f) return mt_bits_f32(MT_MATH_PINF); /* 0x42b17217 */
    if (x < -103.972076416015625f) return 0.0f;                    /* 0xc2cff1b4 */
    float kf = fmaf(x, INV_LN2, SHIFT) - SHIFT;      /* round to nearest integer, |k| <= 150 */
    int k = (int)kf;
    float rhi = fmaf(-kf, MT_LN2_HI, x);             /* exact */
    float corr = -kf * MT_LN2_LO;
    float s = 1.0f + rhi;
    float e0 = (1.0f - s) + rhi;                     /* 1 + rhi = s + e0 */
    float r2 = rhi * rhi;
    float r2lo = fmaf(rhi, rhi, -r2);                /* rhi^2 = r2 + r2lo */
    float h = 0.5f * r2;
    float s2 = s + h;
    float e1 = h - (s2 - s);                         /* s + h = s2 + e1 */
    float p = P5;
    p = fmaf(p, rhi, P4);
    p = fmaf(p, rhi, P3);
    p = fmaf(p, rhi, P2);
    p = fmaf(p, rhi, P1);
    p = fmaf(p, rhi, P0);
    float lo = (r2 * rhi) * p + (0.5f * r2lo + (e0 + e1));
    lo = lo + corr * (s2 + lo);
    if (k < -125) {                                  /* subnormal or near: one rounding */
        float sc = mt_math_pow2i(k + 64);
        float m = s2 * sc;                           /* exact */
        float mlo = lo * sc;
        float y = m * mt_math_pow2i(-64);            /* the rounding onto the grid */
        float err = m - y * mt_math_pow2i(64);       /* exact */
        return fmaf(err + mlo, mt_math_pow2i(-64), y);
    }
    float y0 = s2 + lo;
    return (y0 * mt_math_pow2i(k / 2)) * mt_math_pow2i(k - k / 2);   /* both steps normal */
}

/* ---- the pair itself (mt_math_exp_pair: s2, lo and k, which mt_erff and mt_tanhf use
 * unrounded), against math v1's steps 1-2 above, for every input clamped as mt_expf clamps.
 * Since 2026-12-07 the pair folds its halvings into fmafs (h = 0.5 r2 is never formed). The
 * identical_ftz tier runs the same source under the flush rule (native/contracts/ftz.md; the
 * CPU by mt_ftz_ir.py), so the two step sequences are also compared under mt_ftz.h's emulation
 * of each operation: v1's (pair_ftz(x, 0)) against the folded one (pair_ftz(x, 1)), a copy of
 * mt_math_exp_pair's steps -- on a sample of every input and on every float whose half square
 * crosses FLT_MIN (|x| in [2^-66, 2^-60): where the flushes could part). */
typedef struct { float s2, lo; int k; } exp_pair;

static exp_pair ref_exp_pair_v1(float xs) {
    const float INV_LN2 = 1.44269502162933349609375f, SHIFT = 12582912.0f;
    const float P0 = 0.16666667163372039794921875f, P1 = 0.0416666679084300994873046875f,
                P2 = 0.008333198726177215576171875f, P3 = 0.001388860284350812435150146484375f,
                P4 = 0.000199524001800455152988433837890625f, P5 = 0.000024987515644170343875885009765625f;
    float kf = fmaf(xs, INV_LN2, SHIFT) - SHIFT;
    float rhi = fmaf(-kf, MT_LN2_HI, xs), corr = -kf * MT_LN2_LO;
    float s = 1.0f + rhi, e0 = (1.0f - s) + rhi;
    float r2 = rhi * rhi, r2lo = fmaf(rhi, rhi, -r2);
    float h = 0.5f * r2, s2 = s + h, e1 = h - (s2 - s);
    float p = fmaf(fmaf(fmaf(fmaf(fmaf(P5, rhi, P4), rhi, P3), rhi, P2), rhi, P1), rhi, P0);
    float lo = (r2 * rhi) * p + (0.5f * r2lo + (e0 + e1));
    exp_pair r = {s2, lo + corr * (s2 + lo), (int)kf};
    return r;
}

static exp_pair pair_ftz(float xs, int folded) {
    const float INV_LN2 = 1.44269502162933349609375f, SHIFT = 12582912.0f;
    const float P[6] = {0.16666667163372039794921875f, 0.0416666679084300994873046875f,
                        0.008333198726177215576171875f, 0.001388860284350812435150146484375f,
                        0.000199524001800455152988433837890625f, 0.000024987515644170343875885009765625f};
    float kf = mt_ftz_sub(mt_ftz_fma(xs, INV_LN2, SHIFT), SHIFT);
    float rhi = mt_ftz_fma(mt_ftz_neg(kf), MT_LN2_HI, xs), corr = mt_ftz_mul(mt_ftz_neg(kf), MT_LN2_LO);
    float s = mt_ftz_add(1.0f, rhi), e0 = mt_ftz_add(mt_ftz_sub(1.0f, s), rhi);
    float r2 = mt_ftz_mul(rhi, rhi), r2lo = mt_ftz_fma(rhi, rhi, mt_ftz_neg(r2));
    float s2, e1, tail;
    if (folded) {
        s2 = mt_ftz_fma(0.5f, r2, s);
        e1 = mt_ftz_fma(0.5f, r2, mt_ftz_sub(s, s2));
    } else {
        float h = mt_ftz_mul(0.5f, r2);
        s2 = mt_ftz_add(s, h);
        e1 = mt_ftz_sub(h, mt_ftz_sub(s2, s));
    }
    float p = P[5];
    for (int i = 4; i >= 0; --i) p = mt_ftz_fma(p, rhi, P[i]);
    tail = folded ? mt_ftz_fma(0.5f, r2lo, mt_ftz_add(e0, e1)) : mt_ftz_add(mt_ftz_mul(0.5f, r2lo), mt_ftz_add(e0, e1));
    float lo = mt_ftz_add(mt_ftz_mul(mt_ftz_mul(r2, rhi), p), tail);
    exp_pair r = {s2, mt_ftz_add(lo, mt_ftz_mul(corr, mt_ftz_add(s2, lo))), (int)kf};
    return r;
}

static int pair_differs(exp_pair a, exp_pair b) {
    return mt_f32_bits(a.s2) != mt_f32_bits(b.s2) || mt_f32_bits(a.lo) != mt_f32_bits(b.lo) || a.k != b.k;
}

/* mt_expf's clamp (NaN and -inf to -104) */
static float clamp_exp(float x) {
    float xs = x > -104.0f ? x : -104.0f;
    return xs < 89.0f ? xs : 89.0f;
}

static int pair_case(float x) {   /* 1 if the library's pair differs from v1's */
    float xs = clamp_exp(x), kf, lo;
    int k;
    float s2 = mt_math_exp_pair(xs, &kf, &k, &lo);
    exp_pair got = {s2, lo, k};
    return pair_differs(got, ref_exp_pair_v1(xs));
}

static int pair_ftz_case(float x) {   /* 1 if the two sequences part under the flush rule */
    float xs = clamp_exp(x);
    return pair_differs(pair_ftz(xs, 0), pair_ftz(xs, 1));
}

/* ---- the builds under test ------------------------------------------------------------ */
__attribute__((noinline)) static float scalar_expf(float x) { return mt_expf(x); }
__attribute__((noinline)) static float scalar_expf_mid(float x) { return mt_expf_mid(x); }
__attribute__((noinline)) static float scalar_expf_ranged(float x) { return mt_expf_ranged(x); }
static int in_mid(float x) { return x >= MT_EXPF_MID_LO && x <= MT_EXPF_MID_HI; }

#define LOOP_BODY                                   \
    for (int i = 0; i < n; ++i) y[i] = mt_expf(x[i]);

__attribute__((noinline)) static void loop_default(const float *restrict x, float *restrict y, int n) { LOOP_BODY }
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define HAVE_CLONES 1
__attribute__((noinline, target("arch=x86-64-v3"))) static void loop_v3(const float *restrict x, float *restrict y, int n) { LOOP_BODY }
__attribute__((noinline, target("arch=x86-64-v4"))) static void loop_v4(const float *restrict x, float *restrict y, int n) { LOOP_BODY }
#endif

#define BLOCK 4096
#define CHUNK_BITS 24
#define N_CHUNKS (1u << (32 - CHUNK_BITS))

static unsigned g_next;
static uint64_t g_step = 1;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_v3, g_v4;

#define BUILDS 8
#define FTZ_SAMPLE 61   /* the flush check's stride over the inputs (it emulates each operation) */
typedef struct { uint64_t checked, mid, differ[BUILDS]; uint32_t first_bad[BUILDS]; } tally;

static void compare(tally *t, int which, const uint32_t *in, const float *ref, const float *got, int n) {
    for (int i = 0; i < n; ++i)
        if (mt_f32_bits(ref[i]) != mt_f32_bits(got[i])) {
            if (!t->differ[which]) t->first_bad[which] = in[i];
            t->differ[which]++;
        }
}

static void *work(void *arg) {
    tally *t = (tally *)arg;
    static __thread uint32_t in[BLOCK];
    static __thread float x[BLOCK], ref[BLOCK], got[BLOCK];
    for (;;) {
        pthread_mutex_lock(&g_lock);
        unsigned c = g_next++;
        pthread_mutex_unlock(&g_lock);
        if (c >= N_CHUNKS) return NULL;
        for (uint64_t b = (uint64_t)c << CHUNK_BITS; b < ((uint64_t)(c + 1) << CHUNK_BITS); b += BLOCK * g_step) {
            for (int i = 0; i < BLOCK; ++i) {
                in[i] = (uint32_t)(b + i);
                x[i] = mt_bits_f32(in[i]);
                ref[i] = ref_expf_v1(x[i]);
            }
            for (int i = 0; i < BLOCK; ++i) got[i] = scalar_expf(x[i]);
            compare(t, 0, in, ref, got, BLOCK);
            loop_default(x, got, BLOCK);
            compare(t, 1, in, ref, got, BLOCK);
#ifdef HAVE_CLONES
            if (g_v3) { loop_v3(x, got, BLOCK); compare(t, 2, in, ref, got, BLOCK); }
            if (g_v4) { loop_v4(x, got, BLOCK); compare(t, 3, in, ref, got, BLOCK); }
#endif
            for (int i = 0; i < BLOCK; ++i) got[i] = scalar_expf_ranged(x[i]);
            compare(t, 5, in, ref, got, BLOCK);
            int m = 0;                 /* mt_expf_mid on the inputs of its range, packed */
            for (int i = 0; i < BLOCK; ++i)
                if (in_mid(x[i])) { in[m] = in[i]; ref[m] = ref[i]; got[m] = scalar_expf_mid(x[i]); ++m; }
            compare(t, 4, in, ref, got, m);
            t->mid += (uint64_t)m;
            for (int i = 0; i < BLOCK; ++i) {
                uint32_t u = (uint32_t)(b + i);
                float xi = mt_bits_f32(u);
                if (pair_case(xi) && !t->differ[6]++) t->first_bad[6] = u;
                if (u % FTZ_SAMPLE == 0 && pair_ftz_case(xi) && !t->differ[7]++) t->first_bad[7] = u;
            }
            t->checked += BLOCK;
        }
    }
}

int main(int argc, char **argv) {
    int threads = 2;
    for (int i = 1; i < argc; ++i)
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) g_step = strtoull(argv[++i], NULL, 0);
    if (threads < 1 || threads > 256) threads = 2;
#ifdef HAVE_CLONES
    __builtin_cpu_init();
    g_v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    g_v4 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
    /* mt_expf_mid's edges, densely, whatever -s says: 2^16 patterns each side of -86.5,
     * -0, +0 and 88 (the ones inside the range are compared). */
    static const uint32_t edges[4] = {0xc2ad0000u, 0x80000000u, 0x00000000u, 0x42b00000u};
    uint64_t edge_mid = 0, edge_differ = 0;
    uint32_t edge_first = 0;
    for (int e = 0; e < 4; ++e)
        for (int64_t d = -65536; d <= 65536; ++d) {
            int64_t b = (int64_t)edges[e] + d;
            if (b < 0 || b > 0xffffffffll) continue;
            float x = mt_bits_f32((uint32_t)b);
            if (!in_mid(x)) continue;
            ++edge_mid;
            if (mt_f32_bits(ref_expf_v1(x)) != mt_f32_bits(scalar_expf_mid(x)) && !edge_differ++) edge_first = (uint32_t)b;
        }
    /* the flush rule's crossing: every float with |x| in [2^-66, 2^-60), both signs (every
     * STEP-th with -s) */
    uint64_t ftz_dense = 0, ftz_dense_differ = 0;
    uint32_t ftz_dense_first = 0;
    for (uint32_t sign = 0; sign < 2; ++sign)
        for (uint32_t u = (uint32_t)(127 - 66) << 23; u < (uint32_t)(127 - 60) << 23; u += (uint32_t)g_step) {
            uint32_t v = u | sign << 31;
            ++ftz_dense;
            if (pair_ftz_case(mt_bits_f32(v)) && !ftz_dense_differ++) ftz_dense_first = v;
        }
    pthread_t tid[256];
    tally t[256];
    memset(t, 0, sizeof t);
    for (int i = 0; i < threads; ++i) pthread_create(&tid[i], NULL, work, &t[i]);
    uint64_t checked = 0, mid = 0, differ[BUILDS] = {0, 0, 0, 0, 0, 0, 0, 0};
    uint32_t first[BUILDS] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < threads; ++i) {
        pthread_join(tid[i], NULL);
        checked += t[i].checked;
        mid += t[i].mid;
        for (int w = 0; w < BUILDS; ++w) {
            if (t[i].differ[w] && !differ[w]) first[w] = t[i].first_bad[w];
            differ[w] += t[i].differ[w];
        }
    }
    static const char *names[BUILDS] = {"scalar call", "loop, default ISA", "loop, x86-64-v3", "loop, x86-64-v4",
                                        "mt_expf_mid", "mt_expf_ranged", "pair (s2, lo, k)", "pair, flushed"};
    int ran[BUILDS] = {1, 1, g_v3, g_v4, 1, 1, 1, 1}, bad = (g_step <= 1 && checked != (1ull << 32)) || mid == 0;
    printf("expf_identity: %llu inputs%s, %d threads; reference: the branching mt_expf of math v1\n",
           (unsigned long long)checked, g_step > 1 ? " (sampled)" : "", threads);
    printf("  (mt_expf_mid: the %llu inputs in [%g, %g], and %llu around its edges)\n", (unsigned long long)mid,
           (double)MT_EXPF_MID_LO, (double)MT_EXPF_MID_HI, (unsigned long long)edge_mid);
    if (edge_differ) first[4] = edge_first;
    differ[4] += edge_differ;
    if (ftz_dense_differ && !differ[7]) first[7] = ftz_dense_first;
    differ[7] += ftz_dense_differ;
    printf("  (the pair: every input checked; flushed: every %dth of them and %llu with |x| in [2^-66, 2^-60))\n",
           FTZ_SAMPLE, (unsigned long long)ftz_dense);
    for (int w = 0; w < BUILDS; ++w) {
        if (!ran[w]) { printf("  %-20s not run (the CPU lacks the ISA)\n", names[w]); continue; }
        printf("  %-20s %llu differing", names[w], (unsigned long long)differ[w]);
        if (differ[w]) printf(" (first: input 0x%08x)", first[w]);
        printf("\n");
        bad |= differ[w] != 0;
    }
    printf("expf_identity: %s\n", bad ? "FAIL" : "ok (same bits for every input in every build)");
    return bad;
}
