/* mt_cpu_elementwise.c -- SiLU and the residual add on the cpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_elementwise_features(void) { return 0; }

int mt_silu_forward(float *y, const float *x, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_silu_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_silu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_silu_backward is not built yet on the %s vendor", mt_vendor());
}

int mt_add(float *out, const float *a, const float *b, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_add is not built yet on the %s vendor", mt_vendor());
}
