"""The maps' ``flags`` (mojo_train.h, enum mt_map_flags): MT_MAP_OUT_FRESH fuses the
finiteness check into the one pass when the output is fresh and no input.

Contract under test (mojo_train.h above mt_dropout_forward; elementwise.md; random.md): for
SiLU, GELU (both approximations), add and dropout, forward and backward, on every vendor and
side (host, device):
- a fresh output gets the bytes the checked call writes, at every length (blocks of the CPU's
  fused check are 4096 floats; the GPU's float4 groups and tails);
- a NaN or inf anywhere -- the first element, the last, inside a later block, in the second
  input only -- is refused with the input's name, no input written; a fresh output that is an
  input itself (in place) is checked first, so nothing is written; a host output of a GPU
  vendor is a device twin downloaded only on success, so it is untouched too;
- flag bits other than MT_MAP_OUT_FRESH are refused, naming ``flags``, before anything is read;
- the Python API declares its own new outputs fresh and a caller's ``out=`` not: a refusal
  without ``out=`` says the output is undefined (on the cpu vendor; a GPU vendor's host output
  is a device twin never downloaded, so nothing was written), one with ``out=`` that nothing
  was written.
"""
import array

import pytest

import mojo_train
from mojo_train import DeviceArray, Generator, _native
from mojo_train._native import ffi

from _helpers import EINVAL, ENONFINITE, f32_array, raw

FRESH = _native.MAP_FLAGS["out_fresh"]
LENGTHS = [1, 3, 4, 5, 4095, 4096, 4097, 3 * 4096 + 7, 70001]


def _maps():
    """(name, C function, number of float inputs, extra arguments before n, after n)."""
    return [("silu_forward", "mt_silu_forward", 1, (), ()),
            ("silu_backward", "mt_silu_backward", 2, (), ()),
            ("add", "mt_add", 2, (), ()),
            ("gelu_forward none", "mt_gelu_forward", 1, (), (0,)),
            ("gelu_forward tanh", "mt_gelu_forward", 1, (), (1,)),
            ("gelu_backward none", "mt_gelu_backward", 2, (), (0,)),
            ("gelu_backward tanh", "mt_gelu_backward", 2, (), (1,)),
            ("dropout_forward", "mt_dropout_forward", 1, (0.25, 7, 3, 5), ()),
            ("dropout_backward", "mt_dropout_backward", 1, (0.5, 7, 4, 2), ())]


MAPS = _maps()
IDS = [m[0] for m in MAPS]


@pytest.fixture
def map_mode(elementwise_mode, request):
    """Every loadable vendor x numeric mode with elementwise ops (and random, for dropout)."""
    name = request.node.callspec.params.get("name", "")
    if name.startswith("dropout") and not elementwise_mode.has("random"):
        pytest.skip("this library has no random (mt_features)")
    return elementwise_mode


def _sides(mode):
    return ("host", "device") if mode.has("device_buffers") else ("host",)


def _on(side, buf, mode):
    return mojo_train.to_device(buf, numeric_mode=mode.numeric_mode) if side == "device" else buf


def _ptr(buf):
    return ffi.cast("float *", buf.ptr if isinstance(buf, DeviceArray) else ffi.from_buffer(buf))


def _bytes(buf):
    return raw(buf.to_host() if isinstance(buf, DeviceArray) else buf)


def _call(mode, cfn, ins, out, n, before_n, after_n, flags):
    """The C map on out and the inputs (dropout: y, x, p, seed, stream, offset, n, flags)."""
    lib = mode.backend.lib
    ptrs = [_ptr(b) for b in ins]
    if cfn.startswith("mt_dropout"):
        return getattr(lib, cfn)(_ptr(out), ptrs[0], *before_n, n, flags)
    return getattr(lib, cfn)(_ptr(out), *ptrs, n, *after_n, flags)


@pytest.mark.parametrize("name, cfn, arity, before_n, after_n", MAPS, ids=IDS)
def test_a_fresh_output_gets_the_checked_calls_bytes(map_mode, name, cfn, arity, before_n, after_n):
    for side in _sides(map_mode):
        for n in LENGTHS:
            ins = [_on(side, f32_array(n, 11 * n + k, -6.0, 6.0), map_mode) for k in range(arity)]
            checked = _on(side, array.array("f", [0.0]) * n, map_mode)
            fresh = _on(side, array.array("f", [7.0]) * n, map_mode)
            assert _call(map_mode, cfn, ins, checked, n, before_n, after_n, 0) == 0
            assert _call(map_mode, cfn, ins, fresh, n, before_n, after_n, FRESH) == 0
            assert _bytes(fresh) == _bytes(checked), (side, n)


def _poisoned(n, where, value, seed):
    a = f32_array(n, seed, -3.0, 3.0)
    a[where] = value
    return a


@pytest.mark.parametrize("name, cfn, arity, before_n, after_n", MAPS, ids=IDS)
def test_a_nan_or_inf_anywhere_is_refused_naming_the_input_and_no_input_is_written(map_mode, name, cfn, arity,
                                                                                     before_n, after_n):
    lib, n = map_mode.backend.lib, 3 * 4096 + 7
    names = {1: ["x" if "forward" in name else "dy"], 2: ["a", "b"] if name == "add" else ["dy", "x"]}[arity]
    for side in _sides(map_mode):
        for which in range(arity):
            for where, value in ((0, float("nan")), (n - 1, float("inf")), (2 * 4096 + 5, float("-inf"))):
                ins = [_poisoned(n, where, value, 5) if k == which else f32_array(n, 6 + k, -3.0, 3.0)
                       for k in range(arity)]
                ins = [_on(side, b, map_mode) for b in ins]
                out = _on(side, array.array("f", [9.0]) * n, map_mode)
                before = [_bytes(b) for b in ins]
                assert _call(map_mode, cfn, ins, out, n, before_n, after_n, FRESH) == ENONFINITE
                message = ffi.string(lib.mt_last_error()).decode()
                assert message.startswith("%s holds NaN or inf; refused" % names[which]), message
                assert [_bytes(b) for b in ins] == before
                if side == "host" and map_mode.vendor != "cpu":       # a staged twin is never downloaded
                    assert _bytes(out) == raw(array.array("f", [9.0]) * n) and "before anything" in message


