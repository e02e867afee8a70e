"""Device memory: ``DeviceArray`` and ``to_device``.

A DeviceArray is memory of the loaded GPU vendor (allocated through the library's own
``mt_device_alloc``), with a shape and a dtype. It exports ``__cuda_array_interface__`` and
``__dlpack__`` (so torch and CuPy can view it without a copy) -- on Metal, whose memory is
shared storage the CPU addresses, ``__dlpack__`` as a CPU array (``numpy.from_dlpack`` and
``torch.from_dlpack`` view it in place) and no CUDA interface -- and every op takes it where it
takes a host buffer; results stay on the device. ``to_host()`` copies back into a
``mojo_train.Array``. Foreign device tensors (torch CUDA tensors, CuPy arrays, anything with
``__cuda_array_interface__`` or DLPack) are accepted by the ops directly, in place.
"""
import threading

from ._array import Array, _check_shape, reshaped_dims
from ._dtypes import ARRAY_DTYPES, DTYPES
from ._errors import where_msg
from ._native import SHARED_MEMORY_VENDORS, ffi, load, numeric_mode_arg
from ._probe import probe

__all__ = ["DeviceArray", "to_device", "transfer_bytes", "memory_stats", "release_device_cache"]

# the dtypes a DeviceArray holds (an Array's), with their typestr and itemsize
_TYPESTR = {name: DTYPES[name].typestr for name in ARRAY_DTYPES}
_ITEMSIZE = {name: DTYPES[name].itemsize for name in ARRAY_DTYPES}


def gpu_backend(numeric_mode, where):
    """The loaded backend, which must be a GPU vendor."""
    backend = load(numeric_mode_arg(numeric_mode, where))
    if backend.vendor == "cpu":
        raise RuntimeError(where_msg(where, "the loaded vendor is cpu, which has no device memory; set "
                                     "MOJO_TRAIN_VENDOR=cuda (or auto on a machine with a GPU)"))
    return backend


_FLOAT_P, _VOID_PP, _UINTPTR = (ffi.typeof(t) for t in ("float *", "void **", "uintptr_t"))


_SLOT = threading.local()    # a thread's void *[1] for mt_device_alloc's result (ffi.new is slow)


class _Allocation:
    """One device allocation, freed when the last array viewing it is gone. Made on every op's
    new output, so its host time counts: the pointer is kept as the cdata the allocation gave
    (``vp``), cast from it and freed through it, and its integer value is formed only when
    asked for (``ptr``)."""

    __slots__ = ("backend", "vp", "nbytes", "_free")

    def __init__(self, backend, nbytes):
        # taken out of the thread's slot while in use: Python code that runs between the call and
        # the read (a trace function, a signal handler, a finalizer) may allocate too
        slot = _SLOT.__dict__
        out = slot.pop("out", None) or ffi.new(_VOID_PP)
        lib = backend.lib
        rc = lib.mt_device_alloc(out, nbytes if nbytes > 1 else 1)
        vp = out[0]
        slot["out"] = out
        if rc:
            backend.check(rc, "DeviceArray")
        self.backend, self.vp, self.nbytes, self._free = backend, vp, nbytes, lib.mt_device_free

    @property
    def ptr(self):
        return int(ffi.cast(_UINTPTR, self.vp))

    def float_ptr(self, offset):
        """``float *`` at byte ``offset``."""
        return ffi.cast(_FLOAT_P, self.vp) if not offset else ffi.cast(_FLOAT_P, self.ptr + offset)

    def __del__(self):
        try:
            self._free(self.vp)
        except Exception:   # interpreter shutdown
            pass


class _Borrowed:
    """Device memory another library allocated (``owner``, e.g. a torch tensor, keeps it alive
    for as long as an array views it); never freed here."""

    __slots__ = ("backend", "ptr", "nbytes", "owner")

    def __init__(self, backend, ptr, nbytes, owner):
        self.backend, self.ptr, self.nbytes, self.owner = backend, int(ptr), nbytes, owner

    def float_ptr(self, offset):
        return ffi.cast(_FLOAT_P, self.ptr + offset)


def _checked_shape(shape, dtype):
    """(shape tuple, element count) of a DeviceArray of ``dtype``, refused by name when bad."""
    if dtype not in _TYPESTR:
        raise TypeError(where_msg("DeviceArray", "dtype %r is not supported (%s)" % (dtype, ", ".join(_TYPESTR))))
    shape = _check_shape(shape, "DeviceArray")
    n = 1
    for d in shape:
        n *= d
    return shape, n


