"""LayerNorm on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/layer_norm_cpu.py [--repeat 15] [--mode identical] [--write]

Figures: medians of --repeat calls after warm-up, ours and torch's timed in alternation (call
for call; bench/linear_cpu.py's paired_medians), through the public API on both sides, with
the same thread count on both sides (torch.set_num_threads = mt_num_threads), at RMSNorm's CPU
shapes (bench/_rows.py's CPU_SHAPES). Weight and bias are given; the backward computes dx, dweight
and dbias. The finiteness check rides along with the pass that writes y and dx (layer_norm.md,
"Refusals"; ``prepass_MB`` 0); until 2026-12-02 a pre-pass read every input once more. Target (issue 14): forward+backward at most torch's time.
Records go to bench/results/layer_norm_cpu.jsonl.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _rows import cpu_figures, cpu_main  # noqa: E402
from linear_cpu import filled, torch_of  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import load  # noqa: E402


def bench_ln(rows, dim, repeat, mode):
    import torch.nn.functional as F
    backend = load(mode)
    x, dy = filled((rows, dim), 4, 0, backend), filled((rows, dim), 4, 3, backend)
    w, b = filled((dim,), 4, 1, backend), filled((dim,), 4, 2, backend)
    tx, tdy = torch_of(x).requires_grad_(), torch_of(dy)
    tw, tb = torch_of(w).requires_grad_(), torch_of(b).requires_grad_()

    def ours():
        mt.layer_norm_forward(x, w, b, 1e-5, numeric_mode=mode)
        mt.layer_norm_backward(dy, x, w, b, 1e-5, numeric_mode=mode)

    def theirs():
        tx.grad = tw.grad = tb.grad = None
        F.layer_norm(tx, (dim,), tw, tb, 1e-5).backward(tdy)

    return cpu_figures(rows, dim, [
        lambda: mt.layer_norm_forward(x, w, b, 1e-5, numeric_mode=mode),
        lambda: F.layer_norm(tx.detach(), (dim,), tw.detach(), tb.detach(), 1e-5), ours, theirs], repeat, prepass=False)


if __name__ == "__main__":
    cpu_main(__doc__, "layer_norm", bench_ln)
