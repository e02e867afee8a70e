"""The adapter's nn.Modules: torch's own module classes whose ``forward`` runs mojo_train.

Contract: each class subclasses its torch namesake (``isinstance(m, torch.nn.Linear)`` holds) and
keeps its constructor arguments, parameters, initialisation (torch.nn.init with torch's random
generator: the same values as torch's module after the same ``torch.manual_seed``) and
``state_dict`` keys (``weight``, ``bias``; ``linear.weight`` for LinearCrossEntropyLoss), so
checkpoints load both ways. It adds a keyword-only ``numeric_mode=`` (None: the library's
default, 'identical' unless ``MOJO_TRAIN_NUMERIC_MODE`` says otherwise) and refuses, when
built, a ``dtype`` other than float32 and the torch options mojo_train does not implement.
``forward`` is the matching mojo_train.torch.functional call, whose errors name the module.
"""
import math

import torch

from .. import embedding as _embedding
from .._errors import where_msg
from .._native import numeric_mode_arg
from . import functional as F

__all__ = ["Linear", "RMSNorm", "LayerNorm", "Embedding", "SiLU", "ReLU", "GELU", "Dropout", "CrossEntropyLoss",
           "LinearCrossEntropyLoss"]


def _checked(where, numeric_mode, dtype=None):
    """The numeric mode (checked by name) of a module being built; a dtype other than None or
    float32 is refused (TypeError naming it)."""
    if dtype is not None and dtype != torch.float32:
        raise TypeError(where_msg(where, "dtype=%s; mojo_train computes in float32 only and never casts "
                                  "(leave dtype=None or pass torch.float32)" % (dtype,)))
    return numeric_mode_arg(numeric_mode, where)


class _Numeric:
    """Shows the numeric mode in ``repr(module)``."""

    def extra_repr(self):
        return ", ".join(part for part in (super().extra_repr(), "numeric_mode=%r" % (self.numeric_mode,)) if part)


class Linear(_Numeric, torch.nn.Linear):
    """``torch.nn.Linear(in_features, out_features, bias=True)``: ``y = x @ weight.T + bias``
    by mojo_train.linear_forward / linear_backward. weight ``(out_features, in_features)``."""

    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None, *, numeric_mode=None):
        mode = _checked("torch.nn.Linear", numeric_mode, dtype)
        super().__init__(in_features, out_features, bias, device, dtype)
        self.numeric_mode = mode

    def forward(self, input):
        return F._linear("torch.nn.Linear", input, self.weight, self.bias, self.numeric_mode)


class RMSNorm(_Numeric, torch.nn.RMSNorm):
    """``torch.nn.RMSNorm(normalized_shape, eps=None, elementwise_affine=True)`` by
    mojo_train.rms_norm_forward / rms_norm_backward; weight of shape ``normalized_shape``."""

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, device=None, dtype=None, *,
                 numeric_mode=None):
        mode = _checked("torch.nn.RMSNorm", numeric_mode, dtype)
        super().__init__(normalized_shape, eps, elementwise_affine, device, dtype)
        self.numeric_mode = mode

    def forward(self, input):
        return F._rms_norm("torch.nn.RMSNorm", input, self.normalized_shape, self.weight, self.eps,
                           self.numeric_mode)


