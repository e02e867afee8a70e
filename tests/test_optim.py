"""SGD, Adam, AdamW and clip_grad_norm_ through the public Python API.

Contract under test: a step updates the caller's buffers in place (array.array, memoryview,
numpy, mojo_train.Array) and, in the identical tier, gives exactly the bits of the contract's
arithmetic replayed in Python (tests/_helpers.py); the return value and the per-step reports
(t, lr_, total_norm_, clip_coef_) are torch-like; lr and lr_schedule are read at every step;
torch keywords this library does not take are refused by name; EVERY refusal leaves params,
grads and state byte-identical; state_dict/load_state_dict resume bit-identically, even in a
fresh process; thread counts and concurrent Python threads never change a bit.
"""
import array
import math
import os
import pickle
import subprocess
import sys
import threading

import pytest

from mojo_train import SGD, Adam, AdamW, Array, clip_grad_norm_
from mojo_train._native import ffi

from _helpers import (KINDS, REPO, digest, f32, f32_array, grads_for_step, make_optimizer,
                      params_for, raw, ref_adam, ref_clip, ref_norms, ref_sgd, snapshot,
                      state_buffers, wide_array)

SIZES = (5, 300, 130)
ALL_KINDS = sorted(KINDS)


def flat(tensors):
    out = []
    for t in tensors:
        out.extend(memoryview(t).cast("B").cast("f").tolist() if not isinstance(t, list) else t)
    return out


def copies(tensors):
    return [array.array("f", t) for t in tensors]


def library_one_minus_pow(backend, base, t):
    out = ffi.new("float[1]")
    assert backend.lib.mt_one_minus_pow(out, base, t) == 0
    return out[0]


# ---- the contract's bits (identical tier) ---------------------------------------------------

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
    opt = make_optimizer(kind, params, identical.tier)
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
    opt = make_optimizer("adamw", params, identical.tier)
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
    ref_opt = make_optimizer(kind, reference, mode.tier)
    params = _containers(container, p0)
    opt = make_optimizer(kind, params, mode.tier)
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
    make_optimizer(kind, params, mode.tier).step(frozen)
    make_optimizer(kind, twin, mode.tier).step(grads)
    assert [raw(p) for p in params] == [raw(p) for p in twin]
    assert [raw(g) for g in frozen] == [raw(g) for g in grads]


# ---- what a step reports -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_returns_none_without_max_norm_and_sets_the_reports(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.tier)
    assert (opt.t, opt.lr_, opt.total_norm_, opt.clip_coef_) == (0, None, None, None)
    assert opt.step(grads_for_step(SIZES, 1)) is None
    assert opt.t == 1 and opt.lr_ == f32(KINDS[kind][1]["lr"])
    assert opt.total_norm_ is None and opt.clip_coef_ is None


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_step_with_max_norm_returns_the_pre_clip_total_and_scales_grads(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.tier)
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
        opt = make_optimizer(kind, params, mode.tier, lr=lrs[0])
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
    opt = make_optimizer(kind, params, mode.tier, lr=123.0, lr_schedule=sched)
    man = make_optimizer(kind, manual, mode.tier)
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
    opt = SGD(params, numeric_mode=mode.tier)
    opt.zero_grad(grads)
    assert all(raw(g) == bytes(len(raw(g))) for g in grads)
    assert [raw(p) for p in params] == [raw(x) for x in _containers(container, [[1.0] * 12, [2.0] * 5])]


def test_zero_grad_refuses_read_only_and_mismatched_grads(mode):
    opt = SGD([array.array("f", [1.0] * 4)], numeric_mode=mode.tier)
    frozen = memoryview(array.array("f", [3.0] * 4).tobytes()).cast("f")
    with pytest.raises(ValueError, match="grads"):
        opt.zero_grad([frozen])
    short = array.array("f", [3.0] * 3)
    with pytest.raises(ValueError, match="shape"):
        opt.zero_grad([short])
    assert short.tolist() == [3.0] * 3


def test_adamw_default_weight_decay_is_torchs_0_01(mode):
    assert AdamW(array.array("f", [1.0]), numeric_mode=mode.tier).weight_decay == 0.01
    assert Adam(array.array("f", [1.0]), numeric_mode=mode.tier).weight_decay == 0.0
    results = []
    for kwargs in ({}, {"weight_decay": 0.01}, {"weight_decay": 0.0}):
        p = f32_array(64, 1, 1.0, 2.0)
        AdamW(p, lr=0.1, numeric_mode=mode.tier, **kwargs).step(f32_array(64, 2))
        results.append(p.tobytes())
    assert results[0] == results[1] != results[2]


