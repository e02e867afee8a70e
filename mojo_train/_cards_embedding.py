"""Cards of the embedding (fixtures/embedding.card): cases, inputs and runners, registered with _cards.

Inputs, all from the pinned Philox stream (mt_uniform_fill) of the case's seed: the table
from stream 0, uniform in ``w=low,high``; ``dy`` from stream 1, uniform in ``g=low,high``;
ids from stream 2: ``u`` uniform in [0, 1) (float32), ``id = min(vocab - 1, floor(vocab *
u**skew))`` with ``u**skew`` formed by repeated binary64 multiplication (exact rounding, so
every platform agrees; skew=0 makes every id vocab - 1); with ``accumulate=1`` the gradient
added into comes from stream 3, uniform in ``g``. Outputs: ``out`` (forward) and ``dweight``
(backward), through the public API on the vendor's identical numeric mode.
"""
from . import _card_format as _cards
from . import _native
from ._array import Array
from .device import DeviceArray, to_device
from .embedding import embedding_backward, embedding_forward


def _int(text):
    return int(text)


def _plan(text):
    if text not in ("scan", "sort"):
        raise ValueError("%r is not scan or sort" % text)
    return text


def _id_bytes(text):
    if text not in ("4", "8"):
        raise ValueError("%r is not 4 or 8" % text)
    return int(text)


_COMMON = {"seed": _cards._count, "vocab": _cards._count, "dim": _cards._count, "n": _cards._count,
           "skew": _cards._count, "id_bytes": _id_bytes}
_FORWARD_KEYS = dict(_COMMON, w=_cards._pair)
_BACKWARD_KEYS = dict(_COMMON, g=_cards._pair, padding_idx=_int, accumulate=_cards._flag, plan=_plan)


def _draw(backend, seed, stream, n, bounds):
    """n float32 from (seed, stream) uniform in bounds: an Array, or a DeviceArray on device runs."""
    return _cards.draw(backend, seed, stream, bounds, n)


def skewed_ids(backend, seed, n, vocab, skew, id_bytes=8):
    """The card rule for ids (module docstring), as a host Array of int32/int64."""
    u = _draw_host(backend, seed, 2, n)
    ids = []
    for x in u.tolist():
        t = 1.0
        for _ in range(skew):
            t = t * x
        ids.append(min(vocab - 1, int(vocab * t)))
    return Array.from_list(ids, "int32" if id_bytes == 4 else "int64")


def _draw_host(backend, seed, stream, n):
    return _cards.draw(backend, seed, stream, (0.0, 1.0), n, host=True)


def _inputs(case, backend):
    a = case.args
    ids = skewed_ids(backend, a["seed"], a["n"], a["vocab"], a.get("skew", 1), a.get("id_bytes", 8))
    return to_device(ids, numeric_mode=_cards.mode()) if _cards._ON_DEVICE else ids


def _run_forward(case, backend):
    a = case.args
    table = _draw(backend, a["seed"], 0, a["vocab"] * a["dim"], a["w"]).reshape(a["vocab"], a["dim"])
    out = embedding_forward(table, _inputs(case, backend), numeric_mode=_cards.mode())
    return {"out": _cards._sha([out])}


def _run_backward(case, backend):
    a = case.args
    dy = _draw(backend, a["seed"], 1, a["n"] * a["dim"], a["g"]).reshape(a["n"], a["dim"])
    grad = None
    if a.get("accumulate"):
        grad = _draw(backend, a["seed"], 3, a["vocab"] * a["dim"], a["g"]).reshape(a["vocab"], a["dim"])
    dw = embedding_backward(dy, _inputs(case, backend), a["vocab"], padding_idx=a.get("padding_idx"), grad=grad,
                            plan=a.get("plan", "auto"), numeric_mode=_cards.mode())
    return {"dweight": _cards._sha([dw])}


UNIT, SUB, BIG = "-1,1", "-2**-127,2**-127", "-1e30,1e30"


def _cases():
    fwd = ["vocab=1 dim=1 n=1", "vocab=7 dim=3 n=5 skew=1", "vocab=1000 dim=17 n=1025 skew=3 id_bytes=4",
           "vocab=50 dim=769 n=300 skew=1", "vocab=3 dim=5 n=4097 skew=2 w=%s" % SUB,
           "vocab=13 dim=4 n=2049 skew=0 id_bytes=4"]
    specs = ["embedding_forward %s%s" % (s, "" if " w=" in s else " w=%s" % UNIT) for s in fwd]
    bwd = [
        "vocab=1 dim=3 n=5", "vocab=1 dim=3 n=3000", "vocab=7 dim=3 n=100 skew=1",
        "vocab=1000 dim=17 n=1025 skew=3", "vocab=1000 dim=17 n=1025 skew=3 id_bytes=4",
        "vocab=1000 dim=17 n=5000 skew=3 padding_idx=0", "vocab=1000 dim=64 n=9000 skew=3 accumulate=1",
        "vocab=300 dim=129 n=4097 skew=2 padding_idx=-1 accumulate=1", "vocab=13 dim=5 n=2049 skew=0",
        "vocab=13 dim=5 n=2049 skew=0 padding_idx=12", "vocab=20 dim=7 n=3000 skew=2 g=%s" % SUB,
        "vocab=20 dim=7 n=3000 skew=2 g=%s" % BIG, "vocab=100 dim=9 n=3000 skew=2 plan=scan",
        "vocab=100 dim=9 n=3000 skew=2 plan=sort", "vocab=100 dim=9 n=3000 skew=2 plan=scan accumulate=1",
        "vocab=100 dim=9 n=3000 skew=2 plan=sort accumulate=1", "vocab=5 dim=3 n=1023 skew=1",
        "vocab=5 dim=3 n=1024 skew=1", "vocab=5 dim=3 n=2048 skew=1", "vocab=5 dim=3 n=3073 skew=1",
        "vocab=64 dim=31 n=7169 skew=4 id_bytes=4", "vocab=2 dim=1 n=6000 skew=1",
        "vocab=50304 dim=33 n=16384 skew=3 id_bytes=4", "vocab=50304 dim=33 n=16384 skew=3 padding_idx=0",
        "vocab=40 dim=769 n=2500 skew=2", "vocab=7 dim=3 n=20000 skew=1 accumulate=1 padding_idx=3",
    ]
    specs += ["embedding_backward %s%s" % (s, "" if " g=" in s else " g=%s" % UNIT) for s in bwd]
    return [_cards._seeded(s) for s in specs]


_NOTES = ("w=/g= low,high: the table from stream 0, dy from stream 1, the gradient added into (accumulate=1)",
          "from stream 3; ids from stream 2: min(vocab-1, floor(vocab * u**skew)), u uniform [0,1) (float32),",
          "u**skew by repeated binary64 products; skew defaults to 1, id_bytes to 8, plan to auto.")

_cards.register("embedding", "embedding v1", _cases, {
    "embedding_forward": (_FORWARD_KEYS, ("seed", "vocab", "dim", "n", "w"), lambda case: ("out",), _run_forward),
    "embedding_backward": (_BACKWARD_KEYS, ("seed", "vocab", "dim", "n", "g"), lambda case: ("dweight",),
                           _run_backward),
}, _NOTES)
