/* mt_ftz_probe_cases.c -- the cases, the rule's and IEEE's answers, and the report
 * (mt_ftz_probe_cases.h). Compiled as plain IEEE C: no fast math, no contraction. */
#include <string.h>
#include "mt_ftz.h"
#include "mt_ftz_probe_cases.h"
#include "mt_ftz_probe_ops.h"

#define MIN_BITS 0x00800000u       /* FLT_MIN */
#define HALF 0x3f000000u           /* 0.5 */
#define ONE 0x3f800000u
#define TIE 0x1fffffffu            /* 0x1.fffffep-64 (2^-63 - 2^-87): TIE * 2^-63 rounds up to FLT_MIN */
#define P63 0x20000000u            /* 2^-63 */

const mt_probe_case mt_probe_cases[] = {
    {MT_PROBE_ADD, 0x00000001u, 0x00000000u, 0, "inputs: the smallest subnormal + 0.0 (IEEE: it; flushed: 0)"},
    {MT_PROBE_ADD, 0x80000001u, 0x80000000u, 0, "inputs: -smallest subnormal + -0.0 (the flushed input's sign)"},
    {MT_PROBE_MUL, MIN_BITS, HALF, 0, "outputs: FLT_MIN * 0.5 (IEEE: 2^-127; flushed: 0)"},
    {MT_PROBE_MUL, MIN_BITS | 0x80000000u, HALF, 0, "sign: -FLT_MIN * 0.5 (flushed to -0 or +0?)"},
    {MT_PROBE_SUB, MIN_BITS | 1u, MIN_BITS, 0, "outputs: (FLT_MIN + ulp) - FLT_MIN, an exact subnormal difference"},
    {MT_PROBE_SUB, MIN_BITS, MIN_BITS | 1u, 0, "sign: FLT_MIN - (FLT_MIN + ulp), a negative one"},
    {MT_PROBE_MUL, TIE, P63, 0, "tininess: (2^-63 - 2^-87) * 2^-63 rounds up to FLT_MIN (before rounding: 0)"},
    {MT_PROBE_MUL, TIE | 0x80000000u, P63, 0, "tininess and sign: the same product, negative"},
    {MT_PROBE_FMA, TIE, P63, 0x00000000u, "tininess: fma(TIE, 2^-63, 0)"},
    {MT_PROBE_FMA, P63, P63, 0x80000001u, "fma: 2^-126 + (-subnormal c): c read as -0?"},
    {MT_PROBE_FMA, 0x1f800000u, 0x1f800000u, MIN_BITS | 0x80000000u, "fma: 2^-64 * 2^-64 - FLT_MIN, a tiny exact result"},
    {MT_PROBE_DIV, MIN_BITS, 0x40000000u, 0, "division: FLT_MIN / 2 (IEEE: 2^-127)"},
    {MT_PROBE_DIV, 0x00400000u, ONE, 0, "division: subnormal / 1"},
    {MT_PROBE_DIV, ONE, 0x00000001u, 0, "division: 1 / smallest subnormal (IEEE: inf; flushed input: 1/0 = inf)"},
    {MT_PROBE_DIV, 0x3f7ffffeu, 0x7e800000u, 0, "division: a quotient just below FLT_MIN"},
    {MT_PROBE_SQRT, 0x00000004u, 0, 0, "sqrt of a subnormal (IEEE: 2^-73.5; flushed: 0)"},
    {MT_PROBE_SQRT, 0x80000004u, 0, 0, "sqrt of a negative subnormal (IEEE: NaN; flushed: -0)"},
    {MT_PROBE_GT0, 0x00000001u, 0, 0, "comparison: smallest subnormal > 0 (IEEE: 1; flushed: 0)"},
    {MT_PROBE_EQ0, 0x00000001u, 0, 0, "comparison: smallest subnormal == 0 (IEEE: 0; flushed: 1)"},
    {MT_PROBE_COPY, 0x00000005u, 0, 0, "copy: subnormal bits kept?"},
    {MT_PROBE_SELECT, 0x00000005u, ONE, ONE, "select: c > 0.5 ? subnormal : 1 keeps the bits?"},
    {MT_PROBE_MAX, 0x00000005u, 0x00000000u, 0, "fmax(subnormal, 0)"},
    {MT_PROBE_MIN, 0x80000005u, 0x00000000u, 0, "fmin(-subnormal, 0)"},
    {MT_PROBE_MAX, 0x80000000u, 0x00000000u, 0, "fmax(-0, +0) (the rule: +0)"},
    {MT_PROBE_MAX, 0x00000000u, 0x80000000u, 0, "fmax(+0, -0) (the rule: +0)"},
    {MT_PROBE_MIN, 0x00000000u, 0x80000000u, 0, "fmin(+0, -0) (the rule: -0)"},
    {MT_PROBE_ABS, 0x80000005u, 0, 0, "fabs of a negative subnormal"},
    {MT_PROBE_NEG, 0x00000005u, 0, 0, "negation of a subnormal"},
    {MT_PROBE_TO_INT, 0x00000005u, 0, 0, "int(subnormal)"},
    {MT_PROBE_FLOOR, 0x80000005u, 0, 0, "floor of a negative subnormal (IEEE: -1; flushed: -0)"},
    /* contraction: (1 + 2^-12)^2 - (1 + 2^-11) is 0 in two roundings (the product's 2^-24 is a tie
     * to even), 2^-24 when fused: whether `#pragma METAL fp contract(off)` holds */
    {MT_PROBE_MULADD, 0x3f800800u, 0x3f800800u, 0xbf801000u, "contraction: a * b + c as written (two roundings: 0)"},
    /* normal numbers last: a device that gets these wrong computes nothing trustworthy */
    {MT_PROBE_MUL, 0x3fc00000u, 0x40400000u, 0, "normal: 1.5 * 3 (both agree)"},
    {MT_PROBE_DIV, ONE, 0x40400000u, 0, "normal: 1 / 3, correctly rounded?"},
    {MT_PROBE_SQRT, 0x40000000u, 0, 0, "normal: sqrt(2), correctly rounded?"},
    {MT_PROBE_FMA, 0x3f800001u, 0x3f800001u, 0xbf800002u, "normal: fma(1+u, 1+u, -(1+2u)) = u^2, fused?"},
};
const int mt_probe_count = (int)(sizeof mt_probe_cases / sizeof mt_probe_cases[0]);

