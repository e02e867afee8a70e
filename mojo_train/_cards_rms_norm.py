"""Cards of RMSNorm (contract dense v1, native/contracts/rms_norm.md): their cases, inputs and
runners, registered with _cards as the card ``rms_norm`` (fixtures/rms_norm.card).

Inputs are drawn as the linear cards draw theirs (_cards_linear._draw: x from stream 0, the
weight from stream 1, dy from stream 3, each in C order from offset 0); outputs are digested
in the order of their names. The shapes cross RMSNorm's chunks (over 4096 columns) and the
token rule's leaves (over 1024 rows), with subnormal and large-magnitude inputs. The last lines
take CUDA's one-pass backward (at least 8 leaves, dim a multiple of 128): a last leaf of one
row, a last window shorter than the others, two chunks with one lane row in the second.
"""
from . import _card_format as _cards
from ._cards_linear import CONTRACT, _NOTES, _SIZE, _draw, _sha
from .rms_norm import rms_norm_backward, rms_norm_forward

UNIT, SUB, SUB_SQ = _cards.UNIT, _cards.SUB, _cards.SUB_SQ
_RMS_KEYS = dict(_SIZE, rows=_cards._count, dim=_cards._count, x=_cards._pair, w=_cards._pair,
                 eps=_cards._number)


def _rms_inputs(case, backend):
    rows, dim = case.args["rows"], case.args["dim"]
    x = _draw(backend, case, "x", (rows, dim))
    w = _draw(backend, case, "w", (dim,)) if "w" in case.args else None
    return x, w


def _run_rms_forward(case, backend):
    x, w = _rms_inputs(case, backend)
    return {"y": _sha(rms_norm_forward(x, w, case.args["eps"], numeric_mode=_cards.mode()))}


def _run_rms_backward(case, backend):
    x, w = _rms_inputs(case, backend)
    dy = _draw(backend, case, "dy", (case.args["rows"], case.args["dim"]))
    dx, dw = rms_norm_backward(dy, x, w, case.args["eps"], numeric_mode=_cards.mode())
    out = {"dx": _sha(dx)}
    if dw is not None:
        out["dweight"] = _sha(dw)
    return out


def _rms_outputs(case):
    return ("dx", "dweight") if "w" in case.args else ("dx",)


# (rows, dim): row trees of one lane row up to three chunks; > 1024 rows cross leaves.
_RMS_SHAPES = [(1, 1), (3, 3), (5, 67), (64, 255), (64, 256), (33, 1023), (17, 4096), (9, 4097),
               (3, 8193), (2100, 300), (3000, 129), (5000, 257)]
# (rows, dim) of the one-pass backward's lines (8 leaves and more).
_RMS_ONE_PASS_SHAPES = [(7169, 384), (8200, 128), (7169, 4224)]
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
    for rows, dim in _RMS_ONE_PASS_SHAPES:
        size = "rows=%d dim=%d" % (rows, dim)
        specs.append("rms_norm_backward %s x=%s w=0.5,1.5 dy=%s eps=1e-5" % (size, UNIT, UNIT))
    for x, eps in _RMS_RANGES:   # the last: dx holds one NaN (inf - inf), canonical
        specs.append("rms_norm_backward rows=7169 dim=384 %s w=-2,2 dy=%s eps=%s" % (x, UNIT, eps))
    for rows, dim in ((7, 3), (2100, 300), (7169, 384)):   # rows of zeros, eps = 0: r = inf, NaN everywhere
        specs.append("rms_norm_forward rows=%d dim=%d x=0,0 w=-2,2 eps=0" % (rows, dim))
        specs.append("rms_norm_backward rows=%d dim=%d x=0,0 w=-2,2 dy=%s eps=0" % (rows, dim, UNIT))
    return [_cards._seeded(" ".join(s.split())) for s in specs]


_cards.register("rms_norm", CONTRACT, _rms_cases, {
    "rms_norm_forward": (_RMS_KEYS, ("seed", "rows", "dim", "x", "eps"), lambda c: ("y",), _run_rms_forward),
    "rms_norm_backward": (dict(_RMS_KEYS, dy=_cards._pair), ("seed", "rows", "dim", "x", "dy", "eps"),
                          _rms_outputs, _run_rms_backward),
}, _NOTES)
