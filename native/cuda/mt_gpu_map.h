/* mt_gpu_map.h -- the call shape of one-pass elementwise maps on a GPU (SiLU, add, dropout),
 * defined in mt_gpu_elementwise.cu: staging, the finiteness pre-pass and its refusal words,
 * the synchronizing read and the download of a staged output. */
#ifndef MT_GPU_MAP_H
#define MT_GPU_MAP_H

#include <stdint.h>
#include "mt_gpu.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

/* The refusal words: dev[0] = 1 when input a holds a NaN or inf, dev[1] when b does (the
 * pre-pass sets them; every writer stores 1, no atomic). A map kernel calls mt_map_refused
 * first and writes nothing when it is true; its first thread then copies the words into the
 * calling thread's mapped status (when there is one), which the host reads without a copy. */
struct mt_gpu_flag {
    int32_t *dev = nullptr;
    mt_status *mapped = nullptr;
};
int mt_gpu_flag_init(mt_gpu_flag *f, mt_arena *arena);
int mt_gpu_flag_read(const mt_gpu_flag *f, int bad[2]);   /* synchronizes the stream */

__device__ __forceinline__ bool mt_map_refused(const mt_gpu_flag &f) {
    const int32_t a = f.dev[0], b = f.dev[1];
    if (!(a | b)) return false;
    if (f.mapped && blockIdx.x == 0 && threadIdx.x == 0) {
        f.mapped->bad_params = a;
        f.mapped->bad_grads = b;
    }
    return true;
}

/* Launch the map out[0..n) = f(a, b) on device pointers (b may equal a); the kernel returns
 * at once when mt_map_refused(flag). */
typedef int (*mt_map_launch)(void *ctx, float *out, const float *a, const float *b, int64_t n, mt_gpu_flag flag);

/* The whole call on caller pointers (host or device); names = {out, a, b} for messages;
 * b may be NULL (no second input) or equal to a. Arguments, aliasing included, are checked
 * by the caller. */
int mt_gpu_map(float *out, const float *a, const float *b, int64_t n, const char *const names[3],
               mt_map_launch launch, void *ctx);

MT_HD bool mt_gpu_aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#endif
