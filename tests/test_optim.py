"""SGD, Adam and AdamW through the public Python API (clip_grad_norm_ on its own: test_clip.py).

Contract under test: a step updates the caller's buffers in place (array.array, memoryview,
numpy, mojo_train.Array) and, in the identical numeric mode, gives exactly the bits of the contract's
arithmetic replayed in Python (tests/_helpers.py), clipping included when ``max_norm`` is given;
the return value and the per-step reports (t, lr_, total_norm_, clip_coef_) are torch-like; lr
and lr_schedule are read at every step; torch keywords this library does not take are refused
by name; EVERY refusal leaves params, grads and state byte-identical; state_dict/load_state_dict
resume bit-identically, even in a fresh process; thread counts and concurrent Python threads
never change a bit.
"""
import array
import struct
import math
import os
import pickle
import subprocess
import sys
import threading

import pytest

from mojo_train import SGD, Adam, AdamW, Array
from mojo_train._native import ffi

from _helpers import (EQUAL, KINDS, REPO, digest, equal_grads, f32, f32_array, flat, grads_for_step,
                      make_optimizer, params_for, raw, ref_adam, ref_clip, ref_sgd, snapshot, state_buffers,
                      wide_array)

SIZES = (5, 300, 130)
ALL_KINDS = sorted(KINDS)


def copies(tensors):
    return [array.array("f", t) for t in tensors]


def library_one_minus_pow(backend, base, t):
    out = ffi.new("float[1]")
    assert backend.lib.mt_one_minus_pow(out, base, t) == 0
    return out[0]


# ---- the contract's bits (identical numeric mode) ---------------------------------------------------

class Replay:
    """The contract replayed in Python for one optimizer kind, step by step."""

    def __init__(self, kind, params, backend):
        self.cls, self.kw = KINDS[kind]
        self.p = flat(params)
        self.m = [0.0] * len(self.p)
        self.v = [0.0] * len(self.p)
        self.t = 0
        self.backend = backend

    def step(self, grads, max_norm=None):
        self.t += 1
        total = coef = None
        grads = [list(g) for g in grads]
        if max_norm is not None:
            total, coef, grads = ref_clip(grads, max_norm)
        g = flat(grads)
        kw = self.kw
        if self.cls == "SGD":
            ref_sgd(self.p, g, self.m, self.t > 1, kw["lr"], kw.get("momentum", 0.0),
                    kw.get("dampening", 0.0), kw.get("weight_decay", 0.0), kw.get("nesterov", False),
                    kw.get("maximize", False))
        else:
            b1, b2 = kw.get("betas", (0.9, 0.999))
            bc1 = library_one_minus_pow(self.backend, f32(b1), self.t)
            bc2 = library_one_minus_pow(self.backend, f32(b2), self.t)
            ref_adam(self.p, g, self.m, self.v, kw["lr"], b1, b2, kw.get("eps", 1e-8),
                     kw.get("weight_decay", 0.01 if self.cls == "AdamW" else 0.0),
                     kw.get("maximize", False), self.cls == "AdamW", bc1, bc2)
        return total, coef, grads


@pytest.mark.parametrize("max_norm", [None, 4.0, 1e9])
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_identical_step_gives_the_contracts_bits(identical, kind, max_norm):
    params = params_for(SIZES)
    replay = Replay(kind, params, identical.backend)
    opt = make_optimizer(kind, params, identical.numeric_mode)
    for t in (1, 2, 3):
        grads = grads_for_step(SIZES, t)
        total, coef, clipped = replay.step(grads, max_norm)
        assert opt.step(grads, max_norm=max_norm) == total
        assert (opt.total_norm_, opt.clip_coef_) == (total, coef)
        assert flat(grads) == flat(clipped)
        assert flat(params) == replay.p
        if KINDS[kind][0] != "SGD":
            assert opt.exp_avg.tolist() == replay.m and opt.exp_avg_sq.tolist() == replay.v
        elif opt.exp_avg is not None:
            assert opt.exp_avg.tolist() == replay.m


def test_identical_clip_crosses_chunks_and_lanes_with_the_contracts_bits(identical):
    sizes = (4096 + 129, 1, 257)
    params = params_for(sizes, seed=4)
    replay = Replay("adamw", params, identical.backend)
    opt = make_optimizer("adamw", params, identical.numeric_mode)
    grads = [wide_array(n, 50 + j) for j, n in enumerate(sizes)]
    total, coef, clipped = replay.step(grads, 1.0)
    assert opt.step(grads, max_norm=1.0) == total and coef < 1.0
    assert flat(grads) == flat(clipped)
    assert flat(params) == replay.p


# ---- in place, for every kind of buffer ------------------------------------------------------

def _containers(kind_name, values_2d):
    """Two tensors of shape (3, 4) and (5,) as ``kind_name`` buffers holding ``values_2d``."""
    a, b = values_2d
    if kind_name == "array.array":
        return [array.array("f", a), array.array("f", b)]
    if kind_name == "memoryview":
        return [memoryview(bytearray(array.array("f", a).tobytes())).cast("f", (3, 4)),
                memoryview(bytearray(array.array("f", b).tobytes())).cast("f")]
    if kind_name == "numpy":
        np = pytest.importorskip("numpy")
        return [np.array(a, dtype=np.float32).reshape(3, 4), np.array(b, dtype=np.float32)]
    if kind_name == "Array":
        return [Array.from_list(a).reshape(3, 4), Array.from_list(b)]
    raise AssertionError(kind_name)


CONTAINERS = ["array.array", "memoryview", "numpy", "Array"]


@pytest.mark.parametrize("container", CONTAINERS)
@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_updates_every_kind_of_buffer_in_place(mode, kind, container):
    p0 = [f32_array(12, 1).tolist(), f32_array(5, 2).tolist()]
    gs = [[f32_array(12, 10 + t).tolist(), f32_array(5, 20 + t).tolist()] for t in range(3)]
    reference = [array.array("f", p) for p in p0]
    ref_opt = make_optimizer(kind, reference, mode.numeric_mode)
    params = _containers(container, p0)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    assert all(a is b for a, b in zip(opt.params, params))
    for t in range(3):
        g_ref = [array.array("f", g) for g in gs[t]]
        g = _containers(container, gs[t])
        assert ref_opt.step(g_ref, max_norm=1.5) == opt.step(g, max_norm=1.5)
        assert [raw(x) for x in g] == [raw(x) for x in g_ref]
    assert [raw(x) for x in params] == [raw(x) for x in reference]
    assert [raw(x) for x in params] != [raw(array.array("f", p)) for p in p0]
    assert [raw(s) for s in state_buffers(opt)] == [raw(s) for s in state_buffers(ref_opt)]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_accepts_read_only_grads_without_clipping_and_leaves_them_alone(mode, kind):
    params = params_for(SIZES)
    grads = grads_for_step(SIZES, 1)
    frozen = [memoryview(g.tobytes()).cast("f") for g in grads]
    twin = params_for(SIZES)
    make_optimizer(kind, params, mode.numeric_mode).step(frozen)
    make_optimizer(kind, twin, mode.numeric_mode).step(grads)
    assert [raw(p) for p in params] == [raw(p) for p in twin]
    assert [raw(g) for g in frozen] == [raw(g) for g in grads]


