/* mt_gpu_runtime.cu -- see mt_gpu_runtime.h; also the device-memory half of the C ABI. */
#include <atomic>
#include <map>
#include <mutex>
#include <string.h>
#include "mt_gpu_deferred.h"
#include "mt_gpu_runtime.h"

static std::atomic<int64_t> g_h2d{0}, g_d2h{0};
static std::atomic<int> g_threads{256}, g_max_blocks{0}, g_last_threads{0}, g_last_blocks{0};
static int g_sms = 0;

/* A failed runtime call. Its error is also the thread's last error, which the next call's launch
 * check (gpuGetLastError) would report as its own: cleared here (a sticky error, a broken
 * context, stays and fails every later call, as it must). Out of device memory is MT_ENOMEM
 * (MemoryError), like the host's. */
int mt_gpu_error(gpuError_t err, const char *what) {
    gpuGetLastError();
    return mt_fail(err == gpuErrorMemoryAllocation ? MT_ENOMEM : MT_EDEVICE, "%s failed: %s", what,
                   gpuGetErrorString(err));
}

uint64_t mt_vendor_features(void) {
#if MT_NUMERIC_MODE == 2   /* MT_MODE_FAST (mt_pinned.h is not included here): --use_fast_math: approximate division and sqrt, subnormals flushed */
    return MT_FEATURE_HOST_BUFFERS | MT_FEATURE_DEVICE_BUFFERS | MT_FEATURE_DEFERRED_REFUSALS | MT_FEATURE_APPROXIMATE;
#else
    return MT_FEATURE_HOST_BUFFERS | MT_FEATURE_DEVICE_BUFFERS | MT_FEATURE_DEFERRED_REFUSALS;
#endif
}

/* mt_gpu_ready (mt_gpu_deferred.cu) is this, then the flush of deferred calls. */
static std::atomic<bool> g_ready{false};   /* a device was found usable once: it stays so */

int mt_gpu_ready_deferring(void) {
    if (g_ready.load(std::memory_order_acquire)) return MT_OK;
    int n = 0;
    gpuError_t err = gpuGetDeviceCount(&n);
    if (err != gpuSuccess)
        return mt_fail(MT_EDEVICE, "no usable %s device: %s (is the driver installed and a GPU visible?)",
                       MT_GPU_VENDOR, gpuGetErrorString(err));
    if (n < 1) return mt_fail(MT_EDEVICE, "no %s device is visible", MT_GPU_VENDOR);
    if (!g_sms) {
        int sms = 0;
#if defined(MT_HIP) || defined(__HIPCC__)
        hipDeviceGetAttribute(&sms, hipDeviceAttributeMultiprocessorCount, 0);
#else
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
#endif
        g_sms = sms > 0 ? sms : 1;
#if !defined(MT_HIP) && !defined(__HIPCC__)
        /* DeviceArrays come from the device's default stream-ordered pool; keeping freed
         * memory in the pool makes the next allocation of an op's output cheap (no cudaMalloc
         * per call). */
        cudaMemPool_t pool;
        if (cudaDeviceGetDefaultMemPool(&pool, 0) == cudaSuccess) {
            uint64_t keep = UINT64_MAX;
            cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep);
        }
        cudaGetLastError();
#endif
    }
    g_ready.store(true, std::memory_order_release);
    return MT_OK;
}

/* Allocations made through mt_device_alloc, by address: classifying a pointer into one of
 * them needs no runtime call (they are removed again by mt_device_free, so a freed range is
 * never trusted). Anything else is asked of the runtime. */
static std::mutex g_own_lock;
static std::map<uintptr_t, size_t> g_own;

/* The allocation of ours holding address a, as [*lo, *hi), or false (g_own_lock held). */
static bool mt_own_find(uintptr_t a, uintptr_t *lo, uintptr_t *hi) {
    auto it = g_own.upper_bound(a);
    if (it == g_own.begin()) return false;
    --it;
    *lo = it->first;
    *hi = it->first + it->second;
    return a < *hi;
}

