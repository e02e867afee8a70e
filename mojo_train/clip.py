"""clip_grad_norm_: global-norm gradient clipping (the 2-norm, the 1-norm and the max norm),
bit-pinned in the identical numeric mode.

The norms follow native/contracts/clip.md's tree. The steps of mojo_train.optim that take
``max_norm`` clip with the same native code (the 2-norm), so ``clip_grad_norm_(grads, c)``
returns the total and writes the gradients that a step with ``max_norm=c`` computes. Gradients
are scaled in place through a pointer table (a list of separate arrays is neither packed nor
copied); a refusal writes nothing. The argument checks and pointer tables are shared with
optim.py (mojo_train._optim_common).
"""
import numbers
import threading

from . import _buffer
from ._array import float32_at
from ._errors import where_msg
from ._native import ffi, load, numeric_mode_arg
from ._optim_common import (_Registry, _indexed, _real, _refuse_overlap, _single, _switches,
                            _table_ranges)

__all__ = ["clip_grad_norm_"]

_CLIP_TABLES = threading.local()   # per thread and library: clip_grad_norm_'s last gradient list
_NORM_TYPES = (2.0, 1.0, float("inf"))


def clip_grad_norm_(grads, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None,
                    numeric_mode=None):
    """Scale ``grads`` in place so that their total norm is at most ``max_norm``; return the
    pre-clip total norm (a float).

    The norm is two-level, as torch's: each tensor's norm, then the norm of those norms in
    tensor order (the order is part of the answer). ``norm_type`` is torch's: 2 (the default),
    1, or ``float('inf')`` (or the string ``'inf'``), the largest absolute value, which is
    exact. The 2- and 1-norms are sums by the pinned tree of native/contracts/clip.md. The
    coefficient is ``max_norm / (total + 1e-6)`` clamped to 1; below 1 every gradient is
    multiplied by it. A 0-element tensor has norm 0 (also for ``inf``, where torch refuses
    it) and an empty list returns 0.0, changing nothing.

    ``error_if_nonfinite`` defaults to torch's False: a NaN or infinite total is returned and
    the gradients are still scaled by the coefficient, as torch does (an infinite total gives
    coefficient 0: finite gradients become zeros, infinite ones NaN; a NaN total makes every
    gradient NaN). Every NaN written is the canonical 0x7fc00000, so the result is the same
    bits on every vendor. With ``error_if_nonfinite=True`` a non-finite total is refused
    (ValueError) before anything is written. ``foreach`` may be None, False or True and changes
    nothing: the clip is one native pass over all tensors. A gradient listed twice (it would be
    scaled twice) is refused naming both positions.
    """
    where = "clip_grad_norm_"
    p = _norm_type(norm_type, where)
    _switches(where, error_if_nonfinite=error_if_nonfinite, foreach=foreach)
    mn = _real(max_norm, "max_norm", where)
    backend = load(numeric_mode_arg(numeric_mode, where))
    last = _CLIP_TABLES.__dict__.setdefault(backend.path, _buffer.LastTable())
    hit = last.get(grads)
    if hit is not None:
        table, offsets, n = hit
    else:
        n = len(grads) if type(grads) in (list, tuple) else 0
        table, offsets = ffi.new("float *[]", max(n, 1)), ffi.new("int32_t[]", n + 1)
        keep = _buffer.float32_table(grads, None, table, inplace=True, offsets=offsets,
                                     device_ok=backend.has("device_buffers"))
        fast = keep is not None
        if not fast:
            keep = _Registry(grads, "grads", where, inplace=True, backend=backend, allow_empty=True)
            table, offsets, n = keep.table, keep.c_offsets, keep.n
        if n == 0:                  # an empty list: torch returns 0 and writes nothing
            return 0.0
        offs = memoryview(ffi.buffer(offsets, 4 * (n + 1))).cast("i").tolist()
        _refuse_overlap([_table_ranges(table, [4 * (b - a) for a, b in zip(offs, offs[1:])])],
                        _indexed("grads", _single(grads)), where, "pass each gradient once")
        if fast:
            last.put(grads, (table, offsets, n))
    out = ffi.new("float[2]")
    backend.check(backend.lib.mt_clip_grad_norm(table, out, offsets, mn, p, int(error_if_nonfinite), n), where)
    _buffer.wrote(None if hit is not None else keep)     # a remembered list holds our arrays only
    return float32_at(int(ffi.cast("uintptr_t", out)))


def _norm_type(value, where):
    """torch's ``norm_type`` as the float the native call takes: 2, 1 or inf, as a number or a
    string ``float()`` reads (torch converts it with ``float`` too); other p are not pinned."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, str)):
        raise TypeError(where_msg(where, "norm_type must be a real number or 'inf', got %r" % (value,)))
    try:
        p = float(value)
    except ValueError:
        raise ValueError(where_msg(where, "norm_type=%r is not a number; pass 2, 1 or 'inf'" % (value,))) from None
    except OverflowError:               # an int beyond a double
        p = None
    if p not in _NORM_TYPES:
        raise NotImplementedError(where_msg(where, "norm_type=%r is not implemented; the pinned norms are "
                                                   "2, 1 and inf" % (value,)))
    return p
