/* mt_gpu_embedding.cu -- embedding on the gpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_embedding_features(void) { return 0; }

int mt_embedding_forward(float *out, const float *weight, const void *ids, int32_t id_bytes, int64_t n_ids, int64_t vocab, int64_t dim) {
    return mt_fail(MT_EUNSUPPORTED, "mt_embedding_forward is not built yet on the %s vendor", mt_vendor());
}

int mt_embedding_backward(float *dweight, const float *dy, const void *ids, int32_t id_bytes, int64_t n_ids, int64_t vocab, int64_t dim, int64_t padding_idx, int32_t accumulate) {
    return mt_fail(MT_EUNSUPPORTED, "mt_embedding_backward is not built yet on the %s vendor", mt_vendor());
}
