"""Fuzz targets of scaled_dot_product_attention and its backward: hostile q, k, v (and dout, out,
lse), masks of every wrong dtype, rank and broadcast, is_causal with a mask, enable_gqa
mismatches, dropout_p outside [0, 1) (1 - 2**-30 rounds to 1 in float32), D = 0 and D > 128, NaN, inf
and bool scales, zero-size tensors with huge dimensions.

The oracle is tests/test_attention.py's ``Replay`` (attention.md step by step in Python, the
pinned exp and log compiled from mt_pinned.h by that file's ``pinned`` fixture), bit for bit,
its fma32 (tests/_helpers.py) giving IEEE's signed zeros.
Shapes stay tiny (T <= 9, D <= 8) so the Python replay is cheap; q, k and lse keep values of
magnitude <= 1 so that no score, probability or gradient overflows float32 (the replay's f32
refuses a finite double past FLT_MAX; overflowing scores are tests/test_attention.py's).
The backward's ``out`` and ``lse`` are drawn as any finite values (lse may be -inf): the
contract computes from whatever it is given, and the replay takes them as they are.
"""
import functools
import math

import numpy as np
from hypothesis import strategies as st

from _fuzz_build import STRIDED_KINDS, count, non_contiguous
from _fuzz_spec import (BOOL_BAD, F32, INF, NAN, NOT_A_BUFFER, FnTarget, Param, Scalar, bad, buf, draw_dims,
                        kinds_for, reals, with_field)
from _fuzz_targets import assert_same_bits, unread_values_soft

QK_FILLS = ("unit", "unit", "tiny", "zero")               # |q . k| <= D: no score overflows
V_FILLS = ("unit", "unit", "wide", "tiny", "zero")
LSE_FILLS = ("unit", "pos", "zero", "tiny")                # lse >= -1: exp(s - lse) stays finite
HUGE = 2 ** 40                                             # a dimension of a zero-size tensor
TOO_BIG = 1 << 16                                          # elements: a fault that would allocate more is dropped
MASK_BAD_DTYPES = ("float64", "float16", "int32", "int64", "uint8", "int8", "complex64", "float32_be", "bfloat16")


@functools.lru_cache(maxsize=None)
def pinned():
    """mt_expf and mt_logf compiled by tests/test_attention.py's ``pinned`` fixture (once per
    worker process, in a temporary directory)."""
    import atexit
    import pathlib
    import shutil
    import tempfile

    import pytest
    from test_attention import pinned as fixture
    work = tempfile.mkdtemp(prefix="mt_fuzz_pinned_")
    atexit.register(shutil.rmtree, work, True)

    class TmpPaths:
        def mktemp(self, name):
            path = pathlib.Path(work) / name
            path.mkdir()
            return path
    try:
        return getattr(fixture, "__wrapped__", fixture)(TmpPaths())
    except pytest.skip.Exception as exc:
        raise RuntimeError("the attention oracle compiles mt_pinned.h's exp and log: %s" % exc) from None


# ---- the arguments ----------------------------------------------------------------------------

