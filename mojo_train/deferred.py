"""Deferred refusals: GPU calls that return before the GPU has run them.

By default every GPU call waits for its kernels, so that a refusal (a NaN in an input, an id
outside the table) is raised by the call that was refused. That wait leaves the GPU idle while
Python prepares the next call: for short kernels it is most of the time (torch queues its
kernels and reports a device-side error later). A thread that turns deferred refusals on has
its deferrable calls -- ``silu_*``, ``gelu_*``, ``add``, dropout and ``embedding_forward``, when
every buffer is device memory -- queued without a wait. Their bits do not change, nor does what
a refusal writes (nothing to a caller's buffer): only the moment it is raised moves, to the next

- :func:`synchronize`, or the end of a :func:`deferred_refusals` block (a nested block's end
  too: it waits for everything the thread queued);
- copy to or from the host (``DeviceArray.to_host()``, ``to_device``, a zero-filled
  ``DeviceArray(shape)``), or export of a DeviceArray to another library
  (``__cuda_array_interface__``, ``__dlpack__``), and, in the torch adapter, each call made
  while torch's current stream is not its default one;
- call of any other GPU op of the library (an optimizer step, a loss, a linear, ...).

The error names the refused call and its argument. Every deferred call queued after it writes
nothing to a caller's buffer either (a new output of theirs is undefined), so a refusal cannot
leak into parameters or optimizer state; torch work on those outputs in between is not covered.
The contract: ``native/contracts/README.md``, "Deferred refusals". The switch is per thread and
per loaded library (numeric mode); on the cpu vendor every call reports at once. Memory the
thread allocates or frees while deferring follows its stream's order: hand a new DeviceArray to
another thread only after :func:`synchronize`. A refusal still queued when the thread exits is
never told.
"""
import contextlib
import threading

from ._native import ffi, load, numeric_mode_arg

__all__ = ["deferred_refusals", "set_deferred_refusals", "deferred_refusals_enabled", "synchronize"]

_INT32_P = ffi.typeof("int32_t *")
# A refusal an export raised (DeviceArray._complete), held until synchronize() or the switch's
# turning off collects it: torch probes __cuda_array_interface__ with hasattr, which swallows
# the exception, then tries __dlpack__, which must refuse again.
_HELD = threading.local()


def _raise_held():
    held = getattr(_HELD, "refusal", None)
    if held is not None:
        _HELD.refusal = None
        raise held


def complete_for_export(backend, where):
    """Before device memory of ``backend`` goes to another library: when the calling thread
    defers refusals, wait for its queued calls; a refusal among them (or one an earlier export
    raised and nobody collected) is raised, and held for the next export too."""
    held = getattr(_HELD, "refusal", None)
    if held is not None:
        raise held
    flag = ffi.new(_INT32_P)
    if backend.lib.mt_deferred_refusals(flag) == 0 and flag[0]:
        try:
            backend.check(backend.lib.mt_synchronize(), where)
        except ValueError as exc:
            _HELD.refusal = exc
            raise


def _backend(numeric_mode, where):
    return load(numeric_mode_arg(numeric_mode, where))


def set_deferred_refusals(on, *, numeric_mode=None):
    """Turn deferred refusals on or off for the calling thread. Turning them off first waits for
    the queued calls and raises a refusal among them, if any (the switch is off either way)."""
    where = "set_deferred_refusals"
    if not isinstance(on, bool):
        raise TypeError("mojo_train.%s: on must be True or False, got %r" % (where, on))
    backend = _backend(numeric_mode, where)
    backend.check(backend.lib.mt_set_deferred_refusals(1 if on else 0), where)
    if not on:
        _raise_held()


def deferred_refusals_enabled(*, numeric_mode=None):
    """Whether the calling thread defers refusals (:func:`set_deferred_refusals`)."""
    where = "deferred_refusals_enabled"
    backend = _backend(numeric_mode, where)
    out = ffi.new(_INT32_P)
    backend.check(backend.lib.mt_deferred_refusals(out), where)
    return bool(out[0])


def synchronize(*, numeric_mode=None):
    """Wait until every call this thread queued has run, then raise the first refusal among
    deferred calls, if any (a no-op on the cpu vendor)."""
    where = "synchronize"
    backend = _backend(numeric_mode, where)
    _raise_held()
    backend.check(backend.lib.mt_synchronize(), where)


def _note(exc, text):
    """exc.add_note(text) where Python has it (3.11); else the text joins the arguments."""
    if hasattr(exc, "add_note"):
        exc.add_note(text)
    else:
        exc.args = exc.args + (text,)


@contextlib.contextmanager
def deferred_refusals(*, numeric_mode=None):
    """``with mojo_train.deferred_refusals(): ...`` defers refusals inside the block and, at its
    end, waits for the queued calls and raises the first refusal among them. When the block
    itself raised, that exception propagates; a deferred refusal found then is attached to it
    as a note."""
    was = deferred_refusals_enabled(numeric_mode=numeric_mode)
    set_deferred_refusals(True, numeric_mode=numeric_mode)
    try:
        yield
    except BaseException as exc:
        try:
            set_deferred_refusals(was, numeric_mode=numeric_mode)
            synchronize(numeric_mode=numeric_mode)
        except Exception as late:   # a refusal queued before the block's own error
            _note(exc, "mojo_train: a deferred refusal was pending too: %s" % late)
        raise
    set_deferred_refusals(was, numeric_mode=numeric_mode)
    synchronize(numeric_mode=numeric_mode)
