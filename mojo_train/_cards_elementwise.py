"""Cards of the elementwise ops (fixtures/elementwise.card): their cases, inputs and runners,
registered with _cards.

``silu`` runs forward on x (stream 0 of the seed, in [low, high) given by ``x=``) and backward
on (dy, x) (dy from stream 1, ``dy=``); ``gelu`` likewise, with ``approximate=none|tanh``;
``add`` adds a (stream 0) and b (stream 1); ``relu``
(``n=`` elements) runs forward on x (stream 0) and backward on (dy, x) with dy from stream 3
(its lines were first written into the linear card, whose streams they keep). Every runner
goes through the public API on the selected vendor's identical numeric mode.
"""
from . import _card_format as _cards
from . import elementwise

BIG, SUB = _cards.BIG, _cards.SUB
_OUT = _cards._named("out")
_Y_DX = _cards._named("y", "dx")


def _run_silu(case, backend):
    a = case.args
    x = _cards._input(backend, case, 0, a["x"])
    dy = _cards._input(backend, case, 1, a["dy"])
    y = elementwise.silu_forward(x, numeric_mode=_cards.mode())
    dx = elementwise.silu_backward(dy, x, numeric_mode=_cards.mode())
    return {"y": _cards._sha([y]), "dx": _cards._sha([dx])}


def _approximate(text):
    if text not in ("none", "tanh"):
        raise ValueError("%r is not none or tanh" % text)
    return text


def _run_gelu(case, backend):
    a = case.args
    x = _cards._input(backend, case, 0, a["x"])
    dy = _cards._input(backend, case, 1, a["dy"])
    y = elementwise.gelu_forward(x, a["approximate"], numeric_mode=_cards.mode())
    dx = elementwise.gelu_backward(dy, x, a["approximate"], numeric_mode=_cards.mode())
    return {"y": _cards._sha([y]), "dx": _cards._sha([dx])}


def _run_relu(case, backend):
    a = case.args
    draw = _cards.Case("draw", {"seed": a["seed"], "sizes": (a["n"],)}, "")
    x = _cards._input(backend, draw, 0, a["x"])
    dy = _cards._input(backend, draw, 3, a["dy"])
    return {"y": _cards._sha([elementwise.relu_forward(x, numeric_mode=_cards.mode())]),
            "dx": _cards._sha([elementwise.relu_backward(dy, x, numeric_mode=_cards.mode())])}


def _run_add(case, backend):
    a = case.args
    out = elementwise.add(_cards._input(backend, case, 0, a["a"]), _cards._input(backend, case, 1, a["b"]),
                          numeric_mode=_cards.mode())
    return {"out": _cards._sha([out])}


_ELT_KEYS = {"seed": _cards._count, "sizes": _cards._one_size}
_ELEMENTWISE_OPS = {
    "silu": (dict(_ELT_KEYS, x=_cards._pair, dy=_cards._pair), ("seed", "sizes", "x", "dy"),
             _Y_DX, _run_silu),
    "gelu": (dict(_ELT_KEYS, x=_cards._pair, dy=_cards._pair, approximate=_approximate),
             ("seed", "sizes", "x", "dy", "approximate"), _Y_DX, _run_gelu),
    "add": (dict(_ELT_KEYS, a=_cards._pair, b=_cards._pair), ("seed", "sizes", "a", "b"), _OUT, _run_add),
    "relu": ({"seed": _cards._count, "n": _cards._count, "x": _cards._pair, "dy": _cards._pair},
             ("seed", "n", "x", "dy"), _Y_DX, _run_relu),
}


def _elementwise_cases():
    specs = []
    for n in ("1", "3", "1023", "4099", str(BIG)):
        specs += ["silu sizes=%s x=-1,1 dy=-1,1" % n, "silu sizes=%s x=-20,20 dy=-1,1" % n,
                  "add sizes=%s a=-1,1 b=-1,1" % n, "add sizes=%s a=%s b=%s" % (n, SUB, SUB)]
    specs += [
        "silu sizes=4099 x=-120,120 dy=-1,1",            # exp(-x) overflows below -88.72
        "silu sizes=4099 x=-3,3 dy=-1e30,1e30",
        "silu sizes=4099 x=-1.5,-1 dy=-1,1",             # the gradient's zero near -1.2785
        "silu sizes=4099 x=%s dy=-1,1" % SUB,            # x / 2 onto the subnormal grid
        "silu sizes=4099 x=-2**-100,2**-100 dy=%s" % SUB,
        "silu sizes=4099 x=-1.5e38,1.5e38 dy=-1,1",
        "add sizes=4099 a=-2**-125,2**-125 b=-2**-126,2**-126",
        "add sizes=4099 a=1e38,1.7e38 b=1e38,1.7e38",      # sums that overflow to +inf
        "add sizes=4099 a=-1,1 b=-2**-20,2**-20",
    ]
    specs += ["relu n=%d x=%s dy=%s" % (n, r, _cards.UNIT) for n, r in ((1, _cards.UNIT), (4097, _cards.UNIT),
                                                                           (1023, SUB))]
    return [_cards._seeded(s) for s in specs + _gelu_specs()]


def _gelu_specs():
    """GELU, both approximations: the sizes above over [-6, 6], then the edges of the contract."""
    specs = []
    for approximate in ("none", "tanh"):
        gelu = "gelu sizes=%s x=%s dy=%s approximate=" + approximate
        specs += [gelu % (n, "-6,6", _cards.UNIT) for n in ("1", "3", "1023", "4099", str(BIG))]
        specs += [
            gelu % (4099, "-1.5,1.5", _cards.UNIT),           # erf's polynomial piece and its tail meet at 0.97
            gelu % (4099, "-12,-3", _cards.UNIT),             # the small tail (1 + tanh cancels), then 0
            gelu % (4099, "-120,120", _cards.UNIT),           # saturation: y = x or -0
            gelu % (4099, "-1.5e38,1.5e38", _cards.UNIT),     # x * x and x**3 overflow (tanh's guard)
            gelu % (4099, "-1e20,1e20", _cards.UNIT),         # x * x overflows from 1.8e19
            gelu % (4099, "-3,3", "-1e30,1e30"),
            gelu % (4099, SUB, _cards.UNIT),                  # x * 0.5 onto the subnormal grid
            gelu % (4099, "-2**-100,2**-100", SUB),
            gelu % (4099, _cards.SUB_SQ, _cards.UNIT),        # normal x, subnormal x * x
        ]
    return specs


_cards.register("elementwise", "elementwise v2", _elementwise_cases, _ELEMENTWISE_OPS,
                ["silu: x from stream 0, dy from stream 1 of the seed (x=/dy= low,high); outputs",
                 "y = silu_forward(x) and dx = silu_backward(dy, x). add: a from stream 0, b from stream 1.",
                 "gelu: as silu, y = gelu_forward(x, approximate), dx = gelu_backward(dy, x, approximate).",
                 "relu: x from stream 0, dy from stream 3; outputs y = relu_forward(x), dx = relu_backward(dy, x)."])
