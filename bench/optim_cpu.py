"""AdamW on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/optim_cpu.py [--n 10000000] [--repeat 15] [--write]

Figures: median wall-clock of --repeat steps after warm-up. Bytes per step are counted for
ours including the finiteness pre-pass (the grads read once more before the update): 32 bytes
per parameter (pre-pass 4, update: read p g m v 16, write p m v 12; 36 until 2026-12-02, when
the pre-pass also read the params: native/contracts/optim.md step 3); torch's fused AdamW moves
28, so at equal bandwidth our floor is 1.14x its time. Targets (issue 2): 10M parameters at most
1.3x torch's fused time (issue 16 point 8: at most 1.15x); a
1,000-element step, Python call to result, at most 20 us. Param groups (issue 13): the same 10M
as 40 tensors in 4 groups (each its own lr and weight decay, the last with amsgrad: 8 bytes more a
parameter of that group), one native call, beside torch's fused AdamW on the same groups.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch, median_seconds  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402


def filled(n, seed, stream, backend):
    a = mt.Array((n,), "float32")
    backend.check(backend.lib.mt_uniform_fill(ffi.cast("float *", a.address), seed, stream, 0,
                                              -1.0, 1.0, n), "bench")
    return a


def bench_large(n, repeat, mode):
    import torch
    backend = load(mode)
    p, g = filled(n, 1, 0, backend), filled(n, 1, 1, backend)
    opt = mt.AdamW([p], lr=1e-3, numeric_mode=mode)
    ours = median_seconds(lambda: opt.step([g]), repeat)
    tp = torch.frombuffer(bytearray(p.tobytes()), dtype=torch.float32)
    tp.grad = torch.frombuffer(bytearray(g.tobytes()), dtype=torch.float32)
    topt = torch.optim.AdamW([tp], lr=1e-3, fused=True)
    theirs = median_seconds(topt.step, repeat)
    return {"n": n, "ours_ms": ours * 1e3, "torch_fused_ms": theirs * 1e3, "ratio": ours / theirs,
            "ours_bytes": 32 * n, "torch_bytes": 28 * n,
            "ours_GBps": 32 * n / ours / 1e9, "torch_GBps": 28 * n / theirs / 1e9}


def _groups(tensors, n_groups):
    """n_groups param groups over tensors, each its own lr and weight decay, the last with amsgrad."""
    k = len(tensors) // n_groups
    return [{"params": tensors[i * k:(i + 1) * k], "lr": 1e-3 * (i + 1), "weight_decay": 0.01 * i,
             "amsgrad": i == n_groups - 1} for i in range(n_groups)]


def bench_groups(n, repeat, mode, n_tensors=40, n_groups=4):
    import torch
    backend = load(mode)
    size = n // n_tensors
    p = [filled(size, 3, j, backend) for j in range(n_tensors)]
    g = [filled(size, 4, j, backend) for j in range(n_tensors)]
    opt = mt.AdamW(_groups(p, n_groups), numeric_mode=mode)
    ours = median_seconds(lambda: opt.step(g), repeat)
    tp = [torch.frombuffer(bytearray(x.tobytes()), dtype=torch.float32) for x in p]
    for t, x in zip(tp, g):
        t.grad = torch.frombuffer(bytearray(x.tobytes()), dtype=torch.float32)
    topt = torch.optim.AdamW(_groups(tp, n_groups), fused=True)
    theirs = median_seconds(topt.step, repeat)
    return {"n": size * n_tensors, "tensors": n_tensors, "groups": n_groups, "ours_ms": ours * 1e3,
            "torch_fused_ms": theirs * 1e3, "ratio": ours / theirs}


def bench_small(mode, repeat=2001):
    import torch
    backend = load(mode)
    p, g = filled(1000, 2, 0, backend), filled(1000, 2, 1, backend)
    opt = mt.AdamW([p], numeric_mode=mode)
    ours = median_seconds(lambda: opt.step([g]), repeat, warmup=100)
    tp = torch.zeros(1000)
    tp.grad = torch.ones(1000)
    topt = torch.optim.AdamW([tp])
    theirs = median_seconds(topt.step, repeat // 4, warmup=20)
    return {"ours_us": ours * 1e6, "torch_default_us": theirs * 1e6}


def main():
    args = bench_args(__doc__, 15, ("--n", 10_000_000), mode=True)
    torch, _ = cpu_torch(args.mode)
    large = bench_large(args.n, args.repeat, args.mode)
    small = bench_small(args.mode)
    groups = bench_groups(args.n, args.repeat, args.mode)
    print("AdamW %d params: ours %.2f ms (%.1f GB/s), torch fused %.2f ms (%.1f GB/s), ratio %.2f (target <= 1.3)"
          % (large["n"], large["ours_ms"], large["ours_GBps"], large["torch_fused_ms"],
             large["torch_GBps"], large["ratio"]))
    print("AdamW 1000 params, Python to result: ours %.1f us (target <= 20), torch %.1f us"
          % (small["ours_us"], small["torch_default_us"]))
    print("AdamW %d params, %d tensors in %d groups (one amsgrad): ours %.2f ms, torch fused %.2f ms, ratio %.2f"
          % (groups["n"], groups["tensors"], groups["groups"], groups["ours_ms"], groups["torch_fused_ms"],
             groups["ratio"]))
    cpu_record(args, "optim_cpu", {"large": large, "small": small, "groups": groups}, torch)


if __name__ == "__main__":
    main()
