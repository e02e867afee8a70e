"""mojo_train: neural-network training primitives whose identical numeric mode gives the same
float32 bits on every vendor (the C CPU oracle, CUDA, HIP, Metal).

Run-time dependency: cffi only; numpy is never imported. Tensors are any buffer-protocol
object (array.array, memoryview, numpy arrays, mojo_train.Array); float tensors must be
float32 and are never cast. See README.md for the feature table and native/contracts/ for
the arithmetic each op is pinned to.
"""
from ._array import Array
from ._host_blocks import release as release_host_cache
from ._native import BackendError, backend_info
from .device import DeviceArray, memory_stats, release_device_cache, to_device, transfer_bytes
from .deferred import deferred_refusals, deferred_refusals_enabled, set_deferred_refusals, synchronize
from .optim import SGD, Adam, AdamW, clip_grad_norm_
from .loss import cross_entropy
from .lm_head import chunked_lm_head_loss, linear_cross_entropy
from .linear import linear_backward, linear_forward, mlp_inference_sessions
from .rms_norm import rms_norm_backward, rms_norm_forward
from .layer_norm import layer_norm_backward, layer_norm_forward
from .attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
from .embedding import Embedding, embedding_backward, embedding_forward
from . import nn  # noqa: F401  (the torch-like namespace: mojo_train.nn.linear_forward, ...)
from .random import DropoutKey, Generator
from .elementwise import add, gelu_backward, gelu_forward, relu_backward, relu_forward, silu_backward, silu_forward
from .schedule import ConstantLR, WarmupCosineLR, WarmupLinearLR
from .accumulate import accumulate_grads, accumulation_is_aligned

__version__ = "0.1.0"

__all__ = ["Array", "release_host_cache", "BackendError", "backend_info", "DeviceArray", "to_device", "transfer_bytes", "memory_stats", "release_device_cache",
           "synchronize", "deferred_refusals", "set_deferred_refusals", "deferred_refusals_enabled",
           # optimizers and clipping
           "SGD", "Adam", "AdamW", "clip_grad_norm_",
           # losses
           "cross_entropy", "chunked_lm_head_loss", "linear_cross_entropy",
           # layers
           "linear_forward", "linear_backward", "relu_forward", "relu_backward", "rms_norm_forward",
           "rms_norm_backward", "layer_norm_forward", "layer_norm_backward", "mlp_inference_sessions",
           "Embedding", "embedding_forward", "embedding_backward", "silu_forward", "silu_backward",
           "gelu_forward", "gelu_backward", "add",
           "scaled_dot_product_attention", "scaled_dot_product_attention_backward",
           # random streams, schedules, accumulation
           "Generator", "DropoutKey", "ConstantLR", "WarmupLinearLR", "WarmupCosineLR", "accumulate_grads",
           "accumulation_is_aligned",
           "__version__"]
