"""SiLU and the residual add on a GPU, side by side with torch in one process.

    python bench/elementwise_cuda.py [--log2n 28] [--repeat 40] [--write]

Buffers, timing and the copy-bandwidth yardstick are bench/random_cuda.py's: torch CUDA tensors
of 2**log2n float32 passed to mojo_train directly, ours writing into a preallocated output
(``out=``), each figure the median of --repeat synchronized calls after warm-up.
Bytes: SiLU, ours: the finiteness pre-pass reads x (nothing is written when x holds NaN or
inf), then read x + write y = 12 per element; torch 8. add: ours 20 (the pre-pass reads a and
b), torch 12. Before timing, the first 2**20 SiLU outputs are checked against the CPU oracle.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import write_result  # noqa: E402
from optim_cuda import copy_bandwidth, timed  # noqa: E402
from random_cuda import matches_cpu_oracle  # noqa: E402

from mojo_train import elementwise as ew  # noqa: E402


def bench(torch, n, repeat, bw):
    x = torch.rand(n, device="cuda") * 4 - 2
    y, dx = torch.empty_like(x), torch.empty_like(x)
    ew.silu_forward(x, out=y)
    torch.cuda.synchronize()
    rows = {"silu_matches_cpu": matches_cpu_oracle(torch, x, y, "mt_silu_forward")}
    silu = timed(lambda: ew.silu_forward(x, out=y), repeat)
    silu_t = timed(lambda: torch.nn.functional.silu(x), repeat, sync=torch.cuda.synchronize)
    add = timed(lambda: ew.add(x, y, out=dx), repeat)
    add_t = timed(lambda: torch.add(x, y), repeat, sync=torch.cuda.synchronize)
    rows["elementwise"] = {"elements": n, "silu_ms": silu * 1e3, "silu_torch_ms": silu_t * 1e3,
                           "silu_of_copy_bw": 12 * n / silu / bw, "add_ms": add * 1e3, "add_torch_ms": add_t * 1e3,
                           "add_of_copy_bw": 20 * n / add / bw}
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--log2n", type=int, default=28)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--write", action="store_true", help="record in bench/results/")
    args = ap.parse_args()
    import torch
    os.environ.setdefault("MOJO_TRAIN_VENDOR", "cuda")
    n = 1 << args.log2n
    bw = copy_bandwidth(torch, 4 * n)
    rows = dict(bench(torch, n, args.repeat, bw), copy_TBps=bw / 1e12)
    o = rows["elementwise"]
    print("copy bandwidth %.2f TB/s (read + write, %d floats)" % (rows["copy_TBps"], n))
    print("silu over 2^%d: %.3f ms (%.0f%%; torch %.3f ms; matches the cpu oracle: %s), add %.3f ms (%.0f%%; "
          "torch %.3f ms)"
          % (args.log2n, o["silu_ms"], 100 * o["silu_of_copy_bw"], o["silu_torch_ms"], rows["silu_matches_cpu"],
             o["add_ms"], 100 * o["add_of_copy_bw"], o["add_torch_ms"]))
    if args.write:
        write_result("elementwise_cuda", dict(rows, gpu=torch.cuda.get_device_name(), torch=torch.__version__),
                     " ".join(["python"] + sys.argv))


if __name__ == "__main__":
    main()
