"""Where the time of issue 16's GPU cases goes: each case's wall time per call beside the GPU's
own time per call (kernels, memsets, copies, read by torch.profiler through CUPTI, which sees
every kernel of the process, ours included), and each kernel's share.

    python bench/profile_cuda.py [--repeat N] [--cases adamw_1,embedding_forward,...] [--no-trace]

A call's wall time minus its GPU time is time the GPU sat idle during the call: host work before
the first launch, launch gaps, the final synchronization's round trip. A case whose GPU time is
already over its target needs faster kernels; one whose idle time is what it lacks needs less
host work. The calls are the benchmarks' own (bench/optim_cuda.py, embedding_cuda.py,
loss_cuda.py, rms_norm_cuda.py, elementwise_cuda.py, random_cuda.py), on the same sizes.
Prints a table; records nothing (the benchmarks hold the figures the targets read).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import cuda_torch, device_tensors, fp, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi  # noqa: E402


def _adamw(torch, n_tensors):
    sizes = [100_000_000 // n_tensors] * n_tensors
    _, p = device_tensors(torch, sizes, 1)
    _, g = device_tensors(torch, sizes, 2)
    opt = mt.AdamW(p, lr=1e-3)
    return lambda: opt.step(g)


def _embedding(torch, backward):
    from embedding_cuda import D, T, V, zipf_ids
    ids_t = zipf_ids(torch, T, V)
    ids = mt.to_device(ids_t.cpu().numpy())
    if backward:
        dy = mt.to_device((torch.rand(T, D, device="cuda") * 2 - 1).cpu().numpy())
        return lambda: mt.embedding_backward(dy, ids, V)
    table = mt.to_device(torch.randn(V, D, device="cuda").cpu().numpy())
    return lambda: mt.embedding_forward(table, ids)


def _torch_embedding(torch):
    """torch's own forward on the same problem (its kernel's time beside ours)."""
    from embedding_cuda import D, V, T, zipf_ids
    ids, table = zipf_ids(torch, T, V), torch.randn(V, D, device="cuda")
    return lambda: torch.nn.functional.embedding(ids, table)


def _cross_entropy(torch):
    from loss_cuda import MEAN, DeviceBuffer, _call
    from mojo_train._native import load
    gpu = load("identical", "cuda")
    rows, vocab = 8192, 50304
    logits = DeviceBuffer(gpu, (rows, vocab)).fill_uniform(11, 0, -8.0, 8.0)
    dlogits, loss = DeviceBuffer(gpu, (rows, vocab)), DeviceBuffer(gpu, (1,))
    targets = torch.randint(0, vocab, (rows,), device="cuda", dtype=torch.int64)
    tptr = ffi.cast("void *", targets.data_ptr())
    keep = (logits, dlogits, loss, targets)
    return lambda: keep and _call(gpu, gpu.lib.mt_cross_entropy(loss.ptr(), ffi.NULL, dlogits.ptr(), logits.ptr(),
                                                                   tptr, 8, rows, vocab, -100, MEAN, 0.0, 0), "ce")


def _rms_norm(torch):
    from loss_cuda import DeviceBuffer, _call
    from mojo_train._native import load
    gpu = load("identical", "cuda")
    rows, dim = 16384, 4096
    x = DeviceBuffer(gpu, (rows, dim)).fill_uniform(21, 0, -2.0, 2.0)
    dy = DeviceBuffer(gpu, (rows, dim)).fill_uniform(21, 1, -1.0, 1.0)
    w = DeviceBuffer(gpu, (dim,)).fill_uniform(21, 2, 0.5, 1.5)
    y, dx, dw = DeviceBuffer(gpu, (rows, dim)), DeviceBuffer(gpu, (rows, dim)), DeviceBuffer(gpu, (dim,))

    def both():
        _call(gpu, gpu.lib.mt_rms_norm_forward(y.ptr(), x.ptr(), w.ptr(), 1e-5, rows, dim), "rms forward")
        _call(gpu, gpu.lib.mt_rms_norm_backward(dx.ptr(), dw.ptr(), dy.ptr(), x.ptr(), w.ptr(), 1e-5, rows, dim),
              "rms backward")
    return both


def _maps(torch, which):
    from mojo_train import elementwise as ew
    from mojo_train._native import load
    n = 1 << 28
    x = torch.rand(n, device="cuda") * 12 - 6
    if which == "silu":
        return lambda: ew.silu_forward(x)
    if which == "add":
        b = torch.rand(n, device="cuda")
        return lambda: ew.add(x, b)
    y, lib = torch.empty_like(x), load("identical", "cuda").lib
    return lambda: lib.mt_normal_fill(fp(y), 1234, 1, 0, 0.0, 1.0, n)


CASES = {
    "adamw_1": lambda t: _adamw(t, 1), "adamw_200": lambda t: _adamw(t, 200),
    "embedding_forward": lambda t: _embedding(t, False), "embedding_backward": lambda t: _embedding(t, True),
    "torch_embedding_forward": _torch_embedding,
    "cross_entropy": _cross_entropy, "rms_norm": _rms_norm,
    "silu": lambda t: _maps(t, "silu"), "add": lambda t: _maps(t, "add"), "normal": lambda t: _maps(t, "normal"),
}


def _device_us(e):
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, name):
            return getattr(e, name)
    return 0.0


def profile(torch, name, fn, repeat, trace=True):
    wall = timed(fn, repeat, sync=torch.cuda.synchronize)
    if not trace:              # under ncu, which holds CUPTI itself
        print("%-20s wall %8.1f us" % (name, wall * 1e6))
        return
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = _device_us(e)
        if us > 0 and e.key:
            rows.append((us / repeat, e.count / repeat, e.key))
    gpu = sum(r[0] for r in rows)
    print("%-20s wall %8.1f us  GPU %8.1f us  idle %7.1f us (%4.1f%%)"
          % (name, wall * 1e6, gpu, wall * 1e6 - gpu, 100 * (1 - gpu / (wall * 1e6))))
    for us, count, key in sorted(rows, reverse=True)[:8]:
        print("    %8.1f us  x%-5.2g %s" % (us, count, key[:110]))


def main():
    args = bench_args(__doc__, 30, ("--cases", ",".join(CASES)), ("--no-trace", False, "no torch.profiler (under ncu)"))
    torch = cuda_torch()
    for name in args.cases.split(","):
        fn = CASES[name](torch)
        fn()
        torch.cuda.synchronize()
        profile(torch, name, fn, args.repeat, not args.no_trace)
        del fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
