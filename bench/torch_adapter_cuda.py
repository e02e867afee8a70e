"""The torch adapter's overhead on a GPU: one training step of issue 13's model through
mojo_train.torch (torch's autograd and our AdamW subclass) against the same step through the
native API (tests/_torch_model.py holds both), in one process.

    python bench/torch_adapter_cuda.py [--width 768] [--blocks 4] [--vocab 50304] [--tokens 8192]
                                       [--repeat 10] [--write] [--profile FILE]

Each figure: median wall-clock of --repeat synchronized steps after warm-up (forward, backward,
AdamW with two param groups), batches made beforehand on the device for both sides. Must (issue
13 point 6): the adapter's step at most 1.10x the native API's at width 768, 4 blocks, vocabulary
50304, 8192 tokens. The two sides' parameters are compared after the timed steps (the same
bytes: both took the same batches).

--profile FILE: after the timing, torch.profiler's tables of three more steps of each side (by
CPU time and by CUDA time) and cProfile's of three more (Python functions by own time) are written to FILE: where the
adapter's extra milliseconds go.
"""
import cProfile
import io
import os
import pstats
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _gpu import cuda_torch, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402


def main():
    args = bench_args(__doc__, 10, ("--width", 768), ("--blocks", 4), ("--vocab", 50304), ("--tokens", 8192),
                      ("--profile", "", "write torch.profiler tables of both sides to this file"))
    torch = cuda_torch()
    import mojo_train as mt
    from _torch_model import NativeLM, TorchLM, batch, torch_optimizer, torch_state_bytes, torch_step
    torch.manual_seed(0)
    model = TorchLM(args.vocab, args.width, args.blocks)
    native = NativeLM(model, device=True)
    model = model.cuda()
    opt = torch_optimizer(model)
    n = 3 + args.repeat + (6 if args.profile else 0)
    batches = [batch(s, args.vocab, args.tokens) for s in range(n)]
    on_gpu = [(i.cuda(), t.cuda()) for i, t in batches]
    as_arrays = [(mt.to_device(mt.Array.from_bytes(i.numpy().tobytes(), tuple(i.shape), "int64")),
                  mt.to_device(mt.Array.from_bytes(t.numpy().tobytes(), tuple(t.shape), "int64")))
                 for i, t in batches]
    k = {"adapter": 0, "native": 0}

    def adapter_step():
        ids, targets = on_gpu[k["adapter"]]
        k["adapter"] += 1
        torch_step(model, opt, ids, targets)

    def native_step():
        ids, targets = as_arrays[k["native"]]
        k["native"] += 1
        native.step(ids, targets)

    ours = timed(adapter_step, args.repeat, sync=torch.cuda.synchronize)
    base = timed(native_step, args.repeat, sync=torch.cuda.synchronize)
    same = torch_state_bytes(model, opt) == native.state_bytes()
    rows = {"width": args.width, "blocks": args.blocks, "vocab": args.vocab, "tokens": args.tokens,
            "adapter_ms": ours * 1e3, "native_ms": base * 1e3, "ratio": ours / base, "same_bytes": same}
    print("training step, width %d, %d blocks, vocab %d, %d tokens: torch adapter %.2f ms, native API %.2f ms, "
          "ratio %.3f (must be <= 1.10); same bytes after %d steps: %s"
          % (args.width, args.blocks, args.vocab, args.tokens, rows["adapter_ms"], rows["native_ms"], rows["ratio"],
             n, same))
    gpu_record(args, "torch_adapter_cuda", rows, torch)
    if args.profile:
        profile(torch, args.profile, {"adapter": adapter_step, "native": native_step}, extra=3)


def profile(torch, path, steps, extra):
    """torch.profiler tables of ``extra`` more calls of each step function, written to ``path``."""
    from torch.profiler import ProfilerActivity, profile as torch_profile
    with open(path, "w") as f:
        for name, step in steps.items():
            with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(extra):
                    step()
                torch.cuda.synchronize()
            averages = prof.key_averages()
            for sort in ("cpu_time_total", "self_cpu_time_total", "cuda_time_total"):
                f.write("=== %s, %d steps, by %s\n%s\n" % (name, extra, sort, averages.table(sort_by=sort, row_limit=30)))
            pr = cProfile.Profile()        # the Python side: where the host time goes
            pr.enable()
            for _ in range(extra):
                step()
            torch.cuda.synchronize()
            pr.disable()
            text = io.StringIO()
            pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(30)
            f.write("=== %s, %d steps, Python functions by own time\n%s\n" % (name, extra, text.getvalue()))


if __name__ == "__main__":
    main()
