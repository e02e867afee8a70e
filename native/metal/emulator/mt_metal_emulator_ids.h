/* mt_metal_emulator_ids.h -- the emulator's thread coordinates (see mt_metal_kernel.h): each a
 * type of its own, so that the binder (mt_metal_emulator_bind.h) knows which one a kernel's
 * parameter asks for, and each reads as the uint Metal would pass. */
#ifndef MT_METAL_EMULATOR_IDS_H
#define MT_METAL_EMULATOR_IDS_H
#define MT_EMU_ID(name) \
    struct name {       \
        uint v;         \
        operator uint() const { return v; } \
    }
MT_EMU_ID(mt_emu_id_grid);
MT_EMU_ID(mt_emu_id_grid_size);
MT_EMU_ID(mt_emu_id_local);
MT_EMU_ID(mt_emu_id_group);
MT_EMU_ID(mt_emu_id_group_size);
#undef MT_EMU_ID
#endif
