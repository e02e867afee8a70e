"""mojo_train.torch.functional: torch.nn.functional's names and signatures, computed by
mojo_train's native API, with autograd. ``import mojo_train.torch.functional as F`` in place of
``import torch.nn.functional as F``.

Contract: every function checks its tensors before anything runs -- float32 only (half, bfloat16
and float64 refused naming the dtype: nothing is cast), not under ``torch.autocast``, every
tensor on one CPU or CUDA device -- and refuses with ``mojo_train.torch.functional.<name>:``
(through a module, ``mojo_train.torch.nn.<Module>:``). Then one torch.autograd.Function
(_functions.py) calls the native forward, and its backward the native backward.
``numeric_mode=`` picks the numeric mode (None: ``MOJO_TRAIN_NUMERIC_MODE``, 'identical' unless
set). The native API's own refusals (shapes, NaN or infinity in an input, ids out of range, its
keywords) come through with its words, under the caller's entry point and argument names
(``a`` -> ``input``, ``dc`` -> ``grad_output``), and nothing the caller passed is written when a
call is refused. A name of torch.nn.functional without mojo_train arithmetic is an AttributeError
saying so (use torch's explicitly). The public functions are one-line calls of the private
ones, which the modules call with their own names.
"""
import numbers
import operator

import torch

from .. import embedding as _embedding
from .._buffer import RequiresGradError
from .._errors import where_msg
from .._native import numeric_mode_arg
from ..random import Generator
from . import _functions
from ._checkpoint import checkpoint_phase
from ._generator import default_generator
from ._names import not_here
from ._tensors import device_of, float32, indices, refuse_autocast

__all__ = ["linear", "rms_norm", "layer_norm", "embedding", "silu", "relu", "gelu", "dropout", "cross_entropy",
           "linear_cross_entropy", "scaled_dot_product_attention"]

_HERE = "torch.functional."


# ---- the public functions ----------------------------------------------------------------------
def linear(input, weight, bias=None, *, numeric_mode=None):
    """``input @ weight.T + bias`` as ``torch.nn.functional.linear``: input ``(..., K)``, weight
    ``(N, K)`` (torch's layout), bias ``(N,)`` or None; mojo_train.linear_forward, and
    linear_backward for the gradients autograd asks for."""
    return _linear(_HERE + "linear", input, weight, bias, numeric_mode)


def rms_norm(input, normalized_shape, weight=None, eps=None, *, numeric_mode=None):
    """RMS normalization over the last ``len(normalized_shape)`` dimensions, as
    ``torch.nn.functional.rms_norm``: ``y = x / sqrt(mean(x**2) + eps) * weight``; eps None is
    torch's ``finfo(float32).eps``. mojo_train.rms_norm_forward / rms_norm_backward over the
    trailing dimensions flattened into one (a view)."""
    return _rms_norm(_HERE + "rms_norm", input, normalized_shape, weight, eps, numeric_mode)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, *, numeric_mode=None):
    """Layer normalization over the last ``len(normalized_shape)`` dimensions, as
    ``torch.nn.functional.layer_norm``: ``(x - mean) / sqrt(var + eps) * weight + bias`` with the
    biased variance; mojo_train.layer_norm_forward / layer_norm_backward over the trailing
    dimensions flattened into one (a view)."""
    return _layer_norm(_HERE + "layer_norm", input, normalized_shape, weight, bias, eps, numeric_mode)


