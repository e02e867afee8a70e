"""What optim.py and clip.py share: torch's switches, real-number arguments, tensor lists as
pointer tables, and the refusal of tensors that share memory or are one object at two positions.

A module of its own so that clip.py (clip_grad_norm_) and optim.py (the optimizers, which
re-export clip_grad_norm_) both import it and neither imports the other's internals.
"""
import numbers
import operator
from itertools import chain

from ._errors import where_msg
from . import _buffer
from ._native import ffi


# torch's switches: name -> (the values taken, the exception for another bool, why). The values
# taken ask for nothing this library lacks (amsgrad, taken both ways, is a group's hyper-parameter;
# the others change nothing: optim.py's docstring).
_SWITCHES = {
    "amsgrad": ((False, True), None, None),
    "foreach": ((None, False, True), None, None),
    "fused": ((None, False, True), None, None),
    "capturable": ((False,), NotImplementedError,
                   "there is no CUDA-graph capture here: every step synchronizes before it returns"),
    "differentiable": ((False,), NotImplementedError,
                       "there is no autograd in mojo_train (step takes the gradients)"),
    "decoupled_weight_decay": ((False,), ValueError,
                               "this Adam's weight decay is coupled; the decoupled update is mojo_train.AdamW"),
    "error_if_nonfinite": ((False, True), None, None),
}


def _switches(where, **values):
    """Check torch's switches ``values``: a value of another type is a TypeError, a value that
    asks for behaviour this library lacks is refused by name with the reason."""
    for name, value in values.items():
        taken, exc, reason = _SWITCHES[name]
        allowed = (None, False, True) if None in taken else (False, True)
        if not any(value is v for v in allowed):
            raise TypeError(where_msg(where, "%s must be %s, got %r" % (
                name, "None, True or False" if None in allowed else "True or False", value)))
        if not any(value is v for v in taken):
            raise exc(where_msg(where, "%s=%r is not supported: %s" % (name, value, reason)))
    if values.get("fused") is True and values.get("foreach") is True:
        raise ValueError(where_msg(where, "fused=True and foreach=True ask for two different executions "
                                   "(torch refuses the pair too); pass one of them"))


def _real(value, name, where, low=0.0, high=None, high_open=False):
    """A finite real in [low, high] (or [low, high)); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(where_msg(where, "%s must be a real number, got %r" % (name, value)))
    try:
        v = float(value)
    except OverflowError:                       # an int beyond a double: infinite, refused below
        v = float("inf") if value > 0 else float("-inf")
    v32 = float(ffi.cast("float", v))           # the value the native call will see
    bad = not (v32 == v32) or v32 in (float("inf"), float("-inf")) or (low is not None and v < low)
    if high is not None:
        bad = bad or (v32 >= high if high_open else v32 > high)
    if bad:
        if high is not None:
            rule = "finite and in [%s, %s%s" % (low, high, ")" if high_open else "]")
        else:
            rule = "finite" if low is None else "finite and >= %s" % low
        raise ValueError(where_msg(where, "%s must be %s, got %r" % (name, rule, value)))
    return v


class _Registry:
    """A list of float32 tensors as the native layer sees it: a pointer table and offsets.
    ``probes``: the tensors' Probes, already checked (``tensors`` is then not read)."""

    def __init__(self, tensors, name, where, inplace, backend, like=None, allow_empty=False, probes=None):
        self.probes = probes if probes is not None else _buffer.tensor_list(tensors, name, where, inplace=inplace,
                                                                            allow_empty=allow_empty)
        for j, pb in enumerate(self.probes):
            if pb.device and not backend.has("device_buffers"):
                raise TypeError(where_msg(where, "%s[%d] is device memory, but the loaded vendor (%s) takes "
                                                 "host buffers only; set MOJO_TRAIN_VENDOR to the device's vendor"
                                                 % (name, j, backend.vendor)))
        if like is not None:
            self._match(like, name, where)
        self.offsets = like.offsets if like is not None else _buffer.offsets_for(self.probes, name, where)
        self.n = len(self.probes)
        self.table = ffi.new("float *[]", self.n)
        for j, pb in enumerate(self.probes):
            self.table[j] = ffi.cast("float *", pb.address)
        self.c_offsets = ffi.cast("int32_t *", self.offsets.address)
        self.total = int(self.offsets[self.n])

    def _match(self, like, name, where):
        if len(self.probes) != len(like.probes):
            raise ValueError(where_msg(where, "%s must hold as many tensors as params, one per parameter in "
                                              "params' order: it holds %d, params %d"
                                              % (name, len(self.probes), len(like.probes))))
        for j, (a, b) in enumerate(zip(self.probes, like.probes)):
            if a.shape != b.shape:
                raise ValueError(where_msg(where, "%s[%d] has shape %s, params[%d] has %s"
                                                  % (name, j, a.shape, j, b.shape)))


def _refuse_overlap(groups, name_of, where, fix):
    """Refuse two byte ranges of ``groups`` -- one (starts, ends) pair of lists per argument --
    that share memory, naming both (``name_of((group, index))``, the lower first) and saying
    ``fix``. The common case, every range apart, takes two integer sorts and one pass in C:
    when the i-th smallest end is at most the (i+1)-th smallest start for every i, at most one
    range covers any byte."""
    starts = sorted(chain.from_iterable(g[0] for g in groups))
    ends = sorted(chain.from_iterable(g[1] for g in groups))
    if all(map(operator.le, ends, starts[1:])):
        return
    # Sorted by start, two ranges overlap only if some neighbours do; empty ranges share nothing.
    spans = sorted((a, b, (g, j)) for g, (starts, ends) in enumerate(groups)
                   for j, (a, b) in enumerate(zip(starts, ends)) if b > a)
    for x, y in zip(spans, spans[1:]):
        if y[0] < x[1]:
            first, second = sorted((x[2], y[2]))
            raise ValueError(where_msg(where, "%s and %s share memory; %s" % (name_of(first), name_of(second), fix)))


def _refuse_same(groups, name_of, where, fix):
    """Refuse one object at two positions of ``groups`` -- one list of objects per argument --
    naming both (``name_of((group, index))``, the lower first) and saying ``fix``. Identity,
    not memory: an empty tensor has no byte to share (``_refuse_overlap`` takes it), yet the
    same object twice is one tensor at two positions, as torch's parameter sets see it.
    Distinct objects are distinct tensors, whatever memory they view."""
    if len(set(map(id, chain.from_iterable(groups)))) == sum(map(len, groups)):
        return
    seen = {}
    for g, objects in enumerate(groups):
        for j, obj in enumerate(objects):
            first = seen.setdefault(id(obj), (g, j))
            if first != (g, j):
                raise ValueError(where_msg(where, "%s and %s are the same tensor; %s"
                                           % (name_of(first), name_of((g, j)), fix)))


def _probe_ranges(probes):
    starts = [pb.address for pb in probes]
    return starts, [a + pb.nbytes for a, pb in zip(starts, probes)]


def _table_ranges(table, nbytes):
    """(starts, ends) of a cffi pointer table whose tensor j holds ``nbytes[j]`` bytes."""
    starts = memoryview(ffi.buffer(table, len(nbytes) * ffi.sizeof("float *"))).cast("P").tolist()
    return starts, list(map(operator.add, starts, nbytes))


def _indexed(name, single):
    """How the user sees item ``j`` of argument ``name``: ``name`` for a single buffer."""
    return (lambda order: name) if single else (lambda order: "%s[%d]" % (name, order[1]))


def _single(x):
    return type(x) not in (list, tuple) and _buffer._is_buffer(x)
