"""How the fuzz suite describes an entry point and draws hostile calls of it (the parent side).

A ``Target`` names one public callable (``covers``), how to call it (``call``, in the worker) and
its oracle (``check``). A ``FnTarget`` is declarative: its ``params`` (``F32`` float tensors,
``Ids`` integer tensors, ``Scalar`` options, ``Out`` buffers written by the call) over named
dimensions (``dims``) give a strategy of valid calls, onto which ``draw`` puts up to two faults.
Each fault says which argument it is in (the refusal must name it), and whether it makes the call
invalid ("hard": a refusal is required), or may or may not ("soft": a clean refusal or the
oracle's result). An example (``Example.desc()``) is plain data (tests/_fuzz_build.py builds it).

Refusals a fault allows beyond TypeError/ValueError/IndexError are named with it: MemoryError for
a shape genuinely too large to allocate ("huge"), NotImplementedError for a documented
unsupported option, and so on; see tests/_fuzz_worker.py for the classification.
"""
import math
from fractions import Fraction

from hypothesis import strategies as st

from _fuzz_build import HOST_KINDS, STRIDED_KINDS, count, non_contiguous

NAN, INF = float("nan"), float("inf")
FLOAT_DTYPES_BAD = ("float64", "float16", "int32", "int64", "uint8", "bool", "complex64", "float32_be", "bfloat16")
INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "uint16", "uint32", "uint64")
WRITABLE_KINDS = ("array", "bytes_mv", "numpy", "Array", "torch")
NOT_A_BUFFER = (("lit", "abc"), ("lit", 3), ("lit", 2.5), ("lit", {"a": 1}), ("obj", "object"), ("lit", b"\x00" * 3))


class Ctx:
    """What the parent knows of the worker's vendor: its numeric mode, whether it takes device
    buffers, which containers it can build."""

    def __init__(self, vendor, numeric_mode, device, kinds):
        self.vendor, self.numeric_mode, self.device, self.kinds = vendor, numeric_mode, device, kinds


class Example:
    """One call being drawn: its arguments in order, and the faults put into it."""

    def __init__(self, target, numeric_mode):
        self.target, self.numeric_mode = target, numeric_mode
        self.args, self.faults, self.setup, self.pool = [], [], None, {}

    def add(self, name, spec, kw):
        self.args = [a for a in self.args if a[0] != name] + [(name, spec, kw)]

    def put(self, name, spec):
        """Replace argument ``name``'s spec, keeping its place."""
        self.args = [(n, spec if n == name else s, kw) for n, s, kw in self.args]

    def get(self, name):
        return next((s for n, s, _ in self.args if n == name), None)

    def drop(self, name):
        self.args = [a for a in self.args if a[0] != name]

    def has(self, name):
        return any(n == name for n, _, _ in self.args)

    def faulted(self, name):
        return any(name in f[0] for f in self.faults)

    def fault(self, names, kind, level="hard", extra=()):
        """Record a fault in ``names`` (a name or a tuple of them: the refusal names one)."""
        self.faults.append((tuple([names] if isinstance(names, str) else names), kind, level, tuple(extra)))

    def desc(self):
        """The example as plain data. ``blame``: the arguments a refusal may name -- every
        faulted one; none (any argument of the call) when a fault lies in no one argument (edge
        dimensions: the refusal may then be about any argument)."""
        hard = [f for f in self.faults if f[2] == "hard"]
        expect = "refuse" if hard else ("either" if self.faults else "accept")
        named = {n for f in self.faults for n in f[0]}
        if any(not f[0] for f in self.faults):
            named |= {n for n, _, _ in self.args}
        blame = sorted(named)
        return {"target": self.target, "numeric_mode": self.numeric_mode, "args": list(self.args),
                "setup": self.setup, "pool": dict(self.pool), "faults": list(self.faults), "expect": expect, "blame": blame}


# ---- dimensions -------------------------------------------------------------------------------

