"""mojo_train's own n-dimensional array, with no numpy needed.

Contract: an ``Array`` owns a zero-filled ``bytearray`` holding its
elements in C order, little-endian, for one of a few fixed dtypes.  Its
data address is stable for its whole life (the bytearray is never
resized), so native code may be handed ``Array.address``.  ``reshape``
returns Arrays that share that memory; every other constructor copies.
Arrays export their memory through ``memview()``, the Python 3.12 buffer
protocol (``__buffer__``) and ``__array_interface__`` (zero-copy for
numpy), and they pickle as bytes + shape + dtype.
"""

import math
import operator
import struct
import sys

from . import _host_blocks
from ._dtypes import ARRAY_DTYPES, DTYPES, FLOAT_DTYPES
from ._errors import where_msg
from ._probe import contiguous_fix, probe
from ._probe import ffi as _FFI

_NO_CLEAR = _FFI.new_allocator(should_clear_after_alloc=False)
_NO_CLEAR_FROM = 1 << 16     # bytes: smaller empty() Arrays are plain zeroed bytearrays

# dtype name -> (struct format char, array-interface typestr, itemsize), from the dtype table
_DTYPES = {name: (DTYPES[name].char, DTYPES[name].typestr, DTYPES[name].itemsize) for name in ARRAY_DTYPES}


def _check_dtype(dtype, where="Array"):
    """Return ``dtype`` if supported, else raise TypeError naming it."""
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise TypeError(where_msg(where, "unsupported dtype %r; expected one of %s"
                                  % (dtype, ", ".join(_DTYPES))))
    return dtype


_MAX_ELEMENTS = 2 ** 63 - 1     # of a shape, zeros left out: the native calls take counts as int64


def _check_shape(shape, where="Array"):
    """Return ``shape`` as a tuple of non-negative ints, else ValueError."""
    dims = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    try:
        if any(isinstance(d, bool) for d in dims):
            raise TypeError
        dims = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise ValueError(where_msg(where, "bad shape %r; expected an int or a "
                                   "tuple of ints" % (shape,))) from None
    if any(d < 0 for d in dims):
        raise ValueError(where_msg(where, "bad shape %r; dimensions must be "
                                   "non-negative" % (shape,)))
    if 0 in dims and _prod(d for d in dims if d) > _MAX_ELEMENTS:    # (a nonempty one: _nbytes' MemoryError)
        raise ValueError(where_msg(where, "bad shape %r; the product of its nonzero dimensions must fit "
                                   "int64 (at most 2**63 - 1), even where a zero makes it empty: the native "
                                   "calls take products of dimensions as int64" % (shape,)))
    return dims


def _prod(dims):
    n = 1
    for d in dims:
        n *= d
    return n


