"""SGD, Adam and AdamW, bit-pinned in the identical numeric mode (``clip_grad_norm_`` lives in
mojo_train.clip and is re-exported here, so ``mojo_train.optim.clip_grad_norm_`` works).

The names and defaults are torch's. There is no autograd here, so ``step`` takes the
gradients: ``opt.step(grads, max_norm=None)`` updates the parameters in place, clipping the
gradients first (in place, as ``clip_grad_norm_`` would) when ``max_norm`` is given, and
returns the pre-clip total norm or None. A refused step changes nothing: not the params,
not the grads, not the moments, not ``t`` or the step counts. The arithmetic is
native/contracts/optim.md and clip.md; tensors are addressed in place through a pointer table,
so a list of separate arrays is neither packed nor copied.

Param groups, as torch's: ``params`` may be a list of dicts (``[{"params": [...], "lr": 0.1},
{"params": [...], "weight_decay": 0.0}]``); a key a group lacks takes the constructor's value
(``defaults``). ``param_groups`` holds the groups (each its ``params`` list and every
hyper-parameter), ``add_param_group`` adds one. One native call steps every group; the
gradients of ``step`` are one list in the order of ``opt.params`` (group 0's tensors, then
group 1's, ...). A group's values may be changed between steps (``opt.param_groups[1]["lr"] =
0.01``); a step checks a changed group first and refuses a bad value naming the group and key.
The attributes ``lr``, ``weight_decay``, ... read the value every group shares (a ValueError
when the groups differ) and set it in every group and in ``defaults``. Adam and AdamW keep a step
count per tensor (``steps``, as torch's per-parameter ``state["step"]``): a group added later
starts at step 1 while the others go on. ``t`` counts the steps taken by the optimizer.

``lr_schedule=`` (``ConstantLR``, ``WarmupLinearLR``, ``WarmupCosineLR`` or any object with a
one-based ``lr_at(t)``), per group or for all: step t's lr is ``lr_schedule.lr_at(t)`` (t the
optimizer's step), rounded to float32 (our schedules already are), and the group's ``lr`` is not
read while a schedule is set (it is kept for when ``lr_schedule`` is set back to None).
``accumulation_steps=A`` and ``step_accumulated(microbatch_grads, tokens, max_norm=None)``: the A
microbatch gradients are combined by ``accumulate_grads`` (the pairwise tree; an unaligned split
is refused when ``tokens`` is given), then one ``step``. ``state_dict`` carries ``lr``, the
schedule's ``config()`` and ``accumulation_steps`` beside ``t`` and the moments, the groups
and the per-tensor step counts; ``load_state_dict`` validates every key and value before it
changes anything (see its docstring). Tensors may be empty (0 elements), as in torch.

Memory: parameters must not share memory with each other, nor gradients with each other, a
parameter or the optimizer's state (a step reads every gradient while it writes the params, the
state and, clipping, the gradients: a shared element would depend on the order of those writes).
Both are refused naming the two positions, e.g. ``grads[0] and grads[3] share memory``. One
object is one tensor: the same object in two places -- twice in a list, in two groups (torch
refuses that too), or a gradient that is its parameter -- is refused even when it is empty and
so shares no byte (``params[0]['params'][1] and params[1]['params'][0] are the same tensor``).
"The same" is identity: distinct objects are distinct tensors, whatever they view, so two
distinct empty tensors (even two memoryviews of one empty buffer) are two parameters, as in torch.

torch's switches are taken at the values that ask for nothing this library lacks: ``amsgrad``
both ways (AMSGrad: the denominator from the running maximum ``max_exp_avg_sq``, torch's
arithmetic order), ``capturable``, ``differentiable`` (and Adam's ``decoupled_weight_decay``) at
False; ``foreach`` and ``fused`` at None, False or True. ``foreach=True`` and ``fused=True`` are
execution choices that torch documents as the same update; every step here already is one fused
native pass over all tensors (one pointer table, one launch), so they change nothing, not a bit.
``capturable=True`` and ``differentiable=True`` ask for behaviour this library lacks and are
refused by name (NotImplementedError), as is ``fused=True`` with ``foreach=True`` (torch refuses
that pair too).
"""
import math
import numbers

from ._errors import refuse_keywords, where_msg
from . import _buffer
from ._array import Array, float32_at
from ._native import ffi, load, numeric_mode_arg
from ._optim_common import (_Registry, _indexed, _probe_ranges, _real, _refuse_overlap, _refuse_same,
                            _single, _switches, _table_ranges)
from . import _optim_groups as _groups
from .clip import clip_grad_norm_   # noqa: F401  (mojo_train.optim.clip_grad_norm_ keeps working)
from .device import DeviceArray

__all__ = ["SGD", "Adam", "AdamW", "clip_grad_norm_"]

# torch keywords this library does not take, and why; anything else unknown is refused too.
_REFUSED = {
    "param_groups": "param groups are passed as params, a list of dicts (torch's constructor takes "
                    "no param_groups either), or added with add_param_group",
    "dtype": "float32 only: other dtypes are refused, never cast",
    "device": "the device follows the loaded vendor (MOJO_TRAIN_VENDOR) and the buffers",
}


def _accumulation_steps(value, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "accumulation_steps must be an int, got %r" % (value,)))
    if not 1 <= int(value) <= 2 ** 31 - 1:
        raise ValueError(where_msg(where, "accumulation_steps must be in [1, 2**31 - 1], got %r" % (value,)))
    return int(value)


def _ptr_int(array):
    """The data address of a mojo_train.Array or DeviceArray, an int."""
    return array.ptr if type(array) is DeviceArray else array.address


def _ptr(array, ctype="float *"):
    """A cffi pointer to the data of a mojo_train.Array or DeviceArray."""
    return ffi.cast(ctype, _ptr_int(array))


def _native_max_norm(max_norm, where):
    if max_norm is None:
        return 0, 0.0
    return 1, _real(max_norm, "max_norm", where)


