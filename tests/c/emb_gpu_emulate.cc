/* emb_gpu_emulate.cc -- native/cuda/mt_gpu_embedding.cu (host glue and kernels) compiled as
 * C++ over the CPU emulation of emb_gpu_emulate.h, as a shared library exporting the
 * embedding's two ABI calls and emu_geometry. tests/test_embedding.py builds it with
 *   c++ -std=c++17 -shared -Inative/include -Inative/common -Itests/c \
 *       tests/c/emb_gpu_emulate.cc mt_host.o
 * and compares its bits with the CPU oracle's. */
#define MT_EMB_EMULATE
#include "../../native/cuda/mt_gpu_embedding.cu"

extern "C" {
/* The other op families' feature bits, which mt_host.c's mt_features asks for. */
uint64_t mt_vendor_features(void) { return 0; }
uint64_t mt_optim_features(void) { return 0; }
uint64_t mt_clip_features(void) { return 0; }
uint64_t mt_loss_features(void) { return 0; }
uint64_t mt_linear_features(void) { return 0; }
uint64_t mt_rms_norm_features(void) { return 0; }
uint64_t mt_layer_norm_features(void) { return 0; }
uint64_t mt_attention_features(void) { return 0; }
uint64_t mt_lm_head_features(void) { return 0; }
uint64_t mt_random_features(void) { return 0; }
uint64_t mt_accumulate_features(void) { return 0; }
uint64_t mt_elementwise_features(void) { return 0; }
uint64_t mt_schedule_features(void) { return 0; }

/* Threads per block, the block budget (0: 64), whether leaf partials may be kept, and whether
 * the thread has a mapped status word. */
__attribute__((visibility("default"))) void emu_geometry(int threads, int max_blocks, int part_cap, int mapped) {
    emu_threads = threads;
    emu_max_blocks = max_blocks;
    emu_part_cap = part_cap;
    emu_mapped = mapped;
}

/* "Device" memory for a test's buffers (used in place, never staged), filled with byte `fill`. */
__attribute__((visibility("default"))) void *emu_device_alloc(int64_t bytes, int fill) {
    void *p = malloc((size_t)bytes);
    if (p) {
        memset(p, fill, (size_t)bytes);
        emu_device[(uintptr_t)p] = (size_t)bytes;
    }
    return p;
}

__attribute__((visibility("default"))) void emu_device_free(void *p) {
    emu_device.erase((uintptr_t)p);
    free(p);
}
}
