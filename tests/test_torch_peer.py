"""Peer check: torch's own test inputs through mojo_train.torch (CPU, float32 against torch in float64).

torch.testing._internal (it needs the ``expecttest`` package) holds the inputs torch tests
itself with. Everything it offers for what mojo_train.torch computes runs here, and each input
ends in one of these outcomes:

  match     within tests/tolerances.py's bound of torch in float64 on the same float32 values
            (units as test_torch_adapter.py, test_loss.py and test_optim_groups.py use them)
  mask      dropout in training with p > 0, whose draws are mojo_train's Generator, not torch's
            RNG: every output element is 0 or input / (1 - p) exactly, the gradient uses the same
            mask, and over all those samples some element is kept and some dropped
  refused   a documented refusal: a row of REFUSED_OPS or REFUSED_OPTIM (README, "What
            mojo_train.torch refuses"), the message starting ``mojo_train.<entry point>:``,
            nothing the call was given changed
  error inputs (inputs torch itself refuses): refused as torch refuses (its exception type and
            words), or refused by mojo_train's own check (its message), or warned as torch warns;
            or, for three of Adam's and AdamW's (8 inputs), accepted by a design that
            ACCEPTED_OPTIM_ERROR_INPUTS documents, and then matching torch's equivalent call
Anything else fails: a value outside the bound, a refusal no row documents, a torch error input
accepted silently.

optim_db: the OptimizerInfos of SGD, Adam and AdamW, every config torch's own test_optim runs on
the CPU (``_get_optim_inputs_including_global_cliquey_kwargs``: ``optim_inputs_func(device="cpu")``
and each of them again with differentiable=True and with fused=True), K_STEPS steps of the same
U(-1, 1) float32 gradients on float32 params of SHAPES; params and every state tensor compared,
the state's keys and ``step`` exactly; then ``optim_error_inputs_func("cpu", torch.float32)``.
op_db: the OpInfos nn.functional.linear, rms_norm, embedding, silu, relu, dropout, cross_entropy
and linear_cross_entropy (three: '', 'chunked', 'chunked_none'), float32 on the CPU:
``sample_inputs(requires_grad=True)`` (output, and the gradient of every input that requires grad
from one fixed random grad_output), ``sample_inputs(requires_grad=False)`` (output), and
``error_inputs``.

Counts, CPU, torch 2.13.0: 0 mismatches, 0 undocumented refusals, 0 error inputs accepted
silently; the same counts in the deterministic and fast modes (the last test checks these lines
against the identical mode's run and prints them with the refusals by reason):

    optim_db SGD configs                       27: 18 match, 9 refused differentiable=True
    optim_db Adam configs                      15: 10 match, 5 refused differentiable=True
    optim_db AdamW configs                     15: 10 match, 5 refused differentiable=True
    optim_db error inputs                      31: 12 refused as torch refuses,
        8 refused by mojo_train's check, 3 warned as torch warns, 8 accepted by design and matching torch
    op_db samples, requires_grad=True          403: 62 match, 4 mask, 337 refused
    op_db samples, requires_grad=False         410: 78 match, 4 mask, 328 refused
    op_db error inputs                         23: 23 refused by mojo_train's check

Almost all refused samples are linear_cross_entropy's (the last test prints the refusals by
reason; README, "What mojo_train.torch refuses", lists them): torch's OpInfos give it probability
targets, class weights, K-dimensional linear_weight, unbatched input and its chunking options=,
which the fused head refuses by name (REFUSED_OPS). Torch's 23 op error inputs all meet a
mojo_train check first (the 18 of linear_cross_entropy: their probability targets).
"""
import copy
import functools
import math
import re
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")          # torch.testing._internal imports it
tol = pytest.importorskip("tolerances")
import numpy as np  # noqa: E402

import mojo_train.torch as mtt  # noqa: E402  (imports torch)
from mojo_train.random import Generator  # noqa: E402
from _helpers import skip_without  # noqa: E402
from test_loss import _rows_of, _scale_and_divisor  # noqa: E402  (cross-entropy's units, one copy)

K_STEPS = 5
SHAPES = ((4, 3), (5,), (2, 2, 2), (1,))
OPTIMIZERS = ("SGD", "Adam", "AdamW")
ERROR_INPUT_OPS = ("nn.functional.embedding", "nn.functional.linear_cross_entropy", "nn.functional.rms_norm")
_CLEAR = (ValueError, TypeError, IndexError, NotImplementedError)
# F.linear_cross_entropy and its OpInfo came with torch 2.13; the counts below are that torch's.
HAS_LINEAR_CROSS_ENTROPY = hasattr(torch.nn.functional, "linear_cross_entropy")
COUNTED_TORCH = "2.13."


