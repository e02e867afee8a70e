/* mt_gpu_attention.cu -- attention on a GPU (contract: native/contracts/attention.md): not built
 * yet. The ABI's two entries (native/common/mt_attention_args.c, one copy for every vendor) call
 * mt_attention_run, which here answers MT_EUNSUPPORTED after the shared argument checks, so a
 * bad call is named the same way as on the oracle and the library exports every symbol of the
 * header; mt_attention_features declares no MT_FEATURE_ATTENTION, so callers and tests see the
 * library's capability and skip. The kernel to come follows the contract's
 * block walk: a flash-style forward over key blocks of MT_ATTN_KEY_BLOCK, dk/dv per key block
 * and dq per query tile, no atomics.
 */
#include "mt_attention_args.h"
#include "mt_host.h"

uint64_t mt_attention_features(void) { return 0; }

int mt_attention_run(const mt_attn_args *a, int backward) {
    int rc = mt_check_attention_args(a, backward);
    if (rc) return rc;
    return mt_fail(MT_EUNSUPPORTED, "attention is not built into the %s library yet (no MT_FEATURE_ATTENTION); "
                   "the cpu oracle has it (MOJO_TRAIN_VENDOR=cpu)", MT_VENDOR_NAME);
}
