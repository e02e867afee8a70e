"""SGD, Adam and AdamW, bit-pinned in the identical numeric mode (``clip_grad_norm_`` lives in
mojo_train.clip and is re-exported here, so ``mojo_train.optim.clip_grad_norm_`` works).

The names and defaults are torch's. There is no autograd here, so ``step`` takes the
gradients: ``opt.step(grads, max_norm=None)`` updates the parameters in place, clipping the
gradients first (in place, as ``clip_grad_norm_`` would) when ``max_norm`` is given, and
returns the pre-clip total norm or None. A refused step changes nothing: not the params,
not the grads, not the moments, not ``t``. The arithmetic is native/contracts/optim.md
and clip.md; tensors are addressed in place through a pointer table, so a list of separate
arrays is neither packed nor copied.

``lr_schedule=`` (``ConstantLR``, ``WarmupLinearLR``, ``WarmupCosineLR`` or any object with a
one-based ``lr_at(t)``): step t's lr is ``lr_schedule.lr_at(t)``, rounded to float32 (our
schedules already are), and ``lr`` is not read while a schedule is set (it is kept for when
``lr_schedule`` is set back to None). ``accumulation_steps=A`` and
``step_accumulated(microbatch_grads, tokens, max_norm=None)``: the A microbatch gradients are
combined by ``accumulate_grads`` (the pairwise tree; an unaligned split is refused when
``tokens`` is given), then one ``step``. ``state_dict`` carries ``lr``, the schedule's
``config()`` and ``accumulation_steps`` beside ``t`` and the moments; ``load_state_dict``
validates every key and value before it changes anything (see its docstring).

Memory: parameters must not share memory with each other, nor gradients with each other, a
parameter or the optimizer's state (a step reads every gradient while it writes the params, the
state and, clipping, the gradients: a shared element would depend on the order of those writes).
Both are refused naming the two positions, e.g. ``grads[0] and grads[3] share memory``.

torch's switches are taken at the values that ask for nothing this library lacks: ``amsgrad``,
``capturable``, ``differentiable`` (and Adam's ``decoupled_weight_decay``) at False;
``foreach`` and ``fused`` at None, False or True. ``foreach=True`` and ``fused=True`` are
execution choices that torch documents as the same update; every step here already is one fused
native pass over all tensors (one pointer table, one launch), so they change nothing, not a bit.
``amsgrad=True``, ``capturable=True`` and ``differentiable=True`` ask for behaviour this library
lacks and are refused by name (NotImplementedError), as is ``fused=True`` with ``foreach=True``
(torch refuses that pair too).
"""
import math
import numbers

from ._errors import refuse_keywords, where_msg
from . import _buffer
from ._array import Array
from ._native import ffi, load, numeric_mode_arg
from ._optim_common import (_Registry, _indexed, _probe_ranges, _real, _refuse_overlap,
                            _single, _switches, _table_ranges)
from .clip import clip_grad_norm_   # noqa: F401  (mojo_train.optim.clip_grad_norm_ keeps working)
from .device import DeviceArray

__all__ = ["SGD", "Adam", "AdamW", "clip_grad_norm_"]

# torch keywords this library does not take, and why; anything else unknown is refused too.
_REFUSED = {
    "param_groups": "one hyper-parameter set per optimizer: two groups would mean two clips, "
                    "and two clips are not one; make one optimizer per group",
    "dtype": "float32 only: other dtypes are refused, never cast",
    "device": "the device follows the loaded vendor (MOJO_TRAIN_VENDOR) and the buffers",
}


def _accumulation_steps(value, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "accumulation_steps must be an int, got %r" % (value,)))
    if not 1 <= int(value) <= 2 ** 31 - 1:
        raise ValueError(where_msg(where, "accumulation_steps must be in [1, 2**31 - 1], got %r" % (value,)))
    return int(value)


def _flag(value, name, where):
    if not isinstance(value, bool):
        raise TypeError(where_msg(where, "%s must be a bool, got %r" % (name, value)))
    return value


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


