"""Deferred refusals (native/contracts/README.md, "Deferred refusals"; mojo_train/deferred.py).

Contract under test:
- the switch is per thread, off by default, restored by the ``deferred_refusals()`` block, and
  refuses a non-bool (Python) or a value other than 0 / 1 (C) by name;
- on a vendor that reports at once (cpu), a refused call raises at the call even when deferring;
- on a GPU vendor, a deferrable call on device buffers returns without raising, and its bits are
  the waiting call's (add, SiLU, GELU, dropout, the embedding forward);
- its refusal is raised later -- by ``synchronize()``, a download, any other GPU op (which then
  writes nothing), turning the switch off, the end of the block, or the 1,025th queued call --
  naming the call and the argument (for ids: the position and the id), once;
- the refused call and every deferred call queued after it write nothing to a caller's buffer
  (an ``out=`` that is an input, updated in place, keeps its bytes);
- host buffers make a deferrable call wait: its refusal is raised at the call.
"""
import array
import ctypes
import threading

import pytest

import mojo_train
from mojo_train import _native
from mojo_train import DeviceArray, Generator, to_device
from mojo_train._native import ffi

from _helpers import EINVAL, f32_array, raw

N = 4099   # float4 groups and a tail


def _device_mode(mode):
    if not mode.has("device_buffers"):
        pytest.skip("this library has no device_buffers (mt_features)")
    if not mode.has("deferred_refusals"):     # Metal: every call reports its refusal at once
        pytest.skip("this library has no deferred_refusals (mt_features)")
    return mode


@pytest.fixture
def gpu(elementwise_identical):
    """A GPU library (elementwise ops on device buffers), deferring cleared before and after."""
    mode = _device_mode(elementwise_identical)
    yield mode
    mojo_train.set_deferred_refusals(False, numeric_mode=mode.numeric_mode)


def _nan_at(values, i):
    bad = array.array("f", values)
    bad[i] = float("nan")
    return bad


def _host(x):
    return x.to_host().tobytes()


# ---- the switch, on every vendor ----------------------------------------------------------------

def test_the_switch_is_off_by_default_per_thread_and_restored_by_the_block(identical):
    nm = identical.numeric_mode
    assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is False
    seen = []
    with mojo_train.deferred_refusals(numeric_mode=nm):
        assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is True
        t = threading.Thread(target=lambda: seen.append(mojo_train.deferred_refusals_enabled(numeric_mode=nm)))
        t.start()
        t.join()
    assert seen == [False]
    assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is False


def test_the_switch_refuses_what_is_not_a_bool(identical):
    with pytest.raises(TypeError, match="on must be True or False, got 1"):
        mojo_train.set_deferred_refusals(1, numeric_mode=identical.numeric_mode)
    rc = identical.backend.lib.mt_set_deferred_refusals(2)
    assert rc == EINVAL
    assert "on must be 0 or 1, got 2" in ffi.string(identical.backend.lib.mt_last_error()).decode()
    assert mojo_train.deferred_refusals_enabled(numeric_mode=identical.numeric_mode) is False


def test_host_buffers_are_refused_at_the_call_even_when_deferring(elementwise_identical):
    nm = elementwise_identical.numeric_mode
    a, b = f32_array(N, 1), _nan_at(f32_array(N, 2), 7)
    out = f32_array(N, 3)
    before = raw(out)
    with mojo_train.deferred_refusals(numeric_mode=nm):
        with pytest.raises(ValueError, match="b holds NaN or inf"):
            mojo_train.add(a, b, out=out, numeric_mode=nm)
    assert raw(out) == before


# ---- a GPU vendor: the deferred calls ----------------------------------------------------------

def test_deferred_calls_give_the_waiting_calls_bits(gpu):
    nm = gpu.numeric_mode
    x, y = to_device(f32_array(N, 4, -9, 9), nm), to_device(f32_array(N, 5, -9, 9), nm)
    table = to_device(f32_array(50 * 24, 6), nm).reshape(50, 24)
    ids = to_device(mojo_train.Array.from_list([(7 * i) % 50 for i in range(333)], "int64"), nm)

    def outputs():
        """Every call queued before any download: new outputs (fused) and out= (checked)."""
        gen = Generator(11, numeric_mode=nm)
        kept = DeviceArray.empty((N,), numeric_mode=nm)
        got = [mojo_train.add(x, y, numeric_mode=nm), mojo_train.silu_forward(x, numeric_mode=nm),
               mojo_train.silu_backward(y, x, numeric_mode=nm), mojo_train.gelu_forward(x, "tanh", numeric_mode=nm),
               mojo_train.embedding_forward(table, ids, numeric_mode=nm),
               mojo_train.gelu_backward(y, x, out=kept, numeric_mode=nm)]
        if gpu.has("random"):
            got.append(gen.dropout(x, 0.25)[0])
        return [_host(a) for a in got]

    waiting = outputs()
    with mojo_train.deferred_refusals(numeric_mode=nm):
        deferred = outputs()
    assert deferred == waiting


