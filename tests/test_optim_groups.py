"""Param groups, AMSGrad and per-tensor step counts of SGD, Adam and AdamW (issue 13, point 3).

Contract under test (native/contracts/optim.md, "Param groups" and "AMSGrad element"): one step
of a grouped optimizer gives, in the identical numeric mode, exactly the bits of the contract
replayed in Python per tensor -- each tensor with its group's hyper-parameters and its own step
count (a group added later counts from 1) -- clipping over every group at once; AMSGrad keeps
max(max_exp_avg_sq, exp_avg_sq) (the old value on a tie) and divides by its root; one group of
dicts is the tensor list's step, bit for bit; empty tensors are taken, as torch takes them. The
group API is torch's (param_groups, add_param_group, defaults, per-group values read at every
step); every refusal names the group and key and changes nothing; state_dict carries groups,
steps and max_exp_avg_sq and resumes bit-identically, and a state saved before param groups
still loads. The native grouped calls take state as a pointer per tensor (torch's layout). In
the other numeric modes the same runs stay within tests/tolerances.py's bound of torch float64.
"""
import array
import pickle

import pytest

from mojo_train import SGD, Adam, AdamW, Array
from mojo_train._native import ffi

from _helpers import (digest, f32, flat, grads_for_step, params_for, raw, ref_adam, ref_clip, ref_sgd,
                      snapshot)
from test_optim import library_one_minus_pow

CLASSES = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}
SIZES = (5, 300, 0, 130, 7)
DEFAULTS = {
    "SGD": dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, maximize=False),
    "Adam": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False),
    "AdamW": dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, amsgrad=False, maximize=False),
}
# name -> (class, constructor keywords, group sizes, each group's own keys): every option differs somewhere
GROUPED = {
    "sgd": ("SGD", dict(lr=0.05, momentum=0.9), (2, 1, 2),
            [dict(nesterov=True, weight_decay=0.01), dict(momentum=0.0, maximize=True),
             dict(lr=0.1, dampening=0.25, maximize=True)]),
    "adam": ("Adam", dict(lr=1e-2), (1, 3, 1),
             [dict(betas=(0.8, 0.95), weight_decay=0.1), dict(amsgrad=True, eps=1e-6),
              dict(lr=3e-3, maximize=True, amsgrad=True)]),
    "adamw": ("AdamW", dict(lr=1e-2, amsgrad=True), (2, 3),
              [dict(weight_decay=0.1), dict(amsgrad=False, lr=1e-3, betas=(0.85, 0.99))]),
}


def copies(tensors):
    return [array.array("f", t) for t in tensors]


def split(tensors, counts):
    """``tensors`` cut into consecutive groups of ``counts`` tensors."""
    bounds = [sum(counts[:i]) for i in range(len(counts) + 1)]
    return [tensors[a:b] for a, b in zip(bounds, bounds[1:])]


def grouped(kind, params, numeric_mode, n_groups=None):
    """(optimizer, its replay, the groups' full values) of the first ``n_groups`` groups of
    GROUPED[kind] (all by default) over ``params``."""
    cls, kw, sizes, own = GROUPED[kind]
    parts = split(params, sizes)[:n_groups]
    values = [dict(DEFAULTS[cls], **dict(kw, **extra)) for extra in own]
    opt = CLASSES[cls]([dict(extra, params=part) for extra, part in zip(own, parts)], numeric_mode=numeric_mode, **kw)
    return opt, values, parts


class Replay:
    """The contract replayed in Python per tensor: its group's values, its own step count."""

    def __init__(self, cls, backend):
        self.cls, self.backend = cls, backend
        self.p, self.m, self.v, self.w, self.values, self.steps, self.init = [], [], [], [], [], [], []

    def add(self, params, values):
        for t in params:
            n = len(t)
            self.p.append(list(t))
            self.m.append([0.0] * n)
            self.v.append([0.0] * n)
            self.w.append([0.0] * n)
            self.values.append(values)
            self.steps.append(0)
            self.init.append(False)

    def step(self, grads, max_norm=None):
        total, coef = None, None
        grads = [list(g) for g in grads]
        if max_norm is not None:
            total, coef, grads = ref_clip(grads, max_norm)
        for j, g in enumerate(grads):
            self._tensor(j, g)
        return total, grads

    def _tensor(self, j, g):
        hv = self.values[j]
        self.steps[j] += 1
        if self.cls == "SGD":
            ref_sgd(self.p[j], g, self.m[j], self.init[j], hv["lr"], hv["momentum"], hv["dampening"],
                    hv["weight_decay"], hv["nesterov"], hv["maximize"])
            self.init[j] = self.init[j] or hv["momentum"] != 0.0
            return
        b1, b2 = hv["betas"]
        bc1 = library_one_minus_pow(self.backend, f32(b1), self.steps[j])
        bc2 = library_one_minus_pow(self.backend, f32(b2), self.steps[j])
        ref_adam(self.p[j], g, self.m[j], self.v[j], hv["lr"], b1, b2, hv["eps"], hv["weight_decay"],
                 hv["maximize"], self.cls == "AdamW", bc1, bc2, vmax=self.w[j] if hv["amsgrad"] else None)


