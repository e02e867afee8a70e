/* mt_gpu_norm.cu -- RMSNorm and ReLU on the gpu vendor: NOT BUILT YET (placeholder; every entry
 * refuses with MT_EUNSUPPORTED). */
#include "mt_host.h"

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