bool mt_gpu_own_range(const void *p, int64_t bytes) {
    uintptr_t a = (uintptr_t)p, lo, hi;
    std::lock_guard<std::mutex> hold(g_own_lock);
    return mt_own_find(a, &lo, &hi) && a + (uintptr_t)bytes <= hi;
}

static bool mt_own_allocation(const void *p) { return mt_gpu_own_range(p, 1); }

bool mt_gpu_is_device(const void *p) {
    if (mt_own_allocation(p)) return true;
    gpuPointerAttributes attr;
    if (gpuPointerGetAttributes(&attr, p) != gpuSuccess) {
        gpuGetLastError();   /* an unregistered host pointer: clear the sticky-free error */
        return false;
    }
    return MT_PTR_TYPE(attr) == gpuMemoryTypeDevice || MT_PTR_TYPE(attr) == gpuMemoryTypeManaged;
}

/* is_dev[j] = mt_gpu_is_device(table[j]) for every j with want[j] (else 0), under one hold of
 * the registry's lock: a list of n tensors costs one lock, not n, and the tensors of one
 * allocation (a flat buffer's views) one lookup between them. The runtime is asked only about
 * pointers outside our allocations, after the lock is released. */
static void mt_gpu_classify(float *const *table, const std::vector<char> &want, std::vector<char> &is_dev) {
    size_t n = want.size();
    is_dev.assign(n, 0);
    std::vector<size_t> ask;
    {
        std::lock_guard<std::mutex> hold(g_own_lock);
        uintptr_t lo = 1, hi = 0;    /* the last allocation looked at: empty at first */
        for (size_t j = 0; j < n; ++j) {
            if (!want[j]) continue;
            uintptr_t a = (uintptr_t)table[j];
            if (a >= lo && a < hi) { is_dev[j] = 1; continue; }
            if (mt_own_find(a, &lo, &hi)) is_dev[j] = 1;   /* [lo, hi): a live allocation either way */
            else ask.push_back(j);
        }
    }
    for (size_t j : ask) is_dev[j] = mt_gpu_is_device(table[j]);
}

void mt_gpu_count_h2d(int64_t bytes) { g_h2d += bytes; }
void mt_gpu_count_d2h(int64_t bytes) { g_d2h += bytes; }

int mt_gpu_threads(void) { return g_threads.load(); }

/* Blocks for work_items, at most a test's max_blocks when one is set, else at most `cap`. */
static int blocks_capped(int64_t work_items, int64_t items_per_block, int64_t cap) {
    int64_t need = (work_items + items_per_block - 1) / items_per_block;
    if (g_max_blocks.load() > 0) cap = g_max_blocks.load();
    if (need < 1) need = 1;
    return (int)(need < cap ? need : cap);
}

int mt_gpu_blocks(int64_t work_items, int64_t items_per_block) {
    return blocks_capped(work_items, items_per_block, (int64_t)g_sms * 16);
}

int mt_gpu_blocks_each(int64_t work_items, int64_t items_per_block) {
#if defined(MT_HIP) || defined(__HIPCC__)
    /* HIP refuses a grid of more than 2^32 - 1 threads along x (hipErrorInvalidConfiguration);
     * every kernel launched this way walks its items grid-stride, so a capped grid still covers them */
    return blocks_capped(work_items, items_per_block, (int64_t)UINT32_MAX / MT_MAX_THREADS);
#else
    return blocks_capped(work_items, items_per_block, INT32_MAX);
#endif
}

void mt_gpu_record_launch(int threads, int blocks) {
    g_last_threads = threads;
    g_last_blocks = blocks;
}

/* Per-thread memory, given back when the thread ends (errors ignored: at process exit the
 * runtime may already be gone). */
struct mt_scratch {
    char *dev = nullptr, *pinned = nullptr;
    size_t cap = 0, grow_to = 0;
    bool active = false;     /* an arena of this thread is using it (ops may call ops) */
    ~mt_scratch() {
        if (dev) gpuFree(dev);
        if (pinned) gpuFreeHost(pinned);
        mt_mem_count(-(int64_t)cap);
    }
};

