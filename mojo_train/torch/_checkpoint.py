"""Whether a call runs under ``torch.utils.checkpoint``, for the draws of dropout.

A dropout's forward draws a stream of a mojo_train.Generator, and its backward replays that
stream's key. torch's checkpoint re-runs the forward during the backward, restoring its own random
state first but not a mojo_train.Generator's, so the re-run draws the generator's next stream:
- ``use_reentrant=True`` differentiates the re-run: the backward would replay the re-run's mask,
  not the forward's;
- ``use_reentrant=False`` differentiates the first run's graph with the re-run's saved tensors:
  whatever saved the dropout's output (the next Linear's input, attention's output) would hold
  the re-run's mask while the dropout's backward replays the first run's.
Either way the gradient would be wrong without a word, so a draw under checkpoint is refused.
The phase is read from the stack's frames (torch.utils.checkpoint's own functions), only where a
call draws."""
import inspect
import sys

import torch
import torch.utils.checkpoint as _ck

REENTRANT = "use_reentrant=True"
NON_REENTRANT = "use_reentrant=False"

_FILE = _ck.__file__
_CF = getattr(_ck, "CheckpointFunction", None)
# use_reentrant=True: its forward runs the function, its backward re-runs it
_REENTRANT_CODES = {getattr(getattr(_CF, n, None), "__code__", None) for n in ("forward", "backward")} - {None}
# use_reentrant=False: checkpoint() itself runs the function (checkpoint_sequential's last segment,
# run plainly, is not under it); the backward's re-run is its recompute_fn
_CHECKPOINT_CODE = getattr(inspect.unwrap(_ck.checkpoint), "__code__", None)
_RE_RUN_NAME = "recompute_fn"


def checkpoint_phase():
    """None outside torch.utils.checkpoint, else REENTRANT or NON_REENTRANT. A non-reentrant
    first run without grad (nothing is saved, so nothing is re-run) is None."""
    f = sys._getframe(1)
    phase = None
    while f is not None:
        code = f.f_code
        if code in _REENTRANT_CODES:
            return REENTRANT
        if code is _CHECKPOINT_CODE or (code.co_name == _RE_RUN_NAME and code.co_filename == _FILE):
            phase = NON_REENTRANT
        f = f.f_back
    if phase is not None and not torch.is_grad_enabled():
        return None
    return phase