def gelu(input, approximate="none", *, numeric_mode=None):
    """GELU as ``torch.nn.functional.gelu`` (``approximate`` 'none': erf, with ``1 + erf`` one
    pinned routine of mojo_train's; 'tanh': torch's tanh formula); mojo_train.gelu_forward /
    gelu_backward."""
    return _gelu(_HERE + "gelu", input, approximate, numeric_mode)


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, *, generator=None, numeric_mode=None):
    """Attention as ``torch.nn.functional.scaled_dot_product_attention``: ``softmax(q k^T * scale
    + mask) v`` over ``(B, H, T, D)`` tensors (or ``(N, T, D)``: one head), by
    mojo_train.scaled_dot_product_attention and its backward (native/contracts/attention.md: the
    same bits on CPU and CUDA, no T x T matrix stored). ``attn_mask`` bool (True keeps) or float
    (added), without gradient; ``is_causal`` is torch's top-left alignment; ``enable_gqa`` lets
    key and value have fewer heads. A fully masked row gives 0 and no gradient (as torch 2.13's
    backends do; a plain ``softmax(s) @ v`` gives NaN). ``dropout_p > 0`` drops pairs of the
    probabilities as torch's does, drawn by a ``mojo_train.Generator`` (``generator=``, our
    keyword; else the numeric mode's default one, ``mojo_train.torch.manual_seed``) at one stream
    per call, replayed by the backward (attention.md, "Dropout"): the same bits on every device,
    not torch's random numbers. Like torch's, it drops whenever ``dropout_p > 0`` (pass 0 in
    evaluation). Refused under ``torch.utils.checkpoint`` with ``dropout_p > 0`` (either
    ``use_reentrant``): its re-run of the forward would draw the generator's next stream, not the
    first one's pairs (torch restores its own random state there, not a mojo_train.Generator's)."""
    return _attention_call(_HERE + "scaled_dot_product_attention", query, key, value, attn_mask, dropout_p,
                           is_causal, scale, enable_gqa, numeric_mode, generator)


def embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
              sparse=False, *, numeric_mode=None):
    """Rows of ``weight`` (num_embeddings, embedding_dim) at integer ids ``input`` (any shape), as
    ``torch.nn.functional.embedding``; the gradient of ``weight`` is the dense table summed by
    the token rule, its ``padding_idx`` row +0.0. ``max_norm``, ``scale_grad_by_freq=True`` and
    ``sparse=True`` are refused (mojo_train.Embedding's reasons)."""
    _embedding._refuse_torch_options(max_norm, norm_type, scale_grad_by_freq, sparse, {}, _HERE + "embedding")
    return _embedding_call(_HERE + "embedding", input, weight, padding_idx, numeric_mode)


def silu(input, inplace=False, *, numeric_mode=None):
    """``x * sigmoid(x)`` as ``torch.nn.functional.silu`` (mojo_train.silu_forward /
    silu_backward). ``inplace=True`` writes into ``input`` and keeps a copy of it for the
    backward (as torch does)."""
    return _silu(_HERE + "silu", input, inplace, numeric_mode)


def relu(input, inplace=False, *, numeric_mode=None):
    """``max(x, 0)`` as ``torch.nn.functional.relu`` (mojo_train.relu_forward / relu_backward;
    +0.0 where x <= 0, and a gradient of +0.0 there)."""
    return _relu(_HERE + "relu", input, inplace, numeric_mode)


def dropout(input, p=0.5, training=True, inplace=False, *, generator=None, numeric_mode=None):
    """Inverted dropout as ``torch.nn.functional.dropout``, drawn by a ``mojo_train.Generator``
    (``generator``; None: ``mojo_train.torch.default_generator(numeric_mode)``, seeded by
    ``mojo_train.torch.manual_seed``). Each call in training takes one stream id; the backward
    regenerates the mask from the forward's key (never stored). ``training=False`` returns
    ``input`` itself. p must lie in [0, 1) (p = 1 would drop everything: refused). p > 0 under
    ``torch.utils.checkpoint`` (either ``use_reentrant``) is refused: its re-run of the forward
    would draw another mask than the one the backward replays (mojo_train/torch/_checkpoint.py)."""
    return _dropout(_HERE + "dropout", input, p, training, inplace, generator, numeric_mode)


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0, *, numeric_mode=None, **kwargs):
    """Cross-entropy of logits ``input`` against ``target``, as
    ``torch.nn.functional.cross_entropy``: one mojo_train.cross_entropy(return_grad=True) call
    gives the loss and d loss / d input. Whatever that accepts is accepted here, unchanged:
    class indices or probability targets, a per-class ``weight``, (N, C, d1, ...) inputs, and
    further keywords (``num_items``, ...). No gradient flows to ``target`` or ``weight``. The
    gradient needs reduction='mean' or 'sum' (reduction='none' is forward-only, as in the
    native loss)."""
    options = dict(kwargs, ignore_index=ignore_index, reduction=reduction, label_smoothing=label_smoothing)
    for name, value in (("weight", weight), ("size_average", size_average), ("reduce", reduce)):
        if value is not None:       # passed only when given: the native loss refuses what it lacks, by name
            options[name] = value
    return _cross_entropy(_HERE + "cross_entropy", input, target, options, numeric_mode)


