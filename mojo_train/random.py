"""Philox random streams: ``Generator`` (uniform and normal draws, initializers, dropout).

Contract (native/contracts/random.md): a generator is a seed and a counter. Every draw takes
one stream id -- the counter's value, which then advances -- unless the caller names a
stream, and element ``i`` of a draw is stream element ``offset + i``: a pure function of
(seed, stream, offset + i) computed by the pinned Philox4x32-10 and its float mappings, the
same bits on every vendor's identical numeric mode, thread count and launch geometry. So a draw
split into pieces at matching offsets gives exactly the unsplit draw, and dropout's
backward regenerates the forward's mask from its key instead of storing it. A refused call
changes nothing: the counter advances only after a draw succeeded.

Host scalars (initializer bounds and standard deviations) follow torch.nn.init's formulas
in IEEE binary64 (only ``+ - * /`` and ``math.sqrt``, correctly rounded on every platform)
and are rounded once to float32 inside the library, so every vendor gets the same float32.
"""
import collections
import math
import numbers
import operator
import struct

from . import _buffer, _ops
from ._errors import where_msg
from ._native import load, numeric_mode_arg

__all__ = ["Generator", "DropoutKey"]

_U64 = 1 << 64

DropoutKey = collections.namedtuple("DropoutKey", "seed stream offset p size shape", defaults=(None,))
DropoutKey.__doc__ = """What ``Generator.dropout`` drew with: seed, stream, offset (the stream
element of the input's first element), p (the float32 drop probability, as a Python float),
size (the number of elements) and shape (the input's shape; None in a key built by hand, whose
dy is then checked by size only). ``Generator.dropout_backward`` regenerates the mask from it."""



def _uint64(value, name, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "%s must be an int, got %s" % (name, type(value).__name__)))
    value = int(value)
    if not 0 <= value < _U64:
        raise ValueError(where_msg(where, "%s must be in [0, 2**64), got %d" % (name, value)))
    return value


