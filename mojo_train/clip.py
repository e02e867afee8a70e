"""clip_grad_norm_: global L2-norm gradient clipping, bit-pinned in the identical numeric mode.

The norms follow native/contracts/clip.md's tree. The steps of mojo_train.optim that take
``max_norm`` clip with the same native code, so ``clip_grad_norm_(grads, c)`` returns the
total and writes the gradients that a step with ``max_norm=c`` computes. Gradients are scaled
in place through a pointer table (a list of separate arrays is neither packed nor copied); a
refusal writes nothing. The argument checks and pointer tables are shared with optim.py
(mojo_train._optim_common).
"""
import numbers
import threading

from . import _buffer
from ._errors import where_msg
from ._native import ffi, load, numeric_mode_arg
from ._optim_common import (_Registry, _indexed, _real, _refuse_overlap, _single, _switches,
                            _table_ranges)

__all__ = ["clip_grad_norm_"]

_CLIP_TABLES = threading.local()   # per thread and library: clip_grad_norm_'s last gradient list


def clip_grad_norm_(grads, max_norm, norm_type=2.0, error_if_nonfinite=True, foreach=None,
                    numeric_mode=None):
    """Scale ``grads`` in place so their total L2 norm is at most ``max_norm``; return the
    pre-clip total norm (a float).

    The norm is two-level, as torch's: each tensor's L2 norm by the pinned tree, then the L2
    norm of those norms in tensor order (the order is part of the answer). The coefficient is
    ``max_norm / (total + 1e-6)`` clamped to 1. Only ``norm_type=2`` and
    ``error_if_nonfinite=True`` are implemented: a NaN/inf total is refused, nothing written
    (``error_if_nonfinite=False``, torch's default, is refused by name). ``foreach`` may be
    None, False or True and changes nothing: the clip is one native pass over all tensors.
    A gradient listed twice (it would be scaled twice) is refused naming both positions.
    """
    where = "clip_grad_norm_"
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or float(norm_type) != 2.0:
        raise NotImplementedError(where_msg(where, "norm_type=%r is not implemented; only the L2 norm "
                                                   "(norm_type=2.0) is pinned" % (norm_type,)))
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
            keep = _Registry(grads, "grads", where, inplace=True, backend=backend)
            table, offsets, n = keep.table, keep.c_offsets, keep.n
        offs = memoryview(ffi.buffer(offsets, 4 * (n + 1))).cast("i").tolist()
        _refuse_overlap([_table_ranges(table, [4 * (b - a) for a, b in zip(offs, offs[1:])])],
                        _indexed("grads", _single(grads)), where, "pass each gradient once")
        if fast:
            last.put(grads, (table, offsets, n))
    out = ffi.new("float[2]")
    backend.check(backend.lib.mt_clip_grad_norm(table, out, offsets, mn, n), where)
    _buffer.wrote(None if hit is not None else keep)     # a remembered list holds our arrays only
    return float(out[0])