def draw_dims(draw, decl):
    """Values of the declared dimensions: ``{sym: (low, high, edges)}`` for one dimension,
    ``{"*sym": (rank_low, rank_high, low, high, edges)}`` for a tuple of leading dimensions.
    Returns (values, edge): ``edge`` is True when an edge value (say 0) was drawn."""
    values, edge = {}, False
    for sym, spec in decl.items():
        if sym.startswith("*"):
            r0, r1, lo, hi, edges = spec
            rank = draw(st.integers(r0, r1))
            dims = []
            for _ in range(rank):
                d, e = _one_dim(draw, lo, hi, edges)
                dims.append(d)
                edge |= e
            values[sym] = tuple(dims)
        else:
            values[sym], e = _one_dim(draw, *spec)
            edge |= e
    return values, edge


def _one_dim(draw, lo, hi, edges):
    if edges and draw(st.integers(0, 9)) == 0:
        return draw(st.sampled_from(edges)), True
    return draw(st.integers(lo, hi)), False


def shape_of(syms, dims):
    out = []
    for s in syms:
        if isinstance(s, int):
            out.append(s)
        elif s.startswith("*"):
            out.extend(dims[s])
        else:
            out.append(dims[s])
    return tuple(out)


# ---- buffers ----------------------------------------------------------------------------------

def buf(dtype, shape, kind="numpy", fill="unit", seed=0, special=()):
    return ("buf", dtype, tuple(shape), kind, fill, seed, tuple(special))


def with_field(spec, **changes):
    """A ("buf", ...) spec with some fields changed."""
    fields = dict(zip(("tag", "dtype", "shape", "kind", "fill", "seed", "special"), spec))
    fields.update(changes)
    return (fields["tag"], fields["dtype"], tuple(fields["shape"]), fields["kind"], fields["fill"], fields["seed"],
            tuple(fields["special"]))


def kinds_for(role, ctx, side):
    """Containers a valid tensor of ``role`` may come in: "in" (read), "update" (written in
    place, torch tensors requiring grad allowed), "out" (an output: writable, not requiring grad)."""
    if side == "device":
        return ("device",)
    kinds = HOST_KINDS if role == "in" else WRITABLE_KINDS + (("torch_grad",) if role == "update" else ())
    return tuple(k for k in kinds if k in ctx.kinds)


# ---- parameters -------------------------------------------------------------------------------

class Param:
    """One argument: passed by keyword (``kw``) or position; ``optional`` ones may be left out."""

    def __init__(self, name, kw=False, optional=False):
        self.name, self.kw, self.optional = name, kw, optional

    def valid(self, draw, ctx, dims, side):
        raise NotImplementedError

    def fault(self, draw, ctx, dims, ex, target):
        """Put one fault of this argument into ``ex`` (False when it has none to give)."""
        return False


class F32(Param):
    """A float32 tensor of ``shape`` (dimension symbols). ``role``: "in", "update" or "out";
    ``finite``: True when a NaN or inf in it must be refused, False when it is taken, None when
    the contract leaves it open; ``fills``: the value profiles of valid draws."""

    def __init__(self, name, shape, role="in", finite=True, fills=("unit", "unit", "wide", "tiny", "zero"),
                 nullable=False, bad_dtypes=FLOAT_DTYPES_BAD, strided_ok=False, **kw):
        super().__init__(name, **kw)
        self.shape, self.role, self.finite, self.fills, self.nullable = tuple(shape), role, finite, fills, nullable
        self.bad_dtypes, self.strided_ok = bad_dtypes, strided_ok     # strided_ok: a strided view is read, not refused

    def valid(self, draw, ctx, dims, side):
        if self.nullable and draw(st.integers(0, 2)) == 0:
            return ("lit", None)
        kind = draw(st.sampled_from(kinds_for(self.role, ctx, side)))
        return buf("float32", shape_of(self.shape, dims), kind, draw(st.sampled_from(self.fills)),
                   draw(st.integers(0, 2 ** 16)))

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get(self.name)
        if not (isinstance(spec, tuple) and spec[0] == "buf"):
            return False
        shape = spec[2]
        options = ["dtype", "type", "released", "shape", "shape"]
        if non_contiguous("numpy_strided", shape) and not self.strided_ok:
            options.append("strided")
        if count(shape):
            options += ["nonfinite", "nonfinite"]
        if self.role != "in":
            options += ["readonly", "grad"] if "torch_grad" in ctx.kinds and self.role == "out" else ["readonly"]
        how = draw(st.sampled_from(options))
        return tensor_fault(draw, how, self, spec, ctx, dims, ex, target)


