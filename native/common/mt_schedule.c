/* mt_schedule.c -- exact learning-rate schedules (contract: native/contracts/schedule.md).
 *
 * Host code linked into every vendor's library. Each value is the float32 nearest the exact
 * real value of the schedule (ties to even), the arguments read as exact binary64 numbers.
 * Every step's value is a rational v = (peak*alpha + min*beta) / gamma, or, inside a cosine
 * decay, v = peak*cos^2(theta) + min*sin^2(theta) with theta = pi*a/(2d). A fast estimate with
 * a proven error bound decides whenever its whole error interval lies strictly between two
 * float32 rounding boundaries (RN is monotone, so the exact value rounds the same way);
 * otherwise an exact decision takes over: integer comparisons for rationals, and for the
 * cosine fixed-point ball arithmetic at rising precision, which ends because v is then
 * irrational (Niven's theorem). No libm call for any transcendental function.
 * make SABOTAGE=schedule (MT_SAB_SCHEDULE) rounds warmup values twice.
 */
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include "mt_host.h"
#include "mt_pinned.h"

/* Error-free transformations need every product rounded where it is written: no contraction,
 * whatever the numeric mode's flags. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

uint64_t mt_schedule_features(void) { return MT_FEATURE_SCHEDULE; }

#define MAX_STEPS ((int64_t)1 << 53)          /* warmup_steps, total_steps */
#define MAX_T ((int64_t)1 << 62)              /* the last step asked for */
#define FLT_MAX_D 3.4028234663852886e38       /* the largest float32, exactly */
#define TWO_M150 7.006492321624085e-46        /* 2^-150: at or below it everything rounds to 0 */
#define FIRST_PRECISION 256                   /* fixed-point fraction bits of the first ball pass */
#define LAST_PRECISION 8192

static double pow2d(int e) {                  /* 2^e for -1022 <= e <= 1023 */
    uint64_t u = (uint64_t)(e + 1023) << 52;
    double d;
    memcpy(&d, &u, 8);
    return d;
}

static uint64_t bits_of(double x) {
    uint64_t u;
    memcpy(&u, &x, 8);
    return u;
}

static uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* ==== the step's form ====================================================================== */
typedef struct {
    int cosine;                      /* 0: rational; 1: cos^2 form */
    uint64_t alpha, beta, gamma;     /* v = (peak*alpha + min*beta) / gamma */
    uint64_t a, b, d;                /* theta = pi*a/(2d), a + b = d, 0 < a, b */
} lr_form;

static lr_form rational(uint64_t alpha, uint64_t beta, uint64_t gamma) {
    lr_form f = {0, alpha, beta, gamma, 0, 0, 0};
    return f;
}

static lr_form form_at(int32_t kind, double peak, double min, int64_t w, int64_t total, int64_t t) {
    if (t <= w) return rational((uint64_t)t, 0, (uint64_t)w);       /* warmup: peak * t / w */
    if (kind == MT_SCHEDULE_CONSTANT) return rational(1, 0, 1);
    if (t >= total) return rational(0, 1, 1);                       /* the end and beyond: min */
    uint64_t a = (uint64_t)(t - w), b = (uint64_t)(total - t), d = (uint64_t)(total - w);
    if (kind == MT_SCHEDULE_WARMUP_LINEAR) return rational(b, a, d);
    /* cos^2(pi a / 2d) = (1 + cos(pi a/d)) / 2 is rational only at a/d = 1/3, 1/2, 2/3 */
    if (peak == min) return rational(1, 0, 1);
    if (2 * a == d) return rational(1, 1, 2);
    if (3 * a == d) return rational(3, 1, 4);
    if (3 * a == 2 * d) return rational(1, 3, 4);
    lr_form f = {1, 0, 0, 0, a, b, d};
    return f;
}

/* ==== deciding from an estimate ============================================================
 * hi + lo estimates v (hi >= 2^-300, normal) within margin * hi. The float32 c = RN(hi) is
 * the answer when v lies strictly between the rounding boundaries below and above c; the
 * distances are formed from exact subtractions and two roundings, and margin * 2^2 covers
 * those (see the contract). Returns c's bits, or -1: undecided. */
