"""cross_entropy on a GPU, side by side with torch in one process (identical numeric mode).

    python bench/loss_cuda.py [--repeat N] [--write]

Every buffer lives on the GPU: allocated by the library (mt_device_alloc), filled by its own
Philox (mt_uniform_fill), and viewed by torch without a copy (__cuda_array_interface__), so both
sides read the very same logits. The C entry points are called directly through cffi (no
Python argument plumbing in the figures); every figure is the median wall-clock of --repeat
synchronized calls after warm-up (our calls synchronize before they return).

Bytes counted (float32, N rows, V columns):
- cross_entropy forward+backward, mean, dlogits: one read of the logits and one write of
  dlogits, 8 N V (the rows are staged in shared memory, so every later pass reads on-chip);
  torch's fused log_softmax/nll forward and backward are timed with the same 8 N V counted.
Target (issue 4): cross_entropy 8192 x 50304 <= 1.5 ms (torch 4.83 ms). RMSNorm's figure moved
to bench/rms_norm_cuda.py (which uses DeviceBuffer and _call from here); records before that
hold it under "rms_norm_16384x4096".
"""
import array
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import copy_bandwidth, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

from mojo_train import _native  # noqa: E402

ffi = _native.ffi
MEAN, SUM, NONE = 2, 1, 0


class DeviceBuffer:
    """nbytes of the library's device memory (freed with the object), viewable by torch."""

    _TYPESTR = {"float32": "<f4", "int32": "<i4", "int64": "<i8", "uint8": "|u1"}
    _SIZE = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}

    def __init__(self, backend, shape, dtype="float32"):
        self.backend, self.shape, self.dtype = backend, tuple(shape), dtype
        n = 1
        for d in self.shape:
            n *= d
        self.size, self.nbytes = n, n * self._SIZE[dtype]
        out = ffi.new("void **")
        backend.check(backend.lib.mt_device_alloc(out, max(self.nbytes, 1)), "mt_device_alloc")
        self.address = int(ffi.cast("uintptr_t", out[0]))

    def __del__(self):
        try:
            self.backend.lib.mt_device_free(ffi.cast("void *", self.address))
        except Exception:   # interpreter shutdown
            pass

    def ptr(self, ctype="float *", offset_bytes=0):
        return ffi.cast(ctype, self.address + offset_bytes)

    def fill_uniform(self, seed, stream, low, high):
        """float32 U[low, high) from the library's Philox stream, drawn on the device."""
        self.backend.check(self.backend.lib.mt_uniform_fill(self.ptr(), seed, stream, 0, low, high, self.size),
                           "mt_uniform_fill")
        return self

    def upload(self, data, offset_bytes=0):
        """Copy host bytes (or any buffer) to the start (+offset) of this buffer."""
        data = bytes(data)
        self.backend.check(self.backend.lib.mt_memcpy(self.ptr("void *", offset_bytes), ffi.from_buffer(data),
                                                      len(data)), "mt_memcpy")
        return self

    def download(self, nbytes=None, offset_bytes=0):
        nbytes = self.nbytes - offset_bytes if nbytes is None else nbytes
        host = ffi.new("char[]", max(nbytes, 1))
        self.backend.check(self.backend.lib.mt_memcpy(host, self.ptr("void *", offset_bytes), nbytes), "mt_memcpy")
        return ffi.buffer(host, nbytes)[:]

    @property
    def __cuda_array_interface__(self):
        return {"version": 3, "shape": self.shape, "typestr": self._TYPESTR[self.dtype],
                "data": (self.address, False), "strides": None, "stream": None}

    def torch(self, torch):
        return torch.as_tensor(self, device="cuda")


def _call(backend, rc, what):
    backend.check(rc, what)


