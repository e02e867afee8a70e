/* mt_gpu_deferred.cu -- see mt_gpu_deferred.h: the calling thread's ring of slots, its poison
 * word, the flush, and the C ABI's switch (mt_set_deferred_refusals). */
#include <atomic>
#include <stdio.h>
#include <string.h>
#include <string>
#include <vector>
#include "mt_gpu_deferred.h"
#include "mt_embedding.h"   /* after mt_gpu.h (through the line above): HIP defines its keywords there */

#define MT_DEFER_SLOTS 1024   /* calls queued between two synchronizations before one is forced */

namespace {

struct deferred_call {
    int kind = 0;   /* 0: the slot was taken but its call failed before its kernels were queued */
    std::string what, a, b;
    int64_t limit = 0;
};

std::atomic<int> g_pending_threads{0};   /* threads whose deferred_state::taken > 0 */

struct deferred_state {
    bool on = false;
    mt_deferred_slot *slots = nullptr;   /* MT_DEFER_SLOTS, mapped pinned memory */
    int32_t *poison = nullptr;           /* device memory: 1 after a refusal, until the flush */
    int taken = 0;                       /* slots handed out since the last flush */
    std::vector<deferred_call> calls;
    ~deferred_state() {      /* a thread's exit drops what it queued untold */
        if (taken) g_pending_threads.fetch_sub(1, std::memory_order_acq_rel);
        if (slots) gpuFreeHost(slots);
        if (poison) gpuFree(poison);
    }
};
thread_local deferred_state t_def;

/* The slots and the poison word, allocated once per thread. */
int deferred_alloc(void) {
    if (t_def.slots) return MT_OK;
    mt_deferred_slot *slots = nullptr;
    int32_t *poison = nullptr;
    gpuError_t err = gpuMallocHost((void **)&slots, sizeof(mt_deferred_slot) * MT_DEFER_SLOTS);
    if (err == gpuSuccess) err = gpuMalloc((void **)&poison, sizeof(int32_t));
    if (err == gpuSuccess) err = gpuMemsetAsync(poison, 0, sizeof(int32_t), MT_STREAM);
    if (err == gpuSuccess) err = gpuStreamSynchronize(MT_STREAM);
    if (err != gpuSuccess) {
        if (slots) gpuFreeHost(slots);
        if (poison) gpuFree(poison);
        return mt_gpu_error(err, "deferred refusals' status words");
    }
    t_def.slots = slots;
    t_def.poison = poison;
    t_def.calls.assign(MT_DEFER_SLOTS, deferred_call());
    return MT_OK;
}

/* The refusal slot i reports, written into msg, or 0 when it reports none. */
int deferred_refusal(int i, char *msg, size_t len) {
    const deferred_call &c = t_def.calls[i];
    const mt_deferred_slot &s = t_def.slots[i];
    if (c.kind == MT_DEFER_MAP && (s.st.bad_params || s.st.bad_grads)) {
        snprintf(msg, len, "%s holds NaN or inf", s.st.bad_params ? c.a.c_str() : c.b.c_str());
        return MT_ENONFINITE;
    }
    if (c.kind == MT_DEFER_EMBEDDING && s.st.bad_params) {
        snprintf(msg, len, MT_EMB_BAD_ID_WORDS, (long long)s.where, (long long)s.value, (long long)c.limit);
        return MT_EINVAL;
    }
    return 0;
}

}  // namespace

bool mt_deferred_on(void) { return t_def.on; }

bool mt_deferred_elsewhere(void) {
    return g_pending_threads.load(std::memory_order_acquire) > (t_def.taken ? 1 : 0);
}

int mt_deferred_take(mt_deferred_slot **slot, int32_t **poison, int kind, const char *what, const char *a,
                     const char *b, int64_t limit) {
    int rc;
    if ((rc = deferred_alloc())) return rc;
    if (t_def.taken == MT_DEFER_SLOTS && (rc = mt_deferred_flush())) return rc;
    if (!t_def.taken) g_pending_threads.fetch_add(1, std::memory_order_acq_rel);
    int i = t_def.taken++;
    memset(&t_def.slots[i], 0, sizeof(mt_deferred_slot));   /* no kernel uses it: the last flush synchronized */
    deferred_call &c = t_def.calls[i];
    c.kind = kind;
    c.what = what ? what : "";
    c.a = a ? a : "";
    c.b = b ? b : "";
    c.limit = limit;
    *slot = &t_def.slots[i];
    *poison = t_def.poison;
    return MT_OK;
}

int mt_deferred_flush(void) {
    if (!t_def.taken) return MT_OK;
    MT_GPU_CHECK(gpuStreamSynchronize(MT_STREAM), "the deferred calls");
    int n = t_def.taken, first = -1, code = 0;
    char msg[256] = "";
    for (int i = 0; i < n && !code; ++i)
        if ((code = deferred_refusal(i, msg, sizeof msg))) first = i;
    /* Cleared in stream order, so every later kernel reads 0; the calls are forgotten only
     * once that is queued (a failure leaves them to the next flush). */
    MT_GPU_CHECK(gpuMemsetAsync(t_def.poison, 0, sizeof(int32_t), MT_STREAM), "the deferred calls' poison word");
    t_def.taken = 0;
    g_pending_threads.fetch_sub(1, std::memory_order_acq_rel);
    if (!code) return MT_OK;
    return mt_fail(code,
                   "%s refused (deferred: call %d of the %d queued since the last synchronization): %s; "
                   "nothing was written to a caller's buffer by it or by the %d calls queued after it "
                   "(their new outputs are undefined)",
                   t_def.calls[first].what.c_str(), first + 1, n, msg, n - first - 1);
}

int mt_gpu_ready(void) {
    int rc = mt_gpu_ready_deferring();
    return rc ? rc : mt_deferred_flush();
}

extern "C" {

int mt_set_deferred_refusals(int32_t on) {
    if (on != 0 && on != 1) return mt_fail(MT_EINVAL, "on must be 0 or 1, got %d", (int)on);
    int rc;
    if (on) {
        if ((rc = mt_gpu_ready_deferring()) || (rc = deferred_alloc())) return rc;
        t_def.on = true;
        return MT_OK;
    }
    t_def.on = false;   /* off even when the flush reports a refusal: the caller is told once */
    return mt_deferred_flush();
}

int mt_deferred_refusals(int32_t *out) {
    int rc = mt_check_ptr(out, "out");
    if (rc) return rc;
    *out = t_def.on ? 1 : 0;
    return MT_OK;
}

}  // extern "C"