def assert_replayed(opt, replay, params):
    assert flat(params) == flat(replay.p)
    if replay.cls == "SGD":
        if opt.exp_avg is not None:
            assert opt.exp_avg.tolist() == flat(replay.m)
        return
    assert opt.exp_avg.tolist() == flat(replay.m) and opt.exp_avg_sq.tolist() == flat(replay.v)
    assert opt.steps == replay.steps
    if opt.max_exp_avg_sq is not None:
        ams = [v["amsgrad"] for v in replay.values]
        want = flat([w if a else [0.0] * len(w) for w, a in zip(replay.w, ams)])
        assert opt.max_exp_avg_sq.tolist() == want


# ---- the contract's bits ------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [None, 4.0])
@pytest.mark.parametrize("kind", sorted(GROUPED))
def test_identical_groups_give_the_contracts_bits_per_tensor(identical, kind, max_norm):
    params = params_for(SIZES)
    opt, values, parts = grouped(kind, params, identical.numeric_mode)
    replay = Replay(GROUPED[kind][0], identical.backend)
    for part, v in zip(parts, values):
        replay.add(part, v)
    for t in (1, 2, 3):
        grads = grads_for_step(SIZES, t)
        total, clipped = replay.step(grads, max_norm)
        assert opt.step(grads, max_norm=max_norm) == total
        assert flat(grads) == flat(clipped)
        assert_replayed(opt, replay, params)
    assert opt.t == 3


@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_identical_amsgrad_gives_the_contracts_bits(identical, cls):
    params = params_for(SIZES, seed=2)
    opt = CLASSES[cls](params, lr=1e-2, amsgrad=True, maximize=True, numeric_mode=identical.numeric_mode)
    replay = Replay(cls, identical.backend)
    replay.add(params, dict(DEFAULTS[cls], lr=1e-2, amsgrad=True, maximize=True))
    for t in (1, 2, 3, 4):
        scale = 3.0 if t % 2 else 0.25          # a smaller second moment: the maximum is kept
        grads = grads_for_step(SIZES, t, scale=scale)
        replay.step(grads)
        opt.step(grads)
        assert_replayed(opt, replay, params)
    w, v = opt.max_exp_avg_sq.tolist(), opt.exp_avg_sq.tolist()
    assert all(a >= b for a, b in zip(w, v)) and any(a > b for a, b in zip(w, v))


@pytest.mark.parametrize("kind", sorted(GROUPED))
def test_a_group_added_later_counts_its_own_steps(identical, kind):
    cls, _, sizes, own = GROUPED[kind]
    params = params_for(SIZES, seed=3)
    opt, values, parts = grouped(kind, params, identical.numeric_mode, n_groups=len(sizes) - 1)
    replay = Replay(cls, identical.backend)
    for part, v in zip(parts, values):
        replay.add(part, v)
    first = sum(sizes[:-1])
    for t in (1, 2):
        grads = grads_for_step(SIZES[:first], t)
        replay.step(grads, 2.0)
        opt.step(grads, max_norm=2.0)
    opt.add_param_group(dict(own[-1], params=params[first:]))
    replay.add(params[first:], values[-1])
    for t in (3, 4, 5):
        grads = grads_for_step(SIZES, t)
        replay.step(grads, 2.0)
        opt.step(grads, max_norm=2.0)
    assert_replayed(opt, replay, params)
    if cls != "SGD":
        assert opt.steps == [5] * first + [3] * (len(SIZES) - first)
    assert len(opt.param_groups) == len(sizes) and opt.params == list(params)


@pytest.mark.parametrize("cls", ["SGD", "Adam", "AdamW"])
def test_one_group_of_dicts_gives_the_bits_of_the_tensor_list(mode, cls):
    kw = dict(lr=0.05, momentum=0.9, nesterov=True) if cls == "SGD" else dict(lr=1e-2, weight_decay=0.1)
    plain, dicts = params_for(SIZES), params_for(SIZES)
    a = CLASSES[cls](plain, numeric_mode=mode.numeric_mode, **kw)
    b = CLASSES[cls]([dict(kw, params=dicts)], numeric_mode=mode.numeric_mode)
    for t in (1, 2, 3):
        assert a.step(grads_for_step(SIZES, t), max_norm=3.0) == b.step(grads_for_step(SIZES, t), max_norm=3.0)
    assert digest(a) == digest(b) and [raw(p) for p in plain] != [raw(p) for p in params_for(SIZES)]


