"""Helpers of the layer tests (test_linear.py, test_rms_norm.py and ReLU's; their fixtures
``linear_mode``, ``rms_norm_mode`` and their ``_identical`` twins are conftest.py's): their data, the comparisons of outputs
by bits, the token rule replayed, and the checks every layer's refusals share (a C entry
writes no output; a NaN or inf is refused by name and leaves every input as it was), the
thread-count check and device buffers at a misaligned address.
"""
import hashlib

import pytest
from hypothesis import HealthCheck

from mojo_train import Array, DeviceArray
from mojo_train._native import ffi

from _helpers import EINVAL, _tree_fold, bits, f32_array, thread_counts, wide_array

LEAF = 1024          # MT_TOKEN_LEAF: rows of a leaf of the token rule
SENTINEL = 1234.5    # what a C output holds until something writes it
HYPOTHESIS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                         HealthCheck.too_slow])


# ---- data -----------------------------------------------------------------------------------

def mat(shape, seed, low=-1.0, high=1.0, wide=False):
    """A float32 Array of ``shape`` drawn by Python's generator (wide: spread magnitudes)."""
    n = 1
    for d in shape:
        n *= d
    data = wide_array(n, seed) if wide else f32_array(n, seed, low, high)
    return Array.from_bytes(data.tobytes(), shape, "float32")


def words(x):
    """The distinct 32-bit words of an output (host or device) as 8 hex digits each: NaN bits."""
    return {"%08x" % bits(v) for v in values(x)}


def values(x):
    """The float values of an output (host or device), in C order."""
    if hasattr(x, "to_host"):
        x = x.to_host()
    return x.memview().cast("B").cast("f").tolist() if x.size else []


def rows_of(x, r0, r1):
    """A copy of rows r0..r1 of a 2-D Array."""
    width = x.shape[1]
    return Array.from_bytes(x.tobytes()[r0 * width * 4:r1 * width * 4], (r1 - r0, width), "float32")


def outputs_sha(*outputs):
    """sha256 of the bytes of every output given (host or device; None skipped)."""
    h = hashlib.sha256()
    for x in outputs:
        if x is not None:
            h.update((x.to_host() if hasattr(x, "to_host") else x).tobytes())
    return h.hexdigest()


def same_bits(xs, ys):
    return len(xs) == len(ys) and all(bits(x) == bits(y) for x, y in zip(xs, ys))


def token_tree(per_leaf):
    """Elementwise pairwise tree over per-leaf result lists."""
    return [_tree_fold(column) for column in zip(*per_leaf)]


def device_copy_at(x, offset_bytes, numeric_mode):
    """A DeviceArray holding the Array ``x``, ``offset_bytes`` (4, 8, 12: not 16-byte aligned)
    into a device allocation of its own."""
    base = DeviceArray((x.size + 4,), "float32", numeric_mode=numeric_mode)
    view = DeviceArray(x.shape, "float32", _alloc=base._alloc, _offset=offset_bytes)
    return view.copy_from(x)


# ---- checks every layer shares ----------------------------------------------------------------

def c_in(x):
    return ffi.cast("float *", x.address)


def assert_c_refusals_write_nothing(lib, cases):
    """Each (text, call(outputs)) returns MT_EINVAL with ``text`` in its message and leaves its
    three outputs of 24 floats holding SENTINEL."""
    for text, call in cases:
        outs = [ffi.new("float[]", [SENTINEL] * 24) for _ in range(3)]
        rc = call(outs)
        msg = ffi.string(lib.mt_last_error()).decode()
        assert rc == EINVAL and text in msg, (text, rc, msg)
        assert all(o[i] == SENTINEL for o in outs for i in range(24)), text


def assert_nonfinite_refused(op, arg, call, numeric_mode, inputs, bad, at=None):
    """``call(numeric_mode, inputs)`` with ``bad`` planted in inputs[arg] (at flat index ``at``, the
    middle by default) raises ValueError naming the argument (``w`` is the caller's ``weight``)
    and the entry point ``op``, and leaves every input's bytes as they were."""
    poisoned = inputs[arg].reshape(-1)
    poisoned[poisoned.size // 2 if at is None else at] = float(bad)
    before = {k: v.tobytes() for k, v in inputs.items()}
    with pytest.raises(ValueError) as info:
        call(numeric_mode, inputs)
    name = "weight" if arg == "w" else arg
    assert "%s holds NaN or inf" % name in str(info.value) and "mojo_train.%s" % op in str(info.value)
    assert {k: v.tobytes() for k, v in inputs.items()} == before


def digests_over_thread_counts(mode, digest):
    """``digest()`` (a sha of outputs) under 1, 2, 3 and 5 threads and then the library's own
    count again, as a set; the library's thread count is restored."""
    if not mode.has("threads"):
        pytest.skip("no thread pool in this library")
    digests = [digest() for _ in thread_counts(mode)]
    digests.append(digest())
    return set(digests)


def need_device(mode):
    if not mode.has("device_buffers"):
        pytest.skip("the vendor takes no device buffers")


# ---- bounds and their figures (tolerances.py) --------------------------------------------------------

def assert_within_bound(outputs, what):
    """tolerances.py's bound holds for every output of ``{name: (ours, ref64, unit)}``; ``what``
    names the call in the message."""
    import tolerances as tol
    for name, (ours, ref, unit) in outputs.items():
        tol.assert_close_to_reference(ours, ref, "%s: %s" % (what, name), unit=unit)


def print_family_figures(family, draw_case, vs_torch, n_cases):
    """print_bound_figures over ``n_cases`` cases, each ``draw_case(rng)`` (rng: random.Random(0)),
    compared by ``vs_torch(case, numeric_mode, dtype)``; outputs named "<family> <output>"."""
    import random
    rng = random.Random(0)
    cases = [draw_case(rng) for _ in range(n_cases)]
    print_bound_figures(cases, lambda case, numeric_mode, dtype: {
        family + " " + name: v for name, v in vs_torch(case, numeric_mode, dtype).items()})


def print_bound_figures(cases, compare):
    """For each case: ``compare(case, numeric_mode, dtype)`` gives {output: (ours, ref, unit)}; prints the
    worst share of tolerances.py's bound used, per output, by ours (identical, fast) and by
    torch in float32."""
    import torch

    import tolerances as tol
    worst = {}
    for case in cases:
        for who, numeric_mode, dtype in (("identical", "identical", None), ("fast", "fast", None),
                                 ("torch float32", None, torch.float32)):
            for name, (got, ref, unit) in compare(case, numeric_mode, dtype).items():
                used, _ = tol.bound_used(got, ref, unit)
                worst[(name, who)] = max(worst.get((name, who), 0.0), used)
    for name in sorted({k[0] for k in worst}):
        print("%-18s %s" % (name, "  ".join("%s %.3f" % (w, worst[(name, w)])
                                             for w in ("identical", "fast", "torch float32"))))