/* Calls needing more than this get stream-ordered allocations for the excess instead of a
 * per-thread scratch that would stay that large (and twice that) for the thread's life. */
#define MT_SCRATCH_MAX ((size_t)256 << 20)
static thread_local mt_scratch t_scratch;

#define MT_ALIGN(x) (((x) + 255) & ~(size_t)255)

mt_arena::mt_arena() {
    mt_scratch &sc = t_scratch;
    if (sc.active) {          /* nested (an op calling an op): own allocations only */
        nested = true;
        return;
    }
    sc.active = true;
    if (sc.grow_to > sc.cap || !sc.dev) {     /* gpuFree below waits for the device: queued (deferred) calls too */
        size_t want_cap = sc.grow_to > (size_t)(1 << 20) ? sc.grow_to : (size_t)(1 << 20);
        if (sc.dev) gpuFree(sc.dev);
        if (sc.pinned) gpuFreeHost(sc.pinned);
        mt_mem_count(-(int64_t)sc.cap);
        sc.dev = nullptr;
        sc.pinned = nullptr;
        sc.cap = 0;
        if (gpuMalloc((void **)&sc.dev, want_cap) == gpuSuccess &&
            gpuMallocHost((void **)&sc.pinned, want_cap) == gpuSuccess)
            sc.cap = want_cap;
        else
            gpuGetLastError();
        mt_mem_count((int64_t)sc.cap);
    }
    dev = sc.dev;
    pinned = sc.pinned;
    cap = sc.cap;
}

mt_arena::~mt_arena() {
    for (void *p : owned) gpuFreeAsync(p, MT_STREAM);
    mt_mem_count(-owned_bytes);
    if (nested) return;
    t_scratch.active = false;
    if (want > MT_SCRATCH_MAX) want = MT_SCRATCH_MAX;
    if (want > t_scratch.grow_to) t_scratch.grow_to = want;
}

/* A device block of b bytes of the arena's own, for what its scratch half cannot hold (freed
 * with the arena, counted by mt_mem_count). */
static int own_block(mt_arena *arena, void **out, size_t b) {
    void *p = nullptr;
    int rc = mt_pool_alloc(&p, b);
    if (rc) return rc;
    arena->owned.push_back(p);
    arena->owned_bytes += (int64_t)b;
    mt_mem_count((int64_t)b);
    *out = p;
    return MT_OK;
}

/* The scratch's first half holds staged uploads (mirrored in pinned memory), its second half
 * plain allocations, so a flush never overwrites memory a kernel or copy has written. */
int mt_arena::alloc(void **out, int64_t bytes) {
    size_t b = MT_ALIGN((size_t)(bytes > 0 ? bytes : 4)), half = cap / 2;
    if (2 * (used + b) > want) want = 2 * (used + b);
    if (used + b <= half) {
        *out = dev + half + used;
        used += b;
        return MT_OK;
    }
    return own_block(this, out, b);
}

int mt_arena::stage(void **out, const void *host, int64_t bytes) {
    size_t b = MT_ALIGN((size_t)(bytes > 0 ? bytes : 4)), half = cap / 2;
    if (2 * (staged + b) > want) want = 2 * (staged + b);
    if (staged + b <= half) {
        memcpy(pinned + staged, host, (size_t)bytes);
        *out = dev + staged;
        staged_end = staged + (size_t)(bytes > 0 ? bytes : 0);
        staged += b;
        return MT_OK;
    }
    int rc = own_block(this, out, b);
    if (rc) return rc;
    MT_GPU_CHECK(gpuMemcpyAsync(*out, host, (size_t)bytes, gpuMemcpyDefault, MT_STREAM), "upload");
    mt_gpu_count_h2d(bytes);
    return MT_OK;
}

int mt_arena::flush() {
    if (staged > flushed) {    /* the last piece's alignment padding stays behind */
        size_t bytes = staged_end > flushed ? staged_end - flushed : 0;
        if (bytes) {
            MT_GPU_CHECK(gpuMemcpyAsync(dev + flushed, pinned + flushed, bytes, gpuMemcpyDefault, MT_STREAM), "upload");
            mt_gpu_count_h2d((int64_t)bytes);
        }
        flushed = staged;
    }
    return MT_OK;
}

