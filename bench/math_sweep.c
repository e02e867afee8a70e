/* math_sweep.c -- exhaustive check of mt_pinned.h's mt_expf, mt_logf, mt_log1pf, mt_erff,
 * mt_tanhf and mt_one_plus_erff over all 2^32 float32 bit patterns (native/contracts/math.md
 * states the bounds this measures).
 *
 *   gcc -O2 -ffp-contract=off -Inative/include -pthread bench/math_sweep.c -o math_sweep -lm
 *   ./math_sweep [-t THREADS] [-s STEP] [exp] [log] [log1p] [erf] [tanh] [one_plus_erf]   (make math-sweep)
 *
 * Reference: glibc's double exp/log/log1p/erf/tanh of the (exactly converted) input, rounded once to
 * float. glibc documents these double routines within 1 ulp of double (in practice < 0.52
 * ulp), i.e. within 2^-29 of a float ulp, so the rounded double is the correctly rounded
 * float except when the exact value lies within about 2^-29 float ulp of a rounding boundary
 * (a midpoint between floats, or the overflow point). Those inputs are detected -- the float
 * roundings of d - 2^7 ulp(d) and d + 2^7 ulp(d) disagree -- and recomputed with glibc's
 * x87 long double expl/logl/log1pl/erfl/tanhl (64-bit significand, 2^-40 float ulp); an input still
 * ambiguous at 2^5 long double ulps is counted as "unresolved" (none expected).
 * Error in ulps: |y - ref| / ulp(ref), ulp(v) = 2^(max(floor(log2 |v|), -126) - 23),
 * with ref the unrounded reference (double or long double). mt_one_plus_erff (reference erfc(-x))
 * is held to an absolute error where its value is small: its error is counted in ulps of
 * max(|ref|, 1/4) (the routine's "floor"), its pass bound is its own (math.md), and a +0 where
 * the reference is below erfc(4) (past its clamp) is not a special-value failure; a -0, or a 0
 * where the reference is above that, is one.
 * A result is correct when its bits equal the correctly rounded float's bits; every NaN
 * result must be the canonical 0x7fc00000. -STEP > 1 samples every STEP-th pattern (quick
 * runs); the default is the exhaustive sweep.
 */
#include "mt_pinned.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef float (*fn_f)(float);
typedef double (*ref_d)(double);
typedef long double (*ref_ld)(long double);

typedef struct {
    const char *name;
    fn_f f;
    ref_d rd;
    ref_ld rl;
    double ulp_floor; /* errors in ulps of max(|ref|, floor); 0: of |ref| */
    double bound;   /* the pass bound in those ulps; 0: 1 ulp */
    double zero_below; /* floor routines: a 0 result only where the reference is below this, never -0 */
} routine;

static float call_exp(float x) { return mt_expf(x); }
static float call_log(float x) { return mt_logf(x); }
static float call_log1p(float x) { return mt_log1pf(x); }
static float call_erf(float x) { return mt_erff(x); }
static float call_tanh(float x) { return mt_tanhf(x); }
static float call_one_plus_erf(float x) { return mt_one_plus_erff(x); }
static double erfc_neg(double x) { return erfc(-x); }
static long double erfcl_neg(long double x) { return erfcl(-x); }

static const routine ROUTINES[] = {
    {"exp", call_exp, exp, expl, 0, 0, 0},
    {"log", call_log, log, logl, 0, 0, 0},
    {"log1p", call_log1p, log1p, log1pl, 0, 0, 0},
    {"erf", call_erf, erf, erfl, 0, 0, 0},
    {"tanh", call_tanh, tanh, tanhl, 0, 0, 0},
    {"one_plus_erf", call_one_plus_erf, erfc_neg, erfcl_neg, 0.25, 11.21, 1.56e-8},
};
#define N_ROUTINES (sizeof ROUTINES / sizeof ROUTINES[0])

typedef struct {
    uint64_t inputs, correct, wrong, nan_wrong, inf_zero_wrong, via_long_double, unresolved;
    double max_err;
    uint32_t worst;
    float worst_y, worst_ref;
    uint32_t unresolved_in[4];   /* the first few unresolved inputs (check them with mpmath) */
    float unresolved_y[4];
} tally;

static const routine *g_r;
static uint64_t g_step = 1;
static uint64_t g_next_chunk;
#define CHUNK_BITS 22
#define N_CHUNKS (1ull << (32 - CHUNK_BITS))

static uint32_t bits_of(float x) { return mt_f32_bits(x); }

static double ulp_of(long double v) {
    if (v == 0) return ldexp(1.0, -149);
    int e;
    frexpl(v, &e);
    e -= 1;
    if (e < -126) e = -126;
    return ldexp(1.0, e - 23);
}

