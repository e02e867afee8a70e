/* mt_gpu_accumulate.cu -- gradient accumulation on the gpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_accumulate_features(void) { return 0; }

int mt_accumulate(float *out, const float *const *parts, int32_t n_parts, int64_t n) {
    return mt_fail(MT_EUNSUPPORTED, "mt_accumulate is not built yet on the %s vendor", mt_vendor());
}