int mt_arena::upload(void **out, const void *host, int64_t bytes) {
    int rc = stage(out, host, bytes);
    return rc ? rc : flush();
}

struct mt_cache_entry {
    std::vector<char> host;
    void *dev = nullptr;
    uint64_t used = 0;
    ~mt_cache_entry() {
        if (dev) gpuFree(dev);
    }
};
#define MT_CACHE_ENTRIES 16     /* a step holds ~5 (pointer tables, tile tables, state tables, clip's starts) */
static thread_local mt_cache_entry t_cache[MT_CACHE_ENTRIES];
static thread_local uint64_t t_clock = 0;

extern "C" {
static gpuError_t mt_give_back_memory(void);   /* idle blocks and the pool's unused memory (below) */
}

int mt_cached_upload(const void **out, const void *host, int64_t bytes) {
    mt_cache_entry *victim = &t_cache[0];
    for (mt_cache_entry &e : t_cache) {
        if (e.dev && (int64_t)e.host.size() == bytes && memcmp(e.host.data(), host, (size_t)bytes) == 0) {
            e.used = ++t_clock;
            *out = e.dev;
            return MT_OK;
        }
        if (e.used < victim->used) victim = &e;
    }
    if (victim->dev) {                       /* gpuFree waits for the device (deferred calls use no cache entry) */
        gpuFree(victim->dev);
        victim->dev = nullptr;
    }
    if (gpuMalloc(&victim->dev, (size_t)bytes) != gpuSuccess) {   /* the memory kept for reuse back, once more */
        gpuGetLastError();
        victim->dev = nullptr;
        MT_GPU_CHECK(mt_give_back_memory(), "device allocation");
        MT_GPU_CHECK(gpuMalloc(&victim->dev, (size_t)bytes), "device allocation");
    }
    victim->host.assign((const char *)host, (const char *)host + bytes);
    /* from the entry's own copy, which lives until it is evicted (the caller's may not) */
    MT_GPU_CHECK(gpuMemcpyAsync(victim->dev, victim->host.data(), (size_t)bytes, gpuMemcpyDefault, MT_STREAM),
                 "upload");
    mt_gpu_count_h2d(bytes);
    victim->used = ++t_clock;
    *out = victim->dev;
    return MT_OK;
}

struct mt_mapped {
    mt_status *status = nullptr;
    ~mt_mapped() {
        if (status) gpuFreeHost(status);
    }
};
static thread_local mt_mapped t_mapped;

mt_status *mt_mapped_status(void) {
    if (!t_mapped.status && gpuMallocHost((void **)&t_mapped.status, sizeof(mt_status)) != gpuSuccess) {
        gpuGetLastError();
        t_mapped.status = nullptr;
    }
    return t_mapped.status;
}

int64_t mt_tile_elems(void) { return (int64_t)g_threads.load() * 16; }   /* MT_TILE_OF: 4 x 4 per thread */

int mt_list_stage(mt_dev_list *out, mt_arena *arena, float *const *table, const int32_t *offsets, int32_t n,
                  bool upload) {
    out->n = n;
    out->total = offsets[n];
    out->host_ptr.assign(table, table + n);
    out->dev_ptr.assign(n, nullptr);
    out->staged.assign(n, 0);
    int64_t host_floats = 0;
    /* NULL: absent, stays NULL; an empty tensor is never staged nor copied (its pointer, host
     * or not, is never dereferenced), so a list of empty host tensors needs no region. */
    std::vector<char> want(n), is_dev;
    for (int32_t j = 0; j < n; ++j) want[j] = offsets[j + 1] > offsets[j] && table[j];
    mt_gpu_classify(table, want, is_dev);
    for (int32_t j = 0; j < n; ++j) {
        out->staged[j] = want[j] && !is_dev[j];
        if (out->staged[j]) host_floats += offsets[j + 1] - offsets[j];
    }
    float *region = nullptr;
    int rc;
    if (host_floats && (rc = arena->alloc((void **)&region, host_floats * 4))) return rc;
    for (int32_t j = 0; j < n; ++j) {
        if (!out->staged[j]) { out->dev_ptr[j] = table[j]; continue; }
        int64_t len = offsets[j + 1] - offsets[j];
        out->dev_ptr[j] = region;
        if (upload) {
            MT_GPU_CHECK(gpuMemcpyAsync(region, table[j], (size_t)len * 4, gpuMemcpyDefault, MT_STREAM), "upload");
            mt_gpu_count_h2d(len * 4);
        }
        region += len;
    }
    return MT_OK;
}

