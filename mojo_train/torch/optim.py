"""mojo_train.torch.optim: ``torch.optim.SGD``, ``Adam`` and ``AdamW`` whose step is mojo_train's.

Contract: each class subclasses ``torch.optim.Optimizer`` and keeps torch's constructor
(arguments, defaults, param groups, ``add_param_group``, ``zero_grad``, hooks, ``state`` and
``state_dict``); ``step(closure=None)`` reads ``p.grad`` of every parameter that has one and
updates every group in one native call (mt_sgd_step_groups / mt_adam_step_groups: the bits of
native/contracts/optim.md, the same on CPU tensors and CUDA tensors). Parameters without a
gradient are skipped, as torch skips them. The state is torch's, per parameter and in torch's
layout -- ``step`` (a float32 0-d CPU tensor), ``exp_avg``, ``exp_avg_sq``, ``max_exp_avg_sq``
(amsgrad), ``momentum_buffer`` (SGD with momentum) -- so ``state_dict()`` is torch's format:
torch's own optimizers load ours and ours load theirs, every state tensor's bytes unchanged.

Each group takes torch's keys; ours add two: ``lr_schedule`` (None, or an object with a
one-based ``lr_at(t)`` such as mojo_train.WarmupCosineLR: the group's lr at its t-th step) and
``steps_taken`` (the steps the group has taken part in, which t counts; saved with the
state_dict). torch's LR schedulers (``torch.optim.lr_scheduler``) work as with torch's optimizers:
they write ``group["lr"]``, which each step reads. A group with both a torch scheduler (its
``initial_lr`` key) and ``lr_schedule`` is refused. ``lr`` and ``betas`` may be torch tensors of
one element (read as floats). ``foreach`` and ``fused`` change nothing (every step is one fused
native pass); ``capturable=True`` and ``differentiable=True`` are refused by name.

What a step refuses, changing nothing (no parameter, gradient or state byte, no step count): a
parameter or gradient that is not float32 (TypeError), a sparse gradient, a non-contiguous
parameter or state tensor (written in place through its memory), tensors on more than one
device or on a GPU other than cuda:0, NaN or infinity in a gradient or parameter (ValueError:
mojo_train refuses where torch would write NaN), gradients sharing memory with each other, a
parameter or the state. Messages name ``param_groups[i]['params'][k]`` (a GPU's non-finite
refusal says "grads": its status word has no index). A non-contiguous gradient is read through
a contiguous copy. ``load_state_dict`` refuses, loading nothing, the moments mojo_train's own
load_state_dict refuses, as torch's load casts them to float32 -- a non-finite exp_avg or
momentum buffer, a NaN or negative second moment -- and an Adam state with a step count but no
exp_avg or exp_avg_sq. A step reads the state without scanning it again.

Streams (CUDA): torch's current stream is synchronized before the native call, which
synchronizes its own before returning (mojo_train/torch/_tensors.py).

Host time: a step that succeeded leaves a plan (_optim_plan.py) -- its tensors' signatures, the
state it read, the native pointer tables -- and the native group table is kept while no group's
checked values change; the next step reuses both when its gradients pass the plan's checks and
nothing else changed, and takes the checked path (which makes a new plan) otherwise: the same
bits and refusals either way, with a table rebuilt only when something it holds changed.
"""
import math
import operator
import re
import threading

import torch

from .. import _optim_groups as _groups
from .._errors import where_msg
from .._native import ffi, load, numeric_mode_arg
from .._optim_common import _refuse_overlap, _switches
from ._optim_plan import StepPlan
from ._tensors import device_of, wait_for_torch

__all__ = ["SGD", "Adam", "AdamW"]

_INT32_MAX = 2**31 - 1
_OURS = ("lr_schedule", "steps_taken")
_SWITCH_KEYS = ("foreach", "fused", "differentiable", "capturable")
_ABSENT = object()
# what torch's own __setstate__ gives a group that lacks a switch (never our constructor's values)
_ABSENT_KEYS = {"foreach": None, "fused": None, "differentiable": False, "capturable": False, "maximize": False,
                "amsgrad": False, "nesterov": False, "decoupled_weight_decay": False}


