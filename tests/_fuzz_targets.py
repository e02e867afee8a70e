"""The fuzz targets: every public entry point, its hostile arguments and its oracle.

This module holds the registry (``TARGETS``, ``EXEMPT``) and the stateless tensor functions
(elementwise, linear, RMSNorm, LayerNorm, the losses, the embedding functions);
tests/_fuzz_targets_attention.py holds attention, tests/_fuzz_targets_state.py the optimizers,
clipping and accumulation, tests/_fuzz_targets_random.py the random streams,
tests/_fuzz_targets_misc.py the schedules, Array, device memory, the Embedding layer and the
library's identity calls, tests/_fuzz_targets_torch.py mojo_train.torch's functional calls and
modules' forward.

The oracles are the tests' own (their replays of the contracts, exact in the identical numeric
mode: tests/_helpers.py, test_linear.py, test_rms_norm.py, test_layer_norm.py, test_embedding.py),
or torch in float64 within tests/tolerances.py's bound where no exact replay exists (SiLU, GELU,
cross-entropy);
the fused LM-head losses are held to what their contract promises, the bits of the separate
layers.
"""
import functools
import math

import numpy as np
from hypothesis import strategies as st

import tolerances as tol
from _fuzz_spec import (BOOL_BAD, F32, FnTarget, Ids, Scalar, bad, buf, count, int_bad, real_bad, reals,
                        shape_of)
from _helpers import add32, f32, fma32
from _layer_helpers import token_tree

LEAF = 1024
FILLS_EW = ("unit", "unit", "wide", "tiny", "zero", "huge")


# ---- oracle helpers ---------------------------------------------------------------------------

def host(x):
    from _fuzz_build import host_values
    return host_values(x)


def c_order(x):
    """A C-ordered numpy copy of a buffer's values (0-d stays 0-d)."""
    return np.array(host(x) if not isinstance(x, np.ndarray) else x, copy=True, order="C")


def assert_same_bits(got, want, what, nan_ok=False):
    """float32 ``got`` (any buffer or result) has exactly the bits of ``want`` (and its shape);
    ``nan_ok``: a NaN matches any NaN (IEEE leaves the payload of a NaN made by an invalid
    operation to the hardware)."""
    got = host(got) if not isinstance(got, np.ndarray) else got
    want = np.asarray(want, dtype=np.float32)
    assert tuple(got.shape) == tuple(want.shape), "%s: shape %r, expected %r" % (what, got.shape, want.shape)
    g, w = got.astype(np.float32).reshape(-1).view(np.uint32), want.reshape(-1).view(np.uint32)
    if nan_ok:
        both = np.isnan(got.astype(np.float32).reshape(-1)) & np.isnan(want.reshape(-1))
        g, w = np.where(both, 0, g), np.where(both, 0, w)
    if not np.array_equal(g, w):
        i = int(np.argmax(g != w))
        raise AssertionError("%s differs at flat index %d: got %r (0x%08x), expected %r (0x%08x)" % (
            what, i, float(got.reshape(-1)[i]), int(g[i]), float(want.reshape(-1)[i]), int(w[i])))


def f32_sat(x):
    """The float32 nearest to the double ``x``, overflowing to an infinity as C does."""
    try:
        return f32(x)
    except OverflowError:
        return float("inf") if x > 0 else float("-inf")


def fma_ieee(a, b, c):
    """fma32 for finite operands; with an infinity or NaN among them, IEEE's result (a double
    product of two floats is exact, so one rounding to float32 follows)."""
    if all(math.isfinite(v) for v in (a, b, c)):
        return fma32(a, b, c)
    return f32_sat(a * b + c)


def chain(us, vs):
    """acc = fma(u, v, acc) from +0.0 over the pairs, in order (linear.md's chains)."""
    acc = 0.0
    for u, v in zip(us, vs):
        acc = fma32(float(u), float(v), acc)
    return acc


def over_rows(rows, fold):
    """The token rule over ``rows`` row indices: ``fold(rows of one leaf)`` per leaf of 1024 (a
    list per leaf), met by the pairwise tree."""
    leaves = [fold(range(r0, min(r0 + LEAF, rows))) for r0 in range(0, rows, LEAF)] or [fold(range(0))]
    return token_tree(leaves)


def as_rows(x, width):
    """A (rows, width) view of a (..., width) tensor's values."""
    x = np.asarray(x, dtype=np.float32)
    return x.reshape(count(x.shape[:-1]), width)


def result_of(c):
    """The result of an elementwise call: ``out`` itself when given (checked to be returned)."""
    if c.lit("out") is not None:
        assert c.result is c.args["out"], "out= was given but another object was returned"
    return c.result


# ---- elementwise ------------------------------------------------------------------------------

class Elementwise(FnTarget):
    """One of the elementwise ops: inputs of one shape, an optional out= (fresh, an input itself,
    or a view partly overlapping an input: refused)."""

    dims = {"*S": (0, 3, 1, 4, (0,))}
    inputs = ()
    has_out = True
    fills = {}
    writes = ("out",)

    @functools.cached_property
    def params(self):
        ins = tuple(F32(n, ("*S",), fills=self.fills.get(n, FILLS_EW)) for n in self.inputs)
        return ins + ((F32("out", ("*S",), role="out", finite=False, optional=True, kw=True),) if self.has_out else ())

    def relate(self, draw, ctx, dims, ex, side):
        if not self.has_out or not ex.has("out") or side == "device":
            return
        shape = shape_of(("*S",), dims)
        how = draw(st.sampled_from(("fresh", "fresh", "input", "overlap")))
        first = self.inputs[draw(st.integers(0, len(self.inputs) - 1))]
        if how == "input" or how == "overlap" and count(shape) < 2:
            spec = ex.get(first)
            if spec[0] == "buf" and spec[3] not in ("array", "bytes_mv", "numpy", "Array", "torch"):
                ex.put(first, spec[:3] + ("numpy",) + spec[4:])      # an out= is writable, not requiring grad
            ex.put("out", ("alias", first, None))
        elif how == "overlap" and count(shape):
            ex.pool["mem"] = buf("float32", (count(shape) + 1,), "numpy", "unit", draw(st.integers(0, 99)))
            ex.put(first, ("view", "mem", None, 0, shape, "numpy"))
            ex.put("out", ("view", "mem", None, 1, shape, draw(st.sampled_from(("numpy", "bytes_mv")))))
            ex.fault(("out", first), "out partly overlaps %s" % first)

    def check(self, c):
        want = self.expected(*[np.asarray(c.before(n), dtype=np.float32) for n in self.inputs])
        got = result_of(c)
        self.compare(got, want)

    def compare(self, got, want):
        assert_same_bits(got, want, self.name)