int mt_list_to_device(mt_dev_list *out, mt_arena *arena, float *const *table, const int32_t *offsets,
                      int32_t n, bool upload, const mt_dev_list *like) {
    int rc = mt_list_stage(out, arena, table, offsets, n, upload);
    if (rc) return rc;
    /* Two cached uploads: the tile tables (tile starts 8(n+1), then offsets 4(n+1)) unless shared,
     * and the pointers (8n). Kept apart so that a step whose tensors are new buffers of the same
     * sizes (fresh gradients each step) finds its tables in the cache and uploads only 8n bytes. */
    if (like) {
        out->offsets = like->offsets;
        out->tstart = like->tstart;
        out->tiles = like->tiles;
        out->threads = like->threads;
    } else {
        out->threads = g_threads.load();
        std::vector<char> tables((size_t)(n + 1) * 12);
        int64_t tile = (int64_t)out->threads * 16, t = 0;
        int64_t *ts = (int64_t *)tables.data();
        for (int32_t j = 0; j < n; ++j) {
            ts[j] = t;
            t += (offsets[j + 1] - offsets[j] + tile - 1) / tile;
        }
        ts[n] = t;
        out->tiles = t;
        memcpy(tables.data() + (size_t)(n + 1) * 8, offsets, (size_t)(n + 1) * 4);
        const char *dev = nullptr;
        if ((rc = mt_cached_upload((const void **)&dev, tables.data(), (int64_t)tables.size()))) return rc;
        out->tstart = (const int64_t *)dev;
        out->offsets = (const int32_t *)(dev + (size_t)(n + 1) * 8);
    }
    const void *dev = nullptr;
    if (n > 0 && (rc = mt_cached_upload(&dev, out->dev_ptr.data(), (int64_t)n * 8))) return rc;
    out->table = (float **)dev;
    return MT_OK;
}

int mt_list_to_host(const mt_dev_list *list, const int32_t *offsets) {
    for (int32_t j = 0; j < list->n; ++j) {
        if (!list->staged[j]) continue;
        int64_t bytes = (int64_t)(offsets[j + 1] - offsets[j]) * 4;
        MT_GPU_CHECK(gpuMemcpyAsync(list->host_ptr[j], list->dev_ptr[j], (size_t)bytes, gpuMemcpyDefault, MT_STREAM),
                     "download");
        mt_gpu_count_d2h(bytes);
    }
    return MT_OK;
}

int mt_buf_to_device(void **out, bool *staged, mt_arena *arena, void *ptr, int64_t bytes, bool upload) {
    *staged = !mt_gpu_is_device(ptr);
    if (!*staged) { *out = ptr; return MT_OK; }
    if (!upload) return arena->alloc(out, bytes);
    int rc = arena->alloc(out, bytes);     /* large: a direct copy, not through the pinned mirror */
    if (rc) return rc;
    MT_GPU_CHECK(gpuMemcpyAsync(*out, ptr, (size_t)bytes, gpuMemcpyDefault, MT_STREAM), "upload");
    mt_gpu_count_h2d(bytes);
    return MT_OK;
}

int mt_buf_to_host(void *host, const void *dev, int64_t bytes) {
    MT_GPU_CHECK(gpuMemcpyAsync(host, dev, (size_t)bytes, gpuMemcpyDefault, MT_STREAM), "download");
    mt_gpu_count_d2h(bytes);
    return MT_OK;
}

