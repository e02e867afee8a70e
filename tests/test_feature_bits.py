"""A library cannot under-report itself: every GPU library built here declares at least the
op features of the CPU oracle of its numeric mode.

A stale bit once made mt_gpu_dense.cu (now mt_gpu_linear.cu) report no dense feature, so most dense and LM-head tests
skipped on CUDA unnoticed. This test reads mt_features() straight from each built library file,
in a fresh process (no device needed: the identity functions touch no GPU), and compares the op bits; the
capability bits (buffers, threads, contraction, ...) legitimately differ between vendors.
The bit values come from the header (its enum mt_feature, through cffi), the one place they
are declared.
"""
import functools
import os
import re
import subprocess
import sys

import pytest

from mojo_train import _native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "native", "build")
# Capabilities of a vendor or numeric mode, not ops: they may differ between the oracle and a GPU.
CAPABILITIES = ("HOST_BUFFERS", "DEVICE_BUFFERS", "THREADS", "PINNED_MATH", "CONTRACTION", "APPROXIMATE",
                "FLUSH_RULE", "DEFERRED_REFUSALS")


def header_features():
    """{NAME: bit} of every MT_FEATURE_* the header declares (read by cffi from its enum)."""
    return {name.upper(): bit for name, bit in _native.FEATURES.items()}


# Op families the oracle has and the GPU sources do not yet: their GPU entries answer
# MT_EUNSUPPORTED and declare no bit, so tests skip there by capability. Each entry says why;
# test_a_pending_gpu_feature_is_still_missing makes sure an entry leaves when its kernel lands.
PENDING_ON_GPU = {}
# Op families one GPU vendor compiles but cannot run, by vendor, each with why (declared by the
# library itself: its mt_<family>_features answers 0 there).
NOT_RUN_ON = {"hip": {"ATTENTION": "the attention tiles need 68-167 KiB of shared memory; an AMD workgroup has "
                                   "64 KiB (native/hip/README.md)"},
              "metal": {}}
NOT_RUN_ON["metal_emulated"] = NOT_RUN_ON["metal"]   # the same kernels, run by the emulator


def op_mask(vendor=None):
    skip = CAPABILITIES + tuple(PENDING_ON_GPU) + tuple(NOT_RUN_ON.get(vendor, {}))
    return sum(bit for name, bit in header_features().items() if name not in skip)


# The child that reads one library's mt_features(): exit 3 with dlopen's words when it cannot load.
_READ_FEATURES = """
import ctypes, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as e:
    print("dlopen: %s" % e)
    sys.exit(3)
lib.mt_features.restype = ctypes.c_uint64
print(lib.mt_features())
"""


@functools.lru_cache(maxsize=None)
def features_of(path):
    """mt_features() of a library file, read in a fresh child process. Loading a GPU library loads
    its vendor's runtime, which cannot always be unloaded and loaded again in one process: on the
    H200 machine (Debian's HIP 5.7 runtime, no AMD GPU) a HIP library opened after another was
    dlclose'd aborts inside dlopen ("LLVM ERROR: inconsistency in registered CommandLine options":
    the runtime's LLVM registers its options again; fourteenth session's probe). This test once
    read each library with dlopen and dlclose in the worker, and lost three workers that way.
    OSError when the file cannot be loaded at all."""
    p = subprocess.run([sys.executable, "-c", _READ_FEATURES, path], capture_output=True, text=True, timeout=300)
    if p.returncode == 3:
        raise OSError(p.stdout.strip())
    assert p.returncode == 0, "reading mt_features() of %s in a fresh process ended with status %d: %s" % (
        path, p.returncode, (p.stdout + p.stderr)[-1000:])
    return int(p.stdout.split()[-1])


def _vendor_and_mode(path):
    """(vendor, numeric mode) of a library file's name."""
    m = re.match(r"libmojo_train_(%s)_(%s)\.(so|dylib)$" % ("|".join(_native.VENDORS), "|".join(_native.NUMERIC_MODES)),
                 os.path.basename(path))
    assert m, path
    return m.group(1), m.group(2)


GPU_LIBS = sorted(os.path.join(BUILD, f) for f in (os.listdir(BUILD) if os.path.isdir(BUILD) else ())
                  if re.match(r"libmojo_train_(cuda|hip|metal|metal_emulated)_\w+\.(so|dylib)$", f))


def test_a_gpu_vendor_under_test_has_its_libraries_built():
    """Where the suite runs against a GPU vendor, its libraries must be here to be compared
    (the comparison below skips only where no GPU library was built at all)."""
    vendor = os.environ.get("MOJO_TRAIN_VENDOR", "auto").strip().lower()
    if vendor in ("cuda", "hip", "metal"):
        assert any("_%s_" % vendor in os.path.basename(p) for p in GPU_LIBS), "make %s did not run" % vendor


def test_the_header_declares_the_op_features_the_suite_relies_on():
    names = set(header_features())
    assert {"OPTIM", "CLIP", "LOSS", "LINEAR", "RMS_NORM", "LM_HEAD", "EMBEDDING", "RANDOM", "ELEMENTWISE"} <= names
    assert set(CAPABILITIES) <= names


@pytest.mark.skipif(not GPU_LIBS, reason="no GPU library is built here (make cuda / make hip)")
@pytest.mark.parametrize("path", GPU_LIBS, ids=os.path.basename)
def test_a_gpu_library_declares_every_op_feature_of_the_cpu_oracle(path):
    vendor, numeric_mode = _vendor_and_mode(path)
    assert numeric_mode in _native.NUMERIC_MODES, path
    oracle = os.path.join(BUILD, _native.library_name("cpu", numeric_mode))
    if not os.path.isfile(oracle):
        pytest.skip("the cpu oracle's %s numeric mode is not built (make)" % numeric_mode)
    try:
        gpu = features_of(path)
    except OSError as e:
        pytest.skip("cannot dlopen %s: %s" % (path, e))
    mask = op_mask(vendor)
    missing = (features_of(oracle) & mask) & ~gpu
    names = [n for n, b in header_features().items() if b & missing]
    assert not missing, "%s does not declare %s, which the cpu oracle has" % (os.path.basename(path), names)


@pytest.mark.skipif(not GPU_LIBS, reason="no GPU library is built here (make cuda / make hip)")
@pytest.mark.parametrize("path", GPU_LIBS, ids=os.path.basename)
def test_a_pending_gpu_feature_is_still_missing(path):
    try:
        gpu = features_of(path)
    except OSError as e:
        pytest.skip("cannot dlopen %s: %s" % (path, e))
    vendor = _vendor_and_mode(path)[0]
    pending = list(PENDING_ON_GPU) + list(NOT_RUN_ON.get(vendor, {}))
    landed = [n for n in pending if gpu & header_features()[n]]
    assert not landed, "%s declares %s: remove it from PENDING_ON_GPU / NOT_RUN_ON" % (os.path.basename(path), landed)
