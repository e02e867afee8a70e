"""AdamW on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/optim_cpu.py [--n 10000000] [--repeat 15] [--write]

Figures: median wall-clock of --repeat steps after warm-up. Bytes per step are counted for
ours including the finiteness pre-pass (params and grads read once more before the update):
36 bytes per parameter (pre-pass 8, update: read p g m v 16, write p m v 12); torch's fused
AdamW moves 28. Targets (issue 2): 10M parameters at most 1.3x torch's fused time; a
1,000-element step, Python call to result, at most 20 us.
"""
import argparse
import os
import platform
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import median_seconds, write_result  # noqa: E402

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
            "ours_bytes": 36 * n, "torch_bytes": 28 * n,
            "ours_GBps": 36 * n / ours / 1e9, "torch_GBps": 28 * n / theirs / 1e9}


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10_000_000)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--mode", default="identical")
    ap.add_argument("--write", action="store_true", help="record in bench/results/")
    args = ap.parse_args()
    import torch
    torch.set_num_threads(int(load(args.mode).lib.mt_num_threads()))
    large = bench_large(args.n, args.repeat, args.mode)
    small = bench_small(args.mode)
    print("AdamW %d params: ours %.2f ms (%.1f GB/s), torch fused %.2f ms (%.1f GB/s), ratio %.2f (target <= 1.3)"
          % (large["n"], large["ours_ms"], large["ours_GBps"], large["torch_fused_ms"],
             large["torch_GBps"], large["ratio"]))
    print("AdamW 1000 params, Python to result: ours %.1f us (target <= 20), torch %.1f us"
          % (small["ours_us"], small["torch_default_us"]))
    if args.write:
        write_result("optim_cpu", {"mode": args.mode, "threads": torch.get_num_threads(),
                                   "torch": torch.__version__, "large": large, "small": small},
                     " ".join(["python"] + sys.argv))


if __name__ == "__main__":
    main()
