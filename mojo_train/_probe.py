"""Looking inside one user buffer: ``probe`` and the ``Probe`` it returns.

Contract: ``probe`` turns any buffer-protocol object (array.array, memoryview, bytearray,
numpy array, ...), a ``mojo_train.Array``, or an object exporting ``__cuda_array_interface__``
or DLPack (torch tensors, CuPy, DeviceArray) into a ``Probe`` describing its dtype, shape,
size, writability, contiguity and data address, without copying or casting. ``cast_fix`` and
``contiguous_fix`` say how the user converts an argument, in the words of its library. This
module sits below ``_array`` and ``_buffer`` (which builds the tensor checks on it): it knows
our Array and torch tensors by class name, importing neither. Native byte order only: this
library targets little-endian hosts.
"""
import operator
import sys

import cffi

from ._dtypes import BY_CHAR, BY_TYPESTR, CASTABLE, DTYPES
from ._errors import where_msg

if sys.byteorder != "little":
    raise ImportError("mojo_train supports little-endian hosts only; this "
                      "host is %s-endian" % sys.byteorder)

ffi = cffi.FFI()        # no declarations: takes buffer addresses and wraps raw memory

_BUFFER_KINDS = ("a buffer-protocol object (array.array, memoryview, numpy "
                 "array, mojo_train.Array)")
# C long and size_t formats ('l', 'L', 'n', 'N') name the dtype of their itemsize
_BY_SIZE = {(alias, size): DTYPES[("int%d" if alias in "ln" else "uint%d") % (8 * size)].char
            for alias in "lLnN" for size in (4, 8)}


def normalize_format(fmt, itemsize):
    """Return ``(format, dtype)`` for a struct format string.

    Native/little-endian prefixes are dropped and the char made canonical
    (``'<f'`` -> ``('f', 'float32')``); big-endian formats keep their raw
    format and get a dtype like ``'float32 (big-endian)'``; unknown formats
    give ``(fmt, fmt)``.
    """
    body, big = fmt, False
    if body[:1] in ("@", "=", "<"):
        body = body[1:]
    elif body[:1] in (">", "!"):
        body, big = body[1:], True
    char = _BY_SIZE.get((body, itemsize), body)
    if char not in BY_CHAR:
        return fmt, fmt
    dtype = BY_CHAR[char]
    if big and itemsize > 1:
        return fmt, dtype + " (big-endian)"
    return char, dtype


class Probe:
    """What mojo_train knows about one buffer; keeps it alive while it lives.

    ``versioned``: the torch tensor whose version counter a write into this buffer bumps
    (``_buffer.wrote``), None for anything else."""

    __slots__ = ("obj", "view", "format", "dtype", "itemsize", "shape",
                 "nelems", "nbytes", "readonly", "c_contiguous", "_address", "device", "versioned")

    def __init__(self, obj, view, format, dtype, itemsize, shape, nelems,
                 nbytes, readonly, c_contiguous, address=None):
        """Store the fields; ``address=None`` means compute it on demand."""
        self.obj = obj
        self.view = view
        self.format = format
        self.dtype = dtype
        self.itemsize = itemsize
        self.shape = shape
        self.nelems = nelems
        self.nbytes = nbytes
        self.readonly = readonly
        self.c_contiguous = c_contiguous
        self._address = address
        self.device = False
        self.versioned = None

    @property
    def address(self):
        """The data address as an int (0 for an empty buffer)."""
        if self._address is None:
            if self.nbytes == 0:
                self._address = 0
            elif not self.c_contiguous:
                raise ValueError("mojo_train: a non-contiguous buffer has no "
                                 "single data address")
            else:
                self._address = buffer_address(self.view)
        return self._address

    def __repr__(self):
        return ("Probe(dtype=%r, shape=%r, readonly=%r, c_contiguous=%r)"
                % (self.dtype, self.shape, self.readonly, self.c_contiguous))


def buffer_address(obj):
    """Return the data address of a C-contiguous buffer, releasing at once."""
    cdata = ffi.from_buffer(obj)
    try:
        return int(ffi.cast("uintptr_t", cdata))
    finally:
        ffi.release(cdata)