static double mid_up_d(uint32_t c) {         /* (c + next float up) / 2, exactly */
    uint32_t e = c >> 23, f = c & 0x7fffffu;
    uint32_t mc = e ? (f | 0x800000u) : f;
    int ec = e ? (int)e - 150 : -149;
    return (double)(2 * (uint64_t)mc + 1) * pow2d(ec - 1);
}

static int64_t fast_pick(double hi, double lo, int margin_log2) {
    float c = (float)hi;
    uint32_t cb = f32_bits(c);
    if (cb >= 0x7f800000u) return -1;
    double need = hi * pow2d(margin_log2 + 2);
    double up = (mid_up_d(cb) - hi) - lo;
    if (!(up > need)) return -1;
    if (cb != 0) {
        double dn = (hi - mid_up_d(cb - 1)) + lo;
        if (!(dn > need)) return -1;
    }
    return cb;
}

/* ==== exact comparisons on big integers (32-bit limbs, little-endian) ====================== */
typedef struct {
    const uint32_t *a;
    int na;
    uint64_t k;
    int64_t e;                        /* the term is a * k * 2^e */
} term;

static int limb_bits(uint32_t x) {
    int n = 0;
    while (x) { ++n; x >>= 1; }
    return n;
}

static int big_bits(const uint32_t *a, int na) {
    while (na > 0 && a[na - 1] == 0) --na;
    return na ? 32 * (na - 1) + limb_bits(a[na - 1]) : 0;
}

/* acc += (a * m) << s; acc has room for every limb and carry (the caller sized it). */
static void addmul_shl(uint32_t *acc, int nacc, const uint32_t *a, int na, uint32_t m, int64_t s) {
    if (m == 0) return;
    int q = (int)(s >> 5), r = (int)(s & 31);
    uint64_t mc = 0, ac = 0;
    uint32_t prev = 0;
    int j = q;
    for (int i = 0; i <= na; ++i, ++j) {
        uint32_t p;
        if (i < na) {
            uint64_t t = (uint64_t)a[i] * m + mc;
            p = (uint32_t)t;
            mc = t >> 32;
        } else {
            p = (uint32_t)mc;
        }
        uint32_t sh = r ? (uint32_t)(p << r) | (prev >> (32 - r)) : p;
        prev = p;
        uint64_t t = (uint64_t)acc[j] + sh + ac;
        acc[j] = (uint32_t)t;
        ac = t >> 32;
    }
    if (r) {
        uint64_t t = (uint64_t)acc[j] + (prev >> (32 - r)) + ac;
        acc[j++] = (uint32_t)t;
        ac = t >> 32;
    }
    for (; ac && j < nacc; ++j) {
        uint64_t t = (uint64_t)acc[j] + ac;
        acc[j] = (uint32_t)t;
        ac = t >> 32;
    }
}

static void add_terms(uint32_t *acc, int nacc, const term *ts, int n, int64_t e0) {
    for (int i = 0; i < n; ++i) {
        addmul_shl(acc, nacc, ts[i].a, ts[i].na, (uint32_t)ts[i].k, ts[i].e - e0);
        addmul_shl(acc, nacc, ts[i].a, ts[i].na, (uint32_t)(ts[i].k >> 32), ts[i].e - e0 + 32);
    }
}

/* sign(sum of L - sum of R): -1, 0, 1; -2 when memory runs out. */
static int cmp_terms(const term *L, int nl, const term *R, int nr) {
    int64_t e0 = INT64_MAX, top = 0;
    for (int i = 0; i < nl + nr; ++i) {
        const term *t = i < nl ? &L[i] : &R[i - nl];
        if (t->e < e0) e0 = t->e;
    }
    for (int i = 0; i < nl + nr; ++i) {
        const term *t = i < nl ? &L[i] : &R[i - nl];
        int64_t b = big_bits(t->a, t->na) + 64 + (t->e - e0);
        if (b > top) top = b;
    }
    int n = (int)(top / 32) + 4;
    uint32_t stack[2 * 96], *x = stack;
    if (n > 96 && !(x = (uint32_t *)calloc((size_t)(2 * n), 4))) return -2;
    if (x == stack) memset(stack, 0, (size_t)(2 * n) * 4);
    uint32_t *y = x + n;
    add_terms(x, n, L, nl, e0);
    add_terms(y, n, R, nr, e0);
    int s = 0;
    for (int i = n - 1; i >= 0 && !s; --i) s = x[i] > y[i] ? 1 : x[i] < y[i] ? -1 : 0;
    if (x != stack) free(x);
    return s;
}

