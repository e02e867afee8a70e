"""Losses: cross-entropy here; the chunked language-model head and fused linear +
cross-entropy (``chunked_lm_head_loss``, ``linear_cross_entropy``) live in lm_head.py, their
family's module, and are re-exported here (``mojo_train.loss`` is their public home too).

``cross_entropy`` is torch's ``F.cross_entropy`` over class indices, with the gradient with
respect to the logits from the same call (there is no autograd here). Its arithmetic is
native/contracts/loss.md; its outputs are allocated here, so nothing the caller passed is
ever written, and a refused call raises before any result exists.
"""
from . import _buffer, _ops
from ._errors import refuse_keywords, where_msg
from ._loss_options import MAX_VOCAB, loss_options

__all__ = ["cross_entropy", "chunked_lm_head_loss", "linear_cross_entropy"]

from .lm_head import chunked_lm_head_loss, linear_cross_entropy  # noqa: E402  (the LM head)


# torch keywords cross_entropy does not take, and why; any other unknown keyword is refused too.
_REFUSED = {
    "weight": "per-class weights are not in loss v1: a weighted mean divides by a sum of floats, "
              "which would need its own pinned fold (the unweighted divisor is an exact count)",
    "size_average": "torch's deprecated alias of reduction; say reduction='mean', 'sum' or 'none'",
    "reduce": "torch's deprecated alias of reduction; say reduction='mean', 'sum' or 'none'",
    "input": "the logits are the first argument, named logits here",
    "target": "the class indices are the second argument, named targets here",
    "chunk_rows": "cross_entropy takes the logits whole; linear_cross_entropy computes them in chunks",
}


def _soft_targets(targets, where):
    """Refuse class-probability targets (a float buffer, a 2-D buffer, nested lists) by name;
    return what ``_ops.ids_in`` reads: the list itself, or the buffer's Probe (made once)."""
    why = ("class-probability (soft) targets are not supported (not in loss v1): give one class "
           "index per row")
    if isinstance(targets, (list, tuple)):
        if any(isinstance(v, (list, tuple)) for v in targets):
            raise ValueError(where_msg(where, "targets is a nested list; " + why))
        return targets
    try:
        p = _buffer.probe(targets, "targets", where)
    except TypeError:
        raise TypeError(where_msg(where, "targets must be an integer buffer or a list of ints, got %s"
                                  % type(targets).__name__)) from None
    if p.dtype.startswith(("float", "bfloat")):
        raise TypeError(where_msg(where, "targets has dtype %s; %s" % (p.dtype, why)))
    if len(p.shape) != 1:
        raise ValueError(where_msg(where, "targets must be 1-D (N,), got shape %r; %s" % (tuple(p.shape), why)))
    return p


