"""Cards of the chunked LM head (card ``lm_head``, contracts loss v1 + dense v1): cases,
inputs and the runner, registered with _cards.

A case ``linear_cross_entropy seed=S rows=N vocab=V width=W ...`` draws everything from the
library's Philox (mt_uniform_fill), nothing from disk:
- hidden (N, W): stream 3 of seed S, uniform in ``h=low,high``; weight (V, W): stream 4 in
  [-1, 1); bias (V,): stream 5 in [-1, 1) when ``bias=1``;
- targets and ignored rows exactly as the ``loss`` card draws them (streams 1 and 2).
Keys beyond those: h (default -1,1), bias (0/1), ignore (fraction), reduction, smoothing,
num_items, grad (0/1), chunk (chunk_rows; the bits must not depend on it, so several chunks of
one case give one line each with the same digests). Outputs: ``loss`` (or ``row_loss``), and
with grad ``d_hidden``, ``d_weight`` (and ``d_bias``).
"""
import mojo_train
from . import _card_format as _cards
from ._array import Array
from ._cards_loss import _KEYS as _LOSS_KEYS, _uniform, targets_for

_KEYS = dict({k: _LOSS_KEYS[k] for k in ("seed", "rows", "vocab", "ignore", "reduction", "smoothing",
                                         "num_items", "grad")},
             width=_cards._count, h=_cards._pair, bias=_cards._flag, chunk=_cards._count)
_REQUIRED = ("seed", "rows", "vocab", "width")


def _outputs(case):
    names = ["row_loss"] if case.args.get("reduction", "mean") == "none" else ["loss"]
    if case.args.get("grad", False):
        names += ["d_hidden", "d_weight"] + (["d_bias"] if case.args.get("bias", False) else [])
    return names


def _run(case, backend):
    a = case.args
    n, v, w = a["rows"], a["vocab"], a["width"]
    lo, hi = a.get("h", (-1.0, 1.0))
    hidden = _uniform(backend, a["seed"], 3, lo, hi, n * w).reshape(n, w)
    weight = _uniform(backend, a["seed"], 4, -1.0, 1.0, v * w).reshape(v, w)
    bias = _uniform(backend, a["seed"], 5, -1.0, 1.0, v) if a.get("bias", False) else None
    targets = Array.from_list(targets_for(backend, a), "int64")
    if _cards._ON_DEVICE:
        targets = mojo_train.to_device(targets, numeric_mode=_cards.mode())
    red, grad = a.get("reduction", "mean"), a.get("grad", False)
    got = mojo_train.linear_cross_entropy(hidden, weight, targets, linear_bias=bias, reduction=red,
                                          label_smoothing=a.get("smoothing", 0.0), num_items=a.get("num_items"),
                                          return_grad=grad, chunk_rows=a.get("chunk"), numeric_mode=_cards.mode())
    got = got if grad else (got,)
    out = {"row_loss": _cards._sha([got[0]])} if red == "none" else {"loss": _cards._sha(raw=_cards._f32(got[0]))}
    for name, value in zip(("d_hidden", "d_weight", "d_bias"), got[1:]):
        out[name] = _cards._sha([value])
    return out


def _lm_head_cases():
    base = [
        "rows=1 vocab=2 width=1 grad=1",
        "rows=3 vocab=5 width=3 bias=1 grad=1",
        "rows=129 vocab=1000 width=67 ignore=0.1 grad=1",
        "rows=1023 vocab=257 width=31 bias=1 smoothing=0.1 ignore=0.2 grad=1",
        "rows=2049 vocab=129 width=65 bias=1 ignore=0.1 reduction=sum grad=1",
        "rows=3000 vocab=64 width=16 ignore=0.05 num_items=5000 grad=1",
        "rows=5000 vocab=33 width=7 bias=1 smoothing=0.2 grad=1",
        "rows=300 vocab=4097 width=20 ignore=0.1 reduction=none",
        "rows=64 vocab=50 width=8 ignore=1 grad=1",                      # every row ignored
        "rows=600 vocab=300 width=40 h=-2**-64,2**-64 bias=1 grad=1",   # subnormal products, -0.0 chains
        "rows=257 vocab=700 width=24 h=-30,30 smoothing=0.05 grad=1",   # large logits
        "rows=40 vocab=50304 width=16 grad=1",                           # GPT-2's vocabulary
        # rows too long for a GPU's shared memory (global-memory rows, dlogits in place of
        # the logits), odd and 16-byte multiples
        "rows=20 vocab=60001 width=24 smoothing=0.1 ignore=0.1 grad=1",
        "rows=9 vocab=60000 width=8 grad=1",
        "rows=300 vocab=200 width=24 h=-2**-127,2**-127 bias=1 grad=1",  # subnormal inputs (identical_ftz reads 0)
    ]
    specs = []
    for b in base:          # one seed per case: its chunked lines draw the same inputs
        seeded = _cards._seeded("linear_cross_entropy " + b)
        specs.append(seeded)
        rows = int(b.split()[0].split("=")[1])
        for chunk in sorted({1 if rows < 200 else 97, 1024, rows}):
            if chunk <= rows:
                specs.append("%s chunk=%d" % (seeded, chunk))
    return specs


_cards.register("lm_head", "loss v1 + dense v1", _lm_head_cases,
                {"linear_cross_entropy": (_KEYS, _REQUIRED, _outputs, _run)},
                ["Inputs: hidden from stream 3, weight stream 4, bias stream 5, targets as the loss card",
                 "(streams 1 and 2); unset keys take the public API defaults (see _cards_lm_head.py)."])
