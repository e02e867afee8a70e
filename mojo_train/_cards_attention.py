"""Cards of attention (contract attention v1, native/contracts/attention.md): their cases,
inputs and runners, registered with _cards as the card ``attention`` (fixtures/attention.card).

A case names its sizes (``b h hkv tq tk d``) and input ranges: q and k from streams 0 and 1 in
``qk=``, v from stream 2 in ``v=``, dout from stream 3 in ``do=``, each tensor in C order from
offset 0. ``mask=`` adds a mask: ``b2``/``f2`` of shape (Tq, Tk), ``b4``/``f4`` (B, H, Tq, Tk),
``f3`` (H, Tq, Tk), ``kp`` (B, 1, 1, Tk) (a key-padding mask); ``b*``/``kp`` are bool, ``f*``
float. A pair is kept where u < ``keep=`` (u from stream 5 in [0, 1), one per mask element);
a float mask's kept values come from stream 4 in ``m=``, the others are -inf. ``dead=N``
masks every query row i with i % N == 0 entirely (fully masked rows). ``causal=1``:
is_causal. ``scale=``: the scale (default 1/sqrt(D)). ``drop=``: dropout_p, drawn from stream
6 of the case's seed (a Generator whose counter stands at 6; attention.md "Dropout"). One line
runs the forward (return_lse=True) and the backward on its out and lse (and dropout key), and
digests out, lse, dq, dk, dv.
"""
from . import _card_format as _cards
from ._array import Array
from .device import to_device
from .attention import scaled_dot_product_attention, scaled_dot_product_attention_backward
from .random import Generator

CONTRACT = "attention v1"
_STREAMS = {"q": 0, "k": 1, "v": 2, "do": 3, "m": 4, "keep": 5, "drop": 6}
_MASK_SHAPES = {"b2": lambda a: (a["tq"], a["tk"]), "f2": lambda a: (a["tq"], a["tk"]),
                "b4": lambda a: (a["b"], a["h"], a["tq"], a["tk"]), "f4": lambda a: (a["b"], a["h"], a["tq"], a["tk"]),
                "f3": lambda a: (a["h"], a["tq"], a["tk"]), "kp": lambda a: (a["b"], 1, 1, a["tk"])}
_OUTPUTS = ("out", "lse", "dq", "dk", "dv")


_KEYS = {"seed": _cards._count, "b": _cards._count, "h": _cards._count, "hkv": _cards._count,
         "tq": _cards._count, "tk": _cards._count, "d": _cards._count, "qk": _cards._pair, "v": _cards._pair,
         "do": _cards._pair, "causal": _cards._flag, "mask": _cards._choice(*sorted(_MASK_SHAPES)),
         "keep": _cards._fraction, "m": _cards._pair, "dead": _cards._count, "scale": _cards._number,
         "drop": _cards._fraction}


def _draw(backend, case, name, shape, bounds):
    n = 1
    for dim in shape:
        n *= dim
    spec = _cards.Case("draw", {"seed": case.args["seed"], "sizes": (n,)}, "")
    return _cards._filled(backend, spec, _STREAMS[name], bounds)[0].reshape(shape)


def _floats(x):
    if _cards._ON_DEVICE:
        x = x.to_host()
    return x.memview().cast("B").cast("f").tolist() if x.size else []


_DL_METAL = 8   # DLPack's kDLMetal


class _DeviceBoolMask:
    """A bool mask in device memory for cards run on device buffers: a uint8 DeviceArray whose
    bytes are the mask, exported as bool: through ``__cuda_array_interface__`` (``|b1``) on CUDA
    and HIP, as a torch CUDA bool tensor is; on Metal through DLPack with DLPack's Metal device
    type, so that it counts as device memory (the Metal host layer finds its address inside the
    allocation)."""

    def __init__(self, keep, shape):
        self._bytes = to_device(Array.from_list([int(k) for k in keep], "uint8").reshape(shape), _cards.mode())
        self.shape = shape

    @property
    def __cuda_array_interface__(self):
        return dict(self._bytes.__cuda_array_interface__, typestr="|b1")   # AttributeError on Metal

    def __dlpack__(self, stream=None, **kwargs):
        from . import _dlpack
        self._bytes._complete()
        kind, dev = self.__dlpack_device__()
        return _dlpack.export_capsule(self._bytes.ptr, self.shape, "bool", kind, dev, self)

    def __dlpack_device__(self):
        kind, dev = self._bytes.__dlpack_device__()
        return (_DL_METAL if kind == 1 else kind, dev)   # kDLCPU: a Metal DeviceArray's shared storage


