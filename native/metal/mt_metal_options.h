/* mt_metal_options.h -- the compile options of every Metal source this project compiles at run
 * time (Objective-C; the library's runtime and the float-behaviour probe): no fast math, the
 * `safe` math mode where the SDK has it (macOS 15), fastMathEnabled = NO before. The sources turn
 * contraction off themselves (#pragma METAL fp contract(off)). */
#ifndef MT_METAL_OPTIONS_H
#define MT_METAL_OPTIONS_H
#import <Metal/Metal.h>

static inline MTLCompileOptions *mt_metal_exact_options(void) {
    MTLCompileOptions *options = [MTLCompileOptions new];
#if __MAC_OS_X_VERSION_MAX_ALLOWED >= 150000      /* mathMode exists from the macOS 15 SDK on */
    if (@available(macOS 15.0, *)) {
        options.mathMode = MTLMathModeSafe;
    } else {
        options.fastMathEnabled = NO;
    }
#else
    options.fastMathEnabled = NO;
#endif
    return options;
}
#endif
