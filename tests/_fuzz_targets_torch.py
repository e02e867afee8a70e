"""Fuzz targets of mojo_train.torch's functional entry points (issue 13): torch tensors, with and
without requires_grad; float16, bfloat16 and float64 refused; wrong shapes, non-tensors; the
attention's masks, flags and scale as tests/_fuzz_targets_attention.py draws them for the
native call (a mask must be a torch tensor without grad here; a strided one is read).

The oracle is the same call through the native mojo_train functions on the values the
tensors held before the call, bit for bit (mojo_train.torch's contract: it is those functions
under autograd). The modules' forward is fuzzed where a target below says so; the
constructors and dropout are exempt for now (tests/_fuzz_targets.py's table says why).
"""
import functools

from hypothesis import strategies as st

from _fuzz_build import count
from _fuzz_spec import (BOOL_BAD, F32, NAN, FnTarget, Ids, MethodTarget, Scalar, Subject, bad, buf, draw_dims,
                        shape_of, with_field)
from _fuzz_targets import APPROXIMATE, assert_same_bits, host, weight_unread_without_rows
from _fuzz_targets_attention import (QK_FILLS, V_FILLS, AttentionTarget, Mask, _flag as _attention_flag,
                                     dropout_param, scale_param)

TORCH_FLOAT_BAD = ("float16", "bfloat16", "float64")


class TorchF32(F32):
    """A float32 torch tensor (requires_grad or not); its faults: another float dtype, another
    shape, not a tensor, NaN or infinities (refused as the native function refuses them)."""

    def __init__(self, name, shape, grad=True, **kw):
        super().__init__(name, shape, bad_dtypes=TORCH_FLOAT_BAD, **kw)
        self.kinds = ("torch", "torch_grad") if grad else ("torch",)    # grad False: no gradient flows to it

    def valid(self, draw, ctx, dims, side):
        if self.nullable and draw(st.integers(0, 2)) == 0:
            return ("lit", None)
        return buf("float32", shape_of(self.shape, dims), draw(st.sampled_from(self.kinds)),
                   draw(st.sampled_from(self.fills)), draw(st.integers(0, 2 ** 16)))

    def fault(self, draw, ctx, dims, ex, target):
        from _fuzz_spec import tensor_fault
        spec = ex.get(self.name)
        if not (isinstance(spec, tuple) and spec[0] == "buf"):
            return False
        how = draw(st.sampled_from(("dtype", "dtype", "type", "shape", "nonfinite")))
        if how == "nonfinite" and not count(spec[2]):
            how = "dtype"
        return tensor_fault(draw, how, self, spec, ctx, dims, ex, target)


def _values(c, name):
    value = c.before(name)
    return None if value is None else host(value) if not hasattr(value, "dtype") else value


class TorchFn(FnTarget):
    """A mojo_train.torch.functional call; ``native`` is the mojo_train function it wraps."""

    native = None

    def call(self, subject, args, kwargs):
        import importlib
        module, fn = self.fn.rsplit(".", 1)
        return getattr(importlib.import_module("mojo_train." + module), fn)(*args, **kwargs)

    def expected(self, c):
        import mojo_train as mt
        args = [_values(c, p.name) for p in self.params if isinstance(p, F32)]
        out = getattr(mt, self.native)(*args, **self.native_options(c), numeric_mode=c.mode)
        return out[0] if isinstance(out, tuple) else out

    def native_options(self, c):
        return {}

    def check(self, c):
        import torch
        assert isinstance(c.result, torch.Tensor) and c.result.dtype == torch.float32, type(c.result)
        wants_grad = torch.is_grad_enabled() and any(
            getattr(c.args.get(p.name), "requires_grad", False) for p in self.params if isinstance(p, F32))
        assert c.result.requires_grad == wants_grad, "requires_grad %r" % c.result.requires_grad
        assert_same_bits(c.result.detach().numpy(), host(self.expected(c)), self.name)


def _inplace():
    return Scalar("inplace", st.just(False), BOOL_BAD, optional=True)


