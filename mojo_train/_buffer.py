"""The tensor checks: what native code needs from a user buffer, refused by name otherwise.

Contract: ``probe`` (from _probe.py, re-exported here with ``Probe``) turns any buffer-protocol
object (array.array, memoryview, bytearray, numpy array, ...), a ``mojo_train.Array`` or a
device/DLPack tensor into a ``Probe`` describing its dtype, shape, size, writability, contiguity
and data address.  The tensor checks built on it refuse -- never cast, never
copy silently -- anything that is not what native code needs, with an
error naming the argument and saying the fix (``x.astype(np.float32)``,
``x.float()``, ``np.ascontiguousarray(x)``, ``x.contiguous()``, ``x.detach()``).
Each check takes the object or a Probe of it already made, so an entry point probes each
argument once. ``pack`` gives one flat float32 range over a list of tensors, borrowing their
memory when they already lie end to end.

torch tensors, recognised without importing torch, are read through DLPack
(CPU tensors get a memoryview, like any host buffer); one that requires grad is
read through ``x.detach()``, which shares its memory: nothing is copied. An
in-place target is updated (optimizer parameters, gradients: allowed, as torch's
optimizers do under no_grad) or written as an output (``out=``, ``grad=``:
refused while it requires grad in grad mode, as torch refuses ``out=``); after
a native call has written a torch tensor, ``wrote`` bumps its version counter
as torch's own in-place ops do, so autograd detects a stale saved tensor.
"""

import sys

from ._array import Array
from ._dtypes import INT_DTYPES, native_formats
from ._errors import where_msg
from ._probe import ffi as _ffi
# re-exported: callers take the probe and its helpers from here, with the checks built on them
from ._probe import Probe, cast_fix, contiguous_fix, is_torch_tensor, normalize_format, probe  # noqa: F401
from .device import DeviceArray

_INT32_MAX = 2 ** 31 - 1


class RequiresGradError(RuntimeError, ValueError):
    """An output argument that requires grad, refused in grad mode as torch refuses ``out=``
    (a RuntimeError there; a ValueError like every bad argument here)."""


def _check_layout(p, name, where, allow_empty, inplace=False):
    if p.nelems == 0 and not allow_empty:
        raise ValueError(where_msg(where, "%s is empty" % name))
    if not p.c_contiguous:
        written = (" (it is written in place: the copy then receives the result, not %s)" % name
                   if inplace else "")
        raise ValueError(where_msg(where, "%s must be C-contiguous (got a strided view of shape %r); "
                                   "%s%s" % (name, p.shape, contiguous_fix(p.obj, name), written)))


def _refuse_grad_output(p, name, where):
    """torch's rule for ``out=``: refuse an output that requires grad while grad mode is on."""
    t = p.versioned
    if t is not None and t.requires_grad and sys.modules["torch"].is_grad_enabled():
        raise RequiresGradError(where_msg(where, "%s requires grad, and an output written in place "
                                          "takes no part in autograd (torch refuses out= such "
                                          "tensors too); pass %s.detach() or call under "
                                          "torch.no_grad()" % (name, name)))


def _probed(x, name, where):
    """``x`` itself when it is a Probe (made once by the entry point), else its Probe."""
    return x if type(x) is Probe else probe(x, name, where)


def float32_tensor(x, name, where, *, inplace=False, allow_empty=False):
    """Probe ``x`` (or take its Probe) and require a C-contiguous native float32 buffer.

    TypeError for any other dtype (float64, float16, ints, big-endian...);
    ValueError when empty (unless ``allow_empty``), strided, or -- when
    ``inplace`` -- read-only. ``inplace=True``: an output written in place
    (``out=``), which a torch tensor requiring grad may not be in grad mode
    (RequiresGradError, as torch); ``inplace="update"``: a tensor updated in
    place as torch's optimizers update parameters (allowed). A torch tensor
    written either way needs ``wrote`` after the native call.
    """
    p = _probed(x, name, where)
    if p.dtype != "float32":
        raise TypeError(where_msg(where, "%s has dtype %s; mojo_train works in float32 only "
                                  "and never casts (%s)" % (name, p.dtype, cast_fix(p.obj, name, "float32"))))
    _check_layout(p, name, where, allow_empty, inplace)
    if inplace and p.readonly:
        raise ValueError(where_msg(where, "%s is written in place and must be "
                                   "writable (got a read-only buffer)" % name))
    if inplace is True:
        _refuse_grad_output(p, name, where)
    return p


def int_tensor(x, name, where):
    """Probe ``x`` (or take its Probe) and require a non-empty C-contiguous integer buffer."""
    p = _probed(x, name, where)
    if p.dtype not in INT_DTYPES:
        raise TypeError(where_msg(where, "%s has dtype %s; an integer dtype (int8..int64, "
                                  "uint8..uint64) is required and mojo_train never casts (%s)"
                                  % (name, p.dtype, cast_fix(p.obj, name, "int64"))))
    _check_layout(p, name, where, False)
    return p


