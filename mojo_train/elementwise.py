"""Elementwise ops: SiLU, GELU and ReLU (forward and backward) and the residual add.

Contract (native/contracts/elementwise.md): each output element is one pinned float32
function of the same element of the inputs, identical on every vendor's identical numeric mode:

    silu_forward    y  = x / (1 + exp(-x))                      (= x * sigmoid(x))
    silu_backward   dx = dy * (s * (1 + x * t))                 s = 1 / (1 + exp(-x)),
                                                                t = 1 - s (as exp(-x) * s for x > 0)
    gelu_forward    y  = (x * 0.5) * (1 + erf(x * 0.70710677))  approximate='none'
                    y  = (0.5 * x) * (1 + tanh(v)),             approximate='tanh',
                         v = 0.7978846 * (x + 0.044715 * x**3)
    gelu_backward   dx = dy * (cdf + x * pdf)                   torch's derivatives, torch's order
                    (tanh: dy * (0.5 (1 + t) + 0.5 x (1 - t**2) v'))
    add             out = a + b                                 (one rounding)
    relu_forward    y  = x if x > 0 else +0.0
    relu_backward   dx = dy if x > 0 else +0.0

with exp, 1 + erf and tanh the pinned mt_expf, mt_one_plus_erff and mt_tanhf ('none': 1 + erf by
Abramowitz and Stegun 7.1.26, torch's own CPU formula, and the pdf from the exp it forms, e^-(u*u)
with u = x * 0.70710677; elementwise.md version 3). The residual add's backward
is the identity: the gradient of out flows unchanged to both a and b, so there is no
add_backward. Inputs are float32 of one
shape -- nothing is broadcast: differing shapes are refused, even of one element count --
all on the host or all on the device. A refused call (a NaN or inf in any input, a bad
argument) leaves every caller buffer, ``out=`` included, byte for byte as it was. Without
``out=`` the new output is declared fresh to the native map (MT_MAP_OUT_FRESH), so the
finiteness check rides along in its one pass (one read of each input fewer; the output is
dropped on a refusal); with ``out=`` the check is a pre-pass.
``out=`` writes into a given float32 buffer of the inputs' shape: an input itself (in
place) or a buffer disjoint from them (partial overlaps are refused); otherwise a new Array
or DeviceArray is returned on the inputs' side.
"""
from . import _buffer, _native, _ops
from ._errors import where_msg

__all__ = ["silu_forward", "silu_backward", "gelu_forward", "gelu_backward", "add", "relu_forward",
           "relu_backward"]

_GELU_APPROXIMATE = _native._enum("mt_gelu_approximate", "MT_GELU_")   # {'none': 0, 'tanh': 1}


def _map(where, fn, inputs, out, numeric_mode, extra=()):
    """Run ``fn(out, *inputs, n, *extra, flags)`` with inputs = [(name, buffer), ...] of one shape."""
    if out is None and numeric_mode is None:
        result = _map_plain(where, fn, inputs, extra)
        if result is not None:
            return result
    out, fresh = _ops.unwrap_fresh(out)
    probes = [(name, _ops.f32_in(x, name, where)) for name, x in inputs]
    first, shape, n = probes[0][0], tuple(probes[0][1].shape), probes[0][1].nelems
    for name, p in probes[1:]:
        if tuple(p.shape) != shape:
            raise ValueError(where_msg(where, "%s has shape %r, %s has shape %r; %s does not broadcast: expand "
                                       "explicitly to one shape" % (first, shape, name, tuple(p.shape), where)))
    pout = _ops.out_arg(where, out, shape, probes)
    backend, on_device = _ops.placement(where, numeric_mode, out=pout, **dict(probes))
    result = out if out is not None else _ops.out_f32(probes[0][1].shape, on_device, numeric_mode, backend)
    target = pout if pout is not None else result
    backend.check(getattr(backend.lib, fn)(_ops.fptr_nonnull(target), *[_ops.fptr_nonnull(p) for _, p in probes], n,
                                           *extra, _ops.map_flags(pout, fresh)), where)
    _buffer.wrote(pout)
    return result


def _map_plain(where, fn, inputs, extra):
    """``_map`` of the common call -- our own arrays on one side, a new output, the environment's
    numeric mode -- without the probes (``_ops.plain_f32_inputs``); None when it does not apply
    (the general path then runs, with its refusals). The same native call and flags as that
    path: the new output is declared fresh, and a refusal drops it."""
    plain = _ops.plain_f32_inputs([x for _, x in inputs])
    if plain is None:
        return None
    on_device, shape, n, ptrs, _keep = plain
    backend = _native.load()
    if on_device and backend.vendor == "cpu":
        return None
    result = _ops.plain_out(shape, n, on_device, backend)
    backend.check(getattr(backend.lib, fn)(_ops.fptr(result), *ptrs, n, *extra, _ops.map_flags(None)), where)
    return result


