"""Cards of linear, RMSNorm and ReLU (contract dense v1): their cases, inputs and runners,
registered with _cards.

A case names its shapes and the range of each input; the inputs are drawn by _cards' one
filler (Philox through mt_uniform_fill): a / x from stream 0, weight from stream 1, bias from
stream 2 (weight's range), dc / dy from stream 3, each tensor in C order from offset 0.
Outputs are digested in the order of their names. The shapes are chosen to be odd (rows not a
multiple of any block, K and N of 1, 3, 67, 1023), to cross the token rule's leaves (over 2048
rows) and RMSNorm's chunks (over 4096 columns), with subnormal and large-magnitude inputs.
"""
from . import _cards
from .nn import (linear_backward, linear_forward, relu_backward, relu_forward, rms_norm_backward,
                 rms_norm_forward)

CONTRACT = "dense v1"
_STREAMS = {"a": 0, "x": 0, "w": 1, "bias": 2, "dc": 3, "dy": 3}
_NOTES = ("a=/x=, w=, dc=/dy= low,high: a (or x) from stream 0, weight from stream 1, bias "
          "(bias=1) from stream 2 in w's range,",
          "dc (or dy) from stream 3; each tensor in C order from offset 0. rms_norm without w= "
          "has no weight.")

_SIZE = {"seed": _cards._count}
_LINEAR_KEYS = dict(_SIZE, m=_cards._count, n=_cards._count, k=_cards._count, a=_cards._pair,
                    w=_cards._pair, bias=_cards._flag)
_RMS_KEYS = dict(_SIZE, rows=_cards._count, dim=_cards._count, x=_cards._pair, w=_cards._pair,
                 eps=_cards._number)


def _draw(backend, case, name, shape):
    n = 1
    for d in shape:
        n *= d
    bounds = case.args["w" if name == "bias" else name]
    spec = _cards.Case("draw", {"seed": case.args["seed"], "sizes": (n,)}, "")
    return _cards._filled(backend, spec, _STREAMS[name], bounds)[0].reshape(shape)


def _sha(x):
    return _cards._sha([x])


# ---- linear -----------------------------------------------------------------------------------
def _linear_inputs(case, backend):
    m, n, k = (case.args[key] for key in ("m", "n", "k"))
    a, w = _draw(backend, case, "a", (m, k)), _draw(backend, case, "w", (n, k))
    bias = _draw(backend, case, "bias", (n,)) if case.args.get("bias") else None
    return a, w, bias


def _run_forward(case, backend):
    a, w, bias = _linear_inputs(case, backend)
    return {"out": _sha(linear_forward(a, w, bias, numeric_mode="identical"))}


def _run_backward(case, backend):
    a, w, bias = _linear_inputs(case, backend)
    dc = _draw(backend, case, "dc", (case.args["m"], case.args["n"]))
    grads = linear_backward(dc, a, w, need_bias_grad=bias is not None, numeric_mode="identical")
    return dict(zip(_backward_outputs(case), (_sha(g) for g in grads)))


def _backward_outputs(case):
    return ("da", "dweight", "dbias") if case.args.get("bias") else ("da", "dweight")


def _run_relu(case, backend):
    x = _draw(backend, case, "x", (case.args["n"],))
    dy = _draw(backend, case, "dy", (case.args["n"],))
    return {"y": _sha(relu_forward(x, numeric_mode="identical")),
            "dx": _sha(relu_backward(dy, x, numeric_mode="identical"))}


UNIT, SUB, SUB_SQ = _cards.UNIT, _cards.SUB, _cards.SUB_SQ
# (m, n, k): odd sizes around every block edge; > 2048 rows cross leaves (3, 5, 9 of them).
_SHAPES = [(1, 1, 1), (3, 3, 3), (7, 67, 1), (67, 3, 67), (2, 1023, 67), (13, 67, 1023), (1023, 67, 33),
           (300, 600, 700), (97, 131, 257), (2049, 3, 67), (4097, 67, 13), (9000, 3, 5)]
_RANGES = [("a=%s w=%s" % (SUB, UNIT), "dc=%s" % UNIT),            # subnormal products and sums
           ("a=%s w=%s" % (SUB_SQ, SUB_SQ), "dc=%s" % SUB_SQ),       # normal inputs, subnormal products
           ("a=-1e17,1e17 w=-1e17,1e17", "dc=-1e16,1e16")]         # large magnitudes, sums stay finite


