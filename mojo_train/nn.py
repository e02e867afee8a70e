"""The torch-like layer namespace (``torch.nn.functional``'s role): every layer function and
the embedding under one name, ``mojo_train.nn``.

Nothing is defined here; each name lives in its family's module, which holds its
documentation and contract: linear_forward, linear_backward, mlp_inference_sessions
(mojo_train.linear); rms_norm_forward, rms_norm_backward (mojo_train.rms_norm);
layer_norm_forward, layer_norm_backward (mojo_train.layer_norm); relu_forward,
relu_backward (mojo_train.elementwise); Embedding, embedding_forward, embedding_backward
(mojo_train.embedding); scaled_dot_product_attention and its backward (mojo_train.attention).
"""
from .attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
from .elementwise import relu_backward, relu_forward
from .embedding import Embedding, embedding_backward, embedding_forward
from .layer_norm import layer_norm_backward, layer_norm_forward
from .linear import linear_backward, linear_forward, mlp_inference_sessions
from .rms_norm import FLOAT32_EPS, rms_norm_backward, rms_norm_forward  # noqa: F401  (FLOAT32_EPS: nn's old name)

__all__ = ["linear_forward", "linear_backward", "rms_norm_forward", "rms_norm_backward",
           "layer_norm_forward", "layer_norm_backward",
           "relu_forward", "relu_backward", "mlp_inference_sessions", "embedding_forward",
           "embedding_backward", "Embedding", "scaled_dot_product_attention", "scaled_dot_product_attention_backward"]