def cross_entropy(logits, targets, ignore_index=-100, reduction="mean", label_smoothing=0.0,
                  num_items=None, return_grad=False, numeric_mode=None, **kwargs):
    """Cross-entropy over class indices, as ``torch.nn.functional.cross_entropy``, with the
    gradient with respect to the logits from the same call.

    Parameters
    ----------
    logits : float32 buffer of shape (N, V)
        C-contiguous float32 (never cast), on the host, or device memory on a GPU vendor
        (``DeviceArray``, torch CUDA tensors, anything with ``__cuda_array_interface__`` or
        DLPack). ``1 <= V < 2**24``; N may be 0. Every logit must be finite, in ignored rows
        too: a NaN or infinity raises ValueError naming the first such row.
    targets : integer buffer of shape (N,), or a list of ints
        One class index per row. int32 and int64 buffers are read in place; any other integer
        buffer (uint8, int16, ...) or a list is read as int64 on the host (on the device only
        int32 and int64 are taken). A value equal to ``ignore_index`` marks the row ignored
        (even when it is a valid class, as torch); any other value outside ``[0, V)`` raises
        ValueError naming the row. Bool and float targets are refused (soft targets are not
        supported).
    ignore_index : int, default -100
        The target value of ignored rows: their loss is 0, their gradient row is +0.0, and the
        mean does not count them. Any int64 but -2**63, which the native library reserves
        for "no ignore index" (``MT_NO_IGNORE_INDEX``, used by ``chunked_lm_head_loss``).
    reduction : {'mean', 'sum', 'none'}, default 'mean'
        'sum' adds the row losses by the token rule (leaves of 1024 rows, a pairwise tree of
        leaves); 'mean' divides that sum once by the count of non-ignored rows (or
        ``num_items``): with every row ignored it is NaN, as torch's. 'none' returns the
        per-row losses (0 for ignored rows) and has no gradient.
    label_smoothing : float, default 0.0
        In [0, 1): torch's ``(1 - eps) * nll + eps * mean_j(-log p_j)`` per row.
    num_items : int or None, default None
        The divisor of the mean (>= 1), e.g. Hugging Face's ``num_items_in_batch`` when a batch
        is split into micro-batches. Only with reduction='mean'. None: the non-ignored count.
    return_grad : bool, default False
        Also return ``dlogits``, d loss / d logits, of shape (N, V). Refused with
        reduction='none' (NotImplementedError).
    numeric_mode : {'identical', 'deterministic', 'fast'} or None
        The numeric mode; None takes ``MOJO_TRAIN_NUMERIC_MODE`` (default 'identical').

    Returns
    -------
    loss : float for 'mean' and 'sum'; for 'none' a float32 ``Array`` of shape (N,)
        (a ``DeviceArray`` when the logits are on the device).
    (loss, dlogits) with ``return_grad=True``: dlogits a new float32 ``Array`` (or
        ``DeviceArray``) of shape (N, V).

    Raises
    ------
    TypeError
        A non-float32 logits buffer, non-integer targets, a wrong type for an option, torch's
        ``weight=``, ``size_average=``, ``reduce=`` or any unknown keyword (each named).
    ValueError
        Shapes (logits not 2-D, V < 1 or V >= 2**24, targets not of N elements), a target
        out of range (its row named), NaN/inf logits (the row named), label_smoothing outside
        [0, 1), num_items < 1 or given without reduction='mean', ignore_index outside int64
        or -2**63. The options are checked before any tensor, by the one check the LM-head
        losses share (mojo_train/_loss_options.py).
    NotImplementedError
        return_grad=True with reduction='none'.

    Notes
    -----
    The identical numeric mode gives the same bits on every vendor, thread count and launch geometry;
    the bits differ from torch's (both are within float32 rounding of the exact value, see
    tests/test_loss.py). The call holds a few scratch floats per row besides the outputs.

    Examples
    --------
    >>> import array, mojo_train as mt
    >>> logits = mt.Array.from_list([0.5, 1.5, -1.0, 2.0, 0.0, 0.25], "float32").reshape(2, 3)
    >>> loss, dlogits = mt.cross_entropy(logits, [1, 0], return_grad=True)
    >>> round(loss, 4), dlogits.shape
    (0.3204, (2, 3))
    """
    where = "cross_entropy"
    refuse_keywords(kwargs, where, _REFUSED)
    red, ignore, eps, num, _, _ = loss_options(where, reduction=reduction, ignore_index=ignore_index,
                                               label_smoothing=label_smoothing, num_items=num_items,
                                               return_grad=return_grad)
    lp = _ops.f32_in(logits, "logits", where, ndim=2)
    n, vocab = lp.shape
    if not 1 <= vocab < MAX_VOCAB:
        raise ValueError(where_msg(where, "logits must have at least one class (V >= 1) and fewer than "
                                   "2**24, got shape %r" % (tuple(lp.shape),)))
    tp, tbytes = _ops.ids_in(_soft_targets(targets, where), n, "targets", where)
    backend, on_device = _ops.placement(where, numeric_mode, logits=lp, targets=tp)
    if red == 0:
        rows, out = _ops.out_f32((n,), on_device, backend.numeric_mode), None
    else:
        rows, out = None, _ops.out_f32((1,), on_device, backend.numeric_mode)
    dlogits = _ops.out_f32((n, vocab), on_device, backend.numeric_mode) if return_grad else None
    rc = backend.lib.mt_cross_entropy(_ops.fptr(out), _ops.fptr(rows), _ops.fptr(dlogits), _ops.fptr(lp),
                                      _ops.vptr(tp), tbytes, n, vocab, ignore, red, eps, num)
    backend.check(rc, where)
    if red == 0:
        loss = rows
    else:
        loss = float((out.to_host() if on_device else out)[0])
    return (loss, dlogits) if return_grad else loss
