"""CPU torch tensors wherever buffers work, and autograd kept honest.

Contract under test (mojo_train/_buffer.py): torch tensors are read through DLPack without
importing torch; one that requires grad is read through ``x.detach()`` -- its own memory, no
copy -- so ``Array.from_buffer(t)``, ``Embedding(weight=t)``, ``Embedding.from_pretrained(t)``
and optimizers over ``requires_grad`` parameters work. Every write into a torch tensor (an
optimizer step, a clip, ``zero_grad``, ``out=``, ``grad=``) bumps its version counter as
torch's own in-place ops do, so a tensor saved for backward and then written makes torch's
backward raise; a refused call bumps nothing. An output (``out=``, ``grad=``) that requires
grad is refused in grad mode and taken under ``torch.no_grad()``, as torch does with ``out=``.
Refusals name the argument and say the torch fix (``.float()``, ``.contiguous()``,
``.detach()``).
"""
import gc

import pytest

import mojo_train as mt
from mojo_train._array import Array
from mojo_train._buffer import RequiresGradError, probe
from mojo_train.embedding import Embedding, embedding_backward

torch = pytest.importorskip("torch")

STALE = "modified by an inplace operation"


def _need(mode, *features):
    for feature in features:
        if not mode.has(feature):
            pytest.skip("this library has no %s (mt_features)" % feature)


