"""The adapter's default dropout streams: one ``mojo_train.Generator`` per numeric mode, all of
one seed.

Contract: ``default_generator(numeric_mode)`` is the Generator a dropout without ``generator=``
draws from; ``manual_seed(seed)`` starts every default generator afresh at ``seed`` (counter 0),
as ``torch.manual_seed`` does for torch's. The seed is 0 until it is set. Each dropout forward
takes one stream id from its generator; its backward regenerates the mask from the key it drew
with, so no mask is stored.
"""
from .._native import load, numeric_mode_arg
from ..random import Generator

_SEED = [0]
_DEFAULTS = {}


def manual_seed(seed):
    """Restart every default generator at ``seed`` (an int in [0, 2**64)); returns None."""
    Generator(seed)                     # refuses a bad seed by name before anything changes
    _SEED[0] = seed
    _DEFAULTS.clear()


def default_generator(numeric_mode=None):
    """The default Generator of ``numeric_mode`` (None: the library's default numeric mode, the
    same Generator as that mode's name gives)."""
    # None is the numeric mode the library loaded for None has: one generator per mode, so that
    # layers made with numeric_mode=None and with that mode's name draw one sequence of streams
    # (two generators of one seed would give them the same masks)
    key = load(numeric_mode_arg(numeric_mode, "torch.default_generator")).numeric_mode
    if key not in _DEFAULTS:
        _DEFAULTS[key] = Generator(_SEED[0], numeric_mode=key)
    return _DEFAULTS[key]
