/* mt_gpu_lm_head.cu -- the chunked LM head (mt_lm_head_loss) on a GPU: the CPU oracle's plan
 * (native/cpu_oracle/mt_cpu_lm_head.c) with the GPU's chain GEMM and cross-entropy.
 *
 * Contract: the bits of linear_forward -> cross_entropy -> linear_backward run separately.
 * Per chunk of rows: logits = the forward GEMM (+ bias) into scratch; mt_cross_entropy on the
 * chunk (device pointers, the whole call's divisor) writes the rows' losses and, in place,
 * dlogits; d_hidden rows = dlogits . weight; the weight and bias gradients continue each
 * token leaf's chain across chunk boundaries (the GEMM's accumulate mode) and every finished
 * leaf joins a stack of complete subtrees, merged left + right as they pair up (the pairwise
 * tree of mt_tree_fold, built on the fly). The leftmost subtree lives in d_weight itself, so
 * the scratch is one chunk of logits plus log2(leaves) partials. The loss is the token rule
 * over the rows' losses, summed on the host by the oracle's own function. A chunk's d_hidden
 * GEMM runs on a second stream beside its weight gradients (lm_side: ordering, not bits).
 */
#include <stdlib.h>
#include <vector>
/* The LM head keeps BK 16 with three stages for every layout (the zigzag order on, as in the
 * header), where the linear backward takes BK 32 with two stages for the output-contiguous
 * layouts: measured on the H200 (bench/results/NOTES.md, sixteenth session), 8192x768x50304 took
 * 41.5-42.2 ms with this tiling and 47.8-48.1 ms with the linear's, though each of its GEMM
 * products alone (bench/gemm_variants.py) is as fast or faster with the linear's; why is not
 * established (not the shared-memory carveout: asking for the largest did not help).
 * Its kernels are this file's own (the header's unnamed namespace); the #error below stops an
 * earlier include of the header (these would be ignored), and a -D of the same names on the
 * command line draws a "redefined" warning and does not reach the LM head. */
#ifdef MT_GPU_GEMM_CUH
#error "mt_gpu_gemm.cuh was included before the LM head's tiling was defined"
#endif
#define MT_GEMM_BK_R 16
#define MT_GEMM_STAGES_R 3
#include "mt_gpu_gemm.cuh"
static_assert(mt_gemm::tiling<2, 2>::BK == 16 && mt_gemm::tiling<2, 2>::STAGES == 3 && mt_gemm::tiling<0, 2>::BK == 16,
              "the LM head's GEMM tiling");

namespace {

#define LM_DEFAULT_CHUNK 2048   /* rows: 412 MB of logits at vocab 50304 */

__global__ void k_pair_add(float *dst, const float *left, const float *right, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = left[i] + right[i];
}

/* acc[j] (fresh: from +0.0) = acc[j] + x[r * cols + j] for r ascending: a leaf's bias chain. */
__global__ void k_col_chain(float *acc, const float *x, int64_t rows, int64_t cols, int fresh) {
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < cols; j += (int64_t)gridDim.x * blockDim.x) {
        float a = fresh ? 0.0f : acc[j];
        for (int64_t r = 0; r < rows; ++r) a = a + x[r * cols + j];
        acc[j] = a;
    }
}

