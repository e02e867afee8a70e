"""Cards of the optimizers (fixtures/optim.card): SGD, Adam and AdamW steps, their keys, cases and
runner, registered with _cards.

A case names the optimizer (``sgd``, ``adam``, ``adamw``), its tensor sizes, the ranges of the
params (``p=``, stream 0) and of each step's gradients (``g=``, step k from stream k), the step
count and the hyper-parameters (unset ones take the public API's defaults); ``max_norm=`` clips
inside every step. Outputs: the params, the last step's gradients, the optimizer's moments, and
with ``max_norm`` every step's pre-clip total. The run goes through the public API on the
selected vendor's identical numeric mode.

Param groups (``groups=2,1``: the first two tensors form group 0, the next one group 1): a
hyper-parameter given once is the constructor's (every group's); given per group it is
``a/b`` (``lr=1e-2/1e-3``, ``betas=0.9,0.999/0.8,0.99``) and goes into each group's dict.
``late=K`` adds the last group with ``add_param_group`` before step K, so its tensors stand at
other step counts than the rest (they take no gradient before). ``amsgrad=1`` adds the output
``max_exp_avg_sq``. Sizes may be 0 (an empty tensor), as torch allows.
"""
import mojo_train

from . import _card_format as _cards

UNIT, SUB, SUB_SQ, BIG = _cards.UNIT, _cards.SUB, _cards.SUB_SQ, _cards.BIG



def _per_group(parse):
    """A value for every group (``x``) or one per group (``x/y/...``, a tuple)."""
    def read(text):
        parts = text.split("/")
        return parse(text) if len(parts) == 1 else tuple(parse(x) for x in parts)
    return read


def _sizes(text):
    """``sizes=`` of an optimizer case: tensor sizes, 0 allowed (an empty tensor)."""
    sizes = []
    for item in text.split(","):
        size, _, repeat = item.partition("x")
        sizes.extend([_cards._count(size)] * (_cards._count(repeat) if repeat else 1))
    if not sizes or not any(sizes):
        raise ValueError("%r needs at least one tensor holding elements" % text)
    return tuple(sizes)


def _counts(text):
    counts = tuple(_cards._count(x) for x in text.split(","))
    if not counts or 0 in counts:
        raise ValueError("%r: every group holds at least one tensor" % text)
    return counts


_OPTIM_KEYS = dict(_cards._INPUT_KEYS, sizes=_sizes, p=_cards._pair, steps=_cards._count,
                   lr=_per_group(_cards._number), max_norm=_cards._number,
                   weight_decay=_per_group(_cards._number), maximize=_per_group(_cards._flag),
                   groups=_counts, late=_cards._count)
_REQUIRED = ("seed", "sizes", "p", "g", "steps", "lr")
MANY = "1,3,1023,4096,5000"


def _any(case, key, default):
    value = case.args.get(key, default)
    return any(value) if isinstance(value, tuple) else bool(value)


def _outputs(case):
    names = ["params", "grads"]
    if case.op in ("adam", "adamw"):
        names += ["exp_avg", "exp_avg_sq"]
        if _any(case, "amsgrad", False):
            names.append("max_exp_avg_sq")
    elif _any(case, "momentum", 0.0):
        names.append("exp_avg")
    if "max_norm" in case.args:
        names.append("step_norms")
    return tuple(names)


_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}
_HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "betas", "eps", "amsgrad")


def _grouped(args, params):
    """(params argument, constructor keywords, the group added late or None) of a case."""
    per = {k: args[k] for k in _HYPER if isinstance(args.get(k), tuple) and (k != "betas" or
                                                                            isinstance(args[k][0], tuple))}
    kwargs = {k: args[k] for k in _HYPER if k in args and k not in per}
    if "groups" not in args:
        return params, kwargs, None
    groups, start = [], 0
    for i, count in enumerate(args["groups"]):
        group = {"params": params[start:start + count]}
        group.update((k, v[i]) for k, v in per.items())
        groups.append(group)
        start += count
    late = groups.pop() if "late" in args else None
    return groups, kwargs, late


