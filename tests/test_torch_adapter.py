"""mojo_train.torch: torch autograd Functions and nn.Modules over the native API.

Contract under test (mojo_train/torch/): every module's forward and every gradient autograd
computes are the bits of the native API called directly on the same tensors (every vendor x
numeric mode, CPU tensors and, where torch has CUDA and the vendor takes device buffers, CUDA
tensors); within tests/tolerances.py's bound of torch's own modules in float64; the modules
are torch's classes (init, state_dict keys, loadable both ways); half, bfloat16, float64,
autocast, two devices and bad shapes are refused naming them, with nothing written; a tensor
used twice gets the sum autograd forms, in its documented order (the consumers' backward
nodes in decreasing creation order), bit for bit the native ``add`` of the native gradients;
a tiny model's ``loss.backward()`` gives the bytes of a hand-written native version, the
same in a fresh process, and on CUDA the CPU oracle's.
"""
import gc
import hashlib
import os
import re
import subprocess
import sys

import pytest

import mojo_train as mt
from mojo_train import _native
from mojo_train.random import Generator

from _helpers import python_path

torch = pytest.importorskip("torch")
import mojo_train.torch as mtt  # noqa: E402  (imports torch)
from mojo_train.torch import _tensors  # noqa: E402
from mojo_train.torch import functional as F  # noqa: E402
from mojo_train.torch import nn  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- helpers ----------------------------------------------------------------------------------
def _need(mode, device, *features):
    """Skip unless the library has ``features`` and, for CUDA tensors, torch has CUDA and the
    vendor takes device buffers."""
    if device.type == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("torch has no CUDA here")
        features = features + ("device_buffers",)
    for feature in features:
        if not mode.has(feature):
            pytest.skip("this library has no %s (mt_features)" % feature)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    """torch's device of the tensors: "cuda:0" (a tensor's .device carries its index)."""
    return torch.device("cuda:0" if request.param == "cuda" else "cpu")


def _rand(shape, seed, low=-1.0, high=1.0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * (high - low) + low).to(device)


def _ids(shape, high, seed, device="cpu"):
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed)).to(device)


def _bits(x):
    """The float32 bit patterns of a torch tensor or a native result (Array, DeviceArray)."""
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().contiguous().view(torch.int32).flatten().tolist()
    if hasattr(x, "to_host"):
        x = x.to_host()
    return x.memview().cast("B").cast("i").tolist()


def _leaf(t):
    return t.detach().clone().requires_grad_()


def _np64(t):
    return t.detach().cpu().double().numpy()


# ---- bit for bit: the native API called directly ----------------------------------------------
def test_linear_and_its_gradients_are_the_native_api_bits(mode, device):
    _need(mode, device, "linear")
    x, dy = _leaf(_rand((2, 3, 5), 1, device=device)), _rand((2, 3, 4), 2, device=device)
    layer = nn.Linear(5, 4, numeric_mode=mode.numeric_mode).to(device)
    y = layer(x)
    y.backward(dy)
    want = mt.linear_forward(x, layer.weight, layer.bias, numeric_mode=mode.numeric_mode)
    dx, dw, db = mt.linear_backward(dy, x, layer.weight, need_bias_grad=True, numeric_mode=mode.numeric_mode)
    assert y.device == device and y.shape == (2, 3, 4)
    assert [_bits(y), _bits(x.grad), _bits(layer.weight.grad), _bits(layer.bias.grad)] == \
        [_bits(want), _bits(dx), _bits(dw), _bits(db)]


@pytest.mark.parametrize("shape, normalized, affine", [((4, 6), 6, True), ((2, 3, 4, 5), (4, 5), True),
                                                       ((3, 7), [7], False)])
def test_rms_norm_and_its_gradients_are_the_native_api_bits(mode, device, shape, normalized, affine):
    _need(mode, device, "rms_norm")
    x, dy = _leaf(_rand(shape, 3, device=device)), _rand(shape, 4, device=device)
    layer = nn.RMSNorm(normalized, eps=1e-5, elementwise_affine=affine, numeric_mode=mode.numeric_mode).to(device)
    if affine:
        with torch.no_grad():
            layer.weight.copy_(_rand(layer.weight.shape, 5, 0.5, 1.5))
    y = layer(x)
    y.backward(dy)
    d = x.shape[-1] * (x.shape[-2] if isinstance(normalized, tuple) else 1)
    rows, w = x.detach().reshape(-1, d), None if not affine else layer.weight.detach().reshape(d)
    want = mt.rms_norm_forward(rows, w, 1e-5, numeric_mode=mode.numeric_mode)
    dx, dw = mt.rms_norm_backward(dy.reshape(-1, d), rows, w, 1e-5, numeric_mode=mode.numeric_mode)
    assert _bits(y) == _bits(want) and _bits(x.grad) == _bits(dx)
    assert (layer.weight.grad.shape == layer.weight.shape and _bits(layer.weight.grad) == _bits(dw)) if affine \
        else dw is None


@pytest.mark.parametrize("shape, normalized, affine, bias", [((4, 6), 6, True, True), ((2, 3, 4, 5), (4, 5), True, False),
                                                             ((3, 7), [7], False, False)])
def test_layer_norm_and_its_gradients_are_the_native_api_bits(mode, device, shape, normalized, affine, bias):
    _need(mode, device, "layer_norm")
    x, dy = _leaf(_rand(shape, 3, device=device)), _rand(shape, 4, device=device)
    layer = nn.LayerNorm(normalized, elementwise_affine=affine, bias=bias, numeric_mode=mode.numeric_mode).to(device)
    if affine:
        with torch.no_grad():
            layer.weight.copy_(_rand(layer.weight.shape, 5, 0.5, 1.5))
            if bias:
                layer.bias.copy_(_rand(layer.bias.shape, 6))
    y = layer(x)
    y.backward(dy)
    d = x.shape[-1] * (x.shape[-2] if isinstance(normalized, tuple) else 1)
    flat = lambda t: None if t is None else t.detach().reshape(d)      # noqa: E731
    rows, w, b = x.detach().reshape(-1, d), flat(layer.weight), flat(layer.bias)
    want = mt.layer_norm_forward(rows, w, b, 1e-5, numeric_mode=mode.numeric_mode)
    dx, dw, db = mt.layer_norm_backward(dy.reshape(-1, d), rows, w, b, 1e-5, numeric_mode=mode.numeric_mode)
    assert _bits(y) == _bits(want) and _bits(x.grad) == _bits(dx)
    for p, g in ((layer.weight, dw), (layer.bias, db)):
        assert (p.grad.shape == p.shape and _bits(p.grad) == _bits(g)) if p is not None else g is None


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_and_its_gradient_are_the_native_api_bits(mode, device, approximate):
    _need(mode, device, "elementwise")
    x, dy = _leaf(_rand((5, 7), 7, -4.0, 4.0, device=device)), _rand((5, 7), 8, device=device)
    y = nn.GELU(approximate, numeric_mode=mode.numeric_mode)(x)
    y.backward(dy)
    want = mt.gelu_forward(x.detach(), approximate, numeric_mode=mode.numeric_mode)
    dx = mt.gelu_backward(dy, x.detach(), approximate, numeric_mode=mode.numeric_mode)
    assert _bits(y) == _bits(want) and _bits(x.grad) == _bits(dx)


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(mask="bool"), dict(mask="float", scale=0.3),
                                    dict(enable_gqa=True)])
def test_attention_and_its_gradients_are_the_native_api_bits(mode, device, kwargs):
    _need(mode, device, "attention")
    kwargs = dict(kwargs)
    kv_heads = 1 if kwargs.get("enable_gqa") else 2
    q = _leaf(_rand((2, 2, 5, 8), 9, device=device))
    k, v = _leaf(_rand((2, kv_heads, 7, 8), 10, device=device)), _leaf(_rand((2, kv_heads, 7, 8), 11, device=device))
    dout = _rand((2, 2, 5, 8), 12, device=device)
    kind = kwargs.pop("mask", None)
    mask = None if kind is None else (_rand((5, 7), 13, device=device) > -0.5 if kind == "bool"
                                      else _rand((5, 7), 13, device=device))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, numeric_mode=mode.numeric_mode, **kwargs)
    y.backward(dout)
    plain = [t.detach() for t in (q, k, v)]
    out, lse = mt.scaled_dot_product_attention(*plain, attn_mask=mask, return_lse=True,
                                               numeric_mode=mode.numeric_mode, **kwargs)
    grads = mt.scaled_dot_product_attention_backward(dout, *plain, out, lse, attn_mask=mask,
                                                     numeric_mode=mode.numeric_mode, **kwargs)
    assert y.device == device and _bits(y) == _bits(out)
    assert [_bits(t.grad) for t in (q, k, v)] == [_bits(g) for g in grads]


