/* mt_metal_emulator.h -- between the emulator's runtime (mt_metal_emulator.cpp) and its table of
 * kernels (mt_metal_emulator_kernels.cpp, which compiles the kernel sources as C++). */
#ifndef MT_METAL_EMULATOR_H
#define MT_METAL_EMULATOR_H
#include <stdint.h>

/* One thread's coordinates, as Metal would pass them. */
typedef struct {
    unsigned grid, grid_size, local, group, group_size;
} mt_emu_thread;

/* Run one thread of a kernel; args[k] is the host address of argument k (buffer + offset, or
 * the inline bytes). */
typedef void (*mt_emu_thread_fn)(void *const *args, const mt_emu_thread *t);

#ifdef __cplusplus
extern "C" {
#endif
/* The kernel called `name`: its thread function; 0 if there is none of that name. */
int mt_emu_kernel(const char *name, mt_emu_thread_fn *fn);
#ifdef __cplusplus
}
#endif
#endif
