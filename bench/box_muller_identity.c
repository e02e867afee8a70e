/* box_muller_identity.c -- proof that Box-Muller's shortcuts in native/include/mt_pinned_elementwise.h
 * give the general routines' bits on every input they can receive:
 *   mt_sincospif_angle(x) = mt_sincospif(x) for x = 2 u2, u2 = k 2^-24, 0 <= k < 2^24 (both results);
 *   mt_logf_normal(u1) = mt_logf(u1) for u1 = m 2^-24, 1 <= m <= 2^24;
 *   mt_math_log_core_f(e, f) = mt_math_log_core(e, f, 0) for every f = m - 1 of a split (m's bits
 *   0x3f3504f3..0x3fb504f2), e = 0 and e = -24 (mt_logf's shortened core).
 * Exhaustive: 2^24 inputs each (2^23 f at two e for the core), about two seconds.
 *
 *   gcc -O2 -ffp-contract=off -Inative/include bench/box_muller_identity.c -o /tmp/box_muller_identity -lm
 *   /tmp/box_muller_identity
 *
 * Exit status 0 only if every input agrees (tests/test_random.py builds and runs it).
 */
#include "mt_pinned.h"

#include <stdint.h>
#include <stdio.h>

__attribute__((noinline)) static void general(float x, float *s, float *c) { mt_sincospif(x, s, c); }
__attribute__((noinline)) static void shortcut(float x, float *s, float *c) { mt_sincospif_angle(x, s, c); }
__attribute__((noinline)) static float log_general(float x) { return mt_logf(x); }
__attribute__((noinline)) static float log_shortcut(float x) { return mt_logf_normal(x); }
__attribute__((noinline)) static float core_general(float e, float f) { return mt_math_log_core(e, f, 0.0f); }
__attribute__((noinline)) static float core_shortcut(float e, float f) { return mt_math_log_core_f(e, f); }

int main(void) {
    uint64_t angle_bad = 0, log_bad = 0, core_bad = 0;
    for (uint32_t i = 0; i < 0x800000u; ++i) {
        float f = mt_bits_f32(0x3f3504f3u + i) - 1.0f;
        for (int k = 0; k < 2; ++k) {
            float e = k ? -24.0f : 0.0f, c0 = core_general(e, f), c1 = core_shortcut(e, f);
            if (mt_f32_bits(c0) != mt_f32_bits(c1) && core_bad++ < 5)
                printf("core f=%08x e=%g: %08x / %08x\n", mt_f32_bits(f), e, mt_f32_bits(c0), mt_f32_bits(c1));
        }
    }
    for (uint32_t k = 0; k < (1u << 24); ++k) {
        float x = 2.0f * ((float)k * 5.9604644775390625e-08f), s0, c0, s1, c1;
        general(x, &s0, &c0);
        shortcut(x, &s1, &c1);
        if (mt_f32_bits(s0) != mt_f32_bits(s1) || mt_f32_bits(c0) != mt_f32_bits(c1)) {
            if (angle_bad++ < 5) printf("angle k=%u: sin %08x / %08x, cos %08x / %08x\n", k, mt_f32_bits(s0),
                                        mt_f32_bits(s1), mt_f32_bits(c0), mt_f32_bits(c1));
        }
        float u1 = (float)(k + 1u) * 5.9604644775390625e-08f;
        float l0 = log_general(u1), l1 = log_shortcut(u1);
        if (mt_f32_bits(l0) != mt_f32_bits(l1) && log_bad++ < 5)
            printf("log m=%u: %08x / %08x\n", k + 1u, mt_f32_bits(l0), mt_f32_bits(l1));
    }
    printf("angles: %u inputs, %llu differing; logs: %u inputs, %llu differing; cores: %u inputs, %llu differing\n",
           1u << 24, (unsigned long long)angle_bad, 1u << 24, (unsigned long long)log_bad, 2u * 0x800000u,
           (unsigned long long)core_bad);
    return angle_bad || log_bad || core_bad;
}