@pytest.mark.parametrize("kwargs", [dict(is_causal=True), dict(enable_gqa=True)])
def test_attention_dropout_and_its_gradients_are_the_native_api_bits(mode, device, kwargs):
    """dropout_p > 0 draws one stream of the given mojo_train.Generator, and the backward replays
    it: the native API's bits with a twin generator; the default generator when none is given."""
    _need(mode, device, "attention")
    kv_heads = 1 if kwargs.get("enable_gqa") else 2
    q = _leaf(_rand((2, 2, 5, 8), 19, device=device))
    k, v = _leaf(_rand((2, kv_heads, 70, 8), 20, device=device)), _leaf(_rand((2, kv_heads, 70, 8), 21, device=device))
    dout = _rand((2, 2, 5, 8), 22, device=device)
    g, twin = mt.Generator(31, numeric_mode=mode.numeric_mode), mt.Generator(31, numeric_mode=mode.numeric_mode)
    y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.3, generator=g, numeric_mode=mode.numeric_mode, **kwargs)
    y.backward(dout)
    plain = [t.detach() for t in (q, k, v)]
    out, lse, key = mt.scaled_dot_product_attention(*plain, return_lse=True, dropout_p=0.3, generator=twin,
                                                    numeric_mode=mode.numeric_mode, **kwargs)
    grads = mt.scaled_dot_product_attention_backward(dout, *plain, out, lse, dropout_key=key,
                                                     numeric_mode=mode.numeric_mode, **kwargs)
    assert g.counter == twin.counter == 1
    assert _bits(y) == _bits(out) and [_bits(t.grad) for t in (q, k, v)] == [_bits(x) for x in grads]
    undropped = F.scaled_dot_product_attention(*plain, numeric_mode=mode.numeric_mode, **kwargs)
    assert _bits(undropped) != _bits(y)
    F.scaled_dot_product_attention(*plain, dropout_p=0.3, numeric_mode=mode.numeric_mode, **kwargs)  # default generator


def test_an_expanded_attention_mask_is_broadcast_not_copied():
    """mask.expand(B, H, T, T) (stride 0 over B and H) gives its (T, T) mask's bits, and what the
    forward keeps for the backward is the (T, T) memory, not B*H copies of it."""
    q = _leaf(_rand((3, 4, 6, 8), 23))
    base = _rand((6, 6), 24)
    y = F.scaled_dot_product_attention(q, q, q, attn_mask=base.expand(3, 4, 6, 6))
    want = F.scaled_dot_product_attention(q.detach(), q.detach(), q.detach(), attn_mask=base)
    kept = [t for t in y.grad_fn.saved_tensors if t.dtype == torch.float32 and t.dim() == 4 and t.shape[-1] == 6]
    assert _bits(y) == _bits(want)
    assert len(kept) == 1 and kept[0].numel() == 36 and kept[0].data_ptr() == base.data_ptr(), \
        [(tuple(t.shape), t.numel()) for t in kept]
    y.backward(torch.ones_like(y))      # the backward takes the narrowed mask as well
    assert torch.isfinite(q.grad).all()
    # an expanded mask of other sizes is refused by the shape the caller gave, as torch refuses it
    for bad in (base.expand(5, 4, 6, 6), _rand((3, 1, 6, 6), 26).expand(3, 9, 6, 6), _rand((1, 6), 27).expand(9, 6)):
        with pytest.raises(ValueError, match=r"attn_mask of shape %s does not broadcast"
                                             % re.escape(repr(tuple(bad.shape)))):
            F.scaled_dot_product_attention(q.detach(), q.detach(), q.detach(), attn_mask=bad)


def test_attention_of_one_head_refuses_a_four_dimensional_mask_by_its_own_shape():
    q = _rand((2, 5, 8), 25)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: attn_mask of shape \(1, 1, 5, 5\) has 4 "
                                         r"dimensions; with 3-D query"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=torch.zeros(1, 1, 5, 5))


def test_attention_refuses_a_mask_that_wants_a_gradient():
    q = _rand((1, 1, 3, 4), 14)
    mask = torch.zeros(3, 3, requires_grad=True)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention: attn_mask requires grad"):
        F.scaled_dot_product_attention(q, q, q, attn_mask=mask)


@pytest.mark.parametrize("padding_idx", [None, 2, -1])
def test_embedding_and_its_gradient_are_the_native_api_bits(mode, device, padding_idx):
    _need(mode, device, "embedding")
    table = nn.Embedding(9, 4, padding_idx=padding_idx, numeric_mode=mode.numeric_mode).to(device)
    ids, dy = _ids((3, 5), 9, 6, device), _rand((3, 5, 4), 7, device=device)
    y = table(ids)
    y.backward(dy)
    dw = mt.embedding.embedding_backward(dy, ids, 9, padding_idx=padding_idx, numeric_mode=mode.numeric_mode)
    assert _bits(y) == _bits(mt.embedding.embedding_forward(table.weight, ids, numeric_mode=mode.numeric_mode))
    assert _bits(table.weight.grad) == _bits(dw)
    if padding_idx is not None:
        assert table.weight.grad[padding_idx].abs().sum().item() == 0.0


@pytest.mark.parametrize("op", ["silu", "relu"])
@pytest.mark.parametrize("inplace", [False, True])
def test_silu_and_relu_and_their_gradients_are_the_native_api_bits(mode, device, op, inplace):
    _need(mode, device, "elementwise")
    x0, dy = _leaf(_rand((5, 8), 8, -4.0, 4.0, device)), _rand((5, 8), 9, device=device)
    layer = getattr(nn, {"silu": "SiLU", "relu": "ReLU"}[op])(inplace=inplace, numeric_mode=mode.numeric_mode)
    x = x0 * 1.0                                       # not a leaf: in place is allowed
    y = layer(x)
    y.backward(dy)
    forward, backward = getattr(mt, op + "_forward"), getattr(mt, op + "_backward")
    assert _bits(y) == _bits(forward(x0, numeric_mode=mode.numeric_mode))
    assert _bits(x0.grad) == _bits(backward(dy, x0, numeric_mode=mode.numeric_mode))
    assert (y is x) == inplace


@pytest.mark.parametrize("inplace", [False, True])
def test_dropout_replays_the_generators_mask_from_its_key_and_stores_none(mode, device, inplace):
    _need(mode, device, "random")
    x0, dy = _leaf(_rand((6, 50), 10, device=device)), _rand((6, 50), 11, device=device)
    layer = nn.Dropout(0.3, inplace=inplace, generator=Generator(42, numeric_mode=mode.numeric_mode))
    y = layer(x0 * 1.0)
    assert y.grad_fn.saved_tensors == ()               # the key is kept, no mask
    y.backward(dy)
    ref = Generator(42, numeric_mode=mode.numeric_mode)
    want, key = ref.dropout(x0, 0.3)
    assert _bits(y) == _bits(want) and _bits(x0.grad) == _bits(ref.dropout_backward(dy, key))
    assert layer.generator.counter == 1 and 0.5 < (y != 0).float().mean().item() < 0.9
    assert layer.eval()(x0) is x0 and layer.generator.counter == 1


@pytest.mark.parametrize("options", [{}, {"reduction": "sum"}, {"label_smoothing": 0.1, "ignore_index": 3}])
def test_cross_entropy_and_its_gradient_are_the_native_api_bits(mode, device, options):
    _need(mode, device, "loss")
    logits, target = _leaf(_rand((7, 5), 12, -3.0, 3.0, device)), _ids((7,), 5, 13, device)
    loss = nn.CrossEntropyLoss(numeric_mode=mode.numeric_mode, **options)(logits, target)
    loss.backward()
    want, dlogits = mt.cross_entropy(logits, target, return_grad=True, numeric_mode=mode.numeric_mode, **options)
    assert loss.shape == () and loss.device == device and loss.item() == want
    assert _bits(logits.grad) == _bits(dlogits)