class Mask(Param):
    """``attn_mask``: bool (True keeps a pair) or float32 (added; -inf leaves a pair out) of any
    shape broadcasting to (B, H, Tq, Tk) (``full``), of rank 1 or more. Its faults: a wrong
    dtype, not a buffer, released, strided, rank 0 (torch refuses it too) or one more than the
    call's, a dimension that does not broadcast, NaN or +inf in a float mask, is_causal=True
    with it."""

    kinds = None          # None: every host container; the torch adapter takes torch tensors only

    def __init__(self, name="attn_mask", **kw):
        super().__init__(name, **kw)

    @staticmethod
    def full(dims):
        return (dims["B"], dims["H"], dims["Tq"], dims["Tk"])

    def valid(self, draw, ctx, dims, side):
        full = self.full(dims)
        rank = draw(st.integers(1, len(full)))
        shape = [1 if draw(st.integers(0, 2)) == 0 else f for f in full[len(full) - rank:]]
        if count(shape) > TOO_BIG:             # a huge dimension of an empty call: the mask stays empty
            shape = list(full)
        dtype = "float32" if side == "device" else draw(st.sampled_from(("bool", "float32")))
        kinds = self.kinds or kinds_for("in", ctx, side)
        special = () if dtype == "bool" else tuple((draw(st.integers(0, 2 ** 16)), "-inf")
                                                   for _ in range(draw(st.integers(0, 2))))
        return buf(dtype, shape, draw(st.sampled_from(kinds)), "unit", draw(st.integers(0, 2 ** 16)), special)

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get(self.name)
        if not (isinstance(spec, tuple) and spec[0] == "buf"):
            return False
        shape = spec[2]
        options = ["dtype", "type", "rank", "dim", "dim", "causal"] + ([] if self.kinds else ["released"])
        if non_contiguous("numpy_strided", shape) and not self.kinds:
            options.append("strided")
        if spec[1] == "float32" and count(shape):
            options += ["nonfinite", "nonfinite"]
        if self.kinds and "torch_grad" in ctx.kinds and spec[1] == "float32":
            options.append("grad")
        how = draw(st.sampled_from(options))
        if how == "dtype":
            bad_dtype = draw(st.sampled_from([d for d in MASK_BAD_DTYPES if d != "bfloat16" or "torch" in ctx.kinds]))
            kind = "torch" if bad_dtype == "bfloat16" else spec[3] if spec[3] != "device" else "numpy"
            ex.put(self.name, with_field(spec, dtype=bad_dtype, kind=kind, special=(),
                                         fill=("ids", 0, 1) if bad_dtype[0] in "iu" else "unit"))
            ex.fault(self.name, "dtype %s" % bad_dtype)
        elif how == "type":
            ex.put(self.name, draw(st.sampled_from(NOT_A_BUFFER)))
            ex.fault(self.name, "not a buffer")
        elif how == "released":
            ex.put(self.name, with_field(spec, kind="released"))
            ex.fault(self.name, "released memoryview")
        elif how == "strided":
            strided = [k for k in STRIDED_KINDS if k in ctx.kinds]
            ex.put(self.name, with_field(spec, kind=draw(st.sampled_from(strided))))
            ex.fault(self.name, "not C-contiguous")
        elif how == "rank":
            new = () if draw(st.booleans()) else (1,) * (len(self.full(dims)) + 1 - len(shape)) + tuple(shape)
            ex.put(self.name, with_field(spec, shape=new))
            ex.fault(self.name, "rank %d" % len(new))
        elif how == "dim":
            full = self.full(dims)
            i = draw(st.integers(0, len(shape) - 1))
            f = full[len(full) - len(shape) + i]
            new = list(shape)
            new[i] = f + draw(st.sampled_from((1, 2))) if f else 2        # neither 1 nor the full size
            ex.put(self.name, with_field(spec, shape=tuple(new)))
            ex.fault(self.name, "shape %r does not broadcast to %r" % (tuple(new), full))
        elif how == "causal":
            if ex.has("is_causal"):
                ex.put("is_causal", ("lit", True))
            else:
                ex.add("is_causal", ("lit", True), True)
            ex.fault(("is_causal", self.name), "is_causal=True with a mask")
        elif how == "nonfinite":
            what = draw(st.sampled_from(("nan", "inf")))
            ex.put(self.name, with_field(spec, special=spec[6] + ((draw(st.integers(0, 2 ** 16)), what),)))
            ex.fault(self.name, "holds %s" % what)
        elif how == "grad":
            ex.put(self.name, with_field(spec, kind="torch_grad"))
            ex.fault(self.name, "a mask requiring grad")
        return True


class Lse(F32):
    """The forward's log-sum-exp handed to the backward: finite or -inf (a fully masked row);
    NaN and +inf are refused."""

    def __init__(self, name, shape, **kw):
        super().__init__(name, shape, finite=None, fills=LSE_FILLS, **kw)

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get(self.name)
        if isinstance(spec, tuple) and spec[0] == "buf" and count(spec[2]) and draw(st.integers(0, 3)) == 0:
            what = draw(st.sampled_from(("nan", "inf", "-inf", "-inf")))
            ex.put(self.name, with_field(spec, special=spec[6] + ((draw(st.integers(0, 2 ** 16)), what),)))
            if what != "-inf":
                ex.fault(self.name, "holds %s" % what)
            return True
        return super().fault(draw, ctx, dims, ex, target)


class GeneratorArg(Scalar):
    """``generator``: None or a mojo_train.Generator (dropout's, unused at dropout_p = 0)."""

    def __init__(self):
        super().__init__("generator", None, (), kw=True, optional=True)

    def valid(self, draw, ctx, dims, side):
        return ("lit", None) if draw(st.booleans()) else ("obj", "generator", draw(st.integers(0, 99)))

    def fault(self, draw, ctx, dims, ex, target):
        spec = draw(st.sampled_from((("lit", 7), ("lit", "default"), ("lit", 1.5), ("obj", "object"))))
        if ex.has(self.name):
            ex.put(self.name, spec)
        else:
            ex.add(self.name, spec, True)
        ex.fault(self.name, "generator %r" % (spec,))
        return True