# ---- what a step reports -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_returns_none_without_max_norm_and_sets_the_reports(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    assert (opt.t, opt.lr_, opt.total_norm_, opt.clip_coef_) == (0, None, None, None)
    assert opt.step(grads_for_step(SIZES, 1)) is None
    assert opt.t == 1 and opt.lr_ == f32(KINDS[kind][1]["lr"])
    assert opt.total_norm_ is None and opt.clip_coef_ is None


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_with_max_norm_returns_the_pre_clip_total_and_scales_grads(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    grads = grads_for_step(SIZES, 1)
    before = flat(grads)
    total = opt.step(grads, max_norm=1.0)
    assert isinstance(total, float) and total == opt.total_norm_ == f32(total)
    assert math.isclose(total, math.sqrt(sum(x * x for x in before)), rel_tol=1e-5)
    assert opt.clip_coef_ == f32(opt.clip_coef_) and 0.0 < opt.clip_coef_ < 1.0
    assert math.isclose(opt.clip_coef_, 1.0 / (total + 1e-6), rel_tol=1e-6)
    after = flat(grads)
    assert all(a == f32(b * opt.clip_coef_) for a, b in zip(after, before))
    assert opt.t == 1
    # a generous max_norm: coefficient 1, gradients untouched
    grads = grads_for_step(SIZES, 2)
    before = [raw(g) for g in grads]
    total = opt.step(grads, max_norm=1e6)
    assert opt.clip_coef_ == 1.0 and total == opt.total_norm_
    assert [raw(g) for g in grads] == before and opt.t == 2
    # and no clipping again
    assert opt.step(grads) is None and opt.total_norm_ is None and opt.t == 3


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_lr_is_read_at_every_step(mode, kind):
    runs = []
    for lrs in ((0.1, 0.1, 0.1), (0.1, 0.03, 0.2)):
        params = params_for(SIZES)
        opt = make_optimizer(kind, params, mode.numeric_mode, lr=lrs[0])
        for t, lr in enumerate(lrs, 1):
            opt.lr = lr
            opt.step(grads_for_step(SIZES, t))
            assert opt.lr_ == f32(lr)
        runs.append([raw(p) for p in params])
    assert runs[0] != runs[1]


class Schedule:
    """An lr_schedule: ``lr_at(t)`` with one-based t; records every call."""

    def __init__(self, values):
        self.values, self.calls = values, []

    def lr_at(self, t):
        self.calls.append(t)
        return self.values[t - 1]


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_lr_schedule_is_asked_for_every_one_based_step_and_used(mode, kind):
    lrs = [0.1, 0.03, 0.2, 0.05]
    sched = Schedule(lrs)
    params, manual = params_for(SIZES), params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode, lr=123.0, lr_schedule=sched)
    man = make_optimizer(kind, manual, mode.numeric_mode)
    for t, lr in enumerate(lrs, 1):
        g = grads_for_step(SIZES, t)
        opt.step(g)
        man.lr = lr
        man.step(copies(g))
        assert opt.lr_ == f32(lr)
    assert sched.calls == [1, 2, 3, 4]
    assert [raw(p) for p in params] == [raw(p) for p in manual]


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_lr_schedule_without_lr_at_is_refused(cls):
    with pytest.raises(TypeError, match="lr_schedule"):
        cls(array.array("f", [1.0]), lr_schedule=lambda t: 0.1)


# ---- zero_grad and defaults --------------------------------------------------------------------

@pytest.mark.parametrize("container", CONTAINERS)
def test_zero_grad_writes_positive_zero_everywhere(mode, container):
    params = _containers(container, [[1.0] * 12, [2.0] * 5])
    grads = _containers(container, [[-0.0, float("nan"), float("inf"), -1.5] * 3, [-0.0] * 5])
    opt = SGD(params, numeric_mode=mode.numeric_mode)
    opt.zero_grad(grads)
    assert all(raw(g) == bytes(len(raw(g))) for g in grads)
    assert [raw(p) for p in params] == [raw(x) for x in _containers(container, [[1.0] * 12, [2.0] * 5])]


def test_zero_grad_refuses_read_only_and_mismatched_grads(mode):
    opt = SGD([array.array("f", [1.0] * 4)], numeric_mode=mode.numeric_mode)
    frozen = memoryview(array.array("f", [3.0] * 4).tobytes()).cast("f")
    with pytest.raises(ValueError, match="grads"):
        opt.zero_grad([frozen])
    short = array.array("f", [3.0] * 3)
    with pytest.raises(ValueError, match="shape"):
        opt.zero_grad([short])
    assert short.tolist() == [3.0] * 3


def test_adamw_default_weight_decay_is_torchs_0_01(mode):
    assert AdamW(array.array("f", [1.0]), numeric_mode=mode.numeric_mode).weight_decay == 0.01
    assert Adam(array.array("f", [1.0]), numeric_mode=mode.numeric_mode).weight_decay == 0.0
    results = []
    for kwargs in ({}, {"weight_decay": 0.01}, {"weight_decay": 0.0}):
        p = f32_array(64, 1, 1.0, 2.0)
        AdamW(p, lr=0.1, numeric_mode=mode.numeric_mode, **kwargs).step(f32_array(64, 2))
        results.append(p.tobytes())
    assert results[0] == results[1] != results[2]


# ---- torch's keywords ----------------------------------------------------------------------------

KIND_OF = {SGD: "sgd_momentum", Adam: "adam", AdamW: "adamw"}
BOTH = (None, False, True)
# the values torch users write that ask for nothing this library lacks, per class (torch's own)
SWITCHES_TAKEN = {
    SGD: {"foreach": BOTH, "fused": BOTH, "differentiable": (False,)},
    Adam: {"foreach": BOTH, "fused": BOTH, "differentiable": (False,), "amsgrad": (False,),
           "capturable": (False,), "decoupled_weight_decay": (False,)},
    AdamW: {"foreach": BOTH, "fused": BOTH, "differentiable": (False,), "amsgrad": (False,),
            "capturable": (False,)},
}
TAKEN = [(cls, kw, v) for cls, table in SWITCHES_TAKEN.items() for kw, vals in table.items() for v in vals]


@pytest.mark.parametrize("cls, keyword, value", TAKEN, ids=["%s-%s=%s" % (c.__name__, k, v) for c, k, v in TAKEN])
def test_torch_switches_asking_for_nothing_we_lack_are_taken_and_change_no_bit(mode, cls, keyword, value):
    kind = KIND_OF[cls]
    plain, switched = params_for(SIZES), params_for(SIZES)
    a = make_optimizer(kind, plain, mode.numeric_mode)
    b = make_optimizer(kind, switched, mode.numeric_mode, **{keyword: value})
    for t in (1, 2):
        assert a.step(grads_for_step(SIZES, t), max_norm=2.0) == b.step(grads_for_step(SIZES, t), max_norm=2.0)
    assert digest(a) == digest(b)
    assert [raw(p) for p in switched] != [raw(p) for p in params_for(SIZES)]


REFUSED_SWITCHES = [
    (SGD, "differentiable", True, NotImplementedError, "no autograd"),
    (Adam, "capturable", True, NotImplementedError, "CUDA-graph"),
    (Adam, "differentiable", True, NotImplementedError, "no autograd"),
    (Adam, "decoupled_weight_decay", True, ValueError, "mojo_train.AdamW"),
    (AdamW, "capturable", True, NotImplementedError, "CUDA-graph"),
    (AdamW, "differentiable", True, NotImplementedError, "no autograd"),
    (AdamW, "decoupled_weight_decay", False, TypeError, "always decoupled"),   # torch's AdamW lacks it
    (AdamW, "decoupled_weight_decay", True, TypeError, "always decoupled"),
    (SGD, "amsgrad", False, TypeError, "unexpected keyword"),                   # torch's SGD lacks both
    (SGD, "capturable", False, TypeError, "unexpected keyword"),
]


@pytest.mark.parametrize("cls, keyword, value, exc, reason", REFUSED_SWITCHES,
                         ids=["%s-%s=%s" % c[:3] for c in REFUSED_SWITCHES])
def test_torch_switches_asking_for_what_we_lack_are_refused_by_name_with_the_reason(cls, keyword, value, exc, reason):
    p = array.array("f", [1.0, 2.0])
    with pytest.raises(exc, match=reason) as info:
        cls(p, **{keyword: value})
    assert str(info.value).startswith("mojo_train.%s: " % cls.__name__)
    assert keyword in str(info.value)
    assert p.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("keyword, value", [("fused", 1), ("foreach", "yes"), ("amsgrad", None),
                                            ("capturable", 0), ("differentiable", "False")])
def test_torch_switches_of_another_type_are_refused_naming_the_values_taken(keyword, value):
    with pytest.raises(TypeError, match="%s must be (None, )?True or False, got %r" % (keyword, value)):
        Adam(array.array("f", [1.0]), **{keyword: value})


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_fused_and_foreach_both_true_are_refused_as_torch_refuses_them(cls):
    with pytest.raises(ValueError, match="fused=True and foreach=True"):
        cls(array.array("f", [1.0]), fused=True, foreach=True)


def test_adams_sixth_positional_argument_is_amsgrad_as_in_torch():
    opt = Adam(array.array("f", [1.0]), 1e-3, (0.9, 0.999), 1e-8, 0.0, True)
    assert opt.amsgrad is True and opt.param_groups[0]["amsgrad"] is True
    assert opt.max_exp_avg_sq.tolist() == [0.0]
    with pytest.raises(TypeError):
        SGD(array.array("f", [1.0]), 1e-3, 0.0, 0.0, 0.0, False, True)   # maximize is keyword-only, as in torch


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_torchs_arguments_have_torchs_names_kinds_and_defaults(cls):
    torch = pytest.importorskip("torch")
    import inspect
    ours = inspect.signature(cls.__init__).parameters
    theirs = inspect.signature(getattr(torch.optim, cls.__name__).__init__).parameters
    for name, param in theirs.items():
        if name in ("self", "params"):
            continue
        assert name in ours, name
        assert ours[name].kind == param.kind, name
        assert ours[name].default == param.default, name
    positional = [n for n, p in ours.items() if p.kind == p.POSITIONAL_OR_KEYWORD]
    assert positional == [n for n, p in theirs.items() if p.kind == p.POSITIONAL_OR_KEYWORD]


