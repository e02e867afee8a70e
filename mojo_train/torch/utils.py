"""mojo_train.torch.utils (also ``mojo_train.torch.nn.utils``): torch.nn.utils's gradient clip.

Contract: ``clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False,
foreach=None, *, numeric_mode=None)`` is torch's: it scales the ``.grad`` of the given
parameters (a tensor or an iterable of them; those without a gradient are skipped) in place and
returns the total norm as a 0-d float32 tensor on the gradients' device. The arithmetic is
mojo_train.clip_grad_norm_ (native/contracts/clip.md): the same bits on CPU tensors and CUDA
tensors. ``error_if_nonfinite=True`` refuses a NaN or infinite total before anything is written,
with a ``NonFiniteNormError`` (a RuntimeError, as torch raises, and a ValueError, as mojo_train
does). Gradients must be float32 and contiguous (they are written in place). Any other name of
torch.nn.utils (``clip_grad_value_``, ``parameters_to_vector``, ...) is an AttributeError naming
torch's own (``_names.not_here``).
"""
import re

import torch

from .. import clip as _clip
from .._errors import where_msg
from ._names import not_here
from ._tensors import device_of, wait_for_torch

__all__ = ["clip_grad_norm_", "NonFiniteNormError"]


def __getattr__(name):
    return not_here(__name__, torch.nn.utils, name)


class NonFiniteNormError(RuntimeError, ValueError):
    """A non-finite total norm refused under ``error_if_nonfinite=True``."""


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, error_if_nonfinite=False, foreach=None, *,
                    numeric_mode=None):
    """Scale the parameters' gradients in place to total norm at most ``max_norm``; return the
    pre-clip total norm (a 0-d tensor). See the module docstring."""
    where = "torch.nn.utils.clip_grad_norm_"
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    have = [(k, p.grad) for k, p in enumerate(parameters) if p.grad is not None]
    if not have:
        return torch.tensor(0.0)
    grads = [g for _, g in have]
    for k, g in have:
        if g.dtype != torch.float32:
            raise TypeError(where_msg(where, "parameters[%d].grad has dtype %s; mojo_train computes in float32 only "
                                      "and never casts" % (k, g.dtype)))
        if not g.is_contiguous():
            raise ValueError(where_msg(where, "parameters[%d].grad is not contiguous; it is scaled in place through "
                                       "its memory" % k))
    device = device_of(where, **{"parameters[%d].grad" % k: g for k, g in have})
    wait_for_torch(device)
    if isinstance(max_norm, torch.Tensor) and max_norm.numel() == 1:     # torch takes a Tensor max_norm
        max_norm = max_norm.item()
    try:
        total = _clip.clip_grad_norm_(grads, max_norm, norm_type, error_if_nonfinite=error_if_nonfinite,
                                      foreach=foreach, numeric_mode=numeric_mode)
    except (TypeError, ValueError, NotImplementedError) as exc:
        text = re.sub(r"\bgrads\[(\d+)\]", lambda m: "parameters[%d].grad" % have[int(m.group(1))][0],
                      str(exc).split(": ", 1)[-1])
        nonfinite = error_if_nonfinite is True and text.endswith("nothing was written") and \
            ("NaN or inf" in text or "overflows" in text or "not finite" in text)
        raise (NonFiniteNormError if nonfinite else type(exc))(where_msg(where, text)) from None
    return torch.tensor(total, dtype=torch.float32, device=device)