/* sign(v - mid_up(c)) where v * g = sum of L. */
static int cmp_mid(const term *L, int nl, uint64_t g, uint32_t c) {
    uint32_t e = c >> 23, f = c & 0x7fffffu;
    uint32_t mid = 2 * (e ? (f | 0x800000u) : f) + 1;
    term r = {&mid, 1, g, (e ? (int64_t)e - 150 : -149) - 1};
    return cmp_terms(L, nl, &r, 1);
}

static uint32_t even_of(uint32_t x, uint32_t y) { return (x & 1) ? y : x; }

/* RN32(v), v * g = sum of L, when RN32(v) is c or a neighbour of c (finite, >= 0): its bits,
 * -1 when it is not, -2 when memory runs out. Exact: ties go to the even neighbour. */
static int64_t exact_pick(const term *L, int nl, uint64_t g, uint32_t c) {
    int s = cmp_mid(L, nl, g, c);
    if (s == -2) return -2;
    if (s == 0) return even_of(c, c + 1);
    if (s > 0) {
        if (c + 1 >= 0x7f800000u) return -1;
        int s2 = cmp_mid(L, nl, g, c + 1);
        return s2 == -2 ? -2 : s2 < 0 ? (int64_t)(c + 1) : s2 == 0 ? (int64_t)even_of(c + 1, c + 2) : -1;
    }
    if (c == 0) return 0;
    s = cmp_mid(L, nl, g, c - 1);
    if (s == -2) return -2;
    if (s > 0) return c;
    if (s == 0) return even_of(c - 1, c);
    if (c == 1) return 0;
    int s2 = cmp_mid(L, nl, g, c - 2);
    return s2 == -2 ? -2 : s2 > 0 ? (int64_t)(c - 1) : s2 == 0 ? (int64_t)even_of(c - 2, c - 1) : -1;
}

/* A binary64 x >= 0 as m * 2^e, m < 2^53 (two limbs). */
typedef struct { uint32_t m[2]; int64_t e; } dyadic;

static dyadic dyadic_of(double x) {
    uint64_t u = bits_of(x), E = (u >> 52) & 0x7ff, F = u & (((uint64_t)1 << 52) - 1);
    dyadic r;
    uint64_t m = E ? F | ((uint64_t)1 << 52) : F;
    r.m[0] = (uint32_t)m;
    r.m[1] = (uint32_t)(m >> 32);
    r.e = E ? (int64_t)E - 1075 : -1074;
    return r;
}

/* ==== rationals: v = (peak*alpha + min*beta) / gamma ======================================== */
static int64_t rational_value(const lr_form *f, double peak, double min, int exact_only) {
    if (f->gamma == 1 && f->beta == 0 && f->alpha == 1) return f32_bits((float)peak);   /* IEEE RN */
    if (f->gamma == 1 && f->alpha == 0 && f->beta == 1) return f32_bits((float)min);
    if (MT_SAB_SCHEDULE && f->beta == 0)        /* sabotage: the warmup rounded twice */
        return f32_bits((float)(peak / (double)f->gamma) * (float)f->alpha);
    /* three roundings of nonnegative numbers, no underflow that matters: error < 2^-51 * v */
    double est = (peak * (double)f->alpha + min * (double)f->beta) / (double)f->gamma;
    int64_t r = exact_only ? -1 : fast_pick(est, 0.0, -50);
    if (r >= 0) return r;
    dyadic p = dyadic_of(peak), m = dyadic_of(min);
    term L[2] = {{p.m, 2, f->alpha, p.e}, {m.m, 2, f->beta, m.e}};
    r = exact_pick(L, 2, f->gamma, f32_bits((float)est));
    return r == -1 ? -3 : r;          /* -1 cannot happen: the estimate is within one step */
}

