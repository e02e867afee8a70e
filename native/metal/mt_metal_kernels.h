/* mt_metal_kernels.h -- every kernel of native/metal's library, with whether it synchronizes its
 * threadgroup (threadgroup_barrier): X(name, uses_barriers). The emulator's table and the
 * test that every `kernel void` of the sources is listed read it. */
#define MT_METAL_KERNELS(X)   \
    X(mt_k_nonfinite, 0)      \
    X(mt_k_map, 0)            \
    X(mt_k_random, 0)         \
    X(mt_k_fill_zero, 0)      \
    X(mt_k_norm_lanes, 0)     \
    X(mt_k_norm_lane_tree, 0) \
    X(mt_k_norm_finish, 0)    \
    X(mt_k_scale, 0)          \
    X(mt_k_adam, 0)           \
    X(mt_k_sgd, 0)