def reshaped_dims(shape, size, where):
    """The dimensions of a reshape of ``size`` elements to ``shape`` (the arguments of
    ``reshape(2, 3)`` or ``reshape((2, 3))``; one -1 is inferred), refused by name when bad.
    Array and DeviceArray share it."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = shape[0]
    shape = list(shape)
    if shape.count(-1) > 1:
        raise ValueError(where_msg(where, "only one dimension of the shape may be -1, got %r" % (tuple(shape),)))
    known = None
    if -1 in shape:
        i = shape.index(-1)
        rest = _check_shape(shape[:i] + shape[i + 1:], where)
        known = _prod(rest)
        inferred = size // known if known else -1
        dims = rest[:i] + (max(inferred, 0),) + rest[i:]
    else:
        dims = _check_shape(shape, where)
    if _prod(dims) != size or known == 0:
        raise ValueError(where_msg(where, "cannot reshape size %d into shape %r" % (size, tuple(shape))))
    return dims


def _nest(flat, shape):
    """Split the flat list ``flat`` into nested lists following ``shape``."""
    if not shape:
        return flat[0]
    if len(shape) == 1:
        return list(flat)
    step = _prod(shape[1:])
    return [_nest(flat[i * step:(i + 1) * step], shape[1:])
            for i in range(shape[0])]


def _nbytes(shape, dtype, where):
    """The bytes of an Array of ``shape`` and ``dtype``; MemoryError when no buffer can be that large."""
    nbytes = _prod(shape) * _DTYPES[dtype][2]
    if nbytes > sys.maxsize:
        raise MemoryError(where_msg(where, "shape %r of %s needs %d bytes, more than this machine can "
                                    "address" % (shape, dtype, nbytes)))
    return nbytes


def _pack_one(fmt, dtype, value, where, name="value"):
    """Pack one Python scalar as ``dtype``; TypeError/ValueError naming ``name`` if unfit."""
    what = "%s = %r" % (name, value)
    if dtype in FLOAT_DTYPES:
        try:
            if isinstance(value, (str, bytes, bytearray)):
                raise TypeError
            value = float(value)
        except TypeError:           # a string, None, a list, ...
            raise TypeError(where_msg(where, "%s is not a number" % what)) from None
        except OverflowError:       # an int beyond a double
            raise ValueError(where_msg(where, "%s does not fit in dtype %s" % (what, dtype))) from None
    else:
        try:
            value = operator.index(value)
        except TypeError:
            raise TypeError(where_msg(where, "%s is not an integer; dtype %s "
                                      "takes integers only" % (what, dtype))) from None
    try:
        return struct.pack("<" + fmt, value)
    except (struct.error, OverflowError):
        raise ValueError(where_msg(where, "%s does not fit in dtype %s"
                                   % (what, dtype))) from None


def float32_at(address, index=0):
    """The float32 at ``address`` (an int) + 4 * ``index`` as a Python float, decoded from its bits
    with integer arithmetic: a float32 -> double conversion in C obeys the caller's
    denormals-are-zero mode (``torch.set_flush_denormal(True)`` sets it for the process), which would
    read a subnormal result (an infinity norm of tiny gradients, a tiny loss) as 0. NaN comes back
    as Python's NaN (its payload is not kept)."""
    u = int(_FFI.cast("uint32_t *", address)[index])
    exponent, mantissa = (u >> 23) & 0xFF, u & 0x7FFFFF
    if exponent == 0xFF:
        value = float("nan") if mantissa else float("inf")
    elif exponent == 0:
        value = math.ldexp(mantissa, -149)
    else:
        value = math.ldexp(mantissa | 0x800000, exponent - 150)
    return -value if u >> 31 else value


def float32_bits(x):
    """The bits of the float32 nearest the Python float ``x`` (ties to even; NaN as 0x7fc00000),
    computed with integer arithmetic: a double -> float32 conversion in C obeys the caller's
    flush-to-zero mode and would turn a subnormal float32 into 0 (the inverse of float32_at)."""
    if x != x:
        return 0x7FC00000
    sign = 0x80000000 if math.copysign(1.0, x) < 0 else 0
    a = abs(x)
    if a == 0.0:
        return sign
    if a == float("inf"):
        return sign | 0x7F800000
    m, e = math.frexp(a)                      # a = m * 2**e, 0.5 <= m < 1, exactly
    mi = int(math.ldexp(m, 53))               # a = mi * 2**(e - 53)
    q = max(e - 24, -149)                     # the float32 quantum's exponent
    shift = q - (e - 53)
    n, rem, half = mi >> shift, mi & ((1 << shift) - 1), 1 << (shift - 1)
    if rem > half or (rem == half and n & 1):
        n += 1
    if n >> 24:                               # the rounding carried into a new binade
        n, q = n >> 1, q + 1
    if q + 150 >= 255:
        return sign | 0x7F800000
    return sign | (n if q == -149 else ((q + 150) << 23) | (n & 0x7FFFFF))


