/* mt_cpu_loss.c -- cross-entropy on the cpu vendor: NOT BUILT YET (placeholder; every entry refuses with
 * MT_EUNSUPPORTED and the family's feature bit stays clear). */
#include "mt_host.h"

uint64_t mt_loss_features(void) { return 0; }

int mt_cross_entropy(float *loss_out, float *row_loss, float *dlogits, const float *logits, const void *targets, int32_t target_bytes, int64_t n_rows, int64_t vocab, int64_t ignore_index, int32_t reduction, float label_smoothing, int64_t num_items) {
    return mt_fail(MT_EUNSUPPORTED, "mt_cross_entropy is not built yet on the %s vendor", mt_vendor());
}
