/* mt_gpu_optim.cuh -- what the optimizer steps (mt_gpu_optim.cu) share with clip_grad_norm_
 * (mt_gpu_clip.cu): the tile walk of a tensor list, the device status test, and the host glue
 * of a step (stage, finish). The optim family owns it; clip includes it because its scale pass
 * walks tiles as the steps do and it reports through the same status. Every piece of arithmetic
 * comes from mt_pinned.h; this only decides which thread computes which element, and no result
 * depends on that choice.
 *
 * Element kernels walk the flat registry in tiles of MT_UNROLL * blockDim elements; a tile's
 * first tensor is found by binary search on the offsets, later ones by stepping.
 */
#ifndef MT_GPU_OPTIM_CUH
#define MT_GPU_OPTIM_CUH

#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

#define MT_UNROLL 4

/* Tiles: tensor j owns tiles tstart[j] .. tstart[j+1]-1 of MT_TILE_OF(blockDim) elements,
 * counted from the tensor's own first element, so a tile never straddles two tensors and a
 * 16-byte-aligned tensor gives 16-byte-aligned tiles (float4 loads). */
#define MT_VEC 4
#define MT_TILE_OF(threads) ((int64_t)(threads) * MT_VEC * MT_UNROLL)

struct mt_tile {
    int32_t j;
    int64_t local, flat, len;
};

__device__ __forceinline__ int32_t mt_tensor_of_tile(const int64_t *tstart, int32_t n, int64_t t) {
    int32_t lo = 0, hi = n - 1;
    while (lo < hi) {
        int32_t mid = lo + (hi - lo + 1) / 2;
        if (tstart[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

__device__ __forceinline__ mt_tile mt_tile_in(const int32_t *offs, const int64_t *tstart, int32_t j, int64_t t) {
    mt_tile r;
    r.j = j;
    r.local = (t - tstart[j]) * MT_TILE_OF(blockDim.x);
    r.flat = offs[j] + r.local;
    int64_t left = (int64_t)(offs[j + 1] - offs[j]) - r.local;
    r.len = left < MT_TILE_OF(blockDim.x) ? left : MT_TILE_OF(blockDim.x);
    return r;
}

__device__ __forceinline__ bool mt_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* Up to MT_SHARED_STARTS - 1 tensors, a block first copies the tile starts into shared memory:
 * each tile's binary search then reads shared memory, not global loads that the streamed
 * tiles keep evicting from L1 (a chain of log2(n) dependent loads at every tile's top). */
#define MT_SHARED_STARTS 512
__device__ __forceinline__ const int64_t *mt_starts_in_shared(const int64_t *tstart, int32_t n, int64_t *buf) {
    if (n >= MT_SHARED_STARTS) return tstart;
    for (int32_t i = threadIdx.x; i <= n; i += blockDim.x) buf[i] = tstart[i];
    __syncthreads();
    return buf;
}

/* Run the body for every tile of the registry, grid-stride (measured on the H200 against a
 * contiguous share per block, 9d4f3b2: this walk was as fast or faster, e.g. AdamW over 200
 * tensors 0.998 ms against 1.061 ms), in ascending tile order or, `down`, descending. Every
 * thread of the block must reach it (the copy above synchronizes): a kernel returns before it
 * only on a block-uniform test. Expand it once per scope and never inside a loop: a second
 * copy into the same buffer while slow threads still search the first would race. The order
 * decides only which tiles meet in the cache: no result depends on it. */
#define MT_FOR_TILES_IN(down, offs, tstart, n, tl, ...)                                           \
    __shared__ int64_t mt_starts_buf_[MT_SHARED_STARTS];                                          \
    const int64_t *mt_starts_ = mt_starts_in_shared((tstart), (n), mt_starts_buf_);               \
    for (int64_t mt_k_ = blockIdx.x, mt_T_ = mt_starts_[n]; mt_k_ < mt_T_; mt_k_ += gridDim.x) {  \
        const int64_t mt_t_ = (down) ? mt_T_ - 1 - mt_k_ : mt_k_;                                 \
        mt_tile tl = mt_tile_in((offs), mt_starts_, mt_tensor_of_tile(mt_starts_, (n), mt_t_), mt_t_); \
        __VA_ARGS__                                                                               \
    }
#define MT_FOR_TILES(offs, tstart, n, tl, ...) MT_FOR_TILES_IN(0, offs, tstart, n, tl, __VA_ARGS__)
/* The update and scale passes walk down: the grads' check (or the norms) has just walked up,
 * so the top ~35 MB of grads it read last (2112 blocks x one tile of 4096 floats) are still in
 * L2 when the first wave of the next pass asks for them. */
#define MT_FOR_TILES_DOWN(offs, tstart, n, tl, ...) MT_FOR_TILES_IN(1, offs, tstart, n, tl, __VA_ARGS__)

/* Vector layout of a whole tile: thread x handles float4 number u * blockDim + x. */
#define MT_VEC_INDEX(u) (((int64_t)(u) * blockDim.x + threadIdx.x) * MT_VEC)
#define MT_WHOLE(tl) ((tl).len == MT_TILE_OF(blockDim.x))

/* The device status says the call is refused: an update or scale kernel writes nothing. */
__device__ __forceinline__ bool mt_refused(const mt_status *st) {
    return st->bad_params | st->bad_grads | st->nonfinite_total;
}

/* ---- host glue shared by the steps and clip_grad_norm_ -------------------------------- */

/* A call's staged lists, device status and per-tensor norms. */
struct mt_step_ctx {
    mt_arena arena;
    mt_dev_list p, g;
    mt_status *st = nullptr;
    float *norms = nullptr;
};

int mt_launch_check(const char *what);           /* the last launch's error, as a refusal */
int mt_elem_blocks(const mt_dev_list &list);     /* blocks for an element kernel over list */
int mt_stage_status(mt_step_ctx *c);             /* a zeroed status on the device */
/* Download the status; refuse (nothing written back) or finish: norm_out, staged outputs. */
int mt_step_finish(mt_step_ctx *c, const int32_t *offsets, int32_t clip, float *norm_out, bool grads_written);

/* mt_gpu_clip.cu: the norms by the tree (clip.md) of list g: tensor norms into dev_norms
 * (J floats), total, coefficient and the non-finite refusal into st. */
int mt_gpu_norms(mt_arena *arena, const mt_dev_list *g, const int32_t *offsets, mt_status *st, float *dev_norms,
                 int32_t clip, float max_norm);

#endif