def _scalar_dtype():
    """The dtype torch gives ``state['step']`` (float32 unless the default dtype is float64)."""
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


def _as_number(value):
    """A one-element torch tensor (torch takes a Tensor lr or betas) as a Python float."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.requires_grad:
        return value.item()
    return value


class _Step:
    """One step's tensors: for each parameter with a gradient, its group, its place in the group
    and its state; the native pointer tables and offsets built from them."""

    def __init__(self, items, device):
        self.items, self.device = items, device
        self.n = len(items)
        self.made = []          # (state dict, key, previous value) set for this step: undone on refusal
        self.kept = []

    def name(self, j):
        i, k = self.items[j][0], self.items[j][1]
        return "param_groups[%d]['params'][%d]" % (i, k)

    def table(self, tensors):
        """A native pointer table of ``tensors`` (None: NULL), one cffi allocation."""
        return ffi.cast("float **", self._keep(ffi.new("uintptr_t[]", [0 if x is None else x.data_ptr()
                                                                         for x in tensors] or [0])))

    def _keep(self, cdata):
        self.kept.append(cdata)        # the table's memory lives as long as the step
        return cdata

    def make_offsets(self, where):
        off = ffi.new("int32_t[]", self.n + 1)
        total = 0
        for j, item in enumerate(self.items):
            total += item[2].numel()
            if total > _INT32_MAX:
                raise ValueError(where_msg(where, "the parameters with gradients hold more than 2**31 - 1 elements "
                                           "(%s reaches %d); split them over several optimizers" % (self.name(j), total)))
            off[j + 1] = total
        return off


class _NativeOptimizer(torch.optim.Optimizer):
    """What SGD, Adam and AdamW share: groups checked by mojo_train's rules, the step's tables."""

    _WHERE = "torch.optim.Optimizer"
    _HYPER = ()
    _CTYPE = None
    _SLOTS = ()          # state tensors shaped like the parameter, in table order

    def __init__(self, params, defaults, numeric_mode):
        where = self._WHERE
        self._attach(numeric_mode_arg(numeric_mode, where))
        self._adding = where          # add_param_group's messages during construction name the class
        _switches(where, **{k: defaults[k] for k in _SWITCH_KEYS if k in defaults})
        _groups.check_values(self._HYPER, self._hyper_raw(defaults), None, where, skip=self._skip(defaults))
        super().__init__(params, dict(defaults, steps_taken=0))
        self._adding = where + ".add_param_group"
        self._register_own_hooks()

    def _register_own_hooks(self):
        """Our state_dict hooks, once each: torch's pickled state (deepcopy, pickle) keeps no
        hook, so __setstate__ registers them again -- without them a copy saved its schedules as
        objects and loaded moments that step into NaN."""
        for register, hooks, fn in ((self.register_state_dict_post_hook, "_optimizer_state_dict_post_hooks",
                                     _schedules_as_configs),
                                    (self.register_load_state_dict_pre_hook, "_optimizer_load_state_dict_pre_hooks",
                                     _schedules_from_configs),
                                    (self.register_load_state_dict_pre_hook, "_optimizer_load_state_dict_pre_hooks",
                                     _check_loaded_moments)):
            if fn not in getattr(self, hooks, {}).values():
                register(fn)

    def _attach(self, numeric_mode):
        """The native library of ``numeric_mode`` (a checked name or None) and a fresh check cache."""
        self._backend = load(numeric_mode)
        self.numeric_mode = self._backend.numeric_mode
        self._checked = {}      # id(group) -> (raw values, checked values)
        self._step_lock = threading.Lock()   # one step at a time: the plan's tables are shared memory
        self._forget()

    def _forget(self):
        """Drop the step plan and the group table (the groups or the state were replaced)."""
        self._plan = None           # the last successful step's StepPlan (_optim_plan.py)
        self._group_table = None    # (each group's checked values and flags, the native table written from them)

    def __getstate__(self):
        state = super().__getstate__()
        state["numeric_mode"] = self.numeric_mode     # the library is loaded again on unpickling
        return state

    # ---- groups ------------------------------------------------------------------------------
    def _hyper_raw(self, group):
        """Group values as the checks take them: one-element tensors (torch takes a Tensor lr,
        betas or weight_decay) read as floats."""
        raw = {}
        for key, _ in self._HYPER:
            value = group[key]
            if key == "betas" and isinstance(value, (tuple, list)):
                value = tuple(_as_number(b) for b in value)
            elif key != "lr_schedule":
                value = _as_number(value)
            raw[key] = value
        return raw

    @staticmethod
    def _skip(group):
        return ("lr",) if group.get("lr_schedule") is not None else ()

    def add_param_group(self, param_group):
        """torch's add_param_group (defaults filled in, the same checks), then mojo_train's: every
        hyper-parameter checked (named ``param_groups[i][key]``) and every parameter float32;
        a refused group is not added."""
        super().add_param_group(param_group)
        self._forget()
        i = len(self.param_groups) - 1
        where = getattr(self, "_adding", self._WHERE + ".add_param_group")
        try:
            self._group_values(i, self.param_groups[i], where)
            for k, p in enumerate(self.param_groups[i]["params"]):
                if p.dtype != torch.float32:
                    raise TypeError(where_msg(where, "param_groups[%d]['params'][%d] has dtype %s; mojo_train "
                                              "computes in float32 only and never casts (model.float())"
                                              % (i, k, p.dtype)))
        except Exception:
            self.param_groups.pop()
            raise

    def __setstate__(self, state):
        numeric_mode = state.pop("numeric_mode", None)
        super().__setstate__(state)
        if not hasattr(self, "_backend"):             # unpickled (or deep-copied): load the library again
            self._attach(numeric_mode)
        self._register_own_hooks()
        self._checked = {}
        self._forget()
        for group in self.param_groups:       # an older or a torch optimizer's groups lack keys: torch's values
            for key, value in _ABSENT_KEYS.items():
                if key in self.defaults:
                    group.setdefault(key, value)
            group.setdefault("lr_schedule", None)
            group.setdefault("steps_taken", 0)
            for p in group["params"]:         # torch before 1.12 saved step as a number: a tensor, as torch makes it
                st = self.state.get(p)
                if st and "step" in st and not torch.is_tensor(st["step"]):
                    st["step"] = torch.tensor(float(st["step"]), dtype=_scalar_dtype())

    def _group_values(self, i, group, where):
        """Group i's checked values (cached until one of them changes)."""
        switches = {k: group[k] for k in _SWITCH_KEYS if k in group}
        raw = self._hyper_raw(group)
        key = (tuple(raw.values()), tuple(switches.values()), group.get("decoupled_weight_decay"), "initial_lr" in group)
        hit = self._checked.get(id(group))
        if hit is not None and hit[0] == key:
            return hit[1]
        prefix = _groups.group_name(i)
        try:
            _switches(where, **switches)
        except (TypeError, ValueError, NotImplementedError) as exc:
            raise type(exc)(str(exc).replace(where + ": ", where + ": %s: " % prefix, 1)) from None
        values = _groups.check_values(self._HYPER, raw, prefix, where, skip=self._skip(group))
        if values["lr_schedule"] is not None and "initial_lr" in group:
            raise ValueError(where_msg(where, "%s has both a torch LR scheduler (its 'initial_lr') and "
                                       "lr_schedule; drive its lr with one of them" % prefix))
        self._checked[id(group)] = (key, values)
        return values

    def _native_groups(self, where):
        """The native group table and each group's checked values, lr of a scheduled group
        from its schedule at the group's next step. The table is written anew only when a
        group's checked values or flags changed since the last call (else the same table, its
        scheduled rows' lr written again)."""
        values, flags, lrs = [], [], []
        for i, group in enumerate(self.param_groups):
            v = self._group_values(i, group, where)
            steps = group.get("steps_taken")
            if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
                raise ValueError(where_msg(where, "%s['steps_taken'] must be an int >= 0 (the steps the group has "
                                           "taken), got %r" % (_groups.group_name(i), steps)))
            if v["lr_schedule"] is not None:
                t = group["steps_taken"] + 1
                name = "%s.lr_at(%d)" % (_groups.key_name(_groups.group_name(i), "lr_schedule"), t)
                lrs.append((i, _groups._real(v["lr_schedule"].lr_at(t), name, where)))
            flags.append(_groups.flags(self._backend.lib, v, self._decoupled(group)))
            values.append(v)
        key = (tuple(values), tuple(flags))
        cached = self._group_table
        if cached is not None and len(cached[0][0]) == len(values) and cached[0][1] == key[1] and \
                all(map(operator.is_, cached[0][0], values)):
            table = cached[1]
        else:
            table = ffi.new("%s[]" % self._CTYPE, max(len(values), 1))
            for row, v, bits in zip(table, values, flags):
                _write_row(row, v, bits)
            self._group_table = (key, table)
        for i, lr in lrs:
            table[i].lr = lr
        return table, values

    def _decoupled(self, group):
        return False

    # ---- the step's tensors --------------------------------------------------------------------
    def _gather(self, where):
        """The parameters with a gradient, checked; their device."""
        items = []
        for i, group in enumerate(self.param_groups):
            for k, p in enumerate(group["params"]):
                if p.grad is not None:
                    items.append([i, k, p, p.grad])
        step = _Step(items, None)
        if not items:
            return step
        seen = {}
        for j, item in enumerate(items):
            first = seen.setdefault(id(item[2]), j)
            if first != j:
                raise ValueError(where_msg(where, "%s and %s are the same parameter (torch warns and updates it twice); "
                                           "pass each parameter once" % (step.name(first), step.name(j))))
        for j, (i, k, p, g) in enumerate(items):
            name = step.name(j)
            if p.dtype != torch.float32 or g.dtype != torch.float32:
                which, t = (name, p) if p.dtype != torch.float32 else (name + ".grad", g)
                raise TypeError(where_msg(where, "%s has dtype %s; mojo_train computes in float32 only and never casts"
                                          % (which, t.dtype)))
            if g.is_sparse or g.layout != torch.strided:
                raise ValueError(where_msg(where, "%s.grad is sparse; mojo_train's optimizers take dense gradients: "
                                           "make the layer dense (e.g. nn.Embedding(..., sparse=False)) or pass "
                                           "p.grad.to_dense()" % name))
            if g.shape != p.shape:
                raise ValueError(where_msg(where, "%s.grad has shape %s, the parameter %s"
                                           % (name, tuple(g.shape), tuple(p.shape))))
            if not p.is_contiguous():
                raise ValueError(where_msg(where, "%s is not contiguous; the step writes it in place through its "
                                           "memory: make it contiguous before building the optimizer" % name))
            if g.is_neg():                            # a negated view: its memory holds -grad
                items[j][3] = g = g.resolve_neg()
            if not g.is_contiguous():
                items[j][3] = g.contiguous()          # read only: a contiguous copy serves
        first = items[0][2].device
        if any(p.device != first or g.device != first for _, _, p, g in items) or first.type != "cpu":
            tensors = {}          # the checked path: its error names the tensors
            for j, (_, _, p, g) in enumerate(items):
                tensors[step.name(j)], tensors[step.name(j) + ".grad"] = p, g
            first = device_of(where, **tensors)
        if first.type != "cpu" and not self._backend.has("device_buffers"):
            raise TypeError(where_msg(where, "%s is on %s, but the loaded vendor (%s) takes host buffers only; set "
                                      "MOJO_TRAIN_VENDOR=cuda" % (step.name(0), first, self._backend.vendor)))
        step.device = first
        step.offsets = step.make_offsets(where)        # before any state is made: a refusal here allocates none
        return step

    def _state_tensor(self, step, j, key, where):
        """The state tensor ``key`` of item j, created (zeros, the parameter's layout) when absent."""
        p = step.items[j][2]
        state = self._state_of(step, p)
        t = state.get(key)
        if t is None:
            step.made.append((state, key, state.get(key, _ABSENT)))
            t = state[key] = torch.zeros_like(p, memory_format=torch.contiguous_format)
            return t
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.shape != p.shape or \
                t.device != p.device or not t.is_contiguous():
            raise ValueError(where_msg(where, "the state %r of %s is %s; it must be a contiguous float32 tensor "
                                       "shaped and placed like the parameter %s on %s"
                                       % (key, step.name(j), _described(t), tuple(p.shape), p.device)))
        return t

    def _state_of(self, step, p):
        """``self.state[p]``, made (and recorded, so a refused step removes it again) when absent: a read of
        torch's defaultdict would leave an empty entry behind."""
        if p not in self.state:
            step.made.append((self.state, p, _ABSENT))
            self.state[p] = {}
        return self.state[p]

    def _refuse_shared(self, step, tables, where):
        """Gradients sharing memory with each other, a parameter or the state: refused."""
        nbytes = [item[2].numel() * 4 for item in step.items]
        groups, labels = [], []
        for label, tensors in tables:
            starts = [t.data_ptr() if t is not None else 0 for t in tensors]
            ends = [s + (b if t is not None else 0) for s, b, t in zip(starts, nbytes, tensors)]
            groups.append((starts, ends))
            labels.append(label)

        def name_of(order):
            g, j = order
            return labels[g] % step.name(j)
        _refuse_overlap(groups, name_of, where, "pass each gradient once, in memory of its own")

    def _call(self, step, fn, args, where):
        """The native step (torch's stream drained first); a refusal names the user's tensors."""
        wait_for_torch(step.device)
        rc = fn(*args)
        if rc:
            try:
                self._backend.check(rc, where)
            except Exception as exc:
                def user(m):
                    return step.name(int(m.group(2))) + (".grad" if m.group(1) == "grads" else "")
                raise type(exc)(re.sub(r"\b(params|grads)\[(\d+)\]", user, str(exc))) from None
        for item in step.items:              # written in place, as torch's in-place ops count
            torch.autograd.graph.increment_version(item[2])

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient (``p.grad``), every group in one
        native call; returns the closure's loss (called with grad enabled) or None. A refused
        step changes nothing (module docstring)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        with self._step_lock:       # the plan's and the group table's memory is the native call's
            return self._locked_step(loss)

    def _locked_step(self, loss):
        where = self._WHERE + ".step"
        table, values = self._native_groups(where)
        plan = self._plan                       # read once: the plan whose tables the call reads
        bound = plan.bind(self, values) if plan is not None else None
        if bound is not None:                   # nothing changed since the plan: its tables, this step's grads
            items, counts = bound
            step = _Step(items, plan.device)
            self._call(step, *self._plan_call(plan, table), where)    # a refusal made nothing
            self._advance(step, counts)
        else:
            self._plan = plan = None            # let go of the old state before new state is made
            step = self._gather(where)
            if not step.n:
                return loss
            try:
                fn, args = self._prepare(step, table, values, where)
                self._call(step, fn, args, where)
            except BaseException:
                for state, key, previous in reversed(step.made):     # as it was before the step
                    if previous is _ABSENT:
                        state.pop(key, None)
                    else:
                        state[key] = previous
                raise
            self._advance(step)
            self._plan = StepPlan(self, step, values)
        for i in sorted({item[0] for item in step.items}):
            self.param_groups[i]["steps_taken"] += 1
        return loss

    def _advance(self, step, counts=None):
        """After a step: what the optimizer counts (nothing here; ``counts``: the step-count
        tensors of the items, when the plan found them)."""


