"""DLPack exchange (the legacy, unversioned ``"dltensor"`` capsule) in pure ctypes.

Contract: ``export_capsule`` wraps memory we do not own -- an address, a shape, a dtype name
and a device -- in a PyCapsule fit to return from ``__dlpack__``.  The capsule keeps the
memory's ``owner`` alive until a consumer calls the DLManagedTensor's deleter, or, when no
consumer ever took it, until the capsule itself is destroyed; the deleter frees at most once.
``import_capsule`` / ``from_object`` take over another library's tensor: they rename the
capsule ``"used_dltensor"`` and return an ``Imported`` description (address, shape, dtype,
device, contiguity) that holds the producer's memory until its ``close()`` calls the
producer's deleter, exactly once.  Nothing is copied, cast or compiled; numpy is never
imported.  A malformed capsule is refused before it is renamed, so the producer keeps it.
"""

import ctypes
import itertools
import operator

from ._dtypes import BY_DLPACK as _NAMES
from ._dtypes import TABLE
from ._errors import where_msg

DL_CPU = 1
DL_CUDA = 2
DL_CUDA_HOST = 3
DL_ROCM = 10
DL_ROCM_HOST = 11
DL_CUDA_MANAGED = 13

# dtype name -> (DLDataType code, bits), from the dtype table; lanes is always 1
DTYPES = {d.name: d.dlpack for d in TABLE}

_MAX_NDIM = 64


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


# void (*deleter)(DLManagedTensor *self); the argument is taken as a plain address
_DELETER_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# void (*PyCapsule_Destructor)(PyObject *); a plain address: the capsule is mid-dealloc
_DESTRUCTOR_T = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
# how we call a producer's deleter: holding the GIL (safe whether or not it takes the GIL)
_CALL_DELETER_T = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER_T)]


def _api(name, restype, *argtypes):
    """A private prototype for a C-API function (holds the GIL, raises a set error).

    Private objects, so other code setting ``ctypes.pythonapi.X.argtypes`` cannot clash.
    """
    return ctypes.PYFUNCTYPE(restype, *argtypes)((name, ctypes.pythonapi))


_capsule_new = _api("PyCapsule_New", ctypes.py_object,
                    ctypes.c_void_p, ctypes.c_char_p, _DESTRUCTOR_T)
_capsule_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
_capsule_get_pointer = _api("PyCapsule_GetPointer", ctypes.c_void_p,
                            ctypes.py_object, ctypes.c_char_p)
_capsule_set_name = _api("PyCapsule_SetName", ctypes.c_int, ctypes.py_object, ctypes.c_char_p)
# on a raw PyObject*: the capsule destructor sees its capsule mid-dealloc (no refcounting)
_raw_is_valid = _api("PyCapsule_IsValid", ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)
# no argtypes on purpose: converters are Python calls, which fail while an error is set
_err_fetch = ctypes.PYFUNCTYPE(None)(("PyErr_Fetch", ctypes.pythonapi))
_err_restore = ctypes.PYFUNCTYPE(None)(("PyErr_Restore", ctypes.pythonapi))

_DLTENSOR = b"dltensor"
_USED_DLTENSOR = b"used_dltensor"

# manager_ctx id -> (DLManagedTensor, shape array, strides array, owner); the deleter pops it
_LIVE = {}
_IDS = itertools.count(1)
# callback argument (DLManagedTensor* / capsule PyObject*) -> its _ErrorSlot
_DELETER_SLOTS = {}
_CAPSULE_SLOTS = {}


class _ErrorSlot:
    """Where one callback site parks an error its C caller left pending, plus its export id.

    A C caller may drop a capsule (or free a tensor) while raising.  While an error is set,
    every Python call that returns a value turns into a SystemError, so a callback's first
    call must be ``take``; the cells are per site (made ahead of time, since making them is
    itself a call), so threads never share them.  A ctypes callback cannot return to C with
    an error set: ``give_back`` re-raises it and ctypes reports it as unraisable.
    """

    __slots__ = ("ctx", "_cells", "_refs")

    def __init__(self, ctx):
        self.ctx = ctx
        self._cells = (ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p())
        self._refs = tuple(ctypes.byref(cell) for cell in self._cells)

    def take(self):
        _err_fetch(*self._refs)

    def give_back(self):
        saved = tuple(cell.value for cell in self._cells)
        for cell in self._cells:
            cell.value = None
        if saved[0]:
            _err_restore(*(ctypes.c_void_p(v) for v in saved))


