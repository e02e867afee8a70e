"""Cards of cross_entropy (card ``loss``, contract loss v1): cases, inputs and the runner,
registered with _cards.

A case ``cross_entropy seed=S rows=N vocab=V x=low,high ...`` draws everything from the
library's Philox (mt_uniform_fill of mt_pinned.h), nothing from disk:

- logits (N, V), row-major: stream 0 of seed S, uniform in [low, high);
- targets: u_i = element i of stream 1 in [0, 1) (a multiple of 2^-24, exact), and
  targets[i] = floor(u_i * V), computed exactly as (u_i * 2^24 * V) >> 24;
- ignored rows: w_i = element i of stream 2 in [0, 1); row i is ignored (its target set to
  ignore_index) when w_i < ignore. A drawn target equal to ignore_index is ignored too.

Keys beyond those: ignore (fraction, default 0), ignore_index (default -100), reduction
(none/sum/mean, default mean), smoothing (default 0), num_items (mean only), grad (0/1:
return_grad), tbytes (4: int32 targets, 8: int64, the default). Outputs: ``loss`` (the
float32 bytes of a mean or sum), ``row_loss`` (reduction=none), ``dlogits`` (grad=1).

The keys of the full form (mt_cross_entropy_nd; absent in the first cases, whose inputs they
leave as they were):

- dims=d1,d2,...: positions; logits (rows, vocab, d1, ...) from stream 0, targets (rows, d1,
  ...) drawn as above over the rows * d1 * ... positions in row-major order;
- unbatched=1: logits (vocab,) (rows=1) and a 0-d target (or probabilities (vocab,));
- weight=low,high: class weights, element j of stream 3 in [low, high); wzero=f: weight j is
  +0.0 where element j of stream 4 in [0, 1) is < f;
- soft=low,high: probability targets of the logits' shape from stream 5 in [low, high)
  (ignore is then not used); soft=onehot: exact one-hot rows of the drawn targets.
"""
import mojo_train

from . import _card_format as _cards
from . import _native
from ._array import Array
from .device import DeviceArray

_REDUCTIONS = ("none", "sum", "mean")


def _integer(text):
    return int(text)


def _tbytes(text):
    if text not in ("4", "8"):
        raise ValueError("%r is not 4 or 8" % text)
    return int(text)


def _dims(text):
    dims = tuple(_cards._count(d) for d in text.split(","))
    if 0 in dims:
        raise ValueError("%r has an empty position dimension" % text)
    return dims


def _soft(text):
    return "onehot" if text == "onehot" else _cards._pair(text)


_KEYS = {"seed": _cards._count, "rows": _cards._count, "vocab": _cards._count, "x": _cards._pair,
         "ignore": _cards._fraction, "ignore_index": _integer, "reduction": _cards._choice(*_REDUCTIONS),
         "smoothing": _cards._number, "num_items": _cards._count, "grad": _cards._flag,
         "tbytes": _tbytes, "dims": _dims, "unbatched": _cards._flag, "weight": _cards._pair,
         "wzero": _cards._fraction, "soft": _soft}
_REQUIRED = ("seed", "rows", "vocab", "x")


def _outputs(case):
    names = ["row_loss"] if case.args.get("reduction", "mean") == "none" else ["loss"]
    if case.args.get("grad", False):
        names.append("dlogits")
    return names


def _uniform(backend, seed, stream, low, high, n):
    """n floats of (seed, stream) from offset 0, on the device when cards run there."""
    return _cards.draw(backend, seed, stream, (low, high), n)


def _host(a):
    return a.to_host() if isinstance(a, DeviceArray) else a


def _positions(args):
    p = 1
    for d in args.get("dims", ()):
        p *= d
    return p


def targets_for(backend, args):
    """The case's targets as a host list of ints, one per position (see the module docstring)."""
    n, vocab, seed = args["rows"] * _positions(args), args["vocab"], args["seed"]
    ignore_index = args.get("ignore_index", -100)
    u = _host(_uniform(backend, seed, 1, 0.0, 1.0, n)).tolist() if n else []
    w = _host(_uniform(backend, seed, 2, 0.0, 1.0, n)).tolist() if n else []
    frac = args.get("ignore", 0.0)
    return [ignore_index if w[i] < frac else (int(u[i] * 2 ** 24) * vocab) >> 24 for i in range(n)]


def _placed(a):
    return mojo_train.to_device(a, numeric_mode=_cards.mode()) if _cards._ON_DEVICE else a


