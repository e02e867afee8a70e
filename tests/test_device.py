"""Device buffers: DeviceArray, foreign device tensors, resident optimizer state, transfer
counts and launch geometry. Skipped where the loaded vendor has no device buffers."""
import hashlib
import os

import numpy as np
import pytest

import mojo_train as mt
from mojo_train import _native
from mojo_train._native import ffi


def _device_modes(request_modes):
    return [m for m in request_modes if m[2].has("device_buffers")]


def _filled(n, seed, stream, low=-1.0, high=1.0):
    cpu = _native.load("identical", "cpu")
    a = mt.Array((n,), "float32")
    cpu.check(cpu.lib.mt_uniform_fill(ffi.cast("float *", a.address), seed, stream, 0, low, high, n), "test")
    return a


def _torch_filled(torch, n, seed, stream):
    """The same Philox draw as _filled, as a torch CUDA tensor."""
    return torch.frombuffer(bytearray(_filled(n, seed, stream).tobytes()), dtype=torch.float32).cuda()


def _digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(a.tobytes() if hasattr(a, "tobytes") else bytes(a))
    return h.hexdigest()


@pytest.fixture
def dev(mode):
    if not mode.has("device_buffers"):
        pytest.skip("the loaded vendor takes no device buffers")
    return mode


@pytest.fixture
def dev_identical(identical):
    """Every loadable vendor's identical numeric mode that takes device buffers."""
    if not identical.has("device_buffers"):
        pytest.skip("no device buffers")
    return identical


@pytest.fixture
def torch_cuda():
    """torch, where it is importable and has CUDA."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    return torch


def _oracle_adamw(sizes, steps, max_norm, monkeypatch):
    """The CPU oracle's result for the same inputs (identical numeric mode)."""
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    params = [_filled(n, 11, 0) for n in sizes]
    opt = mt.AdamW(params, lr=1e-2, numeric_mode="identical")
    norms = []
    for s in range(steps):
        grads = [_filled(n, 11, 1 + s) for n in sizes]
        norms.append(opt.step(grads, max_norm=max_norm))
    return _digest(*params), _digest(opt.exp_avg, opt.exp_avg_sq), norms


def test_device_array_round_trips_and_views(dev):
    host = _filled(1000, 3, 0)
    d = mt.to_device(host, numeric_mode=dev.numeric_mode)
    assert d.shape == (1000,) and d.dtype == "float32"
    assert d.to_host().tobytes() == host.tobytes()
    r = d.reshape(10, -1)
    assert r.shape == (10, 100) and r.ptr == d.ptr
    if dev.vendor in _native.SHARED_MEMORY_VENDORS:   # shared storage: a CPU array, no CUDA interface
        assert not hasattr(d, "__cuda_array_interface__") and d.__dlpack_device__() == (1, 0)
        view = np.from_dlpack(d)
        assert view.__array_interface__["data"][0] == d.ptr and view.tobytes() == host.tobytes()
    else:
        cai = d.__cuda_array_interface__
        assert cai["data"][0] == d.ptr and cai["typestr"] == "<f4" and cai["shape"] == (1000,)
    zeros = mt.DeviceArray((5,), numeric_mode=dev.numeric_mode).to_host()
    assert zeros.tobytes() == bytes(20)


def _zeros_then_the_same_block_again(dev, n, at=None):
    """A zero-filled DeviceArray of n floats (at `at` on a GPU vendor, when given: a block kept
    idle) reads zeros; dropped, its block is the next uninitialised array's of its size on a GPU
    vendor. That array."""
    gpu = dev.vendor not in _native.SHARED_MEMORY_VENDORS
    b = mt.DeviceArray((n,), numeric_mode=dev.numeric_mode)
    if gpu and at is not None:
        assert b.ptr == at
    assert b.to_host().tobytes() == bytes(4 * n)
    where = b.ptr
    del b
    c = mt.DeviceArray.empty((n,), numeric_mode=dev.numeric_mode)
    if gpu:
        assert c.ptr == where
    return c