def _skip_without(name, mode=None):
    """A reference skip: the torch under test has no OpInfo for ``name``; with ``mode``, a library
    skip: the library under test declares it lacks the op's family (FAMILY)."""
    if name == "nn.functional.linear_cross_entropy" and not HAS_LINEAR_CROSS_ENTROPY:
        pytest.skip("torch %s has no F.linear_cross_entropy (added in 2.13)" % torch.__version__)
    if mode is not None:
        skip_without(mode, FAMILY[name])


# OpInfo name -> (the OpInfo's positional arguments by name, the mojo_train.torch.functional name)
OPS = {
    "nn.functional.linear": (("input", "weight", "bias"), "linear"),
    "nn.functional.rms_norm": (("input", "normalized_shape", "weight", "eps"), "rms_norm"),
    "nn.functional.embedding": (("weight", "input"), "embedding"),   # the OpInfo's lambda takes (weight, idx)
    "nn.functional.silu": (("input", "inplace"), "silu"),
    "nn.functional.relu": (("input", "inplace"), "relu"),
    "nn.functional.dropout": (("input", "p", "training", "inplace"), "dropout"),
    "nn.functional.cross_entropy": (("input", "target", "weight", "size_average", "ignore_index", "reduce",
                                     "reduction", "label_smoothing"), "cross_entropy"),
    "nn.functional.linear_cross_entropy": (("input", "linear_weight", "target"), "linear_cross_entropy"),
}
# OpInfo name -> the op family (mt_features name) its calls need
FAMILY = {"nn.functional.linear": "linear", "nn.functional.rms_norm": "rms_norm", "nn.functional.embedding": "embedding",
          "nn.functional.silu": "elementwise", "nn.functional.relu": "elementwise", "nn.functional.dropout": "random",
          "nn.functional.cross_entropy": "loss", "nn.functional.linear_cross_entropy": "lm_head"}

# What mojo_train.torch refuses of torch's valid inputs: (refusal, functional names, exception type,
# the message's words, why). README's "What mojo_train.torch refuses" is this table.
REFUSED_OPS = (
    ("probability target that requires grad", ("cross_entropy",), ValueError,
     r"target requires grad, but no gradient with respect to probability targets",
     "no gradient with respect to a probability target is computed (torch computes one): pass target.detach()"),
    ("reduction='none' with a gradient", ("cross_entropy", "linear_cross_entropy"), NotImplementedError,
     r"(return_grad=True with )?reduction='none' (is not supported|on an input that requires grad)",
     "the native losses' reduction='none' is forward-only: native/contracts/loss.md does not define where a "
     "per-row upstream gradient enters the arithmetic"),
    ("unbatched 1-d input", ("linear_cross_entropy",), ValueError, r"input must be at least 2-D",
     "the fused head takes rows (N, in_features): pass input.unsqueeze(0)"),
    ("K-dimensional loss (linear_weight not 2-d)", ("linear_cross_entropy",), ValueError,
     r"linear_weight must be 2-D", "the fused head projects onto one class dimension, (C, in_features)"),
    ("probability targets", ("linear_cross_entropy",), TypeError,
     r"target has dtype torch\.float\d+; class or row indices must be integers",
     "the fused head takes class indices; cross_entropy on materialized logits takes probabilities"),
    ("class weights (weight=)", ("linear_cross_entropy",), TypeError, r"weight= is not supported",
     "the fused head has no per-class weights; cross_entropy on materialized logits takes weight="),
    ("torch's chunking options (options=)", ("linear_cross_entropy",), TypeError, r"options= is not supported",
     "chunk_rows= sets mojo_train's chunk size, which never changes a bit"),
    ("negative eps", ("rms_norm",), ValueError, r"eps must be finite and >= 0",
     "the contract's eps is >= 0 (mean(x**2) + eps < 0 is a NaN row); torch takes any float"),
    ("max_norm", ("embedding",), ValueError, r"max_norm is refused",
     "torch renormalizes rows of weight in place during the forward, a write outside the embedding contract"),
    ("scale_grad_by_freq=True", ("embedding",), ValueError, r"scale_grad_by_freq=True is refused",
     "the gradient is the token rule's plain sum, without a division by id counts"),
    ("sparse=True", ("embedding",), ValueError, r"sparse=True is refused",
     "the gradient is the dense (num_embeddings, embedding_dim) table"),
    ("p = 1", ("dropout",), ValueError, r"p must be in \[0, 1\)",
     "p = 1 drops everything (torch returns zeros); mojo_train's dropout takes p in [0, 1)"),
)

