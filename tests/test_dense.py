"""linear, RMSNorm, ReLU and mlp_inference_sessions through the public API (mojo_train.nn).

Contract under test: native/contracts/dense.md. Every refusal (wrong dtype, shape, size,
pointer, eps; a NaN or inf in any input, named) writes no output; the results' bytes do not
depend on the thread count or on the CPU's GEMM kernel (AVX-512, AVX2, scalar); in the
identical tier each GEMM output is the fma chain over its index in ascending order (replayed
here in exact rational arithmetic), contractions over rows (dweight, dbias) follow the token
rule -- per-leaf results combined by the pairwise tree, which is also the exactness of
gradient accumulation over aligned microbatches -- and RMSNorm is the contract's arithmetic
step by step; every tier stays within tests/tolerances.py's bound of torch in float64;
mlp_inference_sessions is the composition of the layers and ignores how rows are split.
``PYTHONPATH=. python tests/test_dense.py N`` prints the bound figures of tolerances.py.
"""
import hashlib
import math
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train import Array, nn
from mojo_train._native import ffi

import tolerances as tol
from _helpers import REPO, _lane_tree, _tree_fold, bits, f32, f32_array, fma32, wide_array

LEAF = 1024
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow])


@pytest.fixture
def dense(mode):
    if not mode.has("dense"):
        pytest.skip("this library has no dense layers (mt_features)")
    return mode


@pytest.fixture
def dense_identical(identical):
    if not identical.has("dense"):
        pytest.skip("this library has no dense layers (mt_features)")
    return identical


# ---- data -----------------------------------------------------------------------------------

def mat(shape, seed, low=-1.0, high=1.0, wide=False):
    """A float32 Array of ``shape`` drawn by Python's generator (wide: spread magnitudes)."""
    n = 1
    for d in shape:
        n *= d
    data = wide_array(n, seed) if wide else f32_array(n, seed, low, high)
    return Array.from_bytes(data.tobytes(), shape, "float32")


def flat(x):
    """The float values of an output (host or device), in C order."""
    if hasattr(x, "to_host"):
        x = x.to_host()
    return x.memview().cast("B").cast("f").tolist() if x.size else []


def rows_of(x, r0, r1):
    """A copy of rows r0..r1 of a 2-D Array."""
    width = x.shape[1]
    return Array.from_bytes(x.tobytes()[r0 * width * 4:r1 * width * 4], (r1 - r0, width), "float32")


def sha(*outputs):
    h = hashlib.sha256()
    for x in outputs:
        if x is not None:
            h.update((x.to_host() if hasattr(x, "to_host") else x).tobytes())
    return h.hexdigest()


def same_bits(xs, ys):
    return len(xs) == len(ys) and all(bits(x) == bits(y) for x, y in zip(xs, ys))


# ---- the contract replayed in Python -----------------------------------------------------------

def chain(us, vs):
    """acc = fma(u_p, v_p, acc) from +0.0 in ascending p, each fma rounded once."""
    acc = 0.0
    for u, v in zip(us, vs):
        acc = fma32(u, v, acc)
    return acc


def chunk_tree(step_terms):
    """The chunk tree of clip.md over terms (u_i, v_i) folded as fma(u, v, acc) per lane."""
    partials = []
    for c0 in range(0, len(step_terms), 4096):
        acc = [0.0] * 128
        for i, (u, v) in enumerate(step_terms[c0:c0 + 4096]):
            acc[i % 128] = fma32(u, v, acc[i % 128])
        partials.append(_lane_tree(acc))
    return _tree_fold(partials)


def ref_rms_row(x, w, dy, eps):
    """(y, dx, r) of one row by dense.md's RMSNorm, every step rounded to float32."""
    dimf = f32(float(len(x)))
    ss = chunk_tree([(v, v) for v in x])
    r = f32(1.0 / f32(math.sqrt(f32(f32(ss / dimf) + eps))))
    w = w or [1.0] * len(x)
    y = [f32(f32(v * r) * wi) for v, wi in zip(x, w)]
    if dy is None:
        return y, None, r
    g = [f32(d * wi) for d, wi in zip(dy, w)]
    c = chunk_tree(list(zip(g, x)))
    k = f32(f32(c / dimf) * f32(f32(r * r) * r))
    dx = [f32(f32(r * gi) - f32(k * v)) for gi, v in zip(g, x)]
    return y, dx, r


def token_tree(per_leaf):
    """Elementwise pairwise tree over per-leaf result lists."""
    return [_tree_fold(column) for column in zip(*per_leaf)]


# ---- refusals: the Python layer --------------------------------------------------------------

