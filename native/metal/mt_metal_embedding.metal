// mt_metal_embedding.metal -- the embedding (contract: native/contracts/embedding.md). Forward: a
// gather of the table's bits. Backward: for every (row v, column j) the token rule over the row's
// terms, given by the host's stable counting sort (positions perm[row[v] .. row[v + 1]) in
// ascending order, padding positions left out): each leaf's partial from +0.0 by additions in
// ascending position, the partials joined by the leaf stack of native/common/mt_embedding.h (the
// pairwise tree over all leaves), then stored, or added to dweight when accumulating.
#include "mt_metal_kernel.h"
#include "mt_embedding.h"

// out[n, j] = weight[ids[n], j], bit for bit (ids already checked by the host).
kernel void mt_k_emb_gather(device uint *out [[buffer(0)]], device const uint *weight [[buffer(1)]],
                            device const uint *ids [[buffer(2)]], constant mt_mtl_emb_params &p [[buffer(3)]],
                            MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.n_ids * p.dim;
    for (int64_t e = i; e < total; e += stride) {
        const int64_t n = e / p.dim, j = e % p.dim;
        out[e] = weight[mt_mtl_index(ids, p.id_bytes, n) * p.dim + j];
    }
}

// dweight[v, j] for every row and column (a thread each).
kernel void mt_k_emb_backward(device float *dweight [[buffer(0)]], device const float *dy [[buffer(1)]],
                              device const int32_t *perm [[buffer(2)]], device const int64_t *row [[buffer(3)]],
                              constant mt_mtl_emb_params &p [[buffer(4)]], MT_ID_GRID(i), MT_ID_GRID_SIZE(stride)) {
    const int64_t total = p.vocab * p.dim;
    for (int64_t t = i; t < total; t += stride) {
        const int64_t v = t / p.dim, j = t % p.dim, k0 = row[v], k1 = row[v + 1];
        if (k0 == k1) {
            if (!p.accumulate) dweight[t] = 0.0f;
            continue;
        }
        float val[MT_EMB_STACK];
        int64_t first[MT_EMB_STACK];
        int depth = 0;
        for (int64_t k = k0; k < k1;) {
            const int64_t leaf = perm[k] / MT_TOKEN_LEAF;
            int64_t e = k + 1;
            while (e < k1 && perm[e] / MT_TOKEN_LEAF == leaf) ++e;
            float acc = 0.0f;
            for (int64_t q = 0; q < e - k; ++q) acc = acc + dy[(int64_t)perm[p.reversed ? e - 1 - q : k + q] * p.dim + j];
            mt_emb_push(val, 1, first, &depth, leaf, &acc);
            k = e;
        }
        const float root = mt_emb_root(val, 0, depth);
        dweight[t] = p.accumulate ? dweight[t] + root : root;
    }
}
