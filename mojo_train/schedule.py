"""Exact learning-rate schedules and gradient accumulation. Not built yet: each name raises
NotImplementedError (README.md, feature table). Any object with a one-based ``lr_at(t)``
already works as an optimizer's ``lr_schedule=``."""
from ._not_yet import placeholder, placeholder_class

_AREA = "embedding, random streams and schedules"
ConstantLR = placeholder_class("ConstantLR", _AREA)
WarmupLinearLR = placeholder_class("WarmupLinearLR", _AREA)
WarmupCosineLR = placeholder_class("WarmupCosineLR", _AREA)
accumulate_grads = placeholder("accumulate_grads", _AREA)
accumulation_is_aligned = placeholder("accumulation_is_aligned", _AREA)