def _refusals():
    """(function, args, keywords, exception, text of the message)."""
    a, w, b, dc = mat((4, 3), 1), mat((5, 3), 2), mat((5,), 3), mat((4, 5), 4)
    x, g = mat((4, 6), 5), mat((6,), 6)
    w2, b2 = mat((2, 5), 7), mat((2,), 8)
    f64 = memoryview(bytearray(8 * 12)).cast("d", (4, 3))
    strided = memoryview(bytearray(4 * 24)).cast("f", (4, 6))[::2]
    lf, lb, rf, rb = mt.linear_forward, mt.linear_backward, mt.rms_norm_forward, mt.rms_norm_backward
    mlp = mt.mlp_inference_sessions
    return [
        (lf, (f64, w), {}, TypeError, "a has dtype float64"),
        (lf, (a, mat((5, 4), 2)), {}, ValueError, "K=3"),
        (lf, (a, mat((15,), 2)), {}, ValueError, "weight must be 2-D"),
        (lf, (a, w, mat((4,), 3)), {}, ValueError, "bias must have shape (5,)"),
        (lf, (mat((), 1), w), {}, ValueError, "at least one dimension"),
        (lf, (strided, mat((5, 6), 2)), {}, ValueError, "C-contiguous"),
        (lb, (mat((4, 4), 4), a, w), {}, ValueError, "dc must have shape (4, 5)"),
        (lb, (dc, a, w), {"need_bias_grad": 1}, TypeError, "need_bias_grad must be True or False"),
        (rf, (x, mat((5,), 6)), {}, ValueError, "weight must have shape (6,)"),
        (rf, (x, g, -1e-5), {}, ValueError, "eps must be finite and >= 0"),
        (rf, (x, g, float("nan")), {}, ValueError, "eps must be finite"),
        (rf, (x, g, 1e39), {}, ValueError, "eps must be finite"),
        (rf, (x, g, "1e-5"), {}, TypeError, "eps must be a real number"),
        (rf, (mat((3, 0), 1), None), {}, ValueError, "D must be >= 1"),
        (rb, (mat((4, 5), 1), x, g), {}, ValueError, "dy must have x's shape"),
        (nn.relu_backward, (mat((3,), 1), mat((4,), 2)), {}, ValueError, "dy must have x's shape"),
        (mlp, (a, w, b, w2, b2), {}, TypeError, "inputs must be a list"),
        (mlp, ([a, mat((2, 4), 9)], w, b, w2, b2), {}, ValueError, "inputs[1] is (2, 4) but weight1 takes width 3"),
        (mlp, ([a], w, b, mat((2, 4), 7), b2), {}, ValueError, "weight1 has hidden=5"),
        (mlp, ([a], w, b, w2, mat((3,), 8)), {}, ValueError, "bias2 must have shape (2,)"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("i", range(len(REFUSALS)), ids=["%s: %s" % (r[0].__name__, r[4]) for r in REFUSALS])
def test_a_bad_argument_is_refused_naming_it(dense, i):
    fn, args, kwargs, exc, text = REFUSALS[i]
    with pytest.raises(exc) as info:
        fn(*args, numeric_mode=dense.tier, **kwargs)
    assert "mojo_train.%s" % fn.__name__ in str(info.value) and text in str(info.value)


def _nonfinite_calls():
    """(op, argument, call(mode, poisoned inputs)) for every float input of every op."""
    def lf(m, d):
        return mt.linear_forward(d["a"], d["weight"], d["bias"], numeric_mode=m)

    def lb(m, d):
        return mt.linear_backward(d["dc"], d["a"], d["weight"], need_bias_grad=True, numeric_mode=m)

    def rf(m, d):
        return mt.rms_norm_forward(d["x"], d["w"], 1e-5, numeric_mode=m)

    def rb(m, d):
        return mt.rms_norm_backward(d["dy"], d["x"], d["w"], 1e-5, numeric_mode=m)

    def uf(m, d):
        return nn.relu_forward(d["x"], numeric_mode=m)

    def ub(m, d):
        return nn.relu_backward(d["dy"], d["x"], numeric_mode=m)

    return [("linear_forward", arg, lf) for arg in ("a", "weight", "bias")] + \
           [("linear_backward", arg, lb) for arg in ("dc", "a", "weight")] + \
           [("rms_norm_forward", arg, rf) for arg in ("x", "w")] + \
           [("rms_norm_backward", arg, rb) for arg in ("dy", "x", "w")] + \
           [("relu_forward", "x", uf)] + [("relu_backward", arg, ub) for arg in ("dy", "x")]


NONFINITE = _nonfinite_calls()


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("i", range(len(NONFINITE)), ids=["%s %s" % c[:2] for c in NONFINITE])
def test_a_nonfinite_input_is_refused_by_name_and_inputs_are_untouched(dense, i, bad):
    op, arg, call = NONFINITE[i]
    d = {"a": mat((37, 300), 1), "weight": mat((5, 300), 2), "bias": mat((5,), 3), "dc": mat((37, 5), 4),
         "x": mat((37, 300), 5), "w": mat((300,), 6), "dy": mat((37, 300), 7)}
    poisoned = d[arg].reshape(-1)
    poisoned[poisoned.size // 2] = float(bad)
    before = {k: v.tobytes() for k, v in d.items()}
    with pytest.raises(ValueError) as info:
        call(dense.tier, d)
    name = "weight" if arg == "w" else arg
    assert "%s holds NaN or inf" % name in str(info.value) and "mojo_train.%s" % op in str(info.value)
    assert {k: v.tobytes() for k, v in d.items()} == before


# ---- refusals: the C entries write nothing ---------------------------------------------------

SENTINEL = 1234.5


def _c_buffers(*sizes):
    return [ffi.new("float[]", [SENTINEL] * max(n, 1)) for n in sizes]


def _c_in(x):
    return ffi.cast("float *", x.address)


def _c_cases(lib, keep):
    """(text of the message, call(outputs)); the inputs stay alive in ``keep``."""
    keep += [mat(shape, seed) for seed, shape in enumerate(((6, 4), (3, 4), (3,), (6, 3), (6, 4), (4,), (6, 4)))]
    a, w, b, dc, x, g, dy = (_c_in(v) for v in keep)
    N, inf = ffi.NULL, float("inf")
    return [
        ("m must be >= 0", lambda o: lib.mt_linear_forward(o[0], a, w, N, -1, 3, 4)),
        ("k must be >= 0", lambda o: lib.mt_linear_forward(o[0], a, w, N, 6, 3, -4)),
        ("too large", lambda o: lib.mt_linear_forward(o[0], a, w, N, 2**40, 3, 2**40)),
        ("out is NULL", lambda o: lib.mt_linear_forward(N, a, w, N, 6, 3, 4)),
        ("a is NULL", lambda o: lib.mt_linear_forward(o[0], N, w, b, 6, 3, 4)),
        ("weight is NULL", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], dc, a, N, 6, 3, 4)),
        ("dc is NULL", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], N, a, w, 6, 3, 4)),
        ("n must be >= 0", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], dc, a, w, 6, -3, 4)),
        ("dim must be >= 1", lambda o: lib.mt_rms_norm_forward(o[0], x, g, 1e-5, 6, 0)),
        ("rows must be >= 0", lambda o: lib.mt_rms_norm_forward(o[0], x, g, 1e-5, -6, 4)),
        ("eps must be finite and >= 0", lambda o: lib.mt_rms_norm_forward(o[0], x, g, -1.0, 6, 4)),
        ("eps must be finite and >= 0", lambda o: lib.mt_rms_norm_backward(o[0], o[1], dy, x, g, inf, 6, 4)),
        ("y is NULL", lambda o: lib.mt_rms_norm_forward(N, x, g, 1e-5, 6, 4)),
        ("dweight was asked for but weight is NULL",
         lambda o: lib.mt_rms_norm_backward(o[0], o[1], dy, x, N, 1e-5, 6, 4)),
        ("dy is NULL", lambda o: lib.mt_rms_norm_backward(o[0], o[1], N, x, g, 1e-5, 6, 4)),
        ("n must be >= 0", lambda o: lib.mt_relu_forward(o[0], x, -1)),
        ("x is NULL", lambda o: lib.mt_relu_forward(o[0], N, 24)),
        ("dy is NULL", lambda o: lib.mt_relu_backward(o[0], N, x, 24)),
    ]


