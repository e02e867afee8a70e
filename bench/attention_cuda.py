"""Attention on a GPU, side by side with torch in one process (identical numeric mode).

    python bench/attention_cuda.py [--repeat N] [--write]

Causal attention, float32, forward + backward, at (B, H, T, D) = (8, 12, 1024, 64) and
(2, 12, 4096, 64) (issue 14). Every buffer lives on the GPU: the library's own (mt_device_alloc,
bench/loss_cuda.py's DeviceBuffer), filled by its Philox and viewed by torch without a copy. Ours:
mt_attention_forward (with lse) then mt_attention_backward, called through cffi. Torch's: its
efficient-attention backend and its math backend (torch.nn.attention.sdpa_kernel), each
F.scaled_dot_product_attention(...).backward(dout). Medians of --repeat synchronized calls.

Memory: ours is the library's scratch peak (mt_memory_stats: the row deltas, B*H*T floats, and
the call's staging arena), torch's the growth of torch.cuda.max_memory_allocated over one call
beyond its inputs. ``bits_equal_cpu``: our out, lse, dq, dk, dv at the first shape equal the CPU
oracle's bytes. ``torch_efficient_dq_repeats``: whether torch's efficient backend gives the same
dq bits twice in a row.

Also (thirty-second session) the first shape without causality under a float key-padding mask,
(B, 1, 1, T) of 0 and -inf, batch b masking its last b * T / 16 keys (the padded batch of a
variable-length run): every tile then takes the masked path (no tile is plain), against torch's
efficient backend on the same mask (``mask: "key_padding"`` in its record). Its bits are not
compared with the oracle here (the cards and tests/test_attention.py cover masks).

Predicted before the first run (9 SIMT matmul-sized passes of the causal half: forward 2,
backward 7 -- dk/dv recompute s and dp, dq recomputes them again -- 29 G fma at the first
shape, at 40-50% of the H200's 67 TFLOP/s fp32): 2.2-2.8 ms at (8, 12, 1024, 64), 9-11 ms at
(2, 12, 4096, 64). Records go to bench/results/attention_cuda.jsonl.
"""
import hashlib
import math
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import cuda_torch, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402
from loss_cuda import DeviceBuffer, _call  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402

SHAPES = ((8, 12, 1024, 64), (2, 12, 4096, 64))
MASKED_SHAPE = (8, 12, 1024, 64)
MASK_FLOAT = 2   # MT_ATTENTION_MASK_FLOAT


def _attention_calls(lib, bufs, b, h, t, d, causal, scale, mask=None):
    """The forward and backward calls; mask: a (B, 1, 1, T) float DeviceBuffer (key padding) or None."""
    q, k, v, do, out, lse, dq, dk, dv = bufs
    m = (mask.ptr("void *"), MASK_FLOAT, t, 0, 0, 1) if mask is not None else (ffi.NULL, 0, 0, 0, 0, 0)

    def forward():
        return lib.mt_attention_forward(out.ptr(), lse.ptr(), q.ptr(), k.ptr(), v.ptr(), *m,
                                        causal, scale, b, h, h, t, t, d, 0.0, 0, 0, 0)

    def backward():
        return lib.mt_attention_backward(dq.ptr(), dk.ptr(), dv.ptr(), do.ptr(), q.ptr(), k.ptr(), v.ptr(),
                                         out.ptr(), lse.ptr(), *m, causal, scale, b, h, h,
                                         t, t, d, 0.0, 0, 0, 0)
    return forward, backward


def _key_padding(gpu, b, t):
    """(b, 1, 1, t) float32 of 0 and -inf: batch i masks its last i * t // 16 keys."""
    rows = []
    for i in range(b):
        cut = t - i * t // 16
        rows.append(struct.pack("<%df" % t, *([0.0] * cut + [float("-inf")] * (t - cut))))
    buf = DeviceBuffer(gpu, (b, 1, 1, t))
    buf.upload(b"".join(rows))
    return buf


def _digest(buf):
    return hashlib.sha256(buf.download()).hexdigest()


def _cpu_digests(gpu_bufs, b, h, t, d, scale):
    """The CPU oracle's out, lse, dq, dk, dv digests on the very same inputs."""
    try:
        cpu = load("identical", "cpu")
    except mt.BackendError:
        return None
    ins = [ffi.from_buffer("float[]", bytearray(x.download())) for x in gpu_bufs[:4]]
    nq, nl = b * h * t * d, b * h * t
    outs = [ffi.new("float[]", n) for n in (nq, nl, nq, nq, nq)]
    q, k, v, do = ins
    out, lse, dq, dk, dv = outs
    cpu.check(cpu.lib.mt_attention_forward(out, lse, q, k, v, ffi.NULL, 0, 0, 0, 0, 0, 1, scale, b, h, h, t, t, d,
                                           0.0, 0, 0, 0), "mt_attention_forward")
    cpu.check(cpu.lib.mt_attention_backward(dq, dk, dv, do, q, k, v, out, lse, ffi.NULL, 0, 0, 0, 0, 0, 1, scale,
                                            b, h, h, t, t, d, 0.0, 0, 0, 0), "mt_attention_backward")
    return [hashlib.sha256(ffi.buffer(x)).hexdigest() for x in outs]


