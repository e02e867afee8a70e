"""The torch adapter's overhead on a GPU: one training step of issue 13's model through
mojo_train.torch (torch's autograd and our AdamW subclass) against the same step through the
native API (tests/_torch_model.py holds both), in one process.

    python bench/torch_adapter_cuda.py [--width 768] [--blocks 4] [--vocab 50304] [--tokens 8192]
                                       [--repeat 10] [--write]

Each figure: median wall-clock of --repeat synchronized steps after warm-up (forward, backward,
AdamW with two param groups), batches made beforehand on the device for both sides. Must (issue
13 point 6): the adapter's step at most 1.10x the native API's at width 768, 4 blocks, vocabulary
50304, 8192 tokens. The two sides' parameters are compared after the timed steps (the same
bytes: both took the same batches).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _gpu import cuda_torch, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402


def main():
    args = bench_args(__doc__, 10, ("--width", 768), ("--blocks", 4), ("--vocab", 50304), ("--tokens", 8192))
    torch = cuda_torch()
    import mojo_train as mt
    from _torch_model import NativeLM, TorchLM, batch, torch_optimizer, torch_state_bytes, torch_step
    torch.manual_seed(0)
    model = TorchLM(args.vocab, args.width, args.blocks)
    native = NativeLM(model, device=True)
    model = model.cuda()
    opt = torch_optimizer(model)
    n = 3 + args.repeat
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


if __name__ == "__main__":
    main()
