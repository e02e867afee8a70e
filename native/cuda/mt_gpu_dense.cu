/* mt_gpu_dense.cu -- linear (the GEMMs) on the gpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_dense_features(void) { return 0; }

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m, int64_t n, int64_t k) {
    return mt_fail(MT_EUNSUPPORTED, "mt_linear_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a, const float *weight, int64_t m, int64_t n, int64_t k) {
    return mt_fail(MT_EUNSUPPORTED, "mt_linear_backward is not built yet on the %s vendor", mt_vendor());
}