class Array:
    """An n-d array owning its memory (see the module docstring)."""

    __slots__ = ("_buf", "_shape", "_dtype", "_address", "__weakref__")

    def __init__(self, shape, dtype="float32"):
        """Make a zero-filled array of ``shape`` (int or tuple) and ``dtype``."""
        dtype = _check_dtype(dtype)
        shape = _check_shape(shape)
        self._init(bytearray(_nbytes(shape, dtype, "Array")), shape, dtype)

    def _init(self, buf, shape, dtype):
        self._buf = buf
        self._shape = shape
        self._dtype = dtype
        self._address = None

    @classmethod
    def _wrap(cls, buf, shape, dtype):
        """Make an Array over the bytearray ``buf`` without copying it."""
        arr = cls.__new__(cls)
        arr._init(buf, shape, dtype)
        return arr

    # ----- constructors -------------------------------------------------
    @classmethod
    def zeros(cls, shape, dtype="float32"):
        """Return a zero-filled Array."""
        return cls(shape, dtype)

    @classmethod
    def empty(cls, shape, dtype="float32"):
        """Return an Array whose content is unspecified: large ones are not zero-filled
        (outputs a native call overwrites completely need no memset), and one of 1 MiB or more
        may reuse the block of a freed Array of the same size (mojo_train/_host_blocks.py)."""
        dtype = _check_dtype(dtype)
        shape = _check_shape(shape)
        nbytes = _nbytes(shape, dtype, "Array.empty")
        if nbytes < _NO_CLEAR_FROM:
            return cls(shape, dtype)
        return cls._empty_checked(shape, dtype, nbytes)

    @classmethod
    def _empty_checked(cls, shape, dtype, nbytes):
        """``empty`` of a shape tuple and dtype already checked, ``nbytes`` their size (an op's
        output, shaped by its inputs, made on every call; no subclass's ``__init__`` runs)."""
        if nbytes < _NO_CLEAR_FROM:
            return cls._wrap(bytearray(nbytes), shape, dtype)
        new = _host_blocks.new_block if nbytes >= _host_blocks.MIN_BYTES else _NO_CLEAR
        return cls._wrap(_FFI.buffer(new("char[]", nbytes)), shape, dtype)

    @classmethod
    def from_list(cls, values, dtype="float32"):
        """Return a 1-d Array holding ``values``; int dtypes take ints only."""
        dtype = _check_dtype(dtype, "Array.from_list")
        fmt = _DTYPES[dtype][0]
        try:
            items = list(values)
        except TypeError:
            raise TypeError(where_msg("Array.from_list", "values must be an "
                                      "iterable of numbers, got %s"
                                      % type(values).__name__)) from None
        data = b"".join(_pack_one(fmt, dtype, v, "Array.from_list", "values[%d]" % i)
                        for i, v in enumerate(items))
        return cls._wrap(bytearray(data), (len(items),), dtype)

    @classmethod
    def from_bytes(cls, data, shape, dtype="float32"):
        """Return an Array of ``shape``/``dtype`` copied from raw bytes."""
        dtype = _check_dtype(dtype, "Array.from_bytes")
        shape = _check_shape(shape, "Array.from_bytes")
        if isinstance(data, (int, str)):         # bytearray(4) would be 4 zero bytes, bytearray("x") a TypeError
            raise TypeError(where_msg("Array.from_bytes", "data must be bytes-like (bytes, bytearray, a "
                                      "buffer), got %s" % type(data).__name__))
        buf = bytearray(data)
        need = _prod(shape) * _DTYPES[dtype][2]
        if len(buf) != need:
            raise ValueError(where_msg("Array.from_bytes", "got %d bytes; shape "
                                       "%r of %s needs %d" % (len(buf), shape,
                                                              dtype, need)))
        return cls._wrap(buf, shape, dtype)

    @classmethod
    def from_buffer(cls, obj, dtype=None):
        """Return a copy of any buffer-protocol object or CPU torch tensor (one
        that requires grad is read through its data), keeping its shape.

        The dtype is read from the buffer's format; passing a different
        ``dtype`` is refused (TypeError) -- this never casts. Device memory is
        refused (TypeError); so is a strided torch tensor (ValueError: pass
        ``x.contiguous()``), whose elements no memoryview can reach.
        """
        where = "Array.from_buffer"
        p = probe(obj, "obj", where)
        if p.dtype not in _DTYPES:
            raise TypeError(where_msg(where, "obj has dtype %s, which Array "
                                      "does not support" % p.dtype))
        if dtype is not None and _check_dtype(dtype, where) != p.dtype:
            raise TypeError(where_msg(where, "obj has dtype %s, not %s; "
                                      "mojo_train never casts" % (p.dtype, dtype)))
        if p.device:
            raise TypeError(where_msg(where, "obj is device memory; copy it to the host first "
                                      "(DeviceArray.to_host(), x.cpu())"))
        if not isinstance(p.view, memoryview):
            raise ValueError(where_msg(where, "obj is a strided view of shape %r; %s"
                                       % (p.shape, contiguous_fix(obj, "obj"))))
        return cls._from_probe(p)

    @classmethod
    def _from_probe(cls, p):
        """A copy of the host buffer a Probe describes, already checked (an Array dtype, a
        memoryview): for callers that probed the buffer themselves."""
        return cls._wrap(bytearray(p.view.tobytes()), p.shape, p.dtype)

    # ----- attributes ---------------------------------------------------
    @property
    def shape(self):
        """The shape, a tuple of ints."""
        return self._shape

    @property
    def dtype(self):
        """The dtype name, e.g. ``"float32"``."""
        return self._dtype

    @property
    def itemsize(self):
        """Bytes per element."""
        return _DTYPES[self._dtype][2]

    @property
    def size(self):
        """Number of elements (1 for a 0-d array)."""
        return _prod(self._shape)

    @property
    def nbytes(self):
        """Number of data bytes."""
        return len(self._buf)

    @property
    def ndim(self):
        """Number of dimensions."""
        return len(self._shape)

    @property
    def address(self):
        """The data address as an int, valid while this Array lives."""
        if self._address is None:
            cdata = _FFI.from_buffer(self._buf)
            try:
                self._address = int(_FFI.cast("uintptr_t", cdata))
            finally:
                _FFI.release(cdata)
        return self._address

    # ----- conversions ------------------------------------------------
    def memview(self):
        """Return a writable memoryview with this Array's format and shape.

        An Array with a zero in its shape gives a 1-d empty view, since
        memoryview cannot express zeros in a shape. (So does ``numpy.asarray`` of
        such an Array on Python >= 3.12, where numpy reads the buffer before
        ``__array_interface__``: reshape it to ``.shape``.)
        """
        fmt = _DTYPES[self._dtype][0]
        view = memoryview(self._buf)
        if self.size == 0:
            return view.cast(fmt)
        return view.cast(fmt, self._shape)

    def tolist(self):
        """Return the content as nested lists (a scalar for a 0-d Array)."""
        flat = memoryview(self._buf).cast(_DTYPES[self._dtype][0]).tolist()
        return _nest(flat, self._shape)

    def tobytes(self):
        """Return a copy of the raw data bytes."""
        return bytes(self._buf)

    def copy(self):
        """Return an independent copy."""
        return Array._wrap(bytearray(self._buf), self._shape, self._dtype)

    def reshape(self, *shape):
        """Return an Array of a new shape SHARING this one's memory.

        Accepts ``reshape(2, 3)`` or ``reshape((2, 3))``; one -1 is inferred.
        """
        dims = reshaped_dims(shape, self.size, "Array.reshape")
        arr = Array._wrap(self._buf, dims, self._dtype)
        arr._address = self._address
        return arr

    # ----- 1-d element access -----------------------------------------
    def _flat_index(self, index):
        if len(self._shape) != 1:
            raise TypeError(where_msg("Array", "int indexing works on 1-d "
                                      "Arrays only; this one has shape %r"
                                      % (self._shape,)))
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(where_msg("Array", "index must be an int, got %s"
                                      % type(index).__name__)) from None
        n = self._shape[0]
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(where_msg("Array", "index %d out of range for "
                                       "length %d" % (index, n)))
        return i * self.itemsize

    def __getitem__(self, index):
        """Return element ``index`` of a 1-d Array."""
        off = self._flat_index(index)
        return struct.unpack_from("<" + _DTYPES[self._dtype][0], self._buf, off)[0]

    def __setitem__(self, index, value):
        """Set element ``index`` of a 1-d Array."""
        off = self._flat_index(index)
        data = _pack_one(_DTYPES[self._dtype][0], self._dtype, value, "Array")
        self._buf[off:off + len(data)] = data

    def __len__(self):
        """Length of the first dimension; TypeError for a 0-d Array."""
        if not self._shape:
            raise TypeError(where_msg("Array", "len() of a 0-d Array"))
        return self._shape[0]

    def __iter__(self):
        """Iterate over the elements of a 1-d Array."""
        if len(self._shape) != 1:
            raise TypeError(where_msg("Array", "iteration works on 1-d Arrays "
                                      "only; this one has shape %r"
                                      % (self._shape,)))
        return iter(memoryview(self._buf).cast(_DTYPES[self._dtype][0]).tolist())

    def __repr__(self):
        if 0 < self.size <= 16:       # not an empty one: tolist() of shape (2**40, 0) is 2**40 lists
            return "Array(%r, shape=%r, dtype=%r)" % (self.tolist(), self._shape,
                                                      self._dtype)
        return "Array(shape=%r, dtype=%r)" % (self._shape, self._dtype)

    # ----- export protocols -------------------------------------------
    def __buffer__(self, flags):
        """Python >= 3.12 buffer protocol: export ``memview()``."""
        return self.memview()

    def __release_buffer__(self, view):
        """Python >= 3.12 buffer protocol: release a view from ``__buffer__``."""
        view.release()

    @property
    def __array_interface__(self):
        """numpy array interface (v3): lets ``numpy.asarray`` share memory."""
        return {"version": 3, "shape": self._shape,
                "typestr": _DTYPES[self._dtype][1],
                "data": (self.address, False), "strides": None}

    def __reduce__(self):
        return (Array.from_bytes, (bytes(self._buf), self._shape, self._dtype))