def test_amsgrad_keeps_a_loaded_negative_zero_maximum_on_a_tie(mode):
    params = [array.array("f", [0.5, -0.25])]
    opt = Adam(params, lr=1e-2, amsgrad=True, numeric_mode=mode.numeric_mode)
    opt.step([array.array("f", [0.0, 0.0])])      # exp_avg_sq stays +0.0 where the gradient is 0
    state = opt.state_dict()
    state["max_exp_avg_sq"] = array.array("f", [-0.0, 0.0])
    opt.load_state_dict(state)
    opt.step([array.array("f", [0.0, 0.0])])
    assert raw(opt.max_exp_avg_sq) == raw(array.array("f", [-0.0, 0.0]))
    assert params[0].tolist() == [0.5, -0.25]


def test_empty_tensors_are_taken_and_stay_empty(mode):
    params = [array.array("f"), array.array("f", [1.0, 2.0]), array.array("f")]
    opt = AdamW([{"params": params[:1]}, {"params": params[1:], "amsgrad": True}], lr=0.1,
                numeric_mode=mode.numeric_mode)
    grads = [array.array("f"), array.array("f", [0.5, -0.5]), array.array("f")]
    opt.zero_grad(grads)
    assert grads[1].tolist() == [0.0, 0.0]
    opt.step([array.array("f"), array.array("f", [1.0, -1.0]), array.array("f")], max_norm=1.0)
    assert opt.steps == [1, 1, 1] and opt.n_total == 2 and len(params[0]) == 0
    assert params[1][0] < 1.0 and params[1][1] > 2.0


# ---- the group API ----------------------------------------------------------------------------

def test_groups_take_the_constructors_values_where_they_give_none(mode):
    p = params_for((3, 4))
    opt = Adam([{"params": [p[0]], "lr": 0.1}, {"params": p[1], "betas": (0.5, 0.6)}], lr=0.2, eps=1e-6,
               numeric_mode=mode.numeric_mode)
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.2]
    assert [g["betas"] for g in opt.param_groups] == [(0.9, 0.999), (0.5, 0.6)]
    assert [g["eps"] for g in opt.param_groups] == [1e-6, 1e-6]
    assert opt.param_groups[1]["params"] == [p[1]] and opt.params == p
    assert opt.defaults["lr"] == 0.2 and opt.eps == 1e-6
    with pytest.raises(ValueError, match=r"the param groups hold different values \[0\.1, 0\.2\]"):
        opt.lr


def test_a_value_changed_between_steps_is_used_and_one_attribute_sets_every_group(identical):
    params = params_for((6, 9))
    opt = SGD([{"params": params[:1]}, {"params": params[1:]}], lr=0.1, numeric_mode=identical.numeric_mode)
    replay = Replay("SGD", identical.backend)
    replay.add(params[:1], dict(DEFAULTS["SGD"], lr=0.1))
    replay.add(params[1:], dict(DEFAULTS["SGD"], lr=0.1))
    grads = grads_for_step((6, 9), 1)
    opt.param_groups[1]["lr"] = 0.5
    replay.values[1] = dict(replay.values[1], lr=0.5)
    replay.step(grads)
    opt.step(grads)
    assert flat(params) == flat(replay.p)
    opt.lr = 0.25
    assert opt.lr == 0.25 and [g["lr"] for g in opt.param_groups] == [0.25, 0.25]
    replay.values = [dict(v, lr=0.25) for v in replay.values]
    replay.step(grads)
    opt.step(grads)
    assert flat(params) == flat(replay.p) and opt.lr_ == f32(0.25)


def test_a_groups_lr_schedule_gives_that_groups_lr(identical):
    class Halving:
        def lr_at(self, t):
            return 1.0 / 2 ** t
    params = params_for((4, 4))
    opt = SGD([{"params": params[:1], "lr_schedule": Halving()}, {"params": params[1:]}], lr=0.1,
              numeric_mode=identical.numeric_mode)
    replay = Replay("SGD", identical.backend)
    replay.add(params[:1], dict(DEFAULTS["SGD"], lr=0.5))
    replay.add(params[1:], dict(DEFAULTS["SGD"], lr=0.1))
    grads = grads_for_step((4, 4), 1)
    replay.step(grads)
    assert opt.step(grads) is None and opt.lr_ == 0.5
    assert flat(params) == flat(replay.p)


def _groups_of(p):
    return [{"params": [p[0], p[1]]}, {"params": [p[2]], "lr": 0.1}]