def test_the_c_entries_refuse_bad_sizes_pointers_and_eps_writing_nothing(dense):
    lib = dense.backend.lib
    keep = []
    for text, call in _c_cases(lib, keep):
        outs = _c_buffers(24, 24, 24)
        rc = call(outs)
        msg = ffi.string(lib.mt_last_error()).decode()
        assert rc == 1 and text in msg, (text, rc, msg)
        assert all(o[i] == SENTINEL for o in outs for i in range(24)), text


def test_the_c_entries_refuse_a_nonfinite_input_before_writing_any_output(dense):
    lib = dense.backend.lib
    a, w, b, dc = mat((6, 4), 1), mat((3, 4), 2), mat((3,), 3), mat((6, 3), 4)
    wr = w.reshape(-1)
    wr[11] = float("inf")
    outs = _c_buffers(24, 12, 3)
    assert lib.mt_linear_backward(outs[0], outs[1], outs[2], _c_in(dc), _c_in(a), _c_in(wr), 6, 3, 4) == 2
    assert "weight holds NaN or inf" in ffi.string(lib.mt_last_error()).decode()
    assert all(o[i] == SENTINEL for o, n in zip(outs, (24, 12, 3)) for i in range(n))


def test_empty_shapes_are_answered_without_reading_anything(dense):
    m = dense.tier
    out = mt.linear_forward(mat((0, 3), 1), mat((4, 3), 2), numeric_mode=m)
    assert out.shape == (0, 4)
    out = mt.linear_forward(mat((2, 0), 1), mat((3, 0), 2), mat((3,), 3), numeric_mode=m)
    assert flat(out) == flat(mat((3,), 3)) * 2                 # empty chains: +0.0 + bias
    da, dw, db = mt.linear_backward(mat((0, 3), 1), mat((0, 2), 2), mat((3, 2), 3),
                                    need_bias_grad=True, numeric_mode=m)
    assert da.shape == (0, 2) and flat(dw) == [0.0] * 6 and flat(db) == [0.0] * 3
    assert all(bits(v) == 0 for v in flat(dw) + flat(db))      # +0.0, never -0.0
    assert mt.rms_norm_forward(mat((0, 5), 1), None, numeric_mode=m).shape == (0, 5)
    dx, dg = mt.rms_norm_backward(mat((0, 5), 1), mat((0, 5), 2), mat((5,), 3), numeric_mode=m)
    assert dx.shape == (0, 5) and flat(dg) == [0.0] * 5
    assert mt.mlp_inference_sessions([], mat((4, 3), 1), None, mat((2, 4), 2), None, numeric_mode=m).shape == (0, 2)


