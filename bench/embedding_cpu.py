"""Embedding backward and forward on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/embedding_cpu.py [--repeat 9] [--write]

The problem is the GPU benchmark's (bench/embedding_cuda.py, issue 5): a table of V = 50,304
rows x d = 768, T = 16,384 ids drawn Zipf-like by its rule (torch's CPU generator, seed 0), dy
uniform in [-1, 1) (seed 1). Figures: medians of --repeat rounds after warm-up, ours and torch's
timed in alternation (a busy machine slows both alike). Backward: ours through the API
(``embedding_backward(dy, ids, V)``: a new (V, d) output each call, from the host block cache
after the first) and as the C call into a kept output; torch: ``aten.embedding_dense_backward``
(what autograd runs for ``F.embedding``), which also returns a new table. Forward: ours
``embedding_forward(table, ids)`` against ``F.embedding(ids, table)``; both copy rows, so the
bits are equal (checked). Also checked: our gradient's bits equal the C call's, and torch's
largest difference from ours. Target (issue 16 point 8): the backward at most torch's time.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch  # noqa: E402
from embedding_cuda import D, T, V, zipf_ids  # noqa: E402
from linear_cpu import paired_medians  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402


def bench(torch, repeat, mode):
    import numpy as np
    ids_t = zipf_ids(torch, T, V, device="cpu")
    gen = torch.Generator().manual_seed(1)
    dy_t = torch.rand(T, D, generator=gen) * 2 - 1
    table_t = torch.randn(V, D, generator=torch.Generator().manual_seed(2))
    ids, dy, table = ids_t.numpy(), dy_t.numpy(), table_t.numpy()
    lib = load(mode).lib
    kept = mt.Array((V, D), "float32")
    args = (ffi.cast("float *", kept.address), ffi.cast("float *", dy.ctypes.data), ffi.cast("void *", ids.ctypes.data),
            8, T, V, D, -1, 0)
    aten = torch.ops.aten.embedding_dense_backward
    ours, raw, theirs = paired_medians([lambda: mt.embedding_backward(dy, ids, V, numeric_mode=mode),
                                        lambda: lib.mt_embedding_backward(*args),
                                        lambda: aten(dy_t, ids_t, V, -1, False)], repeat)
    got = np.asarray(mt.embedding_backward(dy, ids, V, numeric_mode=mode))
    same_as_c_call = got.tobytes() == bytes(kept.tobytes())
    diff = float(np.abs(got - aten(dy_t, ids_t, V, -1, False).numpy()).max())
    fwd, tfwd = paired_medians([lambda: mt.embedding_forward(table, ids, numeric_mode=mode),
                                lambda: torch.nn.functional.embedding(ids_t, table_t)], repeat)
    same_fwd = np.asarray(mt.embedding_forward(table, ids, numeric_mode=mode)).tobytes() == \
        torch.nn.functional.embedding(ids_t, table_t).numpy().tobytes()
    return {"vocab": V, "dim": D, "ids": T, "distinct_rows": int((torch.bincount(ids_t, minlength=V) > 0).sum()),
            "backward_ms": ours * 1e3, "backward_c_call_ms": raw * 1e3, "torch_backward_ms": theirs * 1e3,
            "backward_vs_torch": theirs / ours, "same_bits_as_c_call": same_as_c_call,
            "torch_max_abs_diff_from_ours": diff,
            "forward_ms": fwd * 1e3, "torch_forward_ms": tfwd * 1e3, "forward_vs_torch": tfwd / fwd,
            "forward_same_bits_as_torch": same_fwd}


def main():
    args = bench_args(__doc__, 9, mode=True)
    torch, _ = cpu_torch(args.mode)
    r = bench(torch, args.repeat, args.mode)
    print("embedding backward V=%d d=%d T=%d Zipf ids (%d distinct rows): ours %.2f ms through the API (C call %.2f "
          "ms), torch %.2f ms = %.2fx torch's speed; bits as the C call: %s; torch's largest difference %.3g"
          % (V, D, T, r["distinct_rows"], r["backward_ms"], r["backward_c_call_ms"], r["torch_backward_ms"],
             r["backward_vs_torch"], r["same_bits_as_c_call"], r["torch_max_abs_diff_from_ours"]))
    print("embedding forward: ours %.2f ms, torch %.2f ms = %.2fx torch's speed; the same bits: %s"
          % (r["forward_ms"], r["torch_forward_ms"], r["forward_vs_torch"], r["forward_same_bits_as_torch"]))
    print("  load average at the end: %.1f (on %d cores)" % (os.getloadavg()[0], os.cpu_count()))
    cpu_record(args, "embedding_cpu", {"embedding": r}, torch)


if __name__ == "__main__":
    main()
