"""CUDA linear (forward, backward) against the CPU oracle, byte for byte; then the benchmark.

    python bench/dev_check_linear.py [--full] [--quick] [--seed S] [--no-bench] [--repeat N]

Every case runs through the C ABI (cffi, identical tier) on the CPU oracle with host buffers
and on CUDA with device buffers (mt_device_alloc; inputs copied up with mt_memcpy, outputs
copied back) and, for the cases marked so, CUDA with host buffers too. Inputs are drawn by
the library's own Philox (mt_uniform_fill on the CPU) in [-1, 1); every output starts
poisoned (all bytes 0xff, a NaN), so an element nobody wrote shows. A case passes when the
return codes agree and every output's bytes agree (forward: out; backward: da, dweight,
dbias -- some cases pass NULL for some of them); on a refusal (a NaN or inf planted in an
input) the message must name the input and CUDA's outputs must still hold the poison.

Shapes: every (m, n, k) of {1, 2, 3, 7, 31, 64, 65, 127, 128, 129}; then chosen ones with
255, 1000, 1023, 1024, 2049 (--full: every triple of the whole set); token-tree cases with
m > 2048 (3 leaves, odd one rising; 8 leaves; 34 leaves = two tree passes); misaligned
device pointers (scalar and 4-byte loader paths); bias on and off; inputs scaled to 1e-20,
1e-22, 1e-23 (subnormal products and results; chains that underflow to -0.0, which a
zero-padded step would turn into +0.0).

Prints PASS / FAIL per case (PASS lines only with -v) and a summary; exits 1 on any FAIL.
Then, unless --no-bench, bench/dense_cuda.py's benchmark (torch side by side if importable).
"""
import argparse
import itertools
import os
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from mojo_train import _native  # noqa: E402

ffi = _native.ffi
ENONFINITE, EUNSUPPORTED = 2, 5
POISON = b"\xff"


# ---- buffers (shared with bench/dense_cuda.py) ----------------------------------------------
class DeviceBuffer:
    """nbytes of device memory from `backend` (mt_device_alloc), freed with the object."""

    def __init__(self, backend, nbytes):
        self.backend, self.nbytes = backend, max(int(nbytes), 1)
        out = ffi.new("void **")
        backend.check(backend.lib.mt_device_alloc(out, self.nbytes), "mt_device_alloc")
        self.addr = int(ffi.cast("uintptr_t", out[0]))

    def fptr(self, offset=0):
        return ffi.cast("float *", self.addr + offset)

    def upload(self, data, offset=0):
        if len(data):
            src = ffi.from_buffer(data)
            self.backend.check(self.backend.lib.mt_memcpy(ffi.cast("void *", self.addr + offset), src, len(data)),
                               "mt_memcpy")

    def download(self, nbytes, offset=0):
        host = ffi.new("char[]", max(nbytes, 1))
        if nbytes:
            self.backend.check(self.backend.lib.mt_memcpy(host, ffi.cast("void *", self.addr + offset), nbytes),
                               "mt_memcpy")
        return ffi.buffer(host, nbytes)[:]

    def fill_uniform(self, n, seed, stream, low=-1.0, high=1.0):
        """n floats from the library's Philox, drawn on the device."""
        b = self.backend
        b.check(b.lib.mt_uniform_fill(self.fptr(), seed, stream, 0, low, high, n), "mt_uniform_fill")

    def __del__(self):
        try:
            self.backend.lib.mt_device_free(ffi.cast("void *", self.addr))
        except Exception:   # interpreter shutdown
            pass


def uniform(cpu, n, seed, stream, low=-1.0, high=1.0):
    """n float32 U[low, high) from (seed, stream), drawn by the CPU library: a bytearray."""
    buf = ffi.new("float[]", max(n, 1))
    cpu.check(cpu.lib.mt_uniform_fill(buf, seed, stream, 0, low, high, n), "mt_uniform_fill")
    return bytearray(ffi.buffer(buf, 4 * n))


def linear_forward(lib, p, m, n, k):
    """Call mt_linear_forward with the pointers p['out'], p['a'], p['weight'], p['bias']."""
    return lib.mt_linear_forward(p["out"], p["a"], p["weight"], p["bias"], m, n, k)


def linear_backward(lib, p, m, n, k):
    return lib.mt_linear_backward(p["da"], p["dweight"], p["dbias"], p["dc"], p["a"], p["weight"], m, n, k)


# ---- one case -------------------------------------------------------------------------------
class Case:
    """op 'forward' or 'backward'; inputs {name: bytes}; outputs {name: nbytes or None (NULL)}."""

    def __init__(self, name, op, m, n, k, inputs, outputs, host=False, offset=0, refuse=None):
        self.name, self.op, self.m, self.n, self.k = name, op, m, n, k
        self.inputs, self.outputs, self.host, self.offset, self.refuse = inputs, outputs, host, offset, refuse


