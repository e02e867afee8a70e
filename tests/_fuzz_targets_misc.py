"""Fuzz targets of the rest of the surface: the learning-rate schedules, Array, device memory
(DeviceArray, to_device: GPU vendors only), the Embedding layer (construction, forward,
backward, the table property, save/load), the library's identity calls, and the harness's own
sabotaged targets ("harness.*": never public, they prove the suite reports what it must).

Oracles: tests/test_schedule.py's exact reference (Fractions, mpmath intervals) for every
schedule value; numpy for Array's contents; the gather and tests/test_embedding.py's token rule
for the layer.
"""
import functools
import os
import struct
import tempfile

import numpy as np
from hypothesis import strategies as st

from _fuzz_build import build
from _fuzz_spec import (BOOL_BAD, F32, FnTarget, Ids, MethodTarget, Scalar, Subject, Target, bad, buf, count,
                        int_bad, real_bad, reals, with_field)
from _fuzz_targets import assert_same_bits, c_order, host

FLT_MAX = float.fromhex("0x1.fffffep+127")
ARRAY_DTYPES = ("float32", "float64", "int32", "int64", "uint32", "uint8")


# ---- schedules --------------------------------------------------------------------------------

KIND = {"ConstantLR": "constant", "WarmupLinearLR": "warmup_linear", "WarmupCosineLR": "warmup_cosine"}
TORCH_ARGS = {"ConstantLR": ("factor", "total_iters", "last_epoch", "optimizer"),
              "WarmupLinearLR": ("start_factor", "total_iters", "last_epoch"),
              "WarmupCosineLR": ("T_max", "eta_min", "last_epoch")}


def schedule_args(draw, cls):
    """Valid arguments of schedule class ``cls``."""
    peak = draw(st.one_of(reals(0.0, 1.0), st.just(FLT_MAX), st.just(0.0)))
    args = {"peak_lr": peak, "warmup_steps": draw(st.one_of(st.integers(0, 5), st.integers(0, 2 ** 53)))}
    if cls != "ConstantLR":
        args["total_steps"] = args["warmup_steps"] + draw(st.one_of(st.integers(1, 6), st.integers(1, 2 ** 20)))
        if args["total_steps"] > 2 ** 53:
            args["total_steps"] = 2 ** 53
            args["warmup_steps"] = min(args["warmup_steps"], 2 ** 53 - 1)
        args["min_lr"] = draw(st.one_of(st.just(0.0), reals(0.0, 1.0).map(lambda v: float(v) * float(peak))))
    return args


def steps_to_check(args):
    w, total = int(args["warmup_steps"]), int(args.get("total_steps") or 0)
    return sorted({1, 2, max(1, w), w + 1, max(1, total - 1), total + 1, total + 7} - {0})


def reference(cls, args, t):
    from test_schedule import reference_bits
    return reference_bits(KIND[cls], float(args["peak_lr"]), float(args.get("min_lr", 0.0)),
                          int(args["warmup_steps"]), args.get("total_steps"), t)


def bits_of(v):
    return struct.unpack("<I", struct.pack("<f", v))[0]


class ScheduleCtor(Target):
    """A schedule's constructor: valid arguments, then one fault (a bad value, a decay whose
    total_steps is not past warmup_steps, min_lr above peak_lr, torch's scheduler arguments)."""

    cls = None
    numeric_mode = False

    def draw(self, draw, ctx):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        args = schedule_args(draw, self.cls)
        how = draw(st.sampled_from((None, None, "peak_lr", "warmup_steps", "total_steps", "min_lr", "order", "torch")))
        if how in ("peak_lr", "min_lr") and how in args:
            args[how] = draw(st.sampled_from([v for v, _, _ in real_bad(0.0)] + [1e39]))
            ex.fault((how, "peak_lr"), "%s=%r" % (how, args[how]))
        elif how in ("warmup_steps", "total_steps") and how in args:
            args[how] = draw(st.sampled_from([v for v, _, _ in int_bad(0, 2 ** 53)]))
            ex.fault((how, "warmup_steps", "total_steps"), "%s=%r" % (how, args[how]))
        elif how == "order" and "total_steps" in args:
            args["total_steps"] = draw(st.sampled_from((args["warmup_steps"], None)))
            ex.fault(("total_steps", "warmup_steps"), "total_steps=%r" % (args["total_steps"],))
        elif how == "order" and self.cls == "ConstantLR":
            args[draw(st.sampled_from(("total_steps", "min_lr")))] = 5
            ex.fault(("total_steps", "min_lr"), "a decay argument to ConstantLR")
        elif how == "torch":
            name = draw(st.sampled_from(TORCH_ARGS[self.cls]))
            args[name] = 1
            ex.fault(name, "torch's %s" % name)
        for k, v in args.items():
            ex.add(k, ("lit", v), True)
        return ex.desc()

    def call(self, subject, args, kwargs):
        import mojo_train
        return getattr(mojo_train, self.cls)(*args, **kwargs)

    def check(self, c):
        args = dict(c.args)
        cfg = c.result.config()
        assert cfg["kind"] == KIND[self.cls] and cfg["warmup_steps"] == args["warmup_steps"]
        for t in steps_to_check(args):
            assert c.result.bits_at(t) == reference(self.cls, args, t), "lr_at(%d)" % t