def tensor_fault(draw, how, param, spec, ctx, dims, ex, target):
    """Put fault ``how`` into the tensor argument ``param`` (whose spec is ``spec``)."""
    name = param.name
    if how == "dtype":
        bad = draw(st.sampled_from(param.bad_dtypes))
        kind = spec[3] if spec[3] != "device" else "numpy"
        if bad == "bfloat16" and "torch" not in ctx.kinds:
            bad = "float64"
        ex.put(name, with_field(spec, dtype=bad, kind="torch" if bad == "bfloat16" else kind,
                                fill=("ids", 0, 3) if bad in INT_DTYPES or bad == "bool" else spec[4]))
        ex.fault(name, "dtype %s" % bad)
    elif how == "type":        # (bytes are a uint8 buffer: valid integer ids, and Array.from_buffer's obj)
        kinds = NOT_A_BUFFER if isinstance(param, F32) and not getattr(param, "takes_bytes", False) else NOT_A_BUFFER[:-1]
        none_ok = param.optional or getattr(param, "nullable", False)
        ex.put(name, draw(st.sampled_from(kinds + ((("lit", None),) if not none_ok else ()))))
        ex.fault(name, "not a buffer")
    elif how == "released":
        ex.put(name, with_field(spec, kind="released"))
        ex.fault(name, "released memoryview")
    elif how == "strided":
        ex.put(name, with_field(spec, kind=draw(st.sampled_from([k for k in STRIDED_KINDS if k in ctx.kinds]))))
        ex.fault(name, "not C-contiguous")
    elif how == "nonfinite":
        what = draw(st.sampled_from(("nan", "inf", "-inf")))
        ex.put(name, with_field(spec, special=spec[6] + ((draw(st.integers(0, 2 ** 16)), what),)))
        if param.finite is not False:
            ex.fault(name, "holds %s" % what, "hard" if param.finite else "soft")
    elif how == "readonly":
        ex.put(name, with_field(spec, kind="readonly"))
        ex.fault(name, "read-only %s" % param.role)
    elif how == "grad":
        ex.put(name, with_field(spec, kind="torch_grad"))
        ex.fault(name, "an output requiring grad")
    elif how == "shape":
        return shape_fault(draw, param, spec, dims, ex, target)
    return True


def shape_fault(draw, param, spec, dims, ex, target):
    """Change one dimension (or the rank) of ``param``'s shape: a hard fault when another tensor
    of the call shares the changed dimension or the rank is fixed, else soft (the call may
    still be valid, and its result must then be the oracle's)."""
    syms = [s for s in param.shape]
    shape = list(spec[2])
    sharing = [p.name for p in target.tensor_params() if p.name != param.name and ex.get(p.name) not in (None, ("lit", None))
               and ex.get(p.name)[:2] != ("alias", param.name)]     # an alias of this tensor follows its shape
    if draw(st.booleans()) or not shape:         # the rank
        lead = syms and isinstance(syms[0], str) and syms[0].startswith("*")
        new = [draw(st.integers(1, 3))] + shape if draw(st.booleans()) or not shape else shape[1:]
        shared = lead and any(syms[0] in getattr(target.param(n), "shape", ()) for n in sharing)
        level = "soft" if lead and not shared or target.loose_shapes else "hard"
        blame = (param.name,) + (tuple(n for n in sharing if syms[0] in target.param(n).shape) if lead else ())
    else:
        i = draw(st.integers(0, len(shape) - 1))
        sym = _sym_at(syms, dims, i)
        new = list(shape)
        new[i] = max(0, shape[i] + draw(st.sampled_from((1, -1, 2, 5))))
        if new[i] == shape[i]:
            new[i] += 1
        users = tuple(n for n in sharing if sym is not None and sym in target.param(n).shape)
        bounded = tuple(n for n in sharing if sym is not None and getattr(target.param(n), "high", None) == sym)
        level = "hard" if (users or sym is None or sym in target.fixed) and not target.loose_shapes else "soft"
        blame = (param.name,) + users + bounded      # a table's rows bound the ids: a refusal may name them
    ex.put(param.name, with_field(spec, shape=tuple(new)))
    ex.fault(blame, "shape %r -> %r" % (tuple(shape), tuple(new)), level)
    return True