# What mojo_train.torch.optim refuses of torch's valid configs: refusal -> (exception type, words, why).
REFUSED_OPTIM = {
    "differentiable=True": (NotImplementedError, r"differentiable=True is not supported",
                            "there is no autograd through mojo_train's step: it takes the gradients as data"),
}

# torch error inputs the optimizers take by design (torch's words -> why); each then matches torch's
# equivalent call (_torch_equivalent: foreach dropped, one-element betas as floats).
ACCEPTED_OPTIM_ERROR_INPUTS = {
    "lr as a Tensor is not supported for capturable=False and foreach=True":
        "foreach changes nothing (every step is one fused native pass, which reads a one-element lr as a float)",
    r"betas\[0\] as a Tensor is not supported for capturable=False and foreach=True":
        "foreach changes nothing (one-element betas are read as floats)",
    "betas must be either both floats or both Tensors": "each one-element beta is read as a float",
}


# ---- helpers ----------------------------------------------------------------------------------
def _np(t):
    return t.detach().double().numpy()


def _rand(shape, seed):
    """U(-1, 1) float32 from a seeded generator of its own (torch's global RNG is left alone)."""
    return torch.rand(shape, generator=torch.Generator().manual_seed(seed)) * 2 - 1


def _describe(named):
    """A sample's arguments in brief: tensors by dtype and shape."""
    def one(v):
        if isinstance(v, torch.Tensor):
            return "%s%s" % (str(v.dtype)[6:], list(v.shape))
        return repr(v)
    return ", ".join("%s=%s" % (k, one(v)) for k, v in named.items())


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _snapshot(value):
    return [t.detach().clone() for t in _tensors(value)]


def _unchanged(value, snapshot):
    """Every tensor of ``value`` byte for byte its snapshot."""
    def raw(t):
        return t.detach().contiguous().reshape(-1).view(torch.uint8) if t.numel() else t.detach()
    return all(torch.equal(raw(t), raw(s)) for t, s in zip(_tensors(value), snapshot))


def _documented_op_refusal(fn, exc, given, snapshot):
    """The REFUSED_OPS row ``exc`` is, or a failure (str)."""
    text = "%s: %s" % (type(exc).__name__, exc)
    if not isinstance(exc, _CLEAR) or not str(exc).startswith("mojo_train.torch.functional.%s: " % fn):
        return None, "undocumented refusal (not mojo_train's clear message): " + text
    if not _unchanged(given, snapshot):
        return None, "refused but changed what it was given: " + text
    for name, fns, kind, words, _ in REFUSED_OPS:
        if fn in fns and isinstance(exc, kind) and re.search(words, str(exc)):
            return name, None
    return None, "refusal in no row of REFUSED_OPS: " + text


def _clear_refusal(exc, where, given, snapshot):
    """A refusal of a torch error input by mojo_train's own check: its clear message, nothing changed."""
    return isinstance(exc, _CLEAR) and str(exc).startswith("mojo_train.%s: " % where) and _unchanged(given, snapshot)


def _as_torch_refuses(exc, error_type, error_regex):
    return isinstance(exc, error_type) and re.search(error_regex, str(exc)) is not None


def _close(ours, ref, unit, what, grad=False):
    """None when ``ours`` is within the bound of ``ref`` (unit None: equal), else the failure.
    Where torch's value is NaN (the mean of no rows) ours is NaN too, or +0.0 for a gradient
    (tolerances.py, cross-entropy)."""
    o, r = _np(ours), _np(ref)
    if o.shape != r.shape:
        return "%s: shape %s, torch %s" % (what, o.shape, r.shape)
    u = None if unit is None else np.asarray(unit, dtype=np.float64)
    if u is not None:       # a unit per element (in any layout of the same elements) or one for all
        u = u.reshape(r.shape) if u.size == r.size and u.ndim else np.broadcast_to(u, r.shape)
    nan = np.isnan(r)
    if nan.any():
        if not (np.isnan(o[nan]) | (grad & (o[nan] == 0))).all():
            return "%s: torch NaN at %s, ours %s" % (what, np.argwhere(nan).tolist(), o[nan].tolist())
        o, r, u = o[~nan], r[~nan], None if u is None else u[~nan]
    if u is None:
        return None if np.array_equal(o, r) else "%s: not equal: ours %s, torch %s" % (what, o.tolist(), r.tolist())
    try:
        tol.assert_close_to_reference(o.ravel(), r.ravel(), what, unit=u.ravel())
    except AssertionError as exc:
        return str(exc)
    return None