def _hyper_property(key, doc):
    """An optimizer attribute over every group's ``key``: reading gives the value the groups
    share, writing sets it in every group and in ``defaults`` (checked at the next step)."""
    def get(self):
        values = [g[key] for g in self.param_groups]
        if all(v is values[0] or v == values[0] for v in values[1:]):
            return values[0]
        raise ValueError(where_msg("%s.%s" % (self._WHERE, key), "the param groups hold different values %r; read "
                                   "param_groups[i][%r]" % (values, key)))

    def put(self, value):
        for group in self.param_groups:
            group[key] = value
        self.defaults[key] = value
    return property(get, put, doc=doc)


class _Optimizer:
    """What SGD, Adam and AdamW share: the registry, the groups, the state, step bookkeeping."""

    _WHERE = "Optimizer"
    _NOT_TAKEN = {}    # this class's own refused keywords, beside _REFUSED
    _HYPER = ()        # (key, check) of a group's hyper-parameters (_optim_groups)
    _STATE = ()
    _OPTIONAL = ()     # state kept only while some group asks for it (_asks_for)
    _CTYPE = None      # the native group struct

    def _refuse_kwargs(self, kwargs):
        refuse_keywords(kwargs, self._WHERE, dict(_REFUSED, **self._NOT_TAKEN))

    def __init__(self, params, defaults, numeric_mode, resident, accumulation_steps=1):
        where = self._WHERE
        self.accumulation_steps = _accumulation_steps(accumulation_steps, where)
        if not any(resident is v for v in (None, True, False)):     # 1 == True: an identity test
            raise TypeError(where_msg(where, "resident must be None, True or False, got %r" % (resident,)))
        self.defaults = _groups.check_values(self._HYPER, defaults, None, where)
        self._backend = load(numeric_mode_arg(numeric_mode, where))
        self._device_ok = self._backend.has("device_buffers")
        self.numeric_mode = self._backend.numeric_mode
        groups, probes, names = [], [], []
        parts = _groups.split_params(params, where)
        self._plain = parts[0][1] is None      # a tensor list: one group, named by the arguments
        for tensors, group, prefix in parts:
            pl = self._probe_group(tensors, prefix if group is None else prefix + "['params']", where)
            values = self.defaults if group is None else _groups.group_values(self._HYPER, group, self.defaults,
                                                                              prefix, where)
            groups.append(dict({"params": [pb.obj for pb in pl]}, **values))
            probes += pl
            names += ([_indexed("params", _single(params))((0, j)) for j in range(len(pl))] if group is None
                      else ["%s['params'][%d]" % (prefix, k) for k in range(len(pl))])
        self._native = _groups.NativeGroups(self._CTYPE, self._HYPER, self._flags_of)
        self._adopt(groups, *self._registry_for(_buffer.ProbeList(probes), names, where), names)
        self._gtable = ffi.new("float *[]", self._params.n)
        self._last_grads = _buffer.LastTable()   # the same gradient list step after step
        self.t = 0
        self.lr_ = None
        self.total_norm_ = None
        self.clip_coef_ = None
        self.packed_ = False   # tensors are addressed in place: nothing is ever packed
        self._norm_out = Array((2,), "float32")
        self._norm_ptr = _ptr(self._norm_out)
        # On a GPU vendor the moments live in device memory between steps unless resident=False.
        self.resident = self._backend.vendor != "cpu" and resident is not False
        self._state, self._sptr, self._stab = {}, {}, {}
        self._steps = ffi.new("int64_t[]", self._params.n)

    def _probe_group(self, tensors, name, where):
        """The checked float32 Probes of one group's tensors (a tensor may be empty, the list not;
        device memory is checked with the registry)."""
        if type(tensors) in (list, tuple) and not tensors:
            raise ValueError(where_msg(where, "%s is an empty list" % name))
        return _buffer.tensor_list(tensors, name, where, inplace=True, allow_empty=True)

    def _registry_for(self, probes, names, where):
        """(registry, byte ranges) over every tensor (``probes``, named ``names``), refusing
        tensors that share memory or are one object twice (module docstring)."""
        ranges = _probe_ranges(probes)
        name_of = lambda order: names[order[1]]
        _refuse_overlap([ranges], name_of, where, "pass each parameter once")
        _refuse_same([[pb.obj for pb in probes]], name_of, where, "pass each parameter once")
        return _Registry(None, "params", where, inplace=True, backend=self._backend, probes=probes), ranges

    def _adopt(self, groups, registry, ranges, names):
        """Make ``groups`` (over ``registry``) the optimizer's, with their native group table."""
        probes = registry.probes
        self._native.rebuild(groups, [len(g["params"]) for g in groups], self._group_names(len(groups)))
        self._params, self._param_ranges, self._names = registry, ranges, names
        self.param_groups = groups
        self.params = [pb.obj for pb in probes]
        self._shapes = [pb.shape for pb in probes]
        self._grad_nbytes = [pb.nbytes for pb in probes]

    def _group_names(self, n):
        """The prefix messages give group i's keys: none for one group made from a tensor list
        (its values are the constructor's arguments and the attributes), else param_groups[i]."""
        return [None] * n if n == 1 and self._plain else [_groups.group_name(i) for i in range(n)]

    def _param_name(self, order):
        return self._names[order[1]]

    lr = _hyper_property("lr", "The learning rate every group shares (param_groups[i]['lr'] when they differ).")
    weight_decay = _hyper_property("weight_decay", "The weight decay every group shares.")
    maximize = _hyper_property("maximize", "Whether every group ascends.")
    lr_schedule = _hyper_property("lr_schedule", "The lr schedule every group shares (None: the groups' lr).")

    @property
    def n_total(self):
        """Number of parameter elements over all tensors."""
        return self._params.total

    def _flags_of(self, values):
        return _groups.flags(self._backend.lib, values, getattr(self, "_DECOUPLED", False))

    def _grads(self, grads, inplace, where):
        """(pointer table, handles to keep alive) for a gradient list matching params, in
        memory of its own (``_refuse_shared``). A list of our arrays met again is not
        looked at again: its memory cannot have moved, and new state is a new allocation."""
        if self._last_grads.get(grads) is not None:
            return self._gtable, grads
        self._last_grads.put((), None)      # the table below is about to change
        keep = _buffer.float32_table(grads, self._shapes, self._gtable, inplace=inplace, device_ok=self._device_ok)
        if keep is not None:
            table, objects = self._gtable, grads
        else:
            keep = _Registry(grads, "grads", where, inplace=inplace, backend=self._backend, like=self._params,
                             allow_empty=True)
            table, objects = keep.table, [pb.obj for pb in keep.probes]
        self._refuse_shared(_table_ranges(table, self._grad_nbytes), objects, _indexed("grads", _single(grads)),
                            where)
        if table is self._gtable:
            self._last_grads.put(grads, True)
        return table, keep

    def _refuse_shared(self, grad_ranges, grad_objects, grad_name, where):
        """Refuse gradients (``grad_ranges``, the objects ``grad_objects``, named by
        ``grad_name``) that share memory with each other, a parameter or the state, or that are
        one object twice or a parameter itself (module docstring)."""
        state = [(name, v) for name, v in ((n, self._state.get(n)) for n in self._STATE) if v is not None]
        starts = [_ptr_int(v) for _, v in state]
        state_ranges = starts, [a + v.nbytes for a, (_, v) in zip(starts, state)]

        def name_of(order):
            if order[0] == 0:
                return grad_name(order)
            return self._param_name(order) if order[0] == 1 else "the optimizer's %s" % state[order[1]][0]
        fix = "pass each gradient once, in memory of its own"
        _refuse_overlap([grad_ranges, self._param_ranges, state_ranges], name_of, where, fix)
        _refuse_same([grad_objects, self.params], name_of, where, fix)

    def _native_groups(self, where):
        """Check the groups that changed since the last step, write the native table; allocate
        the state a group newly asks for (returned, so that a refused step can drop it).
        Returns (the first group's lr, the names of state made now)."""
        native = self._native
        lr = native.sync(self.param_groups, self.t + 1, where)
        made = []
        if native.changed:                 # a group was written: does it ask for state not kept yet?
            native.changed = False
            for name in self._OPTIONAL:
                if self._state.get(name) is None and any(self._asks_for(name, v) for v in native.values):
                    self._put_state(name, self._zeros(name))
                    made.append(name)
        return lr, made

    def _call(self, rc, made, where):
        """Refuse (dropping the state made for this step, asked for again next time) or go on."""
        if rc:
            for name in made:
                self._put_state(name, None)
            self._native.changed = self._native.changed or bool(made)
        self._backend.check(rc, where)

    def _check_room(self, where):
        """A step makes t + 1, which load_state_dict must take back: t stays below 2**62."""
        if self.t >= _MAX_STEPS - 1:
            raise ValueError(where_msg(where, "the optimizer has taken t=%d steps, the most a run counts (2**62 - 1: "
                                       "the range of t that load_state_dict takes)" % self.t))

    def _finish(self, clip, lr):
        self.t += 1
        self.lr_ = float(ffi.cast("float", lr))
        if clip:
            self.total_norm_, self.clip_coef_ = float32_at(self._norm_out.address), float32_at(self._norm_out.address, 1)
        else:
            self.total_norm_ = self.clip_coef_ = None
        return self.total_norm_

    def step_accumulated(self, microbatch_grads, tokens, max_norm=None):
        """One step from ``accumulation_steps`` microbatch gradients (each a gradient list
        matching params), in microbatch order: they are combined by ``accumulate_grads``
        (the pairwise tree over microbatches; with ``tokens``, the whole step's token count,
        a split that ``accumulation_is_aligned`` rejects is refused) into new arrays, which
        are then stepped as ``step`` steps them (and clipped, with ``max_norm``; the step's own
        checks come first, in this method's name; a subclass's override of ``step`` is not
        called). The microbatch gradients are
        never written. A tensor listed twice in one microbatch, or one sharing memory with a
        parameter or the state, is refused naming both (``microbatch_grads[1][0] and
        microbatch_grads[1][2] share memory``). Returns what ``step`` returns; a refusal
        changes nothing."""
        from .accumulate import accumulate_grads
        where = self._WHERE + ".step_accumulated"
        if _buffer._is_buffer(microbatch_grads) or not isinstance(microbatch_grads, (list, tuple)):
            raise TypeError(where_msg(where, "microbatch_grads must be a list of %d gradient lists, got %s"
                                             % (self.accumulation_steps, type(microbatch_grads).__name__)))
        if len(microbatch_grads) != self.accumulation_steps:
            raise ValueError(where_msg(where, "microbatch_grads holds %d microbatch gradients for "
                                              "accumulation_steps=%d; the count is part of the run's arithmetic "
                                              "(make the optimizer with the count you use)"
                                       % (len(microbatch_grads), self.accumulation_steps)))
        for i, entry in enumerate(microbatch_grads):      # checked before any work is done
            name = "microbatch_grads[%d]" % i
            probes = _buffer.tensor_list(entry, name, where, inplace=False, allow_empty=True)
            if len(probes) != len(self._shapes):
                raise ValueError(where_msg(where, "%s has %d tensors for %d parameters; each microbatch's "
                                                  "gradients match params" % (name, len(probes), len(self._shapes))))
            for j, (pb, shape) in enumerate(zip(probes, self._shapes)):
                if tuple(pb.shape) != tuple(shape):
                    raise ValueError(where_msg(where, "%s has shape %r, %s has %r"
                                               % (_indexed(name, _single(entry))((0, j)), tuple(pb.shape),
                                                  self._names[j], tuple(shape))))
            self._refuse_shared(_probe_ranges(probes), [pb.obj for pb in probes], _indexed(name, _single(entry)),
                                where)
        _native_max_norm(max_norm, where)      # the step's own checks, before the combining's work
        self._check_room(where)
        try:
            combined = accumulate_grads(list(microbatch_grads), tokens, numeric_mode=self.numeric_mode)
        except (ValueError, TypeError) as exc:    # said of this call: the combining is part of it
            text = str(exc)
            head = "mojo_train.accumulate_grads: "
            if not text.startswith(head):
                raise
            raise type(exc)(where_msg(where, text[len(head):])) from None
        return self._step(combined, max_norm, where)

    def zero_grad(self, grads):
        """Write +0.0 into every gradient tensor (matching params in count and shape)."""
        where = self._WHERE + ".zero_grad"
        table, keep = self._grads(grads, True, where)
        p = self._params
        self._backend.check(self._backend.lib.mt_fill_zero(table, p.c_offsets, p.n), where)
        _buffer.wrote(keep)

    def add_param_group(self, param_group):
        """Add a group, as ``torch.optim.Optimizer.add_param_group``: a dict with its tensors under
        ``'params'`` and any of this optimizer's hyper-parameters (the others from ``defaults``).
        Its tensors come after every tensor so far in ``params`` (and in the gradient list of
        ``step``); their state starts at zero and, for Adam, their step count at 0, while the
        other groups go on. A tensor already in a group (the same object, empty or not, or one
        sharing its memory) is refused naming both; a refusal changes nothing."""
        where = self._WHERE + ".add_param_group"
        if not isinstance(param_group, dict):
            raise TypeError(where_msg(where, "param_group must be a dict with its tensors under 'params', got %s"
                                             % type(param_group).__name__))
        tensors = _groups.group_tensors(param_group, "param_group", where)
        values = _groups.group_values(self._HYPER, param_group, self.defaults, "param_group", where)
        pl = self._probe_group(tensors, "param_group['params']", where)
        names = self._names + ["param_group['params'][%d]" % k for k in range(len(pl))]
        registry, ranges = self._registry_for(_buffer.ProbeList(list(self._params.probes) + list(pl)), names, where)
        old_n, old_total = self._params.n, self.n_total
        grown = {name: self._grown(name, registry, old_total, old_n) for name in self._STATE}
        groups = self.param_groups + [dict({"params": [pb.obj for pb in pl]}, **values)]
        self._plain = False
        self._adopt(groups, registry, ranges, self._names + ["param_groups[%d]['params'][%d]" % (len(groups) - 1, k)
                                                             for k in range(len(pl))])
        steps = ffi.new("int64_t[]", registry.n)
        ffi.memmove(steps, self._steps, old_n * 8)
        self._steps = steps
        self._gtable = ffi.new("float *[]", registry.n)
        self._last_grads = _buffer.LastTable()
        for name, value in grown.items():
            self._put_state(name, value)

    def _grown(self, name, registry, old_total, old_n):
        """State ``name`` for ``registry`` (add_param_group's): the old values first, zeros for
        the new tensors (None where none is kept)."""
        old = self._state.get(name)
        if old is None:
            return None
        new = self._zeros(name, registry)
        count = old_n if name == "buf_initialized" else old_total
        if count:
            if type(new) is DeviceArray:
                new._copy(new.ptr, old.ptr, old.nbytes)
            else:
                ffi.memmove(ffi.cast("char *", new.address), ffi.cast("char *", _ptr_int(old)), old.nbytes)
        return new

    # -- state ---------------------------------------------------------------------------
    def _zeros(self, name, registry=None):
        """Zero state ``name`` for ``registry`` (the optimizer's by default)."""
        registry = registry or self._params
        dtype = "int32" if name == "buf_initialized" else "float32"
        size = registry.n if name == "buf_initialized" else registry.total
        if self.resident and name != "buf_initialized":
            return DeviceArray((size,), dtype, numeric_mode=self.numeric_mode)
        return Array((size,), dtype)

    def _init_state(self):
        for name in self._STATE:
            self._put_state(name, None if self._state_layout(name)[2] else self._zeros(name))

    def _put_state(self, name, value):
        """Keep `value` (an Array, a DeviceArray or None) as state `name`; a host Array is
        uploaded into the device copy when the state is resident. The native calls get a
        pointer per tensor into it."""
        if value is not None and self.resident and name != "buf_initialized" and type(value) is Array:
            dev = self._state.get(name)
            if dev is None or dev.size != value.size:
                dev = DeviceArray(value.shape, value.dtype, numeric_mode=self.numeric_mode)
            value = dev.copy_from(value)
        self._state[name] = value
        if name == "buf_initialized":
            self._sptr[name] = ffi.NULL if value is None else _ptr(value, "int32_t *")
        else:
            self._stab[name] = ffi.NULL if value is None else self._table_into(value)

    def _table_into(self, value):
        """A pointer per tensor into the flat state ``value``, at the registry's offsets."""
        base, offsets, n = _ptr_int(value), self._params.offsets, self._params.n
        table = ffi.new("float *[]", n)
        for j in range(n):
            table[j] = ffi.cast("float *", base + 4 * offsets[j])
        return table

    def _get_state(self, name):
        value = self._state.get(name)
        return value.to_host() if type(value) is DeviceArray else value

    def _set_state(self, name, value):
        if name not in self._STATE:
            raise ValueError(where_msg(self._WHERE + "." + name, "%s keeps no %s; there is nothing to set"
                                       % (self._WHERE, name)))
        self._put_state(name, self._state_copy(value, name, self._WHERE + "." + name, self._kept(name)))

    exp_avg = property(lambda self: self._get_state("exp_avg"),
                       lambda self, v: self._set_state("exp_avg", v),
                       doc="First moment (SGD: momentum buffer), flat float32 over all params. "
                           "When resident on a device, reading gives a host copy and assigning uploads.")
    exp_avg_sq = property(lambda self: self._get_state("exp_avg_sq"),
                          lambda self, v: self._set_state("exp_avg_sq", v),
                          doc="Second moment, flat float32 over all params (see exp_avg).")
    buf_initialized = property(lambda self: self._get_state("buf_initialized"),
                               lambda self, v: self._set_state("buf_initialized", v),
                               doc="SGD: one int32 flag per tensor, 1 once its momentum buffer exists.")

    def state_dict(self):
        """``t``, ``lr``, the schedule's ``config()`` (None without a schedule, or for a schedule
        without ``config``), ``accumulation_steps`` and copies of the state arrays, ``param_groups``
        (each group's hyper-parameters, its schedule as a config, and the indices of its tensors
        in ``params``) and, for Adam, ``steps`` (each tensor's step count): enough to resume
        bit-identically. ``lr`` and ``lr_schedule`` are the defaults (the constructor's)."""
        cfg = self._config(self.defaults["lr_schedule"])
        state = {"t": self.t, "kind": self._WHERE, "n_total": self.n_total, "lr": self.defaults["lr"],
                 "lr_schedule": cfg, "accumulation_steps": self.accumulation_steps,
                 "param_groups": _groups.saved_groups(self.param_groups, self._native.sizes, self._HYPER)}
        for name in self._STATE:
            value = self._state.get(name)
            state[name] = None if value is None else (value.to_host() if type(value) is DeviceArray else value.copy())
        if "steps" in self._NEW_KEYS:
            state["steps"] = list(self._steps)
        return state

    @staticmethod
    def _config(sched):
        return sched.config() if sched is not None and callable(getattr(sched, "config", None)) else None

    def load_state_dict(self, state):
        """Restore what ``state_dict`` gave, after checking all of it; a refusal changes nothing.

        Every key of the format is required and no other is taken: ``kind`` (this class's
        name), ``n_total`` (this optimizer's), ``t`` (an int >= 0, not a bool), ``lr``,
        ``lr_schedule`` (None, or a schedule config agreeing with this optimizer's schedule),
        ``accumulation_steps`` (this optimizer's) and the state arrays: flat C-contiguous float32
        (``buf_initialized``: int32) buffers of the right length, never cast or reshaped (a list
        of floats is refused), ``exp_avg`` finite, ``exp_avg_sq >= 0`` (and ``max_exp_avg_sq >= 0``)
        and not NaN (+inf is taken: a step writes it where a gradient's square overflows),
        and every ``buf_initialized`` flag 0 or 1; ``exp_avg`` is None exactly where this
        optimizer keeps none (SGD with momentum=0), ``max_exp_avg_sq`` where no group uses amsgrad.

        ``param_groups`` (as many groups as this optimizer's, each listing the indices of the same
        tensors) sets every group's hyper-parameters, checked as the constructor checks them; a
        saved schedule config must agree with the group's schedule, or is taken when the group has
        none. Adam's ``steps`` are ints in [0, t]. A state written before param groups existed
        lacks ``param_groups``, ``steps`` and ``max_exp_avg_sq``: it is taken by an optimizer of one
        group (every tensor then at step ``t``); a state lacking only some of them is refused.

        The step count agrees with the state: moments exist only after a step, so at ``t == 0``
        Adam's moments are all zero and SGD's flags all 0, and a tensor at step 0 has zero moments
        (moments with the step reset to 0 would get step 1's bias corrections, made for moments
        holding one gradient, and the run would not resume); an SGD without a momentum buffer
        has flags 0. ``t >= 1`` with zero moments is a run whose gradients were zero, and is
        taken. These checks refuse the states that would make the next step write NaN by
        themselves (a negative or NaN second moment is a NaN square root, a non-finite first
        moment a non-finite parameter); they do not bound a moment by what gradients could have made it,
        so a finite ``exp_avg`` of 3e38 beside a zero ``exp_avg_sq`` is taken and its next
        update overflows the parameter to infinity, as torch's step would. A state that passes
        resumes bit-identically.
        """
        where = self._WHERE + ".load_state_dict"
        self._check_format(state, where)
        t = _step_count(state["t"], where)
        lr = _real(state["lr"], "lr", where)
        sched = self._schedule_from_state(state["lr_schedule"], where, self.defaults["lr_schedule"], "lr_schedule")
        if _accumulation_steps(state["accumulation_steps"], where) != self.accumulation_steps:
            raise ValueError(where_msg(where, "the state was saved with accumulation_steps=%d, this optimizer has %d"
                                       % (state["accumulation_steps"], self.accumulation_steps)))
        if "param_groups" in state:
            values = self._groups_from_state(state["param_groups"], where)
        elif len(self.param_groups) == 1:
            values = [dict(self._group_hyper(self.param_groups[0]), lr=lr, lr_schedule=sched)]
        else:
            raise ValueError(where_msg(where, "the state has no param_groups (it was saved before param groups), "
                                       "but this optimizer has %d groups" % len(self.param_groups)))
        new = {name: self._loaded(state, name, where, self._kept(name, values)) for name in self._STATE}
        steps = self._check_step_count(new, t, state.get("steps"), where)
        for name, value in new.items():
            self._put_state(name, value)
        for j, s in enumerate(steps):
            self._steps[j] = s
        for group, v in zip(self.param_groups, values):
            group.update(v)
        self._native.raw = [None] * len(self.param_groups)   # written again at the next step
        self.t = t
        self.defaults["lr"], self.defaults["lr_schedule"] = lr, sched

    def _loaded(self, state, name, where, kept):
        if name not in state and kept:     # a state from before param groups
            raise ValueError(where_msg(where, "state lacks %s, which this optimizer keeps (a group uses it)" % name))
        return self._state_copy(state.get(name), name, where, kept)

    def _group_hyper(self, group):
        return {k: group[k] for k, _ in self._HYPER}

    def _groups_from_state(self, saved, where):
        """The hyper-parameters of each group in a state's ``param_groups``, checked."""
        keys = [k for k, _ in self._HYPER]
        if type(saved) not in (list, tuple) or len(saved) != len(self.param_groups):
            raise ValueError(where_msg(where, "param_groups in the state must be a list of %d groups (this "
                                       "optimizer's), got %s" % (len(self.param_groups), _described(saved))))
        out, start = [], 0
        for i, (entry, size) in enumerate(zip(saved, self._native.sizes)):
            name = "param_groups[%d]" % i
            if not isinstance(entry, dict) or sorted(entry, key=str) != sorted(keys + ["params"]):
                raise ValueError(where_msg(where, "%s in the state must be a dict of exactly 'params' and %s, got %s"
                                           % (name, ", ".join(map(repr, keys)), _described(entry))))
            if not _groups.is_index_list(entry["params"], range(start, start + size)):
                raise ValueError(where_msg(where, "%s['params'] in the state is %r; this optimizer's group %d holds "
                                           "tensors %d..%d" % (name, entry["params"], i, start, start + size - 1)))
            start += size
            mine = self.param_groups[i]["lr_schedule"]
            sched = self._schedule_from_state(entry["lr_schedule"], where, mine, name + "['lr_schedule']")
            values = _groups.check_values(self._HYPER, dict(entry, lr_schedule=sched), name, where)
            out.append(values)
        return out

    def _check_format(self, state, where):
        """The keys of ``state_dict``'s format, all of them and no other (those added with param
        groups all or none); kind and n_total."""
        if not isinstance(state, dict):
            raise TypeError(where_msg(where, "state must be a dict, got %s" % type(state).__name__))
        kind = state.get("kind", self._WHERE)
        if not isinstance(kind, str) or kind != self._WHERE:
            raise ValueError(where_msg(where, "state is from %r (its kind), not %s" % (kind, self._WHERE)))
        keys = _KEYS + tuple(k for k in self._STATE if k not in self._NEW_KEYS) + self._NEW_KEYS
        new = [k for k in self._NEW_KEYS if k in state]
        required = keys if new else keys[:len(keys) - len(self._NEW_KEYS)]
        missing = [k for k in required if k not in state]
        if missing:
            raise ValueError(where_msg(where, "state lacks %s; %s.state_dict() holds %s"
                                       % (", ".join(missing), self._WHERE, ", ".join(keys))))
        unknown = [k for k in state if not (isinstance(k, str) and k in keys)]     # no other key's == is run
        if unknown:
            raise ValueError(where_msg(where, "state has unknown key%s %s; %s.state_dict() holds only %s"
                                       % ("s" if len(unknown) > 1 else "", ", ".join(map(repr, unknown)),
                                          self._WHERE, ", ".join(keys))))
        n = state["n_total"]
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(where_msg(where, "n_total must be an int, got %r" % (n,)))
        if n != self.n_total:
            raise ValueError(where_msg(where, "the state is for %d parameter elements (n_total), this optimizer "
                                       "has %d" % (n, self.n_total)))

    _NEW_KEYS = ("param_groups",)   # keys a state written before param groups lacks

    def _check_step_count(self, new, t, saved_steps, where):
        """At t == 0 (no step taken) the moments are zero (load_state_dict). Returns each
        tensor's step count (``t`` for every tensor: the base keeps none of its own)."""
        if t == 0:
            for name in self._STATE:
                if new[name] is not None and any(new[name].memview()):
                    raise ValueError(where_msg(where, "%s is non-zero at t=0, but moments exist only after a step: "
                                               "save t with them (the next step is step t + 1)" % name))
        return [t] * self._params.n

    def _schedule_from_state(self, cfg, where, mine, name):
        """The schedule to resume with: ``mine``, which must agree with a saved config; or, when
        there is none, the one the config describes."""
        if cfg is None:
            return mine
        from .schedule import _Schedule
        try:
            saved = _Schedule.from_config(cfg)
        except (TypeError, ValueError) as e:
            raise ValueError(where_msg(where, "%s in the state is not a schedule config: %s" % (name, e)))
        if mine is None:
            return saved
        if not callable(getattr(mine, "config", None)) or mine.config() != saved.config():
            raise ValueError(where_msg(where, "the state was saved with %s %r, this optimizer has %r"
                                              % (name, saved, mine)))
        return mine

    def _kept(self, name, values=None):
        """Whether state ``name`` is kept: always, or (optional state) while it exists or some
        group (``values``: the groups a load would give) asks for it."""
        if name not in self._OPTIONAL:
            return True
        if self._state.get(name) is not None:
            return True
        values = values if values is not None else [self._group_hyper(g) for g in self.param_groups]
        return any(self._asks_for(name, v) for v in values)

    def _state_copy(self, value, name, where, kept):
        """A checked host copy of state ``name`` (load_state_dict's rules for one array), or
        None where this optimizer keeps none."""
        dtype, want, _ = self._state_layout(name)
        if value is None or not kept:
            if value is None and not kept:
                return None
            raise ValueError(where_msg(where, self._absent_msg(name) if not kept else "%s must not be None" % name))
        if isinstance(value, (list, tuple)):
            raise TypeError(where_msg(where, "%s is a %s; pass a buffer of %s (state is never cast)"
                                             % (name, type(value).__name__, dtype)))
        pb = _buffer.probe(value, name, where)
        if pb.dtype != dtype:
            raise TypeError(where_msg(where, "%s must be a C-contiguous %s buffer, got %s"
                                             % (name, dtype, pb.dtype)))
        _buffer._check_layout(pb, name, where, allow_empty=True)      # strided: a ValueError, as everywhere
        if pb.nelems != want:
            raise ValueError(where_msg(where, "%s has %d elements, expected %d" % (name, pb.nelems, want)))
        if len(pb.shape) != 1:
            raise ValueError(where_msg(where, "%s has shape %r; the state is flat, shape (%d,) as state_dict() "
                                       "gives it" % (name, tuple(pb.shape), want)))
        if pb.view is None or not isinstance(pb.view, memoryview):   # device or DLPack memory
            out = Array((want,), dtype)
            self._backend.check(self._backend.lib.mt_memcpy(ffi.cast("void *", out.address),
                                                            ffi.cast("void *", pb.address), pb.nbytes), where)
        else:
            out = Array.from_buffer(value).reshape(want)
        _check_state_values(self._backend, out, name, where)     # the copy: what is checked is what is kept
        return out

    def _state_layout(self, name):
        """(dtype, element count, kept as None now) of a state entry."""
        if name == "buf_initialized":
            return "int32", self._params.n, False
        return "float32", self.n_total, not self._kept(name)