# name -> (make the refused call on an optimizer after two steps, exception, message pattern)
REFUSALS = {
    "negative lr in a group": (lambda o, p, g: (o.param_groups[1].__setitem__("lr", -1.0), o.step(g)), ValueError,
                               r"^mojo_train\.(Adam|SGD)\.step: param_groups\[1\]\['lr'\] must be finite and "
                               r">= 0\.0, got -1\.0"),
    "a string weight_decay": (lambda o, p, g: (o.param_groups[0].__setitem__("weight_decay", "0.1"), o.step(g)),
                              TypeError, r"param_groups\[0\]\['weight_decay'\] must be a real number"),
    "a key removed": (lambda o, p, g: (o.param_groups[1].pop("maximize"), o.step(g)), ValueError,
                      r"param_groups\[1\] lacks 'maximize'"),
    "params replaced": (lambda o, p, g: (o.param_groups[0].__setitem__("params", [p[0]]), o.step(g)), ValueError,
                        r"param_groups\[0\]\['params'\] was changed after the group was added"),
    "a group appended by hand": (lambda o, p, g: (o.param_groups.append({"params": []}), o.step(g)), ValueError,
                                 "add groups with add_param_group"),
    "a tensor in two groups": (lambda o, p, g: o.add_param_group({"params": [p[1]]}), ValueError,
                               r"params\[0\]\['params'\]\[1\] and param_group\['params'\]\[0\] share memory"),
    "an unknown key": (lambda o, p, g: o.add_param_group({"params": [array.array("f", [1.0])], "lr2": 1.0}),
                       ValueError, r"param_group has unknown key 'lr2'; a group takes 'params' and 'lr'"),
    "no params key": (lambda o, p, g: o.add_param_group({"lr": 1.0}), ValueError, "param_group has no 'params' key"),
    "an empty params list": (lambda o, p, g: o.add_param_group({"params": []}), ValueError,
                             r"param_group\['params'\] is an empty list"),
    "not a dict": (lambda o, p, g: o.add_param_group([array.array("f", [1.0])]), TypeError,
                   "param_group must be a dict"),
    "a float64 tensor": (lambda o, p, g: o.add_param_group({"params": [array.array("d", [1.0])]}), TypeError,
                         r"param_group\['params'\]\[0\] has dtype float64"),
}
ADAM_REFUSALS = {
    "beta out of range": (lambda o, p, g: (o.param_groups[1].__setitem__("betas", (0.9, 1.0)), o.step(g)),
                          ValueError, r"param_groups\[1\]\['betas'\]\[1\] must be finite and in \[0\.0, 1\.0\)"),
    "amsgrad None": (lambda o, p, g: o.add_param_group({"params": [array.array("f", [1.0])], "amsgrad": None}),
                     TypeError, r"param_group\['amsgrad'\] must be True or False, got None"),
}
SGD_REFUSALS = {
    "nesterov without momentum": (lambda o, p, g: (o.param_groups[1].__setitem__("nesterov", True), o.step(g)),
                                  ValueError, r"param_groups\[1\]: nesterov=True needs momentum > 0"),
    "a NaN dampening in a group": (lambda o, p, g: (o.param_groups[1].__setitem__("dampening", float("nan")),
                                                    o.step(g)), ValueError,
                                   r"param_groups\[1\]\['dampening'\] must be finite, got nan"),
}
EDITS_GROUPS = {"negative lr in a group", "a string weight_decay", "a key removed", "params replaced",
                "a group appended by hand", "beta out of range", "nesterov without momentum",
                "a NaN dampening in a group"}
CASES = ([("Adam", c) for c in sorted(REFUSALS) + sorted(ADAM_REFUSALS)]
         + [("SGD", c) for c in sorted(REFUSALS) + sorted(SGD_REFUSALS)])


@pytest.mark.parametrize("cls, case", CASES)
def test_a_refusal_names_the_group_and_key_and_changes_nothing(mode, cls, case):
    params = params_for((5, 6, 7))
    opt = CLASSES[cls](_groups_of(params), numeric_mode=mode.numeric_mode)
    for t in (1, 2):
        opt.step(grads_for_step((5, 6, 7), t))
    call, exc, match = dict(REFUSALS, **ADAM_REFUSALS, **SGD_REFUSALS)[case]
    grads = grads_for_step((5, 6, 7), 3)
    before = snapshot(opt, *(params + grads))
    with pytest.raises(exc, match=match):
        call(opt, params, grads)
    after = snapshot(opt, *(params + grads))
    if case in EDITS_GROUPS:          # the groups hold the test's own edit; everything else is as it was
        for name in ("groups", "group_params"):
            before.pop(name), after.pop(name)
    assert after == before and opt.t == 2


@pytest.mark.parametrize("cls", ["Adam", "SGD"])
def test_constructor_refusals_name_the_group_and_key(cls):
    p = [array.array("f", [1.0, 2.0]), array.array("f", [3.0])]
    with pytest.raises(ValueError, match=r"^mojo_train\.%s: params\[1\]\['lr'\] must be finite" % cls):
        CLASSES[cls]([{"params": [p[0]]}, {"params": [p[1]], "lr": float("nan")}])
    with pytest.raises(TypeError, match=r"params\[1\] is a array, but other items are dicts"):
        CLASSES[cls]([{"params": [p[0]]}, p[1]])
    with pytest.raises(ValueError, match=r"params\[0\]\['params'\]\[0\] and params\[1\]\['params'\]\[0\] share"):
        CLASSES[cls]([{"params": [p[0]]}, {"params": [p[0]]}])
    with pytest.raises(TypeError, match="got a dict; pass \\[params\\] for one group"):
        CLASSES[cls]({"params": p})
    assert p[0].tolist() == [1.0, 2.0]


# ---- one parameter, one place: the same object twice, empty or not ---------------------------------

