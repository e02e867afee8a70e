"""Attention on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/attention_cpu.py [--repeat 15] [--mode identical] [--threads N] [--write]

Figures: forward + backward at B=1, H=4, T=256, D=64, float32 (issue 14), without and with
is_causal; medians of --repeat calls after warm-up, ours and torch's timed in alternation
(bench/linear_cpu.py's paired_medians), through the public API on both sides (ours:
scaled_dot_product_attention(return_lse=True) then its backward; torch: its default backend,
F.scaled_dot_product_attention then .backward), with the same thread count on both sides
(torch.set_num_threads = mt_num_threads; --threads N sets both to N: with other work on the
machine, torch's thread team loses far more than ours, so --threads 1 is the figure to trust
then). ``vs_torch`` is torch's time over ours (above 1: we are
faster). Our finiteness pre-pass reads every input once more before any output is written: its
bytes are listed (``prepass_MB``).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch  # noqa: E402
from linear_cpu import filled, paired_medians, torch_of  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import load  # noqa: E402

SHAPE = (1, 4, 256, 64)   # B, H, T, D


def bench_attention(causal, repeat, mode):
    import torch.nn.functional as F
    backend = load(mode)
    b, h, t, d = SHAPE
    q, k, v, do = (filled((b, h, t, d), 3, s, backend) for s in (0, 1, 2, 3))
    tq, tk, tv = (torch_of(x).requires_grad_() for x in (q, k, v))
    tdo = torch_of(do)

    def ours():
        out, lse = mt.scaled_dot_product_attention(q, k, v, is_causal=causal, return_lse=True, numeric_mode=mode)
        mt.scaled_dot_product_attention_backward(do, q, k, v, out, lse, is_causal=causal, numeric_mode=mode)

    def theirs():
        tq.grad = tk.grad = tv.grad = None
        F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal).backward(tdo)

    fwd, tfwd, both, tboth = paired_medians([
        lambda: mt.scaled_dot_product_attention(q, k, v, is_causal=causal, numeric_mode=mode),
        lambda: F.scaled_dot_product_attention(tq.detach(), tk.detach(), tv.detach(), is_causal=causal),
        ours, theirs], repeat)
    n = b * h * t * d
    return {"B": b, "H": h, "T": t, "D": d, "is_causal": causal, "forward_ms": fwd * 1e3,
            "torch_forward_ms": tfwd * 1e3, "forward_vs_torch": tfwd / fwd, "fwd_bwd_ms": both * 1e3,
            "torch_fwd_bwd_ms": tboth * 1e3, "fwd_bwd_vs_torch": tboth / both,
            "prepass_MB": {"forward": 12 * n / 1e6, "backward": 4 * (5 * n + b * h * t) / 1e6}}


def main():
    args = bench_args(__doc__, 15, ("--threads", 0, "threads on both sides (0: the library's own count)"),
                      mode=True)
    if args.threads:
        load(args.mode).lib.mt_set_num_threads(args.threads)
    torch, _ = cpu_torch(args.mode)
    rows = [bench_attention(c, args.repeat, args.mode) for c in (False, True)]
    for r in rows:
        print("attention B=%d H=%d T=%d D=%d%s: forward %.3f ms (torch %.3f) = %.2fx torch; forward+backward "
              "%.3f ms (torch %.3f) = %.2fx" % (r["B"], r["H"], r["T"], r["D"], " causal" if r["is_causal"] else "",
                                               r["forward_ms"], r["torch_forward_ms"], r["forward_vs_torch"],
                                               r["fwd_bwd_ms"], r["torch_fwd_bwd_ms"], r["fwd_bwd_vs_torch"]))
    cpu_record(args, "attention_cpu", {"attention": rows}, torch)


if __name__ == "__main__":
    main()