# ---- refused keywords ----------------------------------------------------------------------------

TORCH_KEYWORDS = {"amsgrad": True, "foreach": True, "fused": True, "capturable": True,
                  "differentiable": True, "param_groups": [], "dtype": "float32", "device": "cpu"}


@pytest.mark.parametrize("keyword", sorted(TORCH_KEYWORDS))
@pytest.mark.parametrize("cls", [SGD, Adam, AdamW])
def test_torch_keywords_are_refused_by_name_with_the_reason(cls, keyword):
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
        self.opt = make_optimizer(kind, self.params, mode.tier)
        self.twin_params = params_for(SIZES)
        self.twin = make_optimizer(kind, self.twin_params, mode.tier)
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


def case_grad_count_mismatch(c):
    return _step(c, c.grads[:2]), ValueError, "tensors"


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


def _bad_param(value):
    def case(c):
        c.params[2][7] = value        # put there before the snapshot: the step must refuse it
        return _step(c, c.grads), ValueError, "params"
    return case


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
    return _step(c, c.grads), ValueError, "beta1"


def case_nesterov_without_momentum(c):
    c.opt.nesterov, c.opt.momentum = True, 0.0
    return _step(c, c.grads), ValueError, "nesterov"


def _constructor(make_params, exc, match, **kw):
    """A refused constructor: nothing is written to the params it was given."""
    def case(c):
        p = make_params(c)
        c.extra = [p] if not isinstance(p, list) else p
        return lambda: make_optimizer(c.kind, p, c.mode.tier, **kw), exc, match
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
    "one grad for three params": case_single_grad_for_three_params,
    "nan grad": _bad_grad(float("nan"), False),
    "inf grad": _bad_grad(float("inf"), False),
    "-inf grad": _bad_grad(float("-inf"), False),
    "nan grad with clip": _bad_grad(float("nan"), True),
    "inf grad with clip": _bad_grad(float("inf"), True),
    "grad squares overflow the norm": case_overflowing_grad_squares_with_clip,
    "nan param": _bad_param(float("nan")),
    "inf param": _bad_param(float("inf")),
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
    "empty param tensor": _constructor(lambda c: [array.array("f", [1.0]), array.array("f")],
                                       ValueError, "empty"),
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
                                  "negative max_norm", "float64 grads"])
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


# ---- state_dict / load_state_dict ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ALL_KINDS)
def test_state_dict_round_trip_continues_bit_identically(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.tier)
    for t in (1, 2, 3):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    state = pickle.loads(pickle.dumps(opt.state_dict()))
    assert state["t"] == 3
    resumed_params = copies(params)
    resumed = make_optimizer(kind, resumed_params, mode.tier)
    resumed.load_state_dict(state)
    assert resumed.t == 3
    for t in (4, 5):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
        resumed.step(grads_for_step(SIZES, t), max_norm=2.0)
    assert digest(opt) == digest(resumed)


@pytest.mark.parametrize("kind", ALL_KINDS)
def test_state_dict_is_a_copy(mode, kind):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.tier)
    opt.step(grads_for_step(SIZES, 1))
    state = opt.state_dict()
    frozen = {k: raw(v) if hasattr(v, "tobytes") else v for k, v in state.items()}
    opt.step(grads_for_step(SIZES, 2))
    assert {k: raw(v) if hasattr(v, "tobytes") else v for k, v in state.items()} == frozen