def _summary(outcomes):
    """'<n>: <count> <outcome>, ...' in a fixed order."""
    order = ("match", "mask", "refused", "refused differentiable=True", "refused as torch refuses",
             "refused by mojo_train's check", "warned as torch warns", "accepted by design and matching torch")
    counts = {}
    for o in outcomes:
        key = "refused" if o.startswith("refused: ") else o
        counts[key] = counts.get(key, 0) + 1
    keys = sorted(counts, key=lambda k: (order.index(k) if k in order else len(order), k))
    return "%d: %s" % (len(outcomes), ", ".join("%d %s" % (counts[k], k) for k in keys))


# ---- optim_db ---------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _optim_infos():
    from torch.testing._internal.common_optimizers import optim_db
    return {info.optim_cls.__name__: info for info in optim_db if info.optim_cls.__name__ in OPTIMIZERS}


def _optim_configs(name):
    from torch.testing._internal.common_optimizers import _get_optim_inputs_including_global_cliquey_kwargs
    return _get_optim_inputs_including_global_cliquey_kwargs("cpu", torch.float32, _optim_infos()[name])


def _float64_kwargs(kwargs):
    """Tensor-valued keywords as float64 tensors (their float32 values unchanged), for torch's float64 run."""
    def convert(v):
        if isinstance(v, torch.Tensor):
            return v.detach().double()
        return tuple(convert(x) for x in v) if isinstance(v, tuple) else v
    return {k: convert(v) for k, v in kwargs.items()}


def _torch_equivalent(kwargs):
    """The call torch takes for an accepted error input: foreach dropped, one-element betas as floats."""
    out = {k: v for k, v in kwargs.items() if k != "foreach"}
    if "betas" in out:
        out["betas"] = tuple(float(b) for b in out["betas"])
    return out


def _optim_run(name, kwargs, ref_kwargs, mode):
    """K_STEPS steps through mojo_train.torch.optim.<name> (float32) and torch.optim.<name> (float64)
    on the same params and gradients: ('match' or 'refused <REFUSED_OPTIM key>', None), or (None, the
    failures)."""
    params = [_rand(s, 100 + i) for i, s in enumerate(SHAPES)]
    ours_p = [torch.nn.Parameter(p.clone()) for p in params]
    ref_p = [torch.nn.Parameter(p.double()) for p in params]
    try:
        ours = getattr(mtt.optim, name)(ours_p, numeric_mode=mode, **copy.deepcopy(kwargs))
    except Exception as exc:       # noqa: BLE001  (judged below: documented or a failure)
        return _optim_refusal(name, exc, kwargs)
    ref = getattr(torch.optim, name)(ref_p, **_float64_kwargs(ref_kwargs))
    group = ref.param_groups[0]
    decay, sign = (0.0 if name == "AdamW" else float(group["weight_decay"])), (-1.0 if group["maximize"] else 1.0)
    g_unit = 0.0
    for step in range(K_STEPS):
        for i, (p, q) in enumerate(zip(ours_p, ref_p)):
            p.grad = _rand(SHAPES[i], 1000 * step + i)
            q.grad = p.grad.double()
        with torch.no_grad():       # tolerances.py's G: the largest |effective gradient| torch saw
            g_unit = max(g_unit, max(float((sign * q.grad + decay * q).abs().max()) for q in ref_p))
        try:
            ours.step()
        except Exception as exc:   # noqa: BLE001
            return _optim_refusal(name, exc, kwargs)
        ref.step()
    units = tol.units(name, {"lr": float(group["lr"]), "momentum": float(group.get("momentum", 0.0))}, g_unit)
    units["params"] *= K_STEPS / tol.STEPS                     # as tests/test_optim_groups.py: K steps, not STEPS
    units["max_exp_avg_sq"] = units.get("exp_avg_sq")         # a running max of exp_avg_sq: its unit
    failures = [_close(torch.cat([p.flatten() for p in ours_p]), torch.cat([q.flatten() for q in ref_p]),
                       units["params"], "params")]
    for k, (p, q) in enumerate(zip(ours_p, ref_p)):
        mine, theirs = ours.state[p], ref.state[q]
        if set(mine) != set(theirs):
            failures.append("state keys of params[%d]: ours %s, torch %s" % (k, sorted(mine), sorted(theirs)))
            continue
        for key in theirs:
            failures.append(_close(mine[key], theirs[key], None if key == "step" else units[key],
                                   "state[params[%d]][%r]" % (k, key)))
    failures = [f for f in failures if f]
    return ("match", None) if not failures else (None, failures)


