/* mt_gpu_embedding.cu -- the embedding on a GPU (contract: native/contracts/embedding.md).
 *
 * No atomics. Every call: argument checks on the host; staging of host buffers; one check
 * kernel (ids in range, dy and -- accumulating -- dweight finite; the sort plan's keys);
 * kernels that write outputs first read the device status and do nothing after a refusal;
 * one synchronizing status read; the download of staged outputs only on success. The forward
 * on device buffers of a thread that defers refusals (mt_gpu_deferred.h) skips that read.
 *
 * Backward, sort plan: keys id << 32 | position (padding and bad ids get vocab) are sorted
 * (each thread sorts a run of 16, then 8-way merge passes place every key by its ranks in
 * the other runs of its group), so a row's terms lie in ascending order and (row, leaf)
 * segments are runs of keys. Fold kernel: blocks walk the sorted keys (grid-stride), each
 * segment start is folded serially by one block, thread t owning columns t + j * blockDim
 * (j < EMB_COLS); a row with one segment is written at once, otherwise the partial is kept
 * at the segment's sorted index; every segment's end (found by a galloping search) is kept at
 * that index too. Tree kernel: each row of several segments, one block, walking the row's
 * segments by those ends, every thread pushing its columns' partials on the leaf stack of
 * mt_embedding.h. Scan plan:
 * blocks walk the rows, each thread one column, walking every position of every leaf.
 * Columns are independent, so neither the launch geometry nor the plan changes a bit.
 * Scratch (the call's arena): 20 bytes per id for the keys and segment ends and, while 4 T d <= 1 GiB, 4 T d
 * bytes of leaf partials (beyond that, rows of several segments fold them in the tree kernel).
 */
#include <vector>
#ifdef MT_EMB_EMULATE
/* The test build only (never a library build): tests/c/emb_gpu_emulate.cc compiles this file
 * as C++ with that folder on its include path, which provides emb_gpu_emulate.h, and runs each
 * kernel thread by thread (no kernel here cooperates within a block or warp, so that is a valid
 * schedule): the kernels and this host glue are tested where no GPU is present. */
#include "emb_gpu_emulate.h"
#define EMB_LAUNCH(kernel, grid, threads, ...) emu_launch(kernel, grid, threads, __VA_ARGS__)
#else
#include "mt_gpu_deferred.h"
#include "mt_gpu_runtime.h"
#define EMB_LAUNCH(kernel, grid, threads, ...) kernel<<<(grid), (threads), 0, MT_STREAM>>>(__VA_ARGS__)
#endif
#include "mt_pinned.h"
#include "mt_embedding.h"

#define EMB_RUN 16                            /* keys sorted by one thread before merging */
#define EMB_WAYS 8                            /* runs merged by one pass */
#ifndef EMB_PART_CAP
#define EMB_PART_CAP ((int64_t)1 << 30)       /* leaf partials above this: rows fold directly */
#endif

struct emb_status {
    int32_t bad_ids, bad_dy, bad_dw, unused;
};