/* ==== the cosine form, fast: double-word arithmetic ========================================
 * Pairs (h, l) with |l| <= ulp(h)/2, the algorithms of Joldes, Muller and Popescu (ACM TOMS
 * 2017). Products are split exactly by Dekker's TwoProduct (Veltkamp splitting), so no fma
 * call is needed (without -mfma an fma is a library call); exact because contraction is off
 * and |values| < 2^900. u = 2^-53. */
typedef struct { double h, l; } dw;

static dw fast_two_sum(double a, double b) {     /* |a| >= |b| or a == 0: exact */
    dw r;
    r.h = a + b;
    r.l = b - (r.h - a);
    return r;
}

static dw two_sum(double a, double b) {          /* exact */
    dw r;
    r.h = a + b;
    double bb = r.h - a;
    r.l = (a - (r.h - bb)) + (b - bb);
    return r;
}

static dw split(double a) {                      /* a = h + l, each of at most 26 bits */
    double c = 134217729.0 * a;                  /* 2^27 + 1 */
    dw r;
    r.h = c - (c - a);
    r.l = a - r.h;
    return r;
}

static dw two_prod(double a, double b) {         /* a * b = h + l exactly (no underflow) */
    dw x = split(a), y = split(b);
    dw r;
    r.h = a * b;
    r.l = ((x.h * y.h - r.h) + x.h * y.l + x.l * y.h) + x.l * y.l;
    return r;
}

static dw dw_mul(dw x, dw y) {                   /* DWTimesDW1: relative error <= 7u^2 */
    dw c = two_prod(x.h, y.h);
    double tl = x.h * y.l + x.l * y.h;
    return fast_two_sum(c.h, c.l + tl);
}

static dw dw_mul_fp(dw x, double y) {            /* DWTimesFP1: <= 1.5u^2 (+4u^3) */
    dw c = two_prod(x.h, y);
    return fast_two_sum(c.h, c.l + x.l * y);
}

static dw dw_add(dw x, dw y) {                   /* AccurateDWPlusDW: <= 3u^2 */
    dw s = two_sum(x.h, y.h), t = two_sum(x.l, y.l);
    dw v = fast_two_sum(s.h, s.l + t.h);
    return fast_two_sum(v.h, t.l + v.l);
}

#define PI_HI 0x1.921fb54442d18p+1
#define PI_LO 0x1.1a62633145c07p-53
#define DW_TERMS 8          /* terms 0..7 of each series in double-word arithmetic */
#define SERIES_TERMS 14     /* terms 8..14 in double (the last one kept) */

/* (-1)^k / (2k+1)!, the series of sin(x)/x in y = x^2: the nearest double, then (terms 0..7)
 * the nearest double to the rest (tests/test_schedule.py re-derives them). */
static const dw SIN_DW[DW_TERMS] = {
    {0x1.0000000000000p+0, 0x0.0p+0},   /* +1/1! */
    {-0x1.5555555555555p-3, -0x1.5555555555555p-57},   /* -1/3! */
    {0x1.1111111111111p-7, 0x1.1111111111111p-63},   /* +1/5! */
    {-0x1.a01a01a01a01ap-13, -0x1.a01a01a01a01ap-73},   /* -1/7! */
    {0x1.71de3a556c734p-19, -0x1.c154f8ddc6c00p-73},   /* +1/9! */
    {-0x1.ae64567f544e4p-26, 0x1.c062e06d1f209p-80},   /* -1/11! */
    {0x1.6124613a86d09p-33, 0x1.f28e0cc748ebep-87},   /* +1/13! */
    {-0x1.ae7f3e733b81fp-41, -0x1.1d8656b0ee8cbp-97},   /* -1/15! */
};
static const double SIN_TAIL[SERIES_TERMS + 1 - DW_TERMS] = {
    0x1.952c77030ad4ap-49,   /* +1/17! */
    -0x1.2f49b46814157p-57,   /* -1/19! */
    0x1.71b8ef6dcf572p-66,   /* +1/21! */
    -0x1.761b41316381ap-75,   /* -1/23! */
    0x1.3f3ccdd165fa9p-84,   /* +1/25! */
    -0x1.d1ab1c2dccea3p-94,   /* -1/27! */
    0x1.259f98b4358adp-103,   /* +1/29! */
};

/* sin(x)/x = sum over k <= 14 of c_k y^k, y = x^2: terms 8..14 by Horner in double on y.h,
 * then Horner in double-words down to term 0. */