def test_leading_dimensions_are_rows_and_skipped_gradients_are_none(dense):
    m = dense.tier
    a3, w, b = mat((2, 3, 5), 161), mat((4, 5), 162), mat((4,), 163)
    a2 = a3.reshape(6, 5)
    out = mt.linear_forward(a3, w, b, numeric_mode=m)
    assert out.shape == (2, 3, 4) and sha(out) == sha(mt.linear_forward(a2, w, b, numeric_mode=m))
    one = mt.linear_forward(mat((5,), 164), w, numeric_mode=m)
    assert one.shape == (4,) and sha(one) == sha(mt.linear_forward(mat((1, 5), 164), w, numeric_mode=m))
    dc3 = mat((2, 3, 4), 165)
    da, dw = mt.linear_backward(dc3, a3, w, numeric_mode=m)
    da2, dw2, db2 = mt.linear_backward(dc3.reshape(6, 4), a2, w, need_bias_grad=True, numeric_mode=m)
    assert da.shape == (2, 3, 5) and sha(da, dw) == sha(da2, dw2)
    none, dw3, db3 = mt.linear_backward(dc3, a3, w, need_input_grad=False, need_bias_grad=True, numeric_mode=m)
    assert none is None and sha(dw3, db3) == sha(dw2, db2)
    assert mt.linear_backward(dc3, a3, w, need_weight_grad=False, numeric_mode=m)[1] is None
    x3 = mat((2, 3, 7), 166)
    y = mt.rms_norm_forward(x3, None, numeric_mode=m)
    assert y.shape == (2, 3, 7) and sha(y) == sha(mt.rms_norm_forward(x3.reshape(6, 7), None, numeric_mode=m))


# ---- linear: the chains (identical tier) -------------------------------------------------------

def test_linear_forward_outputs_are_fma_chains_over_k_in_ascending_order(dense_identical):
    m, n, k = 5, 7, 300
    a, w, b = mat((m, k), 11, wide=True), mat((n, k), 12, wide=True), mat((n,), 13)
    out = flat(mt.linear_forward(a, w, b, numeric_mode="identical"))
    nob = flat(mt.linear_forward(a, w, numeric_mode="identical"))
    av, wv, bv = flat(a), flat(w), flat(b)
    reversed_differs = False
    for i, j in ((0, 0), (4, 6), (2, 3), (3, 1)):
        row, col = av[i * k:(i + 1) * k], wv[j * k:(j + 1) * k]
        want = chain(row, col)
        assert bits(nob[i * n + j]) == bits(want)
        assert bits(out[i * n + j]) == bits(f32(want + bv[j]))
        reversed_differs |= bits(chain(row[::-1], col[::-1])) != bits(want)
    assert reversed_differs, "these inputs cannot tell the chain's order"


def test_linear_backward_da_is_the_chain_over_n_and_dweight_the_chain_over_rows(dense_identical):
    m, n, k = 40, 67, 9
    dc, a, w = mat((m, n), 21, wide=True), mat((m, k), 22, wide=True), mat((n, k), 23, wide=True)
    da, dw, db = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    dcv, av, wv = flat(dc), flat(a), flat(w)
    for i, p in ((0, 0), (39, 8), (17, 4)):
        want = chain(dcv[i * n:(i + 1) * n], [wv[j * k + p] for j in range(n)])
        assert bits(flat(da)[i * k + p]) == bits(want)
    for j, p in ((0, 0), (66, 8), (30, 5)):
        want = chain([dcv[i * n + j] for i in range(m)], [av[i * k + p] for i in range(m)])
        assert bits(flat(dw)[j * k + p]) == bits(want)
    for j in (0, 13, 66):
        acc = 0.0
        for i in range(m):
            acc = f32(acc + dcv[i * n + j])
        assert bits(flat(db)[j]) == bits(acc)


