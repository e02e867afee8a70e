"""RMSNorm on a GPU, side by side with torch in one process (identical numeric mode).

    python bench/rms_norm_cuda.py [--repeat N] [--rows N] [--write]

Every buffer lives on the GPU: allocated by the library (mt_device_alloc, bench/loss_cuda.py's
DeviceBuffer), filled by its own Philox (mt_uniform_fill) and viewed by torch without a copy,
so both sides read the very same rows. The C entry points are called directly through cffi;
every figure is the median wall-clock of --repeat synchronized calls after warm-up.

Bytes counted (float32, N rows, D columns): forward+backward with dweight, the least any
implementation must move is 20 N D (forward reads x, writes y; backward reads dy and x, writes
dx); the three-kernel backward moves 28 N D (the dweight leaves read dy and x once more), the
one-pass kernel 20 N D.
Target (issue 4): RMSNorm 16384 x 4096 forward+backward <= torch's (0.64 ms). Records before
the split into families are in bench/results/loss_cuda.jsonl (key "rms_norm_16384x4096");
new ones go to rms_norm_cuda.jsonl.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _rows import gpu_figures, gpu_main  # noqa: E402
from loss_cuda import DeviceBuffer, _call  # noqa: E402


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

    xt, wt, dyt = x.torch(torch).requires_grad_(True), w.torch(torch).requires_grad_(True), dy.torch(torch)

    def theirs():
        out = torch.nn.functional.rms_norm(xt, (dim,), wt, eps)
        torch.autograd.grad(out, (xt, wt), dyt)

    return gpu_figures(torch, rows, dim, ours_forward, ours_backward, theirs, repeat, bw)


if __name__ == "__main__":
    gpu_main(__doc__, "rms_norm", "weight, dweight", bench_rms_norm)