/* ---- the device half of the ABI ---- */
/* out[0], out[1] = the two counters a and b (for the exports that read a pair back). */
template <class T, class C>
static int read_pair(T *out, const C &a, const C &b) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    out[0] = a.load();
    out[1] = b.load();
    return MT_OK;
}

extern "C" {

int mt_device_count(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    int n = 0;
    gpuError_t err = gpuGetDeviceCount(&n);
    *out = err == gpuSuccess ? n : 0;
    if (err != gpuSuccess)
        return mt_fail(MT_EDEVICE, "no usable %s device: %s (is the driver installed and a GPU visible?)",
                       MT_GPU_VENDOR, gpuGetErrorString(err));
    return MT_OK;
}

/* Idle blocks of mt_device_free, by size: a block freed after the whole device was idle (the
 * synchronizing free) is kept for the next mt_device_alloc of the same size, which then makes
 * no runtime call and needs no synchronization (nothing has touched the block since the device
 * was idle). An op's new output is allocated and dropped on every call, so a step repeats the
 * same sizes. At most MT_IDLE_BLOCKS blocks and MT_IDLE_BYTES bytes are kept, the least
 * recently kept given back to the stream-ordered pool first (on CUDA the pool keeps freed
 * memory too: its release threshold, above; on HIP it does not, so these bytes are what the
 * library then holds beyond its scratch). Any pool allocation that fails gives them all back
 * and tries once more (mt_pool_alloc). g_idle_lock held for the g_idle_* state. */
#define MT_IDLE_BLOCKS 32
#define MT_IDLE_BYTES ((size_t)2 << 30)
struct mt_idle_block {
    void *ptr;
    uint64_t stamp;     /* when it was kept: the smallest is given back first, the largest taken first */
    int device;         /* the device current when it was freed: taken only by an allocation there */
};
static std::mutex g_idle_lock;
static std::multimap<size_t, mt_idle_block> g_idle;
static size_t g_idle_bytes = 0;
static uint64_t g_idle_clock = 0;

/* The calling thread's current device (0 when the runtime cannot say). */
static int mt_current_device(void) {
    int d = 0;
#if defined(MT_HIP) || defined(__HIPCC__)
    if (hipGetDevice(&d) != hipSuccess) d = 0;
#else
    if (cudaGetDevice(&d) != cudaSuccess) d = 0;
#endif
    return d;
}

/* The most recently kept idle block of nbytes on the current device (its lines likeliest in
 * L2), or NULL. */
static void *mt_idle_take(size_t nbytes) {
    const int device = mt_current_device();
    std::lock_guard<std::mutex> hold(g_idle_lock);
    auto range = g_idle.equal_range(nbytes);
    auto pick = g_idle.end();
    for (auto it = range.first; it != range.second; ++it)
        if (it->second.device == device && (pick == g_idle.end() || it->second.stamp > pick->second.stamp)) pick = it;
    if (pick == g_idle.end()) return nullptr;
    void *p = pick->second.ptr;
    g_idle.erase(pick);
    g_idle_bytes -= nbytes;
    return p;
}

static bool mt_idle_holds(const void *p) {
    std::lock_guard<std::mutex> hold(g_idle_lock);
    for (auto &e : g_idle)
        if (e.second.ptr == p) return true;
    return false;
}

/* Set by mt_device_release_cache(1): no block is kept idle any more (an exit handler's call, so
 * that blocks freed later in the process's teardown go back to the pool too). */
static std::atomic<bool> g_idle_off{false};

/* Keeps p (nbytes, idle), giving back the least recently kept blocks while over either bound;
 * false (p not kept) when it alone is over MT_IDLE_BYTES. */
static bool mt_idle_keep(void *p, size_t nbytes) {
    if (nbytes > MT_IDLE_BYTES) return false;
    const int device = mt_current_device();
    std::lock_guard<std::mutex> hold(g_idle_lock);
    /* under the lock: a free racing mt_device_release_cache(1) either lands before its release
     * (and is given back by it) or sees the switch */
    if (g_idle_off.load(std::memory_order_relaxed)) return false;
    while (!g_idle.empty() && (g_idle.size() >= MT_IDLE_BLOCKS || g_idle_bytes + nbytes > MT_IDLE_BYTES)) {
        auto oldest = g_idle.begin();
        for (auto it = g_idle.begin(); it != g_idle.end(); ++it)
            if (it->second.stamp < oldest->second.stamp) oldest = it;
        gpuFreeAsync(oldest->second.ptr, MT_STREAM);
        g_idle_bytes -= oldest->first;
        g_idle.erase(oldest);
    }
    g_idle.emplace(nbytes, mt_idle_block{p, ++g_idle_clock, device});
    g_idle_bytes += nbytes;
    return true;
}

static void mt_idle_release_all(void) {
    std::lock_guard<std::mutex> hold(g_idle_lock);
    for (auto &e : g_idle) gpuFreeAsync(e.second.ptr, MT_STREAM);
    g_idle.clear();
    g_idle_bytes = 0;
}

/* Every idle block back to the pool, the calling thread's stream finished, and (CUDA, whose
 * pool keeps freed memory: its release threshold) the current device's pool's unused memory
 * back to the device, where a plain cudaMalloc can have it. */
static gpuError_t mt_give_back_memory(void) {
    mt_idle_release_all();
    gpuError_t err = gpuStreamSynchronize(MT_STREAM);
#if !defined(MT_HIP) && !defined(__HIPCC__)
    cudaMemPool_t pool;
    if (cudaDeviceGetDefaultMemPool(&pool, mt_current_device()) == cudaSuccess) cudaMemPoolTrimTo(pool, 0);
    cudaGetLastError();
#endif
    return err;
}

/* gpuMallocAsync on MT_STREAM; when it fails, the idle blocks go back to the pool and it is
 * tried once more. */
extern "C++" {   /* mt_gpu_runtime.h declares it for C++ */
int mt_pool_alloc(void **p, size_t nbytes) {
    if (gpuMallocAsync(p, nbytes, MT_STREAM) == gpuSuccess) return MT_OK;
    gpuGetLastError();
    mt_idle_release_all();
    MT_GPU_CHECK(gpuMallocAsync(p, nbytes, MT_STREAM), "device allocation");
    return MT_OK;
}
}

int mt_device_alloc(void **out, int64_t nbytes) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_gpu_ready_deferring())) return rc;
    if (nbytes < 1) return mt_fail(MT_EINVAL, "nbytes must be >= 1, got %lld", (long long)nbytes);
    void *p = mt_idle_take((size_t)nbytes);
    if (p) {
        std::lock_guard<std::mutex> hold(g_own_lock);
        g_own[(uintptr_t)p] = (size_t)nbytes;
        *out = p;
        return MT_OK;
    }
    /* Stream-ordered, then synchronized: the memory is usable on any stream on return. A thread
     * that defers refusals keeps its calls queued: the memory is then usable in the order of
     * this thread's stream (and of the legacy default stream, which synchronizes with it). */
    if ((rc = mt_pool_alloc(&p, (size_t)nbytes))) return rc;
    if (!mt_deferred_on()) MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "device allocation");
    {
        std::lock_guard<std::mutex> hold(g_own_lock);
        g_own[(uintptr_t)p] = (size_t)nbytes;
    }
    *out = p;
    return MT_OK;
}