def _described(value):
    return "a %s" % type(value).__name__ if not isinstance(value, (list, tuple)) else "%d items" % len(value)


_MAX_STEPS = 2 ** 62                # t is in [0, _MAX_STEPS): what a state holds
_KEYS = ("kind", "t", "n_total", "lr", "lr_schedule", "accumulation_steps")   # + the class's _STATE


def _step_count(value, where, name="t", what="the steps taken", high=None):
    """A step count: an int in [0, 2**62) and, with ``high`` (t), at most ``high``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "%s must be an int (%s), got %r" % (name, what, value)))
    if not 0 <= value < _MAX_STEPS:
        raise ValueError(where_msg(where, "%s must be in [0, 2**62), got %r" % (name, value)))
    if high is not None and value > high:
        raise ValueError(where_msg(where, "%s is %d, more than t=%d: a tensor takes at most one step per step of "
                                          "the optimizer" % (name, value, high)))
    return int(value)


def _check_state_values(backend, array, name, where):
    """Flags 0 or 1; first moments finite; second moments >= 0 and not NaN (the step takes
    their square root; +inf, which a step writes where a gradient's square overflows, is
    taken). The moments are scanned natively (mt_find_bad_state: a few ms per 10M values)."""
    view = array.memview()
    if name == "buf_initialized":
        bad = next((j for j, f in enumerate(view) if f not in (0, 1)), None)
        if bad is not None:
            raise ValueError(where_msg(where, "buf_initialized[%d] is %d; each flag is 0 or 1 (1 once the tensor's "
                                       "momentum buffer exists)" % (bad, view[bad])))
        return
    first = ffi.new("int64_t *")
    backend.check(backend.lib.mt_find_bad_state(first, ffi.cast("float *", array.address), array.size,
                                                name in _SECOND_MOMENTS), where)
    j = first[0]
    if j < 0:
        return
    if name not in _SECOND_MOMENTS:
        raise ValueError(where_msg(where, "%s[%d] is %r; the state must be finite (a non-finite moment makes the "
                                   "next step's parameters non-finite)" % (name, j, view[j])))
    raise ValueError(where_msg(where, "%s[%d] is %r; a second moment is >= 0 and not NaN (the step takes its "
                               "square root; +inf is taken)" % (name, j, view[j])))


_SECOND_MOMENTS = ("exp_avg_sq", "max_exp_avg_sq")


class Adam(_Optimizer):
    """Adam with coupled weight decay (``g + weight_decay * p``), as ``torch.optim.Adam``.

    ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
    foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
    decoupled_weight_decay=False, lr_schedule=None, numeric_mode=None, resident=None,
    accumulation_steps=1)``: torch's signature, then ours. ``params`` is a float32 buffer, a
    list of them (updated in place) or a list of param groups (dicts; module docstring). Each
    group takes ``lr``, ``betas``, ``eps``, ``weight_decay``, ``amsgrad``, ``maximize`` and
    ``lr_schedule``. State: ``exp_avg``, ``exp_avg_sq`` and, once a group uses amsgrad,
    ``max_exp_avg_sq`` (flat float32 Arrays over all parameters, in registry order), ``steps``
    (each tensor's step count) and ``t`` (steps taken). Bias corrections are computed per tensor
    in float32 by the contract's pinned routine, not in float64 as torch does.

    torch's switches (module docstring): ``foreach`` and ``fused`` may be None, False or True
    and change nothing (every step is one fused native pass); ``amsgrad`` is taken both ways;
    ``capturable``, ``differentiable`` and ``decoupled_weight_decay`` are taken at False, and
    True is refused by name (decoupled decay is :class:`AdamW`).
    """

    _WHERE = "Adam"
    _DECOUPLED = False
    _HYPER = _groups.ADAM_HYPER
    _CTYPE = "mt_adam_group"
    _STATE = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
    _OPTIONAL = ("max_exp_avg_sq",)
    _NEW_KEYS = ("param_groups", "steps", "max_exp_avg_sq")

    betas = _hyper_property("betas", "The (beta1, beta2) every group shares.")
    eps = _hyper_property("eps", "The eps every group shares.")
    amsgrad = _hyper_property("amsgrad", "Whether every group uses AMSGrad.")
    max_exp_avg_sq = property(lambda self: self._get_state("max_exp_avg_sq"),
                              lambda self, v: self._set_state("max_exp_avg_sq", v),
                              doc="AMSGrad's running maximum of exp_avg_sq, flat float32 over all params (None "
                                  "until a group uses amsgrad; zero for tensors of the other groups).")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, lr_schedule=None, numeric_mode=None, resident=None,
                 accumulation_steps=1, **kwargs):
        self._refuse_kwargs(kwargs)
        _switches(self._WHERE, amsgrad=amsgrad, foreach=foreach, capturable=capturable,
                  differentiable=differentiable, fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                                      maximize=maximize, lr_schedule=lr_schedule),
                         numeric_mode, resident, accumulation_steps)
        self._init_state()

    @property
    def steps(self):
        """Each tensor's step count (the steps it has taken; torch's ``state[p]["step"]``), a list."""
        return list(self._steps)

    @staticmethod
    def _asks_for(name, values):
        return bool(values["amsgrad"])

    @staticmethod
    def _absent_msg(name):
        return "%s must be None: no group of this optimizer uses amsgrad" % name

    def _check_step_count(self, new, t, saved_steps, where):
        """As the base; then each tensor's step count (``t`` for all in a state from before param
        groups), at most ``t``, and a tensor at step 0 has zero moments. Returns the counts."""
        steps = super()._check_step_count(new, t, saved_steps, where)
        if saved_steps is not None:
            n = self._params.n
            if type(saved_steps) not in (list, tuple) or len(saved_steps) != n:
                raise ValueError(where_msg(where, "steps must be a list of %d ints (each tensor's step count), got %s"
                                           % (n, _described(saved_steps))))
            steps = [_step_count(s, where, "steps[%d]" % j, "a tensor's step count", t)
                     for j, s in enumerate(saved_steps)]
        offsets = self._params.offsets
        for j, s in enumerate(steps):
            if s:
                continue
            for name in self._STATE:
                if new[name] is not None and any(new[name].memview()[offsets[j]:offsets[j + 1]]):
                    raise ValueError(where_msg(where, "%s is non-zero for params[%d], whose step count is 0 "
                                               "(steps[%d]); moments exist only after a step: save steps with them"
                                               % (name, j, j)))
        return steps

    def step(self, grads, max_norm=None):
        """One update from ``grads`` (one float32 tensor per parameter, same shapes, in the order
        of ``params``), every group with its own hyper-parameters in one native call.

        With ``max_norm``, the gradients are first clipped in place to total L2 norm
        ``max_norm`` (over every group) and the pre-clip total is returned; otherwise returns
        None. A gradient listed twice (even an empty one: module docstring), or sharing memory
        with a parameter or the state, is refused naming both. A gradient holding NaN or inf is
        refused before anything is written; a parameter holding NaN or inf is not read before the
        update and is stepped as torch steps it (NaN stays NaN: native/contracts/optim.md step 3).
        """
        return self._step(grads, max_norm, self._WHERE + ".step")

    def _step(self, grads, max_norm, where):
        clip, mn = _native_max_norm(max_norm, where)
        self._check_room(where)
        gtable, keep = self._grads(grads, clip == 1, where)
        lr, made = self._native_groups(where)
        p, s, g = self._params, self._stab, self._native
        rc = self._backend.lib.mt_adam_step_groups(p.table, gtable, s["exp_avg"], s["exp_avg_sq"], s["max_exp_avg_sq"],
                                                   self._steps, self._norm_ptr, p.c_offsets, g.table, g.tensor_group,
                                                   clip, mn, len(g.sizes), p.n)
        self._call(rc, made, where)
        _buffer.wrote(p, keep if clip else None)        # torch tensors: bump their version
        return self._finish(clip, lr)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``p * (1 - lr * weight_decay)``), as
    ``torch.optim.AdamW``; ``weight_decay`` defaults to 0.01 as in torch. Arguments, groups,
    switches, state and refusals are :class:`Adam`'s, less ``decoupled_weight_decay`` (torch's
    AdamW does not take it either: its decay is always decoupled)."""

    _WHERE = "AdamW"
    _DECOUPLED = True
    _NOT_TAKEN = {"decoupled_weight_decay": "AdamW's weight decay is always decoupled (torch's AdamW does "
                                            "not take it either); coupled decay is mojo_train.Adam"}

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, *,
                 maximize=False, foreach=None, capturable=False, differentiable=False, fused=None,
                 lr_schedule=None, numeric_mode=None, resident=None, accumulation_steps=1, **kwargs):
        self._refuse_kwargs(kwargs)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad,
                         maximize=maximize, foreach=foreach, capturable=capturable,
                         differentiable=differentiable, fused=fused, lr_schedule=lr_schedule,
                         numeric_mode=numeric_mode, resident=resident, accumulation_steps=accumulation_steps)