class Add(Elementwise):
    name, fn, covers, inputs = "add", "add", ("mojo_train.add",), ("a", "b")

    def expected(self, a, b):
        with np.errstate(over="ignore"):
            return (a.astype(np.float64) + b.astype(np.float64)).astype(np.float32)   # double rounding is innocuous


class SiluForward(Elementwise):
    name, fn, covers, inputs = "silu_forward", "silu_forward", ("mojo_train.silu_forward",), ("x",)

    def expected(self, x):
        from test_elementwise import _torch_silu64
        return np.array(_torch_silu64(x.reshape(-1), [1.0] * x.size)[0]).reshape(x.shape)

    def compare(self, got, want):
        assert tuple(host(got).shape) == want.shape
        tol.assert_close_to_reference(host(got), want, self.name, unit=1.0)


class SiluBackward(SiluForward):
    name, fn, covers, inputs = "silu_backward", "silu_backward", ("mojo_train.silu_backward",), ("dy", "x")
    fills = {"dy": ("unit", "wide", "tiny", "zero")}       # dy * silu'(x) may overflow float32 from huge dy

    def expected(self, dy, x):
        from test_elementwise import _torch_silu64
        return np.array(_torch_silu64(x.reshape(-1), dy.reshape(-1))[1]).reshape(x.shape)


class ReluForward(Elementwise):
    name, fn, has_out = "relu_forward", "relu_forward", False
    covers, inputs = ("mojo_train.relu_forward",), ("x",)

    def expected(self, x):
        return np.where(x > 0, x, np.float32(0.0))


class ReluBackward(Elementwise):
    name, fn, has_out = "relu_backward", "relu_backward", False
    covers, inputs = ("mojo_train.relu_backward",), ("dy", "x")

    def expected(self, dy, x):
        return np.where(x > 0, dy, np.float32(0.0))


APPROXIMATE = Scalar("approximate", st.sampled_from(("none", "tanh")),
                     bad("erf", "Tanh", "", " none", None, 0, 1, True, b"none", ["none"]), optional=True)


class GeluForward(Elementwise):
    """GELU (either approximation, positional or by keyword) with out=; its oracle is torch in
    float64 within tests/tolerances.py's GELU bound (test_elementwise.py's reference and units:
    |x| for y, |dy| for dx)."""

    name, fn, covers, inputs = "gelu_forward", "gelu_forward", ("mojo_train.gelu_forward",), ("x",)

    @functools.cached_property
    def params(self):
        base = Elementwise.params.func(self)
        return base[:len(self.inputs)] + (APPROXIMATE,) + base[len(self.inputs):]

    def check(self, c):
        from test_elementwise import _torch_gelu
        x = np.asarray(c.before("x"), dtype=np.float32)
        dy = np.ones(x.shape, np.float32) if "dy" not in self.inputs else np.asarray(c.before("dy"), dtype=np.float32)
        y64, dx64 = _torch_gelu(x.reshape(-1).tolist(), dy.reshape(-1).tolist(), c.lit("approximate", "none"))
        want, unit = (dx64, np.abs(dy)) if "dy" in self.inputs else (y64, np.abs(x))
        got = host(result_of(c))
        assert tuple(got.shape) == x.shape, "%s: shape %r, expected %r" % (self.name, got.shape, x.shape)
        used, i = tol.bound_used(got.reshape(-1), want, unit.reshape(-1), tol.gelu_bound)
        assert used <= 1.0, "%s (%s): %.3g of the GELU bound at [%s]: ours %r, float64 %r" % (
            self.name, c.lit("approximate", "none"), used, i, float(got.reshape(-1)[i]), want[i])


class GeluBackward(GeluForward):
    name, fn, covers, inputs = "gelu_backward", "gelu_backward", ("mojo_train.gelu_backward",), ("dy", "x")
    fills = {"dy": ("unit", "wide", "tiny", "zero")}       # dy * gelu'(x) (up to 1.13) may overflow from huge dy


# ---- linear -----------------------------------------------------------------------------------

LAYER_FILLS = ("unit", "unit", "wide", "tiny", "zero")
def _flag(name):
    return Scalar(name, st.booleans(), BOOL_BAD, kw=True, optional=True)


class LinearForward(FnTarget):
    name, fn = "linear_forward", "linear_forward"
    covers = ("mojo_train.linear_forward",)
    dims = {"*L": (0, 2, 1, 3, (0,)), "K": (1, 4, (0,)), "N": (1, 4, (0,))}
    params = (F32("a", ("*L", "K")), F32("weight", ("N", "K")), F32("bias", ("N",), nullable=True, optional=True))

    def check(self, c):
        a, w, b = c.before("a"), c.before("weight"), c.before("bias")
        n, k = w.shape
        rows = as_rows(a, k)
        out = np.array([[chain(r, w[j]) for j in range(n)] for r in rows], dtype=np.float32).reshape(rows.shape[0], n)
        if b is not None:
            out = np.array([[f32(float(v) + float(b[j])) for j, v in enumerate(r)] for r in out],
                           dtype=np.float32).reshape(out.shape)
        assert_same_bits(c.result, out.reshape(a.shape[:-1] + (n,)), "linear_forward")


