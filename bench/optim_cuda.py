"""Optimizers on a GPU, side by side with torch in one process (identical numeric mode).

    python bench/optim_cuda.py [--write]

Parameters and gradients are resident on the GPU (mojo_train DeviceArrays; torch tensors for
torch). Every figure: median wall-clock of --repeat synchronized calls after warm-up, and the
bytes each side must move, as a fraction of the measured device-to-device copy bandwidth.
Bytes for ours include the finiteness pre-pass: AdamW moves 32 bytes a parameter (pre-pass
reads g: 4; update reads p g m v: 16, writes p m v: 12); torch's fused AdamW 28. With
clipping, the norm pass is the pre-pass. (36 bytes until 2026-12-02, when the pre-pass also
read p: native/contracts/optim.md step 3.) Prediction for 32 bytes, before its first GPU run:
100M in one tensor 0.923 -> ~0.82 ms (the same fraction of copy bandwidth), in 200 tensors
1.017 -> ~0.90 ms. clip_grad_norm_ on its own:
bench/clip_cuda.py.
Targets (issue 3): AdamW 100M in one tensor <= 1.1x torch fused; 100M as 200 tensors <= 0.6x
torch fused; 1,000-element AdamW step <= 20 us. Param groups (issue 13): 100M as 200 tensors in 4
groups (each its own lr and weight decay, one with amsgrad, which moves 8 bytes more a parameter
of its group) is still one launch; torch's fused AdamW runs per group there.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import copy_bandwidth, cuda_torch, device_tensors, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

import mojo_train as mt  # noqa: E402


def _groups(tensors, n_groups):
    """n_groups param groups over tensors, each its own lr and weight decay, the last with amsgrad."""
    k = len(tensors) // n_groups
    return [{"params": tensors[i * k:(i + 1) * k if i < n_groups - 1 else None], "lr": 1e-3 * (i + 1),
             "weight_decay": 0.01 * i, "amsgrad": i == n_groups - 1} for i in range(n_groups)]


def bench_adamw(torch, sizes, repeat, bw, clip=None, n_groups=0):
    tp, p = device_tensors(torch, sizes, 1)
    tg, g = device_tensors(torch, sizes, 2)
    opt = mt.AdamW(_groups(p, n_groups) if n_groups else p, lr=1e-3)
    ours = timed(lambda: opt.step(g, max_norm=clip), repeat)
    for a, b in zip(tp, tg):
        a.grad = b
    topt = torch.optim.AdamW(_groups(tp, n_groups) if n_groups else tp, lr=1e-3, fused=True)
    theirs = timed(topt.step, repeat, sync=torch.cuda.synchronize)
    n = sum(sizes)
    return {"params": n, "tensors": len(sizes), "groups": max(n_groups, 1), "clip": clip, "ours_ms": ours * 1e3,
            "torch_fused_ms": theirs * 1e3,
            "ratio": ours / theirs, "ours_bytes": 32 * n, "torch_bytes": 28 * n,
            "ours_of_copy_bw": 32 * n / ours / bw, "torch_of_copy_bw": 28 * n / theirs / bw}


def bench_overheads(torch, repeat=200):
    """Where host time goes: pointer classification and the raw C call for 200 tensors."""
    from mojo_train._native import ffi, load
    lib = load("identical", "cuda").lib
    x = mt.DeviceArray((4,))
    flag = ffi.new("int32_t *")
    cls = timed(lambda: lib.mt_is_device_pointer(flag, ffi.cast("void *", x.ptr)), repeat * 10)
    tp, p = device_tensors(torch, [500_000] * 200, 6)
    tg, g = device_tensors(torch, [500_000] * 200, 7)
    opt = mt.AdamW(p)
    opt.step(g)                       # fills the optimizer's native group table
    table = ffi.new("float *[]", [ffi.cast("float *", a.ptr) for a in g])
    s, gr = opt._stab, opt._native
    raw = timed(lambda: lib.mt_adam_step_groups(opt._params.table, table, s["exp_avg"], s["exp_avg_sq"],
                                                s["max_exp_avg_sq"], opt._steps, opt._norm_ptr, opt._params.c_offsets,
                                                gr.table, gr.tensor_group, 0, 0.0, 1, 200), 20)
    api = timed(lambda: opt.step(g), 20)
    return {"classify_us": cls * 1e6, "raw_c_200_ms": raw * 1e3, "api_200_ms": api * 1e3}


def bench_small(torch, repeat=2001):
    tp, p = device_tensors(torch, [1000], 4)
    tg, g = device_tensors(torch, [1000], 5)
    opt = mt.AdamW(p)
    ours = timed(lambda: opt.step(g), repeat, warmup=100)
    tp[0].grad = tg[0]
    topt = torch.optim.AdamW(tp, fused=True)
    theirs = timed(topt.step, repeat // 4, warmup=20, sync=torch.cuda.synchronize)
    return {"ours_us": ours * 1e6, "torch_fused_us": theirs * 1e6}


def main():
    args = bench_args(__doc__, 40)
    torch = cuda_torch()
    bw = copy_bandwidth(torch)
    rows = {"copy_TBps": bw / 1e12,
            "adamw_100M_1": bench_adamw(torch, [100_000_000], args.repeat, bw),
            "adamw_100M_200": bench_adamw(torch, [500_000] * 200, args.repeat, bw),
            "adamw_100M_200_4groups": bench_adamw(torch, [500_000] * 200, args.repeat, bw, n_groups=4),
            "small": bench_small(torch), "overheads": bench_overheads(torch)}
    print("copy bandwidth %.2f TB/s (read + write)" % rows["copy_TBps"])
    for key in ("adamw_100M_1", "adamw_100M_200", "adamw_100M_200_4groups"):
        r = rows[key]
        print("AdamW %dM in %d tensor(s), %d group(s): ours %.3f ms (%.0f%% of copy bw), torch fused %.3f ms "
              "(%.0f%%), ratio %.2f"
              % (r["params"] // 10**6, r["tensors"], r["groups"], r["ours_ms"], 100 * r["ours_of_copy_bw"],
                 r["torch_fused_ms"],
                 100 * r["torch_of_copy_bw"], r["ratio"]))
    s = rows["small"]
    print("AdamW 1000 params on device, Python to result: ours %.1f us, torch fused %.1f us"
          % (s["ours_us"], s["torch_fused_us"]))
    o = rows["overheads"]
    print("overheads: pointer classification %.2f us; 200 tensors: raw C call %.3f ms, Python API %.3f ms"
          % (o["classify_us"], o["raw_c_200_ms"], o["api_200_ms"]))
    gpu_record(args, "optim_cuda", rows, torch)


if __name__ == "__main__":
    main()
