/* mt_metal_kernel.h -- the first include of every kernel source of native/metal: the Metal
 * standard library, contraction off (a*b+c is two roundings, as the identical contracts pin
 * it), the pinned routines (native/include/mt_pinned.h, one definition for every vendor) and the
 * host's parameter structs. Kernels name their thread coordinates through MT_ID_* so that the
 * emulator (native/metal/emulator/) can hand them in: there each is a type of its own.
 *
 * Conventions every kernel keeps (the emulator binds arguments by position, the host by index):
 * buffers and the parameter struct take [[buffer(0)]], [[buffer(1)]], ... in parameter order;
 * the thread coordinates come last; a kernel walks its range with the grid's stride, so any
 * grid covers any n. */
#ifndef MT_METAL_KERNEL_H
#define MT_METAL_KERNEL_H
#include <metal_stdlib>
using namespace metal;
#pragma METAL fp contract(off)

#include "mt_pinned.h"
#include "mt_metal_params.h"

/* Index n of an integer array of 4- or 8-byte signed elements bound as 32-bit words (an 8-byte
 * one is two words, little-endian): ids and targets. */
static inline int64_t mt_mtl_index(device const uint *ids, int32_t id_bytes, int64_t n) {
    return id_bytes == 4 ? (int64_t)(int32_t)ids[n] : (int64_t)((uint64_t)ids[2 * n] | ((uint64_t)ids[2 * n + 1] << 32));
}

#if defined(MT_METAL_EMULATED)
#include "emulator/mt_metal_emulator_ids.h"
#define MT_ID_GRID(n) mt_emu_id_grid n
#define MT_ID_GRID_SIZE(n) mt_emu_id_grid_size n
#define MT_ID_LOCAL(n) mt_emu_id_local n
#define MT_ID_GROUP(n) mt_emu_id_group n
#define MT_ID_GROUP_SIZE(n) mt_emu_id_group_size n
#else
#define MT_ID_GRID(n) uint n [[thread_position_in_grid]]
#define MT_ID_GRID_SIZE(n) uint n [[threads_per_grid]]
#define MT_ID_LOCAL(n) uint n [[thread_position_in_threadgroup]]
#define MT_ID_GROUP(n) uint n [[threadgroup_position_in_grid]]
#define MT_ID_GROUP_SIZE(n) uint n [[threads_per_threadgroup]]
#endif
#endif
