"""Layer normalization over the last dimension: ``layer_norm_forward`` / ``layer_norm_backward``
(torch's ``F.layer_norm`` with ``normalized_shape = (D,)`` and its gradients).

Contract: native/contracts/layer_norm.md. Per row, the mean is the chunk tree of x
(native/contracts/clip.md) divided by D, the variance (biased, two-pass) the chunk tree of
``fma(x - mean, x - mean, acc)`` divided by D, and every scalar step is pinned; dweight and
dbias, contractions over rows, follow the token rule of linear.md (leaves of 1024 rows, a
pairwise tree over leaves). Float tensors are float32 and C-contiguous, never cast; leading
dimensions of ``(..., D)`` are rows. A NaN or infinity in any input an output depends on is
refused (ValueError naming it) and nothing the caller owns is written. Outputs are new arrays on the inputs'
side (``Array`` or ``DeviceArray``). ``mojo_train.nn`` re-exports every name here.
"""
from . import _ops
from ._errors import where_msg
from .rms_norm import _rms_args

__all__ = ["layer_norm_forward", "layer_norm_backward"]


def _ln_args(x, weight, bias, eps, where):
    """(x, weight, bias Probes, eps, D): RMSNorm's checks of x, weight and eps, then bias's."""
    if eps is None:       # torch's F.layer_norm takes a float; only rms_norm maps None to a default
        raise TypeError(where_msg(where, "eps must be a real number (torch's default is 1e-5), got None"))
    px, pw, eps, d = _rms_args(x, weight, eps, where)
    pb = None if bias is None else _ops.f32_in(bias, "bias", where, ndim=1)
    _ops.vector_of(pb, d, "bias", where)
    return px, pw, pb, eps, d


def layer_norm_forward(x, weight=None, bias=None, eps=1e-5, *, numeric_mode=None):
    """Layer normalization over the last dimension, as ``torch.nn.functional.layer_norm(x, (D,),
    weight, bias, eps)``: ``y = (x - mean) * r * weight + bias`` per row, ``r = 1 / sqrt(var +
    eps)`` with the biased variance.

    ``x`` is ``(..., D)``; ``weight`` and ``bias`` are ``(D,)`` or None (no scale, no shift:
    torch's ``elementwise_affine=False``, or either alone); ``eps`` >= 0 (torch's default
    1e-5), rounded to float32. Returns a new array shaped like ``x``. With ``eps = 0`` a
    constant row has r = inf and gives NaN, as torch does.
    """
    where = "layer_norm_forward"
    px, pw, pb, eps, d = _ln_args(x, weight, bias, eps, where)
    backend, on_device = _ops.placement(where, numeric_mode, x=px, weight=pw, bias=pb)
    y = _ops.out_f32(tuple(px.shape), on_device, numeric_mode)
    rc = backend.lib.mt_layer_norm_forward(_ops.fptr(y), _ops.fptr(px), _ops.fptr(pw), _ops.fptr(pb), eps,
                                           _ops.leading_rows(px.shape), d)
    backend.check(rc, where)
    return y


def layer_norm_backward(dy, x, weight=None, bias=None, eps=1e-5, *, numeric_mode=None):
    """Gradients of :func:`layer_norm_forward`: ``(dx, dweight, dbias)``.

    ``dy`` and ``x`` are ``(..., D)`` of one shape; ``weight``, ``bias`` and ``eps`` are the
    forward's. ``dweight`` and ``dbias`` (``(D,)`` each) are contractions over rows and follow
    the token rule; each is None when its parameter is None. ``bias``'s values enter no
    gradient: only whether it is given (and its shape) matters. The mean and the row scale are
    recomputed from ``x`` exactly as the forward computes them.
    """
    where = "layer_norm_backward"
    px, pw, pb, eps, d = _ln_args(x, weight, bias, eps, where)
    pdy = _ops.f32_in(dy, "dy", where)
    _ops.dy_like_x(pdy, px, where)
    backend, on_device = _ops.placement(where, numeric_mode, dy=pdy, x=px, weight=pw, bias=pb)
    dx = _ops.out_f32(tuple(px.shape), on_device, numeric_mode)
    dw = None if pw is None else _ops.out_f32((d,), on_device, numeric_mode)
    db = None if pb is None else _ops.out_f32((d,), on_device, numeric_mode)
    rc = backend.lib.mt_layer_norm_backward(_ops.fptr(dx), _ops.fptr(dw), _ops.fptr(db), _ops.fptr(pdy),
                                            _ops.fptr(px), _ops.fptr(pw), eps, _ops.leading_rows(px.shape), d)
    backend.check(rc, where)
    return dx, dw, db