def _each_container_and_class(test):
    """``test`` for each optimizer class and each kind of tensor (array.array, Array, torch)."""
    return pytest.mark.parametrize("container", ["array.array", "Array", "torch"])(
        pytest.mark.parametrize("cls", sorted(CLASSES))(test))


def _empty(container):
    """A new empty float32 tensor of ``container``'s kind."""
    if container == "torch":
        return pytest.importorskip("torch").zeros(0)
    return Array((0,), "float32") if container == "Array" else array.array("f")


@_each_container_and_class
def test_an_empty_tensor_in_two_groups_is_refused_naming_both_as_torch_refuses_it(mode, cls, container):
    # An empty tensor has no byte to share, but it is one parameter: torch refuses it in two groups
    # ("some parameters appear in more than one parameter group").
    p, e = array.array("f", [1.0, 2.0]), _empty(container)
    with pytest.raises(ValueError, match=r"^mojo_train\.%s: params\[0\]\['params'\]\[1\] and params\[1\]\['params'\]"
                                         r"\[0\] are the same tensor; pass each parameter once$" % cls):
        CLASSES[cls]([{"params": [p, e]}, {"params": [e], "lr": 0.1}], numeric_mode=mode.numeric_mode)
    opt = CLASSES[cls]([{"params": [p, e]}], numeric_mode=mode.numeric_mode)
    opt.step([array.array("f", [0.5, 0.5]), _empty(container)])
    before = snapshot(opt, p)
    with pytest.raises(ValueError, match=r"^mojo_train\.%s\.add_param_group: params\[0\]\['params'\]\[1\] and "
                                         r"param_group\['params'\]\[0\] are the same tensor; pass each parameter "
                                         r"once$" % cls):
        opt.add_param_group({"params": [e], "lr": 0.1})
    assert snapshot(opt, p) == before and len(opt.param_groups) == 1 and opt.params == [p, e]
    opt.step([array.array("f", [0.5, 0.5]), _empty(container)])      # the refusal left a working optimizer
    assert opt.t == 2


@_each_container_and_class
def test_an_empty_tensor_twice_in_one_list_is_refused_naming_both(mode, cls, container):
    # torch warns ("duplicate parameters; in future, this will cause an error") and keeps both;
    # here one object twice is refused, as a non-empty one is (there: "share memory").
    p, e = array.array("f", [1.0, 2.0]), _empty(container)
    with pytest.raises(ValueError, match=r"^mojo_train\.%s: params\[1\] and params\[3\] are the same tensor; "
                                         r"pass each parameter once$" % cls):
        CLASSES[cls]([p, e, _empty(container), e], numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError, match=r"params\[1\]\['params'\]\[0\] and params\[1\]\['params'\]\[2\] "
                                         r"are the same tensor"):
        CLASSES[cls]([{"params": [p]}, {"params": [e, _empty(container), e]}], numeric_mode=mode.numeric_mode)
    opt = CLASSES[cls]([p], numeric_mode=mode.numeric_mode)
    before = snapshot(opt, p)
    with pytest.raises(ValueError, match=r"param_group\['params'\]\[0\] and param_group\['params'\]\[1\] are the "
                                         r"same tensor"):
        opt.add_param_group({"params": [e, e]})
    assert snapshot(opt, p) == before and p.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("cls", sorted(CLASSES))
def test_distinct_empty_tensors_are_distinct_parameters_even_over_one_buffer(mode, cls):
    # Identity, not memory, makes "the same parameter": two objects are two parameters (torch takes
    # two distinct empty tensors), even two views of one empty buffer, which share no byte.
    buffer = array.array("f")
    empties = [array.array("f"), Array((0,), "float32"), memoryview(buffer), memoryview(buffer)]
    p = array.array("f", [1.0, 2.0])
    opt = CLASSES[cls]([{"params": [p, empties[0]]}, {"params": empties[1:3], "lr": 0.1}],
                       numeric_mode=mode.numeric_mode)
    opt.add_param_group({"params": [empties[3]]})
    assert opt.params == [p] + empties and opt.n_total == 2
    opt.step([array.array("f", [0.5, -0.5])] + [array.array("f") for _ in empties])
    assert opt.t == 1 and p.tolist() != [1.0, 2.0]
    CLASSES[cls]([array.array("f"), array.array("f")], numeric_mode=mode.numeric_mode)


def test_switching_amsgrad_on_makes_its_state_and_a_refused_step_drops_it(mode):
    params = params_for((4, 5))
    opt = Adam([{"params": params[:1]}, {"params": params[1:]}], numeric_mode=mode.numeric_mode)
    opt.step(grads_for_step((4, 5), 1))
    assert opt.max_exp_avg_sq is None
    opt.param_groups[1]["amsgrad"] = True
    bad = grads_for_step((4, 5), 2)
    bad[0][1] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        opt.step(bad)
    assert opt.max_exp_avg_sq is None and opt.steps == [1, 1]
    opt.step(grads_for_step((4, 5), 2))
    w = opt.max_exp_avg_sq.tolist()
    assert w[:4] == [0.0] * 4 and w[4:] == opt.exp_avg_sq.tolist()[4:]