int launched(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

int pair_add(float *dst, const float *left, const float *right, int64_t n) {
    int threads = 256, blocks = mt_gpu_blocks((n + threads - 1) / threads, 1);
    k_pair_add<<<blocks, threads, 0, MT_STREAM>>>(dst, left, right, n);
    return launched("token-tree merge");
}

/* A stack of complete subtrees of leaf partials (n floats each); the bottom one is `root`
 * (the caller's output), the others arena buffers. A leaf is written into next(), then
 * pushed; sabotage (MT_SAB_LM_HEAD) folds right to left at the end instead. */
struct token_stack {
    float *root = nullptr;
    int64_t n = 0;
    mt_arena *arena = nullptr;
    std::vector<float *> slot;      /* slot[d]: the buffer of stack level d (0 = root) */
    std::vector<int64_t> leaves;    /* leaves under each held subtree */
    int reversed = MT_SAB_LM_HEAD;

    int next(float **out) {
        size_t d = leaves.size();
        if (d == 0) { *out = root; return MT_OK; }
        while (slot.size() <= d) slot.push_back(nullptr);
        if (!slot[d]) {
            int rc = arena->alloc((void **)&slot[d], n * 4);
            if (rc) return rc;
        }
        *out = slot[d];
        return MT_OK;
    }
    int push() {
        leaves.push_back(1);
        while (!reversed && leaves.size() >= 2 && leaves[leaves.size() - 1] == leaves[leaves.size() - 2]) {
            size_t top = leaves.size() - 1;
            float *left = top - 1 == 0 ? root : slot[top - 1];
            int rc = pair_add(left, left, slot[top], n);
            if (rc) return rc;
            leaves[top - 1] *= 2;
            leaves.pop_back();
        }
        return MT_OK;
    }
    int finish() {      /* the held subtrees, right to left: s[k] + (s[k+1] + ...) */
        for (size_t d = leaves.size(); d-- > 1;) {
            float *left = d - 1 == 0 ? root : slot[d - 1];
            int rc = pair_add(left, left, slot[d], n);
            if (rc) return rc;
        }
        return MT_OK;
    }
};

struct lm_device {               /* device twins of every buffer, and what to download */
    const float *hidden = nullptr, *weight = nullptr, *bias = nullptr;
    const void *targets = nullptr;
    float *d_hidden = nullptr, *d_weight = nullptr, *d_bias = nullptr, *logits = nullptr, *losses = nullptr;
    int32_t *flags = nullptr;
};

int to_device(lm_device *dv, mt_arena *arena, const mt_lm_args &c) {
    bool st;
    int rc;
    int64_t w = c.width, v = c.vocab, r = c.rows;
    if ((rc = mt_buf_to_device((void **)&dv->hidden, &st, arena, (void *)c.hidden, r * w * 4, true)) ||
        (rc = mt_buf_to_device((void **)&dv->weight, &st, arena, (void *)c.weight, v * w * 4, true)) ||
        (c.bias && (rc = mt_buf_to_device((void **)&dv->bias, &st, arena, (void *)c.bias, v * 4, true))) ||
        (rc = mt_buf_to_device((void **)&dv->targets, &st, arena, (void *)c.targets, r * c.target_bytes, true)) ||
        (c.d_hidden && (rc = mt_buf_to_device((void **)&dv->d_hidden, &st, arena, c.d_hidden, r * w * 4, false))) ||
        (c.d_weight && (rc = mt_buf_to_device((void **)&dv->d_weight, &st, arena, c.d_weight, v * w * 4, false))) ||
        (c.d_bias && (rc = mt_buf_to_device((void **)&dv->d_bias, &st, arena, c.d_bias, v * 4, false))) ||
        (rc = arena->alloc((void **)&dv->logits, c.chunk * v * 4)) ||
        (rc = arena->alloc((void **)&dv->losses, (r > 0 ? r : 1) * 4)) ||
        (rc = arena->alloc((void **)&dv->flags, 8 * 4)))
        return rc;
    return arena->flush();
}

/* Targets (read on the host: rows * 8 bytes at most), then finite inputs (one pre-pass). */
int check_inputs(int64_t *kept, const mt_lm_args &c, const lm_device &dv) {
    std::vector<char> host((size_t)(c.rows * c.target_bytes));
    int rc;
    if (c.rows) {
        MT_GPU_CHECK(gpuMemcpyAsync(host.data(), dv.targets, host.size(), gpuMemcpyDefault, MT_STREAM), "targets");
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "targets");
        if (mt_gpu_is_device(c.targets)) mt_gpu_count_d2h((int64_t)host.size());
    }
    if ((rc = mt_check_targets(kept, host.data(), c.target_bytes, c.rows, c.vocab, c.ignore_index))) return rc;
    MT_GPU_CHECK(gpuMemsetAsync(dv.flags, 0, 8 * 4, MT_STREAM), "flags");
    const float *ptrs[3] = {dv.hidden, dv.weight, dv.bias};
    int64_t counts[3] = {c.rows * c.width, c.vocab * c.width, c.vocab};
    if ((rc = mt_gemm::finite_check(dv.flags, ptrs, counts, 3))) return rc;
    int32_t flags[4];
    MT_GPU_CHECK(gpuMemcpyAsync(flags, dv.flags, sizeof flags, gpuMemcpyDefault, MT_STREAM), "flags");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "finiteness pre-pass");
    const char *names[3] = {"hidden", "weight", "bias"};
    for (int b = 0; b < 3; ++b)
        if (flags[1 + b]) return mt_fail(MT_ENONFINITE, "%s holds NaN or inf; nothing was written", names[b]);
    return MT_OK;
}

