/* mt_metal_runtime.m -- the Metal runtime of mt_metal_runtime.h on Apple's GPUs (macOS; built by
 * `make metal`, with ARC). One device (the system default), one command queue, the library
 * compiled at first use from the embedded source (mt_metal_amalgamate.py: every kernel source
 * with its includes inlined) without fast math -- the kernels also turn contraction off
 * themselves -- and a compute pipeline per kernel, made when first launched. Buffers are shared
 * storage: the host reads and writes their contents in place. Every run is committed and waited
 * for before it returns; a command buffer that fails is MT_EDEVICE with Metal's description.
 * Not compiled on other machines: the host code above this seam is (emulator/). */
#import <Foundation/Foundation.h>
#import <Metal/Metal.h>
#include <pthread.h>
#include <unistd.h>
#include "mt_host.h"
#include "mt_metal_options.h"
#include "mt_metal_runtime.h"

extern const char mt_metal_source[];

struct mt_mtl_buffer {
    void *handle;   /* id<MTLBuffer>, retained (CFBridgingRetain) */
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static id<MTLDevice> g_device;
static id<MTLCommandQueue> g_queue;
static id<MTLLibrary> g_library;
static NSMutableDictionary<NSString *, id<MTLComputePipelineState>> *g_pipelines;
static char g_why[1024];   /* why the device could not be opened (kept: every call reports it) */
static char g_name[256];

static int open_locked(void) {
    if (g_library) return MT_OK;
    if (g_why[0]) return mt_fail(MT_EDEVICE, "%s", g_why);
    @autoreleasepool {
        g_device = MTLCreateSystemDefaultDevice();   /* needs CoreGraphics linked (make metal does) */
        if (!g_device) {
            NSArray<id<MTLDevice>> *all = MTLCopyAllDevices();
            g_device = all.firstObject;
        }
        if (!g_device) {
            snprintf(g_why, sizeof g_why, "no Metal device (MTLCreateSystemDefaultDevice returned nil)");
            return mt_fail(MT_EDEVICE, "%s", g_why);
        }
        snprintf(g_name, sizeof g_name, "%s", g_device.name.UTF8String);
        g_queue = [g_device newCommandQueue];
        MTLCompileOptions *options = mt_metal_exact_options();
        NSError *error = nil;
        NSString *text = [NSString stringWithUTF8String:mt_metal_source];
        g_library = [g_device newLibraryWithSource:text options:options error:&error];
        if (!g_library) {
            snprintf(g_why, sizeof g_why, "the Metal kernels did not compile on %s: %s", g_name,
                     error ? error.localizedDescription.UTF8String : "(no description)");
            return mt_fail(MT_EDEVICE, "%s", g_why);
        }
        g_pipelines = [NSMutableDictionary new];
    }
    return MT_OK;
}

int mt_mtl_open(void) {
    pthread_mutex_lock(&g_lock);
    int rc = open_locked();
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int mt_mtl_buffer_new(mt_mtl_buffer **out, void **contents, int64_t bytes) {
    int rc = mt_mtl_open();
    if (rc) return rc;
    @autoreleasepool {
        id<MTLBuffer> b = [g_device newBufferWithLength:(NSUInteger)(bytes > 0 ? bytes : 4)
                                                options:MTLResourceStorageModeShared];
        if (!b) return mt_fail(MT_ENOMEM, "cannot allocate %lld bytes of Metal memory", (long long)bytes);
        mt_mtl_buffer *wrap = (mt_mtl_buffer *)malloc(sizeof *wrap);
        if (!wrap) return mt_fail(MT_ENOMEM, "out of host memory");
        wrap->handle = (void *)CFBridgingRetain(b);
        *out = wrap;
        *contents = b.contents;
    }
    return MT_OK;
}

int64_t mt_mtl_page_bytes(void) { return (int64_t)getpagesize(); }

int mt_mtl_buffer_wrap(mt_mtl_buffer **out, void *host, int64_t bytes) {
    int rc = mt_mtl_open();
    if (rc) return rc;
    @autoreleasepool {
        /* shared storage over the caller's pages: Apple silicon's GPU reads and writes them in place */
        id<MTLBuffer> b = [g_device newBufferWithBytesNoCopy:host length:(NSUInteger)bytes
                                                     options:MTLResourceStorageModeShared deallocator:nil];
        if (!b) return mt_fail(MT_ENOMEM, "cannot wrap %lld bytes of host memory as a Metal buffer", (long long)bytes);
        mt_mtl_buffer *wrap = (mt_mtl_buffer *)malloc(sizeof *wrap);
        if (!wrap) return mt_fail(MT_ENOMEM, "out of host memory");
        wrap->handle = (void *)CFBridgingRetain(b);
        *out = wrap;
    }
    return MT_OK;
}

void mt_mtl_buffer_release(mt_mtl_buffer *b) {
    if (!b) return;
    @autoreleasepool {
        id<MTLBuffer> buffer = CFBridgingRelease(b->handle);
        (void)buffer;
    }
    free(b);
}

static id<MTLComputePipelineState> pipeline(const char *kernel, char *why, size_t why_size) {
    NSString *name = [NSString stringWithUTF8String:kernel];
    pthread_mutex_lock(&g_lock);
    id<MTLComputePipelineState> p = g_pipelines[name];
    if (!p) {
        id<MTLFunction> fn = [g_library newFunctionWithName:name];
        NSError *error = nil;
        if (fn) p = [g_device newComputePipelineStateWithFunction:fn error:&error];
        if (p) g_pipelines[name] = p;
        else snprintf(why, why_size, "%s", fn ? (error ? error.localizedDescription.UTF8String : "no pipeline")
                                              : "no such kernel in the library");
    }
    pthread_mutex_unlock(&g_lock);
    return p;
}

int mt_mtl_run(const char *kernel, const mt_mtl_arg *args, int32_t n_args, uint32_t groups, uint32_t group_size,
               uint32_t *ran) {
    int rc = mt_mtl_open();
    if (rc) return rc;
    if (groups == 0) return MT_OK;
    @autoreleasepool {
        char why[512] = "";
        id<MTLComputePipelineState> p = pipeline(kernel, why, sizeof why);
        if (!p) return mt_fail(MT_EDEVICE, "Metal kernel %s: %s", kernel, why);
        NSUInteger width = group_size;
        if (width > p.maxTotalThreadsPerThreadgroup) width = p.maxTotalThreadsPerThreadgroup;   /* grid-stride kernels */
        if (ran) *ran = (uint32_t)width;
        id<MTLCommandBuffer> cb = [g_queue commandBuffer];
        id<MTLComputeCommandEncoder> enc = [cb computeCommandEncoder];
        [enc setComputePipelineState:p];
        for (int32_t k = 0; k < n_args; ++k) {
            if (args[k].buffer)
                [enc setBuffer:(__bridge id<MTLBuffer>)args[k].buffer->handle offset:(NSUInteger)args[k].offset
                       atIndex:(NSUInteger)k];
            else
                [enc setBytes:args[k].bytes length:(NSUInteger)args[k].size atIndex:(NSUInteger)k];
        }
        [enc dispatchThreadgroups:MTLSizeMake(groups, 1, 1) threadsPerThreadgroup:MTLSizeMake(width, 1, 1)];
        [enc endEncoding];
        [cb commit];
        [cb waitUntilCompleted];
        if (cb.status != MTLCommandBufferStatusCompleted)
            return mt_fail(MT_EDEVICE, "Metal kernel %s failed on %s: %s", kernel, g_name,
                           cb.error ? cb.error.localizedDescription.UTF8String : "(no description)");
    }
    return MT_OK;
}
