"""Losses: cross-entropy here; the chunked language-model head and fused linear +
cross-entropy (``chunked_lm_head_loss``, ``linear_cross_entropy``) live in lm_head.py, their
family's module, and are re-exported here (``mojo_train.loss`` is their public home too).

``cross_entropy`` is torch's ``F.cross_entropy`` (class indices or probabilities, class weights,
positions), with the gradient with respect to the logits from the same call (there is no
autograd here). Its arithmetic is native/contracts/loss.md; its outputs are allocated here, so
nothing the caller passed is ever written, and a refused call raises before any result exists.
"""
import re

from . import _buffer, _ops
from ._array import float32_at
from ._errors import refuse_keywords, where_msg
from ._loss_options import MAX_VOCAB, loss_options
from ._native import ffi

__all__ = ["cross_entropy", "chunked_lm_head_loss", "linear_cross_entropy"]

from .lm_head import chunked_lm_head_loss, linear_cross_entropy  # noqa: E402  (the LM head)


# torch keywords cross_entropy does not take, and why; any other unknown keyword is refused too.
_REFUSED = {
    "size_average": "torch's deprecated alias of reduction; say reduction='mean', 'sum' or 'none'",
    "reduce": "torch's deprecated alias of reduction; say reduction='mean', 'sum' or 'none'",
    "input": "the logits are the first argument, named logits here",
    "target": "the targets are the second argument, named targets here",
    "chunk_rows": "cross_entropy takes the logits whole; linear_cross_entropy computes them in chunks",
}
_NAMES = {"target_probs": "targets"}   # the C library's names of our arguments, where they differ
# A refusal after the library's one pass names the C outputs it left undefined; here those are
# this call's own new arrays, dropped on refusal, so none of the caller's buffers was written.
_UNDEFINED_TAIL = re.compile(r"; (?:dlogits|row_loss|dlogits and row_loss) left undefined, loss_out not written$")


def _nothing_of_yours_written(text):
    return _UNDEFINED_TAIL.sub("; nothing was written", text)


def _layout(lp, where):
    """(batch, vocab, inner, row shape) of logits (C,), (N, C) or (N, C, d1, ..., dk): the rows
    are the batch * inner positions, inner = d1 * ... * dk (1 without positions), and the row
    shape is the index targets' (and 'none''s losses')."""
    shape = tuple(lp.shape)
    if not shape:
        raise ValueError(where_msg(where, "logits must have a class dimension: (C,), (N, C) or (N, C, d1, ...), "
                                   "got a 0-d tensor"))
    batch, vocab, rest = (1, shape[0], ()) if len(shape) == 1 else (shape[0], shape[1], shape[2:])
    if not 1 <= vocab < MAX_VOCAB:
        raise ValueError(where_msg(where, "logits must have at least one class (V >= 1) and fewer than "
                                   "2**24, got shape %r" % (shape,)))
    inner = 1
    for d in rest:
        inner *= d
    return batch, vocab, inner, (() if len(shape) == 1 else (batch,) + rest)


def _targets(targets, lp, rows, row_shape, where):
    """(index Probe, its itemsize) for class indices, or (probability Probe, 0) for float
    targets: ``rows`` indices of the rows' shape, or probabilities of the logits' shape."""
    if isinstance(targets, (list, tuple)):
        if any(isinstance(v, (list, tuple)) for v in targets):
            raise ValueError(where_msg(where, "targets is a nested list; give class indices as an integer buffer "
                                       "(or a flat list for (N, C) logits), probabilities as a float32 buffer"))
        return _ops.ids_in(targets, rows, "targets", where, shape=row_shape)
    try:
        p = _buffer.probe(targets, "targets", where)
    except TypeError:
        raise TypeError(where_msg(where, "targets must be a buffer (integer class indices or float32 "
                                  "probabilities) or a list of ints, got %s" % type(targets).__name__)) from None
    if not p.dtype.startswith(("float", "bfloat")):
        return _ops.ids_in(p, rows, "targets", where, shape=row_shape)
    p = _ops.f32_in(p, "targets", where)
    if tuple(p.shape) != tuple(lp.shape):
        raise ValueError(where_msg(where, "targets has dtype float32 and shape %r: class probabilities must have "
                                   "the logits' shape %r (class indices: an integer buffer of shape %r)"
                                   % (tuple(p.shape), tuple(lp.shape), tuple(row_shape))))
    return p, 0


