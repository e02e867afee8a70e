"""CUDA cross_entropy, RMSNorm and ReLU against the CPU oracle, byte for byte; then the benchmark.

    python bench/dev_check_loss_norm.py [--only ce|rms|relu] [--match TEXT] [--big] [--seed S] [--no-bench]
                                        [--repeat N]

Every case runs three times through the C ABI (cffi, identical tier): on the CPU oracle with
host buffers, on CUDA with host buffers, and on CUDA with device buffers (mt_device_alloc,
inputs copied up with mt_memcpy, outputs copied back). Inputs come from the library's own
Philox (mt_uniform_fill on the CPU), with special values planted where a case says so;
every output starts poisoned (all bytes 0xff), so an element nobody wrote shows. A case
passes when the return codes agree and every output's bytes agree; on a refusal, loss_out
(and, for a refused target, row_loss and dlogits; for RMSNorm, dweight) must still hold the
poison on both sides. Until the CPU oracle implements an op (MT_EUNSUPPORTED) its cases
print NO-ORACLE, and CUDA's host and device runs are still compared with each other.

Prints PASS / FAIL / NO-ORACLE per case and a summary; exits 1 on any FAIL. Then, unless
--no-bench (or torch is missing), the side-by-side benchmark of bench/loss_cuda.py.
"""
import argparse
import os
import random
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loss_cuda import DeviceBuffer, MEAN, NONE, SUM, report, run_benchmarks  # noqa: E402

from mojo_train import _native  # noqa: E402

ffi = _native.ffi
EINVAL, ENONFINITE, EUNSUPPORTED = 1, 2, 5
NAN, INF = float("nan"), float("inf")


# ---- case description ------------------------------------------------------------------------
class Buf:
    """One pointer argument: an input (data bytes) or an output (nbytes, poisoned); absent -> NULL.
    `offset` shifts the pointer by that many bytes (misaligned rows); `keep` names outputs that
    must still hold the poison after a refusal with one of the codes in it."""

    def __init__(self, name, data=None, nbytes=None, ctype="float *", offset=0, keep=()):
        self.name, self.data, self.ctype, self.offset, self.keep = name, data, ctype, offset, tuple(keep)
        self.nbytes = len(data) if data is not None else nbytes
        self.output = data is None


class Case:
    def __init__(self, name, bufs, call):
        self.name, self.bufs, self.call = name, [b for b in bufs if b is not None], call


def uniform(cpu, n, seed, stream, low, high):
    """n float32 U[low, high) from (seed, stream): a bytearray."""
    buf = ffi.new("float[]", max(n, 1))
    cpu.check(cpu.lib.mt_uniform_fill(buf, seed, stream, 0, low, high, n), "mt_uniform_fill")
    return bytearray(ffi.buffer(buf, 4 * n))


def plant(data, specials):
    for index, value in specials:
        struct.pack_into("<f", data, 4 * index, value)
    return data


# ---- running one case on one side --------------------------------------------------------------
def run(backend, case, on_device):
    """(rc, message, {output name: bytes}) of case on backend, host or device buffers."""
    ptrs, keep = {}, []
    for b in case.bufs:
        if b.nbytes is None:
            ptrs[b.name] = ffi.NULL
            continue
        data = b.data if not b.output else b"\xff" * b.nbytes
        if on_device:
            d = DeviceBuffer(backend, (b.nbytes + b.offset,), "uint8")
            if b.nbytes:
                d.upload(data, b.offset)
            keep.append(d)
            ptrs[b.name] = d.ptr(b.ctype, b.offset)
        else:
            h = ffi.new("char[]", b.nbytes + b.offset + 1)
            ffi.memmove(h + b.offset, data, b.nbytes)
            keep.append(h)
            ptrs[b.name] = ffi.cast(b.ctype, h + b.offset)
    rc = case.call(backend.lib, ptrs)
    msg = ffi.string(backend.lib.mt_last_error()).decode("utf-8", "replace") if rc else ""
    outs = {}
    for b, k in zip([b for b in case.bufs if b.nbytes is not None], keep):
        if not b.output:
            continue
        if on_device:
            outs[b.name] = k.download(b.nbytes, b.offset) if b.nbytes else b""
        else:
            outs[b.name] = ffi.buffer(k + b.offset, b.nbytes)[:]
    return rc, msg, outs


def first_diff(a, b):
    """Index of the first differing float32 of two equal-length byte strings."""
    lo, hi = 0, len(a)
    step = 1 << 20
    while hi - lo > step:                      # narrow down by slices (fast memcmp)
        mid = lo + step
        if a[lo:mid] != b[lo:mid]:
            hi = mid
            break
        lo = mid
    for i in range(lo - lo % 4, hi, 4):
        if a[i:i + 4] != b[i:i + 4]:
            return i // 4
    return -1


