"""RMS normalization over the last dimension: ``rms_norm_forward`` / ``rms_norm_backward``
(torch's ``F.rms_norm`` and its gradients).

Contract: native/contracts/rms_norm.md. Per row, the mean square is the chunk tree of
``fma(x, x, acc)`` (native/contracts/clip.md) divided by D, and every scalar step is pinned;
dweight, a contraction over rows, follows the token rule of linear.md (leaves of 1024 rows, a
pairwise tree over leaves). Float tensors are float32 and C-contiguous, never cast; leading
dimensions of ``(..., D)`` are rows. A NaN or infinity in any input is refused (ValueError
naming it) and nothing the caller owns is written. Outputs are new arrays on the inputs'
side (``Array`` or ``DeviceArray``). ``mojo_train.nn`` re-exports every name here.
"""
import numbers

from . import _ops
from ._errors import where_msg

__all__ = ["rms_norm_forward", "rms_norm_backward"]

FLOAT32_EPS = 2.0 ** -23   # torch.finfo(torch.float32).eps: F.rms_norm's eps when None


def _eps(eps, where):
    if eps is None:
        return FLOAT32_EPS
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real):
        raise TypeError(where_msg(where, "eps must be a real number or None, got %r" % (eps,)))
    try:
        value = float(eps)
    except OverflowError:            # an int beyond float range
        value = float("inf")
    if not (0.0 <= value <= 3.4028234663852886e38):
        raise ValueError(where_msg(where, "eps must be finite and >= 0 in float32, got %r" % (eps,)))
    return value


def _rms_args(x, weight, eps, where):
    px = _ops.f32_in(x, "x", where)
    _ops.at_least_1d(px, "x", "..., D", where)
    d = px.shape[-1]
    if d < 1:
        raise ValueError(where_msg(where, "x's last dimension D must be >= 1, got shape %r"
                                   % (tuple(px.shape),)))
    pw = None if weight is None else _ops.f32_in(weight, "weight", where, ndim=1)
    _ops.vector_of(pw, d, "weight", where)
    return px, pw, _eps(eps, where), d


def rms_norm_forward(x, weight=None, eps=None, *, numeric_mode=None):
    """RMS normalization over the last dimension, as ``torch.nn.functional.rms_norm(x, (D,),
    weight, eps)``: ``y = x * r * weight`` with ``r = 1 / sqrt(mean(x**2) + eps)`` per row.

    ``x`` is ``(..., D)``; ``weight`` is ``(D,)`` or None (no affine scale); ``eps`` >= 0, or
    None for torch's default ``finfo(float32).eps = 2**-23``, rounded to float32. The mean
    square is the chunk tree of ``fma(x, x, acc)`` (native/contracts/clip.md) divided by D.
    Returns a new array shaped like ``x``.
    """
    where = "rms_norm_forward"
    px, pw, eps, d = _rms_args(x, weight, eps, where)
    backend, on_device = _ops.placement(where, numeric_mode, x=px, weight=pw)
    y = _ops.out_f32(tuple(px.shape), on_device, numeric_mode, backend)
    rc = backend.lib.mt_rms_norm_forward(_ops.fptr(y), _ops.fptr(px), _ops.fptr(pw), eps, _ops.leading_rows(px.shape), d)
    backend.check(rc, where)
    return y


def rms_norm_backward(dy, x, weight=None, eps=None, *, numeric_mode=None):
    """Gradients of :func:`rms_norm_forward`: ``(dx, dweight)``.

    ``dy`` and ``x`` are ``(..., D)`` of one shape; ``weight`` and ``eps`` are the forward's.
    ``dweight`` (``(D,)``) is a contraction over rows and follows the token rule; it is None
    when ``weight`` is None (nothing to differentiate). The row scale is recomputed from ``x``
    exactly as the forward computes it.
    """
    where = "rms_norm_backward"
    px, pw, eps, d = _rms_args(x, weight, eps, where)
    pdy = _ops.f32_in(dy, "dy", where)
    _ops.dy_like_x(pdy, px, where)
    backend, on_device = _ops.placement(where, numeric_mode, dy=pdy, x=px, weight=pw)
    dx = _ops.out_f32(tuple(px.shape), on_device, numeric_mode, backend)
    dw = None if pw is None else _ops.out_f32((d,), on_device, numeric_mode, backend)
    rc = backend.lib.mt_rms_norm_backward(_ops.fptr(dx), _ops.fptr(dw), _ops.fptr(pdy), _ops.fptr(px),
                                          _ops.fptr(pw), eps, _ops.leading_rows(px.shape), d)
    backend.check(rc, where)
    return dx, dw