@pytest.mark.parametrize("case", ["class_weight", "probability_targets", "n_c_d_inputs"])
def test_cross_entropy_passes_what_the_native_loss_takes_through_unchanged(mode, device, case):
    _need(mode, device, "loss")
    logits, target, kwargs = _rand((6, 5), 18, -2.0, 2.0, device), _ids((6,), 5, 19, device), {}
    if case == "class_weight":
        kwargs["weight"] = _rand((5,), 20, 0.5, 2.0, device)
    elif case == "probability_targets":
        target = torch.softmax(_rand((6, 5), 21, -2.0, 2.0), dim=1).to(device)
    else:
        logits, target = _rand((2, 5, 3), 22, -2.0, 2.0, device), _ids((2, 3), 5, 23, device)
    x = _leaf(logits)
    loss = nn.CrossEntropyLoss(numeric_mode=mode.numeric_mode, **kwargs)(x, target)
    loss.backward()
    want, dlogits = mt.cross_entropy(logits, target, return_grad=True, numeric_mode=mode.numeric_mode, **kwargs)
    assert loss.item() == want and _bits(x.grad) == _bits(dlogits) and x.grad.shape == logits.shape
    reference = torch.nn.functional.cross_entropy(logits.double(), target if case != "probability_targets" else
                                                  target.double(), **{k: v.double() for k, v in kwargs.items()})
    assert loss.item() == pytest.approx(reference.item(), rel=1e-5)


@pytest.mark.parametrize("bias", [False, True])
def test_linear_cross_entropy_and_its_gradients_are_the_native_api_bits(mode, device, bias):
    _need(mode, device, "lm_head")
    head = nn.LinearCrossEntropyLoss(6, 11, bias=bias, label_smoothing=0.05, numeric_mode=mode.numeric_mode).to(device)
    hidden, target = _leaf(_rand((2, 5, 6), 14, device=device)), _ids((2, 5), 11, 15, device)
    loss = head(hidden, target)
    loss.backward()
    want = mt.linear_cross_entropy(hidden, head.linear.weight, target, linear_bias=head.linear.bias,
                                   label_smoothing=0.05, return_grad=True, numeric_mode=mode.numeric_mode)
    got = [hidden.grad, head.linear.weight.grad] + ([head.linear.bias.grad] if bias else [])
    assert loss.item() == want[0] and [_bits(g) for g in got] == [_bits(g) for g in want[1:]]


def test_a_scaled_loss_multiplies_the_native_gradient_once_and_1_leaves_it_alone(mode):
    _need(mode, torch.device("cpu"), "loss")
    logits, target = _rand((4, 3), 16), _ids((4,), 3, 17)
    _, dlogits = mt.cross_entropy(logits, target, return_grad=True, numeric_mode=mode.numeric_mode)
    dlogits = torch.tensor(dlogits.tolist())
    for scale in (1.0, 0.5, 1.0 / 3.0):
        x = _leaf(logits)
        (F.cross_entropy(x, target, numeric_mode=mode.numeric_mode) * scale).backward()
        assert _bits(x.grad) == _bits(dlogits * torch.tensor(scale, dtype=torch.float32))


# ---- torch in float64, within tests/tolerances.py's bound --------------------------------------
class _LinearThenCrossEntropy(torch.nn.Module):
    """torch's documented equivalent of LinearCrossEntropyLoss (linear, then cross_entropy): the
    reference on every torch, 2.11 (which lacks the class) included."""

    def __init__(self, in_features, num_classes):
        super().__init__()
        self.linear = torch.nn.Linear(in_features, num_classes)

    def forward(self, input, target):
        return torch.nn.functional.cross_entropy(self.linear(input), target)


def _pair(ours, theirs, device="cpu"):
    """Our module and torch's float64 twin holding the same parameters."""
    theirs = theirs.double()
    with torch.no_grad():
        for p, q in zip(ours.parameters(), theirs.parameters()):
            q.copy_(p.double())
    return ours.to(device), theirs


def _run(module, inputs, dy=None):
    """Output and gradients (inputs that require grad, then the parameters)."""
    y = module(*inputs)
    y.backward(dy)
    return [y] + [t.grad for t in inputs if t.requires_grad] + [p.grad for p in module.parameters()]


def test_linear_rms_norm_and_embedding_are_within_the_torch_float64_bound(mode):
    _need(mode, torch.device("cpu"), "linear", "rms_norm", "embedding")
    tol = pytest.importorskip("tolerances")
    x, dy = _leaf(_rand((40, 30), 20)), _rand((40, 9), 21)
    ours, theirs = _pair(nn.Linear(30, 9, numeric_mode=mode.numeric_mode), torch.nn.Linear(30, 9))
    got, ref = _run(ours, [x], dy), _run(theirs, [_leaf(x.double())], dy.double())
    units = tol.linear_units(_np64(x), _np64(ours.weight), _np64(dy), _np64(ours.bias))
    for g, r, what in zip(got, ref, ("out", "da", "dweight", "dbias")):
        tol.assert_close_to_reference(_np64(g), _np64(r), "Linear " + what, unit=units[what].ravel())
    x, dy = _leaf(_rand((20, 33), 22, -2.0, 2.0)), _rand((20, 33), 23)
    ours, theirs = _pair(nn.RMSNorm(33, eps=1e-5, numeric_mode=mode.numeric_mode), torch.nn.RMSNorm(33, eps=1e-5))
    with torch.no_grad():
        for p in (ours.weight, theirs.weight):
            p.copy_(_rand((33,), 24, 0.5, 1.5))
    got, ref = _run(ours, [x], dy), _run(theirs, [_leaf(x.double())], dy.double())
    units = tol.rms_units(_np64(x), _np64(ours.weight), _np64(dy), 1e-5)
    for g, r, what in zip(got, ref, ("y", "dx", "dweight")):
        tol.assert_close_to_reference(_np64(g), _np64(r), "RMSNorm " + what, unit=units[what].ravel())
    ids, dy = _ids((300,), 13, 25), _rand((300, 4), 26)
    ours, theirs = _pair(nn.Embedding(13, 4, numeric_mode=mode.numeric_mode), torch.nn.Embedding(13, 4))
    got, ref = _run(ours, [ids], dy), _run(theirs, [ids], dy.double())
    assert _np64(got[0]).tolist() == _np64(ref[0]).tolist()            # a gather is exact
    unit = float(torch.zeros(13, 4, dtype=torch.float64).index_add_(0, ids, dy.double().abs()).max())
    tol.assert_close_to_reference(_np64(got[1]), _np64(ref[1]), "Embedding dweight", unit=unit)


def test_silu_relu_and_dropout_are_within_the_torch_float64_bound(mode):
    _need(mode, torch.device("cpu"), "elementwise", "random")
    tol = pytest.importorskip("tolerances")
    x, dy = _rand((64, 32), 27, -4.0, 4.0), _rand((64, 32), 28)
    for ours, theirs in ((nn.SiLU(numeric_mode=mode.numeric_mode), torch.nn.SiLU()),
                         (nn.ReLU(numeric_mode=mode.numeric_mode), torch.nn.ReLU())):
        got, ref = _run(ours, [_leaf(x)], dy), _run(theirs, [_leaf(x.double())], dy.double())
        for g, r, what in zip(got, ref, ("y", "dx")):
            tol.assert_close_to_reference(_np64(g), _np64(r), "%s %s" % (type(ours).__name__, what), unit=1.0)
    drop = nn.Dropout(0.25, generator=Generator(3, numeric_mode=mode.numeric_mode))
    y, dx = _run(drop, [_leaf(x)], dy)
    keep = (y != 0).double()                           # x has no zero, so y is 0 exactly where dropped
    tol.assert_close_to_reference(_np64(y), (x.double() * keep / 0.75).numpy(), "Dropout y", unit=1.0)
    tol.assert_close_to_reference(_np64(dx), (dy.double() * keep / 0.75).numpy(), "Dropout dx", unit=1.0)


