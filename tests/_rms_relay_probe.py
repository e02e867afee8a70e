"""Run by tests/test_rms_norm.py in a process of its own with MOJO_TRAIN_RMS_RELAY=1 (the library
reads it once): RMSNorm's backward on the device vendor named by MOJO_TRAIN_VENDOR against the CPU
oracle, on widths only the relay takes on CUDA (not multiples of 128), with a launch cap that
leaves one row block for every walker, and refusals that must leave a device dweight untouched.
Prints one JSON object per case: what it found and the launch geometry recorded after it."""
import hashlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import mojo_train as mt  # noqa: E402
from mojo_train import Array, DeviceArray  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402

from _layer_helpers import SENTINEL, device_copy_at, values  # noqa: E402

VENDOR = os.environ["MOJO_TRAIN_VENDOR"]
LIB = load("identical", VENDOR).lib


def _digest(*arrays):
    return hashlib.sha256(b"".join(bytes(a.to_host().tobytes() if isinstance(a, DeviceArray) else a.tobytes())
                                   for a in arrays)).hexdigest()


def _inputs(rows, dim, seed):
    os.environ["MOJO_TRAIN_VENDOR"] = "cpu"   # mojo_train's CPU generator: Python's would take minutes
    g = mt.Generator(seed, numeric_mode="identical")
    out = g.uniform((rows, dim), -1.0, 1.0), g.uniform((rows, dim), -1.0, 1.0), g.uniform((dim,), 0.5, 1.5)
    os.environ["MOJO_TRAIN_VENDOR"] = VENDOR
    return out


def _geometry():
    seen = ffi.new("int32_t[2]")
    assert LIB.mt_launch_geometry(seen) == 0
    return [int(seen[0]), int(seen[1])]


def bits_case(rows, dim, cap, seed):
    x, dy, w = _inputs(rows, dim, seed)
    os.environ["MOJO_TRAIN_VENDOR"] = "cpu"
    want = _digest(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    os.environ["MOJO_TRAIN_VENDOR"] = VENDOR
    assert LIB.mt_set_launch_geometry(256, cap) == 0
    try:
        got = _digest(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    finally:
        LIB.mt_set_launch_geometry(256, 0)
    return {"case": "bits", "rows": rows, "dim": dim, "cap": cap, "same": got == want, "geometry": _geometry()}


def refusal_case(bad, rows=7169, dim=128):
    x, dy, w = _inputs(rows, dim, 60)
    host = {"x": x, "dy": dy, "w": w}
    poisoned = host[bad].reshape(-1)
    poisoned[poisoned.size // 2] = float("nan")
    dev = {k: device_copy_at(v, 0, "identical") for k, v in host.items()}
    dw = device_copy_at(Array.from_list([SENTINEL] * dim, "float32"), 0, "identical")
    dx = DeviceArray((rows, dim), "float32", numeric_mode="identical")
    ptr = lambda a: ffi.cast("float *", a.ptr)   # noqa: E731
    rc = LIB.mt_rms_norm_backward(ptr(dx), ptr(dw), ptr(dev["dy"]), ptr(dev["x"]), ptr(dev["w"]), 1e-5, rows, dim)
    return {"case": "refusal", "bad": bad, "rc": rc, "message": ffi.string(LIB.mt_last_error()).decode(),
            "dweight_untouched": values(dw) == [SENTINEL] * dim, "geometry": _geometry()}


if __name__ == "__main__":
    # (rows, dim, cap): 8 or 9 leaves; a cap of walkers + 1 leaves one row block (walkers: a leaf's
    # dim / 4 columns over 128 threads -- 8, 8, 27 of them here)
    for i, (rows, dim, cap) in enumerate([(7169, 128, 0), (7169, 128, 9), (8191, 132, 0), (8191, 132, 9),
                                          (9007, 1028, 0), (9007, 1028, 28)]):
        print(json.dumps(bits_case(rows, dim, cap, 100 + i)), flush=True)
    for bad in ("x", "dy", "w"):
        print(json.dumps(refusal_case(bad)), flush=True)
