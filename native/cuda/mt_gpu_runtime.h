/* mt_gpu_runtime.h -- host glue shared by the GPU ops: pointer classification, staging of
 * host buffers through device memory (counted), the per-call device arena, launch geometry.
 * Every call runs on the calling thread's default stream and synchronizes before returning,
 * except the deferrable calls of a thread that defers refusals (mt_gpu_deferred.h).
 */
#ifndef MT_GPU_RUNTIME_H
#define MT_GPU_RUNTIME_H

#include <stdint.h>
#include <vector>
#include "mt_gpu.h"
#include "mt_host.h"

#define MT_STREAM gpuStreamPerThread
#define MT_MAX_THREADS 512   /* the element kernels' launch bound */

/* What the device reports back after a step: refusals, norms, coefficient. */
struct mt_status {
    int32_t bad_params, bad_grads, nonfinite_total, scale;
    float total, coef;
};

int mt_gpu_error(gpuError_t err, const char *what);
#define MT_GPU_CHECK(call, what)                                  \
    do {                                                          \
        gpuError_t mt_err_ = (call);                              \
        if (mt_err_ != gpuSuccess) return mt_gpu_error(mt_err_, what); \
    } while (0)

/* MT_OK once a device is usable, else a clear refusal; first reports a refusal among the
 * calling thread's deferred calls (mt_gpu_deferred.h), so every call that cannot itself skip
 * after one calls this before it queues anything. */
int mt_gpu_ready(void);
bool mt_gpu_is_device(const void *p);
bool mt_gpu_own_range(const void *p, int64_t bytes);   /* [p, p + bytes) inside one allocation of ours */
void mt_gpu_count_h2d(int64_t bytes);
void mt_gpu_count_d2h(int64_t bytes);
int mt_gpu_blocks(int64_t work_items, int64_t items_per_block);
/* A block for every items_per_block items, without mt_gpu_blocks's cap of 16 blocks an SM (a
 * test's mt_set_launch_geometry still caps it): for kernels whose blocks' work is uneven and
 * short, so that the block scheduler, not a grid-stride loop, spreads it. */
int mt_gpu_blocks_each(int64_t work_items, int64_t items_per_block);
int mt_gpu_threads(void);
void mt_gpu_record_launch(int threads, int blocks);

/* Per-call memory. Small pieces come from the calling thread's scratch buffers (device and
 * pinned host, reused call after call, grown to the high-water mark); `stage` records an
 * upload into the pinned mirror and `flush` sends everything staged in ONE copy. Pieces that
 * do not fit fall back to stream-ordered allocations freed when the arena dies. */
struct mt_arena {
    std::vector<void *> owned;
    size_t staged = 0, flushed = 0, used = 0, want = 0;   /* staged: first half; used: second */
    size_t staged_end = 0;    /* the end of the last staged piece's bytes (staged: its aligned end) */
    int64_t owned_bytes = 0;                              /* counted by mt_mem_count */
    bool nested = false;      /* another arena of this thread holds the scratch: cap stays 0 */
    char *dev = nullptr, *pinned = nullptr;
    size_t cap = 0;
    mt_arena();
    ~mt_arena();
    int alloc(void **out, int64_t bytes);                      /* device memory, uninitialised */
    int stage(void **out, const void *host, int64_t bytes);    /* device copy of host after flush() */
    int flush();
    int upload(void **out, const void *host, int64_t bytes);   /* stage + flush */
};

/* A device copy of host bytes that stays between calls: pointer tables and offsets repeat
 * step after step, so the calling thread keeps the last few (compared byte for byte) and a
 * repeat costs no transfer. Kernels only read them. */
int mt_cached_upload(const void **out, const void *host, int64_t bytes);

/* Device memory from the stream-ordered pool on MT_STREAM (uninitialised); when the pool has
 * none, mt_device_free's idle blocks go back to it and it is tried once more. */
int mt_pool_alloc(void **p, size_t nbytes);

/* The calling thread's status word in mapped pinned memory (kernels write it directly). */
mt_status *mt_mapped_status(void);

/* A tensor list as the device sees it: a device copy of the pointer table (host tensors
 * staged into one device region) and of the offsets. */
struct mt_dev_list {
    float **table = nullptr;          /* device array of J device pointers */
    const int32_t *offsets = nullptr; /* device copy */
    const int64_t *tstart = nullptr;  /* device: first tile of each tensor (J + 1) */
    int64_t tiles = 0;
    int threads = 0;                  /* the block size the tiles are cut for (16 elements each) */
    std::vector<float *> host_ptr;    /* the caller's pointers */
    std::vector<float *> dev_ptr;     /* device pointer of each tensor */
    std::vector<char> staged;         /* tensor j was a host buffer */
    int32_t n = 0;
    int64_t total = 0;
    bool any_staged() const {
        for (char s : staged) if (s) return true;
        return false;
    }
};

/* The staging half of mt_list_to_device: host tensors copied into one device region (when
 * `upload`), out->dev_ptr filled; NULL entries stay NULL (absent). No table is uploaded. */
int mt_list_stage(mt_dev_list *out, mt_arena *arena, float *const *table, const int32_t *offsets, int32_t n,
                  bool upload);
/* Stage a list; with `like`, its offsets and tiles are shared (same registry). Cached uploads
 * (mt_cached_upload: bytes seen before are not sent again) carry the pointer table and, without
 * `like`, the tile starts and offsets apart from it. */
int mt_list_to_device(mt_dev_list *out, mt_arena *arena, float *const *table, const int32_t *offsets,
                      int32_t n, bool upload, const mt_dev_list *like);
int64_t mt_tile_elems(void);
int mt_list_to_host(const mt_dev_list *list, const int32_t *offsets);

/* One flat buffer: the device pointer for ptr (staged when ptr is a host pointer). */
int mt_buf_to_device(void **out, bool *staged, mt_arena *arena, void *ptr, int64_t bytes, bool upload);
int mt_buf_to_host(void *host, const void *dev, int64_t bytes);

#endif
