"""SiLU and the residual add (native/contracts/elementwise.md).

Contract under test: add is one correctly rounded float32 sum, subnormal sums kept; SiLU and
its gradient are the stated formulas through the pinned exp, within the torch comparison
bound of tests/tolerances.py of torch's float64 values, and never NaN for finite inputs
however large; the bytes do not depend on the thread count or launch geometry; a NaN or inf
in any input is refused by name (in place: nothing written); sizes and dtypes are checked.
"""
import array
import math

import pytest

import mojo_train
from mojo_train import DeviceArray
from mojo_train import elementwise as ew
from mojo_train._native import ffi

from _helpers import bits, f32, f32_array, raw, wide_array

FEATURE_ELEMENTWISE = 1 << 13


@pytest.fixture
def elt_mode(mode):
    if not mode.backend.has(FEATURE_ELEMENTWISE):
        pytest.skip("SiLU and add are not built into this library")
    return mode


@pytest.fixture
def elt_identical(identical):
    if not identical.backend.has(FEATURE_ELEMENTWISE):
        pytest.skip("SiLU and add are not built into this library")
    return identical


def floats(a):
    return array.array("f", raw(a.to_host() if isinstance(a, DeviceArray) else a))


def _inputs(n, seed):
    """Values over many binades and both signs, plus the edges of SiLU's ranges."""
    x = wide_array(n, seed, -30, 7)
    edges = [0.0, -0.0, 1.0, -1.0, -1.2784645, 88.72, -88.72, -88.73, -103.98, -104.0, 120.0, -120.0,
             3e38, -3e38, 2.0**-149, -2.0**-149, 2.0**-126, 1e-30, -1e-30, 17.0, -17.0]
    x[:len(edges)] = array.array("f", edges)
    return x


# ---- add --------------------------------------------------------------------------------------
@pytest.mark.parametrize("low_exp, high_exp", [(-14, 4), (-149, -120), (100, 127)])
def test_add_is_the_correctly_rounded_float32_sum(elt_mode, low_exp, high_exp):
    if elt_mode.has("approximate"):
        pytest.skip("IEEE-exact arithmetic is not this tier's promise (approximate division, flushed subnormals)")
    n = 20011
    a, b = wide_array(n, 1, low_exp, high_exp), wide_array(n, 2, low_exp, high_exp)
    out = floats(ew.add(a, b, numeric_mode=elt_mode.tier))
    for i in range(n):
        s = a[i] + b[i]
        want = f32(s) if abs(s) < 3.4028235677973366e38 else math.copysign(math.inf, s)
        assert bits(out[i]) == bits(want), (i, a[i], b[i], out[i])


def test_add_keeps_the_first_inputs_shape_and_accepts_other_shapes_of_one_size(elt_mode):
    a = mojo_train.Array.from_list([1.0] * 6).reshape(2, 3)
    out = ew.add(a, array.array("f", [2.0] * 6), numeric_mode=elt_mode.tier)
    assert out.shape == (2, 3) and floats(out) == array.array("f", [3.0] * 6)


