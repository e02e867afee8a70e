"""Exact learning-rate schedules (contract: native/contracts/schedule.md).

``ConstantLR``, ``WarmupLinearLR`` and ``WarmupCosineLR`` share names with torch's schedulers
but are not schedulers: each is a pure function ``lr_at(t)`` of the ONE-BASED step ``t``,
passed to an optimizer as ``lr_schedule=``; nothing is stepped and no optimizer is wrapped.
``lr_at(t)`` is the float32 nearest the exact real value of the schedule for the arguments
read as exact binary64 numbers (ties to even), decided with proven error bounds, so every
machine gives the same bits. Values come from the native library (``mt_lr_values``, host code
in every vendor's library) a block of 1024 steps at a time and are cached.

Gradient accumulation lives in mojo_train/accumulate.py; ``accumulate_grads``,
``accumulation_is_aligned`` and ``TOKEN_LEAF`` are re-exported here, where they used to live.

Every schedule takes ``numeric_mode=`` (keyword only; None: the environment's): the library that
computes its values. The values are the same in every numeric mode: identical_ftz exempts the
schedules from its flush (native/contracts/ftz.md, "Exempt"), so a value below FLT_MIN is kept,
and an optimizer's step reads it flushed. It is not part of ``config()``.
"""
import array
import numbers
import struct
import sys

from . import _ops
from ._errors import refuse_keywords, where_msg
from . import _native
from ._native import ffi, load
from .accumulate import TOKEN_LEAF, accumulate_grads, accumulation_is_aligned  # noqa: F401 (old home)

__all__ = ["ConstantLR", "WarmupLinearLR", "WarmupCosineLR", "accumulate_grads",
           "accumulation_is_aligned", "TOKEN_LEAF"]

_MAX_STEPS = 2 ** 53              # warmup_steps and total_steps
_MAX_T = 2 ** 62                  # the largest step lr_at answers
_FLT_MAX = float.fromhex("0x1.fffffep+127")
_BLOCK = 1024                     # steps per native call of lr_at's cache

_KIND_CODES = _native.SCHEDULES      # mojo_train.h enum mt_schedule_kind

# torch scheduler arguments, and what to pass here instead
_TORCH_ARGS = {
    "optimizer": "pass the schedule to the optimizer as lr_schedule= instead",
    "last_epoch": "a schedule here has no state: lr_at(t) takes the step; resume through the "
                  "optimizer's state_dict, which carries t",
    "verbose": "nothing is printed",
    "T_max": "pass total_steps= (the one-based step at which the decay reaches min_lr)",
    "eta_min": "pass min_lr=",
    "factor": "ConstantLR here is peak_lr after an optional linear warmup; there is no factor",
    "total_iters": "pass warmup_steps= (ConstantLR) or total_steps= (the decays)",
    "start_factor": "the warmup here always rises linearly from peak_lr / warmup_steps at step 1",
    "end_factor": "the decays here end at min_lr=",
    "T_mult": "restarts are not implemented",
    "step_size": "step decay is not implemented",
    "gamma": "exponential and step decay are not implemented",
    "milestones": "multi-step decay is not implemented",
    "lr_lambda": "write an object with an lr_at(t) method and pass it as lr_schedule=",
}


def _refuse_torch(kwargs, where):
    refuse_keywords(kwargs, where, _TORCH_ARGS,
                    "%%s= is an argument of torch's schedulers; this %s is a step -> lr function passed "
                    "as lr_schedule=, not a scheduler: %%s" % where)