def _run_optim(case, backend):
    args = case.args
    params = _cards._filled(backend, case, 0, args["p"])
    first, kwargs, late = _grouped(args, params)
    opt = getattr(mojo_train, _OPTIMIZERS[case.op])(first, numeric_mode=_cards.mode(), **kwargs)
    totals = []
    for step in range(1, args["steps"] + 1):
        if late is not None and step == args["late"]:
            opt.add_param_group(late)
        grads = _cards._filled(backend, case, step, args["g"])[:len(opt.params)]
        totals.append(opt.step(grads, max_norm=args.get("max_norm")))
    out = {"params": _cards._sha(params), "grads": _cards._sha(grads)}
    if getattr(opt, "exp_avg", None) is not None:
        out["exp_avg"] = _cards._sha([opt.exp_avg])
    if case.op != "sgd":
        out["exp_avg_sq"] = _cards._sha([opt.exp_avg_sq])
        if opt.max_exp_avg_sq is not None:
            out["max_exp_avg_sq"] = _cards._sha([opt.max_exp_avg_sq])
    if "max_norm" in args:
        out["step_norms"] = _cards._sha(raw=_cards._f32(*totals))
    return out


_SGD = ("", "momentum=0.9", "momentum=0.9 dampening=0.1", "momentum=0.9 nesterov=1",
        "weight_decay=0.01", "maximize=1")
_ADAM = ("", "weight_decay=0.01", "maximize=1", "betas=0.8,0.99")
_ADAMW = ("", "weight_decay=0.1", "maximize=1", "eps=1e-6")
# U(-1,1) grads over >= 1023 elements have a total norm near 18 or more: 1.0 clips, 1e6 never.
_CLIPS = ("", "max_norm=1.0", "max_norm=1e6")


def _optim_cases():
    configs = ([("sgd", o) for o in _SGD] + [("adam", o) for o in _ADAM]
               + [("adamw", o) for o in _ADAMW])
    specs = []
    for op, opts in configs:
        for clip in _CLIPS:
            specs.append("%s sizes=1023 steps=3 lr=1e-2 p=%s g=%s %s %s" % (op, UNIT, UNIT, opts, clip))
            specs.append("%s sizes=%s steps=4 lr=1e-3 p=%s g=%s %s %s" % (op, MANY, UNIT, UNIT, opts, clip))
    specs += [
        "sgd sizes=1 steps=5 lr=1e-2 p=-1,1 g=-1,1 momentum=0.9",
        "sgd sizes=3 steps=5 lr=1e-2 p=-1,1 g=-1,1 momentum=0.9 nesterov=1 max_norm=0.01",
        "adam sizes=1 steps=5 lr=1e-3 p=-1,1 g=-1,1 max_norm=1e6",
        "adam sizes=3 steps=5 lr=1e-2 p=-1,1 g=-1,1 max_norm=0.01",
        "adamw sizes=1 steps=5 lr=1e-2 p=-1,1 g=-1,1 max_norm=0.01",
        "adamw sizes=3,1,3 steps=5 lr=1e-3 p=-1,1 g=-1,1",
        "sgd sizes=%d steps=3 lr=1e-2 p=-1,1 g=-1,1 momentum=0.9 nesterov=1 max_norm=1.0" % BIG,
        "adam sizes=%d steps=3 lr=1e-3 p=-1,1 g=-1,1 weight_decay=0.01" % BIG,
        "adamw sizes=%d steps=3 lr=1e-3 p=-1,1 g=-1,1 max_norm=1.0" % BIG,
        "adamw sizes=1,%d,3 steps=3 lr=1e-2 p=-1,1 g=-1,1 weight_decay=0.1 max_norm=1e6" % BIG,
    ]
    specs += _subnormal_optim_cases() + _group_cases()
    return [_cards._seeded(" ".join(s.split())) for s in specs]


def _subnormal_optim_cases():
    # Subnormal grads have total norm 0 (their squares underflow): max_norm=1e-9 still clips.
    return [
        "sgd sizes=1023 steps=4 lr=1e-2 p=%s g=%s" % (SUB, SUB),
        "sgd sizes=%s steps=4 lr=1e-2 p=%s g=%s momentum=0.9 weight_decay=0.01 max_norm=1e-9" % (MANY, SUB, SUB),
        "sgd sizes=1023 steps=3 lr=1e-3 p=%s g=%s momentum=0.9 dampening=0.1 max_norm=1.0" % (SUB, UNIT),
        "adam sizes=1023 steps=4 lr=1e-3 p=%s g=%s weight_decay=0.01" % (SUB, SUB),
        "adam sizes=%s steps=3 lr=1e-2 p=%s g=%s max_norm=1e-9" % (MANY, UNIT, SUB),
        "adamw sizes=1023 steps=4 lr=1e-3 p=%s g=%s" % (SUB, SUB),
        "adamw sizes=%s steps=3 lr=1e-2 p=%s g=%s weight_decay=0.1 max_norm=1e-9" % (MANY, SUB, SUB),
        "adamw sizes=1023 steps=5 lr=1e-3 p=%s g=%s max_norm=1.0" % (SUB, UNIT),
        "sgd sizes=%s steps=3 lr=1e-2 p=%s g=%s momentum=0.9 max_norm=1e-20" % (MANY, UNIT, SUB_SQ),
        "adam sizes=%s steps=3 lr=1e-3 p=%s g=%s max_norm=1e-20" % (MANY, UNIT, SUB_SQ),
    ]