static void check_one(const routine *r, uint32_t u, tally *t) {
    float x = mt_bits_f32(u);
    float y = r->f(x);
    double d = r->rd((double)x);
    long double ref = d;
    float want = (float)d;
    t->inputs++;
    if (isnan(d)) {
        if (bits_of(y) == MT_MATH_QNAN) t->correct++;
        else { t->wrong++; t->nan_wrong++; }
        return;
    }
    if (isfinite(d) && d != 0.0) {
        double delta = fabs(d) * 0x1p-46;                /* 2^7 double ulps */
        if ((float)(d - delta) != (float)(d + delta)) {  /* near a float rounding boundary */
            long double dl = r->rl((long double)x);
            long double dld = fabsl(dl) * 0x1p-58L;      /* 2^5 long double ulps */
            t->via_long_double++;
            if ((float)(dl - dld) != (float)(dl + dld)) {
                if (t->unresolved < 4) {
                    t->unresolved_in[t->unresolved] = u;
                    t->unresolved_y[t->unresolved] = y;
                }
                t->unresolved++;
            }
            ref = dl;
            want = (float)dl;
        }
    }
    if (r->ulp_floor > 0 && y == 0.0f && (signbit(y) || d > r->zero_below)) t->inf_zero_wrong++;
    if (bits_of(y) == bits_of(want)) {
        t->correct++;
    } else {
        t->wrong++;
        if (isnan(y) || isinf(y) || isinf(want) || (r->ulp_floor == 0 && (y == 0.0f || want == 0.0f))) t->inf_zero_wrong++;
    }
    double err;
    if (isinf(want) || isinf(y) || isnan(y)) {
        err = (bits_of(y) == bits_of(want)) ? 0.0 : INFINITY;
    } else {
        long double scale = fabsl(ref) > r->ulp_floor ? fabsl(ref) : (long double)r->ulp_floor;
        err = (double)(fabsl((long double)y - ref) / ulp_of(scale));
    }
    if (err > t->max_err) {
        t->max_err = err;
        t->worst = u;
        t->worst_y = y;
        t->worst_ref = want;
    }
}

