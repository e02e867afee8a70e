"""Philox random streams: Generator, initializers, dropout. The stream itself (Philox4x32-10
and its float mapping) is pinned in native/include/mt_pinned.h already and draws the cards'
inputs; the public Generator is not built yet and raises NotImplementedError."""
from ._not_yet import placeholder_class

Generator = placeholder_class("Generator", "embedding, random streams and schedules")
