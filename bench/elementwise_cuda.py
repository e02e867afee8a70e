"""SiLU, GELU and the residual add on a GPU, side by side with torch in one process.

    python bench/elementwise_cuda.py [--log2n 28] [--repeat 40] [--write]

Buffers are bench/random_cuda.py's, timing and the copy-bandwidth yardstick bench/_gpu.py's: torch CUDA tensors
of 2**log2n float32 passed to mojo_train directly, each figure the median of --repeat
synchronized calls after warm-up. Ours is timed two ways: as torch is called, returning a new
output (``silu_ms``, ``forward_ms``...: the output is declared fresh, MT_MAP_OUT_FRESH, so the
finiteness check rides along in the one pass), and into a preallocated ``out=``
(``silu_out_ms``...: a pre-pass first, so that a refusal leaves out= untouched). SiLU and add
are timed a third way: with deferred refusals (``silu_deferred_ms``, ``add_deferred_ms``; each
call followed by ``mt.synchronize()``, as torch's by ``torch.cuda.synchronize()``), where the
call does not wait for the GPU itself and the output's allocation and free do not synchronize.
SiLU's backward (``silu_backward_ms``, against ``torch.ops.aten.silu_backward``, its first 2**20
outputs checked against the CPU oracle) into a new output only.
Bytes, fresh: as torch's, SiLU and GELU forward 8 per element (read x, write y), add and the
backwards 12; with out= one more read of each input: 12 and 20. Before timing, the first 2**20
SiLU outputs are checked against the CPU oracle. GELU (both approximations, x in [-6, 6)):
backward ``gelu_backward(dy, x)`` against ``torch.ops.aten.gelu_backward`` (the kernel torch's
autograd calls); the first 2**20 outputs of each checked against the CPU oracle. Issue 14's
target: forward + backward over 2**28 at most torch's 2.03 ms (H200, torch 2.11, measured
with autograd).

Prediction for the fresh path (written before its first GPU run, 2026-12-02, fifth session):
the bytes fall by a third (unary 12 -> 8, binary 20 -> 12) and these maps ran at 74-85% of copy
bandwidth, so SiLU 0.93 -> ~0.65 ms, add 1.32 -> ~0.85 ms, GELU forward + backward 3.0 ->
~2.1 ms (the backward near compute-bound: ~1.2 ms of issue), dropout (bench/random_cuda.py)
0.86 -> ~0.63 ms; each allocation of a new output is a stream-ordered pool allocation plus a
synchronization (mt_device_alloc), a few microseconds.

Prediction, not yet run (this session had no GPU), from the H200 records of
bench/results/elementwise_cuda.jsonl (copy 4.1 TB/s; SiLU 0.91 ms at 12 bytes, add 1.30 ms at 20):
GELU forward ~0.95 ms (SiLU's bytes; its ~85 instructions per element, ~0.7 ms of the H200's
fp32 issue rate, hide under the memory time), backward ~1.4 ms ('none': erf, exp and ~20 more
operations, ~150 instructions per element, ~1.2 ms of issue: close to compute-bound), so
forward + backward ~2.3-2.4 ms: about 15% over the 2.03 ms target, against torch's own kernels
at ~0.55 + ~0.8 ms. The finiteness pre-pass is 8 of ours' 32 bytes per element (25%).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import CHECK, fp, gpu_record, matches_cpu_oracle, over_floats, timed  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train import elementwise as ew  # noqa: E402

_APPROXIMATE = {"none": 0, "tanh": 1}   # mojo_train.h enum mt_gelu_approximate


def gelu_matches_cpu(torch, x, dy, out_dev, approximate):
    """The first CHECK outputs of a device GELU call (forward when dy is None) equal the CPU oracle's."""
    code = (_APPROXIMATE[approximate],)
    if dy is None:
        return matches_cpu_oracle(torch, x, out_dev, "mt_gelu_forward", after=code)
    return matches_cpu_oracle(torch, dy, out_dev, "mt_gelu_backward", more=[x], after=code)


def bench_gelu(torch, n, repeat, bw):
    """Forward and backward of both approximations, ours and torch's, over n floats in [-6, 6)."""
    x = torch.rand(n, device="cuda") * 12 - 6
    dy = torch.rand(n, device="cuda") * 2 - 1
    y, dx = torch.empty_like(x), torch.empty_like(x)
    rows = {}
    for a in _APPROXIMATE:
        ew.gelu_forward(x, a, out=y)
        ew.gelu_backward(dy, x, a, out=dx)
        torch.cuda.synchronize()
        fwd = timed(lambda: ew.gelu_forward(x, a), repeat)
        bwd = timed(lambda: ew.gelu_backward(dy, x, a), repeat)
        fwd_out = timed(lambda: ew.gelu_forward(x, a, out=y), repeat)
        bwd_out = timed(lambda: ew.gelu_backward(dy, x, a, out=dx), repeat)
        tfwd = timed(lambda: torch.nn.functional.gelu(x, approximate=a), repeat, sync=torch.cuda.synchronize)
        tbwd = timed(lambda: torch.ops.aten.gelu_backward(dy, x, approximate=a), repeat, sync=torch.cuda.synchronize)
        fresh_y, fresh_dx = ew.gelu_forward(x, a), ew.gelu_backward(dy, x, a)
        rows["gelu_" + a] = {"elements": n, "matches_cpu": [gelu_matches_cpu(torch, x, None, y, a),
                                                            gelu_matches_cpu(torch, x, dy, dx, a)],
                             "fresh_equals_out": [_same(torch, fresh_y, y), _same(torch, fresh_dx, dx)],
                             "forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3, "fwd_bwd_ms": (fwd + bwd) * 1e3,
                             "forward_out_ms": fwd_out * 1e3, "backward_out_ms": bwd_out * 1e3,
                             "torch_forward_ms": tfwd * 1e3, "torch_backward_ms": tbwd * 1e3,
                             "forward_of_copy_bw": 8 * n / fwd / bw, "backward_of_copy_bw": 12 * n / bwd / bw}
    return rows