def _weight(weight, vocab, where):
    """The Probe of the class weights (None: no weight): float32 of shape (C,)."""
    if weight is None:
        return None
    wp = _ops.f32_in(weight, "weight", where)
    if tuple(wp.shape) != (vocab,):
        raise ValueError(where_msg(where, "weight must have shape (%d,) (one per class), got %r"
                                   % (vocab, tuple(wp.shape))))
    return wp


def cross_entropy(logits, targets, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  num_items=None, return_grad=False, numeric_mode=None, **kwargs):
    """Cross-entropy as ``torch.nn.functional.cross_entropy``, with the gradient with respect to
    the logits from the same call.

    Parameters
    ----------
    logits : float32 buffer of shape (N, C), (N, C, d1, ..., dk) or (C,)
        C-contiguous float32 (never cast), on the host, or device memory on a GPU vendor
        (``DeviceArray``, torch CUDA tensors, anything with ``__cuda_array_interface__`` or
        DLPack). ``1 <= C < 2**24``; N may be 0. (C,) is one unbatched row. With positions
        (d1, ..., dk) every position is a row of its own, as torch. Every logit must be finite,
        in ignored rows too: a NaN or infinity raises ValueError naming the first such row.
    targets : class indices, or class probabilities
        Class indices: an integer buffer of shape (N,), (N, d1, ..., dk) or () (for (C,)
        logits), or a list of ints for (N, C) logits. int32 and int64 buffers are read in place;
        any other integer buffer (uint8, int16, ...) or a list is read as int64 on the host (on
        the device only int32 and int64 are taken). A value equal to ``ignore_index`` marks the
        row ignored (even when it is a valid class, as torch); any other value outside
        ``[0, C)`` raises ValueError naming the row (its flat index). Probabilities: a float32
        buffer of the logits' shape, any finite values (rows need not sum to 1, as torch); no
        row is ignored. Other float dtypes and bool are refused (never cast).
    weight : float32 buffer of shape (C,) or None, default None
        Per-class weights, as torch: a row's loss is scaled by its target's weight (with
        probabilities, class j's term by ``weight[j]``), and 'mean' divides by the sum of the
        target weights of the rows not ignored (by the row count with probabilities). Finite
        values, zero and negative ones too; on the logits' side (host or device).
    ignore_index : int, default -100
        The target value of ignored rows: their loss is 0, their gradient row is +0.0, and the
        mean does not count them. Any int64 but -2**63, which the native library reserves
        for "no ignore index" (``MT_NO_IGNORE_INDEX``, used by ``chunked_lm_head_loss``).
        Unused with probabilities.
    reduction : {'mean', 'sum', 'none'}, default 'mean'
        'sum' adds the row losses by the token rule (leaves of 1024 rows, a pairwise tree of
        leaves); 'mean' divides that sum once by the divisor (the count of rows not ignored,
        the sum of their target weights, the row count with probabilities, or ``num_items``):
        a divisor of 0 gives NaN (every row ignored, no rows), as torch's. 'none' returns the
        per-row losses (0 for ignored rows) in the targets' shape (N, d1, ..., dk), and has no
        gradient.
    label_smoothing : float, default 0.0
        In [0, 1): torch's ``(1 - eps) * nll + eps * mean_j(-log p_j)`` per row (weighted as
        torch weights it); with probabilities, torch's ``y * (1 - eps) + eps / C``.
    num_items : int or None, default None
        The divisor of the mean (>= 1), e.g. Hugging Face's ``num_items_in_batch`` when a batch
        is split into micro-batches. Only with reduction='mean'. None: the divisor above.
    return_grad : bool, default False
        Also return ``dlogits``, d loss / d logits, of the logits' shape. Refused with
        reduction='none' (NotImplementedError).
    numeric_mode : {'identical', 'deterministic', 'fast'} or None
        The numeric mode; None takes ``MOJO_TRAIN_NUMERIC_MODE`` (default 'identical').

    Returns
    -------
    loss : float for 'mean' and 'sum'; for 'none' a float32 ``Array`` of the targets' shape
        (a ``DeviceArray`` when the logits are on the device).
    (loss, dlogits) with ``return_grad=True``: dlogits a new float32 ``Array`` (or
        ``DeviceArray``) of the logits' shape.

    Raises
    ------
    TypeError
        A non-float32 logits or weight buffer, float targets other than float32, bool
        targets, a wrong type for an option, torch's ``size_average=``, ``reduce=`` or any
        unknown keyword (each named).
    ValueError
        Shapes (0-d logits, C < 1 or C >= 2**24, targets of neither the rows' nor the logits'
        shape, weight not (C,)), a target out of range (its row named), NaN/inf logits,
        probabilities or weights (the row or class named), label_smoothing outside [0, 1),
        num_items < 1 or given without reduction='mean', ignore_index outside int64 or
        -2**63. The options are checked before any tensor, by the one check the LM-head
        losses share (mojo_train/_loss_options.py).
    NotImplementedError
        return_grad=True with reduction='none'.

    Notes
    -----
    The identical numeric mode gives the same bits on every vendor, thread count and launch
    geometry (native/contracts/loss.md); the bits differ from torch's (both are within float32
    rounding of the exact value, see tests/test_loss.py). The call holds a few scratch floats
    per row besides the outputs (with positions, also a tile of 16 rows of C on the CPU, or a
    transposed copy of the logits on a GPU). A weight of all ones gives the unweighted bits;
    one-hot probabilities without weight or smoothing give the class-index bits.

    Examples
    --------
    >>> import array, mojo_train as mt
    >>> logits = mt.Array.from_list([0.5, 1.5, -1.0, 2.0, 0.0, 0.25], "float32").reshape(2, 3)
    >>> loss, dlogits = mt.cross_entropy(logits, [1, 0], return_grad=True)
    >>> round(loss, 4), dlogits.shape
    (0.3204, (2, 3))
    >>> w = mt.Array.from_list([1.0, 2.0, 0.5], "float32")
    >>> round(mt.cross_entropy(logits, [1, 0], weight=w), 4)
    0.3375
    """
    where = "cross_entropy"
    refuse_keywords(kwargs, where, _REFUSED)
    red, ignore, eps, num, _, _ = loss_options(where, reduction=reduction, ignore_index=ignore_index,
                                               label_smoothing=label_smoothing, num_items=num_items,
                                               return_grad=return_grad)
    lp = _ops.f32_in(logits, "logits", where)
    batch, vocab, inner, row_shape = _layout(lp, where)
    tp, tbytes = _targets(targets, lp, batch * inner, row_shape, where)
    wp = _weight(weight, vocab, where)
    if inner == 0:      # positions of size 0: no rows at all, torch's empty batch (the library wants inner >= 1)
        batch, inner = 0, 1
    backend, on_device = _ops.placement(where, numeric_mode, logits=lp, targets=tp, weight=wp)
    if red == 0:
        rows, out = _ops.out_f32(row_shape, on_device, backend.numeric_mode, backend), None
    else:
        rows, out = None, _ops.out_f32((1,), on_device, backend.numeric_mode, backend)
    dlogits = _ops.out_f32(tuple(lp.shape), on_device, backend.numeric_mode, backend) if return_grad else None
    if tbytes and wp is None and inner == 1:       # loss.md's first sections: mt_cross_entropy itself
        rc = backend.lib.mt_cross_entropy(_ops.fptr(out), _ops.fptr(rows), _ops.fptr(dlogits), _ops.fptr(lp),
                                          _ops.vptr(tp), tbytes, batch, vocab, ignore, red, eps, num)
    else:
        rc = backend.lib.mt_cross_entropy_nd(
            _ops.fptr(out), _ops.fptr(rows), _ops.fptr(dlogits), _ops.fptr(lp), _ops.vptr(tp) if tbytes else ffi.NULL,
            ffi.NULL if tbytes else _ops.fptr(tp), _ops.fptr(wp), tbytes, batch, vocab, inner, ignore, red, eps, num)
    _ops.check(backend, rc, where, _NAMES, _nothing_of_yours_written)
    if red == 0:
        loss = rows
    else:
        host = out.to_host() if on_device else out    # held: its buffer must outlive the read
        loss = float32_at(host.address)
    return (loss, dlogits) if return_grad else loss
