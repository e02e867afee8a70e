/* mt_metal_memory.c -- the Metal vendor's memory half of the ABI (see mt_metal_host.h): device
 * allocations are shared-storage buffers whose contents' addresses are the "device pointers";
 * host buffers are staged into twins per call; the launch geometry; the vendor's identity bits.
 * Every call waits for its work, so there is nothing to defer and nothing to synchronize. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "mt_host.h"
#include "mt_metal_host.h"

uint64_t mt_vendor_features(void) { return MT_FEATURE_HOST_BUFFERS | MT_FEATURE_DEVICE_BUFFERS; }

/* ---- the registry of allocations ---- */
typedef struct {
    char *base;
    int64_t bytes;
    mt_mtl_buffer *buffer;
} alloc_rec;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static alloc_rec *g_allocs;
static int64_t g_n_allocs, g_cap_allocs;
static int64_t g_h2d, g_d2h;   /* staged bytes, counted under g_lock */

static int find_locked(const void *p, int64_t bytes, int64_t *at) {
    const char *c = (const char *)p;
    for (int64_t k = 0; k < g_n_allocs; ++k)
        if (c >= g_allocs[k].base && bytes <= g_allocs[k].bytes && c - g_allocs[k].base <= g_allocs[k].bytes - bytes) {
            if (at) *at = k;
            return 1;
        }
    return 0;
}

int mt_mtl_is_device(const void *p, int64_t bytes) {
    pthread_mutex_lock(&g_lock);
    int r = p && find_locked(p, bytes, NULL);
    pthread_mutex_unlock(&g_lock);
    return r;
}

int mt_device_count(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = 0;
    if ((rc = mt_mtl_open())) return rc;
    *out = 1;
    return MT_OK;
}

int mt_device_alloc(void **out, int64_t nbytes) {
    int rc;
    if ((rc = mt_check_ptr(out, "out")) || (rc = mt_mtl_open())) return rc;
    if (nbytes < 1) return mt_fail(MT_EINVAL, "nbytes must be >= 1, got %lld", (long long)nbytes);
    mt_mtl_buffer *b;
    void *contents;
    if ((rc = mt_mtl_buffer_new(&b, &contents, nbytes))) return rc;
    pthread_mutex_lock(&g_lock);
    if (g_n_allocs == g_cap_allocs) {
        int64_t cap = g_cap_allocs ? 2 * g_cap_allocs : 64;
        alloc_rec *grown = (alloc_rec *)realloc(g_allocs, (size_t)cap * sizeof *grown);
        if (!grown) {
            pthread_mutex_unlock(&g_lock);
            mt_mtl_buffer_release(b);
            return mt_fail(MT_ENOMEM, "out of host memory for the allocation registry");
        }
        g_allocs = grown;
        g_cap_allocs = cap;
    }
    g_allocs[g_n_allocs].base = (char *)contents;
    g_allocs[g_n_allocs].bytes = nbytes;
    g_allocs[g_n_allocs].buffer = b;
    ++g_n_allocs;
    pthread_mutex_unlock(&g_lock);
    *out = contents;
    return MT_OK;
}

int mt_device_free(void *ptr) {
    if (!ptr) return MT_OK;
    pthread_mutex_lock(&g_lock);
    for (int64_t k = 0; k < g_n_allocs; ++k)
        if (g_allocs[k].base == (char *)ptr) {
            mt_mtl_buffer *b = g_allocs[k].buffer;
            g_allocs[k] = g_allocs[--g_n_allocs];
            pthread_mutex_unlock(&g_lock);
            mt_mtl_buffer_release(b);
            return MT_OK;
        }
    pthread_mutex_unlock(&g_lock);
    return mt_fail(MT_EINVAL, "ptr %p is not an allocation of mt_device_alloc (free only what it returned)", ptr);
}

/* Metal keeps no freed buffer: every mt_device_free releases its buffer at once. */
int mt_device_release_cache(int32_t keep_none_after) {
    (void)keep_none_after;
    return MT_OK;
}

/* Every call has waited for its work: device memory is read and written in place. */
int mt_memcpy(void *dst, const void *src, int64_t nbytes) {
    int rc;
    if (nbytes < 0) return mt_fail(MT_EINVAL, "nbytes must be >= 0, got %lld", (long long)nbytes);
    if (nbytes == 0) return MT_OK;
    if ((rc = mt_check_ptr(dst, "dst")) || (rc = mt_check_ptr(src, "src"))) return rc;
    int d = mt_mtl_is_device(dst, nbytes), s = mt_mtl_is_device(src, nbytes);
    memmove(dst, src, (size_t)nbytes);
    pthread_mutex_lock(&g_lock);
    if (d && !s) g_h2d += nbytes;
    if (s && !d) g_d2h += nbytes;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

int mt_synchronize(void) { return mt_mtl_open(); }

int mt_is_device_pointer(int32_t *out, const void *ptr) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = ptr ? mt_mtl_is_device(ptr, 1) : 0;
    return MT_OK;
}

