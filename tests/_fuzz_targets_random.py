"""Fuzz targets of the random streams: Generator's constructor, draws (uniform, normal, the four
initializers), dropout and its backward, the stream counter and the state dict
(tests/_fuzz_targets.py holds the registry and says how targets are written).

Oracle: tests/test_pinned.py's pure-Python Philox for every uniform draw and dropout mask, the
contract's float32 mappings replayed; normal draws within tests/test_random.py's Box-Muller
bound; the initializers' scalars by torch.nn.init's formulas (tests/test_random.py).
"""
import math

import numpy as np
from hypothesis import strategies as st

from _fuzz_spec import F32, FnTarget, MethodTarget, Scalar, Subject, WRITABLE_KINDS, bad, count, int_bad, real_bad, reals
from _fuzz_targets import assert_same_bits, f32_sat, host
from _helpers import f32

U64 = 2 ** 64


def word(seed, stream, i):
    from test_pinned import word_py
    return word_py(seed, stream, i)


def uniform_ref(seed, stream, offset, n, low, high):
    lo, hi = f32(low), f32(high)
    width = f32(hi - lo)
    return [f32(lo + f32(width * ((word(seed, stream, offset + i) >> 8) * 2.0 ** -24))) for i in range(n)]


def normal_ref_close(z, seed, stream, offset):
    """tests/test_random.py's bound: each standard normal within 1e-6 * max(1, radius) of
    Box-Muller in double on the stated Philox words."""
    for i, v in enumerate(z):
        j = offset + i
        block = [word(seed, stream, 4 * (j >> 2) + k) for k in range(4)]
        pair = (j & 3) >> 1
        u1 = ((block[2 * pair] >> 8) + 1) * 2.0 ** -24
        u2 = (block[2 * pair + 1] >> 8) * 2.0 ** -24
        rad = math.sqrt(-2.0 * math.log(u1))
        ref = rad * (math.sin if j & 1 else math.cos)(2.0 * math.pi * u2)
        assert abs(v - ref) <= 1e-6 * max(1.0, rad), "normal element %d: %r, Box-Muller gives %r" % (i, v, ref)


def _shape_valid():
    dims = st.lists(st.integers(0, 4), max_size=3)
    return st.one_of(st.integers(0, 6), dims.map(tuple), dims)


SHAPE_BAD = bad(-1, (2, -1), 2.5, "3", None, (True,), (2.0,)) + bad((2 ** 40,), (2 ** 62, 2 ** 62), 2 ** 63,
                                                                    extra=("MemoryError",))
UINT64 = st.one_of(st.integers(0, 2 ** 20), st.integers(0, U64 - 1 - 2 ** 20))
UINT64_BAD = int_bad(0, U64 - 1)


class GeneratorMethod(MethodTarget):
    """A method of a Generator (seed, counter drawn; the counter set by load_state_dict).
    ``takes_stream``: a call without ``stream=`` takes the counter's next stream id."""

    takes_stream = True

    def draw_setup(self, draw, ctx):
        return {"seed": draw(UINT64), "counter": draw(st.one_of(st.integers(0, 5), st.sampled_from((U64 - 2, U64 - 1))))}, {}

    def make(self, setup, built, numeric_mode):
        import mojo_train as mt
        g = mt.Generator(setup["seed"], numeric_mode=numeric_mode)
        g.load_state_dict({"seed": setup["seed"], "counter": setup["counter"]})
        return Subject(g, **g.state_dict())

    def state(self, subject):
        return subject.obj.state_dict()

    def stream_used(self, c):
        stream = c.lit("stream")
        s = c.subject.before["counter"] if stream is None else int(stream)
        assert c.subject.obj.counter == c.subject.before["counter"] + (stream is None), "the counter did not move right"
        return s

    def relate(self, draw, ctx, dims, ex, side):
        if self.takes_stream and ex.setup["counter"] == U64 - 1 and (ex.get("stream") is None or ex.get("stream")[1] is None):
            ex.fault("stream", "the counter is exhausted", extra=("RuntimeError",))
        if ex.has("device") and ex.get("device")[1] and not ctx.device:
            ex.fault("device", "device=True on a vendor without device memory")
        if ex.has("low") and ex.has("high") and not f32(float(ex.get("low")[1])) < f32(float(ex.get("high")[1])):
            ex.fault(("low", "high"), "low >= high")
        offset = ex.get("offset")
        if offset is not None and isinstance(offset[1], int) and offset[1] > U64 - 1 - 100:
            ex.fault(("offset", "n"), "offset + n past 2**64 - 1", "soft")


STREAM_BAD = int_bad(0, U64 - 1, optional=True)
DRAW_COMMON = (Scalar("stream", st.one_of(st.none(), UINT64), STREAM_BAD, kw=True, optional=True),
               Scalar("offset", UINT64, UINT64_BAD, kw=True, optional=True),
               Scalar("device", st.just(False), bad(1, "yes", None, level="soft"), kw=True, optional=True))