@pytest.mark.parametrize("name, cfn, arity, before_n, after_n", MAPS, ids=IDS)
def test_in_place_with_the_flag_is_still_checked_first(map_mode, name, cfn, arity, before_n, after_n):
    n = 5000
    for side in _sides(map_mode):
        x = _on(side, _poisoned(n, n - 1, float("nan"), 3), map_mode)
        others = [_on(side, f32_array(n, 4, -3.0, 3.0), map_mode) for _ in range(arity - 1)]
        before = _bytes(x)
        assert _call(map_mode, cfn, [x] + others, x, n, before_n, after_n, FRESH) == ENONFINITE
        assert "before anything was written" in ffi.string(map_mode.backend.lib.mt_last_error()).decode()
        assert _bytes(x) == before, side


@pytest.mark.parametrize("flags", [2, 3, 1 << 31])
@pytest.mark.parametrize("name, cfn, arity, before_n, after_n", MAPS, ids=IDS)
def test_unknown_flag_bits_are_refused_naming_flags(map_mode, name, cfn, arity, before_n, after_n, flags):
    n = 100
    ins = [f32_array(n, 1 + k) for k in range(arity)]
    out = array.array("f", [5.0]) * n
    assert _call(map_mode, cfn, ins, out, n, before_n, after_n, flags) == EINVAL
    assert ("flags 0x%x has unknown bits" % flags) in ffi.string(map_mode.backend.lib.mt_last_error()).decode()
    assert raw(out) == raw(array.array("f", [5.0]) * n)


def _python_calls(mode, x, y):
    m, g = mode.numeric_mode, Generator(3, numeric_mode=mode.numeric_mode)
    return [("x", lambda **kw: mojo_train.silu_forward(x, numeric_mode=m, **kw)),
            ("x", lambda **kw: mojo_train.gelu_backward(y, x, "tanh", numeric_mode=m, **kw)),
            ("b", lambda **kw: mojo_train.add(y, x, numeric_mode=m, **kw)),
            ("x", lambda **kw: g.dropout(x, 0.5, **kw)[0])]


def test_the_python_api_declares_its_own_outputs_fresh_and_a_callers_out_not(map_mode):
    """Seen through the refusal's words (the one observable difference): without out= the
    output was the call's own (undefined), with out= nothing was written, and out= is untouched."""
    n = 5000
    x, y = _poisoned(n, 4100, float("nan"), 8), f32_array(n, 9, -3.0, 3.0)
    # a GPU vendor's new host output is a device twin, never downloaded on a refusal: nothing written
    fresh_words = r"\(the output's contents are undefined" if map_mode.vendor == "cpu" else "before anything was written"
    for name, call in _python_calls(map_mode, x, y):
        with pytest.raises(ValueError, match=r"%s holds NaN or inf; refused %s" % (name, fresh_words)):
            call()
        out = array.array("f", [2.0]) * n
        with pytest.raises(ValueError, match=r"%s holds NaN or inf; refused before anything was written" % name):
            call(out=out)
        assert raw(out) == raw(array.array("f", [2.0]) * n)


@pytest.mark.parametrize("name, cfn, arity, before_n, after_n", MAPS, ids=IDS)
def test_threads_split_a_fused_map_and_its_refusal_alike(map_mode, name, cfn, arity, before_n, after_n):
    """Above the pool's inline size (65,536 elements) the fused pass runs on several threads:
    the same bytes as the checked call at 1 and 4 threads, and a NaN at a block's first or last
    element (4095, 4096) or deep in another thread's range is refused with the input named."""
    lib, n = map_mode.backend.lib, 70001
    if not map_mode.has("threads"):
        pytest.skip("the vendor has no thread pool")
    ins = [array.array("f", f32_array(4099, 31 + k, -6.0, 6.0)) * 18 for k in range(arity)]   # 73,782 >= n
    for buf in ins:
        del buf[n:]
    assert all(len(buf) == n for buf in ins)
    old = lib.mt_num_threads()
    try:
        outs = []
        for threads in (1, 4):
            assert lib.mt_set_num_threads(threads) == 0
            out = array.array("f", [0.0]) * n
            assert _call(map_mode, cfn, ins, out, n, before_n, after_n, FRESH) == 0
            outs.append(raw(out))
            checked = array.array("f", [0.0]) * n
            assert _call(map_mode, cfn, ins, checked, n, before_n, after_n, 0) == 0
            assert raw(checked) == outs[-1]
            for where in (4095, 4096, 60001):
                bad = array.array("f", ins[-1])
                bad[where] = float("nan")
                args = [bad if k == arity - 1 else ins[k] for k in range(arity)]
                before = [raw(b) for b in args]
                assert _call(map_mode, cfn, args, array.array("f", [0.0]) * n, n, before_n, after_n, FRESH) \
                    == ENONFINITE, (threads, where)
                assert [raw(b) for b in args] == before
        assert outs[0] == outs[1]
    finally:
        lib.mt_set_num_threads(old)
