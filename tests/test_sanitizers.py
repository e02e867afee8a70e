"""The sanitizer build is live: `make asan` builds the CPU libraries with AddressSanitizer and
UndefinedBehaviorSanitizer into native/build/asan/ (this test builds the identical one itself),
and `make asan-test` runs the suite against them. A clean run proves nothing unless the sanitizer would have spoken: here a child
interpreter reads past the end of a buffer through the sanitized library and must die with
AddressSanitizer's report, while the same call within bounds succeeds."""
import os
import shutil
import subprocess
import sys

import pytest

from _helpers import REPO, python_path

ASAN_DIR = os.path.join(REPO, "native", "build", "asan")

# ``a`` holds 1024 floats (a malloc'd block: PYTHONMALLOC=malloc); ``out`` is a separate mapping
# large enough for n, so only the read of ``a`` can run past its end.
CALL = """
import array, mmap
from mojo_train import _native
b = _native.load("identical", "cpu")
assert b.path.startswith(%r), b.path
n = %d
a = array.array("f", [1.0] * 1024)
out = mmap.mmap(-1, 4 * n)
pa = _native.ffi.cast("float *", a.buffer_info()[0])
pout = _native.ffi.cast("float *", _native.ffi.from_buffer(out))
rc = b.lib.mt_add(pout, pa, pa, n)
print("rc", rc)
"""


def _run(n):
    cc = os.environ.get("CC", "cc")
    preload = ":".join(subprocess.run([cc, "-print-file-name=" + lib], capture_output=True, text=True).stdout.strip()
                       for lib in ("libasan.so", "libubsan.so"))
    env = dict(os.environ, LD_PRELOAD=preload, ASAN_OPTIONS="detect_leaks=0", MOJO_TRAIN_LIBRARY_PATH=ASAN_DIR,
               MOJO_TRAIN_VENDOR="cpu", MOJO_TRAIN_NUM_THREADS="1", PYTHONMALLOC="malloc",
               PYTHONPATH=python_path(REPO))
    return subprocess.run([sys.executable, "-c", CALL % (ASAN_DIR, n)], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def asan_build():
    """The sanitized identical library, built here when it is not (about 10 s)."""
    if not shutil.which(os.environ.get("CC", "cc")) or not shutil.which("make"):
        pytest.skip("no C compiler or make to build the sanitized library")
    lib = os.path.join("native", "build", "asan", "libmojo_train_cpu_identical.so")
    build = subprocess.run(["make", lib], cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]


def test_the_sanitized_library_reports_a_read_past_the_end(asan_build):
    bad = _run(1024 + 256)
    assert bad.returncode != 0 and "AddressSanitizer" in bad.stderr, (bad.returncode, bad.stderr[-1500:])


def test_the_same_call_within_bounds_is_clean(asan_build):
    good = _run(1024)
    assert good.returncode == 0 and "rc 0" in good.stdout, good.stderr[-1500:]
