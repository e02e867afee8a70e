"""cross_entropy on the CPU, side by side with torch in one process (identical numeric mode by default).

    python bench/loss_cpu.py [--rows 1024] [--vocab 32000] [--repeat 15] [--write]

Figures: medians of --repeat rounds after warm-up; each round times ours and torch's back to
back (interleaved, so that a busy machine slows both alike), as wall-clock time and as the
process's CPU time (all threads), which is the steadier of the two on a shared machine. Forward + backward is
``mt.cross_entropy(x, t, return_grad=True)`` (Python call to result: the new dlogits array
included) against ``F.cross_entropy(x, t).backward()`` with ``x.grad = None`` first (torch
allocates its gradient too); forward alone is ``return_grad=False`` against torch under
``no_grad``. "native" is the C call alone into a dlogits buffer allocated once (what the
Python layer adds is the allocation of dlogits: ``Array.empty`` zero-fills it).
Bytes per logit, ours: pass 1 reads the logits (the max and the finiteness check in one
read; the softmax sum then runs on the row in cache), the gradient pass reads them again and
writes dlogits: 12 bytes. torch: log_softmax reads x and writes logp, backward reads logp and
writes the gradient: 16 bytes. Target (issue 4): forward + backward on 1024 x 32000 at most
0.5x torch's time.
"""
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, cpu_torch  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402


def interleaved(fns, repeat, warmup=2):
    """{name: (median wall seconds, median process CPU seconds)} of each fn, timed in rounds of
    one call each. CPU time (all threads) is the steadier figure on a shared machine."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {name: ([], []) for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            times[name][0].append(time.perf_counter() - w0)
            times[name][1].append(time.process_time() - c0)
    return {name: (statistics.median(w), statistics.median(c)) for name, (w, c) in times.items()}


def inputs(rows, vocab, backend):
    x = mt.Array((rows, vocab), "float32")
    backend.check(backend.lib.mt_uniform_fill(ffi.cast("float *", x.address), 1, 0, 0, -4.0, 4.0, rows * vocab),
                  "bench")
    t = mt.Array.from_list([(i * 7919 + 13) % vocab for i in range(rows)], "int64")
    return x, t


def bench(rows, vocab, repeat, mode):
    import torch
    backend = load(mode)
    x, t = inputs(rows, vocab, backend)
    d = mt.Array((rows, vocab), "float32")
    loss = ffi.new("float[1]")
    xp, tp, dp = ffi.cast("float *", x.address), ffi.cast("void *", t.address), ffi.cast("float *", d.address)

    def native():
        backend.check(backend.lib.mt_cross_entropy(loss, ffi.NULL, dp, xp, tp, 8, rows, vocab, -100, 2, 0.0, 0),
                      "bench")

    tx = torch.frombuffer(bytearray(x.tobytes()), dtype=torch.float32).reshape(rows, vocab).requires_grad_(True)
    tt = torch.tensor(t.tolist(), dtype=torch.int64)

    def torch_fwd_bwd():
        tx.grad = None
        torch.nn.functional.cross_entropy(tx, tt).backward()

    def torch_fwd():
        with torch.no_grad():
            torch.nn.functional.cross_entropy(tx, tt)

    med = interleaved({"ours": lambda: mt.cross_entropy(x, t, return_grad=True, numeric_mode=mode),
                       "torch": torch_fwd_bwd, "native": native,
                       "ours_fwd": lambda: mt.cross_entropy(x, t, numeric_mode=mode), "torch_fwd": torch_fwd},
                      repeat)
    n = rows * vocab
    out = {"rows": rows, "vocab": vocab, "ours_bytes": 12 * n, "torch_bytes": 16 * n,
           "native_GBps": 12 * n / med["native"][0] / 1e9}
    for k, (wall, cpu) in med.items():
        out[k + "_ms"], out[k + "_cpu_ms"] = wall * 1e3, cpu * 1e3
    for k, ref in (("ours", "torch"), ("native", "torch"), ("ours_fwd", "torch_fwd")):
        out[k + "_ratio"] = med[k][0] / med[ref][0]
        out[k + "_cpu_ratio"] = med[k][1] / med[ref][1]
    return out


def main():
    args = bench_args(__doc__, 15, ("--rows", 1024), ("--vocab", 32000), mode=True)
    torch, _ = cpu_torch(args.mode)
    r = bench(args.rows, args.vocab, args.repeat, args.mode)
    print("cross_entropy %d x %d, forward + backward: ours %.1f ms (native call %.1f ms, %.1f GB/s), "
          "torch %.1f ms: ratio %.2f (native %.2f; target <= 0.5)"
          % (r["rows"], r["vocab"], r["ours_ms"], r["native_ms"], r["native_GBps"], r["torch_ms"],
             r["ours_ratio"], r["native_ratio"]))
    print("  process CPU time: ours %.1f ms, native %.1f ms, torch %.1f ms: ratio %.2f (native %.2f)"
          % (r["ours_cpu_ms"], r["native_cpu_ms"], r["torch_cpu_ms"], r["ours_cpu_ratio"], r["native_cpu_ratio"]))
    print("forward only: ours %.1f ms, torch %.1f ms, ratio %.2f (CPU time %.2f)"
          % (r["ours_fwd_ms"], r["torch_fwd_ms"], r["ours_fwd_ratio"], r["ours_fwd_cpu_ratio"]))
    print("  load average at the end: %.1f (on %d cores)" % (os.getloadavg()[0], os.cpu_count() or 0))
    cpu_record(args, "loss_cpu", {"cross_entropy": r}, torch)


if __name__ == "__main__":
    main()