namespace {

__device__ __forceinline__ bool emb_refused(const emb_status *st) {
    return (st->bad_ids | st->bad_dy | st->bad_dw) != 0;
}

__device__ __forceinline__ int64_t key_row(uint64_t k) { return (int64_t)(k >> 32); }
__device__ __forceinline__ int64_t key_pos(uint64_t k) { return (int64_t)(k & 0xffffffffu); }
__device__ __forceinline__ int64_t key_leaf(uint64_t k) { return key_pos(k) / MT_TOKEN_LEAF; }

__device__ __forceinline__ int64_t grid_thread() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_threads() { return (int64_t)gridDim.x * blockDim.x; }

/* Whether x[0..n) holds a NaN or inf (this thread's share of a grid-stride walk). */
__device__ bool any_nonfinite(const float *x, int64_t n) {
    int64_t t = grid_thread(), stride = grid_threads(), head = 0;
    bool bad = false;
    if (mt_gpu_aligned16(x)) {
        const float4 *x4 = (const float4 *)x;
        for (int64_t i = t; i < n / 4; i += stride) {
            float4 q = x4[i];
            bad |= !(mt_is_finite(q.x) && mt_is_finite(q.y) && mt_is_finite(q.z) && mt_is_finite(q.w));
        }
        head = n / 4 * 4;
    }
    for (int64_t i = head + t; i < n; i += stride) bad |= !mt_is_finite(x[i]);
    return bad;
}

/* The pre-pass. keys (sort plan only): id << 32 | position, or vocab << 32 | position for a
 * padding or out-of-range id, so those sort after every row. Every writer of a flag stores 1. */
__global__ void k_check(const void *ids, int32_t id_bytes, int64_t n, int64_t vocab, int64_t pad, const float *dy,
                        int64_t n_dy, const float *dw, int64_t n_dw, uint64_t *keys, emb_status *st) {
    bool bad = false;
    for (int64_t i = grid_thread(); i < n; i += grid_threads()) {
        int64_t id = mt_emb_id(ids, id_bytes, i);
        bool ok = id >= 0 && id < vocab;
        bad |= !ok;
        if (keys) keys[i] = ((uint64_t)(ok && id != pad ? id : vocab) << 32) | (uint64_t)i;
    }
    if (bad) st->bad_ids = 1;
    if (dy && any_nonfinite(dy, n_dy)) st->bad_dy = 1;
    if (dw && any_nonfinite(dw, n_dw)) st->bad_dw = 1;
}

/* ---- the sort ---- */
__global__ void k_sort_runs(uint64_t *keys, int64_t n) {
    for (int64_t r = grid_thread(); r * EMB_RUN < n; r += grid_threads()) {
        int64_t b = r * EMB_RUN, m = n - b < EMB_RUN ? n - b : EMB_RUN;
        uint64_t a[EMB_RUN];
#pragma unroll
        for (int i = 0; i < EMB_RUN; ++i) a[i] = i < m ? keys[b + i] : ~(uint64_t)0;
#pragma unroll
        for (int i = 1; i < EMB_RUN; ++i)
#pragma unroll
            for (int j = i; j > 0; --j) {
                uint64_t lo = a[j - 1] < a[j] ? a[j - 1] : a[j], hi = a[j - 1] < a[j] ? a[j] : a[j - 1];
                a[j - 1] = lo;
                a[j] = hi;
            }
#pragma unroll
        for (int i = 0; i < EMB_RUN; ++i)
            if (i < m) keys[b + i] = a[i];
    }
}

/* One merge pass: groups of EMB_WAYS runs of length `run` merge; each key goes to its index
 * in its own run plus, for every other run of its group, the number of that run's keys below
 * it (keys are distinct). The searches are independent, so their loads overlap. */
__global__ void k_merge(const uint64_t *in, uint64_t *out, int64_t n, int64_t run) {
    for (int64_t i = grid_thread(); i < n; i += grid_threads()) {
        int64_t r = i / run, group = r / EMB_WAYS * EMB_WAYS, dest = group * run + (i - r * run);
        uint64_t k = in[i];
        for (int64_t q = group; q < group + EMB_WAYS && q * run < n; ++q) {
            if (q == r) continue;
            int64_t lo = q * run, hi = n - lo < run ? n : lo + run;
            while (lo < hi) {
                int64_t mid = lo + (hi - lo) / 2;
                if (in[mid] < k) lo = mid + 1; else hi = mid;
            }
            dest += lo - q * run;
        }
        out[dest] = k;
    }
}

/* The first index in [b, e) whose key is >= k (sorted keys). */
__device__ __forceinline__ int64_t lower_bound(const uint64_t *keys, int64_t b, int64_t e, uint64_t k) {
    while (b < e) {
        int64_t mid = b + (e - b) / 2;
        if (keys[mid] < k) b = mid + 1; else e = mid;
    }
    return b;
}

/* The end of the (row, leaf) segment starting at sorted index i: the first key at or past
 * (row, first position of the next leaf) -- a later leaf of the row or a later row -- found by
 * galloping from i + 1 (probes at i + 1, i + 2, i + 4, ..., then a binary search), within
 * i + MT_TOKEN_LEAF (a leaf's positions are distinct). Most segments are one key: one probe;
 * a walk key by key cost a dependent load a key (the most frequent row's ~1,000 keys). */
__device__ __forceinline__ int64_t segment_end(const uint64_t *keys, int64_t i, int64_t n) {
    const uint64_t k = keys[i];
    const uint64_t bound = ((uint64_t)key_row(k) << 32) + (uint64_t)(key_leaf(k) + 1) * MT_TOKEN_LEAF;
    const int64_t limit = n - i < MT_TOKEN_LEAF ? n : i + MT_TOKEN_LEAF;   /* the segment ends by here */
    int64_t lo = i + 1, step = 1;   /* every key in [i, lo) is below bound */
    while (lo < limit && keys[lo] < bound) {
        const int64_t next = lo + step < limit ? lo + step : limit;
        if (next == limit || keys[next] >= bound) return lower_bound(keys, lo + 1, next, bound);
        lo = next + 1;
        step *= 2;
    }
    return lo;
}

/* A thread's columns: c0 + j * blockDim.x for j < EMB_COLS (those < d are real). */
#define EMB_COLS 4

/* One leaf's partials of the thread's columns: +0.0, then + dy over the segment's positions
 * in ascending order (descending in the sabotage build). The columns' loads are independent,
 * and four positions' loads are issued before their additions. */
__device__ void fold_segment(float x[EMB_COLS], const uint64_t *keys, int64_t b, int64_t e, const float *dy, int64_t d,
                             int64_t c0) {
    int64_t step = blockDim.x, len = e - b, q = 0;
#pragma unroll
    for (int j = 0; j < EMB_COLS; ++j) x[j] = 0.0f;
    for (; q + 4 <= len; q += 4) {
        float y[4][EMB_COLS];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const float *row = dy + key_pos(keys[MT_SAB_EMBEDDING ? e - 1 - q - u : b + q + u]) * d;
#pragma unroll
            for (int j = 0; j < EMB_COLS; ++j) y[u][j] = c0 + j * step < d ? row[c0 + j * step] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
#pragma unroll
            for (int j = 0; j < EMB_COLS; ++j) x[j] = x[j] + y[u][j];
    }
    for (; q < len; ++q) {
        const float *row = dy + key_pos(keys[MT_SAB_EMBEDDING ? e - 1 - q : b + q]) * d;
#pragma unroll
        for (int j = 0; j < EMB_COLS; ++j) x[j] = x[j] + (c0 + j * step < d ? row[c0 + j * step] : 0.0f);
    }
}

/* dst = x (overwrite) or dst + x (accumulate) for the thread's columns below d. */
__device__ __forceinline__ void store_cols(float *dst, const float x[EMB_COLS], int64_t d, int64_t c0, int32_t acc) {
#pragma unroll
    for (int j = 0; j < EMB_COLS; ++j) {
        int64_t c = c0 + j * (int64_t)blockDim.x;
        if (c < d) dst[c] = acc ? dst[c] + x[j] : x[j];
    }
}

/* The column groups of a block: group g covers EMB_COLS * blockDim.x columns. */
#define EMB_FOR_GROUPS(c0, d)                                                                  \
    for (int64_t g_ = blockIdx.y, c0 = g_ * EMB_COLS * blockDim.x + threadIdx.x;              \
         g_ * EMB_COLS * blockDim.x < (d); g_ += gridDim.y, c0 = g_ * EMB_COLS * blockDim.x + threadIdx.x)

/* +0.0 into all of dweight (overwriting; the rows with terms are written again later). */
__global__ void k_zero(float *dw, int64_t n, const emb_status *st) {
    if (emb_refused(st)) return;
    int64_t head = 0;
    if (mt_gpu_aligned16(dw)) {
        float4 *d4 = (float4 *)dw;
        for (int64_t i = grid_thread(); i < n / 4; i += grid_threads()) d4[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        head = n / 4 * 4;
    }
    for (int64_t i = head + grid_thread(); i < n; i += grid_threads()) dw[i] = 0.0f;
}

/* Every (row, leaf) segment, one block each: a row of one segment is stored; otherwise (with
 * part) the partial is kept at part[i * d + c], i the segment's first sorted index. Every
 * segment's end goes to ends[i] for k_tree. */
__global__ void k_fold(const uint64_t *keys, int64_t n, int64_t vocab, const float *dy, int64_t d, float *dw,
                       float *part, uint32_t *ends, int32_t acc, const emb_status *st) {
    if (emb_refused(st)) return;
    EMB_FOR_GROUPS(c0, d) {
        for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
            uint64_t k = keys[i];
            int64_t v = key_row(k);
            if (v >= vocab) break;                       /* padding and bad ids sort last */
            bool row_start = i == 0 || key_row(keys[i - 1]) != v;
            if (!row_start && key_leaf(keys[i - 1]) == key_leaf(k)) continue;   /* not a segment start */
            int64_t e = segment_end(keys, i, n);
            if (c0 == 0) ends[i] = (uint32_t)e;          /* one writer: the first column group's thread 0 */
            bool single = row_start && (e == n || key_row(keys[e]) != v);
            if (!single && !part) continue;
            float x[EMB_COLS];
            fold_segment(x, keys, i, e, dy, d, c0);
            store_cols(single ? dw + v * d : part + i * d, x, d, c0, single ? acc : 0);
        }
    }
}

/* Rows of several segments, one block each: the leaf stack over their partials (or, without
 * part, over segments folded here), the segments walked by the ends k_fold wrote. */
__global__ void k_tree(const uint64_t *keys, int64_t n, int64_t vocab, const float *dy, int64_t d, float *dw,
                       const float *part, const uint32_t *ends, int32_t acc, const emb_status *st) {
    if (emb_refused(st)) return;
    EMB_FOR_GROUPS(c0, d) {
        for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
            uint64_t k = keys[i];
            int64_t v = key_row(k);
            if (v >= vocab) break;
            if (i > 0 && key_row(keys[i - 1]) == v) continue;          /* rows, by their first key */
            const int64_t e0 = ends[i];
            if (e0 == n || key_row(keys[e0]) != v) continue;           /* one segment: k_fold's */
            float val[EMB_COLS * MT_EMB_STACK], x[EMB_COLS];
            int64_t first[MT_EMB_STACK];
            int depth = 0;
            for (int64_t s = i; s < n && key_row(keys[s]) == v;) {
                int64_t e = ends[s];
                if (part) {
#pragma unroll
                    for (int j = 0; j < EMB_COLS; ++j) {
                        int64_t c = c0 + j * (int64_t)blockDim.x;
                        x[j] = c < d ? part[s * d + c] : 0.0f;
                    }
                } else {
                    fold_segment(x, keys, s, e, dy, d, c0);
                }
                mt_emb_push(val, EMB_COLS, first, &depth, key_leaf(keys[s]), x);
                s = e;
            }
#pragma unroll
            for (int j = 0; j < EMB_COLS; ++j) x[j] = mt_emb_root(val, j, depth);
            store_cols(dw + v * d, x, d, c0, acc);
        }
    }
}

