/* attn_gpu_emulate.h -- the CUDA features a cooperative kernel header uses (block barriers, warp
 * shuffles, dynamic shared memory), emulated on the CPU with real threads, so GPU kernels can be
 * compiled as plain C++ and their output bytes compared with the CPU oracle's. Included instead of
 * the CUDA runtime, before the kernel header (tests/c/attn_gpu_emulate.cc does it for
 * native/cuda/mt_gpu_attention_kernels.cuh).
 *
 * Execution model. emu_launch(grid, threads, smem_bytes, kernel, args...) runs the grid's blocks
 * one after another in a shuffled order (a kernel that assumes an order of blocks shows), and each
 * block's `threads` threads concurrently, on a pool of std::threads (thread t of a block is pool
 * worker t). Each thread calls kernel with its own copy of the arguments. threadIdx, blockIdx,
 * blockDim and gridDim are thread_local (x only; y = z = 0 or 1). Lane = linear index % 32, warp =
 * linear index / 32. The dynamic shared memory (emu_dynamic_smem(), MT_ATTN_SMEM_DECL) is filled
 * with 0xFF bytes (a NaN as float) before every block and ends at an inaccessible page, so reading
 * an unwritten element gives NaN and running past its end faults. `__shared__` is `static`: blocks
 * never overlap, so one copy per kernel serves (not refilled between blocks; no initializers).
 *
 * Synchronization. __syncthreads and __syncthreads_or are one barrier of the block; every warp
 * operation (__shfl_*_sync, __syncwarp, __ballot_sync, __any_sync, __all_sync) is a barrier of the
 * warp's lanes: each lane writes its value in a slot, waits for the warp, reads its source's slot.
 * The slots are double-buffered by call parity, so a fast lane's next call cannot overwrite a
 * value a slow lane has still to read (that lane must reach the next call's barrier first).
 * Barriers are atomic counters with futex waits (std::atomic::wait), acquire/release, so memory
 * written before a barrier is visible after it, as on a GPU; not std::barrier, which can neither
 * time out nor be broken, so it could not report the errors below. The cost is a few context
 * switches a thread: about 0.5 ms per barrier of 256 threads on two cores.
 *
 * Errors are reported, not left to hang: emu_launch throws emu::launch_error naming the kernel's
 * launch, block and thread when
 *   - a kernel throws, or a thread of the block asks for a barrier after another thread of it has
 *     returned (a `return` before a __syncthreads: a GPU would hang or misbehave too), or returns
 *     while others wait at one; the same for a warp's lanes;
 *   - threads meet at one barrier through different operations (__syncthreads with
 *     __syncthreads_or; shuffles of different kinds, lane masks, widths, or a mask other than
 *     every lane of the warp);
 *   - every thread left is waiting and nothing moves for EMU_DEADLOCK_MS milliseconds (default
 *     3000): a deadlock; the message lists where each thread waits;
 *   - grid or threads is 0, threads > 1024, or smem_bytes > 227 KiB (invalid launches on a GPU).
 * A thread still computing when its block has failed is waited for; if nothing at all moves for
 * EMU_HANG_S seconds (default 300) the process prints the threads' states and exits (status 3).
 * A segmentation fault in a kernel thread prints the launch, block and thread before dying.
 *
 * Environment: EMU_SEED (the block-order seed base), EMU_DEADLOCK_MS, EMU_HANG_S.
 * Not emulated: atomics, textures, cooperative groups, static __shared__ with initializers,
 * extern __shared__ (use MT_ATTN_SMEM_DECL), shuffles with partial masks, 2-D/3-D launches.
 */
#ifndef ATTN_GPU_EMULATE_H
#define ATTN_GPU_EMULATE_H
#define MT_EMULATED_GPU 1

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>
#include <math.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