class _Optimizer:
    """What SGD, Adam and AdamW share: the registry, the state, step bookkeeping."""

    _WHERE = "Optimizer"
    _NOT_TAKEN = {}    # this class's own refused keywords, beside _REFUSED

    def _refuse_kwargs(self, kwargs):
        refuse_keywords(kwargs, self._WHERE, dict(_REFUSED, **self._NOT_TAKEN))

    def __init__(self, params, lr, numeric_mode, lr_schedule, resident, accumulation_steps=1):
        where = self._WHERE
        self.accumulation_steps = _accumulation_steps(accumulation_steps, where)
        if resident not in (None, True, False):
            raise TypeError(where_msg(where, "resident must be None, True or False, got %r" % (resident,)))
        if lr_schedule is not None and not callable(getattr(lr_schedule, "lr_at", None)):
            raise TypeError(where_msg(where, "lr_schedule must have an lr_at(step) method, got %r"
                                             % (lr_schedule,)))
        self._backend = load(numeric_mode_arg(numeric_mode, where))
        self._device_ok = self._backend.has("device_buffers")
        self.numeric_mode = self._backend.numeric_mode
        self._params = _Registry(params, "params", where, inplace=True, backend=self._backend)
        self._param_name = _indexed("params", _single(params))
        self._param_ranges = _probe_ranges(self._params.probes)
        _refuse_overlap([self._param_ranges], self._param_name, where, "pass each parameter once")
        self._grad_nbytes = [pb.nbytes for pb in self._params.probes]
        self.params = [pb.obj for pb in self._params.probes]
        self._shapes = [pb.shape for pb in self._params.probes]
        self._gtable = ffi.new("float *[]", self._params.n)
        self._last_grads = _buffer.LastTable()   # the same gradient list step after step
        self.lr = _real(lr, "lr", where)
        self.lr_schedule = lr_schedule
        self.t = 0
        self.lr_ = None
        self.total_norm_ = None
        self.clip_coef_ = None
        self.packed_ = False   # tensors are addressed in place: nothing is ever packed
        self._norm_out = Array((2,), "float32")
        self._norm_ptr = _ptr(self._norm_out)
        # On a GPU vendor the moments live in device memory between steps unless resident=False.
        self.resident = self._backend.vendor != "cpu" and resident is not False
        self._state, self._sptr = {}, {}

    @property
    def n_total(self):
        """Number of parameter elements over all tensors."""
        return self._params.total

    def _grads(self, grads, inplace, where):
        """(pointer table, handles to keep alive) for a gradient list matching params, in
        memory of its own (``_refuse_shared``). A list of our arrays met again is not
        looked at again: its memory cannot have moved, and new state is a new allocation."""
        if self._last_grads.get(grads) is not None:
            return self._gtable, grads
        self._last_grads.put((), None)      # the table below is about to change
        keep = _buffer.float32_table(grads, self._shapes, self._gtable, inplace=inplace, device_ok=self._device_ok)
        if keep is not None:
            table = self._gtable
        else:
            keep = _Registry(grads, "grads", where, inplace=inplace, backend=self._backend, like=self._params)
            table = keep.table
        self._refuse_shared(_table_ranges(table, self._grad_nbytes), _indexed("grads", _single(grads)), where)
        if table is self._gtable:
            self._last_grads.put(grads, True)
        return table, keep

    def _refuse_shared(self, grad_ranges, grad_name, where):
        """Refuse gradients (``grad_ranges``, named by ``grad_name``) that share memory with
        each other, a parameter or the state (module docstring)."""
        state = [(name, v) for name, v in ((n, self._state.get(n)) for n in self._STATE) if v is not None]
        starts = [_ptr_int(v) for _, v in state]
        state_ranges = starts, [a + v.nbytes for a, (_, v) in zip(starts, state)]

        def name_of(order):
            if order[0] == 0:
                return grad_name(order)
            return self._param_name(order) if order[0] == 1 else "the optimizer's %s" % state[order[1]][0]
        _refuse_overlap([grad_ranges, self._param_ranges, state_ranges], name_of, where,
                        "pass each gradient once, in memory of its own")

    def _lr_for_next_step(self):
        if self.lr_schedule is None:
            lr = self.lr
            if type(lr) is float and 0.0 <= lr < float("inf"):
                return lr
            return _real(lr, "lr", self._WHERE)
        return _real(self.lr_schedule.lr_at(self.t + 1), "lr_schedule.lr_at(%d)" % (self.t + 1), self._WHERE)

    def _finish(self, clip, lr):
        self.t += 1
        self.lr_ = float(ffi.cast("float", lr))
        if clip:
            self.total_norm_, self.clip_coef_ = float(self._norm_out[0]), float(self._norm_out[1])
        else:
            self.total_norm_ = self.clip_coef_ = None
        return self.total_norm_

    def step_accumulated(self, microbatch_grads, tokens, max_norm=None):
        """One step from ``accumulation_steps`` microbatch gradients (each a gradient list
        matching params), in microbatch order: they are combined by ``accumulate_grads``
        (the pairwise tree over microbatches; with ``tokens``, the whole step's token count,
        a split that ``accumulation_is_aligned`` rejects is refused) into new arrays, which
        ``step`` then takes (and clips, with ``max_norm``). The microbatch gradients are
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
            raise ValueError(where_msg(where, "%d microbatch gradients for accumulation_steps=%d; the count is "
                                              "part of the run's arithmetic (make the optimizer with the count you "
                                              "use)" % (len(microbatch_grads), self.accumulation_steps)))
        for i, entry in enumerate(microbatch_grads):      # checked before any work is done
            probes = _buffer.tensor_list(entry, "microbatch_grads[%d]" % i, where, inplace=False)
            self._refuse_shared(_probe_ranges(probes), _indexed("microbatch_grads[%d]" % i, _single(entry)), where)
        combined = accumulate_grads(list(microbatch_grads), tokens, numeric_mode=self.numeric_mode)
        return self.step(combined, max_norm=max_norm)

    def zero_grad(self, grads):
        """Write +0.0 into every gradient tensor (matching params in count and shape)."""
        where = self._WHERE + ".zero_grad"
        table, keep = self._grads(grads, True, where)
        p = self._params
        self._backend.check(self._backend.lib.mt_fill_zero(table, p.c_offsets, p.n), where)
        _buffer.wrote(keep)

    # -- state ---------------------------------------------------------------------------
    _STATE = ()

    def _init_state(self):
        for name in self._STATE:
            dtype, size, absent = self._state_layout(name)
            if absent:
                self._put_state(name, None)
            elif self.resident and name != "buf_initialized":
                self._put_state(name, DeviceArray((size,), dtype, numeric_mode=self.numeric_mode))
            else:
                self._put_state(name, Array((size,), dtype))

    def _put_state(self, name, value):
        """Keep `value` (an Array, a DeviceArray or None) as state `name`; a host Array is
        uploaded into the device copy when the state is resident."""
        if value is not None and self.resident and name != "buf_initialized" and type(value) is Array:
            dev = self._state.get(name)
            if dev is None:
                dev = DeviceArray(value.shape, value.dtype, numeric_mode=self.numeric_mode)
            value = dev.copy_from(value)
        self._state[name] = value
        self._sptr[name] = ffi.NULL if value is None else _ptr(value, "int32_t *" if name == "buf_initialized" else "float *")

    def _get_state(self, name):
        value = self._state.get(name)
        return value.to_host() if type(value) is DeviceArray else value

    def _set_state(self, name, value):
        self._put_state(name, self._state_copy(value, name, self._WHERE + "." + name))

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
        without ``config``), ``accumulation_steps`` and copies of the state arrays: enough to
        resume bit-identically."""
        sched = self.lr_schedule
        cfg = sched.config() if sched is not None and callable(getattr(sched, "config", None)) else None
        state = {"t": self.t, "kind": self._WHERE, "n_total": self.n_total, "lr": self.lr,
                 "lr_schedule": cfg, "accumulation_steps": self.accumulation_steps}
        for name in self._STATE:
            value = self._state.get(name)
            state[name] = None if value is None else (value.to_host() if type(value) is DeviceArray else value.copy())
        return state

    def load_state_dict(self, state):
        """Restore what ``state_dict`` gave, after checking all of it; a refusal changes nothing.

        Every key of the format is required and no other is taken: ``kind`` (this class's
        name), ``n_total`` (this optimizer's), ``t`` (an int >= 0, not a bool), ``lr``,
        ``lr_schedule`` (None, or a schedule config agreeing with this optimizer's schedule),
        ``accumulation_steps`` (this optimizer's) and the state arrays: flat C-contiguous float32
        (``buf_initialized``: int32) buffers of the right length, never cast or reshaped (a list
        of floats is refused), finite, with ``exp_avg_sq >= 0`` and every ``buf_initialized`` flag 0 or 1;
        ``exp_avg`` is None exactly where this optimizer keeps none (SGD with momentum=0).

        The step count agrees with the state: moments exist only after a step, so at ``t == 0``
        Adam's ``exp_avg`` and ``exp_avg_sq`` are all zero and SGD's flags all 0 (moments with
        ``t`` reset to 0 would get step 1's bias corrections, made for moments holding one
        gradient, and the run would not resume); an SGD without a momentum buffer has flags 0.
        ``t >= 1`` with zero moments
        is a run whose gradients were zero, and is taken. With these checks a loaded state
        cannot make the next step write NaN (a negative ``exp_avg_sq`` is a NaN square root,
        a non-finite moment a non-finite parameter); a state that passes resumes bit-identically.
        """
        where = self._WHERE + ".load_state_dict"
        self._check_format(state, where)
        t = _step_count(state["t"], where)
        lr = _real(state["lr"], "lr", where)
        sched = self._schedule_from_state(state["lr_schedule"], where)
        if _accumulation_steps(state["accumulation_steps"], where) != self.accumulation_steps:
            raise ValueError(where_msg(where, "the state was saved with accumulation_steps=%d, this optimizer has %d"
                                       % (state["accumulation_steps"], self.accumulation_steps)))
        new = {name: self._state_copy(state[name], name, where) for name in self._STATE}
        self._check_step_count(new, t, where)
        for name, value in new.items():
            self._put_state(name, value)
        self.t = t
        self.lr = lr
        self.lr_schedule = sched

    def _check_format(self, state, where):
        """The keys of ``state_dict``'s format, all of them and no other; kind and n_total."""
        if not isinstance(state, dict):
            raise TypeError(where_msg(where, "state must be a dict, got %s" % type(state).__name__))
        kind = state.get("kind", self._WHERE)
        if not isinstance(kind, str) or kind != self._WHERE:
            raise ValueError(where_msg(where, "state is from %r (its kind), not %s" % (kind, self._WHERE)))
        keys = _KEYS + self._STATE
        missing = [k for k in keys if k not in state]
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

    def _check_step_count(self, new, t, where):
        """Adam, AdamW: at t == 0 (no step taken) the moments are zero (load_state_dict)."""
        if t == 0:
            for name in self._STATE:
                if any(new[name].memview()):
                    raise ValueError(where_msg(where, "%s is non-zero at t=0, but moments exist only after a step: "
                                               "save t with them (the next step is step t + 1)" % name))

    def _schedule_from_state(self, cfg, where):
        """The schedule to resume with: this optimizer's, which must agree with a saved config;
        or, when it has none, the one the config describes."""
        if cfg is None:
            return self.lr_schedule
        from .schedule import _Schedule
        try:
            saved = _Schedule.from_config(cfg)
        except (TypeError, ValueError) as e:
            raise ValueError(where_msg(where, "lr_schedule in the state is not a schedule config: %s" % (e,)))
        mine = self.lr_schedule
        if mine is None:
            return saved
        if not callable(getattr(mine, "config", None)) or mine.config() != saved.config():
            raise ValueError(where_msg(where, "the state was saved with lr_schedule %r, this optimizer has %r"
                                              % (saved, mine)))
        return mine

    def _state_copy(self, value, name, where):
        """A checked host copy of state ``name`` (load_state_dict's rules for one array), or
        None where this optimizer keeps none."""
        dtype, want, absent = self._state_layout(name)
        if value is None or absent:
            if value is None and absent:
                return None
            raise ValueError(where_msg(where, "%s must be None: this optimizer keeps none (an SGD made with "
                                       "momentum=0 has no momentum buffer)" % name if absent
                                       else "%s must not be None" % name))
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
        """(dtype, element count, kept as None) of a state entry."""
        if name == "buf_initialized":
            return "int32", self._params.n, False
        return "float32", self.n_total, False


