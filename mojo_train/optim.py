"""SGD, Adam, AdamW and clip_grad_norm_, bit-pinned in the identical tier.

The names and defaults are torch's. There is no autograd here, so ``step`` takes the
gradients: ``opt.step(grads, max_norm=None)`` updates the parameters in place, clipping the
gradients first (in place, as ``clip_grad_norm_`` would) when ``max_norm`` is given, and
returns the pre-clip total norm or None. A refused step changes nothing: not the params,
not the grads, not the moments, not ``t``. The arithmetic is native/contracts/optimizer.md
and clip.md; tensors are addressed in place through a pointer table, so a list of separate
arrays is neither packed nor copied.

``lr_schedule=`` (``ConstantLR``, ``WarmupLinearLR``, ``WarmupCosineLR`` or any object with a
one-based ``lr_at(t)``): step t's lr is ``lr_schedule.lr_at(t)``, rounded to float32 (our
schedules already are), and ``lr`` is not read while a schedule is set (it is kept for when
``lr_schedule`` is set back to None). ``accumulation_steps=A`` and
``step_accumulated(microbatch_grads, tokens, max_norm=None)``: the A microbatch gradients are
combined by ``accumulate_grads`` (the pairwise tree; an unaligned split is refused when
``tokens`` is given), then one ``step``. ``state_dict`` carries ``lr``, the schedule's
``config()`` and ``accumulation_steps`` beside ``t`` and the moments.
"""
import numbers
import threading

from ._errors import refuse_keywords
from . import _buffer
from ._array import Array
from ._native import ffi, load
from .device import DeviceArray

__all__ = ["SGD", "Adam", "AdamW", "clip_grad_norm_"]

_DEVICE_BUFFERS = 1 << 9   # mt_features(): the vendor takes device pointers
_CLIP_TABLES = threading.local()   # per thread and library: clip_grad_norm_'s last gradient list

# torch keywords this library does not take, and why; anything else unknown is refused too.
_REFUSED = {
    "amsgrad": "amsgrad is not implemented: its max(v_max, v) is outside the pinned contract",
    "foreach": "an execution knob: every step here is one fused native pass",
    "fused": "an execution knob: every step here is one fused native pass",
    "capturable": "no CUDA-graph capture here; every step synchronizes before it returns",
    "differentiable": "there is no autograd in mojo_train (step takes the gradients)",
    "param_groups": "one hyper-parameter set per optimizer: two groups would mean two clips, "
                    "and two clips are not one; make one optimizer per group",
    "dtype": "float32 only: other dtypes are refused, never cast",
    "device": "the device follows the loaded vendor (MOJO_TRAIN_VENDOR) and the buffers",
}


def _refuse_kwargs(kwargs, where):
    refuse_keywords(kwargs, where, _REFUSED)