TORCH_KEYWORDS = {"param_groups": [], "dtype": "float32", "device": "cpu"}


@pytest.mark.parametrize("keyword", sorted(TORCH_KEYWORDS))
@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_torch_keywords_we_do_not_take_are_refused_by_name_with_the_reason(cls, keyword):
    p = array.array("f", [1.0, 2.0])
    with pytest.raises(TypeError) as info:
        cls(p, **{keyword: TORCH_KEYWORDS[keyword]})
    msg = str(info.value)
    assert keyword in msg
    reason = msg.split(keyword, 1)[1]
    assert "not supported" in reason and len(reason.split()) >= 5, msg
    assert p.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_unknown_keywords_are_refused_by_name(cls):
    with pytest.raises(TypeError, match="'betas2'"):
        cls(array.array("f", [1.0]), betas2=0.5)


# ---- every refusal changes nothing ---------------------------------------------------------------

class Ctx:
    """A warmed-up optimizer (two steps) with valid grads for the next step, and a twin that
    never sees the refusal."""

    def __init__(self, kind, mode):
        self.kind, self.mode = kind, mode
        self.is_sgd = KINDS[kind][0] == "SGD"
        self.params = params_for(SIZES)
        self.opt = make_optimizer(kind, self.params, mode.numeric_mode)
        self.twin_params = params_for(SIZES)
        self.twin = make_optimizer(kind, self.twin_params, mode.numeric_mode)
        for t in (1, 2):
            self.opt.step(grads_for_step(SIZES, t), max_norm=2.0)
            self.twin.step(grads_for_step(SIZES, t), max_norm=2.0)
        self.grads = grads_for_step(SIZES, 3)

    def with_grad(self, j, value):
        g = copies(self.grads)
        g[j] = value
        return g

    def numpy(self):
        return pytest.importorskip("numpy")


def _step(ctx, grads, **kw):
    return lambda: ctx.opt.step(grads, **kw)


def case_float64_grads(c):
    return _step(c, c.with_grad(1, array.array("d", c.grads[1]))), TypeError, "float64"


def case_float16_grads(c):
    np = c.numpy()
    return _step(c, c.with_grad(1, np.zeros(300, np.float16))), TypeError, "float16"


def case_big_endian_grads(c):
    np = c.numpy()
    return _step(c, c.with_grad(1, np.zeros(300, ">f4"))), TypeError, "big-endian"


def case_int32_grads(c):
    return _step(c, c.with_grad(0, array.array("i", [1] * 5))), TypeError, "int32"


def case_empty_grad_tensor(c):
    return _step(c, c.with_grad(0, array.array("f"))), ValueError, r"grads\[0\]"


def case_non_contiguous_grads(c):
    np = c.numpy()
    return _step(c, c.with_grad(1, np.zeros(600, np.float32)[::2])), ValueError, "contiguous"


def case_read_only_grads_with_max_norm(c):
    frozen = memoryview(c.grads[2].tobytes()).cast("f")
    return _step(c, c.with_grad(2, frozen), max_norm=1.0), ValueError, "writable|read-only"


def case_grad_shape_mismatch(c):
    return _step(c, c.with_grad(1, array.array("f", [0.5] * 299))), ValueError, "shape"


def _grads_sharing_memory(clip):
    """grads[1] is all of one buffer, grads[2] a slice of it (grads[0] stays its own)."""
    def case(c):
        big = array.array("f", c.grads[1])
        c.extra = [big]
        g = copies(c.grads)
        g[1], g[2] = memoryview(big), memoryview(big)[100:230]
        kw = {"max_norm": 1.0} if clip else {}
        return _step(c, g, **kw), ValueError, r"grads\[1\] and grads\[2\] share memory"
    return case


def case_grad_is_a_param(c):
    return _step(c, c.with_grad(2, c.params[2])), ValueError, r"grads\[2\] and params\[2\] share memory"


def case_grad_overlaps_another_param(c):
    part = memoryview(c.params[1])[10:15]
    return _step(c, c.with_grad(0, part), max_norm=1.0), ValueError, r"grads\[0\] and params\[1\] share memory"


def case_grad_count_mismatch(c):
    return _step(c, c.grads[:2]), ValueError, r"grads must hold as many tensors as params, one per parameter in " \
                                              r"params' order: it holds 2, params 3"


def case_single_grad_for_three_params(c):
    return _step(c, array.array("f", [0.5] * 435)), ValueError, "tensors"


def _bad_grad(value, clip):
    def case(c):
        g = copies(c.grads)
        g[1][123] = value
        kw = {"max_norm": 1.0} if clip else {}
        return _step(c, g, **kw), ValueError, "grads|gradient norm"
    return case


def case_overflowing_grad_squares_with_clip(c):
    g = [array.array("f", [3e38] * n) for n in SIZES]
    return _step(c, g, max_norm=1.0), ValueError, "overflow"


def _bad_max_norm(value, exc):
    def case(c):
        return _step(c, c.grads, max_norm=value), exc, "max_norm"
    return case


def case_negative_lr(c):
    c.opt.lr = -0.1
    return _step(c, c.grads), ValueError, "lr"


def case_nan_lr(c):
    c.opt.lr = float("nan")
    return _step(c, c.grads), ValueError, "lr"


def case_lr_overflowing_float32(c):
    c.opt.lr = 1e39
    return _step(c, c.grads), ValueError, "lr"


def case_lr_schedule_gives_a_negative_lr(c):
    c.opt.lr_schedule = Schedule([-1.0] * 10)
    return _step(c, c.grads), ValueError, r"lr_schedule.lr_at\(3\)"


def case_lr_schedule_gives_a_string(c):
    c.opt.lr_schedule = Schedule(["0.1"] * 10)
    return _step(c, c.grads), TypeError, "lr_schedule"


def case_betas_out_of_range(c):
    if c.is_sgd:
        c.opt.momentum = -0.5          # SGD's own hyper-parameter out of range
        return _step(c, c.grads), ValueError, "momentum"
    c.opt.betas = (1.0, 0.999)
    return _step(c, c.grads), ValueError, r"betas\[0\] must be finite and in \[0\.0, 1\.0\), got 1\.0"


def case_nesterov_without_momentum(c):
    c.opt.nesterov, c.opt.momentum = True, 0.0
    return _step(c, c.grads), ValueError, "nesterov"


def _constructor(make_params, exc, match, **kw):
    """A refused constructor: nothing is written to the params it was given."""
    def case(c):
        p = make_params(c)
        c.extra = [p] if not isinstance(p, list) else p
        return lambda: make_optimizer(c.kind, p, c.mode.numeric_mode, **kw), exc, match
    return case


def _np_params(dtype):
    def make(c):
        np = c.numpy()
        return [np.ones(5, dtype)]
    return make


def _read_only_params(c):
    return [memoryview(array.array("f", [1.0] * 5).tobytes()).cast("f")]


def _strided_params(c):
    np = c.numpy()
    return [np.ones(10, np.float32)[::2]]


REFUSALS = {
    "float64 grads": case_float64_grads,
    "float16 grads": case_float16_grads,
    "big-endian grads": case_big_endian_grads,
    "int32 grads": case_int32_grads,
    "empty grad tensor": case_empty_grad_tensor,
    "non-contiguous grads": case_non_contiguous_grads,
    "read-only grads with max_norm": case_read_only_grads_with_max_norm,
    "grad shape mismatch": case_grad_shape_mismatch,
    "grad count mismatch": case_grad_count_mismatch,
    "grads sharing memory": _grads_sharing_memory(False),
    "grads sharing memory with clip": _grads_sharing_memory(True),
    "grad is a param": case_grad_is_a_param,
    "grad overlaps another param": case_grad_overlaps_another_param,
    "one grad for three params": case_single_grad_for_three_params,
    "nan grad": _bad_grad(float("nan"), False),
    "inf grad": _bad_grad(float("inf"), False),
    "-inf grad": _bad_grad(float("-inf"), False),
    "nan grad with clip": _bad_grad(float("nan"), True),
    "inf grad with clip": _bad_grad(float("inf"), True),
    "grad squares overflow the norm": case_overflowing_grad_squares_with_clip,
    "negative max_norm": _bad_max_norm(-1.0, ValueError),
    "nan max_norm": _bad_max_norm(float("nan"), ValueError),
    "inf max_norm": _bad_max_norm(float("inf"), ValueError),
    "string max_norm": _bad_max_norm("1.0", TypeError),
    "bool max_norm": _bad_max_norm(True, TypeError),
    "max_norm overflowing float32": _bad_max_norm(1e39, ValueError),
    "negative lr": case_negative_lr,
    "nan lr": case_nan_lr,
    "lr overflowing float32": case_lr_overflowing_float32,
    "negative scheduled lr": case_lr_schedule_gives_a_negative_lr,
    "string scheduled lr": case_lr_schedule_gives_a_string,
    "hyper-parameter out of range": case_betas_out_of_range,
    "nesterov without momentum": case_nesterov_without_momentum,
    "float64 params": _constructor(lambda c: [array.array("d", [1.0] * 5)], TypeError, "float64"),
    "float16 params": _constructor(_np_params("float16"), TypeError, "float16"),
    "int32 params": _constructor(lambda c: [array.array("i", [1] * 5)], TypeError, "int32"),
    "empty param list": _constructor(lambda c: [], ValueError, "empty"),
    "non-contiguous params": _constructor(_strided_params, ValueError, "contiguous"),
    "read-only params": _constructor(_read_only_params, ValueError, "writable|read-only"),
    "negative lr at construction": _constructor(lambda c: [array.array("f", [1.0])], ValueError, "lr", lr=-1.0),
}


