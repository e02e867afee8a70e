"""The language-model head without the logits: ``chunked_lm_head_loss`` and the fused
``linear_cross_entropy`` (named and shaped as torch 2.13's), both one ``mt_lm_head_loss`` call.

Contract: the result is bit for bit what ``linear_forward`` -> ``cross_entropy`` ->
``linear_backward`` give when run separately (native/contracts/loss.md and dense.md: the
same chains, the same row trees, the token rule for the weight and bias gradients), while
at most ``chunk_rows`` rows of logits exist at a time. The chunk size changes memory and
speed, never a bit. Scratch memory is the library's own (``mojo_train.memory_stats``).
"""
from . import _ops
from ._errors import where_msg
from ._native import ffi

_REDUCTIONS = {"none": 0, "sum": 1, "mean": 2}
_NO_IGNORE = -(2 ** 63)   # no target can equal it and be in range


def _lm_head_call(where, hidden, weight, bias, targets, ignore_index, reduction, label_smoothing,
                  num_items, return_grad, chunk_rows, numeric_mode):
    """Shared body: (loss, row_loss, d_hidden, d_weight, d_bias) with None where not asked."""
    h = _ops.f32_in(hidden, "hidden" if where == "chunked_lm_head_loss" else "input", where)
    wname = "weight" if where == "chunked_lm_head_loss" else "linear_weight"
    w = _ops.f32_in(weight, wname, where, 2)
    if len(h.shape) < 2:
        raise ValueError(where_msg(where, "%s must be at least 2-D (rows, width), got shape %r"
                                   % ("hidden" if where == "chunked_lm_head_loss" else "input", tuple(h.shape))))
    vocab, width = (int(d) for d in w.shape)
    if int(h.shape[-1]) != width:
        raise ValueError(where_msg(where, "the input's last dimension is %d but %s has width %d"
                                   % (int(h.shape[-1]), wname, width)))
    if vocab < 1:
        raise ValueError(where_msg(where, "%s has no rows (vocab 0)" % wname))
    lead = tuple(int(d) for d in h.shape[:-1])
    rows = 1
    for d in lead:
        rows *= d
    b = None
    if bias is not None:
        b = _ops.f32_in(bias, "linear_bias", where, 1)
        if int(b.shape[0]) != vocab:
            raise ValueError(where_msg(where, "linear_bias has %d elements, the vocabulary %d"
                                       % (int(b.shape[0]), vocab)))
    t, tbytes = _ops.ids_in(targets, rows, "target" if where == "linear_cross_entropy" else "targets", where)
    if reduction not in _REDUCTIONS:
        raise ValueError(where_msg(where, "reduction=%r; it must be 'none', 'sum' or 'mean'" % (reduction,)))
    red = _REDUCTIONS[reduction]
    if return_grad and red == 0:
        raise ValueError(where_msg(where, "reduction='none' has no gradient here: an upstream "
                                   "per-row gradient is not supported; use 'sum' or 'mean'"))
    eps = float(label_smoothing)
    if not 0.0 <= eps < 1.0:
        raise ValueError(where_msg(where, "label_smoothing must be in [0, 1), got %r" % (label_smoothing,)))
    if num_items is not None and int(num_items) < 1:
        raise ValueError(where_msg(where, "num_items must be >= 1, got %r" % (num_items,)))
    if chunk_rows is not None and int(chunk_rows) < 1:
        raise ValueError(where_msg(where, "chunk_rows must be >= 1, got %r" % (chunk_rows,)))
    backend, dev = _ops.placement(where, numeric_mode, input=h, weight=w, bias=b, target=t)
    loss = _ops.out_f32((1,), False, numeric_mode)
    row_loss = _ops.out_f32(lead, dev, numeric_mode) if red == 0 else None
    d_h = _ops.out_f32(tuple(h.shape), dev, numeric_mode) if return_grad else None
    d_w = _ops.out_f32((vocab, width), dev, numeric_mode) if return_grad else None
    d_b = _ops.out_f32((vocab,), dev, numeric_mode) if return_grad and b is not None else None
    rc = backend.lib.mt_lm_head_loss(
        _ops.fptr(loss) if red else ffi.NULL, _ops.fptr(row_loss), _ops.fptr(d_h), _ops.fptr(d_w),
        _ops.fptr(d_b), _ops.fptr(h), _ops.fptr(w), _ops.fptr(b), _ops.vptr(t), tbytes, rows, vocab,
        width, int(ignore_index), red, eps, 0 if num_items is None else int(num_items),
        0 if chunk_rows is None else int(chunk_rows))
    backend.check(rc, where)
    value = row_loss if red == 0 else float(loss[0])
    return value, d_h, d_w, d_b