class Uniform(GeneratorMethod):
    name, method, covers = "Generator.uniform", "uniform", ("mojo_train.Generator.uniform",)
    params = (Scalar("shape", _shape_valid(), SHAPE_BAD),
              Scalar("low", reals(-2.0, 0.0), real_bad(None), kw=True, optional=True),
              Scalar("high", reals(0.5, 3.0), real_bad(None), kw=True, optional=True)) + DRAW_COMMON

    def check(self, c):
        s = self.stream_used(c)
        n = c.result.size
        want = uniform_ref(c.subject.before["seed"], s, int(c.lit("offset", 0)), n, float(c.lit("low", 0.0)),
                           float(c.lit("high", 1.0)))
        assert_same_bits(np.array(host(c.result)).reshape(-1), want, "uniform")


class Normal(GeneratorMethod):
    name, method, covers = "Generator.normal", "normal", ("mojo_train.Generator.normal",)
    params = (Scalar("shape", _shape_valid(), SHAPE_BAD),
              Scalar("mean", reals(-2.0, 2.0), real_bad(None), kw=True, optional=True),
              Scalar("std", reals(0.0, 3.0), real_bad(0.0), kw=True, optional=True)) + DRAW_COMMON

    def check(self, c):
        import mojo_train as mt
        s = self.stream_used(c)
        seed, offset = c.subject.before["seed"], int(c.lit("offset", 0))
        z = mt.Generator(seed, numeric_mode=c.mode).normal(c.result.size, stream=s, offset=offset).tolist()
        normal_ref_close(z, seed, s, offset)
        m, sd = f32(float(c.lit("mean", 0.0))), f32(float(c.lit("std", 1.0)))
        assert_same_bits(np.array(host(c.result)).reshape(-1), [f32(m + f32(sd * v)) for v in z], "normal")


def _fan(name):
    return Scalar(name, st.integers(1, 5000), bad(0, -3, 1.5, True, "3", None))


class Initializer(GeneratorMethod):
    """kaiming_uniform, kaiming_normal, xavier_uniform, xavier_normal: torch.nn.init's scalars,
    then the uniform or normal draw of the generator's next stream."""

    def check(self, c):
        from test_random import _torch_bounds
        fan_in, fan_out = int(c.lit("fan_in")), int(c.lit("fan_out", 1))
        a, gain = float(c.lit("a", math.sqrt(5.0) if self.method == "kaiming_uniform" else 0.0)), float(c.lit("gain", 1.0))
        scalar = _torch_bounds(fan_in, fan_out, a, gain)[self.method]
        import mojo_train as mt
        g = mt.Generator(c.subject.before["seed"], numeric_mode=c.mode)
        s = self.stream_used(c)
        n = c.result.size
        if self.method.endswith("uniform"):
            want = uniform_ref(g.seed, s, 0, n, -scalar, scalar)
        else:
            want = g.normal(n, 0.0, scalar, stream=s).tolist()
        assert_same_bits(np.array(host(c.result)).reshape(-1), want, self.method)


def _initializers():
    out = []
    for method in ("kaiming_uniform", "kaiming_normal", "xavier_uniform", "xavier_normal"):
        scalars = (_fan("fan_in"),) + ((Scalar("a", reals(0.0, 3.0), real_bad(None), optional=True),)
                                       if method.startswith("kaiming") else
                                       (_fan("fan_out"), Scalar("gain", reals(0.1, 3.0), real_bad(None) + bad(0.0, -1.0),
                                                                optional=True)))
        out.append(type(method, (Initializer,), {
            "name": "Generator." + method, "method": method, "covers": ("mojo_train.Generator." + method,),
            "params": (Scalar("shape", _shape_valid(), SHAPE_BAD),) + scalars + (DRAW_COMMON[2],)})())
    return out


def dropout_ref(x, seed, stream, offset, p32):
    scale = f32(1.0 / f32(1.0 - p32))
    return [f32_sat(float(v) * scale) if (word(seed, stream, offset + i) >> 8) * 2.0 ** -24 >= p32 else 0.0
            for i, v in enumerate(np.asarray(x, dtype=np.float32).reshape(-1))]


P_BAD = bad(1.0, 1.5, -0.1, 1.0 - 1e-9, True, "0.5", None, float("nan"), 10 ** 400)