def _constructor_hyper(c):
    if c.is_sgd:
        return _constructor(lambda c: [array.array("f", [1.0])], ValueError, "nesterov",
                            momentum=0.0, nesterov=True)(c)
    return _constructor(lambda c: [array.array("f", [1.0])], ValueError, r"betas\[1\]",
                        betas=(0.9, 1.0))(c)


REFUSALS["betas / nesterov out of range at construction"] = _constructor_hyper


SGD_ONLY = {"nesterov without momentum"}
REFUSAL_CASES = [(kind, case) for kind in ("sgd_momentum", "sgd_nesterov", "adam", "adamw")
                 for case in sorted(REFUSALS) if KINDS[kind][0] == "SGD" or case not in SGD_ONLY]


@pytest.mark.parametrize("kind, case", REFUSAL_CASES)
def test_every_refusal_leaves_params_grads_and_state_byte_identical(mode, kind, case):
    c = Ctx(kind, mode)
    c.extra = []
    call, exc, match = REFUSALS[case](c)
    before = snapshot(c.opt, *(c.params + c.grads + c.extra))
    with pytest.raises(exc, match=match):
        call()
    assert snapshot(c.opt, *(c.params + c.grads + c.extra)) == before
    assert c.opt.t == 2


@pytest.mark.parametrize("case", ["nan grad", "inf grad with clip", "grad squares overflow the norm",
                                  "read-only grads with max_norm", "grad shape mismatch",
                                  "negative max_norm", "float64 grads", "grads sharing memory with clip",
                                  "grad overlaps another param"])
@pytest.mark.parametrize("kind", ["sgd_momentum", "adam", "adamw"])
def test_a_refused_step_does_not_change_the_next_step(mode, kind, case):
    c = Ctx(kind, mode)
    c.extra = []
    call, exc, _ = REFUSALS[case](c)
    with pytest.raises(exc):
        call()
    twin_grads = copies(c.grads)         # the step clips c.grads in place
    c.opt.step(c.grads, max_norm=2.0)
    c.twin.step(twin_grads, max_norm=2.0)
    assert digest(c.opt) == digest(c.twin)


# ---- a parameter that became non-finite is stepped, not refused (optim.md step 3) ----------------

NONFINITE_KINDS = [("adamw", {}), ("adam", {"weight_decay": 0.0}), ("adam", {}), ("sgd_momentum", {"weight_decay": 0.0}),
                   ("sgd_momentum", {})]        # KINDS' adam and sgd_momentum have weight decay (coupled)


