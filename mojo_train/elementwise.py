"""Elementwise ops: SiLU (forward and backward) and the residual add.

Contract (native/contracts/elementwise.md): each output element is one pinned float32
function of the same element of the inputs, identical on every vendor's identical tier:

    silu_forward    y  = x / (1 + exp(-x))                      (= x * sigmoid(x))
    silu_backward   dx = dy * (s * (1 + x * t))                 s = 1 / (1 + exp(-x)),
                                                                t = 1 - s (as exp(-x) * s for x > 0)
    add             out = a + b                                 (one rounding)

with exp the pinned mt_expf. The residual add's backward is the identity: the gradient of
out flows unchanged to both a and b, so there is no add_backward. Inputs are float32 of one
size (shapes may differ; the output takes the first input's shape), all on the host or all
on the device; a NaN or inf in any input is refused (ValueError) and the caller's buffers
are left as they were. ``out=`` writes into a given float32 buffer (it may be an input:
in place); otherwise a new Array or DeviceArray is returned on the inputs' side.
"""
from . import _buffer, _ops
from ._errors import where_msg
from .random import _ptr

__all__ = ["silu_forward", "silu_backward", "add"]


def _map(where, fn, inputs, out, numeric_mode):
    """Run ``fn(out, *inputs, n)`` with inputs = [(name, buffer), ...] of one size."""
    probes = [(name, _ops.f32_in(x, name, where)) for name, x in inputs]
    n = probes[0][1].nelems
    for name, p in probes[1:]:
        if p.nelems != n:
            raise ValueError(where_msg(where, "%s has %d elements, %s has %d" % (name, p.nelems, probes[0][0], n)))
    pout = None if out is None else _buffer.float32_tensor(out, "out", where, inplace=True, allow_empty=True)
    if pout is not None and pout.nelems != n:
        raise ValueError(where_msg(where, "out has %d elements, %s has %d" % (pout.nelems, probes[0][0], n)))
    backend, on_device = _ops.placement(where, numeric_mode, out=pout, **dict(probes))
    result = out if out is not None else _ops.out_f32(probes[0][1].shape, on_device, numeric_mode)
    target = pout if pout is not None else result
    backend.check(getattr(backend.lib, fn)(_ptr(target), *[_ptr(p) for _, p in probes], n), where)
    return result


def silu_forward(x, *, out=None, numeric_mode=None):
    """SiLU of float32 ``x``: ``x / (1 + exp(-x))`` elementwise (exp(-x) overflowing to inf
    below x = -88.72 gives -0.0, never NaN)."""
    return _map("silu_forward", "mt_silu_forward", [("x", x)], out, numeric_mode)


def silu_backward(dy, x, *, out=None, numeric_mode=None):
    """Gradient of SiLU at ``x``: ``dy * (s * (1 + x * (1 - s)))``, s = sigmoid(x), with
    1 - s formed as exp(-x) * s for x > 0 so that it keeps its digits as s nears 1."""
    return _map("silu_backward", "mt_silu_backward", [("dy", dy), ("x", x)], out, numeric_mode)


def add(a, b, *, out=None, numeric_mode=None):
    """The residual add ``a + b`` of two float32 tensors of one size (one rounding; subnormal
    sums kept). Its backward is the identity: d(out) is the gradient of a and of b."""
    return _map("add", "mt_add", [("a", a), ("b", b)], out, numeric_mode)