def run(backend, case, on_device):
    """(rc, message, {output: bytes}) of the case on `backend`, host or device buffers. On the
    device, `offset` bytes shift every pointer (misaligned when not a multiple of 16)."""
    ptrs, keep = {}, []
    off = case.offset if on_device else 0
    for name, data in list(case.inputs.items()) + [(o, None) for o in case.outputs]:
        nbytes = case.outputs[name] if data is None else None if data is False else len(data)
        if nbytes is None:                      # an absent bias, an output not asked for: NULL
            ptrs[name] = ffi.NULL
            continue
        payload = data if data is not None else POISON * nbytes
        if on_device:
            d = DeviceBuffer(backend, nbytes + off)
            d.upload(payload, off)
            keep.append((name, d))
            ptrs[name] = d.fptr(off)
        else:
            h = ffi.new("char[]", max(nbytes, 1))
            ffi.memmove(h, payload, nbytes)
            keep.append((name, h))
            ptrs[name] = ffi.cast("float *", h)
    call = linear_forward if case.op == "forward" else linear_backward
    rc = call(backend.lib, ptrs, case.m, case.n, case.k)
    msg = ffi.string(backend.lib.mt_last_error()).decode("utf-8", "replace") if rc else ""
    outs = {}
    for name, obj in keep:
        if name not in case.outputs:
            continue
        nbytes = case.outputs[name]
        outs[name] = obj.download(nbytes, off) if on_device else ffi.buffer(obj, nbytes)[:]
    return rc, msg, outs