class ProbeList(list):
    """The Probes ``tensor_list`` gives, with ``versioned``: the torch tensors among them,
    found once, so ``wrote`` costs nothing per step when there are none."""

    __slots__ = ("versioned",)

    def __init__(self, probes):
        super().__init__(probes)
        self.versioned = [p.versioned for p in probes if p.versioned is not None]


def wrote(*targets):
    """Call after a native call has written in-place targets: bumps the version counter of
    each torch tensor among them, as torch's own in-place ops do, so autograd refuses a
    backward through a tensor saved before the write. A target is a Probe, a ProbeList or
    an object holding one as ``.probes`` (an optimizer's registry); None and anything else
    (the handles of our own arrays) hold no torch tensor and are skipped."""
    torch = sys.modules.get("torch")
    if torch is None:       # no torch tensor can exist
        return
    for t in targets:
        t = getattr(t, "probes", t)
        tensors = t.versioned if type(t) is ProbeList else [t.versioned] if type(t) is Probe else ()
        for tensor in tensors:
            if tensor is not None:
                torch.autograd.graph.increment_version(tensor)


def _is_buffer(x):
    if (isinstance(x, (Array, DeviceArray)) or is_torch_tensor(x)
            or getattr(x, "__cuda_array_interface__", None) is not None):
        return True
    try:
        memoryview(x).release()
    except TypeError:
        return False
    except ValueError:          # a released memoryview: a buffer, refused by name where it is read
        return True
    return True


def tensor_list(x, name, where, *, inplace, allow_empty=False):
    """Return float32 Probes (a ProbeList) for one buffer or an iterable of buffers.

    Each item is checked with ``float32_tensor`` under the name
    ``name[i]``; an empty iterable is refused (ValueError), and so is an
    empty tensor, unless ``allow_empty``. ``inplace``:
    the tensors are updated in place as torch's optimizers update
    parameters and gradients (``float32_tensor``'s ``inplace="update"``).
    """
    inplace = "update" if inplace else False        # params and gradients, as torch's optimizers
    if _is_buffer(x):
        return ProbeList([float32_tensor(x, name, where, inplace=inplace, allow_empty=allow_empty)])
    if isinstance(x, str):
        items = None
    else:
        try:
            items = list(x)
        except TypeError:
            items = None
    if items is None:
        raise TypeError(where_msg(where, "%s must be a float32 buffer or a list "
                                  "of them, got %s" % (name, type(x).__name__)))
    if not items and not allow_empty:
        raise ValueError(where_msg(where, "%s is an empty list" % name))
    return ProbeList([float32_tensor(item, "%s[%d]" % (name, i), where, inplace=inplace, allow_empty=allow_empty)
                      for i, item in enumerate(items)])


def offsets_for(probes, name="tensors", where="offsets_for"):
    """Return an int32 Array of J+1 element offsets (offsets[0] == 0).

    ValueError when the total exceeds 2**31-1 elements.
    """
    offsets = [0]
    for p in probes:
        offsets.append(offsets[-1] + p.nelems)
    if offsets[-1] > _INT32_MAX:
        raise ValueError(where_msg(where, "%s hold %d elements in total, over "
                                   "the limit of 2**31-1 (%d)"
                                   % (name, offsets[-1], _INT32_MAX)))
    return Array.from_list(offsets, "int32")


def lie_end_to_end(probes):
    """True when each tensor starts where the previous one ends."""
    for a, b in zip(probes, probes[1:]):
        if b.address != a.address + a.nbytes:
            return False
    return True


def borrow_bytes(address, nbytes, readonly=False):
    """Return a memoryview of raw memory; it does NOT keep the owner alive."""
    if nbytes == 0:
        view = memoryview(bytearray())
    else:
        view = memoryview(_ffi.buffer(_ffi.cast("char *", address), nbytes))
    return view.toreadonly() if readonly else view