def _write_row(row, v, bits):
    """Group values ``v`` (checked) and flags ``bits`` into a native group row (mt_sgd_group or
    mt_adam_group); a scheduled group's lr is written by the step."""
    for key in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if key in v and not (key == "lr" and v["lr_schedule"] is not None):
            setattr(row, key, v[key])
    if "betas" in v:
        row.beta1, row.beta2 = v["betas"]
    row.flags = bits


def _schedules_as_configs(optimizer, state_dict):
    """state_dict post-hook: a group's lr_schedule saved as its config() (plain data, which
    ``torch.load(weights_only=True)`` reads), as mojo_train's own optimizers save it."""
    for group in state_dict["param_groups"]:
        sched = group.get("lr_schedule")
        if sched is not None and callable(getattr(sched, "config", None)):
            group["lr_schedule"] = {"mojo_train_schedule": sched.config()}
    return state_dict


def _schedules_from_configs(optimizer, state_dict):
    """load_state_dict pre-hook: the schedules a state_dict holds as configs, rebuilt."""
    from ..schedule import _Schedule
    groups = []
    for group in state_dict["param_groups"]:
        sched = group.get("lr_schedule")
        if isinstance(sched, dict) and set(sched) == {"mojo_train_schedule"}:
            try:
                sched = _Schedule.from_config(sched["mojo_train_schedule"])
            except (TypeError, ValueError) as exc:
                raise ValueError(where_msg(optimizer._WHERE + ".load_state_dict", "a group's lr_schedule config "
                                           "cannot be read: %s" % exc)) from None
            group = dict(group, lr_schedule=sched)
        groups.append(group)
    return dict(state_dict, param_groups=groups)


_SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")


def _check_loaded_moments(optimizer, state_dict):
    """load_state_dict pre-hook, before anything is loaded: the native load_state_dict's rules
    for the moments a step reads, as torch's load casts them (to float32) -- exp_avg and the
    momentum buffer finite, second moments >= 0 and not NaN (+inf, which a step writes where a
    gradient's square overflows, is taken) -- since a step does not scan its state: a NaN or
    negative second moment would step the parameter into NaN. Adam's state with a step count but
    without exp_avg or exp_avg_sq is refused too (torch's own step fails on it; ours would start
    its moments from zero)."""
    where = optimizer._WHERE + ".load_state_dict"
    state = state_dict.get("state") if isinstance(state_dict, dict) else None
    if not isinstance(state, dict):
        return None                     # torch's own checks name it
    for index, entry in state.items():
        if not isinstance(entry, dict):
            continue
        for key in optimizer._SLOTS:
            t = entry.get(key)
            if not torch.is_tensor(t) or not t.is_floating_point():
                continue                # absent, None or not a tensor: the step names it
            v = t.detach().to(torch.float32).flatten()
            second = key in _SECOND_MOMENTS
            bad = torch.isnan(v) | (v < 0) if second else ~torch.isfinite(v)
            if bool(bad.any()):
                j = int(bad.nonzero()[0])
                cast = "" if t.dtype == torch.float32 else " as float32 (torch's load casts it so)"
                why = ("a second moment must be >= 0 and not NaN (the step takes its square root; +inf is taken)"
                       if second else "it must be finite (a non-finite one makes the parameter non-finite)")
                raise ValueError(where_msg(where, "state[%r][%r] holds %r at flat index %d%s; %s"
                                           % (index, key, float(v[j]), j, cast, why)))
        if "exp_avg" in optimizer._SLOTS and "step" in entry:
            missing = [k for k in ("exp_avg", "exp_avg_sq") if k not in entry]
            if missing:
                raise ValueError(where_msg(where, "state[%r] has a step count but no %s; torch's Adam state holds "
                                           "step, exp_avg and exp_avg_sq together" % (index, " or ".join(missing))))
    return None