def test_the_losses_are_within_the_torch_float64_bound(mode):
    _need(mode, torch.device("cpu"), "loss", "lm_head")
    tol = pytest.importorskip("tolerances")
    logits, target = _rand((30, 17), 29, -4.0, 4.0), _ids((30,), 17, 30)
    target[::7] = -100
    got = _run(nn.CrossEntropyLoss(label_smoothing=0.1, numeric_mode=mode.numeric_mode), [_leaf(logits), target])
    ref = _run(torch.nn.CrossEntropyLoss(label_smoothing=0.1), [_leaf(logits.double()), target])
    kept = int((target != -100).sum())
    units = tol.ce_units(4.0, kept, kept, "mean")
    tol.assert_close_to_reference([got[0].item()], [ref[0].item()], "cross_entropy loss", unit=units["loss"])
    tol.assert_close_to_reference(_np64(got[1]), _np64(ref[1]), "cross_entropy dlogits", unit=units["dlogits"])
    hidden, target = _rand((40, 12), 31), _ids((40,), 23, 32)
    ours, theirs = _pair(nn.LinearCrossEntropyLoss(12, 23, bias=True, numeric_mode=mode.numeric_mode),
                         _LinearThenCrossEntropy(12, 23))
    got, ref = _run(ours, [_leaf(hidden), target]), _run(theirs, [_leaf(hidden.double()), target])
    logits = hidden.double() @ ours.linear.weight.detach().double().T + ours.linear.bias.detach().double()
    dl = torch.autograd.functional.jacobian(lambda z: torch.nn.functional.cross_entropy(z, target), logits).abs()
    units = tol.linear_units(_np64(hidden), _np64(ours.linear.weight), dl.numpy(), _np64(ours.linear.bias))
    tol.assert_close_to_reference([got[0].item()], [ref[0].item()], "lce loss", unit=float(logits.abs().max()))
    for g, r, what in zip(got[1:], ref[1:], ("da", "dweight", "dbias")):
        tol.assert_close_to_reference(_np64(g), _np64(r), "LinearCrossEntropyLoss " + what, unit=units[what].ravel())


# ---- the modules are torch's ------------------------------------------------------------------
_TWINS = [("Linear", (6, 4), {}), ("Linear", (6, 4), {"bias": False}), ("RMSNorm", ((3, 5),), {}),
          ("RMSNorm", (5,), {"elementwise_affine": False}), ("Embedding", (10, 3), {"padding_idx": 1}),
          ("LinearCrossEntropyLoss", (4, 7), {"bias": True}), ("CrossEntropyLoss", (), {"label_smoothing": 0.2}),
          ("LayerNorm", ((3, 5),), {}), ("LayerNorm", (5,), {"bias": False}), ("GELU", ("tanh",), {})]


@pytest.mark.parametrize("name, args, kwargs", _TWINS)
def test_a_module_is_its_torch_namesake_with_its_init_and_state_dict(name, args, kwargs):
    if not hasattr(torch.nn, name):
        pytest.skip("torch %s has no nn.%s (added in 2.13)" % (torch.__version__, name))
    torch.manual_seed(5)
    ours = getattr(nn, name)(*args, **kwargs)
    torch.manual_seed(5)
    theirs = getattr(torch.nn, name)(*args, **kwargs)
    assert isinstance(ours, getattr(torch.nn, name)) and ours.numeric_mode is None
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert [_bits(v) for v in ours.state_dict().values()] == [_bits(v) for v in theirs.state_dict().values()]
    torch.manual_seed(6)
    other = getattr(torch.nn, name)(*args, **kwargs)
    ours.load_state_dict(other.state_dict())            # torch's checkpoint into ours ...
    theirs.load_state_dict(ours.state_dict())           # ... and ours into torch's
    assert [_bits(v) for v in theirs.state_dict().values()] == [_bits(v) for v in other.state_dict().values()]


def test_the_stand_in_for_an_older_torch_builds_torch_2_13s_linear_cross_entropy_loss():
    """With a torch that lacks nn.LinearCrossEntropyLoss (2.11 on the GPU machine) ours subclasses a
    stand-in; where torch has the class, the stand-in must build the same module."""
    if not hasattr(torch.nn, "LinearCrossEntropyLoss"):
        pytest.skip("torch %s has no nn.LinearCrossEntropyLoss (added in 2.13)" % (torch.__version__,))
    from mojo_train.torch.modules import _LinearCrossEntropyLoss
    for kwargs in ({}, {"bias": True, "reduction": "sum", "ignore_index": 3, "label_smoothing": 0.25}):
        torch.manual_seed(9)
        ours = _LinearCrossEntropyLoss(5, 8, **kwargs)
        torch.manual_seed(9)
        theirs = torch.nn.LinearCrossEntropyLoss(5, 8, **kwargs)
        public = lambda m: {k: v for k, v in vars(m).items() if not k.startswith("_")}  # noqa: E731
        assert public(ours) == public(theirs)
        assert list(ours.state_dict()) == list(theirs.state_dict())
        assert [_bits(v) for v in ours.state_dict().values()] == [_bits(v) for v in theirs.state_dict().values()]
    for bad in ({"weight": torch.ones(3)}, {"label_smoothing": 1.5}):
        with pytest.raises(RuntimeError):
            _LinearCrossEntropyLoss(5, 8, **bad)
        with pytest.raises(RuntimeError):
            torch.nn.LinearCrossEntropyLoss(5, 8, **bad)


def test_modules_refuse_torch_options_they_do_not_implement_and_bad_numeric_modes():
    cases = [(lambda: nn.Embedding(5, 2, max_norm=1.0), ValueError, r"Embedding: max_norm is refused"),
             (lambda: nn.Embedding(5, 2, sparse=True), ValueError, r"Embedding: sparse=True is refused"),
             (lambda: nn.Linear(3, 2, dtype=torch.float16), TypeError, r"Linear: dtype=torch\.float16; .*float32"),
             (lambda: nn.LinearCrossEntropyLoss(3, 4, out_features=(2,)), ValueError, r"out_features=\(2,\)"),
             (lambda: nn.SiLU(numeric_mode="exact"), ValueError, r"^mojo_train\.torch\.nn\.SiLU: .*numeric_mode")]
    for make, exc, words in cases:
        with pytest.raises(exc, match=words):
            make()
    assert "numeric_mode='fast'" in repr(nn.ReLU(numeric_mode="FAST"))
    layer = nn.Embedding.from_pretrained(torch.ones(3, 2), numeric_mode="identical")
    assert layer.numeric_mode == "identical" and not layer.weight.requires_grad


def test_the_namespaces_name_only_what_mojo_train_computes():
    assert nn.Module is torch.nn.Module and nn.Sequential is torch.nn.Sequential and nn.functional is F
    for namespace, name, torch_name in ((nn, "Conv2d", "torch.nn.Conv2d"), (F, "softmax", "torch.nn.functional.softmax"),
                                        (nn.utils, "clip_grad_value_", "torch.nn.utils.clip_grad_value_"),
                                        (nn.utils, "parameters_to_vector", "torch.nn.utils.parameters_to_vector")):
        assert not hasattr(namespace, name)
        with pytest.raises(AttributeError, match=r"^mojo_train\.torch\.\w+: has no %s: .* use %s explicitly"
                                                 % (name, re.escape(torch_name))):
            getattr(namespace, name)
    with pytest.raises(AttributeError, match="has no attribute 'Nonesuch'"):
        nn.Nonesuch
    with pytest.raises(AttributeError, match="has no attribute 'Nonesuch'"):
        nn.utils.Nonesuch


# ---- refusals: named, nothing written -----------------------------------------------------------
def _snapshot(*tensors):
    return [(_bits(t), t._version, t.grad) for t in tensors]


def _layers(mode):
    m = mode.numeric_mode
    return {"Linear": nn.Linear(4, 3, numeric_mode=m), "RMSNorm": nn.RMSNorm(4, numeric_mode=m),
            "SiLU": nn.SiLU(numeric_mode=m), "ReLU": nn.ReLU(numeric_mode=m), "Dropout": nn.Dropout(numeric_mode=m)}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_half_bfloat16_and_float64_inputs_are_refused_naming_the_dtype(mode, dtype):
    for name, layer in _layers(mode).items():
        x = _rand((2, 4), 40).to(dtype).requires_grad_()
        params, before = list(layer.parameters()), _snapshot(x, *layer.parameters())
        with pytest.raises(TypeError, match=r"^mojo_train\.torch\.nn\.%s: input has dtype %s; mojo_train computes "
                                            r"in float32 only and never casts \(convert with input\.float\(\)"
                                            % (name, re.escape(str(dtype)))):
            layer(x)
        assert _snapshot(x, *params) == before
    with pytest.raises(TypeError, match=r"^mojo_train\.torch\.nn\.Linear: weight has dtype torch\.bfloat16"):
        _layers(mode)["Linear"].to(torch.bfloat16)(_rand((2, 4), 41))


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_calls_under_autocast_are_refused_naming_autocast(mode, device_type):
    _need(mode, torch.device(device_type))
    layers = dict(_layers(mode), CrossEntropyLoss=nn.CrossEntropyLoss(numeric_mode=mode.numeric_mode))
    for name, layer in layers.items():
        layer.to(device_type)
        x = _rand((2, 4), 42, device=device_type).requires_grad_()
        args = (x, _ids((2,), 4, 43, device_type)) if name == "CrossEntropyLoss" else (x,)
        before = _snapshot(x, *layer.parameters())
        with torch.autocast(device_type):
            with pytest.raises(mtt.AutocastError, match=r"^mojo_train\.torch\.nn\.%s: called under "
                                                        r"torch\.autocast\('%s'\)" % (name, device_type)):
                layer(*args)
        assert _snapshot(x, *layer.parameters()) == before
    assert issubclass(mtt.AutocastError, TypeError) and issubclass(mtt.AutocastError, RuntimeError)


