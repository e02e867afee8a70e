"""Cards of the clip (fixtures/clip.card): clip_grad_norm_ and the per-tensor norms, their keys,
cases and runner, registered with _cards.

A case names the tensor sizes (``0`` is an empty tensor), the range of the gradients (``g=``,
drawn from stream 1), ``max_norm`` and optionally ``norm_type`` (2, 1 or inf),
``error_if_nonfinite`` (0 or 1) and ``put=`` (``j:i:value,...``: gradient element i of tensor j
set to value, ``nan``, ``inf`` or ``-inf`` allowed, after the draw). Outputs: the per-tensor
norms and their total from ``mt_grad_norms``, then the gradients clipped in place by
``clip_grad_norm_`` and the total it returns (``refused: ValueError`` when it refuses), on the
selected vendor's identical numeric mode.
"""
import struct

import mojo_train

from . import _card_format as _cards
from . import _native
from ._array import Array
from .device import DeviceArray

UNIT, SUB, SUB_SQ, BIG = _cards.UNIT, _cards.SUB, _cards.SUB_SQ, _cards.BIG
_REFUSED = b"refused: ValueError"


def _outputs(case):
    return ("tensor_norms", "norms_total", "grads", "total")


def _norm_type(text):
    """``2``, ``1`` or ``inf``."""
    if text not in ("2", "1", "inf"):
        raise ValueError("%r is not 2, 1 or inf" % text)
    return float(text)


def _bits(text):
    """The float32 bits of a value (``nan``, ``inf``, ``-inf`` or a number): equal for equal
    values, NaN included, so that a case read twice is the same case."""
    v = float(text) if text in ("nan", "inf", "-inf") else _cards._number(text)
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _puts(text):
    """``j:i:value,...`` as ((j, i, float32 bits of value), ...)."""
    out = []
    for item in text.split(","):
        j, i, v = item.split(":")
        out.append((_cards._count(j), _cards._count(i), _bits(v)))
    return tuple(out)


def _grads(case, backend):
    """The case's gradients: the non-empty ones drawn as _cards._filled draws them (an empty
    tensor takes no elements of the stream), the empty ones in their places, then ``put=``."""
    sizes = case.args["sizes"]
    drawn = iter(_cards._filled(backend, case._replace(args=dict(case.args, sizes=[n for n in sizes if n])), 1,
                                case.args["g"]))
    empty = (lambda: DeviceArray((0,), "float32", numeric_mode=_cards.mode())) if _cards._ON_DEVICE else \
        (lambda: Array((0,), "float32"))
    grads = [next(drawn) if n else empty() for n in sizes]
    ffi = _native.ffi
    for j, i, v in case.args.get("put", ()):
        if i >= sizes[j]:
            raise ValueError("put=%d:%d: tensor %d has %d elements" % (j, i, j, sizes[j]))
        address = grads[j].ptr if _cards._ON_DEVICE else grads[j].address
        backend.check(backend.lib.mt_memcpy(ffi.cast("void *", address + 4 * i), ffi.new("uint32_t *", v), 4),
                      "mt_memcpy")
    return grads


def _address(g):
    return g.ptr if isinstance(g, DeviceArray) else g.address


def _run_clip(case, backend):
    grads = _grads(case, backend)
    p = case.args.get("norm_type", 2.0)
    n, ffi = len(grads), _native.ffi
    offsets = [0]
    for g in grads:
        offsets.append(offsets[-1] + g.size)
    offsets = Array.from_list(offsets, "int32")
    table = ffi.new("float *[]", [ffi.cast("float *", _address(g)) for g in grads])
    norms, total = Array((n,), "float32"), Array((1,), "float32")
    rc = backend.lib.mt_grad_norms(ffi.cast("float *", norms.address), ffi.cast("float *", total.address),
                                   table, ffi.cast("int32_t *", offsets.address), p, n)
    backend.check(rc, "mt_grad_norms")
    kwargs = {"error_if_nonfinite": case.args["error_if_nonfinite"]} if "error_if_nonfinite" in case.args else {}
    try:
        raw = _cards._f32(mojo_train.clip_grad_norm_(grads, case.args["max_norm"], p, numeric_mode=_cards.mode(),
                                                     **kwargs))
    except ValueError:
        raw = _REFUSED
    return {"tensor_norms": _cards._sha([norms]), "norms_total": _cards._sha([total]), "grads": _cards._sha(grads),
            "total": _cards._sha(raw=raw)}