def _release(ctx):
    """Forget export ``ctx`` (dropping its owner); idempotent."""
    entry = _LIVE.pop(ctx, None)
    if entry is not None:
        _DELETER_SLOTS.pop(ctypes.addressof(entry[0]), None)


def _deleter_impl(managed_address):
    """DLManagedTensor.deleter: a consumer is done with our memory."""
    slot = _DELETER_SLOTS[managed_address]  # a second call stops here: KeyError, no reads
    slot.take()
    try:
        _release(slot.ctx)
    finally:
        slot.give_back()


def _capsule_destructor_impl(capsule_address):
    """PyCapsule destructor: free the tensor only if no consumer ever took the capsule."""
    slot = _CAPSULE_SLOTS[capsule_address]
    slot.take()
    try:
        del _CAPSULE_SLOTS[capsule_address]
        if _raw_is_valid(capsule_address, _DLTENSOR):
            _release(slot.ctx)
    finally:
        slot.give_back()


_DELETER = _DELETER_T(_deleter_impl)
_CAPSULE_DESTRUCTOR = _DESTRUCTOR_T(_capsule_destructor_impl)


def _immortalize(*objects):
    """Leak one reference to each object: capsules and consumers may outlive this module
    (interpreter shutdown), and they hold raw pointers into these objects."""
    incref = ctypes.PYFUNCTYPE(None, ctypes.py_object)(("Py_IncRef", ctypes.pythonapi))
    for obj in objects:
        incref(obj)


_immortalize(_DLTENSOR, _USED_DLTENSOR, _DELETER, _CAPSULE_DESTRUCTOR)


def dtype_code(dtype, where="export_capsule"):
    """Return the (code, bits) DLPack pair for a dtype name; TypeError naming a bad one."""
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise TypeError(where_msg(where, "unsupported dtype %r; expected one of %s"
                                  % (dtype, ", ".join(DTYPES))))
    return DTYPES[dtype]


def c_strides(shape):
    """C-contiguous strides, in elements, for ``shape``."""
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(extent, 1)
    return tuple(reversed(strides))


def _check_shape(shape, where):
    """Return ``shape`` as a tuple of non-negative ints, or raise naming the problem."""
    try:
        dims = tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(where_msg(where, "shape must be a sequence of ints, got %r"
                                  % (shape,))) from None
    if any(d < 0 for d in dims) or len(dims) > _MAX_NDIM:
        raise ValueError(where_msg(where, "shape must have at most %d non-negative "
                                   "extents, got %r" % (_MAX_NDIM, dims)))
    return dims


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def export_capsule(address, shape, dtype, device_type, device_id, owner):
    """Return a ``"dltensor"`` PyCapsule describing C-contiguous memory at ``address``.

    ``owner`` (any Python object owning that memory) is kept alive until a consumer calls
    the deleter or, if none takes the capsule, until the capsule is destroyed.
    """
    where = "export_capsule"
    code, bits = dtype_code(dtype, where)
    dims = _check_shape(shape, where)
    address, device_type, device_id = (operator.index(v) for v in
                                       (address, device_type, device_id))
    if address < 0 or (address == 0 and _numel(dims) > 0):
        raise ValueError(where_msg(where, "address must be a non-null pointer for a "
                                   "non-empty tensor, got %#x" % address))
    ndim = len(dims)
    shape_arr = (ctypes.c_int64 * max(ndim, 1))(*dims)
    strides_arr = (ctypes.c_int64 * max(ndim, 1))(*c_strides(dims))
    ctx = next(_IDS)
    managed = _DLManagedTensor()
    t = managed.dl_tensor
    t.data, t.ndim, t.byte_offset = address or None, ndim, 0
    t.device.device_type, t.device.device_id = device_type, device_id
    t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, 1
    t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
    managed.manager_ctx, managed.deleter = ctx, _DELETER
    _LIVE[ctx] = (managed, shape_arr, strides_arr, owner)
    _DELETER_SLOTS[ctypes.addressof(managed)] = _ErrorSlot(ctx)
    try:
        capsule = _capsule_new(ctypes.addressof(managed), _DLTENSOR, _CAPSULE_DESTRUCTOR)
    except BaseException:
        _release(ctx)
        raise
    _CAPSULE_SLOTS[id(capsule)] = _ErrorSlot(ctx)
    return capsule


def live_exports():
    """How many exported tensors are still held (not yet freed by a deleter)."""
    return len(_LIVE)