def bench_attention(torch, gpu, shape, repeat, check_bits, masked=False):
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    b, h, t, d = shape
    scale = float(torch.tensor(1.0 / math.sqrt(d), dtype=torch.float32))
    q, k, v, do = (DeviceBuffer(gpu, shape).fill_uniform(23, s, -1.0, 1.0) for s in range(4))
    out, dq, dk, dv = (DeviceBuffer(gpu, shape) for _ in range(4))
    lse = DeviceBuffer(gpu, (b, h, t))
    bufs = (q, k, v, do, out, lse, dq, dk, dv)
    mask = _key_padding(gpu, b, t) if masked else None
    causal = 0 if masked else 1
    forward, backward = _attention_calls(gpu.lib, bufs, b, h, t, d, causal, scale, mask)

    def ours():
        _call(gpu, forward(), "mt_attention_forward")
        _call(gpu, backward(), "mt_attention_backward")

    stats = ffi.new("int64_t[2]")
    ours()
    torch.cuda.synchronize()
    gpu.check(gpu.lib.mt_memory_stats(stats, 1), "mt_memory_stats")
    ours()
    gpu.check(gpu.lib.mt_memory_stats(stats, 0), "mt_memory_stats")
    ours_extra = int(stats[1])
    t_fwd = timed(lambda: _call(gpu, forward(), "mt_attention_forward"), repeat, sync=torch.cuda.synchronize)
    t_both = timed(ours, repeat, sync=torch.cuda.synchronize)

    qt, kt, vt = (x.torch(torch).requires_grad_(True) for x in (q, k, v))
    dot = do.torch(torch)
    mask_t = mask.torch(torch) if masked else None

    def theirs(backend):
        def run():
            qt.grad = kt.grad = vt.grad = None
            with sdpa_kernel([backend]):
                F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask_t, is_causal=not masked,
                                               scale=scale).backward(dot)
        return run

    figures = {"B": b, "H": h, "T": t, "D": d, "is_causal": not masked, "forward_ms": t_fwd * 1e3,
               "fwd_bwd_ms": t_both * 1e3, "extra_MB": ours_extra / 1e6,
               "delta_MB": 4 * b * h * t / 1e6}
    if masked:
        figures["mask"] = "key_padding"
    for name, backend in (("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)):
        run = theirs(backend)
        try:
            run()
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            run()
            torch.cuda.synchronize()
            extra = torch.cuda.max_memory_allocated() - base
            tt = timed(run, repeat, sync=torch.cuda.synchronize)
        except (RuntimeError, torch.OutOfMemoryError) as e:   # the math backend at long T may not fit
            figures["torch_%s" % name] = "failed: %s" % str(e).splitlines()[0][:120]
            torch.cuda.empty_cache()
            continue
        figures["torch_%s_ms" % name] = tt * 1e3
        figures["torch_%s_extra_MB" % name] = extra / 1e6
        figures["vs_torch_%s" % name] = tt / t_both
        if name == "efficient":
            run()
            g1 = qt.grad.clone()
            run()
            figures["torch_efficient_dq_repeats"] = bool(torch.equal(g1.view(torch.int32), qt.grad.view(torch.int32)))
    if check_bits:
        ours()
        torch.cuda.synchronize()
        want = _cpu_digests(bufs, b, h, t, d, scale)
        got = [_digest(x) for x in (out, lse, dq, dk, dv)]
        figures["bits_equal_cpu"] = "no cpu library" if want is None else want == got
    return figures


def main():
    args = bench_args(__doc__, 20)
    torch = cuda_torch()
    gpu = load("identical", "cuda")
    rows = []
    cases = [(shape, i == 0, False) for i, shape in enumerate(SHAPES)] + [(MASKED_SHAPE, False, True)]
    for shape, check_bits, masked in cases:
        r = bench_attention(torch, gpu, shape, args.repeat, check_bits=check_bits, masked=masked)
        rows.append(r)
        line = ("attention %s B=%d H=%d T=%d D=%d: forward %.3f ms, forward+backward %.3f ms, extra %.1f MB"
                % ("key-padding-masked" if masked else "causal", r["B"], r["H"], r["T"], r["D"], r["forward_ms"],
                   r["fwd_bwd_ms"], r["extra_MB"]))
        for name in ("efficient", "math"):
            if "torch_%s_ms" % name in r:
                line += "; torch %s %.3f ms (%.0f MB) = %.2fx ours" % (name, r["torch_%s_ms" % name],
                                                                       r["torch_%s_extra_MB" % name],
                                                                       r["vs_torch_%s" % name])
            else:
                line += "; torch %s %s" % (name, r.get("torch_%s" % name))
        if "bits_equal_cpu" in r:
            line += "; bits equal the cpu oracle: %s" % r["bits_equal_cpu"]
        if "torch_efficient_dq_repeats" in r:
            line += "; torch efficient dq repeats: %s" % r["torch_efficient_dq_repeats"]
        print(line, flush=True)
    gpu_record(args, "attention_cuda", {"attention": rows}, torch)


if __name__ == "__main__":
    main()