def test_normalized_shape_takes_int_likes_and_refuses_others_by_name():
    x = _rand((2, 8), 45)
    assert _bits(F.rms_norm(x, torch.Size([8]))) == _bits(F.rms_norm(x, 8))
    for bad in (8.0, "8", None):
        with pytest.raises(TypeError, match=r"^mojo_train\.torch\.functional\.layer_norm: normalized_shape must be "
                                            r"an int or a sequence of ints, got"):
            F.layer_norm(x, bad)


def test_bad_shapes_are_refused_with_the_users_argument_names_and_nothing_written(mode):
    _need(mode, torch.device("cpu"), "linear", "rms_norm", "embedding", "loss")
    x = _leaf(_rand((2, 5), 44))
    cases = [(nn.Linear(4, 3, numeric_mode=mode.numeric_mode), (x,),
              r"^mojo_train\.torch\.nn\.Linear: input has K=5 in its last dimension"),
             (nn.RMSNorm((3, 5), numeric_mode=mode.numeric_mode), (x,),
              r"^mojo_train\.torch\.nn\.RMSNorm: input of shape \(2, 5\) does not end with normalized_shape \(3, 5\)"),
             (nn.Embedding(4, 5, numeric_mode=mode.numeric_mode), (torch.tensor([1, 4]),),
              r"^mojo_train\.torch\.nn\.Embedding: input\[1\] = 4 is outside \[0, 4\)"),
             (nn.CrossEntropyLoss(numeric_mode=mode.numeric_mode), (x, torch.tensor([0, 5])),
              r"^mojo_train\.torch\.nn\.CrossEntropyLoss: target\[1\] = 5 is outside \[0, 5\)")]
    for layer, args, words in cases:
        before = _snapshot(*args[:1], *layer.parameters())
        with pytest.raises(ValueError, match=words):
            layer(*args)
        assert _snapshot(*args[:1], *layer.parameters()) == before


# torch's own refusal of class indices it does not take, reworded in torch 2.13 ("expected target
# dtype to be Long or Byte"; the H200 machine's 2.11 says "expected scalar type Long but found
# Int"). Both take int64 and uint8.
_TORCH_TARGET_DTYPE_WORDS = ("expected target dtype to be Long or Byte"
                             if torch.torch_version.TorchVersion(torch.__version__) >= (2, 13)
                             else "expected scalar type Long but found")


def test_cross_entropy_refuses_what_torch_refuses_in_torch_words(mode):
    # Code that runs on the adapter must run on torch: class indices of int32, int16, int8 or bool
    # are refused as the installed torch refuses them; int64 and uint8 are taken by both. The
    # messages speak of torch's arguments, not the native API's.
    _need(mode, torch.device("cpu"), "loss")
    x, ids = _leaf(_rand((4, 3), 45)), torch.tensor([0, 1, 2, 0])
    for dtype in (torch.int32, torch.int16, torch.int8, torch.bool):
        with pytest.raises(TypeError, match=r"^mojo_train\.torch\.functional\.cross_entropy: target has dtype "
                                            r"%s; class indices must be int64 \(or uint8\), as torch's "
                                            r"cross_entropy requires: convert with target\.long\(\)$"
                                            % re.escape(str(dtype))):
            F.cross_entropy(x, ids.to(dtype), numeric_mode=mode.numeric_mode)
        with pytest.raises(RuntimeError, match=_TORCH_TARGET_DTYPE_WORDS):
            torch.nn.functional.cross_entropy(x, ids.to(dtype))
    # uint8: taken by both, with the int64 indices' loss
    torch.nn.functional.cross_entropy(x, ids.to(torch.uint8))
    assert float(F.cross_entropy(x, ids.to(torch.uint8), numeric_mode=mode.numeric_mode)) == float(
        F.cross_entropy(x, ids, numeric_mode=mode.numeric_mode))
    # a float target: the fix is the target's own (no model.float()), and the shape in English
    with pytest.raises(TypeError, match=r"target has dtype torch\.float64; mojo_train computes in float32 only and "
                                        r"never casts \(convert with target\.float\(\)\)$"):
        F.cross_entropy(x, torch.zeros(4, 3, dtype=torch.float64), numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError, match=r"class probabilities must have the input's shape \(4, 3\)"):
        F.cross_entropy(x, torch.zeros(4, dtype=torch.float32), numeric_mode=mode.numeric_mode)
    # reduction='none' with a gradient wanted: torch's words, before anything runs
    with pytest.raises(NotImplementedError, match=r"cross_entropy: reduction='none' on an input that requires grad: "
                                                  r"the per-row losses have no backward here"):
        F.cross_entropy(x, ids, reduction="none", numeric_mode=mode.numeric_mode)
    with torch.no_grad():
        assert F.cross_entropy(x, ids, reduction="none", numeric_mode=mode.numeric_mode).shape == (4,)


def test_a_nan_gradient_is_refused_in_backward_with_nothing_accumulated(mode):
    _need(mode, torch.device("cpu"), "linear")
    layer, x = nn.Linear(4, 3, numeric_mode=mode.numeric_mode), _leaf(_rand((2, 4), 45))
    y = layer(x)
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.nn\.Linear\.backward: grad_output holds NaN"):
        y.backward(torch.full((2, 3), float("nan")))
    assert x.grad is None and layer.weight.grad is None and layer.bias.grad is None


def test_tensors_on_two_devices_or_an_unsupported_one_are_refused():
    layer = nn.Linear(4, 3)
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.nn\.Linear: input is on meta; mojo_train runs on "
                                         r"the CPU and on CUDA"):
        layer.to("meta")(torch.empty(2, 4, device="meta"))
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.functional\.linear: input is on cpu but weight is "
                                         r"on meta; put every tensor of the call on one device"):
        F.linear(torch.ones(2, 4), torch.empty(3, 4, device="meta"))


@pytest.mark.parametrize("op", ["silu", "relu", "dropout"])
def test_inplace_on_a_leaf_that_requires_grad_is_refused_before_writing(op):
    x = _leaf(_rand((3, 4), 46))
    before = _snapshot(x)
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.functional\.%s: inplace=True on input, a leaf "
                                         r"tensor that requires grad" % op):
        getattr(F, op)(x, inplace=True)
    assert _snapshot(x) == before


def test_a_dropout_generator_of_another_numeric_mode_or_torchs_is_refused():
    with pytest.raises(ValueError, match=r"numeric_mode='fast' but generator has numeric_mode 'identical'"):
        F.dropout(torch.ones(3), generator=Generator(1, numeric_mode="identical"), numeric_mode="fast")
    with pytest.raises(TypeError, match=r"generator must be a mojo_train\.Generator, got Generator"):
        F.dropout(torch.ones(3), generator=torch.Generator())


# ---- strided inputs, no_grad, zero copies -------------------------------------------------------
def test_strided_inputs_give_the_bits_of_their_contiguous_copies(mode):
    _need(mode, torch.device("cpu"), "linear", "rms_norm")
    xl, wl = _leaf(_rand((5, 8), 47)), _leaf(_rand((4, 5), 48))
    x, w = xl[:, ::2], wl.t()                           # strided views: (5, 4) and (5, 4)
    y = F.linear(x, w, numeric_mode=mode.numeric_mode)
    y.sum().backward()                                  # an expanded (stride 0) grad_output
    xc, wc = _leaf(x.detach().contiguous()), _leaf(w.detach().contiguous())
    yc = F.linear(xc, wc, numeric_mode=mode.numeric_mode)
    yc.backward(torch.ones(5, 5))
    assert _bits(y) == _bits(yc)
    assert _bits(xl.grad[:, ::2]) == _bits(xc.grad) and _bits(wl.grad.t()) == _bits(wc.grad)
    z = F.rms_norm(x, (4,), numeric_mode=mode.numeric_mode)
    assert _bits(z) == _bits(F.rms_norm(xc, 4, numeric_mode=mode.numeric_mode))


