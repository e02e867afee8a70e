"""Argument plumbing shared by the loss and layer functions (loss.py, nn.py).

Contract: inputs are probed once (``_buffer.probe``), never cast: float tensors must be
float32 and C-contiguous; targets/ids are any integer buffer or a list of ints. All of a
call's tensors are on the host or all on the device (mixing is refused by name); device
tensors need a GPU vendor. Outputs are allocated here, on the inputs' side, uninitialised:
the native call fills them, and on refusal they are dropped, so nothing the caller owns is
ever written.
"""
from . import _buffer
from ._array import Array
from ._errors import where_msg
from ._native import ffi, load

_SIGNED_NATIVE = {"int32": 4, "int64": 8}


def f32_in(x, name, where, ndim=None):
    """The Probe of a read-only float32 input; ``ndim`` (int or tuple of ints) is checked."""
    p = _buffer.float32_tensor(x, name, where, allow_empty=True)
    if ndim is not None and len(p.shape) not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(where_msg(where, "%s must be %s-D, got shape %r"
                                   % (name, "- or ".join(str(d) for d in ((ndim,) if isinstance(ndim, int) else ndim)),
                                      tuple(p.shape))))
    return p


def ids_in(x, n, name, where):
    """(Probe, itemsize) of an integer input of n elements: a signed 4- or 8-byte buffer is
    used in place; any other integer buffer, or a list of ints, becomes an int64 copy on the
    host. Device buffers must already be int32 or int64."""
    if isinstance(x, (list, tuple)):
        try:
            x = Array.from_list([int(v) if not isinstance(v, (float, bool)) else _not_int(v, name, where)
                                 for v in x], "int64")
        except OverflowError:
            raise ValueError(where_msg(where, "%s holds a value outside int64" % name)) from None
    p = _buffer.int_tensor(x, name, where) if n else _buffer.probe(x, name, where)
    if p.nelems != n:
        raise ValueError(where_msg(where, "%s has %d elements, %d expected" % (name, p.nelems, n)))
    if p.dtype in _SIGNED_NATIVE:
        return p, _SIGNED_NATIVE[p.dtype]
    if p.device:
        raise TypeError(where_msg(where, "%s is a device %s buffer; on the device only int32 and "
                                  "int64 are read" % (name, p.dtype)))
    if p.dtype not in _buffer.INT_DTYPES:
        raise TypeError(where_msg(where, "%s has dtype %s; integer indices are required"
                                  % (name, p.dtype)))
    copy = Array.from_list(list(p.view.cast("B").cast(p.format)) if p.nelems else [], "int64")
    return _buffer.probe(copy, name, where), 8


def _not_int(v, name, where):
    raise TypeError(where_msg(where, "%s must hold integers, got %r" % (name, v)))


def placement(where, numeric_mode, **probes):
    """(backend, on_device) for one call: every given Probe (None skipped) on one side."""
    given = {k: p for k, p in probes.items() if p is not None}
    sides = {k: bool(p.device) for k, p in given.items()}
    on_device = any(sides.values())
    if on_device and not all(sides.values()):
        host = sorted(k for k, d in sides.items() if not d)
        dev = sorted(k for k, d in sides.items() if d)
        raise ValueError(where_msg(where, "%s on the device but %s on the host; pass all of them on "
                                   "one side" % (", ".join(dev), ", ".join(host))))
    backend = load(numeric_mode)
    if on_device and backend.vendor == "cpu":
        raise ValueError(where_msg(where, "device buffers were given but the loaded vendor is cpu; "
                                   "set MOJO_TRAIN_VENDOR=cuda"))
    return backend, on_device


def out_f32(shape, on_device, numeric_mode):
    """An uninitialised float32 output on the chosen side."""
    if on_device:
        from .device import DeviceArray
        return DeviceArray.empty(shape, numeric_mode=numeric_mode)
    return Array.empty(shape, "float32")


def fptr(x):
    """``float *`` of an output we allocated, or of an input Probe (None -> NULL)."""
    if x is None:
        return ffi.NULL
    if isinstance(x, Array):
        return ffi.cast("float *", x.address)
    if isinstance(x, _buffer.Probe):
        return ffi.cast("float *", x.address)
    return ffi.cast("float *", x.ptr)


def vptr(p):
    """``void *`` of an input Probe."""
    return ffi.cast("void *", p.address)
