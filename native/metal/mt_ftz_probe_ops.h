/* mt_ftz_probe_ops.h -- the op codes of the float-behaviour probe (mt_ftz_probe.metal, and its
 * host mt_ftz_probe.m, which holds the cases). Plain C and MSL alike. */
#ifndef MT_FTZ_PROBE_OPS_H
#define MT_FTZ_PROBE_OPS_H
#define MT_PROBE_ADD 0
#define MT_PROBE_SUB 1
#define MT_PROBE_MUL 2
#define MT_PROBE_DIV 3
#define MT_PROBE_FMA 4
#define MT_PROBE_SQRT 5
#define MT_PROBE_GT0 6      /* a > 0 (1 or 0) */
#define MT_PROBE_EQ0 7      /* a == 0 (1 or 0) */
#define MT_PROBE_COPY 8
#define MT_PROBE_SELECT 9   /* c > 0.5 ? a : b */
#define MT_PROBE_MAX 10
#define MT_PROBE_MIN 11
#define MT_PROBE_ABS 12
#define MT_PROBE_NEG 13
#define MT_PROBE_TO_INT 14  /* int(a), its bits */
#define MT_PROBE_FLOOR 15
#define MT_PROBE_MULADD 16  /* a * b + c as written: two roundings unless the compiler contracts it */
#define MT_PROBE_OPS 17
#endif
