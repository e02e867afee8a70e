"""The step plan of mojo_train.torch.optim: what a step that succeeded checked and built, reused by
the next step while nothing it depends on has changed.

Contract: ``StepPlan(optimizer, step, values)`` is made after a step that passed every check of
the checked path (optim.py: ``_gather``, ``_prepare``) and the native call; it keeps the
parameters with a gradient (in order, with their group and place), each one's signature --
``data_ptr``, shape, dtype, device, contiguity --, the state tensors the native call read (the
same objects, each with its signature), what of each group's checked values decides which
state a tensor has (amsgrad, momentum or none: ``_plan_fact``), the native pointer tables of the
parameters and of the state, the offsets and the tensor -> group table. The group's other values
(lr, betas, ...) are not the plan's: the native group table carries them.
``bind(optimizer, values)`` readies the plan's tables for this step -- every gradient read
afresh (its checks, its pointer written into the gradient table), every step count read afresh --
and gives the step's items, or None whenever anything differs from what the plan was made of: another
parameter set, group or place, a parameter or state tensor that is another object or has
another ``data_ptr``, shape, dtype, device or layout, a state entry missing, a gradient that
the checked path would copy or refuse, gradients that may share memory with anything. None
sends the step down the checked path, which refuses with its own words or succeeds and makes a
new plan; ``bind`` itself raises nothing and changes nothing, so a step's result, bits and
refusals are the checked path's. The plan holds the tensors it names (so their ids and
addresses cannot be reused by others while it lives); the optimizer drops it whenever its
groups or state are replaced (``add_param_group``, ``load_state_dict``, unpickling).
"""
import operator

import torch

from .._native import ffi


def signature(t):
    """What the checks of a parameter or state tensor read: its memory and layout."""
    return t.data_ptr(), t.shape, t.dtype, t.device, t.is_contiguous()


class StepPlan:
    """One optimizer's step, checked once; see the module docstring."""

    __slots__ = ("facts", "places", "params", "sigs", "device", "slots", "slot_sigs", "needs_state", "counted",
                 "starts", "ends", "nbytes", "grads", "tables", "offsets", "tensor_group", "numbers", "keep")

    def __init__(self, optimizer, step, values):
        items = step.items
        self.facts = tuple(map(optimizer._plan_fact, values))
        self.places = tuple((i, k) for i, k, _, _ in items)
        self.params = tuple(item[2] for item in items)
        self.sigs = tuple(signature(p) for p in self.params)
        self.device = step.device
        slots, self.counted = optimizer._plan_state(items, values)
        self.slots = tuple(tuple(row) for row in slots)          # per item: its state tensors, in _SLOTS order
        self.slot_sigs = tuple(tuple(None if t is None else signature(t) for t in row) for row in self.slots)
        self.needs_state = tuple(self.counted or any(t is not None for t in row) for row in self.slots)
        self.nbytes = tuple(p.numel() * 4 for p in self.params)
        starts, ends = [], []
        for j, p in enumerate(self.params):
            for t in (p,) + self.slots[j]:
                if t is not None:
                    starts.append(t.data_ptr())
                    ends.append(starts[-1] + self.nbytes[j])
        self.starts, self.ends = starts, ends
        self.keep, self.tables = [], []
        for column in [self.params] + [[row[s] for row in self.slots] for s in range(len(optimizer._SLOTS))]:
            raw = ffi.new("uintptr_t[]", [0 if t is None else t.data_ptr() for t in column] or [0])
            self.keep.append(raw)
            self.tables.append(ffi.cast("float **", raw))
        self.grads = ffi.new("uintptr_t[]", max(len(items), 1))
        self.keep.append(self.grads)
        self.tables.insert(1, ffi.cast("float **", self.grads))   # params, grads, then the state's slots
        self.offsets = step.offsets
        self.tensor_group = ffi.new("int32_t[]", [i for i, _ in self.places] or [0])
        self.numbers = optimizer._plan_numbers(items, values)    # step counts (Adam), buffers made (SGD)

    def bind(self, optimizer, values):
        """(items, step-count tensors to advance) of this step, its gradients' and step counts'
        values written into the plan's tables; or None (module docstring)."""
        if tuple(map(optimizer._plan_fact, values)) != self.facts:
            return None
        params, places, sigs, slots, slot_sigs = self.params, self.places, self.sigs, self.slots, self.slot_sigs
        needs_state, counted, keys = self.needs_state, self.counted, optimizer._SLOTS
        n, device, grads, state = len(params), self.device, self.grads, optimizer.state
        items, grad_starts, counts, whole = [], [], [], []
        f32, strided, tensor = torch.float32, torch.strided, torch.Tensor
        j = 0
        for i, group in enumerate(optimizer.param_groups):
            for k, p in enumerate(group["params"]):
                g = p.grad
                if g is None:
                    continue
                if j == n or p is not params[j] or places[j] != (i, k):
                    return None
                sig = sigs[j]
                if signature(p) != sig:
                    return None
                if (type(g) is not tensor or g.dtype != f32 or g.layout != strided or g.shape != sig[1]
                        or not g.is_contiguous() or g.is_neg() or g.device != device):
                    return None
                if needs_state[j]:
                    st = state.get(p)
                    if type(st) is not dict:
                        return None
                    if counted:
                        count = st.get("step")
                        value = _whole_count(count)
                        if value is None:
                            return None
                        counts.append(count)
                        whole.append(value)
                    for key, t, tsig in zip(keys, slots[j], slot_sigs[j]):
                        if t is not None and (st.get(key) is not t or signature(t) != tsig):
                            return None
                grad_starts.append(g.data_ptr())
                items.append([i, k, p, g])
                j += 1
        if j != n:
            return None
        starts = sorted(self.starts + grad_starts)
        ends = sorted(self.ends + list(map(operator.add, grad_starts, self.nbytes)))
        if not all(map(operator.le, ends, starts[1:])):
            return None                      # memory may be shared: the checked path says where
        for j, address in enumerate(grad_starts):
            grads[j] = address
        if counted:
            numbers = self.numbers
            for j, value in enumerate(whole):
                numbers[j] = value
        return items, counts


def _whole_count(count):
    """The step count ``count`` holds as an int, when the checked path takes it without a word
    (a one-element tensor holding a whole number in [0, 2**63)); None otherwise."""
    if not isinstance(count, torch.Tensor) or count.numel() != 1:
        return None
    try:
        s = float(count)
    except Exception:           # noqa: BLE001 -- whatever the checked path meets, it words
        return None
    return int(s) if 0 <= s < 2.0**63 and s == int(s) else None