RESUME_SCRIPT = """
import pickle, sys
import mojo_train
from _helpers import digest, grads_for_step, make_optimizer
path, kind, tier, k, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
with open(path, "rb") as f:
    saved = pickle.load(f)
params = saved["params"]
opt = make_optimizer(kind, params, tier)
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
    opt = make_optimizer(kind, params, mode.tier)
    for t in range(1, k + 1):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    path = tmp_path / "run.pkl"
    with open(path, "wb") as f:
        pickle.dump({"params": copies(params), "state": opt.state_dict()}, f)
    for t in range(k + 1, n + 1):
        opt.step(grads_for_step(SIZES, t), max_norm=2.0)
    search = [REPO, os.path.join(REPO, "tests")] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(search))
    out = subprocess.run([sys.executable, "-c", RESUME_SCRIPT, str(path), kind, mode.tier, str(k), str(n)],
                         env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    resumed_digest, numpy_loaded = out.stdout.split()
    assert resumed_digest == digest(opt)
    assert numpy_loaded == "False"


def _bad_states(opt):
    good = opt.state_dict()
    n = opt.n_total
    bad = {
        "not a dict": [good],
        "lists of floats": dict(good, exp_avg=[0.0] * n),
        "tuple": dict(good, exp_avg=tuple([0.0] * n)),
        "float64 exp_avg": dict(good, exp_avg=array.array("d", [0.0] * n)),
        "int32 exp_avg": dict(good, exp_avg=array.array("i", [0] * n)),
        "short exp_avg": dict(good, exp_avg=array.array("f", [0.0] * (n - 1))),
        "long exp_avg": dict(good, exp_avg=array.array("f", [0.0] * (n + 1))),
        "missing t": {k: v for k, v in good.items() if k != "t"},
        "negative t": dict(good, t=-1),
        "float t": dict(good, t=3.0),
        "bool t": dict(good, t=True),
        "other kind": dict(good, kind="Adagrad"),
    }
    if "exp_avg_sq" in good:
        bad["float64 exp_avg_sq"] = dict(good, exp_avg_sq=array.array("d", [0.0] * n))
        bad["missing exp_avg_sq"] = {k: v for k, v in good.items() if k != "exp_avg_sq"}
        bad["None exp_avg_sq"] = dict(good, exp_avg_sq=None)
    if "buf_initialized" in good:
        j = len(opt.params)
        bad["float32 buf_initialized"] = dict(good, buf_initialized=array.array("f", [1.0] * j))
        bad["short buf_initialized"] = dict(good, buf_initialized=array.array("i", [1] * (j - 1)))
        bad["list buf_initialized"] = dict(good, buf_initialized=[1] * j)
    return bad


COMMON_BAD_STATES = ["not a dict", "lists of floats", "tuple", "float64 exp_avg", "int32 exp_avg",
                     "short exp_avg", "long exp_avg", "missing t", "negative t", "float t", "bool t",
                     "other kind"]
BAD_STATES = ([("sgd_momentum", b) for b in COMMON_BAD_STATES + [
                  "float32 buf_initialized", "short buf_initialized", "list buf_initialized"]]
              + [(k, b) for k in ("adam", "adamw") for b in COMMON_BAD_STATES + [
                  "float64 exp_avg_sq", "missing exp_avg_sq", "None exp_avg_sq"]])


@pytest.mark.parametrize("kind, bad", BAD_STATES)
def test_load_state_dict_refuses_bad_state_and_changes_nothing(mode, kind, bad):
    params = params_for(SIZES)
    opt = make_optimizer(kind, params, mode.tier)
    for t in (1, 2):
        opt.step(grads_for_step(SIZES, t))
    states = _bad_states(opt)
    before = snapshot(opt, *params)
    with pytest.raises((TypeError, ValueError)):
        opt.load_state_dict(states[bad])
    assert snapshot(opt, *params) == before


def test_load_state_dict_refuses_another_optimizers_state(mode):
    adam = make_optimizer("adam", params_for(SIZES), mode.tier)
    adamw = make_optimizer("adamw", params_for(SIZES), mode.tier)
    adam.step(grads_for_step(SIZES, 1))
    before = snapshot(adamw)
    with pytest.raises(ValueError, match="Adam"):
        adamw.load_state_dict(adam.state_dict())
    assert snapshot(adamw) == before


# ---- clip_grad_norm_ -----------------------------------------------------------------------------

def test_clip_grad_norm_returns_the_total_and_scales_in_place_with_the_contracts_bits(identical):
    grads = [wide_array(n, 60 + j) for j, n in enumerate((4096 + 300, 7, 129, 3 * 4096))]
    total, coef, clipped = ref_clip([list(g) for g in grads], 2.0)
    got = clip_grad_norm_(grads, 2.0, numeric_mode=identical.tier)
    assert got == total and coef < 1.0
    assert flat(grads) == flat(clipped)


def test_clip_grad_norm_agrees_with_the_norms_of_the_pinned_tree(identical):
    grads = [wide_array(n, 70 + j) for j, n in enumerate((1, 128, 129, 4097, 2 * 4096 + 1))]
    norms, total = ref_norms(grads)
    assert clip_grad_norm_(grads, 1e9, numeric_mode=identical.tier) == total
    assert norms[0] == abs(grads[0][0])


def _rows_then_small():
    """Each lane: 1.0 in row 0, then 32 rows of 2**-12. Ascending rows round every small square
    away (1 + 2**-24 -> 1); a reversed fold would keep their sum (1 + 2**-19)."""
    return array.array("f", [1.0] * 128 + [2.0**-12] * (128 * 32))


def _chunks_then_small():
    """Chunk partials 1 then seven of 2**-24: the pairwise tree keeps 3 * 2**-23 of them, a
    serial fold of the partials rounds each away."""
    x = [0.0] * (8 * 4096)
    x[0] = 1.0
    for c in range(1, 8):
        x[c * 4096] = 2.0**-12
    return array.array("f", x)


@pytest.mark.parametrize("make, alternative", [
    (_rows_then_small, 11.313719749450684),        # sqrt(128 + 2**-12) in float32
    (_chunks_then_small, 1.0),                     # sqrt(1) after a serial fold
])
def test_the_norm_follows_the_contracts_tree_where_order_matters(identical, make, alternative):
    x = make()
    _, total = ref_norms([x])
    assert total != alternative                     # the input tells the two orders apart
    assert clip_grad_norm_([x], 1e9, numeric_mode=identical.tier) == total
    opt = SGD([array.array("f", [0.0] * len(x))], numeric_mode=identical.tier)
    assert opt.step([make()], max_norm=1e9) == total


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_clip_grad_norm_is_the_clip_the_optimizers_apply(mode, kind):
    g1, g2 = grads_for_step(SIZES, 1), grads_for_step(SIZES, 1)
    total = clip_grad_norm_(g1, 0.5, numeric_mode=mode.tier)
    opt = make_optimizer(kind, params_for(SIZES), mode.tier)
    assert opt.step(g2, max_norm=0.5) == total
    assert [raw(g) for g in g1] == [raw(g) for g in g2]


def test_clip_grad_norm_below_max_norm_leaves_grads_alone(mode):
    grads = grads_for_step(SIZES, 1)
    before = [raw(g) for g in grads]
    total = clip_grad_norm_(grads, 1e6, numeric_mode=mode.tier)
    assert total > 0 and [raw(g) for g in grads] == before


@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(norm_type=1.0), NotImplementedError, "norm_type"),
    (dict(norm_type=float("inf")), NotImplementedError, "norm_type"),
    (dict(norm_type="fro"), NotImplementedError, "norm_type"),
    (dict(error_if_nonfinite=False), NotImplementedError, "error_if_nonfinite"),
    (dict(foreach=True), TypeError, "foreach"),
    (dict(max_norm=-1.0), ValueError, "max_norm"),
    (dict(max_norm=float("nan")), ValueError, "max_norm"),
])
def test_clip_grad_norm_refuses_what_it_does_not_implement_by_name(mode, kwargs, exc, match):
    grads = grads_for_step(SIZES, 1)
    before = [raw(g) for g in grads]
    kwargs = dict(kwargs)
    max_norm = kwargs.pop("max_norm", 1.0)
    with pytest.raises(exc, match=match):
        clip_grad_norm_(grads, max_norm, numeric_mode=mode.tier, **kwargs)
    assert [raw(g) for g in grads] == before


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 3e38])
def test_clip_grad_norm_refuses_a_nonfinite_total_and_writes_nothing(mode, poison):
    grads = grads_for_step(SIZES, 1)
    grads[1][5] = poison
    if poison == 3e38:
        grads[1][6] = poison
    before = [raw(g) for g in grads]
    with pytest.raises(ValueError, match="grads|overflow"):
        clip_grad_norm_(grads, 1.0, numeric_mode=mode.tier)
    assert [raw(g) for g in grads] == before


def test_clip_grad_norm_refuses_read_only_grads(mode):
    frozen = [memoryview(array.array("f", [3.0, 4.0]).tobytes()).cast("f")]
    with pytest.raises(ValueError, match="writable|read-only"):
        clip_grad_norm_(frozen, 1.0, numeric_mode=mode.tier)


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
            opt = make_optimizer(kind, params, mode.tier)
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
        opt = make_optimizer(kind, params, mode.tier)
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