class LayerNorm(_Numeric, torch.nn.LayerNorm):
    """``torch.nn.LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)`` by
    mojo_train.layer_norm_forward / layer_norm_backward; weight and bias of shape
    ``normalized_shape``."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, bias=True, device=None, dtype=None, *,
                 numeric_mode=None):
        mode = _checked("torch.nn.LayerNorm", numeric_mode, dtype)
        super().__init__(normalized_shape, eps, elementwise_affine, bias, device, dtype)
        self.numeric_mode = mode

    def forward(self, input):
        return F._layer_norm("torch.nn.LayerNorm", input, self.normalized_shape, self.weight, self.bias, self.eps,
                             self.numeric_mode)


class GELU(_Numeric, torch.nn.GELU):
    """``torch.nn.GELU(approximate='none')`` by mojo_train.gelu_forward / gelu_backward."""

    def __init__(self, approximate="none", *, numeric_mode=None):
        mode = _checked("torch.nn.GELU", numeric_mode)
        super().__init__(approximate)
        self.numeric_mode = mode

    def forward(self, input):
        return F._gelu("torch.nn.GELU", input, self.approximate, self.numeric_mode)


class Embedding(_Numeric, torch.nn.Embedding):
    """``torch.nn.Embedding(num_embeddings, embedding_dim, padding_idx=None)`` by
    mojo_train.embedding_forward / embedding_backward (a dense gradient summed by the token
    rule). ``max_norm``, ``scale_grad_by_freq=True`` and ``sparse=True`` are refused."""

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None, norm_type=2.0,
                 scale_grad_by_freq=False, sparse=False, _weight=None, _freeze=False, device=None, dtype=None, *,
                 numeric_mode=None):
        where = "torch.nn.Embedding"
        _embedding._refuse_torch_options(max_norm, norm_type, scale_grad_by_freq, sparse, {}, where)
        mode = _checked(where, numeric_mode, dtype)
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                         sparse, _weight, _freeze, device, dtype)
        self.numeric_mode = mode

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False, *, numeric_mode=None):
        """torch's ``Embedding.from_pretrained`` (the table is used as the weight, not copied),
        with ``numeric_mode=``."""
        layer = super().from_pretrained(embeddings, freeze, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                                        sparse)
        layer.numeric_mode = _checked("torch.nn.Embedding.from_pretrained", numeric_mode)
        return layer

    def forward(self, input):
        return F._embedding_call("torch.nn.Embedding", input, self.weight, self.padding_idx, self.numeric_mode)


class SiLU(_Numeric, torch.nn.SiLU):
    """``torch.nn.SiLU(inplace=False)`` by mojo_train.silu_forward / silu_backward."""

    def __init__(self, inplace=False, *, numeric_mode=None):
        mode = _checked("torch.nn.SiLU", numeric_mode)
        super().__init__(inplace)
        self.numeric_mode = mode

    def forward(self, input):
        return F._silu("torch.nn.SiLU", input, self.inplace, self.numeric_mode)


class ReLU(_Numeric, torch.nn.ReLU):
    """``torch.nn.ReLU(inplace=False)`` by mojo_train.relu_forward / relu_backward."""

    def __init__(self, inplace=False, *, numeric_mode=None):
        mode = _checked("torch.nn.ReLU", numeric_mode)
        super().__init__(inplace)
        self.numeric_mode = mode

    def forward(self, input):
        return F._relu("torch.nn.ReLU", input, self.inplace, self.numeric_mode)


class Dropout(_Numeric, torch.nn.Dropout):
    """``torch.nn.Dropout(p=0.5, inplace=False)`` drawn by a mojo_train.Generator: ``generator``
    (None: ``mojo_train.torch.default_generator(numeric_mode)`` at each call). In training each
    call takes one stream id and its backward regenerates the mask; in eval it is the identity."""

    def __init__(self, p=0.5, inplace=False, *, generator=None, numeric_mode=None):
        mode = _checked("torch.nn.Dropout", numeric_mode)
        super().__init__(p, inplace)
        self.generator, self.numeric_mode = generator, mode

    def forward(self, input):
        return F._dropout("torch.nn.Dropout", input, self.p, self.training, self.inplace, self.generator,
                          self.numeric_mode)


class CrossEntropyLoss(_Numeric, torch.nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss(weight=None, ignore_index=-100, reduction='mean',
    label_smoothing=0.0)`` by mojo_train.cross_entropy (see mojo_train.torch.functional.cross_entropy
    for what it accepts). torch's deprecated ``size_average``/``reduce`` become ``reduction`` as in
    torch."""

    def __init__(self, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                 label_smoothing=0.0, *, numeric_mode=None):
        mode = _checked("torch.nn.CrossEntropyLoss", numeric_mode)
        super().__init__(weight, size_average, ignore_index, reduce, reduction, label_smoothing)
        self.numeric_mode = mode

    def forward(self, input, target):
        options = {"ignore_index": self.ignore_index, "reduction": self.reduction,
                   "label_smoothing": self.label_smoothing}
        if self.weight is not None:
            options["weight"] = self.weight
        return F._cross_entropy("torch.nn.CrossEntropyLoss", input, target, options, self.numeric_mode)