/* The scan plan: row v walks every leaf, one thread per column; a leaf holding a term of v
 * is pushed on the stack. */
__global__ void k_scan(const void *ids, int32_t id_bytes, int64_t n, int64_t vocab, int64_t pad, const float *dy,
                       int64_t d, float *dw, int32_t acc, const emb_status *st) {
    if (emb_refused(st)) return;
    int64_t leaves = mt_token_leaves(n);
    for (int64_t c = blockIdx.y * (int64_t)blockDim.x + threadIdx.x; c < d; c += (int64_t)gridDim.y * blockDim.x) {
        for (int64_t v = blockIdx.x; v < vocab; v += gridDim.x) {
            float val[MT_EMB_STACK];
            int64_t first[MT_EMB_STACK];
            int depth = 0;
            for (int64_t leaf = 0; leaf < leaves && v != pad; ++leaf) {
                int64_t lo = leaf * MT_TOKEN_LEAF, hi = n - lo < MT_TOKEN_LEAF ? n : lo + MT_TOKEN_LEAF;
                float x = 0.0f;
                bool any = false;
                for (int64_t q = 0; q < hi - lo; ++q) {
                    int64_t p = MT_SAB_EMBEDDING ? hi - 1 - q : lo + q;
                    if (mt_emb_id(ids, id_bytes, p) != v) continue;
                    x = x + dy[p * d + c];
                    any = true;
                }
                if (any) mt_emb_push(val, 1, first, &depth, leaf, &x);
            }
            float *dst = dw + v * d + c;
            if (depth) *dst = acc ? *dst + mt_emb_root(val, 0, depth) : mt_emb_root(val, 0, depth);
            else if (!acc) *dst = 0.0f;
        }
    }
}