def chunked_lm_head_loss(hidden, weight, targets, return_grad=False, *, chunk_rows=None, numeric_mode=None):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, never holding the
    (rows, vocab) logits.

    hidden : float32 (rows, width) buffer (host, or device on a GPU vendor).
    weight : float32 (vocab, width), the output embedding in torch's layout.
    targets : integer buffer or list of ints, (rows,), every one in [0, vocab) (no ignore
        index, bias or smoothing here: ``linear_cross_entropy`` has them).
    return_grad : also return ``d_hidden`` (rows, width) and ``d_weight`` (vocab, width).
    chunk_rows : rows of logits alive at a time (None: the library's choice); the bits do not
        depend on it.

    Returns the loss as a float, or ``(loss, d_hidden, d_weight)``; the gradients live where
    the inputs do. Bit for bit ``cross_entropy(linear_forward(hidden, weight), targets)`` and
    its ``linear_backward``.
    """
    value, d_h, d_w, _ = _lm_head_call("chunked_lm_head_loss", hidden, weight, None, targets, _NO_IGNORE,
                                       "mean", 0.0, None, return_grad, chunk_rows, numeric_mode)
    return (value, d_h, d_w) if return_grad else value


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, reduction="mean", ignore_index=None,
                         label_smoothing=0.0, num_items=None, return_grad=False, chunk_rows=None,
                         numeric_mode=None, **refused):
    """``cross_entropy(linear(input, linear_weight, linear_bias), target)`` without the logits,
    named and shaped as torch 2.13's ``torch.nn.functional.linear_cross_entropy``.

    input : float32 (..., width); linear_weight : float32 (vocab, width); linear_bias :
        float32 (vocab,) or None (its gradient follows the token rule, like the weight's).
    target : integer class indices shaped like input's leading dimensions.
    reduction : 'mean' (default), 'sum' or 'none' (per-row losses; no gradient).
    ignore_index : None means torch's -100; rows whose target equals it count for nothing.
    label_smoothing : in [0, 1). num_items : the mean's divisor instead of the non-ignored count.
    return_grad : also return ``d_input`` and ``d_linear_weight`` (and ``d_linear_bias`` when a
        bias is given), from the same call.
    chunk_rows : rows of logits alive at a time; the bits do not depend on it.

    Refused by name: ``weight=`` (per-class weights) and ``options=`` (torch's chunking
    options; use ``chunk_rows``), and any other keyword. Returns the loss (a float, or the
    per-row losses for 'none'), or ``(loss, d_input, d_linear_weight[, d_linear_bias])``.
    Bit for bit ``linear_forward`` -> ``cross_entropy`` -> ``linear_backward`` run separately.
    """
    for name in sorted(refused):
        if name in ("weight", "options") and refused[name] is None:
            continue                       # torch's defaults, accepted
        if name == "weight":
            raise TypeError(where_msg("linear_cross_entropy", "weight= (per-class loss weights) is not "
                                      "supported: a weighted mean needs its own contract"))
        if name == "options":
            raise TypeError(where_msg("linear_cross_entropy", "options= (torch's chunking options) is not "
                                      "supported; chunk_rows= sets the chunk size, which never changes a bit"))
        raise TypeError(where_msg("linear_cross_entropy", "unexpected keyword argument %r" % name))
    value, d_h, d_w, d_b = _lm_head_call("linear_cross_entropy", input, linear_weight, linear_bias, target,
                                         -100 if ignore_index is None else int(ignore_index), reduction,
                                         label_smoothing, num_items, return_grad, chunk_rows, numeric_mode)
    if not return_grad:
        return value
    return (value, d_h, d_w) if linear_bias is None else (value, d_h, d_w, d_b)