def test_under_no_grad_a_loss_computes_no_gradient_and_records_nothing(mode):
    _need(mode, torch.device("cpu"), "loss", "lm_head")
    logits, target = _leaf(_rand((4, 3), 49)), _ids((4,), 3, 50)
    with torch.no_grad():
        loss = F.cross_entropy(logits, target, numeric_mode=mode.numeric_mode)
        head = F.linear_cross_entropy(logits, _rand((5, 3), 51), target, numeric_mode=mode.numeric_mode)
    assert loss.grad_fn is None and head.grad_fn is None
    assert loss.item() == mt.cross_entropy(logits, target, numeric_mode=mode.numeric_mode)


def test_a_native_array_becomes_a_torch_tensor_over_its_own_memory():
    a = mt.Array.from_list([1.5, -2.0, 3.25, 0.0, 7.0, -1.0]).reshape(2, 3)
    t = _tensors.as_torch(a, torch.device("cpu"))
    assert t.data_ptr() == a.address and t.shape == (2, 3) and t.dtype == torch.float32
    t[0, 0] = 9.0                                       # one memory
    assert a.tolist()[0][0] == 9.0
    del a
    assert t.tolist() == [[9.0, -2.0, 3.25], [0.0, 7.0, -1.0]]    # the tensor keeps it alive


# ---- a tensor used twice: autograd's sum, in its order ------------------------------------------
class _Tiny(torch.nn.Module):
    """Embedding -> Linear -> RMSNorm -> SiLU -> residual -> Linear head (its weight optionally
    the embedding table)."""

    def __init__(self, layers, vocab, width, numeric_mode, tied=False):
        super().__init__()
        m = numeric_mode
        self.embed = layers.Embedding(vocab, width, padding_idx=0, numeric_mode=m)
        self.proj = layers.Linear(width, width, numeric_mode=m)
        self.norm = layers.RMSNorm(width, numeric_mode=m)
        self.act = layers.SiLU(numeric_mode=m)
        self.head = layers.Linear(width, vocab, numeric_mode=m)
        if tied:
            self.head.weight = self.embed.weight

    def forward(self, ids):
        e = self.embed(ids)
        return self.head(e + self.act(self.norm(self.proj(e))))


def _tiny_run(mode, device, tied, seed=0):
    """(loss, {name: grad}) of one backward of the tiny model on ``device``."""
    torch.manual_seed(seed)
    model = _Tiny(nn, 23, 8, mode.numeric_mode, tied).to(device)
    ids, targets = _ids((3, 6), 23, seed + 1, device), _ids((18,), 23, seed + 2, device)
    loss = F.cross_entropy(model(ids).reshape(-1, 23), targets, numeric_mode=mode.numeric_mode)
    loss.backward()
    return model, ids, targets, loss


def _native_tiny(model, ids, targets, numeric_mode, tied):
    """The hand-written native-API version of _Tiny's forward and backward (its grads by name)."""
    m = {"numeric_mode": numeric_mode}
    p = dict(model.named_parameters())
    w_head = p["embed.weight"] if tied else p["head.weight"]
    e = mt.embedding_forward(p["embed.weight"], ids, **m)
    z = mt.linear_forward(e, p["proj.weight"], p["proj.bias"], **m)
    n = mt.rms_norm_forward(z, p["norm.weight"], **m)
    s = mt.silu_forward(n, **m)
    h = mt.add(e, s, **m)
    logits = mt.linear_forward(h, w_head, p["head.bias"], **m)
    loss, dlogits = mt.cross_entropy(logits.reshape(18, 23), targets, return_grad=True, **m)
    dh, dw_head, db_head = mt.linear_backward(dlogits.reshape(3, 6, 23), h, w_head, need_bias_grad=True, **m)
    dz, dw_norm = mt.rms_norm_backward(mt.silu_backward(dh, n, **m), z, p["norm.weight"], **m)
    de_proj, dw_proj, db_proj = mt.linear_backward(dz, e, p["proj.weight"], need_bias_grad=True, **m)
    de = mt.add(dh, de_proj, **m)                   # e feeds the residual add and proj
    dw_embed = mt.embedding_backward(de, ids, 23, padding_idx=0, **m)
    grads = {"embed.weight": dw_embed, "proj.weight": dw_proj, "proj.bias": db_proj, "norm.weight": dw_norm,
             "head.weight": dw_head, "head.bias": db_head}
    if tied:        # the head ran after the embedding, so its gradient reaches the table first
        grads["embed.weight"] = mt.add(dw_head, dw_embed, **m)
        del grads["head.weight"]
    return loss, grads


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied_embedding_and_head"])
def test_a_tiny_model_backward_gives_the_bytes_of_the_hand_written_native_version(mode, device, tied):
    _need(mode, device, "linear", "rms_norm", "elementwise", "embedding", "loss")
    model, ids, targets, loss = _tiny_run(mode, device, tied)
    want_loss, want = _native_tiny(model, ids, targets, mode.numeric_mode, tied)
    got = {name: p.grad for name, p in model.named_parameters()}
    assert loss.item() == want_loss and sorted(got) == sorted(want)
    assert {k: _bits(v) for k, v in got.items()} == {k: _bits(v) for k, v in want.items()}


def _digest(mode, device, tied):
    model, _, _, loss = _tiny_run(mode, device, tied)
    h = hashlib.sha256(repr(loss.item()).encode())
    for name, p in model.named_parameters():
        h.update(("%s %r" % (name, _bits(p.grad))).encode())
    return h.hexdigest()


def test_the_tiny_model_gives_the_same_gradient_bytes_every_run_and_in_a_fresh_process(identical):
    _need(identical, torch.device("cpu"), "linear", "rms_norm", "elementwise", "embedding", "loss")
    here = _digest(identical, torch.device("cpu"), True)
    assert _digest(identical, torch.device("cpu"), True) == here
    code = ("import sys; sys.path.insert(0, %r); import test_torch_adapter as t, conftest\n"
            "from mojo_train import _native; import torch\n"
            "mode = conftest.Mode(%r, 'identical', _native.load('identical', %r))\n"
            "print(t._digest(mode, torch.device('cpu'), True))" % (HERE, identical.vendor, identical.vendor))
    env = dict(os.environ, MOJO_TRAIN_VENDOR=identical.vendor, PYTHONPATH=python_path(os.path.dirname(HERE)))
    done = subprocess.run([sys.executable, "-c", code], cwd=HERE, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == here


def test_an_activation_fed_to_three_layers_accumulates_in_reverse_creation_order(mode):
    _need(mode, torch.device("cpu"), "linear")
    m = mode.numeric_mode
    x = _leaf(_rand((16, 24), 52, -8.0, 8.0))
    layers = [nn.Linear(24, 5, bias=False, numeric_mode=m) for _ in range(3)]
    dy = _rand((16, 5), 53)
    with torch.no_grad():
        for k, layer in enumerate(layers):
            layer.weight.mul_(10.0 ** k)              # magnitudes far apart: the order shows in the bits
    ys = [layer(x) for layer in layers]
    (ys[0] + ys[1] + ys[2]).backward(dy)
    g = [mt.linear_backward(dy, x, layer.weight, need_weight_grad=False, numeric_mode=m)[0] for layer in layers]
    newest_first = mt.add(mt.add(g[2], g[1], numeric_mode=m), g[0], numeric_mode=m)
    oldest_first = mt.add(mt.add(g[0], g[1], numeric_mode=m), g[2], numeric_mode=m)
    assert _bits(x.grad) == _bits(newest_first)
    assert _bits(newest_first) != _bits(oldest_first)   # the order is part of the answer


# ---- CUDA: the CPU oracle's bits, torch's streams ------------------------------------------------
def test_cuda_tensors_give_the_cpu_oracles_gradient_bytes(identical, monkeypatch):
    cuda = torch.device("cuda:0")
    _need(identical, cuda, "linear", "rms_norm", "elementwise", "embedding", "loss")
    on_gpu = _digest(identical, cuda, True)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    try:
        oracle = _native.load("identical", "cpu")
    except _native.BackendError:
        pytest.skip("the cpu oracle's identical numeric mode is not built (make)")
    assert _digest(_CpuMode(oracle), torch.device("cpu"), True) == on_gpu


class _CpuMode:
    numeric_mode = "identical"

    def __init__(self, backend):
        self.backend = backend

    def has(self, feature):
        return self.backend.has(feature)


def test_inputs_made_on_a_torch_side_stream_are_waited_for(identical):
    cuda = torch.device("cuda:0")
    _need(identical, cuda, "linear")
    w = _rand((256, 512), 54, device=cuda)
    want = mt.linear_forward(_rand((4096, 512), 55), w.cpu(), numeric_mode="identical")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device=cuda)
        for _ in range(20):                             # queue work long enough to race against
            big = big @ big * 1e-3
        x = _rand((4096, 512), 55, device=cuda) + big[:, :512] * 0.0
        y = F.linear(x, w, numeric_mode="identical")
        y2 = y * 1.0                                    # torch reads the result on its stream
    side.synchronize()
    assert _bits(y2) == _bits(want)