/* Words one lane of the gather holds at once: a batch's loads are all issued before its stores. */
#define EMB_GATHER_BATCH 8

/* One row's copy by one warp: lane l moves words l, l + 32, l + 64, ..., a batch at a time.
 * W: uint32_t, or uint4 where the table and the output are 16-byte aligned and a row is a
 * whole number of them (every bit is copied either way). */
template <class W>
__device__ __forceinline__ void gather_row(W *__restrict__ dst, const W *__restrict__ src, int64_t words, int lane) {
    for (int64_t base = lane; base < words; base += 32 * EMB_GATHER_BATCH) {
        W v[EMB_GATHER_BATCH];
#pragma unroll
        for (int j = 0; j < EMB_GATHER_BATCH; ++j)
            if (base + 32 * j < words) v[j] = src[base + 32 * j];
#pragma unroll
        for (int j = 0; j < EMB_GATHER_BATCH; ++j)
            if (base + 32 * j < words) dst[base + 32 * j] = v[j];
    }
}

/* The forward: a warp per row (grid-stride over rows; blockDim a multiple of 32), the row's
 * words copied by gather_row.
 * Checked (fused_bad NULL): k_check has set st's words; after a refusal nothing is copied.
 * Deferred (slot_bad, slot_at and poison set as well: mt_gpu_deferred.h), a refusal is written
 * to the slot -- the first refused position and its id, found by one thread (a refusal's cost
 * only), then the flag -- and raises the poison word; nothing is copied after an earlier
 * deferred call's refusal either.
 * Fused (fused_bad set; an output that is no caller data): each warp checks its row's id; an
 * id outside [0, vocab) sets *fused_bad and leaves its row unwritten, the others are copied. */