class TorchLinear(TorchFn):
    name, fn, native, covers = "torch.linear", "torch.functional.linear", "linear_forward", ("mojo_train.torch.linear",)
    dims = {"*L": (0, 2, 1, 3, (0,)), "K": (1, 4, (0,)), "N": (1, 4, (0,))}
    params = (TorchF32("input", ("*L", "K")), TorchF32("weight", ("N", "K")),
              TorchF32("bias", ("N",), nullable=True, optional=True))


class TorchSilu(TorchFn):
    name, fn, native, covers = "torch.silu", "torch.functional.silu", "silu_forward", ("mojo_train.torch.silu",)
    dims = {"*S": (0, 3, 1, 4, (0,))}
    params = (TorchF32("input", ("*S",), fills=("unit", "wide", "tiny", "zero")), _inplace())


class TorchRelu(TorchSilu):
    name, fn, native, covers = "torch.relu", "torch.functional.relu", "relu_forward", ("mojo_train.torch.relu",)


class TorchRmsNorm(TorchFn):
    name, fn, native, covers = "torch.rms_norm", "torch.functional.rms_norm", "rms_norm_forward", \
        ("mojo_train.torch.rms_norm",)
    dims = {"*L": (0, 2, 1, 3, ()), "D": (1, 5, (0,))}
    params = (TorchF32("input", ("*L", "D")),
              Scalar("normalized_shape", lambda dims: st.sampled_from(((dims["D"],), dims["D"], [dims["D"]])),
                     [((0,), "hard", ()), ("D", "hard", ("TypeError",)), ((1, 2, 3, 4), "hard", ())]),
              TorchF32("weight", ("D",), nullable=True, optional=True),
              Scalar("eps", st.one_of(st.none(), st.floats(1e-8, 1e-2)), [(-1.0, "hard", ()), ("x", "hard", ())],
                     optional=True))

    def native_options(self, c):
        return {"eps": c.lit("eps")}


class TorchIds(Ids):
    """Integer ids as a torch tensor (int64 or int32). A strided one is no fault: the adapter,
    as torch, reads it through a contiguous copy (mojo_train/torch/_tensors.py; the long fuzz
    run of 2026-12-03 counted its acceptance as a wrong outcome)."""

    strided_ok = True
    dtypes = ("int64", "int32")      # torch's embedding takes both

    def valid(self, draw, ctx, dims, side):
        spec = super().valid(draw, ctx, dims, side)
        return with_field(spec, kind="torch", dtype=draw(st.sampled_from(self.dtypes))) if spec[0] == "buf" else \
            buf("int64", shape_of(self.shape, dims), "torch", ("ids", 0, max(self.bound(dims) - 1, 0)), 1)


class TorchTargetIds(TorchIds):
    """Class indices for the adapter's cross_entropy: int64 only valid (torch refuses int32 targets:
    "expected target dtype to be Long or Byte"; so does the adapter since the fourteenth session)."""

    dtypes = ("int64",)