def silu_forward(x, *, out=None, numeric_mode=None):
    """SiLU of float32 ``x``: ``x / (1 + exp(-x))`` elementwise (exp(-x) overflowing to inf
    below x = -88.72 gives -0.0, never NaN)."""
    return _map("silu_forward", "mt_silu_forward", [("x", x)], out, numeric_mode)


def silu_backward(dy, x, *, out=None, numeric_mode=None):
    """Gradient of SiLU at ``x``: ``dy * (s * (1 + x * (1 - s)))``, s = sigmoid(x), with
    1 - s formed as exp(-x) * s for x > 0 so that it keeps its digits as s nears 1."""
    return _map("silu_backward", "mt_silu_backward", [("dy", dy), ("x", x)], out, numeric_mode)


def _approximate(value, where):
    """The native code of GELU's ``approximate`` ('none' or 'tanh', as torch spells them)."""
    if not isinstance(value, str) or value not in _GELU_APPROXIMATE:
        raise ValueError(where_msg(where, "approximate must be 'none' or 'tanh', got %r" % (value,)))
    return _GELU_APPROXIMATE[value]


def gelu_forward(x, approximate="none", *, out=None, numeric_mode=None):
    """GELU of float32 ``x``, as ``torch.nn.functional.gelu``: ``approximate='none'`` is
    ``(x * 0.5) * (1 + erf(x * 0.70710677))`` with ``1 + erf`` one pinned routine; ``'tanh'`` is
    ``(0.5 * x) * (1 + tanh(0.7978846 * (x + 0.044715 * x**3)))`` through the pinned tanh.
    Never NaN for a finite ``x``; ``-0.0`` from x = -5.657 down ('none': ``x * 0.70710677`` at its
    clamp, -4) or below -5.158 ('tanh', where ``1 + tanh`` rounds to 0)."""
    where = "gelu_forward"
    code = _approximate(approximate, where)
    return _map(where, "mt_gelu_forward", [("x", x)], out, numeric_mode, (code,))


def gelu_backward(dy, x, approximate="none", *, out=None, numeric_mode=None):
    """Gradient of :func:`gelu_forward` at ``x`` times ``dy``, by torch's formulas: 'none'
    ``dy * (cdf + x * pdf)`` with ``cdf = 0.5 * (1 + erf(x / sqrt 2))``, ``pdf =
    exp(-x**2 / 2) / sqrt(2 pi)``; 'tanh' ``dy * (0.5 * (1 + t) + (0.5 * x * (1 - t**2)) *
    sqrt(2/pi) * (1 + 3 * 0.044715 * x**2))``, t the forward's tanh (finite for every finite x)."""
    where = "gelu_backward"
    code = _approximate(approximate, where)
    return _map(where, "mt_gelu_backward", [("dy", dy), ("x", x)], out, numeric_mode, (code,))


def add(a, b, *, out=None, numeric_mode=None):
    """The residual add ``a + b`` of two float32 tensors of one shape (one rounding; subnormal
    sums kept). Shapes must be equal: torch would broadcast (5, 1) + (5,) to (5, 5); this
    refuses it, so expand explicitly. Its backward is the identity: d(out) is the gradient of
    a and of b."""
    return _map("add", "mt_add", [("a", a), ("b", b)], out, numeric_mode)


# ---- ReLU (elementwise.md, "ReLU"): a new output of the input's shape, no out= -------------------


def relu_forward(x, *, numeric_mode=None):
    """``max(x, 0)`` elementwise, as ``torch.relu`` (-0.0 becomes +0.0). Any shape."""
    where = "relu_forward"
    px = _ops.f32_in(x, "x", where)
    backend, on_device = _ops.placement(where, numeric_mode, x=px)
    y = _ops.out_f32(tuple(px.shape), on_device, numeric_mode)
    backend.check(backend.lib.mt_relu_forward(_ops.fptr(y), _ops.fptr(px), px.nelems), where)
    return y


def relu_backward(dy, x, *, numeric_mode=None):
    """Gradient of :func:`relu_forward`: ``dy`` where ``x > 0``, else +0.0 (torch's choice
    at 0). ``dy`` and ``x`` have one shape."""
    where = "relu_backward"
    pdy = _ops.f32_in(dy, "dy", where)
    px = _ops.f32_in(x, "x", where)
    _ops.dy_like_x(pdy, px, where)
    backend, on_device = _ops.placement(where, numeric_mode, dy=pdy, x=px)
    dx = _ops.out_f32(tuple(px.shape), on_device, numeric_mode)
    rc = backend.lib.mt_relu_backward(_ops.fptr(dx), _ops.fptr(pdy), _ops.fptr(px), px.nelems)
    backend.check(rc, where)
    return dx