@pytest.mark.parametrize("m", [3 * LEAF - 324, 6 * LEAF + 3])
def test_dweight_and_dbias_are_per_leaf_results_met_in_the_pairwise_tree(dense_identical, m):
    n, k = 5, 3
    dc, a, w = mat((m, n), 31, wide=True), mat((m, k), 32, wide=True), mat((n, k), 33)
    da, dw, db = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    leaves = [(r0, min(r0 + LEAF, m)) for r0 in range(0, m, LEAF)]
    parts = [mt.linear_backward(rows_of(dc, r0, r1), rows_of(a, r0, r1), w, need_bias_grad=True,
                                numeric_mode="identical") for r0, r1 in leaves]
    assert same_bits(flat(dw), token_tree([flat(p[1]) for p in parts]))
    assert same_bits(flat(db), token_tree([flat(p[2]) for p in parts]))
    assert same_bits(flat(da), sum((flat(p[0]) for p in parts), []))
    if len(parts) >= 4:                 # from four leaves on, a left-to-right fold is another tree
        serial = flat(parts[0][1])
        for p in parts[1:]:
            serial = [f32(s + v) for s, v in zip(serial, flat(p[1]))]
        assert not same_bits(serial, flat(dw)), "these inputs cannot tell the tree from a serial fold"