class ScheduleMethod(MethodTarget):
    """lr_at, lr_values, bits_at and from_config of a valid schedule."""

    cls, method = None, None

    def draw_setup(self, draw, ctx):
        return {"cls": self.cls, "args": schedule_args(draw, self.cls)}, {}

    def make(self, setup, built, numeric_mode):
        import mojo_train
        return Subject(getattr(mojo_train, setup["cls"])(**setup["args"]), args=setup["args"])

    def state(self, subject):
        return subject.obj.config()


T_BAD = int_bad(1, 2 ** 63) + bad(0, -1)


class LrAt(ScheduleMethod):
    @functools.cached_property
    def params(self):
        if self.method == "lr_values":
            return (Scalar("n", st.integers(0, 40), int_bad(0) + bad(2 ** 40, extra=("MemoryError",))),)
        return (Scalar("t", st.one_of(st.integers(1, 40), st.integers(1, 2 ** 53), st.just(2 ** 62)),
                       [b for b in T_BAD if not (isinstance(b[0], int) and not isinstance(b[0], bool) and b[0] >= 1)]),)

    def check(self, c):
        args = c.subject.before["args"]
        if self.method == "lr_values":
            n = int(c.lit("n"))
            assert len(c.result) == n, "lr_values(%d) has %d values" % (n, len(c.result))
            for t in sorted({1, n, (n + 1) // 2} - {0}) if n else ():
                assert bits_of(c.result[t - 1]) == reference(self.cls, args, t), "lr_values[%d]" % (t - 1)
            return
        t = int(c.lit("t"))
        got = c.result if self.method == "bits_at" else bits_of(c.result)
        assert got == reference(self.cls, args, t), "%s(%d)" % (self.method, t)


class FromConfig(ScheduleMethod):
    method = "from_config"

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        cfg = {"kind": KIND[self.cls], "total_steps": None, "min_lr": 0.0}
        cfg.update(setup["args"])
        how = draw(st.sampled_from((None, None, "kind", "unknown", "missing", "value", "type")))
        if how == "kind":
            cfg["kind"] = draw(st.sampled_from(("bogus", None, 3) + tuple(k for k in KIND.values() if k != cfg["kind"])))
            ex.fault(("cfg", "kind"), "kind %r" % (cfg["kind"],))
        elif how == "unknown":
            cfg["fuzz"] = 1
            ex.fault(("cfg", "fuzz"), "an unknown key")
        elif how == "missing" and self.cls != "ConstantLR":
            cfg.pop("total_steps")
            ex.fault(("cfg", "total_steps"), "no total_steps")
        elif how == "value":
            key = draw(st.sampled_from(("peak_lr", "warmup_steps")))
            cfg[key] = draw(st.sampled_from((-1, float("nan"), "x", None, True)))
            ex.fault(("cfg", key), "%s=%r" % (key, cfg[key]))
        elif how == "type":
            cfg = draw(st.sampled_from(([], "cfg", None, 3)))
            ex.fault("cfg", "not a dict")
        ex.add("cfg", ("lit", cfg), False)
        return ex.desc()

    def call(self, subject, args, kwargs):
        import mojo_train
        return getattr(mojo_train, self.cls).from_config(*args, **kwargs)

    def check(self, c):
        assert c.result == c.subject.obj, "from_config(%r) is %r" % (c.args["cfg"], c.result)


def _schedule_targets():
    out = []
    for cls in KIND:
        out.append(type("Ctor" + cls, (ScheduleCtor,), {"cls": cls, "name": cls, "covers": ("mojo_train.%s" % cls,)})())
        for method in ("lr_at", "lr_values", "bits_at"):
            out.append(type(method + cls, (LrAt,), {"cls": cls, "method": method, "name": "%s.%s" % (cls, method),
                                                    "covers": ("mojo_train.%s.%s" % (cls, method),)})())
        out.append(type("FromConfig" + cls, (FromConfig,), {"cls": cls, "name": "%s.from_config" % cls,
                                                             "covers": ("mojo_train.%s.from_config" % cls,)})())
    return out


# ---- Array ------------------------------------------------------------------------------------

ARRAY_SHAPE = st.one_of(st.integers(0, 5), st.lists(st.integers(0, 4), max_size=3).map(tuple))
ARRAY_SHAPE_BAD = bad(-1, (2, -1), 2.5, "3", (True,), None, (2.0,)) + bad((2 ** 40,), (2 ** 62, 2 ** 62), 2 ** 63,
                                                                         extra=("MemoryError",))
DTYPE_BAD = bad("float16", "f4", None, 3, "bogus", np.float32)


def _shape_tuple(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


class ArrayCtor(FnTarget):
    """Array(shape, dtype), Array.zeros, Array.empty: a zero-filled (empty: any) Array."""

    numeric_mode = False
    params = (Scalar("shape", ARRAY_SHAPE, ARRAY_SHAPE_BAD),
              Scalar("dtype", st.sampled_from(ARRAY_DTYPES), DTYPE_BAD, optional=True))

    def check(self, c):
        a, dtype = c.result, c.lit("dtype", "float32")
        shape = _shape_tuple(c.lit("shape"))
        assert a.shape == shape and a.dtype == dtype and a.nbytes == count(shape) * np.dtype(dtype).itemsize
        if self.fn != "Array.empty":
            assert not any(a.tobytes()), "not zero-filled"


class FromList(FnTarget):
    name, fn, covers = "Array.from_list", "Array.from_list", ("mojo_train.Array.from_list",)
    numeric_mode = False
    params = (Scalar("values", st.lists(st.one_of(st.integers(0, 100), st.floats(-1e3, 1e3)), max_size=6), ()),
              Scalar("dtype", st.sampled_from(ARRAY_DTYPES), DTYPE_BAD, optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        values = list(ex.get("values")[1])
        dtype = ex.get("dtype")[1] if ex.has("dtype") else "float32"
        if dtype not in ("float32", "float64") and any(isinstance(v, float) for v in values):
            ex.fault(("values", "dtype"), "floats for %s" % dtype)
        if draw(st.integers(0, 3)) == 0:
            bad_value = draw(st.sampled_from(("1", None, [1], 10 ** 400) + ((10 ** 39,) if dtype == "float32" else ())
                                             if dtype.startswith("float") else
                                             ("1", None, [1], 1.5, 2 ** 64, -1 if dtype.startswith("u") else 2 ** 70)))
            values.append(bad_value)
            ex.put("values", ("lit", values))
            ex.fault(("values", "dtype"), "an element %r" % (bad_value,))
        elif draw(st.integers(0, 5)) == 0:
            ex.put("values", ("lit", draw(st.sampled_from((3, None, 1.5)))))
            ex.fault("values", "not an iterable")

    def check(self, c):
        dtype = c.lit("dtype", "float32")
        want = np.array(c.lit("values"), dtype=dtype)
        assert c.result.shape == want.shape and c.result.tobytes() == want.tobytes()


class FromBytes(FnTarget):
    name, fn, covers = "Array.from_bytes", "Array.from_bytes", ("mojo_train.Array.from_bytes",)
    numeric_mode = False
    params = (Scalar("data", st.none(), ()), Scalar("shape", ARRAY_SHAPE, ARRAY_SHAPE_BAD),
              Scalar("dtype", st.sampled_from(ARRAY_DTYPES), DTYPE_BAD, optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        dtype = ex.get("dtype")[1] if ex.has("dtype") else "float32"
        n = count(_shape_tuple(ex.get("shape")[1])) * np.dtype(dtype).itemsize
        data = bytes(draw(st.binary(min_size=n, max_size=n)))
        how = draw(st.sampled_from((None, None, "short", "long", "int", "str", "list")))
        if how in ("short", "long"):
            data = data[:-1] if how == "short" and n else data + b"\x00"
        elif how == "int":
            data = n                          # bytearray(n) would be n zero bytes: an int is no data
        elif how == "str":
            data = "x" * n
        elif how == "list":
            data = list(data)                 # a list of byte values is a buffer of bytes for bytearray()
            how = None
        if how:
            ex.fault(("data", "shape") if how in ("short", "long") else "data", "data: %s" % how)
        ex.put("data", ("lit", data))

    def check(self, c):
        assert c.result.tobytes() == bytes(c.lit("data")) and c.result.shape == _shape_tuple(c.lit("shape"))


class AnyBuffer(F32):
    """A buffer of any Array dtype (Array.from_buffer's obj): bytes are a uint8 buffer there, not
    the "not a buffer" fault they are for a float32 argument (the long fuzz run, 2026-12-03)."""
    takes_bytes = True


class FromBuffer(FnTarget):
    name, fn, covers = "Array.from_buffer", "Array.from_buffer", ("mojo_train.Array.from_buffer",)
    numeric_mode = False
    dims = {"*S": (0, 3, 1, 4, (0,))}
    params = (AnyBuffer("obj", ("*S",), finite=False, strided_ok=True,
                  bad_dtypes=("float16", "bool", "complex64", "int16", "int8", "uint64", "float32_be")),
              Scalar("dtype", st.sampled_from((None, "float32")), bad("float16", "f4", 3, "bogus", np.float32, "int32",
                                                                          "float64"), optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        spec = ex.get("obj")
        if draw(st.integers(0, 2)) == 0 and spec[0] == "buf":      # another dtype, any layout: copied as it is
            dtype = draw(st.sampled_from(("float64", "int32", "int64", "uint8", "uint32")))
            kind = draw(st.sampled_from(("numpy", "numpy_strided", "array", "readonly")))
            ex.put("obj", with_field(spec, dtype=dtype, kind=kind, fill=("ids", 0, 9)))
            given = ex.get("dtype")[1] if ex.has("dtype") else None
            if given == dtype:      # a "bad" dtype drawn for float32 that is this buffer's own: no fault
                self._own_dtype_is_no_fault(ex)
            elif given is not None:
                ex.fault(("dtype", "obj"), "dtype %r for a %s buffer" % (given, dtype))
        spec = ex.get("obj")          # as it stands now
        if spec[3] == "torch_strided" or spec[0] == "buf" and spec[3] == "device":
            ex.fault("obj", "a strided torch tensor or device memory")

    def one_fault(self, draw, ctx, dims, ex):
        spec = ex.get("obj")
        if spec and spec[0] == "buf" and not ex.faulted("obj") and draw(st.integers(0, 3)):
            how = draw(st.sampled_from(("type", "released", "float16", "torch_strided")))
            if how == "torch_strided" and "torch_strided" not in ctx.kinds:
                return False
            ex.put("obj", {"type": ("lit", "abc"), "released": with_field(spec, kind="released"),
                           "float16": with_field(spec, dtype="float16", kind="numpy"),
                           "torch_strided": with_field(spec, kind="torch_strided")}[how])
            if how != "torch_strided" or count(spec[2]) >= 2:
                ex.fault("obj", how)
            return True
        done = FnTarget.one_fault(self, draw, ctx, dims, ex)
        self._own_dtype_is_no_fault(ex)
        return done

    @staticmethod
    def _own_dtype_is_no_fault(ex):
        """A "bad" dtype (bad for float32) that is the buffer's own is no fault, whether it was
        drawn before the buffer's dtype (relate) or after it (one_fault; the thirteenth session's
        long run met dtype='float64' for a float64 buffer)."""
        spec, given = ex.get("obj"), ex.get("dtype")[1] if ex.has("dtype") else None
        if spec and spec[0] == "buf" and given is not None and given == spec[1]:
            ex.faults = [f for f in ex.faults if f[0] != ("dtype",)]

    def check(self, c):
        want = c_order(c.before("obj"))
        assert c.result.shape == want.shape and c.result.tobytes() == want.tobytes(), "not a copy of obj"
        assert c.result.dtype == str(want.dtype), "dtype %s, obj has %s" % (c.result.dtype, want.dtype)


class ArrayMethod(MethodTarget):
    """A method of an Array built from ``setup`` (a shape, a dtype, values)."""

    def draw_setup(self, draw, ctx):
        shape = draw(st.lists(st.integers(0, 4), max_size=3).map(tuple))
        return {"spec": buf(draw(st.sampled_from(ARRAY_DTYPES)), shape, "Array", ("ids", 0, 9), draw(st.integers(0, 99)))}, \
            {"shape": shape}

    def make(self, setup, built, numeric_mode):
        arr, _ = build(setup["spec"], built, "self")
        return Subject(arr, values=np.array(host(arr)))

    def state(self, subject):
        return subject.obj.tobytes()


class Reshape(ArrayMethod):
    name, method, covers = "Array.reshape", "reshape", ("mojo_train.Array.reshape",)

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        n = count(dims["shape"])
        target = [d for d in (1, 2, 3, 4, 6) if n % d == 0] if n else [0]
        shape = [draw(st.sampled_from(target))] if n else [0, draw(st.integers(0, 3))]
        shape.append(n // shape[0] if shape[0] else 0)
        if draw(st.booleans()) and shape[0]:
            shape[1] = -1
        how = draw(st.sampled_from((None, None, "product", "two", "negative", "type")))
        if how == "product":
            shape[0] += 1
        elif how == "two":
            shape = [-1, -1]
        elif how == "negative":
            shape[0] = -2
        elif how == "type":
            shape[0] = draw(st.sampled_from((1.5, "2", None)))
        if not _reshape_ok(shape, n):
            ex.fault("shape", "reshape to %r" % (shape,))
        if draw(st.booleans()):
            ex.add("shape", ("lit", tuple(shape)), False)
        else:
            for i, d in enumerate(shape):
                ex.add("d%d" % i, ("lit", d), False)
        return ex.desc()

    def names_in_refusal(self, desc):
        """The shape comes as reshape(*shape): the refusal names it as shape or as what it reshapes into."""
        return ["shape", "reshape"]

    def check(self, c):
        r = c.result
        assert r.size == c.subject.obj.size and r.address == c.subject.obj.address and r.tobytes() == c.subject.obj.tobytes()


def _reshape_ok(shape, n):
    """Whether ``shape`` (one -1 allowed) holds exactly ``n`` elements."""
    if any(isinstance(d, bool) or not isinstance(d, int) for d in shape) or shape.count(-1) > 1 or \
            any(d < -1 for d in shape):
        return False
    known = count([d for d in shape if d != -1])
    return known == n if -1 not in shape else known > 0 and n % known == 0


class Conversions(ArrayMethod):
    """memview, tolist, tobytes, copy: the values, as numpy has them."""

    name = "Array conversions"
    covers = tuple("mojo_train.Array.%s" % m for m in ("memview", "tolist", "tobytes", "copy"))

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        ex.add("method", ("lit", draw(st.sampled_from(("memview", "tolist", "tobytes", "copy")))), False)
        if draw(st.integers(0, 5)) == 0:
            ex.add("extra", ("lit", 1), False)
            ex.fault(("extra", "method", "memview", "tolist", "tobytes", "copy"), "an extra argument")
        return ex.desc()

    def call(self, subject, args, kwargs):
        return getattr(subject.obj, args[0])(*args[1:])

    def check(self, c):
        values, method = c.subject.before["values"], c.args["method"]
        r = c.result
        if method == "tolist":
            assert r == values.tolist(), "tolist"
        elif method == "tobytes":
            assert r == values.tobytes()
        elif method == "copy":
            assert r.tobytes() == values.tobytes() and r.address != c.subject.obj.address or not values.size
        else:
            assert r.tobytes() == values.tobytes()


class Item(ArrayMethod):
    """a[index] and a[index] = value on a 1-d Array: out-of-range and extreme indices."""

    writes = ("self",)

    def draw_setup(self, draw, ctx):
        n = draw(st.integers(0, 5))
        dtype = draw(st.sampled_from(ARRAY_DTYPES))
        two_d = draw(st.integers(0, 7)) == 0
        return {"spec": buf(dtype, (n, 2) if two_d else (n,), "Array", ("ids", 0, 9), 1)}, {"n": n, "dtype": dtype,
                                                                                            "two_d": two_d}

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        n = dims["n"]
        index = draw(st.one_of(st.integers(-n, n - 1) if n else st.just(0), st.sampled_from(
            (n, -n - 1, 2 ** 63, -2 ** 63, 2 ** 100, 1.5, "0", None, slice(0, 1), True, np.int64(0)))))
        valid_int = isinstance(index, (int, np.integer)) and not isinstance(index, bool) and -n <= index < n
        if dims["two_d"]:
            ex.fault(("index", "indexing"), "a 2-d Array")
        elif isinstance(index, bool):
            if not -n <= int(index) < n:
                ex.fault("index", "index %r" % (index,))
        elif not valid_int:
            ex.fault("index", "index %r" % (index,))
        ex.add("index", ("lit", index), False)
        if self.method == "__setitem__":
            value = draw(st.one_of(st.integers(0, 200), st.floats(-10, 10), st.sampled_from(("1", None, 2 ** 64, -1))))
            fits = (isinstance(value, (int, float)) and not isinstance(value, bool) and
                    (dims["dtype"].startswith("float") or isinstance(value, int) and
                     np.iinfo(dims["dtype"]).min <= value <= np.iinfo(dims["dtype"]).max))
            if not fits:
                ex.fault("value", "value %r for %s" % (value, dims["dtype"]))
            ex.add("value", ("lit", value), False)
        return ex.desc()

    def names_in_refusal(self, desc):
        """a[i] = v names no argument: the refusal names the index or the value (its repr)."""
        return ["index", "indexing", "0-d", "1-d"] + [repr(s[1]) for n, s, _ in desc["args"]]

    def check(self, c):
        values = c.subject.before["values"].copy()
        i = int(c.args["index"])
        if self.method == "__getitem__":
            assert c.result == values[i].item(), "a[%d] is %r, not %r" % (i, c.result, values[i])
        else:
            values[i] = c.args["value"]
            assert c.subject.obj.tobytes() == values.tobytes()


# ---- device memory (GPU vendors) --------------------------------------------------------------

class ToDevice(FnTarget):
    name, fn, covers = "to_device", "to_device", ("mojo_train.to_device",)
    device_only = True
    dims = {"*S": (0, 3, 1, 4, (0,))}
    params = (F32("x", ("*S",), finite=False, bad_dtypes=("float16", "bool", "complex64", "int16", "float32_be")),)

    def check(self, c):
        assert isinstance(c.result, __import__("mojo_train").DeviceArray)
        assert host(c.result).tobytes() == c_order(c.before("x")).tobytes(), "not a copy of x"


class DeviceArrayCtor(ArrayCtor):
    device_only = True
    numeric_mode = True

    def check(self, c):
        shape = _shape_tuple(c.lit("shape"))
        assert c.result.shape == shape and c.result.dtype == c.lit("dtype", "float32")
        if self.fn == "DeviceArray":
            assert not any(c.result.to_host().tobytes()), "not zero-filled"


class DeviceMethod(MethodTarget):
    """copy_from, reshape, to_host of a DeviceArray."""

    device_only = True

    def draw_setup(self, draw, ctx):
        shape = draw(st.lists(st.integers(0, 4), max_size=3).map(tuple))
        return {"spec": buf("float32", shape, "device", "unit", draw(st.integers(0, 99)))}, {"*S": shape, "shape": shape}

    def make(self, setup, built, numeric_mode):
        arr, _ = build(setup["spec"], built, "self")
        return Subject(arr, values=host(arr))

    def state(self, subject):
        return subject.obj.to_host().tobytes()


class CopyFrom(DeviceMethod):
    name, method, covers = "DeviceArray.copy_from", "copy_from", ("mojo_train.DeviceArray.copy_from",)
    params = (F32("host", ("*S",), finite=False),)

    def check(self, c):
        assert c.result is c.subject.obj and c.result.to_host().tobytes() == c_order(c.before("host")).tobytes()

    def writes_for(self, desc):
        return ("self",)


class DeviceReshape(DeviceMethod):
    name, method, covers = "DeviceArray.reshape", "reshape", ("mojo_train.DeviceArray.reshape",)
    draw_args = Reshape.draw_args

    def check(self, c):
        assert c.result.size == c.subject.obj.size and c.result.ptr == c.subject.obj.ptr


class ToHost(DeviceMethod):
    name, method, covers = "DeviceArray.to_host", "to_host", ("mojo_train.DeviceArray.to_host",)
    params = ()

    def check(self, c):
        assert c.result.tobytes() == c.subject.before["values"].tobytes()


# ---- the Embedding layer ----------------------------------------------------------------------

TORCH_OPTIONS = {"max_norm": 1.0, "norm_type": 1.0, "scale_grad_by_freq": True, "sparse": True, "_weight": None,
                 "device": "cpu", "dtype": "float32"}


class EmbeddingCtor(FnTarget):
    name, fn, covers = "Embedding", "Embedding", ("mojo_train.Embedding",)
    dims = {"V": (1, 5, ()), "d": (1, 4, ())}
    params = (Scalar("num_embeddings", lambda dims: st.just(dims["V"]), int_bad(1)),
              Scalar("embedding_dim", lambda dims: st.just(dims["d"]), int_bad(1)),
              Scalar("padding_idx", lambda dims: st.one_of(st.none(), st.integers(-dims["V"], dims["V"] - 1)),
                     bad(1.5, True, "0"), optional=True),
              F32("weight", ("V", "d"), finite=False, kw=True),
              Scalar("plan", st.sampled_from(("auto", "scan", "sort")), bad("fast", None, 1), kw=True, optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        how = draw(st.sampled_from(("weight", "weight", "generator", "both", "neither", "torch", "huge")))
        if how in ("generator", "both", "huge"):
            ex.add("generator", ("obj", "generator", draw(st.integers(0, 99))), True)
        if how in ("generator", "neither", "huge"):
            ex.drop("weight")
        if how == "huge":
            ex.put("num_embeddings", ("lit", 2 ** 40))
            ex.fault("num_embeddings", "a table of 2**40 rows", extra=("MemoryError",))
        elif how in ("both", "neither"):
            ex.fault(("weight", "generator"), how)
        elif how == "torch":
            name = draw(st.sampled_from(sorted(TORCH_OPTIONS)))
            ex.add(name, ("lit", TORCH_OPTIONS[name]), True)
            ex.fault(name, "torch's %s=" % name)
        pad = ex.get("padding_idx")
        if pad is not None and isinstance(pad[1], int) and not isinstance(pad[1], bool) and \
                not -dims["V"] <= pad[1] < dims["V"]:
            ex.fault("padding_idx", "outside the table")

    def check(self, c):
        layer = c.result
        v, d = int(c.lit("num_embeddings")), int(c.lit("embedding_dim"))
        if c.has("weight"):
            want = np.asarray(c.before("weight"), dtype=np.float32)
            assert layer.weight is not c.args["weight"], "the table is not a copy"
        else:
            import mojo_train as mt
            want = np.array(host(mt.Generator(c.args["generator"].seed, numeric_mode=c.mode).normal((v, d))))
            if layer.padding_idx is not None:
                want[layer.padding_idx] = 0.0
        assert_same_bits(layer.weight, want, "the table")


class FromPretrained(FnTarget):
    name, fn, covers = "Embedding.from_pretrained", "Embedding.from_pretrained", ("mojo_train.Embedding.from_pretrained",)
    dims = {"V": (1, 5, (0,)), "d": (1, 4, (0,))}
    params = (F32("embeddings", ("V", "d"), finite=False),
              Scalar("freeze", st.booleans(), BOOL_BAD, optional=True),
              Scalar("padding_idx", lambda dims: st.one_of(st.none(), st.integers(-max(dims["V"], 1), max(dims["V"] - 1, 0))),
                     bad(1.5, True, "0"), optional=True),
              Scalar("plan", st.sampled_from(("auto", "scan", "sort")), bad("fast", None, 1), kw=True, optional=True))

    def check(self, c):
        assert_same_bits(c.result.weight, np.asarray(c.before("embeddings"), dtype=np.float32), "the table")
        assert c.result.freeze == c.lit("freeze", True)


def draw_layer(draw, ctx):
    v, d = draw(st.integers(1, 5)), draw(st.integers(1, 4))
    setup = {"V": v, "d": d, "padding_idx": draw(st.one_of(st.none(), st.integers(-v, v - 1))),
             "plan": draw(st.sampled_from(("auto", "scan", "sort"))), "freeze": draw(st.integers(0, 7)) == 0,
             "seed": draw(st.integers(0, 99))}
    return setup, {"V": v, "d": d, "*I": tuple(draw(st.lists(st.integers(1, 3), max_size=2)))}


class LayerMethod(MethodTarget):
    """A method of an Embedding layer drawn by ``draw_layer``."""

    def draw_setup(self, draw, ctx):
        return draw_layer(draw, ctx)

    def make(self, setup, built, numeric_mode):
        import mojo_train as mt
        table, _ = build(buf("float32", (setup["V"], setup["d"]), "Array", "unit", setup["seed"]), built)
        layer = mt.Embedding.from_pretrained(table, freeze=setup["freeze"], padding_idx=setup["padding_idx"],
                                             plan=setup["plan"], numeric_mode=numeric_mode)
        return Subject(layer, table=np.array(host(layer.weight)))

    def state(self, subject):
        return host(subject.obj.weight).tobytes(), subject.obj.padding_idx, subject.obj.freeze


class LayerForward(LayerMethod):
    name, method = "Embedding.forward", "forward"
    covers = ("mojo_train.Embedding.forward",)
    params = (Ids("ids", ("*I",), "V"), Scalar("device", st.just(False), bad(1, "yes", None), optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        if draw(st.integers(0, 5)) == 0:
            ex.add("device", ("lit", True), False)
            if not ctx.device:
                ex.fault("device", "device=True on a vendor without device memory")

    def check(self, c):
        table = c.subject.before["table"]
        ids = np.asarray(c.before("ids") if c.before("ids") is not None else c.lit("ids"), dtype=np.int64)
        assert_same_bits(c.result, table[ids.reshape(-1)].reshape(ids.shape + (table.shape[1],)), "forward")


class LayerBackward(LayerMethod):
    name, method = "Embedding.backward", "backward"
    covers = ("mojo_train.Embedding.backward",)
    loose_shapes = True
    writes = ("grad",)
    params = (Ids("ids", ("*I",), "V"), F32("dy", ("*I", "d")), F32("grad", ("V", "d"), role="out", optional=True))

    def relate(self, draw, ctx, dims, ex, side):
        if ex.setup["freeze"]:
            ex.fault(("freeze", "frozen"), "a frozen table", extra=("RuntimeError",))

    def check(self, c):
        from test_embedding import token_rule
        layer = c.subject.obj
        dy = np.asarray(c.before("dy"), dtype=np.float32)
        ids = np.asarray(c.before("ids") if c.before("ids") is not None else c.lit("ids"), dtype=np.int64).reshape(-1)
        grad = c.before("grad")
        want = token_rule(np, dy.reshape(-1, dy.shape[-1]), ids, layer.num_embeddings, layer.padding_idx,
                          None if grad is None else np.asarray(grad, dtype=np.float32))
        assert_same_bits(c.result, want, "backward")


class LayerWeight(LayerMethod):
    """Assigning the table: a copy of a float32 (V, d) buffer, or a refusal by name."""

    name, covers = "Embedding.weight", ("mojo_train.Embedding.weight",)
    keywords = False
    params = (F32("value", ("V", "d"), finite=False),)

    def call(self, subject, args, kwargs):
        subject.obj.weight = args[0]

    def names_in_refusal(self, desc):
        return ["weight", "value"]

    def check(self, c):
        assert_same_bits(c.subject.obj.weight, np.asarray(c.before("value"), dtype=np.float32), "the table")
        assert c.subject.obj.weight is not c.args["value"], "the table is not a copy"


class SaveLoad(LayerMethod):
    """save(path) then Embedding.load(path): the same layer back; a bad path, or a file damaged
    between the two, refused (OSError for a path the system refuses, ValueError naming the
    file for a damaged one)."""

    name = "Embedding.save/load"
    covers = ("mojo_train.Embedding.save", "mojo_train.Embedding.load")
    refusal_types = ("OSError",)

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        path = draw(st.sampled_from(("file", "file", "file", "bytes", "dir", "missing_dir", "none")))
        damage = draw(st.sampled_from((None, None, "truncate", "flip", "empty", "garbage")))
        damage_at = draw(st.integers(0, 2 ** 16))
        if path in ("dir", "missing_dir"):
            ex.fault("path", "path: %s" % path)
        elif path == "none":
            ex.fault("path", "path None")
        elif damage in ("truncate", "empty", "garbage"):
            ex.fault("path", "the file: %s" % damage)
        elif damage == "flip":           # (a bytes path is valid: file names may be str, bytes or PathLike)
            ex.fault("path", "a flipped byte", "soft")
        ex.add("path", ("lit", path), False)
        ex.add("damage", ("lit", (damage, damage_at)), False)
        return ex.desc()

    def call(self, subject, args, kwargs):
        import mojo_train as mt
        how, (damage, at) = args
        folder = tempfile.mkdtemp(prefix="mt-fuzz-")
        path = {"file": os.path.join(folder, "t.npz"), "bytes": os.path.join(folder, "t.npz").encode(),
                "dir": folder, "missing_dir": os.path.join(folder, "no", "t.npz"), "none": None}[how]
        try:
            subject.obj.save(path)
            if damage:
                _damage(path, damage, at)
            return mt.Embedding.load(path)
        finally:
            for name in os.listdir(folder):
                full = os.path.join(folder, name)
                (os.rmdir if os.path.isdir(full) else os.remove)(full)
            os.rmdir(folder)

    def names_in_refusal(self, desc):
        return ["path", "t.npz", "mt-fuzz-", "NoneType", "None"]

    def check(self, c):
        a, b = c.subject.obj, c.result
        assert (b.num_embeddings, b.embedding_dim, b.padding_idx, b.plan, b.freeze) == \
            (a.num_embeddings, a.embedding_dim, a.padding_idx, a.plan, a.freeze)
        assert host(b.weight).tobytes() == host(a.weight).tobytes()


def _damage(path, how, at):
    with open(path, "rb") as f:
        blob = f.read()
    blob = {"truncate": blob[:at % max(len(blob), 1)], "empty": b"", "garbage": b"PK\x03\x04" + bytes(64),
            "flip": blob[:at % len(blob)] + bytes([blob[at % len(blob)] ^ 0x5A]) + blob[at % len(blob) + 1:]}[how]
    with open(path, "wb") as f:
        f.write(blob)


# ---- the library's identity -------------------------------------------------------------------

class BackendInfo(FnTarget):
    name, fn, covers = "backend_info", "backend_info", ("mojo_train.backend_info",)
    numeric_mode = False
    refusal_types = ()

    @functools.cached_property
    def params(self):
        return (Scalar("numeric_mode", st.sampled_from((None, "identical", "IDENTICAL", " identical ")),
                       bad("bogus", 3, "", ["identical"]), kw=True, optional=True),
                Scalar("vendor", lambda dims: st.sampled_from((None, dims["vendor"], dims["vendor"].upper())),
                       bad("bogus", 3, "") + bad("metal", extra=("ImportError",)), kw=True, optional=True))

    def draw(self, draw, ctx):
        return self.draw_args(draw, ctx, {"vendor": ctx.vendor}, False)

    def check(self, c):
        from mojo_train._native import default_numeric_mode
        info = c.result
        assert info["numeric_mode"] == (c.lit("numeric_mode") or default_numeric_mode()).strip().lower()
        assert info["vendor"] == (c.lit("vendor") or info["vendor"]).lower() and info["abi_version"] >= 1, info


class MemoryStats(FnTarget):
    name, fn, covers = "memory_stats", "memory_stats", ("mojo_train.memory_stats",)
    params = (Scalar("reset", st.booleans(), bad("yes", 2, None, level="soft"), optional=True),)

    def check(self, c):
        stats = c.result
        assert set(stats) == {"current", "peak"} and 0 <= stats["current"] <= stats["peak"], stats


class ReleaseDeviceCache(FnTarget):
    """Returns None on every vendor (the cpu vendor and Metal keep nothing); tests/test_device.py
    checks what a GPU vendor keeps and gives back."""
    name, fn, covers = "release_device_cache", "release_device_cache", ("mojo_train.release_device_cache",)
    params = ()

    def check(self, c):
        assert c.result is None


class TransferBytes(FnTarget):
    name, fn, covers = "transfer_bytes", "transfer_bytes", ("mojo_train.transfer_bytes",)
    params = ()

    def check(self, c):
        up, down = c.result
        assert isinstance(up, int) and isinstance(down, int) and up >= 0 and down >= 0


# ---- deferred refusals (mojo_train.deferred): the switch and the synchronization -------------

class SetDeferredRefusals(FnTarget):
    """The switch takes True or False only; the oracle reads it back and turns it off again
    (no later example runs deferring)."""
    name, fn, covers = "set_deferred_refusals", "set_deferred_refusals", ("mojo_train.set_deferred_refusals",)
    params = (Scalar("on", st.booleans(), bad(1, 0, "yes", None, 1.0, [True])),)

    def check(self, c):
        import mojo_train
        nm = c.lit("numeric_mode")
        try:
            assert c.result is None
            assert mojo_train.deferred_refusals_enabled(numeric_mode=nm) is c.lit("on")
        finally:
            mojo_train.set_deferred_refusals(False, numeric_mode=nm)


class DeferredRefusalsEnabled(FnTarget):
    name, fn, covers = ("deferred_refusals_enabled", "deferred_refusals_enabled",
                        ("mojo_train.deferred_refusals_enabled",))
    params = ()

    def check(self, c):
        assert c.result is False   # no target leaves the switch on


class Synchronize(FnTarget):
    name, fn, covers = "synchronize", "synchronize", ("mojo_train.synchronize",)
    params = ()

    def check(self, c):
        assert c.result is None


# ---- the harness's own sabotaged targets (tests/test_fuzz.py proves the suite reports them) ----

class Sabotage(Target):
    """``harness.<how>``: a call of a float32 ``x`` (and a ``scale`` it ignores) that misbehaves
    as ``how`` says, and an example that must be reported as ``category`` (a finding of it)."""

    numeric_mode = False
    writes = ()

    def __init__(self, how, category, expect="either"):
        self.name, self.how, self.category, self.expect = "harness." + how, how, category, expect

    def draw(self, draw, ctx):
        return {"target": self.name, "numeric_mode": ctx.numeric_mode, "setup": None, "pool": {},
                "args": [("x", buf("float32", (4,), "numpy", "unit", draw(st.integers(0, 9))), False),
                         ("scale", ("lit", 1.0), True)],
                "faults": [(("x",), "sabotage", "hard" if self.expect == "refuse" else "soft", ())],
                "expect": self.expect, "blame": ["x"]}

    def call(self, subject, args, kwargs):
        x = args[0]
        if self.how == "abort":
            os.abort()
        if self.how == "partial_write":
            x[0] = 1234.5
            raise ValueError("mojo_train.harness: x is refused after a write")
        if self.how == "unclear_error":
            raise RuntimeError("boom")
        if self.how == "unnamed":
            raise ValueError("mojo_train.harness: something is wrong")
        if self.how == "writes_input":
            x[1] = -1.0
        return np.array(x, dtype=np.float32) + np.float32(1.0)

    def check(self, c):
        assert_same_bits(c.result, np.asarray(c.before("x"), dtype=np.float32), "harness result")


SABOTAGE = [Sabotage("abort", "crash"), Sabotage("partial_write", "partial write"),
            Sabotage("unclear_error", "unclear error"), Sabotage("unnamed", "unclear error"),
            Sabotage("writes_input", "wrong result"), Sabotage("wrong_result", "wrong result"),
            Sabotage("accepts_invalid", "wrong outcome", expect="refuse")]


def _array_targets():
    out = [FromList(), FromBytes(), FromBuffer(), Reshape(), Conversions()]
    for fn in ("Array", "Array.zeros", "Array.empty"):
        out.append(type("ArrayCtor", (ArrayCtor,), {"name": fn, "fn": fn, "covers": ("mojo_train.%s" % fn,)})())
    for method in ("__getitem__", "__setitem__"):
        out.append(type("Item", (Item,), {"name": "Array.%s" % method, "method": method,
                                          "covers": ("mojo_train.Array.%s" % method,)})())
    for fn in ("DeviceArray", "DeviceArray.empty"):
        out.append(type("DeviceArrayCtor", (DeviceArrayCtor,), {"name": fn, "fn": fn, "covers": ("mojo_train.%s" % fn,),
                                                                "params": ArrayCtor.params})())
    return out


MISC_TARGETS = _schedule_targets() + _array_targets() + [
    ToDevice(), CopyFrom(), DeviceReshape(), ToHost(), EmbeddingCtor(), FromPretrained(), LayerForward(),
    LayerBackward(), LayerWeight(), SaveLoad(), BackendInfo(), MemoryStats(), ReleaseDeviceCache(), TransferBytes(), SetDeferredRefusals(),
    DeferredRefusalsEnabled(), Synchronize()] + SABOTAGE
