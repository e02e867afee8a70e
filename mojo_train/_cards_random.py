"""Cards of the random draws (fixtures/random.card): their cases, inputs and runners,
registered with _cards.

``normal``/``uniform`` draw n values of (seed, stream) at ``offset`` through
Generator.normal/uniform; the initializers run on a Generator whose counter is set to
``stream``; ``dropout`` drops out x (drawn like every card input: stream 0 of the seed, in
[low, high) given by ``x=``) with the generator's ``stream`` and ``offset``, and replays the
mask on dy (stream 1, ``dy=``). Every runner goes through the public API on the selected
vendor's identical numeric mode.
"""
from . import _card_format as _cards
from .random import Generator



def _device():
    return bool(_cards._ON_DEVICE)


def _n(case):
    return case.args["sizes"][0]


def _run_draw(case, backend):
    a = case.args
    g = Generator(a["seed"], numeric_mode=_cards.mode())
    if case.op == "normal":
        out = g.normal(_n(case), a.get("mean", 0.0), a.get("std", 1.0), stream=a["stream"],
                       offset=a.get("offset", 0), device=_device())
    else:
        low, high = a.get("range", (0.0, 1.0))
        out = g.uniform(_n(case), low, high, stream=a["stream"], offset=a.get("offset", 0), device=_device())
    return {"out": _cards._sha([out])}


def _run_init(case, backend):
    a = case.args
    g = Generator(a["seed"], numeric_mode=_cards.mode())
    g.load_state_dict({"seed": a["seed"], "counter": a["stream"]})
    fans = {"fan_in": a["fan_in"]}
    if case.op.startswith("xavier"):
        fans["fan_out"] = a["fan_out"]
    extra = {k: a[k] for k in ("a", "gain") if k in a}
    out = getattr(g, case.op)((_n(case),), device=_device(), **fans, **extra)
    return {"out": _cards._sha([out])}


def _run_dropout(case, backend):
    a = case.args
    x = _cards._input(backend, case, 0, a["x"])
    dy = _cards._input(backend, case, 1, a["dy"])
    g = Generator(a["seed"], numeric_mode=_cards.mode())
    y, key = g.dropout(x, a["p"], offset=a.get("offset", 0), stream=a["stream"])
    dx = g.dropout_backward(dy, key)
    return {"y": _cards._sha([y]), "dx": _cards._sha([dx])}


_BASE = {"seed": _cards._count, "sizes": _cards._one_size, "stream": _cards._count}
_DRAW = dict(_BASE, offset=_cards._count, mean=_cards._number, std=_cards._number, range=_cards._pair)
_INIT = dict(_BASE, fan_in=_cards._count, fan_out=_cards._count, a=_cards._number, gain=_cards._number)
_DROP = dict(_BASE, offset=_cards._count, p=_cards._number, x=_cards._pair, dy=_cards._pair)
_OUT = _cards._named("out")
_Y_DX = _cards._named("y", "dx")
_RANDOM_OPS = {
    "normal": (_DRAW, ("seed", "sizes", "stream"), _OUT, _run_draw),
    "uniform": (_DRAW, ("seed", "sizes", "stream"), _OUT, _run_draw),
    "kaiming_uniform": (_INIT, ("seed", "sizes", "stream", "fan_in"), _OUT, _run_init),
    "kaiming_normal": (_INIT, ("seed", "sizes", "stream", "fan_in"), _OUT, _run_init),
    "xavier_uniform": (_INIT, ("seed", "sizes", "stream", "fan_in", "fan_out"), _OUT, _run_init),
    "xavier_normal": (_INIT, ("seed", "sizes", "stream", "fan_in", "fan_out"), _OUT, _run_init),
    "dropout": (_DROP, ("seed", "sizes", "stream", "p", "x", "dy"), _Y_DX, _run_dropout),
}

BIG = _cards.BIG
SUB = _cards.SUB
SIZES = ("1", "2", "3", "5", "1023", "4099", str(BIG))


def _random_cases():
    specs = []
    for n in SIZES:
        specs.append("normal sizes=%s stream=3" % n)
        specs.append("normal sizes=%s stream=4 mean=0.5 std=2" % n)
        specs.append("dropout sizes=%s stream=2 p=0.1 x=-1,1 dy=-1,1" % n)
        specs.append("dropout sizes=%s stream=5 p=0.3 offset=7 x=-4,4 dy=-1,1" % n)
    for offset in ("1", "2", "3", "4", "1021", "4294967297", "18446744073709550000"):
        specs.append("normal sizes=1023 stream=9 offset=%s" % offset)
        specs.append("dropout sizes=1023 stream=9 offset=%s p=0.2 x=-1,1 dy=-1,1" % offset)
    specs += [
        "normal sizes=4099 stream=18446744073709551615",
        "normal sizes=4099 stream=3 mean=-3 std=1e-3",
        "normal sizes=4099 stream=3 std=0",
        "normal sizes=4099 stream=3 std=2**-140",          # subnormal products
        "normal sizes=4099 stream=3 mean=2**-130 std=2**-127",
        "uniform sizes=4099 stream=3",
        "uniform sizes=4099 stream=3 offset=3 range=-2,5",
        "dropout sizes=4099 stream=2 p=0 x=-1,1 dy=-1,1",
        "dropout sizes=4099 stream=2 p=0.5 x=-1,1 dy=-1,1",
        "dropout sizes=4099 stream=2 p=0.9 x=-1,1 dy=-1,1",
        "dropout sizes=4099 stream=2 p=0.999 x=-1,1 dy=-1,1",
        "dropout sizes=4099 stream=2 p=1e-7 x=-1,1 dy=-1,1",
        "dropout sizes=4099 stream=2 p=0.1 x=%s dy=%s" % (SUB, SUB),
        "dropout sizes=4099 stream=2 p=0.3 x=-1.5e38,1.5e38 dy=-1e38,1e38",
    ]
    for n in ("3", "4099", str(BIG)):
        specs += ["kaiming_uniform sizes=%s stream=0 fan_in=64" % n,
                  "kaiming_normal sizes=%s stream=1 fan_in=64" % n,
                  "xavier_uniform sizes=%s stream=2 fan_in=64 fan_out=256" % n,
                  "xavier_normal sizes=%s stream=3 fan_in=64 fan_out=256" % n]
    specs += ["kaiming_uniform sizes=4099 stream=7 fan_in=4096 a=0",
              "kaiming_normal sizes=4099 stream=7 fan_in=3 a=0.01",
              "xavier_uniform sizes=4099 stream=7 fan_in=1 fan_out=1 gain=5",
              "xavier_normal sizes=4099 stream=7 fan_in=1000 fan_out=3 gain=1.4142135623730951"]
    return [_cards._seeded(s) for s in specs]


_cards.register("random", "random v1", _random_cases, _RANDOM_OPS,
                ["normal/uniform: Generator(seed).normal/uniform(n, ..., stream=, offset=); initializers on",
                 "Generator(seed) with counter = stream; dropout: x from stream 0, dy from stream 1 of the",
                 "seed (x=/dy= low,high), mask from stream= at offset=; outputs y and dx = backward(dy)."])
