/* mt_gpu_dense.cu -- linear, RMSNorm and ReLU on the gpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_dense_features(void) { return 0; }

int mt_linear_forward(float *out, const float *a, const float *weight, const float *bias, int64_t m, int64_t n, int64_t k) {
    return mt_fail(MT_EUNSUPPORTED, "mt_linear_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_linear_backward(float *da, float *dweight, float *dbias, const float *dc, const float *a, const float *weight, int64_t m, int64_t n, int64_t k) {
    return mt_fail(MT_EUNSUPPORTED, "mt_linear_backward is not built yet on the %s vendor", mt_vendor());
}

int mt_rms_norm_forward(float *y, const float *x, const float *weight, float eps, int64_t rows, int64_t dim) {
    return mt_fail(MT_EUNSUPPORTED, "mt_rms_norm_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_rms_norm_backward(float *dx, float *dweight, const float *dy, const float *x, const float *weight, float eps, int64_t rows, int64_t dim) {
    return mt_fail(MT_EUNSUPPORTED, "mt_rms_norm_backward is not built yet on the %s vendor", mt_vendor());
}

int mt_relu_forward(float *y, const float *x, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_relu_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_relu_backward(float *dx, const float *dy, const float *x, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_relu_backward is not built yet on the %s vendor", mt_vendor());
}