def test_inputs_made_on_torchs_default_stream_are_ordered_before_the_native_call(identical):
    """No host wait on torch's default stream: the native call's per-thread stream waits for the
    legacy default stream's queued work by CUDA's rule (mojo_train/torch/_tensors.py)."""
    cuda = torch.device("cuda:0")
    _need(identical, cuda, "linear")
    assert torch.cuda.current_stream(cuda).cuda_stream == 0, "torch's default stream is the legacy one"
    w = _rand((256, 512), 54, device=cuda)
    want = mt.linear_forward(_rand((4096, 512), 55), w.cpu(), numeric_mode="identical")
    big = torch.randn(4096, 4096, device=cuda)
    for _ in range(20):                                 # queue work long enough to race against
        big = big @ big * 1e-3
    x = _rand((4096, 512), 55, device=cuda) + big[:, :512] * 0.0
    y = F.linear(x, w, numeric_mode="identical")
    assert _bits(y * 1.0) == _bits(want)


def test_cuda_outputs_stay_on_the_device_without_crossing_the_bus(identical):
    cuda = torch.device("cuda:0")
    _need(identical, cuda, "linear")
    layer = nn.Linear(64, 32, numeric_mode="identical").to(cuda)
    x = _leaf(_rand((128, 64), 56, device=cuda))
    before = mt.transfer_bytes("identical")
    y = layer(x)
    y.backward(torch.ones_like(y))
    after = mt.transfer_bytes("identical")
    assert y.device == cuda and x.grad.device == cuda and layer.weight.grad.device == cuda
    assert sum(after) - sum(before) <= 1024             # status words only: no tensor (32 KiB) is staged


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_results_can_be_modified_in_place_as_torchs_can(identical, device_type):
    """No result is a view made inside a Function (autograd forbids modifying those in place):
    RMSNorm's and Linear's outputs modified in place, then SiLU in place, give the bits and
    gradients of the same model written out of place."""
    device = torch.device("cuda:0" if device_type == "cuda" else "cpu")
    _need(identical, device, "linear", "rms_norm", "elementwise")
    layer = nn.Linear(16, 8, numeric_mode="identical").to(device)
    norm = nn.RMSNorm(16, numeric_mode="identical").to(device)
    x0 = _rand((2, 3, 16), 59, device=device)

    def run(inplace):
        layer.zero_grad()
        norm.zero_grad()
        x = _leaf(x0)
        h = norm(x)
        h = h.mul_(2.0) if inplace else h * 2.0
        y = layer(h)
        y = F.silu(y.add_(1.0), inplace=True, numeric_mode="identical") if inplace else \
            F.silu(y + 1.0, numeric_mode="identical")
        y.sum().backward()
        return [_bits(t) for t in (y, x.grad, layer.weight.grad, layer.bias.grad, norm.weight.grad)]

    assert run(True) == run(False)


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
def test_an_empty_batch_gives_torchs_empty_per_row_losses(identical, device_type):
    """reduction='none' over zero rows: an empty (0,) loss on the inputs' device, as torch gives
    (on CUDA the empty output keeps an address of the library's own: an empty torch tensor's is
    NULL, which the native call would refuse)."""
    device = torch.device("cuda:0" if device_type == "cuda" else "cpu")
    _need(identical, device, "loss")
    logits, targets = torch.zeros((0, 5), device=device), torch.zeros((0,), dtype=torch.long, device=device)
    got = F.cross_entropy(logits, targets, reduction="none", numeric_mode="identical")
    want = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    assert got.shape == want.shape == (0,) and got.device == device


def test_cuda_results_are_torch_tensors_of_torchs_allocator_not_dlpack_imports(identical):
    """On CUDA the outputs a native call allocates are torch.empty tensors (mojo_train._ops.
    device_outputs): torch's allocator counts them, and nothing is exported through DLPack."""
    from mojo_train import _dlpack
    cuda = torch.device("cuda:0")
    _need(identical, cuda, "linear", "rms_norm")
    layer = nn.Linear(256, 512, numeric_mode="identical").to(cuda)
    norm = nn.RMSNorm(256, numeric_mode="identical").to(cuda)
    x = _leaf(_rand((1024, 256), 58, device=cuda))
    gc.collect()                    # earlier tests' garbage is not freed inside the measured calls
    torch.cuda.synchronize()
    exports, held = _dlpack.live_exports(), torch.cuda.memory_allocated(cuda)
    y = layer(norm(x))
    assert torch.cuda.memory_allocated(cuda) - held >= y.numel() * 4 + x.numel() * 4   # y and norm(x)
    assert y.untyped_storage().nbytes() == y.numel() * 4
    y.backward(torch.ones_like(y))
    assert _dlpack.live_exports() == exports
    want_y = F.linear(F.rms_norm(x.detach().cpu(), (256,), norm.weight.detach().cpu(), numeric_mode="identical"),
                      layer.weight.detach().cpu(), layer.bias.detach().cpu(), numeric_mode="identical")
    assert _bits(y.detach().cpu()) == _bits(want_y)


# ---- the default generator, the README ----------------------------------------------------------
def test_manual_seed_restarts_the_default_dropout_streams(mode):
    _need(mode, torch.device("cpu"), "random")
    x = _rand((100,), 57)
    mtt.manual_seed(7)
    first = [_bits(F.dropout(x, 0.5, numeric_mode=mode.numeric_mode)) for _ in range(2)]
    mtt.manual_seed(7)
    again = [_bits(nn.Dropout(0.5, numeric_mode=mode.numeric_mode)(x)) for _ in range(2)]
    assert first == again and first[0] != first[1]
    assert mtt.default_generator(mode.numeric_mode).state_dict() == {"seed": 7, "counter": 2}
    with pytest.raises(ValueError, match=r"seed must be in \[0, 2\*\*64\)"):
        mtt.manual_seed(-1)
    assert mtt.default_generator(mode.numeric_mode).counter == 2


def test_the_readme_torch_loop_differs_from_plain_torch_only_in_imports_and_tracks_it(tmp_path):
    from test_readme import examples, run_example
    code = examples()["torch adapter"]
    plain = code.replace("from mojo_train.torch import nn", "from torch import nn").replace(
        "import mojo_train.torch.functional as F", "import torch.nn.functional as F").replace(
        "from mojo_train.torch import optim", "from torch import optim")
    assert not re.search(r"^\s*(import|from) mojo_train", plain, re.M) and plain != code
    losses = [[float(v) for v in re.findall(r"loss (\d+\.\d+)", run_example(c, tmp_path))] for c in (code, plain)]
    assert len(losses[0]) == len(losses[1]) >= 3 and losses[0][-1] < losses[0][0] / 2
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)


@pytest.mark.parametrize("op, inplace", [("silu", False), ("silu", True), ("relu", False), ("relu", True),
                                         ("gelu", False)])
def test_a_negated_view_is_read_as_the_values_torch_sees(op, inplace):
    """torch's lazy negation bit (``x._neg_view()``: memory holds -x) is resolved before the
    native call reads the memory, and an in-place result lands where torch reads it: the
    same bytes as the layer on the materialized values."""
    base = torch.tensor([[-1.5, 0.25, 2.0, -0.75]])
    make = {"silu": lambda: nn.SiLU(inplace=inplace), "relu": lambda: nn.ReLU(inplace=inplace),
            "gelu": lambda: nn.GELU()}[op]
    want = make()(-base)
    x = (base * 1.0)._neg_view()
    assert x.is_neg()
    y = make()(x)
    assert _bits(y.resolve_neg()) == _bits(want), (op, y, want)
    if inplace:
        assert y is x and _bits(x.resolve_neg()) == _bits(want)


