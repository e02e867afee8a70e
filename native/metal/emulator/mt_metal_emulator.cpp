// mt_metal_emulator.cpp -- the Metal runtime of mt_metal_runtime.h on a CPU: buffers are aligned
// host blocks, and a dispatch runs its threads one after another on the calling thread, in the
// order of their grid positions. That is all a kernel without threadgroup barriers needs, and the
// library's kernels have none yet (tests/test_metal_shim.py holds them to it); kernels that share
// threadgroup memory will need the threads of a group run as fibers that meet at each barrier.
// Float behaviour is the kernels' translation unit's (mt_metal_emulator_kernels.cpp): IEEE, or the
// flush rule.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <vector>
#include <unistd.h>
#include "mt_host.h"
#include "mt_metal_emulator.h"
#include "../mt_metal_runtime.h"

struct mt_mtl_buffer {
    void *mem;
    bool owned;    // false: the caller's pages (mt_mtl_buffer_wrap)
};

namespace {
std::mutex g_run;   // one dispatch at a time
}  // namespace

extern "C" {

int mt_mtl_open(void) { return MT_OK; }

int mt_mtl_buffer_new(mt_mtl_buffer **out, void **contents, int64_t bytes) {
    size_t n = ((size_t)bytes + 255) / 256 * 256;
    void *mem = std::aligned_alloc(256, n ? n : 256);
    mt_mtl_buffer *b = mem ? new (std::nothrow) mt_mtl_buffer{mem, true} : nullptr;
    if (!b) {
        std::free(mem);
        return mt_fail(MT_ENOMEM, "cannot allocate %lld bytes of (emulated) Metal memory", (long long)bytes);
    }
    *out = b;
    *contents = mem;
    return MT_OK;
}

int64_t mt_mtl_page_bytes(void) { return (int64_t)sysconf(_SC_PAGESIZE); }

int mt_mtl_buffer_wrap(mt_mtl_buffer **out, void *host, int64_t bytes) {
    (void)bytes;
    mt_mtl_buffer *b = new (std::nothrow) mt_mtl_buffer{host, false};
    if (!b) return mt_fail(MT_ENOMEM, "out of host memory");
    *out = b;
    return MT_OK;
}

void mt_mtl_buffer_release(mt_mtl_buffer *b) {
    if (!b) return;
    if (b->owned) std::free(b->mem);
    delete b;
}

int mt_mtl_run(const char *kernel, const mt_mtl_arg *args, int32_t n_args, uint32_t groups, uint32_t group_size,
               uint32_t *ran) {
    if (ran) *ran = group_size;
    mt_emu_thread_fn fn;
    if (!mt_emu_kernel(kernel, &fn))
        return mt_fail(MT_EDEVICE, "the Metal library has no kernel %s", kernel);
    std::vector<void *> bound((size_t)n_args);
    for (int32_t k = 0; k < n_args; ++k)
        bound[k] = args[k].buffer ? (void *)((char *)args[k].buffer->mem + args[k].offset) : (void *)args[k].bytes;
    std::lock_guard<std::mutex> hold(g_run);
    const uint32_t grid_size = groups * group_size;
    mt_fp_env env;      // a GPU's arithmetic ignores the calling thread's flush-to-zero flags
    mt_fp_begin(&env);
    for (uint32_t q = 0; q < groups; ++q)
        for (uint32_t l = 0; l < group_size; ++l) {
            const mt_emu_thread t = {q * group_size + l, grid_size, l, q, group_size};
            fn(bound.data(), &t);
        }
    mt_fp_end(&env);
    return MT_OK;
}

}  // extern "C"