def _group_cases():
    """Param groups (one native call for all), per-tensor step counts (a group added late),
    AMSGrad, empty tensors, and SGD's nesterov / maximize / momentum mixed across groups."""
    adam3 = "groups=2,2,1 lr=1e-2/1e-3/3e-3 betas=0.9,0.999/0.8,0.99/0.9,0.95 weight_decay=0.1/0/0.01"
    return [
        "adamw sizes=1023,3,4096,5000,1 steps=4 p=%s g=%s %s" % (UNIT, UNIT, adam3),
        "adamw sizes=1023,3,4096,5000,1 steps=4 p=%s g=%s %s max_norm=1.0" % (UNIT, UNIT, adam3),
        "adam sizes=1023,3,4096,5000,1 steps=4 p=%s g=%s %s eps=1e-6 maximize=0/1/0" % (UNIT, UNIT, adam3),
        "adam sizes=1023,5,3 steps=5 lr=1e-2 p=%s g=%s groups=2,1 late=3" % (UNIT, UNIT),
        "adamw sizes=1,4096,5000,7 steps=6 lr=1e-2/3e-3 p=%s g=%s groups=2,2 late=4 amsgrad=0/1 max_norm=1.0"
        % (UNIT, UNIT),
        "adam sizes=1023 steps=5 lr=1e-2 p=%s g=%s amsgrad=1" % (UNIT, UNIT),
        "adam sizes=%s steps=4 lr=1e-3 p=%s g=%s amsgrad=1 weight_decay=0.01 max_norm=1.0" % (MANY, UNIT, UNIT),
        "adamw sizes=%s steps=4 lr=1e-3 p=%s g=%s amsgrad=1 maximize=1" % (MANY, UNIT, UNIT),
        "adamw sizes=1023 steps=4 lr=1e-3 p=%s g=%s amsgrad=1" % (SUB, SUB),
        "adamw sizes=%d,1,3 steps=3 lr=1e-2 p=-1,1 g=-1,1 groups=1,2 amsgrad=1/0 max_norm=1e6" % BIG,
        "adam sizes=3,0,1023 steps=4 lr=1e-2 p=%s g=%s groups=1,2 amsgrad=0/1" % (UNIT, UNIT),
        "adamw sizes=0,5,0 steps=3 lr=1e-2 p=%s g=%s groups=1,1,1 weight_decay=0.1/0.2/0 max_norm=1.0"
        % (UNIT, UNIT),
        "sgd sizes=0,5,1023 steps=4 lr=1e-2 p=%s g=%s groups=1,2 momentum=0.9/0" % (UNIT, UNIT),
        "sgd sizes=1023,5,4096 steps=4 lr=1e-2/1e-3/3e-2 p=%s g=%s groups=1,1,1 momentum=0.9/0.9/0 "
        "nesterov=1/0/0 dampening=0/0.1/0 maximize=0/1/1 weight_decay=0.01/0/0.1" % (UNIT, UNIT),
        "sgd sizes=1023,5,4096 steps=4 lr=1e-2 p=%s g=%s groups=1,1,1 momentum=0.9/0/0.8 nesterov=0/0/1 "
        "maximize=1/0/0 max_norm=1.0" % (UNIT, UNIT),
        "sgd sizes=1023,3,5000 steps=5 lr=1e-2 p=%s g=%s groups=2,1 late=3 momentum=0.9 nesterov=1" % (UNIT, UNIT),
    ]


_cards.register("optim", "optimizer v1", _optim_cases, {
    "sgd": (dict(_OPTIM_KEYS, momentum=_per_group(_cards._number), dampening=_per_group(_cards._number),
                 nesterov=_per_group(_cards._flag)), _REQUIRED, _outputs, _run_optim),
    "adam": (dict(_OPTIM_KEYS, betas=_per_group(_cards._pair), eps=_per_group(_cards._number),
                  amsgrad=_per_group(_cards._flag)), _REQUIRED, _outputs, _run_optim),
    "adamw": (dict(_OPTIM_KEYS, betas=_per_group(_cards._pair), eps=_per_group(_cards._number),
                   amsgrad=_per_group(_cards._flag)), _REQUIRED, _outputs, _run_optim),
}, _cards._LIST_NOTES)
