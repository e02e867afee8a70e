"""Cards of the optimizers (fixtures/optim.card): SGD, Adam and AdamW steps, their keys, cases and
runner, registered with _cards.

A case names the optimizer (``sgd``, ``adam``, ``adamw``), its tensor sizes, the ranges of the
params (``p=``, stream 0) and of each step's gradients (``g=``, step k from stream k), the step
count and the hyper-parameters (unset ones take the public API's defaults); ``max_norm=`` clips
inside every step. Outputs: the params, the last step's gradients, the optimizer's moments, and
with ``max_norm`` every step's pre-clip total. The run goes through the public API on the
selected vendor's identical numeric mode.
"""
import mojo_train

from . import _card_format as _cards

UNIT, SUB, SUB_SQ, BIG = _cards.UNIT, _cards.SUB, _cards.SUB_SQ, _cards.BIG

_OPTIM_KEYS = dict(_cards._INPUT_KEYS, p=_cards._pair, steps=_cards._count, lr=_cards._number,
                   max_norm=_cards._number, weight_decay=_cards._number, maximize=_cards._flag)
_REQUIRED = ("seed", "sizes", "p", "g", "steps", "lr")
MANY = "1,3,1023,4096,5000"


def _outputs(case):
    names = ["params", "grads"]
    if case.op in ("adam", "adamw"):
        names += ["exp_avg", "exp_avg_sq"]
    elif case.args.get("momentum", 0.0) != 0.0:
        names.append("exp_avg")
    if "max_norm" in case.args:
        names.append("step_norms")
    return tuple(names)


_OPTIMIZERS = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW"}
_HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov", "maximize", "betas", "eps")


def _run_optim(case, backend):
    args = case.args
    params = _cards._filled(backend, case, 0, args["p"])
    kwargs = {k: args[k] for k in _HYPER if k in args}
    opt = getattr(mojo_train, _OPTIMIZERS[case.op])(params, numeric_mode="identical", **kwargs)
    totals = []
    for step in range(1, args["steps"] + 1):
        grads = _cards._filled(backend, case, step, args["g"])
        totals.append(opt.step(grads, max_norm=args.get("max_norm")))
    out = {"params": _cards._sha(params), "grads": _cards._sha(grads)}
    if getattr(opt, "exp_avg", None) is not None:
        out["exp_avg"] = _cards._sha([opt.exp_avg])
    if case.op != "sgd":
        out["exp_avg_sq"] = _cards._sha([opt.exp_avg_sq])
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
    specs += _subnormal_optim_cases()
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


_cards.register("optim", "optimizer v1", _optim_cases, {
    "sgd": (dict(_OPTIM_KEYS, momentum=_cards._number, dampening=_cards._number, nesterov=_cards._flag),
            _REQUIRED, _outputs, _run_optim),
    "adam": (dict(_OPTIM_KEYS, betas=_cards._pair, eps=_cards._number), _REQUIRED, _outputs, _run_optim),
    "adamw": (dict(_OPTIM_KEYS, betas=_cards._pair, eps=_cards._number), _REQUIRED, _outputs, _run_optim),
}, _cards._LIST_NOTES)