@pytest.mark.parametrize("max_norm", [None, 1.0])
@pytest.mark.parametrize("kind, extra", NONFINITE_KINDS, ids=lambda v: str(v))
def test_a_non_finite_parameter_is_stepped_and_every_other_element_is_the_finite_runs(mode, kind, extra, max_norm):
    """The step reads no parameter before its update, so a NaN or inf placed in a parameter
    after construction is stepped: NaN stays the canonical NaN, +inf stays +inf (AdamW's decay
    > 0; coupled weight decay makes it NaN: inf - inf, as torch's step does), and every other
    element of the parameters and of the state has the bits of a run without it; the state of
    the poisoned elements changes only where the update reads p into it (coupled weight decay)."""
    runs = []
    for poison in (False, True):
        params = params_for(EQUAL)
        opt = make_optimizer(kind, params, mode.numeric_mode, **extra)
        opt.step(equal_grads("Array", 1), max_norm=max_norm)
        if poison:
            params[2][7] = float("nan")
            params[1][3] = float("inf")
        opt.step(equal_grads("Array", 2), max_norm=max_norm)
        runs.append(([p.tobytes() for p in params], [bytes(raw(b)) for b in state_buffers(opt)]))
    (clean_p, clean_s), (dirty_p, dirty_s) = runs
    coupled = kind != "adamw" and dict(KINDS[kind][1], **extra).get("weight_decay", 0.0) != 0.0
    nan_bits, inf_bits = struct.pack("<I", 0x7fc00000), struct.pack("<f", float("inf"))
    assert dirty_p[2][28:32] == nan_bits and dirty_p[1][12:16] == (nan_bits if coupled else inf_bits)
    for j in range(len(clean_p)):
        poisoned = {2: 7, 1: 3}.get(j)
        for i in range(len(clean_p[j]) // 4):
            if i != poisoned:
                assert dirty_p[j][4 * i:4 * i + 4] == clean_p[j][4 * i:4 * i + 4], (j, i)
    poisoned_flat = {2 * EQUAL[0] + 7, 1 * EQUAL[0] + 3}          # flat positions in the moments (EQUAL sizes)
    for clean, dirty in zip(clean_s, dirty_s):
        if len(clean) != 4 * sum(EQUAL):                           # the SGD flags: untouched
            assert dirty == clean
            continue
        for k in range(sum(EQUAL)):
            a, b = clean[4 * k:4 * k + 4], dirty[4 * k:4 * k + 4]
            if k in poisoned_flat and coupled:                       # p read into the moment: not finite
                assert not math.isfinite(struct.unpack("<f", b)[0]), k
            else:
                assert a == b, k                                     # the moments never read p


# ---- gradients in memory of their own ------------------------------------------------------------

@pytest.mark.parametrize("container", ["Array", "array.array"])
@pytest.mark.parametrize("max_norm", [None, 1.0])
@pytest.mark.parametrize("kind", ["sgd_momentum", "adamw"])
def test_a_gradient_listed_twice_is_refused_naming_both_and_changes_nothing(mode, kind, max_norm, container):
    params = params_for(EQUAL)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    g = equal_grads(container, 1)
    twice = [g[0], g[1], g[2], g[0]]
    before = snapshot(opt, *g)
    with pytest.raises(ValueError, match=r"^mojo_train\.%s\.step: grads\[0\] and grads\[3\] share memory; pass each "
                       r"gradient once" % KINDS[kind][0]):
        opt.step(twice, max_norm=max_norm)
    assert snapshot(opt, *g) == before
    with pytest.raises(ValueError, match=r"grads\[0\] and grads\[3\] share memory"):
        opt.zero_grad(twice)
    assert snapshot(opt, *g) == before


def test_a_refused_gradient_list_does_not_disturb_the_one_remembered_before_it(mode):
    # Lists of our own arrays are remembered from step to step; a refused list must not leave
    # its addresses behind for the remembered one.
    params, twin_params = params_for(EQUAL), params_for(EQUAL)
    opt, twin = make_optimizer("adamw", params, mode.numeric_mode), make_optimizer("adamw", twin_params, mode.numeric_mode)
    g = equal_grads("Array", 1)
    other = equal_grads("Array", 2)
    opt.step(g)
    twin.step(equal_grads("Array", 1))
    with pytest.raises(ValueError, match="share memory"):
        opt.step([other[0], other[1], other[2], other[1]])
    opt.step(g)
    twin.step(equal_grads("Array", 1))
    assert digest(opt) == digest(twin)


def test_adjacent_gradients_in_one_buffer_are_their_own_memory(mode):
    flat_grads = array.array("f", [x for g in grads_for_step(SIZES, 1) for x in g])
    view, at = memoryview(flat_grads), [0, 5, 305, 435]
    halves = [view[at[j]:at[j + 1]] for j in range(3)]
    params, twin_params = params_for(SIZES), params_for(SIZES)
    opt, twin = make_optimizer("adam", params, mode.numeric_mode), make_optimizer("adam", twin_params, mode.numeric_mode)
    assert opt.step(halves, max_norm=1.0) == twin.step(grads_for_step(SIZES, 1), max_norm=1.0)
    assert digest(opt) == digest(twin)


@pytest.mark.parametrize("kind", ["sgd_momentum", "adam"])
def test_a_gradient_in_the_optimizers_own_state_is_refused(mode, kind):
    params = [array.array("f", [0.5] * 8)]
    opt = make_optimizer(kind, params, mode.numeric_mode, resident=False)   # state in host memory, as exp_avg gives it
    opt.step([array.array("f", [1.0] * 8)])
    names = [n for n in ("exp_avg", "exp_avg_sq") if getattr(opt, n) is not None]
    assert names == (["exp_avg"] if KINDS[kind][0] == "SGD" else ["exp_avg", "exp_avg_sq"])
    for name in names:
        state = getattr(opt, name)
        before = snapshot(opt)
        with pytest.raises(ValueError, match=r"grads\[0\] and the optimizer's %s share memory" % name):
            opt.step([state])
        with pytest.raises(ValueError, match=r"^mojo_train\.\w+\.step: grads and the optimizer's %s" % name):
            opt.step(state)           # a single buffer is named as the user passed it
        assert snapshot(opt) == before


def _accumulating(mode):
    """(params, an AdamW of accumulation_steps=2 over them, two microbatches' gradients)."""
    params = params_for(EQUAL)
    opt = make_optimizer("adamw", params, mode.numeric_mode, accumulation_steps=2)
    return params, opt, equal_grads("array.array", 1), equal_grads("array.array", 2)


def test_step_accumulated_refuses_a_microbatch_gradient_listed_twice_or_in_a_param(mode):
    params, opt, a, b = _accumulating(mode)
    before = snapshot(opt, *(a + b))
    with pytest.raises(ValueError, match=r"microbatch_grads\[1\]\[0\] and microbatch_grads\[1\]\[2\] share memory"):
        opt.step_accumulated([a, [b[0], b[1], b[0], b[3]]], None, max_norm=1.0)
    with pytest.raises(ValueError, match=r"microbatch_grads\[0\]\[1\] and params\[3\] share memory"):
        opt.step_accumulated([[a[0], params[3], a[2], a[3]], b], None)
    assert snapshot(opt, *(a + b)) == before
    opt.step_accumulated([a, a], None)      # one list in two microbatches is read twice, not shared
    assert opt.t == 1


def _new_empty(container):
    return (lambda: Array((0,), "float32")) if container == "Array" else (lambda: array.array("f"))


@pytest.mark.parametrize("container", ["Array", "array.array"])
@pytest.mark.parametrize("max_norm", [None, 1.0])
@pytest.mark.parametrize("kind", ["sgd_momentum", "adam", "adamw"])
def test_an_empty_gradient_listed_twice_or_given_as_its_parameter_is_refused(mode, kind, max_norm, container):
    # The parameters' rule: one object in two places is refused, though an empty tensor shares no
    # memory (clip_grad_norm_, torch's function, takes it as torch does: test_clip.py).
    new = _new_empty(container)
    params = [array.array("f", [0.5, -0.5]), new(), new()]
    opt = make_optimizer(kind, params, mode.numeric_mode)
    g = Array.from_list([1.0, 2.0]) if container == "Array" else array.array("f", [1.0, 2.0])
    opt.step([g, new(), new()], max_norm=max_norm)          # distinct empty gradients: taken
    e = new()
    before = snapshot(opt, g)
    for _ in range(2):                                      # a refused list is not remembered as checked
        with pytest.raises(ValueError, match=r"^mojo_train\.%s\.step: grads\[1\] and grads\[2\] are the same tensor; "
                                             r"pass each gradient once, in memory of its own$" % KINDS[kind][0]):
            opt.step([g, e, e], max_norm=max_norm)
    with pytest.raises(ValueError, match=r"grads\[2\] and params\[2\] are the same tensor"):
        opt.step([g, new(), params[2]], max_norm=max_norm)
    with pytest.raises(ValueError, match=r"^mojo_train\.\w+\.zero_grad: grads\[1\] and grads\[2\] are the same tensor"):
        opt.zero_grad([g, e, e])
    assert snapshot(opt, g) == before
    opt.step([g, e, new()], max_norm=max_norm)
    assert opt.t == 2


def test_step_accumulated_refuses_an_empty_microbatch_gradient_listed_twice(mode):
    new = _new_empty("array.array")
    params = [array.array("f", [0.5, -0.5]), new(), new()]
    opt = make_optimizer("adamw", params, mode.numeric_mode, accumulation_steps=2)
    a, b, e = [array.array("f", [1.0, 2.0]), new(), new()], array.array("f", [3.0, 4.0]), new()
    before = snapshot(opt, *a, b)
    with pytest.raises(ValueError, match=r"^mojo_train\.AdamW\.step_accumulated: microbatch_grads\[1\]\[1\] and "
                                         r"microbatch_grads\[1\]\[2\] are the same tensor"):
        opt.step_accumulated([a, [b, e, e]], None)
    with pytest.raises(ValueError, match=r"microbatch_grads\[0\]\[1\] and params\[1\] are the same tensor"):
        opt.step_accumulated([[a[0], params[1], a[2]], [b, new(), new()]], None)
    assert snapshot(opt, *a, b) == before
    opt.step_accumulated([a, a], None)      # one list in two microbatches: read twice, no place held twice
    assert opt.t == 1


def assert_runs_on_alike(a, b):
    """Steps 4 and 5 of both optimizers give the same bits (a resume is exact)."""
    for t in (4, 5):
        a.step(grads_for_step(SIZES, t), max_norm=2.0)
        b.step(grads_for_step(SIZES, t), max_norm=2.0)
    assert digest(a) == digest(b)


# ---- state_dict / load_state_dict ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ALL_KINDS)
def test_state_dict_round_trip_continues_bit_identically(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    for t in (1, 2, 3):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    state = pickle.loads(pickle.dumps(opt.state_dict()))
    assert state["t"] == 3
    resumed_params = copies(params)
    resumed = make_optimizer(kind, resumed_params, mode.numeric_mode)
    resumed.load_state_dict(state)
    assert resumed.t == 3
    assert_runs_on_alike(opt, resumed)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_state_dict_is_a_copy(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1))
    state = opt.state_dict()
    frozen = {k: raw(v) if hasattr(v, "tobytes") else v for k, v in state.items()}
    opt.step(grads_for_step(SIZES, 2))
    assert {k: raw(v) if hasattr(v, "tobytes") else v for k, v in state.items()} == frozen


RESUME_SCRIPT = """
import pickle, sys
import mojo_train
from _helpers import digest, grads_for_step, make_optimizer
path, kind, numeric_mode, k, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
with open(path, "rb") as f:
    saved = pickle.load(f)
params = saved["params"]
opt = make_optimizer(kind, params, numeric_mode)
opt.load_state_dict(saved["state"])
sizes = [len(p) for p in params]
for t in range(k + 1, n + 1):
    opt.step(grads_for_step(sizes, t), max_norm=2.0)
print(digest(opt))
print("numpy" in sys.modules)
"""


@pytest.mark.parametrize("kind", ["sgd_momentum", "sgd_nesterov", "adam", "adamw"])
def test_a_run_saved_at_step_k_and_resumed_in_a_fresh_process_is_bit_identical(mode, kind, tmp_path):
    k, n = 3, 6
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    for t in range(1, k + 1):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    path = tmp_path / "run.pkl"
    with open(path, "wb") as f:
        pickle.dump({"params": copies(params), "state": opt.state_dict()}, f)
    for t in range(k + 1, n + 1):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    search = [REPO, os.path.join(REPO, "tests")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(search))
    out = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(path), kind, mode.numeric_mode, str(k), str(n)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    resumed_digest, numpy_loaded = out.stdout.split()
    assert resumed_digest == digest(opt)
    assert numpy_loaded == "False"


def _poked(buffer, typecode, i, value):
    out = array.array(typecode)
    out.frombytes(raw(buffer))
    out[i] = value
    return out


class _Uncomparable:
    """A dict key whose == raises: load_state_dict must not compare it with its own keys."""

    def __eq__(self, other):
        raise RuntimeError("compared")

    __hash__ = object.__hash__


def _bad_arrays(good, name):
    """name -> (a state with ``good[name]`` damaged, exception, pattern): the structural damages
    every state array is refused for, whatever it holds."""
    value = good[name]
    code = "i" if name == "buf_initialized" else "f"
    n = len(raw(value)) // 4
    flat = array.array(code, [0] * n)
    dtype = "int32" if code == "i" else "float32"
    return {
        "2-D " + name: (dict(good, **{name: memoryview(flat).cast("B").cast(code, (1, n))}), ValueError,
                        r"%s has shape \(1, %d\); the state is flat, shape \(%d,\)" % (name, n, n)),
        "strided " + name: (dict(good, **{name: memoryview(array.array(code, [0] * 2 * n))[::2]}), ValueError,
                            r"%s must be C-contiguous \(got a strided view of shape \(%d,\)\)" % (name, n)),
        "str " + name: (dict(good, **{name: "0" * n}), TypeError, "%s must be a buffer-protocol object" % name),
        "dict " + name: (dict(good, **{name: {"data": flat}}), TypeError, "%s must be a buffer-protocol object" % name),
        "bytes " + name: (dict(good, **{name: bytes(4 * n)}), TypeError,
                          "%s must be a C-contiguous %s buffer, got uint8" % (name, dtype)),
        "nested lists " + name: (dict(good, **{name: [[0] * n]}), TypeError, "%s is a list" % name),
        "int64 " + name: (dict(good, **{name: array.array("q", [0] * n)}), TypeError,
                          "%s must be a C-contiguous %s buffer, got int64" % (name, dtype)),
        "empty " + name: (dict(good, **{name: array.array(code)}), ValueError,
                          "%s has 0 elements, expected %d" % (name, n)),
    }


def _bad_states(good, opt):
    """name -> (a bad state for ``opt`` made from ``good``, exception, message pattern)."""
    n, j, nan, inf = opt.n_total, len(opt.params), float("nan"), float("inf")
    drop = lambda key: {k: v for k, v in good.items() if k != key}
    bad = {
        "not a dict": ([good], TypeError, "state must be a dict"),
        "negative t": (dict(good, t=-1), ValueError, r"t must be in \[0, 2\*\*62\), got -1"),
        "t of 2**62": (dict(good, t=2 ** 62), ValueError, r"t must be in \[0, 2\*\*62\)"),
        "float t": (dict(good, t=3.0), TypeError, r"t must be an int \(the steps taken\), got 3\.0"),
        "bool t": (dict(good, t=True), TypeError, "t must be an int"),
        "string t": (dict(good, t="3"), TypeError, "t must be an int"),
        "other kind": (dict(good, kind="Adagrad"), ValueError, r"state is from 'Adagrad' \(its kind\), not"),
        "unknown key": (dict(good, momentum_buffer=None), ValueError, "unknown key 'momentum_buffer'"),
        "other n_total": (dict(good, n_total=n + 1), ValueError, "the state is for %d parameter elements" % (n + 1)),
        "bool n_total": (dict(good, n_total=True), TypeError, "n_total must be an int"),
        "nan lr": (dict(good, lr=nan), ValueError, "lr must be finite"),
        "not a schedule config": (dict(good, lr_schedule={"kind": "Nope"}), ValueError,
                                  "lr_schedule in the state is not a schedule config"),
        "other accumulation_steps": (dict(good, accumulation_steps=2), ValueError, "saved with accumulation_steps=2"),
        "None state": (None, TypeError, "state must be a dict, got NoneType"),
        "kind not a str": (dict(good, kind=5), ValueError, r"state is from 5 \(its kind\)"),
        "a key not a str": ({**good, 3: 4}, ValueError, "unknown key 3;"),
        "a key whose == raises": ({**good, _Uncomparable(): 1}, ValueError, "unknown key <"),
        "None t": (dict(good, t=None), TypeError, "t must be an int .*got None"),
        "nan t": (dict(good, t=nan), TypeError, "t must be an int .*got nan"),
        "t of 2**64": (dict(good, t=2 ** 64), ValueError, r"t must be in \[0, 2\*\*62\), got 18446744073709551616"),
        "float n_total": (dict(good, n_total=float(n)), TypeError, "n_total must be an int"),
        "negative n_total": (dict(good, n_total=-n), ValueError, "the state is for -%d parameter elements" % n),
        "string lr": (dict(good, lr="0.1"), TypeError, "lr must be a real number, got '0.1'"),
        "None lr": (dict(good, lr=None), TypeError, "lr must be a real number"),
        "bool lr": (dict(good, lr=True), TypeError, "lr must be a real number"),
        "inf lr": (dict(good, lr=inf), ValueError, "lr must be finite"),
        "negative lr": (dict(good, lr=-0.5), ValueError, r"lr must be finite and >= 0\.0, got -0\.5"),
        "zero accumulation_steps": (dict(good, accumulation_steps=0), ValueError,
                                    r"accumulation_steps must be in \[1,"),
        "bool accumulation_steps": (dict(good, accumulation_steps=True), TypeError,
                                    "accumulation_steps must be an int"),
        "float accumulation_steps": (dict(good, accumulation_steps=1.0), TypeError,
                                     "accumulation_steps must be an int"),
        "string lr_schedule": (dict(good, lr_schedule="constant"), ValueError,
                               "lr_schedule in the state is not a schedule config: .*got str"),
        "list lr_schedule": (dict(good, lr_schedule=[("kind", "constant")]), ValueError,
                             "lr_schedule in the state is not a schedule config"),
        "lr_schedule with an unknown key": (dict(good, lr_schedule={"kind": "constant", "peak_lr": 0.1, "gamma": 2}),
                                            ValueError, r"lr_schedule in the state .*unknown keys \['gamma'\]"),
    }
    for key in ("kind", "t", "n_total", "lr", "lr_schedule", "accumulation_steps", "exp_avg"):
        bad["missing " + key] = (drop(key), ValueError, "state lacks %s;" % key)
    for name in ("exp_avg", "exp_avg_sq", "buf_initialized"):
        if good.get(name) is not None:
            bad.update(_bad_arrays(good, name))
    if good["exp_avg"] is not None:
        f32_msg = "exp_avg must be a C-contiguous float32 buffer"
        bad.update({
            "lists of floats": (dict(good, exp_avg=[0.0] * n), TypeError, "exp_avg is a list"),
            "tuple": (dict(good, exp_avg=tuple([0.0] * n)), TypeError, "exp_avg is a tuple"),
            "float64 exp_avg": (dict(good, exp_avg=array.array("d", [0.0] * n)), TypeError, f32_msg),
            "int32 exp_avg": (dict(good, exp_avg=array.array("i", [0] * n)), TypeError, f32_msg),
            "short exp_avg": (dict(good, exp_avg=array.array("f", [0.0] * (n - 1))), ValueError,
                              "exp_avg has %d elements, expected %d" % (n - 1, n)),
            "long exp_avg": (dict(good, exp_avg=array.array("f", [0.0] * (n + 1))), ValueError, "exp_avg has"),
            "None exp_avg": (dict(good, exp_avg=None), ValueError, "exp_avg must not be None"),
            "nan exp_avg": (dict(good, exp_avg=_poked(good["exp_avg"], "f", 7, nan)), ValueError,
                            r"exp_avg\[7\] is nan; the state must be finite"),
            "inf exp_avg": (dict(good, exp_avg=_poked(good["exp_avg"], "f", 7, inf)), ValueError,
                            r"exp_avg\[7\] is inf"),
            "-inf exp_avg": (dict(good, exp_avg=_poked(good["exp_avg"], "f", n - 1, -inf)), ValueError,
                             r"exp_avg\[%d\] is -inf" % (n - 1)),
        })
    if "exp_avg_sq" in good:
        zeros = array.array("f", [0.0] * n)
        bad.update({
            "float64 exp_avg_sq": (dict(good, exp_avg_sq=array.array("d", [0.0] * n)), TypeError, "exp_avg_sq must be"),
            "missing exp_avg_sq": (drop("exp_avg_sq"), ValueError, "state lacks exp_avg_sq"),
            "None exp_avg_sq": (dict(good, exp_avg_sq=None), ValueError, "exp_avg_sq must not be None"),
            "nan exp_avg_sq": (dict(good, exp_avg_sq=_poked(good["exp_avg_sq"], "f", 3, nan)), ValueError,
                               r"exp_avg_sq\[3\] is nan"),
            "negative exp_avg_sq": (dict(good, exp_avg_sq=_poked(good["exp_avg_sq"], "f", 3, -0.5)), ValueError,
                                    r"exp_avg_sq\[3\] is -0\.5; a second moment is >= 0"),
            "-inf exp_avg_sq": (dict(good, exp_avg_sq=_poked(good["exp_avg_sq"], "f", n - 1, -inf)), ValueError,
                                r"exp_avg_sq\[%d\] is -inf" % (n - 1)),
            "negative subnormal exp_avg_sq": (dict(good, exp_avg_sq=_poked(good["exp_avg_sq"], "f", 9, -1e-45)),
                                              ValueError, r"exp_avg_sq\[9\] is -1\.4\d*e-45; a second moment is >= 0"),
            "list exp_avg_sq": (dict(good, exp_avg_sq=[0.0] * n), TypeError, "exp_avg_sq is a list"),
            "int32 exp_avg_sq": (dict(good, exp_avg_sq=array.array("i", [0] * n)), TypeError, "exp_avg_sq must be"),
            "short exp_avg_sq": (dict(good, exp_avg_sq=array.array("f", [0.0] * (n - 1))), ValueError,
                                 "exp_avg_sq has %d elements, expected %d" % (n - 1, n)),
            "moments at t=0": (dict(good, t=0), ValueError, "exp_avg is non-zero at t=0"),
            "exp_avg_sq alone at t=0": (dict(good, t=0, exp_avg=zeros), ValueError, "exp_avg_sq is non-zero at t=0"),
        })
    if "buf_initialized" in good:
        flags = good["buf_initialized"]
        bad.update({
            "float32 buf_initialized": (dict(good, buf_initialized=array.array("f", [1.0] * j)), TypeError,
                                        "buf_initialized must be a C-contiguous int32 buffer"),
            "short buf_initialized": (dict(good, buf_initialized=array.array("i", [1] * (j - 1))), ValueError,
                                      "buf_initialized has %d elements, expected %d" % (j - 1, j)),
            "list buf_initialized": (dict(good, buf_initialized=[1] * j), TypeError, "buf_initialized is a list"),
            "flag 7": (dict(good, buf_initialized=_poked(flags, "i", 1, 7)), ValueError,
                       r"buf_initialized\[1\] is 7; each flag is 0 or 1"),
            "flag -1": (dict(good, buf_initialized=_poked(flags, "i", 2, -1)), ValueError,
                        r"buf_initialized\[2\] is -1"),
            "None buf_initialized": (dict(good, buf_initialized=None), ValueError, "buf_initialized must not be None"),
            "missing buf_initialized": (drop("buf_initialized"), ValueError, "state lacks buf_initialized;"),
            "long buf_initialized": (dict(good, buf_initialized=array.array("i", [1] * (j + 1))), ValueError,
                                     "buf_initialized has %d elements, expected %d" % (j + 1, j)),
        })
        if good["exp_avg"] is not None:
            bad["flags at t=0"] = (dict(good, t=0), ValueError, r"buf_initialized\[0\] is 1, but t is 0")
        else:
            bad["exp_avg without momentum"] = (dict(good, exp_avg=array.array("f", [0.0] * n)), ValueError,
                                               "exp_avg must be None: this optimizer keeps none")
            bad["flags without momentum"] = (dict(good, buf_initialized=array.array("i", [0] * (j - 1) + [1])),
                                             ValueError, r"buf_initialized\[%d\] is 1, but this SGD keeps no "
                                             r"momentum buffer" % (j - 1))
    return bad


COMMON_BAD_STATES = ["not a dict", "None state", "negative t", "t of 2**62", "t of 2**64", "float t", "bool t",
                     "string t", "None t", "nan t", "other kind", "kind not a str", "unknown key", "a key not a str",
                     "a key whose == raises", "other n_total", "bool n_total", "float n_total", "negative n_total",
                     "nan lr", "inf lr", "negative lr", "string lr", "None lr", "bool lr", "not a schedule config",
                     "string lr_schedule", "list lr_schedule", "lr_schedule with an unknown key",
                     "other accumulation_steps", "zero accumulation_steps", "bool accumulation_steps",
                     "float accumulation_steps"] + ["missing " + k for k in (
                         "kind", "t", "n_total", "lr", "lr_schedule", "accumulation_steps", "exp_avg")]
ARRAY_DAMAGES = ["2-D", "strided", "str", "dict", "bytes", "nested lists", "int64", "empty"]
EXP_AVG_BAD_STATES = ["lists of floats", "tuple", "float64 exp_avg", "int32 exp_avg", "short exp_avg",
                      "long exp_avg", "None exp_avg", "nan exp_avg", "inf exp_avg", "-inf exp_avg"] + [
                          d + " exp_avg" for d in ARRAY_DAMAGES]
EXP_AVG_SQ_BAD_STATES = ["float64 exp_avg_sq", "missing exp_avg_sq", "None exp_avg_sq", "nan exp_avg_sq",
                         "-inf exp_avg_sq", "negative exp_avg_sq", "negative subnormal exp_avg_sq",
                         "list exp_avg_sq", "int32 exp_avg_sq", "short exp_avg_sq", "moments at t=0",
                         "exp_avg_sq alone at t=0"] + [d + " exp_avg_sq" for d in ARRAY_DAMAGES]
FLAG_BAD_STATES = ["float32 buf_initialized", "short buf_initialized", "long buf_initialized", "list buf_initialized",
                   "None buf_initialized", "missing buf_initialized", "flag 7", "flag -1"] + [
                       d + " buf_initialized" for d in ARRAY_DAMAGES]
# the table: every optimizer kind x every damage its state can have (SGD's momentum buffer is exp_avg)
BAD_STATES = ([("sgd", b) for b in COMMON_BAD_STATES + FLAG_BAD_STATES + [
                  "exp_avg without momentum", "flags without momentum"]]
              + [(k, b) for k in ("sgd_momentum", "sgd_nesterov")
                 for b in COMMON_BAD_STATES + EXP_AVG_BAD_STATES + FLAG_BAD_STATES + ["flags at t=0"]]
              + [(k, b) for k in ("adam", "adam_maximize", "adamw")
                 for b in COMMON_BAD_STATES + EXP_AVG_BAD_STATES + EXP_AVG_SQ_BAD_STATES])


def test_the_table_of_bad_states_covers_every_optimizer_kind():
    assert sorted({k for k, _ in BAD_STATES}) == ALL_KINDS


@pytest.mark.parametrize("kind, bad", BAD_STATES)
def test_load_state_dict_refuses_each_bad_state_by_name_and_changes_nothing(mode, kind, bad):
    saved = params_for(SIZES)
    source = make_optimizer(kind, saved, mode.numeric_mode)
    for t in (1, 2, 3):
        source.step(grads_for_step(SIZES, t), max_norm=2.0)
    good = source.state_dict()
    params = params_for(SIZES, seed=1)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1), max_norm=2.0)       # t=1: loading any state of t=3 would show
    state, exc, match = _bad_states(good, opt)[bad]
    before = snapshot(opt, *params)
    with pytest.raises(exc, match=match) as info:
        opt.load_state_dict(state)
    assert str(info.value).startswith("mojo_train.%s.load_state_dict: " % KINDS[kind][0])
    assert snapshot(opt, *params) == before
    # the good state still loads after the refusal and resumes bit-identically
    for mine, theirs in zip(params, saved):
        memoryview(mine)[:] = memoryview(theirs)
    opt.load_state_dict(good)
    assert_runs_on_alike(source, opt)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_load_state_dict_takes_a_fresh_state_and_zero_moments_after_steps(mode, kind):
    fresh_params = params_for(SIZES)
    fresh = make_optimizer(kind, fresh_params, mode.numeric_mode)
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1))
    opt.load_state_dict(fresh.state_dict())               # t=0 and zero moments: as made
    assert opt.t == 0 and [raw(s) for s in state_buffers(opt)] == [raw(s) for s in state_buffers(fresh)]
    zero_run = dict(fresh.state_dict(), t=5)               # a run whose gradients were all zero
    if "exp_avg_sq" in zero_run:
        zero_run["exp_avg_sq"] = array.array("f", [-0.0] * opt.n_total)   # -0.0 >= 0
    opt.load_state_dict(zero_run)
    assert opt.t == 5
    fresh.load_state_dict(zero_run)
    for mine, theirs in zip(params, fresh_params):
        memoryview(mine)[:] = memoryview(theirs)
    opt.step(grads_for_step(SIZES, 6))
    fresh.step(grads_for_step(SIZES, 6))
    assert digest(opt) == digest(fresh) and opt.t == 6