def _logits_shape(args):
    if args.get("unbatched", False):
        if args["rows"] != 1:
            raise ValueError("unbatched=1 needs rows=1")
        return (args["vocab"],)
    return (args["rows"], args["vocab"]) + args.get("dims", ())


def _weight(backend, args):
    """The case's class weights (None without weight=): stream 3, zeros where stream 4 < wzero."""
    if "weight" not in args:
        return None
    vocab, seed = args["vocab"], args["seed"]
    w = _host(_uniform(backend, seed, 3, args["weight"][0], args["weight"][1], vocab)).tolist()
    z = _host(_uniform(backend, seed, 4, 0.0, 1.0, vocab)).tolist()
    frac = args.get("wzero", 0.0)
    return _placed(Array.from_list([0.0 if z[j] < frac else w[j] for j in range(vocab)], "float32"))


def _targets(backend, args, shape):
    """Index targets of the rows' shape, or probabilities of the logits' shape (soft=)."""
    if "soft" not in args:
        rows = () if args.get("unbatched", False) else shape[:1] + shape[2:]
        t = Array.from_list(targets_for(backend, args), "int32" if args.get("tbytes", 8) == 4 else "int64")
        return _placed(t.reshape(*rows))
    n = 1
    for d in shape:
        n *= d
    if args["soft"] != "onehot":
        return _uniform(backend, args["seed"], 5, args["soft"][0], args["soft"][1], n).reshape(*shape)
    vocab, p = args["vocab"], _positions(args)
    y = [0.0] * n
    for r, t in enumerate(targets_for(backend, args)):
        y[((r // p) * vocab + t) * p + r % p] = 1.0
    return _placed(Array.from_list(y, "float32").reshape(*shape))


def _run(case, backend):
    args = case.args
    shape = _logits_shape(args)
    n = 1
    for d in shape:
        n *= d
    logits = _uniform(backend, args["seed"], 0, args["x"][0], args["x"][1], n).reshape(*shape)
    targets, weight = _targets(backend, args, shape), _weight(backend, args)
    reduction, grad = args.get("reduction", "mean"), args.get("grad", False)
    got = mojo_train.cross_entropy(logits, targets, weight=weight, ignore_index=args.get("ignore_index", -100),
                                   reduction=reduction, label_smoothing=args.get("smoothing", 0.0),
                                   num_items=args.get("num_items"), return_grad=grad, numeric_mode=_cards.mode())
    loss, dlogits = got if grad else (got, None)
    out = {"row_loss": _cards._sha([loss])} if reduction == "none" else {"loss": _cards._sha(raw=_cards._f32(loss))}
    if grad:
        out["dlogits"] = _cards._sha([dlogits])
    return out


# ---- the cases ------------------------------------------------------------------------------
UNIT = "-4,4"
WIDE = "-60,60"                  # e^(x - m) down to e^-120: subnormal terms and zeros in the sums
SUB = "-2**-140,2**-140"         # subnormal logits: every e^(x - m) rounds to 1
BIG = "-1e4,1e4"                 # only the few largest logits of a row count
HUGE = "-1e30,1e30"
LM = 50304                       # GPT-2's padded vocabulary


def _loss_cases():
    specs = []
    shapes = [(1, 1), (3, 2), (1, 50), (3, 1000), (17, 4096), (5, 4097), (1023, 129), (2049, 384),
              (3, LM), (40, 12289)]
    for rows, vocab in shapes:
        for opts in ("reduction=mean grad=1", "reduction=sum grad=1", "reduction=none"):
            specs.append("cross_entropy rows=%d vocab=%d x=%s ignore=0.1 %s" % (rows, vocab, UNIT, opts))
    specs += [
        # label smoothing, with and without the gradient, every reduction
        "cross_entropy rows=67 vocab=%d x=%s smoothing=0.1 reduction=mean grad=1" % (LM, UNIT),
        "cross_entropy rows=1023 vocab=1000 x=%s ignore=0.25 smoothing=0.5 reduction=sum grad=1" % UNIT,
        "cross_entropy rows=300 vocab=4097 x=%s smoothing=0.9 reduction=none" % UNIT,
        "cross_entropy rows=2100 vocab=777 x=%s ignore=0.05 smoothing=0.2 reduction=mean" % WIDE,
        # num_items (the mean's divisor given), int32 targets, ignore_index a valid class
        "cross_entropy rows=1023 vocab=1000 x=%s ignore=0.3 num_items=4000 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=130 vocab=%d x=%s num_items=1 reduction=mean grad=1 tbytes=4" % (LM, UNIT),
        "cross_entropy rows=1023 vocab=1000 x=%s ignore=0.1 reduction=mean grad=1 tbytes=4" % UNIT,
        "cross_entropy rows=500 vocab=3 x=%s ignore_index=1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=513 vocab=999 x=%s ignore=0.2 ignore_index=7 reduction=sum grad=1" % UNIT,
        # every row ignored: the mean is the canonical NaN, the gradient all +0.0
        "cross_entropy rows=64 vocab=500 x=%s ignore=1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=64 vocab=500 x=%s ignore=1 reduction=sum grad=1" % UNIT,
        # many rows: several token leaves (1024 rows each) in the reduction
        "cross_entropy rows=5000 vocab=257 x=%s ignore=0.1 reduction=sum grad=1" % UNIT,
        "cross_entropy rows=4097 vocab=1000 x=%s ignore=0.1 reduction=mean" % WIDE,
        # magnitudes: e^(x - m) underflowing to subnormals and zero; subnormal logits
        "cross_entropy rows=1023 vocab=1000 x=%s reduction=mean grad=1" % WIDE,
        "cross_entropy rows=100 vocab=%d x=%s ignore=0.1 reduction=sum grad=1" % (LM, WIDE),
        "cross_entropy rows=129 vocab=4097 x=%s reduction=mean grad=1" % SUB,
        "cross_entropy rows=129 vocab=4097 x=%s smoothing=0.1 reduction=none" % SUB,
        "cross_entropy rows=1023 vocab=385 x=%s ignore=0.1 reduction=sum grad=1" % BIG,
        "cross_entropy rows=9 vocab=%d x=%s smoothing=0.3 reduction=mean grad=1" % (LM, BIG),
        "cross_entropy rows=1023 vocab=385 x=%s ignore=0.1 reduction=mean grad=1" % HUGE,
        "cross_entropy rows=9 vocab=%d x=%s smoothing=0.3 reduction=none" % (LM, HUGE),
        # empty batch
        "cross_entropy rows=0 vocab=10 x=%s reduction=sum grad=1" % UNIT,
        "cross_entropy rows=0 vocab=10 x=%s reduction=mean" % UNIT,
        # a row shared by a cluster of 2, 4 and 8 blocks on CUDA (k_ce_rows_cluster), and more rows
        # than an H200 holds clusters of 2 (66): each block's two buffers and exchanged words reused
        "cross_entropy rows=300 vocab=%d x=%s ignore=0.1 reduction=sum grad=1" % (LM, UNIT),
        "cross_entropy rows=5 vocab=60000 x=%s ignore=0.2 smoothing=0.1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=3 vocab=128256 x=%s ignore=0.1 reduction=sum grad=1" % UNIT,
    ]
    specs += _nd_cases()
    return [_cards._seeded(" ".join(s.split())) for s in specs]


def _nd_cases():
    """The full form (mt_cross_entropy_nd): class weights, probability targets, positions."""
    every = ("reduction=mean grad=1", "reduction=sum grad=1", "reduction=none")
    specs = []
    for opts in every:
        specs += ["cross_entropy rows=67 vocab=1000 x=%s weight=0,2 ignore=0.1 %s" % (UNIT, opts),
                  "cross_entropy rows=67 vocab=1000 x=%s weight=0,2 ignore=0.1 smoothing=0.2 %s" % (UNIT, opts),
                  "cross_entropy rows=67 vocab=1000 x=%s soft=0,1 %s" % (UNIT, opts),
                  "cross_entropy rows=67 vocab=1000 x=%s soft=0,1 weight=0,2 smoothing=0.1 %s" % (UNIT, opts)]
        for d in ("1", "3", "7", "3,5"):
            specs += ["cross_entropy rows=5 vocab=300 dims=%s x=%s ignore=0.1 %s" % (d, UNIT, opts),
                      "cross_entropy rows=5 vocab=300 dims=%s x=%s weight=0,2 ignore=0.1 smoothing=0.1 %s"
                      % (d, UNIT, opts),
                      "cross_entropy rows=5 vocab=300 dims=%s x=%s soft=0,1 weight=0.5,1.5 %s" % (d, UNIT, opts)]
    specs += [
        # weights: zeros among them, negative ones, a large vocabulary, several chunks, num_items, int32
        "cross_entropy rows=33 vocab=4097 x=%s weight=0,2 wzero=0.3 ignore=0.2 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=1023 vocab=385 x=%s weight=-1,3 ignore=0.1 smoothing=0.2 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=5 vocab=%d x=%s weight=0.5,1.5 smoothing=0.1 reduction=mean grad=1" % (LM, UNIT),
        "cross_entropy rows=300 vocab=1000 x=%s weight=0,2 ignore=0.3 num_items=400 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=300 vocab=1000 x=%s weight=0,2 ignore=0.3 reduction=sum grad=1 tbytes=4" % UNIT,
        "cross_entropy rows=2100 vocab=257 x=%s weight=0,2 ignore=0.1 reduction=mean grad=1" % UNIT,
        # the mean of nothing: every row ignored, every target weight zero (NaN; zero weights: NaN gradients)
        "cross_entropy rows=64 vocab=500 x=%s weight=0,1 ignore=1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=64 vocab=500 x=%s weight=0,1 wzero=1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=64 vocab=500 x=%s weight=0,1 wzero=1 smoothing=0.1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=0 vocab=10 x=%s weight=0,1 reduction=mean" % UNIT,
        "cross_entropy rows=0 vocab=10 x=%s weight=0,1 reduction=sum grad=1" % UNIT,
        # probabilities: rows summing to other than 1, negative entries, smoothing, one-hot, no rows
        "cross_entropy rows=129 vocab=4097 x=%s soft=-0.5,1 smoothing=0.3 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=50 vocab=300 x=%s soft=onehot reduction=mean grad=1" % UNIT,
        "cross_entropy rows=50 vocab=300 x=%s soft=onehot reduction=none" % UNIT,
        "cross_entropy rows=3 vocab=%d x=%s soft=0,1 reduction=sum grad=1" % (LM, UNIT),
        "cross_entropy rows=1100 vocab=129 x=%s soft=0,1 num_items=7 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=0 vocab=10 x=%s soft=0,1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=0 vocab=10 x=%s soft=0,1 reduction=sum" % UNIT,
        # positions: many rows over the token leaves, several chunks, no batch entries, unbatched
        "cross_entropy rows=200 vocab=257 dims=7 x=%s weight=0,2 ignore=0.1 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=3 vocab=4097 dims=7 x=%s soft=0,1 smoothing=0.2 reduction=mean grad=1" % UNIT,
        "cross_entropy rows=0 vocab=10 dims=3 x=%s reduction=mean grad=1" % UNIT,
        "cross_entropy rows=1 vocab=1000 unbatched=1 x=%s reduction=mean grad=1" % UNIT,
        "cross_entropy rows=1 vocab=1000 unbatched=1 x=%s weight=0,2 reduction=none" % UNIT,
        "cross_entropy rows=1 vocab=1000 unbatched=1 x=%s soft=0,1 reduction=sum grad=1" % UNIT,
        # magnitudes: e^(x - m) down to zero, logits near 1e4 and 1e30
        "cross_entropy rows=100 vocab=1000 x=%s weight=0,2 smoothing=0.1 reduction=sum grad=1" % WIDE,
        "cross_entropy rows=100 vocab=1000 x=%s soft=0,1 reduction=mean grad=1" % WIDE,
        "cross_entropy rows=1023 vocab=385 x=%s weight=0,2 ignore=0.1 smoothing=0.3 reduction=mean grad=1" % BIG,
        "cross_entropy rows=9 vocab=%d x=%s soft=0,1 smoothing=0.3 reduction=mean grad=1" % (LM, BIG),
        "cross_entropy rows=50 vocab=385 dims=3 x=%s weight=0,2 ignore=0.1 reduction=mean grad=1" % HUGE,
        "cross_entropy rows=9 vocab=%d x=%s soft=0,1 weight=0,2 reduction=none" % (LM, HUGE),
        "cross_entropy rows=129 vocab=4097 x=%s weight=0,2 smoothing=0.1 reduction=mean grad=1" % SUB,
        "cross_entropy rows=129 vocab=4097 x=%s soft=0,1 reduction=none" % SUB,
    ]
    return specs


_cards.register("loss", "loss v1", _loss_cases,
                {"cross_entropy": (_KEYS, _REQUIRED, _outputs, _run)},
                ("logits (rows, vocab): stream 0 in [x); targets[i] = (u_i * 2^24 * vocab) >> 24 with u_i",
                 "element i of stream 1 in [0, 1); row i ignored (target = ignore_index, default -100)",
                 "when element i of stream 2 in [0, 1) is < ignore; unset options take the API defaults."))