template <class W>
__global__ void k_gather(W *out, const W *w, const void *ids, int32_t id_bytes, int64_t n, int64_t words,
                         const emb_status *st, int64_t vocab, int32_t *slot_bad, int64_t *slot_at, int32_t *poison,
                         int32_t *fused_bad) {
    if (!fused_bad) {
        if (slot_bad && st->bad_ids && blockIdx.x == 0 && threadIdx.x == 0) {
            int64_t i = 0, id = 0;
            for (; i < n; ++i)
                if ((id = mt_emb_id(ids, id_bytes, i)) < 0 || id >= vocab) break;
            slot_at[0] = i;
            slot_at[1] = id;
            *slot_bad = 1;
            *poison = 1;
        }
        if (emb_refused(st) || (poison && *poison)) return;
    }
    const int lane = (int)(threadIdx.x & 31u);
    const int64_t warps = (int64_t)gridDim.x * (blockDim.x >> 5);
    for (int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); r < n; r += warps) {
        int64_t id = mt_emb_id(ids, id_bytes, r);
        if (fused_bad && (id < 0 || id >= vocab)) {
            if (lane == 0) *fused_bad = 1;
            continue;
        }
        gather_row(out + r * words, w + id * words, words, lane);
    }
}

/* ---- host glue ---- */
int launch_check(const char *what) {
    MT_GPU_CHECK(gpuGetLastError(), what);
    return MT_OK;
}

/* A grid of (items, column groups of `width` columns) within the launch geometry's budget;
 * each: a block for every EMB_EACH items and column group (mt_gpu_blocks_each), for k_fold and
 * k_tree, whose blocks walk keys in turn: a long segment then holds up the few keys of its own
 * block, not the ~8 that the budget of 16 blocks an SM queued behind it at T = 16,384, while
 * blocks stay few enough that their launches cost little (bench/results/NOTES.md, a model). */