@pytest.mark.parametrize("kind", ["sgd_momentum", "sgd_nesterov", "adam", "adamw"])
def test_load_state_dict_keeps_signed_zeros_and_subnormal_moments_bit_for_bit(mode, kind):
    """-0.0 is >= 0 (a second moment may hold it) and subnormals are finite: taken, never canonicalized."""
    opt = make_optimizer(kind, params_for(SIZES), mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1))
    state = opt.state_dict()
    edges = {"exp_avg": [-0.0, -1e-45, 1e-45, 0.0]}
    if "exp_avg_sq" in state:
        edges["exp_avg_sq"] = [-0.0, 1e-45, 0.0, -0.0]
    for name, values in edges.items():
        for i, value in enumerate(values):
            state[name] = _poked(state[name], "f", 7 * i, value)
    opt.load_state_dict(state)
    for name in edges:
        assert raw(getattr(opt, name)) == raw(state[name]), name


@pytest.mark.parametrize("kind", ["sgd", "sgd_momentum", "adam"])
def test_assigning_a_state_array_is_checked_as_loading_it_is(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1))
    n, j = opt.n_total, len(params)
    before = snapshot(opt, *params)
    bad = [("buf_initialized", array.array("i", [2] * j),
            r"^mojo_train\.SGD\.buf_initialized: buf_initialized\[0\] is 2")]
    if KINDS[kind][1].get("momentum"):
        bad.append(("exp_avg", array.array("f", [float("nan")] * n), r"exp_avg\[0\] is nan"))
    elif KINDS[kind][0] == "SGD":
        bad.append(("exp_avg", array.array("f", [0.0] * n), "exp_avg must be None"))
    else:
        bad = [("exp_avg_sq", array.array("f", [1.0] * (n - 1) + [-1.0]), r"exp_avg_sq\[%d\] is -1\.0" % (n - 1)),
               ("exp_avg", array.array("f", [float("inf")] * n), r"exp_avg\[0\] is inf")]
    for name, value, match in bad:
        with pytest.raises(ValueError, match=match):
            setattr(opt, name, value)
    assert snapshot(opt, *params) == before


