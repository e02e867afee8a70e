"""layer_norm_forward and layer_norm_backward through the public API (mojo_train.layer_norm,
re-exported by mojo_train and mojo_train.nn).

Contract under test: native/contracts/layer_norm.md. Every refusal (wrong dtype, shape, eps,
pointer; a NaN or inf in any input an output depends on, named) writes no output; the
results' bytes do not depend on the thread count, on the alignment of device buffers or on
whether a GPU stages a row in shared memory; in the identical numeric mode each row is the
contract's arithmetic step by step (replayed here in float32, one rounding per step) and
dweight and dbias follow the token rule over rows; every numeric mode stays within
tests/tolerances.py's bound of torch in float64.
``PYTHONPATH=. python tests/test_layer_norm.py N`` prints the bound figures of tolerances.py.
"""
import math
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train import Array
from mojo_train._native import ffi

import tolerances as tol
from _helpers import ENONFINITE, _lane_tree, _tree_fold, add32, f32, fma32, thread_counts
from _layer_helpers import LEAF, SENTINEL, assert_c_refusals_write_nothing, assert_nonfinite_refused, c_in, \
    assert_within_bound, device_copy_at, digests_over_thread_counts, mat, need_device, print_family_figures, \
    rows_of, same_bits, token_tree, values, words
from _layer_helpers import HYPOTHESIS, outputs_sha as sha

LF, LB = mt.layer_norm_forward, mt.layer_norm_backward


# ---- the contract replayed in Python -----------------------------------------------------------

def chunk_tree(terms, step):
    """The chunk tree of clip.md: lane l of a 4096-chunk folds terms l, l + 128, ... by
    ``acc = step(acc, term)`` from +0.0; then the lane tree, then the pairwise tree of chunks."""
    partials = []
    for c0 in range(0, len(terms), 4096):
        acc = [0.0] * 128
        for i, t in enumerate(terms[c0:c0 + 4096]):
            acc[i % 128] = step(acc[i % 128], t)
        partials.append(_lane_tree(acc))
    return _tree_fold(partials)


def ref_ln_row(x, w, b, dy, eps):
    """(y, dx, xhat) of one row by layer_norm.md, every step rounded to float32."""
    dimf = f32(float(len(x)))
    mu = f32(chunk_tree(x, add32) / dimf)
    q = chunk_tree([f32(v - mu) for v in x], lambda acc, d: fma32(d, d, acc))
    s = f32(math.sqrt(f32(f32(q / dimf) + eps)))
    r = math.inf if s == 0 else f32(1.0 / s)          # var + eps = 0 (eps = 0, a constant row): 1/+0
    w = w or [1.0] * len(x)
    b = b or [-0.0] * len(x)
    xhat = [f32(f32(v - mu) * r) for v in x]
    y = [fma32(xh, wi, bi) for xh, wi, bi in zip(xhat, w, b)]
    g = [f32(d * wi) for d, wi in zip(dy, w)]
    mg = f32(chunk_tree(g, add32) / dimf)
    mgx = f32(chunk_tree(list(zip(g, xhat)), lambda acc, t: fma32(t[0], t[1], acc)) / dimf)
    dx = [f32(r * f32(f32(gi - mg) - f32(xh * mgx))) for gi, xh in zip(g, xhat)]
    return y, dx, xhat


# ---- refusals --------------------------------------------------------------------------------