def _same(torch, ours, theirs):
    """The bytes of a result of ours (a DeviceArray) equal a torch tensor's."""
    return bool(torch.equal(torch.as_tensor(ours, device="cuda").view(torch.int32), theirs.view(torch.int32)))


def bench_silu_backward(torch, x, n, repeat, bw):
    """silu_backward(dy, x) into a new output against torch.ops.aten.silu_backward (12 bytes an element)."""
    dy = torch.rand(n, device="cuda") * 2 - 1
    dx = ew.silu_backward(dy, x)
    ours = timed(lambda: ew.silu_backward(dy, x), repeat)
    theirs = timed(lambda: torch.ops.aten.silu_backward(dy, x), repeat, sync=torch.cuda.synchronize)
    return {"silu_backward_ms": ours * 1e3, "silu_backward_torch_ms": theirs * 1e3,
            "silu_backward_of_copy_bw": 12 * n / ours / bw,
            "silu_backward_matches_cpu": matches_cpu_oracle(torch, dy, torch.as_tensor(dx, device="cuda"),
                                                            "mt_silu_backward", more=[x])}


def bench(torch, n, repeat, bw):
    x = torch.rand(n, device="cuda") * 4 - 2
    y, dx = torch.empty_like(x), torch.empty_like(x)
    ew.silu_forward(x, out=y)
    torch.cuda.synchronize()
    rows = {"silu_matches_cpu": matches_cpu_oracle(torch, x, y, "mt_silu_forward")}
    silu = timed(lambda: ew.silu_forward(x), repeat)
    silu_out = timed(lambda: ew.silu_forward(x, out=y), repeat)
    silu_t = timed(lambda: torch.nn.functional.silu(x), repeat, sync=torch.cuda.synchronize)
    add = timed(lambda: ew.add(x, y), repeat)
    add_out = timed(lambda: ew.add(x, y, out=dx), repeat)
    add_t = timed(lambda: torch.add(x, y), repeat, sync=torch.cuda.synchronize)
    with mt.deferred_refusals():   # each call then synchronized by mt.synchronize, as torch's by its own
        silu_d = timed(lambda: ew.silu_forward(x), repeat, sync=mt.synchronize)
        add_d = timed(lambda: ew.add(x, y), repeat, sync=mt.synchronize)
        same_d = _same(torch, ew.silu_forward(x), y)
    rows["elementwise"] = {"elements": n, "silu_ms": silu * 1e3, "silu_out_ms": silu_out * 1e3,
                           "silu_torch_ms": silu_t * 1e3, "silu_of_copy_bw": 8 * n / silu / bw,
                           "silu_fresh_equals_out": _same(torch, ew.silu_forward(x), y),
                           "add_ms": add * 1e3, "add_out_ms": add_out * 1e3, "add_torch_ms": add_t * 1e3,
                           "add_of_copy_bw": 12 * n / add / bw,
                           "silu_deferred_ms": silu_d * 1e3, "add_deferred_ms": add_d * 1e3,
                           "silu_deferred_equals_out": same_d}
    rows["elementwise"].update(bench_silu_backward(torch, x, n, repeat, bw))
    rows.update(bench_gelu(torch, n, repeat, bw))
    return rows


def main():
    args, torch, rows = over_floats(__doc__, bench)
    o = rows["elementwise"]
    print("silu over 2^%d: %.3f ms new output (%.0f%%), %.3f ms into out=; torch %.3f ms; matches the cpu oracle: "
          "%s; add %.3f ms new output (%.0f%%), %.3f ms into out=; torch %.3f ms"
          % (args.log2n, o["silu_ms"], 100 * o["silu_of_copy_bw"], o["silu_out_ms"], o["silu_torch_ms"],
             rows["silu_matches_cpu"] and o["silu_fresh_equals_out"], o["add_ms"], 100 * o["add_of_copy_bw"],
             o["add_out_ms"], o["add_torch_ms"]))
    print("silu_backward over 2^%d: %.3f ms new output (%.0f%%); torch %.3f ms; matches the cpu oracle: %s"
          % (args.log2n, o["silu_backward_ms"], 100 * o["silu_backward_of_copy_bw"], o["silu_backward_torch_ms"],
             o["silu_backward_matches_cpu"]))
    print("deferred refusals (each call then mt.synchronize()): silu %.3f ms, add %.3f ms; same bits: %s"
          % (o["silu_deferred_ms"], o["add_deferred_ms"], o["silu_deferred_equals_out"]))
    for a in _APPROXIMATE:
        g = rows["gelu_" + a]
        print("gelu %s over 2^%d: forward %.3f ms (%.0f%%; out= %.3f; torch %.3f), backward %.3f ms (%.0f%%; out= "
              "%.3f; torch %.3f), forward + backward %.3f ms (target: torch's 2.03 ms); matches the cpu oracle: %s, "
              "fresh equals out=: %s"
              % (a, args.log2n, g["forward_ms"], 100 * g["forward_of_copy_bw"], g["forward_out_ms"],
                 g["torch_forward_ms"], g["backward_ms"], 100 * g["backward_of_copy_bw"], g["backward_out_ms"],
                 g["torch_backward_ms"], g["fwd_bwd_ms"], g["matches_cpu"], g["fresh_equals_out"]))
    gpu_record(args, "elementwise_cuda", rows, torch)


if __name__ == "__main__":
    main()