# ---- SiLU against torch float64 -------------------------------------------------------------
def _torch_silu64(x, dy):
    torch = pytest.importorskip("torch")
    t = torch.tensor(list(x), dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.silu(t)
    (dx,) = torch.autograd.grad(y, t, torch.tensor(list(dy), dtype=torch.float64))
    return y.detach().tolist(), dx.tolist()


@pytest.mark.parametrize("seed", [3, 4])
def test_silu_and_its_gradient_are_within_the_torch_bound_of_float64(elt_identical, seed):
    tolerances = pytest.importorskip("tolerances")
    n = 30011
    x, dy = _inputs(n, seed), f32_array(n, seed + 10, -2.0, 2.0)
    y = floats(ew.silu_forward(x, numeric_mode=elt_identical.tier))
    dx = floats(ew.silu_backward(dy, x, numeric_mode=elt_identical.tier))
    y64, dx64 = _torch_silu64(x, dy)
    # unit: the natural scale -- 1 for dx (|silu'| <= 1.1, |dy| <= 2), max(1, |x|) for y
    tolerances.assert_close_to_reference(y, y64, "silu_forward", unit=1.0)
    tolerances.assert_close_to_reference(dx, dx64, "silu_backward", unit=1.0)


def test_silu_is_finite_for_every_finite_input_and_exact_where_it_saturates(elt_mode):
    x = array.array("f", [-3.4e38, -1e30, -120.0, -88.8, 88.8, 120.0, 1e30, 3.4e38])
    y = floats(ew.silu_forward(x, numeric_mode=elt_mode.tier))
    dx = floats(ew.silu_backward(array.array("f", [1.0] * len(x)), x, numeric_mode=elt_mode.tier))
    assert all(math.isfinite(v) for v in list(y) + list(dx))
    assert [bits(v) for v in y[:4]] == [0x80000000] * 4        # -0.0: exp(-x) overflowed, x / inf
    assert list(y[5:]) == list(x[5:])                           # sigmoid rounds to 1
    assert list(dx[5:]) == [1.0] * 3 and list(dx[:3]) == [0.0] * 3


def test_silu_of_subnormals_halves_them_onto_the_grid(elt_mode):
    if elt_mode.has("approximate"):
        pytest.skip("IEEE-exact arithmetic is not this tier's promise (approximate division, flushed subnormals)")
    x = array.array("f", [2.0**-149, 3 * 2.0**-149, -5 * 2.0**-149, 2.0**-127])
    y = floats(ew.silu_forward(x, numeric_mode=elt_mode.tier))
    # ties to even: 2^-150 -> 0, 1.5 * 2^-148 -> 2^-148, -2.5 * 2^-149 -> -2 * 2^-149
    assert [bits(v) for v in y] == [0, 2, 0x80000002, bits(2.0**-128)]


def test_silu_gradient_uses_one_minus_s_from_exp_for_positive_x(elt_identical):
    # s = 1 / (1 + e) with e < 2^-24 rounds to 1: 1 - s would be 0 and the gradient exactly 1;
    # with t = e * s the gradient keeps x * e (here about 2e-7 for x = 17.5)
    x = array.array("f", [17.5])
    dx = floats(ew.silu_backward(array.array("f", [1.0]), x, numeric_mode=elt_identical.tier))[0]
    e = math.exp(-17.5)
    exact = (1 + e * (1 + 17.5)) / (1 + e) ** 2                 # s (1 + x (1 - s))
    assert dx != 1.0 and abs(dx - exact) <= 2.0**-23


# ---- determinism and placement ------------------------------------------------------------
def test_the_bytes_do_not_depend_on_the_thread_count_or_launch_geometry(elt_mode):
    lib = elt_mode.backend.lib
    n = 2**18 + 3
    x, dy = _inputs(n, 5), f32_array(n, 6)
    geometry = ffi.new("int32_t[2]")
    assert lib.mt_launch_geometry(geometry) == 0
    before = geometry[0]
    results = []
    try:
        for threads, blocks in ((1, 1), (2, 3), (3, 0), (64, 7), (256, 0)):
            if lib.mt_set_launch_geometry(threads, blocks) != 0:
                continue
            t = elt_mode.tier
            results.append((raw(ew.silu_forward(x, numeric_mode=t)), raw(ew.silu_backward(dy, x, numeric_mode=t)),
                            raw(ew.add(x, dy, numeric_mode=t))))
    finally:
        assert lib.mt_set_launch_geometry(before, 0) == 0
    assert len(results) >= 2 and all(r == results[0] for r in results)


def test_unaligned_views_give_the_same_bytes(elt_mode):
    x, dy = _inputs(4099, 7), f32_array(4099, 8)
    t = elt_mode.tier
    whole = [floats(ew.silu_forward(x, numeric_mode=t)), floats(ew.silu_backward(dy, x, numeric_mode=t))]
    part = [floats(ew.silu_forward(memoryview(x)[1:], numeric_mode=t)),
            floats(ew.silu_backward(memoryview(dy)[1:], memoryview(x)[1:], numeric_mode=t))]
    assert raw(part[0]) == raw(whole[0][1:]) and raw(part[1]) == raw(whole[1][1:])


def test_device_inputs_give_device_outputs_with_the_host_bytes(elt_mode):
    if not elt_mode.has("device"):
        pytest.skip("the loaded vendor takes no device buffers")
    x, dy = _inputs(5003, 9), f32_array(5003, 10)
    t = elt_mode.tier
    dx, ddy = mojo_train.to_device(x, numeric_mode=t), mojo_train.to_device(dy, numeric_mode=t)
    for dev, hst in ((ew.silu_forward(dx, numeric_mode=t), ew.silu_forward(x, numeric_mode=t)),
                     (ew.silu_backward(ddy, dx, numeric_mode=t), ew.silu_backward(dy, x, numeric_mode=t)),
                     (ew.add(dx, ddy, numeric_mode=t), ew.add(x, dy, numeric_mode=t))):
        assert isinstance(dev, DeviceArray) and raw(dev.to_host()) == raw(hst)
    with pytest.raises(ValueError, match=r"add: a on the device but b on the host"):
        ew.add(dx, dy, numeric_mode=t)


# ---- out= and refusals -------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["silu_forward", "silu_backward", "add"])
def test_out_may_be_an_input(elt_mode, op):
    t = elt_mode.tier
    x, dy = _inputs(1031, 11), f32_array(1031, 12)
    call = {"silu_forward": lambda out: ew.silu_forward(x, out=out, numeric_mode=t),
            "silu_backward": lambda out: ew.silu_backward(dy, x, out=out, numeric_mode=t),
            "add": lambda out: ew.add(x, dy, out=out, numeric_mode=t)}[op]
    expected = raw(call(None))
    assert call(x) is x and raw(x) == expected


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("op, names", [("silu_forward", "x"), ("silu_backward", "dy or x"), ("add", "a or b")])
def test_a_nonfinite_input_is_refused_by_name(elt_mode, op, names, bad):
    t = elt_mode.tier
    for which in range(1 if op == "silu_forward" else 2):
        ins = [f32_array(3001, 13), f32_array(3001, 14)]
        ins[which][2999] = bad
        before = [raw(v) for v in ins]
        args = ins[:1] if op == "silu_forward" else ins
        with pytest.raises(ValueError, match=r"mojo_train\.%s: %s holds NaN or inf; refused" % (op, names)):
            getattr(ew, op)(*args, numeric_mode=t)
        assert [raw(v) for v in ins] == before
        with pytest.raises(ValueError, match=r"refused before anything was written"):
            getattr(ew, op)(*args, out=ins[1 - which] if len(args) == 2 else ins[0], numeric_mode=t)
        assert [raw(v) for v in ins] == before


def test_sizes_dtypes_and_out_are_checked_by_name(elt_mode):
    t = elt_mode.tier
    one, two = array.array("f", [1.0]), array.array("f", [1.0, 2.0])
    with pytest.raises(ValueError, match=r"add: b has 2 elements, a has 1"):
        ew.add(one, two, numeric_mode=t)
    with pytest.raises(ValueError, match=r"silu_backward: x has 2 elements, dy has 1"):
        ew.silu_backward(one, two, numeric_mode=t)
    with pytest.raises(TypeError, match=r"silu_forward: x has dtype float64"):
        ew.silu_forward(array.array("d", [1.0]), numeric_mode=t)
    with pytest.raises(ValueError, match=r"out has 2 elements, x has 1"):
        ew.silu_forward(one, out=two, numeric_mode=t)
    with pytest.raises(ValueError, match=r"out is written in place and must be writable"):
        ew.add(one, one, out=memoryview(array.array("f", [0.0])).toreadonly(), numeric_mode=t)


def test_empty_inputs_give_empty_outputs(elt_mode):
    e = array.array("f")
    assert ew.add(e, e, numeric_mode=elt_mode.tier).size == 0
    assert ew.silu_backward(e, e, numeric_mode=elt_mode.tier).size == 0


def test_the_c_abi_refuses_null_and_negative_sizes(elt_mode):
    lib = elt_mode.backend.lib
    buf = array.array("f", [1.0, 2.0])
    p = ffi.cast("float *", ffi.from_buffer(buf))
    assert lib.mt_silu_forward(ffi.NULL, p, 2) == 1 and b"y is NULL" in ffi.string(lib.mt_last_error())
    assert lib.mt_silu_backward(p, p, ffi.NULL, 2) == 1 and b"x is NULL" in ffi.string(lib.mt_last_error())
    assert lib.mt_add(p, p, p, -1) == 1 and b"n must be >= 0" in ffi.string(lib.mt_last_error())
    assert list(buf) == [1.0, 2.0]