# ---- create_graph=True: refused by name, never a silently constant gradient ----------------------
def _double_backward_cases(m):
    x = _rand((3, 8), 1).requires_grad_()
    w = _rand((5, 8), 2).requires_grad_()
    q = _rand((1, 2, 4, 8), 3).requires_grad_()
    ids = _ids((6,), 5, 4)
    t = _ids((3,), 5, 5)
    return {
        "linear": (lambda: F.linear(x, w, numeric_mode=m), x, "torch.nn.functional.linear"),
        "rms_norm": (lambda: F.rms_norm(x, (8,), numeric_mode=m), x, "torch.nn.functional.rms_norm"),
        "layer_norm": (lambda: F.layer_norm(x, (8,), numeric_mode=m), x, "torch.nn.functional.layer_norm"),
        "gelu": (lambda: F.gelu(x, numeric_mode=m), x, "torch.nn.functional.gelu"),
        "silu": (lambda: F.silu(x, numeric_mode=m), x, "torch.nn.functional.silu"),
        "relu": (lambda: F.relu(x, numeric_mode=m), x, "torch.nn.functional.relu"),
        "dropout": (lambda: F.dropout(x, 0.5, generator=Generator(1, numeric_mode=m), numeric_mode=m), x,
                    "torch.nn.functional.dropout"),
        "embedding": (lambda: F.embedding(ids, w, numeric_mode=m), w, "torch.nn.functional.embedding"),
        "attention": (lambda: F.scaled_dot_product_attention(q, q, q, numeric_mode=m), q,
                      "torch.nn.functional.scaled_dot_product_attention"),
        "cross_entropy": (lambda: F.cross_entropy(F.linear(x, w, numeric_mode=m), t, numeric_mode=m), x,
                          "torch.nn.functional.cross_entropy"),
        "linear_cross_entropy": (lambda: F.linear_cross_entropy(x, w, t, numeric_mode=m), x,
                                 "torch.nn.functional.linear_cross_entropy"),
    }


@pytest.mark.parametrize("op", sorted(_double_backward_cases(None)))
def test_a_differentiable_gradient_is_refused_by_name(mode, op):
    """Backwards are once-differentiable: ``torch.autograd.grad(..., create_graph=True)`` is
    refused naming the op. torch's own once_differentiable refuses only when the incoming
    gradient requires grad, so a gradient penalty on ``y.sum()``'s gradient came back as a
    constant and its term was dropped from the next backward without a word."""
    if op == "attention":
        _need(mode, torch.device("cpu"), "attention")
    fn, wrt, where = _double_backward_cases(mode.numeric_mode)[op]
    y = fn().sum()
    with pytest.raises(RuntimeError, match=r"^mojo_train\.torch\.functional\.%s\.backward: a differentiable "
                                           r"gradient was asked for \(create_graph=True" % where.rsplit(".", 1)[1]):
        torch.autograd.grad(y, wrt, create_graph=True)
    (g,) = torch.autograd.grad(fn().sum(), wrt)            # the once-differentiable gradient itself is taken
    assert g.shape == wrt.shape and not g.requires_grad


# ---- dropout under torch.utils.checkpoint ------------------------------------------------------
def _checkpointed_dropout(mode, use_reentrant):
    """(forward's kept positions, backward's kept positions, the next draw) of nn.Dropout(0.5)
    on 1000 ones (times the ones), under torch.utils.checkpoint (use_reentrant given) or without
    it (None)."""
    import torch.utils.checkpoint as cp
    gen = Generator(7, numeric_mode=mode.numeric_mode)
    drop = nn.Dropout(0.5, generator=gen, numeric_mode=mode.numeric_mode)
    x = torch.ones(1000, requires_grad=True)

    def f(x):       # the product saves tensors, so that a non-reentrant checkpoint re-runs the function
        return drop(x) * x
    y = f(x) if use_reentrant is None else cp.checkpoint(f, x, use_reentrant=use_reentrant)
    y.sum().backward()
    return y.detach() != 0, x.grad != 0, _bits(drop(torch.ones(1000)))


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_dropout_under_a_checkpoint_is_refused_by_name(mode, use_reentrant):
    """The re-run of the forward draws the generator's next stream: with use_reentrant=True 518
    of 1000 positions of the backward's mask differed from the forward's, silently; with False
    the product's saved dropout output is the re-run's while the dropout's backward replays the
    first run's key. p = 0 under checkpoint draws nothing and stays taken."""
    with pytest.raises(RuntimeError, match=r"^mojo_train\.torch\.nn\.Dropout: p=0\.5 under torch\.utils\.checkpoint "
                                           r"\(use_reentrant=%s\).*keep the dropout outside" % use_reentrant):
        _checkpointed_dropout(mode, use_reentrant)
    fwd, bwd, _ = _checkpointed_dropout(mode, None)      # without checkpoint: the forward's mask, replayed
    assert torch.equal(fwd, bwd) and 300 < int(fwd.sum()) < 700
    import torch.utils.checkpoint as cp
    x = torch.ones(10, requires_grad=True)
    drop = nn.Dropout(0.0, numeric_mode=mode.numeric_mode)
    cp.checkpoint(lambda x: drop(x) * x, x, use_reentrant=use_reentrant).sum().backward()
    assert x.grad.tolist() == [2.0] * 10


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_attention_dropout_under_a_checkpoint_is_refused_by_name(mode, use_reentrant):
    """Attention saves its output for the backward: under either checkpoint mode the backward
    read the re-run's output (another stream's mask) beside the forward's key, and its
    gradient was wrong without a word; dropout_p=0 under checkpoint stays taken."""
    import torch.utils.checkpoint as cp
    _need(mode, torch.device("cpu"), "attention")
    q = _rand((1, 2, 16, 8), 9).requires_grad_()

    def attend(p):
        return lambda q: F.scaled_dot_product_attention(q, q, q, dropout_p=p, numeric_mode=mode.numeric_mode,
                                                        generator=Generator(3, numeric_mode=mode.numeric_mode))
    with pytest.raises(RuntimeError, match=r"^mojo_train\.torch\.functional\.scaled_dot_product_attention: "
                                           r"dropout_p=0\.5 under torch\.utils\.checkpoint \(use_reentrant=%s"
                                           % use_reentrant):
        cp.checkpoint(attend(0.5), q, use_reentrant=use_reentrant)
    cp.checkpoint(attend(0.0), q, use_reentrant=use_reentrant).sum().backward()
    (plain,) = torch.autograd.grad(attend(0.0)(q).sum(), q)
    assert _bits(q.grad) == _bits(plain)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_checkpoint_sequential_refuses_dropout_only_in_the_segments_it_checkpoints(mode, use_reentrant):
    """checkpoint_sequential runs its last segment plainly (and everything with segments=1): a
    dropout there draws once and is replayed, so it is taken; one in a checkpointed segment is
    refused. A stack frame of torch/utils/checkpoint.py alone does not mean a re-run."""
    import torch.utils.checkpoint as cp
    m = mode.numeric_mode
    x = torch.ones(2, 4, requires_grad=True)
    last = torch.nn.Sequential(nn.Linear(4, 4, numeric_mode=m), nn.Linear(4, 4, numeric_mode=m),
                               nn.Dropout(0.5, generator=Generator(1, numeric_mode=m), numeric_mode=m))
    for segments in (1, 2):
        cp.checkpoint_sequential(last, segments, x, use_reentrant=use_reentrant).sum().backward()
    first = torch.nn.Sequential(nn.Dropout(0.5, generator=Generator(1, numeric_mode=m), numeric_mode=m),
                                nn.Linear(4, 4, numeric_mode=m), nn.Linear(4, 4, numeric_mode=m))
    with pytest.raises(RuntimeError, match=r"^mojo_train\.torch\.nn\.Dropout: p=0\.5 under torch\.utils\.checkpoint "
                                           r"\(use_reentrant=%s\)" % use_reentrant):
        cp.checkpoint_sequential(first, 2, x, use_reentrant=use_reentrant)


def test_the_default_generator_of_none_is_the_default_modes_own():
    """Layers made with numeric_mode=None and with the default mode's name draw from one
    generator: two generators of one seed gave both the same masks, and a checkpoint that saved
    default_generator() missed the one the named layers drew from."""
    mtt.manual_seed(5)
    mode = _native.load(None).numeric_mode
    assert mtt.default_generator() is mtt.default_generator(mode) is mtt.default_generator(mode.upper())
    a = nn.Dropout(0.5)(torch.ones(64))
    b = nn.Dropout(0.5, numeric_mode=mode)(torch.ones(64))
    assert not torch.equal(a, b) and mtt.default_generator().counter == 2
