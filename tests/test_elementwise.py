"""SiLU, GELU and the residual add (native/contracts/elementwise.md).

Contract under test: add is one correctly rounded float32 sum, subnormal sums kept; SiLU and
its gradient are the stated formulas through the pinned exp, within the torch comparison
bound of tests/tolerances.py of torch's float64 values, and never NaN for finite inputs
however large; GELU (approximate 'none' and 'tanh') likewise, within tolerances.py's GELU bound,
saturating to x and -0.0 where the contract says, an approximate other than 'none' or 'tanh'
refused by name writing nothing; the bytes do not depend on the thread count or launch geometry; a NaN or inf
in any input is refused by name and a refused call writes nothing (out= stays byte for byte
as it was); inputs and out= must have one shape (nothing is broadcast); out= is an input
itself (in place, the out-of-place bits) or disjoint from every input; dtypes are checked.
"""
import array
import functools
import itertools
import math
import os
import random
import re
import subprocess
import sys

import pytest

import mojo_train
from mojo_train import DeviceArray
from mojo_train import elementwise as ew
from mojo_train._native import ffi

from _helpers import EINVAL, REPO, bits, f32, f32_array, raw, skip_unless_gradual_underflow, wide_array
from mojo_train import Array
from _layer_helpers import assert_c_refusals_write_nothing, assert_nonfinite_refused, c_in, device_copy_at, \
    digests_over_thread_counts, mat, need_device, same_bits, values
from _layer_helpers import outputs_sha as sha



def floats(a):
    return array.array("f", raw(a.to_host() if isinstance(a, DeviceArray) else a))


_OPS = {"silu_forward": ("x",), "silu_backward": ("dy", "x"), "gelu_forward": ("x",), "gelu_backward": ("dy", "x"),
        "add": ("a", "b")}
SLOTS = [(op, slot) for op in sorted(_OPS) for slot in range(len(_OPS[op]))]


def _count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _re_shape(shape):
    return re.escape(repr(tuple(shape)))


