"""Fuzz targets with state: the optimizers (construction, step, zero_grad, the state dict, the
state properties, step_accumulated), clip_grad_norm_ and gradient accumulation
(tests/_fuzz_targets.py holds the registry and says how targets are written).

Oracles: tests/_helpers.py's replays of the optimizer and clip contracts (ref_sgd, ref_adam,
ref_clip; Adam's bias corrections by the library's pinned routine, as tests/test_optim.py
takes them) and the pairwise tree of accumulate.md.
"""
import functools

import numpy as np
from hypothesis import strategies as st

from _fuzz_build import build
from _fuzz_spec import (BOOL_BAD, FnTarget, MethodTarget, Scalar, Subject, WRITABLE_KINDS, bad, buf,
                        count, int_bad, kinds_for, real_bad, reals, with_field)
from _fuzz_targets import assert_same_bits, c_order, host
from _helpers import _tree_fold, f32, ref_adam, ref_clip, ref_sgd
from mojo_train.optim import _KEYS

U64 = 2 ** 64
SIZES = st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=3)


def flat_values(xs):
    """The float values of a list of buffers (numpy arrays or built objects), concatenated."""
    return [float(v) for x in xs for v in np.asarray(host(x) if not isinstance(x, np.ndarray) else x).reshape(-1)]


def shapes_of(sizes):
    """(n,) or (n, m) shapes from drawn (n, m) pairs (m = 0: one dimension)."""
    return [(n,) if m == 0 else (n, m) for n, m in sizes]


# ---- tensor lists -----------------------------------------------------------------------------

class TensorList(Scalar):
    """A list of float32 tensors of the shapes ``dims[key]``: gradients, parameters. ``writes``
    is called with the example to say whether the call writes them (a read-only one is then
    refused). Faults: a wrong count, one tensor bad (dtype, layout, values, type, shape), one
    passed twice (a non-empty one: an empty tensor shares no memory, and the rule for it differs
    between clip_grad_norm_ and the optimizers), one sharing memory with
    another argument (``alias_of``). ``finite``: True, a
    NaN or infinity is refused; False, it may be; a callable of the example: True refuses, False
    takes it (the oracle runs)."""

    def __init__(self, name, key="shapes", role="update", alias_of=(), written=lambda ex: True, finite=True,
                 counted=True, **kw):
        super().__init__(name, None, (), **kw)
        self.key, self.role, self.alias_of, self.written, self.finite = key, role, alias_of, written, finite
        self.counted = counted      # False: any number of tensors is valid (no count to get wrong)

    def valid(self, draw, ctx, dims, side):
        items = [buf("float32", shape, draw(st.sampled_from(kinds_for(self.role, ctx, side))),
                     draw(st.sampled_from(("unit", "wide", "tiny", "zero"))), draw(st.integers(0, 2 ** 16)))
                 for shape in dims[self.key]]
        return (draw(st.sampled_from(("list", "list", "tuple"))), items)

    def fault(self, draw, ctx, dims, ex, target):
        spec = ex.get(self.name)
        if spec is None or spec[0] not in ("list", "tuple") or not spec[1]:
            return False
        items = list(spec[1])
        how = draw(st.sampled_from(("count", "item", "item", "item", "twice", "alias", "not a list")))
        i = draw(st.integers(0, len(items) - 1))
        if how == "count" and self.counted:
            items = items[:-1] if len(items) > 1 and draw(st.booleans()) else items + [items[0]]
            ex.fault(self.name, "%d tensors" % len(items))
        elif how == "twice" and len(items) > 1 and items[i][0] == "buf" and 0 not in items[i][2]:
            # one tensor twice shares memory (refused: two writers); an empty one shares none and
            # is not drawn: clip_grad_norm_ takes it, as torch does, and the optimizers refuse it
            # as one object in two places (optim.py's docstring)
            j = (i + 1) % len(items)
            ex.pool["twice"] = items[i]
            items[i] = items[j] = ("alias", "twice", None)
            ex.fault(self.name, "%s[%d] is %s[%d]" % (self.name, i, self.name, j))
        elif how == "alias" and self.alias_of:
            other = draw(st.sampled_from(self.alias_of))
            items[i] = ("alias", other, i) if other == "params" else ("alias", other, None)
            ex.fault((self.name, other), "%s[%d] shares memory with %s" % (self.name, i, other))
        elif how == "not a list":
            ex.put(self.name, draw(st.sampled_from((("lit", "abc"), ("lit", None), ("lit", 3), ("obj", "object")))))
            ex.fault(self.name, "not a list of buffers")
            return True
        else:
            return self._item_fault(draw, ctx, ex, items, i, spec)
        ex.put(self.name, (spec[0], items))
        return True

    def _item_fault(self, draw, ctx, ex, items, i, spec):
        item = items[i]
        if item[0] != "buf":
            return False
        options = ["dtype", "type", "released", "readonly"] + (["shape"] if self.counted else []) + \
            (["nonfinite"] if count(item[2]) else []) + (["strided"] if count(item[2]) >= 2 else [])
        how = draw(st.sampled_from(options))
        level = "hard"
        if how == "dtype":
            items[i] = with_field(item, dtype=draw(st.sampled_from(("float64", "float16", "int32", "uint8"))))
        elif how == "type":
            items[i] = draw(st.sampled_from((("lit", "abc"), ("lit", None), ("lit", [1.0]), ("obj", "object"))))
        elif how == "shape":
            items[i] = with_field(item, shape=item[2][:-1] + (item[2][-1] + 1,))
        elif how == "released":
            items[i] = with_field(item, kind="released")
        elif how == "readonly":
            items[i] = with_field(item, kind="readonly")
            level = "hard" if self.written(ex) else None
        elif how == "nonfinite":
            items[i] = with_field(item, special=((0, draw(st.sampled_from(("nan", "inf", "-inf")))),))
            finite = self.finite(ex) if callable(self.finite) else self.finite
            level = "hard" if finite else None if callable(self.finite) else "soft"
        else:
            items[i] = with_field(item, kind=draw(st.sampled_from(("numpy_strided", "numpy_transposed"))))
        if level:
            ex.fault(self.name, "%s[%d]: %s" % (self.name, i, how), level)
        ex.put(self.name, (spec[0], items))
        return True