/* ---- the CUDA spellings ---------------------------------------------------------------------- */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
typedef dim3 uint3;
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(8) float2 {
    float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

inline thread_local dim3 threadIdx(0, 0, 0), blockIdx(0, 0, 0), blockDim(1, 1, 1), gridDim(1, 1, 1);
static constexpr int warpSize = 32;

inline unsigned __float_as_uint(float x) { unsigned u; memcpy(&u, &x, 4); return u; }
inline float __uint_as_float(unsigned u) { float x; memcpy(&x, &u, 4); return x; }
inline int __float_as_int(float x) { int u; memcpy(&u, &x, 4); return u; }
inline float __int_as_float(int u) { float x; memcpy(&x, &u, 4); return x; }
/* The correctly rounded intrinsics are the plain operations here (g++ -ffp-contract=off). */
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
template <class T> inline T __ldg(const T *p) { return *p; }
/* The project's asynchronous copies (native/cuda/mt_gpu.h) as HIP has them: a plain copy now,
 * commit and wait doing nothing (the barrier after them orders the copy). */
inline void mt_cp_async16(float *smem, const float *gmem, int src_bytes) {
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    memcpy(v, gmem, (size_t)src_bytes);
    memcpy(smem, v, 16);
}
inline void mt_cp_async4(float *smem, const float *gmem, int src_bytes) { *smem = src_bytes ? *gmem : 0.0f; }
inline void mt_cp_async_commit() {}
template <int N> inline void mt_cp_async_wait() {}

namespace emu {

struct launch_error : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct broken_block {};                     /* thrown in a thread whose block has already failed */

enum { RUNNING = 0, AT_SYNC, AT_WARP, EXITED, IDLE };
enum { OP_SYNC = 1, OP_SYNC_OR, OP_SHFL_XOR, OP_SHFL_IDX, OP_SHFL_DOWN, OP_SHFL_UP, OP_SYNCWARP, OP_BALLOT };

inline const char *op_name(int op) {
    static const char *names[] = {"?", "__syncthreads", "__syncthreads_or", "__shfl_xor_sync", "__shfl_sync",
                                  "__shfl_down_sync", "__shfl_up_sync", "__syncwarp", "__ballot/any/all_sync"};
    return op >= 0 && op <= OP_BALLOT ? names[op] : "?";
}

/* A barrier of n participants: the last to arrive runs the check and bumps the generation. */
struct Barrier {
    std::atomic<unsigned> arrived{0};
    std::atomic<unsigned> gen{0};
};

/* What one thread put in for its current barrier (read by the barrier's last arriver). */
struct Slot {
    uint64_t value[2];                          /* the shuffle value, by call parity */
    int op, arg1, arg2;                         /* the operation, lane mask / source / delta, width */
    int vote;                                   /* a ballot's predicate, or __syncthreads_or's */
    unsigned mask;
    std::atomic<int> state{IDLE};
    unsigned syncs = 0, warp_ops = 0;           /* how many of each this thread has done */
};

struct Block {
    unsigned threads = 0, warps = 0;
    float *smem = nullptr;
    Barrier sync;
    std::vector<Barrier> warp_bar;
    std::vector<Slot> slot;
    std::vector<std::atomic<unsigned>> warp_exited;
    std::atomic<unsigned> exited{0};
    int or_result = 0;
    std::vector<uint32_t> ballot;               /* per warp, written by the warp barrier's last arriver */
    std::atomic<bool> broken{false};
    std::mutex error_mutex;
    std::string error;
};

struct State {
    std::vector<std::thread> workers;
    /* go[i]: a new value (blocks_run) tells worker i to run the current block, UINT64_MAX to
     * quit; only the block's workers are woken, so an idle one never reads a later block's
     * settings */
    struct alignas(64) Go {
        std::atomic<uint64_t> seq{0};
    };
    std::unique_ptr<Go[]> go{new Go[1024]};
    uint64_t blocks_run = 0;
    std::atomic<unsigned> done{0};
    std::atomic<uint64_t> progress{0};
    std::mutex done_mutex;
    std::condition_variable done_cv;
    unsigned active = 0;
    std::function<void()> body;
    Block *block = nullptr;
    unsigned char *smem_map = nullptr;
    size_t smem_map_bytes = 0, smem_max_seen = 0;
    unsigned long launches = 0;
    std::string label;                          /* what the driver says it is running */
};
inline State &state() {
    static State s;
    return s;
}

inline thread_local Block *cur = nullptr;
inline thread_local unsigned me = 0;            /* linear thread index within the block */

inline void fail(Block *b, const std::string &what) {
    {
        std::lock_guard<std::mutex> g(b->error_mutex);
        if (b->error.empty()) b->error = what;
    }
    if (!b->broken.exchange(true)) {            /* wake every waiter: each sees broken and unwinds */
        b->sync.gen.fetch_add(1);
        b->sync.gen.notify_all();
        for (auto &w : b->warp_bar) {
            w.gen.fetch_add(1);
            w.gen.notify_all();
        }
    }
}

inline std::string where() {
    return "block " + std::to_string(blockIdx.x) + " thread " + std::to_string(me);
}

/* Arrive at barrier bar of n participants; the last arriver runs complete(), which returns an
 * error text or "". A waiter that finds a participant already returned (*exited > 0, checked
 * after its own arrival, so a thread returning at the same time sees the arrival) while the
 * barrier is still open fails the block with lost(). Throws broken_block if the block has failed. */
template <class Complete, class Lost>
inline void arrive(Barrier &bar, unsigned n, int waiting_state, const std::atomic<unsigned> *exited,
                   Complete &&complete, Lost &&lost) {
    Block *b = cur;
    Slot &s = b->slot[me];
    unsigned g = bar.gen.load(std::memory_order_acquire);
    if (b->broken.load()) throw broken_block{};
    s.state.store(waiting_state);
    if (bar.arrived.fetch_add(1) + 1 == n) {    /* all n arrived: none of them has returned */
        std::string err = complete();
        if (!err.empty()) {
            fail(b, err);
            throw broken_block{};
        }
        bar.arrived.store(0);
        bar.gen.fetch_add(1, std::memory_order_release);
        bar.gen.notify_all();
        state().progress.fetch_add(1, std::memory_order_relaxed);
    } else {
        /* Only while this barrier is still open: a thread that passed it (its last arriver came
         * while this one was descheduled between its arrival and here) may already have returned
         * -- that is no error (seen under load on a 16-core machine, 2026-12-03). A thread that
         * returned without arriving leaves it open for good. */
        if (exited->load() > 0 && bar.gen.load(std::memory_order_acquire) == g) {
            fail(b, lost());
            throw broken_block{};
        }
        while (bar.gen.load(std::memory_order_acquire) == g) bar.gen.wait(g, std::memory_order_acquire);
    }
    s.state.store(RUNNING);
    if (b->broken.load()) throw broken_block{};
}

inline void block_sync(int op, int value) {
    Block *b = cur;
    Slot &s = b->slot[me];
    s.op = op;
    s.vote = value;
    ++s.syncs;
    arrive(b->sync, b->threads, AT_SYNC, &b->exited, [b]() -> std::string {
        int o = 0;
        for (unsigned t = 0; t < b->threads; ++t) {
            if (b->slot[t].op != b->slot[0].op)
                return std::string("threads of block ") + std::to_string(blockIdx.x) + " meet at one barrier through " +
                       op_name(b->slot[0].op) + " (thread 0) and " + op_name(b->slot[t].op) + " (thread " +
                       std::to_string(t) + ")";
            o |= b->slot[t].vote != 0;
        }
        b->or_result = o;
        return "";
    }, [&s, op]() {
        return where() + " reaches " + op_name(op) + " #" + std::to_string(s.syncs) +
               " after another thread of its block returned (every thread must reach every barrier)";
    });
}

/* One warp operation: every lane of the warp puts in (op, a1, a2, mask, value); returns the
 * value of lane src (computed from the lane by pick) after the warp's barrier. */
template <class Pick>
inline uint64_t warp_op(int op, int a1, int a2, unsigned mask, uint64_t value, Pick &&pick, int vote = 0) {
    Block *b = cur;
    Slot &s = b->slot[me];
    unsigned w = me / 32, first = w * 32, n = std::min(32u, b->threads - first);
    int parity = s.warp_ops++ & 1;
    s.op = op, s.arg1 = a1, s.arg2 = a2, s.mask = mask, s.vote = vote;
    s.value[parity] = value;
    arrive(b->warp_bar[w], n, AT_WARP, &b->warp_exited[w], [b, first, n, w]() -> std::string {
        const Slot &s0 = b->slot[first];
        uint32_t votes = 0;
        for (unsigned l = 0; l < n; ++l) {
            const Slot &x = b->slot[first + l];
            if (x.op != s0.op || x.arg1 != s0.arg1 || x.arg2 != s0.arg2 || x.mask != s0.mask)
                return std::string("lanes 0 and ") + std::to_string(l) + " of warp " + std::to_string(w) + " of block " +
                       std::to_string(blockIdx.x) + " meet through different warp operations (" + op_name(s0.op) +
                       " arg " + std::to_string(s0.arg1) + " vs " + op_name(x.op) + " arg " + std::to_string(x.arg1) +
                       "; lane-dependent lane masks, widths or masks are not emulated)";
            if (x.mask != 0xffffffffu && x.mask != (n == 32 ? 0xffffffffu : (1u << n) - 1u))
                return std::string("a warp operation with mask ") + std::to_string(x.mask) +
                       " (only every lane of the warp is emulated)";
            votes |= (uint32_t)(x.vote != 0) << l;
        }
        b->ballot[w] = votes;
        return "";
    }, [&s, op]() {
        return where() + " calls " + op_name(op) + " #" + std::to_string(s.warp_ops) +
               " after a lane of its warp returned";
    });
    if (op == OP_SYNCWARP || op == OP_BALLOT) return 0;
    unsigned lane = me - first;
    unsigned src = pick(lane);
    if (src >= n) {
        fail(b, where() + ": " + op_name(op) + " reads lane " + std::to_string(src) + ", which the warp lacks (" +
                    std::to_string(n) + " lanes)");
        throw broken_block{};
    }
    return b->slot[first + src].value[parity];
}

template <class T> inline uint64_t to_bits(T v) {
    static_assert(sizeof(T) <= 8, "shuffles of at most 8 bytes");
    uint64_t u = 0;
    memcpy(&u, &v, sizeof(T));
    return u;
}
template <class T> inline T from_bits(uint64_t u) {
    T v;
    memcpy(&v, &u, sizeof(T));
    return v;
}
inline bool width_ok(int width) { return width >= 1 && width <= 32 && (width & (width - 1)) == 0; }

/* ---- the launch ------------------------------------------------------------------------------- */

inline void on_segv(int sig, siginfo_t *info, void *) {
    static std::atomic<int> first{0};
    if (first.exchange(1)) for (;;) pause();    /* one thread reports; the others wait for the end */
    char buf[256];
    int n = snprintf(buf, sizeof buf, "\nemulator: signal %d at address %p in %s (launch %lu, block %u, thread %u)\n",
                     sig, info->si_addr, cur ? "a kernel thread" : "the host thread", state().launches, blockIdx.x,
                     me);
    if (n > 0) (void)!write(2, buf, (size_t)n);
    if (!state().label.empty()) {
        (void)!write(2, "emulator: case ", 15);
        (void)!write(2, state().label.data(), state().label.size());
        (void)!write(2, "\n", 1);
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

inline void install_fault_handler() {
    static bool done = false;
    if (done) return;
    done = true;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    sigaction(SIGFPE, &sa, nullptr);
}

inline long env_long(const char *name, long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, nullptr, 10) : fallback;
}

inline void worker_main(unsigned index) {
    State &S = state();
    uint64_t seen = 0;
    for (;;) {
        uint64_t e;
        std::atomic<uint64_t> &go = S.go[index].seq;
        while ((e = go.load(std::memory_order_acquire)) == seen) go.wait(seen, std::memory_order_acquire);
        seen = e;
        if (e == UINT64_MAX) return;            /* the pool shuts down */
        const unsigned active = S.active;
        Block *b = S.block;
        cur = b;
        me = index;
        threadIdx = dim3(index, 0, 0);
        Slot &s = b->slot[index];
        s.state.store(RUNNING);
        try {
            S.body();
        } catch (const broken_block &) {
        } catch (const std::exception &x) {
            fail(b, where() + " threw: " + x.what());
        } catch (...) {
            fail(b, where() + " threw an exception");
        }
        /* Returning: an error if others of the block (or warp) wait at a barrier now. */
        b->exited.fetch_add(1);
        b->warp_exited[index / 32].fetch_add(1);
        s.state.store(EXITED);
        if (!b->broken.load()) {
            unsigned at_sync = b->sync.arrived.load(), at_warp = b->warp_bar[index / 32].arrived.load();
            if (at_sync || at_warp)
                fail(b, where() + " returned while " + std::to_string(at_sync ? at_sync : at_warp) + " thread(s) wait at " +
                            (at_sync ? "__syncthreads" : "a warp operation") + " (after " + std::to_string(s.syncs) +
                            " __syncthreads of its own)");
        }
        cur = nullptr;
        S.progress.fetch_add(1, std::memory_order_relaxed);
        if (S.done.fetch_add(1) + 1 == active) {   /* after this, S is the next block's */
            std::lock_guard<std::mutex> g(S.done_mutex);
            S.done_cv.notify_all();
        }
    }
}

inline void shutdown_pool() {
    State &S = state();
    for (size_t i = 0; i < S.workers.size(); ++i) {
        S.go[i].seq.store(UINT64_MAX);
        S.go[i].seq.notify_all();
    }
    for (auto &t : S.workers) t.join();
    S.workers.clear();
}

inline void ensure_workers(unsigned n) {
    State &S = state();
    if (S.workers.empty()) std::atexit(shutdown_pool);
    while (S.workers.size() < n) {
        unsigned i = (unsigned)S.workers.size();
        S.workers.emplace_back(worker_main, i);
    }
}

/* The states of a block's threads, as ranges: "threads 0-31 at __syncthreads #4, ...". */
inline std::string describe(Block *b) {
    std::string out;
    auto one = [&](unsigned t) {
        const Slot &s = b->slot[t];
        int st = s.state.load();
        if (st == AT_SYNC) return std::string("at ") + op_name(s.op) + " #" + std::to_string(s.syncs);
        if (st == AT_WARP) return std::string("at ") + op_name(s.op) + " #" + std::to_string(s.warp_ops) + " of its warp";
        if (st == EXITED) return std::string("returned");
        return std::string("running");
    };
    unsigned t0 = 0;
    std::string d0 = one(0);
    for (unsigned t = 1; t <= b->threads; ++t) {
        std::string d = t < b->threads ? one(t) : std::string();
        if (t == b->threads || d != d0) {
            out += (out.empty() ? "" : "; ") +
                   (t - 1 == t0 ? "thread " + std::to_string(t0) : "threads " + std::to_string(t0) + "-" + std::to_string(t - 1)) +
                   " " + d0;
            t0 = t, d0 = d;
        }
    }
    return out;
}

/* Run one block: all its threads at once; returns its error text or "". */
inline std::string run_block(Block &b) {
    State &S = state();
    S.block = &b;
    S.done.store(0);
    ++S.blocks_run;
    for (unsigned i = 0; i < S.active; ++i) {
        S.go[i].seq.store(S.blocks_run, std::memory_order_release);
        S.go[i].seq.notify_all();
    }
    const auto deadlock = std::chrono::milliseconds(env_long("EMU_DEADLOCK_MS", 3000));
    const auto hang = std::chrono::seconds(env_long("EMU_HANG_S", 300));
    uint64_t last = S.progress.load();
    auto since = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(S.done_mutex);
    while (S.done.load() < S.active) {
        S.done_cv.wait_for(lock, std::chrono::milliseconds(100));
        uint64_t now_progress = S.progress.load();
        auto now = std::chrono::steady_clock::now();
        if (now_progress != last) {
            last = now_progress, since = now;
            continue;
        }
        bool all_waiting = true;
        for (unsigned t = 0; t < b.threads; ++t) {
            int st = b.slot[t].state.load();
            all_waiting &= st == AT_SYNC || st == AT_WARP || st == EXITED;
        }
        if (all_waiting && now - since > deadlock && !b.broken.load()) {
            fail(&b, "deadlock: " + describe(&b));
            since = now;
        } else if (now - since > hang) {
            fprintf(stderr, "emulator: nothing moved for %lld s in launch %lu (%s): %s\n",
                    (long long)std::chrono::duration_cast<std::chrono::seconds>(hang).count(), S.launches,
                    S.label.c_str(), describe(&b).c_str());
            fflush(stderr);
            _exit(3);
        }
    }
    return b.error;
}

/* Dynamic shared memory of `bytes`, ending at an inaccessible page, filled with 0xFF. */
inline float *fresh_smem(size_t bytes) {
    State &S = state();
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t rounded = (bytes + 15) / 16 * 16, need = (rounded + page - 1) / page * page + page;
    if (need > S.smem_map_bytes) {
        if (S.smem_map) munmap(S.smem_map, S.smem_map_bytes);
        void *p = mmap(nullptr, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) throw launch_error("emulator: cannot map shared memory");
        S.smem_map = (unsigned char *)p, S.smem_map_bytes = need;
        mprotect(S.smem_map + need - page, page, PROT_NONE);
    }
    unsigned char *end = S.smem_map + S.smem_map_bytes - page;
    memset(end - rounded, 0xff, rounded);
    return (float *)(end - rounded);
}

}  // namespace emu

/* ---- what kernels call ------------------------------------------------------------------------ */

inline float *emu_dynamic_smem() { return emu::cur->smem; }
#ifndef MT_ATTN_SMEM_DECL
#define MT_ATTN_SMEM_DECL(name) float *name = emu_dynamic_smem()
#endif

inline void __syncthreads() { emu::block_sync(emu::OP_SYNC, 0); }
inline int __syncthreads_or(int p) {
    emu::block_sync(emu::OP_SYNC_OR, p);
    return emu::cur->or_result;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) {
    emu::warp_op(emu::OP_SYNCWARP, 0, 0, mask, 0, [](unsigned l) { return l; });
}
inline unsigned __ballot_sync(unsigned mask, int p) {
    emu::warp_op(emu::OP_BALLOT, 0, 0, mask, 0, [](unsigned l) { return l; }, p != 0);
    return emu::cur->ballot[emu::me / 32];
}
inline int __any_sync(unsigned mask, int p) { return __ballot_sync(mask, p) != 0; }
inline int __all_sync(unsigned mask, int p) {
    unsigned n = std::min(32u, emu::cur->threads - emu::me / 32 * 32);
    return __ballot_sync(mask, p) == (n == 32 ? 0xffffffffu : (1u << n) - 1u);
}

template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int laneMask, int width = 32) {
    if (!emu::width_ok(width)) throw std::invalid_argument("__shfl_xor_sync: width must be a power of 2 <= 32");
    return emu::from_bits<T>(emu::warp_op(emu::OP_SHFL_XOR, laneMask, width, mask, emu::to_bits(v), [=](unsigned l) {
        unsigned src = l ^ (unsigned)laneMask, base = l & ~(unsigned)(width - 1);
        return src >= base + (unsigned)width ? l : src;     /* a later group: the caller's own value */
    }));
}
template <class T>
inline T __shfl_sync(unsigned mask, T v, int srcLane, int width = 32) {
    if (!emu::width_ok(width)) throw std::invalid_argument("__shfl_sync: width must be a power of 2 <= 32");
    return emu::from_bits<T>(emu::warp_op(emu::OP_SHFL_IDX, srcLane, width, mask, emu::to_bits(v), [=](unsigned l) {
        return (l & ~(unsigned)(width - 1)) + ((unsigned)srcLane & (unsigned)(width - 1));
    }));
}
template <class T>
inline T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    if (!emu::width_ok(width)) throw std::invalid_argument("__shfl_down_sync: width must be a power of 2 <= 32");
    return emu::from_bits<T>(emu::warp_op(emu::OP_SHFL_DOWN, (int)delta, width, mask, emu::to_bits(v), [=](unsigned l) {
        unsigned in_group = l & (unsigned)(width - 1);
        return in_group + delta < (unsigned)width ? l + delta : l;
    }));
}
template <class T>
inline T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = 32) {
    if (!emu::width_ok(width)) throw std::invalid_argument("__shfl_up_sync: width must be a power of 2 <= 32");
    return emu::from_bits<T>(emu::warp_op(emu::OP_SHFL_UP, (int)delta, width, mask, emu::to_bits(v), [=](unsigned l) {
        unsigned in_group = l & (unsigned)(width - 1);
        return in_group >= delta ? l - delta : l;
    }));
}