static dw dw_sinc(dw y) {
    int n = SERIES_TERMS - DW_TERMS;
    double q = SIN_TAIL[n];
    for (int k = n - 1; k >= 0; --k) q = q * y.h + SIN_TAIL[k];
    dw p = {q, 0.0};
    for (int k = DW_TERMS - 1; k >= 0; --k) p = dw_add(dw_mul(p, y), SIN_DW[k]);
    return p;
}

/* v * 2^scale as a double-word, relative error < 2^-90 (schedule.md, "the fast bound"):
 * r = m/(2d) <= 1/4, m = min(a, b), y = (pi r)^2; sin^2(pi r) = y S(y)^2 directly (it may be
 * tiny) and cos^2(pi r) = 1 - sin^2(pi r) (at least 1/2, and the larger: no relative loss). */
static dw cos_estimate(const lr_form *f, double peak, double min, int *scale) {
    uint64_t m = f->a <= f->b ? f->a : f->b;
    int k = 1023 - (int)((bits_of(peak) >> 52) & 0x7ff);
    double ps = peak * pow2d(k), ms = min * pow2d(k);
    *scale = k;
    double den = 2.0 * (double)f->d;
    dw r;
    r.h = (double)m / den;
    dw p = two_prod(r.h, den);                   /* m - p.h is exact (Sterbenz), and so is the rest */
    r.l = (((double)m - p.h) - p.l) / den;
    dw pi = {PI_HI, PI_LO};
    dw x = dw_mul(pi, r);
    dw y = dw_mul(x, x);
    dw s = dw_sinc(y);
    dw s2 = dw_mul(y, dw_mul(s, s));
    dw neg = {-s2.h, -s2.l}, one = {1.0, 0.0};
    dw c2 = dw_add(one, neg);
    dw wp = f->a <= f->b ? c2 : s2, wm = f->a <= f->b ? s2 : c2;
    dw v = dw_mul_fp(wp, ps);
    if (min != 0.0) v = dw_add(v, dw_mul_fp(wm, ms));
    return v;
}

/* ==== the cosine form, exact: fixed-point balls ============================================
 * A ball is c * 2^-F with c an unsigned big integer of `n` limbs, plus a radius of r units of
 * 2^-F: the exact value lies in [c - r, c + r]. Every operation below returns a ball that
 * contains the exact result of its operation applied to any points of its argument balls. */
typedef struct { uint32_t *c; uint64_t r; } ball;
typedef struct { int F, q, n; uint32_t *tmp; int failed; } bctx;   /* q = F / 32 limbs */

#define RADIUS_CAP ((uint64_t)1 << 40)

static uint64_t int_part(const bctx *x, const ball *a) {   /* floor(a) + 1 >= a + r (r < 2^F) */
    return (uint64_t)a->c[x->q] + ((uint64_t)a->c[x->q + 1] << 32) + 1;
}

static void ball_check(bctx *x, ball *a) {
    if (a->r > RADIUS_CAP || a->c[x->n - 1] != 0) x->failed = 1;
}

static void ball_mul(bctx *x, ball *out, const ball *a, const ball *b) {
    int n = x->n;
    memset(x->tmp, 0, (size_t)(2 * n) * 4);
    for (int i = 0; i < n; ++i) {
        uint64_t carry = 0;
        for (int j = 0; j < n; ++j) {
            uint64_t t = (uint64_t)a->c[i] * b->c[j] + x->tmp[i + j] + carry;
            x->tmp[i + j] = (uint32_t)t;
            carry = t >> 32;
        }
        x->tmp[i + n] = (uint32_t)carry;
    }
    uint64_t r = a->r * int_part(x, b) + b->r * int_part(x, a) + 2;
    for (int i = 0; i < n; ++i) out->c[i] = x->tmp[i + x->q];
    for (int i = n + x->q; i < 2 * n; ++i) if (x->tmp[i]) x->failed = 1;
    out->r = r;
    ball_check(x, out);
}

static void ball_div(bctx *x, ball *out, const ball *a, uint32_t d) {
    uint64_t rem = 0;
    for (int i = x->n - 1; i >= 0; --i) {
        uint64_t cur = (rem << 32) | a->c[i];
        out->c[i] = (uint32_t)(cur / d);
        rem = cur % d;
    }
    out->r = a->r / d + 2;
}