def _optim_refusal(name, exc, kwargs):
    text = "%s: %s" % (type(exc).__name__, exc)
    if not isinstance(exc, _CLEAR) or not str(exc).startswith("mojo_train.torch.optim.%s: " % name):
        return None, ["undocumented refusal (not mojo_train's clear message): " + text]
    if not any(re.search(r"\b%s\b" % k, str(exc)) for k in kwargs):
        return None, ["a refusal naming none of the keywords %s: %s" % (sorted(kwargs), text)]
    for reason, (kind, words, _) in REFUSED_OPTIM.items():
        if isinstance(exc, kind) and re.search(words, str(exc)):
            return "refused " + reason, None
    return None, ["refusal in no row of REFUSED_OPTIM: " + text]


def _optim_error_input(name, error_input, mode):
    """One torch error input: (outcome, None) or (None, failure)."""
    from torch.testing._internal.common_optimizers import OptimizerErrorEnum
    given = error_input.optimizer_error_input
    params = given.params if given.params is not None else [torch.nn.Parameter(_rand((2, 2), 7))]
    kind, regex = error_input.error_type, error_input.error_regex
    snapshot, raised = _snapshot(params), None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            opt = getattr(mtt.optim, name)(params, numeric_mode=mode, **given.kwargs)
            if error_input.error_on == OptimizerErrorEnum.STEP_ERROR:
                for p in opt.param_groups[0]["params"]:
                    p.grad = torch.ones_like(p)
                opt.step()
        except Exception as exc:     # noqa: BLE001
            raised = exc
    label = "%s %r" % (name, given.desc)
    if issubclass(kind, Warning):
        warned = any(issubclass(w.category, kind) and re.search(regex, str(w.message)) for w in caught)
        return ("warned as torch warns", None) if warned and raised is None else \
            (None, "%s: not warned as torch warns (%r): %r" % (label, regex, raised))
    if raised is not None:
        if _as_torch_refuses(raised, kind, regex):
            return "refused as torch refuses", None
        if _clear_refusal(raised, "torch.optim." + name, params, snapshot):
            return "refused by mojo_train's check", None
        return None, "%s: refused unclearly: %s: %s" % (label, type(raised).__name__, raised)
    if regex not in ACCEPTED_OPTIM_ERROR_INPUTS:
        return None, "%s: accepted silently (torch refuses it: %s)" % (label, regex)
    outcome, failures = _optim_run(name, given.kwargs, _torch_equivalent(given.kwargs), mode)
    if outcome != "match":
        return None, "%s: accepted by design but %s" % (label, failures)
    return "accepted by design and matching torch", None


@functools.lru_cache(maxsize=None)
def _optim_outcomes(name, key):
    """[(desc, outcome or None, failures or None)] of every optim_db config of ``name``; ``key``:
    (vendor, numeric mode), the fixture having selected the vendor."""
    out = []
    for config in _optim_configs(name):
        outcome, failures = _optim_run(name, config.kwargs, config.kwargs, key[1])
        out.append(("%s %s" % (config.desc, config.kwargs), outcome, failures))
    return out


@functools.lru_cache(maxsize=None)
def _optim_error_outcomes(key):
    out = []
    for name in OPTIMIZERS:
        for error_input in _optim_infos()[name].optim_error_inputs_func("cpu", torch.float32):
            outcome, failure = _optim_error_input(name, error_input, key[1])
            out.append((name, outcome, failure))
    return out


# ---- op_db ------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _opinfos():
    from torch.testing._internal.common_methods_invocations import op_db
    return [op for op in op_db if op.name in OPS and torch.float32 in op.supported_dtypes("cpu")]


def _named(op, sample):
    """The sample's arguments by name (the functional's keywords)."""
    names = OPS[op.name][0]
    positional = (sample.input,) + tuple(sample.args)
    assert len(positional) <= len(names), (op.name, len(positional))
    named = dict(zip(names, positional))
    named.update(sample.kwargs)
    return named


def _float64(named, fn):
    """torch's float64 arguments: float tensors as float64 leaves (requires_grad kept), the rest as
    given; rms_norm's eps=None is the float32 input's eps, finfo(float32).eps, spelled out."""
    def convert(v):
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            return v.detach().double().requires_grad_(v.requires_grad)
        return v
    out = {k: convert(v) for k, v in named.items()}
    if fn == "rms_norm" and out.get("eps") is None:
        out["eps"] = torch.finfo(torch.float32).eps
    return out