class LinearBackward(FnTarget):
    name, fn = "linear_backward", "linear_backward"
    covers = ("mojo_train.linear_backward",)
    dims = LinearForward.dims
    params = (F32("dc", ("*L", "N")), F32("a", ("*L", "K")), F32("weight", ("N", "K")),
              _flag("need_input_grad"), _flag("need_weight_grad"), _flag("need_bias_grad"))

    def check(self, c):
        dc, a, w = c.before("dc"), c.before("a"), c.before("weight")
        n, k = w.shape
        dcr, ar = as_rows(dc, n), as_rows(a, k)
        m = ar.shape[0]
        got = c.result
        want_len = 3 if c.lit("need_bias_grad", False) else 2
        assert isinstance(got, tuple) and len(got) == want_len, "returned %r" % (got,)
        if c.lit("need_input_grad", True):
            da = [[chain(dcr[i], w[:, p]) for p in range(k)] for i in range(m)]
            assert_same_bits(got[0], np.array(da, dtype=np.float32).reshape(a.shape), "da")
        else:
            assert got[0] is None, "da was not asked for"
        if c.lit("need_weight_grad", True):
            dw = over_rows(m, lambda rows: [chain(dcr[list(rows), j], ar[list(rows), p]) for j in range(n)
                                            for p in range(k)])
            assert_same_bits(got[1], np.array(dw, dtype=np.float32).reshape(n, k), "dweight")
        else:
            assert got[1] is None, "dweight was not asked for"
        if want_len == 3:
            db = over_rows(m, lambda rows: [_serial(dcr[list(rows), j]) for j in range(n)])
            assert_same_bits(got[2], np.array(db, dtype=np.float32).reshape(n), "dbias")


def _serial(values):
    acc = 0.0
    for v in values:
        acc = f32(acc + float(v))
    return acc


class Sessions(Scalar):
    """mlp_inference_sessions' ``inputs``: a list of (rows_i, width) float32 sessions."""

    def __init__(self):
        super().__init__("inputs", None, ())

    def valid(self, draw, ctx, dims, side):
        f32_arg = F32("session", ("R", "W"))
        items = []
        for _ in range(draw(st.integers(0, 3))):
            items.append(f32_arg.valid(draw, ctx, dict(dims, R=draw(st.integers(0, 3))), side))
        return ("tuple" if draw(st.integers(0, 4)) == 0 else "list", items)

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get("inputs")
        how = draw(st.sampled_from(("not a list", "item", "item", "width")))
        if how == "not a list" or not spec[1]:
            ex.put("inputs", buf("float32", (2, dims["W"]), "numpy"))
            ex.fault("inputs", "a buffer, not a list")
            return True
        items = list(spec[1])
        i = draw(st.integers(0, len(items) - 1))
        if how == "width":
            items[i] = ("buf",) + (items[i][1], (items[i][2][0], dims["W"] + 1)) + items[i][3:]
            ex.fault("inputs", "inputs[%d] of another width" % i)
        else:
            items[i], why = draw(st.sampled_from(((("lit", "abc"), "not a buffer"),
                                                  (("buf", "float64", items[i][2], "numpy", "unit", 0, ()), "float64"),
                                                  (("buf", "float32", items[i][2], "numpy", "unit", 0, ((0, "nan"),)),
                                                   "NaN"))))
            if why == "NaN" and not count(items[i][2]):
                return False
            ex.fault("inputs", "inputs[%d] %s" % (i, why))
        ex.put("inputs", (spec[0], items))
        return True


class MlpSessions(FnTarget):
    name, fn = "mlp_inference_sessions", "mlp_inference_sessions"
    covers = ("mojo_train.mlp_inference_sessions",)
    dims = {"W": (1, 3, (0,)), "H": (1, 3, (0,)), "O": (1, 3, (0,))}
    params = (Sessions(), F32("weight1", ("H", "W")), F32("bias1", ("H",), nullable=True),
              F32("weight2", ("O", "H")), F32("bias2", ("O",), nullable=True))

    def check(self, c):
        w1, b1, w2, b2 = (c.before(n) for n in ("weight1", "bias1", "weight2", "bias2"))
        hidden, width = w1.shape
        rows = [r for x in c.before("inputs") for r in as_rows(x, width)]
        out = []
        for r in rows:
            h = [chain(r, w1[j]) for j in range(hidden)]
            h = [f32(v + float(b1[j])) for j, v in enumerate(h)] if b1 is not None else h
            h = [v if v > 0 else 0.0 for v in h]
            o = [chain(h, w2[j]) for j in range(w2.shape[0])]
            out.append([f32(v + float(b2[j])) for j, v in enumerate(o)] if b2 is not None else o)
        assert_same_bits(c.result, np.array(out, dtype=np.float32).reshape(len(rows), w2.shape[0]),
                         "mlp_inference_sessions")


# ---- RMSNorm ----------------------------------------------------------------------------------

EPS = Scalar("eps", st.one_of(st.none(), reals(0.0, 1e-2), st.just(0.0)),
             real_bad(0.0, optional=True) + bad(1e39), kw=True, optional=True)


def _eps32(c):
    eps = c.lit("eps")
    return 2.0 ** -23 if eps is None else f32(float(eps))


