"""Losses: cross-entropy, the chunked language-model head, fused linear + cross-entropy.
Not built yet: each name raises NotImplementedError (README.md, feature table)."""
from ._not_yet import placeholder

_AREA = "loss and dense layers"
cross_entropy = placeholder("cross_entropy", _AREA)
chunked_lm_head_loss = placeholder("chunked_lm_head_loss", _AREA)
linear_cross_entropy = placeholder("linear_cross_entropy", _AREA)