# ---- optimizers -------------------------------------------------------------------------------

def _maybe_zero(strategy):
    return st.one_of(st.just(0.0), strategy)


HYPER = {
    "SGD": {"lr": reals(0.0, 0.5), "momentum": _maybe_zero(reals(0.0, 0.99)),
            "dampening": _maybe_zero(reals(-0.5, 0.9)), "weight_decay": _maybe_zero(reals(0.0, 0.1)),
            "nesterov": st.booleans(), "maximize": st.booleans()},
    "Adam": {"lr": reals(0.0, 0.5), "betas": st.tuples(reals(0.0, 0.99), reals(0.0, 0.999)),
             "eps": st.one_of(reals(1e-8, 1e-3)), "weight_decay": _maybe_zero(reals(0.0, 0.1)),
             "maximize": st.booleans(), "foreach": st.sampled_from((None, False, True)), "amsgrad": st.booleans()},
}
HYPER["AdamW"] = HYPER["Adam"]

HYPER_BAD = {
    "lr": real_bad(0.0), "momentum": real_bad(0.0), "dampening": real_bad(None), "weight_decay": real_bad(0.0),
    "eps": real_bad(0.0), "nesterov": BOOL_BAD, "maximize": BOOL_BAD,
    "betas": bad((0.9,), (0.9, 1.0), (1.0, 0.9), (-0.1, 0.9), (0.9, float("nan")), (0.9, 0.999, 0.1), 0.9,
                 (0.9, 1.0 - 1e-9), ("0.9", 0.9)),
    "foreach": bad(1, "yes"), "fused": bad(1, "yes"),
    "amsgrad": bad(1, None, "yes"),
    "capturable": bad(True, extra=("NotImplementedError",)),
    "differentiable": bad(True, extra=("NotImplementedError",)),
    "resident": bad(1, "yes"), "lr_schedule": bad("abc", 0.1, 3),
    "accumulation_steps": int_bad(1, 2 ** 31 - 1),
}


GROUP_KEYS = {"SGD": ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize"),
              "Adam": ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize")}
GROUP_KEYS["AdamW"] = GROUP_KEYS["Adam"]


def _hyper(draw, cls, keys=None, amsgrad=True):
    hyper = {k: draw(v) for k, v in HYPER[cls].items()
             if draw(st.integers(0, 2)) and (keys is None or k in keys) and (amsgrad or k != "amsgrad")}
    if hyper.get("nesterov") and (not f32(float(hyper.get("momentum", 0.0))) or hyper.get("dampening")):
        hyper["nesterov"] = False           # (a momentum that is 0 in float32 is no momentum: see the report)
    return hyper


def _schedule(draw):
    kind = draw(st.sampled_from((None, None, "ConstantLR", "WarmupLinearLR", "WarmupCosineLR")))
    if kind is None:
        return None
    args = {"peak_lr": draw(reals(0.0, 0.1)), "warmup_steps": draw(st.integers(0, 3))}
    if kind != "ConstantLR":
        args["total_steps"] = args["warmup_steps"] + draw(st.integers(1, 5))
    return ("obj", "schedule", kind, args)


def group_hyper(draw, cls, amsgrad=True):
    """One param group's own hyper-parameters (the others come from the defaults): an SGD group
    says its nesterov (and dampening 0 with it), so the defaults cannot make it incoherent."""
    hyper = _hyper(draw, cls, GROUP_KEYS[cls], amsgrad)
    if cls == "SGD":
        hyper.setdefault("nesterov", False)
        if hyper["nesterov"]:
            hyper["dampening"] = 0.0
    return hyper


def draw_groups(draw, cls, n, amsgrad=True):
    """None (a plain list of tensors), or the param groups over ``n`` tensors: (tensor count,
    hyper-parameters) per group, every group at least one tensor."""
    if draw(st.integers(0, 2)):
        return None
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=2)))) if n > 1 else []
    sizes = [b - a for a, b in zip([0] + cuts, cuts + [n])]
    return [(k, group_hyper(draw, cls, amsgrad)) for k in sizes]


def with_groups(params, groups):
    """``params`` (a list) split into param group dicts by ``groups`` ((count, hyper) pairs)."""
    out, at = [], 0
    for k, hyper in groups:
        out.append(dict({"params": params[at:at + k]}, **hyper))
        at += k
    return out


def draw_optimizer(draw, ctx, cls, accumulation=False, groups=True, amsgrad=True):
    """A valid optimizer description: its class, parameters (all host or all device memory),
    in param groups or not, options and the steps before."""
    shapes = shapes_of(draw(SIZES))
    side = "device" if ctx.device and draw(st.integers(0, 3)) == 0 else "host"
    params = [buf("float32", s, draw(st.sampled_from(kinds_for("update", ctx, side))), "unit",
                  draw(st.integers(0, 2 ** 16))) for s in shapes]
    setup = {"cls": cls, "params": params, "hyper": _hyper(draw, cls, amsgrad=amsgrad), "schedule": _schedule(draw),
             "groups": draw_groups(draw, cls, len(params), amsgrad) if groups else None,
             "accumulation_steps": draw(st.integers(1, 3)) if accumulation else 1,
             "prior": [(draw(st.integers(0, 99)), draw(st.sampled_from((None, 0.5, 100.0))))
                       for _ in range(draw(st.integers(0, 2)))]}
    return setup, {"shapes": shapes, "sizes": [count(s) for s in shapes], "side": side}


def _grads_for(seed, shapes, device, numeric_mode):
    import mojo_train as mt
    from _helpers import f32_array
    grads = [mt.Array.from_bytes(f32_array(count(s), 1000 * seed + j).tobytes(), s, "float32")
             for j, s in enumerate(shapes)]
    return [mt.to_device(g, numeric_mode=numeric_mode) for g in grads] if device else grads