# ---- state_dict ---------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", sorted(GROUPED))
def test_a_grouped_run_saved_and_resumed_with_a_late_group_is_bit_identical(mode, kind):
    cls, _, sizes, own = GROUPED[kind]
    first = sum(sizes[:-1])
    a_params, b_params = params_for(SIZES), params_for(SIZES)
    a, _, _ = grouped(kind, a_params, mode.numeric_mode, n_groups=len(sizes) - 1)
    a.step(grads_for_step(SIZES[:first], 1), max_norm=2.0)
    a.add_param_group(dict(own[-1], params=a_params[first:]))
    a.step(grads_for_step(SIZES, 2), max_norm=2.0)
    state = pickle.loads(pickle.dumps(a.state_dict()))
    assert state["param_groups"][-1]["params"] == list(range(first, len(SIZES)))
    for mine, theirs in zip(b_params, a_params):
        memoryview(mine)[:] = memoryview(theirs)
    b = CLASSES[cls]([{"params": part} for part in split(b_params, sizes)], numeric_mode=mode.numeric_mode)
    b.load_state_dict(state)
    assert [dict(g, params=None) for g in b.param_groups] == [dict(g, params=None) for g in a.param_groups]
    if cls != "SGD":
        assert b.steps == a.steps == [2] * first + [1] * (len(SIZES) - first)
    for t in (3, 4):
        a.step(grads_for_step(SIZES, t), max_norm=2.0)
        b.step(grads_for_step(SIZES, t), max_norm=2.0)
    assert digest(a) == digest(b)
    if cls != "SGD":
        assert raw(a.max_exp_avg_sq) == raw(b.max_exp_avg_sq)


@pytest.mark.parametrize("cls", ["SGD", "Adam"])
def test_a_state_saved_before_param_groups_loads_and_a_partial_one_is_refused(mode, cls):
    kw = dict(momentum=0.9) if cls == "SGD" else {}
    src, dst = params_for((3, 4)), params_for((3, 4))
    a = CLASSES[cls](src, lr=0.01, numeric_mode=mode.numeric_mode, **kw)
    a.step(grads_for_step((3, 4), 1))
    old = {k: v for k, v in a.state_dict().items() if k not in ("param_groups", "steps", "max_exp_avg_sq")}
    b = CLASSES[cls](dst, lr=0.5, numeric_mode=mode.numeric_mode, **kw)
    if cls == "Adam":
        partial = dict(old, steps=[1, 1])
        with pytest.raises(ValueError, match="state lacks param_groups, max_exp_avg_sq"):
            b.load_state_dict(partial)
    b.load_state_dict(old)
    assert b.t == 1 and b.lr == 0.01 and getattr(b, "steps", [1, 1]) == [1, 1]
    for mine, theirs in zip(dst, src):
        memoryview(mine)[:] = memoryview(theirs)
    a.step(grads_for_step((3, 4), 2))
    b.step(grads_for_step((3, 4), 2))
    assert digest(a) == digest(b)
    two = CLASSES[cls]([{"params": [params_for((3,))[0]]}, {"params": [params_for((4,))[0]]}],
                       numeric_mode=mode.numeric_mode, **kw)
    with pytest.raises(ValueError, match=r"saved before param groups\), but this optimizer has 2 groups"):
        two.load_state_dict(old)


def _adam_bad_states(good):
    groups = good["param_groups"]
    return {
        "groups of another count": (dict(good, param_groups=groups[:1]), ValueError,
                                    "must be a list of 2 groups"),
        "other tensors": (dict(good, param_groups=[dict(groups[0], params=[1]), groups[1]]), ValueError,
                          r"param_groups\[0\]\['params'\] in the state is \[1\]"),
        "a group key missing": (dict(good, param_groups=[{k: v for k, v in groups[0].items() if k != "eps"},
                                                         groups[1]]), ValueError, "must be a dict of exactly"),
        "a bad lr": (dict(good, param_groups=[groups[0], dict(groups[1], lr=-2.0)]), ValueError,
                     r"param_groups\[1\]\['lr'\] must be finite"),
        "a schedule config that is none": (dict(good, param_groups=[dict(groups[0], lr_schedule="x"), groups[1]]),
                                           ValueError, r"param_groups\[0\]\['lr_schedule'\] in the state is not"),
        "steps beyond t": (dict(good, steps=[3, 2, 2]), ValueError, "steps\\[0\\] is 3, more than t=2"),
        "a bool step": (dict(good, steps=[True, 2, 2]), TypeError, r"steps\[0\] must be an int"),
        "steps of another length": (dict(good, steps=[2, 2]), ValueError, "steps must be a list of 3 ints"),
        "moments at step 0": (dict(good, steps=[2, 0, 2]), ValueError,
                              r"exp_avg is non-zero for params\[1\], whose step count is 0"),
        "max_exp_avg_sq negative": (dict(good, max_exp_avg_sq=array.array("f", [0.0] * 8 + [-1.0])), ValueError,
                                    r"max_exp_avg_sq\[8\] is -1\.0; a second moment is >= 0"),
        "max_exp_avg_sq missing while a group uses amsgrad": (dict(good, max_exp_avg_sq=None), ValueError,
                                                              "max_exp_avg_sq must not be None"),
    }