int mt_device_free(void *ptr) {
    if (!ptr) return MT_OK;
    size_t nbytes = 0;
    {
        std::lock_guard<std::mutex> hold(g_own_lock);
        auto it = g_own.find((uintptr_t)ptr);
        if (it != g_own.end()) {
            nbytes = it->second;
            g_own.erase(it);
        }
    }
    /* Reused only after the whole device is idle (as cudaFree would wait), so no kernel on any
     * stream -- torch's included -- can still be reading it: kept idle (above) or back to the
     * pool. A thread that defers refusals frees in its stream's order (work on the legacy
     * default stream, torch's unless told otherwise, is ordered with it; a side stream's is
     * not), unless another thread has deferred calls queued (its stream is not ordered with
     * this one); such a block is never kept idle (it may still be in use on that stream). */
    if (!nbytes && mt_idle_holds(ptr))       /* kept idle by an earlier free of it: freeing it again */
        return mt_fail(MT_EINVAL, "ptr %p was already freed by mt_device_free", ptr);
    if (!mt_deferred_on() || mt_deferred_elsewhere()) {
        MT_GPU_CHECK(gpuDeviceSynchronize(), "device free");
        if (nbytes && mt_idle_keep(ptr, nbytes)) return MT_OK;
    }
    MT_GPU_CHECK(gpuFreeAsync(ptr, MT_STREAM), "device free");
    return MT_OK;
}