#define EMB_EACH 4
dim3 grid2(int64_t items, int64_t dim, int64_t width, int threads, bool each = false) {
    int64_t cols = (dim + width - 1) / width;
    int64_t total = each ? mt_gpu_blocks_each((items + EMB_EACH - 1) / EMB_EACH * cols, 1) : mt_gpu_blocks(items, 1);
    int64_t y = cols < total ? cols : total;
    if (y > 65535) y = 65535;
    int64_t x = total / y > 0 ? total / y : 1;
    mt_gpu_record_launch(threads, (int)(x * y));
    return dim3((unsigned)x, (unsigned)y);
}

int grid1(int64_t items, int threads) {
    int blocks = mt_gpu_blocks(items, threads);
    mt_gpu_record_launch(threads, blocks);
    return blocks;
}

/* The device address of a caller's buffer (staged through the arena when on the host; a
 * buffer of 0 bytes is NULL). */
int stage(void **dev, bool *staged, mt_arena *arena, const void *p, int64_t bytes, bool upload) {
    *dev = nullptr;
    *staged = false;
    if (bytes == 0) return MT_OK;
    return mt_buf_to_device(dev, staged, arena, const_cast<void *>(p), bytes, upload);
}

/* p's bytes on the host (p itself, or a download into buf): for the refusal messages. */
int host_copy(std::vector<char> *buf, const void **out, const void *p, int64_t bytes) {
    *out = p;
    if (!mt_gpu_is_device(p)) return MT_OK;
    buf->resize((size_t)bytes);
    MT_GPU_CHECK(gpuMemcpy(buf->data(), p, (size_t)bytes, gpuMemcpyDefault), "download for the error message");
    *out = buf->data();
    return MT_OK;
}

/* The refusal of ids holding a value outside [0, vocab): the oracle's message, naming the first
 * (fresh: the forward's output was declared fresh, mt_emb_bad_id). */
int refuse_ids(const void *ids, int32_t id_bytes, int64_t n, int64_t vocab, int fresh = 0) {
    std::vector<char> buf;
    const void *h = nullptr;
    int rc = host_copy(&buf, &h, ids, n * id_bytes);
    if (rc) return rc;
    int64_t bad = mt_emb_first_bad_id(h, id_bytes, n, vocab);
    return bad >= 0 ? mt_emb_bad_id(h, id_bytes, bad, vocab, fresh) : mt_fail(MT_EINVAL, "ids hold a value outside [0, vocab)");
}

/* The status after the call's kernels; on a refusal, the same message as the CPU oracle. */
int finish(const emb_status *dev_st, const void *ids, int32_t id_bytes, int64_t n, int64_t vocab, const float *dy,
           const float *dw, int64_t dim, int fresh = 0) {
    emb_status st;
    MT_GPU_CHECK(gpuMemcpyAsync(&st, dev_st, sizeof st, gpuMemcpyDefault, MT_STREAM), "status download");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "embedding");
    mt_gpu_count_d2h(sizeof st);
    std::vector<char> buf;
    const void *h = nullptr;
    int rc;
    int64_t bad = -1;
    if (st.bad_ids) return refuse_ids(ids, id_bytes, n, vocab, fresh);
    if (st.bad_dy || st.bad_dw) {
        const float *x = st.bad_dy ? dy : dw;
        int64_t count = st.bad_dy ? n * dim : vocab * dim;
        if ((rc = host_copy(&buf, &h, x, count * 4))) return rc;
        bad = mt_emb_first_nonfinite((const float *)h, count);
        return mt_emb_nonfinite(st.bad_dy ? "dy" : "dweight (the gradient accumulated into)", bad < 0 ? 0 : bad, dim);
    }
    return MT_OK;
}

int new_status(emb_status **st, mt_arena *arena) {
    int rc = arena->alloc((void **)st, sizeof(emb_status));
    if (rc) return rc;
    MT_GPU_CHECK(gpuMemsetAsync(*st, 0, sizeof(emb_status), MT_STREAM), "status reset");
    return MT_OK;
}