class TorchCrossEntropy(TorchFn):
    name, fn, covers = "torch.cross_entropy", "torch.functional.cross_entropy", ("mojo_train.torch.cross_entropy",)
    dims = {"N": (1, 5, (0,)), "V": (1, 6, (0,))}
    params = (TorchF32("input", ("N", "V")), TorchTargetIds("target", ("N",), "V", as_list=False),
              TorchF32("weight", ("V",), grad=False, kw=True, optional=True),
              Scalar("reduction", st.sampled_from(("mean", "sum")), [("MEAN", "hard", ()), (1, "hard", ())],
                     kw=True, optional=True),
              Scalar("label_smoothing", st.sampled_from((0.0, 0.1, 0.5)), [(1.5, "hard", ()), (-0.1, "hard", ())],
                     kw=True, optional=True))

    def one_fault(self, draw, ctx, dims, ex):
        """As the base; an input reshaped by a fault no longer matches the target drawn for the
        old shape, so a refusal may name either (the long fuzz run of 2026-12-03 met 'target must
        have shape (1, 1), got (1,)' for an input made (1, 1, 1)). Without rows a NaN/inf weight
        may be taken, as by cross_entropy (the thirteenth session's long run met it here)."""
        done = super().one_fault(draw, ctx, dims, ex)
        weight_unread_without_rows(ex, "input")
        reshaped = any("input" in f[0] and f[1].startswith("shape ") for f in ex.faults)
        if reshaped and ex.has("target") and not ex.faulted("target"):
            ex.fault(("target",), "target drawn for the input's shape before the fault")
        return done

    def expected(self, c):
        import mojo_train as mt
        opts = {k: c.lit(k) for k in ("reduction", "label_smoothing") if k in c.args}
        w = _values(c, "weight")
        return mt.cross_entropy(_values(c, "input"), _values(c, "target"), weight=w, numeric_mode=c.mode, **opts)

    def check(self, c):
        import numpy as np
        assert c.result.dtype.is_floating_point and c.result.shape == (), c.result.shape
        assert c.result.requires_grad == bool(getattr(c.args["input"], "requires_grad", False))
        assert_same_bits(c.result.detach().numpy().reshape(()), np.float32(self.expected(c)), self.name)


class TorchEmbedding(TorchFn):
    name, fn, covers = "torch.embedding", "torch.functional.embedding", ("mojo_train.torch.embedding",)
    dims = {"V": (1, 5, (0,)), "d": (1, 4, (0,)), "*I": (0, 2, 1, 3, (0,))}
    params = (TorchIds("input", ("*I",), "V", as_list=False), TorchF32("weight", ("V", "d"), finite=False))

    def expected(self, c):
        import mojo_train as mt
        return mt.embedding_forward(_values(c, "weight"), _values(c, "input"), numeric_mode=c.mode)

    def check(self, c):
        assert c.result.requires_grad == bool(c.args["weight"].requires_grad)
        assert_same_bits(c.result.detach().numpy(), host(self.expected(c)), self.name)


TORCH_TARGETS = [TorchLinear(), TorchSilu(), TorchRelu(), TorchRmsNorm(), TorchCrossEntropy(), TorchEmbedding()]


class TorchLayerNorm(TorchFn):
    name, fn, native, covers = "torch.layer_norm", "torch.functional.layer_norm", "layer_norm_forward", \
        ("mojo_train.torch.layer_norm",)
    dims = {"*L": (0, 2, 1, 3, ()), "D": (1, 5, (0,))}
    params = (TorchF32("input", ("*L", "D")),
              Scalar("normalized_shape", lambda dims: st.sampled_from(((dims["D"],), dims["D"], [dims["D"]])),
                     [((0,), "hard", ()), ("D", "hard", ("TypeError",)), ((1, 2, 3, 4), "hard", ())]),
              TorchF32("weight", ("D",), nullable=True, optional=True),
              TorchF32("bias", ("D",), nullable=True, optional=True),
              Scalar("eps", st.one_of(st.just(1e-5), st.just(0.0), st.floats(1e-8, 1e-2)),
                     bad(-1.0, "x", None, NAN, True), optional=True))

    def native_options(self, c):
        return {"eps": c.lit("eps", 1e-5)}


class TorchGelu(TorchFn):
    name, fn, native, covers = "torch.gelu", "torch.functional.gelu", "gelu_forward", ("mojo_train.torch.gelu",)
    dims = {"*S": (0, 3, 1, 4, (0,))}
    params = (TorchF32("input", ("*S",), fills=("unit", "wide", "tiny", "zero", "huge")), APPROXIMATE)

    def native_options(self, c):
        return {"approximate": c.lit("approximate", "none")}


class TorchMask(Mask):
    """A torch tensor mask (bool or float32; strided ones are made dense by the adapter); its
    faults add one requiring grad and drop the memoryview ones."""
    kinds = ("torch", "torch", "torch_strided")