def test_load_state_dict_refuses_another_optimizers_state(mode):
    adam = make_optimizer("adam", params_for(SIZES), mode.numeric_mode)
    adamw = make_optimizer("adamw", params_for(SIZES), mode.numeric_mode)
    adam.step(grads_for_step(SIZES, 1))
    before = snapshot(adamw)
    with pytest.raises(ValueError, match="Adam"):
        adamw.load_state_dict(adam.state_dict())
    assert snapshot(adamw) == before


# ---- threads ---------------------------------------------------------------------------------------

_BIG = {}


def _big_inputs():
    if not _BIG:
        sizes = (2**20 - 1000, 1000, 7)   # 2**20 + 7 elements in all
        _BIG["sizes"] = sizes
        _BIG["params"] = params_for(sizes, seed=9)
        _BIG["grads"] = [grads_for_step(sizes, t) for t in (1, 2)]
    return _BIG


@pytest.mark.parametrize("kind", ["sgd_nesterov", "adam", "adamw"])
def test_the_result_does_not_depend_on_the_thread_count(mode, kind):
    if not mode.has("threads"):
        pytest.skip("no thread pool in this library")
    big = _big_inputs()
    assert sum(big["sizes"]) == 2**20 + 7
    lib = mode.backend.lib
    before = lib.mt_num_threads()
    results = []
    try:
        for n_threads in (1, 2, 3):
            assert lib.mt_set_num_threads(n_threads) == 0
            params = copies(big["params"])
            opt = make_optimizer(kind, params, mode.numeric_mode)
            totals = []
            for g in big["grads"]:
                g = copies(g)
                totals.append(opt.step(g, max_norm=100.0))
            assert opt.clip_coef_ < 1.0
            results.append((digest(opt), totals, raw(g[0])))
    finally:
        assert lib.mt_set_num_threads(before) == 0
    assert lib.mt_num_threads() == before
    assert results[0] == results[1] == results[2]