static void ball_mul_small(bctx *x, ball *out, const ball *a, uint32_t k) {
    uint64_t carry = 0;
    for (int i = 0; i < x->n; ++i) {
        uint64_t t = (uint64_t)a->c[i] * k + carry;
        out->c[i] = (uint32_t)t;
        carry = t >> 32;
    }
    out->r = a->r * k;
    if (carry) x->failed = 1;
    ball_check(x, out);
}

/* out = a + sign * b (sign = 1 or -1); a subtraction must not go below zero. */
static void ball_addsub(bctx *x, ball *out, const ball *a, const ball *b, int sign) {
    int64_t carry = 0;
    for (int i = 0; i < x->n; ++i) {
        int64_t t = (int64_t)a->c[i] + sign * (int64_t)b->c[i] + carry;
        out->c[i] = (uint32_t)t;
        carry = t < 0 ? -1 : t >> 32;
    }
    if (carry) x->failed = 1;
    out->r = a->r + b->r;
    ball_check(x, out);
}

static void ball_set_one(bctx *x, ball *out) {
    memset(out->c, 0, (size_t)x->n * 4);
    out->c[x->q] = 1;
    out->r = 0;
}

static int ball_is_zero(const bctx *x, const ball *a) {
    for (int i = 0; i < x->n; ++i) if (a->c[i]) return 0;
    return 1;
}

/* atan(1/k) = sum (-1)^j / ((2j+1) k^(2j+1)), stopped at the first power whose centre is 0:
 * the rest is an alternating series of falling terms, so it is at most that power (<= its
 * radius). w holds 3 spare balls. */
static void ball_atan_inv(bctx *x, ball *out, uint32_t k, ball *w) {
    ball *p = &w[0], *t = &w[1], *neg = &w[2];
    ball_set_one(x, p);
    ball_div(x, p, p, k);
    memset(out->c, 0, (size_t)x->n * 4);
    memset(neg->c, 0, (size_t)x->n * 4);
    out->r = neg->r = 0;
    for (uint32_t j = 0; !ball_is_zero(x, p) && !x->failed; ++j) {
        ball_div(x, t, p, 2 * j + 1);
        ball_addsub(x, (j & 1) ? neg : out, (j & 1) ? neg : out, t, 1);
        ball_div(x, p, p, k * k);
    }
    ball_addsub(x, out, out, neg, -1);
    out->r += p->r + 1;
}

static void ball_pi(bctx *x, ball *out, ball *w) {      /* Machin: 16 atan(1/5) - 4 atan(1/239) */
    ball *a = &w[3], *b = &w[4];
    ball_atan_inv(x, a, 5, w);
    ball_atan_inv(x, b, 239, w);
    ball_mul_small(x, a, a, 16);
    ball_mul_small(x, b, b, 4);
    ball_addsub(x, out, a, b, -1);
}

/* The smallest K with 1/(2K + 2 + odd)! <= 2^-(F+1), from sum of floor(log2 j) <= log2 n!. */
static int series_terms(int F, int odd) {
    int64_t lg = 0;
    int j = 1;
    while (lg < F + 1) lg += limb_bits((uint32_t)++j) - 1;
    int K = 0;
    while (2 * K + 2 + odd < j) ++K;
    return K;
}

/* C(y) (odd = 0) or S(y) (odd = 1) as in dw_series, K terms, plus the tail bound. */
static void ball_series(bctx *x, ball *out, const ball *y, int odd, ball *t) {
    int K = series_terms(x->F, odd);
    ball_set_one(x, out);
    ball one;
    one.c = t[1].c;
    ball_set_one(x, &one);
    for (int k = K; k >= 1 && !x->failed; --k) {
        uint32_t n = odd ? (uint32_t)(2 * k) * (uint32_t)(2 * k + 1) : (uint32_t)(2 * k - 1) * (uint32_t)(2 * k);
        ball_mul(x, &t[0], y, out);
        ball_div(x, &t[0], &t[0], n);
        ball_addsub(x, out, &one, &t[0], -1);
    }
    out->r += 1;
}

