"""Shared by the GPU benchmarks: torch with mojo_train's vendor defaulting to CUDA, the timing
loop (bench/_timing.py's, synchronized), the device-to-device copy-bandwidth yardstick, tensors
resident on the GPU for both sides, the CPU-oracle check of a device call, and the record."""
import os

from _timing import bench_args, median_seconds, record

import mojo_train as mt
from mojo_train._native import ffi, load

timed = median_seconds   # timed(fn, repeat, warmup=3, sync=None): the one timing loop
CHECK = 1 << 20          # outputs compared with the CPU oracle


def cuda_torch():
    """torch, with MOJO_TRAIN_VENDOR defaulting to cuda (call it after the command line is read)."""
    import torch
    os.environ.setdefault("MOJO_TRAIN_VENDOR", "cuda")
    return torch


def over_floats(doc, bench):
    """(args, torch, rows) of a benchmark over 2**--log2n floats (default 28, --repeat 40): rows =
    bench(torch, n, repeat, bw), bw the copy bandwidth over as many floats (printed, kept as copy_TBps)."""
    args = bench_args(doc, 40, ("--log2n", 28))
    torch = cuda_torch()
    n = 1 << args.log2n
    bw = copy_bandwidth(torch, 4 * n)
    rows = dict(bench(torch, n, args.repeat, bw), copy_TBps=bw / 1e12)
    print("copy bandwidth %.2f TB/s (read + write, %d floats)" % (rows["copy_TBps"], n))
    return args, torch, rows


def gpu_record(args, name, rows, torch):
    """With --write: rows, the GPU's name and torch's version, to bench/results/<name>.jsonl."""
    record(args, name, dict(rows, gpu=torch.cuda.get_device_name(), torch=torch.__version__))


def copy_bandwidth(torch, nbytes=4 << 30):
    """Bytes per second of torch's y.copy_(x) over nbytes (read + write)."""
    x = torch.empty(nbytes // 4, device="cuda")
    y = torch.empty_like(x)
    t = timed(lambda: y.copy_(x), 20, sync=torch.cuda.synchronize)
    return 2 * nbytes / t


def device_tensors(torch, sizes, seed):
    """The same uniform [-1, 1) values as torch CUDA tensors and as mojo_train DeviceArrays."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    ts = [torch.rand(n, device="cuda", generator=gen) * 2 - 1 for n in sizes]
    ours = [mt.to_device(t.cpu().numpy()) for t in ts]
    return ts, ours


def fp(t):
    """A torch tensor's data as a cffi float pointer."""
    return ffi.cast("float *", t.data_ptr())


def matches_cpu_oracle(torch, x, y_dev, fn, *args, more=(), after=()):
    """The first CHECK outputs of a device call equal the CPU oracle's identical numeric mode on the
    same inputs. fn is the C entry point's name, one of the maps, called as (out, x, more...,
    args..., n, after..., 0): x and the tensors `more` are the device inputs it read (a backward's
    dy, then x), args precede n (dropout's p and stream), after follows it (GELU's approximation)."""
    try:
        cpu = load("identical", "cpu")
    except mt.BackendError:
        return "no cpu library (run make)"
    hosts = [t[:CHECK].cpu().contiguous() for t in (x, *more)]
    yh = torch.empty_like(hosts[0])
    cpu.check(getattr(cpu.lib, fn)(fp(yh), *[fp(h) for h in hosts], *args, CHECK, *after, 0), fn)
    return bool(torch.equal(yh.view(torch.int32), y_dev[:CHECK].cpu().view(torch.int32)))