def _units(fn, named, y64, gy):
    """{'out' or argument name: unit} of every quantity compared (tests/tolerances.py)."""
    if fn == "linear":
        x, w, b = named["input"], named["weight"], named.get("bias")
        k, n = w.shape[1], w.shape[0]
        dy = np.zeros(y64.shape) if gy is None else _np(gy)
        u = tol.linear_units(_np(x).reshape(-1, k), _np(w), dy.reshape(-1, n), None if b is None else _np(b))
        return {"out": u["out"], "input": u["da"], "weight": u["dweight"], "bias": u["dbias"]}
    if fn == "rms_norm":
        shape = named["normalized_shape"]
        d = math.prod((shape,) if isinstance(shape, int) else shape)
        x, w, eps = _np(named["input"]).reshape(-1, d), named.get("weight"), named.get("eps")
        dy = np.zeros(x.shape) if gy is None else _np(gy).reshape(-1, d)
        u = tol.rms_units(x, None if w is None else _np(w).reshape(d), dy,
                          torch.finfo(torch.float32).eps if eps is None else eps)
        return {"out": u["y"], "input": u["dx"], "weight": u["dweight"]}
    if fn == "embedding":          # a gather is exact; dweight sums |grad_output| rows (test_torch_adapter.py)
        w, ids = named["weight"], named["input"]
        unit = None if gy is None else torch.zeros(w.shape, dtype=torch.float64).index_add_(
            0, ids.reshape(-1), gy.double().abs().reshape(-1, w.shape[1])).numpy()
        return {"out": None, "weight": unit}
    if fn in ("silu", "relu"):     # unit 1, as tests/test_torch_adapter.py
        return {"out": 1.0, "input": 1.0}
    if fn == "cross_entropy":
        return _ce_units(named, _np(named["input"]), gy)
    if fn == "linear_cross_entropy":
        return _lce_units(named, gy)
    raise AssertionError(fn)


def _ce_units(named, x, gy):
    """cross_entropy's units as tests/test_loss.py's bound_used_of: ce_units times S, the mean's
    divisor torch's; dlogits also times |grad_output|."""
    ignore = -100 if named.get("ignore_index") is None else named["ignore_index"]
    options = {"weight": None if named.get("weight") is None else _np(named["weight"]),
               "label_smoothing": named.get("label_smoothing", 0.0)}
    x2, t2 = _rows_of(x, named["target"].detach().numpy())
    if t2.dtype.kind != "f":
        t2 = np.where(t2 == ignore, -100, t2)          # _scale_and_divisor knows -100 as the ignored class
    scale, kept, divisor = _scale_and_divisor(t2, x2.shape[1], options)
    reduction = named.get("reduction", "mean")
    u = tol.ce_units(np.abs(x).max() if x.size else 0.0, kept, divisor, reduction)
    g = 0.0 if gy is None else float(gy.abs().max())
    return {"out": u["loss"] * scale, "input": u["dlogits"] * scale * g}


def _lce_units(named, gy):
    """linear_cross_entropy's: cross_entropy's units over its float64 logits, and the gradients'
    linear_units with every dlogit in cross_entropy's dlogits unit (tolerances.py: absolute, in
    units of g; |d loss / d logits| itself is no unit where p_target - 1 cancels)."""
    h, w, b = named["input"], named["linear_weight"], named.get("linear_bias")
    logits = _np(h) @ _np(w).T + (0.0 if b is None else _np(b))
    units = _ce_units(dict(named, input=torch.from_numpy(logits)), logits, gy)
    dl = np.full(logits.shape, units["input"])
    u = tol.linear_units(_np(h), _np(w), dl, None if b is None else _np(b))
    return {"out": units["out"], "input": u["da"], "linear_weight": u["dweight"], "linear_bias": u["dbias"]}


def _reference(fn, named64, gy):
    """torch's float64 output and gradients (by argument name)."""
    y = getattr(torch.nn.functional, fn)(**named64)
    return y, _grads(y, named64, gy)


def _grads(y, named, gy):
    wanted = {k: v for k, v in named.items() if isinstance(v, torch.Tensor) and v.requires_grad}
    if gy is None or not wanted:
        return {}
    got = torch.autograd.grad(y, list(wanted.values()), gy.to(y.dtype), allow_unused=True)
    return {k: (None if g is None else g.detach()) for k, g in zip(wanted, got)}


def _dropout(named, y, grads, gy, tally):
    """Training with p > 0: 0 or input / (1 - p) exactly, the gradient on the same mask; else the input."""
    x, p, training = named["input"].detach(), named.get("p", 0.5), named.get("training", True)
    y = y.detach()
    if not training or p == 0:
        bad = [] if torch.equal(y, x) else ["output is not the input"]
        if gy is not None and not torch.equal(grads["input"], gy):
            bad.append("gradient is not grad_output")
        return ("match" if not bad else None), bad
    kept, decided = y != 0, x != 0                     # where x == 0 either way gives 0
    scaled = (x.double() / (1 - p)).float()
    bad = [] if bool(((y == 0) | (y == scaled)).all()) else ["an element neither 0 nor input / (1 - p)"]
    if gy is not None:
        dx, dscaled = grads["input"], (gy.double() / (1 - p)).float()
        if not bool((dx[kept & decided] == dscaled[kept & decided]).all() and (dx[~kept & decided] == 0).all()):
            bad.append("the gradient's mask is not the output's")
    tally["kept"] += int((kept & decided).sum())
    tally["dropped"] += int((~kept & decided).sum())
    return ("mask" if not bad else None), bad