class TorchMask3(TorchMask):
    """The mask of a (N, T, D) call: it broadcasts to (N, Tq, Tk)."""

    @staticmethod
    def full(dims):
        return (dims["B"], dims["Tq"], dims["Tk"])


class TorchAttention(AttentionTarget, TorchFn):
    """torch's (B, H, T, D) attention; its oracle is the native call on the same values."""
    name, fn, covers = "torch.scaled_dot_product_attention", "torch.functional.scaled_dot_product_attention", \
        ("mojo_train.torch.scaled_dot_product_attention",)
    names = {"q": "query", "k": "key", "v": "value"}
    shapes = (("B", "H", "Tq", "D"), ("B", "Hkv", "Tk", "D"))
    mask = TorchMask

    @functools.cached_property
    def params(self):
        q, kv = self.shapes
        return (TorchF32("query", q, fills=QK_FILLS), TorchF32("key", kv, fills=QK_FILLS),
                TorchF32("value", kv, fills=V_FILLS), self.mask("attn_mask", optional=True),
                dropout_param(positional=True), _attention_flag("is_causal", positional=True),
                scale_param(positional=True), _attention_flag("enable_gqa", positional=True))

    def native_args(self, c):
        """(q, k, v, attn_mask) as the native call takes them."""
        return [_values(c, n) for n in ("query", "key", "value", "attn_mask")]

    def expected(self, c):
        import mojo_train as mt
        q, k, v, mask = self.native_args(c)
        opts = {n: c.lit(n) for n in ("dropout_p", "is_causal", "scale", "enable_gqa") if c.has(n)}
        return mt.scaled_dot_product_attention(q, k, v, attn_mask=mask, numeric_mode=c.mode, **opts)


class TorchAttention3(TorchAttention):
    """(N, T, D) query, key and value: one head (the adapter adds it, and a mask's head axis)."""
    name = "torch.scaled_dot_product_attention (N, T, D)"
    dims = dict(AttentionTarget.dims, Hkv=(1, 1, ()), G=(1, 1, ()))
    shapes = (("B", "Tq", "D"), ("B", "Tk", "D"))
    mask = TorchMask3
    examples = 0.5

    def native_args(self, c):
        q, k, v, mask = TorchAttention.native_args(self, c)
        heads = [None if t is None else t[:, None] for t in (q, k, v)]
        return heads + [mask if mask is None or mask.ndim < 3 else mask[:, None]]

    def expected(self, c):
        return host(TorchAttention.expected(self, c))[:, 0]


TORCH_TARGETS += [TorchLayerNorm(), TorchGelu(), TorchAttention(), TorchAttention3()]


# ---- the nn modules' forward -------------------------------------------------------------------

class TorchModuleForward(MethodTarget):
    """``forward`` of a mojo_train.torch module built valid (its constructor is not fuzzed yet);
    the oracle is the functional target's, with the module's own parameters."""

    method = "forward"
    cls = None

    def draw_setup(self, draw, ctx):
        dims, _ = draw_dims(draw, self.dims)
        return {"cls": self.cls, "args": self.module_args(dims)}, dict(dims, side="host")

    def module_args(self, dims):
        return []

    def make(self, setup, built, numeric_mode):
        import importlib
        import torch
        torch.manual_seed(0)
        cls = getattr(importlib.import_module("mojo_train.torch"), setup["cls"])
        return Subject(cls(*setup["args"], numeric_mode=numeric_mode))

    def state(self, subject):
        return [bytes(p.detach().numpy().tobytes()) for p in subject.obj.parameters()]

    def check(self, c):
        import torch
        m = c.subject.obj
        wants_grad = torch.is_grad_enabled() and (c.args["input"].requires_grad or
                                                  any(p.requires_grad for p in m.parameters()))
        assert c.result.requires_grad == wants_grad, "requires_grad %r" % c.result.requires_grad
        assert_same_bits(c.result.detach().numpy(), host(self.expected(c, m)), self.name)


def _param(t):
    return None if t is None else t.detach().numpy()


