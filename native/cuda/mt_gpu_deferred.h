/* mt_gpu_deferred.h -- deferred refusals (contract: native/contracts/README.md, "Deferred
 * refusals"). A thread that turned them on (mt_set_deferred_refusals) has its deferrable calls
 * -- the maps (SiLU, GELU, add, dropout) and the embedding forward, when every buffer is device
 * memory -- queued without a synchronization. Each takes a slot: refusal words in mapped pinned
 * memory that its kernels write, and host-side words naming the call. A refusal also raises
 * the thread's poison word (device memory); every deferrable kernel queued after it reads that
 * word and writes nothing to a caller buffer. mt_deferred_flush synchronizes and reports the
 * first refusal in call order: at mt_synchronize and mt_memcpy, at the entry of every other
 * GPU call (mt_gpu_ready), when the ring of slots is full, and when the mode is turned off.
 */
#ifndef MT_GPU_DEFERRED_H
#define MT_GPU_DEFERRED_H

#include <stdint.h>
#include "mt_gpu_runtime.h"

/* What a deferred call's kernels write back (mapped pinned memory; the host clears a slot
 * before the call's first launch and reads it only after a synchronization). The maps use
 * st.bad_params / st.bad_grads for their inputs a and b (mt_gpu_map.h); the embedding forward
 * st.bad_params for a refused id, with `where` its (first) flat position and `value` the id. */
struct mt_deferred_slot {
    mt_status st;
    int64_t where, value;
};

enum mt_deferred_kind { MT_DEFER_MAP = 1, MT_DEFER_EMBEDDING = 2 };

/* Whether the calling thread defers (mt_set_deferred_refusals). */
bool mt_deferred_on(void);

/* Whether a thread other than the calling one has deferred calls queued (mt_device_free: a
 * stream-ordered free is then not ordered with that thread's stream). */
bool mt_deferred_elsewhere(void);

/* The next slot of the calling thread (its words cleared) and the thread's poison word, for
 * the call named by `kind`, `what` (the call), `a` and `b` (its inputs, maps) and `limit` (the
 * vocab, embedding): recorded before any launch, so that a refusal its kernels write is told
 * even when the call fails after queueing them. A full ring is flushed first (so this may
 * report an earlier call's refusal). A kernel raises the poison word only where it also writes
 * its slot, so a raised poison word always has a slot that tells why. */
int mt_deferred_take(mt_deferred_slot **slot, int32_t **poison, int kind, const char *what, const char *a,
                     const char *b, int64_t limit);

/* Synchronize when calls are queued, then report the first refusal among them (MT_ENONFINITE
 * or MT_EINVAL, as the call itself would have) and forget them all. */
int mt_deferred_flush(void);

/* mt_gpu_ready without the flush: for the deferrable calls, which flush themselves when they
 * cannot defer (a host buffer among their arguments). */
int mt_gpu_ready_deferring(void);

#endif
