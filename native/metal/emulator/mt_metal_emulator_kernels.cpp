// mt_metal_emulator_kernels.cpp -- every kernel source of native/metal compiled as C++ through the
// shim (native/metal/shim/metal_stdlib, MT_METAL_EMULATED), and the table that binds each kernel's
// parameters by position: pointers and the parameter struct from the call's arguments in order,
// thread coordinates (mt_metal_kernel.h's MT_ID_*) from the running thread. In identical_ftz this
// translation unit goes through the flush rule's rewrite (native/cpu_oracle/mt_ftz_ir.py), as the
// CPU oracle does: the kernels' float32 arithmetic then follows native/contracts/ftz.md.
#include <cstring>
#include <tuple>
#include "mt_metal_emulator.h"

#define MT_METAL_EMULATED 1
#include "../mt_metal_elementwise.metal"
#include "../mt_metal_random.metal"
#include "../mt_metal_tensors.metal"
#include "../mt_metal_clip.metal"
#include "../mt_metal_optim.metal"
#include "../mt_metal_accumulate.metal"
#include "../mt_metal_rms_norm.metal"
#include "../mt_metal_layer_norm.metal"
#include "../mt_metal_embedding.metal"
#include "../mt_metal_loss.metal"
#include "../mt_metal_linear.metal"
#include "../mt_metal_attention.metal"
#include "../mt_metal_kernels.h"

namespace {

template <class T>
struct arg_of;
template <class T>
struct arg_of<T *> {
    static T *get(void *const *args, const mt_emu_thread *, int &k) { return (T *)args[k++]; }
};
template <class T>
struct arg_of<T &> {
    static T &get(void *const *args, const mt_emu_thread *, int &k) { return *(T *)args[k++]; }
};
#define MT_EMU_COORD(type, field)                                                                 \
    template <>                                                                                   \
    struct arg_of<type> {                                                                         \
        static type get(void *const *, const mt_emu_thread *t, int &) { return type{t->field}; } \
    }
MT_EMU_COORD(mt_emu_id_grid, grid);
MT_EMU_COORD(mt_emu_id_grid_size, grid_size);
MT_EMU_COORD(mt_emu_id_local, local);
MT_EMU_COORD(mt_emu_id_group, group);
MT_EMU_COORD(mt_emu_id_group_size, group_size);
#undef MT_EMU_COORD

template <class... A>
void call(void (*fn)(A...), void *const *args, const mt_emu_thread *t) {
    int k = 0;
    std::tuple<A...> bound{arg_of<A>::get(args, t, k)...};   // braces: evaluated in order
    std::apply(fn, bound);
}

template <auto fn>
void run_thread(void *const *args, const mt_emu_thread *t) { call(fn, args, t); }

struct entry {
    const char *name;
    mt_emu_thread_fn fn;
};

#define MT_EMU_ENTRY(name) {#name, &run_thread<&name>},
const entry table[] = {MT_METAL_KERNELS(MT_EMU_ENTRY)};
#undef MT_EMU_ENTRY

}  // namespace

extern "C" int mt_emu_kernel(const char *name, mt_emu_thread_fn *fn) {
    for (const entry &e : table)
        if (std::strcmp(e.name, name) == 0) {
            *fn = e.fn;
            return 1;
        }
    return 0;
}
