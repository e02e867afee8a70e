"""Cards of gradient accumulation (fixtures/accumulate.card, contract accumulate v1): cases,
inputs and runners, registered with _cards.

Every input comes from the pinned Philox stream (mt_uniform_fill) of the case's seed:
- ``accumulate seed=S sizes=... parts=A g=low,high [tokens=T]``: microbatch i (i = 1..A)
  holds one tensor per size, drawn from stream i, tensor j at offset offsets[j], uniform in
  ``g``; ``accumulate_grads`` combines the A microbatches (with ``tokens``, the split is
  checked aligned first; without, it is not checked). Output ``grads``: the results' bytes.
- ``accumulate_linear seed=S tokens=T parts=A width=K classes=N g=low,high``: ``a (T, K)``
  from stream 1 and ``dc (T, N)`` from stream 2, uniform in ``g``; ``weight (N, K)`` from
  stream 0 in [-1, 1). Microbatch i is rows ``[i T/A, (i+1) T/A)``, the same draws at their
  offsets; its ``linear_backward`` weight and bias gradients are combined by
  ``accumulate_grads(..., tokens=T)``. Every such split is aligned, so for one seed, T, K and
  N the outputs ``dweight`` and ``dbias`` are the same for every A: the unsplit batch's bits.
"""
from . import _card_format as _cards
from .accumulate import accumulate_grads
from .nn import linear_backward

_KEYS = dict(_cards._INPUT_KEYS, parts=_cards._count, tokens=_cards._count)
_LINEAR_KEYS = {"seed": _cards._count, "tokens": _cards._count, "parts": _cards._count, "width": _cards._count,
                "classes": _cards._count, "g": _cards._pair}


def _run_accumulate(case, backend):
    a = case.args
    parts = [_cards._filled(backend, case, i, a["g"]) for i in range(1, a["parts"] + 1)]
    return {"grads": _cards._sha(accumulate_grads(parts, a.get("tokens"), numeric_mode=_cards.mode()))}


def _draw(backend, seed, stream, sizes, bounds):
    """Tensors of ``sizes`` from (seed, stream), end to end from offset 0 (as _cards._filled)."""
    return _cards._filled(backend, _cards.Case("", {"seed": seed, "sizes": sizes}, ""), stream, bounds)


def _rows(backend, a, stream, cols, bounds):
    """The microbatches' row blocks of a (T, cols) draw from ``stream``: A of (T/A, cols)."""
    m = a["tokens"] // a["parts"]
    return [x.reshape(m, cols) for x in _draw(backend, a["seed"], stream, (m * cols,) * a["parts"], bounds)]


def _run_linear(case, backend):
    a = case.args
    k, n = a["width"], a["classes"]
    weight = _draw(backend, a["seed"], 0, (n * k,), (-1.0, 1.0))[0].reshape(n, k)
    grads = [list(linear_backward(dc, x, weight, need_input_grad=False, need_bias_grad=True,
                                  numeric_mode=_cards.mode())[1:])
             for x, dc in zip(_rows(backend, a, 1, k, a["g"]), _rows(backend, a, 2, n, a["g"]))]
    dweight, dbias = accumulate_grads(grads, a["tokens"], numeric_mode=_cards.mode())
    return {"dweight": _cards._sha([dweight]), "dbias": _cards._sha([dbias])}


UNIT, SUB, TINY = "-1,1", "-2**-127,2**-127", "-2**-120,2**-120"   # TINY: sums round near underflow
# Split counts: powers of two, one or two one bits, and three or more (where the stack of
# complete subtrees holds three or more at the end).
COUNTS = (1, 2, 3, 4, 5, 7, 8, 11, 13, 16, 23, 31, 33, 100, 127)
SIZES = ("1", "3", "257", "1023,1,300", "4097")


def _accumulate_cases():
    specs = ["accumulate sizes=%s parts=%d g=%s" % (s, a, UNIT) for s in SIZES for a in COUNTS]
    specs += ["accumulate sizes=%s parts=%d g=%s" % (s, a, g) for g in (SUB, TINY)
              for s in ("3", "1023,1,300") for a in (2, 7, 13, 100)]
    # large values, kept where no partial sum can reach float32's max (A * high < 3.4e38)
    specs += ["accumulate sizes=1023,5 parts=2 g=-1.5e38,1.5e38", "accumulate sizes=1023,5 parts=3 g=-1.1e38,1.1e38",
              "accumulate sizes=1023,5 parts=7 g=-4.5e37,4.5e37", "accumulate sizes=257 parts=100 g=-3e36,3e36",
              "accumulate sizes=%d parts=13 g=%s" % (2 ** 18 + 3, UNIT)]
    # the alignment check on the way: leaf-aligned splits into power-of-two-leaf microbatches
    specs += ["accumulate sizes=1023 parts=%d g=%s tokens=%d" % (a, UNIT, t)
              for a, t in ((1, 5000), (3, 3072), (4, 4096), (4, 16384), (5, 10240), (7, 14336), (16, 16384))]
    return [_cards._seeded(s) for s in specs] + _linear_cases()


def _linear_cases():
    """Aligned splits of one batch: each (tokens, width, classes) is seeded once, so its lines
    for every split count draw the same inputs and must carry the same digests."""
    specs = []
    for tokens, counts, k, n in ((4096, (1, 2, 4), 16, 8), (8192, (1, 2, 4, 8), 9, 5), (3072, (1, 3), 16, 8),
                                 (7168, (1, 7), 8, 3), (13312, (1, 13), 5, 4)):
        seeded = _cards._seeded("accumulate_linear tokens=%d width=%d classes=%d g=%s" % (tokens, k, n, UNIT))
        specs += ["%s parts=%d" % (seeded, a) for a in counts]
    return specs


_cards.register("accumulate", "accumulate v1", _accumulate_cases, {
    "accumulate": (_KEYS, ("seed", "sizes", "parts", "g"), lambda case: ("grads",), _run_accumulate),
    "accumulate_linear": (_LINEAR_KEYS, ("seed", "tokens", "parts", "width", "classes", "g"),
                          lambda case: ("dweight", "dbias"), _run_linear),
}, ("g= low,high: microbatch i (1..parts) from stream i, tensor j at offset offsets[j];",
    "accumulate_linear: weight from stream 0 in [-1,1), a (tokens, width) from stream 1, dc (tokens,",
    "classes) from stream 2; microbatch i is rows [i*tokens/parts, (i+1)*tokens/parts) of them."),
    needs={"accumulate_linear": ("linear",)})