def test_an_allocation_made_inside_another_on_the_same_thread_gets_its_own_block(dev):
    """Python code can run on the allocating thread between mt_device_alloc's return and the
    read of its result (a trace function, a signal handler, a finalizer); an array it makes
    there must not take the outer allocation's result slot: two blocks, two addresses."""
    import sys
    from mojo_train import device
    mt.DeviceArray.empty((1,), numeric_mode=dev.numeric_mode)
    inner, armed = [], [True]
    code = device._Allocation.__init__.__code__

    def tracer(frame, event, arg):
        if frame.f_code is not code:
            return None

        def local(frame, event, arg):
            if event == "line" and armed[0] and "rc" in frame.f_locals:   # after the native call
                armed[0] = False
                inner.append(mt.DeviceArray.empty((1000,), numeric_mode=dev.numeric_mode))
            return local
        return local

    old = sys.gettrace()
    sys.settrace(tracer)
    try:
        outer = mt.DeviceArray.empty((1000,), numeric_mode=dev.numeric_mode)
    finally:
        sys.settrace(old)
    assert inner and not armed[0], "the trace function never ran inside the allocation"
    assert outer.ptr != inner[0].ptr


def test_release_device_cache_gives_the_kept_blocks_back_and_keeping_goes_on(dev):
    """release_device_cache() returns on every vendor; on a GPU vendor the block a dropped array
    left idle goes back (the pool may still hand the same address out), and a block dropped
    after it is kept again for the next array of its size."""
    n = 1031
    a = mt.DeviceArray((n,), numeric_mode=dev.numeric_mode)
    del a
    assert mt.release_device_cache(numeric_mode=dev.numeric_mode) is None
    _zeros_then_the_same_block_again(dev, n)


_LEAK_PROGRAM = """
import mojo_train as mt
for n in (1031, 1031, 4099, 1 << 20):
    a = mt.DeviceArray((n,), numeric_mode=%r)
    del a
kept = mt.DeviceArray((77,), numeric_mode=%r)   # alive until the interpreter's teardown
print("done")
"""