def _clip_cases():
    lists = ("1", "3", "1023", "4096", "4097", str(BIG), "1,3,1023,4096,4097", "999x67,1000x66,1001x67")
    specs = []
    for sizes in lists:
        small = "0.01" if sizes in ("1", "3") else "1.0"
        for max_norm in (small, "1e6", "0"):
            specs.append("clip sizes=%s g=%s max_norm=%s" % (sizes, UNIT, max_norm))
    for sizes in ("1023", "4097", "1,3,1023,4096,4097"):
        for max_norm in ("1e-9", "1.0", "0"):     # the total is 0: only max_norm < 1e-6 scales
            specs.append("clip sizes=%s g=%s max_norm=%s" % (sizes, SUB, max_norm))
    for sizes in ("1023", "4097", "999x67,1000x66,1001x67"):
        for max_norm in ("1e-20", "1.0"):       # subnormal squares summed by the tree
            specs.append("clip sizes=%s g=%s max_norm=%s" % (sizes, SUB_SQ, max_norm))
    # Large magnitudes, kept where the sum of squares stays below float32's max (no overflow).
    large = [("3", "1e18"), ("1,3,200", "1e18"), ("100x3", "1e18"), ("1023", "1e17"),
             ("4096", "1e17"), ("4097", "1e17"), (str(BIG), "1e16"), ("999x67,1000x66,1001x67", "1e16")]
    for sizes, mag in large:
        for max_norm in ("1.0", "1e30"):
            specs.append("clip sizes=%s g=-%s,%s max_norm=%s" % (sizes, mag, mag, max_norm))
    # Hundreds to thousands of tensors: the vector of norms has full rows and several chunks.
    # Many tensors of >= 3 rows each are also what sees a changed summation order: one norm
    # shows a one-ulp change of its sum of squares only now and then (sqrt and the coarser
    # roundings up the tree absorb most), a few hundred norms almost surely show one.
    specs += ["clip sizes=3x5000 g=-1,1 max_norm=1.0", "clip sizes=3x5000 g=-1,1 max_norm=1e6",
              "clip sizes=300x300 g=-1,1 max_norm=1.0", "clip sizes=1x4097 g=-1,1 max_norm=1e6",
              "clip sizes=3x5000 g=-1e17,1e17 max_norm=1.0", "clip sizes=4097x40 g=-1,1 max_norm=1.0",
              "clip sizes=257x400,1023x100 g=-1,1 max_norm=0",
              "clip sizes=1023x100 g=-1e16,1e16 max_norm=1e30"]
    return [_cards._seeded(s) for s in specs + _norm_type_specs()]


def _norm_type_specs():
    """Issue 13: the 1-norm and the max norm, empty tensors, and non-finite totals clipped
    (error_if_nonfinite=0, torch's default) or refused (1), for every norm type."""
    specs = []
    odd = ("1", "3", "1023", "4096", "4097", str(BIG), "1,3,1023,4096,4097", "999x67,1000x66,1001x67",
           "300x300", "3x5000", "4097x40", "257x400,1023x100")
    for sizes in odd:
        for p, max_norms in (("1", ("1.0", "1e9")), ("inf", ("0.5", "1e9"))):
            for max_norm in max_norms:
                specs.append("clip sizes=%s g=%s max_norm=%s norm_type=%s" % (sizes, UNIT, max_norm, p))
    for p in ("2", "1", "inf"):
        for sizes in ("0,3,0,5", "0,1023,0x3,4097,0", "0", "0,0", "0x300,3x300"):   # empty tensors: norm 0
            specs.append("clip sizes=%s g=%s max_norm=0.5 norm_type=%s" % (sizes, UNIT, p))
        for sizes in ("1023", "4097", "1,3,1023,4096,4097"):        # subnormal gradients and coefficients
            for g, max_norm in ((SUB, "1e-40"), (SUB, "1.0"), (SUB_SQ, "1e-30")):
                specs.append("clip sizes=%s g=%s max_norm=%s norm_type=%s" % (sizes, g, max_norm, p))
        # 1e38: the 1-norm and the squares overflow to inf (coefficient 0: the gradients become
        # zeros), the max norm stays finite; refused with error_if_nonfinite=1.
        for sizes in ("3", "1023", "1,3,200", "0,4097,5"):
            for err in ("0", "1"):
                specs.append("clip sizes=%s g=-1e38,1e38 max_norm=1.0 norm_type=%s error_if_nonfinite=%s"
                             % (sizes, p, err))
        for put in ("2:100:nan", "3:7:inf", "3:4095:-inf", "0:0:nan,4:4096:inf", "4:4096:inf,0:0:-inf"):
            for err in ("0", "1"):
                specs.append("clip sizes=1,3,1023,4096,4097 g=%s max_norm=1.0 norm_type=%s error_if_nonfinite=%s "
                             "put=%s" % (UNIT, p, err, put))
        specs.append("clip sizes=0,5,0,999x3 g=%s max_norm=1.0 norm_type=%s put=4:998:nan" % (UNIT, p))
    return specs


_cards.register("clip", "clip v1", _clip_cases, {
    "clip": (dict(_cards._INPUT_KEYS, sizes=_cards._sizes_or_empty, max_norm=_cards._number, norm_type=_norm_type,
                  error_if_nonfinite=_cards._flag, put=_puts),
             ("seed", "sizes", "g", "max_norm"), _outputs, _run_clip),
}, _cards._LIST_NOTES)
