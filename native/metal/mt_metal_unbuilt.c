/* mt_metal_unbuilt.c -- the ops the Metal library does not have yet (issue 17): each refuses with
 * MT_EUNSUPPORTED naming itself (Python: NotImplementedError), writes nothing, and its family's
 * feature bit is 0, so callers and tests see from mt_features() what this library lacks. A family
 * leaves this file when its kernels are written. */
#include "mt_attention_args.h"
#include "mt_host.h"

#define MT_UNBUILT(name) \
    mt_fail(MT_EUNSUPPORTED, "%s is not built into the Metal library yet (mt_features() says which ops are)", name)

uint64_t mt_attention_features(void) { return 0; }
uint64_t mt_lm_head_features(void) { return 0; }

int mt_attention_run(const mt_attn_args *a, int backward) {
    return MT_UNBUILT(backward ? "mt_attention_backward" : "mt_attention_forward");
}

int mt_lm_head_loss(float *loss_out, float *row_loss, float *d_hidden, float *d_weight, float *d_bias,
                    const float *hidden, const float *weight, const float *bias, const void *targets,
                    int32_t target_bytes, int64_t rows, int64_t vocab, int64_t width, int64_t ignore_index,
                    int32_t reduction, float label_smoothing, int64_t num_items, int64_t chunk_rows) {
    return MT_UNBUILT("mt_lm_head_loss");
}

