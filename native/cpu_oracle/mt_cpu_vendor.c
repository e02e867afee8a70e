/* mt_cpu_vendor.c -- the CPU vendor itself: its identity bits, thread control, and the device
 * half of the ABI answered for a vendor without devices. The ops live in their families' files. */
#include "mt_cpu.h"
#include "mt_host.h"
#include "mt_pool.h"

uint64_t mt_vendor_features(void) { return MT_FEATURE_HOST_BUFFERS | MT_FEATURE_THREADS; }

int mt_num_threads(void) { return mt_pool_threads(); }

int mt_set_num_threads(int32_t n_threads) {
    if (mt_pool_set_threads(n_threads) != 0)
        return mt_fail(MT_EINVAL, "n_threads must be in 1..64, got %d", (int)n_threads);
    return MT_OK;
}

/* ---- the device half of the ABI, on a vendor without devices ---- */
#include <string.h>

int mt_device_count(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = 0;
    return MT_OK;
}

int mt_device_alloc(void **out, int64_t nbytes) {
    return mt_fail(MT_EUNSUPPORTED, "the cpu vendor has no device memory; load a GPU vendor (MOJO_TRAIN_VENDOR)");
}

int mt_device_free(void *ptr) {
    return ptr ? mt_fail(MT_EUNSUPPORTED, "the cpu vendor has no device memory to free") : MT_OK;
}

int mt_device_release_cache(int32_t keep_none_after) {
    (void)keep_none_after;   /* no device memory, so nothing is kept */
    return MT_OK;
}

int mt_memcpy(void *dst, const void *src, int64_t nbytes) {
    int rc;
    if (nbytes < 0) return mt_fail(MT_EINVAL, "nbytes must be >= 0, got %lld", (long long)nbytes);
    if (nbytes == 0) return MT_OK;
    if ((rc = mt_check_ptr(dst, "dst")) || (rc = mt_check_ptr(src, "src"))) return rc;
    memmove(dst, src, (size_t)nbytes);
    return MT_OK;
}

int mt_synchronize(void) { return MT_OK; }

/* Every call of this vendor reports its refusal at once, which the deferred contract allows:
 * the switch is only kept, per thread, for mt_deferred_refusals. */
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

int mt_is_device_pointer(int32_t *out, const void *ptr) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = 0;
    return MT_OK;
}

int mt_transfer_bytes(int64_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    out[0] = out[1] = 0;
    return MT_OK;
}

/* On the CPU the "geometry" is the thread count; the bits never depend on it. */
int mt_set_launch_geometry(int32_t threads_per_block, int32_t max_blocks) {
    return mt_set_num_threads(threads_per_block);
}

int mt_launch_geometry(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    out[0] = (int32_t)mt_pool_threads();
    out[1] = 1;
    return MT_OK;
}