def rms_rows(x, w, dy, eps):
    """test_rms_norm.py's replay per row: (y, dx, r) rows. A row whose mean square is 0 with
    eps 0 has r = +inf: its replay (a Python division by zero) is then done in numpy float32,
    IEEE's inf and NaN included (compare it with ``same_or_both_nan``)."""
    from test_rms_norm import chunk_tree, ref_rms_row
    d = x.shape[-1]
    xr = as_rows(x, d)
    dyr = None if dy is None else as_rows(dy, d)
    wl = None if w is None else [float(v) for v in w]
    rows = []
    for i in range(xr.shape[0]):
        xs, dys = [float(v) for v in xr[i]], None if dyr is None else [float(v) for v in dyr[i]]
        try:
            rows.append(ref_rms_row(xs, wl, dys, eps))
        except ZeroDivisionError:
            rows.append(_rms_row_at_zero(xr[i], w, None if dyr is None else dyr[i], chunk_tree))
    return rows


def _rms_row_at_zero(x, w, dy, chunk_tree):
    f = np.float32
    r = f(np.inf)
    w = np.ones_like(x) if w is None else np.asarray(w, dtype=np.float32)
    with np.errstate(all="ignore"):
        y = (x * r) * w
        if dy is None:
            return list(y), None, float(r)
        g = dy * w
        c = f(chunk_tree([(float(a), float(b)) for a, b in zip(g, x)]))
        k = (c / f(len(x))) * ((r * r) * r)
        return list(y), list(r * g - k * x), float(r)


class RmsNormForward(FnTarget):
    name, fn = "rms_norm_forward", "rms_norm_forward"
    covers = ("mojo_train.rms_norm_forward",)
    dims = {"*L": (0, 2, 1, 3, (0,)), "D": (1, 5, (0,))}
    params = (F32("x", ("*L", "D")), F32("weight", ("D",), nullable=True, optional=True), EPS)

    def check(self, c):
        x = c.before("x")
        y = [r[0] for r in rms_rows(x, c.before("weight"), None, _eps32(c))]
        assert_same_bits(c.result, np.array(y, dtype=np.float32).reshape(x.shape), "rms_norm_forward", nan_ok=True)


class RmsNormBackward(FnTarget):
    name, fn = "rms_norm_backward", "rms_norm_backward"
    covers = ("mojo_train.rms_norm_backward",)
    dims = RmsNormForward.dims
    params = (F32("dy", ("*L", "D")), F32("x", ("*L", "D")), F32("weight", ("D",), nullable=True, optional=True), EPS)

    def check(self, c):
        x, w, dy = c.before("x"), c.before("weight"), c.before("dy")
        d = x.shape[-1]
        xr, dyr = as_rows(x, d), as_rows(dy, d)
        rows = rms_rows(x, w, dy, _eps32(c))
        dx, dw = c.result
        assert_same_bits(dx, np.array([r[1] for r in rows], dtype=np.float32).reshape(x.shape), "dx", nan_ok=True)
        if w is None:
            assert dw is None, "dweight without a weight"
            return

        def leaf(idx):
            acc = [0.0] * d
            for i in idx:
                acc = [fma_ieee(float(dyr[i][j]), f32_sat(float(xr[i][j]) * rows[i][2]), acc[j]) for j in range(d)]
            return acc
        with np.errstate(all="ignore"):
            want = np.array(over_rows(xr.shape[0], leaf), dtype=np.float32).reshape(d)
        assert_same_bits(dw, want, "dweight", nan_ok=True)


# ---- LayerNorm --------------------------------------------------------------------------------

LN_EPS = Scalar("eps", st.one_of(reals(0.0, 1e-2), st.just(0.0), st.just(1e-5), st.just(1e-50)),
                real_bad(0.0) + bad(1e39, 3.5e38), optional=True)       # None too: torch's F.layer_norm takes a float


def _ln_eps32(c):
    return f32(float(c.lit("eps", 1e-5)))


def ln_rows(x, w, b, dy, eps):
    """test_layer_norm.py's replay per row: (y, dx, xhat) rows (a row whose variance plus eps is 0
    has r = +inf there)."""
    import test_layer_norm
    d = x.shape[-1]
    xr = as_rows(x, d)
    dyr = np.zeros_like(xr) if dy is None else as_rows(dy, d)
    wl, bl = (None if p is None else [float(v) for v in p] for p in (w, b))
    rows = []
    for i in range(xr.shape[0]):
        xs, dys = [float(v) for v in xr[i]], [float(v) for v in dyr[i]]
        rows.append(test_layer_norm.ref_ln_row(xs, wl, bl, dys, eps))
    return rows


class LayerNormForward(FnTarget):
    name, fn = "layer_norm_forward", "layer_norm_forward"
    covers = ("mojo_train.layer_norm_forward",)
    dims = {"*L": (0, 2, 1, 3, (0,)), "D": (1, 5, (0,))}
    params = (F32("x", ("*L", "D")), F32("weight", ("D",), nullable=True, optional=True),
              F32("bias", ("D",), nullable=True, optional=True), LN_EPS)

    def check(self, c):
        x = c.before("x")
        y = [r[0] for r in ln_rows(x, c.before("weight"), c.before("bias"), None, _ln_eps32(c))]
        assert_same_bits(c.result, np.array(y, dtype=np.float32).reshape(x.shape), self.name, nan_ok=True)


