"""linear on a GPU, side by side with torch in one process (identical numeric mode, device buffers).

    python bench/linear_cuda.py [--repeat N] [--quick] [--write]

Ours: mt_linear_forward / mt_linear_backward of the identical CUDA library through cffi, on
mt_device_alloc buffers (bench/loss_cuda.py's DeviceBuffer); torch: F.linear, and dc @ w,
dc.T @ a, dc.sum(0) for the backward, float32 with TF32 off
(torch.backends.cuda.matmul.allow_tf32 = False: cuBLAS SGEMM, FFMA).
Both sides get the same inputs (drawn by torch, copied into ours with mt_memcpy). Every figure
is the median wall-clock of --repeat synchronized calls after warm-up (ours returns
synchronized; torch is followed by torch.cuda.synchronize()). FLOPs: 2 m n k per product
(forward 1, backward 2 + m n for dbias). Ours includes the finiteness pre-pass (it reads
every input once: pre_pass_MB) and one status read-back per call; the backward with m > 1024
tokens also holds leaves * n * k floats of dweight partials (scratch_MB) and folds them.
Then ours is compared with torch's float32 result (max |diff| / max |ref|, not bits: the
bits are the linear card's and tests/test_linear.py's business). Target (issue): forward
8192^3 at least torch's TFLOP/s, backward 8192x4096x4096 at most torch's time (issue 16). Records before the split into families are in
bench/results/dense_cuda.jsonl; new ones go to linear_cuda.jsonl.

Tilings of the GEMM are compared by bench/gemm_variants.py (the kernel alone, one small
executable per tiling, the bits checked by a hash of C).
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import median_seconds, write_result  # noqa: E402
from loss_cuda import DeviceBuffer  # noqa: E402

from mojo_train import _native  # noqa: E402

ffi = _native.ffi

FORWARD = [(8192, 8192, 8192), (8192, 4096, 4096), (4096, 11008, 4096), (8192, 1024, 4096), (2048, 2048, 2048)]
BACKWARD = [(8192, 8192, 8192), (8192, 4096, 4096), (16384, 1024, 1024), (2048, 2048, 2048)]
QUICK_FORWARD = [(8192, 8192, 8192), (2048, 2048, 2048)]
QUICK_BACKWARD = [(8192, 4096, 4096)]


def linear_forward(lib, p, m, n, k):
    """Call mt_linear_forward with the pointers p['out'], p['a'], p['weight'], p['bias']."""
    return lib.mt_linear_forward(p["out"], p["a"], p["weight"], p["bias"], m, n, k)


def linear_backward(lib, p, m, n, k):
    return lib.mt_linear_backward(p["da"], p["dweight"], p["dbias"], p["dc"], p["a"], p["weight"], m, n, k)


class Operands:
    """Device inputs and outputs of one shape for both sides: torch tensors (when torch is
    there) and our DeviceBuffers holding the same bytes."""

    def __init__(self, gpu, torch, shapes, seed):
        self.gpu, self.torch, self.t, self.ours = gpu, torch, {}, {}
        for i, (name, shape, is_input) in enumerate(shapes):
            buf = DeviceBuffer(gpu, shape)
            if is_input and torch is not None:
                g = torch.Generator(device="cuda").manual_seed(seed * 100 + i)
                t = torch.rand(shape, device="cuda", generator=g) * 2 - 1
                self.t[name] = t
                gpu.check(gpu.lib.mt_memcpy(buf.ptr("void *"), ffi.cast("void *", t.data_ptr()), buf.nbytes),
                          "mt_memcpy")
            elif is_input:
                buf.fill_uniform(seed, i, -1.0, 1.0)
            self.ours[name] = buf
        if torch is not None:
            torch.cuda.synchronize()

    def ptrs(self, names):
        return {k: (self.ours[k].ptr() if k in names else ffi.NULL) for k in self.ours}

    def as_torch(self, name, shape):
        out = self.torch.empty(shape, device="cuda")
        buf = self.ours[name]
        self.gpu.check(self.gpu.lib.mt_memcpy(ffi.cast("void *", out.data_ptr()), buf.ptr("void *"), buf.nbytes),
                       "mt_memcpy")
        return out


def rel_err(torch, ours, ref):
    return float((ours.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-30))


def bench_forward(gpu, torch, m, n, k, repeat):
    ops = Operands(gpu, torch, [("a", (m, k), True), ("weight", (n, k), True), ("bias", (n,), True),
                                ("out", (m, n), False)], seed=m + n + k)
    p = ops.ptrs(("a", "weight", "bias", "out"))
    call = lambda: gpu.check(linear_forward(gpu.lib, p, m, n, k), "mt_linear_forward")  # noqa: E731
    flops = 2.0 * m * n * k
    row = {"op": "forward", "m": m, "n": n, "k": k, "flops": flops,
           "pre_pass_MB": 4 * (m * k + n * k + n) / 1e6}
    row["ours_ms"] = median_seconds(call, repeat) * 1e3
    row["ours_TFLOPs"] = flops / row["ours_ms"] / 1e9
    if torch is not None:
        F = torch.nn.functional
        a, w, b = ops.t["a"], ops.t["weight"], ops.t["bias"]
        row["torch_ms"] = median_seconds(lambda: F.linear(a, w, b), repeat, sync=torch.cuda.synchronize) * 1e3
        row["torch_TFLOPs"] = flops / row["torch_ms"] / 1e9
        row["ratio"] = row["ours_TFLOPs"] / row["torch_TFLOPs"]
        row["rel_err_vs_torch"] = rel_err(torch, ops.as_torch("out", (m, n)), F.linear(a, w, b))
    return row


def bench_backward(gpu, torch, m, n, k, repeat):
    ops = Operands(gpu, torch, [("dc", (m, n), True), ("a", (m, k), True), ("weight", (n, k), True),
                                ("da", (m, k), False), ("dweight", (n, k), False), ("dbias", (n,), False)],
                   seed=m + 2 * n + 3 * k)
    leaves = (m + 1023) // 1024
    flops = 4.0 * m * n * k + m * n
    row = {"op": "backward", "m": m, "n": n, "k": k, "flops": flops, "leaves": leaves,
           "pre_pass_MB": 4 * (m * n + m * k + n * k) / 1e6,
           "scratch_MB": 4 * leaves * n * k / 1e6 if leaves > 1 else 0.0}
    for label, outs in (("", ("da", "dweight", "dbias")), ("_da", ("da",)), ("_dweight", ("dweight",))):
        p = ops.ptrs(("dc", "a", "weight") + outs)
        call = lambda: gpu.check(linear_backward(gpu.lib, p, m, n, k), "mt_linear_backward")  # noqa: E731
        row["ours%s_ms" % label] = median_seconds(call, repeat) * 1e3
    row["ours_TFLOPs"] = flops / row["ours_ms"] / 1e9
    row["ours_da_TFLOPs"] = 2.0 * m * n * k / row["ours_da_ms"] / 1e9
    row["ours_dweight_TFLOPs"] = 2.0 * m * n * k / row["ours_dweight_ms"] / 1e9
    if torch is not None:
        dc, a, w = ops.t["dc"], ops.t["a"], ops.t["weight"]

        def theirs():
            return dc @ w, dc.t() @ a, dc.sum(0)
        row["torch_ms"] = median_seconds(theirs, repeat, sync=torch.cuda.synchronize) * 1e3
        row["torch_da_ms"] = median_seconds(lambda: dc @ w, repeat, sync=torch.cuda.synchronize) * 1e3
        row["torch_dweight_ms"] = median_seconds(lambda: dc.t() @ a, repeat, sync=torch.cuda.synchronize) * 1e3
        row["torch_TFLOPs"] = flops / row["torch_ms"] / 1e9
        row["ratio"] = row["ours_TFLOPs"] / row["torch_TFLOPs"]
        p = ops.ptrs(("dc", "a", "weight", "da", "dweight", "dbias"))
        gpu.check(linear_backward(gpu.lib, p, m, n, k), "mt_linear_backward")
        ref = theirs()
        row["rel_err_vs_torch"] = max(rel_err(torch, ops.as_torch(name, shape), r) for name, shape, r in
                                      (("da", (m, k), ref[0]), ("dweight", (n, k), ref[1]), ("dbias", (n,), ref[2])))
    return row


def report(rows):
    print("%-9s %6s %6s %6s | %9s %7s | %9s %7s | %5s | %s" % (
        "op", "m", "n", "k", "ours ms", "TFLOP/s", "torch ms", "TFLOP/s", "ratio", "notes"))
    for r in rows:
        notes = []
        if r["op"] == "backward":
            notes.append("da %.2f ms (%.1f TF/s), dweight %.2f ms (%.1f TF/s)" % (
                r["ours_da_ms"], r["ours_da_TFLOPs"], r["ours_dweight_ms"], r["ours_dweight_TFLOPs"]))
            if "torch_da_ms" in r:
                notes.append("torch da %.2f, dweight %.2f ms" % (r["torch_da_ms"], r["torch_dweight_ms"]))
            if r["scratch_MB"]:
                notes.append("%d leaves, %.0f MB partials" % (r["leaves"], r["scratch_MB"]))
        if "rel_err_vs_torch" in r:
            notes.append("rel err %.1e" % r["rel_err_vs_torch"])
        print("%-9s %6d %6d %6d | %9.3f %7.2f | %9s %7s | %5s | %s" % (
            r["op"], r["m"], r["n"], r["k"], r["ours_ms"], r["ours_TFLOPs"],
            "%.3f" % r["torch_ms"] if "torch_ms" in r else "-",
            "%.2f" % r["torch_TFLOPs"] if "torch_TFLOPs" in r else "-",
            "%.2f" % r["ratio"] if "ratio" in r else "-", "; ".join(notes)))


def run_benchmarks(repeat=12, quick=False, write=False):
    gpu = _native.load("identical", "cuda")
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
    except ImportError:
        torch = None
        print("(torch is not importable: ours only)")
    rows = []
    for (m, n, k) in (QUICK_FORWARD if quick else FORWARD):
        rows.append(bench_forward(gpu, torch, m, n, k, repeat))
    for (m, n, k) in (QUICK_BACKWARD if quick else BACKWARD):
        rows.append(bench_backward(gpu, torch, m, n, k, repeat))
    print("linear, identical numeric mode, device buffers, median of %d (%s)" % (
        repeat, torch.cuda.get_device_name() if torch is not None else "no torch"))
    report(rows)
    if write:
        write_result("linear_cuda", {"rows": rows, "repeat": repeat,
                                     "gpu": torch.cuda.get_device_name() if torch is not None else None,
                                     "torch": torch.__version__ if torch is not None else None},
                     " ".join(["python"] + sys.argv))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="8192^3 and 2048^3 forward, one backward")
    ap.add_argument("--write", action="store_true", help="append a record to bench/results/linear_cuda.jsonl")
    args = ap.parse_args()
    run_benchmarks(args.repeat, args.quick, args.write)


if __name__ == "__main__":
    main()