def test_gradients_of_aligned_microbatches_add_up_to_the_full_batch_exactly(dense_identical):
    """Two microbatches of 2048 rows (two leaves each) are the tree's two halves."""
    m, n, k = 4 * LEAF, 6, 4
    dc, a, w = mat((m, n), 41, wide=True), mat((m, k), 42, wide=True), mat((n, k), 43)
    full = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    halves = [mt.linear_backward(rows_of(dc, r0, r0 + m // 2), rows_of(a, r0, r0 + m // 2), w,
                                 need_bias_grad=True, numeric_mode="identical") for r0 in (0, m // 2)]
    for out in (1, 2):
        assert same_bits(flat(full[out]), [f32(x + y) for x, y in zip(flat(halves[0][out]), flat(halves[1][out]))])


# ---- RMSNorm: the contract's arithmetic (identical tier) -----------------------------------------

@pytest.mark.parametrize("dim, affine", [(1, True), (5, False), (300, True), (5000, True), (4097, False)])
def test_rms_norm_is_the_contracts_arithmetic_row_by_row(dense_identical, dim, affine):
    rows, eps = 2, 1e-5
    x, dy = mat((rows, dim), 51 + dim, wide=True), mat((rows, dim), 52 + dim, wide=True)
    w = mat((dim,), 53, 0.5, 1.5) if affine else None
    y = flat(mt.rms_norm_forward(x, w, eps, numeric_mode="identical"))
    dx, dw = mt.rms_norm_backward(dy, x, w, eps, numeric_mode="identical")
    xv, dyv, wv = flat(x), flat(dy), flat(w) if affine else None
    dweight = [0.0] * dim
    for i in range(rows):
        sl = slice(i * dim, (i + 1) * dim)
        ry, rdx, r = ref_rms_row(xv[sl], wv, dyv[sl], f32(eps))
        assert same_bits(y[sl], ry) and same_bits(flat(dx)[sl], rdx)
        dweight = [fma32(d, f32(v * r), acc) for d, v, acc in zip(dyv[sl], xv[sl], dweight)]
    if affine:
        assert same_bits(flat(dw), dweight)
    else:
        assert dw is None


def test_rms_norm_eps_none_is_float32_machine_epsilon(dense_identical):
    x, w = mat((3, 8), 61, -1e-4, 1e-4), mat((8,), 62)
    assert sha(mt.rms_norm_forward(x, w, numeric_mode="identical")) == sha(
        mt.rms_norm_forward(x, w, 2.0 ** -23, numeric_mode="identical"))
    assert sha(mt.rms_norm_forward(x, w, numeric_mode="identical")) != sha(
        mt.rms_norm_forward(x, w, 1e-5, numeric_mode="identical"))


def test_rms_norm_dweight_follows_the_token_rule_over_rows(dense_identical):
    rows, dim = 3 * LEAF - 700, 37
    x, dy, w = mat((rows, dim), 71, wide=True), mat((rows, dim), 72, wide=True), mat((dim,), 73)
    dx, dw = mt.rms_norm_backward(dy, x, w, 1e-6, numeric_mode="identical")
    parts = [mt.rms_norm_backward(rows_of(dy, r0, min(r0 + LEAF, rows)), rows_of(x, r0, min(r0 + LEAF, rows)),
                                  w, 1e-6, numeric_mode="identical") for r0 in range(0, rows, LEAF)]
    assert same_bits(flat(dw), token_tree([flat(p[1]) for p in parts]))
    assert same_bits(flat(dx), sum((flat(p[0]) for p in parts), []))


# ---- ReLU --------------------------------------------------------------------------------------

def test_relu_keeps_positives_and_gives_positive_zero_elsewhere(dense):
    tiny = 2.0 ** -149
    xs = [-2.0, -0.0, 0.0, tiny, -tiny, 1.5, 3e38, -3e38, 2.0 ** -127]
    x = Array.from_list(xs, "float32")
    dy = Array.from_list([7.0, -1.0, 2.0, 3.0, 4.0, -5.0, 6.0, 8.0, -0.0], "float32")
    y = flat(nn.relu_forward(x, numeric_mode=dense.tier))
    dx = flat(nn.relu_backward(dy, x, numeric_mode=dense.tier))
    want_y = [0.0, 0.0, 0.0, tiny, 0.0, 1.5, f32(3e38), 0.0, 2.0 ** -127]
    want_dx = [0.0, 0.0, 0.0, 3.0, 0.0, -5.0, 6.0, 0.0, -0.0]
    if dense.has("approximate"):
        # A library that flushes subnormals (MT_FEATURE_APPROXIMATE: a GPU's fast tier) reads the
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
    shaped = nn.relu_forward(mat((2, 3, 4), 81), numeric_mode=dense.tier)
    assert shaped.shape == (2, 3, 4)


# ---- determinism: threads and kernels -------------------------------------------------------------

_INPUTS = {}


def _all_outputs(tier):
    if not _INPUTS:
        _INPUTS.update(a=mat((300, 1100), 91), w=mat((70, 1100), 92), b=mat((70,), 93), dc=mat((300, 70), 94),
                       big_dc=mat((2600, 70), 95), big_a=mat((2600, 33), 96), big_w=mat((70, 33), 100),
                       x=mat((2600, 300), 97), g=mat((300,), 98), dy=mat((2600, 300), 99))
    d = _INPUTS
    return sha(mt.linear_forward(d["a"], d["w"], d["b"], numeric_mode=tier),
               *mt.linear_backward(d["dc"], d["a"], d["w"], need_bias_grad=True, numeric_mode=tier),
               *mt.linear_backward(d["big_dc"], d["big_a"], d["big_w"], need_bias_grad=True, numeric_mode=tier),
               mt.rms_norm_forward(d["x"], d["g"], numeric_mode=tier),
               *mt.rms_norm_backward(d["dy"], d["x"], d["g"], numeric_mode=tier),
               nn.relu_forward(d["x"], numeric_mode=tier), nn.relu_backward(d["dy"], d["x"], numeric_mode=tier))


def test_outputs_do_not_depend_on_the_thread_count(dense):
    if not dense.has("threads"):
        pytest.skip("no thread pool in this library")
    lib = dense.backend.lib
    before = lib.mt_num_threads()
    try:
        digests = []
        for n_threads in (1, 2, 3, 5):
            assert lib.mt_set_num_threads(n_threads) == 0
            digests.append(_all_outputs(dense.tier))
        digests.append(_all_outputs(dense.tier))
    finally:
        assert lib.mt_set_num_threads(before) == 0
    assert len(set(digests)) == 1


_GEMM_HOST = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
static uint32_t state = 12345u;
static float draw(void) {                   /* wide magnitudes: any reordering shows */
    state = state * 1664525u + 1013904223u;
    float v = (float)((state >> 8) & 0xffff) / 65536.0f - 0.5f;
    return v * (float)(1u << ((state >> 3) & 15));
}
static uint64_t hash(const float *x, int64_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)x;
    for (int64_t i = 0; i < 4 * n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
int main(void) {
    int64_t n = 67, k = 1031;
    uint64_t h = 1469598103934665603ull;
    for (int64_t m = 61; m < 300; m += 142) {   /* one block of rows, then several */
        float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
        float *c = malloc(sizeof(float) * m * n), *bias = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < m * k; ++i) a[i] = draw();
        for (int64_t i = 0; i < k * n; ++i) b[i] = draw();
        for (int64_t i = 0; i < n; ++i) bias[i] = draw();
        mt_fp_env env;
        mt_fp_begin(&env);
        /* row-major B, transposed B, a chain continued over two calls, transposed A */
        if (mt_cpu_gemm(c, n, a, k, 1, b, n, 1, m, n, k, 0, bias)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, k, 1, b, 1, k, m, n, k, 0, NULL)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, k, 1, b, n, 1, m, n, 500, 0, NULL)) return 1;
        if (mt_cpu_gemm(c, n, a + 500, k, 1, b + 500 * n, n, 1, m, n, k - 500, 1, bias)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, 1, m, b, n, 1, m, n, k, 0, NULL)) return 1;
        h = hash(c, m * n, h);
        mt_fp_end(&env);
        free(a); free(b); free(c); free(bias);
    }
    printf("%s %016llx\n", mt_cpu_gemm_kernel(), (unsigned long long)h);
    return 0;
}
"""


def test_every_gemm_kernel_gives_the_same_bits_as_the_scalar_one(tmp_path):
    """The CPU oracle's AVX-512, AVX2 and scalar kernels (MOJO_TRAIN_CPU_GEMM), on chains of
    every stride layout the dense ops use, one continued over two calls."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "gemm_host.c"
    src.write_text(_GEMM_HOST)
    exe = tmp_path / "gemm_host"
    oracle = os.path.join(REPO, "native", "cpu_oracle")
    sources = [os.path.join(oracle, f) for f in sorted(os.listdir(oracle)) if f.endswith(".c")]
    build = subprocess.run([cc, "-std=c11", "-O1", "-ffp-contract=off", "-fno-fast-math", "-D_GNU_SOURCE",
                            "-I", os.path.join(REPO, "native", "include"), "-I", oracle, str(src)] + sources
                           + ["-o", str(exe), "-lm", "-pthread"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    seen = {}
    for kernel in ("avx512", "avx2", "scalar"):
        for threads in ("1", "2"):
            run = subprocess.run([str(exe)], capture_output=True, text=True,
                                 env=dict(os.environ, MOJO_TRAIN_CPU_GEMM=kernel, MOJO_TRAIN_NUM_THREADS=threads))
            assert run.returncode == 0, run.stderr
            name, digest = run.stdout.split()
            seen.setdefault(name, set()).add(digest)
    assert "scalar" in seen
    assert len(set().union(*seen.values())) == 1, seen


# ---- mlp_inference_sessions ---------------------------------------------------------------------

def _mlp_weights():
    return mat((40, 13), 111), mat((40,), 112), mat((7, 40), 113), mat((7,), 114)


def test_mlp_sessions_are_linear_relu_linear_of_the_concatenated_rows(dense):
    w1, b1, w2, b2 = _mlp_weights()
    sessions = [mat((r, 13), 120 + r) for r in (3, 0, 1200, 1)]
    out = mt.mlp_inference_sessions(sessions, w1, b1, w2, b2, numeric_mode=dense.tier)
    x = Array.from_bytes(b"".join(s.tobytes() for s in sessions), (1204, 13), "float32")
    h = nn.relu_forward(mt.linear_forward(x, w1, b1, numeric_mode=dense.tier), numeric_mode=dense.tier)
    want = mt.linear_forward(h, w2, b2, numeric_mode=dense.tier)
    assert out.shape == (1204, 7) and sha(out) == sha(want)


def test_mlp_sessions_do_not_depend_on_how_rows_are_split(dense):
    w1, b1, w2, b2 = _mlp_weights()
    x = mat((500, 13), 130)
    splits = [(500,), (1, 499), (250, 0, 250), (100,) * 5, (7, 3, 490)]
    digests = set()
    for split in splits:
        sessions, r0 = [], 0
        for r in split:
            sessions.append(rows_of(x, r0, r0 + r))
            r0 += r
        digests.add(sha(mt.mlp_inference_sessions(sessions, w1, b1, w2, b2, numeric_mode=dense.tier)))
    assert len(digests) == 1


def test_mlp_sessions_without_biases(dense):
    w1, _, w2, _ = _mlp_weights()
    x = mat((9, 13), 140)
    out = mt.mlp_inference_sessions([x], w1, None, w2, None, numeric_mode=dense.tier)
    h = nn.relu_forward(mt.linear_forward(x, w1, numeric_mode=dense.tier), numeric_mode=dense.tier)
    assert sha(out) == sha(mt.linear_forward(h, w2, numeric_mode=dense.tier))


# ---- device buffers ----------------------------------------------------------------------------

def test_device_inputs_give_device_outputs_with_the_host_bits(dense):
    if not dense.has("device"):
        pytest.skip("the vendor takes no device buffers")
    t = dense.tier
    a, w, b, dc = mat((33, 70), 151), mat((9, 70), 152), mat((9,), 153), mat((33, 9), 154)
    dev = [mt.to_device(v, numeric_mode=t) for v in (a, w, b, dc)]
    out = mt.linear_forward(dev[0], dev[1], dev[2], numeric_mode=t)
    assert isinstance(out, mt.DeviceArray) and sha(out) == sha(mt.linear_forward(a, w, b, numeric_mode=t))
    grads = mt.linear_backward(dev[3], dev[0], dev[1], need_bias_grad=True, numeric_mode=t)
    assert sha(*grads) == sha(*mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode=t))
    with pytest.raises(ValueError, match="on the device but"):
        mt.linear_forward(dev[0], w, numeric_mode=t)


# ---- torch in float64 (tests/tolerances.py) ---------------------------------------------------------

@st.composite
def linear_cases(draw):
    return {"m": draw(st.integers(*tol.DENSE_ROWS_RANGE)), "n": draw(st.integers(*tol.DENSE_OUT_RANGE)),
            "k": draw(st.integers(*tol.DENSE_K_RANGE)), "bias": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**32 - 1))}


