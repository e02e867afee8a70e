"""GELU on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/elementwise_cpu.py [--log2n 22] [--repeat 15] [--mode identical] [--write]

Figures: medians of --repeat calls after warm-up, ours and torch's timed in alternation (call
for call; bench/linear_cpu.py's paired_medians), with the same thread count on both sides
(torch.set_num_threads = mt_num_threads). Both approximations ('none': erf, 'tanh'), over
2**log2n float32 in [-6, 6): forward (ours into a preallocated out=, torch's
``F.gelu``) and backward (ours ``gelu_backward(dy, x, out=)``, torch's
``torch.ops.aten.gelu_backward``, the kernel its autograd calls); ``fwd_bwd_vs_torch`` is torch's
forward + backward time over ours (above 1: ours faster). Bytes per element: ours 12 forward and
20 backward (the finiteness pre-pass reads every input once more before anything is written),
torch 8 and 12. Ours is also timed as torch is called, returning a new output (``fresh_*``: the
output declared fresh, MT_MAP_OUT_FRESH, so the finiteness check rides along in the one pass and
the bytes are torch's). OMP_WAIT_POLICY defaults to PASSIVE (bench/_timing.py): with libgomp's default, torch's idle
OpenMP threads spin on both cores for a while after each of its calls, and ours, timed next,
ran 1.7x slower (measured in this session: forward 5.3 ms against 3.05 ms alone). Records go
to bench/results/elementwise_cpu.jsonl.

What to expect, from the cost of one element (vectorized 16 wide on AVX-512): 'tanh' near
torch's time (mt_tanhf takes both of its pieces, ~75 operations; torch's vectorized tanh is as
dear); 'none' since elementwise v3 through Abramowitz-Stegun 7.1.26 (torch's own CPU erf formula:
one division, a degree-5 polynomial and a plain exp; ~44 AVX-512 instructions per 16 elements with
GELU's product), its backward taking the pdf from the same exp: 1.02-1.04x torch's speed forward +
backward (0.61-0.68x through v2's two-piece 1 + erf, 0.46-0.51x through v1's mt_erff).
First record (bench/results/elementwise_cpu.jsonl,
2**22, 2 threads, AMD EPYC, load ~1): 'none' forward 3.03 ms (torch 1.93), backward 6.96 (2.82);
'tanh' 3.07 (3.42) and 3.96 (4.22).
"""
import os
import sys


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch  # noqa: E402
from linear_cpu import paired_medians, torch_of  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402


def _uniform(n, stream, backend):
    a = mt.Array((n,), "float32")
    backend.check(backend.lib.mt_uniform_fill(ffi.cast("float *", a.address), 14, stream, 0, -6.0, 6.0, n), "bench")
    return a


def bench_gelu(n, approximate, repeat, mode):
    import torch
    backend = load(mode)
    x, dy = _uniform(n, 0, backend), _uniform(n, 1, backend)
    y, dx = mt.Array((n,), "float32"), mt.Array((n,), "float32")
    tx, tdy = torch_of(x), torch_of(dy)
    fwd, tfwd, bwd, tbwd, ffwd, fbwd = paired_medians([
        lambda: mt.gelu_forward(x, approximate, out=y, numeric_mode=mode),
        lambda: torch.nn.functional.gelu(tx, approximate=approximate),
        lambda: mt.gelu_backward(dy, x, approximate, out=dx, numeric_mode=mode),
        lambda: torch.ops.aten.gelu_backward(tdy, tx, approximate=approximate),
        lambda: mt.gelu_forward(x, approximate, numeric_mode=mode),
        lambda: mt.gelu_backward(dy, x, approximate, numeric_mode=mode)], repeat)
    return {"elements": n, "approximate": approximate, "forward_ms": fwd * 1e3, "torch_forward_ms": tfwd * 1e3,
            "backward_ms": bwd * 1e3, "torch_backward_ms": tbwd * 1e3, "forward_vs_torch": tfwd / fwd,
            "fwd_bwd_vs_torch": (tfwd + tbwd) / (fwd + bwd), "prepass_MB": {"forward": 4 * n / 1e6,
                                                                            "backward": 8 * n / 1e6},
            "fresh_forward_ms": ffwd * 1e3, "fresh_backward_ms": fbwd * 1e3,
            "fresh_fwd_bwd_vs_torch": (tfwd + tbwd) / (ffwd + fbwd)}


def main():
    args = bench_args(__doc__, 15, ("--log2n", 22), mode=True)
    torch, threads = cpu_torch(args.mode)
    rows = [bench_gelu(1 << args.log2n, a, args.repeat, args.mode) for a in ("none", "tanh")]
    for r in rows:
        print("gelu %s over 2^%d (%d threads): forward %.2f ms (torch %.2f) = %.2fx torch; backward %.2f ms "
              "(torch %.2f); forward+backward %.2fx torch; new outputs as torch's: forward %.2f, backward %.2f ms, "
              "%.2fx torch" % (
                  r["approximate"], args.log2n, threads, r["forward_ms"], r["torch_forward_ms"],
                  r["forward_vs_torch"], r["backward_ms"], r["torch_backward_ms"], r["fwd_bwd_vs_torch"],
                  r["fresh_forward_ms"], r["fresh_backward_ms"], r["fresh_fwd_bwd_vs_torch"]))
    cpu_record(args, "elementwise_cpu", {"gelu": rows}, torch)


if __name__ == "__main__":
    main()