int mt_memcpy(void *dst, const void *src, int64_t nbytes) {
    int rc;
    if (nbytes < 0) return mt_fail(MT_EINVAL, "nbytes must be >= 0, got %lld", (long long)nbytes);
    if (nbytes == 0) return MT_OK;
    if ((rc = mt_check_ptr(dst, "dst")) || (rc = mt_check_ptr(src, "src")) || (rc = mt_gpu_ready())) return rc;
    bool d = mt_gpu_is_device(dst), s = mt_gpu_is_device(src);
    if (!d && !s) { memmove(dst, src, (size_t)nbytes); return MT_OK; }
    MT_GPU_CHECK(gpuMemcpyAsync(dst, src, (size_t)nbytes, gpuMemcpyDefault, MT_STREAM), "copy");
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "copy");
    if (d && !s) mt_gpu_count_h2d(nbytes);
    if (s && !d) mt_gpu_count_d2h(nbytes);
    return MT_OK;
}

/* Every idle block back to the stream-ordered pool, and (CUDA) the pool's unused memory back to
 * the device; keep_none_after != 0: no block is kept idle from then on. */
int mt_device_release_cache(int32_t keep_none_after) {
    if (keep_none_after) {
        std::lock_guard<std::mutex> hold(g_idle_lock);
        g_idle_off.store(true, std::memory_order_relaxed);
    }
    if (!g_ready.load(std::memory_order_acquire)) return MT_OK;   /* nothing was ever allocated */
    /* as every GPU call: a deferred refusal queued on this thread is reported; the blocks go
     * back either way (no queued call uses one: a block is kept only once the device was idle) */
    int rc = mt_gpu_ready();
    gpuError_t err = mt_give_back_memory();
    if (rc) return rc;
    return err == gpuSuccess ? MT_OK : mt_gpu_error(err, "release cache");
}

int mt_synchronize(void) {
    int rc = mt_gpu_ready();
    if (rc) return rc;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "synchronize");
    return MT_OK;
}

int mt_is_device_pointer(int32_t *out, const void *ptr) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_gpu_ready_deferring())) return rc;
    *out = ptr ? (int32_t)mt_gpu_is_device(ptr) : 0;
    return MT_OK;
}

int mt_transfer_bytes(int64_t *out) { return read_pair(out, g_h2d, g_d2h); }

int mt_set_launch_geometry(int32_t threads_per_block, int32_t max_blocks) {
    if (threads_per_block < 32 || threads_per_block > MT_MAX_THREADS || threads_per_block % 32)
        return mt_fail(MT_EINVAL, "threads_per_block must be a multiple of 32 in 32..%d, got %d", MT_MAX_THREADS,
                       (int)threads_per_block);
    if (max_blocks < 0) return mt_fail(MT_EINVAL, "max_blocks must be >= 0 (0: automatic), got %d", (int)max_blocks);
    g_threads = threads_per_block;
    g_max_blocks = max_blocks;
    return MT_OK;
}

int mt_launch_geometry(int32_t *out) { return read_pair(out, g_last_threads, g_last_blocks); }

int mt_num_threads(void) { return g_threads.load(); }

int mt_set_num_threads(int32_t n_threads) {
    return mt_set_launch_geometry(n_threads, g_max_blocks.load());
}

}  /* extern "C" */