static void *worker(void *arg) {
    tally *t = (tally *)arg;
    for (;;) {
        uint64_t c = __atomic_fetch_add(&g_next_chunk, 1, __ATOMIC_RELAXED);
        if (c >= N_CHUNKS) break;
        uint64_t lo = c << CHUNK_BITS, hi = (c + 1) << CHUNK_BITS;
        uint64_t start = ((lo + g_step - 1) / g_step) * g_step;
        for (uint64_t i = start; i < hi; i += g_step) check_one(g_r, (uint32_t)i, t);
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* Named special values: bits out, exactly. */
typedef struct { const char *what; uint32_t in, out; } special;

static const special SPECIAL_EXP[] = {
    {"exp(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"exp(-sNaN)", 0xff800001u, MT_MATH_QNAN},
    {"exp(+inf)", 0x7f800000u, 0x7f800000u}, {"exp(-inf)", 0xff800000u, 0x00000000u},
    {"exp(+0)", 0x00000000u, 0x3f800000u}, {"exp(-0)", 0x80000000u, 0x3f800000u},
    {"exp(1)", 0x3f800000u, 0x402df854u},
    {"exp(88.72283172607421875) finite", 0x42b17217u, 0x7f7fff84u},
    {"exp(88.72283935546875) overflows", 0x42b17218u, 0x7f800000u},
    {"exp(-87.3365478515625) subnormal", 0xc2aeac50u, 0x007fffe6u},
    {"exp(-103.972076416015625) = 2^-149", 0xc2cff1b4u, 0x00000001u},
    {"exp(-103.97208404541015625) = +0", 0xc2cff1b5u, 0x00000000u},
};
static const special SPECIAL_LOG[] = {
    {"log(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"log(-1)", 0xbf800000u, MT_MATH_QNAN},
    {"log(-inf)", 0xff800000u, MT_MATH_QNAN}, {"log(-2^-149)", 0x80000001u, MT_MATH_QNAN},
    {"log(+0)", 0x00000000u, 0xff800000u}, {"log(-0)", 0x80000000u, 0xff800000u},
    {"log(+inf)", 0x7f800000u, 0x7f800000u}, {"log(1)", 0x3f800000u, 0x00000000u},
    {"log(0.5)", 0x3f000000u, 0xbf317218u},
    {"log(2^-149)", 0x00000001u, 0xc2ce8ed0u}, {"log(FLT_MAX)", 0x7f7fffffu, 0x42b17218u},
};
static const special SPECIAL_LOG1P[] = {
    {"log1p(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"log1p(-2)", 0xc0000000u, MT_MATH_QNAN},
    {"log1p(-inf)", 0xff800000u, MT_MATH_QNAN}, {"log1p(-1)", 0xbf800000u, 0xff800000u},
    {"log1p(+inf)", 0x7f800000u, 0x7f800000u}, {"log1p(+0)", 0x00000000u, 0x00000000u},
    {"log1p(-0)", 0x80000000u, 0x80000000u}, {"log1p(2^-149)", 0x00000001u, 0x00000001u},
    {"log1p(-2^-149)", 0x80000001u, 0x80000001u}, {"log1p(FLT_MAX)", 0x7f7fffffu, 0x42b17218u},
};
static const special SPECIAL_ERF[] = {
    {"erf(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"erf(-sNaN)", 0xff800001u, MT_MATH_QNAN},
    {"erf(+inf)", 0x7f800000u, 0x3f800000u}, {"erf(-inf)", 0xff800000u, 0xbf800000u},
    {"erf(+0)", 0x00000000u, 0x00000000u}, {"erf(-0)", 0x80000000u, 0x80000000u},
    {"erf(2^-149)", 0x00000001u, 0x00000001u}, {"erf(-4 * 2^-149)", 0x80000004u, 0x80000005u},
    {"erf(1)", 0x3f800000u, 0x3f57bb3du}, {"erf(0.6875)", 0x3f300000u, 0x3f2b4922u},
    {"erf(4) = 1 (the clamp)", 0x40800000u, 0x3f800000u}, {"erf(-FLT_MAX)", 0xff7fffffu, 0xbf800000u},
};
static const special SPECIAL_ONE_PLUS_ERF[] = {
    {"one_plus_erf(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"one_plus_erf(-sNaN)", 0xff800001u, MT_MATH_QNAN},
    {"one_plus_erf(+inf)", 0x7f800000u, 0x40000000u}, {"one_plus_erf(-inf)", 0xff800000u, 0x00000000u},
    {"one_plus_erf(+0)", 0x00000000u, 0x3f800000u}, {"one_plus_erf(-0)", 0x80000000u, 0x3f800000u},
    {"one_plus_erf(4) = 2 (the clamp)", 0x40800000u, 0x40000000u},
    {"one_plus_erf(-4) = +0 (the clamp)", 0xc0800000u, 0x00000000u},
    {"one_plus_erf(-FLT_MAX)", 0xff7fffffu, 0x00000000u}, {"one_plus_erf(FLT_MAX)", 0x7f7fffffu, 0x40000000u},
    {"one_plus_erf(-3.99999976), inside the clamp", 0xc07fffffu, 0x3284cd9eu},
    {"one_plus_erf(-3.9)", 0xc079999au, 0x3315cdfbu}, {"one_plus_erf(0.6875)", 0x3f300000u, 0x3fd5a491u},
    {"one_plus_erf(-0.6875)", 0xbf300000u, 0x3ea96dbcu}, {"one_plus_erf(-2)", 0xc0000000u, 0x3b9948bdu},
};
static const special SPECIAL_TANH[] = {
    {"tanh(+qNaN)", 0x7fc00000u, MT_MATH_QNAN}, {"tanh(-sNaN)", 0xff800001u, MT_MATH_QNAN},
    {"tanh(+inf)", 0x7f800000u, 0x3f800000u}, {"tanh(-inf)", 0xff800000u, 0xbf800000u},
    {"tanh(+0)", 0x00000000u, 0x00000000u}, {"tanh(-0)", 0x80000000u, 0x80000000u},
    {"tanh(2^-149)", 0x00000001u, 0x00000001u}, {"tanh(-2^-149)", 0x80000001u, 0x80000001u},
    {"tanh(1)", 0x3f800000u, 0x3f42f7d6u}, {"tanh(0.25)", 0x3e800000u, 0x3e7acbf5u},
    {"tanh(10) = 1 (the clamp)", 0x41200000u, 0x3f800000u}, {"tanh(-FLT_MAX)", 0xff7fffffu, 0xbf800000u},
};

static int check_specials(const routine *r) {
    const special *s;
    size_t n;
    if (!strcmp(r->name, "exp")) { s = SPECIAL_EXP; n = sizeof SPECIAL_EXP / sizeof *s; }
    else if (!strcmp(r->name, "log")) { s = SPECIAL_LOG; n = sizeof SPECIAL_LOG / sizeof *s; }
    else if (!strcmp(r->name, "log1p")) { s = SPECIAL_LOG1P; n = sizeof SPECIAL_LOG1P / sizeof *s; }
    else if (!strcmp(r->name, "erf")) { s = SPECIAL_ERF; n = sizeof SPECIAL_ERF / sizeof *s; }
    else if (!strcmp(r->name, "tanh")) { s = SPECIAL_TANH; n = sizeof SPECIAL_TANH / sizeof *s; }
    else { s = SPECIAL_ONE_PLUS_ERF; n = sizeof SPECIAL_ONE_PLUS_ERF / sizeof *s; }
    int bad = 0;
    for (size_t i = 0; i < n; ++i) {
        uint32_t got = bits_of(r->f(mt_bits_f32(s[i].in)));
        if (got != s[i].out) {
            printf("  SPECIAL FAIL %s: got 0x%08x want 0x%08x\n", s[i].what, got, s[i].out);
            bad++;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    int threads = 2;
    int want[N_ROUTINES] = {0};
    int any = 0;
    for (int i = 1; i < argc; ++i) {
        if (!strcmp(argv[i], "-t") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "-s") && i + 1 < argc) g_step = strtoull(argv[++i], NULL, 0);
        else {
            size_t k;
            for (k = 0; k < N_ROUTINES; ++k)
                if (!strcmp(argv[i], ROUTINES[k].name)) { want[k] = 1; any = 1; break; }
            if (k == N_ROUTINES) {
                fprintf(stderr, "usage: %s [-t THREADS] [-s STEP] [exp] [log] [log1p] [erf] [tanh] [one_plus_erf]\n", argv[0]);
                return 2;
            }
        }
    }
    if (threads < 1) threads = 1;
    if (threads > 64) threads = 64;
    if (g_step < 1) g_step = 1;
    if (!any)
        for (size_t k = 0; k < N_ROUTINES; ++k) want[k] = 1;

    printf("math_sweep: %s, %d threads, reference glibc double (long double near boundaries)\n",
           g_step == 1 ? "all 2^32 float32 inputs" : "sampled inputs", threads);
    printf("| routine | inputs | correctly rounded | not CR | CR fraction | max ulp error | worst input | y / correct | via long double | unresolved | NaN/inf/0 wrong | specials | seconds |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
    int failed = 0;
    for (size_t k = 0; k < N_ROUTINES; ++k) {
        if (!want[k]) continue;
        g_r = &ROUTINES[k];
        g_next_chunk = 0;
        tally parts[64];
        pthread_t tid[64];
        memset(parts, 0, sizeof parts);
        double t0 = now();
        for (int i = 0; i < threads; ++i) pthread_create(&tid[i], NULL, worker, &parts[i]);
        for (int i = 0; i < threads; ++i) pthread_join(tid[i], NULL);
        double secs = now() - t0;
        tally t;
        memset(&t, 0, sizeof t);
        for (int i = 0; i < threads; ++i) {
            tally *p = &parts[i];
            t.inputs += p->inputs; t.correct += p->correct; t.wrong += p->wrong;
            t.nan_wrong += p->nan_wrong; t.inf_zero_wrong += p->inf_zero_wrong;
            t.via_long_double += p->via_long_double; t.unresolved += p->unresolved;
            if (p->max_err > t.max_err || (p->max_err == t.max_err && p->worst < t.worst)) {
                t.max_err = p->max_err; t.worst = p->worst; t.worst_y = p->worst_y; t.worst_ref = p->worst_ref;
            }
        }
        int bad_specials = check_specials(g_r);
        uint32_t un_in[4 * 64];
        float un_y[4 * 64];
        int n_un = 0;
        for (int i = 0; i < threads; ++i)
            for (uint64_t j = 0; j < parts[i].unresolved && j < 4; ++j) {
                un_in[n_un] = parts[i].unresolved_in[j];
                un_y[n_un++] = parts[i].unresolved_y[j];
            }
        printf("| %s | %llu | %llu | %llu | %.7f | %.4f | 0x%08x (%.9g) | %.9g / %.9g | %llu | %llu | %llu | %s | %.1f |\n",
               g_r->name, (unsigned long long)t.inputs, (unsigned long long)t.correct,
               (unsigned long long)t.wrong, (double)t.correct / (double)t.inputs, t.max_err, t.worst,
               mt_bits_f32(t.worst), t.worst_y, t.worst_ref, (unsigned long long)t.via_long_double,
               (unsigned long long)t.unresolved, (unsigned long long)(t.nan_wrong + t.inf_zero_wrong),
               bad_specials ? "FAIL" : "ok", secs);
        for (int i = 0; i < n_un; ++i)
            printf("  %s unresolved (within 2^5 long double ulps of a float rounding boundary): input 0x%08x (%.9g) -> 0x%08x (%.9g), counted by the long double rounding\n",
                   g_r->name, un_in[i], mt_bits_f32(un_in[i]), mt_f32_bits(un_y[i]), un_y[i]);
        fflush(stdout);
        if (bad_specials || t.nan_wrong || t.inf_zero_wrong || !(t.max_err < (g_r->bound > 0 ? g_r->bound : 1.0))) failed = 1;
    }
    printf("%s\n", failed ? "math_sweep: FAILED (special value or error >= its bound)" : "math_sweep: ok (every error within its bound, specials exact)");
    return failed;
}
