"""clip_grad_norm_ on a GPU, side by side with torch's foreach clip in one process (identical numeric mode).

    python bench/clip_cuda.py [--repeat 40] [--write]

Gradients are resident on the GPU (mojo_train DeviceArrays; torch tensors as p.grad for torch).
Every figure: median wall-clock of --repeat synchronized calls after warm-up, and the bytes
moved as a fraction of the measured device-to-device copy bandwidth (bench/_gpu.py's timing
and yardstick). With clipping active a clip moves 12 bytes an element (norm read 4, scale read
4 + write 4). Target (issue 3): 200 x 500K (active) <= 0.4 ms.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import copy_bandwidth, cuda_torch, device_tensors, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

import mojo_train as mt  # noqa: E402


def halving(start):
    """max_norm for call k: half the previous, so clipping is active on every call (a fixed
    max_norm stops clipping after the first call has scaled the gradients down to it)."""
    state = [start]

    def next_norm():
        state[0] *= 0.5
        return state[0]
    return next_norm


def bench_clip(torch, sizes, repeat, bw):
    tg, g = device_tensors(torch, sizes, 3)
    n = sum(sizes)
    ours_norm = halving(1.0)
    ours = timed(lambda: mt.clip_grad_norm_(g, ours_norm()), repeat)
    tparams = [torch.zeros(1, device="cuda").expand(s).clone() for s in sizes]   # torch clips p.grad
    for p, gr in zip(tparams, tg):
        p.grad = gr
    theirs_norm = halving(1.0)
    theirs = timed(lambda: torch.nn.utils.clip_grad_norm_(tparams, theirs_norm(), foreach=True), repeat,
                   sync=torch.cuda.synchronize)
    return {"elements": n, "tensors": len(sizes), "ours_ms": ours * 1e3, "torch_foreach_ms": theirs * 1e3,
            "bytes": 12 * n, "ours_of_copy_bw": 12 * n / ours / bw}


def main():
    args = bench_args(__doc__, 40)
    torch = cuda_torch()
    bw = copy_bandwidth(torch)
    rows = {"copy_TBps": bw / 1e12, "clip_200x500K": bench_clip(torch, [500_000] * 200, args.repeat, bw)}
    print("copy bandwidth %.2f TB/s (read + write)" % rows["copy_TBps"])
    c = rows["clip_200x500K"]
    print("clip_grad_norm_ 200 x 500K (clipping): ours %.3f ms (%.0f%% of copy bw), torch foreach %.3f ms"
          % (c["ours_ms"], 100 * c["ours_of_copy_bw"], c["torch_foreach_ms"]))
    gpu_record(args, "clip_cuda", rows, torch)


if __name__ == "__main__":
    main()