/* The sort plan's kernels after the check: sort, (zero), fold, tree. */
int sorted_backward(mt_arena *arena, uint64_t *keys, int64_t n, int64_t vocab, const float *dy, int64_t dim,
                    float *dw, int32_t acc, const emb_status *st) {
    int threads = mt_gpu_threads(), rc;
    uint64_t *other = nullptr;
    uint32_t *ends = nullptr;   /* each segment's end, at its first sorted index (k_fold -> k_tree) */
    float *part = nullptr;
    if ((rc = arena->alloc((void **)&other, n * 8)) || (rc = arena->alloc((void **)&ends, n * 4))) return rc;
    if (n * dim * 4 <= EMB_PART_CAP && (rc = arena->alloc((void **)&part, n * dim * 4))) return rc;
    EMB_LAUNCH(k_sort_runs, grid1((n + EMB_RUN - 1) / EMB_RUN, threads), threads, keys, n);
    if ((rc = launch_check("embedding sort"))) return rc;
    for (int64_t run = EMB_RUN; run < n; run *= EMB_WAYS) {
        EMB_LAUNCH(k_merge, grid1(n, threads), threads, keys, other, n, run);
        if ((rc = launch_check("embedding merge"))) return rc;
        uint64_t *t = keys;
        keys = other;
        other = t;
    }
    if (!acc) {
        EMB_LAUNCH(k_zero, grid1(vocab * dim / 4 + 1, threads), threads, dw, vocab * dim, st);
        if ((rc = launch_check("embedding zero"))) return rc;
    }
    EMB_LAUNCH(k_fold, grid2(n, dim, EMB_COLS * threads, threads, true), threads, keys, n, vocab, dy, dim, dw, part,
               ends, acc, st);
    if ((rc = launch_check("embedding fold"))) return rc;
    EMB_LAUNCH(k_tree, grid2(n, dim, EMB_COLS * threads, threads, true), threads, keys, n, vocab, dy, dim, dw, part,
               ends, acc, st);
    return launch_check("embedding tree");
}

}  // namespace

extern "C" {

uint64_t mt_embedding_features(void) { return MT_FEATURE_EMBEDDING; }

int mt_embedding_forward(float *out, const float *weight, const void *ids, int32_t id_bytes, int64_t n_ids,
                         int64_t vocab, int64_t dim, uint32_t flags) {
    int rc = mt_emb_check_forward(out, weight, ids, id_bytes, n_ids, vocab, dim, flags);
    if (rc) return rc;
    if (n_ids == 0) return MT_OK;
    if ((rc = mt_gpu_ready_deferring())) return rc;
    mt_arena arena;
    emb_status *st = nullptr;
    void *dids, *dw, *dout;
    bool s_ids, s_w, s_out;
    if ((rc = stage(&dids, &s_ids, &arena, ids, n_ids * id_bytes, true)) ||
        (rc = stage(&dw, &s_w, &arena, weight, vocab * dim * 4, true)) ||
        (rc = stage(&dout, &s_out, &arena, out, n_ids * dim * 4, false)))
        return rc;
    /* Deferred (mt_gpu_deferred.h) when the thread defers and nothing is staged. Else fused
     * when the output is no caller data (declared fresh, or a host output's device twin): the
     * gather checks the ids itself, into the thread's mapped status word where there is one
     * (no reset or download on the stream), else into the device status. */
    bool defer = mt_deferred_on() && !s_ids && !s_w && !s_out;
    const int fresh_flag = (flags & MT_MAP_OUT_FRESH) != 0;
    bool fused = !defer && (s_out || fresh_flag);
    mt_status *mapped = fused ? mt_mapped_status() : nullptr;
    mt_deferred_slot *slot = nullptr;
    int32_t *poison = nullptr, *fused_bad = nullptr;
    if ((!mapped && (rc = new_status(&st, &arena))) || (!defer && (rc = mt_deferred_flush())) ||
        (defer && (rc = mt_deferred_take(&slot, &poison, MT_DEFER_EMBEDDING, "mt_embedding_forward", "ids", "weight",
                                          vocab))))
        return rc;
    int threads = mt_gpu_threads();
    if (mapped) {
        mapped->bad_params = 0;                          /* pinned host memory */
        fused_bad = &mapped->bad_params;
    } else if (fused) {
        fused_bad = &st->bad_ids;
    } else {
        EMB_LAUNCH(k_check, grid1(n_ids, threads), threads, dids, id_bytes, n_ids, vocab, -1, nullptr, 0, nullptr, 0,
                   nullptr, st);
        if ((rc = launch_check("embedding check"))) return rc;
    }
    int gather_blocks = grid1(n_ids * 32, threads);    /* a warp a row */
    int32_t *slot_bad = slot ? &slot->st.bad_params : nullptr;
    int64_t *slot_at = slot ? &slot->where : nullptr;
    if (dim % 4 == 0 && mt_gpu_aligned16(dout) && mt_gpu_aligned16(dw))
        EMB_LAUNCH(k_gather<uint4>, gather_blocks, threads, (uint4 *)dout, (const uint4 *)dw, dids, id_bytes, n_ids,
                   dim / 4, st, vocab, slot_bad, slot_at, poison, fused_bad);
    else
        EMB_LAUNCH(k_gather<uint32_t>, gather_blocks, threads, (uint32_t *)dout, (const uint32_t *)dw, dids, id_bytes,
                   n_ids, dim, st, vocab, slot_bad, slot_at, poison, fused_bad);
    if ((rc = launch_check("embedding gather"))) return rc;
    if (defer) return MT_OK;
    if (mapped) {
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "embedding");
        if (mapped->bad_params) return refuse_ids(ids, id_bytes, n_ids, vocab, fresh_flag);
    } else if ((rc = finish(st, ids, id_bytes, n_ids, vocab, nullptr, nullptr, dim, fresh_flag))) {
        return rc;
    }
    if (s_out) {
        if ((rc = mt_buf_to_host(out, dout, n_ids * dim * 4))) return rc;
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    }
    return MT_OK;
}