def _is_a(x, module, name):
    """True when the class of ``x`` or one of its bases is ``module.name``; imports nothing."""
    return any(c.__name__ == name and c.__module__ == module for c in type(x).__mro__)


# What an argument's class is, found once per class (a call probes several): a mojo_train.Array,
# a DeviceArray, a torch tensor read from its own fields, a torch tensor whose class exports its
# memory its own way (a subclass with its own __dlpack__ or __cuda_array_interface__: asked, as
# any foreign object), or anything else. At most _KINDS_KEPT classes are remembered (classes made
# in a loop would otherwise be kept alive).
_ARRAY, _DEVICE, _TORCH, _TORCH_OWN_EXPORT, _OTHER = "array", "device", "torch", "torch, own export", "other"
_KIND_OF_TYPE = {}
_KINDS_KEPT = 256


def _same_export(t, base, names):
    """True when class ``t`` takes every attribute of ``names`` from ``base`` unchanged."""
    return all(getattr(t, n, None) is getattr(base, n, None) for n in names)


def _classify(x):
    t = type(x)
    if _is_a(x, __package__ + "._array", "Array"):
        return _ARRAY
    if _is_a(x, __package__ + ".device", "DeviceArray"):
        base = next(c for c in t.__mro__ if c.__name__ == "DeviceArray")
        return _DEVICE if _same_export(t, base, ("__cuda_array_interface__",)) else _OTHER
    if _is_a(x, "torch", "Tensor"):
        plain = _same_export(t, sys.modules["torch"].Tensor, ("__dlpack__", "__cuda_array_interface__"))
        return _TORCH if plain else _TORCH_OWN_EXPORT
    return _OTHER


def _kind(x):
    """One of _ARRAY, _DEVICE, _TORCH, _TORCH_OWN_EXPORT, _OTHER for ``x`` (see above)."""
    t = type(x)
    kind = _KIND_OF_TYPE.get(t)
    if kind is None:
        kind = _classify(x)
        if len(_KIND_OF_TYPE) >= _KINDS_KEPT:
            _KIND_OF_TYPE.clear()
        _KIND_OF_TYPE[t] = kind
    return kind


def is_torch_tensor(x):
    """True for a torch.Tensor or a subclass (nn.Parameter), without importing torch."""
    kind = _kind(x)
    return kind is _TORCH or kind is _TORCH_OWN_EXPORT


def _is_array(x):
    """True for a mojo_train.Array (or a subclass); _array imports this module, not the reverse."""
    return _kind(x) is _ARRAY


def probe(x, name, where):
    """Describe buffer ``x`` (argument ``name`` of ``where``) as a Probe.

    TypeError when ``x`` does not export a buffer.
    """
    kind = _kind(x)
    if kind is _TORCH:
        p = _torch_probe(x)
        if p is not None:
            return p
    elif kind is _DEVICE:   # its __cuda_array_interface__, read from its fields
        return _described(x, None, x.ptr, x.shape, x.dtype, DTYPES[x.dtype].itemsize, None, False, True)
    if kind is _ARRAY:      # before 3.12 an Array exports no buffer; its own view has its shape
        view, shape = x.memview(), x.shape
    else:
        try:
            view = memoryview(x)
        except TypeError:
            dev = _foreign_probe(x, name, where)
            if dev is not None:
                return dev
            raise TypeError(where_msg(where, "%s must be %s, got %s"
                                      % (name, _BUFFER_KINDS,
                                         type(x).__name__))) from None
        except ValueError as exc:  # e.g. a released memoryview
            raise ValueError(where_msg(where, "%s: %s" % (name, exc))) from None
        shape = tuple(view.shape)
    fmt, dtype = normalize_format(view.format, view.itemsize)
    nelems = 1
    for d in shape:
        nelems *= d
    return Probe(x, view, fmt, dtype, view.itemsize, shape, nelems,
                 view.nbytes, bool(view.readonly), bool(view.c_contiguous))


