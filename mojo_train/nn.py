"""Dense layers and embedding: linear, RMSNorm, Embedding, small elementwise ops.
Not built yet: each name raises NotImplementedError (README.md, feature table)."""
from ._not_yet import placeholder, placeholder_class

_DENSE = "loss and dense layers"
_EMB = "embedding, random streams and schedules"
linear_forward = placeholder("linear_forward", _DENSE)
linear_backward = placeholder("linear_backward", _DENSE)
rms_norm_forward = placeholder("rms_norm_forward", _DENSE)
rms_norm_backward = placeholder("rms_norm_backward", _DENSE)
mlp_inference_sessions = placeholder("mlp_inference_sessions", _DENSE)
embedding_forward = placeholder("embedding_forward", _EMB)
embedding_backward = placeholder("embedding_backward", _EMB)
Embedding = placeholder_class("Embedding", _EMB)
