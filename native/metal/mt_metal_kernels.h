/* mt_metal_kernels.h -- every kernel of native/metal's library, X(name): the emulator's table
 * (emulator/mt_metal_emulator_kernels.cpp) and tests/test_metal_shim.py, which checks that every
 * `kernel void` of the sources is listed, read it. */
#define MT_METAL_KERNELS(X)   \
    X(mt_k_nonfinite)      \
    X(mt_k_map)            \
    X(mt_k_random)         \
    X(mt_k_fill_zero)      \
    X(mt_k_fold_lanes)     \
    X(mt_k_fold_lane_tree) \
    X(mt_k_norm_finish)    \
    X(mt_k_scale)          \
    X(mt_k_adam)           \
    X(mt_k_sgd)               \
    X(mt_k_add2)              \
    X(mt_k_copy)              \
    X(mt_k_rms_rows)          \
    X(mt_k_rms_elems)         \
    X(mt_k_rms_dweight_leaves) \
    X(mt_k_rms_dweight_tree)  \
    X(mt_k_ln_elems)          \
    X(mt_k_ln_param_leaves)   \
    X(mt_k_emb_gather)        \
    X(mt_k_emb_backward)      \
    X(mt_k_ce_row_max)        \
    X(mt_k_ce_coef)           \
    X(mt_k_ce_row_loss)       \
    X(mt_k_ce_grad)           \
    X(mt_k_ce_transpose)      \
    X(mt_k_ce_target_weights) \
    X(mt_k_token_leaves)      \
    X(mt_k_ce_total)          \
    X(mt_k_linear_chain)      \
    X(mt_k_linear_leaves)     \
    X(mt_k_linear_tree)       \
    X(mt_k_attn_forward)      \
    X(mt_k_attn_delta)        \
    X(mt_k_attn_dq)           \
    X(mt_k_attn_dkv)