def _flag(name, positional=False):
    return Scalar(name, st.booleans(), BOOL_BAD, kw=not positional, optional=True)


def dropout_param(positional=False):
    """dropout_p: 0 in the valid draws (the Replay oracle has no dropout; dropout's bits are
    tests/test_attention.py's replay and cards); 1 and everything outside [0, 1) refused."""
    return Scalar("dropout_p", st.sampled_from((0.0, 0, -0.0, np.float32(0.0))),
                  bad(1.0, -0.1, 1.5, 1 - 2.0 ** -30, NAN, INF, -INF, True, "0", None, [0.0], complex(0, 0)),
                  kw=not positional, optional=True)


def scale_param(positional=False):
    return Scalar("scale", st.one_of(st.none(), reals(-8.0, 8.0)),
                  bad(NAN, INF, -INF, 1e39, -1e39, 3.5e38, 10 ** 400, True, False, "0.5", [0.5], complex(1, 1)),
                  kw=not positional, optional=True)


QKV = (F32("q", ("B", "H", "Tq", "D"), fills=QK_FILLS), F32("k", ("B", "Hkv", "Tk", "D"), fills=QK_FILLS),
       F32("v", ("B", "Hkv", "Tk", "D"), fills=V_FILLS))
OPTIONS = (Mask(kw=True, optional=True), dropout_param(), _flag("is_causal"), scale_param(), _flag("enable_gqa"),
           GeneratorArg())


# ---- the targets ------------------------------------------------------------------------------

class AttentionTarget(FnTarget):
    """What the forward and backward share: the dimensions (H = Hkv * G, with rare draws of
    D > 128, of B = 0 or Hkv = 0, of a zero-size call with a huge dimension, of H no multiple of
    Hkv), enable_gqa set where H != Hkv, is_causal cleared where a mask is given, v sometimes k
    itself."""

    dims = {"B": (1, 2, ()), "Hkv": (1, 2, ()), "G": (1, 2, ()), "Tq": (1, 9, (0,)), "Tk": (1, 9, (0,)),
            "D": (1, 8, (0,))}          # B = 0 and Hkv = 0 are drawn in ``draw`` (fewer edge examples in all)
    names = {"q": "q", "k": "k", "v": "v"}        # the roles' argument names (the torch adapter's differ)

    def draw(self, draw, ctx):
        dims, edge = draw_dims(draw, self.dims)
        rare = draw(st.integers(0, 39))
        if rare < 2:
            dims["D"] = draw(st.sampled_from((129, 130, 256)))
        elif rare < 4:
            dims["B"] = 0
            dims[draw(st.sampled_from(("Tq", "Tk", "Hkv")))] = HUGE
        elif rare < 6:
            dims[draw(st.sampled_from(("B", "Hkv")))] = 0
        dims["H"] = dims["Hkv"] * dims["G"] + (1 if 6 <= rare < 8 and dims["Hkv"] >= 2 else 0)
        return self.draw_args(draw, ctx, dims, edge or 2 <= rare < 6)

    def relate(self, draw, ctx, dims, ex, side):
        q, k, v = (self.names[r] for r in ("q", "k", "v"))
        gqa = dims["H"] != dims["Hkv"]
        if gqa:
            (ex.put if ex.has("enable_gqa") else lambda n, s: ex.add(n, s, True))("enable_gqa", ("lit", True))
        if ex.has("attn_mask") and ex.get("attn_mask") != ("lit", None) and ex.has("is_causal"):
            ex.put("is_causal", ("lit", False))
        if dims["D"] > 128:
            ex.fault((q, k, v), "D = %d > 128" % dims["D"])
        elif dims["Hkv"] and dims["H"] % dims["Hkv"]:
            ex.fault((q, k, v, "enable_gqa"), "H = %d is no multiple of Hkv = %d" % (dims["H"], dims["Hkv"]))
        elif gqa and dims["Hkv"] and draw(st.integers(0, 5)) == 0:
            ex.put("enable_gqa", ("lit", False))
            ex.fault(("enable_gqa", q, k, v), "H = %d != Hkv = %d without enable_gqa" % (dims["H"], dims["Hkv"]))
        if side == "host" and draw(st.integers(0, 5)) == 0:
            ex.put(v, ("alias", k, None))          # v is k itself: inputs may share memory

    def one_fault(self, draw, ctx, dims, ex):
        """As the base, but a fault that would allocate a huge buffer (a changed dimension of a
        zero-size call) is dropped; a changed shape of q, k or v may be refused naming any of
        them or the mask (the heads' and the mask's rules read them together); without a pair
        (B, Tq or Tk zero) a NaN/+inf mask may be taken (the thirteenth session's long run)."""
        args, faults = list(ex.args), list(ex.faults)
        done = super().one_fault(draw, ctx, dims, ex)
        if done and any(s[0] == "buf" and count(s[2]) > TOO_BIG for _, s, _ in ex.args if isinstance(s, tuple) and s):
            ex.args, ex.faults = args, faults
            return False
        if 0 in (dims["B"], dims["Tq"], dims["Tk"]):      # no pair: no output reads the mask (attention.md)
            unread_values_soft(ex, "attn_mask")
        if done and ex.faults and ex.faults[-1][1].startswith("shape ") and ex.faults[-1][0][0] in self.names.values():
            names, kind, level, extra = ex.faults[-1]
            more = tuple(self.names.values()) + (("attn_mask",) if ex.has("attn_mask") else ())
            ex.faults[-1] = (tuple(dict.fromkeys(names + more)), kind, level, extra)
        return done

    def replay(self, c, q, k, v, dout=None):
        """test_attention.py's Replay of the call ``c`` on the values q, k, v (and dout)."""
        from test_attention import Replay
        b, h, tq, d = q.shape
        tk = k.shape[2]
        mask = c.before("attn_mask")
        keep = add = None
        if mask is not None and b * h * tq * tk:
            m4 = np.broadcast_to(np.asarray(mask), (b, h, tq, tk)).tolist()
            if np.asarray(mask).dtype == np.bool_:
                keep = lambda bb, hh, i, j: bool(m4[bb][hh][i][j])      # noqa: E731
            else:
                add = lambda bb, hh, i, j: float(m4[bb][hh][i][j])      # noqa: E731
        scale = c.lit("scale")
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        x = {"q": q, "k": k, "v": v, "dout": np.zeros(q.shape, np.float32) if dout is None else dout}
        return Replay(x, scale, pinned(), keep, add, bool(c.lit("is_causal", False)))