def bench_cross_entropy(torch, gpu, rows, vocab, repeat, bw, smoothing=0.0):
    logits = DeviceBuffer(gpu, (rows, vocab)).fill_uniform(11, 0, -8.0, 8.0)
    dlogits = DeviceBuffer(gpu, (rows, vocab))
    loss = DeviceBuffer(gpu, (1,))
    gen = torch.Generator(device="cuda").manual_seed(5)
    targets_t = torch.randint(0, vocab, (rows,), device="cuda", generator=gen, dtype=torch.int64)
    lib, tptr = gpu.lib, ffi.cast("void *", targets_t.data_ptr())
    torch.cuda.synchronize()

    def ours():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, dlogits.ptr(), logits.ptr(), tptr, 8, rows, vocab,
                                        -100, MEAN, smoothing, 0), "mt_cross_entropy")

    def ours_forward():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, ffi.NULL, logits.ptr(), tptr, 8, rows, vocab, -100,
                                        MEAN, smoothing, 0), "mt_cross_entropy")

    x = logits.torch(torch).requires_grad_(True)

    def theirs():
        out = torch.nn.functional.cross_entropy(x, targets_t, label_smoothing=smoothing)
        torch.autograd.grad(out, x)

    t_ours, t_fwd = timed(ours, repeat), timed(ours_forward, repeat)
    t_theirs = timed(theirs, repeat, sync=torch.cuda.synchronize)
    nbytes = 8 * rows * vocab
    return {"rows": rows, "vocab": vocab, "label_smoothing": smoothing, "ours_ms": t_ours * 1e3,
            "ours_forward_ms": t_fwd * 1e3, "torch_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs,
            "bytes": nbytes, "floor_ms": nbytes / bw * 1e3, "ours_of_copy_bw": nbytes / t_ours / bw,
            "torch_of_copy_bw": nbytes / t_theirs / bw}


def run_benchmarks(torch, gpu, repeat):
    bw = copy_bandwidth(torch)
    return {"copy_TBps": bw / 1e12,
            "cross_entropy_8192x50304": bench_cross_entropy(torch, gpu, 8192, 50304, repeat, bw),
            "cross_entropy_8192x50304_smooth": bench_cross_entropy(torch, gpu, 8192, 50304, repeat, bw, 0.1)}


def report(rows):
    print("copy bandwidth %.2f TB/s (read + write)" % rows["copy_TBps"])
    for key in ("cross_entropy_8192x50304", "cross_entropy_8192x50304_smooth"):
        r = rows[key]
        print("cross_entropy %dx%d fwd+bwd (mean, eps %.1f): ours %.3f ms (%.0f%% of copy bw; forward only %.3f ms), "
              "torch %.3f ms, ratio %.2f; floor %.3f ms for %.2f GB"
              % (r["rows"], r["vocab"], r["label_smoothing"], r["ours_ms"], 100 * r["ours_of_copy_bw"],
                 r["ours_forward_ms"], r["torch_ms"], r["ratio"], r["floor_ms"], r["bytes"] / 1e9))


def kernel_only(gpu, rows, vocab, repeat, label):
    """Ours alone, no torch in the process: for A/B builds and ncu
    (`ncu --kernel-name regex:k_ce_rows ... python bench/loss_cuda.py --kernel-only`)."""
    logits = DeviceBuffer(gpu, (rows, vocab)).fill_uniform(11, 0, -8.0, 8.0)
    dlogits, loss = DeviceBuffer(gpu, (rows, vocab)), DeviceBuffer(gpu, (1,))
    targets = DeviceBuffer(gpu, (rows,), "int32")
    targets.upload(array.array("i", [i * 7919 % vocab for i in range(rows)]).tobytes())
    tptr, lib = targets.ptr("void *"), gpu.lib

    def both():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, dlogits.ptr(), logits.ptr(), tptr, 4, rows, vocab,
                                        -100, MEAN, 0.0, 0), "mt_cross_entropy")

    def forward():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, ffi.NULL, logits.ptr(), tptr, 4, rows, vocab,
                                        -100, MEAN, 0.0, 0), "mt_cross_entropy")

    t_both, t_fwd = timed(both, repeat), timed(forward, repeat)
    print("%s ce %dx%d: fwd+bwd %.3f ms, forward %.3f ms" % (label, rows, vocab, t_both * 1e3, t_fwd * 1e3))



def main():
    args = bench_args(__doc__, 20, ("--kernel-only", False, "time ours alone (no torch), for A/B builds and ncu"),
                      ("--rows", 8192), ("--vocab", 50304), ("--label", ""))
    if args.kernel_only:
        return kernel_only(_native.load("identical", "cuda"), args.rows, args.vocab, args.repeat, args.label)
    import torch
    gpu = _native.load("identical", "cuda")
    rows = run_benchmarks(torch, gpu, max(args.repeat, 10))
    report(rows)
    gpu_record(args, "loss_cuda", rows, torch)


if __name__ == "__main__":
    main()