static float f(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static uint32_t u(float x) { uint32_t v; memcpy(&v, &x, 4); return v; }

uint32_t mt_probe_rule(const mt_probe_case *c) {
    float a = f(c->a), b = f(c->b), cc = f(c->c);
    switch (c->op) {
    case MT_PROBE_ADD: return u(mt_ftz_add(a, b));
    case MT_PROBE_SUB: return u(mt_ftz_sub(a, b));
    case MT_PROBE_MUL: return u(mt_ftz_mul(a, b));
    case MT_PROBE_DIV: return u(mt_ftz_div(a, b));
    case MT_PROBE_FMA: return u(mt_ftz_fma(a, b, cc));
    case MT_PROBE_SQRT: return u(mt_ftz_sqrt(a));
    case MT_PROBE_GT0: return mt_ftz_in(a) > 0.0f;
    case MT_PROBE_EQ0: return mt_ftz_in(a) == 0.0f;
    case MT_PROBE_COPY: return c->a;
    case MT_PROBE_SELECT: return mt_ftz_in(cc) > 0.5f ? c->a : c->b;
    case MT_PROBE_MAX: return u(mt_ftz_max(a, b));
    case MT_PROBE_MIN: return u(mt_ftz_min(a, b));
    case MT_PROBE_ABS: return u(mt_ftz_abs(a));
    case MT_PROBE_NEG: return u(mt_ftz_neg(a));
    case MT_PROBE_TO_INT: return (uint32_t)(int32_t)mt_ftz_in(a);
    case MT_PROBE_FLOOR: return u(mt_ftz_floor(a));
    case MT_PROBE_MULADD: return u(mt_ftz_add(mt_ftz_mul(a, b), cc));
    }
    return 0xffffffffu;
}

uint32_t mt_probe_ieee(const mt_probe_case *c) {
    float a = f(c->a), b = f(c->b), cc = f(c->c);
    switch (c->op) {
    case MT_PROBE_ADD: return u(a + b);
    case MT_PROBE_SUB: return u(a - b);
    case MT_PROBE_MUL: return u(a * b);
    case MT_PROBE_DIV: return u(a / b);
    case MT_PROBE_FMA: return u(fmaf(a, b, cc));
    case MT_PROBE_SQRT: return u(sqrtf(a));
    case MT_PROBE_GT0: return a > 0.0f;
    case MT_PROBE_EQ0: return a == 0.0f;
    case MT_PROBE_COPY: return c->a;
    case MT_PROBE_SELECT: return cc > 0.5f ? c->a : c->b;
    case MT_PROBE_MAX: return u(fmaxf(a, b));
    case MT_PROBE_MIN: return u(fminf(a, b));
    case MT_PROBE_ABS: return c->a & 0x7fffffffu;
    case MT_PROBE_NEG: return c->a ^ 0x80000000u;
    case MT_PROBE_TO_INT: return (uint32_t)(int32_t)a;
    case MT_PROBE_FLOOR: return u(floorf(a));
    case MT_PROBE_MULADD: {
        float p = a * b;   /* a statement of its own: no contraction whatever the flags */
        return u(p + cc);
    }
    }
    return 0xffffffffu;
}

/* Two results agree: the same bits, or both NaN (vendors' NaN bits differ). */
static int same(uint32_t x, uint32_t y) {
    return x == y || ((x & 0x7fffffffu) > 0x7f800000u && (y & 0x7fffffffu) > 0x7f800000u);
}

/* The hardware's answer to case k, as "rule", "ieee", "both" or "neither". */
static const char *follows(const uint32_t *hw, int k) {
    uint32_t r = mt_probe_rule(&mt_probe_cases[k]), i = mt_probe_ieee(&mt_probe_cases[k]);
    if (same(hw[k], r) && same(hw[k], i)) return "both";
    if (same(hw[k], r)) return "rule";
    return same(hw[k], i) ? "ieee" : "neither";
}

static int find(uint32_t op, uint32_t a, uint32_t b) {
    for (int k = 0; k < mt_probe_count; ++k)
        if (mt_probe_cases[k].op == op && mt_probe_cases[k].a == a && mt_probe_cases[k].b == b) return k;
    return -1;
}

int mt_probe_report(FILE *out, const uint32_t *hw, uint32_t simd_width, const char *device_name) {
    int differ = 0, normal_wrong = 0;
    fprintf(out, "{\n  \"device\": \"%s\",\n  \"simd_width\": %u,\n  \"cases\": [\n", device_name, simd_width);
    for (int k = 0; k < mt_probe_count; ++k) {
        const mt_probe_case *c = &mt_probe_cases[k];
        differ += !same(hw[k], mt_probe_rule(c));
        if (strncmp(c->question, "normal:", 7) == 0 && !same(hw[k], mt_probe_ieee(c)) && !same(hw[k], mt_probe_rule(c)))
            normal_wrong += 1;
        fprintf(out, "    {\"question\": \"%s\", \"op\": %u, \"a\": \"%08x\", \"b\": \"%08x\", \"c\": \"%08x\", "
                "\"hardware\": \"%08x\", \"rule\": \"%08x\", \"ieee\": \"%08x\", \"follows\": \"%s\"}%s\n",
                c->question, c->op, c->a, c->b, c->c, hw[k], mt_probe_rule(c), mt_probe_ieee(c), follows(hw, k),
                k + 1 < mt_probe_count ? "," : "");
    }
    int in = find(MT_PROBE_ADD, 0x00000001u, 0), outk = find(MT_PROBE_MUL, MIN_BITS, HALF);
    int neg = find(MT_PROBE_MUL, MIN_BITS | 0x80000000u, HALF), tie = find(MT_PROBE_MUL, TIE, P63);
    fprintf(out, "  ],\n  \"verdicts\": {\n");
    fprintf(out, "    \"subnormal inputs read as zero\": %s,\n", hw[in] == 0 ? "true" : "false");
    fprintf(out, "    \"results below FLT_MIN flushed\": %s,\n", hw[outk] == 0 ? "true" : "false");
    fprintf(out, "    \"tininess\": \"%s\",\n", hw[outk] != 0 ? "no flush" : hw[tie] == 0 ? "before rounding"
            : hw[tie] == MIN_BITS ? "after rounding" : "other");
    fprintf(out, "    \"sign of a flushed negative result\": \"%s\",\n", hw[neg] == 0x80000000u ? "-0" : hw[neg] == 0 ? "+0" : "not flushed");
    int con = find(MT_PROBE_MULADD, 0x3f800800u, 0x3f800800u);
    fprintf(out, "    \"a * b + c contracted (fp contract(off) not honoured)\": %s,\n",
            same(hw[con], mt_probe_ieee(&mt_probe_cases[con])) ? "false" : "true");
    fprintf(out, "    \"normal cases neither rule nor IEEE (the device computed nothing trustworthy)\": %d,\n",
            normal_wrong);
    fprintf(out, "    \"cases that differ from the rule\": %d\n  }\n}\n", differ);
    return normal_wrong ? -1 : differ;
}