def _refusals():
    """(function, args, exception, text of the message)."""
    x, g = mat((4, 6), 5), mat((6,), 6)
    return [
        (LF, (x, mat((5,), 6)), ValueError, "weight must have shape (6,)"),
        (LF, (x, g, mat((7,), 6)), ValueError, "bias must have shape (6,)"),
        (LF, (x, None, mat((2, 3), 6)), ValueError, "bias must be 1-D"),
        (LF, (x, g, Array.from_list([0] * 6, "int32")), TypeError, "bias"),
        (LF, (x, g, g, -1e-5), ValueError, "eps must be finite and >= 0"),
        (LF, (x, g, g, float("nan")), ValueError, "eps must be finite"),
        (LF, (x, g, g, 1e39), ValueError, "eps must be finite"),
        (LF, (x, g, g, "1e-5"), TypeError, "eps must be a real number"),
        (LF, (x, g, g, None), TypeError, "eps must be a real number (torch's default is 1e-5)"),
        (LF, (mat((3, 0), 1),), ValueError, "D must be >= 1"),
        (LF, (mat((), 1),), ValueError, "at least one dimension"),
        (LB, (mat((4, 5), 1), x, g), ValueError, "dy must have x's shape"),
        (LB, (x, x, g, mat((5,), 6)), ValueError, "bias must have shape (6,)"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("i", range(len(REFUSALS)), ids=["%s: %s" % (r[0].__name__, r[3]) for r in REFUSALS])
def test_a_bad_argument_is_refused_naming_it(layer_norm_mode, i):
    fn, args, exc, text = REFUSALS[i]
    with pytest.raises(exc) as info:
        fn(*args, numeric_mode=layer_norm_mode.numeric_mode)
    assert "mojo_train.%s" % fn.__name__ in str(info.value) and text in str(info.value)


def _lf(m, d):
    return LF(d["x"], d["w"], d["bias"], 1e-5, numeric_mode=m)


def _lb(m, d):
    return LB(d["dy"], d["x"], d["w"], d["bias"], 1e-5, numeric_mode=m)


NONFINITE = [("layer_norm_forward", arg, _lf) for arg in ("x", "w", "bias")] + \
            [("layer_norm_backward", arg, _lb) for arg in ("dy", "x", "w")]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("i", range(len(NONFINITE)), ids=["%s %s" % c[:2] for c in NONFINITE])
def test_a_nonfinite_input_is_refused_by_name_and_inputs_are_untouched(layer_norm_mode, i, bad):
    d = {"x": mat((37, 300), 5), "w": mat((300,), 6), "bias": mat((300,), 7), "dy": mat((37, 300), 8)}
    assert_nonfinite_refused(*NONFINITE[i], layer_norm_mode.numeric_mode, d, bad)


@pytest.mark.parametrize("rows", [0, 3])
@pytest.mark.parametrize("which", ["weight", "bias"])
def test_a_nonfinite_weight_or_bias_is_refused_with_or_without_rows(layer_norm_mode, rows, which):
    """With no rows, no kernel reads the parameters along the way: they are still checked."""
    m = layer_norm_mode.numeric_mode
    x, dy, p = mat((rows, 128), 8), mat((rows, 128), 9), mat((128,), 10)
    p.reshape(-1)[0] = float("nan")
    w, b = (p, None) if which == "weight" else (None, p)
    calls = [lambda: LF(x, w, b, numeric_mode=m)] + ([lambda: LB(dy, x, w, None, numeric_mode=m)] if w else [])
    for call in calls:
        with pytest.raises(ValueError, match="%s holds NaN or inf" % which):
            call()


def test_the_backward_reads_only_whether_a_bias_is_given(layer_norm_mode):
    """dbias does not depend on the bias: a NaN bias gives the same gradients as any other."""
    m = layer_norm_mode.numeric_mode
    x, dy, w, b = mat((5, 33), 11), mat((5, 33), 12), mat((33,), 13), mat((33,), 14)
    nan_b = mat((33,), 14)
    nan_b.reshape(-1)[3] = float("nan")
    assert sha(*LB(dy, x, w, nan_b, numeric_mode=m)) == sha(*LB(dy, x, w, b, numeric_mode=m))
    assert LB(dy, x, w, None, numeric_mode=m)[2] is None


def _c_cases(lib, keep):
    """(text of the message, call(outputs)); the inputs stay alive in ``keep``."""
    keep += [mat(shape, seed) for shape, seed in (((6, 4), 4), ((4,), 5), ((6, 4), 6), ((4,), 7))]
    x, g, dy, b = (c_in(v) for v in keep)
    N, inf = ffi.NULL, float("inf")
    fwd, bwd = lib.mt_layer_norm_forward, lib.mt_layer_norm_backward
    return [
        ("dim must be >= 1", lambda o: fwd(o[0], x, g, b, 1e-5, 6, 0)),
        ("rows must be >= 0", lambda o: fwd(o[0], x, g, b, 1e-5, -6, 4)),
        ("too large", lambda o: fwd(o[0], x, g, b, 1e-5, 2**40, 2**40)),
        ("eps must be finite and >= 0", lambda o: fwd(o[0], x, g, b, -1.0, 6, 4)),
        ("eps must be finite and >= 0", lambda o: bwd(o[0], o[1], o[2], dy, x, g, inf, 6, 4)),
        ("y is NULL", lambda o: fwd(N, x, g, b, 1e-5, 6, 4)),
        ("x is NULL", lambda o: fwd(o[0], N, g, b, 1e-5, 6, 4)),
        ("dweight was asked for but weight is NULL", lambda o: bwd(o[0], o[1], o[2], dy, x, N, 1e-5, 6, 4)),
        ("dy is NULL", lambda o: bwd(o[0], o[1], o[2], N, x, g, 1e-5, 6, 4)),
    ]


def test_the_c_entries_refuse_bad_sizes_pointers_and_eps_writing_nothing(layer_norm_mode):
    keep = []
    assert_c_refusals_write_nothing(layer_norm_mode.backend.lib, _c_cases(layer_norm_mode.backend.lib, keep))


def _poisoned(shape, seed, bad):
    """mat(shape, seed) with NaN at element 3 of its last row when ``bad``."""
    a = mat(shape, seed)
    if bad:
        ffi.cast("float *", a.address)[(shape[0] - 1) * shape[1] + 3] = float("nan")
    return a


@pytest.mark.parametrize("rows", [40, 2 * LEAF + 552])     # one leaf, three leaves
def test_a_nonfinite_row_found_during_the_pass_is_refused_by_name_writing_no_input(layer_norm_mode, rows):
    """layer_norm.md, "Refusals": NaN in the last row of x (forward), of dy or of x (backward),
    found while the outputs are computed: refused naming that input, every input's bytes as
    they were, dweight and dbias never written (y and dx are undefined); also with dx only and
    with dbias only, and with x bad in row 0 and dy in the last row (dy is named: the order)."""
    lib, dim = layer_norm_mode.backend.lib, 37
    for threads in thread_counts(layer_norm_mode):
        for bad in ("x", "dy", "both"):
            x, dy = _poisoned((rows, dim), 41, bad == "x"), _poisoned((rows, dim), 42, bad != "x")
            if bad == "both":
                ffi.cast("float *", x.address)[1] = float("-inf")
            w, b = mat((dim,), 43), mat((dim,), 44)
            before = [a.tobytes() for a in (x, dy, w, b)]
            y = ffi.new("float[]", rows * dim)
            if bad == "x":
                assert lib.mt_layer_norm_forward(y, c_in(x), c_in(w), c_in(b), 1e-5, rows, dim) == ENONFINITE
                assert "x holds NaN or inf" in ffi.string(lib.mt_last_error()).decode()
            named = "x" if bad == "x" else "dy"
            for want in ("dx dweight dbias", "dx", "dx dbias"):
                dw, db = (ffi.new("float[]", [SENTINEL] * dim) if k in want else ffi.NULL
                          for k in ("dweight", "dbias"))
                rc = lib.mt_layer_norm_backward(y, dw, db, c_in(dy), c_in(x), c_in(w), 1e-5, rows, dim)
                assert rc == ENONFINITE, (threads, bad, want)
                assert ffi.string(lib.mt_last_error()).decode().startswith(named + " holds NaN or inf"), bad
                assert all(list(o) == [SENTINEL] * dim for o in (dw, db) if o != ffi.NULL), (threads, bad, want)
            assert [a.tobytes() for a in (x, dy, w, b)] == before, (threads, bad)


def test_a_refusal_leaves_an_input_that_is_also_the_output_untouched(layer_norm_mode):
    """An output overlapping an input (y = x, dx = dy in place; dx over dweight) gets the refusal
    before anything is written, as does a non-finite weight, which is named after x (the order
    x, weight, bias). Host buffers: a GPU stages them and downloads only on success."""
    lib, rows, dim = layer_norm_mode.backend.lib, 40, 37
    x, w, b = _poisoned((rows, dim), 45, True), mat((dim,), 46), mat((dim,), 47)
    before = x.tobytes()
    assert lib.mt_layer_norm_forward(c_in(x), c_in(x), c_in(w), c_in(b), 1e-5, rows, dim) == ENONFINITE
    assert x.tobytes() == before
    dy, clean = _poisoned((rows, dim), 48, True), mat((rows, dim), 49)
    before = dy.tobytes()
    assert lib.mt_layer_norm_backward(c_in(dy), ffi.NULL, ffi.NULL, c_in(dy), c_in(clean), c_in(w), 1e-5, rows,
                                      dim) == ENONFINITE
    assert dy.tobytes() == before
    dx = ffi.new("float[]", [SENTINEL] * (rows * dim))        # dweight is dx's first row: outputs overlap
    db = ffi.new("float[]", [SENTINEL] * dim)
    assert lib.mt_layer_norm_backward(dx, dx, db, c_in(dy), c_in(clean), c_in(w), 1e-5, rows, dim) == ENONFINITE
    assert list(dx) == [SENTINEL] * (rows * dim) and list(db) == [SENTINEL] * dim
    ffi.cast("float *", w.address)[0] = float("inf")
    y = ffi.new("float[]", rows * dim)
    assert lib.mt_layer_norm_forward(y, c_in(x), c_in(w), c_in(b), 1e-5, rows, dim) == ENONFINITE
    assert ffi.string(lib.mt_last_error()).decode().startswith("x holds NaN or inf")
    assert lib.mt_layer_norm_forward(y, c_in(clean), c_in(w), c_in(b), 1e-5, rows, dim) == ENONFINITE
    assert ffi.string(lib.mt_last_error()).decode().startswith("weight holds NaN or inf")


def test_the_c_backward_computes_any_subset_of_its_outputs_alike(layer_norm_mode):
    """dx, dweight and dbias may each be NULL; what is computed does not depend on what is not
    (over 2048 rows: with and without dx, the leaves run in one pass or two)."""
    lib, (rows, dim) = layer_norm_mode.backend.lib, (2600, 37)
    keep = [mat((rows, dim), 31), mat((rows, dim), 32), mat((dim,), 33)]
    dy, x, w = (c_in(v) for v in keep)

    def run(want):
        outs = [ffi.new("float[]", n) if k in want else ffi.NULL
                for k, n in (("dx", rows * dim), ("dweight", dim), ("dbias", dim))]
        assert lib.mt_layer_norm_backward(outs[0], outs[1], outs[2], dy, x, w, 1e-5, rows, dim) == 0
        return {k: list(o) for k, o in zip(("dx", "dweight", "dbias"), outs) if o != ffi.NULL}

    every = run({"dx", "dweight", "dbias"})
    for want in ({"dweight", "dbias"}, {"dweight"}, {"dbias"}, {"dx"}, {"dx", "dbias"}):
        assert run(want) == {k: every[k] for k in want}, want


def test_empty_rows_are_answered_without_reading_anything(layer_norm_mode):
    m = layer_norm_mode.numeric_mode
    assert LF(mat((0, 5), 1), None, None, numeric_mode=m).shape == (0, 5)
    dx, dw, db = LB(mat((0, 5), 1), mat((0, 5), 2), mat((5,), 3), mat((5,), 4), numeric_mode=m)
    assert dx.shape == (0, 5) and values(dw) == [0.0] * 5 and values(db) == [0.0] * 5


def test_leading_dimensions_are_rows_and_absent_parameters_have_no_gradient(layer_norm_mode):
    m = layer_norm_mode.numeric_mode
    x3, dy3, b = mat((2, 3, 7), 166), mat((2, 3, 7), 167), mat((7,), 168)
    y = LF(x3, None, b, numeric_mode=m)
    assert y.shape == (2, 3, 7) and sha(y) == sha(LF(x3.reshape(6, 7), None, b, numeric_mode=m))
    dx, dw, db = LB(dy3, x3, None, b, numeric_mode=m)
    assert dw is None and db.shape == (7,) and dx.shape == (2, 3, 7)
    assert sha(dx, db) == sha(*LB(dy3.reshape(6, 7), x3.reshape(6, 7), None, b, numeric_mode=m)[::2])
    assert LB(dy3, x3, mat((7,), 169), None, numeric_mode=m)[2] is None


def test_the_default_eps_is_torchs(layer_norm_mode):
    m = layer_norm_mode.numeric_mode
    x = mat((3, 8), 61, -1e-3, 1e-3)
    assert sha(LF(x, numeric_mode=m)) == sha(LF(x, None, None, 1e-5, numeric_mode=m))
    assert sha(LF(x, numeric_mode=m)) != sha(LF(x, None, None, 1e-6, numeric_mode=m))


# ---- the contract's arithmetic (identical numeric mode) -------------------------------------------------

@pytest.mark.parametrize("dim, weight, bias", [(1, True, True), (5, False, False), (300, True, False),
                                               (300, False, True), (4097, True, True), (5000, False, False)])
def test_layer_norm_is_the_contracts_arithmetic_row_by_row(layer_norm_identical, dim, weight, bias):
    rows, eps = 2, 1e-5
    x, dy = mat((rows, dim), 51 + dim, wide=True), mat((rows, dim), 52 + dim, wide=True)
    w = mat((dim,), 53, 0.5, 1.5) if weight else None
    b = mat((dim,), 54) if bias else None
    y = values(LF(x, w, b, eps, numeric_mode="identical"))
    dx, dw, db = LB(dy, x, w, b, eps, numeric_mode="identical")
    xv, dyv = values(x), values(dy)
    wv, bv = (values(p) if p is not None else None for p in (w, b))
    dweight, dbias = [0.0] * dim, [0.0] * dim
    for i in range(rows):
        sl = slice(i * dim, (i + 1) * dim)
        ry, rdx, xhat = ref_ln_row(xv[sl], wv, bv, dyv[sl], f32(eps))
        assert same_bits(y[sl], ry) and same_bits(values(dx)[sl], rdx)
        dweight = [fma32(d, xh, acc) for d, xh, acc in zip(dyv[sl], xhat, dweight)]
        dbias = [add32(acc, d) for d, acc in zip(dyv[sl], dbias)]
    assert (dw is None) == (not weight) and (db is None) == (not bias)
    assert dw is None or same_bits(values(dw), dweight)
    assert db is None or same_bits(values(db), dbias)


def test_layer_norm_dweight_and_dbias_follow_the_token_rule_over_rows(layer_norm_identical):
    rows, dim = 3 * LEAF - 700, 37
    x, dy = mat((rows, dim), 71, wide=True), mat((rows, dim), 72, wide=True)
    w, b = mat((dim,), 73), mat((dim,), 74)
    dx, dw, db = LB(dy, x, w, b, 1e-6, numeric_mode="identical")
    parts = [LB(rows_of(dy, r0, min(r0 + LEAF, rows)), rows_of(x, r0, min(r0 + LEAF, rows)), w, b, 1e-6,
                numeric_mode="identical") for r0 in range(0, rows, LEAF)]
    assert same_bits(values(dw), token_tree([values(p[1]) for p in parts]))
    assert same_bits(values(db), token_tree([values(p[2]) for p in parts]))
    assert same_bits(values(dx), sum((values(p[0]) for p in parts), []))


@pytest.mark.parametrize("dim", [1, 3, 4096, 4097])
def test_a_constant_row_whose_sum_is_exact_normalizes_to_the_bias(layer_norm_identical, dim):
    """Variance 0: xhat = 0, so y is the bias bit for bit and dx = r * (g - mean g) (0 for D = 1)."""
    m = "identical"
    x = Array.from_list([1.5] * (2 * dim), "float32").reshape((2, dim))
    w, b, dy = mat((dim,), 81, 0.5, 1.5), mat((dim,), 82), mat((2, dim), 83)
    assert same_bits(values(LF(x, w, b, numeric_mode=m)), values(b) * 2)
    dx, r = values(LB(dy, x, w, b, numeric_mode=m)[0]), f32(1.0 / f32(math.sqrt(f32(1e-5))))
    g = [f32(d * wi) for d, wi in zip(values(dy)[:dim], values(w))]
    mg = f32(chunk_tree(g, add32) / f32(float(dim)))
    assert same_bits(dx[:dim], [f32(r * f32(gi - mg)) for gi in g]) and (dim > 1 or dx == [0.0, 0.0])


# ---- determinism: threads, alignment, rows too wide for shared memory ----------------------------

def test_outputs_do_not_depend_on_the_thread_count(layer_norm_mode):
    m = layer_norm_mode.numeric_mode
    x, w, b, dy = mat((2600, 300), 97), mat((300,), 98), mat((300,), 96), mat((2600, 300), 99)
    digest = lambda: sha(LF(x, w, b, numeric_mode=m), *LB(dy, x, w, b, numeric_mode=m))  # noqa: E731
    assert len(digests_over_thread_counts(layer_norm_mode, digest)) == 1


# (rows, dim, offset): rows off 16-byte alignment (the scalar walk); a row of 40000 floats is too
# wide for a GPU to stage x and dy of the backward in shared memory, one of 65539 even x alone.
@pytest.mark.parametrize("rows, dim, offset", [(7, 4096, 4), (3, 4097, 0), (2, 40000, 0), (2, 65539, 4)])
def test_device_buffers_give_the_host_bits_whatever_the_alignment_and_width(layer_norm_identical, rows, dim, offset):
    need_device(layer_norm_identical)
    t = "identical"
    x, dy = mat((rows, dim), 191, wide=True), mat((rows, dim), 192)
    w, b = mat((dim,), 193, 0.5, 1.5), mat((dim,), 194)
    dev = [device_copy_at(v, offset, t) for v in (x, dy, w, b)]
    assert sha(LF(dev[0], dev[2], dev[3], 1e-5, numeric_mode=t)) == sha(LF(x, w, b, 1e-5, numeric_mode=t))
    assert sha(*LB(dev[1], dev[0], dev[2], dev[3], 1e-5, numeric_mode=t)) == \
        sha(*LB(dy, x, w, b, 1e-5, numeric_mode=t))
    assert sha(*LB(dev[1], dev[0], None, dev[3], 1e-5, numeric_mode=t)) == \
        sha(*LB(dy, x, None, b, 1e-5, numeric_mode=t))


# ---- torch in float64 (tests/tolerances.py) ---------------------------------------------------------

@st.composite
def ln_cases(draw):
    dim = draw(st.integers(*tol.RMS_DIM_RANGE))
    rows = min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))
    return {"rows": draw(st.integers(tol.DENSE_ROWS_RANGE[0], rows)), "dim": dim,
            "weight": draw(st.booleans()), "bias": draw(st.booleans()), "eps": draw(st.sampled_from(tol.LN_EPS)),
            "seed": draw(st.integers(0, 2**32 - 1))}


