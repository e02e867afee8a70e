"""The Python part of a small device call, on any vendor that takes device buffers (the cpu
machine's metal_emulated included): no GPU needed, no torch.

    MOJO_TRAIN_VENDOR=metal_emulated python bench/call_overhead_host.py [--calls 50000] [--rounds 7]

Each figure is the fastest of --rounds rounds of --calls calls, in microseconds a call:
  c_alloc_free        mt_device_alloc + mt_device_free of 4,096 floats through cffi alone
  allocation          the package's allocation object made and dropped (the C calls and its Python)
  device_array        an op's new output (a DeviceArray of 4,096 floats) made and dropped
  c_embedding_forward the native mt_embedding_forward of 4 ids from a (64, 16) table, kept output
  embedding_forward   mojo_train.embedding_forward of the same through the API (a new output)
So embedding_forward - c_embedding_forward is the wrapper with its output's allocation.
"""
import array
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mojo_train as mt  # noqa: E402
from mojo_train import _native, _ops  # noqa: E402
from mojo_train._native import ffi  # noqa: E402
from mojo_train.device import DeviceArray, _Allocation  # noqa: E402
from mojo_train.embedding import embedding_forward  # noqa: E402


def fastest_us(fn, calls, rounds):
    for _ in range(1000):
        fn()
    best = None
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t = (time.perf_counter() - t0) / calls * 1e6
        best = t if best is None or t < best else best
    return best


def main():
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    backend = _native.load()
    if not backend.has("device_buffers"):
        sys.exit("call_overhead_host.py: vendor %s takes no device buffers; set MOJO_TRAIN_VENDOR "
                 "(metal_emulated runs on any machine)" % backend.vendor)
    lib, slot = backend.lib, ffi.new("void **")
    table = mt.to_device(array.array("f", [0.5] * (64 * 16))).reshape(64, 16)
    ids = mt.to_device(array.array("q", [1, 2, 3, 4]))
    kept = embedding_forward(table, ids)

    def c_alloc_free():
        lib.mt_device_alloc(slot, 4 * 4096)
        lib.mt_device_free(slot[0])

    figures = {
        "c_alloc_free": c_alloc_free,
        "allocation": lambda: _Allocation(backend, 4 * 4096),
        "device_array": lambda: _ops.plain_out((4096,), 4096, True, backend),
        "c_embedding_forward": lambda: lib.mt_embedding_forward(kept._cptr, table._cptr, ids._cptr, 8, 4, 64, 16,
                                                                _ops.map_flags(None)),
        "embedding_forward": lambda: embedding_forward(table, ids),
    }
    assert isinstance(figures["device_array"](), DeviceArray)
    print("vendor %s; us a call, fastest of %d rounds of %d calls:" % (backend.vendor, args.rounds, args.calls))
    for name, fn in figures.items():
        print("  %-20s %.2f" % (name, fastest_us(fn, args.calls, args.rounds)))


if __name__ == "__main__":
    main()
