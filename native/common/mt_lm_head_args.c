/* mt_lm_head_args.c -- the C ABI's mt_lm_head_loss, one copy for every vendor: the argument
 * checks (mt_check_lm_head_args, mt_host.c) inside the library's floating-point environment,
 * then the vendor's mt_lm_head_run (mt_host.h), as mt_attention_args.c does for attention. A
 * file of its own, so that mt_host.c links without any vendor's LM head (tests/c's emulators). */
#include "mt_host.h"

/* The C ABI's LM head for every vendor: the checks, then the vendor's mt_lm_head_run. */
MT_NOINLINE static int lm_head_body(mt_lm_args *a) {
    int rc = mt_check_lm_head_args(a->loss_out, a->row_loss, a->d_hidden, a->d_weight, a->d_bias, a->hidden,
                                   a->weight, a->bias, a->targets, a->target_bytes, a->rows, a->vocab, a->width,
                                   a->reduction, a->label_smoothing, a->num_items, a->chunk);
    return rc ? rc : mt_lm_head_run(a);
}

int mt_lm_head_loss(float *loss_out, float *row_loss, float *d_hidden, float *d_weight, float *d_bias,
                    const float *hidden, const float *weight, const float *bias, const void *targets,
                    int32_t target_bytes, int64_t rows, int64_t vocab, int64_t width, int64_t ignore_index,
                    int32_t reduction, float label_smoothing, int64_t num_items, int64_t chunk_rows) {
    mt_lm_args a = {loss_out, row_loss, d_hidden, d_weight, d_bias, hidden, weight, bias, targets, target_bytes,
                    reduction, rows, vocab, width, ignore_index, num_items, chunk_rows, label_smoothing};
    MT_RETURN_IN_FP_ENV(lm_head_body(&a));
}