def ln_vs_torch(case, numeric_mode, dtype=None):
    import numpy as np
    torch = pytest.importorskip("torch")
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    rows, dim, eps = case["rows"], case["dim"], case["eps"]
    x, dy = rng.uniform(-1, 1, (rows, dim)).astype(np.float32), rng.uniform(-1, 1, (rows, dim)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dim).astype(np.float32) if case["weight"] else None
    b = rng.uniform(-1, 1, dim).astype(np.float32) if case["bias"] else None

    def torch_run(dt):
        tx = torch.tensor(x, dtype=dt, requires_grad=True)
        tw, tb = (None if p is None else torch.tensor(p, dtype=dt, requires_grad=True) for p in (w, b))
        y = torch.nn.functional.layer_norm(tx, (dim,), tw, tb, float(np.float32(eps)))
        y.backward(torch.tensor(dy, dtype=dt))
        out = {"y": y.detach().numpy(), "dx": tx.grad.numpy()}
        out.update({k: p.grad.numpy() for k, p in (("dweight", tw), ("dbias", tb)) if p is not None})
        return out

    ref = torch_run(torch.float64)
    if dtype is None:
        got = {"y": np.asarray(LF(x, w, b, eps, numeric_mode=numeric_mode))}
        grads = LB(dy, x, w, b, eps, numeric_mode=numeric_mode)
        got.update({k: np.asarray(g) for k, g in zip(("dx", "dweight", "dbias"), grads) if g is not None})
    else:
        got = torch_run(dtype)
    units = tol.ln_units(x, w, b, dy, np.float32(eps))
    return {key: (got[key], ref[key], units[key].ravel()) for key in ref}