int mt_embedding_backward(float *dweight, const float *dy, const void *ids, int32_t id_bytes, int64_t n_ids,
                          int64_t vocab, int64_t dim, int64_t padding_idx, int32_t accumulate) {
    int rc, plan = MT_EMB_PLAN_SORT;
    if ((rc = mt_emb_check_backward(&plan, dweight, dy, ids, id_bytes, n_ids, vocab, dim, padding_idx, accumulate)) ||
        (rc = mt_gpu_ready()))
        return rc;
    int32_t acc = accumulate & MT_EMB_ACCUMULATE;
    int64_t pad = padding_idx < 0 ? -1 : padding_idx;
    mt_arena arena;
    emb_status *st = nullptr;
    void *dids, *ddy, *ddw;
    uint64_t *keys = nullptr;
    bool s_ids, s_dy, s_dw;
    bool sort = plan == MT_EMB_PLAN_SORT && n_ids > 0;
    if ((rc = new_status(&st, &arena)) || (rc = stage(&dids, &s_ids, &arena, ids, n_ids * id_bytes, true)) ||
        (rc = stage(&ddy, &s_dy, &arena, dy, n_ids * dim * 4, true)) ||
        (rc = stage(&ddw, &s_dw, &arena, dweight, vocab * dim * 4, acc != 0)) ||
        (sort && (rc = arena.alloc((void **)&keys, n_ids * 8))))
        return rc;
    int threads = mt_gpu_threads();
    int64_t work = acc && vocab > n_ids ? vocab * dim : n_ids * dim;     /* floats the pre-pass reads */
    EMB_LAUNCH(k_check, grid1(work / 4 + 1, threads), threads, dids, id_bytes, n_ids, vocab, pad, (const float *)ddy,
               n_ids * dim, acc ? (const float *)ddw : nullptr, vocab * dim, keys, st);
    if ((rc = launch_check("embedding check"))) return rc;
    if (sort)
        rc = sorted_backward(&arena, keys, n_ids, vocab, (const float *)ddy, dim, (float *)ddw, acc, st);
    else {
        EMB_LAUNCH(k_scan, grid2(vocab, dim, threads, threads), threads, dids, id_bytes, n_ids, vocab, pad,
                   (const float *)ddy, dim, (float *)ddw, acc, st);
        rc = launch_check("embedding scan");
    }
    if (rc || (rc = finish(st, ids, id_bytes, n_ids, vocab, dy, dweight, dim))) return rc;
    if (s_dw) {
        if ((rc = mt_buf_to_host(dweight, ddw, vocab * dim * 4))) return rc;
        MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "download");
    }
    return MT_OK;
}

}  /* extern "C" */