class Dropout(GeneratorMethod):
    name, method, covers = "Generator.dropout", "dropout", ("mojo_train.Generator.dropout",)
    dims = {"*S": (0, 3, 1, 4, (0,))}
    writes = ("out",)
    params = (F32("x", ("*S",), fills=("unit", "wide", "tiny", "huge")), Scalar("p", reals(0.0, 0.95), P_BAD),
              Scalar("offset", UINT64, UINT64_BAD, optional=True),
              Scalar("stream", st.one_of(st.none(), UINT64), STREAM_BAD, optional=True),
              F32("out", ("*S",), role="out", finite=False, kw=True, optional=True))

    def draw_setup(self, draw, ctx):
        setup, _ = GeneratorMethod.draw_setup(self, draw, ctx)
        from _fuzz_spec import draw_dims
        return setup, draw_dims(draw, self.dims)[0]

    def relate(self, draw, ctx, dims, ex, side):
        GeneratorMethod.relate(self, draw, ctx, dims, ex, side)
        if ex.has("out") and side == "host" and draw(st.booleans()):
            x = ex.get("x")
            if x[3] not in WRITABLE_KINDS:
                ex.put("x", x[:3] + ("numpy",) + x[4:])         # x itself as out=: writable, not requiring grad
            ex.put("out", ("alias", "x", None))
        if ex.get("x")[4] == "huge":
            ex.fault((), "huge x: x * scale may overflow", "soft")

    def check(self, c):
        import mojo_train as mt
        y, key = c.result
        if c.lit("out") is not None:
            assert y is c.args["out"]
        s = self.stream_used(c)
        x = c.before("x")
        p32 = f32(float(c.lit("p")))
        offset = int(c.lit("offset", 0))
        assert_same_bits(np.array(host(y)).reshape(-1), dropout_ref(x, c.subject.before["seed"], s, offset, p32), "y")
        assert key == mt.DropoutKey(c.subject.before["seed"], s, offset, p32, int(np.size(x)), tuple(np.shape(x))), key


class DropoutBackward(GeneratorMethod):
    name, method, covers = "Generator.dropout_backward", "dropout_backward", ("mojo_train.Generator.dropout_backward",)
    dims = Dropout.dims
    writes = ("out",)
    params = (F32("dy", ("*S",)), F32("out", ("*S",), role="out", finite=False, kw=True, optional=True))
    takes_stream = False
    draw_setup = Dropout.draw_setup

    def relate(self, draw, ctx, dims, ex, side):
        from _fuzz_spec import shape_of
        shape = shape_of(("*S",), dims)
        fields = [draw(UINT64), draw(UINT64), draw(st.integers(0, 2 ** 40)), f32(draw(reals(0.0, 0.9))), count(shape),
                  draw(st.sampled_from((shape, None)))]
        if draw(st.integers(0, 2)) == 0:
            i, value = draw(st.sampled_from(((0, -1), (0, U64), (1, -5), (2, U64), (3, 1.0), (3, -0.5), (3, float("nan")),
                                             (4, count(shape) + 1), (5, shape + (1,)), (0, "7"))))
            fields[i] = value
            ex.fault(("key", ("seed", "stream", "offset", "p", "dy", "dy")[i]), "key field %d = %r" % (i, value))
        ex.add("key", ("obj", "dropout_key", tuple(fields)), False)
        if draw(st.integers(0, 7)) == 0:
            ex.put("key", ("lit", tuple(fields)))
            ex.fault("key", "a plain tuple, not a DropoutKey")
        ex.args = [a for a in ex.args if a[0] != "out"] + [a for a in ex.args if a[0] == "out"]

    def check(self, c):
        key = c.args["key"]
        if c.lit("out") is not None:
            assert c.result is c.args["out"]
        assert c.subject.obj.counter == c.subject.before["counter"], "dropout_backward took a stream"
        assert_same_bits(np.array(host(c.result)).reshape(-1),
                         dropout_ref(c.before("dy"), key.seed, key.stream, key.offset, key.p), "dx")


class GeneratorCtor(FnTarget):
    name, fn, covers = "Generator", "Generator", ("mojo_train.Generator",)
    params = (Scalar("seed", st.one_of(UINT64, UINT64.map(np.uint64)), UINT64_BAD),)

    def check(self, c):
        assert c.result.seed == int(c.lit("seed")) and c.result.counter == 0


class NextStream(GeneratorMethod):
    name, method, covers = "Generator.next_stream", "next_stream", ("mojo_train.Generator.next_stream",)
    params = ()
    refusal_types = ("RuntimeError",)      # a counter at 2**64 - 1 is exhausted (documented)

    def check(self, c):
        assert c.result == c.subject.before["counter"] and c.subject.obj.counter == c.result + 1


class GeneratorState(GeneratorMethod):
    takes_stream = False

    name, covers = "Generator.state_dict/load_state_dict", ("mojo_train.Generator.state_dict",
                                                            "mojo_train.Generator.load_state_dict")
    params = (Scalar("state", st.fixed_dictionaries({"seed": UINT64, "counter": UINT64}),
                     bad({"seed": 1}, {"seed": 1, "counter": 2, "x": 3}, {"seed": -1, "counter": 0},
                         {"seed": 0, "counter": U64}, {"seed": 1.0, "counter": 0}, {"seed": True, "counter": 0},
                         [1, 2], None, "state")),)

    def call(self, subject, args, kwargs):
        subject.obj.load_state_dict(*args, **kwargs)
        return subject.obj.state_dict()

    def names_in_refusal(self, desc):
        return ["state", "seed", "counter"]

    def check(self, c):
        assert c.result == c.args["state"], "state_dict() gives %r after loading %r" % (c.result, c.args["state"])



RANDOM_TARGETS = [GeneratorCtor(), Uniform(), Normal(), Dropout(), DropoutBackward(), NextStream(), GeneratorState()] \
    + _initializers()
