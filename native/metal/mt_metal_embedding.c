/* mt_metal_embedding.c -- the embedding forward and backward on Metal (contract:
 * native/contracts/embedding.md; kernels: mt_metal_embedding.metal). The checks and messages are
 * native/common/mt_embedding.h's, in the contract's order: arguments, then the first id outside
 * [0, vocab), then (backward) the first NaN/inf of dy and, accumulating, of dweight, named by
 * position and column; nothing is written before they pass. Ids and the finiteness searches are
 * read on the host through the buffers' host addresses (shared storage); the backward's grouping
 * of positions by row is the oracle's stable counting sort, on the host (integers only); every
 * float32 operation is the kernels'. */
#include <stddef.h>
#include "mt_embedding.h"
#include "mt_host.h"
#include "mt_metal_elementwise.h"

uint64_t mt_embedding_features(void) { return MT_FEATURE_EMBEDDING; }

MT_NOINLINE static int forward_body(float *out, const float *weight, const void *ids, int32_t id_bytes, int64_t n_ids,
                                    int64_t vocab, int64_t dim, uint32_t flags) {
    /* The ids are checked on the host before the gather; MT_MAP_OUT_FRESH changes only a refusal's
     * words (out undefined, as a GPU that checks inside its gather says: one message everywhere) */
    int rc = mt_emb_check_forward(out, weight, ids, id_bytes, n_ids, vocab, dim, flags);
    if (rc || n_ids == 0 || (rc = mt_mtl_open())) return rc;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[4];
    const void *hid = NULL;
    if ((rc = mt_mtl_stage(&call, &args[2], ids, n_ids * id_bytes, MT_MTL_IN, (void **)&hid))) goto done;
    int64_t bad = mt_emb_first_bad_id(hid, id_bytes, n_ids, vocab);
    if (bad >= 0) {
        rc = mt_emb_bad_id(hid, id_bytes, bad, vocab, (flags & MT_MAP_OUT_FRESH) != 0);
        goto done;
    }
    if ((rc = mt_mtl_stage(&call, &args[1], weight, vocab * dim * 4, MT_MTL_IN, NULL)) ||
        (rc = mt_mtl_stage(&call, &args[0], out, n_ids * dim * 4, MT_MTL_OUT, NULL)))
        goto done;
    mt_mtl_emb_params p = {n_ids, vocab, dim, id_bytes, 0, MT_SAB_EMBEDDING, 0};
    rc = mt_mtl_launch_with("mt_k_emb_gather", args, 4, &p, sizeof p, n_ids * dim);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_embedding_forward(float *out, const float *weight, const void *ids, int32_t id_bytes, int64_t n_ids,
                         int64_t vocab, int64_t dim, uint32_t flags) {
    MT_RETURN_IN_FP_ENV(forward_body(out, weight, ids, id_bytes, n_ids, vocab, dim, flags));
}

/* The refusal naming the first NaN/inf of the n floats bound in `x` (host address hx), if any. */
static int refuse_nonfinite(mt_mtl_call *call, const mt_mtl_arg *x, const float *hx, int64_t n, int64_t dim,
                            const char *name) {
    mt_mtl_arg words;
    int bad[2] = {0, 0};
    int rc = n > 0 ? mt_mtl_prepass(call, x, NULL, n, &words, bad) : MT_OK;
    if (rc || !bad[0]) return rc;
    return mt_emb_nonfinite(name, mt_emb_first_nonfinite(hx, n), dim);   /* the error path reads it */
}

MT_NOINLINE static int backward_body(float *dweight, const float *dy, const void *ids, int32_t id_bytes, int64_t n_ids,
                                     int64_t vocab, int64_t dim, int64_t padding_idx, int32_t flags) {
    int rc, plan;
    if ((rc = mt_emb_check_backward(&plan, dweight, dy, ids, id_bytes, n_ids, vocab, dim, padding_idx, flags)) ||
        (rc = mt_mtl_open()))
        return rc;
    const int accumulate = flags & MT_EMB_ACCUMULATE;
    const int64_t pad = padding_idx < 0 ? -1 : padding_idx;
    mt_mtl_call call;
    mt_mtl_begin(&call);
    mt_mtl_arg args[5], ids_arg;
    const void *hid = NULL;
    const float *hdy = NULL, *hdw = NULL;
    int32_t *perm;
    int64_t *row;
    if (n_ids > 0 && (rc = mt_mtl_stage(&call, &ids_arg, ids, n_ids * id_bytes, MT_MTL_IN, (void **)&hid))) goto done;
    int64_t bad = n_ids > 0 ? mt_emb_first_bad_id(hid, id_bytes, n_ids, vocab) : -1;
    if (bad >= 0) {
        rc = mt_emb_bad_id(hid, id_bytes, bad, vocab, 0);
        goto done;
    }
    if ((rc = mt_mtl_stage(&call, &args[1], dy, n_ids * dim * 4, MT_MTL_IN, (void **)&hdy)) ||
        (rc = refuse_nonfinite(&call, &args[1], hdy, n_ids * dim, dim, "dy")) ||
        (rc = mt_mtl_stage(&call, &args[0], dweight, vocab * dim * 4, accumulate ? MT_MTL_INOUT : MT_MTL_OUT,
                           (void **)&hdw)) ||
        (accumulate && (rc = refuse_nonfinite(&call, &args[0], hdw, vocab * dim, dim,
                                              "dweight (the gradient accumulated into)"))) ||
        (rc = mt_mtl_scratch(&call, &args[2], (n_ids ? n_ids : 1) * 4, (void **)&perm)) ||
        (rc = mt_mtl_scratch(&call, &args[3], (vocab + 1) * 8, (void **)&row)))
        goto done;
    /* The stable counting sort: row[v] .. row[v + 1] index perm, ascending positions within a row,
     * padding positions left out (the oracle's, mt_cpu_embedding.c). */
    for (int64_t n = 0; n < n_ids; ++n) {
        int64_t id = mt_emb_id(hid, id_bytes, n);
        if (id != pad) row[id]++;
    }
    int64_t total = 0;
    for (int64_t v = 0; v < vocab; ++v) row[v] = total += row[v];
    row[vocab] = total;
    for (int64_t n = n_ids - 1; n >= 0; --n) {
        int64_t id = mt_emb_id(hid, id_bytes, n);
        if (id != pad) perm[--row[id]] = (int32_t)n;
    }
    mt_mtl_emb_params p = {n_ids, vocab, dim, id_bytes, accumulate, MT_SAB_EMBEDDING, 0};
    rc = mt_mtl_launch_with("mt_k_emb_backward", args, 5, &p, sizeof p, vocab * dim);
done:
    mt_mtl_end(&call, rc == MT_OK);
    return rc;
}

int mt_embedding_backward(float *dweight, const float *dy, const void *ids, int32_t id_bytes, int64_t n_ids,
                          int64_t vocab, int64_t dim, int64_t padding_idx, int32_t accumulate) {
    MT_RETURN_IN_FP_ENV(backward_body(dweight, dy, ids, id_bytes, n_ids, vocab, dim, padding_idx, accumulate));
}