def _values(c, name):
    return np.asarray(c.before(name), dtype=np.float32)


def _flat(nested, shape):
    return np.array(nested, dtype=np.float64).astype(np.float32).reshape(shape)


class AttentionForward(AttentionTarget):
    name, fn = "scaled_dot_product_attention", "scaled_dot_product_attention"
    covers = ("mojo_train.scaled_dot_product_attention",)
    params = QKV + OPTIONS + (_flag("return_lse"),)

    def check(self, c):
        q, k, v = (_values(c, n) for n in ("q", "k", "v"))
        b, h, tq, d = q.shape
        replay = self.replay(c, q, k, v)
        rows = [[[replay.forward_row(bb, hh, i) for i in range(tq)] for hh in range(h)] for bb in range(b)]
        out = _flat([[[r[0] for r in rs] for rs in hs] for hs in rows], (b, h, tq, d))
        lse = _flat([[[r[1] for r in rs] for rs in hs] for hs in rows], (b, h, tq))
        if c.lit("return_lse", False):
            assert isinstance(c.result, tuple) and len(c.result) == 2, "return_lse=True returned %r" % (c.result,)
            assert_same_bits(c.result[0], out, "out")
            assert_same_bits(c.result[1], lse, "lse")
        else:
            assert_same_bits(c.result, out, "out")


class AttentionBackward(AttentionTarget):
    name, fn = "scaled_dot_product_attention_backward", "scaled_dot_product_attention_backward"
    covers = ("mojo_train.scaled_dot_product_attention_backward",)
    params = (F32("dout", ("B", "H", "Tq", "D"), fills=V_FILLS),) + QKV + (
        F32("out", ("B", "H", "Tq", "D"), fills=("unit", "tiny", "zero")), Lse("lse", ("B", "H", "Tq"))) + OPTIONS

    def check(self, c):
        q, k, v, dout, out, lse = (_values(c, n) for n in ("q", "k", "v", "dout", "out", "lse"))
        got = c.result
        assert isinstance(got, tuple) and len(got) == 3, "returned %r" % (got,)
        replay = self.replay(c, q, k, v, dout)
        dq, dk, dv = replay.backward(out.tolist(), lse.tolist())
        for name, g, want, shape in (("dq", got[0], dq, q.shape), ("dk", got[1], dk, k.shape),
                                     ("dv", got[2], dv, v.shape)):
            assert_same_bits(g, _flat(want, shape), name, nan_ok=True)     # lse = -inf: inf * 0 is a NaN


ATTENTION_TARGETS = [AttentionForward(), AttentionBackward()]
