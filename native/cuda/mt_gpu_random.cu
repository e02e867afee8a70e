/* mt_gpu_random.cu -- normal fills and dropout on the gpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_random_features(void) { return 0; }

int mt_normal_fill(float *out, uint64_t seed, uint64_t stream, uint64_t offset, double mean, double std, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_normal_fill is not built yet on the %s vendor", mt_vendor());
}

int mt_dropout_forward(float *y, const float *x, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_dropout_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_dropout_backward(float *dx, const float *dy, float p, uint64_t seed, uint64_t stream, uint64_t offset, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_dropout_backward is not built yet on the %s vendor", mt_vendor());
}