def _real(value, name, where, low=0.0, high=None, high_open=False):
    """A finite real in [low, high] (or [low, high)); bools are refused."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError("mojo_train.%s: %s must be a real number, got %r" % (where, name, value))
    v = float(value)
    v32 = float(ffi.cast("float", v))           # the value the native call will see
    bad = not (v32 == v32) or v32 in (float("inf"), float("-inf")) or (low is not None and v < low)
    if high is not None:
        bad = bad or (v32 >= high if high_open else v32 > high)
    if bad:
        rng = "[%s, %s%s" % (low, high, ")" if high_open else "]") if high is not None else ">= %s" % low
        raise ValueError("mojo_train.%s: %s must be finite and in %s, got %r" % (where, name, rng, value))
    return v


def _accumulation_steps(value, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError("mojo_train.%s: accumulation_steps must be an int, got %r" % (where, value))
    if not 1 <= int(value) <= 2 ** 31 - 1:
        raise ValueError("mojo_train.%s: accumulation_steps must be in [1, 2**31 - 1], got %r" % (where, value))
    return int(value)


def _flag(value, name, where):
    if not isinstance(value, bool):
        raise TypeError("mojo_train.%s: %s must be a bool, got %r" % (where, name, value))
    return value


class _Registry:
    """A list of float32 tensors as the native layer sees it: a pointer table and offsets."""

    def __init__(self, tensors, name, where, inplace, backend, like=None):
        self.probes = _buffer.tensor_list(tensors, name, where, inplace=inplace)
        for j, pb in enumerate(self.probes):
            if pb.device and not backend.has(_DEVICE_BUFFERS):
                raise TypeError("mojo_train.%s: %s[%d] is device memory, but the loaded vendor (%s) takes "
                                "host buffers only; set MOJO_TRAIN_VENDOR to the device's vendor"
                                % (where, name, j, backend.vendor))
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
            raise ValueError("mojo_train.%s: %s has %d tensors, params has %d"
                             % (where, name, len(self.probes), len(like.probes)))
        for j, (a, b) in enumerate(zip(self.probes, like.probes)):
            if a.shape != b.shape:
                raise ValueError("mojo_train.%s: %s[%d] has shape %s, params[%d] has %s"
                                 % (where, name, j, a.shape, j, b.shape))


def _refuse_overlap(probes, name, where):
    """Parameters must not share memory (torch refuses duplicates too): an element updated
    twice in one step would depend on the order of the updates."""
    spans = sorted((pb.address, pb.address + pb.nbytes, j) for j, pb in enumerate(probes))
    for (a0, a1, i), (b0, b1, j) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError("mojo_train.%s: %s[%d] and %s[%d] share memory; pass each parameter once"
                             % (where, name, min(i, j), name, max(i, j)))


def _ptr(array, ctype="float *"):
    """A cffi pointer to the data of a mojo_train.Array or DeviceArray."""
    return ffi.cast(ctype, array.ptr if type(array) is DeviceArray else array.address)


def _native_max_norm(max_norm, where):
    if max_norm is None:
        return 0, 0.0
    return 1, _real(max_norm, "max_norm", where)


class _Optimizer:
    """What SGD, Adam and AdamW share: the registry, the state, step bookkeeping."""

    _WHERE = "Optimizer"

    def __init__(self, params, lr, numeric_mode, lr_schedule, resident, accumulation_steps=1):
        where = self._WHERE
        self.accumulation_steps = _accumulation_steps(accumulation_steps, where)
        if resident not in (None, True, False):
            raise TypeError("mojo_train.%s: resident must be None, True or False, got %r" % (where, resident))
        if lr_schedule is not None and not callable(getattr(lr_schedule, "lr_at", None)):
            raise TypeError("mojo_train.%s: lr_schedule must have an lr_at(step) method, got %r"
                            % (where, lr_schedule))
        self._backend = load(numeric_mode)
        self._device_ok = self._backend.has(_DEVICE_BUFFERS)
        self.numeric_mode = self._backend.tier
        self._params = _Registry(params, "params", where, inplace=True, backend=self._backend)
        _refuse_overlap(self._params.probes, "params", where)
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
        """(pointer table, handles to keep alive) for a gradient list matching params."""
        if self._last_grads.get(grads) is not None:
            return self._gtable, grads
        keep = _buffer.float32_table(grads, self._shapes, self._gtable, inplace=inplace, device_ok=self._device_ok)
        if keep is not None:
            self._last_grads.put(grads, True)
            return self._gtable, keep
        reg = _Registry(grads, "grads", where, inplace=inplace, backend=self._backend, like=self._params)
        return reg.table, reg

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
        never written. Returns what ``step`` returns; a refusal changes nothing."""
        from .schedule import accumulate_grads
        where = self._WHERE + ".step_accumulated"
        if _buffer._is_buffer(microbatch_grads) or not isinstance(microbatch_grads, (list, tuple)):
            raise TypeError("mojo_train.%s: microbatch_grads must be a list of %d gradient lists, got %s"
                            % (where, self.accumulation_steps, type(microbatch_grads).__name__))
        if len(microbatch_grads) != self.accumulation_steps:
            raise ValueError("mojo_train.%s: %d microbatch gradients for accumulation_steps=%d; the count "
                             "is part of the run's arithmetic (make the optimizer with the count you use)"
                             % (where, len(microbatch_grads), self.accumulation_steps))
        combined = accumulate_grads(list(microbatch_grads), tokens, numeric_mode=self.numeric_mode)
        return self.step(combined, max_norm=max_norm)

    def zero_grad(self, grads):
        """Write +0.0 into every gradient tensor (matching params in count and shape)."""
        where = self._WHERE + ".zero_grad"
        table, keep = self._grads(grads, True, where)
        p = self._params
        self._backend.check(self._backend.lib.mt_fill_zero(table, p.c_offsets, p.n), where)

    # -- state ---------------------------------------------------------------------------
    _STATE = ()

    def _init_state(self):
        for name in self._STATE:
            dtype, size, nullable = self._state_layout(name)
            if nullable:
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
        """Restore what ``state_dict`` gave. Arrays must be float32/int32 buffers of the right
        size (never cast: a list of Python floats is refused). Nothing changes on refusal."""
        where = self._WHERE + ".load_state_dict"
        if not isinstance(state, dict):
            raise TypeError("mojo_train.%s: state must be a dict, got %s" % (where, type(state).__name__))
        missing = [k for k in ("t",) + self._STATE if k not in state]
        if missing:
            raise ValueError("mojo_train.%s: state lacks %s" % (where, ", ".join(missing)))
        if state.get("kind", self._WHERE) != self._WHERE:
            raise ValueError("mojo_train.%s: state is from %s, not %s" % (where, state["kind"], self._WHERE))
        t = state["t"]
        if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < 2 ** 62:
            raise ValueError("mojo_train.%s: t must be an int in [0, 2**62), got %r" % (where, t))
        lr = _real(state["lr"], "lr", where) if "lr" in state else self.lr
        sched = self._schedule_from_state(state.get("lr_schedule"), where)
        if "accumulation_steps" in state:
            a = _accumulation_steps(state["accumulation_steps"], where)
            if a != self.accumulation_steps:
                raise ValueError("mojo_train.%s: the state was saved with accumulation_steps=%d, this optimizer "
                                 "has %d" % (where, a, self.accumulation_steps))
        new = {name: self._state_copy(state[name], name, where) for name in self._STATE}
        for name, value in new.items():
            self._put_state(name, value)
        self.t = int(t)
        self.lr = lr
        self.lr_schedule = sched

    def _schedule_from_state(self, cfg, where):
        """The schedule to resume with: this optimizer's, which must agree with a saved config;
        or, when it has none, the one the config describes."""
        if cfg is None:
            return self.lr_schedule
        from .schedule import _Schedule
        try:
            saved = _Schedule.from_config(cfg)
        except (TypeError, ValueError) as e:
            raise ValueError("mojo_train.%s: lr_schedule in the state is not a schedule config: %s" % (where, e))
        mine = self.lr_schedule
        if mine is None:
            return saved
        if not callable(getattr(mine, "config", None)) or mine.config() != saved.config():
            raise ValueError("mojo_train.%s: the state was saved with lr_schedule %r, this optimizer has %r"
                             % (where, saved, mine))
        return mine

    def _state_copy(self, value, name, where):
        dtype, want, nullable = self._state_layout(name)
        if value is None:
            if nullable:
                return None
            raise ValueError("mojo_train.%s: %s must not be None" % (where, name))
        if isinstance(value, (list, tuple)):
            raise TypeError("mojo_train.%s: %s is a %s; pass a %s buffer (state is never cast)"
                            % (where, name, type(value).__name__, dtype))
        pb = _buffer.probe(value, name, where)
        if pb.dtype != dtype or not pb.c_contiguous:
            raise TypeError("mojo_train.%s: %s must be a C-contiguous %s buffer, got %s"
                            % (where, name, dtype, pb.dtype))
        if pb.nelems != want:
            raise ValueError("mojo_train.%s: %s has %d elements, expected %d" % (where, name, pb.nelems, want))
        if pb.view is None or not isinstance(pb.view, memoryview):   # device or DLPack memory
            out = Array((want,), dtype)
            self._backend.check(self._backend.lib.mt_memcpy(ffi.cast("void *", out.address),
                                                            ffi.cast("void *", pb.address), pb.nbytes), where)
            return out
        return Array.from_buffer(value).reshape(want)

    def _state_layout(self, name):
        """(dtype, element count, may be None) of a state entry."""
        if name == "buf_initialized":
            return "int32", self._params.n, False
        return "float32", self.n_total, False