def _sentinel(n):
    """n float32 slots holding a pattern no op writes: signalling-NaN bits and 0xDEADBEEF."""
    words = array.array("I", [0x7FA5A5A5, 0xDEADBEEF] * (n // 2 + 1))[:n]
    return array.array("f", words.tobytes())


@functools.lru_cache(maxsize=None)
def _base(n, seed):
    return f32_array(n, seed, -4.0, 4.0).tobytes()


def _fresh(n, seed):
    """A new float32 array of n finite values (the same values for the same n and seed)."""
    return array.array("f", _base(n, seed))


def _sides(mode):
    """Where the buffers of a call may live on this vendor: the host, and the device if any."""
    return ("host", "device") if mode.has("device_buffers") else ("host",)


def _on(side, buf, mode):
    return mojo_train.to_device(buf, numeric_mode=mode.numeric_mode) if side == "device" else buf


def _bytes(buf):
    return raw(buf.to_host() if isinstance(buf, DeviceArray) else buf)


def _inputs(n, seed):
    """Values over many binades and both signs, plus the edges of SiLU's ranges."""
    x = wide_array(n, seed, -30, 7)
    edges = [0.0, -0.0, 1.0, -1.0, -1.2784645, 88.72, -88.72, -88.73, -103.98, -104.0, 120.0, -120.0,
             3e38, -3e38, 2.0**-149, -2.0**-149, 2.0**-126, 1e-30, -1e-30, 17.0, -17.0]
    x[:len(edges)] = array.array("f", edges)
    return x


# ---- add --------------------------------------------------------------------------------------
@pytest.mark.parametrize("low_exp, high_exp", [(-14, 4), (-149, -120), (100, 127)])
def test_add_is_the_correctly_rounded_float32_sum(elementwise_mode, low_exp, high_exp):
    if low_exp < -126:
        skip_unless_gradual_underflow(elementwise_mode)
    elif elementwise_mode.has("approximate"):
        pytest.skip("IEEE-exact arithmetic is not this numeric mode's promise (approximate division, flushed subnormals)")
    n = 20011
    a, b = wide_array(n, 1, low_exp, high_exp), wide_array(n, 2, low_exp, high_exp)
    out = floats(ew.add(a, b, numeric_mode=elementwise_mode.numeric_mode))
    for i in range(n):
        s = a[i] + b[i]
        want = f32(s) if abs(s) < 3.4028235677973366e38 else math.copysign(math.inf, s)
        assert bits(out[i]) == bits(want), (i, a[i], b[i], out[i])


def test_add_of_one_shape_returns_that_shape(elementwise_mode):
    a = mojo_train.Array.from_list([1.0] * 6).reshape(2, 3)
    out = ew.add(a, mojo_train.Array.from_list([2.0] * 6).reshape(2, 3), numeric_mode=elementwise_mode.numeric_mode)
    assert out.shape == (2, 3) and floats(out) == array.array("f", [3.0] * 6)


@pytest.mark.parametrize("op, shapes", [("add", ((5, 1), (5,))), ("add", ((2, 3), (6,))), ("add", ((2, 3), (3, 2))),
                                        ("silu_backward", ((5,), (5, 1))), ("silu_backward", ((1, 4), (4,)))])
def test_inputs_of_differing_shapes_are_refused_even_of_one_element_count(elementwise_mode, op, shapes):
    names = {"add": ("a", "b"), "silu_backward": ("dy", "x")}[op]
    ins = [mojo_train.Array.from_list([1.0] * _count(sh)).reshape(*sh) for sh in shapes]
    out = _sentinel(_count(shapes[0]))
    before = raw(out)
    want = r"mojo_train\.%s: %s has shape %s, %s has shape %s; %s does not broadcast: expand explicitly" % (
        op, names[0], _re_shape(shapes[0]), names[1], _re_shape(shapes[1]), op)
    with pytest.raises(ValueError, match=want):
        getattr(ew, op)(*ins, numeric_mode=elementwise_mode.numeric_mode)
    with pytest.raises(ValueError, match=want):
        getattr(ew, op)(*ins, out=out, numeric_mode=elementwise_mode.numeric_mode)
    assert raw(out) == before


@pytest.mark.parametrize("op", sorted(_OPS))
def test_out_of_another_shape_than_the_result_is_refused_and_left_alone(elementwise_mode, op):
    ins = [mojo_train.Array.from_list([0.5] * 6).reshape(2, 3) for _ in _OPS[op]]
    for shape in ((6,), (3, 2), (2, 3, 1)):
        out = array.array("f", raw(_sentinel(6)))
        view = memoryview(out).cast("B").cast("f", shape)
        before = raw(out)
        with pytest.raises(ValueError, match=r"mojo_train\.%s: out has shape %s; the result's shape is \(2, 3\)"
                           % (op, _re_shape(shape))):
            getattr(ew, op)(*ins, out=view, numeric_mode=elementwise_mode.numeric_mode)
        assert raw(out) == before


# ---- SiLU against torch float64 -------------------------------------------------------------
def _torch_silu64(x, dy):
    torch = pytest.importorskip("torch")
    t = torch.tensor(list(x), dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.silu(t)
    (dx,) = torch.autograd.grad(y, t, torch.tensor(list(dy), dtype=torch.float64))
    return y.detach().tolist(), dx.tolist()


@pytest.mark.parametrize("seed", [3, 4])
def test_silu_and_its_gradient_are_within_the_torch_bound_of_float64(elementwise_identical, seed):
    tolerances = pytest.importorskip("tolerances")
    n = 30011
    x, dy = _inputs(n, seed), f32_array(n, seed + 10, -2.0, 2.0)
    y = floats(ew.silu_forward(x, numeric_mode=elementwise_identical.numeric_mode))
    dx = floats(ew.silu_backward(dy, x, numeric_mode=elementwise_identical.numeric_mode))
    y64, dx64 = _torch_silu64(x, dy)
    # unit: the natural scale -- 1 for dx (|silu'| <= 1.1, |dy| <= 2), max(1, |x|) for y
    tolerances.assert_close_to_reference(y, y64, "silu_forward", unit=1.0)
    tolerances.assert_close_to_reference(dx, dx64, "silu_backward", unit=1.0)


def test_silu_is_finite_for_every_finite_input_and_exact_where_it_saturates(elementwise_mode):
    x = array.array("f", [-3.4e38, -1e30, -120.0, -88.8, 88.8, 120.0, 1e30, 3.4e38])
    y = floats(ew.silu_forward(x, numeric_mode=elementwise_mode.numeric_mode))
    dx = floats(ew.silu_backward(array.array("f", [1.0] * len(x)), x, numeric_mode=elementwise_mode.numeric_mode))
    assert all(math.isfinite(v) for v in list(y) + list(dx))
    assert [bits(v) for v in y[:4]] == [0x80000000] * 4        # -0.0: exp(-x) overflowed, x / inf
    assert list(y[5:]) == list(x[5:])                           # sigmoid rounds to 1
    assert list(dx[5:]) == [1.0] * 3 and list(dx[:3]) == [0.0] * 3


def test_silu_of_subnormals_halves_them_onto_the_grid(elementwise_mode):
    skip_unless_gradual_underflow(elementwise_mode)
    x = array.array("f", [2.0**-149, 3 * 2.0**-149, -5 * 2.0**-149, 2.0**-127])
    y = floats(ew.silu_forward(x, numeric_mode=elementwise_mode.numeric_mode))
    # ties to even: 2^-150 -> 0, 1.5 * 2^-148 -> 2^-148, -2.5 * 2^-149 -> -2 * 2^-149
    assert [bits(v) for v in y] == [0, 2, 0x80000002, bits(2.0**-128)]


def test_silu_gradient_uses_one_minus_s_from_exp_for_positive_x(elementwise_identical):
    # s = 1 / (1 + e) with e < 2^-24 rounds to 1: 1 - s would be 0 and the gradient exactly 1;
    # with t = e * s the gradient keeps x * e (here about 2e-7 for x = 17.5)
    x = array.array("f", [17.5])
    dx = floats(ew.silu_backward(array.array("f", [1.0]), x, numeric_mode=elementwise_identical.numeric_mode))[0]
    e = math.exp(-17.5)
    exact = (1 + e * (1 + 17.5)) / (1 + e) ** 2                 # s (1 + x (1 - s))
    assert dx != 1.0 and abs(dx - exact) <= 2.0**-23


# ---- GELU against torch float64 --------------------------------------------------------------
GELU_APPROXIMATIONS = ("none", "tanh")


def _gelu_bytes(dy, x, numeric_mode):
    """The bytes of gelu_forward(x) and gelu_backward(dy, x), both approximations."""
    return tuple(raw(f(approximate)) for approximate in GELU_APPROXIMATIONS for f in (
        lambda a: ew.gelu_forward(x, a, numeric_mode=numeric_mode),
        lambda a: ew.gelu_backward(dy, x, a, numeric_mode=numeric_mode)))


def _gelu_inputs(n, seed):
    """_inputs' binades, a dense run over [-12, 12], and GELU's edges (saturation, overflow of x*x)."""
    x = _inputs(n, seed)
    dense = f32_array(n // 3, seed + 20, -12.0, 12.0)
    x[len(x) - len(dense):] = dense
    edges = [5.42039585, 5.42039633, -5.65685415, -5.65685463, -5.3, 5.0036, -5.1579, 0.97, -0.97, 14.5, -14.5, 6.98e12, -6.98e12,
             2.0**64, -2.0**64, 1.9e19, -1.9e19, 3.4e38, -3.4e38, 2.0**-127, -3 * 2.0**-149]
    x[30:30 + len(edges)] = array.array("f", edges)
    return x


def _torch_gelu(x, dy, approximate, dtype_name="float64"):
    torch = pytest.importorskip("torch")
    dtype = getattr(torch, dtype_name)
    t = torch.tensor(list(x), dtype=dtype, requires_grad=True)
    y = torch.nn.functional.gelu(t, approximate=approximate)
    (dx,) = torch.autograd.grad(y, t, torch.tensor(list(dy), dtype=dtype))
    return y.detach().tolist(), dx.tolist()


def _gelu_vs_torch(n, seed, approximate, numeric_mode, dtype_name=None):
    """{output: (got, ref64, unit)}: ours (numeric_mode) or torch's (dtype_name) against float64."""
    x, dy = _gelu_inputs(n, seed), f32_array(n, seed + 10, -2.0, 2.0)
    if dtype_name:
        y, dx = _torch_gelu(x, dy, approximate, dtype_name)
    else:
        y = floats(ew.gelu_forward(x, approximate, numeric_mode=numeric_mode))
        dx = floats(ew.gelu_backward(dy, x, approximate, numeric_mode=numeric_mode))
    y64, dx64 = _torch_gelu(x, dy, approximate)
    return {"y": (y, y64, [abs(v) for v in x]), "dx": (dx, dx64, [abs(v) for v in dy])}


@pytest.mark.parametrize("seed", [3, 4])
@pytest.mark.parametrize("approximate", GELU_APPROXIMATIONS)
def test_gelu_and_its_gradient_are_within_the_torch_gelu_bound_of_float64(elementwise_identical, approximate, seed):
    tolerances = pytest.importorskip("tolerances")
    for name, (got, ref, unit) in _gelu_vs_torch(30011, seed, approximate, elementwise_identical.numeric_mode).items():
        used, i = tolerances.bound_used(got, ref, unit, tolerances.gelu_bound)
        assert used <= 1.0, "gelu %s %s: %.3g of the bound at [%d]: ours %r, float64 %r" % (
            approximate, name, used, i, got[i], ref[i])


# (approximate, y = x from, y = -0.0 below minus): elementwise.md's figures
_GELU_SATURATION = [("none", 5.4204, 5.6569), ("tanh", 5.0036, 5.1579)]


@pytest.mark.parametrize("approximate, top, bottom", _GELU_SATURATION)
def test_gelu_is_finite_for_every_finite_input_and_exact_where_it_saturates(elementwise_mode, approximate, top,
                                                                            bottom):
    t = elementwise_mode.numeric_mode
    far = [20.0, 6.98e12, 2.0**64, 1e30, 3.4e38]          # pdf and 1 - tanh**2 are 0; x*x, x**3 overflow
    x = array.array("f", [top * 1.001] + far + [-bottom * 1.001] + [-v for v in far])
    y = floats(ew.gelu_forward(x, approximate, numeric_mode=t))
    dx = floats(ew.gelu_backward(array.array("f", [2.0] * len(x)), x, approximate, numeric_mode=t))
    half = len(far) + 1
    assert all(math.isfinite(v) for v in list(y) + list(dx))
    assert list(y[:half]) == list(x[:half])                       # 1 + erf (1 + tanh) rounds to 2
    assert [bits(v) for v in y[half:]] == [0x80000000] * half     # ... and to 0: -0.0
    assert list(dx[1:half]) == [2.0] * len(far)
    assert [bits(v) for v in dx[half + 1:]] == [0] * len(far)     # +0.0 (+0 + -0 = +0)


def test_gelu_backward_gives_each_element_the_same_bits_in_any_block(elementwise_mode):
    """An element's bits must not depend on its neighbours, nor on whether it falls in the
    vectorized loop or its remainder: blocks 0 and 1 hold the same inputs around the clamp
    (|x| = 5.657), the saturation (5.420) and far past them, block 1 one 20.0 more, and a tail of
    5 elements follows; each element is also computed alone. (Version 2's oracle switched exps by
    block; version 3 takes one path, and this keeps that true.)"""
    t = elementwise_mode.numeric_mode
    near = [5.6568542, -5.6568542, 5.65685463, -5.65685463, 5.42039585, 5.42039633, -5.3, -3.0, 0.25,
            0.0414, -0.49, -13.3, 13.5, 1e30]
    block = [near[i % len(near)] * (1.0 - (i % 7) * 1e-4) for i in range(1024)]
    x = array.array("f", block + block + block[:5])
    x[1024 + 17] = 20.0
    dy = array.array("f", [1.0 + (i % 1024 % 5) * 0.25 for i in range(len(x))])
    whole = [bits(v) for v in floats(ew.gelu_backward(dy, x, "none", numeric_mode=t))]
    same = [i for i in range(1024) if i != 17]
    assert [whole[i] for i in same] == [whole[1024 + i] for i in same]
    assert whole[2048:] == whole[:5]
    alone = [bits(floats(ew.gelu_backward(array.array("f", [dy[i]]), array.array("f", [x[i]]), "none",
                                          numeric_mode=t))[0]) for i in range(0, len(x), 7)]
    assert alone == whole[::7]


def test_gelu_gradient_drops_its_pdf_term_at_the_clamp(elementwise_mode):
    """'none' (elementwise.md v3): the pdf is +0 from |u| = 4 on (|x| >= 5.65685463), so dx jumps
    there by x * pdf, about 2.5e-7 |dy|: just inside, dy * (cdf + x * pdf) is -2.46e-7 (x < 0) and
    1 + 2^-22 (x > 0); at the clamp +0 and exactly dy. torch float64's dx just inside agrees
    within the GELU bound."""
    if elementwise_mode.has("approximate"):
        pytest.skip("IEEE-exact arithmetic is not this numeric mode's promise (approximate division, flushed subnormals)")
    x = array.array("f", [-5.6568542, -5.65685463, 5.6568542, 5.65685463])
    dx = floats(ew.gelu_backward(array.array("f", [1.0] * 4), x, "none",
                                 numeric_mode=elementwise_mode.numeric_mode))
    assert -2.6e-7 < dx[0] < -2.3e-7
    assert bits(dx[1]) == 0 and dx[3] == 1.0
    assert dx[2] == 1.0 + 2.0 ** -22


@pytest.mark.parametrize("approximate", GELU_APPROXIMATIONS)
def test_gelu_of_subnormals_halves_them_onto_the_grid(elementwise_mode, approximate):
    skip_unless_gradual_underflow(elementwise_mode)
    x = array.array("f", [2.0**-149, 3 * 2.0**-149, -5 * 2.0**-149, 2.0**-127, -0.0])
    y = floats(ew.gelu_forward(x, approximate, numeric_mode=elementwise_mode.numeric_mode))
    # (x * 0.5) ties to even, then times 1 + erf = 1 (1 + tanh = 1)
    assert [bits(v) for v in y] == [0, 2, 0x80000002, bits(2.0**-128), 0x80000000]


_BAD_APPROXIMATE = ["erf", "Tanh", "", None, 0, 1, b"none"]


@pytest.mark.parametrize("bad", _BAD_APPROXIMATE, ids=repr)
@pytest.mark.parametrize("op", ["gelu_forward", "gelu_backward"])
def test_gelu_refuses_an_approximate_other_than_none_or_tanh_by_name_writing_nothing(elementwise_mode, op, bad):
    ins = [_fresh(1000, 70 + k) for k in range(len(_OPS[op]))]
    out = _sentinel(1000)
    before = [raw(v) for v in ins + [out]]
    with pytest.raises(ValueError, match=r"^mojo_train\.%s: approximate must be 'none' or 'tanh', got %s$"
                       % (op, re.escape(repr(bad)))):
        getattr(ew, op)(*ins, bad, out=out, numeric_mode=elementwise_mode.numeric_mode)
    assert [raw(v) for v in ins + [out]] == before


@pytest.mark.parametrize("bad", [2, -1, 1 << 30])
def test_the_c_abi_refuses_an_approximate_other_than_0_or_1_writing_nothing(elementwise_mode, bad):
    lib, n = elementwise_mode.backend.lib, 1000
    x, dy, out = _fresh(n, 80), _fresh(n, 81), _sentinel(n)
    px, pdy, pout = (ffi.cast("float *", ffi.from_buffer(b)) for b in (x, dy, out))
    before = [raw(x), raw(dy), raw(out)]
    for rc in (lib.mt_gelu_forward(pout, px, n, bad, 0), lib.mt_gelu_backward(pout, pdy, px, n, bad, 0)):
        assert rc == EINVAL
        assert ffi.string(lib.mt_last_error()).decode().endswith(
            "approximate must be 0 (none) or 1 (tanh), got %d" % bad)
    assert [raw(x), raw(dy), raw(out)] == before


@pytest.mark.parametrize("approximate", GELU_APPROXIMATIONS)
def test_gelu_refuses_a_nonfinite_input_by_name_in_both_approximations(elementwise_mode, approximate):
    for op, slot in (("gelu_forward", 0), ("gelu_backward", 0), ("gelu_backward", 1)):
        ins = [_fresh(4099, 90 + k) for k in range(len(_OPS[op]))]
        ins[slot][4098] = math.nan
        out = _sentinel(4099)
        before = [raw(v) for v in ins + [out]]
        with pytest.raises(ValueError, match=r"mojo_train\.%s: %s holds NaN or inf; refused before anything was "
                                             r"written" % (op, _OPS[op][slot])):
            getattr(ew, op)(*ins, approximate, out=out, numeric_mode=elementwise_mode.numeric_mode)
        assert [raw(v) for v in ins + [out]] == before


def test_gelu_approximations_differ_and_default_to_none(elementwise_mode):
    t, x, dy = elementwise_mode.numeric_mode, _inputs(1000, 31), f32_array(1000, 32)
    assert raw(ew.gelu_forward(x, numeric_mode=t)) == raw(ew.gelu_forward(x, "none", numeric_mode=t))
    assert raw(ew.gelu_backward(dy, x, numeric_mode=t)) == raw(ew.gelu_backward(dy, x, "none", numeric_mode=t))
    assert raw(ew.gelu_forward(x, "tanh", numeric_mode=t)) != raw(ew.gelu_forward(x, numeric_mode=t))
    assert mojo_train.gelu_forward is ew.gelu_forward and mojo_train.gelu_backward is ew.gelu_backward


# ---- determinism and placement ------------------------------------------------------------
def test_the_bytes_do_not_depend_on_the_thread_count_or_launch_geometry(elementwise_mode):
    lib = elementwise_mode.backend.lib
    n = 2**18 + 3
    x, dy = _inputs(n, 5), f32_array(n, 6)
    before = lib.mt_num_threads()   # the threads later launches take (not the last launch's: 0 at first)
    results = []
    try:
        for threads, blocks in ((1, 1), (2, 3), (3, 0), (32, 1), (64, 7), (96, 5), (256, 0)):
            if lib.mt_set_launch_geometry(threads, blocks) != 0:
                continue
            t = elementwise_mode.numeric_mode
            results.append((raw(ew.silu_forward(x, numeric_mode=t)), raw(ew.silu_backward(dy, x, numeric_mode=t)),
                            raw(ew.add(x, dy, numeric_mode=t))) + _gelu_bytes(dy, x, t))
    finally:
        assert lib.mt_set_launch_geometry(before, 0) == 0
    assert len(results) >= 2 and all(r == results[0] for r in results)


def test_unaligned_views_give_the_same_bytes(elementwise_mode):
    x, dy = _inputs(4099, 7), f32_array(4099, 8)
    t = elementwise_mode.numeric_mode
    whole = [floats(ew.silu_forward(x, numeric_mode=t)), floats(ew.silu_backward(dy, x, numeric_mode=t))]
    part = [floats(ew.silu_forward(memoryview(x)[1:], numeric_mode=t)),
            floats(ew.silu_backward(memoryview(dy)[1:], memoryview(x)[1:], numeric_mode=t))]
    assert raw(part[0]) == raw(whole[0][1:]) and raw(part[1]) == raw(whole[1][1:])
    for whole, part in zip(_gelu_bytes(dy, x, t), _gelu_bytes(memoryview(dy)[1:], memoryview(x)[1:], t)):
        assert part == whole[4:]


def _silu_fast_range(per_binade, seed):
    """Floats whose float4 groups take SiLU's unguarded quotients on a GPU (every x with
    2^-64 <= |x| <= 64: native/cuda/mt_gpu_elementwise.cu's silu_fast): each binade's two ends
    and random mantissas, both signs, the range's own ends, shuffled; a multiple of 4 long."""
    rng = random.Random(seed)
    words = [0x1F800000, 0x42800000]
    for exponent in range(0x1F800000 >> 23, 0x42800000 >> 23):
        words += [exponent << 23, (exponent << 23) | 0x7FFFFF]
        words += [(exponent << 23) | rng.getrandbits(23) for _ in range(per_binade)]
    words += [w | 0x80000000 for w in words]
    rng.shuffle(words)
    words = words[:len(words) // 4 * 4]
    return array.array("f", array.array("I", words).tobytes())


def test_silu_fast_groups_give_the_per_element_bytes(elementwise_mode):
    """On a GPU a 16-byte aligned device buffer over this range takes the fast groups (the
    quotients without div.rn's guard; without the fused finiteness check of x) and one 4 bytes
    off the per-element IEEE path: forward and backward, new output and out=, the same bytes as
    each other and as the host call's (bench/silu_division_sweep.py runs every float of the range
    on a GPU). On the host both halves compare the vectorized loop with the unaligned one."""
    x = _silu_fast_range(24, 31)
    dy = _fresh(len(x), 32)
    t = elementwise_mode.numeric_mode
    host = [raw(ew.silu_forward(x, numeric_mode=t)), raw(ew.silu_backward(dy, x, numeric_mode=t))]
    shifted = [raw(ew.silu_forward(memoryview(x)[1:], numeric_mode=t)),
               raw(ew.silu_backward(memoryview(dy)[1:], memoryview(x)[1:], numeric_mode=t))]
    assert shifted == [h[4:] for h in host]
    if not elementwise_mode.has("device_buffers"):
        return
    xs, dys = [Array.from_list(list(v), "float32") for v in (x, dy)]
    for offset in (0, 4):       # 0: the fast groups; 4: the per-element path
        if offset:
            ux, udy, out = (device_copy_at(v, offset, t) for v in (xs, dys, xs))
        else:
            ux, udy = (mojo_train.to_device(v, numeric_mode=t) for v in (xs, dys))
            out = DeviceArray((len(x),), "float32", numeric_mode=t)
        assert raw(ew.silu_forward(ux, numeric_mode=t).to_host()) == host[0], offset
        assert raw(ew.silu_backward(udy, ux, numeric_mode=t).to_host()) == host[1], offset
        ew.silu_forward(ux, out=out, numeric_mode=t)
        assert raw(out.to_host()) == host[0], offset
        ew.silu_backward(udy, ux, out=out, numeric_mode=t)
        assert raw(out.to_host()) == host[1], offset


def test_device_inputs_give_device_outputs_with_the_host_bytes(elementwise_mode):
    if not elementwise_mode.has("device_buffers"):
        pytest.skip("the loaded vendor takes no device buffers")
    x, dy = _inputs(5003, 9), f32_array(5003, 10)
    t = elementwise_mode.numeric_mode
    dx, ddy = mojo_train.to_device(x, numeric_mode=t), mojo_train.to_device(dy, numeric_mode=t)
    for dev, hst in ((ew.silu_forward(dx, numeric_mode=t), ew.silu_forward(x, numeric_mode=t)),
                     (ew.silu_backward(ddy, dx, numeric_mode=t), ew.silu_backward(dy, x, numeric_mode=t)),
                     (ew.add(dx, ddy, numeric_mode=t), ew.add(x, dy, numeric_mode=t))):
        assert isinstance(dev, DeviceArray) and raw(dev.to_host()) == raw(hst)
    for approximate in GELU_APPROXIMATIONS:
        for dev, hst in ((ew.gelu_forward(dx, approximate, numeric_mode=t),
                          ew.gelu_forward(x, approximate, numeric_mode=t)),
                         (ew.gelu_backward(ddy, dx, approximate, numeric_mode=t),
                          ew.gelu_backward(dy, x, approximate, numeric_mode=t))):
            assert isinstance(dev, DeviceArray) and raw(dev.to_host()) == raw(hst), approximate
    with pytest.raises(ValueError, match=r"add: a on the device but b on the host"):
        ew.add(dx, dy, numeric_mode=t)


# ---- out= and refusals -------------------------------------------------------------------------
@pytest.mark.parametrize("op, slot", SLOTS)
def test_out_may_be_any_input_itself_and_gives_the_out_of_place_bits(elementwise_mode, op, slot):
    """At 1031 elements, and at 2^18 + 5, where CUDA's ring walk (GELU 'none''s, every map's under
    MOJO_TRAIN_MAP_RING=1) has whole spans of 8 tiles at 256 and at 512 threads a block."""
    t = elementwise_mode.numeric_mode
    for n, side in itertools.product((1031, 2**18 + 5), _sides(elementwise_mode)):
        ins = [_on(side, _inputs(n, 11) if k == 0 else f32_array(n, 12 + k), elementwise_mode)
               for k in range(len(_OPS[op]))]
        expected = _bytes(getattr(ew, op)(*ins, numeric_mode=t))
        assert getattr(ew, op)(*ins, out=ins[slot], numeric_mode=t) is ins[slot]
        assert _bytes(ins[slot]) == expected, (n, side)


@pytest.mark.parametrize("op, slot", SLOTS)
def test_out_viewing_exactly_an_inputs_memory_is_in_place(elementwise_mode, op, slot):
    ins = [_fresh(1000, 40 + k) for k in range(len(_OPS[op]))]
    expected = raw(getattr(ew, op)(*ins, numeric_mode=elementwise_mode.numeric_mode))
    getattr(ew, op)(*ins, out=memoryview(ins[slot]), numeric_mode=elementwise_mode.numeric_mode)
    assert raw(ins[slot]) == expected


# (n, position, value): sizes that take one, several and many ranges of the thread pool
_POISON = [(1, 0, math.nan), (1, 0, math.inf), (1000, 0, -math.inf), (1000, 500, math.nan), (1000, 999, math.inf),
           (100003, 0, math.inf), (100003, 50001, -math.inf), (100003, 100002, math.nan)]


@pytest.mark.parametrize("n, at, bad", _POISON)
@pytest.mark.parametrize("op, slot", SLOTS)
def test_a_nonfinite_input_is_refused_by_name_and_out_stays_byte_identical(elementwise_mode, op, slot, n, at, bad):
    name = _OPS[op][slot]
    for side in _sides(elementwise_mode):
        ins = [_fresh(n, 20 + k) for k in range(len(_OPS[op]))]
        ins[slot][at] = bad
        ins, out = [_on(side, v, elementwise_mode) for v in ins], _on(side, _sentinel(n), elementwise_mode)
        before = [_bytes(v) for v in ins + [out]]
        with pytest.raises(ValueError, match=r"mojo_train\.%s: %s holds NaN or inf; refused before anything was "
                                             r"written" % (op, name)):
            getattr(ew, op)(*ins, out=out, numeric_mode=elementwise_mode.numeric_mode)
        assert [_bytes(v) for v in ins + [out]] == before, side


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("op, slot", SLOTS)
def test_a_nonfinite_input_is_refused_in_place_without_writing(elementwise_mode, op, slot, bad):
    for target in range(len(_OPS[op])):                     # out is the poisoned input, or the other one
        ins = [_fresh(3001, 13 + k) for k in range(len(_OPS[op]))]
        ins[slot][2999] = bad
        before = [raw(v) for v in ins]
        with pytest.raises(ValueError, match=r"mojo_train\.%s: %s holds NaN or inf; refused before anything "
                                             r"was written" % (op, _OPS[op][slot])):
            getattr(ew, op)(*ins, out=ins[target], numeric_mode=elementwise_mode.numeric_mode)
        assert [raw(v) for v in ins] == before


@pytest.mark.parametrize("shift", [1, -1, 37, -999])
@pytest.mark.parametrize("op, slot", SLOTS)
def test_an_out_partly_overlapping_an_input_is_refused_naming_both(elementwise_mode, op, slot, shift):
    n, base = 1000, 1000
    store = _fresh(3000, 50)
    ins = [_fresh(n, 20 + k) for k in range(len(_OPS[op]))]
    ins[slot] = memoryview(store)[base:base + n]
    out = memoryview(store)[base + shift:base + shift + n]
    before = [raw(store)] + [raw(v) for v in ins]
    name = _OPS[op][slot]
    with pytest.raises(ValueError, match=r"mojo_train\.%s: out and %s overlap in memory without being the same "
                                         r"buffer \(out starts %d bytes %s %s\); pass %s itself as out"
                                         % (op, name, 4 * abs(shift), "after" if shift > 0 else "before", name, name)):
        getattr(ew, op)(*ins, out=out, numeric_mode=elementwise_mode.numeric_mode)
    assert [raw(store)] + [raw(v) for v in ins] == before


def _c_calls(p, q, n):
    """(C function, arguments, the two names its message must give) with out partly over an input."""
    return [("mt_silu_forward", (p + 1, p, n), "y and x"), ("mt_silu_forward", (p, p + 3, n), "y and x"),
            ("mt_silu_backward", (p + 1, p, q, n), "dx and dy"), ("mt_silu_backward", (p, q, p + 2, n), "dx and x"),
            ("mt_add", (p + 5, q, p, n), "out and b"), ("mt_add", (p + 1, p, p, n), "out and a"),
            ("mt_gelu_forward", (p + 1, p, n, 0), "y and x"), ("mt_gelu_forward", (p, p + 3, n, 1), "y and x"),
            ("mt_gelu_backward", (p + 1, p, q, n, 1), "dx and dy"),
            ("mt_gelu_backward", (p, q, p + 2, n, 0), "dx and x")]


def test_the_c_abi_refuses_an_output_partly_overlapping_an_input_and_writes_nothing(elementwise_mode):
    lib, n = elementwise_mode.backend.lib, 1000
    for side in _sides(elementwise_mode):
        store, other = _on(side, _fresh(n + 8, 60), elementwise_mode), _on(side, _fresh(n, 61), elementwise_mode)
        p, q = (ffi.cast("float *", b.ptr if side == "device" else ffi.from_buffer(b)) for b in (store, other))
        before = [_bytes(store), _bytes(other)]
        for fn, args, names in _c_calls(p, q, n):
            for flags in (0, 1):                  # a fresh output is checked for overlaps all the same
                assert getattr(lib, fn)(*args, flags) == EINVAL, (fn, side, flags)
                assert ("%s overlap without being the same buffer" % names) in ffi.string(lib.mt_last_error()).decode()
        assert [_bytes(store), _bytes(other)] == before, side
        assert lib.mt_add(p, p, q, n, 0) == 0 and lib.mt_silu_forward(p + 1, p + 1, n, 0) == 0   # in place


def test_sizes_dtypes_and_out_are_checked_by_name(elementwise_mode):
    t = elementwise_mode.numeric_mode
    one, two = array.array("f", [1.0]), array.array("f", [1.0, 2.0])
    with pytest.raises(ValueError, match=r"add: a has shape \(1,\), b has shape \(2,\)"):
        ew.add(one, two, numeric_mode=t)
    with pytest.raises(ValueError, match=r"silu_backward: dy has shape \(1,\), x has shape \(2,\)"):
        ew.silu_backward(one, two, numeric_mode=t)
    with pytest.raises(TypeError, match=r"silu_forward: x has dtype float64"):
        ew.silu_forward(array.array("d", [1.0]), numeric_mode=t)
    with pytest.raises(ValueError, match=r"silu_forward: out has shape \(2,\); the result's shape is \(1,\)"):
        ew.silu_forward(one, out=two, numeric_mode=t)
    with pytest.raises(ValueError, match=r"out is written in place and must be writable"):
        ew.add(one, one, out=memoryview(array.array("f", [0.0])).toreadonly(), numeric_mode=t)


def test_empty_inputs_give_empty_outputs(elementwise_mode):
    e = array.array("f")
    assert ew.add(e, e, numeric_mode=elementwise_mode.numeric_mode).size == 0
    assert ew.silu_backward(e, e, numeric_mode=elementwise_mode.numeric_mode).size == 0


def test_the_c_abi_refuses_null_and_negative_sizes(elementwise_mode):
    lib = elementwise_mode.backend.lib
    buf = array.array("f", [1.0, 2.0])
    p = ffi.cast("float *", ffi.from_buffer(buf))
    assert lib.mt_silu_forward(ffi.NULL, p, 2, 0) == EINVAL and b"y is NULL" in ffi.string(lib.mt_last_error())
    assert lib.mt_silu_backward(p, p, ffi.NULL, 2, 0) == EINVAL and b"x is NULL" in ffi.string(lib.mt_last_error())
    assert lib.mt_add(p, p, p, -1, 0) == EINVAL and b"n must be >= 0" in ffi.string(lib.mt_last_error())
    assert list(buf) == [1.0, 2.0]


# ---- ReLU ---------------------------------------------------------------------------------------

def test_relu_refuses_a_dy_of_another_shape_naming_it(elementwise_mode):
    with pytest.raises(ValueError) as info:
        ew.relu_backward(mat((3,), 1), mat((4,), 2), numeric_mode=elementwise_mode.numeric_mode)
    assert "mojo_train.relu_backward" in str(info.value) and "dy must have x's shape" in str(info.value)


def _uf(m, d):
    return ew.relu_forward(d["x"], numeric_mode=m)


def _ub(m, d):
    return ew.relu_backward(d["dy"], d["x"], numeric_mode=m)


RELU_NONFINITE = [("relu_forward", "x", _uf)] + [("relu_backward", arg, _ub) for arg in ("dy", "x")]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("i", range(len(RELU_NONFINITE)), ids=["%s %s" % c[:2] for c in RELU_NONFINITE])
def test_relu_refuses_a_nonfinite_input_by_name_and_inputs_are_untouched(elementwise_mode, i, bad):
    d = {"x": mat((37, 300), 5), "dy": mat((37, 300), 7)}
    assert_nonfinite_refused(*RELU_NONFINITE[i], elementwise_mode.numeric_mode, d, bad)


def test_relu_c_entries_refuse_bad_sizes_and_pointers_writing_nothing(elementwise_mode):
    lib, x = elementwise_mode.backend.lib, mat((6, 4), 5)
    assert_c_refusals_write_nothing(lib, [
        ("n must be >= 0", lambda o: lib.mt_relu_forward(o[0], c_in(x), -1)),
        ("x is NULL", lambda o: lib.mt_relu_forward(o[0], ffi.NULL, 24)),
        ("dy is NULL", lambda o: lib.mt_relu_backward(o[0], ffi.NULL, c_in(x), 24)),
    ])


def test_relu_keeps_positives_and_gives_positive_zero_elsewhere(elementwise_mode):
    skip_unless_gradual_underflow(elementwise_mode)   # x > 0 of a subnormal reads it flushed under the rule
    tiny = 2.0 ** -149
    xs = [-2.0, -0.0, 0.0, tiny, -tiny, 1.5, 3e38, -3e38, 2.0 ** -127]
    x = Array.from_list(xs, "float32")
    dy = Array.from_list([7.0, -1.0, 2.0, 3.0, 4.0, -5.0, 6.0, 8.0, -0.0], "float32")
    y = values(ew.relu_forward(x, numeric_mode=elementwise_mode.numeric_mode))
    dx = values(ew.relu_backward(dy, x, numeric_mode=elementwise_mode.numeric_mode))
    want_y = [0.0, 0.0, 0.0, tiny, 0.0, 1.5, f32(3e38), 0.0, 2.0 ** -127]
    want_dx = [0.0, 0.0, 0.0, 3.0, 0.0, -5.0, 6.0, 0.0, -0.0]
    if elementwise_mode.has("approximate"):
        # A library that flushes subnormals (MT_FEATURE_APPROXIMATE: a GPU's fast numeric mode) reads the
        # subnormal inputs 3 and 8 as zero: their outputs are then +0.0; the rest is exact.
        flushed = [3, 8]
        assert all(same_bits([y[i]], [0.0]) or same_bits([y[i]], [want_y[i]]) for i in flushed)
        assert same_bits([dx[3]], [0.0]) or same_bits([dx[3]], [3.0])
        assert dx[8] == 0.0
        keep = [i for i in range(len(xs)) if i not in flushed]
        y, want_y = [y[i] for i in keep], [want_y[i] for i in keep]
        dx, want_dx = [dx[i] for i in keep], [want_dx[i] for i in keep]
    assert same_bits(y, want_y)
    assert same_bits(dx, want_dx)
    shaped = ew.relu_forward(mat((2, 3, 4), 81), numeric_mode=elementwise_mode.numeric_mode)
    assert shaped.shape == (2, 3, 4)


def test_relu_outputs_do_not_depend_on_the_thread_count(elementwise_mode):
    x, dy = mat((300, 300), 97), mat((300, 300), 99)
    digest = lambda: sha(ew.relu_forward(x, numeric_mode=elementwise_mode.numeric_mode),  # noqa: E731
                         ew.relu_backward(dy, x, numeric_mode=elementwise_mode.numeric_mode))
    assert len(digests_over_thread_counts(elementwise_mode, digest)) == 1


@pytest.mark.parametrize("n", [1, 5, 4099])
def test_relu_on_device_buffers_off_16_byte_alignment_gives_the_host_bits(elementwise_identical, n):
    need_device(elementwise_identical)
    x, dy = mat((n,), 181, wide=True), mat((n,), 182)
    dev_x, dev_dy = device_copy_at(x, 4, "identical"), device_copy_at(dy, 4, "identical")
    assert sha(ew.relu_forward(dev_x, numeric_mode="identical")) == sha(ew.relu_forward(x, numeric_mode="identical"))
    assert sha(ew.relu_backward(dev_dy, dev_x, numeric_mode="identical")) == \
        sha(ew.relu_backward(dy, x, numeric_mode="identical"))


def _print_gelu_figures():
    """The GELU figures of tests/tolerances.py: the worst share of its bound used per output."""
    import tolerances
    for approximate in GELU_APPROXIMATIONS:
        for who, numeric_mode, dtype_name in (("identical", "identical", None), ("fast", "fast", None),
                                              ("torch float32", None, "float32")):
            worst = {"y": 0.0, "dx": 0.0}
            for seed in (3, 4):
                # torch float32 is NaN (tanh's gradient) or inf (erf's y at 3.4e38) beyond 2**64: left out;
                # subnormal x are left out too (y = x * 0.5 onto the grid uses 0.5 of the bound, for all)
                x = _gelu_inputs(30011, seed)
                keep = [i for i, v in enumerate(x)
                        if abs(v) >= 2.0**-125 and (dtype_name is None or abs(v) < 2.0**64)]
                for name, compared in _gelu_vs_torch(30011, seed, approximate, numeric_mode, dtype_name).items():
                    got, ref, unit = ([v[i] for i in keep] for v in compared)
                    worst[name] = max(worst[name], tolerances.bound_used(got, ref, unit, tolerances.gelu_bound)[0])
            print("gelu %s %-14s y %.3f  dx %.3f" % (approximate, who, worst["y"], worst["dx"]))


if __name__ == "__main__":
    _print_gelu_figures()


def test_the_silu_division_sweep_covers_its_range_once():
    """bench/silu_division_sweep.py's chunks: consecutive, from 2^-64's bits to 64's, each float
    once, at any chunk size (the GPU proof of the fast groups rests on it)."""
    sys.path.insert(0, os.path.join(REPO, "bench"))
    import silu_division_sweep as sweep
    for chunk in (1 << 26, 1 << 24, 12345):
        start = sweep.LO_BITS
        for first, count in sweep.chunks(chunk):
            assert first == start and 0 < count <= chunk
            start += count
        assert start == sweep.HI_BITS + 1
    assert (sweep.LO_BITS, sweep.HI_BITS) == (bits(2.0 ** -64), bits(64.0))


# ---- the ring walk (GELU 'none' by default; MOJO_TRAIN_MAP_RING=1 every map, 0 none) -------------
_RING_TESTS = ("bytes_do_not_depend_on_the_thread_count or unaligned_views or silu_fast_groups or device_inputs "
               "or out_may_be_any_input or out_viewing_exactly or nonfinite_input_is_refused or (gelu and not float64)")

_RING_GEOMETRY = """
import sys
import mojo_train
from mojo_train import elementwise as ew
from mojo_train._native import ffi, load
t = sys.argv[1]
lib = load(t, sys.argv[2]).lib
x = mojo_train.Generator(1, numeric_mode=t).uniform((1 << 22,), -4.0, 4.0)
seen = ffi.new("int32_t[2]")
for call in (lambda: ew.silu_forward(x, numeric_mode=t), lambda: ew.gelu_forward(x, numeric_mode=t),
             lambda: ew.gelu_backward(x, x, numeric_mode=t), lambda: ew.gelu_forward(x, "tanh", numeric_mode=t)):
    call()
    assert lib.mt_launch_geometry(seen) == 0
    print(seen[0], seen[1])
"""


def _ring_geometry(mode, ring):
    """(threads a block, [blocks]) of a 2^22 SiLU, GELU 'none', its gradient and GELU 'tanh'
    on CUDA, the blocks in that order, with MOJO_TRAIN_MAP_RING set to `ring` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != "MOJO_TRAIN_MAP_RING"}
    if ring is not None:
        env["MOJO_TRAIN_MAP_RING"] = ring
    seen = subprocess.run([sys.executable, "-c", _RING_GEOMETRY, mode, "cuda"], env=env, capture_output=True,
                          text=True, timeout=300)
    assert seen.returncode == 0, seen.stderr[-3000:]
    launches = [tuple(map(int, line.split())) for line in seen.stdout.strip().splitlines()]
    assert len(launches) == 4 and len({threads for threads, _ in launches}) == 1, seen.stdout
    return launches[0][0], [blocks for _, blocks in launches]


def _ring_subset(elementwise_mode, ring):
    env = dict(os.environ, MOJO_TRAIN_MAP_RING=ring, MOJO_TRAIN_VENDOR=elementwise_mode.vendor,
               MOJO_TRAIN_TEST_NUMERIC_MODES=elementwise_mode.numeric_mode)
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                          os.path.abspath(__file__), "-k", _RING_TESTS], env=env, cwd=os.path.dirname(__file__),
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    passed = re.search(r"(\d+) passed", out.stdout)
    assert passed and int(passed.group(1)) >= 40 and "failed" not in out.stdout, out.stdout[-2000:]


def test_the_ring_walk_gives_the_same_bits_and_refuses_without_writing(elementwise_mode):
    """MOJO_TRAIN_MAP_RING (read once, so in processes of their own) puts every CUDA map (SiLU,
    its gradient, add, GELU) on the ring walk of native/cuda/mt_gpu_elementwise.cu ("1": blocks
    of contiguous spans whose threads keep their next float4 groups in flight in a ring of
    registers) or none ("0": GELU 'none', the ring's by default, then takes the capped,
    unrolled walk). This file's tests of launch geometry (one block of 32 threads walks every
    group in one span; other capped grids lengthen the spans and shorten the last), unaligned
    views, the fast groups, device buffers, in place (with whole spans), refusals and GELU's bits
    run again under "1" and, on CUDA, under "0", in this mode. On CUDA a 2^22 call launches:
    with "1", SiLU fewer blocks than its groups over the block's threads (the lean launch's
    count) and every GELU as many as SiLU; unset, SiLU the lean count, GELU 'none' and its
    gradient the ring's, GELU 'tanh' what it launches with "0"; with "0", SiLU the lean count
    and every GELU the same count (the unrolled walk's). Other vendors read nothing of the
    variable: there the run under "1" repeats theirs."""
    _ring_subset(elementwise_mode, "1")
    if elementwise_mode.vendor != "cuda":
        return
    _ring_subset(elementwise_mode, "0")
    mode = elementwise_mode.numeric_mode
    threads, (silu, gelu, gelu_grad, tanh) = _ring_geometry(mode, "1")
    lean = (1 << 20) // threads
    assert silu < lean and gelu == gelu_grad == tanh == silu, (threads, silu, gelu, gelu_grad, tanh)
    ring = silu
    threads, (silu, gelu, gelu_grad, tanh) = _ring_geometry(mode, "0")
    assert silu == lean and gelu == gelu_grad == tanh, (threads, silu, gelu, gelu_grad, tanh)
    unrolled = gelu
    threads, (silu, gelu, gelu_grad, tanh) = _ring_geometry(mode, None)
    assert (silu, gelu, gelu_grad, tanh) == (lean, ring, ring, unrolled), (threads, silu, gelu, gelu_grad, tanh)