def pack(probes):
    """Return ``(flat, packed)``: one 1-d float32 range over all tensors.

    When there is one tensor or they lie end to end, ``flat`` is a
    memoryview (format 'f') BORROWING their memory (read-only if any of
    them is) and ``packed`` is False; for several tensors it does not
    keep them alive, so keep the probes alive while using it.
    Otherwise ``flat`` is a fresh float32 ``Array`` holding a copy and
    ``packed`` is True (see ``unpack_into``).
    """
    total = sum(p.nbytes for p in probes)
    if len(probes) == 1 and total:  # a view of the view keeps the owner alive
        return probes[0].view.cast("B").cast("f"), False
    if lie_end_to_end(probes):
        start = probes[0].address if probes else 0
        readonly = any(p.readonly for p in probes)
        return borrow_bytes(start, total, readonly).cast("f"), False
    flat = Array(total // 4, "float32")
    offset = flat.address
    for p in probes:
        copy_bytes(offset, p.address, p.nbytes)
        offset += p.nbytes
    return flat, True


def unpack_into(flat, probes):
    """Copy ``flat`` (from ``pack``) back into each tensor, in order."""
    src = probe(flat, "flat", "unpack_into")
    total = sum(p.nbytes for p in probes)
    if src.nbytes < total:
        raise ValueError(where_msg("unpack_into", "flat holds %d bytes; the "
                                   "tensors need %d" % (src.nbytes, total)))
    for i, p in enumerate(probes):
        if p.readonly:
            raise ValueError(where_msg("unpack_into", "tensor %d is read-only; "
                                       "nothing was copied" % i))
    offset = src.address
    for p in probes:
        if p.address != offset:
            copy_bytes(p.address, offset, p.nbytes)
        offset += p.nbytes


def refuse_overlap(where, out, inputs, *, in_place=True):
    """Refuse (ValueError naming both) an output whose memory meets an input's.

    ``out`` and each of ``inputs`` are ``(name, Probe)`` (a None Probe is skipped). The very
    same buffer -- same start, same size -- is an in-place call, allowed when ``in_place``;
    any other intersection is refused. Empty buffers meet nothing.
    """
    oname, po = out
    o0, o1 = po.address, po.address + po.nbytes
    for name, p in inputs:
        if p is None or not p.nbytes or not po.nbytes or p.address >= o1 or o0 >= p.address + p.nbytes:
            continue
        same = p.address == o0 and p.nbytes == po.nbytes
        if same and in_place:
            continue
        if same:
            how = "%s is %s itself" % (oname, name)
        else:
            shift = o0 - p.address
            how = ("%s and %s overlap in memory without being the same buffer (%s starts %d bytes %s %s)"
                   % (oname, name, oname, abs(shift), "after" if shift >= 0 else "before", name))
        fix = "pass %s itself as %s (in place) or a separate buffer" % (name, oname) if in_place else \
            "%s must be a buffer of its own" % oname
        raise ValueError(where_msg(where, "%s; %s" % (how, fix)))


def copy_bytes(dst_address, src_address, nbytes):
    """memmove ``nbytes`` from ``src_address`` to ``dst_address``."""
    if nbytes:
        _ffi.memmove(_ffi.cast("void *", dst_address),
                     _ffi.cast("void *", src_address), nbytes)


_ZEROS = bytes(1 << 20)


def zero_bytes(address, nbytes):
    """Set ``nbytes`` bytes at ``address`` to zero."""
    step = len(_ZEROS)
    for start in range(0, nbytes, step):
        n = min(step, nbytes - start)
        _ffi.memmove(_ffi.cast("void *", address + start), _ZEROS, n)


_F32_FORMATS = native_formats("float32")


def float32_table(tensors, shapes, table, *, inplace, offsets=None, device_ok=False):
    """Fast path of the hot calls: write the addresses of ``tensors`` (a list or tuple of
    C-contiguous float32 buffers or DeviceArrays, with exactly ``shapes`` -- or, when
    ``shapes`` is None, any non-empty shapes, their running sizes then going into the cffi
    ``int32_t[]`` ``offsets``) into the cffi ``float *[]`` ``table``, and return the buffer
    handles that must stay alive during the native call.

    Returns None for anything unusual (a single buffer, another dtype, a shape, layout or
    writability problem); the caller then takes the checked path (``tensor_list``), whose
    error names the argument. Nothing is written anywhere on either path.
    """
    if type(tensors) not in (list, tuple) or not tensors or (shapes is not None and len(tensors) != len(shapes)):
        return None
    keep, sizes = [], []
    for j, t in enumerate(tensors):
        kind = type(t)
        if kind is Array or kind is DeviceArray:        # our own arrays: no buffer export needed
            if t.dtype != "float32" or (t.shape != shapes[j] if shapes is not None else t.nbytes == 0):
                return None
            if kind is DeviceArray and not device_ok:
                return None
            keep.append(t._cptr if kind is DeviceArray else _ffi.cast("float *", t.address))
            sizes.append(t.nbytes >> 2)
            continue
        try:
            view = memoryview(t)
        except (TypeError, ValueError):
            return None
        if (view.format not in _F32_FORMATS or not view.c_contiguous or (inplace and view.readonly)
                or (view.shape != shapes[j] if shapes is not None else view.nbytes == 0)):
            return None
        keep.append(_ffi.from_buffer("float[]", view))
        sizes.append(view.nbytes >> 2)
    if offsets is not None:
        if sum(sizes) > _INT32_MAX:
            return None
        total = 0
        for j, size in enumerate(sizes):
            total += size
            offsets[j + 1] = total
        offsets[0] = 0
    for j, handle in enumerate(keep):
        table[j] = handle
    return keep


class LastTable:
    """Remembers the pointer table built for the last list of our own arrays (Array,
    DeviceArray) and hands it back when the same objects come again, in the same order: a
    training loop passes the same gradient list every step. It holds those objects, so their
    ids cannot be reused by others while they are remembered; their addresses and sizes never
    change (our arrays do not resize). Anything else is looked at afresh every call."""

    __slots__ = ("objects", "result")

    def __init__(self):
        self.objects, self.result = (), None

    def get(self, tensors):
        objects = self.objects
        if (type(tensors) in (list, tuple) and len(tensors) == len(objects) and objects
                and all(a is b for a, b in zip(tensors, objects))):
            return self.result
        return None

    def put(self, tensors, result):
        if all(type(t) is Array or type(t) is DeviceArray for t in tensors):
            self.objects, self.result = tuple(tensors), result
        else:
            self.objects, self.result = (), None
        return result