def _mask(backend, case):
    """The case's mask (a bool memoryview or a float32 Array), or None."""
    a = case.args
    if "mask" not in a:
        return None
    kind, shape = a["mask"], _MASK_SHAPES[a["mask"]](a)
    keep = [u < a.get("keep", 1.0) for u in _floats(_draw(backend, case, "keep", shape, (0.0, 1.0)))]
    tq, tk, dead = a["tq"], a["tk"], a.get("dead", 0)
    if dead and kind != "kp":
        keep = [k and ((e // tk) % tq) % dead != 0 for e, k in enumerate(keep)]   # row i = (e // Tk) % Tq
    if kind[0] != "f":
        if _cards._ON_DEVICE:
            return _DeviceBoolMask(keep, shape)
        return memoryview(bytearray(keep)).cast("?", shape)
    values = _floats(_draw(backend, case, "m", shape, a.get("m", (0.0, 0.0))))
    mask = Array.from_list([x if k else float("-inf") for x, k in zip(values, keep)], "float32").reshape(shape)
    return to_device(mask, _cards.mode()) if _cards._ON_DEVICE else mask


def _run(case, backend):
    a = case.args
    qshape, kvshape = (a["b"], a["h"], a["tq"], a["d"]), (a["b"], a["hkv"], a["tk"], a["d"])
    q, k = _draw(backend, case, "q", qshape, a["qk"]), _draw(backend, case, "k", kvshape, a["qk"])
    v, dout = _draw(backend, case, "v", kvshape, a["v"]), _draw(backend, case, "do", qshape, a["do"])
    kw = dict(attn_mask=_mask(backend, case), is_causal=a.get("causal", False), scale=a.get("scale"),
              enable_gqa=a["h"] != a["hkv"], numeric_mode=_cards.mode())
    drop = {}
    if a.get("drop", 0.0) > 0.0:
        g = Generator(a["seed"], numeric_mode=_cards.mode())
        for _ in range(_STREAMS["drop"]):
            g.next_stream()
        drop = {"dropout_p": a["drop"], "generator": g}
    out, lse, *key = scaled_dot_product_attention(q, k, v, return_lse=True, **kw, **drop)
    grads = scaled_dot_product_attention_backward(dout, q, k, v, out, lse, dropout_key=key[0] if key else None,
                                                  **kw)
    return {name: _cards._sha([x]) for name, x in zip(_OUTPUTS, (out, lse) + tuple(grads))}


# (b, h, hkv, tq, tk, d): T = 1 on either side, odd sizes, block edges (64, 65, 129), Tq != Tk,
# grouped-query heads (2, 3, 4 query heads per kv head), D up to 128.
_SHAPES = [(1, 1, 1, 1, 1, 1), (1, 1, 1, 1, 1, 64), (2, 3, 3, 5, 7, 3), (1, 2, 2, 1, 130, 5), (1, 2, 2, 130, 1, 5),
           (2, 2, 2, 67, 67, 33), (1, 3, 3, 64, 64, 64), (1, 2, 2, 65, 129, 17), (1, 4, 2, 100, 70, 24),
           (2, 6, 2, 33, 95, 8), (1, 4, 1, 50, 50, 16), (1, 2, 2, 40, 200, 128), (1, 1, 1, 300, 300, 64)]
_UNIT = "qk=-1,1 v=-1,1 do=-1,1"


def _attention_cases():
    specs = []
    for b, h, hkv, tq, tk, d in _SHAPES:
        size = "b=%d h=%d hkv=%d tq=%d tk=%d d=%d" % (b, h, hkv, tq, tk, d)
        specs += ["attention %s %s" % (size, _UNIT), "attention %s %s causal=1" % (size, _UNIT),
                  "attention %s %s mask=b2 keep=0.7 dead=5" % (size, _UNIT),
                  "attention %s %s mask=f4 m=-2,2 keep=0.8 dead=7" % (size, _UNIT),
                  "attention %s qk=-8,8 v=-1,1 do=-1,1" % size]                 # large logits
    specs += [
        "attention b=2 h=2 hkv=2 tq=70 tk=90 d=16 %s mask=kp keep=0.6" % _UNIT,          # key padding
        "attention b=1 h=3 hkv=3 tq=33 tk=65 d=7 %s mask=f3 m=-30,30 keep=1" % _UNIT,     # mask sets the scale
        "attention b=1 h=2 hkv=2 tq=20 tk=70 d=9 %s mask=b4 keep=0.02" % _UNIT,           # many fully masked rows
        "attention b=1 h=2 hkv=1 tq=9 tk=130 d=5 %s mask=b2 keep=0 " % _UNIT,             # every row fully masked
        "attention b=1 h=2 hkv=2 tq=2 tk=0 d=4 %s" % _UNIT,                               # no keys at all
        "attention b=1 h=2 hkv=2 tq=40 tk=150 d=64 qk=-1000,1000 v=-1,1 do=-1,1",         # one-hot rows, exp underflow
        "attention b=1 h=2 hkv=2 tq=40 tk=150 d=64 qk=-30,30 v=-1,1 do=-1,1 causal=1",
        "attention b=1 h=2 hkv=2 tq=33 tk=77 d=12 qk=-1,1 v=%s do=-1,1" % _cards.SUB,     # subnormal v
        "attention b=1 h=2 hkv=2 tq=33 tk=77 d=12 qk=%s v=-1,1 do=%s" % (_cards.SUB_SQ, _cards.SUB_SQ),
        "attention b=1 h=2 hkv=2 tq=50 tk=50 d=20 %s scale=0.05" % _UNIT,
        "attention b=1 h=2 hkv=2 tq=50 tk=50 d=20 %s scale=-1.5 causal=1" % _UNIT,
        "attention b=1 h=2 hkv=2 tq=50 tk=50 d=20 %s scale=0" % _UNIT,
        "attention b=1 h=8 hkv=2 tq=130 tk=129 d=128 %s causal=1" % _UNIT,
        # dropout: causal, masks with dead rows, grouped-query heads, both column groups, p near 0 and 1
        "attention b=2 h=2 hkv=2 tq=67 tk=67 d=33 %s causal=1 drop=0.25" % _UNIT,
        "attention b=1 h=4 hkv=2 tq=100 tk=70 d=24 %s mask=f4 m=-2,2 keep=0.8 dead=7 drop=0.5" % _UNIT,
        "attention b=1 h=2 hkv=2 tq=65 tk=129 d=17 %s mask=b2 keep=0.7 dead=5 drop=0.1" % _UNIT,
        "attention b=1 h=2 hkv=2 tq=40 tk=200 d=128 %s drop=0.9" % _UNIT,
        "attention b=1 h=2 hkv=1 tq=130 tk=130 d=64 qk=-8,8 v=-1,1 do=-1,1 causal=1 drop=0.01",
    ]
    return [_cards._seeded(" ".join(s.split())) for s in specs]


_cards.register("attention", CONTRACT, _attention_cases, {
    "attention": (_KEYS, ("seed", "b", "h", "hkv", "tq", "tk", "d", "qk", "v", "do"), _cards._named(*_OUTPUTS), _run),
}, ["q, k from streams 0, 1 in qk=; v from stream 2 in v=; dout from stream 3 in do= (low,high; C order from",
    "offset 0). mask= b2/f2 (Tq,Tk), b4/f4 (B,H,Tq,Tk), f3 (H,Tq,Tk), kp (B,1,1,Tk): kept where stream 5's",
    "u < keep=, float values from stream 4 in m= (else -inf); dead=N masks rows i % N == 0. drop=p: dropout_p",
    "from stream 6 of the seed. Outputs: out, lse of the forward (return_lse=True), dq, dk, dv of the backward."])