class LayerNormBackward(FnTarget):
    """bias's values enter no gradient (layer_norm.md): a NaN or inf in it is taken."""
    name, fn = "layer_norm_backward", "layer_norm_backward"
    covers = ("mojo_train.layer_norm_backward",)
    dims = LayerNormForward.dims
    params = (F32("dy", ("*L", "D")), F32("x", ("*L", "D")), F32("weight", ("D",), nullable=True, optional=True),
              F32("bias", ("D",), nullable=True, optional=True, finite=False), LN_EPS)

    def check(self, c):
        x, w, b, dy = c.before("x"), c.before("weight"), c.before("bias"), c.before("dy")
        d = x.shape[-1]
        dyr = as_rows(dy, d)
        rows = ln_rows(x, w, b, dy, _ln_eps32(c))
        got = c.result
        assert isinstance(got, tuple) and len(got) == 3, "returned %r" % (got,)
        dx, dw, db = got
        assert_same_bits(dx, np.array([r[1] for r in rows], dtype=np.float32).reshape(x.shape), "dx", nan_ok=True)

        def fold(step, of_row):
            def leaf(idx):
                acc = [0.0] * d
                for i in idx:
                    acc = [step(of_row(i, j), acc[j]) for j in range(d)]
                return acc
            with np.errstate(all="ignore"):
                return np.array(over_rows(dyr.shape[0], leaf), dtype=np.float32).reshape(d)
        for name, param, grad, want in (
                ("dweight", w, dw, lambda: fold(lambda t, acc: fma32(t[0], t[1], acc),
                                                lambda i, j: (float(dyr[i][j]), rows[i][2][j]))),
                ("dbias", b, db, lambda: fold(lambda t, acc: add32(acc, t), lambda i, j: float(dyr[i][j])))):
            if param is None:
                assert grad is None, "%s without its parameter" % name
            else:
                assert_same_bits(grad, want(), name, nan_ok=True)


# ---- losses -----------------------------------------------------------------------------------

REDUCTION = Scalar("reduction", st.sampled_from(("mean", "sum", "none")), bad("MEAN", None, 1, "avg", b"sum"),
                   kw=True, optional=True)
SMOOTHING = Scalar("label_smoothing", st.one_of(st.just(0.0), reals(0.0, 0.9)),
                   real_bad(0.0, 1.0, high_open=True), kw=True, optional=True)
CHUNK_ROWS = Scalar("chunk_rows", st.one_of(st.none(), st.integers(1, 5)), int_bad(1, optional=True), kw=True,
                    optional=True)


def _ignore_valid(dims):
    return st.sampled_from((-100, -100, -1, dims["V"] + 3, np.int64(-100), 2 ** 40))


IGNORE_BAD = bad(True, 1.5, "x", None, -2 ** 63, 2 ** 63, -2 ** 64)


class LossTarget(FnTarget):
    """Options the three losses share, kept coherent in the valid draw (num_items only with
    'mean', no gradient with 'none'); the incoherent pairs are faults."""

    def relate(self, draw, ctx, dims, ex, side):
        red = ex.get("reduction")
        red = "mean" if red is None else red[1]
        if red != "mean" and ex.has("num_items"):
            ex.drop("num_items")
        if red == "none" and ex.has("return_grad"):
            ex.put("return_grad", ("lit", False))
        ignore = ex.get("ignore_index")
        t = ex.get(self.targets)
        if ignore is not None and t is not None and draw(st.booleans()):       # some rows ignored
            value = int(ignore[1])
            if t[0] == "lit" and t[1]:
                ex.put(self.targets, ("lit", [value] + list(t[1][1:])))
            elif t[0] == "buf" and t[1] == "int64":
                ex.put(self.targets, t[:6] + (((0, value),),))
        if draw(st.integers(0, 5)) == 0:
            self._incoherent(draw, ex, red)

    def _incoherent(self, draw, ex, red):
        if red == "none":
            ex.add("return_grad", ("lit", True), True)
            ex.fault(("return_grad", "reduction"), "return_grad with reduction='none'", extra=("NotImplementedError",))
        elif "num_items" in [p.name for p in self.params] and red == "sum":
            ex.add("num_items", ("lit", 2), True)
            ex.fault(("num_items", "reduction"), "num_items without reduction='mean'")


def _ce_options(c):
    # the smoothing the native call computes with: rounded to float32 (2e-164 is 0 there)
    return {"reduction": c.lit("reduction", "mean"), "label_smoothing": float(np.float32(c.lit("label_smoothing", 0.0))),
            "num_items": c.lit("num_items"), "return_grad": c.lit("return_grad", False)}


def _targets_with_default_ignore(t, ignore):
    """The targets with ``ignore`` spelled -100 (test_loss.py's reference ignores -100)."""
    t = np.asarray(t, dtype=np.int64).reshape(-1)
    return np.where(t == ignore, -100, t) if ignore is not None else t


def unread_values_soft(ex, name):
    """A NaN or inf in the argument ``name`` that no output reads is a soft fault: it may be taken."""
    ex.faults = [(f[0], f[1], "soft", f[3]) if f[0] == (name,) and f[1].startswith("holds ") else f
                 for f in ex.faults]


def weight_unread_without_rows(ex, logits):
    """With no rows in the argument ``logits`` no output reads the class weight, so a NaN or inf
    in it may be taken (loss.md), as torch takes it."""
    spec = ex.get(logits)
    if spec is not None and spec[0] == "buf" and 0 in spec[2]:
        unread_values_soft(ex, "weight")