def _described(value):
    if isinstance(value, torch.Tensor):
        return "a %s tensor of shape %s on %s%s" % (value.dtype, tuple(value.shape), value.device,
                                                    "" if value.is_contiguous() else ", not contiguous")
    return "a %s" % type(value).__name__


class Adam(_NativeOptimizer):
    """``torch.optim.Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
    amsgrad=False, *, foreach=None, maximize=False, capturable=False, differentiable=False,
    fused=None, decoupled_weight_decay=False)`` stepped by mojo_train (module docstring), plus
    ``lr_schedule=None`` and ``numeric_mode=None``. ``decoupled_weight_decay=True`` is AdamW's
    update. Bias corrections are the contract's float32 routine per tensor, from its
    ``state['step']``."""

    _WHERE = "torch.optim.Adam"
    _HYPER = _groups.ADAM_HYPER
    _CTYPE = "mt_adam_group"
    _SLOTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, lr_schedule=None, numeric_mode=None):
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad, maximize=maximize,
                        foreach=foreach, capturable=capturable, differentiable=differentiable, fused=fused,
                        decoupled_weight_decay=decoupled_weight_decay, lr_schedule=lr_schedule)
        if not isinstance(decoupled_weight_decay, bool):
            raise TypeError(where_msg(self._WHERE, "decoupled_weight_decay must be True or False, got %r"
                                      % (decoupled_weight_decay,)))
        super().__init__(params, defaults, numeric_mode)

    def _decoupled(self, group):
        return bool(group.get("decoupled_weight_decay"))

    def _prepare(self, step, table, values, where):
        n = step.n
        steps = ffi.new("int64_t[]", n)
        m, v, w = [], [], []
        for j, (i, k, p, g) in enumerate(step.items):
            state = self._state_of(step, p)
            if "step" in state and not torch.is_tensor(state["step"]):
                raise ValueError(where_msg(where, "state['step'] of %s is a %s; torch keeps it as a tensor (load the "
                                           "state with load_state_dict, which converts it)"
                                           % (step.name(j), type(state["step"]).__name__)))
            if "step" not in state:
                step.made.append((state, "step", _ABSENT))
                state["step"] = torch.tensor(0.0, dtype=_scalar_dtype())
            s = float(state["step"])
            if not (0 <= s < 2.0**63 and s == math.floor(s)):
                raise ValueError(where_msg(where, "state['step'] of %s is %r; a step count is a whole number >= 0"
                                           % (step.name(j), s)))
            steps[j] = int(s)
            m.append(self._state_tensor(step, j, "exp_avg", where))
            v.append(self._state_tensor(step, j, "exp_avg_sq", where))
            w.append(self._state_tensor(step, j, "max_exp_avg_sq", where) if values[i]["amsgrad"] else None)
        params, grads = [it[2] for it in step.items], [it[3] for it in step.items]
        self._refuse_shared(step, [("%s", params), ("%s.grad", grads), ("the exp_avg of %s", m),
                                   ("the exp_avg_sq of %s", v), ("the max_exp_avg_sq of %s", w)], where)
        tg = ffi.new("int32_t[]", [it[0] for it in step.items])
        return self._backend.lib.mt_adam_step_groups, (
            step.table(params), step.table(grads), step.table(m), step.table(v), step.table(w), steps, ffi.NULL,
            step.offsets, table, tg, 0, 0.0, len(self.param_groups), n)

    def _advance(self, step, counts=None):
        """Each tensor's state['step'] + 1, in place, as torch's own step counts (one foreach call)."""
        if counts is None:
            counts = [self.state[item[2]]["step"] for item in step.items]
        torch._foreach_add_(counts, 1)

    @staticmethod
    def _plan_fact(v):
        """What of a group's checked values ``v`` decides its tensors' state: amsgrad."""
        return v["amsgrad"]

    def _plan_state(self, items, values):
        """(per item: its exp_avg, exp_avg_sq and max_exp_avg_sq -- None unless amsgrad --, True:
        the items' step counts are read), for a StepPlan."""
        rows = []
        for i, _, p, _ in items:
            st = self.state[p]
            rows.append((st["exp_avg"], st["exp_avg_sq"], st["max_exp_avg_sq"] if values[i]["amsgrad"] else None))
        return rows, True

    @staticmethod
    def _plan_numbers(items, values):
        return ffi.new("int64_t[]", len(items))          # the step counts, written by each bind

    def _plan_call(self, plan, table):
        p, g, m, v, w = plan.tables
        return self._backend.lib.mt_adam_step_groups, (p, g, m, v, w, plan.numbers, ffi.NULL, plan.offsets, table,
                                                        plan.tensor_group, 0, 0.0, len(plan.facts), len(plan.params))