class DeviceArray:
    """An n-d array in GPU memory. ``DeviceArray(shape, dtype='float32')`` is zero-filled."""

    __slots__ = ("_alloc", "_offset", "shape", "dtype", "_cptr", "nbytes", "__weakref__")

    def __init__(self, shape, dtype="float32", numeric_mode=None, _alloc=None, _offset=0):
        shape, n = _checked_shape(shape, dtype)
        self.shape, self.dtype, self._offset = shape, dtype, _offset
        self.nbytes = n * _ITEMSIZE[dtype]
        if _alloc is None:
            _alloc = _Allocation(gpu_backend(numeric_mode, "DeviceArray"), self.nbytes)
            self._alloc = _alloc
            self._zero()
        self._alloc = _alloc
        self._cptr = _alloc.float_ptr(_offset)   # for the hot calls

    @classmethod
    def empty(cls, shape, dtype="float32", numeric_mode=None):
        """An uninitialised DeviceArray (for outputs a kernel fills completely)."""
        shape, n = _checked_shape(shape, dtype)
        nbytes = n * _ITEMSIZE[dtype]
        alloc = _Allocation(gpu_backend(numeric_mode, "DeviceArray"), nbytes)
        return cls._over(shape, dtype, nbytes, alloc) if cls is DeviceArray else cls(shape, dtype, _alloc=alloc)

    @classmethod
    def _fresh(cls, backend, shape, n=None):
        """An uninitialised float32 DeviceArray of ``backend`` (a GPU vendor's), of a ``shape``
        already checked (an op's output, shaped by its inputs' probes), of ``n`` elements when
        the caller knows them."""
        if n is None:
            n = 1
            for d in shape:
                n *= d
        return cls._over(tuple(shape), "float32", 4 * n, _Allocation(backend, 4 * n))

    @classmethod
    def _over(cls, shape, dtype, nbytes, alloc, offset=0):
        """The array of checked ``shape`` and ``dtype`` over ``alloc`` from ``offset`` (no check
        again: an op's output is made on every call)."""
        a = object.__new__(cls)
        a.shape, a.dtype, a._offset, a.nbytes, a._alloc = shape, dtype, offset, nbytes, alloc
        a._cptr = alloc.float_ptr(offset)
        return a

    @classmethod
    def _borrowing(cls, shape, ptr, owner, dtype="float32", numeric_mode=None):
        """An uninitialised DeviceArray over device memory at ``ptr`` that ``owner`` allocated
        (at least the array's bytes) and keeps alive: the torch adapter's outputs, made by
        torch's caching allocator (mojo_train._ops.device_outputs). Private."""
        shape, n = _checked_shape(shape, dtype)
        alloc = _Borrowed(gpu_backend(numeric_mode, "DeviceArray"), ptr, n * _ITEMSIZE[dtype], owner)
        return cls(shape, dtype, _alloc=alloc)

    def _borrowed_from(self):
        """The object whose memory this array is, from its first byte to its last (the owner
        given to ``_borrowing``), or None: memory of our own, or a part of borrowed memory."""
        a = self._alloc
        return a.owner if isinstance(a, _Borrowed) and self._offset == 0 and self.nbytes == a.nbytes else None

    def _zero(self):
        """Zero-fill on the device (a kernel; nothing crosses the bus)."""
        if not self.nbytes:
            return
        b = self._alloc.backend
        table = ffi.new("float *[1]", [ffi.cast("float *", self.ptr)])
        offsets = ffi.new("int32_t[2]", [0, self.nbytes // 4])
        if self.nbytes % 4 or self.nbytes // 4 > 2 ** 31 - 1:
            zeros = Array((self.nbytes,), "uint8")
            self._copy(self.ptr, zeros.address, self.nbytes)
        else:
            b.check(b.lib.mt_fill_zero(table, offsets, 1), "DeviceArray")

    def _copy(self, dst, src, nbytes):
        b = self._alloc.backend
        b.check(b.lib.mt_memcpy(ffi.cast("void *", dst), ffi.cast("void *", src), nbytes), "DeviceArray")

    @property
    def ptr(self):
        """The device address (an int)."""
        return self._alloc.ptr + self._offset

    @property
    def size(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def ndim(self):
        return len(self.shape)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d DeviceArray")
        return self.shape[0]

    def to_host(self):
        """A new ``mojo_train.Array`` holding a copy of the data."""
        out = Array(self.shape, self.dtype)
        if self.nbytes:
            self._copy(out.address, self.ptr, self.nbytes)
        return out

    def copy_from(self, host):
        """Upload a host buffer of the same dtype and size into this array."""
        pb = probe(host, "host", "DeviceArray.copy_from")
        if pb.dtype != self.dtype or pb.nelems != self.size or not pb.c_contiguous:
            raise ValueError(where_msg("DeviceArray.copy_from", "need a C-contiguous %s buffer of %d elements, "
                                       "got %s of %d" % (self.dtype, self.size, pb.dtype, pb.nelems)))
        if self.nbytes:
            self._copy(self.ptr, pb.address, self.nbytes)
        return self

    def reshape(self, *shape):
        """A view with another shape (one -1 allowed); shares the memory."""
        shape = reshaped_dims(shape, self.size, "DeviceArray.reshape")
        return DeviceArray(tuple(shape), self.dtype, _alloc=self._alloc, _offset=self._offset)

    def _complete(self):
        """Before the memory is handed to another library: when the calling thread defers
        refusals (mojo_train.deferred), wait for its queued calls (raising a refusal among
        them, held for the next export until synchronize() collects it), so the data is
        complete on every stream, as a waiting call leaves it."""
        from . import deferred   # late: deferred is a sibling the package imports after this module
        deferred.complete_for_export(self._alloc.backend, "DeviceArray")

    @property
    def __cuda_array_interface__(self):
        vendor = self._alloc.backend.vendor
        if vendor in SHARED_MEMORY_VENDORS:   # AttributeError: hasattr() is False, as for any non-CUDA array
            raise AttributeError("a %s DeviceArray is shared memory the CPU addresses: it exports no "
                                 "__cuda_array_interface__; __dlpack__ gives it as a CPU array "
                                 "(numpy.from_dlpack, torch.from_dlpack)" % vendor)
        self._complete()
        return {"version": 3, "shape": self.shape, "typestr": _TYPESTR[self.dtype],
                "data": (self.ptr, False), "strides": None, "stream": None}

    def __dlpack_device__(self):
        from . import _dlpack   # late: ctypes is loaded only when DLPack is asked for (not a cycle)
        vendor = self._alloc.backend.vendor
        kind = (_dlpack.DL_CPU if vendor in SHARED_MEMORY_VENDORS else _dlpack.DL_ROCM if vendor == "hip"
                else _dlpack.DL_CUDA)
        return (kind, 0)

    def __dlpack__(self, stream=None, **kwargs):
        from . import _dlpack
        self._complete()
        kind, dev = self.__dlpack_device__()
        return _dlpack.export_capsule(self.ptr, self.shape, self.dtype, kind, dev, self)

    def __repr__(self):
        return "DeviceArray(shape=%r, dtype=%r, vendor=%r)" % (self.shape, self.dtype,
                                                             self._alloc.backend.vendor)

    def __reduce__(self):
        raise TypeError("mojo_train.DeviceArray cannot be pickled; pickle .to_host() instead")


def to_device(x, numeric_mode=None):
    """Copy a host buffer (any buffer-protocol object, float32 or integer) to a new DeviceArray."""
    return upload(probe(x, "x", "to_device"), numeric_mode)


def upload(pb, numeric_mode=None):
    """``to_device`` of a host buffer the caller has probed already (``pb``, its Probe)."""
    if not pb.c_contiguous:
        raise ValueError(where_msg("to_device", "x must be C-contiguous"))
    if pb.dtype not in _TYPESTR:
        raise TypeError(where_msg("to_device", "x has dtype %s; supported: %s" % (pb.dtype, ", ".join(_TYPESTR))))
    out = DeviceArray(pb.shape, pb.dtype, numeric_mode=numeric_mode, _alloc=_Allocation(
        gpu_backend(numeric_mode, "to_device"), pb.nbytes))
    if pb.nbytes:
        out._copy(out.ptr, pb.address, pb.nbytes)
    return out


def transfer_bytes(numeric_mode=None):
    """(host->device, device->host) bytes the loaded library has copied since it was loaded."""
    backend = load(numeric_mode_arg(numeric_mode, "transfer_bytes"))
    out = ffi.new("int64_t[2]")
    backend.check(backend.lib.mt_transfer_bytes(out), "transfer_bytes")
    return int(out[0]), int(out[1])


def memory_stats(reset=False, numeric_mode=None):
    """The loaded library's own scratch memory in bytes (not caller buffers or DeviceArrays):
    ``{'current': ..., 'peak': ...}``, the peak since load or the last ``reset=True`` (which
    then lowers the peak to the current value). On a GPU vendor this is device memory."""
    backend = load(numeric_mode_arg(numeric_mode, "memory_stats"))
    out = ffi.new("int64_t[2]")
    backend.check(backend.lib.mt_memory_stats(out, 1 if reset else 0), "memory_stats")
    return {"current": int(out[0]), "peak": int(out[1])}


def release_device_cache(numeric_mode=None):
    """Give device memory kept for reuse back to the GPU (torch.cuda.empty_cache's job).

    Dropping a DeviceArray on a GPU vendor keeps its block, once the device is idle, for the next
    array of the same size (at most 32 blocks and 2 GiB), so an op's new output costs no runtime
    call or synchronization; the stream-ordered pool keeps freed memory too. This gives both
    back: the blocks to the pool, and (CUDA) the pool's unused memory to the device. Arrays still
    alive are untouched; later drops are kept again. The cpu vendor and Metal keep nothing, so
    there it does nothing. The package calls the same at exit, so that a leak checker such as
    compute-sanitizer's memcheck finds every block freed. Each numeric mode is a library of its
    own: ``numeric_mode`` names one (default: the environment's), as for the arrays."""
    backend = load(numeric_mode_arg(numeric_mode, "release_device_cache"))
    backend.check(backend.lib.mt_device_release_cache(0), "release_device_cache")