@pytest.mark.parametrize("bad", sorted(_adam_bad_states({"param_groups": [{}, {}]}).keys()))
def test_load_state_dict_refuses_each_bad_group_or_step_and_changes_nothing(mode, bad):
    def make(params):
        return Adam([{"params": params[:1]}, {"params": params[1:], "amsgrad": True}], lr=1e-2,
                    numeric_mode=mode.numeric_mode)
    source = make(params_for((2, 3, 4)))
    for t in (1, 2):
        source.step(grads_for_step((2, 3, 4), t))
    good = source.state_dict()
    params = params_for((2, 3, 4), seed=1)
    opt = make(params)
    opt.step(grads_for_step((2, 3, 4), 1))
    state, exc, match = _adam_bad_states(good)[bad]
    before = snapshot(opt, *params)
    with pytest.raises(exc, match=match):
        opt.load_state_dict(state)
    assert snapshot(opt, *params) == before
    opt.load_state_dict(good)
    assert opt.steps == [2, 2, 2] and opt.t == 2


# ---- the native grouped calls, as a torch adapter makes them ---------------------------------------

def _tables(tensors):
    keep = [ffi.from_buffer("float[]", t) for t in tensors]
    table = ffi.new("float *[]", len(tensors))
    for j, k in enumerate(keep):
        table[j] = k
    return table, keep


def _adam_native(lib, params, grads, m, v, w, steps, group_rows, tensor_group, clip=0, max_norm=0.0):
    """mt_adam_step_groups over separate per-tensor state arrays (a state tensor per parameter)."""
    offsets = ffi.new("int32_t[]", [0] + [sum(len(p) for p in params[:j + 1]) for j in range(len(params))])
    tabs = [_tables(x) for x in (params, grads, m, v, w)]
    groups = ffi.new("mt_adam_group[]", group_rows)
    tg = ffi.new("int32_t[]", tensor_group)
    norm = ffi.new("float[2]")
    rc = lib.mt_adam_step_groups(tabs[0][0], tabs[1][0], tabs[2][0], tabs[3][0], tabs[4][0], steps, norm, offsets,
                                 groups, tg, clip, max_norm, len(group_rows), len(params))
    return rc


def test_the_native_call_on_a_state_tensor_per_parameter_gives_the_optimizers_bits(mode):
    lib = mode.backend.lib
    sizes = (5, 300, 130)
    mine = params_for(sizes)
    opt = Adam([{"params": mine[:2]}, {"params": mine[2:], "amsgrad": True, "lr": 3e-3}], lr=1e-2,
               weight_decay=0.1, numeric_mode=mode.numeric_mode)
    theirs = params_for(sizes)
    m, v, w = ([array.array("f", [0.0] * n) for n in sizes] for _ in range(3))
    steps = ffi.new("int64_t[]", [0, 0, 0])
    rows = [(1e-2, 0.9, 0.999, 1e-8, 0.1, 0), (3e-3, 0.9, 0.999, 1e-8, 0.1, lib.MT_OPTIM_AMSGRAD)]
    for t in (1, 2, 3):
        opt.step(grads_for_step(sizes, t), max_norm=5.0)
        assert _adam_native(lib, theirs, grads_for_step(sizes, t), m, v, w, steps, rows, [0, 0, 1], 1, 5.0) == 0
    assert [raw(p) for p in theirs] == [raw(p) for p in mine]
    assert raw(opt.exp_avg) == b"".join(raw(x) for x in m) and raw(opt.exp_avg_sq) == b"".join(raw(x) for x in v)
    assert raw(opt.max_exp_avg_sq)[4 * 305:] == raw(w[2]) and list(steps) == [3, 3, 3]
    assert w[0].tolist() == [0.0] * 5                  # not a tensor of an amsgrad group: never written


NATIVE_REFUSALS = {
    "a group index out of range": (dict(tensor_group=[0, 2]), r"tensor_group\[1\] is 2; a group index is in \[0, "
                                                              r"n_groups = 2\)"),
    "a negative step count": (dict(steps=[0, -1]), r"steps\[1\] is -1"),
    "an unknown flag": (dict(flags=1 << 7), r"groups\[1\]\.flags has unknown bits 0x80"),
    "nesterov on Adam": (dict(flags=2), r"groups\[1\]\.flags has unknown bits 0x2"),
    "beta2 of 1": (dict(beta2=1.0), r"groups\[1\]\.beta2 must be in \[0, 1\)"),
    "no max_exp_avg_sq table with amsgrad": (dict(no_w=True), r"max_exp_avg_sq is NULL, but tensor 1 is in a group "
                                                              "that uses it"),
}