class AdamW(Adam):
    """``torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2,
    amsgrad=False, *, maximize=False, foreach=None, capturable=False, differentiable=False,
    fused=None)``: Adam with decoupled weight decay, stepped by mojo_train, plus
    ``lr_schedule=None`` and ``numeric_mode=None``."""

    _WHERE = "torch.optim.AdamW"

    def __setstate__(self, state):
        super().__setstate__(state)
        for group in self.param_groups:     # AdamW's decay is decoupled whatever a loaded group says, as torch's
            group["decoupled_weight_decay"] = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 lr_schedule=None, numeric_mode=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         foreach=foreach, maximize=maximize, capturable=capturable, differentiable=differentiable,
                         fused=fused, decoupled_weight_decay=True, lr_schedule=lr_schedule,
                         numeric_mode=numeric_mode)


class SGD(_NativeOptimizer):
    """``torch.optim.SGD(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
    nesterov=False, *, maximize=False, foreach=None, differentiable=False, fused=None)`` stepped
    by mojo_train (module docstring), plus ``lr_schedule=None`` and ``numeric_mode=None``. With
    momentum, ``state[p]['momentum_buffer']`` is the gradient after the first step, as torch's."""

    _WHERE = "torch.optim.SGD"
    _HYPER = _groups.SGD_HYPER
    _CTYPE = "mt_sgd_group"
    _SLOTS = ("momentum_buffer",)

    def __init__(self, params, lr=1e-3, momentum=0, dampening=0, weight_decay=0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, lr_schedule=None,
                 numeric_mode=None):
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov,
                        maximize=maximize, foreach=foreach, differentiable=differentiable, fused=fused,
                        lr_schedule=lr_schedule)
        super().__init__(params, defaults, numeric_mode)

    def _prepare(self, step, table, values, where):
        n = step.n
        init = ffi.new("int32_t[]", max(n, 1))
        bufs = []
        for j, (i, k, p, g) in enumerate(step.items):
            if values[i]["momentum"] == 0.0:
                bufs.append(None)
                continue
            init[j] = 1 if self.state.get(p, {}).get("momentum_buffer") is not None else 0
            bufs.append(self._state_tensor(step, j, "momentum_buffer", where))
        params, grads = [it[2] for it in step.items], [it[3] for it in step.items]
        self._refuse_shared(step, [("%s", params), ("%s.grad", grads), ("the momentum_buffer of %s", bufs)], where)
        tg = ffi.new("int32_t[]", [it[0] for it in step.items])
        return self._backend.lib.mt_sgd_step_groups, (
            step.table(params), step.table(grads), step.table(bufs), init, ffi.NULL, step.offsets, table, tg,
            0, 0.0, len(self.param_groups), n)

    @staticmethod
    def _plan_fact(v):
        """What of a group's checked values ``v`` decides its tensors' state: momentum or none."""
        return v["momentum"] != 0.0

    def _plan_state(self, items, values):
        """(per item: its momentum_buffer, None without momentum; False: no step counts), for a
        StepPlan."""
        return [(self.state[p]["momentum_buffer"] if values[i]["momentum"] != 0.0 else None,)
                for i, _, p, _ in items], False

    @staticmethod
    def _plan_numbers(items, values):
        """Each item's buffer-made flag: 1 where its group has momentum (the buffer exists after
        the step that made the plan)."""
        return ffi.new("int32_t[]", [1 if values[i]["momentum"] != 0.0 else 0 for i, _, _, _ in items] or [0])

    def _plan_call(self, plan, table):
        p, g, bufs = plan.tables
        return self._backend.lib.mt_sgd_step_groups, (p, g, bufs, plan.numbers, ffi.NULL, plan.offsets, table,
                                                       plan.tensor_group, 0, 0.0, len(plan.facts), len(plan.params))
