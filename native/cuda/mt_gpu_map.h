/* mt_gpu_map.h -- the call shape of one-pass elementwise maps on a GPU (SiLU, add, dropout),
 * defined in mt_gpu_elementwise.cu: staging, the finiteness pre-pass and its refusal words,
 * the synchronizing read and the download of a staged output. */
#ifndef MT_GPU_MAP_H
#define MT_GPU_MAP_H

#include <stdint.h>
#include "mt_gpu.h"
#include "mt_gpu_deferred.h"
#include "mt_gpu_runtime.h"
#include "mt_pinned.h"

/* The refusal words: dev[0] = 1 when input a holds a NaN or inf, dev[1] when b does (every
 * writer stores 1, no atomic). Checked (fused false): the pre-pass sets them, and a map kernel
 * calls mt_map_refused first and writes nothing when it is true; its first thread then copies
 * the words into the calling thread's mapped status (when there is one), which the host reads
 * without a copy. Fused (the output is the library's scratch or declared fresh, and no
 * input): no pre-pass; the map kernel checks what it reads and reports by mt_map_report. */
/* Deferred (mt_gpu_deferred.h): `mapped` is the call's slot, and `poison` the thread's poison
 * word, which a refusal raises and which makes a checked kernel write nothing. */
struct mt_gpu_flag {
    int32_t *dev = nullptr;
    mt_status *mapped = nullptr;
    int32_t *poison = nullptr;
    bool fused = false;
};
/* The words cleared; slot: a deferred call's (else the thread's mapped status). */
int mt_gpu_flag_init(mt_gpu_flag *f, mt_arena *arena, mt_status *slot);
int mt_gpu_flag_read(const mt_gpu_flag *f, int bad[2]);   /* synchronizes the stream */

__device__ __forceinline__ bool mt_map_refused(const mt_gpu_flag &f) {
    const int32_t a = f.dev[0], b = f.dev[1];
    if (!(a | b)) return f.poison && *f.poison;   /* an earlier deferred call refused */
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        if (f.mapped) {
            f.mapped->bad_params = a;
            f.mapped->bad_grads = b;
        }
        if (f.poison) *f.poison = 1;
    }
    return true;
}

/* A fused map kernel's report, once per thread at its end: bad_a / bad_b when what the thread
 * read of a / b held a NaN or inf (the words and, when there is one, the mapped status). */
__device__ __forceinline__ void mt_map_report(const mt_gpu_flag &f, bool bad_a, bool bad_b) {
    if (bad_a) {
        f.dev[0] = 1;
        if (f.mapped) f.mapped->bad_params = 1;
    }
    if (bad_b) {
        f.dev[1] = 1;
        if (f.mapped) f.mapped->bad_grads = 1;
    }
    if ((bad_a || bad_b) && f.poison) *f.poison = 1;
}

/* Launch the map out[0..n) = f(a, b) on device pointers (b may equal a); checked, the kernel
 * returns at once when mt_map_refused(flag); fused, it checks its reads and reports. */
typedef int (*mt_map_launch)(void *ctx, float *out, const float *a, const float *b, int64_t n, mt_gpu_flag flag);

/* The whole call on caller pointers (host or device); names = {out, a, b, the call} for messages;
 * b may be NULL (no second input) or equal to a; flags as mojo_train.h's maps (checked here).
 * Fused when the output is no input and either a device twin of a host output (downloaded
 * only on success) or declared fresh (MT_MAP_OUT_FRESH). Other arguments, aliasing included,
 * are checked by the caller. */
int mt_gpu_map(float *out, const float *a, const float *b, int64_t n, uint32_t flags, const char *const names[4],
               mt_map_launch launch, void *ctx);

#endif
