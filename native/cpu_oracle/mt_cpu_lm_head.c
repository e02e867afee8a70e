/* mt_cpu_lm_head.c -- the chunked LM head on the cpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_lm_head_features(void) { return 0; }

int mt_lm_head_loss(float *loss_out, float *row_loss, float *d_hidden, float *d_weight, float *d_bias, const float *hidden, const float *weight, const float *bias, const void *targets, int32_t target_bytes, int64_t rows, int64_t vocab, int64_t width, int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items, int64_t chunk_rows) {
    return mt_fail(MT_EUNSUPPORTED, "mt_lm_head_loss is not built yet on the %s vendor", mt_vendor());
}