def linear_cross_entropy(input, linear_weight, target, *, linear_bias=None, weight=None, reduction="mean",
                         ignore_index=None, label_smoothing=0.0, options=None, numeric_mode=None, **kwargs):
    """``cross_entropy(linear(input, linear_weight, linear_bias), target)`` without the logits,
    as torch 2.13's ``torch.nn.functional.linear_cross_entropy``: one
    mojo_train.linear_cross_entropy(return_grad=True) call (the chunked LM head) gives the loss
    and the gradients of input, linear_weight and linear_bias. ``chunk_rows=`` and other
    keywords of mojo_train.linear_cross_entropy pass through; ``weight`` and ``options`` are
    passed on (the native head refuses them unless None)."""
    passed = dict(kwargs, weight=weight, reduction=reduction, ignore_index=ignore_index,
                  label_smoothing=label_smoothing, options=options)
    return _linear_cross_entropy(_HERE + "linear_cross_entropy", input, linear_weight, linear_bias, target,
                                 passed, numeric_mode)


def __getattr__(name):
    return not_here(__name__, torch.nn.functional, name)


# ---- the checks ---------------------------------------------------------------------------------
def _floats(where, numeric_mode, optional=(), **tensors):
    """Check float tensors (None refused by name, except those named in ``optional``), their
    device and autocast, and the numeric mode; return the numeric mode (None or its name)."""
    for name, t in tensors.items():
        if t is None and name not in optional:
            raise TypeError(where_msg(where, "%s must be a torch.Tensor, got None" % name))
        if t is not None:
            float32(t, name, where)
    refuse_autocast(where, device_of(where, **tensors))
    return numeric_mode_arg(numeric_mode, where)


def _inplace_target(input, inplace, where):
    """Refuse ``inplace=True`` on a leaf that requires grad in grad mode, before anything is
    written (torch refuses it too)."""
    if not isinstance(inplace, bool):
        raise TypeError(where_msg(where, "inplace must be True or False, got %r" % (inplace,)))
    if inplace and input.is_leaf and input.requires_grad and torch.is_grad_enabled():
        raise RequiresGradError(where_msg(where, "inplace=True on input, a leaf tensor that requires grad: "
                                          "autograd cannot differentiate a leaf written in place (torch "
                                          "refuses it too); pass inplace=False"))


def _normalized_shape(normalized_shape, input, where):
    try:
        shape = (operator.index(normalized_shape),)
    except TypeError:
        try:
            shape = tuple(operator.index(d) for d in normalized_shape)
        except TypeError:
            raise TypeError(where_msg(where, "normalized_shape must be an int or a sequence of ints, got %r"
                                      % (normalized_shape,))) from None
    if not shape or input.dim() < len(shape) or tuple(input.shape[input.dim() - len(shape):]) != shape:
        raise ValueError(where_msg(where, "input of shape %r does not end with normalized_shape %r"
                                   % (tuple(input.shape), shape)))
    return shape


def _generator(generator, mode, where):
    """The Generator a dropout draws from: ``generator`` (whose numeric mode must be ``mode``
    when both are given), or the default one of ``mode``."""
    if generator is None:
        return default_generator(mode)
    if not isinstance(generator, Generator):
        raise TypeError(where_msg(where, "generator must be a mojo_train.Generator, got %s (torch's "
                                  "generators are not taken: their streams differ from device to device)"
                                  % type(generator).__name__))
    if mode is not None and generator.numeric_mode != mode:
        raise ValueError(where_msg(where, "numeric_mode=%r but generator has numeric_mode %r; pass "
                                   "generator=mojo_train.Generator(seed, numeric_mode=%r)"
                                   % (mode, generator.numeric_mode, mode)))
    return generator