int mt_transfer_bytes(int64_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    pthread_mutex_lock(&g_lock);
    out[0] = g_h2d;
    out[1] = g_d2h;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

/* Every call reports its refusal at once, which the deferred contract allows: the switch is
 * only kept, per thread, for mt_deferred_refusals (as the cpu vendor does). */
static _Thread_local int32_t t_deferred;

int mt_set_deferred_refusals(int32_t on) {
    if (on != 0 && on != 1) return mt_fail(MT_EINVAL, "on must be 0 or 1, got %d", (int)on);
    t_deferred = on;
    return MT_OK;
}

int mt_deferred_refusals(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = t_deferred;
    return MT_OK;
}

/* ---- launch geometry ---- */
static int32_t g_threads = 256, g_max_groups, g_last_threads, g_last_groups;

int mt_set_launch_geometry(int32_t threads_per_block, int32_t max_blocks) {
    if (threads_per_block < 32 || threads_per_block > MT_MTL_MAX_THREADS || threads_per_block % 32)
        return mt_fail(MT_EINVAL, "threads_per_block must be a multiple of 32 in 32..%d, got %d", MT_MTL_MAX_THREADS,
                       (int)threads_per_block);
    if (max_blocks < 0) return mt_fail(MT_EINVAL, "max_blocks must be >= 0 (0: automatic), got %d", (int)max_blocks);
    pthread_mutex_lock(&g_lock);
    g_threads = threads_per_block;
    g_max_groups = max_blocks;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

int mt_launch_geometry(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    pthread_mutex_lock(&g_lock);
    out[0] = g_last_threads;
    out[1] = g_last_groups;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

int mt_num_threads(void) {
    pthread_mutex_lock(&g_lock);
    int32_t t = g_threads;
    pthread_mutex_unlock(&g_lock);
    return t;
}

int mt_set_num_threads(int32_t n_threads) {
    pthread_mutex_lock(&g_lock);
    int32_t m = g_max_groups;
    pthread_mutex_unlock(&g_lock);
    return mt_set_launch_geometry(n_threads, m);
}

int mt_mtl_launch_with(const char *kernel, mt_mtl_arg *args, int32_t n_args, const void *params, int32_t size,
                       int64_t work) {
    mt_mtl_bytes(&args[n_args - 1], params, size);
    return mt_mtl_launch(kernel, args, n_args, work);
}

int mt_mtl_launch(const char *kernel, const mt_mtl_arg *args, int32_t n_args, int64_t work) {
    pthread_mutex_lock(&g_lock);
    int64_t threads = g_threads, cap = g_max_groups > 0 ? g_max_groups : 4096;
    pthread_mutex_unlock(&g_lock);
    int64_t need = (work + threads - 1) / threads;
    if (need < 1) need = 1;
    uint32_t groups = (uint32_t)(need < cap ? need : cap), ran = 0;
    int rc = mt_mtl_run(kernel, args, n_args, groups, (uint32_t)threads, &ran);
    if (rc) return rc;
    pthread_mutex_lock(&g_lock);
    g_last_threads = (int32_t)ran;
    g_last_groups = (int32_t)groups;
    pthread_mutex_unlock(&g_lock);
    return MT_OK;
}

/* ---- a call's staging ---- */
void mt_mtl_begin(mt_mtl_call *call) { call->n_staged = 0; }

void mt_mtl_bytes(mt_mtl_arg *arg, const void *p, int32_t size) {
    arg->buffer = NULL;
    arg->offset = 0;
    arg->bytes = p;
    arg->size = size;
}

/* Whether a host range may be bound without a copy: an input only, on whole pages. */
static int wrappable(const void *host, int64_t bytes, int mode) {
    const int64_t page = mt_mtl_page_bytes();
    return host && mode == MT_MTL_IN && page > 0 && bytes > 0 && (uintptr_t)host % (uintptr_t)page == 0 &&
           bytes % page == 0;
}

static int new_twin(mt_mtl_call *call, const void *host, int64_t bytes, int mode, int32_t *at) {
    if (call->n_staged == MT_MTL_MAX_STAGED) return mt_fail(MT_EINVAL, "a Metal call staged too many buffers");
    int32_t k = call->n_staged;
    int wrap = wrappable(host, bytes, mode), rc = MT_EDEVICE;
    if (wrap && (rc = mt_mtl_buffer_wrap(&call->staged[k].buffer, (void *)host, bytes)) != MT_OK)
        wrap = 0;          /* pages Metal will not map (read-only, file-backed, ...): a twin, as any other */
    if (!wrap && (rc = mt_mtl_buffer_new(&call->staged[k].buffer, &call->staged[k].contents, bytes > 0 ? bytes : 4)))
        return rc;
    if (wrap) call->staged[k].contents = (void *)host;
    call->staged[k].host = host;
    call->staged[k].bytes = bytes;
    call->staged[k].mode = mode;
    call->staged[k].wrapped = wrap;
    call->n_staged = k + 1;
    *at = k;
    return MT_OK;
}

int mt_mtl_stage(mt_mtl_call *call, mt_mtl_arg *arg, const void *ptr, int64_t bytes, int mode, void **seen) {
    int rc;
    arg->bytes = NULL;
    arg->size = 0;
    if (ptr && bytes > 0) {
        pthread_mutex_lock(&g_lock);
        int64_t k;
        int dev = find_locked(ptr, bytes, &k);
        if (dev) {
            arg->buffer = g_allocs[k].buffer;
            arg->offset = (const char *)ptr - g_allocs[k].base;
        }
        pthread_mutex_unlock(&g_lock);
        if (dev) {
            if (seen) *seen = (void *)ptr;
            return MT_OK;
        }
        for (int32_t j = 0; j < call->n_staged; ++j)
            if (call->staged[j].host == ptr && call->staged[j].bytes == bytes) {
                if ((mode & MT_MTL_IN) && !(call->staged[j].mode & MT_MTL_IN)) {   /* first read: fill it (never wrapped) */
                    memcpy(call->staged[j].contents, ptr, (size_t)bytes);
                    pthread_mutex_lock(&g_lock);
                    g_h2d += bytes;
                    pthread_mutex_unlock(&g_lock);
                }
                call->staged[j].mode |= mode;
                arg->buffer = call->staged[j].buffer;
                arg->offset = 0;
                if (seen) *seen = call->staged[j].contents;
                return MT_OK;
            }
    }
    int32_t j = 0;
    if ((rc = new_twin(call, ptr && bytes > 0 ? ptr : NULL, ptr ? bytes : 0, ptr && bytes > 0 ? mode : 0, &j)))
        return rc;
    if ((mode & MT_MTL_IN) && ptr && bytes > 0 && !call->staged[j].wrapped) {
        memcpy(call->staged[j].contents, ptr, (size_t)bytes);
        pthread_mutex_lock(&g_lock);
        g_h2d += bytes;
        pthread_mutex_unlock(&g_lock);
    }
    arg->buffer = call->staged[j].buffer;
    arg->offset = 0;
    if (seen) *seen = call->staged[j].contents;
    return MT_OK;
}

int mt_mtl_scratch(mt_mtl_call *call, mt_mtl_arg *arg, int64_t bytes, void **contents) {
    int32_t j = 0;
    int rc = new_twin(call, NULL, bytes, 0, &j);
    if (rc) return rc;
    memset(call->staged[j].contents, 0, (size_t)(bytes > 0 ? bytes : 4));
    mt_mtl_bytes(arg, NULL, 0);
    arg->buffer = call->staged[j].buffer;
    if (contents) *contents = call->staged[j].contents;
    return MT_OK;
}

void *mt_mtl_contents(const mt_mtl_call *call, const mt_mtl_arg *arg) {
    for (int32_t j = 0; j < call->n_staged; ++j)
        if (call->staged[j].buffer == arg->buffer) return (char *)call->staged[j].contents + arg->offset;
    return NULL;
}

void mt_mtl_end(mt_mtl_call *call, int download) {
    for (int32_t j = 0; j < call->n_staged; ++j) {
        if (download && call->staged[j].host && (call->staged[j].mode & MT_MTL_OUT) && !call->staged[j].wrapped) {
            memcpy((void *)call->staged[j].host, call->staged[j].contents, (size_t)call->staged[j].bytes);
            pthread_mutex_lock(&g_lock);
            g_d2h += call->staged[j].bytes;
            pthread_mutex_unlock(&g_lock);
        }
        mt_mtl_buffer_release(call->staged[j].buffer);
    }
    call->n_staged = 0;
}
