"""RMSNorm on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/rms_norm_cpu.py [--repeat 15] [--mode identical] [--write]

Figures: medians of --repeat calls after warm-up, ours and torch's timed in alternation (call
for call; bench/linear_cpu.py's paired_medians), through the public API on both sides, with
the same thread count on both sides (torch.set_num_threads = mt_num_threads). Our finiteness
pre-pass reads every input once more before any output is written: its bytes are listed
(``prepass_MB``). Records before the split into families are in bench/results/dense_cpu.jsonl
(key "rms_norm"); new ones go to rms_norm_cpu.jsonl.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _rows import cpu_figures, cpu_main  # noqa: E402
from linear_cpu import filled, torch_of  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import load  # noqa: E402


def bench_rms(rows, dim, repeat, mode):
    import torch.nn.functional as F
    backend = load(mode)
    x, dy, w = filled((rows, dim), 2, 0, backend), filled((rows, dim), 2, 3, backend), filled((dim,), 2, 1, backend)
    tx, tdy, tw = torch_of(x).requires_grad_(), torch_of(dy), torch_of(w).requires_grad_()

    def ours():
        mt.rms_norm_forward(x, w, 1e-5, numeric_mode=mode)
        mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode=mode)

    def theirs():
        tx.grad = tw.grad = None
        F.rms_norm(tx, (dim,), tw, 1e-5).backward(tdy)

    return cpu_figures(rows, dim, [
        lambda: mt.rms_norm_forward(x, w, 1e-5, numeric_mode=mode),
        lambda: F.rms_norm(tx.detach(), (dim,), tw.detach(), 1e-5), ours, theirs], repeat)


if __name__ == "__main__":
    cpu_main(__doc__, "rms_norm", bench_rms)