# Class-index targets torch's cross_entropy takes: int64 and uint8 (uint8 since pytorch/pytorch
# #59765, 2021; measured taken by torch 2.11 on the H200 machine, CPU and CUDA, and by 2.13 here).
_INDEX_TARGETS = (torch.int64, torch.uint8)


def _target(target, where):
    """Refuse a float target that is not float32 or that requires grad (no gradient with respect
    to probability targets is computed), and class indices of a dtype torch refuses (int32,
    int16, int8, bool: code that runs here must run on torch); int64 and uint8 indices go to the
    native loss as they are."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(where_msg(where, "target must be a torch.Tensor, got %s" % type(target).__name__))
    if not target.dtype.is_floating_point and target.dtype not in _INDEX_TARGETS:
        raise TypeError(where_msg(where, "target has dtype %s; class indices must be int64 (or uint8), as "
                                  "torch's cross_entropy requires: convert with target.long()" % target.dtype))
    if target.dtype.is_floating_point:
        float32(target, "target", where, of_model=False)
        if target.requires_grad and torch.is_grad_enabled():
            raise ValueError(where_msg(where, "target requires grad, but no gradient with respect to "
                                       "probability targets is computed: pass target.detach()"))


def _want_grad(*tensors):
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


# ---- the calls (the modules call these with their own names) -------------------------------------
def _linear(where, input, weight, bias, numeric_mode):
    mode = _floats(where, numeric_mode, ("bias",), input=input, weight=weight, bias=bias)
    return _functions.LinearFunction.apply(input, weight, bias, mode, where)


def _rms_norm(where, input, normalized_shape, weight, eps, numeric_mode):
    mode = _floats(where, numeric_mode, ("weight",), input=input, weight=weight)
    shape = _normalized_shape(normalized_shape, input, where)
    if weight is not None and tuple(weight.shape) != shape:
        raise ValueError(where_msg(where, "weight has shape %r; it must have the shape normalized_shape %r (as "
                                   "torch requires)" % (tuple(weight.shape), shape)))
    return _functions.RMSNormFunction.apply(input, weight, shape, eps, mode, where)


def _layer_norm(where, input, normalized_shape, weight, bias, eps, numeric_mode):
    mode = _floats(where, numeric_mode, ("weight", "bias"), input=input, weight=weight, bias=bias)
    shape = _normalized_shape(normalized_shape, input, where)
    for name, t in (("weight", weight), ("bias", bias)):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(where_msg(where, "%s has shape %r; it must have the shape normalized_shape %r (as "
                                       "torch requires)" % (name, tuple(t.shape), shape)))
    return _functions.LayerNormFunction.apply(input, weight, bias, shape, eps, mode, where)


def _gelu(where, input, approximate, numeric_mode):
    mode = _floats(where, numeric_mode, input=input)
    return _functions.GELUFunction.apply(input, approximate, mode, where)


def _attention_call(where, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, numeric_mode,
                    generator=None):
    mode = _floats(where, numeric_mode, query=query, key=key, value=value)
    if attn_mask is not None:
        if not isinstance(attn_mask, torch.Tensor):
            raise TypeError(where_msg(where, "attn_mask must be a torch.Tensor or None, got %s"
                                      % type(attn_mask).__name__))
        if attn_mask.requires_grad:
            raise ValueError(where_msg(where, "attn_mask requires grad; no gradient of the mask is computed: "
                                       "pass attn_mask.detach()"))
        device_of(where, query=query, attn_mask=attn_mask)
    if query.dim() == 3 and key.dim() == 3 and value.dim() == 3:       # (N, T, D): one head
        if attn_mask is not None and attn_mask.dim() > 3:
            raise ValueError(where_msg(where, "attn_mask of shape %r has %d dimensions; with 3-D query, key and "
                                       "value (N, T, D) it must broadcast to (N, Tq, Tk), at most 3 (torch "
                                       "refuses it too)" % (tuple(attn_mask.shape), attn_mask.dim())))
        out = _attention_call(where, query.unsqueeze(1), key.unsqueeze(1), value.unsqueeze(1),
                              attn_mask if attn_mask is None or attn_mask.dim() < 3 else attn_mask.unsqueeze(1),
                              dropout_p, is_causal, scale, enable_gqa, numeric_mode, generator)
        return out.squeeze(1)
    options = {"dropout_p": dropout_p, "is_causal": is_causal, "scale": scale, "enable_gqa": enable_gqa}
    if isinstance(dropout_p, numbers.Real) and not isinstance(dropout_p, bool) and dropout_p > 0:
        options["generator"] = _generator(generator, mode, where)      # dropout_p itself: checked natively
        phase = checkpoint_phase()
        if phase is not None:
            raise RuntimeError(where_msg(where, "dropout_p=%r under torch.utils.checkpoint (%s): its re-run of the "
                                         "forward in the backward would draw the generator's next stream, not this "
                                         "call's pairs (torch restores only its own random state there), and the "
                                         "gradient would mix the two; keep the attention call outside the "
                                         "checkpointed function, or pass dropout_p=0" % (dropout_p, phase)))
    elif generator is not None:
        _generator(generator, mode, where)
    return _functions.AttentionFunction.apply(query, key, value, attn_mask, options, mode, where)


def _embedding_call(where, input, weight, padding_idx, numeric_mode):
    indices(input, "input", where)
    mode = _floats(where, numeric_mode, weight=weight)
    device_of(where, weight=weight, input=input)
    if padding_idx is not None:
        padding_idx = _embedding._padding(padding_idx, weight.shape[0], where)
    return _functions.EmbeddingFunction.apply(input, weight, padding_idx, mode, where)


def _silu(where, input, inplace, numeric_mode):
    mode = _floats(where, numeric_mode, input=input)
    _inplace_target(input, inplace, where)
    return _functions.SiLUFunction.apply(input, inplace, mode, where)


def _relu(where, input, inplace, numeric_mode):
    mode = _floats(where, numeric_mode, input=input)
    _inplace_target(input, inplace, where)
    return _functions.ReLUFunction.apply(input, inplace, mode, where)


def _dropout(where, input, p, training, inplace, generator, numeric_mode):
    mode = _floats(where, numeric_mode, input=input)
    generator = _generator(generator, mode, where)
    if not training:
        return input
    _inplace_target(input, inplace, where)
    phase = checkpoint_phase() if isinstance(p, numbers.Real) and not isinstance(p, bool) and p > 0 else None
    if phase is not None:
        raise RuntimeError(where_msg(where, "p=%r under torch.utils.checkpoint (%s): its re-run of the forward in "
                                     "the backward would draw the generator's next stream, not this call's mask "
                                     "(torch restores only its own random state there), and the gradient would "
                                     "mix the two masks; keep the dropout outside the checkpointed function"
                                     % (p, phase)))
    return _functions.DropoutFunction.apply(input, p, inplace, generator, where)


def _cross_entropy(where, input, target, options, numeric_mode):
    mode = _floats(where, numeric_mode, ("weight",), input=input, weight=options.get("weight"))
    _target(target, where)
    if options.get("reduction") == "none" and _want_grad(input):
        raise NotImplementedError(where_msg(where, "reduction='none' on an input that requires grad: the per-row "
                                            "losses have no backward here; use reduction='sum' or 'mean', or call "
                                            "under torch.no_grad() for the per-row values"))
    device_of(where, input=input, target=target)
    return _functions.CrossEntropyFunction.apply(input, target, _want_grad(input), mode, options, where)


def _linear_cross_entropy(where, input, linear_weight, linear_bias, target, options, numeric_mode):
    mode = _floats(where, numeric_mode, ("linear_bias",), input=input, linear_weight=linear_weight,
                  linear_bias=linear_bias)
    indices(target, "target", where)
    device_of(where, input=input, target=target)
    return _functions.LinearCrossEntropyFunction.apply(input, linear_weight, linear_bias, target,
                                                       _want_grad(input, linear_weight, linear_bias), mode, options,
                                                       where)