def make_optimizer(setup, built, numeric_mode):
    """The optimizer of ``setup`` after its prior steps, its parameters registered as caller
    memory (``built``'s "params"), and a copy of its state before the call under test."""
    import mojo_train as mt
    params, _ = build(("list", setup["params"]), built, "params")
    sched = build(setup["schedule"], built)[0] if setup["schedule"] else None
    grouped = with_groups(params, setup["groups"]) if setup.get("groups") else params
    opt = getattr(mt, setup["cls"])(grouped, numeric_mode=numeric_mode, lr_schedule=sched,
                                    accumulation_steps=setup["accumulation_steps"], **setup["hyper"])
    shapes = [tuple(np.shape(host(p))) for p in params]
    device = any(isinstance(p, mt.DeviceArray) for p in params)
    for seed, max_norm in setup["prior"]:
        opt.step(_grads_for(seed, shapes, device, numeric_mode), max_norm=max_norm)
    state = {n: (None if getattr(opt, n, None) is None else getattr(opt, n).tolist()) for n in STATE_NAMES}
    return Subject(opt, p=flat_values(params), t=opt.t, steps=list(getattr(opt, "steps", [opt.t] * len(params))),
                   **state)


STATE_NAMES = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "buf_initialized")


class OptimizerMethod(MethodTarget):
    """A method of SGD, Adam or AdamW called on an optimizer after 0-2 steps."""

    cls = None
    accumulation = False
    groups = True        # False: no param groups (the state targets draw one group)
    amsgrad = True       # False: no group uses amsgrad

    def draw_setup(self, draw, ctx):
        return draw_optimizer(draw, ctx, self.cls, self.accumulation, self.groups, self.amsgrad)

    def make(self, setup, built, numeric_mode):
        return make_optimizer(setup, built, numeric_mode)

    def state(self, subject):
        return optimizer_state(subject.obj)


def optimizer_state(opt):
    """Every byte and number a refused call must leave as it was (tests/_helpers.py's snapshot,
    for torch and device tensors too): params, moments, flags, t, the per-step reports, lr."""
    state = {name: None if getattr(opt, name, None) is None else host(getattr(opt, name)).tobytes()
             for name in STATE_NAMES}
    state["steps"] = getattr(opt, "steps", None)
    state["param_groups"] = repr(opt.param_groups)
    state["params"] = [host(p).tobytes() for p in opt.params]
    state.update((name, getattr(opt, name)) for name in ("t", "lr_", "total_norm_", "clip_coef_"))
    state["lr_schedule"] = id(opt.lr_schedule)
    return state