/* ---- the host side ---------------------------------------------------------------------------- */

/* What the driver is running (printed with a fault or a hang). */
inline void emu_set_label(const std::string &label) { emu::state().label = label; }
/* The largest dynamic shared memory a launch has asked for so far. */
inline size_t emu_smem_max_seen() { return emu::state().smem_max_seen; }

/* Run kernel(args...) over grid blocks of threads threads with smem_bytes of dynamic shared
 * memory; returns when every block has finished. Throws emu::launch_error on an invalid launch or
 * a failed block (the first error of the first failing block). */
template <class K, class... A>
void emu_launch(unsigned grid, unsigned threads, size_t smem_bytes, K kernel, A... args) {
    emu::State &S = emu::state();
    ++S.launches;
    const std::string launch = "launch " + std::to_string(S.launches) + " (grid " + std::to_string(grid) + ", " +
                               std::to_string(threads) + " threads, " + std::to_string(smem_bytes) +
                               " bytes of shared memory)";
    if (grid == 0 || threads == 0 || threads > 1024)
        throw emu::launch_error(launch + ": an invalid configuration on a GPU (grid and threads must be 1 .. "
                                "2^31-1 and 1 .. 1024)");
    if (smem_bytes > 227u * 1024u)
        throw emu::launch_error(launch + ": more dynamic shared memory than a GPU block can have (227 KiB)");
    S.smem_max_seen = std::max(S.smem_max_seen, smem_bytes);
    emu::install_fault_handler();
    emu::ensure_workers(threads);
    const std::tuple<A...> params(args...);
    S.active = threads;
    std::vector<unsigned> order(grid);
    std::iota(order.begin(), order.end(), 0u);
    std::shuffle(order.begin(), order.end(), std::mt19937((unsigned)(emu::env_long("EMU_SEED", 0) + S.launches)));
    for (unsigned bx : order) {
        emu::Block b;
        b.threads = threads;
        b.warps = (threads + 31) / 32;
        b.warp_bar = std::vector<emu::Barrier>(b.warps);
        b.slot = std::vector<emu::Slot>(threads);
        b.warp_exited = std::vector<std::atomic<unsigned>>(b.warps);
        b.ballot.assign(b.warps, 0);
        b.smem = emu::fresh_smem(smem_bytes);
        S.body = [&, bx]() {                    /* run by each thread of the block */
            blockIdx = dim3(bx, 0, 0), gridDim = dim3(grid, 1, 1), blockDim = dim3(threads, 1, 1);
            std::tuple<A...> mine = params;     /* its own copy, as kernel parameters are */
            std::apply(kernel, mine);
        };
        std::string err = emu::run_block(b);
        if (!err.empty()) {
            S.body = nullptr;
            throw emu::launch_error(launch + ", block " + std::to_string(bx) + ": " + err);
        }
    }
    S.body = nullptr;
}

#endif