def _linear_cases():
    specs = []
    for m, n, k in _SHAPES:
        size = "m=%d n=%d k=%d" % (m, n, k)
        specs.append("linear_forward %s a=%s w=%s bias=0" % (size, UNIT, UNIT))
        specs.append("linear_forward %s a=%s w=%s bias=1" % (size, UNIT, UNIT))
        specs.append("linear_backward %s a=%s w=%s dc=%s bias=%d" % (size, UNIT, UNIT, UNIT, m % 2))
    for m, n, k in ((5, 67, 255), (2100, 7, 33)):
        for inputs, grads in _RANGES:
            size = "m=%d n=%d k=%d" % (m, n, k)
            specs.append("linear_forward %s %s bias=0" % (size, inputs))   # a bias would swallow the chain
            specs.append("linear_backward %s %s %s bias=1" % (size, inputs, grads))
    specs += ["relu n=%d x=%s dy=%s" % (n, r, UNIT) for n, r in ((1, UNIT), (4097, UNIT), (1023, SUB))]
    return [_cards._seeded(s) for s in specs]


# ---- RMSNorm ----------------------------------------------------------------------------------
def _rms_inputs(case, backend):
    rows, dim = case.args["rows"], case.args["dim"]
    x = _draw(backend, case, "x", (rows, dim))
    w = _draw(backend, case, "w", (dim,)) if "w" in case.args else None
    return x, w


def _run_rms_forward(case, backend):
    x, w = _rms_inputs(case, backend)
    return {"y": _sha(rms_norm_forward(x, w, case.args["eps"], numeric_mode="identical"))}


def _run_rms_backward(case, backend):
    x, w = _rms_inputs(case, backend)
    dy = _draw(backend, case, "dy", (case.args["rows"], case.args["dim"]))
    dx, dw = rms_norm_backward(dy, x, w, case.args["eps"], numeric_mode="identical")
    out = {"dx": _sha(dx)}
    if dw is not None:
        out["dweight"] = _sha(dw)
    return out


def _rms_outputs(case):
    return ("dx", "dweight") if "w" in case.args else ("dx",)


# (rows, dim): row trees of one lane row up to three chunks; > 2048 rows cross leaves.
_RMS_SHAPES = [(1, 1), (3, 3), (5, 67), (64, 255), (64, 256), (33, 1023), (17, 4096), (9, 4097),
               (3, 8193), (2100, 300), (3000, 129), (5000, 257)]
_RMS_RANGES = [("x=%s" % SUB, "1e-5"),           # subnormal x: eps carries the scale
               ("x=%s" % SUB_SQ, "0"),           # squares subnormal, summed by gradual underflow
               ("x=-1e15,1e15", "1e-6")]         # large x: r**3 subnormal in the backward


def _rms_cases():
    specs = []
    for rows, dim in _RMS_SHAPES:
        size = "rows=%d dim=%d" % (rows, dim)
        for eps, weight in (("1e-5", "w=0.5,1.5"), ("1e-6", "")):
            specs.append("rms_norm_forward %s x=%s %s eps=%s" % (size, UNIT, weight, eps))
            specs.append("rms_norm_backward %s x=%s %s dy=%s eps=%s" % (size, UNIT, weight, UNIT, eps))
    for rows, dim in ((7, 1023), (2100, 300)):
        for x, eps in _RMS_RANGES:
            size = "rows=%d dim=%d" % (rows, dim)
            specs.append("rms_norm_forward %s %s w=-2,2 eps=%s" % (size, x, eps))
            specs.append("rms_norm_backward %s %s w=-2,2 dy=%s eps=%s" % (size, x, UNIT, eps))
    return [_cards._seeded(" ".join(s.split())) for s in specs]


_cards.register("linear", CONTRACT, _linear_cases, {
    "linear_forward": (_LINEAR_KEYS, ("seed", "m", "n", "k", "a", "w"), lambda c: ("out",), _run_forward),
    "linear_backward": (dict(_LINEAR_KEYS, dc=_cards._pair), ("seed", "m", "n", "k", "a", "w", "dc"),
                        _backward_outputs, _run_backward),
    "relu": (dict(_SIZE, n=_cards._count, x=_cards._pair, dy=_cards._pair), ("seed", "n", "x", "dy"),
             lambda c: ("y", "dx"), _run_relu),
}, _NOTES)

_cards.register("rms_norm", CONTRACT, _rms_cases, {
    "rms_norm_forward": (_RMS_KEYS, ("seed", "rows", "dim", "x", "eps"), lambda c: ("y",), _run_rms_forward),
    "rms_norm_backward": (dict(_RMS_KEYS, dy=_cards._pair), ("seed", "rows", "dim", "x", "dy", "eps"),
                          _rms_outputs, _run_rms_backward),
}, _NOTES)