/* c - r (clamped at 0) or c + r, into dst (n + 1 limbs). */
static void ball_end(const bctx *x, uint32_t *dst, const ball *a, int upper) {
    uint64_t carry = a->r;
    int borrow = 0;
    memcpy(dst, a->c, (size_t)x->n * 4);
    dst[x->n] = 0;
    if (upper) {
        for (int i = 0; i <= x->n && carry; ++i) {
            uint64_t t = (uint64_t)dst[i] + (uint32_t)carry;
            dst[i] = (uint32_t)t;
            carry = (carry >> 32) + (t >> 32);
        }
        return;
    }
    uint64_t sub = a->r;
    for (int i = 0; i <= x->n; ++i) {
        int64_t t = (int64_t)dst[i] - (int64_t)(uint32_t)sub - borrow;
        sub >>= 32;
        borrow = t < 0;
        dst[i] = (uint32_t)(t + (borrow ? ((int64_t)1 << 32) : 0));
    }
    if (borrow) memset(dst, 0, (size_t)(x->n + 1) * 4);
}

/* One pass at F fraction bits: the bits, -1 (not decided at this precision), -2 (memory). */
static int64_t cos_exact_pass(const lr_form *f, double peak, double min, uint32_t cand, int F) {
    bctx x = {F, F / 32, F / 32 + 3, NULL, 0};
    int n = x.n, nb = 10;
    uint32_t *mem = (uint32_t *)calloc((size_t)(nb * n + 2 * n + 2 * (n + 1)), 4);
    if (!mem) return -2;
    ball b[10];
    for (int i = 0; i < nb; ++i) b[i].c = mem + i * n, b[i].r = 0;
    x.tmp = mem + nb * n;
    uint32_t *end_p = x.tmp + 2 * n, *end_m = end_p + (n + 1);
    ball *pi = &b[5], *r = &b[6], *y = &b[7], *c = &b[8], *s = &b[9];
    ball_pi(&x, pi, b);
    uint64_t m = f->a <= f->b ? f->a : f->b, den = 2 * f->d, rem = m;
    for (int i = F - 1; i >= 0; --i) {                  /* r = m / (2d): F quotient bits */
        rem <<= 1;
        if (rem >= den) { rem -= den; r->c[i / 32] |= (uint32_t)1 << (i % 32); }
    }
    r->r = 1;
    ball_mul(&x, y, pi, r);
    ball_mul(&x, y, y, y);
    ball_series(&x, c, y, 0, b);
    ball_mul(&x, c, c, c);                              /* cos^2(pi r) */
    ball_series(&x, s, y, 1, b);
    ball_mul(&x, s, s, s);
    ball_mul(&x, s, s, y);                              /* sin^2(pi r) */
    int64_t res = -1;
    if (!x.failed) {
        dyadic p = dyadic_of(peak), q = dyadic_of(min);
        ball *wp = f->a <= f->b ? c : s, *wm = f->a <= f->b ? s : c;
        int64_t got[2];
        for (int up = 0; up < 2; ++up) {
            ball_end(&x, end_p, wp, up);              /* v's lower (up = 0) or upper end */
            ball_end(&x, end_m, wm, up);
            term L[2] = {{end_p, n + 1, ((uint64_t)p.m[1] << 32) | p.m[0], p.e - F},
                         {end_m, n + 1, ((uint64_t)q.m[1] << 32) | q.m[0], q.e - F}};
            got[up] = exact_pick(L, 2, 1, cand);
        }
        if (got[0] == -2 || got[1] == -2) res = -2;
        else if (got[0] >= 0 && got[0] == got[1]) res = got[0];
    }
    free(mem);
    return res;
}

static int64_t cos_value(const lr_form *f, double peak, double min, int exact_only) {
    int scale;
    dw v = cos_estimate(f, peak, min, &scale);
    double hi = v.h * pow2d(-scale), lo = v.l * pow2d(-scale);
    if (!exact_only) {
        int64_t r = fast_pick(hi, lo, -90);
        if (r >= 0) return r;
    }
    uint32_t cand = f32_bits((float)hi);
    for (int F = FIRST_PRECISION; F <= LAST_PRECISION; F *= 2) {
        int64_t r = cos_exact_pass(f, peak, min, cand, F);
        if (r != -1) return r;
    }
    return -4;
}

