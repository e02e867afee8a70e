/* mt_gpu_attention_relay.cuh -- what attention's GPU kernels are handed (mt_attn_dev), the dq
 * relay's handoffs between blocks and the size of its words, and the refusal flags of the host's
 * check kernels. Included by mt_gpu_attention_kernels.cuh (the kernels and their launch plan);
 * compiled as C++ by tests/c/attn_gpu_emulate.cc with MT_EMULATED_GPU, as the kernels are. */
#ifndef MT_GPU_ATTENTION_RELAY_CUH
#define MT_GPU_ATTENTION_RELAY_CUH

#include <stdint.h>
#if defined(__CUDACC__) || defined(__HIPCC__)
#include "mt_gpu.h"          /* the runtime header (HIP needs it before mt_pinned.h) */
#endif
#include "mojo_train.h"
#include "mt_attention_args.h"
#include "mt_pinned.h"

/* What the kernels read: the call (device pointers), the row deltas (B*H*Tq floats, the
 * backward's) and the refusal flags of the host's check kernels (int32[MT_ATTN_FLAGS], zeroed
 * before the call; the attention kernels do not touch them). */
/* The relay's handoffs. take: a block's work index, in the order blocks start (a block waits
 * only on blocks with smaller indices, so on blocks already running or done: no deadlock
 * whatever order the hardware starts blocks in). wait: until *word == value, then the writes
 * published with it are visible to the block (after its barrier). publish: *word = value after
 * the block's writes (after its barrier). load (load4: four, 16-byte aligned): a float another
 * block wrote, never from a stale L1 line. */
#if defined(MT_EMULATED_GPU)
inline int32_t mt_relay_take(int32_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }
inline void mt_relay_wait(const int32_t *word, int32_t value) {   /* blocks run one at a time there, in */
    if (__atomic_load_n(word, __ATOMIC_ACQUIRE) != value)          /* take order: a wait must find its word */
        throw std::runtime_error("dq relay: waited for " + std::to_string(value) + ", the word holds " +
                                 std::to_string(__atomic_load_n(word, __ATOMIC_ACQUIRE)));
}
inline void mt_relay_publish(int32_t *word, int32_t value) { __atomic_store_n(word, value, __ATOMIC_RELEASE); }
inline float mt_relay_load(const float *p) { return *p; }
inline float4 mt_relay_load4(const float *p) { return *(const float4 *)p; }
#else   /* mt_gpu.h's device-scope words */
__device__ __forceinline__ int32_t mt_relay_take(int32_t *counter) { return atomicAdd(counter, 1); }
__device__ __forceinline__ void mt_relay_wait(const int32_t *word, int32_t value) {
    while (mt_load_acquire_gpu(word) != value) mt_spin_pause();
}
__device__ __forceinline__ void mt_relay_publish(int32_t *word, int32_t value) { mt_store_release_gpu(word, value); }
#if defined(__HIPCC__) || defined(MT_HIP)
__device__ __forceinline__ float mt_relay_load(const float *p) { return *p; }   /* after an acquire at agent scope */
__device__ __forceinline__ float4 mt_relay_load4(const float *p) { return *(const float4 *)p; }
#else
__device__ __forceinline__ float mt_relay_load(const float *p) { return __ldcg(p); }
__device__ __forceinline__ float4 mt_relay_load4(const float *p) { return __ldcg((const float4 *)p); }
#endif
#endif

struct mt_attn_dev {
    mt_attn_args a;
    float *delta;
    int32_t *flags;
    int32_t *relay;     /* the dq relay's words (mt_attn_relay_words, zeroed before the backward), or NULL */
};

/* The dq relay (the backward with dq asked for and at least one key block): the dk/dv kernel's
 * block of key block kb, having formed ds of a query tile, continues that tile's dq chains over
 * its keys, from where block kb - 1 left them in dq, and hands them on. Its words: one a query
 * tile of each (batch, head), the count of key blocks whose part of the tile's chains is in dq;
 * then the count of blocks that have taken their work. */
inline int64_t mt_attn_relay_words(const mt_attn_args &a) {
    return a.B * a.H * ((a.Tq + MT_ATTN_KEY_BLOCK - 1) / MT_ATTN_KEY_BLOCK) + 1;
}

enum { MT_ATTN_FLAG_Q, MT_ATTN_FLAG_K, MT_ATTN_FLAG_V, MT_ATTN_FLAG_DOUT, MT_ATTN_FLAG_OUT, MT_ATTN_FLAG_LSE,
       MT_ATTN_FLAG_MASK, MT_ATTN_FLAGS = 8 };

#endif /* MT_GPU_ATTENTION_RELAY_CUH */
