"""Cards of LayerNorm (contract layer_norm v1, native/contracts/layer_norm.md): their cases,
inputs and runners, registered with _cards as the card ``layer_norm`` (fixtures/layer_norm.card).

Inputs come from _cards' one filler (Philox through mt_uniform_fill): x from stream 0, the
weight from stream 1, the bias from stream 2, dy from stream 3, each in C order from offset 0
(the streams of the linear and RMSNorm cards). Outputs are digested in the order of their
names. The shapes are odd (D = 1, 3, 67, 255, 1023, 4097), cross the chunks of the row tree
(over 4096 columns) and the token rule's leaves (over 1024 rows), and take every affine case
(weight and bias, either, neither); the ranges add subnormal, large-magnitude, large-mean and
constant rows (variance 0 or one rounding away from it; a range low,low is that constant).
"""
from . import _card_format as _cards
from ._cards_linear import _tensor
from .layer_norm import layer_norm_backward, layer_norm_forward

CONTRACT = "layer_norm v1"
_STREAMS = {"x": 0, "w": 1, "b": 2, "dy": 3}
_NOTES = ("x=, w=, b=, dy= low,high: x from stream 0, weight from stream 1, bias from stream 2, dy from",
          "stream 3; each tensor in C order from offset 0; low,low is low (in float32) everywhere, no draw.",
          "Without w= there is no weight, without b= no bias.")
_KEYS = dict(seed=_cards._count, rows=_cards._count, dim=_cards._count, x=_cards._pair, w=_cards._pair,
             b=_cards._pair, eps=_cards._number)
UNIT, SUB, SUB_SQ = _cards.UNIT, _cards.SUB, _cards.SUB_SQ


def _draw(backend, case, name, shape):
    """Tensor ``name`` of the case (None when its range is not given), drawn from its stream;
    a range low,low is that one value everywhere (a constant row: no draw)."""
    if name not in case.args:
        return None
    return _tensor(backend, case, _STREAMS[name], case.args[name], shape)


def _inputs(case, backend):
    shape, dim = (case.args["rows"], case.args["dim"]), case.args["dim"]
    return _draw(backend, case, "x", shape), _draw(backend, case, "w", (dim,)), _draw(backend, case, "b", (dim,))


def _run_forward(case, backend):
    x, w, b = _inputs(case, backend)
    return {"y": _cards._sha([layer_norm_forward(x, w, b, case.args["eps"], numeric_mode=_cards.mode())])}


def _run_backward(case, backend):
    x, w, b = _inputs(case, backend)
    dy = _draw(backend, case, "dy", (case.args["rows"], case.args["dim"]))
    grads = layer_norm_backward(dy, x, w, b, case.args["eps"], numeric_mode=_cards.mode())
    return {name: _cards._sha([g]) for name, g in zip(("dx", "dweight", "dbias"), grads) if g is not None}


def _backward_outputs(case):
    return ("dx",) + (("dweight",) if "w" in case.args else ()) + (("dbias",) if "b" in case.args else ())


# (rows, dim): one row, one column, odd widths, up to three chunks; > 1024 rows cross leaves.
_SHAPES = [(1, 1), (3, 3), (1, 4097), (5, 67), (64, 255), (64, 256), (33, 1023), (17, 4096), (9, 4097),
           (3, 8193), (2100, 1), (2100, 300), (3000, 129), (5000, 257)]
_AFFINE = [("w=0.5,1.5 b=-1,1", "1e-5"), ("", "1e-6")]               # every shape: both, neither
_ONE_SIDED = [("w=-2,2", "1e-5"), ("b=-1,1", "1e-5")]                 # a few shapes: either alone
_RANGES = [("x=%s" % SUB, "1e-5"),            # subnormal x: eps carries the scale
           ("x=%s" % SUB_SQ, "0"),            # squared deviations subnormal, no eps
           ("x=-1e15,1e15", "1e-6"),          # large x: squares near 1e30
           ("x=1e4,1.0001e4", "1e-5"),        # a large mean over a small spread (the two passes)
           ("x=1.5,1.5", "1e-5"),             # a constant row, its sum exact: xhat = 0
           ("x=0.1,0.1", "1e-5")]             # a constant row, its mean one rounding off


def _specs():
    specs = []

    def both(size, rest, eps):
        specs.append("layer_norm_forward %s %s eps=%s" % (size, rest, eps))
        specs.append("layer_norm_backward %s %s dy=%s eps=%s" % (size, rest, UNIT, eps))

    for rows, dim in _SHAPES:
        for affine, eps in _AFFINE:
            both("rows=%d dim=%d" % (rows, dim), "x=%s %s" % (UNIT, affine), eps)
    for rows, dim in ((3, 3), (33, 1023), (2100, 300)):
        for affine, eps in _ONE_SIDED:
            both("rows=%d dim=%d" % (rows, dim), "x=%s %s" % (UNIT, affine), eps)
    for rows, dim in ((7, 3), (7, 1023), (2100, 300)):
        for x, eps in _RANGES:
            both("rows=%d dim=%d" % (rows, dim), "%s w=-2,2 b=-1,1" % x, eps)
    for rows, dim in ((7, 3), (2100, 300)):   # eps = 0 on constant rows: r = inf, NaN everywhere (canonical)
        both("rows=%d dim=%d" % (rows, dim), "x=1.5,1.5 w=-2,2 b=-1,1", "0")
    return specs


def _cases():
    return [_cards._seeded(" ".join(s.split())) for s in _specs()]


_cards.register("layer_norm", CONTRACT, _cases, {
    "layer_norm_forward": (_KEYS, ("seed", "rows", "dim", "x", "eps"), lambda c: ("y",), _run_forward),
    "layer_norm_backward": (dict(_KEYS, dy=_cards._pair), ("seed", "rows", "dim", "x", "dy", "eps"),
                            _backward_outputs, _run_backward),
}, _NOTES)
