"""linear on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/linear_cpu.py [--repeat 15] [--mode identical] [--write]

Figures: medians of --repeat calls after warm-up, ours and torch's timed in alternation (call
for call), so that a busy machine slows both alike; through the public API on both sides
(ours allocates its outputs as torch does). Same thread count on both sides
(torch.set_num_threads = mt_num_threads). GFLOP/s count 2*M*N*K per GEMM. Our finiteness
pre-pass reads every input once more before any output is written: its bytes are listed
(``prepass_MB``). On a shared machine the wall-clock figures move with the load (recorded);
the one-thread figure in GFLOP per CPU-second of the process moves less. Target (issue 4):
linear_forward 1024^3 at least 0.5x torch's GFLOP/s. RMSNorm's figures: bench/rms_norm_cpu.py
(which times them with paired_medians and filled from here). Records before the split into
families are in bench/results/dense_cpu.jsonl; new ones go to linear_cpu.jsonl.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402

LINEAR_SHAPES = [(1024, 1024, 1024), (4096, 1024, 1024), (8192, 768, 256), (64, 4096, 4096)]


def paired_medians(fns, repeat, warmup=3, clock=time.perf_counter):
    """Median seconds of each of fns, timed in alternation."""
    for _ in range(warmup):
        for fn in fns:
            fn()
    times = [[] for _ in fns]
    for _ in range(repeat):
        for fn, t in zip(fns, times):
            t0 = clock()
            fn()
            t.append(clock() - t0)
    return [statistics.median(t) for t in times]


def filled(shape, seed, stream, backend):
    n = 1
    for d in shape:
        n *= d
    a = mt.Array(shape, "float32")
    backend.check(backend.lib.mt_uniform_fill(ffi.cast("float *", a.address), seed, stream, 0, -1.0, 1.0, n),
                  "bench")
    return a


def torch_of(a):
    import torch
    return torch.frombuffer(bytearray(a.tobytes()), dtype=torch.float32).reshape(a.shape)


def bench_linear(m, n, k, repeat, mode):
    import torch
    import torch.nn.functional as F
    backend = load(mode)
    a, w, dc = filled((m, k), 1, 0, backend), filled((n, k), 1, 1, backend), filled((m, n), 1, 3, backend)
    ta, tw, tdc = torch_of(a), torch_of(w), torch_of(dc)
    fwd, tfwd, bwd, tbwd = paired_medians([
        lambda: mt.linear_forward(a, w, numeric_mode=mode), lambda: F.linear(ta, tw),
        lambda: mt.linear_backward(dc, a, w, numeric_mode=mode), lambda: (tdc @ tw, tdc.t() @ ta)], repeat)
    flops = 2.0 * m * n * k
    return {"m": m, "n": n, "k": k,
            "forward_ms": fwd * 1e3, "torch_forward_ms": tfwd * 1e3,
            "forward_GFLOPs": flops / fwd / 1e9, "torch_forward_GFLOPs": flops / tfwd / 1e9,
            "forward_vs_torch": tfwd / fwd,
            "backward_ms": bwd * 1e3, "torch_backward_ms": tbwd * 1e3,
            "backward_GFLOPs": 2 * flops / bwd / 1e9, "torch_backward_GFLOPs": 2 * flops / tbwd / 1e9,
            "backward_vs_torch": tbwd / bwd,
            "prepass_MB": {"forward": 4 * (m * k + n * k) / 1e6, "backward": 4 * (m * n + m * k + n * k) / 1e6}}


def single_thread_cpu_time(m, n, k, repeat, mode):
    """linear_forward on one thread each, in GFLOP per CPU-second of this process: what a
    core does, whatever else the machine runs (the wall-clock figures depend on that)."""
    import torch
    import torch.nn.functional as F
    backend = load(mode)
    before = (backend.lib.mt_num_threads(), torch.get_num_threads())
    backend.lib.mt_set_num_threads(1)
    torch.set_num_threads(1)
    try:
        a, w = filled((m, k), 1, 0, backend), filled((n, k), 1, 1, backend)
        ta, tw = torch_of(a), torch_of(w)
        ours, theirs = paired_medians([lambda: mt.linear_forward(a, w, numeric_mode=mode), lambda: F.linear(ta, tw)],
                                      repeat, clock=time.process_time)
    finally:
        backend.lib.mt_set_num_threads(before[0])
        torch.set_num_threads(before[1])
    flops = 2.0 * m * n * k
    return {"m": m, "n": n, "k": k, "GFLOP_per_cpu_s": flops / ours / 1e9,
            "torch_GFLOP_per_cpu_s": flops / theirs / 1e9, "vs_torch": theirs / ours}


def main():
    args = bench_args(__doc__, 15, mode=True)
    torch, threads = cpu_torch(args.mode)
    linear = [bench_linear(m, n, k, args.repeat, args.mode) for m, n, k in LINEAR_SHAPES]
    core = single_thread_cpu_time(1024, 1024, 1024, args.repeat, args.mode)
    load_avg = os.getloadavg()[0]
    for r in linear:
        print("linear %5d x %4d x %4d: forward %6.1f GFLOP/s (torch %6.1f) = %.2fx torch%s; backward %6.1f "
              "GFLOP/s (torch %6.1f) = %.2fx" % (r["m"], r["n"], r["k"], r["forward_GFLOPs"], r["torch_forward_GFLOPs"],
                                                  r["forward_vs_torch"],
                                                  " (target >= 0.5)" if (r["m"], r["n"], r["k"]) == (1024,) * 3 else "",
                                                  r["backward_GFLOPs"], r["torch_backward_GFLOPs"], r["backward_vs_torch"]))
    print("linear 1024^3 on one thread, per CPU-second: ours %.1f GFLOP, torch %.1f = %.2fx (load average %.1f "
          "on %d cores)" % (core["GFLOP_per_cpu_s"], core["torch_GFLOP_per_cpu_s"], core["vs_torch"], load_avg,
                            os.cpu_count() or 0))
    cpu_record(args, "linear_cpu", {"gemm_kernel": os.environ.get("MOJO_TRAIN_CPU_GEMM", "auto"),
                                    "load_average": load_avg, "linear": linear, "one_thread_cpu_time": core}, torch)


if __name__ == "__main__":
    main()