_KEYS = ("kind", "t", "n_total", "lr", "lr_schedule", "accumulation_steps")   # + the class's _STATE


def _step_count(value, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "t must be an int (the steps taken), got %r" % (value,)))
    if not 0 <= value < 2 ** 62:
        raise ValueError(where_msg(where, "t must be in [0, 2**62), got %r" % (value,)))
    return int(value)


def _check_state_values(backend, array, name, where):
    """Flags 0 or 1; moments finite, and exp_avg_sq >= 0 (the step takes its square root).
    The moments are scanned natively (mt_find_bad_state: a few ms per 10M values)."""
    view = array.memview()
    if name == "buf_initialized":
        bad = next((j for j, f in enumerate(view) if f not in (0, 1)), None)
        if bad is not None:
            raise ValueError(where_msg(where, "buf_initialized[%d] is %d; each flag is 0 or 1 (1 once the tensor's "
                                       "momentum buffer exists)" % (bad, view[bad])))
        return
    first = ffi.new("int64_t *")
    backend.check(backend.lib.mt_find_bad_state(first, ffi.cast("float *", array.address), array.size,
                                                name == "exp_avg_sq"), where)
    j = first[0]
    if j < 0:
        return
    if not math.isfinite(view[j]):
        raise ValueError(where_msg(where, "%s[%d] is %r; the state must be finite (a non-finite moment makes the "
                                   "next step's parameters non-finite)" % (name, j, view[j])))
    raise ValueError(where_msg(where, "exp_avg_sq[%d] is %r; a second moment is >= 0 (the step takes its "
                               "square root)" % (j, view[j])))


