"""The fused LM head on the GPU: linear_cross_entropy forward + backward against torch's
materialized fp32 path (F.linear -> F.cross_entropy -> backward, TF32 off), side by side in
one process, identical numeric mode, device buffers (torch CUDA tensors passed straight in).

    python bench/lm_head_cuda.py [--rows 8192 --width 768 --vocab 50304] [--repeat 5] [--write]

Target (issue 4): at most 1.25x torch's time with at most 1 GB of extra GPU memory (torch:
4.9 GB). Our extra memory is the library's own counter (mojo_train.memory_stats: scratch the
call allocates), torch's the growth of torch.cuda.max_memory_allocated over its inputs.
FLOPs: three GEMMs of 2 * rows * width * vocab each.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mojo_train as mt  # noqa: E402
from _timing import median_seconds, write_result  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--width", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    r, w, v = args.rows, args.width, args.vocab
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(r, w, device="cuda", generator=g)
    wt = torch.randn(v, w, device="cuda", generator=g) * 0.02
    t = torch.randint(0, v, (r,), device="cuda", generator=g)
    sync = torch.cuda.synchronize

    def ours():
        return mt.linear_cross_entropy(h, wt, t, return_grad=True, chunk_rows=args.chunk, numeric_mode="identical")

    hh, ww = h.clone().requires_grad_(), wt.clone().requires_grad_()

    def theirs():
        hh.grad = ww.grad = None
        loss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(hh, ww), t)
        loss.backward()
        return loss

    got = ours()
    ref = theirs()
    sync()
    ours_ms = median_seconds(ours, args.repeat, warmup=2, sync=sync) * 1e3
    before = mt.memory_stats(reset=True, numeric_mode="identical")["current"]
    ours()
    ours_extra = mt.memory_stats(numeric_mode="identical")["peak"] - before
    theirs_ms = median_seconds(theirs, args.repeat, warmup=2, sync=sync) * 1e3
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    theirs()
    sync()
    theirs_extra = torch.cuda.max_memory_allocated() - base
    flops = 3 * 2.0 * r * w * v
    dw = torch.as_tensor(got[2], device="cuda")
    err = float((dw - ww.grad).abs().max() / ww.grad.abs().max())
    figures = {"rows": r, "width": w, "vocab": v, "ours_ms": ours_ms, "torch_ms": theirs_ms,
               "ratio": ours_ms / theirs_ms, "ours_tflops": flops / ours_ms / 1e9,
               "torch_tflops": flops / theirs_ms / 1e9, "ours_extra_mb": ours_extra / 2 ** 20,
               "torch_extra_mb": theirs_extra / 2 ** 20, "loss": got[0], "torch_loss": float(ref.detach()),
               "dweight_rel_err": err, "chunk_rows": args.chunk, "gpu": torch.cuda.get_device_name()}
    print("linear_cross_entropy fwd+bwd %dx%dx%d: ours %.2f ms (%.1f TFLOP/s, %.0f MB extra), torch materialized "
          "fp32 %.2f ms (%.1f TFLOP/s, %.0f MB extra), ratio %.2f; loss %.6f vs %.6f, dweight rel err %.1e"
          % (r, w, v, ours_ms, figures["ours_tflops"], figures["ours_extra_mb"], theirs_ms,
             figures["torch_tflops"], figures["torch_extra_mb"], figures["ratio"], got[0], float(ref), err))
    if args.write:
        write_result("lm_head_cuda", figures, "python bench/lm_head_cuda.py --write")


if __name__ == "__main__":
    main()