def replay_step(c, grads, max_norm):
    """(params, exp_avg, exp_avg_sq, max_exp_avg_sq, total, clipped grads) of one step by the
    contract, from the optimizer's state before the call: tensor by tensor, each with its
    group's hyper-parameters and (Adam) its own step count."""
    s, opt = c.subject.before, c.subject.obj
    total, coef, g = (None, None, [list(x) for x in grads]) if max_norm is None else ref_clip(grads, max_norm)
    p = list(s["p"])
    state = {k: None if s[k] is None else list(s[k]) for k in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")}
    at = 0
    j = 0
    for gi, group in enumerate(opt.param_groups):
        for _ in group["params"]:
            k = len(g[j])
            sl = slice(at, at + k)
            _replay_tensor(c, group, j, p, g[j], state, sl)
            at, j = at + k, j + 1
    return p, state, total, g


def _replay_tensor(c, group, j, p, grad, state, sl):
    """One tensor's update in place on the flat lists (``sl`` its slice)."""
    from test_optim import library_one_minus_pow
    s, opt = c.subject.before, c.subject.obj
    t = s["steps"][j] + 1
    lr = group["lr_schedule"].lr_at(t) if group["lr_schedule"] is not None else group["lr"]
    pj = p[sl]
    zero = [0.0] * len(pj)
    m = state["exp_avg"][sl] if state["exp_avg"] is not None else list(zero)
    if type(opt).__name__ == "SGD":
        flags = s["buf_initialized"]
        ref_sgd(pj, grad, m, bool(flags and flags[j]), lr, group["momentum"], group["dampening"],
                group["weight_decay"], group["nesterov"], group["maximize"])
    else:
        v = state["exp_avg_sq"][sl]
        vmax = state["max_exp_avg_sq"][sl] if group["amsgrad"] else None
        b1, b2 = group["betas"]
        bc1, bc2 = (library_one_minus_pow(opt._backend, f32(b), t) for b in (b1, b2))
        ref_adam(pj, grad, m, v, lr, b1, b2, group["eps"], group["weight_decay"], group["maximize"],
                 type(opt).__name__ == "AdamW", bc1, bc2, vmax=vmax)
        state["exp_avg_sq"][sl] = v
        if vmax is not None:
            state["max_exp_avg_sq"][sl] = vmax
    p[sl] = pj
    if state["exp_avg"] is not None:
        state["exp_avg"][sl] = m


def check_step(c, grads, max_norm, result):
    """The optimizer after one step holds the contract's bits, and ``result`` is its report."""
    opt = c.subject.obj
    p, state, total, clipped = replay_step(c, grads, max_norm)
    assert opt.t == c.subject.before["t"] + 1, "t is %d after a step from %d" % (opt.t, c.subject.before["t"])
    assert_same_bits(np.array(flat_values(opt.params), np.float32), p, "params")
    for name, want in state.items():
        if want is not None:
            assert_same_bits(host(getattr(opt, name)), want, name)
    if hasattr(opt, "steps"):
        assert opt.steps == [k + 1 for k in c.subject.before["steps"]], "steps %r" % (opt.steps,)
    assert result == total, "returned %r, the pre-clip total is %r" % (result, total)
    return clipped


def _max_norm():
    return Scalar("max_norm", st.one_of(st.none(), reals(0.0, 10.0)), real_bad(0.0, optional=True), kw=True,
                  optional=True)


def _clips(ex):
    spec = ex.get("max_norm")
    return spec is not None and spec[1] is not None


class Step(OptimizerMethod):
    method = "step"
    params = (TensorList("grads", alias_of=("params",), written=_clips), _max_norm())

    def writes_for(self, desc):
        return ("params", "grads") if any(n == "max_norm" and s[1] is not None for n, s, _ in desc["args"]) \
            else ("params",)

    def check(self, c):
        grads = [list(np.asarray(g, dtype=np.float64).reshape(-1)) for g in c.before("grads")]
        max_norm = c.lit("max_norm")
        clipped = check_step(c, grads, None if max_norm is None else float(max_norm), c.result)
        assert_same_bits(np.array(flat_values(c.args["grads"]), np.float32), [v for x in clipped for v in x],
                         "grads after the step")


class ZeroGrad(OptimizerMethod):
    method = "zero_grad"
    writes = ("grads",)
    params = (TensorList("grads", alias_of=("params",), finite=False),)      # overwritten: NaN in them is no fault

    def check(self, c):
        assert c.result is None
        n = sum(count(np.shape(g)) for g in c.before("grads"))
        assert_same_bits(np.array(flat_values(c.args["grads"]), np.float32), [0.0] * n, "grads")
        assert c.subject.obj.t == c.subject.before["t"]


class StateDict(OptimizerMethod):
    method = "state_dict"
    params = ()

    def check(self, c):
        opt, state = c.subject.obj, c.result
        assert state["t"] == opt.t and state["kind"] == type(opt).__name__ and state["n_total"] == opt.n_total
        for name in STATE_NAMES:
            if name in state:
                want = c.subject.before[name]
                assert (state[name] is None) == (want is None), name
                if want is not None:
                    assert state[name].tolist() == want, name


class LoadStateDict(OptimizerMethod):
    """load_state_dict of a state drawn valid for this optimizer (any step count, any finite
    moments, second moments >= 0), then faults in its keys and values."""

    method = "load_state_dict"
    params = ()
    groups = amsgrad = False

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        n, tensors = sum(dims["sizes"]), len(dims["sizes"])
        sgd = setup["cls"] == "SGD"
        t = draw(st.sampled_from((0, 1, 2, 17)))
        moments = "zero" if t == 0 else "unit"
        state = {"kind": ("lit", setup["cls"]), "t": ("lit", t), "n_total": ("lit", n),
                 "lr": ("lit", draw(reals(0.0, 0.5))), "lr_schedule": ("lit", None),
                 "accumulation_steps": ("lit", setup["accumulation_steps"])}
        if sgd:
            keeps = bool(setup["hyper"].get("momentum"))
            state["exp_avg"] = buf("float32", (n,), "numpy", moments, 1) if keeps else ("lit", None)
            state["buf_initialized"] = buf("int32", (tensors,), "numpy", ("ids", int(t > 0 and keeps), int(t > 0 and keeps)), 0)
        else:
            state["exp_avg"] = buf("float32", (n,), draw(st.sampled_from(("numpy", "Array", "array"))), moments, 1)
            state["exp_avg_sq"] = buf("float32", (n,), "numpy", "zero" if t == 0 else "pos", 2)
        if setup["schedule"] is not None:
            state["lr_schedule"] = ("lit", None)
        for _ in range(draw(st.sampled_from((0, 1, 1, 2)))):
            self._fault(draw, state, ex, n, tensors, sgd)
        ex.add("state", state.pop("not a dict", ("dict", state)), False)
        return ex.desc()

    def _fault(self, draw, state, ex, n, tensors, sgd):
        moments = [k for k in ("exp_avg", "exp_avg_sq") if k in state and state[k][0] == "buf"]
        how = draw(st.sampled_from(("missing", "unknown", "kind", "n_total", "t", "lr", "moment", "moment",
                                    "flags", "schedule", "steps", "not a dict")))
        if how == "missing":
            key = draw(st.sampled_from(sorted(k for k in state if k in _KEYS or k in ("exp_avg", "exp_avg_sq",
                                                                                   "buf_initialized"))))
            state.pop(key)
            ex.fault("state", "lacks %s" % key)
        elif how == "unknown":
            state["fuzz_key"] = ("lit", 1)
            ex.fault(("state", "fuzz_key"), "an unknown key")
        elif how in ("kind", "n_total", "t", "lr", "steps"):
            value = draw(st.sampled_from({"kind": ("Adagrad", None, 3), "n_total": (n + 1, 0, "n", True),
                                          "t": (-1, True, 1.5, 2 ** 62, "1", None),
                                          "lr": (float("nan"), -1.0, "0.1", None, 10 ** 400),
                                          "steps": (0, 99, True)}[how]))
            state["accumulation_steps" if how == "steps" else how] = ("lit", value)
            ex.fault(("state", "accumulation_steps" if how == "steps" else how, "kind", "n_total"), "%s=%r" % (how, value))
        elif how == "moment" and moments:
            key = draw(st.sampled_from(moments))
            spec = state[key]
            change = draw(st.sampled_from(("size", "dtype", "list", "none", "nan", "neg", "strided")))
            if change == "neg" and key == "exp_avg" or change == "strided" and n < 2:
                return                          # a negative first moment is valid; one element is contiguous
            state[key] = {"size": with_field(spec, shape=(n + 1,)), "dtype": with_field(spec, dtype="float64"),
                          "list": ("lit", [0.0] * n), "none": ("lit", None),
                          "nan": with_field(spec, special=((0, "nan"),)),
                          "neg": with_field(spec, fill="pos", special=((0, "neg"),)),
                          "strided": with_field(spec, kind="numpy_strided")}[change]
            ex.fault(("state", key), "%s: %s" % (key, change))
        elif how == "flags" and "buf_initialized" in state:
            state["buf_initialized"] = buf("int32", (tensors,), "numpy", ("ids", 2, 2), 0)
            ex.fault(("state", "buf_initialized"), "a flag of 2")
        elif how == "schedule":
            state["lr_schedule"] = ("lit", draw(st.sampled_from(({"kind": "bogus"}, {"kind": "constant"}, "x"))))
            ex.fault(("state", "lr_schedule"), "a bad schedule config")
        elif how == "not a dict":
            state["not a dict"] = ("lit", draw(st.sampled_from(([], "state", None))))
            ex.fault("state", "not a dict")

    def check(self, c):
        opt, state = c.subject.obj, c.args["state"]
        assert opt.t == state["t"] and opt.lr == float(state["lr"]), "t or lr not loaded"
        for name in ("exp_avg", "exp_avg_sq", "buf_initialized"):
            if name in state:
                got = getattr(opt, name)
                assert (got is None) == (state[name] is None), name
                if got is not None:
                    assert host(got).tobytes() == c_order(state[name]).tobytes(), name


class StateProperty(OptimizerMethod):
    """Assigning exp_avg, exp_avg_sq or buf_initialized (the properties load_state_dict's
    checks guard)."""

    writes = ()
    groups = False

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        n, tensors = sum(dims["sizes"]), len(dims["sizes"])
        names = ("exp_avg", "buf_initialized", "exp_avg_sq") if setup["cls"] == "SGD" else \
            ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
        name = draw(st.sampled_from(names))
        if setup["cls"] == "SGD" and name == "exp_avg_sq":
            ex.fault(name, "SGD keeps no second moment")
        if name == "max_exp_avg_sq" and not setup["hyper"].get("amsgrad"):
            ex.fault(name, "no group uses amsgrad")
        if name == "buf_initialized":
            spec = buf("int32", (tensors,), "numpy", ("ids", 0, 0), 0)
        else:
            spec = buf("float32", (n,), draw(st.sampled_from(WRITABLE_KINDS)), "pos", draw(st.integers(0, 99)))
        change = draw(st.sampled_from((None, None, "size", "dtype", "list", "nan", "neg", "type")))
        if change:
            spec = {"size": with_field(spec, shape=(n + 2,)), "dtype": with_field(spec, dtype="float64"),
                    "list": ("lit", [0.0] * n), "nan": with_field(spec, special=((0, "nan"),)),
                    "neg": with_field(spec, special=((0, "neg"),)), "type": ("lit", "abc")}[change]
            keeps_none = name == "exp_avg" and setup["cls"] == "SGD" and not setup["hyper"].get("momentum")
            if not (change == "neg" and name not in ("exp_avg_sq", "max_exp_avg_sq") or change in ("nan", "neg") and name == "buf_initialized"):
                ex.fault(name, "%s: %s" % (name, change))
            elif keeps_none:
                ex.fault(name, "this SGD keeps no momentum buffer")
        elif name == "exp_avg" and setup["cls"] == "SGD" and not setup["hyper"].get("momentum"):
            ex.fault(name, "this SGD keeps no momentum buffer")
        ex.add("name", ("lit", name), False)
        ex.add("value", spec, False)
        return ex.desc()

    def call(self, subject, args, kwargs):
        name, value = args
        setattr(subject.obj, name, value)

    def check(self, c):
        got = getattr(c.subject.obj, c.args["name"])
        assert host(got).tobytes() == c_order(c.args["value"]).tobytes(), c.args["name"]


class StepAccumulated(OptimizerMethod):
    method = "step_accumulated"
    accumulation = True
    writes = ("params",)

    class Micro(TensorList):
        def valid(self, draw, ctx, dims, side):
            one = TensorList("g", role="in")
            return ("list", [one.valid(draw, ctx, dims, side) for _ in range(dims["steps"])])

        def fault(self, draw, ctx, dims, ex, target):
            spec = ex.get(self.name)
            how = draw(st.sampled_from(("count", "entry")))
            if ex.faulted(self.name):
                return False
            if how == "count" or not spec[1]:
                ex.put(self.name, ("list", spec[1][:-1] if len(spec[1]) > 1 else spec[1] * 2))
                ex.fault(self.name, "another count of microbatches")
                return True
            i = draw(st.integers(0, len(spec[1]) - 1))
            inner = TensorList("microbatch_grads", role="in", alias_of=("params",), written=lambda ex: False)
            probe = _Probe(spec[1][i])
            if not inner.fault(draw, ctx, dims, probe, target):
                return False
            entries = list(spec[1])
            entries[i] = probe.value
            ex.put(self.name, ("list", entries))
            ex.faults += probe.faults
            ex.pool.update(probe.pool)
            return True

    params = (Micro("microbatch_grads"),
              Scalar("tokens", lambda dims: st.one_of(st.none(), st.just(dims["steps"] * 1024 * 2 ** (dims["steps"] % 2)),
                                                      st.integers(1, 5000)), int_bad(1, 2 ** 62, optional=True)),
              _max_norm())

    def draw_setup(self, draw, ctx):
        setup, dims = draw_optimizer(draw, ctx, self.cls, True)
        dims["steps"] = setup["accumulation_steps"]
        return setup, dims

    def relate(self, draw, ctx, dims, ex, side):
        tokens = ex.get("tokens")[1]
        steps = dims["steps"]
        if tokens is not None and steps > 1:
            m, r = divmod(tokens, steps)
            if r or m % 1024 or (m // 1024) & (m // 1024 - 1):
                ex.fault("tokens", "tokens=%d is not aligned with %d microbatches" % (tokens, steps))

    def check(self, c):
        micro = [[list(np.asarray(g, dtype=np.float64).reshape(-1)) for g in entry] for entry in c.before("microbatch_grads")]
        combined = [[_tree_fold([m[j][e] for m in micro]) for e in range(len(micro[0][j]))] for j in range(len(micro[0]))]
        max_norm = c.lit("max_norm")
        check_step(c, combined, None if max_norm is None else float(max_norm), c.result)


class AddParamGroup(OptimizerMethod):
    """add_param_group of a group dict (new tensors, its own hyper-parameters), then faults: not
    a dict, no or empty 'params', an unknown key, a bad value, a tensor the optimizer holds."""

    method = "add_param_group"
    writes = ()
    params = ()

    def draw_args(self, draw, ctx, dims, edge, setup=None, side=None):
        from _fuzz_spec import Example
        ex = Example(self.name, ctx.numeric_mode)
        ex.setup = setup
        shapes = shapes_of(draw(SIZES))
        items = [buf("float32", sh, draw(st.sampled_from(kinds_for("update", ctx, side))), "unit",
                     draw(st.integers(0, 2 ** 16))) for sh in shapes]
        group = {"params": ("list", items), **{k: ("lit", v) for k, v in group_hyper(draw, setup["cls"]).items()}}
        how = draw(st.sampled_from((None, None, None, "not a dict", "no params", "empty", "unknown", "value", "held")))
        if how == "not a dict":
            ex.add("param_group", ("lit", draw(st.sampled_from(([], "g", None)))), False)
            ex.fault("param_group", "not a dict")
            return ex.desc()
        if how in ("no params", "empty"):
            group["params"] = ("lit", [])
            if how == "no params":
                group.pop("params")
        elif how == "unknown":
            group["fuzz_key"] = ("lit", 1)
        elif how == "value":
            key = draw(st.sampled_from(GROUP_KEYS[setup["cls"]]))
            group[key] = ("lit", draw(st.sampled_from([v for v, level, _ in HYPER_BAD[key] if level == "hard"])))
        elif how == "held":
            items[0] = ("alias", "params", draw(st.integers(0, len(dims["sizes"]) - 1)))
        if how:
            ex.fault(("param_group",) + (("params",) if how == "held" else ()), "param_group: %s" % how)
        ex.add("param_group", ("dict", group), False)
        return ex.desc()

    def check(self, c):
        opt, given, s = c.subject.obj, c.args["param_group"], c.subject.before
        new = list(given["params"])
        n_before = len(s["p"])
        assert opt.params[-len(new):] == new or all(a is b for a, b in zip(opt.params[-len(new):], new)), \
            "the group's tensors are not the caller's, last in params"
        assert opt.param_groups[-1]["params"] == new or all(a is b for a, b in zip(opt.param_groups[-1]["params"], new))
        for key, value in given.items():
            if key != "params":
                mine = opt.param_groups[-1][key]
                assert mine == value or isinstance(value, tuple) and tuple(mine) == value, "%s=%r" % (key, mine)
        added = sum(count(np.shape(host(t))) for t in new)
        assert opt.n_total == n_before + added and opt.t == s["t"]
        for name in STATE_NAMES:
            value = getattr(opt, name, None)
            if value is not None and name != "buf_initialized":
                old = s[name] if s[name] is not None else [0.0] * n_before
                assert value.tolist() == list(old) + [0.0] * added, "%s: old values then zeros" % name
        if hasattr(opt, "steps"):
            assert opt.steps == s["steps"] + [0] * len(new), "steps %r" % (opt.steps,)


class _Probe:
    """An Example-like holder of one list argument, so a TensorList can put its fault into an
    entry of a list of lists."""

    def __init__(self, value):
        self.value, self.faults, self.pool = value, [], {}

    def get(self, name):
        return self.value

    def put(self, name, spec):
        self.value = spec

    def has(self, name):
        return True

    def fault(self, names, kind, level="hard", extra=()):
        self.faults.append((("microbatch_grads",), kind, level, tuple(extra)))


class Construct(FnTarget):
    """The constructor of SGD, Adam or AdamW: parameters (a buffer or a list; empty, repeated,
    overlapping, read-only, strided refused), every option, torch's switches."""

    cls = None
    numeric_mode = True

    @functools.cached_property
    def params(self):
        options = tuple(Scalar(k, v, HYPER_BAD.get(k, ()), kw=True, optional=True) for k, v in HYPER[self.cls].items())
        switches = ("capturable", "differentiable", "fused") if self.cls != "SGD" else \
            ("differentiable", "fused")
        extra = tuple(Scalar(k, st.sampled_from((False, None) if k == "fused" else (False,)), HYPER_BAD[k], kw=True,
                             optional=True) for k in switches)
        return (TensorList("params", key="shapes", finite=None, counted=False),) + options + extra + (
            Scalar("resident", st.sampled_from((None, False, True)), HYPER_BAD["resident"], kw=True, optional=True),
            Scalar("accumulation_steps", st.integers(1, 4), HYPER_BAD["accumulation_steps"], kw=True, optional=True),
            Scalar("lr_schedule", st.just(None), HYPER_BAD["lr_schedule"], kw=True, optional=True))

    def draw(self, draw, ctx):
        shapes = shapes_of(draw(SIZES))
        desc = self.draw_args(draw, ctx, {"shapes": shapes}, False)
        return desc

    def relate(self, draw, ctx, dims, ex, side):
        mom, damp, nest = (ex.get(k) for k in ("momentum", "dampening", "nesterov"))
        def f32_nonzero(spec):   # the library reads them in float32: a tiny momentum is none (long fuzz run, 2026-12-03)
            try:
                return spec is not None and f32(float(spec[1])) != 0.0
            except (TypeError, ValueError, OverflowError):
                return bool(spec[1])
        if nest is not None and nest[1] is True and (not f32_nonzero(mom) or f32_nonzero(damp)):
            ex.fault(("nesterov", "momentum", "dampening"), "nesterov without momentum or with dampening")
        if draw(st.integers(0, 6)) == 0:
            ex.add("param_groups", ("lit", []), True)
            ex.fault("param_groups", "torch's param_groups")
        if ex.get("foreach") == ("lit", True) and draw(st.integers(0, 3)) == 0 and self.cls != "SGD":
            ex.add("fused", ("lit", True), True)
            ex.fault(("fused", "foreach"), "fused and foreach both True")
        params = ex.get("params")
        if draw(st.integers(0, 5)) == 0 and len(params[1]) > 1:
            a, b = params[1][0], params[1][1]
            if a[0] == "buf" and b[0] == "buf" and count(a[2]) and count(b[2]):
                ex.pool["mem"] = buf("float32", (count(a[2]) + count(b[2]),), "numpy", "unit", 5)
                items = [("view", "mem", None, 0, a[2], "numpy"), ("view", "mem", None, count(a[2]) - 1, b[2], "numpy")]
                ex.put("params", (params[0], items + list(params[1][2:])))
                ex.fault("params", "params[0] and params[1] overlap")
        elif draw(st.integers(0, 9)) == 0:
            ex.put("params", ("list", []))
            ex.fault("params", "an empty list")
        elif draw(st.integers(0, 2)) == 0:
            self._grouped(draw, ex)

    def _grouped(self, draw, ex):
        """params as torch's param groups (dicts, each with its own hyper-parameters), at times
        with one group fault: a bad value, an unknown key, no 'params', an empty group, a
        tensor in two groups."""
        tag, items = ex.get("params")
        groups = draw_groups(draw, self.cls, len(items)) or [(len(items), {})]
        dicts, at = [], 0
        for k, hyper in groups:
            dicts.append({"params": ("list", list(items[at:at + k])), **{n: ("lit", v) for n, v in hyper.items()}})
            at += k
        how = draw(st.sampled_from((None, None, None, "value", "unknown", "no params", "empty", "twice")))
        g = draw(st.integers(0, len(dicts) - 1))
        if how == "value":
            key = draw(st.sampled_from(GROUP_KEYS[self.cls]))
            value = draw(st.sampled_from([v for v, level, _ in HYPER_BAD[key] if level == "hard"]))
            dicts[g][key] = ("lit", value)
            ex.fault("params", "params[%d][%r]=%r" % (g, key, value))
        elif how == "unknown":
            dicts[g]["fuzz_key"] = ("lit", 1)
            ex.fault("params", "params[%d] has an unknown key" % g)
        elif how in ("no params", "empty"):
            dicts[g]["params"] = ("lit", [])
            if how == "no params":
                dicts[g].pop("params")
            ex.fault("params", "params[%d]: %s" % (g, how))
        elif how == "twice" and len(dicts) > 1 and items[0][0] == "buf":
            ex.pool["twice"] = items[0]
            dicts[0]["params"][1][0] = ("alias", "twice", None)
            dicts[1]["params"] = ("list", dicts[1]["params"][1] + [("alias", "twice", None)])
            ex.fault("params", "params[0] and params[1] share a tensor")
        ex.put("params", (tag, [("dict", d) for d in dicts]))

    def check(self, c):
        opt = c.result
        passed = c.args["params"]
        passed = list(passed) if isinstance(passed, (list, tuple)) else [passed]
        if passed and isinstance(passed[0], dict):
            assert len(opt.param_groups) == len(passed), "%d groups from %d" % (len(opt.param_groups), len(passed))
            for mine, given in zip(opt.param_groups, passed):
                for key, value in given.items():
                    if key != "params":
                        assert mine[key] == value or tuple(mine[key]) == tuple(value), "group %r=%r" % (key, mine[key])
            passed = [t for g in passed for t in g["params"]]
        assert len(opt.params) == len(passed) and all(a is b for a, b in zip(opt.params, passed)), \
            "params are not the caller's tensors"
        assert opt.t == 0 and opt.n_total == sum(count(np.shape(host(p))) for p in passed)
        for name in ("exp_avg", "exp_avg_sq"):
            value = getattr(opt, name, None)
            if value is not None:
                assert not any(value.tolist()), "%s is not zero after construction" % name
        if all(np.isfinite(host(p)).all() for p in passed):
            _first_step_is_taken(opt, passed, c.mode)


def _first_step_is_taken(opt, params, numeric_mode):
    """An optimizer the constructor accepted takes a step (zero gradients): an option it took
    must not make every step refuse."""
    import mojo_train as mt
    zeros = [mt.Array(np.shape(host(p)), "float32") for p in params]
    if any(isinstance(p, mt.DeviceArray) for p in params):
        zeros = [mt.to_device(z, numeric_mode=numeric_mode) for z in zeros]
    try:
        opt.step(zeros)
    except (TypeError, ValueError) as exc:
        raise AssertionError("the constructor accepted these options, then its first step refused: %s" % exc)


def _optimizer_targets():
    out = []
    for cls in ("SGD", "Adam", "AdamW"):
        specs = [(Construct, cls, "mojo_train.%s" % cls), (Step, "%s.step" % cls, None),
                 (ZeroGrad, "%s.zero_grad" % cls, None), (StateDict, "%s.state_dict" % cls, None),
                 (LoadStateDict, "%s.load_state_dict" % cls, None), (StepAccumulated, "%s.step_accumulated" % cls, None),
                 (AddParamGroup, "%s.add_param_group" % cls, None)]
        for base, name, cover in specs:
            t = type(base.__name__ + cls, (base,), {"cls": cls, "name": name,
                                                    "covers": (cover or "mojo_train.%s" % name,)})()
            if base is Construct:
                t.fn = cls
            out.append(t)
        props = tuple("mojo_train.%s.%s" % (cls, p) for p in ("exp_avg", "exp_avg_sq", "buf_initialized") +
                      (("max_exp_avg_sq",) if cls != "SGD" else ()))
        out.append(type("StateProperty" + cls, (StateProperty,), {"cls": cls, "name": "%s state properties" % cls,
                                                                  "covers": props})())
    return out


# ---- clipping and accumulation ----------------------------------------------------------------

class Clip(FnTarget):
    """clip_grad_norm_ over every norm type torch takes (2, 1, inf, as numbers or strings), with
    error_if_nonfinite both ways: off, NaN and infinities are taken (the gradients scaled as
    torch does); on, they are refused. Empty tensors and an empty list are valid."""

    name, fn, covers = "clip_grad_norm_", "clip_grad_norm_", ("mojo_train.clip_grad_norm_",)
    writes = ("grads",)
    params = (TensorList("grads", counted=False, finite=lambda ex: ex.get("error_if_nonfinite") == ("lit", True)),
              Scalar("max_norm", reals(0.0, 10.0), real_bad(0.0)),
              Scalar("norm_type", st.sampled_from((2.0, 2, np.float32(2.0), 1, 1.0, float("inf"), "inf", "2", np.inf)),
                     bad(3.0, 0, float("-inf"), extra=("NotImplementedError",)) + bad("fro", "x", True, None, [2]),
                     optional=True),
              Scalar("error_if_nonfinite", st.booleans(), bad(1, None, "True"), kw=True, optional=True),
              Scalar("foreach", st.sampled_from((None, False, True)), bad(1, "yes"), kw=True, optional=True))

    def draw(self, draw, ctx):
        sizes = draw(st.one_of(SIZES, SIZES, SIZES, st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2)),
                                                                     max_size=2)))
        return self.draw_args(draw, ctx, {"shapes": shapes_of(sizes)}, False)

    def check(self, c):
        grads = [list(np.asarray(g, dtype=np.float64).reshape(-1)) for g in c.before("grads")]
        total, coef, clipped = ref_clip(grads, float(c.lit("max_norm")), float(c.lit("norm_type", 2.0)))
        assert np.float32(c.result).tobytes() == np.float32(total).tobytes(), \
            "returned %r, the contract's total is %r" % (c.result, total)
        assert_same_bits(np.array(flat_values(c.args["grads"]), np.float32), [v for x in clipped for v in x], "grads")