class TorchLinearModule(TorchModuleForward):
    name, cls, covers = "torch.nn.Linear.forward", "Linear", ("mojo_train.torch.Linear.forward",)
    dims = TorchLinear.dims
    params = (TorchF32("input", ("*L", "K")),)

    def module_args(self, dims):
        return [dims["K"], dims["N"], bool(dims["N"] % 2)]

    def expected(self, c, m):
        import mojo_train as mt
        return mt.linear_forward(_values(c, "input"), _param(m.weight), _param(m.bias), numeric_mode=c.mode)


class TorchSiluModule(TorchModuleForward):
    name, cls, covers = "torch.nn.SiLU.forward", "SiLU", ("mojo_train.torch.SiLU.forward",)
    dims = TorchSilu.dims
    params = (TorchF32("input", ("*S",), fills=("unit", "wide", "tiny", "zero")),)
    native = "silu_forward"

    def expected(self, c, m):
        import mojo_train as mt
        return getattr(mt, self.native)(_values(c, "input"), numeric_mode=c.mode)


class TorchReluModule(TorchSiluModule):
    name, cls, covers, native = "torch.nn.ReLU.forward", "ReLU", ("mojo_train.torch.ReLU.forward",), "relu_forward"


class TorchRmsNormModule(TorchModuleForward):
    name, cls, covers = "torch.nn.RMSNorm.forward", "RMSNorm", ("mojo_train.torch.RMSNorm.forward",)
    dims = {"*L": (0, 2, 1, 3, ()), "D": (1, 5, ())}
    params = (TorchF32("input", ("*L", "D")),)

    def module_args(self, dims):
        return [dims["D"]]

    def expected(self, c, m):
        import mojo_train as mt
        out = mt.rms_norm_forward(_values(c, "input"), _param(m.weight), m.eps, numeric_mode=c.mode)
        return out[0] if isinstance(out, tuple) else out


TORCH_TARGETS += [TorchLinearModule(), TorchSiluModule(), TorchReluModule(), TorchRmsNormModule()]


class TorchLayerNormModule(TorchModuleForward):
    """LayerNorm(D, eps, elementwise_affine, bias) with its parameters redrawn U(-1, 1)."""
    name, cls, covers = "torch.nn.LayerNorm.forward", "LayerNorm", ("mojo_train.torch.LayerNorm.forward",)
    dims = {"*L": (0, 2, 1, 3, ()), "D": (1, 5, ())}
    params = (TorchF32("input", ("*L", "D")),)

    def draw_setup(self, draw, ctx):
        dims, _ = draw_dims(draw, self.dims)
        args = [dims["D"], draw(st.sampled_from((1e-5, 1e-3, 0.0))), draw(st.booleans()), draw(st.booleans())]
        return {"cls": self.cls, "args": args}, dict(dims, side="host")

    def make(self, setup, built, numeric_mode):
        import torch
        subject = super().make(setup, built, numeric_mode)
        with torch.no_grad():
            for p in subject.obj.parameters():
                p.uniform_(-1.0, 1.0)
        return subject

    def expected(self, c, m):
        import mojo_train as mt
        return mt.layer_norm_forward(_values(c, "input"), _param(m.weight), _param(m.bias), m.eps, numeric_mode=c.mode)


class TorchGeluModule(TorchModuleForward):
    name, cls, covers = "torch.nn.GELU.forward", "GELU", ("mojo_train.torch.GELU.forward",)
    dims = TorchGelu.dims
    params = (TorchF32("input", ("*S",), fills=("unit", "wide", "tiny", "zero", "huge")),)

    def draw_setup(self, draw, ctx):
        dims, _ = draw_dims(draw, self.dims)
        return {"cls": self.cls, "args": [draw(st.sampled_from(("none", "tanh")))]}, dict(dims, side="host")

    def expected(self, c, m):
        import mojo_train as mt
        return mt.gelu_forward(_values(c, "input"), m.approximate, numeric_mode=c.mode)


TORCH_TARGETS += [TorchLayerNormModule(), TorchGeluModule()]