def _real(value, name, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(where_msg(where, "%s must be a real number, got %s" % (name, type(value).__name__)))
    try:
        value = float(value)
    except OverflowError:                       # an int beyond a double: not finite
        value = float("inf")
    if not math.isfinite(value):
        raise ValueError(where_msg(where, "%s must be finite, got %r" % (name, value)))
    return value


def _fan(value, name, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not 1 <= value < 2 ** 63:
        raise ValueError(where_msg(where, "%s must be a positive int below 2**63, got %r" % (name, value)))
    return int(value)


def _within_f32(value, what, cause, where):
    """``value`` rounded to float32, refused naming ``cause`` when it is beyond float32's range."""
    f = _nearest_f32(value)
    if f is None or not math.isfinite(f):
        raise ValueError(where_msg(where, "%s %r is beyond float32's range; %s is too large" % (what, value, cause)))
    return f


def _key_shape(key, name, where):
    """A DropoutKey's shape as a tuple, or None (a key of a count alone); a hand-built key's
    other shape is refused naming ``name``.shape."""
    if key.shape is None:
        return None
    try:
        return tuple(operator.index(d) for d in key.shape)
    except TypeError:
        raise TypeError(where_msg(where, "%s.shape must be None or a tuple of ints (the forward's shape), got %r"
                                  % (name, key.shape))) from None


def _shape(shape, where):
    """(shape tuple, element count) of an int or a sequence of ints >= 0."""
    dims = (shape,) if isinstance(shape, numbers.Integral) and not isinstance(shape, bool) else shape
    try:
        dims = tuple(dims)
    except TypeError:
        raise TypeError(where_msg(where, "shape must be an int or a tuple of ints, got %r" % (shape,))) from None
    n = 1
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or d < 0:
            raise ValueError(where_msg(where, "shape must hold ints >= 0, got %r" % (shape,)))
        n *= int(d)
    return tuple(int(d) for d in dims), n


def _nearest_f32(value):
    """The float32 nearest to the number ``value`` (as a Python float), or None where there is
    none: beyond float32's range (or a double's), or not a number at all."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(value)))[0]
    except (TypeError, ValueError, OverflowError, struct.error):
        return None


def _f32(value, name, where):
    """The float32 nearest to ``value`` (a finite real)."""
    f = _nearest_f32(_real(value, name, where))
    if f is None:
        raise ValueError(where_msg(where, "%s is outside float32's range, got %r" % (name, value)))
    return f


class Generator:
    """A seeded Philox4x32-10 random stream: draws, initializers and dropout.

    ``Generator(seed)`` with ``seed`` an int in [0, 2**64); ``numeric_mode`` picks the numeric mode
    (None: the library default). Each draw takes the next stream id from the generator's
    counter (``state_dict()`` holds seed and counter: save it beside the optimizer state to
    resume exactly). Results are ``mojo_train.Array`` of float32, or ``DeviceArray`` with
    ``device=True`` on a GPU vendor (dropout's output sits where its input does).

    >>> g = Generator(0)
    >>> w = g.kaiming_uniform((128, 64), fan_in=64)
    >>> y, key = g.dropout(w, p=0.1)
    >>> dw = g.dropout_backward(w, key)
    """

    def __init__(self, seed, numeric_mode=None):
        self._seed = _uint64(seed, "seed", "Generator")
        self._counter = 0
        self.numeric_mode = numeric_mode_arg(numeric_mode, "Generator")

    @property
    def seed(self):
        return self._seed

    @property
    def counter(self):
        """The stream id the next draw will take."""
        return self._counter

    def state_dict(self):
        """``{'seed': int, 'counter': int}``: everything that decides the next draws."""
        return {"seed": self._seed, "counter": self._counter}

    def load_state_dict(self, state):
        """Resume from ``state_dict()``: both keys required, ints in [0, 2**64); nothing
        changes when refused."""
        where = "Generator.load_state_dict"
        if not isinstance(state, dict) or set(state) != {"seed", "counter"}:
            raise ValueError(where_msg(where, "state must be a dict with exactly the keys 'seed' and "
                                       "'counter', got %r" % (state,)))
        seed, counter = _uint64(state["seed"], "seed", where), _uint64(state["counter"], "counter", where)
        self._seed, self._counter = seed, counter

    def next_stream(self):
        """Take and return the next stream id (e.g. to drop out a batch split into microbatches
        with one stream and per-piece offsets)."""
        return self._take(None, "Generator.next_stream")

    def _take(self, stream, where, commit=True):
        """The stream a draw uses: ``stream`` when given, else the counter (advanced when
        ``commit``)."""
        if stream is not None:
            return _uint64(stream, "stream", where)
        if self._counter >= _U64 - 1:
            raise RuntimeError(where_msg(where, "the stream counter is exhausted (2**64 - 1 streams drawn)"))
        s = self._counter
        if commit:
            self._counter += 1
        return s

    # ---- draws ---------------------------------------------------------------------------
    def _fill(self, where, fill, shape, a, b, stream, offset, device):
        shape, n = _shape(shape, where)
        offset = _uint64(offset, "offset", where)
        s = self._take(stream, where, commit=False)
        backend = load(self.numeric_mode)
        if device and backend.vendor == "cpu":
            raise ValueError(where_msg(where, "device=True but the loaded vendor is cpu; set "
                                       "MOJO_TRAIN_VENDOR=cuda"))
        out = _ops.out_f32(shape, bool(device), self.numeric_mode)
        backend.check(getattr(backend.lib, fill)(_ops.fptr_nonnull(out), self._seed, s, offset, a, b, n), where)
        if stream is None:
            self._counter += 1
        return out

    def uniform(self, shape, low=0.0, high=1.0, *, stream=None, offset=0, device=False):
        """Uniform float32 values in [low, high] (``low + (high - low) * u``, u on the 2**-24
        grid of [0, 1); the top can be reached by rounding). low < high, both finite in
        float32. ``stream``: None takes the next stream id; ``offset``: the stream element of
        the first value, so pieces drawn at matching offsets equal one draw."""
        where = "Generator.uniform"
        return self._fill(where, "mt_uniform_fill", shape, _real(low, "low", where), _real(high, "high", where),
                          stream, offset, device)

    def normal(self, shape, mean=0.0, std=1.0, *, stream=None, offset=0, device=False):
        """Normal float32 values ``mean + std * z`` (z by Box-Muller from pairs of stream
        elements, |z| <= 5.77); std >= 0. ``stream``, ``offset``, ``device`` as in uniform."""
        where = "Generator.normal"
        return self._fill(where, "mt_normal_fill", shape, _real(mean, "mean", where), _real(std, "std", where),
                          stream, offset, device)

    # ---- initializers (torch.nn.init's formulas) -----------------------------------------
    def kaiming_uniform(self, shape, fan_in, a=math.sqrt(5.0), *, device=False):
        """U(-bound, bound) with bound = gain * sqrt(3 / fan_in), gain = sqrt(2 / (1 + a*a)):
        torch's kaiming_uniform_ (mode='fan_in', leaky_relu slope a); the default a = sqrt(5)
        is nn.Linear's weight init."""
        where = "Generator.kaiming_uniform"
        bound = math.sqrt(3.0) * (self._gain(a, where) / math.sqrt(_fan(fan_in, "fan_in", where)))
        return self._bounded(where, bound, shape, device)

    def kaiming_normal(self, shape, fan_in, a=0.0, *, device=False):
        """N(0, std) with std = gain / sqrt(fan_in), gain = sqrt(2 / (1 + a*a)): torch's
        kaiming_normal_ (mode='fan_in', leaky_relu slope a; a = 0 is ReLU's gain sqrt(2))."""
        where = "Generator.kaiming_normal"
        std = self._gain(a, where) / math.sqrt(_fan(fan_in, "fan_in", where))
        return self.normal(shape, 0.0, std, device=device)   # std <= sqrt(2): within float32

    def xavier_uniform(self, shape, fan_in, fan_out, gain=1.0, *, device=False):
        """U(-b, b) with b = sqrt(3) * gain * sqrt(2 / (fan_in + fan_out)): torch's
        xavier_uniform_; gain > 0."""
        where = "Generator.xavier_uniform"
        bound = math.sqrt(3.0) * self._xavier_std(fan_in, fan_out, gain, where)
        return self._bounded(where, bound, shape, device)

    def xavier_normal(self, shape, fan_in, fan_out, gain=1.0, *, device=False):
        """N(0, std) with std = gain * sqrt(2 / (fan_in + fan_out)): torch's xavier_normal_."""
        where = "Generator.xavier_normal"
        std = self._xavier_std(fan_in, fan_out, gain, where)
        _within_f32(std, "the std", "gain", where)
        return self.normal(shape, 0.0, std, device=device)

    @staticmethod
    def _gain(a, where):
        a = _real(a, "a", where)
        return math.sqrt(2.0 / (1 + a * a))

    @staticmethod
    def _xavier_std(fan_in, fan_out, gain, where):
        gain = _real(gain, "gain", where)
        if gain <= 0.0:
            raise ValueError(where_msg(where, "gain must be > 0, got %r" % gain))
        return gain * math.sqrt(2.0 / float(_fan(fan_in, "fan_in", where) + _fan(fan_out, "fan_out", where)))

    def _bounded(self, where, bound, shape, device):
        if not bound > 0.0 or _within_f32(bound, "the bound", "gain", where) == 0.0:
            raise ValueError(where_msg(where, "the bound %r rounds to 0 in float32" % bound))
        return self._fill(where, "mt_uniform_fill", shape, -bound, bound, None, 0, device)

    # ---- dropout -------------------------------------------------------------------------
    def dropout(self, x, p, offset=0, stream=None, *, out=None):
        """Inverted dropout of float32 ``x``: ``(y, key)``.

        Element i is kept iff the uniform u of stream element ``offset + i`` (the value
        ``uniform`` would draw there) satisfies u >= p; kept elements become x * scale,
        scale = 1 / (1 - p) in float32; dropped ones +0.0. p (rounded to float32) must lie in
        [0, 1); p = 0 returns x bit for bit. ``offset`` lets a microbatch draw exactly the
        values it would draw inside the whole batch (use one ``stream`` for all pieces);
        ``stream`` None takes the next stream id. A NaN or inf in x is refused
        (ValueError) and nothing is written. ``out``: a float32 buffer of x's shape to write
        (x itself: in place; a buffer partly overlapping x is refused), else a new one on
        x's side (host or device). ``key`` feeds dropout_backward.
        """
        where = "Generator.dropout"
        px = _ops.f32_in(x, "x", where)
        p32 = self._p(p, where)
        offset = _uint64(offset, "offset", where)
        s = self._take(stream, where, commit=False)
        y = self._apply(where, "mt_dropout_forward", px, "x", out, p32, self._seed, s, offset)
        if stream is None:
            self._counter += 1
        return y, DropoutKey(self._seed, s, offset, p32, px.nelems, tuple(px.shape))

    def dropout_backward(self, dy, key, *, out=None):
        """Gradient of ``dropout``: dy * scale where the forward kept, +0.0 where it dropped,
        with the mask regenerated from ``key`` (a DropoutKey; dy must have the forward's
        shape, key.shape). Takes no stream. ``out`` as in dropout, with dy for x."""
        where = "Generator.dropout_backward"
        if not isinstance(key, DropoutKey):
            raise TypeError(where_msg(where, "key must be the DropoutKey dropout returned, got %s"
                                      % type(key).__name__))
        for field in ("seed", "stream", "offset"):       # a key built by hand reaches C unchecked otherwise
            _uint64(getattr(key, field), "key." + field, where)
        pdy = _ops.f32_in(dy, "dy", where)
        if _key_shape(key, "key", where) not in (None, tuple(pdy.shape)):
            raise ValueError(where_msg(where, "dy has shape %r, the forward's x had shape %r; dy must have x's "
                                       "shape (no broadcasting: reshape or expand explicitly)"
                                       % (tuple(pdy.shape), tuple(key.shape))))
        if isinstance(key.size, bool) or not isinstance(key.size, numbers.Integral):     # a key built by hand
            raise TypeError(where_msg(where, "key.size must be an int (the forward's element count), got %r"
                                      % (key.size,)))
        if pdy.nelems != key.size:
            raise ValueError(where_msg(where, "dy has %d elements, the key's forward had %d" % (pdy.nelems, key.size)))
        return self._apply(where, "mt_dropout_backward", pdy, "dy", out, self._p(key.p, where), key.seed,
                           key.stream, key.offset)

    @staticmethod
    def _p(p, where):
        p32 = _f32(p, "p", where)
        if not 0.0 <= p32 < 1.0:
            raise ValueError(where_msg(where, "p must be in [0, 1) after rounding to float32, got %r" % p))
        return p32

    def _apply(self, where, fn, px, name, out, p32, seed, stream, offset):
        out, fresh = _ops.unwrap_fresh(out)
        pout = _ops.out_arg(where, out, px.shape, [(name, px)])
        backend, on_device = _ops.placement(where, self.numeric_mode, **{name: px, "out": pout})
        y = out if out is not None else _ops.out_f32(px.shape, on_device, self.numeric_mode)
        target = pout if pout is not None else y
        backend.check(getattr(backend.lib, fn)(_ops.fptr_nonnull(target), _ops.fptr_nonnull(px), p32, seed, stream,
                                               offset, px.nelems, _ops.map_flags(pout, fresh)), where)
        _buffer.wrote(pout)
        return y

    def __repr__(self):
        return "Generator(seed=%d, counter=%d)" % (self._seed, self._counter)