class _LinearCrossEntropyLoss(torch.nn.modules.loss._WeightedLoss):
    """torch 2.13's ``torch.nn.LinearCrossEntropyLoss`` as a base for a torch that lacks it (torch
    2.11, say): the same constructor checks, attributes, parameters (``linear.weight``,
    ``linear.bias``, initialised by torch.nn.Linear) and ``state_dict`` keys, so a checkpoint moves
    between torch versions unchanged."""

    def __init__(self, in_features, num_classes, *, out_features=(), bias=False, device=None, dtype=None,
                 reduction="mean", weight=None, ignore_index=None, label_smoothing=0.0, options=None):
        if weight is not None and tuple(weight.shape) != (num_classes,):
            raise RuntimeError("expected weight shape to be %r, got %r" % ((num_classes,), tuple(weight.shape)))
        if label_smoothing < 0 or label_smoothing > 1.0:
            raise RuntimeError("expected label_smoothing to be in range [0, 1], got %r" % (label_smoothing,))
        super().__init__(weight=weight, size_average=None, reduce=None, reduction=reduction)
        self.num_classes, self.out_features = num_classes, out_features
        self.ignore_index, self.label_smoothing = ignore_index, label_smoothing
        self.linear = torch.nn.Linear(in_features, math.prod(out_features, start=num_classes), bias=bias,
                                      device=device, dtype=dtype)
        self.options = options


_TorchLinearCrossEntropyLoss = getattr(torch.nn, "LinearCrossEntropyLoss", _LinearCrossEntropyLoss)


class LinearCrossEntropyLoss(_Numeric, _TorchLinearCrossEntropyLoss):
    """torch 2.13's ``torch.nn.LinearCrossEntropyLoss(in_features, num_classes, *, bias=False,
    reduction='mean', ignore_index=None, label_smoothing=0.0)`` by mojo_train.linear_cross_entropy
    (the chunked LM head: no logits kept); with a torch older than 2.13, which lacks the class, it
    subclasses a stand-in with the same constructor and state_dict. Its parameters are ``linear.weight`` (num_classes,
    in_features) and ``linear.bias``; ``out_features`` other than () is refused, and per-class
    ``weight`` and ``options`` are refused by the native head unless None."""

    def __init__(self, in_features, num_classes, *, out_features=(), bias=False, device=None, dtype=None,
                 reduction="mean", weight=None, ignore_index=None, label_smoothing=0.0, options=None,
                 numeric_mode=None):
        where = "torch.nn.LinearCrossEntropyLoss"
        if tuple(out_features) != ():
            raise ValueError(where_msg(where, "out_features=%r is refused: only (N, C) logits, one class "
                                       "per row (out_features=())" % (tuple(out_features),)))
        mode = _checked(where, numeric_mode, dtype)
        super().__init__(in_features, num_classes, out_features=(), bias=bias, device=device, dtype=dtype,
                         reduction=reduction, weight=weight, ignore_index=ignore_index,
                         label_smoothing=label_smoothing, options=options)
        self.numeric_mode = mode

    def forward(self, input, target):
        options = {"weight": self.weight, "reduction": self.reduction, "ignore_index": self.ignore_index,
                   "label_smoothing": self.label_smoothing, "options": self.options}
        return F._linear_cross_entropy("torch.nn.LinearCrossEntropyLoss", input, self.linear.weight,
                                       self.linear.bias, target, options, self.numeric_mode)