class Accumulate(FnTarget):
    name, fn, covers = "accumulate_grads", "accumulate_grads", ("mojo_train.accumulate_grads",)
    dims = {}

    class Entries(TensorList):
        def valid(self, draw, ctx, dims, side):
            single = dims["single"]
            one = TensorList("g", role="in")
            entries = [one.valid(draw, ctx, dims, side) for _ in range(dims["steps"])]
            return ("list", [e[1][0] for e in entries] if single else entries)

        def fault(self, draw, ctx, dims, ex, target):
            spec = ex.get(self.name)
            how = draw(st.sampled_from(("structure", "count", "entry", "entry", "empty", "bare")))
            entries = list(spec[1])
            if how in ("structure", "count") and (len(entries) < 2 or dims["single"] and how == "count"):
                how = "entry"
            if ex.faulted(self.name) or how == "entry" and len(entries) < 2:
                return False              # one microbatch: its shapes have nothing to disagree with
            if how == "empty":
                ex.put(self.name, ("list", []))
            elif how == "bare":
                ex.put(self.name, entries[0] if dims["single"] else entries[0][1][0])
            elif how == "structure":
                entries[1] = ("list", [entries[1]]) if dims["single"] else entries[1][1][0]
                ex.put(self.name, ("list", entries))
            elif how == "count":
                entries[-1] = ("list", list(entries[-1][1]) + [entries[-1][1][0]])
                ex.put(self.name, ("list", entries))
            else:
                i = draw(st.integers(0, len(entries) - 1))
                probe = _Probe(entries[i] if not dims["single"] else ("list", [entries[i]]))
                inner = TensorList("microbatch_grads", role="in", written=lambda ex: False)
                if not inner._item_fault(draw, ctx, probe, list(probe.value[1]),
                                         draw(st.integers(0, len(probe.value[1]) - 1)), probe.value):
                    return False
                entries[i] = probe.value if not dims["single"] else probe.value[1][0]
                ex.put(self.name, ("list", entries))
                ex.faults += probe.faults
                return True
            ex.fault(self.name, how)
            return True

    params = (Entries("microbatch_grads"),
              Scalar("tokens", lambda dims: st.one_of(st.none(), st.just(dims["steps"] * 1024), st.integers(1, 5000)),
                     int_bad(1, 2 ** 62, optional=True)))

    def draw(self, draw, ctx):
        dims = {"shapes": shapes_of(draw(SIZES)), "steps": draw(st.integers(1, 4)), "single": draw(st.booleans())}
        if dims["single"]:
            dims["shapes"] = dims["shapes"][:1]
        return self.draw_args(draw, ctx, dims, False)

    def relate(self, draw, ctx, dims, ex, side):
        tokens, steps = ex.get("tokens")[1], dims["steps"]
        if tokens is not None and steps > 1:
            m, r = divmod(tokens, steps)
            if r or m % 1024 or (m // 1024) & (m // 1024 - 1):
                ex.fault("tokens", "tokens=%d is not aligned with %d microbatches" % (tokens, steps))
        if draw(st.integers(0, 5)) == 0:          # huge values: the sum may overflow (refused)
            spec = ex.get("microbatch_grads")
            entries = [with_field(e, fill="huge") if e[0] == "buf" else ("list", [with_field(x, fill="huge") for x in e[1]])
                       for e in spec[1]]
            ex.put("microbatch_grads", ("list", entries))
            ex.fault((), "huge values: the sum may overflow", "soft")

    def check(self, c):
        entries = c.before("microbatch_grads")
        single = not isinstance(entries[0], list)
        entries = [[e] for e in entries] if single else entries
        want = [np.array([_tree_fold_sat([float(np.asarray(m[j]).reshape(-1)[e]) for m in entries])
                          for e in range(np.asarray(entries[0][j]).size)], np.float32).reshape(np.shape(entries[0][j]))
                for j in range(len(entries[0]))]
        got = [c.result] if single else c.result
        assert len(got) == len(want)
        for j, (g, w) in enumerate(zip(got, want)):
            assert_same_bits(g, w, "tensor %d" % j)


def _tree_fold_sat(values):
    """The pairwise tree; a sum outside float32 is inf (the call must then have refused)."""
    try:
        return _tree_fold(values)
    except OverflowError:
        return float("inf")


class Aligned(FnTarget):
    name, fn, covers = "accumulation_is_aligned", "accumulation_is_aligned", ("mojo_train.accumulation_is_aligned",)
    numeric_mode = False
    params = (Scalar("tokens", st.one_of(st.integers(1, 2 ** 62), st.sampled_from([k * 1024 * 2 ** j for k in (1, 2, 3, 4, 8)
                                                                                    for j in range(4)])),
                     int_bad(1, 2 ** 62)),
              Scalar("accumulation_steps", st.one_of(st.integers(1, 9), st.integers(1, 2 ** 31 - 1)),
                     int_bad(1, 2 ** 31 - 1)))

    def check(self, c):
        tokens, steps = int(c.lit("tokens")), int(c.lit("accumulation_steps"))
        per, rest = divmod(tokens, steps)
        leaves = per // 1024
        want = steps == 1 or (rest == 0 and per % 1024 == 0 and leaves & (leaves - 1) == 0)
        assert c.result is want, "accumulation_is_aligned(%d, %d) is %r" % (tokens, steps, c.result)


STATE_TARGETS = _optimizer_targets() + [Clip(), Accumulate(), Aligned()]
