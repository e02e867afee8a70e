/* mt_ftz_probe.m -- runs the float-behaviour probe (mt_ftz_probe.metal) on the Mac's default
 * Metal device and prints the report of mt_ftz_probe_cases.c as JSON.
 *
 *     native/build/mt_ftz_probe native/metal/mt_ftz_probe.metal > probe.json   (make metal-probe)
 *
 * The kernel source is compiled at run time without fast math (MTLMathModeSafe where the SDK has
 * it, fastMathEnabled = NO before), as the library's kernels will be. Exit status: 0 when every
 * case follows the identical_ftz rule, 1 when some differ (the report says which), 2 on errors
 * and when the device gets normal numbers wrong (GitHub's macOS runners have a paravirtual GPU). */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include "mt_metal_options.h"
#include <stdio.h>
#include <string.h>
#include "mt_ftz_probe_cases.h"

static int fail(const char *what, NSError *error) {
    fprintf(stderr, "mt_ftz_probe: %s%s%s\n", what, error ? ": " : "", error ? error.localizedDescription.UTF8String : "");
    return 2;
}

static id<MTLComputePipelineState> pipeline(id<MTLDevice> dev, id<MTLLibrary> lib, NSString *name, NSError **error) {
    id<MTLFunction> fn = [lib newFunctionWithName:name];
    return fn ? [dev newComputePipelineStateWithFunction:fn error:error] : nil;
}

int main(int argc, char **argv) {
    @autoreleasepool {
        if (argc != 2) return fail("usage: mt_ftz_probe path/to/mt_ftz_probe.metal", nil);
        NSError *error = nil;
        NSString *path = [NSString stringWithUTF8String:argv[1]];
        NSString *src = [NSString stringWithContentsOfFile:path encoding:NSUTF8StringEncoding error:&error];
        if (!src) return fail("cannot read the kernel source", error);
        id<MTLDevice> dev = MTLCreateSystemDefaultDevice();
        if (!dev) return fail("no Metal device", nil);
        MTLCompileOptions *opt = mt_metal_exact_options();
        /* the op codes' header sits beside the kernel: paste it in (run-time compiles have no -I) */
        NSString *ops = [NSString stringWithContentsOfFile:[[path stringByDeletingLastPathComponent]
                                                               stringByAppendingPathComponent:@"mt_ftz_probe_ops.h"]
                                                  encoding:NSUTF8StringEncoding error:&error];
        if (!ops) return fail("cannot read mt_ftz_probe_ops.h beside the kernel", error);
        src = [src stringByReplacingOccurrencesOfString:@"#include \"mt_ftz_probe_ops.h\"" withString:ops];
        id<MTLLibrary> lib = [dev newLibraryWithSource:src options:opt error:&error];
        if (!lib) return fail("the kernel does not compile", error);
        id<MTLComputePipelineState> probe = pipeline(dev, lib, @"mt_ftz_probe", &error);
        id<MTLComputePipelineState> width = pipeline(dev, lib, @"mt_ftz_probe_simd_width", &error);
        if (!probe || !width) return fail("no pipeline", error);

        const uint32_t n = (uint32_t)mt_probe_count;
        id<MTLBuffer> cases = [dev newBufferWithLength:16 * n options:MTLResourceStorageModeShared];
        id<MTLBuffer> out = [dev newBufferWithLength:4 * n options:MTLResourceStorageModeShared];
        id<MTLBuffer> simd = [dev newBufferWithLength:4 options:MTLResourceStorageModeShared];
        uint32_t *words = (uint32_t *)cases.contents;
        for (uint32_t k = 0; k < n; ++k) {
            words[4 * k] = mt_probe_cases[k].op;
            words[4 * k + 1] = mt_probe_cases[k].a;
            words[4 * k + 2] = mt_probe_cases[k].b;
            words[4 * k + 3] = mt_probe_cases[k].c;
        }
        id<MTLCommandQueue> queue = [dev newCommandQueue];
        id<MTLCommandBuffer> cmd = [queue commandBuffer];
        id<MTLComputeCommandEncoder> enc = [cmd computeCommandEncoder];
        [enc setComputePipelineState:probe];
        [enc setBuffer:cases offset:0 atIndex:0];
        [enc setBuffer:out offset:0 atIndex:1];
        [enc setBytes:&n length:4 atIndex:2];
        [enc dispatchThreads:MTLSizeMake(n, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
        [enc setComputePipelineState:width];
        [enc setBuffer:simd offset:0 atIndex:0];
        [enc dispatchThreads:MTLSizeMake(32, 1, 1) threadsPerThreadgroup:MTLSizeMake(32, 1, 1)];
        [enc endEncoding];
        [cmd commit];
        [cmd waitUntilCompleted];
        if (cmd.error) return fail("the command buffer failed", cmd.error);
        int differ = mt_probe_report(stdout, (const uint32_t *)out.contents, ((const uint32_t *)simd.contents)[0],
                                     dev.name.UTF8String);
        fprintf(stderr, "threadExecutionWidth of the probe's pipeline: %lu\n", (unsigned long)probe.threadExecutionWidth);
        if (differ < 0) return fail("the device got normal-number cases wrong (see the report): nothing it said is trustworthy", nil);
        return differ ? 1 : 0;
    }
}