def _ours(fn, named, mode, seed):
    extra = {"numeric_mode": mode}
    if fn == "dropout":
        extra["generator"] = Generator(seed, numeric_mode=mode)
    return getattr(mtt.functional, fn)(**named, **extra)


def _op_sample(op, sample, mode, seed, with_grad, tally):
    """(outcome, failures) of one sample: ours against torch in float64."""
    fn = OPS[op.name][1]
    named = _named(op, sample)
    snapshot = _snapshot(named)
    gy = None
    try:
        y = _ours(fn, named, mode, seed)
        want = {k: v for k, v in named.items() if isinstance(v, torch.Tensor) and v.requires_grad}
        if with_grad and want:
            gy = _rand(y.shape, seed)
            got = _grads(y, named, gy) if y.requires_grad else dict.fromkeys(want)
        else:
            got = {}
    except Exception as exc:       # noqa: BLE001  (judged: documented or a failure)
        refusal, failure = _documented_op_refusal(fn, exc, named, snapshot)
        return ("refused: " + refusal, []) if refusal else (None, [failure])
    if fn == "dropout":
        return _dropout(named, y, got, gy, tally)
    named64 = _float64(named, fn)
    y64, ref = _reference(fn, named64, gy)
    units = _units(fn, named, y64, gy)
    bad = [_close(y, y64, units["out"], "output")]
    for k, g64 in ref.items():
        if got.get(k) is None:
            bad.append("no gradient for %s (torch has one)" % k)
        else:
            bad.append(_close(got[k], g64, units[k], "d " + k, grad=True))
    bad = [b for b in bad if b]
    return ("match" if not bad else None), bad