def describe(name, a, b):
    i = first_diff(a, b)
    n = sum(1 for j in range(0, len(a), 4) if a[j:j + 4] != b[j:j + 4]) if len(a) <= 1 << 22 else None
    va, vb = struct.unpack_from("<f", a, 4 * i)[0], struct.unpack_from("<f", b, 4 * i)[0]
    return "%s[%d]: cpu %r (0x%08x) vs cuda %r (0x%08x)%s" % (
        name, i, va, struct.unpack_from("<I", a, 4 * i)[0], vb, struct.unpack_from("<I", b, 4 * i)[0],
        "; %d of %d differ" % (n, len(a) // 4) if n is not None else "")


def compare(case, want, got, label):
    """Problems of `got` (rc, msg, outs) against `want`, as strings."""
    problems = []
    if got[0] != want[0]:
        problems.append("%s: rc %d (%s) but expected %d (%s)" % (label, got[0], got[1], want[0], want[1]))
        return problems
    for b in case.bufs:
        if not b.output or b.nbytes is None:
            continue
        w, g = want[2][b.name], got[2][b.name]
        if want[0] == 0 and w != g:
            problems.append("%s: %s" % (label, describe(b.name, w, g)))
        if want[0] != 0 and want[0] in b.keep:
            for side, data in (("cpu", w), (label, g)):
                if data != b"\xff" * b.nbytes:
                    problems.append("%s wrote %s on refusal %d" % (side, b.name, want[0]))
    return problems


def check(cpu, gpu, case):
    """('PASS'|'FAIL'|'NO-ORACLE', problems, seconds)."""
    t0 = time.time()
    want = run(cpu, case, False)
    host, dev = run(gpu, case, False), run(gpu, case, True)
    if want[0] == EUNSUPPORTED:
        problems = compare(case, host, dev, "cuda device vs cuda host")
        return ("NO-ORACLE" if not problems else "FAIL"), problems, time.time() - t0
    problems = compare(case, want, host, "cuda host") + compare(case, want, dev, "cuda device")
    return ("PASS" if not problems else "FAIL"), problems, time.time() - t0


# ---- cross-entropy cases -------------------------------------------------------------------------
def ce_case(cpu, name, rows, vocab, seed, reduction=MEAN, eps=0.0, num_items=0, grad=True, tbytes=8,
            ignore_index=-100, ignore_frac=0.1, low=-8.0, high=8.0, specials=(), targets=None, offset=0,
            row_loss=None, loss_out=True):
    rnd = random.Random(seed)
    logits = plant(uniform(cpu, rows * vocab, seed, 0, low, high), specials)
    if targets is None:
        targets = [ignore_index if rows > 1 and rnd.random() < ignore_frac else rnd.randrange(vocab)
                   for _ in range(rows)]
    tdata = struct.pack("<%d%s" % (rows, "q" if tbytes == 8 else "i"), *targets)
    with_rows = reduction == NONE if row_loss is None else row_loss
    bufs = [Buf("loss_out", nbytes=4 if loss_out else None, keep=(EINVAL, ENONFINITE)),
            Buf("row_loss", nbytes=4 * rows if with_rows else None, keep=(EINVAL,)),
            Buf("dlogits", nbytes=4 * rows * vocab if grad else None, offset=offset, keep=(EINVAL,)),
            Buf("logits", data=bytes(logits), offset=offset), Buf("targets", data=tdata, ctype="void *")]

    def call(lib, p):
        return lib.mt_cross_entropy(p["loss_out"], p["row_loss"], p["dlogits"], p["logits"], p["targets"], tbytes,
                                    rows, vocab, ignore_index, reduction, eps, num_items)
    label = "ce %s %dx%d red=%s eps=%g%s%s t%d" % (name, rows, vocab, {0: "none", 1: "sum", 2: "mean"}[reduction], eps,
                                                   " num_items=%d" % num_items if num_items else "",
                                                   " grad" if grad else "", tbytes * 8)
    return Case(label, bufs, call)


VOCABS = (1, 2, 3, 127, 128, 129, 4095, 4096, 4097, 8193, 50304)
ROWS = (1, 3, 1023, 2049)


def ce_cases(cpu, seed, big):
    k = 0
    for vocab in VOCABS:
        for rows in ROWS:
            if rows * vocab > 1023 * 50304:
                continue
            red = (MEAN, SUM, NONE)[k % 3]
            yield ce_case(cpu, "grid", rows, vocab, seed + k, reduction=red, eps=(0.0, 0.1, 0.0, 0.25)[k % 4],
                          num_items=7 if red == MEAN and k % 5 == 2 else 0, grad=red != NONE and k % 4 != 3,
                          tbytes=(8, 4)[k % 2], row_loss=red == NONE or k % 3 == 1)
            k += 1
    s = seed + 1000
    yield ce_case(cpu, "token-tree", 2049, 50304, s + 1)
    yield ce_case(cpu, "token-tree", 3073, 4097, s + 2, reduction=SUM, eps=0.1)
    yield ce_case(cpu, "ignore-valid-class", 1023, 129, s + 3, ignore_index=5, ignore_frac=0.3)
    yield ce_case(cpu, "all-ignored", 5, 4097, s + 4, targets=[-100] * 5)                        # mean = 0/0
    yield ce_case(cpu, "all-ignored", 5, 4097, s + 5, targets=[-100] * 5, num_items=3)
    yield ce_case(cpu, "all-ignored", 5, 4097, s + 6, targets=[-100] * 5, reduction=SUM)
    yield ce_case(cpu, "smoothing", 1023, 50304, s + 7, eps=0.9, num_items=100000)
    yield ce_case(cpu, "subnormal", 3, 4097, s + 8, low=-2.0 ** -140, high=2.0 ** -140, eps=0.1)
    yield ce_case(cpu, "subnormal", 1023, 128, s + 9, low=-2.0 ** -140, high=2.0 ** -140)
    yield ce_case(cpu, "large 1e4", 3, 50304, s + 10, low=-1e4, high=1e4, eps=0.1)
    yield ce_case(cpu, "large 1e30", 3, 50304, s + 11, low=-1e30, high=1e30, eps=0.1)
    yield ce_case(cpu, "large 1e30", 1023, 4097, s + 12, low=-1e30, high=1e30, reduction=SUM)
    yield ce_case(cpu, "sum overflows", 3, 129, s + 13, low=1e38, high=1.7e38, eps=0.5)
    yield ce_case(cpu, "tiny probabilities", 64, 4099, s + 14, low=-120.0, high=0.0)       # subnormal e_j
    yield ce_case(cpu, "misaligned rows", 33, 4096, s + 15, offset=4)
    yield ce_case(cpu, "misaligned rows", 33, 50304, s + 16, offset=4, eps=0.1)
    yield ce_case(cpu, "no rows", 0, 129, s + 17)
    yield ce_case(cpu, "no rows", 0, 129, s + 18, reduction=SUM)
    yield ce_case(cpu, "no rows", 0, 129, s + 19, reduction=NONE, grad=False)
    yield ce_case(cpu, "none+loss_out", 7, 129, s + 20, reduction=NONE, grad=False)
    # refusals: the codes and what stays untouched
    v = 4097
    yield ce_case(cpu, "refuse NaN", 5, v, s + 21, specials=[(2 * v + 7, NAN)])
    yield ce_case(cpu, "refuse +inf", 5, v, s + 22, specials=[(3 * v, INF)], reduction=SUM)
    yield ce_case(cpu, "refuse -inf", 5, v, s + 23, specials=[(4 * v + v - 1, -INF)], reduction=NONE, grad=False)
    yield ce_case(cpu, "refuse NaN in ignored row", 5, v, s + 24, specials=[(v + 1, NAN)],
                  targets=[1, -100, 2, 3, 4])
    yield ce_case(cpu, "refuse two NaN rows", 5, 50304, s + 25, specials=[(4 * 50304, NAN), (1 * 50304 + 9, NAN)])
    yield ce_case(cpu, "refuse target = V", 5, v, s + 26, targets=[0, 1, 2, v, 4])
    yield ce_case(cpu, "refuse target < 0", 5, v, s + 27, targets=[0, -5, 2, 3, 4], tbytes=4)
    yield ce_case(cpu, "refuse target and NaN", 5, v, s + 28, targets=[0, 1, 2, 3, v + 9],
                  specials=[(7, NAN)])
    yield ce_case(cpu, "refuse none with dlogits", 3, 129, s + 29, reduction=NONE, grad=True)
    yield ce_case(cpu, "refuse smoothing 1", 3, 129, s + 30, eps=1.0)
    if big:
        yield ce_case(cpu, "benchmark shape", 8192, 50304, s + 31)
        yield ce_case(cpu, "benchmark shape", 8192, 50304, s + 32, eps=0.1, tbytes=4)


# ---- RMSNorm and ReLU cases ----------------------------------------------------------------------
def rms_case(cpu, name, rows, dim, seed, backward, weight=True, dx=True, dweight=True, eps=1e-5, low=-2.0,
             high=2.0, specials_x=(), specials_dy=(), specials_w=(), offset=0):
    x = bytes(plant(uniform(cpu, rows * dim, seed, 0, low, high), specials_x))
    w = bytes(plant(uniform(cpu, dim, seed, 2, 0.5, 1.5), specials_w)) if weight else None
    wbuf = Buf("weight", data=w) if weight else Buf("weight")
    if not backward:
        bufs = [Buf("y", nbytes=4 * rows * dim, offset=offset), Buf("x", data=x, offset=offset), wbuf]

        def call(lib, p):
            return lib.mt_rms_norm_forward(p["y"], p["x"], p["weight"], eps, rows, dim)
    else:
        dy = bytes(plant(uniform(cpu, rows * dim, seed, 1, -1.0, 1.0), specials_dy))
        bufs = [Buf("dx", nbytes=4 * rows * dim if dx else None, offset=offset),
                Buf("dweight", nbytes=4 * dim if dweight else None, keep=(EINVAL, ENONFINITE)),
                Buf("dy", data=dy, offset=offset), Buf("x", data=x, offset=offset), wbuf]

        def call(lib, p):
            return lib.mt_rms_norm_backward(p["dx"], p["dweight"], p["dy"], p["x"], p["weight"], eps, rows, dim)
    label = "rms %s %s %dx%d%s eps=%g%s%s" % ("bwd" if backward else "fwd", name, rows, dim, " w" if weight else "",
                                             eps, " dx" if backward and dx else "",
                                             " dweight" if backward and dweight else "")
    return Case(label, bufs, call)


DIMS = (1, 3, 127, 128, 4095, 4096, 4097, 8192)
RMS_ROWS = (1, 3, 1025, 2049)


def rms_cases(cpu, seed, big):
    k = 0
    for dim in DIMS:
        for rows in RMS_ROWS + ((3073,) if dim <= 128 else ()):
            w = k % 3 != 2
            yield rms_case(cpu, "grid", rows, dim, seed + k, False, weight=w, eps=(1e-5, 1e-6, 0.1)[k % 3])
            yield rms_case(cpu, "grid", rows, dim, seed + k, True, weight=w, dweight=w, dx=k % 4 != 3,
                           eps=(1e-5, 1e-6, 0.1)[k % 3])
            k += 1
    s = seed + 2000
    yield rms_case(cpu, "eps 0", 3, 4096, s + 1, False, eps=0.0)
    yield rms_case(cpu, "eps 0", 3, 4096, s + 1, True, eps=0.0)
    yield rms_case(cpu, "subnormal", 5, 4097, s + 2, False, low=-2.0 ** -140, high=2.0 ** -140)
    yield rms_case(cpu, "subnormal", 5, 4097, s + 2, True, low=-2.0 ** -140, high=2.0 ** -140)
    yield rms_case(cpu, "squares subnormal", 1025, 128, s + 3, True, low=-2.0 ** -64, high=2.0 ** -64, eps=1e-30)
    yield rms_case(cpu, "large", 3, 4096, s + 4, True, low=-1e18, high=1e18)
    yield rms_case(cpu, "dweight only", 2049, 4096, s + 5, True, dx=False)
    yield rms_case(cpu, "misaligned", 7, 4096, s + 6, False, offset=4)
    yield rms_case(cpu, "misaligned", 7, 4096, s + 6, True, offset=4)
    yield rms_case(cpu, "wide (backward unstaged)", 3, 40000, s + 7, True)
    yield rms_case(cpu, "wide (backward unstaged)", 1025, 40000, s + 8, True, weight=False, dweight=False)
    yield rms_case(cpu, "wide (unstaged)", 3, 65539, s + 9, False)
    yield rms_case(cpu, "wide (unstaged)", 3, 65539, s + 9, True)
    yield rms_case(cpu, "no rows", 0, 4096, s + 10, False)
    yield rms_case(cpu, "no rows", 0, 4096, s + 10, True)
    yield rms_case(cpu, "no outputs", 3, 4096, s + 11, True, dx=False, dweight=False)
    yield rms_case(cpu, "refuse NaN x", 3, 4096, s + 12, False, specials_x=[(5000, NAN)])
    yield rms_case(cpu, "refuse inf weight", 3, 4096, s + 13, False, specials_w=[(7, INF)])
    yield rms_case(cpu, "refuse NaN x", 1025, 4096, s + 14, True, specials_x=[(4096 * 1024, NAN)])
    yield rms_case(cpu, "refuse inf dy", 3, 4097, s + 15, True, specials_dy=[(4097, -INF)])
    yield rms_case(cpu, "refuse NaN weight", 3, 4097, s + 16, True, specials_w=[(4096, NAN)])
    yield rms_case(cpu, "refuse NaN weight no rows", 0, 128, s + 17, True, specials_w=[(0, NAN)])
    yield rms_case(cpu, "refuse NaN dy without outputs", 3, 128, s + 18, True, dx=False, dweight=False,
                   specials_dy=[(1, NAN)])
    yield rms_case(cpu, "refuse dweight without weight", 3, 128, s + 19, True, weight=False, dweight=True)
    yield rms_case(cpu, "refuse eps < 0", 3, 128, s + 20, False, eps=-1.0)
    if big:
        yield rms_case(cpu, "benchmark shape", 16384, 4096, s + 21, False)
        yield rms_case(cpu, "benchmark shape", 16384, 4096, s + 21, True)


def relu_case(cpu, name, n, seed, backward, specials_x=(), specials_dy=(), offset=0):
    x = bytes(plant(uniform(cpu, n, seed, 0, -1.0, 1.0), specials_x))
    if not backward:
        bufs = [Buf("y", nbytes=4 * n, offset=offset), Buf("x", data=x, offset=offset)]

        def call(lib, p):
            return lib.mt_relu_forward(p["y"], p["x"], n)
    else:
        dy = bytes(plant(uniform(cpu, n, seed, 1, -1.0, 1.0), specials_dy))
        bufs = [Buf("dx", nbytes=4 * n, offset=offset), Buf("dy", data=dy, offset=offset),
                Buf("x", data=x, offset=offset)]

        def call(lib, p):
            return lib.mt_relu_backward(p["dx"], p["dy"], p["x"], n)
    return Case("relu %s %s n=%d%s" % ("bwd" if backward else "fwd", name, n, " +%d" % offset if offset else ""),
                bufs, call)


def relu_cases(cpu, seed, big):
    zeros = [(0, -0.0), (1, 0.0), (2, 2.0 ** -149), (3, -2.0 ** -149)]
    for i, n in enumerate((1, 3, 4, 5, 1023, 4099, (1 << 20) + 3)):
        for backward in (False, True):
            sx = [z for z in zeros if z[0] < n]
            yield relu_case(cpu, "values", n, seed + i, backward, specials_x=sx, specials_dy=[(0, -0.0)])
            yield relu_case(cpu, "values", n, seed + i, backward, specials_x=sx, offset=4)
    yield relu_case(cpu, "refuse NaN x", 4099, seed + 50, False, specials_x=[(4098, NAN)])
    yield relu_case(cpu, "refuse inf x", 4099, seed + 51, True, specials_x=[(17, INF)])
    yield relu_case(cpu, "refuse NaN dy", 4099, seed + 52, True, specials_dy=[(0, NAN)])
    yield relu_case(cpu, "empty", 0, seed + 53, False)


# ---- main --------------------------------------------------------------------------------------
def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=("ce", "rms", "relu"))
    ap.add_argument("--match", help="run only the cases whose name contains this")
    ap.add_argument("--big", action="store_true", help="also the benchmark shapes (slow on the CPU oracle)")
    ap.add_argument("--seed", type=int, default=0, help="base seed of every case's inputs")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--repeat", type=int, default=20)
    args = ap.parse_args()
    cpu, gpu = _native.load("identical", "cpu"), _native.load("identical", "cuda")
    families = {"ce": ce_cases, "rms": rms_cases, "relu": relu_cases}
    salt = {"ce": 0, "rms": 300, "relu": 600}
    counts = {"PASS": 0, "FAIL": 0, "NO-ORACLE": 0}
    failed = []
    for fam, gen in families.items():
        if args.only and fam != args.only:
            continue
        for case in gen(cpu, args.seed * 100000 + salt[fam], args.big):
            if args.match and args.match not in case.name:
                continue
            status, problems, secs = check(cpu, gpu, case)
            counts[status] += 1
            print("%-9s %s (%.1f s)" % (status, case.name, secs), flush=True)
            for p in problems[:4]:
                print("          " + p)
            if status == "FAIL":
                failed.append(case.name)
    print("\n%d passed, %d failed, %d without oracle" % (counts["PASS"], counts["FAIL"], counts["NO-ORACLE"]))
    for name in failed:
        print("FAILED: " + name)
    if not args.no_bench:
        try:
            import torch
        except ImportError:
            print("torch is not importable: no benchmark")
        else:
            report(run_benchmarks(torch, gpu, max(args.repeat, 10)))
    sys.exit(1 if counts["FAIL"] else 0)


if __name__ == "__main__":
    main()
