// mt_metal_emulator.cpp -- the Metal runtime of mt_metal_runtime.h on a CPU: buffers are aligned
// host blocks, and a dispatch runs its threadgroups one after another on the calling thread. A
// kernel without barriers runs thread after thread; one with barriers (mt_metal_kernels.h) runs
// its group's threads as fibers that all stop at each threadgroup_barrier before any goes on, so
// a group's `threadgroup` arrays (statics here) are shared as on the GPU. Float behaviour is the
// kernels' translation unit's (mt_metal_emulator_kernels.cpp): IEEE, or the flush rule.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <ucontext.h>
#include <vector>
#include "mt_host.h"
#include "mt_metal_emulator.h"
#include "../mt_metal_runtime.h"

struct mt_mtl_buffer {
    void *mem;
};

namespace {

std::mutex g_run;   // one dispatch at a time: the kernels' threadgroup statics are shared

struct fiber {
    ucontext_t ctx;
    std::vector<char> stack;
    int state;   // 0 running, 1 at a barrier, 2 done
};

struct group_run {
    ucontext_t main;
    std::vector<fiber> fibers;
    int current;
    mt_emu_thread_fn fn;
    void *const *args;
    std::vector<mt_emu_thread> coords;
};

thread_local group_run *t_group;   // the group whose fibers run now (barriers find it)
thread_local bool t_barrier_misuse;

void fiber_entry() {
    group_run *g = t_group;
    int me = g->current;
    g->fn(g->args, &g->coords[me]);
    g->fibers[me].state = 2;
    swapcontext(&g->fibers[me].ctx, &g->main);
}

const char *run_group_fibers(group_run &g, uint32_t size) {
    constexpr size_t kStack = 256 * 1024;
    g.fibers.resize(size);
    for (uint32_t l = 0; l < size; ++l) {
        fiber &f = g.fibers[l];
        f.stack.resize(kStack);
        f.state = 0;
        getcontext(&f.ctx);
        f.ctx.uc_stack.ss_sp = f.stack.data();
        f.ctx.uc_stack.ss_size = kStack;
        f.ctx.uc_link = nullptr;
        makecontext(&f.ctx, fiber_entry, 0);
    }
    t_group = &g;
    for (;;) {
        int at_barrier = 0, done = 0;
        for (uint32_t l = 0; l < size; ++l) {
            if (g.fibers[l].state == 2) { ++done; continue; }
            g.fibers[l].state = 0;
            g.current = (int)l;
            swapcontext(&g.main, &g.fibers[l].ctx);
            if (g.fibers[l].state == 1) ++at_barrier;
            else ++done;
        }
        if (done == (int)size) break;
        if (done) { t_group = nullptr; return "threads of one threadgroup ended while others waited at a barrier"; }
        (void)at_barrier;
    }
    t_group = nullptr;
    return nullptr;
}

}  // namespace

extern "C" void mt_emu_barrier(void) {
    group_run *g = t_group;
    if (!g) { t_barrier_misuse = true; return; }
    int me = g->current;
    g->fibers[me].state = 1;
    swapcontext(&g->fibers[me].ctx, &g->main);
}

extern "C" {

int mt_mtl_open(void) { return MT_OK; }

const char *mt_mtl_device_name(void) { return "the Metal emulator (the kernels run as C++ on this CPU)"; }

int mt_mtl_buffer_new(mt_mtl_buffer **out, void **contents, int64_t bytes) {
    size_t n = ((size_t)bytes + 255) / 256 * 256;
    void *mem = std::aligned_alloc(256, n ? n : 256);
    mt_mtl_buffer *b = mem ? new (std::nothrow) mt_mtl_buffer{mem} : nullptr;
    if (!b) {
        std::free(mem);
        return mt_fail(MT_ENOMEM, "cannot allocate %lld bytes of (emulated) Metal memory", (long long)bytes);
    }
    *out = b;
    *contents = mem;
    return MT_OK;
}

void mt_mtl_buffer_release(mt_mtl_buffer *b) {
    if (!b) return;
    std::free(b->mem);
    delete b;
}

int mt_mtl_run(const char *kernel, const mt_mtl_arg *args, int32_t n_args, uint32_t groups, uint32_t group_size) {
    mt_emu_thread_fn fn;
    int barriers;
    if (!mt_emu_kernel(kernel, &fn, &barriers))
        return mt_fail(MT_EDEVICE, "the Metal library has no kernel %s", kernel);
    std::vector<void *> bound((size_t)n_args);
    for (int32_t k = 0; k < n_args; ++k)
        bound[k] = args[k].buffer ? (void *)((char *)args[k].buffer->mem + args[k].offset) : (void *)args[k].bytes;
    std::lock_guard<std::mutex> hold(g_run);
    const uint32_t grid_size = groups * group_size;
    t_barrier_misuse = false;
    group_run g;
    g.fn = fn;
    g.args = bound.data();
    g.coords.resize(group_size);
    for (uint32_t q = 0; q < groups; ++q) {
        for (uint32_t l = 0; l < group_size; ++l)
            g.coords[l] = mt_emu_thread{q * group_size + l, grid_size, l, q, group_size};
        if (!barriers) {
            for (uint32_t l = 0; l < group_size; ++l) fn(g.args, &g.coords[l]);
            if (t_barrier_misuse)
                return mt_fail(MT_EDEVICE, "kernel %s reached a threadgroup barrier but mt_metal_kernels.h says it "
                               "uses none", kernel);
        } else if (const char *why = run_group_fibers(g, group_size)) {
            return mt_fail(MT_EDEVICE, "kernel %s: %s", kernel, why);
        }
    }
    return MT_OK;
}

}  // extern "C"