def _values(n, scale=0.25):
    return [scale * (k - n // 2) for k in range(n)]


# ---- reading --------------------------------------------------------------------------------
@pytest.mark.parametrize("requires_grad", [False, True])
def test_array_from_buffer_copies_a_cpu_tensor_keeping_shape_and_dtype(requires_grad):
    t = torch.tensor(_values(6)).reshape(2, 3).requires_grad_(requires_grad)
    a = Array.from_buffer(t)
    assert (a.shape, a.dtype, a.tolist()) == ((2, 3), "float32", t.tolist())
    with torch.no_grad():
        t.add_(1.0)
    assert a.tolist() != t.tolist()                    # a copy, not a view
    ids = Array.from_buffer(torch.tensor([[3, -1]]))
    assert (ids.shape, ids.dtype, ids.tolist()) == ((1, 2), "int64", [[3, -1]])


def test_a_tensor_that_requires_grad_is_read_in_its_own_memory():
    t = torch.zeros(5, requires_grad=True)
    p = probe(t, "x", "step")
    assert p.address == t.data_ptr() and p.obj is t and p.versioned is t
    with torch.no_grad():
        t[2] = 7.0
    assert p.view.tolist() == [0.0, 0.0, 7.0, 0.0, 0.0]


def test_the_view_of_a_cpu_tensor_keeps_its_memory_alive():
    n = 1 << 20                     # 4 MiB: malloc maps it alone and unmaps it when it is freed
    t = torch.arange(n, dtype=torch.float32)
    view = probe(t, "x", "step").view[n - 3:]
    del t
    gc.collect()
    others = [torch.full((n,), -1.0) for _ in range(4)]
    assert view.tolist() == [n - 3.0, n - 2.0, n - 1.0] and len(others) == 4


@pytest.mark.parametrize("swap", ["data", "set_", "double"])
def test_a_probed_view_keeps_its_memory_when_the_parameters_storage_is_swapped(swap):
    """An optimizer keeps the Probes of its parameters; a Parameter whose storage is swapped
    afterwards (p.data = ..., p.set_(...), module.double()) must leave the probed memory alive
    (stale, not freed: the step then writes where it was built to)."""
    n = 1 << 20                     # 4 MiB: malloc maps it alone and unmaps it when it is freed
    layer = torch.nn.Linear(n, 1, bias=False)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(n, dtype=torch.float32).reshape(1, n))
    view = probe(layer.weight, "x", "step").view
    with torch.no_grad():
        if swap == "data":
            layer.weight.data = torch.zeros(1)
        elif swap == "set_":
            layer.weight.set_(torch.zeros(1))
        else:
            layer.double()
    gc.collect()
    others = [torch.full((n,), -1.0) for _ in range(4)]
    assert view.cast("B").cast("f")[n - 3:].tolist() == [n - 3.0, n - 2.0, n - 1.0] and len(others) == 4


@pytest.mark.parametrize("lazy, fix", [(lambda t: torch._neg_view(t), "resolve_neg()"),
                                       (lambda t: torch.complex(t, t).conj(), "resolve_conj()")])
def test_a_lazily_negated_or_conjugated_view_is_refused_naming_the_fix(lazy, fix):
    """Its memory holds the values before the negation (conjugation): reading it would give
    a + b for add(-a, b)."""
    a = torch.arange(4, dtype=torch.float32)
    with pytest.raises(ValueError, match=r"mojo_train.add: a is a lazily .* pass a\.%s" % fix.replace("(", r"\(")
                       .replace(")", r"\)")):
        mt.add(lazy(a), a)


def test_a_tensor_without_memory_is_refused():
    t = torch.ones(8)
    t.untyped_storage().resize_(0)
    with pytest.raises(ValueError, match=r"mojo_train.add: a has no memory to read \(address 0 for 32 bytes"):
        mt.add(t, torch.ones(8))


def test_a_subclass_exporting_its_own_way_is_asked():
    """A Tensor subclass with its own __dlpack__ is asked for its memory, not read around it."""
    class Refusing(torch.Tensor):
        def __dlpack__(self, *args, **kwargs):
            raise BufferError("this tensor does not export")

    t = torch.ones(4).as_subclass(Refusing)
    with pytest.raises(BufferError, match="does not export"):
        probe(t, "x", "add")
    assert probe(torch.nn.Parameter(torch.ones(4)), "x", "add").address   # Parameter: read from its fields


def test_a_single_tensor_is_one_parameter_not_a_list_of_its_rows(mode):
    _need(mode, "optim")
    t = torch.ones(3, 4, requires_grad=True)
    opt = mt.AdamW(t, numeric_mode=mode.numeric_mode)
    assert len(opt.params) == 1 and opt.params[0] is t and opt.n_total == 12


@pytest.mark.parametrize("requires_grad", [False, True])
def test_embedding_takes_a_cpu_tensor_as_weight_and_from_pretrained(mode, requires_grad):
    _need(mode, "embedding")
    t = torch.tensor(_values(8)).reshape(4, 2).requires_grad_(requires_grad)
    rows = t.tolist()
    for layer in (Embedding(4, 2, weight=t, numeric_mode=mode.numeric_mode),
                  Embedding.from_pretrained(t, numeric_mode=mode.numeric_mode)):
        assert layer.forward(torch.tensor([3, 0, 3])).tolist() == [rows[3], rows[0], rows[3]]
        assert layer.weight.tolist() == rows and isinstance(layer.weight, Array)     # its own copy
    assert Embedding.from_pretrained(t).freeze


# ---- writing: in place, without a copy, versions bumped -------------------------------------
@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_an_optimizer_updates_params_that_require_grad_in_place_as_on_our_arrays(mode, kind):
    _need(mode, "optim")
    make = getattr(mt, kind)
    params = [torch.tensor(_values(6)).reshape(2, 3).requires_grad_(), torch.tensor(_values(5, 0.5)).requires_grad_()]
    ours = [Array.from_buffer(p) for p in params]
    grads = [torch.tensor(_values(6, -0.125)).reshape(2, 3), torch.tensor(_values(5, 0.375))]
    addresses = [p.data_ptr() for p in params]
    opt, ref = make(params, lr=0.1, numeric_mode=mode.numeric_mode), make(ours, lr=0.1, numeric_mode=mode.numeric_mode)
    for _ in range(3):
        opt.step(grads)
        ref.step([Array.from_buffer(g) for g in grads])
    assert [p.data_ptr() for p in params] == addresses and all(p.requires_grad for p in params)
    assert [p.detach().numpy().tobytes() for p in params] == [a.tobytes() for a in ours]
    assert ours[0].tolist() != Array.from_buffer(torch.tensor(_values(6)).reshape(2, 3)).tolist()
    assert [p._version for p in params] == [3, 3] and [g._version for g in grads] == [0, 0]


@pytest.mark.parametrize("kind", ["AdamW", "SGD"])
def test_a_tensor_saved_for_backward_then_stepped_makes_backward_raise(mode, kind):
    _need(mode, "optim")
    w = torch.ones(4, requires_grad=True)
    loss = (w * torch.arange(4.0)).sum() * (w * w).sum()       # saves w
    getattr(mt, kind)([w], numeric_mode=mode.numeric_mode).step([torch.ones(4)])
    with pytest.raises(RuntimeError, match=STALE):
        loss.backward()


def test_a_refused_step_leaves_the_params_and_their_version_alone(mode):
    _need(mode, "optim")
    w = torch.ones(4, requires_grad=True)
    loss = (w * w).sum()
    opt = mt.AdamW([w], numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError):
        opt.step([torch.tensor([0.0, float("nan"), 0.0, 0.0])])
    assert w._version == 0 and w.tolist() == [1.0] * 4 and opt.t == 0
    loss.backward()
    assert w.grad.tolist() == [2.0] * 4


def test_clipping_and_zero_grad_bump_the_gradients_version(mode):
    _need(mode, "optim", "clip")
    grads = [torch.full((3,), 4.0), torch.full((2,), 3.0, requires_grad=True)]
    assert mt.clip_grad_norm_(grads, 1.0, numeric_mode=mode.numeric_mode) == pytest.approx(66 ** 0.5)
    assert [g._version for g in grads] == [1, 1]
    assert grads[0].tolist()[0] == pytest.approx(4.0 / 66 ** 0.5, rel=1e-5)
    opt = mt.SGD([torch.zeros(3), torch.zeros(2)], numeric_mode=mode.numeric_mode)
    opt.zero_grad(grads)
    assert [g._version for g in grads] == [2, 2] and grads[0].tolist() == [0.0] * 3
    opt.step(grads, max_norm=1.0)
    assert [g._version for g in grads] == [3, 3]


def _write_out(mode, op, x, out):
    if op == "add":
        _need(mode, "elementwise")
        return mt.add(x, x, out=out, numeric_mode=mode.numeric_mode)
    _need(mode, "random")
    return mt.Generator(5, numeric_mode=mode.numeric_mode).dropout(x, 0.5, out=out)[0]


@pytest.mark.parametrize("op", ["add", "dropout"])
def test_an_out_tensor_written_bumps_its_version_so_a_stale_save_is_detected(mode, op):
    out = torch.zeros(6)
    w = torch.ones(6, requires_grad=True)
    loss = (w * out).sum()                                      # saves out
    _write_out(mode, op, torch.tensor(_values(6)), out)
    assert out._version == 1 and out.tolist() != [0.0] * 6
    with pytest.raises(RuntimeError, match=STALE):
        loss.backward()


@pytest.mark.parametrize("op", ["add", "dropout"])
def test_an_out_that_requires_grad_is_refused_in_grad_mode_as_torch_refuses_it(mode, op):
    x, out = torch.tensor(_values(6)), torch.zeros(6, requires_grad=True)
    with pytest.raises(RuntimeError, match="don't support automatic differentiation"):
        torch.add(x, x, out=out)                                # the reference's rule
    with pytest.raises(RequiresGradError, match=r"out requires grad.*pass out\.detach\(\) or call under "
                                                 r"torch\.no_grad\(\)") as refused:
        _write_out(mode, op, x, out)
    assert isinstance(refused.value, ValueError) and isinstance(refused.value, RuntimeError)
    assert out.tolist() == [0.0] * 6 and out._version == 0
    with torch.no_grad():
        _write_out(mode, op, x, out)
    assert out._version == 1 and out.tolist() != [0.0] * 6 and out.requires_grad


def test_embedding_backward_into_a_torch_grad_bumps_it_and_refuses_one_requiring_grad(mode):
    _need(mode, "embedding")
    dy = torch.ones(3, 2)
    grad = torch.zeros(4, 2)
    embedding_backward(dy, torch.tensor([1, 1, 3]), 4, grad=grad, numeric_mode=mode.numeric_mode)
    assert grad.tolist() == [[0.0, 0.0], [2.0, 2.0], [0.0, 0.0], [1.0, 1.0]] and grad._version == 1
    tracked = torch.zeros(4, 2, requires_grad=True)
    with pytest.raises(RequiresGradError, match=r"^mojo_train\.embedding_backward: grad requires grad"):
        embedding_backward(dy, torch.tensor([1, 1, 3]), 4, grad=tracked, numeric_mode=mode.numeric_mode)
    assert tracked._version == 0 and tracked.tolist() == [[0.0, 0.0]] * 4


# ---- refusals say the torch fix -------------------------------------------------------------
@pytest.mark.parametrize("requires_grad, fix", [(False, r"params\[0\]\.float\(\)"),
                                                (True, r"params\[0\]\.detach\(\)\.float\(\)")])
def test_a_float64_param_is_refused_saying_float(mode, requires_grad, fix):
    _need(mode, "optim")
    t = torch.ones(3, dtype=torch.float64, requires_grad=requires_grad)
    with pytest.raises(TypeError, match=r"^mojo_train\.AdamW: params\[0\] has dtype float64; .*\(convert "
                                        r"with %s\)$" % fix):
        mt.AdamW([t], numeric_mode=mode.numeric_mode)


@pytest.mark.parametrize("requires_grad, fix", [(False, r"weight\.contiguous\(\)"),
                                                (True, r"weight\.detach\(\)\.contiguous\(\)")])
def test_a_strided_tensor_is_refused_saying_contiguous(mode, requires_grad, fix):
    _need(mode, "embedding")
    t = torch.ones(3, 4, requires_grad=requires_grad).t()
    with pytest.raises(ValueError, match=r"^mojo_train\.embedding_forward: weight must be C-contiguous "
                                         r"\(got a strided view of shape \(4, 3\)\); pass %s$" % fix):
        mt.embedding.embedding_forward(t, [0], numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError, match=r"^mojo_train\.Array\.from_buffer: obj is a strided view .*; pass "
                                         r"obj(\.detach\(\))?\.contiguous\(\)$"):
        Array.from_buffer(t)


def test_float_ids_are_refused_saying_long(mode):
    _need(mode, "embedding")
    with pytest.raises(TypeError, match=r"^mojo_train\.embedding_forward: ids has dtype float32; .*\(convert "
                                        r"with ids\.long\(\)\)$"):
        mt.embedding.embedding_forward(torch.ones(3, 2), torch.zeros(2), numeric_mode=mode.numeric_mode)


# ---- the adapter's own probe (mojo_train/torch/_tensors.py: probed) ----------------------------
def _fields(p):
    """Every field of a Probe, the view as its format, shape and bytes."""
    out = {name: getattr(p, name) for name in p.__slots__ if name not in ("view", "obj", "versioned")}
    out["view"] = None if p.view is None else (p.view.format, p.view.shape, p.view.tobytes())
    return out


def _probe_cases(device):
    g = torch.Generator().manual_seed(5)
    base = torch.rand(6, 5, generator=g)
    return {
        "matrix": base.clone(),
        "vector": base[1].clone(),
        "0-d": torch.tensor(2.5),
        "offset row": base[2:4],                        # contiguous, not at its storage's start
        "odd size-1 stride": base.reshape(-1)[:5].as_strided((1, 5), (9, 1)),   # contiguous for torch
        "unsqueezed": base.unsqueeze(1),                # (6, 1, 5)
        "parameter": torch.nn.Parameter(base.clone()),
        "requires grad": base.clone().requires_grad_(),
        "int64 ids": torch.tensor([[3, 0, 7]]),
        "int32 ids": torch.tensor([1, 2], dtype=torch.int32),
    }


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_probed_is_the_probe_the_native_api_makes_of_the_tensor(device):
    """The adapter hands the native API a Probe read from torch's metadata; every field must be
    the one _buffer.probe reads through DLPack (CPU) or __cuda_array_interface__ (CUDA)."""
    from mojo_train.torch._tensors import probed
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    for name, t in _probe_cases(device).items():
        t = t.to(device) if device != "cpu" else t
        assert t.is_contiguous(), name
        fast, slow = probed(t), probe(t, "x", "test")
        assert type(fast) is type(slow), name
        assert _fields(fast) == _fields(slow), name
        assert fast.obj is t and fast.versioned is t and slow.obj is t and slow.versioned is t, name


def test_probed_hands_over_anything_unusual_as_the_tensor_itself():
    """What probed does not describe goes to the native API as before (its own probe, its own
    refusal): another dtype, a strided or empty tensor, a negated view, a sparse tensor, a
    subclass."""
    from mojo_train.torch._tensors import probed

    class Tagged(torch.Tensor):
        pass
    x = torch.rand(4, 3)
    cases = [x.double(), x.half(), x.to(torch.bfloat16), x.t(), torch.zeros(0, 3), torch.zeros(4, 0),
             x._neg_view(), x.to_sparse(), x.as_subclass(Tagged), torch.ones(3, dtype=torch.int16),
             torch.ones(3, dtype=torch.bool)]
    for t in cases:
        assert probed(t) is t
    assert probed(None) is None


def test_a_probed_cpu_view_keeps_the_tensor_alive_and_sees_its_writes():
    from mojo_train.torch._tensors import probed
    t = torch.zeros(3)
    p = probed(t)
    view = p.view
    del t, p
    gc.collect()
    assert view.tolist() == [0.0, 0.0, 0.0]
    t = torch.zeros(4)
    p = probed(t)
    t[1] = 5.0
    assert p.view.tolist() == [0.0, 5.0, 0.0, 0.0] and p.address == t.data_ptr()


def test_the_raw_stream_handle_is_the_current_streams():
    """wait_for_torch reads torch's current stream through its raw accessor: the very handle
    torch.cuda.current_stream gives, on the default stream (0: no wait) and on a side stream."""
    from mojo_train.torch._tensors import _RAW_STREAM, wait_for_torch
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    device = torch.zeros(1, device="cuda").device
    if _RAW_STREAM is not None:
        assert _RAW_STREAM(device.index) == torch.cuda.current_stream(device).cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        if _RAW_STREAM is not None:
            assert _RAW_STREAM(device.index) == side.cuda_stream != 0
        x = torch.ones(1 << 20, device="cuda") * 3
        wait_for_torch(device)                  # the side stream drained: its work is complete
        assert side.query()
    assert float(x[0]) == 3.0