class Adam(_Optimizer):
    """Adam with coupled weight decay (``g + weight_decay * p``), as ``torch.optim.Adam``.

    ``Adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False,
    lr_schedule=None, numeric_mode=None, accumulation_steps=1)``. ``params`` is a float32 buffer or a list of them
    (updated in place). State: ``exp_avg``, ``exp_avg_sq`` (flat float32 Arrays over all
    parameters, in registry order), ``t`` (steps taken). Bias corrections are computed in
    float32 by the contract's pinned routine, not in float64 as torch does.
    """

    _WHERE = "Adam"
    _DECOUPLED = False
    _STATE = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                 maximize=False, lr_schedule=None, numeric_mode=None, resident=None, accumulation_steps=1,
                 **kwargs):
        _refuse_kwargs(kwargs, self._WHERE)
        try:
            b1, b2 = betas
        except (TypeError, ValueError):
            raise ValueError("mojo_train.%s: betas must be a pair (beta1, beta2), got %r" % (self._WHERE, betas))
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
        ``max_norm`` and the pre-clip total is returned; otherwise returns None.
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
        return self._finish(clip, lr)


class AdamW(Adam):
    """AdamW: Adam with decoupled weight decay (``p * (1 - lr * weight_decay)``), as
    ``torch.optim.AdamW``; ``weight_decay`` defaults to 0.01 as in torch. Arguments, state
    and refusals are :class:`Adam`'s."""

    _WHERE = "AdamW"
    _DECOUPLED = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 maximize=False, lr_schedule=None, numeric_mode=None, resident=None, accumulation_steps=1,
                 **kwargs):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         maximize=maximize, lr_schedule=lr_schedule, numeric_mode=numeric_mode,
                         resident=resident, accumulation_steps=accumulation_steps, **kwargs)