def _c_contiguous(shape, strides, itemsize):
    if strides is None:
        return True
    expect = itemsize
    for d, s in zip(reversed(shape), reversed(strides)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def _char_of(dtype):
    """The struct char of a dtype name, or the name itself when it has none."""
    row = DTYPES.get(dtype)
    return row.char if row is not None and row.char else dtype


def _described(x, view, ptr, shape, dtype, itemsize, strides, readonly, device):
    nelems = 1
    for d in shape:
        nelems *= d
    p = Probe(x, view, _char_of(dtype), dtype, itemsize, tuple(shape), nelems,
              nelems * itemsize, bool(readonly), _c_contiguous(shape, strides, itemsize), ptr)
    p.device = device
    return p


def _foreign_probe(x, name, where):
    """A Probe for an object without the buffer protocol that exports memory through
    ``__cuda_array_interface__`` (torch CUDA tensors, CuPy, DeviceArray) or DLPack (torch
    CPU tensors: a memoryview over their memory); None when it exports neither. A torch
    tensor that requires grad is read through ``x.detach()``, which shares its memory."""
    torch = is_torch_tensor(x)
    if torch:
        _refuse_lazy_views(x, name, where)
    src = x.detach() if torch and x.requires_grad else x
    p = _interface_probe(x, src, name, where)
    if p is None and callable(getattr(src, "__dlpack__", None)):
        p = _dlpack_probe(x, src)
    if p is not None and p.nbytes and not p._address:
        raise ValueError(where_msg(where, "%s has no memory to read (address 0 for %d bytes: a fake, meta or "
                                   "storage-freed tensor)" % (name, p.nbytes)))
    if p is not None and torch:
        p.versioned = x
    return p


def _refuse_lazy_views(x, name, where):
    """A torch tensor whose negation or conjugation is a bit, not in its memory: its memory holds
    other values than it has (neither DLPack nor ``__cuda_array_interface__`` says so)."""
    if x.is_neg():
        raise ValueError(where_msg(where, "%s is a lazily negated view (torch's negative bit): its memory holds "
                                   "the values before negation; pass %s.resolve_neg()" % (name, name)))
    if x.is_conj():
        raise ValueError(where_msg(where, "%s is a lazily conjugated view (torch's conjugate bit): its memory holds "
                                   "the values before conjugation; pass %s.resolve_conj()" % (name, name)))


_TORCH_DTYPES = {}      # torch dtype -> our name, for the dtypes a memoryview can be cast to


def _torch_dtypes():
    if not _TORCH_DTYPES:
        torch = sys.modules["torch"]
        for name, d in DTYPES.items():
            if d.char in CASTABLE and isinstance(getattr(torch, name, None), torch.dtype):
                _TORCH_DTYPES[getattr(torch, name)] = name
    return _TORCH_DTYPES


def torch_fields(x):
    """(dtype name, on a CUDA device, shape tuple, data address) of a C-contiguous strided torch
    tensor on the CPU or a CUDA device, read from its own attributes; None for any other tensor
    (a sparse, meta, negative- or conjugate-bit, strided or unusual dtype one), which takes the
    general path and its messages."""
    torch = sys.modules["torch"]
    dtype = _torch_dtypes().get(x.dtype)
    if dtype is None or x.layout is not torch.strided or not x.is_contiguous() or x.is_neg() or x.is_conj():
        return None
    device = x.device.type
    if device != "cpu" and device != "cuda":
        return None
    try:
        n = x.numel()
        address = x.data_ptr() if n else 0
    except RuntimeError:      # e.g. a tensor without storage (functional): the general path says why
        return None
    if n and not address:     # a fake tensor, or one whose storage was resized away: refused there
        return None
    return dtype, device != "cpu", tuple(x.shape), address


def _torch_probe(x):
    """The Probe of a tensor ``torch_fields`` reads: what ``_foreign_probe`` finds through DLPack
    or ``__cuda_array_interface__`` (same fields, same view of host memory), without a capsule or
    an interface dict: a CUDA tensor 2.3 us instead of 5.3 on the H200 machine
    (bench/call_overhead_cuda.py's probe), a CPU tensor ~4 us instead of 18.6 on a 2-core VM."""
    fields = torch_fields(x)
    if fields is None:
        return None
    dtype, on_device, shape, address = fields
    p = _described(x, None, address, shape, dtype, DTYPES[dtype].itemsize, None, False, on_device)
    if not on_device:
        # owned by an alias of the memory, not by x: a Parameter whose storage is swapped later
        # (p.data = ..., module.double()) keeps the memory a kept Probe (an optimizer's) points into
        p.view = _owned_view(x.detach(), address, p.nbytes, p.format, p.shape)
    p.versioned = x
    return p


def _interface_probe(x, src, name, where):
    cai = getattr(src, "__cuda_array_interface__", None)
    if cai is None:
        return None
    ts = cai["typestr"]
    dtype = BY_TYPESTR.get(ts[1:], ts) if ts[:1] in "<|=" else ts + " (big-endian)"
    itemsize = int(ts[2:]) if ts[2:].isdigit() else 0
    ptr, readonly = cai["data"]
    return _described(x, None, int(ptr or 0), _interface_shape(cai["shape"], name, where), dtype, itemsize,
                      cai.get("strides"), readonly, True)


def _interface_shape(shape, name, where):
    """A foreign exporter's shape as a tuple of non-negative Python ints (every other probe's
    shape is one already), else ValueError naming the argument: an op's output is shaped by it
    unchecked (DeviceArray._fresh)."""
    try:
        dims = tuple(shape)
        if any(isinstance(d, bool) for d in dims):
            raise TypeError
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        dims = None
    if dims is None or any(d < 0 for d in dims):
        raise ValueError(where_msg(where, "%s's __cuda_array_interface__ has shape %r; a shape is a tuple of "
                                   "non-negative ints" % (name, shape)))
    return dims


def _dlpack_probe(x, src):
    from . import _dlpack   # late: ctypes is loaded only when a DLPack tensor comes (not a cycle)
    imp = _dlpack.from_object(src)
    itemsize = DTYPES[imp.dtype].itemsize if imp.dtype in DTYPES else 0
    p = _described(x, imp, imp.address, imp.shape, imp.dtype, itemsize, None, False,
                   imp.device_type != _dlpack.DL_CPU)
    p.c_contiguous = imp.c_contiguous
    if not p.device and p.c_contiguous and p.format in CASTABLE:
        p.view = _owned_view(imp, p.address, p.nbytes, p.format, p.shape)
    return p


def _owned_view(owner, address, nbytes, fmt, shape):
    """A memoryview of ``shape`` over raw memory that keeps ``owner`` alive while it, or any
    view made from it, lives (the cffi pointer under it holds ``owner``)."""
    if nbytes == 0:
        return memoryview(bytearray()).cast(fmt)
    ptr = ffi.gc(ffi.cast("char *", address), lambda _ptr, owner=owner: None)
    return memoryview(ffi.buffer(ptr, nbytes)).cast(fmt, shape)


# ---- how the user fixes an argument, in the words of its library --------------------------
def _library(x):
    """'numpy', 'cupy', 'torch' or None: whose array ``x`` is, for the fix a message names."""
    if is_torch_tensor(x):
        return "torch"
    module = type(x).__module__.split(".")[0]
    return module if module in ("numpy", "cupy") else None


def _detached(x, name):
    return name + ".detach()" if x.requires_grad else name


def cast_fix(x, name, dtype):
    """How the user converts argument ``name`` (the object ``x``) to ``dtype`` ('float32' or
    'int64'), as a clause for an error message."""
    lib = _library(x)
    if lib == "torch":
        return "convert with %s.%s()" % (_detached(x, name), "float" if dtype == "float32" else "long")
    if lib:
        return "convert with %s.astype(%s.%s)" % (name, "np" if lib == "numpy" else lib, dtype)
    return "convert it to %s first" % dtype


def contiguous_fix(x, name):
    """How the user makes a C-contiguous copy of argument ``name`` (the object ``x``)."""
    lib = _library(x)
    if lib == "torch":
        return "pass %s.contiguous()" % _detached(x, name)
    if lib:
        return "pass %s.ascontiguousarray(%s)" % ("np" if lib == "numpy" else lib, name)
    return "copy it into a contiguous buffer"