def test_a_process_that_drops_arrays_exits_with_every_device_block_freed(dev):
    """Every GPU library the package loads has its exit handler registered once (it gives the
    kept blocks back, and keeps none after, while the GPU runtime is up), and a process that
    drops arrays of several sizes and keeps one into the interpreter's teardown exits cleanly.
    On CUDA it runs under compute-sanitizer's memcheck with the leak check, which must report
    nothing: a C exit handler ran too late for it (the thirty-third session's memcheck of every
    card counted the 32 idle blocks as leaked)."""
    import shutil
    import subprocess
    import sys
    assert dev.backend.path in _native._exit_handlers
    code = _LEAK_PROGRAM % (dev.numeric_mode, dev.numeric_mode)
    cmd, env = [sys.executable, "-c", code], dict(os.environ, MOJO_TRAIN_VENDOR=dev.vendor)
    if dev.vendor == "cuda":
        tool = shutil.which("compute-sanitizer") or (
            "/usr/local/cuda/bin/compute-sanitizer" if os.path.exists("/usr/local/cuda/bin/compute-sanitizer") else None)
        if tool is None:
            pytest.skip("compute-sanitizer is not installed (it comes with the CUDA toolkit)")
        # device backtraces only: a host backtrace keeps the Python frames of every allocation (and
        # the arrays they hold) alive until exit (bench/sanitize_cuda.py)
        cmd = [tool, "--tool", "memcheck", "--leak-check", "full", "--show-backtrace", "device",
               "--error-exitcode", "9"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    text = r.stdout + r.stderr
    assert r.returncode == 0 and "done" in r.stdout and "Traceback" not in text, text[-3000:]
    if dev.vendor == "cuda":
        assert "Leaked" not in text and "ERROR SUMMARY: 0 errors" in text, text[-3000:]


def test_a_dropped_arrays_block_is_reused_by_the_next_of_its_size_and_never_shows_through(dev):
    """A DeviceArray dropped on a waiting thread leaves its block idle for the next allocation of
    its size (a GPU vendor's mt_device_free keeps it: no runtime call then); a zero-filled array
    there reads zeros, not the dropped array's values, and an uninitialised one takes writes."""
    n = 4099
    a = mt.to_device(_filled(n, 5, 0), numeric_mode=dev.numeric_mode)
    where = a.ptr
    del a
    c = _zeros_then_the_same_block_again(dev, n, at=where)
    host = _filled(n, 6, 1)
    c.copy_from(host)
    assert c.to_host().tobytes() == host.tobytes()


def test_a_call_mixing_host_and_device_buffers_is_refused_on_every_vendor(dev):
    """Host and device buffers in one call are refused naming each side -- on Metal too, whose
    shared memory could take the mix: code written there must run on CUDA as it is."""
    a, b = _filled(300, 5, 0), _filled(300, 5, 1)
    da = mt.to_device(a, numeric_mode=dev.numeric_mode)
    with pytest.raises(ValueError, match="a on the device but b on the host; pass all of them on one side"):
        mt.add(da, b, numeric_mode=dev.numeric_mode)


def test_adamw_on_device_arrays_matches_the_oracle_and_stays_on_the_device(dev_identical, monkeypatch):
    sizes = [1, 1023, 4096 * 3 + 5]
    want_p, want_m, want_norms = _oracle_adamw(sizes, 3, 0.5, monkeypatch)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", dev_identical.vendor)
    params = [mt.to_device(_filled(n, 11, 0)) for n in sizes]
    opt = mt.AdamW(params, lr=1e-2)
    assert opt.resident
    norms = []
    for s in range(3):
        grads = [mt.to_device(_filled(n, 11, 1 + s)) for n in sizes]
        before = mt.transfer_bytes()
        norms.append(opt.step(grads, max_norm=0.5))
        after = mt.transfer_bytes()
        if s:   # after the first step, only the new gradients' pointer table, the status and the scalars move
            assert (after[0] - before[0]) + (after[1] - before[1]) <= 64 + 8 * len(sizes) + _ADAM_SCALARS
    assert _digest(*[p.to_host() for p in params]) == want_p
    assert _digest(opt.exp_avg, opt.exp_avg_sq) == want_m
    assert norms == want_norms


# A step's host scalars (native/include/mt_pinned.h mt_adam_scalars: 11 floats and 2 int32, per
# group and step count), staged for the update kernel each step: bias corrections change every step.
_ADAM_SCALARS = 13 * 4


def test_one_tensor_device_step_moves_its_scalars_and_at_most_64_bytes_more(dev_identical, monkeypatch):
    p, g = mt.to_device(_filled(1000, 5, 0)), mt.to_device(_filled(1000, 5, 1))
    opt = mt.AdamW([p])
    opt.step([g])
    before = mt.transfer_bytes()
    opt.step([g], max_norm=1.0)
    after = mt.transfer_bytes()
    assert (after[0] - before[0]) + (after[1] - before[1]) <= 64 + _ADAM_SCALARS


def test_host_buffers_on_a_gpu_vendor_match_the_oracle_with_state_resident(dev_identical, monkeypatch):
    sizes = [3, 5000]
    want_p, want_m, want_norms = _oracle_adamw(sizes, 2, None, monkeypatch)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", dev_identical.vendor)
    for resident in (None, False):
        params = [_filled(n, 11, 0) for n in sizes]
        opt = mt.AdamW(params, lr=1e-2, resident=resident)
        assert opt.resident is (resident is None)
        for s in range(2):
            opt.step([_filled(n, 11, 1 + s) for n in sizes])
        assert _digest(*params) == want_p
        assert _digest(opt.exp_avg, opt.exp_avg_sq) == want_m


def test_state_dict_round_trips_resident_moments_bit_exactly(dev):
    p = mt.to_device(_filled(777, 8, 0))
    opt = mt.Adam([p], numeric_mode=dev.numeric_mode, weight_decay=0.1)
    opt.step([mt.to_device(_filled(777, 8, 1))])
    state = opt.state_dict()
    p2 = mt.to_device(p.to_host())
    opt2 = mt.Adam([p2], numeric_mode=dev.numeric_mode, weight_decay=0.1)
    opt2.load_state_dict(state)
    g = mt.to_device(_filled(777, 8, 2))
    opt.step([g])
    opt2.step([g])
    assert p.to_host().tobytes() == p2.to_host().tobytes()
    assert _digest(opt.exp_avg, opt.exp_avg_sq) == _digest(opt2.exp_avg, opt2.exp_avg_sq)
    opt2.exp_avg = _filled(777, 9, 0)           # assignable: uploads
    assert opt2.exp_avg.tobytes() == _filled(777, 9, 0).tobytes()


def test_launch_geometry_never_moves_the_bits(dev_identical, monkeypatch):
    lib = dev_identical.backend.lib
    digests = set()
    seen = set()
    try:
        for threads, blocks in [(256, 0), (32, 1), (64, 3), (512, 7), (128, 0)]:
            assert lib.mt_set_launch_geometry(threads, blocks) == 0
            params = [mt.to_device(_filled(n, 21, 0)) for n in (4097, 300000)]
            opt = mt.AdamW(params)
            norm = opt.step([mt.to_device(_filled(n, 21, 1)) for n in (4097, 300000)], max_norm=0.25)
            geometry = ffi.new("int32_t[2]")
            assert lib.mt_launch_geometry(geometry) == 0
            seen.add((geometry[0], geometry[1]))
            assert geometry[0] == threads and (blocks == 0 or geometry[1] <= blocks)
            digests.add((_digest(*[p.to_host() for p in params]), norm))
    finally:
        lib.mt_set_launch_geometry(256, 0)
    assert len(seen) >= 4 and len(digests) == 1


def test_torch_cuda_tensors_are_stepped_in_place_with_the_oracles_bits(dev_identical, torch_cuda, monkeypatch):
    sizes = [1, 1023, 4096 * 3 + 5]
    want_p, want_m, want_norms = _oracle_adamw(sizes, 3, 0.5, monkeypatch)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", dev_identical.vendor)
    params = [_torch_filled(torch_cuda, n, 11, 0) for n in sizes]
    ptrs = [p.data_ptr() for p in params]
    opt = mt.AdamW([p.detach() for p in params], lr=1e-2)
    norms = []
    for s in range(3):
        grads = [_torch_filled(torch_cuda, n, 11, 1 + s) for n in sizes]
        norms.append(opt.step(grads, max_norm=0.5))
    assert [p.data_ptr() for p in params] == ptrs
    assert _digest(*[p.cpu().numpy().tobytes() for p in params]) == want_p
    assert norms == want_norms
    view = torch_cuda.from_dlpack(mt.to_device(_filled(10, 1, 0)))
    assert view.is_cuda and view.cpu().numpy().tobytes() == _filled(10, 1, 0).tobytes()


def test_two_hundred_separate_torch_tensors_take_one_step_with_the_oracles_bits(dev_identical, torch_cuda, monkeypatch):
    sizes = [1000 + 7 * j for j in range(200)]
    want_p, want_m, want_norms = _oracle_adamw(sizes, 2, 1.0, monkeypatch)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", dev_identical.vendor)
    params = [_torch_filled(torch_cuda, n, 11, 0) for n in sizes]
    opt = mt.AdamW(params, lr=1e-2)
    norms = [opt.step([_torch_filled(torch_cuda, n, 11, 1 + s) for n in sizes], max_norm=1.0) for s in range(2)]
    assert _digest(*[p.cpu().numpy().tobytes() for p in params]) == want_p
    assert norms == want_norms
