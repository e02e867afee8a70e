"""The language-model head without the logits: ``chunked_lm_head_loss`` and the fused
``linear_cross_entropy`` (named and shaped as torch 2.13's), both one ``mt_lm_head_loss`` call.

Contract (native/contracts/lm_head.md): the result is bit for bit what ``linear_forward`` ->
``cross_entropy`` -> ``linear_backward`` give when run separately (loss.md and linear.md: the
same chains, the same row trees, the token rule for the weight and bias gradients), while
at most ``chunk_rows`` rows of logits exist at a time. The chunk size changes memory and
speed, never a bit. Scratch memory is the library's own (``mojo_train.memory_stats``).
``mojo_train.loss`` re-exports both functions (their public home before this module).
"""
from . import _ops
from ._array import float32_at
from ._errors import refuse_keywords, where_msg
from ._loss_options import MAX_VOCAB, NO_IGNORE, loss_options
from ._native import ffi

__all__ = ["chunked_lm_head_loss", "linear_cross_entropy"]

# The user's name of each tensor, per entry point (the C library names them hidden, weight,
# bias, targets: its messages are renamed to these).
_NAMES = {
    "chunked_lm_head_loss": {"hidden": "hidden", "weight": "weight", "bias": "bias", "targets": "targets"},
    "linear_cross_entropy": {"hidden": "input", "weight": "linear_weight", "bias": "linear_bias",
                             "targets": "target"},
}

_NOT_IN_CHUNKED = ("is not taken by chunked_lm_head_loss (the mean over every row, each target a "
                   "class); linear_cross_entropy has it")
_REFUSED_CHUNKED = {k: _NOT_IN_CHUNKED for k in ("ignore_index", "reduction", "label_smoothing",
                                                   "num_items", "bias", "linear_bias")}
_REFUSED_LCE = {
    "weight": "per-class loss weights are not supported by the fused LM head (cross_entropy takes "
              "weight= on materialized logits)",
    "options": "torch's chunking options are not supported; chunk_rows= sets the chunk size, which "
               "never changes a bit",
}


def _tensors(where, hidden, weight, bias):
    """Probes of (hidden, weight, bias), refused by the caller's names; and (lead, rows, vocab, width)."""
    names = _NAMES[where]
    h = _ops.f32_in(hidden, names["hidden"], where)
    w = _ops.f32_in(weight, names["weight"], where, 2)
    if len(h.shape) < 2:
        raise ValueError(where_msg(where, "%s must be at least 2-D (rows, width), got shape %r"
                                   % (names["hidden"], tuple(h.shape))))
    vocab, width = (int(d) for d in w.shape)
    if int(h.shape[-1]) != width:
        raise ValueError(where_msg(where, "the last dimension of %s is %d but %s has width %d"
                                   % (names["hidden"], int(h.shape[-1]), names["weight"], width)))
    if not 1 <= vocab < MAX_VOCAB:
        raise ValueError(where_msg(where, "%s has %d rows (the classes); 1 to 2**24 - 1 are supported"
                                   % (names["weight"], vocab)))
    if width < 1:
        raise ValueError(where_msg(where, "%s has width 0 (shape %r); the width must be >= 1"
                                   % (names["weight"], tuple(w.shape))))
    b = None
    if bias is not None:
        b = _ops.f32_in(bias, names["bias"], where, 1)
        if int(b.shape[0]) != vocab:
            raise ValueError(where_msg(where, "%s has %d elements, the classes (rows of %s) %d"
                                       % (names["bias"], int(b.shape[0]), names["weight"], vocab)))
    lead = tuple(int(d) for d in h.shape[:-1])
    rows = 1
    for d in lead:
        rows *= d
    return h, w, b, lead, rows, vocab, width