def _sym_at(syms, dims, i):
    """The dimension symbol at position ``i`` of a shape made of ``syms``."""
    at = 0
    for s in syms:
        width = len(dims[s]) if isinstance(s, str) and s.startswith("*") else 1
        if at <= i < at + width:
            return s if isinstance(s, str) else None
        at += width
    return None


class Ids(Param):
    """An integer tensor of ``shape`` with values in [low, high) (``high`` a symbol or an int);
    ``as_list``: a flat list of ints is also taken; ``extra_ok``: values outside the range that
    are valid (an ignore_index)."""

    bad_dtypes = ("float32", "float64", "bool", "complex64", "float16")

    def __init__(self, name, shape, high, low=0, as_list=True, extra_ok=(), **kw):
        super().__init__(name, **kw)
        self.shape, self.high, self.low, self.as_list, self.extra_ok = tuple(shape), high, low, as_list, extra_ok
        self.finite = True

    def bound(self, dims):
        return dims[self.high] if isinstance(self.high, str) else self.high

    def valid(self, draw, ctx, dims, side):
        shape, high = shape_of(self.shape, dims), self.bound(dims)
        seed = draw(st.integers(0, 2 ** 16))
        hi = max(self.low, high - 1)
        if side == "host" and self.as_list and len(shape) == 1 and draw(st.integers(0, 3)) == 0:
            vals = draw(st.lists(st.integers(self.low, hi), min_size=shape[0], max_size=shape[0]))
            return ("lit", vals)
        kind = draw(st.sampled_from(kinds_for("in", ctx, side)))
        dtype = draw(st.sampled_from(("int64", "int32") if side == "device" else INT_DTYPES))
        return buf(dtype, shape, kind if not kind.startswith("torch_grad") else "torch", ("ids", self.low, hi), seed)

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get(self.name)
        high = self.bound(dims)
        if isinstance(spec, tuple) and spec[0] == "lit" and isinstance(spec[1], list) and spec[1]:
            vals = list(spec[1])
            i = draw(st.integers(0, len(vals) - 1))
            bad, why, level = draw(st.sampled_from(
                [(high, "out of range", "hard"), (-1, "out of range", "hard"), (2 ** 63, "outside int64", "hard"),
                 (2 ** 70, "outside int64", "hard"), (1.5, "not an int", "hard"), (True, "a bool", "hard"),
                 ("1", "a string", "hard"), ([0], "nested", "hard")]))
            if bad in self.extra_ok:
                return False
            vals[i] = bad
            ex.put(self.name, ("lit", vals))
            ex.fault(self.name, "%s: %r" % (why, bad), level)
            return True
        if not (isinstance(spec, tuple) and spec[0] == "buf"):
            return False
        options = ["dtype", "type", "released", "shape"] + (["range", "range", "range"] if count(spec[2]) else [])
        if non_contiguous("numpy_strided", spec[2]) and not getattr(self, "strided_ok", False):
            options.append("strided")
        how = draw(st.sampled_from(options))
        if how != "range":
            return tensor_fault(draw, how, self, spec, ctx, dims, ex, target)
        limits = {"int8": 2 ** 7, "int16": 2 ** 15, "int32": 2 ** 31, "int64": 2 ** 63, "uint8": 2 ** 8,
                  "uint16": 2 ** 16, "uint32": 2 ** 32, "uint64": 2 ** 64}
        top = limits[spec[1]]
        signed = spec[1].startswith("int")
        cands = [v for v in (high, high + 1, top - 1, -1, -top // 2 if signed else None, -top if signed else None)
                 if v is not None and (-top if signed else 0) <= v < (top // 2 if signed else top)
                 and not (self.low <= v < high) and v not in self.extra_ok]
        if not cands:
            return False
        value = draw(st.sampled_from(cands))
        ex.put(self.name, with_field(spec, special=((draw(st.integers(0, 2 ** 16)), value),)))
        ex.fault(self.name, "value %d outside [%d, %d)" % (value, self.low, high))
        return True


class Scalar(Param):
    """A non-tensor argument: valid values drawn from ``valid`` (a strategy), faults from
    ``bad`` ((value, level, extra exception names) triples; see the *_BAD helpers)."""

    def __init__(self, name, valid, bad, **kw):
        super().__init__(name, **kw)
        self.valid_st, self.bad = valid, tuple(bad)

    def valid(self, draw, ctx, dims, side):
        valid = self.valid_st(dims) if callable(self.valid_st) else self.valid_st
        return ("lit", draw(valid))

    def fault(self, draw, ctx, dims, ex, target):
        if not self.bad:
            return False
        bad = self.bad_for(dims) if hasattr(self, "bad_for") else self.bad
        value, level, extra = draw(st.sampled_from(bad))
        if not ex.has(self.name):          # by keyword: an optional positional before it may be absent
            ex.add(self.name, ("lit", value), True)
        else:
            ex.put(self.name, ("lit", value))
        ex.fault(self.name, "%s=%r" % (self.name, value), level, extra)
        return True


def bad(*values, level="hard", extra=()):
    return [(v, level, tuple(extra)) for v in values]


def real_bad(low=0.0, high=None, high_open=False, optional=False):
    """Values a real-number argument in [low, high] (or [low, high)) must refuse."""
    out = bad(True, "0.5", [0.5], NAN, INF, -INF, 10 ** 400, -10 ** 400, complex(1, 1))
    if not optional:
        out += bad(None)
    if low is not None:
        out += bad(low - 1.0, low - 2.0 ** -20 if low == 0 else low * (1 - 2.0 ** -20))
    if high is not None:
        out += bad(high + 1.0, *((high, high - 1e-9) if high_open else ()))
    return out


def int_bad(low, high=None, optional=False):
    """Values an integer argument in [low, high] must refuse."""
    out = bad(True, False, 2.0, 2.5, "3", [1], low - 1, -2 ** 64, 2 ** 64 + 5, 10 ** 30 * -1)
    if not optional:
        out += bad(None)
    if high is not None:
        out += bad(high + 1, 2 ** 70)
    return [o for o in out if not (isinstance(o[0], int) and not isinstance(o[0], bool) and low <= o[0]
                                   and (high is None or o[0] <= high))]


BOOL_BAD = bad(1, 0, "True", None, 1.0)


def reals(low, high):
    """Valid reals in [low, high], some in exotic types (ints, Fractions, numpy scalars)."""
    import numpy as np
    base = st.floats(low, high, allow_nan=False, allow_infinity=False)
    return st.one_of(base, base, base, base.map(Fraction), base.map(np.float32).filter(lambda v: low <= float(v) <= high),
                     st.integers(math.ceil(low), math.floor(high)) if math.floor(high) >= math.ceil(low) else base)


# ---- targets ----------------------------------------------------------------------------------

class Target:
    """One public entry point under fuzz (see the module docstring). ``covers``: the public names
    it exercises; ``writes``: the arguments a successful call may write; ``device_only``: its
    every call needs device buffers; ``refusal_types``: exception names allowed for any fault of
    this target beyond the three (see tests/_fuzz_worker.py)."""

    name = None
    covers = ()
    writes = ()
    device_only = False
    numeric_mode = True
    refusal_types = ()
    examples = 1.0        # relative share of the example budget

    def strategy(self, ctx):
        return st.composite(lambda draw: self.draw(draw, ctx))()

    def draw(self, draw, ctx):
        raise NotImplementedError

    # worker side
    def setup(self, desc, built):
        """The object a method target calls (built from ``desc["setup"]``), else None."""
        return None

    def call(self, subject, args, kwargs):
        raise NotImplementedError

    def state(self, subject):
        """What of ``subject`` a refusal must leave as it was (compared with ==)."""
        return None

    def check(self, c):
        """The oracle: raise AssertionError (or Mismatch) when the result is not the expected one."""
        raise NotImplementedError


def mode_variants(numeric_mode):
    """Valid spellings of a numeric mode (any case, surrounding blanks)."""
    return st.sampled_from((numeric_mode, numeric_mode, numeric_mode.upper(), " %s " % numeric_mode))


MODE_BAD = bad("bogus", 3, "", b"identical", ["identical"])


class FnTarget(Target):
    """A declarative target: ``fn`` (a dotted name under mojo_train), ``params``, ``dims``;
    ``fixed``: dimension symbols whose change alone is invalid (a tensor's rank or a size the
    contract bounds)."""

    fn = None
    params = ()
    dims = {}
    fixed = ()
    max_faults = 2
    keywords = True       # False: an attribute assignment (no keyword to add, no argument to leave out)
    loose_shapes = False  # True: shapes may also be valid in another form (embedding dy: (n, d) for any ids shape)

    def tensor_params(self):
        return [p for p in self.params if isinstance(p, (F32, Ids))]

    def param(self, name):
        return next(p for p in self.params if p.name == name)

    def draw(self, draw, ctx):
        dims, edge = draw_dims(draw, self.dims)
        return self.draw_args(draw, ctx, dims, edge)

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        """A call over the dimensions ``dims``: valid arguments (all on the host, or all device
        memory), then up to ``max_faults`` faults. Once an optional positional argument is left
        out, the ones after it are passed by keyword."""
        if side is None:
            side = "device" if ctx.device and draw(st.integers(0, 3)) == 0 else "host"
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        by_keyword = False
        for p in self.params:
            if p.optional and draw(st.booleans()):
                by_keyword |= not p.kw
                continue
            ex.add(p.name, p.valid(draw, ctx, dims, side), p.kw or by_keyword)
        self.relate(draw, ctx, dims, ex, side)
        if self.numeric_mode:
            ex.add("numeric_mode", ("lit", draw(mode_variants(ctx.numeric_mode))), True)
        if edge:
            ex.fault((), "edge dimensions %r" % (dims,), "soft")
        for _ in range(draw(st.sampled_from((0, 0, 1, 1, 1, 2)[:4 + self.max_faults]))):
            self.one_fault(draw, ctx, dims, ex)
        return ex.desc()

    def relate(self, draw, ctx, dims, ex, side):
        """Target-specific additions after the valid draw (aliases, coupled options)."""

    def one_fault(self, draw, ctx, dims, ex):
        """Put one fault into the call (False when the drawn kind has none to give). An argument
        takes one fault: a second would replace the first's value and leave its record stale."""
        choice = draw(st.integers(0, len(self.params) + 2))
        if choice < len(self.params):
            p = self.params[choice]
            if not ex.has(p.name) and not isinstance(p, Scalar) or ex.faulted(p.name):
                return False
            return p.fault(draw, ctx, dims, ex, self)
        if choice == len(self.params) and self.numeric_mode:
            value, level, extra = draw(st.sampled_from(MODE_BAD))
            ex.put("numeric_mode", ("lit", value))
            ex.fault("numeric_mode", "numeric_mode=%r" % (value,))
            return True
        if choice == len(self.params) + 1 and self.keywords:
            ex.add("fuzz_unknown", ("lit", 1), True)
            ex.fault("fuzz_unknown", "an unknown keyword")
            return True
        referenced = {s[1] for _, s, _ in ex.args if isinstance(s, tuple) and s and s[0] in ("alias", "view")}
        positional = [n for n, _, kw in ex.args if not kw]
        required = [p for p in self.params if not p.optional and not p.kw and positional and p.name == positional[-1]
                    and p.name not in referenced]       # the last positional one: no other moves into its place
        if not required or not self.keywords:
            return False
        p = required[0]
        ex.drop(p.name)
        ex.fault(p.name, "left out")
        return True

    def call(self, subject, args, kwargs):
        import mojo_train
        fn = mojo_train
        for part in self.fn.split("."):
            fn = getattr(fn, part)
        return fn(*args, **kwargs)


class Subject:
    """What a method target calls: ``obj``, and what its oracle needs of ``obj`` before the call."""

    def __init__(self, obj, **before):
        self.obj, self.before = obj, before


class MethodTarget(FnTarget):
    """A method of an object the worker builds first from ``desc["setup"]`` (``draw_setup``
    draws it, with the dimensions the arguments use; ``make`` builds it)."""

    method = None
    numeric_mode = False

    def draw(self, draw, ctx):
        setup, dims = self.draw_setup(draw, ctx)
        return self.draw_args(draw, ctx, dims, False, setup, dims.get("side", "host"))

    def draw_setup(self, draw, ctx):
        raise NotImplementedError

    def setup(self, desc, built):
        return self.make(desc["setup"], built, desc["numeric_mode"])

    def call(self, subject, args, kwargs):
        return getattr(subject.obj, self.method)(*args, **kwargs)