class SGD(_Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    ``SGD(params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
    maximize=False, foreach=None, differentiable=False, fused=None, lr_schedule=None,
    numeric_mode=None, resident=None, accumulation_steps=1)``: torch's signature, then ours.
    ``params``: a buffer, a list of them or a list of param groups (module docstring), each
    group taking ``lr``, ``momentum``, ``dampening``, ``weight_decay``, ``nesterov``,
    ``maximize`` and ``lr_schedule``. Weight decay is coupled. The momentum buffer is
    ``exp_avg`` (allocated once a group has momentum > 0, else None); ``buf_initialized`` holds
    one int32 flag per tensor (0 until its buffer is first written, as torch's ``None``).
    ``foreach`` and ``fused`` may be None, False or True and change nothing;
    ``differentiable=True`` is refused by name (module docstring).
    """

    _WHERE = "SGD"
    _HYPER = _groups.SGD_HYPER
    _CTYPE = "mt_sgd_group"
    _STATE = ("exp_avg", "buf_initialized")
    _OPTIONAL = ("exp_avg",)

    momentum = _hyper_property("momentum", "The momentum every group shares.")
    dampening = _hyper_property("dampening", "The dampening every group shares.")
    nesterov = _hyper_property("nesterov", "Whether every group uses Nesterov momentum.")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, lr_schedule=None,
                 numeric_mode=None, resident=None, accumulation_steps=1, **kwargs):
        self._refuse_kwargs(kwargs)
        _switches(self._WHERE, foreach=foreach, differentiable=differentiable, fused=fused)
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay,
                                      nesterov=nesterov, maximize=maximize, lr_schedule=lr_schedule),
                         numeric_mode, resident, accumulation_steps)
        self._init_state()

    @staticmethod
    def _asks_for(name, values):
        return values["momentum"] != 0.0

    @staticmethod
    def _absent_msg(name):
        return ("%s must be None: this optimizer keeps none (an SGD made with momentum=0 has no momentum buffer)"
                % name)

    def _check_step_count(self, new, t, saved_steps, where):
        """A flag is 1 only once a momentum buffer exists: after a step, with momentum."""
        flags = new["buf_initialized"].memview()
        j = next((j for j, f in enumerate(flags) if f), None)
        if j is not None and (t == 0 or new["exp_avg"] is None):
            raise ValueError(where_msg(where, "buf_initialized[%d] is 1, but %s" % (j, (
                "t is 0 and a momentum buffer exists only after a step: save t with it" if t == 0 else
                "this SGD keeps no momentum buffer (it was made with momentum=0)"))))
        return [t] * self._params.n

    def step(self, grads, max_norm=None):
        """One update from ``grads``, every group with its own hyper-parameters in one native
        call; clipping, return value and non-finite values as :meth:`Adam.step`."""
        return self._step(grads, max_norm, self._WHERE + ".step")

    def _step(self, grads, max_norm, where):
        clip, mn = _native_max_norm(max_norm, where)
        self._check_room(where)
        gtable, keep = self._grads(grads, clip == 1, where)
        lr, made = self._native_groups(where)
        p, g = self._params, self._native
        rc = self._backend.lib.mt_sgd_step_groups(p.table, gtable, self._stab["exp_avg"], self._sptr["buf_initialized"],
                                                  self._norm_ptr, p.c_offsets, g.table, g.tensor_group, clip, mn,
                                                  len(g.sizes), p.n)
        self._call(rc, made, where)
        _buffer.wrote(p, keep if clip else None)        # torch tensors: bump their version
        return self._finish(clip, lr)