def _lm_head_call(where, hidden, weight, bias, targets, opts, numeric_mode):
    """Shared body: (loss, d_hidden, d_weight, d_bias) with None where not asked; ``opts``
    are the checked ``LossOptions``."""
    names = _NAMES[where]
    h, w, b, lead, rows, vocab, width = _tensors(where, hidden, weight, bias)
    t, tbytes = _ops.ids_in(targets, rows, names["targets"], where, shape=lead)
    backend, dev = _ops.placement(where, numeric_mode, **{names["hidden"]: h, names["weight"]: w,
                                                         names["bias"]: b, names["targets"]: t})
    red, grad = opts.reduction, opts.return_grad
    loss = _ops.out_f32((1,), False, numeric_mode)
    row_loss = _ops.out_f32(lead, dev, numeric_mode) if red == 0 else None
    d_h = _ops.out_f32(tuple(h.shape), dev, numeric_mode) if grad else None
    d_w = _ops.out_f32((vocab, width), dev, numeric_mode) if grad else None
    d_b = _ops.out_f32((vocab,), dev, numeric_mode) if grad and b is not None else None
    rc = backend.lib.mt_lm_head_loss(
        _ops.fptr(loss) if red else ffi.NULL, _ops.fptr(row_loss), _ops.fptr(d_h), _ops.fptr(d_w),
        _ops.fptr(d_b), _ops.fptr(h), _ops.fptr(w), _ops.fptr(b), _ops.vptr(t), tbytes, rows, vocab,
        width, opts.ignore_index, red, opts.label_smoothing, opts.num_items, opts.chunk_rows)
    _ops.check(backend, rc, where, names)
    value = row_loss if red == 0 else float32_at(loss.address)
    return value, d_h, d_w, d_b


def chunked_lm_head_loss(hidden, weight, targets, return_grad=False, *, chunk_rows=None, numeric_mode=None,
                         **refused):
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``, never holding the
    (rows, vocab) logits.

    hidden : float32 (..., width) buffer (host, or device on a GPU vendor); leading
        dimensions are rows.
    weight : float32 (vocab, width), the output embedding in torch's layout.
    targets : integer buffer shaped like hidden's leading dimensions, or a list of ints for
        2-D hidden; every one in [0, vocab): there is no ignore index (a target of -100 or
        -2**63 is refused like any other outside the classes), nor bias, smoothing or another
        reduction (``linear_cross_entropy`` has them; those keywords are refused here by name).
    return_grad : bool; also return ``d_hidden`` (shaped like hidden) and ``d_weight``.
    chunk_rows : an int >= 1, rows of logits alive at a time (None: the library's choice);
        the bits do not depend on it.

    Options are checked as ``cross_entropy``'s (mojo_train/_loss_options.py). Returns the loss
    as a float, or ``(loss, d_hidden, d_weight)``; the gradients live where the inputs do.
    Bit for bit ``cross_entropy(linear_forward(hidden, weight), targets)`` and its
    ``linear_backward``.
    """
    where = "chunked_lm_head_loss"
    refuse_keywords(refused, where, _REFUSED_CHUNKED, "%s= %s")
    opts = loss_options(where, ignore_index=NO_IGNORE, return_grad=return_grad, chunk_rows=chunk_rows)
    value, d_h, d_w, _ = _lm_head_call(where, hidden, weight, None, targets, opts, numeric_mode)
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
    ignore_index : an int (None means torch's -100); rows whose target equals it count for
        nothing. -2**63 is reserved (the native library's "no ignore index") and refused.
    label_smoothing : a float in [0, 1). num_items : an int >= 1, the mean's divisor instead of
        the non-ignored count (reduction='mean' only).
    return_grad : bool; also return ``d_input`` and ``d_linear_weight`` (and ``d_linear_bias``
        when a bias is given), from the same call ('none' has no gradient: NotImplementedError).
    chunk_rows : an int >= 1, rows of logits alive at a time; the bits do not depend on it.

    Every option is checked as ``cross_entropy``'s (mojo_train/_loss_options.py), before any
    tensor; errors name the arguments as spelled here (input, linear_weight, linear_bias,
    target), including the native library's (a logit that overflows float32 names the row of
    input).

    Refused by name: ``weight=`` (per-class weights) and ``options=`` (torch's chunking
    options; use ``chunk_rows``), and any other keyword. Returns the loss (a float, or the
    per-row losses for 'none'), or ``(loss, d_input, d_linear_weight[, d_linear_bias])``.
    Bit for bit ``linear_forward`` -> ``cross_entropy`` -> ``linear_backward`` run separately.
    """
    where = "linear_cross_entropy"
    refuse_keywords({k: v for k, v in refused.items() if not (k in _REFUSED_LCE and v is None)}, where,
                    _REFUSED_LCE)                  # weight=None, options=None: torch's defaults, accepted
    opts = loss_options(where, reduction=reduction, ignore_index=-100 if ignore_index is None else ignore_index,
                        label_smoothing=label_smoothing, num_items=num_items, return_grad=return_grad,
                        chunk_rows=chunk_rows)
    value, d_h, d_w, d_b = _lm_head_call(where, input, linear_weight, linear_bias, target, opts, numeric_mode)
    if not return_grad:
        return value
    return (value, d_h, d_w) if linear_bias is None else (value, d_h, d_w, d_b)