class CrossEntropy(LossTarget):
    """cross_entropy over (N, C) logits and class indices, with and without a per-class weight;
    the subclasses below take the other layouts torch takes."""

    name, fn, covers, targets = "cross_entropy", "cross_entropy", ("mojo_train.cross_entropy",), "targets"
    dims = {"N": (0, 5, ()), "V": (1, 6, (0,))}
    logits_shape, target_param = ("N", "V"), Ids("targets", ("N",), "V", extra_ok=(-100, -1))

    @functools.cached_property
    def params(self):
        return (F32("logits", self.logits_shape), self.target_param,
                F32("weight", ("V",), kw=True, optional=True),
                Scalar("ignore_index", _ignore_valid, IGNORE_BAD, kw=True, optional=True), REDUCTION, SMOOTHING,
                Scalar("num_items", lambda dims: st.one_of(st.none(), st.integers(1, 2 * count(
                    [dims[k] for k in self.target_param.shape if k in dims]) + 1)),
                       int_bad(1, optional=True), kw=True, optional=True),
                Scalar("return_grad", st.booleans(), BOOL_BAD, kw=True, optional=True))

    def one_fault(self, draw, ctx, dims, ex):
        """As the base; logits reshaped by a fault no longer match the targets drawn for the old
        shape (rows, positions, an unbatched (C,) input's one target): a refusal may name either.
        Without rows a NaN/inf weight enters no output: accepting it is allowed (loss.md)."""
        done = super().one_fault(draw, ctx, dims, ex)
        weight_unread_without_rows(ex, "logits")
        reshaped = any("logits" in f[0] and f[1].startswith("shape ") for f in ex.faults)
        if reshaped and ex.has(self.targets) and not ex.faulted(self.targets):
            ex.fault((self.targets,), "targets drawn for the logits' shape before the fault")
        return done

    def check(self, c):
        import torch
        from test_loss import bound_used_of, run_torch
        x = np.asarray(c.before("logits"), dtype=np.float32)
        t = c.before("targets") if c.before("targets") is not None else c.lit("targets")
        if isinstance(self.target_param, F32):         # probabilities (an empty list of ints reads as float)
            t = np.asarray(t, dtype=np.float32)
        else:
            t = _targets_with_default_ignore(t, int(c.lit("ignore_index", -100))).reshape(np.shape(t))
        opts = _ce_options(c)
        if c.before("weight") is not None:
            opts["weight"] = np.asarray(c.before("weight"), dtype=np.float64)
        ref = run_torch(x, t, torch.float64, **opts)
        ref32 = run_torch(x, t, torch.float32, **opts)      # where float32 itself overflows (bound_used_of)
        loss, grad = c.result if opts["return_grad"] else (c.result, None)
        got = {"loss": np.asarray(host(loss) if opts["reduction"] == "none" else loss, dtype=np.float64)}
        assert got["loss"].shape == ref["loss"].shape, "loss shape %r, torch's %r" % (got["loss"].shape,
                                                                                     ref["loss"].shape)
        if grad is not None:
            got["dlogits"] = np.asarray(host(grad), dtype=np.float64)
            assert got["dlogits"].shape == x.shape
        for name, used in bound_used_of(got, ref, x, t, opts, ref32).items():
            assert used <= 1.0, "%s: %.3g of the torch bound" % (name, used)


class CrossEntropyProbabilities(CrossEntropy):
    """Class probabilities: float32 targets of the logits' shape (any finite values)."""
    name = "cross_entropy probabilities"
    target_param = F32("targets", ("N", "V"), fills=("unit", "unit", "tiny", "zero"))


class CrossEntropyPositions(CrossEntropy):
    """(N, C, d) logits with (N, d) class indices: every position a row."""
    name = "cross_entropy positions"
    dims = {"N": (0, 3, ()), "V": (1, 5, (0,)), "P": (1, 3, (0,))}
    logits_shape, target_param = ("N", "V", "P"), Ids("targets", ("N", "P"), "V", as_list=False, extra_ok=(-100, -1))


class CrossEntropyUnbatched(CrossEntropy):
    """(C,) logits with a 0-d class index: one unbatched row."""
    name = "cross_entropy unbatched"
    dims = {"V": (1, 6, (0,))}
    logits_shape, target_param = ("V",), Ids("targets", (), "V", as_list=False, extra_ok=(-100, -1))


def _separate_head(c, hidden, weight, bias, target, **ce):
    """(loss, d_hidden, d_weight[, d_bias]) of the separate layers: the fused heads' contract."""
    import mojo_train as mt
    from test_lm_head import _separate

    class Mode:
        numeric_mode = c.mode
    width = weight.shape[1]
    h = mt.Array.from_bytes(as_rows(hidden, width).tobytes(), (count(hidden.shape[:-1]), width), "float32")
    w = mt.Array.from_bytes(np.ascontiguousarray(weight).tobytes(), weight.shape, "float32")
    b = None if bias is None else mt.Array.from_bytes(np.ascontiguousarray(bias).tobytes(), bias.shape, "float32")
    t = list(np.asarray(target, dtype=np.int64).reshape(-1))
    if ce.get("return_grad", True):
        ce.pop("return_grad", None)
        return _separate(h, w, b, t, Mode, **ce)
    ce.pop("return_grad", None)
    return (mt.cross_entropy(mt.linear_forward(h, w, b, numeric_mode=c.mode), t, numeric_mode=c.mode, **ce),)


def _compare_head(got, want, lead, what):
    loss = got[0] if isinstance(got, tuple) else got
    if isinstance(want[0], float):
        assert isinstance(loss, float) and np.float32(loss).tobytes() == np.float32(want[0]).tobytes(), \
            "%s loss %r, the separate layers give %r" % (what, loss, want[0])
    else:
        assert_same_bits(loss, host(want[0]).reshape(lead), what + " row losses")
    for i, g in enumerate(got[1:] if isinstance(got, tuple) else ()):
        w = host(want[1 + i])
        assert_same_bits(g, w.reshape(host(g).shape) if w.size == host(g).size else w, "%s gradient %d" % (what, i))


