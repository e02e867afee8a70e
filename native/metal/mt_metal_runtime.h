/* mt_metal_runtime.h -- the one seam between the host ops (plain C, compiled on every machine)
 * and a Metal runtime: Apple's (mt_metal_runtime.m, Objective-C, macOS) or the emulator's
 * (emulator/mt_metal_emulator.cpp, which runs the same kernel sources on the CPU). Everything
 * above it -- argument checks, refusals, staging of host buffers, the ABI -- is the same code for
 * both, so the emulator's cards vouch for it.
 *
 * Memory is shared storage: a buffer's contents are addressable by the host, so "device
 * pointers" (mt_device_alloc) are the contents' addresses and the host reads results in place
 * after the wait. Every run is encoded, committed and waited for before it returns. */
#ifndef MT_METAL_RUNTIME_H
#define MT_METAL_RUNTIME_H
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_mtl_buffer mt_mtl_buffer;   /* an MTLBuffer, or the emulator's block */

/* MT_OK once a device is there (opened on first use), else an MT_EDEVICE refusal naming why. */
int mt_mtl_open(void);
/* A shared-storage buffer of `bytes` (> 0) bytes; *contents its host address. */
int mt_mtl_buffer_new(mt_mtl_buffer **out, void **contents, int64_t bytes);
void mt_mtl_buffer_release(mt_mtl_buffer *b);
/* The size of a page: a host range that starts on a page and spans whole pages can be wrapped. */
int64_t mt_mtl_page_bytes(void);
/* A buffer over the host's own `bytes` bytes at `host` (page-aligned, whole pages), without a
 * copy: what the kernels write lands there. Its release leaves the memory to its owner. */
int mt_mtl_buffer_wrap(mt_mtl_buffer **out, void *host, int64_t bytes);

/* One kernel argument: a buffer at an offset, or (buffer NULL) `size` bytes set inline. */
typedef struct {
    mt_mtl_buffer *buffer;
    int64_t offset;
    const void *bytes;
    int32_t size;
} mt_mtl_arg;

/* Run `kernel` (a name of mt_metal_kernels.h) on `groups` threadgroups of `group_size` threads
 * (fewer when the kernel's pipeline allows fewer: *ran, when not NULL, says how many ran; every
 * kernel walks its range with the grid's stride), arguments bound at indices 0 .. n_args - 1, and
 * wait for it. */
int mt_mtl_run(const char *kernel, const mt_mtl_arg *args, int32_t n_args, uint32_t groups, uint32_t group_size,
               uint32_t *ran);

#ifdef __cplusplus
}
#endif
#endif