@settings(max_examples=20, **HYPOTHESIS)
@given(case=ln_cases())
def test_layer_norm_stays_within_the_bound_of_torch_float64(layer_norm_mode, case):
    assert_within_bound(ln_vs_torch(case, layer_norm_mode.numeric_mode),
                        "%r layer_norm %r" % (layer_norm_mode, case))


def test_eps_zero_on_a_constant_row_is_nan_as_in_torch(layer_norm_mode):
    torch = pytest.importorskip("torch")
    x = Array.from_list([0.25] * 8, "float32").reshape((2, 4))
    ours = values(LF(x, None, None, 0.0, numeric_mode=layer_norm_mode.numeric_mode))
    ref = torch.nn.functional.layer_norm(torch.full((2, 4), 0.25, dtype=torch.float64), (4,), eps=0.0)
    assert all(math.isnan(v) for v in ours) and bool(torch.isnan(ref).all())


def test_every_nan_written_is_the_canonical_quiet_nan(layer_norm_identical):
    """eps = 0 on a constant row: xhat = 0 * inf. x86 and NVIDIA make NaNs of other signs and
    payloads; the contract writes 0x7fc00000 in y, dx and dweight (dbias, sums of dy, is finite)."""
    x = Array.from_list([0.25] * 8, "float32").reshape((2, 4))
    w, b, dy = mat((4,), 41, 0.5, 1.5), mat((4,), 42), mat((2, 4), 43)
    y = LF(x, w, b, 0.0, numeric_mode="identical")
    dx, dw, db = mt.layer_norm_backward(dy, x, w, b, 0.0, numeric_mode="identical")
    assert all(words(t) == {"7fc00000"} for t in (y, dx, dw)) and "7fc00000" not in words(db)


def _figures_case(rng):
    dim = rng.randint(*tol.RMS_DIM_RANGE)
    return {"rows": rng.randint(1, min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))), "dim": dim,
            "weight": rng.random() < 0.5, "bias": rng.random() < 0.5, "eps": rng.choice(tol.LN_EPS),
            "seed": rng.getrandbits(32)}


if __name__ == "__main__":   # worst share of the bound used per output: ours (identical, fast), torch float32
    print_family_figures("layer_norm", _figures_case, ln_vs_torch, int(sys.argv[1]) if len(sys.argv) > 1 else 200)