class ChunkedLmHead(LossTarget):
    name, fn, covers, targets = "chunked_lm_head_loss", "chunked_lm_head_loss", \
        ("mojo_train.chunked_lm_head_loss",), "targets"
    dims = {"*L": (1, 2, 0, 3, ()), "W": (1, 4, (0,)), "V": (1, 5, (0,))}
    params = (F32("hidden", ("*L", "W")), F32("weight", ("V", "W")), Ids("targets", ("*L",), "V"),
              Scalar("return_grad", st.booleans(), BOOL_BAD, optional=True), CHUNK_ROWS)

    def relate(self, draw, ctx, dims, ex, side):
        if draw(st.integers(0, 7)) == 0:
            name = draw(st.sampled_from(("ignore_index", "reduction", "label_smoothing", "bias")))
            ex.add(name, ("lit", {"ignore_index": -100, "reduction": "sum", "label_smoothing": 0.1}.get(name)), True)
            ex.fault(name, "%s= is linear_cross_entropy's" % name)

    def check(self, c):
        h, w = c.before("hidden"), c.before("weight")
        t = c.before("targets") if c.before("targets") is not None else c.lit("targets")
        grad = c.lit("return_grad", False)
        want = _separate_head(c, h, w, None, t, return_grad=grad)
        _compare_head(c.result if grad else (c.result,), want, h.shape[:-1], self.name)


class LinearCrossEntropy(LossTarget):
    name, fn, covers, targets = "linear_cross_entropy", "linear_cross_entropy", \
        ("mojo_train.linear_cross_entropy",), "target"
    dims = ChunkedLmHead.dims
    params = (F32("input", ("*L", "W")), F32("linear_weight", ("V", "W")),
              Ids("target", ("*L",), "V", extra_ok=(-100, -1)),
              F32("linear_bias", ("V",), kw=True, optional=True),
              Scalar("ignore_index", _ignore_valid, bad(True, 1.5, "x", -2 ** 63, 2 ** 63), kw=True, optional=True),
              REDUCTION, SMOOTHING,
              Scalar("num_items", lambda dims: st.one_of(st.none(), st.integers(1, 9)), int_bad(1, optional=True),
                     kw=True, optional=True),
              Scalar("return_grad", st.booleans(), BOOL_BAD, kw=True, optional=True), CHUNK_ROWS)

    def check(self, c):
        h, w, b = c.before("input"), c.before("linear_weight"), c.before("linear_bias")
        t = c.before("target") if c.before("target") is not None else c.lit("target")
        opts = _ce_options(c)
        ignore = c.lit("ignore_index")
        want = _separate_head(c, h, w, b, t, ignore_index=-100 if ignore is None else ignore, **opts)
        got = c.result if opts["return_grad"] else (c.result,)
        _compare_head(got, want, h.shape[:-1], self.name)


# ---- embedding functions ----------------------------------------------------------------------

class EmbeddingForward(FnTarget):
    name, fn = "embedding_forward", "embedding_forward"
    covers = ("mojo_train.embedding_forward",)
    dims = {"V": (1, 5, (0,)), "d": (1, 4, (0,)), "*I": (0, 2, 1, 3, (0,))}
    params = (F32("weight", ("V", "d"), finite=False), Ids("ids", ("*I",), "V"))

    def check(self, c):
        w = np.asarray(c.before("weight"), dtype=np.float32)
        ids = np.asarray(c.before("ids") if c.before("ids") is not None else c.lit("ids"), dtype=np.int64)
        assert_same_bits(c.result, w[ids.reshape(-1)].reshape(ids.shape + (w.shape[1],)), self.name)


class EmbeddingBackward(FnTarget):
    name, fn = "embedding_backward", "embedding_backward"
    covers = ("mojo_train.embedding_backward",)
    loose_shapes = True
    dims = EmbeddingForward.dims
    writes = ("grad",)
    params = (F32("dy", ("*I", "d")), Ids("ids", ("*I",), "V"),
              Scalar("vocab", lambda dims: st.just(dims["V"]), int_bad(1) + bad(2 ** 62, extra=("MemoryError",))),
              # (a vocab that disagrees with grad's rows may be refused naming grad: see relate)
              Scalar("padding_idx", lambda dims: st.one_of(st.none(), st.integers(-dims["V"], dims["V"] - 1))
                     if dims["V"] else st.none(), (), kw=True, optional=True),
              F32("grad", ("V", "d"), role="out", kw=True, optional=True),      # added into: NaN refused
              Scalar("plan", st.sampled_from(("auto", "scan", "sort")), bad("fast", None, 1, "AUTO"), kw=True,
                     optional=True))

    def one_fault(self, draw, ctx, dims, ex):
        done = FnTarget.one_fault(self, draw, ctx, dims, ex)
        if done and "vocab" in ex.faults[-1][0] and ex.has("grad"):   # grad is (vocab, d): its check may come first
            ex.faults[-1] = (ex.faults[-1][0] + ("grad",),) + ex.faults[-1][1:]
        return done

    def relate(self, draw, ctx, dims, ex, side):
        if draw(st.integers(0, 5)) == 0:        # padding_idx outside the table
            value = draw(st.sampled_from((dims["V"], -dims["V"] - 1, 1.5, True, "0")))
            ex.add("padding_idx", ("lit", value), True)
            ex.fault("padding_idx", "padding_idx=%r" % (value,))
        if side == "host" and ex.has("grad") and draw(st.integers(0, 4)) == 0:
            dy, g = ex.get("dy"), ex.get("grad")
            if dy[0] == "buf" and g[0] == "buf" and count(dy[2]) and count(g[2]):
                ex.pool["mem"] = buf("float32", (count(dy[2]) + count(g[2]),), "numpy", "unit", 3)
                ex.put("dy", ("view", "mem", None, 0, dy[2], "numpy"))
                ex.put("grad", ("view", "mem", None, count(dy[2]) - 1, g[2], "numpy"))
                ex.fault(("grad", "dy"), "grad overlaps dy")

    def check(self, c):
        from test_embedding import token_rule
        vocab = int(c.lit("vocab"))
        dy = np.asarray(c.before("dy"), dtype=np.float32)
        ids = np.asarray(c.before("ids") if c.before("ids") is not None else c.lit("ids"), dtype=np.int64).reshape(-1)
        d = dy.shape[-1]
        pad = c.lit("padding_idx")
        grad = c.before("grad")
        want = token_rule(np, dy.reshape(-1, d), ids, vocab, None if pad is None else pad % vocab,
                          None if grad is None else np.asarray(grad, dtype=np.float32))
        if grad is not None:
            assert c.result is c.args["grad"], "grad= was given but another object was returned"
        assert_same_bits(c.result, want, self.name)


