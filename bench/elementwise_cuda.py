"""SiLU and the residual add on a GPU, side by side with torch in one process.

    python bench/elementwise_cuda.py [--log2n 28] [--repeat 40] [--write]

Buffers are bench/random_cuda.py's, timing and the copy-bandwidth yardstick bench/_gpu.py's: torch CUDA tensors
of 2**log2n float32 passed to mojo_train directly, ours writing into a preallocated output
(``out=``), each figure the median of --repeat synchronized calls after warm-up.
Bytes: SiLU, ours: the finiteness pre-pass reads x (nothing is written when x holds NaN or
inf), then read x + write y = 12 per element; torch 8. add: ours 20 (the pre-pass reads a and
b), torch 12. Before timing, the first 2**20 SiLU outputs are checked against the CPU oracle.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import gpu_record, matches_cpu_oracle, over_floats, timed  # noqa: E402

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
    args, torch, rows = over_floats(__doc__, bench)
    o = rows["elementwise"]
    print("silu over 2^%d: %.3f ms (%.0f%%; torch %.3f ms; matches the cpu oracle: %s), add %.3f ms (%.0f%%; "
          "torch %.3f ms)"
          % (args.log2n, o["silu_ms"], 100 * o["silu_of_copy_bw"], o["silu_torch_ms"], rows["silu_matches_cpu"],
             o["add_ms"], 100 * o["add_of_copy_bw"], o["add_torch_ms"]))
    gpu_record(args, "elementwise_cuda", rows, torch)


if __name__ == "__main__":
    main()