def _samples(op, requires_grad):
    """The OpInfo's samples, made from a seeded global RNG (make_tensor draws from it), which is
    restored afterwards."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return list(op.sample_inputs("cpu", torch.float32, requires_grad=requires_grad))


@functools.lru_cache(maxsize=None)
def _op_outcomes(name, key, requires_grad):
    """([(label, outcome or None, failures)] of every sample of the OpInfos named ``name``, dropout's
    tally of kept and dropped elements); ``key``: (vendor, numeric mode)."""
    out, tally = [], {"kept": 0, "dropped": 0}
    for op in _opinfos():
        if op.name != name:
            continue
        for i, sample in enumerate(_samples(op, requires_grad)):
            outcome, failures = _op_sample(op, sample, key[1], i, requires_grad, tally)
            out.append(("%s[%s] sample %d %s" % (op.name, op.variant_test_name, i, _describe(_named(op, sample))),
                        outcome, failures))
    return out, tally


@functools.lru_cache(maxsize=None)
def _op_error_outcomes(name, key):
    out = []
    for op in _opinfos():
        if op.name != name or op.error_inputs_func is None:
            continue
        fn = OPS[name][1]
        for i, error_input in enumerate(op.error_inputs("cpu")):
            named = _named(op, error_input.sample_input)
            snapshot = _snapshot(named)
            label = "%s[%s] error input %d (%s)" % (name, op.variant_test_name, i, error_input.error_regex)
            try:
                _ours(fn, named, key[1], i)
            except Exception as exc:    # noqa: BLE001
                if _as_torch_refuses(exc, error_input.error_type, error_input.error_regex):
                    out.append((label, "refused as torch refuses", None))
                elif _clear_refusal(exc, "torch.functional." + fn, named, snapshot):
                    out.append((label, "refused by mojo_train's check", None))
                else:
                    out.append((label, None, "refused unclearly: %s: %s" % (type(exc).__name__, exc)))
                continue
            out.append((label, None, "accepted silently (torch refuses it: %s)" % error_input.error_regex))
    return out


def _failures(rows):
    return ["%s: %s" % (label, f) for label, outcome, failures in rows if outcome is None or failures
            for f in (failures if isinstance(failures, list) else [failures])]


# ---- the tests --------------------------------------------------------------------------------
def test_torch_has_an_opinfo_for_every_op_and_an_optimizerinfo_for_every_optimizer_checked():
    names = {op.name for op in _opinfos()}
    expected = set(OPS) - (set() if HAS_LINEAR_CROSS_ENTROPY else {"nn.functional.linear_cross_entropy"})
    assert names == expected, sorted(expected ^ names)
    variants = sorted(op.variant_test_name for op in _opinfos() if op.name == "nn.functional.linear_cross_entropy")
    assert variants == (["", "chunked", "chunked_none"] if HAS_LINEAR_CROSS_ENTROPY else [])
    assert sorted(_optim_infos()) == sorted(OPTIMIZERS)
    assert sorted({op.name for op in _opinfos() if op.error_inputs_func is not None}) == \
        [n for n in ERROR_INPUT_OPS if n in expected]


def _key(mode):
    return mode.vendor, mode.numeric_mode


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_every_optim_db_config_matches_torch_float64_or_is_a_documented_refusal(mode, name):
    rows = _optim_outcomes(name, _key(mode))
    assert not _failures(rows), "\n".join(_failures(rows))
    assert any(outcome == "match" for _, outcome, _ in rows)


def test_every_optim_db_error_input_is_refused_as_torch_or_accepted_by_a_documented_design(mode):
    rows = _optim_error_outcomes(_key(mode))
    assert not _failures(rows), "\n".join(_failures(rows))


@pytest.mark.parametrize("requires_grad", [True, False], ids=["with_gradients", "forward"])
@pytest.mark.parametrize("name", sorted(OPS))
def test_every_opinfo_sample_matches_torch_float64_or_is_a_documented_refusal(mode, name, requires_grad):
    _skip_without(name, mode)
    rows, tally = _op_outcomes(name, _key(mode), requires_grad)
    assert rows, "no samples for %s" % name
    assert not _failures(rows), "\n".join(_failures(rows))
    if name == "nn.functional.dropout":     # the masks are dropout's, not all-keep or all-drop
        assert tally["kept"] > 0 and tally["dropped"] > 0, tally


@pytest.mark.parametrize("name", ERROR_INPUT_OPS)
def test_every_opinfo_error_input_is_refused(mode, name):
    _skip_without(name, mode)
    rows = _op_error_outcomes(name, _key(mode))
    assert rows, "torch has no error inputs for %s" % name
    assert not _failures(rows), "\n".join(_failures(rows))


def _count_lines(key):
    """The docstring's count lines, of this run."""
    lines = []
    for name in OPTIMIZERS:
        lines.append(("optim_db %s configs" % name, [o or "FAILED" for _, o, _ in _optim_outcomes(name, key)]))
    lines.append(("optim_db error inputs", [o or "FAILED" for _, o, _ in _optim_error_outcomes(key)]))
    for requires_grad in (True, False):
        outcomes = [o or "FAILED" for name in sorted(OPS) for _, o, _ in _op_outcomes(name, key, requires_grad)[0]]
        lines.append(("op_db samples, requires_grad=%s" % requires_grad, outcomes))
    lines.append(("op_db error inputs", [o or "FAILED" for name in sorted(OPS) for _, o, _ in
                                         _op_error_outcomes(name, key)]))
    return ["%-42s %s" % (label, _summary(outcomes)) for label, outcomes in lines]


def _refusal_counts(key):
    """{(functional name, REFUSED_OPS row): samples refused by it}, both sample sets."""
    counts = {}
    for name in sorted(OPS):
        for requires_grad in (True, False):
            for _, outcome, _ in _op_outcomes(name, key, requires_grad)[0]:
                if outcome and outcome.startswith("refused: "):
                    row = (OPS[name][1], outcome[len("refused: "):])
                    counts[row] = counts.get(row, 0) + 1
    return counts


def test_the_counts_are_this_docstrings_and_every_documented_refusal_occurs(identical, capsys):
    if not torch.__version__.startswith(COUNTED_TORCH):
        pytest.skip("the docstring's counts are torch 2.13's inputs; torch %s has others" % torch.__version__)
    skip_without(identical, "optim", *sorted(set(FAMILY.values())))     # the counts are over every op
    lines = _count_lines(_key(identical))
    refusals = _refusal_counts(_key(identical))
    with capsys.disabled():
        print("\npeer check, %r:" % identical)
        for line in lines:
            print("    " + line)
        for (fn, refusal), n in sorted(refusals.items()):
            print("    refused %-22s %-45s %4d" % (fn, refusal, n))
    doc = " ".join(__doc__.split())
    assert [line for line in lines if " ".join(line.split()) not in doc] == []
    used = {refusal for _, refusal in refusals}
    assert [row[0] for row in REFUSED_OPS if row[0] not in used] == []