/* Weight and bias gradients of chunk rows [r0, r0 + n), leaf by leaf. */
int chunk_gradients(token_stack *dw, token_stack *db, float **dw_leaf, float **db_leaf, const mt_lm_args &c,
                    const lm_device &dv, int64_t r0, int64_t n) {
    int64_t v = c.vocab, w = c.width;
    int rc;
    for (int64_t r = r0; r < r0 + n;) {
        int64_t leaf_end = (r / MT_TOKEN_LEAF + 1) * MT_TOKEN_LEAF, end = leaf_end < r0 + n ? leaf_end : r0 + n;
        bool fresh = r % MT_TOKEN_LEAF == 0, done = end == leaf_end || end == c.rows;
        const float *dl = dv.logits + (r - r0) * v;
        if (dv.d_weight) {
            if (fresh && (rc = dw->next(dw_leaf))) return rc;
            /* A(i = class, p = row), B(j = feature, p = row) */
            mt_gemm::desc d = mt_gemm::make_desc(*dw_leaf, w, {dl, v, mt_gemm::MT_RMAJOR},
                                                 {dv.hidden + r * w, w, mt_gemm::MT_RMAJOR}, v, w, end - r);
            d.accumulate = !fresh;
            if ((rc = mt_gemm::gemm(d)) || (done && (rc = dw->push()))) return rc;
        }
        if (dv.d_bias) {
            if (fresh && (rc = db->next(db_leaf))) return rc;
            int threads = 256, blocks = mt_gpu_blocks((v + threads - 1) / threads, 1);
            k_col_chain<<<blocks, threads, 0, MT_STREAM>>>(*db_leaf, dl, end - r, v, fresh ? 1 : 0);
            if ((rc = launched("bias chain")) || (done && (rc = db->push()))) return rc;
        }
        r = end;
    }
    return MT_OK;
}

/* The calling thread's second stream and its two events. A chunk's d_hidden GEMM has few
 * output tiles and a long contraction (2048 rows x width 768 is 96 tiles of 128 x 128 with
 * K = vocab: under one wave on an H200's 132 SMs), so it runs there while the weight
 * gradients of the same chunk fill the rest of the device; the next chunk's forward GEMM,
 * which overwrites the logits both read, waits for it. Only the order of launches changes,
 * never a chain, so the bits are the same (MOJO_TRAIN_LM_ONE_STREAM=1 keeps everything on
 * the calling thread's stream: an A/B switch). */
struct lm_side {
    gpuStream_t stream = nullptr;
    gpuEvent_t ready = nullptr, done = nullptr;
    ~lm_side() {            /* thread exit; errors after the runtime's teardown are ignored */
        if (ready) gpuEventDestroy(ready);
        if (done) gpuEventDestroy(done);
        if (stream) gpuStreamDestroy(stream);
        gpuGetLastError();
    }
};

