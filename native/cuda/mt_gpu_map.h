/* mt_gpu_map.h -- the call shape of one-pass elementwise maps on a GPU (SiLU, add, dropout),
 * defined in mt_gpu_elementwise.cu: staging, the refusal word, the in-place pre-pass, the
 * synchronizing read and the download of a staged output. */
#ifndef MT_GPU_MAP_H
#define MT_GPU_MAP_H

#include <stdint.h>
#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

/* A word the kernels set to 1 on a NaN or inf: the calling thread's mapped status when it
 * exists (no copy), else a device word copied back. */
struct mt_gpu_flag {
    int32_t *dev = nullptr;
    mt_status *mapped = nullptr;
};
int mt_gpu_flag_init(mt_gpu_flag *f, mt_arena *arena);
int mt_gpu_flag_read(const mt_gpu_flag *f, int *bad);   /* synchronizes the stream */

/* Launch the map out[0..n) = f(a, b) on device pointers (b may equal a); the kernel sets
 * *bad on a non-finite input. */
typedef int (*mt_map_launch)(void *ctx, float *out, const float *a, const float *b, int64_t n, int32_t *bad);

/* The whole call on caller pointers (host or device); names = {out, a, b} for messages;
 * b may be NULL (no second input) or equal to a. Arguments are checked by the caller. */
int mt_gpu_map(float *out, const float *a, const float *b, int64_t n, const char *const names[3],
               mt_map_launch launch, void *ctx);

MT_HD bool mt_gpu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif
