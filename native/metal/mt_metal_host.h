/* mt_metal_host.h -- what the Metal host ops share above the runtime seam (mt_metal_runtime.h):
 * the registry of device allocations, a call's staging of host buffers, and launches with the
 * library's geometry (mt_metal_memory.c). Plain C: the same on macOS and in the emulator. */
#ifndef MT_METAL_HOST_H
#define MT_METAL_HOST_H
#include <stdint.h>
#include "mojo_train.h"
#include "mt_metal_params.h"
#include "mt_metal_runtime.h"

#define MT_MTL_MAX_THREADS 1024   /* Metal's threadgroup limit; the kernels' group size */
enum { MT_MTL_IN = 1, MT_MTL_OUT = 2, MT_MTL_INOUT = 3 };
#define MT_MTL_MAX_STAGED 128   /* the LM head: two token stacks beside its own buffers */

/* A call's buffers: device allocations are bound in place; a host buffer gets a shared-storage
 * twin (filled from it when read), downloaded back into it by mt_mtl_end(call, 1) when written.
 * The same host range staged twice is one twin. A host input that starts on a page and spans
 * whole pages (mt_mtl_page_bytes) is not copied: its own pages are wrapped as the buffer
 * (wrapped), as Metal allows; should the call stage that range again to write it (an op in
 * place), it is written there, after the op's refusals like any device buffer. */
typedef struct {
    struct {
        const void *host;
        int64_t bytes;
        mt_mtl_buffer *buffer;
        void *contents;
        int mode, wrapped;
    } staged[MT_MTL_MAX_STAGED];
    int32_t n_staged;
} mt_mtl_call;

void mt_mtl_begin(mt_mtl_call *call);
/* arg <- ptr's `bytes` bytes (NULL or 0 bytes: a small placeholder the kernel must not read);
 * *seen (may be NULL) <- the address the kernel's buffer has on the host. */
int mt_mtl_stage(mt_mtl_call *call, mt_mtl_arg *arg, const void *ptr, int64_t bytes, int mode, void **seen);
/* A zeroed buffer of `bytes` that lives as long as the call; *contents its host address. */
int mt_mtl_scratch(mt_mtl_call *call, mt_mtl_arg *arg, int64_t bytes, void **contents);
/* The host address of a twin or scratch of `call` bound in `arg` (NULL for anything else). */
void *mt_mtl_contents(const mt_mtl_call *call, const mt_mtl_arg *arg);
/* Downloads the written twins (when `download`), then releases every twin and scratch. */
void mt_mtl_end(mt_mtl_call *call, int download);
void mt_mtl_bytes(mt_mtl_arg *arg, const void *p, int32_t size);

/* Launch `kernel` over `work` items (grid-stride kernels: the grid is capped). */
int mt_mtl_launch(const char *kernel, const mt_mtl_arg *args, int32_t n_args, int64_t work);
/* The same with the kernel's parameter struct (`size` bytes at `params`) as its last argument,
 * args[n_args - 1]. */
int mt_mtl_launch_with(const char *kernel, mt_mtl_arg *args, int32_t n_args, const void *params, int32_t size,
                       int64_t work);

/* Whether [p, p + bytes) lies inside one allocation of mt_device_alloc. */
int mt_mtl_is_device(const void *p, int64_t bytes);
#endif