def _real_arg(value, name, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        if hasattr(value, "step") and hasattr(value, "params"):
            raise TypeError(where_msg(where, "the first argument is peak_lr (a number), got an optimizer "
                                      "(%s): this %s is not torch's scheduler but a step -> lr function; "
                                      "pass it to the optimizer as lr_schedule=" % (type(value).__name__, where)))
        raise TypeError(where_msg(where, "%s must be a real number, got %r" % (name, value)))
    try:
        v = float(value)
    except OverflowError:                       # an int beyond a double: not finite
        v = float("inf")
    if not (v == v) or v in (float("inf"), float("-inf")):
        raise ValueError(where_msg(where, "%s must be finite, got %r" % (name, value)))
    return v


class _Schedule:
    """What the three schedules share: validation, the native call and its block cache."""

    kind = None

    def _setup(self, peak_lr, warmup_steps, total_steps, min_lr, numeric_mode=None):
        where = type(self).__name__
        self.peak_lr = _real_arg(peak_lr, "peak_lr", where)
        if not 0.0 <= self.peak_lr <= _FLT_MAX:
            raise ValueError(where_msg(where, "peak_lr must be >= 0 and at most the largest float32 "
                                       "(%r), got %r" % (_FLT_MAX, peak_lr)))
        self.min_lr = _real_arg(min_lr, "min_lr", where)
        if not 0.0 <= self.min_lr <= self.peak_lr:
            raise ValueError(where_msg(where, "min_lr must be in [0, peak_lr] = [0, %r], got %r"
                                       % (self.peak_lr, min_lr)))
        self.warmup_steps = _ops.int_arg(warmup_steps, "warmup_steps", where, 0, _MAX_STEPS)
        if total_steps is None:
            self.total_steps = None
        else:
            self.total_steps = _ops.int_arg(total_steps, "total_steps", where, 0, _MAX_STEPS)
            if self.total_steps <= self.warmup_steps:
                raise ValueError(where_msg(where, "total_steps must be > warmup_steps (the decay needs at "
                                           "least one step), got total_steps=%d, warmup_steps=%d"
                                           % (self.total_steps, self.warmup_steps)))
        self.numeric_mode = _native.numeric_mode_arg(numeric_mode, where)
        self._backend = load(self.numeric_mode)
        self._code = _KIND_CODES[self.kind]
        self._tail = self.warmup_steps + 1 if self.total_steps is None else self.total_steps
        self._tail_value = self._native(self._tail, 1)[0]
        self._cache = (-1, None)

    def _native(self, first, n):
        """lr_at(first) .. lr_at(first + n - 1) as a list of floats."""
        out = ffi.new("float[]", max(n, 1))
        rc = self._backend.lib.mt_lr_values(out, self._code, self.peak_lr, self.min_lr, self.warmup_steps,
                                            self.total_steps or 0, first, n)
        self._backend.check(rc, type(self).__name__)
        return ffi.unpack(out, n)

    def lr_at(self, t):
        """The float32 learning rate of the ONE-BASED step ``t`` (lr_at(1) is the first step's),
        as a Python float."""
        if type(t) is int and 0 < t <= _MAX_T:
            if t >= self._tail:
                return self._tail_value
            b = (t - 1) >> 10
            index, block = self._cache          # one tuple: threads never see a mixed pair
            if b != index:
                first = (b << 10) + 1
                block = self._native(first, min(_BLOCK, self._tail - first))
                self._cache = (b, block)
            return block[(t - 1) & (_BLOCK - 1)]
        return self.lr_at(_ops.int_arg(t, "t", type(self).__name__ + ".lr_at", 1, _MAX_T))

    def lr_values(self, n):
        """``array('f')`` of lr_at(1) .. lr_at(n)."""
        where = type(self).__name__ + ".lr_values"
        n = _ops.int_arg(n, "n", where, 0, _MAX_T)
        try:
            if 4 * n > sys.maxsize:
                raise MemoryError
            out = array.array("f", bytes(4 * n))
        except MemoryError:
            raise MemoryError(where_msg(where, "n=%d values need %d bytes, more than this machine can hold; take "
                                        "lr_at(t) for the steps you need" % (n, 4 * n))) from None
        if n:
            rc = self._backend.lib.mt_lr_values(ffi.from_buffer("float[]", out), self._code, self.peak_lr,
                                                self.min_lr, self.warmup_steps, self.total_steps or 0, 1, n)
            self._backend.check(rc, type(self).__name__ + ".lr_values")
        return out

    def bits_at(self, t):
        """lr_at(t)'s float32 bit pattern, as an int."""
        return struct.unpack("<I", struct.pack("<f", self.lr_at(t)))[0]

    def config(self):
        """The arguments as a plain dict; ``from_config`` turns it back into the schedule."""
        return {"kind": self.kind, "peak_lr": self.peak_lr, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "min_lr": self.min_lr}

    @classmethod
    def from_config(cls, cfg):
        """The schedule a ``config()`` dict describes (on a concrete class, its kind must match)."""
        where = cls.__name__ + ".from_config"
        if not isinstance(cfg, dict):
            raise TypeError(where_msg(where, "cfg must be a dict from config(), got %s" % type(cfg).__name__))
        classes = {c.kind: c for c in (ConstantLR, WarmupLinearLR, WarmupCosineLR)}
        kind = cfg.get("kind")
        if kind not in classes:
            raise ValueError(where_msg(where, "cfg['kind'] must be one of %s, got %r" % (sorted(classes), kind)))
        target = classes[kind]
        if cls is not _Schedule and cls is not target:
            raise ValueError(where_msg(where, "cfg describes a %s, not a %s" % (target.__name__, cls.__name__)))
        unknown = sorted(set(cfg) - {"kind", "peak_lr", "warmup_steps", "total_steps", "min_lr"})
        if unknown:
            raise ValueError(where_msg(where, "cfg has unknown keys %s" % unknown))
        args = {k: v for k, v in cfg.items() if k != "kind"}
        if target is ConstantLR:
            if args.pop("total_steps", None) is not None or args.pop("min_lr", 0.0) != 0.0:
                raise ValueError(where_msg(where, "a constant schedule has no total_steps or min_lr"))
        return target(**args)

    def __repr__(self):
        cfg = self.config()
        keys = ("peak_lr", "warmup_steps") + (() if self.kind == "constant" else ("total_steps", "min_lr"))
        return "%s(%s)" % (type(self).__name__, ", ".join("%s=%r" % (k, cfg[k]) for k in keys))

    def __eq__(self, other):
        return type(other) is type(self) and other.config() == self.config()

    def __reduce__(self):              # pickles as its config (the native handle is not data)
        return (_from_config, (self.config(),))

    def __hash__(self):
        return hash((type(self).__name__,) + tuple(sorted(self.config().items(), key=lambda kv: kv[0])))


class ConstantLR(_Schedule):
    """``peak_lr`` at every step, after an optional linear warmup.

    Not torch's ``ConstantLR`` (a scheduler wrapping an optimizer): this is a step -> lr
    function passed as ``SGD(..., lr_schedule=ConstantLR(...))``; torch's arguments
    (an optimizer, ``factor``, ``total_iters``, ``last_epoch``, ...) are refused by name.

    ``ConstantLR(peak_lr, warmup_steps=0)``. ``lr_at(t)`` (t one-based) is the float32 nearest
    ``peak_lr * t / warmup_steps`` for ``t <= warmup_steps`` and ``peak_lr`` after. There is no
    decay, so ``total_steps`` and ``min_lr`` are refused rather than ignored. ``peak_lr`` is
    finite, >= 0 and at most the largest float32; ``0 <= warmup_steps <= 2**53``.
    """

    kind = "constant"

    def __init__(self, peak_lr, warmup_steps=0, *, numeric_mode=None, **kwargs):
        for name in ("total_steps", "min_lr"):
            if name in kwargs:
                raise TypeError(where_msg("ConstantLR", "%s= is not taken: a constant schedule has no decay "
                                          "(use WarmupLinearLR or WarmupCosineLR)" % name))
        _refuse_torch(kwargs, "ConstantLR")
        self._setup(peak_lr, warmup_steps, None, 0.0, numeric_mode)


def _from_config(cfg):
    return _Schedule.from_config(cfg)


class _Decay(_Schedule):
    """The two decays: a warmup, then a decay that reaches min_lr at total_steps (required)."""

    def __init__(self, peak_lr, warmup_steps=0, total_steps=None, min_lr=0.0, *, numeric_mode=None, **kwargs):
        where = type(self).__name__
        _refuse_torch(kwargs, where)
        if total_steps is None:
            raise ValueError(where_msg(where, "total_steps is required (the step at which the decay "
                                       "reaches min_lr)"))
        self._setup(peak_lr, warmup_steps, total_steps, min_lr, numeric_mode)


class WarmupLinearLR(_Decay):
    """Linear warmup, then a straight line from ``peak_lr`` down to ``min_lr``.

    Not torch's ``LinearLR`` scheduler: a step -> lr function passed as ``lr_schedule=``;
    torch's arguments (an optimizer, ``start_factor``, ``total_iters``, ``last_epoch``, ...)
    are refused by name.

    ``WarmupLinearLR(peak_lr, warmup_steps=0, total_steps=..., min_lr=0.0)``; W =
    warmup_steps, T = total_steps (required, W < T <= 2**53). ``lr_at(t)`` (t one-based) is
    the float32 nearest ``peak_lr * t / W`` for ``t <= W``,
    ``min_lr + (peak_lr - min_lr) * (T - t) / (T - W)`` for ``W < t < T``, and ``min_lr`` from
    step T on. ``0 <= min_lr <= peak_lr``.
    """

    kind = "warmup_linear"


class WarmupCosineLR(_Decay):
    """Linear warmup, then a half cosine from ``peak_lr`` down to ``min_lr``.

    Not torch's ``CosineAnnealingLR`` scheduler: a step -> lr function passed as
    ``lr_schedule=``; torch's arguments (an optimizer, ``T_max``, ``eta_min``, ``last_epoch``,
    ...) are refused by name, with what to pass instead.

    ``WarmupCosineLR(peak_lr, warmup_steps=0, total_steps=..., min_lr=0.0)``; W =
    warmup_steps, T = total_steps (required, W < T <= 2**53). ``lr_at(t)`` (t one-based) is
    the float32 nearest ``peak_lr * t / W`` for ``t <= W``,
    ``min_lr + (peak_lr - min_lr) * (1 + cos(pi * (t - W) / (T - W))) / 2`` for ``W < t < T``
    (the exact real number, never a libm cosine), and ``min_lr`` from step T on.
    """

    kind = "warmup_cosine"