def test_a_deferred_refusal_is_raised_by_synchronize_once_naming_the_call(gpu):
    nm = gpu.numeric_mode
    a, b = to_device(f32_array(N, 1), nm), to_device(_nan_at(f32_array(N, 2), N - 1), nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.add(a, b, numeric_mode=nm)            # queued: no error yet
    with pytest.raises(ValueError, match=r"mt_add refused \(deferred: call 1 of the 1 queued.*\): b holds NaN or inf"):
        mojo_train.synchronize(numeric_mode=nm)
    mojo_train.synchronize(numeric_mode=nm)          # told once
    assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is True


def test_calls_after_a_refusal_write_nothing_to_caller_buffers(gpu):
    nm = gpu.numeric_mode
    good = f32_array(N, 8)
    a, bad = to_device(good, nm), to_device(_nan_at(f32_array(N, 9), 3), nm)
    acc = to_device(f32_array(N, 10), nm)
    before = _host(acc)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.silu_forward(bad, numeric_mode=nm)                 # refused: call 1
    mojo_train.add(acc, a, out=acc, numeric_mode=nm)              # in place after it: writes nothing
    mojo_train.silu_forward(acc, out=acc, numeric_mode=nm)        # likewise
    with pytest.raises(ValueError, match=r"mt_silu_forward refused \(deferred: call 1 of the 3 queued.*x holds "
                                         r"NaN or inf; nothing was written to a caller's buffer by it or by the 2 "
                                         r"calls queued after it"):
        mojo_train.synchronize(numeric_mode=nm)
    assert _host(acc) == before
    mojo_train.add(acc, a, out=acc, numeric_mode=nm)              # after the report: writes again
    mojo_train.synchronize(numeric_mode=nm)
    assert _host(acc) != before


def test_a_download_raises_a_pending_refusal(gpu):
    nm = gpu.numeric_mode
    x = to_device(_nan_at(f32_array(N, 12), 0), nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    y = mojo_train.gelu_forward(x, numeric_mode=nm)
    with pytest.raises(ValueError, match="mt_gelu_forward refused .*x holds NaN or inf"):
        y.to_host()


def test_another_gpu_op_raises_a_pending_refusal_and_writes_nothing(gpu):
    nm = gpu.numeric_mode
    x = to_device(_nan_at(f32_array(N, 13), 5), nm)
    dy = to_device(f32_array(6 * 8, 14), nm).reshape(6, 8)
    ids = to_device(mojo_train.Array.from_list([0, 1, 2, 1, 0, 3], "int64"), nm)
    grad = to_device(f32_array(4 * 8, 15), nm).reshape(4, 8)
    before = _host(grad)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.silu_forward(x, numeric_mode=nm)
    with pytest.raises(ValueError, match="mt_silu_forward refused"):   # not deferrable: reports before it writes
        mojo_train.embedding_backward(dy, ids, 4, grad=grad, numeric_mode=nm)
    assert _host(grad) == before
    mojo_train.embedding_backward(dy, ids, 4, grad=grad, numeric_mode=nm)   # told once: this one writes
    assert _host(grad) != before
    with pytest.raises(ValueError, match="mt_silu_forward refused"):    # the block's end reports too
        with mojo_train.deferred_refusals(numeric_mode=nm):
            mojo_train.silu_forward(x, numeric_mode=nm)


def test_a_checked_call_and_dropout_raise_the_poison_too(gpu):
    nm = gpu.numeric_mode
    bad = to_device(_nan_at(f32_array(N, 19), N // 2), nm)
    good = to_device(f32_array(N, 20), nm)
    into, acc = DeviceArray.empty((N,), numeric_mode=nm), to_device(f32_array(N, 21), nm)
    before = _host(acc)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.silu_forward(bad, out=into, numeric_mode=nm)          # the pre-pass path (out= given)
    mojo_train.add(acc, good, out=acc, numeric_mode=nm)
    with pytest.raises(ValueError, match=r"mt_silu_forward refused \(deferred: call 1 of the 2"):
        mojo_train.synchronize(numeric_mode=nm)
    assert _host(acc) == before
    if gpu.has("random"):
        Generator(3, numeric_mode=nm).dropout(bad, 0.5)              # fused: a new output
        mojo_train.add(acc, good, out=acc, numeric_mode=nm)
        with pytest.raises(ValueError, match="mt_dropout_forward refused .*x holds NaN or inf"):
            mojo_train.synchronize(numeric_mode=nm)
        assert _host(acc) == before


def test_the_poison_is_the_refusing_threads_own(gpu):
    nm = gpu.numeric_mode
    bad = to_device(_nan_at(f32_array(N, 22), 1), nm)
    good = to_device(f32_array(N, 23), nm)
    acc = to_device(f32_array(N, 24), nm)
    before = _host(acc)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.add(bad, good, numeric_mode=nm)                       # refused on this thread, not yet told
    errors = []

    def other():
        try:
            with mojo_train.deferred_refusals(numeric_mode=nm):
                mojo_train.add(acc, good, out=acc, numeric_mode=nm)
        except Exception as exc:   # pragma: no cover - reported below
            errors.append(exc)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert errors == []
    with pytest.raises(ValueError, match="mt_add refused .*a holds NaN or inf"):
        mojo_train.synchronize(numeric_mode=nm)
    assert _host(acc) != before   # the other thread's in-place add wrote: the poison was this thread's


def test_an_export_waits_for_the_queued_calls(gpu):
    nm = gpu.numeric_mode
    x = to_device(_nan_at(f32_array(N, 25), 9), nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    z = mojo_train.silu_forward(x, numeric_mode=nm)
    # torch's own test, PyObject_HasAttrString, swallows the refusal (Python's hasattr would not) ...
    has = ctypes.pythonapi.PyObject_HasAttrString
    has.argtypes, has.restype = (ctypes.py_object, ctypes.c_char_p), ctypes.c_int
    shared = gpu.vendor in _native.SHARED_MEMORY_VENDORS   # Metal exports DLPack (a CPU array) only
    if not shared:
        assert has(z, b"__cuda_array_interface__") == 0
    with pytest.raises(ValueError, match="mt_silu_forward refused"):
        z.__dlpack__()                                   # ... so the next export raises it again
    with pytest.raises(ValueError, match="mt_silu_forward refused"):
        mojo_train.synchronize(numeric_mode=nm)          # and synchronize collects it, once
    mojo_train.synchronize(numeric_mode=nm)
    if not shared:
        assert z.__cuda_array_interface__["data"][0] == z.ptr        # nothing queued now: no error
    else:
        z.__dlpack__()                                   # nothing queued now: no error



def test_turning_the_switch_off_raises_a_pending_refusal(gpu):
    nm = gpu.numeric_mode
    a = to_device(_nan_at(f32_array(N, 15), 2), nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.add(a, a, numeric_mode=nm)
    with pytest.raises(ValueError, match="mt_add refused .*a holds NaN or inf"):
        mojo_train.set_deferred_refusals(False, numeric_mode=nm)
    assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is False


def test_an_embedding_refusal_names_the_first_bad_position_and_id(gpu):
    nm = gpu.numeric_mode
    table = to_device(f32_array(10 * 8, 16), nm).reshape(10, 8)
    ids = to_device(mojo_train.Array.from_list([1, 2, 3, 10, 4, -1], "int32"), nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    mojo_train.embedding_forward(table, ids, numeric_mode=nm)
    with pytest.raises(ValueError, match=r"mt_embedding_forward refused .*ids\[3\] = 10 is outside \[0, 10\)"):
        mojo_train.synchronize(numeric_mode=nm)


def test_a_full_queue_reports_at_the_next_deferred_call(gpu):
    nm = gpu.numeric_mode
    x, bad = to_device(f32_array(64, 17), nm), to_device(_nan_at(f32_array(64, 18), 0), nm)
    out = DeviceArray.empty((64,), numeric_mode=nm)
    mojo_train.set_deferred_refusals(True, numeric_mode=nm)
    for _ in range(1100):                       # no refusal: the queue is flushed and reused
        mojo_train.add(x, x, out=out, numeric_mode=nm)
    mojo_train.synchronize(numeric_mode=nm)
    mojo_train.add(bad, x, numeric_mode=nm)     # call 1 refused
    with pytest.raises(ValueError, match=r"mt_add refused \(deferred: call 1 of the 1024 queued"):
        for _ in range(1024):
            mojo_train.add(x, x, out=out, numeric_mode=nm)
