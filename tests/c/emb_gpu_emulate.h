/* emb_gpu_emulate.h -- what native/cuda/mt_gpu_embedding.cu takes from the GPU runtime,
 * emulated on the CPU for tests/c/emb_gpu_emulate.cc (built by tests/test_embedding.py).
 *
 * Kernels run one thread at a time: blocks in a shuffled order, threads last to first. That is
 * a valid schedule for kernels without block or warp cooperation, which is all the embedding
 * has. "Device" memory is malloc'd and registered, so host buffers are staged and copied back
 * as on a GPU; outputs that are not uploaded start as NaN bytes, so reading one shows.
 */
#ifndef EMB_GPU_EMULATE_H
#define EMB_GPU_EMULATE_H
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <vector>
#include "mt_host.h"

#define __global__
#define __device__
#define __forceinline__ inline

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct float4 {
    float x, y, z, w;
};
struct alignas(16) uint4 {     /* as CUDA's: a 16-byte load of a misaligned address faults */
    uint32_t x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }

inline dim3 blockIdx, threadIdx, blockDim, gridDim;
inline int emu_threads = 256, emu_max_blocks = 0, emu_part_cap = 1;
inline unsigned emu_launches = 0;
#define EMB_PART_CAP (emu_part_cap ? ((int64_t)1 << 30) : (int64_t)-1)

template <class K, class... A>
void emu_launch(K kernel, dim3 grid, int threads, A... args) {
    gridDim = grid;
    blockDim = dim3((unsigned)threads);
    std::vector<uint64_t> order((uint64_t)grid.x * grid.y);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(++emu_launches));
    for (uint64_t b : order) {
        blockIdx = dim3((unsigned)(b % grid.x), (unsigned)(b / grid.x));
        for (int t = threads - 1; t >= 0; --t) {
            threadIdx = dim3((unsigned)t);
            kernel(args...);
        }
    }
}

/* ---- the runtime ---- */
typedef int gpuError_t;
#define gpuSuccess 0
#define gpuMemcpyDefault 0
#define MT_STREAM 0
inline gpuError_t gpuGetLastError() { return gpuSuccess; }
inline gpuError_t gpuMemcpyAsync(void *d, const void *s, size_t n, int, int) { memcpy(d, s, n); return gpuSuccess; }
inline gpuError_t gpuMemcpy(void *d, const void *s, size_t n, int) { memcpy(d, s, n); return gpuSuccess; }
inline gpuError_t gpuMemsetAsync(void *d, int v, size_t n, int) { memset(d, v, n); return gpuSuccess; }
inline gpuError_t gpuStreamSynchronize(int) { return gpuSuccess; }
#define MT_GPU_CHECK(call, what)                                              \
    do {                                                                      \
        if ((call) != gpuSuccess) return mt_fail(MT_EDEVICE, "%s failed", what); \
    } while (0)

inline std::map<uintptr_t, size_t> emu_device;     /* the emulated device allocations */

inline bool mt_gpu_is_device(const void *p) {
    auto it = emu_device.upper_bound((uintptr_t)p);
    if (it == emu_device.begin()) return false;
    --it;
    return (uintptr_t)p < it->first + it->second;
}
inline int mt_gpu_ready(void) { return MT_OK; }
/* Deferred refusals (native/cuda/mt_gpu_deferred.h) are never on here: every call reads its
 * status at once, so the slot and the poison word stay unused. */
struct mt_deferred_slot {
    struct {
        int32_t bad_params, bad_grads, nonfinite_total, scale;
        float total, coef;
    } st;
    int64_t where, value;
};
#define MT_DEFER_EMBEDDING 2
/* The thread's status word in mapped pinned memory (native/cuda/mt_gpu_runtime.h); emu_mapped = 0
 * emulates a thread without one (the fused gather then checks into the device status). */
struct mt_status {
    int32_t bad_params, bad_grads, nonfinite_total, scale;
    float total, coef;
};
inline int emu_mapped = 1;
inline mt_status emu_mapped_word;
inline mt_status *mt_mapped_status(void) { return emu_mapped ? &emu_mapped_word : nullptr; }
inline int mt_gpu_ready_deferring(void) { return MT_OK; }
inline bool mt_deferred_on(void) { return false; }
inline int mt_deferred_flush(void) { return MT_OK; }
inline int mt_deferred_take(mt_deferred_slot **, int32_t **, int, const char *, const char *, const char *, int64_t) {
    return MT_EINVAL;
}
inline int mt_gpu_threads(void) { return emu_threads; }
inline int emu_blocks(int64_t items, int64_t per_block, int64_t cap) {
    int64_t need = (items + per_block - 1) / per_block;
    if (emu_max_blocks > 0) cap = emu_max_blocks;
    return (int)(need < 1 ? 1 : need < cap ? need : cap);
}
inline int mt_gpu_blocks(int64_t items, int64_t per_block) { return emu_blocks(items, per_block, 64); }
inline int mt_gpu_blocks_each(int64_t items, int64_t per_block) { return emu_blocks(items, per_block, INT32_MAX); }
inline void mt_gpu_record_launch(int, int) {}
inline void mt_gpu_count_d2h(int64_t) {}

struct mt_arena {
    std::vector<void *> owned;
    int alloc(void **out, int64_t bytes) {
        size_t b = (size_t)(bytes > 0 ? bytes : 4);
        void *p = malloc(b);
        if (!p) return mt_fail(MT_ENOMEM, "emulated device allocation");
        memset(p, 0xff, b);                            /* NaN: an unwritten output shows */
        emu_device[(uintptr_t)p] = b;
        owned.push_back(p);
        *out = p;
        return MT_OK;
    }
    ~mt_arena() {
        for (void *p : owned) {
            emu_device.erase((uintptr_t)p);
            free(p);
        }
    }
};

inline int mt_buf_to_device(void **out, bool *staged, mt_arena *arena, void *ptr, int64_t bytes, bool upload) {
    *staged = !mt_gpu_is_device(ptr);
    if (!*staged) {
        *out = ptr;
        return MT_OK;
    }
    int rc = arena->alloc(out, bytes);
    if (!rc && upload) memcpy(*out, ptr, (size_t)bytes);
    return rc;
}
inline int mt_buf_to_host(void *host, const void *dev, int64_t bytes) {
    memcpy(host, dev, (size_t)bytes);
    return MT_OK;
}
#endif