# ---- the registry -----------------------------------------------------------------------------

def _registry():
    from _fuzz_targets_misc import MISC_TARGETS
    from _fuzz_targets_random import RANDOM_TARGETS
    from _fuzz_targets_state import STATE_TARGETS
    from _fuzz_targets_torch import TORCH_TARGETS
    from _fuzz_targets_attention import ATTENTION_TARGETS
    targets = [Add(), SiluForward(), SiluBackward(), GeluForward(), GeluBackward(), ReluForward(), ReluBackward(),
               LinearForward(), LinearBackward(), MlpSessions(), RmsNormForward(), RmsNormBackward(),
               LayerNormForward(), LayerNormBackward(), CrossEntropy(),
               CrossEntropyProbabilities(), CrossEntropyPositions(), CrossEntropyUnbatched(),
               ChunkedLmHead(), LinearCrossEntropy(), EmbeddingForward(), EmbeddingBackward()]
    targets += ATTENTION_TARGETS + STATE_TARGETS + RANDOM_TARGETS + MISC_TARGETS + TORCH_TARGETS
    return {t.name: t for t in targets}


TARGETS = _registry()


# The public names no target calls, and why (tests/test_fuzz.py holds the suite to this list).
_PROPERTY = "a read-only property that takes no argument; the oracles of the targets above read it"
EXEMPT = {
    "mojo_train.BackendError": "an exception class: raised by the loader, never called with data",
    "mojo_train.DropoutKey": "a namedtuple of plain values, built by hand or by dropout; its hostile fields reach "
                             "the library only through Generator.dropout_backward's key, which is fuzzed",
    "mojo_train.ConstantLR.config": "takes no argument; every schedule target's oracle compares it",
    "mojo_train.WarmupLinearLR.config": "takes no argument; every schedule target's oracle compares it",
    "mojo_train.WarmupCosineLR.config": "takes no argument; every schedule target's oracle compares it",
    "mojo_train.release_host_cache": "takes no argument; tests/test_host_blocks.py checks what it frees, and every "
                                     "target's large outputs pass through the cache it empties",
    "mojo_train.deferred_refusals": "a context manager over set_deferred_refusals and synchronize, whose arguments "
                                    "are fuzzed; tests/test_deferred.py checks what it does",
}
EXEMPT.update(("mojo_train.Array.%s" % p, _PROPERTY) for p in ("shape", "dtype", "itemsize", "size", "nbytes",
                                                                "ndim", "address"))
EXEMPT.update(("mojo_train.DeviceArray.%s" % p, _PROPERTY) for p in ("ptr", "size", "ndim"))
EXEMPT.update(("mojo_train.Generator.%s" % p, _PROPERTY) for p in ("seed", "counter"))
EXEMPT.update(("mojo_train.%s.n_total" % c, _PROPERTY) for c in ("SGD", "Adam", "AdamW"))
_GROUP_PROPERTY = ("a property over param_groups: every step target's oracle replays each group's values from "
                   "param_groups (the same dicts), and the Construct and add_param_group targets check them; a "
                   "target assigning hostile values through the property, then stepping, is still to come")
EXEMPT.update(("mojo_train.%s.%s" % (c, p), _GROUP_PROPERTY) for c, props in (
    ("SGD", ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "lr_schedule")),
    ("Adam", ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "lr_schedule")),
    ("AdamW", ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize", "lr_schedule"))) for p in props)
EXEMPT.update(("mojo_train.%s.steps" % c, "a read-only property (each tensor's step count); the step and "
                                          "add_param_group targets' oracles compare it") for c in ("Adam", "AdamW"))
_TORCH_LATER = "issue 13: targets to come (mojo_train.torch: torch tensors, the dtype refusals, the native oracle)"
EXEMPT.update(("mojo_train.torch.%s" % n, _TORCH_LATER) for n in (
    "dropout", "linear_cross_entropy",
    "manual_seed", "default_generator", "clip_grad_norm_"))
EXEMPT["mojo_train.torch.AutocastError"] = "an exception class: raised by mojo_train.torch, never called with data"
_MODULES = ("Linear", "RMSNorm", "Embedding", "SiLU", "ReLU", "Dropout", "CrossEntropyLoss", "LinearCrossEntropyLoss",
            "LayerNorm", "GELU")
EXEMPT.update(("mojo_train.torch.%s.forward" % m, _TORCH_LATER) for m in _MODULES
              if m not in ("Linear", "RMSNorm", "SiLU", "ReLU", "LayerNorm", "GELU"))
EXEMPT.update(("mojo_train.torch.%s" % m, "issue 13: constructor targets to come (tests/_fuzz_targets_torch.py "
                                          "builds the modules valid and fuzzes forward where it has a target)")
              for m in _MODULES)
EXEMPT.update(("mojo_train.torch.%s.extra_repr" % m, "takes no argument: the module's repr text") for m in _MODULES)
EXEMPT["mojo_train.torch.Embedding.from_pretrained"] = _TORCH_LATER
