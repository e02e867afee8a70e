"""mojo_train.torch: torch's autograd and nn.Modules over mojo_train's native arithmetic.

Adopting it is a change of imports: ``from mojo_train.torch import nn`` and ``import
mojo_train.torch.functional as F`` in place of torch's; the model, ``loss.backward()`` and the
checkpoints stay torch's. Linear, RMSNorm, LayerNorm, Embedding, SiLU, ReLU, GELU, Dropout,
scaled-dot-product attention, cross-entropy and the fused LM-head loss (linear_cross_entropy) run mojo_train's numeric mode ('identical' unless
``numeric_mode=`` or ``MOJO_TRAIN_NUMERIC_MODE`` says otherwise) on CPU tensors and, with the
CUDA vendor loaded, on CUDA tensors, in the tensors' own memory. Layout:

    functional.py   torch.nn.functional's names: the checks, then one autograd Function each
    modules.py      torch.nn's module classes, subclassed: forward calls functional
    nn.py           the namespace ``nn``: those modules plus torch's containers
    _functions.py   the torch.autograd.Functions: one native call per forward and backward
    _tensors.py     dtype/autocast/device checks, CUDA stream handshake, zero-copy wrapping
    _generator.py   the default dropout Generators and manual_seed
    _names.py       the AttributeError for a torch name without mojo_train arithmetic

    optim.py        torch.optim's SGD, Adam and AdamW, stepped by the native grouped step
    utils.py        torch.nn.utils.clip_grad_norm_ (also nn.utils)

``import mojo_train`` never imports this package (it imports torch); import it yourself.
"""
try:
    import torch  # noqa: F401
except ImportError as exc:      # mojo_train itself runs without torch; this package is torch's adapter
    raise ImportError("mojo_train.torch needs PyTorch, which mojo_train itself does not depend on: "
                      "pip install torch (or pip install 'mojo_train[torch]')") from exc

from . import functional, nn, optim, utils  # noqa: F401,E402
from ._generator import default_generator, manual_seed
from ._tensors import AutocastError
from .functional import (cross_entropy, dropout, embedding, gelu, layer_norm, linear, linear_cross_entropy, relu,
                         rms_norm, scaled_dot_product_attention, silu)
from .modules import (GELU, CrossEntropyLoss, Dropout, Embedding, LayerNorm, Linear, LinearCrossEntropyLoss, ReLU,
                      RMSNorm, SiLU)
from .utils import clip_grad_norm_

__all__ = ["nn", "functional", "optim", "utils", "clip_grad_norm_", "manual_seed", "default_generator", "AutocastError",
           "linear", "rms_norm", "layer_norm", "embedding", "silu", "relu", "gelu", "dropout", "cross_entropy",
           "linear_cross_entropy", "scaled_dot_product_attention",
           "Linear", "RMSNorm", "LayerNorm", "Embedding", "SiLU", "ReLU", "GELU", "Dropout", "CrossEntropyLoss",
           "LinearCrossEntropyLoss"]