/* ==== the entry point ====================================================================== */
static int check_args(const float *out, int32_t kind, double peak, double min, int64_t w, int64_t total,
                      int64_t first, int64_t n) {
    if (kind < MT_SCHEDULE_CONSTANT || kind > MT_SCHEDULE_WARMUP_COSINE)
        return mt_fail(MT_EINVAL, "kind must be MT_SCHEDULE_CONSTANT, _WARMUP_LINEAR or _WARMUP_COSINE, got %d",
                       (int)kind);
    if (!(peak >= 0.0 && peak <= FLT_MAX_D))
        return mt_fail(MT_EINVAL, "peak_lr must be finite, >= 0 and at most the largest float32, got %g", peak);
    if (w < 0 || w > MAX_STEPS)
        return mt_fail(MT_EINVAL, "warmup_steps must be in [0, 2^53], got %lld", (long long)w);
    if (kind == MT_SCHEDULE_CONSTANT) {
        if (min != 0.0 || total != 0)
            return mt_fail(MT_EINVAL, "a constant schedule has no min_lr or total_steps: pass 0 for both");
    } else {
        if (!(min >= 0.0 && min <= peak))
            return mt_fail(MT_EINVAL, "min_lr must be in [0, peak_lr] = [0, %g], got %g", peak, min);
        if (total <= w || total > MAX_STEPS)
            return mt_fail(MT_EINVAL, "total_steps must be > warmup_steps (%lld) and at most 2^53, got %lld",
                           (long long)w, (long long)total);
    }
    if (first < 1 || first > MAX_T)
        return mt_fail(MT_EINVAL, "first_step must be in [1, 2^62] (steps are one-based), got %lld",
                       (long long)first);
    if (n < 0 || n > MAX_T - first + 1)
        return mt_fail(MT_EINVAL, "n must be in [0, 2^62 - first_step + 1], got %lld", (long long)n);
    if (n > 0 && !out) return mt_fail(MT_EINVAL, "out is NULL");
    return MT_OK;
}

static int64_t value_at(int32_t kind, double peak, double min, int64_t w, int64_t total, int64_t t,
                        int exact_only) {
    if (peak <= TWO_M150) return 0;                     /* every value is in [0, 2^-150] */
    lr_form f = form_at(kind, peak, min, w, total, t);
    return f.cosine ? cos_value(&f, peak, min, exact_only) : rational_value(&f, peak, min, exact_only);
}

MT_NOINLINE static int lr_values_body(float *out, int32_t kind, double peak, double min, int64_t w,
                                      int64_t total, int64_t first, int64_t n) {
    int rc = check_args(out, kind, peak, min, w, total, first, n);
    if (rc) return rc;
    const char *env = getenv("MOJO_TRAIN_LR_EXACT_ONLY");
    int exact_only = env && env[0] == '1';
    int64_t tail = kind == MT_SCHEDULE_CONSTANT ? w + 1 : total;   /* constant from here on */
    int64_t tail_bits = -1;
    for (int64_t i = 0; i < n; ++i) {
        int64_t t = first + i, v;
        if (t >= tail && tail_bits >= 0) v = tail_bits;
        else v = value_at(kind, peak, min, w, total, t, exact_only);
        if (t >= tail) tail_bits = v;
        if (v < 0) {
            if (v == -2) return mt_fail(MT_ENOMEM, "out of memory in the exact learning-rate decision");
            if (v == -4)
                return mt_fail(MT_EINVAL, "the learning rate of step %lld lies within 2^-%d of a float32 rounding "
                               "boundary; refusing to guess its last bit", (long long)t, LAST_PRECISION - 64);
            return mt_fail(MT_EINVAL, "internal error %lld deciding the learning rate of step %lld", (long long)v,
                           (long long)t);
        }
        uint32_t u = (uint32_t)v;
        memcpy(&out[i], &u, 4);
    }
    return MT_OK;
}

int mt_lr_values(float *out, int32_t kind, double peak_lr, double min_lr, int64_t warmup_steps, int64_t total_steps,
                 int64_t first_step, int64_t n) {
    MT_RETURN_IN_FP_ENV(lr_values_body(out, kind, peak_lr, min_lr, warmup_steps, total_steps, first_step, n));
}
