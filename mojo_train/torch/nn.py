"""mojo_train.torch.nn: ``from mojo_train.torch import nn`` in place of ``from torch import nn``.

Contract: the layers and losses mojo_train computes are its own (mojo_train/torch/modules.py:
Linear, RMSNorm, LayerNorm, Embedding, SiLU, ReLU, GELU, Dropout, CrossEntropyLoss,
LinearCrossEntropyLoss);
torch's structure comes through unchanged -- Module, the containers, Parameter, Identity,
Flatten, Unflatten, init -- since it computes nothing; ``nn.functional`` is
mojo_train.torch.functional and ``nn.utils`` mojo_train.torch.utils (clip_grad_norm_). Any other name of torch.nn (GELU, LayerNorm, Conv2d, ...) is an
AttributeError saying mojo_train has no arithmetic for it: spell ``torch.nn.<Name>`` where
torch's own will do, so no layer falls back to torch's arithmetic unseen.
"""
import torch
from torch.nn import (Flatten, Identity, Module, ModuleDict, ModuleList, Parameter, ParameterDict,  # noqa: F401
                      ParameterList, Sequential, Unflatten, init)

from . import functional, utils  # noqa: F401
from ._names import not_here
from .modules import (GELU, CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear,  # noqa: F401
                      LinearCrossEntropyLoss, ReLU, RMSNorm, SiLU)

__all__ = ["Linear", "RMSNorm", "LayerNorm", "Embedding", "SiLU", "ReLU", "GELU", "Dropout", "CrossEntropyLoss",
           "LinearCrossEntropyLoss",
           "Module", "ModuleDict", "ModuleList", "Parameter", "ParameterDict", "ParameterList", "Sequential",
           "Identity", "Flatten", "Unflatten", "init", "functional", "utils"]


def __getattr__(name):
    return not_here(__name__, torch.nn, name)