/* *out = the thread's side stream, or NULL when switched off. */
int lm_side_get(lm_side **out) {
    static const bool one = getenv("MOJO_TRAIN_LM_ONE_STREAM") && getenv("MOJO_TRAIN_LM_ONE_STREAM")[0] == '1';
    static thread_local lm_side side;
    *out = nullptr;
    if (one) return MT_OK;
    if (!side.stream) MT_GPU_CHECK(gpuStreamCreateWithFlags(&side.stream, gpuStreamNonBlocking), "LM head stream");
    if (!side.ready) MT_GPU_CHECK(gpuEventCreateWithFlags(&side.ready, gpuEventDisableTiming), "LM head event");
    if (!side.done) MT_GPU_CHECK(gpuEventCreateWithFlags(&side.done, gpuEventDisableTiming), "LM head event");
    *out = &side;
    return MT_OK;
}

/* Whatever the side stream was given is joined into the calling thread's stream when the
 * chunk loop ends, on every path: the arena frees its memory in that stream's order. */
struct lm_join {
    lm_side *side = nullptr;
    bool pending = false;
    int wait() {
        if (!pending) return MT_OK;
        MT_GPU_CHECK(gpuStreamWaitEvent(MT_STREAM, side->done, 0), "LM head join");
        pending = false;
        return MT_OK;
    }
    ~lm_join() {
        if (pending && wait() != MT_OK) gpuStreamSynchronize(side->stream);   /* last resort: drain it */
    }
};

/* d_hidden rows of a chunk = dlogits . weight, on the side stream when there is one. */
int chunk_d_hidden(lm_join *join, const lm_device &dv, int64_t r0, int64_t n, int64_t v, int64_t w) {
    mt_gemm::desc h = mt_gemm::make_desc(dv.d_hidden + r0 * w, w, {dv.logits, v, mt_gemm::MT_KMAJOR},
                                         {dv.weight, w, mt_gemm::MT_RMAJOR}, n, w, v);
    if (!join->side) return mt_gemm::gemm(h);
    MT_GPU_CHECK(gpuEventRecord(join->side->ready, MT_STREAM), "LM head fork");
    MT_GPU_CHECK(gpuStreamWaitEvent(join->side->stream, join->side->ready, 0), "LM head fork");
    h.stream = join->side->stream;
    int rc = mt_gemm::gemm(h);
    MT_GPU_CHECK(gpuEventRecord(join->side->done, join->side->stream), "LM head fork");
    join->pending = true;
    return rc;
}

int run_chunks(const mt_lm_args &c, const lm_device &dv, mt_arena *arena, int64_t kept) {
    int64_t v = c.vocab, w = c.width;
    bool grad = dv.d_hidden || dv.d_weight || dv.d_bias;
    token_stack dw, db;
    dw.root = dv.d_weight; dw.n = v * w; dw.arena = arena;
    db.root = dv.d_bias; db.n = v; db.arena = arena;
    float *dw_leaf = nullptr, *db_leaf = nullptr;
    lm_join join;
    int rc;
    if (dv.d_hidden && (rc = lm_side_get(&join.side))) return rc;
    for (int64_t r0 = 0; r0 < c.rows; r0 += c.chunk) {
        int64_t n = c.rows - r0 < c.chunk ? c.rows - r0 : c.chunk;
        mt_gemm::desc f = mt_gemm::make_desc(dv.logits, v, {dv.hidden + r0 * w, w, mt_gemm::MT_KMAJOR},
                                             {dv.weight, w, mt_gemm::MT_KMAJOR}, n, v, w);
        f.bias = dv.bias;
        if ((rc = mt_gemm::gemm(f))) return rc;
        float ignored;
        mt_logits_of_lm_head(r0, dv.bias != nullptr);   /* a non-finite logit: hidden @ weight.T overflowed */
        rc = mt_cross_entropy(&ignored, dv.losses + r0, grad ? dv.logits : nullptr, dv.logits,
                              (const char *)dv.targets + r0 * c.target_bytes, c.target_bytes, n, v, c.ignore_index,
                              c.reduction, c.label_smoothing,
                              c.reduction == MT_REDUCTION_MEAN ? (c.num_items ? c.num_items : kept) : 0);
        mt_logits_of_lm_head(-1, 0);
        if (rc) return rc;
        if (dv.d_hidden && (rc = chunk_d_hidden(&join, dv, r0, n, v, w))) return rc;
        if (grad && (rc = chunk_gradients(&dw, &db, &dw_leaf, &db_leaf, c, dv, r0, n))) return rc;
        if ((rc = join.wait())) return rc;   /* before the next chunk's logits */
    }
    if (dv.d_weight && (rc = dw.finish())) return rc;
    if (dv.d_bias && (rc = db.finish())) return rc;
    return MT_OK;
}