@pytest.mark.parametrize("case", sorted(NATIVE_REFUSALS))
def test_a_refused_native_grouped_call_writes_nothing(mode, case):
    lib = mode.backend.lib
    change, match = NATIVE_REFUSALS[case]
    params, grads = params_for((3, 4)), grads_for_step((3, 4), 1)
    m, v, w = ([array.array("f", [0.25] * n) for n in (3, 4)] for _ in range(3))
    steps = ffi.new("int64_t[]", change.get("steps", [1, 1]))
    rows = [(1e-2, 0.9, 0.999, 1e-8, 0.0, 0),
            (1e-2, 0.9, change.get("beta2", 0.999), 1e-8, 0.0, change.get("flags", lib.MT_OPTIM_AMSGRAD))]
    before = [raw(x) for x in params + grads + m + v + w] + [list(steps)]
    offsets = ffi.new("int32_t[]", [0, 3, 7])
    tabs = [_tables(x) for x in (params, grads, m, v, w)]
    rc = lib.mt_adam_step_groups(tabs[0][0], tabs[1][0], tabs[2][0], tabs[3][0],
                                 ffi.NULL if change.get("no_w") else tabs[4][0], steps, ffi.new("float[2]"), offsets,
                                 ffi.new("mt_adam_group[]", rows), ffi.new("int32_t[]", change.get("tensor_group",
                                                                                                [0, 1])),
                                 0, 0.0, 2, 2)
    assert rc == lib.MT_EINVAL
    import re
    assert re.search(match, ffi.string(lib.mt_last_error()).decode()), ffi.string(lib.mt_last_error())
    assert [raw(x) for x in params + grads + m + v + w] + [list(steps)] == before


def test_the_native_sgd_call_marks_only_the_tensors_of_groups_with_momentum(mode):
    lib = mode.backend.lib
    params, grads = params_for((3, 0, 4)), grads_for_step((3, 0, 4), 1)
    buf = [array.array("f", [0.0] * n) for n in (3, 0, 4)]
    flags = ffi.new("int32_t[]", [0, 0, 0])
    tabs = [_tables(x) for x in (params, grads, buf)]
    rows = ffi.new("mt_sgd_group[]", [(0.1, 0.9, 0.0, 0.0, lib.MT_OPTIM_NESTEROV), (0.1, 0.0, 0.0, 0.0, 0)])
    rc = lib.mt_sgd_step_groups(tabs[0][0], tabs[1][0], tabs[2][0], flags, ffi.NULL, ffi.new("int32_t[]", [0, 3, 3, 7]),
                                rows, ffi.new("int32_t[]", [0, 0, 1]), 0, 0.0, 2, 3)
    assert rc == 0 and list(flags) == [1, 1, 0]
    assert buf[0].tolist() == grads[0].tolist() and buf[2].tolist() == [0.0] * 4


# ---- torch float64 (the other numeric modes: within the stated bound) ----------------------------

@pytest.mark.parametrize("cls", ["Adam", "AdamW"])
def test_amsgrad_groups_stay_within_the_bound_of_torch_float64(mode, cls):
    torch = pytest.importorskip("torch")
    np = pytest.importorskip("numpy")
    import tolerances as tol
    sizes, steps = (7, 33, 5), 20
    params = params_for(sizes, seed=5)
    spec = [dict(lr=1e-2, amsgrad=True, weight_decay=0.0 if cls == "Adam" else 0.01),
            dict(lr=3e-3, betas=(0.8, 0.99), amsgrad=False)]
    ours = CLASSES[cls]([dict(spec[0], params=params[:2]), dict(spec[1], params=params[2:])],
                        numeric_mode=mode.numeric_mode)
    ts = [torch.tensor(list(p), dtype=torch.float64) for p in params]
    ref = getattr(torch.optim, cls)([dict(spec[0], params=ts[:2]), dict(spec[1], params=ts[2:])])
    g_unit = 0.0
    for t in range(1, steps + 1):
        grads = grads_for_step(sizes, t, scale=1.0 / t)     # shrinking gradients: the maximum is what divides
        ours.step(grads)
        for p, g in zip(ts, grads):
            p.grad = torch.tensor(list(g), dtype=torch.float64)
        ref.step()
        g_unit = max(g_unit, max(abs(x) for g in grads for x in g) + 0.01)
    units = tol.units(cls, dict(lr=1e-2), g_unit)
    units["params"] *= steps / tol.STEPS
    tol.assert_close_to_reference(np.asarray(flat(params)), torch.cat(ts).numpy(), "params", units["params"])
    ref_w = torch.cat([ref.state[p]["max_exp_avg_sq"] for p in ts[:2]]).numpy()
    tol.assert_close_to_reference(np.asarray(ours.max_exp_avg_sq.tolist()[:40]), ref_w, "max_exp_avg_sq",
                                  units["exp_avg_sq"])
    assert ours.steps == [steps] * 3 and [int(ref.state[p]["step"]) for p in ts] == [steps] * 3