@st.composite
def rms_cases(draw):
    dim = draw(st.integers(*tol.RMS_DIM_RANGE))
    rows = min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))
    return {"rows": draw(st.integers(tol.DENSE_ROWS_RANGE[0], rows)), "dim": dim,
            "affine": draw(st.booleans()), "eps": draw(st.sampled_from(tol.RMS_EPS)),
            "seed": draw(st.integers(0, 2**32 - 1))}


def linear_vs_torch(case, tier, dtype=None):
    """{name: (ours or torch-in-dtype, float64 reference, unit)} for one linear case."""
    import numpy as np
    torch = pytest.importorskip("torch")
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    m, n, k = case["m"], case["n"], case["k"]
    a, w, dc = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (n, k), (m, n)))
    b = rng.uniform(-1, 1, n).astype(np.float32) if case["bias"] else None
    T = {key: torch.tensor(v, dtype=torch.float64) for key, v in (("a", a), ("w", w), ("dc", dc))}
    ref = {"out": T["a"] @ T["w"].T, "da": T["dc"] @ T["w"], "dweight": T["dc"].T @ T["a"],
           "dbias": T["dc"].sum(0)}
    if b is not None:
        ref["out"] = ref["out"] + torch.tensor(b, dtype=torch.float64)
    if dtype is None:
        got = {"out": mt.linear_forward(a, w, b, numeric_mode=tier)}
        got["da"], got["dweight"], got["dbias"] = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode=tier)
        got = {key: np.asarray(v) for key, v in got.items()}
    else:
        t = {key: torch.tensor(v) for key, v in (("a", a), ("w", w), ("dc", dc))}
        got = {"out": t["a"] @ t["w"].T, "da": t["dc"] @ t["w"], "dweight": t["dc"].T @ t["a"], "dbias": t["dc"].sum(0)}
        if b is not None:
            got["out"] = got["out"] + torch.tensor(b)
        got = {key: v.numpy() for key, v in got.items()}
    units = tol.linear_units(a, w, dc, b)
    return {key: (got[key], ref[key].numpy(), units[key].ravel()) for key in ref}


