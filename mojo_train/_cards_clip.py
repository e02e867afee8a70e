"""Cards of the clip (fixtures/clip.card): clip_grad_norm_ and the per-tensor norms, their keys,
cases and runner, registered with _cards.

A case names the tensor sizes, the range of the gradients (``g=``, drawn from stream 1) and
``max_norm``. Outputs: the per-tensor norms and their total from ``mt_grad_norms``, then the
gradients clipped in place by ``clip_grad_norm_`` and the total it returns, on the selected
vendor's identical numeric mode.
"""
import mojo_train

from . import _card_format as _cards
from . import _native
from ._array import Array

UNIT, SUB, SUB_SQ, BIG = _cards.UNIT, _cards.SUB, _cards.SUB_SQ, _cards.BIG


def _outputs(case):
    return ("tensor_norms", "norms_total", "grads", "total")


def _run_clip(case, backend):
    grads = _cards._filled(backend, case, 1, case.args["g"])
    n, ffi = len(grads), _native.ffi
    offsets = [0]
    for g in grads:
        offsets.append(offsets[-1] + g.size)
    offsets = Array.from_list(offsets, "int32")
    table = ffi.new("float *[]", [ffi.cast("float *", g.ptr if _cards._ON_DEVICE else g.address) for g in grads])
    norms, total = Array((n,), "float32"), Array((1,), "float32")
    rc = backend.lib.mt_grad_norms(ffi.cast("float *", norms.address), ffi.cast("float *", total.address),
                                   table, ffi.cast("int32_t *", offsets.address), n)
    backend.check(rc, "mt_grad_norms")
    clipped_total = mojo_train.clip_grad_norm_(grads, case.args["max_norm"], numeric_mode="identical")
    return {"tensor_norms": _cards._sha([norms]), "norms_total": _cards._sha([total]), "grads": _cards._sha(grads),
            "total": _cards._sha(raw=_cards._f32(clipped_total))}


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
    return [_cards._seeded(s) for s in specs]


_cards.register("clip", "clip v1", _clip_cases, {
    "clip": (dict(_cards._INPUT_KEYS, max_norm=_cards._number), ("seed", "sizes", "g", "max_norm"), _outputs,
             _run_clip),
}, _cards._LIST_NOTES)