def first_diff(a, b):
    """(index of the first differing float32, count of differing floats) of two equally long
    byte strings that differ."""
    lo, step = 0, 1 << 16
    while lo < len(a) and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    first = next(i // 4 for i in range(lo, min(lo + step, len(a)), 4) if a[i:i + 4] != b[i:i + 4])
    count = sum(1 for i in range(0, len(a), 4) if a[i:i + 4] != b[i:i + 4]) if len(a) <= 1 << 22 else None
    return first, count


def describe(name, want, got):
    if len(want) != len(got):
        return "%s: %d bytes from the oracle, %d from cuda" % (name, len(want), len(got))
    i, count = first_diff(want, got)
    w, g = struct.unpack_from("<f", want, 4 * i)[0], struct.unpack_from("<f", got, 4 * i)[0]
    return "%s[%d]: cpu %r vs cuda %r (%s of %d floats differ)" % (
        name, i, w, g, "?" if count is None else count, len(want) // 4)


def check(cpu, gpu, case):
    """A list of problems (empty: PASS)."""
    want_rc, want_msg, want = run(cpu, case, False)
    if want_rc == EUNSUPPORTED:
        return ["the CPU oracle refuses: %s" % want_msg]
    sides = [("device", True)] + ([("host", False)] if case.host else [])
    problems = []
    for side, on_device in sides:
        rc, msg, got = run(gpu, case, on_device)
        if rc != want_rc:
            problems.append("%s: rc %d (%s) but the oracle's %d (%s)" % (side, rc, msg, want_rc, want_msg))
            continue
        if rc:
            if case.refuse and case.refuse + " holds" not in msg:
                problems.append("%s: the refusal does not name %s: %s" % (side, case.refuse, msg))
            for name, data in got.items():
                if data != POISON * len(data):
                    problems.append("%s: %s was written by a refused call" % (side, name))
            continue
        for name in case.outputs:
            if want.get(name) != got.get(name):
                problems.append("%s: %s" % (side, describe(name, want[name], got[name])))
    return problems


# ---- the cases ------------------------------------------------------------------------------
SMALL = (1, 2, 3, 7, 31, 64, 65, 127, 128, 129)
LARGE = (255, 1000, 1023, 1024, 2049)


def make_case(cpu, seed, idx, m, n, k, op, bias=True, host=False, offset=0, drop=(), refuse=None, scale=1.0):
    """scale: inputs in [-scale, scale) (1e-20: products in the subnormal range, chains that
    underflow to -0.0)."""
    s = seed * 1000003 + idx
    if op == "forward":
        inputs = {"a": uniform(cpu, m * k, s, 1, -scale, scale), "weight": uniform(cpu, n * k, s, 2, -scale, scale),
                  "bias": uniform(cpu, n, s, 3, -scale, scale) if bias else False}
        outputs = {"out": 4 * m * n}
    else:
        inputs = {"dc": uniform(cpu, m * n, s, 4, -scale, scale), "a": uniform(cpu, m * k, s, 1, -scale, scale),
                  "weight": uniform(cpu, n * k, s, 2, -scale, scale)}
        outputs = {"da": 4 * m * k, "dweight": 4 * n * k, "dbias": 4 * n}
        for d in drop:
            outputs[d] = None
    if refuse:
        name, value = refuse
        struct.pack_into("<f", inputs[name], 4 * (len(inputs[name]) // 8), value)
    label = "%s m=%d n=%d k=%d%s%s%s%s%s%s" % (
        op, m, n, k, "" if op == "backward" or bias else " nobias", " +host" if host else "",
        " off=%d" % offset if offset else "", " drop=%s" % ",".join(drop) if drop else "",
        " refuse=%s" % refuse[0] if refuse else "", " scale=%g" % scale if scale != 1.0 else "")
    return Case(label, op, m, n, k, inputs, outputs, host, offset, refuse[0] if refuse else None)


def shape_list(args):
    shapes = []
    if args.quick:
        return [(1, 1, 1), (3, 7, 31), (65, 127, 129), (129, 64, 65), (255, 1000, 1023), (2049, 129, 65)]
    shapes += list(itertools.product(SMALL, repeat=3))
    if args.full:
        every = SMALL + LARGE
        shapes += [t for t in itertools.product(every, repeat=3) if max(t) >= 255]
    else:
        for big in LARGE:                       # each large size against a few small ones, each position
            for other in ((1, 129), (64, 7), (127, 1000)):
                for pos in range(3):
                    t = list(other)
                    t.insert(pos, big)
                    shapes.append(tuple(t))
        shapes += [(1024, 1024, 1024), (1023, 1000, 255), (2049, 1023, 1000), (1000, 2049, 1024)]
    return shapes


def cases(cpu, args):
    out, idx = [], 0
    for (m, n, k) in shape_list(args):
        idx += 1
        host = m * n * k <= 2 ** 16 and idx % 3 == 0 or (m, n, k) == (1024, 1024, 1024)
        out.append(make_case(cpu, args.seed, idx, m, n, k, "forward", bias=idx % 2 == 0, host=host))
        drop = (("da",), ("dweight",), ("dbias",), ("da", "dbias"))[idx % 4] if idx % 5 == 0 else ()
        out.append(make_case(cpu, args.seed, idx, m, n, k, "backward", host=host, drop=drop))
    token = [(2048, 3, 5), (2049, 3, 5), (3000, 17, 33), (4097, 129, 65), (8192, 64, 96), (5000, 200, 300)]
    if not args.quick:
        token.append((33 * 1024 + 5, 3, 4))     # 34 leaves: two passes of the tree
    for (m, n, k) in token:
        idx += 1
        out.append(make_case(cpu, args.seed, idx, m, n, k, "backward", host=idx % 2 == 0))
        out.append(make_case(cpu, args.seed, idx, m, n, k, "forward", host=idx % 2 == 1))
    for offset in (4, 8, 12):                   # 4-byte misalignment: the scalar and 4-byte loaders
        for (m, n, k) in ((65, 130, 67), (129, 7, 255), (1025, 33, 20)):
            idx += 1
            out.append(make_case(cpu, args.seed, idx, m, n, k, "forward", offset=offset))
            out.append(make_case(cpu, args.seed, idx, m, n, k, "backward", offset=offset))
    for (m, n, k) in ((0, 5, 7), (5, 0, 7), (5, 7, 0), (0, 0, 0), (1030, 3, 0)):   # empty dimensions
        idx += 1
        out.append(make_case(cpu, args.seed, idx, m, n, k, "forward", host=True))
        out.append(make_case(cpu, args.seed, idx, m, n, k, "backward", host=True))
    for scale in (1e-20, 1e-22, 1e-23):        # subnormal results; chains ending at -0.0 and +0.0
        for (m, n, k) in ((5, 7, 9), (130, 17, 33), (1100, 5, 21), (65, 129, 1000), (2049, 64, 31)):
            idx += 1
            for op in ("forward", "backward"):
                out.append(make_case(cpu, args.seed, idx, m, n, k, op, bias=False, scale=scale))
    nan, inf = float("nan"), float("inf")
    for name, value in (("a", nan), ("weight", inf), ("bias", -inf)):
        idx += 1
        out.append(make_case(cpu, args.seed, idx, 70, 130, 40, "forward", host=True, refuse=(name, value)))
    for name, value in (("dc", inf), ("a", nan), ("weight", nan)):
        idx += 1
        out.append(make_case(cpu, args.seed, idx, 1500, 70, 40, "backward", host=True, refuse=(name, value)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="every (m, n, k) triple of the whole size set")
    ap.add_argument("--quick", action="store_true", help="a handful of shapes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--repeat", type=int, default=12, help="benchmark runs (median)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print PASS lines too")
    args = ap.parse_args()
    cpu = _native.load("identical", "cpu")
    gpu = _native.load("identical", "cuda")
    print("cpu: %s\ncuda: %s" % (cpu.path, gpu.path))
    t0 = time.perf_counter()
    todo = cases(cpu, args)
    passed = failed = 0
    for case in todo:
        problems = check(cpu, gpu, case)
        if problems:
            failed += 1
            print("FAIL %s\n     %s" % (case.name, "\n     ".join(problems)), flush=True)
        else:
            passed += 1
            if args.verbose:
                print("PASS %s" % case.name, flush=True)
    print("linear: %d passed, %d failed (%d cases, %.1f s)" % (passed, failed, len(todo), time.perf_counter() - t0))
    if not args.no_bench:
        import dense_cuda
        dense_cuda.run_benchmarks(repeat=args.repeat)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
