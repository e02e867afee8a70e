"""Same inputs on the CPU and on the GPU: how many output bits differ, torch against ours.

    python bench/cross_device_cuda.py [--write]

The figures README quotes for torch (its AdamW and cross-entropy differ between CPU and CUDA)
come from here. For each case the same float32 inputs go through torch on the CPU and on
CUDA, and through mojo_train's identical numeric mode on the cpu and cuda vendors; the fraction of
output elements whose bits differ is printed for both. Needs a GPU, torch with CUDA, and
mojo_train's CUDA library (make cuda).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import write_result  # noqa: E402

import mojo_train as mt  # noqa: E402


def differing(a, b):
    """Fraction of float32 elements whose bits differ between two equal-length byte strings."""
    import numpy as np
    ua, ub = np.frombuffer(a, np.uint32), np.frombuffer(b, np.uint32)
    return float((ua != ub).mean())


def torch_adamw(torch, p0, grads, device, fused):
    p = p0.clone().to(device).requires_grad_(True)
    opt = torch.optim.AdamW([p], lr=1e-3, fused=fused or None, foreach=False if not fused else None)
    out = []
    for g in grads:
        p.grad = g.to(device)
        opt.step()
        out.append(p.detach().cpu().numpy().tobytes())
    return out


def ours_adamw(np, p0, grads, vendor):
    os.environ["MOJO_TRAIN_VENDOR"] = vendor
    p = p0.numpy().copy()
    opt = mt.AdamW([p], lr=1e-3)
    out = []
    for g in grads:
        opt.step([g.numpy().copy()])
        out.append(p.tobytes())
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--write", action="store_true")
    ap.add_argument("--n", type=int, default=1 << 20)
    args = ap.parse_args()
    import numpy as np
    import torch
    gen = torch.Generator().manual_seed(0)
    p0 = torch.randn(args.n, generator=gen)
    grads = [torch.randn(args.n, generator=gen) * 1e-2 for _ in range(10)]
    t_cpu = torch_adamw(torch, p0, grads, "cpu", False)
    t_gpu = torch_adamw(torch, p0, grads, "cuda", True)
    o_cpu = ours_adamw(np, p0, grads, "cpu")
    o_gpu = ours_adamw(np, p0, grads, "cuda")
    fig = {"n": args.n,
           "torch_adamw_cpu_vs_cuda_fused_step1": differing(t_cpu[0], t_gpu[0]),
           "torch_adamw_cpu_vs_cuda_fused_step10": differing(t_cpu[-1], t_gpu[-1]),
           "ours_adamw_cpu_vs_cuda_step1": differing(o_cpu[0], o_gpu[0]),
           "ours_adamw_cpu_vs_cuda_step10": differing(o_cpu[-1], o_gpu[-1])}
    logits = torch.randn(512, 50304, generator=gen) * 3
    targets = torch.randint(0, 50304, (512,), generator=gen)
    grads_t = []
    for device in ("cpu", "cuda"):
        x = logits.clone().to(device).requires_grad_(True)
        torch.nn.functional.cross_entropy(x, targets.to(device)).backward()
        grads_t.append(x.grad.cpu().numpy().tobytes())
    grads_o = []
    for vendor in ("cpu", "cuda"):
        os.environ["MOJO_TRAIN_VENDOR"] = vendor
        _, d = mt.cross_entropy(logits.numpy(), targets.numpy(), return_grad=True)
        grads_o.append(bytes(d.to_host().tobytes() if hasattr(d, "to_host") else d.tobytes()))
    fig["torch_cross_entropy_dlogits_cpu_vs_cuda"] = differing(*grads_t)
    fig["ours_cross_entropy_dlogits_cpu_vs_cuda"] = differing(*grads_o)
    for k, v in fig.items():
        print("%-45s %s" % (k, "%.4f" % v if isinstance(v, float) else v))
    if args.write:
        write_result("cross_device_cuda", fig, "python bench/cross_device_cuda.py")


if __name__ == "__main__":
    main()
