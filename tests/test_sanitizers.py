"""The sanitizer builds are live: `make asan` builds the CPU libraries with AddressSanitizer and
UndefinedBehaviorSanitizer into native/build/asan/, `make tsan` with ThreadSanitizer into
native/build/tsan/ (these tests build the identical ones themselves), and `make asan-test` /
`make tsan-test` run the suite against them. A clean run proves nothing unless the sanitizer
would have spoken: here a child interpreter reads past the end of a buffer through the
sanitized library and must die with AddressSanitizer's report, and two threads write one output
buffer at once through the TSan library and must draw ThreadSanitizer's data-race report; the
same calls within bounds, or into two buffers, are clean."""
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
rc = b.lib.mt_add(pout, pa, pa, n, 0)
print("rc", rc)
"""


# Two Python threads (cffi lets go of the GIL during the call) add into ``out`` at once: the
# same buffer (a race on every element) or one buffer each.
RACE = """
import array, sys, threading
from mojo_train import _native
b = _native.load("identical", "cpu")
assert b.path.startswith(%r), b.path
n = 1 << 16
a = array.array("f", [1.0] * n)
outs = [array.array("f", [0.0] * n) for _ in range(2)]
pa = _native.ffi.cast("float *", a.buffer_info()[0])
shared = sys.argv[1] == "shared"
def work(k):
    out = _native.ffi.cast("float *", outs[0 if shared else k].buffer_info()[0])
    for _ in range(200):
        assert b.lib.mt_add(out, pa, pa, n, 0) == 0
threads = [threading.Thread(target=work, args=(k,)) for k in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print("done")
"""


def _runtime(*names):
    cc = os.environ.get("CC", "cc")
    return ":".join(subprocess.run([cc, "-print-file-name=" + lib], capture_output=True, text=True).stdout.strip()
                    for lib in names)


def _child(script, preload, folder, args=(), **env):
    env = dict(os.environ, LD_PRELOAD=preload, MOJO_TRAIN_LIBRARY_PATH=folder, MOJO_TRAIN_VENDOR="cpu",
               MOJO_TRAIN_NUM_THREADS="1", PYTHONPATH=python_path(REPO), **env)
    return subprocess.run([sys.executable, "-c", script] + list(args), env=env, capture_output=True, text=True,
                          timeout=180)


def _run(n):
    return _child(CALL % (ASAN_DIR, n), _runtime("libasan.so", "libubsan.so"), ASAN_DIR,
                  ASAN_OPTIONS="detect_leaks=0", PYTHONMALLOC="malloc")


def _race(kind):
    return _child(RACE % TSAN_DIR, _runtime("libtsan.so"), TSAN_DIR, [kind],
                  TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0")


def _build(folder):
    """The sanitized identical library in ``folder``, built here when it is not (10-20 s)."""
    if not shutil.which(os.environ.get("CC", "cc")) or not shutil.which("make"):
        pytest.skip("no C compiler or make to build the sanitized library")
    lib = os.path.join("native", "build", folder, "libmojo_train_cpu_identical.so")
    build = subprocess.run(["make", lib], cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]


TSAN_DIR = os.path.join(REPO, "native", "build", "tsan")


@pytest.fixture(scope="module")
def asan_build():
    _build("asan")


@pytest.fixture(scope="module")
def tsan_build():
    _build("tsan")


def test_the_sanitized_library_reports_a_read_past_the_end(asan_build):
    bad = _run(1024 + 256)
    assert bad.returncode != 0 and "AddressSanitizer" in bad.stderr, (bad.returncode, bad.stderr[-1500:])


def test_the_same_call_within_bounds_is_clean(asan_build):
    good = _run(1024)
    assert good.returncode == 0 and "rc 0" in good.stdout, good.stderr[-1500:]


def test_the_thread_sanitized_library_reports_two_threads_writing_one_buffer(tsan_build):
    bad = _race("shared")
    assert bad.returncode != 0 and "ThreadSanitizer: data race" in bad.stderr, (bad.returncode, bad.stderr[-1500:])


def test_two_threads_writing_their_own_buffers_are_clean(tsan_build):
    good = _race("separate")
    assert good.returncode == 0 and "done" in good.stdout and "ThreadSanitizer" not in good.stderr, good.stderr[-1500:]
