"""Cards of linear (contract dense v1, native/contracts/linear.md): their cases, inputs and
runners, registered with _cards as the card ``linear`` (fixtures/linear.card).

A case names its shapes and the range of each input; the inputs are drawn by _cards' one
filler (Philox through mt_uniform_fill): a / x from stream 0, weight from stream 1, bias from
stream 2 (weight's range), dc / dy from stream 3, each tensor in C order from offset 0 (the
RMSNorm cards, _cards_rms_norm.py, draw theirs the same way, through _draw here).
Outputs are digested in the order of their names. The shapes are chosen to be odd (rows not a
multiple of any block, K and N of 1, 3, 67, 1023) and to cross the token rule's leaves (over
2048 rows), with subnormal and large-magnitude inputs.

"""
from . import _card_format as _cards
from ._array import Array
from .device import to_device
from .linear import linear_backward, linear_forward

CONTRACT = "dense v1"
_STREAMS = {"a": 0, "x": 0, "w": 1, "bias": 2, "dc": 3, "dy": 3}
_NOTES = ("a=/x=, w=, dc=/dy= low,high: a (or x) from stream 0, weight from stream 1, bias "
          "(bias=1) from stream 2 in w's range,",
          "dc (or dy) from stream 3; each tensor in C order from offset 0. rms_norm without w= "
          "has no weight.")

_SIZE = {"seed": _cards._count}
_LINEAR_KEYS = dict(_SIZE, m=_cards._count, n=_cards._count, k=_cards._count, a=_cards._pair,
                    w=_cards._pair, bias=_cards._flag)


def _tensor(backend, case, stream, bounds, shape):
    """A tensor of ``shape`` drawn from ``stream`` in ``bounds``; bounds low,low is that one value
    everywhere (a constant: no draw)."""
    n = 1
    for d in shape:
        n *= d
    low, high = bounds
    if low == high:
        const = Array.from_list([low] * n, "float32").reshape(shape)
        return to_device(const, _cards.mode()) if _cards._ON_DEVICE else const
    spec = _cards.Case("draw", {"seed": case.args["seed"], "sizes": (n,)}, "")
    return _cards._filled(backend, spec, stream, bounds)[0].reshape(shape)


def _draw(backend, case, name, shape):
    return _tensor(backend, case, _STREAMS[name], case.args["w" if name == "bias" else name], shape)


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
    return {"out": _sha(linear_forward(a, w, bias, numeric_mode=_cards.mode()))}


def _run_backward(case, backend):
    a, w, bias = _linear_inputs(case, backend)
    dc = _draw(backend, case, "dc", (case.args["m"], case.args["n"]))
    grads = linear_backward(dc, a, w, need_bias_grad=bias is not None, numeric_mode=_cards.mode())
    return dict(zip(_backward_outputs(case), (_sha(g) for g in grads)))


def _backward_outputs(case):
    return ("da", "dweight", "dbias") if case.args.get("bias") else ("da", "dweight")


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
    # Products that round up to +-FLT_MIN from below: (2^-63 - 2^-87) 2^-63 = 2^-126 - 2^-150, a tie
    # that rounds to the even FLT_MIN; identical_ftz flushes them (tininess before rounding).
    for below in (_JUST_BELOW, "-" + _JUST_BELOW):
        inputs = "a=%s,%s w=2**-63,2**-63" % (below, below)
        for k in (1, 3):
            specs.append("linear_forward m=2 n=3 k=%d %s bias=0" % (k, inputs))
        specs.append("linear_backward m=2 n=3 k=3 %s dc=2**-63,2**-63 bias=0" % inputs)
    return [_cards._seeded(s) for s in specs]


_JUST_BELOW = "1.0842021078620191e-19"   # the float32 2^-63 - 2^-87 (0x1.fffffep-64), exactly




_cards.register("linear", CONTRACT, _linear_cases, {
    "linear_forward": (_LINEAR_KEYS, ("seed", "m", "n", "k", "a", "w"), lambda c: ("out",), _run_forward),
    "linear_backward": (dict(_LINEAR_KEYS, dc=_cards._pair), ("seed", "m", "n", "k", "a", "w", "dc"),
                        _backward_outputs, _run_backward),
}, _NOTES)