class Imported:
    """A tensor taken over from a DLPack producer; ``close()`` gives it back.

    Fields: ``address`` (data + byte_offset), ``shape``, ``strides`` (elements, or None when
    the producer gave none), ``dtype`` (name), ``device_type``, ``device_id``,
    ``c_contiguous``, ``readonly`` (always False for a legacy capsule).  The memory is only
    valid until ``close()`` (also run by ``__del__`` and ``with``).
    """

    __slots__ = ("address", "shape", "strides", "dtype", "device_type", "device_id",
                 "c_contiguous", "readonly", "_managed", "__weakref__")

    def __init__(self, managed_address, fields):
        for name, value in fields.items():
            setattr(self, name, value)
        self.readonly = False
        self._managed = managed_address

    @property
    def closed(self):
        return not self._managed

    @property
    def nbytes(self):
        return _numel(self.shape) * DTYPES[self.dtype][1] // 8

    def close(self):
        """Call the producer's deleter (once; later calls do nothing)."""
        managed, self._managed = self._managed, None
        if managed:
            deleter = _DLManagedTensor.from_address(managed).deleter
            if deleter:
                ctypes.cast(deleter, _CALL_DELETER_T)(managed)

    def __del__(self):
        try:
            self.close()
        except AttributeError:  # __init__ never ran to the end
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return ("Imported(address=%#x, shape=%r, dtype=%r, device=(%d, %d), "
                "c_contiguous=%r%s)" % (self.address or 0, self.shape, self.dtype,
                                         self.device_type, self.device_id,
                                         self.c_contiguous, ", closed" if self.closed else ""))


def _is_c_contiguous(shape, strides):
    """True when ``strides`` is None or matches C order (extent-1 axes ignored)."""
    if strides is None or 0 in shape:
        return True
    expected = c_strides(shape)
    return all(s == e for d, s, e in zip(shape, strides, expected) if d != 1)


def _read_fields(t, where):
    """The ``Imported`` fields of DLTensor ``t``; raises (before any renaming) if unusable."""
    if not 0 <= t.ndim <= _MAX_NDIM:
        raise ValueError(where_msg(where, "capsule has ndim %d" % t.ndim))
    key = (t.dtype.code, t.dtype.bits)
    if t.dtype.lanes != 1 or key not in _NAMES:
        raise TypeError(where_msg(where, "unsupported DLPack dtype (code %d, bits %d, "
                                  "lanes %d)" % (key + (t.dtype.lanes,))))
    if t.ndim and not t.shape:
        raise ValueError(where_msg(where, "capsule has ndim %d but no shape" % t.ndim))
    shape = tuple(t.shape[i] for i in range(t.ndim))
    strides = tuple(t.strides[i] for i in range(t.ndim)) if t.strides else None
    if any(d < 0 for d in shape):
        raise ValueError(where_msg(where, "capsule has negative shape %r" % (shape,)))
    return {"address": (t.data or 0) + t.byte_offset, "shape": shape, "strides": strides,
            "dtype": _NAMES[key], "device_type": t.device.device_type,
            "device_id": t.device.device_id,
            "c_contiguous": _is_c_contiguous(shape, strides)}


def import_capsule(capsule):
    """Take over a ``"dltensor"`` capsule, renaming it ``"used_dltensor"``; an ``Imported``."""
    where = "import_capsule"
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError(where_msg(where, "expected a DLPack PyCapsule, got %s"
                                  % type(capsule).__name__))
    if not _capsule_is_valid(capsule, _DLTENSOR):
        state = ("was already consumed" if _capsule_is_valid(capsule, _USED_DLTENSOR)
                 else "is not named 'dltensor' (versioned DLPack is not supported)")
        raise ValueError(where_msg(where, "the capsule " + state))
    managed = _capsule_get_pointer(capsule, _DLTENSOR)
    if not managed:
        raise ValueError(where_msg(where, "the capsule holds a NULL DLManagedTensor"))
    fields = _read_fields(_DLManagedTensor.from_address(managed).dl_tensor, where)
    _capsule_set_name(capsule, _USED_DLTENSOR)  # raises on failure: the producer keeps it
    return Imported(managed, fields)


def from_object(obj, stream=None):
    """Import ``obj.__dlpack__(stream=stream)``; TypeError naming the type if it has none.

    A producer whose ``__dlpack__`` takes no ``stream`` keyword is called without it, but
    only when ``stream`` is None (nothing would be lost).
    """
    where = "from_object"
    method = getattr(obj, "__dlpack__", None)
    if method is None:
        raise TypeError(where_msg(where, "%s does not support DLPack (no __dlpack__)"
                                  % type(obj).__name__))
    try:
        capsule = method(stream=stream)
    except TypeError as exc:
        if stream is not None or "keyword" not in str(exc):
            raise
        capsule = method()
    return import_capsule(capsule)