class SGD(_Optimizer):
    """Stochastic gradient descent, as ``torch.optim.SGD``.

    ``SGD(params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
    maximize=False, lr_schedule=None, numeric_mode=None, accumulation_steps=1)``. Weight decay is coupled. The
    momentum buffer is ``exp_avg`` (allocated when momentum > 0); ``buf_initialized`` holds
    one int32 flag per tensor (0 until its buffer is first written, as torch's ``None``).
    """

    _WHERE = "SGD"
    _STATE = ("exp_avg", "buf_initialized")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, maximize=False, lr_schedule=None, numeric_mode=None, resident=None,
                 accumulation_steps=1, **kwargs):
        _refuse_kwargs(kwargs, self._WHERE)
        self.momentum = _real(momentum, "momentum", self._WHERE)
        self.dampening = _real(dampening, "dampening", self._WHERE, low=None)
        self.weight_decay = _real(weight_decay, "weight_decay", self._WHERE)
        self.nesterov = _flag(nesterov, "nesterov", self._WHERE)
        self.maximize = _flag(maximize, "maximize", self._WHERE)
        if self.nesterov and (self.momentum == 0.0 or self.dampening != 0.0):
            raise ValueError("mojo_train.SGD: nesterov=True needs momentum > 0 and dampening == 0, "
                             "got momentum=%r, dampening=%r" % (momentum, dampening))
        super().__init__(params, lr, numeric_mode, lr_schedule, resident, accumulation_steps)
        self._init_state()

    def _state_layout(self, name):
        dtype, size, _ = super()._state_layout(name)
        return dtype, size, name == "exp_avg" and self.momentum == 0.0

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
        return self._finish(clip, lr)


def clip_grad_norm_(grads, max_norm, norm_type=2.0, error_if_nonfinite=True, foreach=None,
                    numeric_mode=None):
    """Scale ``grads`` in place so their total L2 norm is at most ``max_norm``; return the
    pre-clip total norm (a float).

    The norm is two-level, as torch's: each tensor's L2 norm by the pinned tree, then the L2
    norm of those norms in tensor order (the order is part of the answer). The coefficient is
    ``max_norm / (total + 1e-6)`` clamped to 1. Only ``norm_type=2`` and
    ``error_if_nonfinite=True`` are implemented: a NaN/inf total is refused, nothing written.
    """
    where = "clip_grad_norm_"
    if isinstance(norm_type, bool) or not isinstance(norm_type, numbers.Real) or float(norm_type) != 2.0:
        raise NotImplementedError("mojo_train.%s: norm_type=%r is not implemented; only the L2 norm "
                                  "(norm_type=2.0) is pinned" % (where, norm_type))
    if error_if_nonfinite is not True:
        raise NotImplementedError("mojo_train.%s: error_if_nonfinite=%r is not implemented: a "
                                  "non-finite norm is always refused before anything is written"
                                  % (where, error_if_nonfinite))
    if foreach is not None:
        raise TypeError("mojo_train.%s: foreach= is not supported: %s" % (where, _REFUSED["foreach"]))
    mn = _real(max_norm, "max_norm", where)
    backend = load(numeric_mode)
    last = _CLIP_TABLES.__dict__.setdefault(backend.path, _buffer.LastTable())
    hit = last.get(grads)
    if hit is not None:
        table, offsets, n = hit
    else:
        n = len(grads) if type(grads) in (list, tuple) else 0
        table, offsets = ffi.new("float *[]", max(n, 1)), ffi.new("int32_t[]", n + 1)
        keep = _buffer.float32_table(grads, None, table, inplace=True, offsets=offsets,
                                     device_ok=backend.has(_DEVICE_BUFFERS))
        if keep is None:
            keep = _Registry(grads, "grads", where, inplace=True, backend=backend)
            table, offsets, n = keep.table, keep.c_offsets, keep.n
        else:
            last.put(grads, (table, offsets, n))
    out = ffi.new("float[2]")
    backend.check(backend.lib.mt_clip_grad_norm(table, out, offsets, mn, n), where)
    return float(out[0])
