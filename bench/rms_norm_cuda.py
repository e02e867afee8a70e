"""RMSNorm on a GPU, side by side with torch in one process (identical numeric mode).

    python bench/rms_norm_cuda.py [--repeat N] [--write]

Every buffer lives on the GPU: allocated by the library (mt_device_alloc, bench/loss_cuda.py's
DeviceBuffer), filled by its own Philox (mt_uniform_fill) and viewed by torch without a copy,
so both sides read the very same rows. The C entry points are called directly through cffi;
every figure is the median wall-clock of --repeat synchronized calls after warm-up.

Bytes counted (float32, N rows, D columns): forward+backward with dweight, the least any
implementation must move is 20 N D (forward reads x, writes y; backward reads dy and x, writes
dx); ours moves 28 N D (the dweight leaves read dy and x once more).
Target (issue 4): RMSNorm 16384 x 4096 forward+backward <= torch's (0.64 ms). Records before
the split into families are in bench/results/loss_cuda.jsonl (key "rms_norm_16384x4096");
new ones go to rms_norm_cuda.jsonl.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import copy_bandwidth, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402
from loss_cuda import DeviceBuffer, _call  # noqa: E402

from mojo_train import _native  # noqa: E402


def bench_rms_norm(torch, gpu, rows, dim, repeat, bw, eps=1e-5):
    x = DeviceBuffer(gpu, (rows, dim)).fill_uniform(21, 0, -2.0, 2.0)
    dy = DeviceBuffer(gpu, (rows, dim)).fill_uniform(21, 1, -1.0, 1.0)
    w = DeviceBuffer(gpu, (dim,)).fill_uniform(21, 2, 0.5, 1.5)
    y, dx, dw = DeviceBuffer(gpu, (rows, dim)), DeviceBuffer(gpu, (rows, dim)), DeviceBuffer(gpu, (dim,))
    lib = gpu.lib

    def ours_forward():
        _call(gpu, lib.mt_rms_norm_forward(y.ptr(), x.ptr(), w.ptr(), eps, rows, dim), "mt_rms_norm_forward")

    def ours_backward():
        _call(gpu, lib.mt_rms_norm_backward(dx.ptr(), dw.ptr(), dy.ptr(), x.ptr(), w.ptr(), eps, rows, dim),
              "mt_rms_norm_backward")

    def ours():
        ours_forward()
        ours_backward()

    xt, wt, dyt = x.torch(torch).requires_grad_(True), w.torch(torch).requires_grad_(True), dy.torch(torch)

    def theirs():
        out = torch.nn.functional.rms_norm(xt, (dim,), wt, eps)
        torch.autograd.grad(out, (xt, wt), dyt)

    torch.cuda.synchronize()
    t_f, t_b, t_ours = timed(ours_forward, repeat), timed(ours_backward, repeat), timed(ours, repeat)
    t_theirs = timed(theirs, repeat, sync=torch.cuda.synchronize)
    least, moved = 20 * rows * dim, 28 * rows * dim
    return {"rows": rows, "dim": dim, "ours_ms": t_ours * 1e3, "ours_forward_ms": t_f * 1e3,
            "ours_backward_ms": t_b * 1e3, "torch_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs,
            "least_bytes": least, "ours_bytes": moved, "floor_ms": least / bw * 1e3,
            "ours_of_copy_bw": moved / t_ours / bw, "torch_of_copy_bw": least / t_theirs / bw}


def report(r):
    print("rms_norm %dx%d fwd+bwd (weight, dweight): ours %.3f ms (fwd %.3f + bwd %.3f; %.0f%% of copy bw for "
          "%.2f GB moved), torch %.3f ms, ratio %.2f; floor %.3f ms for the least %.2f GB"
          % (r["rows"], r["dim"], r["ours_ms"], r["ours_forward_ms"], r["ours_backward_ms"], 100 * r["ours_of_copy_bw"],
             r["ours_bytes"] / 1e9, r["torch_ms"], r["ratio"], r["floor_ms"], r["least_bytes"] / 1e9))


def main():
    args = bench_args(__doc__, 20)
    import torch
    gpu = _native.load("identical", "cuda")
    bw = copy_bandwidth(torch)
    print("copy bandwidth %.2f TB/s (read + write)" % (bw / 1e12))
    row = bench_rms_norm(torch, gpu, 16384, 4096, max(args.repeat, 10), bw)
    report(row)
    gpu_record(args, "rms_norm_cuda", {"copy_TBps": bw / 1e12, "rms_norm_16384x4096": row}, torch)


if __name__ == "__main__":
    main()
