"""The cache of large host blocks behind ``Array.empty`` (mojo_train/_host_blocks.py).

Contract under test: the module's docstring. A freed block of >= 1 MiB is handed to the next
request of exactly its size; a block still reachable from any Python object (a numpy view of
the Array) is never handed out; the cache holds at most MAX_BLOCKS blocks and
MOJO_TRAIN_HOST_CACHE_MB MiB; 0 disables it; a bad value is refused at import naming the
variable (and in one line by the command line); ``release_host_cache`` empties it; a failed
malloc releases the cache and tries again; a forked child has a lock of its own; threads never
get one block twice.
"""
import gc
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import mojo_train as mt
from mojo_train import _host_blocks as hb

from _helpers import REPO, python_path

MIB = 1 << 20


@pytest.fixture(autouse=True)
def empty_cache():
    gc.collect()
    mt.release_host_cache()
    yield
    gc.collect()
    mt.release_host_cache()


def test_a_freed_large_block_serves_the_next_request_of_its_size():
    a = mt.Array.empty((MIB,))                 # 4 MiB
    address = a.address
    del a
    assert hb.held_bytes() == 4 * MIB
    other = mt.Array.empty((MIB + 1,))         # another size: not that block
    assert other.address != address and hb.held_bytes() == 4 * MIB
    again = mt.Array.empty((MIB,))
    assert again.address == address and hb.held_bytes() == 0


def test_a_block_still_viewed_is_not_handed_out():
    a = mt.Array.empty((MIB,))
    view = np.asarray(a).view(np.uint8)        # numpy's view holds the Array
    view[:4] = [1, 2, 3, 4]
    address = a.address
    del a
    assert hb.held_bytes() == 0                # numpy's view keeps it alive
    b = mt.Array.empty((MIB,))
    np.asarray(b).view(np.uint8)[:4] = 255
    assert b.address != address and view[:4].tolist() == [1, 2, 3, 4]


def test_small_blocks_are_not_cached():
    a = mt.Array.empty((MIB // 4 - 1,))        # just under 1 MiB
    del a
    assert hb.held_bytes() == 0


def test_the_cache_keeps_at_most_max_blocks_and_the_oldest_goes_first():
    arrays = [mt.Array.empty((MIB + k,)) for k in range(hb.MAX_BLOCKS + 2)]
    addresses = [a.address for a in arrays]
    while arrays:
        del arrays[0]                          # freed in order: 0 first
    assert hb.held_bytes() == sum(4 * (MIB + k) for k in range(2, hb.MAX_BLOCKS + 2))
    held = hb.held_bytes()
    evicted = mt.Array.empty((MIB + 1,))       # block 1 went back to the C library: none cached fits
    assert hb.held_bytes() == held
    kept = mt.Array.empty((MIB + 2,))
    assert kept.address == addresses[2] and hb.held_bytes() == held - 4 * (MIB + 2)
    del evicted, kept


def test_release_returns_every_cached_byte():
    arrays = [mt.Array.empty((MIB,)) for _ in range(3)]
    del arrays
    assert mt.release_host_cache() == 12 * MIB and hb.held_bytes() == 0
    assert mt.release_host_cache() == 0


def test_an_op_output_in_a_reused_block_has_the_ops_bits():
    x = mt.Array.from_list([float(i % 17) - 8.0 for i in range(MIB // 2)])
    first = bytes(mt.relu_forward(x).tobytes())
    junk = mt.Array.empty((MIB // 2,))
    np.asarray(junk).view(np.uint8)[:] = 0x7f                          # NaNs in the block to be reused
    del junk
    assert bytes(mt.relu_forward(x).tobytes()) == first


def test_threads_never_hold_one_block_twice():
    live, errors = {}, []
    lock = threading.Lock()

    def work(seed):
        try:
            for i in range(200):
                a = mt.Array.empty((MIB // 4 * (1 + (seed + i) % 3),))
                with lock:
                    if a.address in live:
                        errors.append("block %#x handed out twice" % a.address)
                    live[a.address] = True
                view = np.asarray(a).view(np.uint8)
                view[:8] = seed
                ok = view[:8].tolist() == [seed] * 8
                del view
                with lock:
                    del live[a.address]
                if not ok:
                    errors.append("block overwritten while held")
                del a
        except Exception as exc:      # pragma: no cover - reported below
            errors.append(repr(exc))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert hb.held_bytes() <= hb.limit_bytes()


def _child(code, value):
    env = dict(os.environ, PYTHONPATH=python_path(REPO), MOJO_TRAIN_HOST_CACHE_MB=value)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


def test_a_limit_of_zero_disables_the_cache():
    run = _child("import mojo_train as mt\nfrom mojo_train import _host_blocks as hb\n"
                 "a = mt.Array.empty((1 << 20,)); del a\nprint(hb.limit_bytes(), hb.held_bytes())", "0")
    assert run.returncode == 0 and run.stdout.split() == ["0", "0"], run.stderr


def test_the_limit_bounds_the_bytes_held():
    run = _child("import mojo_train as mt\nfrom mojo_train import _host_blocks as hb\n"
                 "a = [mt.Array.empty((1 << 20,)) for _ in range(4)]; del a\nprint(hb.limit_bytes(), hb.held_bytes())",
                 "9")
    assert run.returncode == 0 and run.stdout.split() == [str(9 * MIB), str(8 * MIB)], run.stderr


@pytest.mark.parametrize("value", ["lots", "-1", "1.5", "\u0663"])
def test_a_bad_limit_is_refused_at_import_naming_the_variable(value):
    run = _child("import mojo_train", value)
    assert run.returncode != 0, run.stdout + run.stderr
    assert "ValueError: mojo_train: the environment variable MOJO_TRAIN_HOST_CACHE_MB must be a whole number of " \
           "MiB >= 0" in run.stderr, run.stderr



def test_the_command_line_reports_a_bad_limit_in_one_line():
    env = dict(os.environ, PYTHONPATH=python_path(REPO), MOJO_TRAIN_HOST_CACHE_MB="abc")
    run = subprocess.run([sys.executable, "-m", "mojo_train", "info"], capture_output=True, text=True, env=env,
                         timeout=120)
    assert run.returncode == 2 and run.stderr.startswith(
        "mojo_train: error: the environment variable MOJO_TRAIN_HOST_CACHE_MB must be"), \
        run.stderr
    assert len(run.stderr.splitlines()) == 1


def test_a_failed_malloc_releases_the_cache_and_tries_again(monkeypatch):
    kept = mt.Array.empty((MIB,))
    del kept
    assert hb.held_bytes() == 4 * MIB
    real, calls = hb._libc, []

    class FailingOnce:
        def malloc(self, n):
            calls.append(n)
            return hb._NULL if len(calls) == 1 else real.malloc(n)

        def free(self, p):
            real.free(p)

    monkeypatch.setattr(hb, "_libc", FailingOnce())
    got = mt.Array.empty((MIB + 5,))
    assert calls == [4 * (MIB + 5)] * 2 and hb.held_bytes() == 0 and got.nbytes == 4 * (MIB + 5)


def test_a_forked_child_gets_a_lock_of_its_own():
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    hb._lock.acquire()                         # as if another thread held it at the fork
    try:
        pid = os.fork()
        if pid == 0:                           # the child: release() must not wait on the parent's lock
            try:
                mt.release_host_cache()
                os._exit(0)
            except BaseException:
                os._exit(3)
    finally:
        hb._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