def rms_vs_torch(case, tier, dtype=None):
    import numpy as np
    torch = pytest.importorskip("torch")
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    rows, dim, eps = case["rows"], case["dim"], case["eps"]
    x, dy = rng.uniform(-1, 1, (rows, dim)).astype(np.float32), rng.uniform(-1, 1, (rows, dim)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dim).astype(np.float32) if case["affine"] else None

    def torch_run(dt):
        tx = torch.tensor(x, dtype=dt, requires_grad=True)
        tw = None if w is None else torch.tensor(w, dtype=dt, requires_grad=True)
        y = torch.nn.functional.rms_norm(tx, (dim,), tw, float(np.float32(eps)))
        y.backward(torch.tensor(dy, dtype=dt))
        out = {"y": y.detach().numpy(), "dx": tx.grad.numpy()}
        if w is not None:
            out["dweight"] = tw.grad.numpy()
        return out

    ref = torch_run(torch.float64)
    if dtype is None:
        got = {"y": np.asarray(mt.rms_norm_forward(x, w, eps, numeric_mode=tier))}
        dx, dwt = mt.rms_norm_backward(dy, x, w, eps, numeric_mode=tier)
        got["dx"] = np.asarray(dx)
        if w is not None:
            got["dweight"] = np.asarray(dwt)
    else:
        got = torch_run(dtype)
    units = tol.rms_units(x, w, dy, np.float32(eps))
    return {key: (got[key], ref[key], units[key].ravel()) for key in ref}


@settings(max_examples=20, **_SETTINGS)
@given(case=linear_cases())
def test_linear_stays_within_the_bound_of_torch_float64(dense, case):
    for name, (ours, ref, unit) in linear_vs_torch(case, dense.tier).items():
        tol.assert_close_to_reference(ours, ref, "%r linear %s %r" % (dense, name, case), unit=unit)


@settings(max_examples=20, **_SETTINGS)
@given(case=rms_cases())
def test_rms_norm_stays_within_the_bound_of_torch_float64(dense, case):
    for name, (ours, ref, unit) in rms_vs_torch(case, dense.tier).items():
        tol.assert_close_to_reference(ours, ref, "%r rms_norm %s %r" % (dense, name, case), unit=unit)


def _figures(n_cases):
    """Worst share of the bound used, per output: ours (identical, fast) and torch float32."""
    import random
    import torch
    rng = random.Random(0)
    worst = {}
    for _ in range(n_cases):
        lc = {"m": rng.randint(*tol.DENSE_ROWS_RANGE), "n": rng.randint(*tol.DENSE_OUT_RANGE),
              "k": rng.randint(*tol.DENSE_K_RANGE), "bias": rng.random() < 0.5, "seed": rng.getrandbits(32)}
        dim = rng.randint(*tol.RMS_DIM_RANGE)
        rc = {"rows": rng.randint(1, min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))), "dim": dim,
              "affine": rng.random() < 0.5, "eps": rng.choice(tol.RMS_EPS), "seed": rng.getrandbits(32)}
        for who, tier, dtype in (("identical", "identical", None), ("fast", "fast", None),
                                 ("torch float32", None, torch.float32)):
            for op, fn, case in (("linear", linear_vs_torch, lc), ("rms_norm", rms_vs_torch, rc)):
                for name, (got, ref, unit) in fn(case, tier, dtype).items():
                    used, _ = tol.bound_used(got, ref, unit)
                    key = ("%s %s" % (op, name), who)
                    worst[key] = max(worst.get(key, 0.0), used)
    for name in sorted({k[0] for k in worst}):
        print("%-18s %s" % (name, "  ".join("%s %.3f" % (w, worst[(name, w)])
                                             for w in ("identical", "fast", "torch float32"))))


if __name__ == "__main__":
    _figures(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