@pytest.mark.parametrize("kind", ["sgd_momentum", "adamw"])
def test_python_threads_stepping_separate_optimizers_match_the_serial_bytes(mode, kind):
    sizes = (200_003, 70_001)
    n_workers, steps = 4, 3
    grads = {t: grads_for_step(sizes, t) for t in range(1, steps + 1)}

    def run(index, barrier=None):
        params = params_for(sizes, seed=index)
        opt = make_optimizer(kind, params, mode.numeric_mode)
        mine = {t: copies(g) for t, g in grads.items()}     # clipping writes them
        if barrier is not None:
            barrier.wait()
        for t in range(1, steps + 1):
            opt.step(mine[t], max_norm=50.0)
        assert opt.clip_coef_ < 1.0
        return digest(opt)

    serial = [run(i) for i in range(n_workers)]
    results = [None] * n_workers
    barrier = threading.Barrier(n_workers)

    def worker(i):
        results[i] = run(i, barrier)
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_workers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert results == serial
    assert len(set(serial)) == n_workers     # different params: the comparison has teeth


@pytest.mark.parametrize("nonnegative", [0, 1])
def test_the_native_state_scan_finds_the_first_bad_value(mode, nonnegative):
    """mt_find_bad_state (load_state_dict's scan): NaN and inf anywhere; with nonnegative (a
    second moment) NaN and values below zero, -inf too, while +inf passes (a step writes it
    where a gradient's square overflows); -0.0 and subnormals pass."""
    from mojo_train._native import ffi
    lib = mode.backend.lib
    first = ffi.new("int64_t *")
    for bad, at in ((float("nan"), 0), (-float("nan"), 3), (float("inf"), 7), (-float("inf"), 4098), (-1e-45, 5),
                    (-2.0, 4098)):
        values = Array.from_list([0.5, -0.0, 1e-45, 3.0] * 1025)
        values.memview()[at] = bad
        assert lib.mt_find_bad_state(first, ffi.cast("float *", values.address), values.size, nonnegative) == 0
        bad_here = (bad != bad or bad < 0) if nonnegative else (bad != bad or abs(bad) == float("inf"))
        assert first[0] == (at if bad_here else -1), (bad, at)
    clean = Array.from_list([0.5, -0.0, 1e-45] * 100)
    assert lib.mt_find_bad_state(first, ffi.cast("float *", clean.address), clean.size, nonnegative) == 0
    assert first[0] == -1


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_a_step_past_the_range_of_t_is_refused_so_every_state_a_step_makes_loads_back(mode, kind):
    """t is in [0, 2**62) in a state: the step that would make t = 2**62 is refused (it was
    taken, and the optimizer's own state_dict was then refused by its load_state_dict)."""
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    opt.step(grads_for_step(SIZES, 1))
    state = opt.state_dict()
    state["t"] = 2 ** 62 - 2
    opt.load_state_dict(state)
    opt.step(grads_for_step(SIZES, 2))                     # t = 2**62 - 1: the last count a state holds
    assert opt.t == 2 ** 62 - 1
    opt.load_state_dict(opt.state_dict())
    grads = grads_for_step(SIZES, 3)
    before = snapshot(opt, *params, *grads)
    with pytest.raises(ValueError, match=r"^mojo_train\.%s\.step: the optimizer has taken t=%d steps, the most a run "
                                         r"counts" % (KINDS[kind][0], 2 ** 62 - 1)):
        opt.step(grads, max_norm=1.0)
    assert snapshot(opt, *params, *grads) == before


def test_step_accumulated_names_itself_for_max_norm_before_combining(mode):
    _, opt, a, b = _accumulating(mode)
    before = snapshot(opt, *(a + b))
    with pytest.raises(ValueError, match=r"^mojo_train\.AdamW\.step_accumulated: max_norm must be finite"):
        opt.step_accumulated([a, b], None, max_norm=math.nan)
    assert snapshot(opt, *(a + b)) == before


@pytest.mark.parametrize("betas", [{0.999, 0.9}, frozenset((0.9, 0.999)), {0.9: 1, 0.999: 2},
                                   (b for b in (0.9, 0.999)), iter((0.9, 0.999))],
                         ids=["set", "frozenset", "dict", "generator", "iterator"])
def test_betas_without_an_order_are_refused_by_name(mode, betas):
    """A set's order is its hashes' ({0.999, 0.9} gave beta1 = 0.999 silently), a generator's
    is read once: betas must be indexable, as torch indexes it."""
    with pytest.raises(TypeError, match=r"^mojo_train\.AdamW: betas must be a pair \(beta1, beta2\) in order"):
        AdamW(params_for(SIZES), betas=betas, numeric_mode=mode.numeric_mode)
    assert AdamW(params_for(SIZES), betas=[0.8, 0.95], numeric_mode=mode.numeric_mode).betas == (0.8, 0.95)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
def test_a_second_moment_a_step_overflowed_to_inf_loads_back_and_resumes(mode, kind):
    """A finite gradient past ~1.8e19 squares to inf: the step writes exp_avg_sq = +inf and moves
    the parameter by exp_avg / inf = 0, as torch's does (past ~1e21 there). Such a state was
    refused by the optimizer's own load_state_dict (a second moment had to be finite)."""
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.numeric_mode)
    grads = grads_for_step(SIZES, 1)
    memoryview(grads[0])[2] = 4e19
    opt.step(grads)
    assert float("inf") in list(opt.exp_avg_sq.memview()) and all(map(math.isfinite, memoryview(params[0])))
    twin_params = [array.array("f", p) for p in params]
    twin = make_optimizer(kind, twin_params, mode.numeric_mode)
    twin.load_state_dict(opt.state_dict())
    for s in (2, 3):
        opt.step(grads_for_step(SIZES, s))
        twin.step(grads_for_step(SIZES, s))
    assert [raw(p) for p in params] == [raw(p) for p in twin_params]