MT_NOINLINE float host_loss(const float *losses, int64_t rows, int32_t reduction, float divisor, float *partials) {
    float total = mt_token_sum(losses, rows, partials);
    if (reduction != MT_REDUCTION_MEAN) return total;
    return divisor == 0.0f ? mt_bits_f32(MT_MATH_QNAN) : total / divisor;
}

/* Losses to the caller: the per-row values, or the token rule's total (mean: / D). */
int finish(const mt_lm_args &c, const lm_device &dv, int64_t kept) {
    std::vector<float> losses((size_t)(c.rows > 0 ? c.rows : 1)), partials((size_t)(mt_token_leaves(c.rows) + 1));
    if (c.rows) MT_GPU_CHECK(gpuMemcpyAsync(losses.data(), dv.losses, c.rows * 4, gpuMemcpyDefault, MT_STREAM), "losses");
    int rc;
    if (c.d_hidden && dv.d_hidden != c.d_hidden && (rc = mt_buf_to_host(c.d_hidden, dv.d_hidden, c.rows * c.width * 4)))
        return rc;
    if (c.d_weight && dv.d_weight != c.d_weight &&
        (rc = mt_buf_to_host(c.d_weight, dv.d_weight, c.vocab * c.width * 4)))
        return rc;
    if (c.d_bias && dv.d_bias != c.d_bias && (rc = mt_buf_to_host(c.d_bias, dv.d_bias, c.vocab * 4))) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "LM head");
    if (c.rows) mt_gpu_count_d2h(c.rows * 4);
    if (c.reduction == MT_REDUCTION_NONE) {
        if (c.rows) MT_GPU_CHECK(gpuMemcpy(c.row_loss, losses.data(), c.rows * 4, gpuMemcpyDefault), "row losses");
        if (c.rows && mt_gpu_is_device(c.row_loss)) mt_gpu_count_h2d(c.rows * 4);
        return MT_OK;
    }
    mt_fp_env env;
    mt_fp_begin(&env);
    float loss = host_loss(losses.data(), c.rows, c.reduction, (float)(c.num_items ? c.num_items : kept),
                           partials.data());
    mt_fp_end(&env);
    if (mt_gpu_is_device(c.loss_out)) {
        MT_GPU_CHECK(gpuMemcpy(c.loss_out, &loss, 4, gpuMemcpyDefault), "loss");
        mt_gpu_count_h2d(4);
    } else {
        *c.loss_out = loss;
    }
    return MT_OK;
}

}  // namespace

uint64_t mt_lm_head_features(void) { return MT_FEATURE_LM_HEAD; }

extern "C" int mt_lm_head_run(mt_lm_args *a) {
    int rc = mt_gpu_ready();
    if (rc) return rc;
    mt_lm_args c = *a;
    const int64_t rows = c.rows, vocab = c.vocab, width = c.width;
    if (!c.chunk) c.chunk = LM_DEFAULT_CHUNK;
    if (c.chunk > rows) c.chunk = rows > 0 ? rows : 1;
    mt_arena arena;
    lm_device dv;
    int64_t kept = 0;
    if ((rc = to_device(&dv, &arena, c)) || (rc = check_inputs(&kept, c, dv)) ||
        (rc = run_chunks(c, dv, &arena, kept)))
        return rc;
    if (rows == 0) {   /* no chains ran: the gradients are zero sums */
        if (dv.d_weight) MT_GPU_CHECK(gpuMemsetAsync(dv.d_weight, 0, vocab * width * 4, MT_STREAM), "zero");
        if (dv.d_bias) MT_GPU_CHECK(gpuMemsetAsync(dv.d_bias, 0, vocab * 4, MT_STREAM), "zero");
    }
    return finish(c, dv, kept);
}
