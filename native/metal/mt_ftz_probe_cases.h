/* mt_ftz_probe_cases.h -- the float-behaviour probe's cases and its report (plain C): what a GPU
 * gives for each case is compared with the identical_ftz rule (native/include/mt_ftz.h, computed
 * here on the CPU) and with IEEE gradual underflow, and the report says which one the GPU follows
 * for each question native/contracts/ftz.md depends on. Used by the Metal host
 * (mt_ftz_probe.m); compiled and run on Linux by tests/test_metal_shim.py with the rule's own
 * results standing in for a GPU's. */
#ifndef MT_FTZ_PROBE_CASES_H
#define MT_FTZ_PROBE_CASES_H
#include <stdint.h>
#include <stdio.h>

typedef struct {
    uint32_t op, a, b, c;      /* MT_PROBE_* and the operands' float32 bits */
    const char *question;      /* what this case asks, in words */
} mt_probe_case;

extern const mt_probe_case mt_probe_cases[];
extern const int mt_probe_count;

uint32_t mt_probe_rule(const mt_probe_case *c);    /* the result's bits under the flush rule */
uint32_t mt_probe_ieee(const mt_probe_case *c);    /* ... under IEEE gradual underflow */

/* The report as JSON: every case (hardware, rule and IEEE bits) and the verdicts; returns the
 * number of cases where the hardware differs from the rule, or -1 when it got a normal-number
 * case wrong under both (a device that computes nothing, e.g. a paravirtual GPU). */
int mt_probe_report(FILE *f, const uint32_t *hardware, uint32_t simd_width, const char *device_name);

#endif