class Adam(_Optimizer):
    """Adam with coupled weight decay (``g + weight_decay * p``), as ``torch.optim.Adam``.

    ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
    foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
    decoupled_weight_decay=False, lr_schedule=None, numeric_mode=None, resident=None,
    accumulation_steps=1)``: torch's signature, then ours. ``params`` is a float32 buffer or a
    list of them (updated in place). State: ``exp_avg``, ``exp_avg_sq`` (flat float32 Arrays
    over all parameters, in registry order), ``t`` (steps taken). Bias corrections are
    computed in float32 by the contract's pinned routine, not in float64 as torch does.

    torch's switches (module docstring): ``foreach`` and ``fused`` may be None, False or True
    and change nothing (every step is one fused native pass); ``amsgrad``, ``capturable``,
    ``differentiable`` and ``decoupled_weight_decay`` are taken at False, and True is refused
    by name (decoupled decay is :class:`AdamW`).
    """

    _WHERE = "Adam"
    _DECOUPLED = False
    _STATE = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, *,
                 foreach=None, maximize=False, capturable=False, differentiable=False, fused=None,
                 decoupled_weight_decay=False, lr_schedule=None, numeric_mode=None, resident=None,
                 accumulation_steps=1, **kwargs):
        self._refuse_kwargs(kwargs)
        _switches(self._WHERE, amsgrad=amsgrad, foreach=foreach, capturable=capturable,
                  differentiable=differentiable, fused=fused, decoupled_weight_decay=decoupled_weight_decay)
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise ValueError(where_msg(self._WHERE, "betas must be a pair (beta1, beta2), got %r" % (betas,)))
        self.betas = (_real(b1, "betas[0]", self._WHERE, 0.0, 1.0, True),
                      _real(b2, "betas[1]", self._WHERE, 0.0, 1.0, True))
        self.eps = _real(eps, "eps", self._WHERE)
        self.weight_decay = _real(weight_decay, "weight_decay", self._WHERE)
        self.maximize = _flag(maximize, "maximize", self._WHERE)
        super().__init__(params, lr, numeric_mode, lr_schedule, resident, accumulation_steps)
        self._init_state()

    def step(self, grads, max_norm=None):
        """One update from ``grads`` (one float32 tensor per parameter, same shapes).

        With ``max_norm``, the gradients are first clipped in place to total L2 norm
        ``max_norm`` and the pre-clip total is returned; otherwise returns None. A gradient
        listed twice, or sharing memory with a parameter or the state, is refused naming both.
        """
        where = self._WHERE + ".step"
        clip, mn = _native_max_norm(max_norm, where)
        gtable, keep = self._grads(grads, clip == 1, where)
        lr = self._lr_for_next_step()
        fn = self._backend.lib.mt_adamw_step if self._DECOUPLED else self._backend.lib.mt_adam_step
        p = self._params
        rc = fn(p.table, gtable, self._sptr["exp_avg"], self._sptr["exp_avg_sq"], self._norm_ptr,
                p.c_offsets, lr, self.betas[0], self.betas[1], self.eps, self.weight_decay,
                int(self.maximize), clip, mn, self.t + 1, p.n)
        self._backend.check(rc, where)
        _buffer.wrote(p, keep if clip else None)        # torch tensors: bump their version
        return self._finish(clip, lr)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``p * (1 - lr * weight_decay)``), as
    ``torch.optim.AdamW``; ``weight_decay`` defaults to 0.01 as in torch. Arguments, switches,
    state and refusals are :class:`Adam`'s, less ``decoupled_weight_decay`` (torch's AdamW
    does not take it either: its decay is always decoupled)."""

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
    Weight decay is coupled. The momentum buffer is ``exp_avg`` (allocated when momentum > 0,
    else None); ``buf_initialized`` holds one int32 flag per tensor (0 until its buffer is first
    written, as torch's ``None``). ``foreach`` and ``fused`` may be None, False or True and
    change nothing; ``differentiable=True`` is refused by name (module docstring).
    """

    _WHERE = "SGD"
    _STATE = ("exp_avg", "buf_initialized")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 maximize=False, foreach=None, differentiable=False, fused=None, lr_schedule=None,
                 numeric_mode=None, resident=None, accumulation_steps=1, **kwargs):
        self._refuse_kwargs(kwargs)
        _switches(self._WHERE, foreach=foreach, differentiable=differentiable, fused=fused)
        self.momentum = _real(momentum, "momentum", self._WHERE)
        self.dampening = _real(dampening, "dampening", self._WHERE, low=None)
        self.weight_decay = _real(weight_decay, "weight_decay", self._WHERE)
        self.nesterov = _flag(nesterov, "nesterov", self._WHERE)
        self.maximize = _flag(maximize, "maximize", self._WHERE)
        if self.nesterov and (self.momentum == 0.0 or self.dampening != 0.0):
            raise ValueError(where_msg("SGD", "nesterov=True needs momentum > 0 and dampening == 0, "
                                              "got momentum=%r, dampening=%r" % (momentum, dampening)))
        super().__init__(params, lr, numeric_mode, lr_schedule, resident, accumulation_steps)
        self._init_state()

    def _state_layout(self, name):
        dtype, size, _ = super()._state_layout(name)
        if name != "exp_avg":
            return dtype, size, False
        # kept as None since construction with momentum=0 (asked before the state exists)
        return dtype, size, self._state["exp_avg"] is None if "exp_avg" in self._state else self.momentum == 0.0

    def _check_step_count(self, new, t, where):
        """A flag is 1 only once a momentum buffer exists: after a step, with momentum."""
        flags = new["buf_initialized"].memview()
        j = next((j for j, f in enumerate(flags) if f), None)
        if j is not None and (t == 0 or new["exp_avg"] is None):
            raise ValueError(where_msg(where, "buf_initialized[%d] is 1, but %s" % (j, (
                "t is 0 and a momentum buffer exists only after a step: save t with it" if t == 0 else
                "this SGD keeps no momentum buffer (it was made with momentum=0)"))))

    def step(self, grads, max_norm=None):
        """One update from ``grads``; clipping and return value as :meth:`Adam.step`."""
        where = "SGD.step"
        clip, mn = _native_max_norm(max_norm, where)
        gtable, keep = self._grads(grads, clip == 1, where)
        lr = self._lr_for_next_step()
        p = self._params
        rc = self._backend.lib.mt_sgd_step(
            p.table, gtable, self._sptr["exp_avg"], self._sptr["buf_initialized"],
            self._norm_ptr, p.c_offsets, lr, self.momentum,
            self.dampening, self.weight_decay, int(self.nesterov), int(self.maximize), clip, mn, p.n)
        self._backend.check(rc, where)
        _buffer.wrote(p, keep if clip else None)        # torch tensors: bump their version
        return self._finish(clip, lr)
