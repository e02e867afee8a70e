"""Argument plumbing shared by the loss and layer functions (loss.py, linear.py, rms_norm.py, ...).

Contract: inputs are probed once (``_buffer.probe``), never cast: float tensors must be
float32 and C-contiguous; targets/ids are any integer buffer or a list of ints. All of a
call's tensors are on the host or all on the device (mixing is refused by name); device
tensors need a GPU vendor. Outputs are allocated here, on the inputs' side, uninitialised:
the native call fills them, and on refusal they are dropped, so nothing the caller owns is
ever written. A refusal from the native library is raised by ``check``, naming the arguments
as the caller spelled them where the C names differ (``hidden`` -> ``input``, ...).
"""
import contextlib
import numbers
import operator
import re
import threading

from . import _buffer
from ._array import Array
from ._dtypes import DTYPES
from ._errors import where_msg
from ._native import MAP_FLAGS, ffi, load, numeric_mode_arg
from ._probe import _TORCH, _kind as _probe_kind, torch_fields
from .device import DeviceArray

_MAP_OUT_FRESH = MAP_FLAGS["out_fresh"]
_SIGNED_NATIVE = {name: DTYPES[name].itemsize for name in ("int32", "int64")}   # ids read in place
_INT64 = (-2 ** 63, 2 ** 63 - 1)


def f32_in(x, name, where, ndim=None):
    """The Probe of a read-only float32 input; ``ndim`` (int or tuple of ints) is checked."""
    p = _buffer.float32_tensor(x, name, where, allow_empty=True)
    if ndim is not None and len(p.shape) not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(where_msg(where, "%s must be %s-D, got shape %r"
                                   % (name, "- or ".join(str(d) for d in ((ndim,) if isinstance(ndim, int) else ndim)),
                                      tuple(p.shape))))
    return p


def int_probe(x, name, where):
    """The Probe of an integer argument: a list or tuple of ints becomes an int64 Array first
    (a value that is no integer, or outside int64, is refused naming its index)."""
    if isinstance(x, (list, tuple)):
        x = Array.from_list(_int64_values(x, name, where), "int64")
    return _buffer.probe(x, name, where)


def ids_in(x, n, name, where, shape=None):
    """(Probe, itemsize) of an integer input of n elements (and of ``shape``, when given): a
    signed 4- or 8-byte buffer is used in place; any other integer buffer, or a list of ints,
    becomes an int64 copy on the host (a value outside int64 is refused naming its index).
    Device buffers must already be int32 or int64. ``x`` may be the Probe ``int_probe`` gave
    (its entry point probes each argument once)."""
    p = x if type(x) is _buffer.Probe else int_probe(x, name, where)
    if n:
        p = _buffer.int_tensor(p, name, where)
    if p.nelems != n:
        raise ValueError(where_msg(where, "%s has %d elements, %d expected" % (name, p.nelems, n)))
    if shape is not None and tuple(p.shape) != tuple(shape):
        raise ValueError(where_msg(where, "%s must have shape %r, got %r" % (name, tuple(shape), tuple(p.shape))))
    if p.dtype in _SIGNED_NATIVE:
        return p, _SIGNED_NATIVE[p.dtype]
    if p.device:
        raise TypeError(where_msg(where, "%s is a device %s buffer; on the device only int32 and "
                                  "int64 are read" % (name, p.dtype)))
    if p.dtype not in _buffer.INT_DTYPES:
        raise TypeError(where_msg(where, "%s has dtype %s; integer indices are required"
                                  % (name, p.dtype)))
    values = _int64_values(p.view.cast("B").cast(p.format), name, where) if p.nelems else []
    return _buffer.probe(Array.from_list(values, "int64"), name, where), 8


def _int64_values(values, name, where):
    """The values as Python ints, each an integer (bool refused) that fits in int64."""
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool):
            raise TypeError(where_msg(where, "%s must hold integers, got %r at %s[%d]" % (name, v, name, i)))
        try:
            v = operator.index(v)
        except TypeError:
            raise TypeError(where_msg(where, "%s must hold integers, got %r at %s[%d]"
                                      % (name, v, name, i))) from None
        if not _INT64[0] <= v <= _INT64[1]:
            raise ValueError(where_msg(where, "%s[%d] = %d does not fit in int64" % (name, i, v)))
        out.append(v)
    return out


# A one-letter C argument name ("a", "x") where a message uses it as a name (before "[",
# " holds", " is ", ...), not as a word of prose ("a 96 x 50304 product", "a GPU"); longer
# names ("hidden", "weight") are renamed wherever they stand as a word.
_ARGUMENT = r"(?<![\w.])(%s)(?='s\b|\[| holds\b| is\b| and \w+ overlap| overlap| has\b| must\b| of shape|:|,|$)"


def check(backend, rc, where, names=None, rewrite=None):
    """``backend.check(rc, where)``, the library's message then naming the caller's arguments:
    ``names`` maps a C argument name (a whole word of the message) to the caller's name;
    ``rewrite`` (text -> text), applied after, tells what names cannot (an indexed C argument,
    what a refusal left written)."""
    if not rc:
        return
    try:
        backend.check(rc, where)
    except Exception as exc:
        if not (names or rewrite) or not isinstance(exc, (ValueError, TypeError)):
            raise
        text = str(exc).split(": ", 1)[1]
        text = rename_arguments(text, names) if names else text
        raise type(exc)(where_msg(where, rewrite(text) if rewrite else text)) from None


def rename_arguments(text, names):
    """``text`` (a message without its ``mojo_train.<where>:`` prefix) with every C argument name
    of ``names`` (a whole word; one letter only where it stands as a name) replaced, in one
    pass, by the caller's name it maps to."""
    # each name with the apostrophe of a plural's possessive ("the logits' shape"), which becomes
    # "'s" when the caller's name is singular ("the input's shape")
    pattern = "|".join((_ARGUMENT if len(c) == 1 else r"\b(%s)\b") % re.escape(c) +
                       ("(?:'(?!s))?" if len(c) > 1 and c.endswith("s") else "") for c in names)

    def renamed(m):
        new = names[next(g for g in m.groups() if g)]
        if m.group(0).endswith("'"):      # a quoted 'name' keeps its closing quote
            quoted = m.start() > 0 and m.string[m.start() - 1] == "'"
            return new + ("'" if quoted or new.endswith("s") else "'s")
        return new
    return re.sub(pattern, renamed, text)


def placement(where, numeric_mode, **probes):
    """(backend, on_device) for one call: every given Probe (None skipped) on one side. Metal too,
    though its shared memory could take a mix: code written there must run on CUDA as it is."""
    given = {k: p for k, p in probes.items() if p is not None}
    sides = {k: bool(p.device) for k, p in given.items()}
    on_device = any(sides.values())
    if on_device and not all(sides.values()):
        host = sorted(k for k, d in sides.items() if not d)
        dev = sorted(k for k, d in sides.items() if d)
        raise ValueError(where_msg(where, "%s on the device but %s on the host; pass all of them on "
                                   "one side" % (", ".join(dev), ", ".join(host))))
    backend = load(numeric_mode_arg(numeric_mode, where))
    if on_device and backend.vendor == "cpu":
        raise ValueError(where_msg(where, "device buffers were given but the loaded vendor is cpu; "
                                   "set MOJO_TRAIN_VENDOR=cuda"))
    return backend, on_device


_DEVICE_OUTPUTS = threading.local()


@contextlib.contextmanager
def device_outputs(allocate):
    """Within this block, on this thread, every device output an entry point allocates is
    ``allocate(shape, numeric_mode)`` (an uninitialised float32 DeviceArray of that shape) instead
    of a DeviceArray of the library's own memory: the torch adapter passes torch's caching
    allocator, so a result is a torch tensor already -- no allocation and synchronization of
    ours, no DLPack capsule, no device-wide synchronization when torch drops it. Private."""
    previous = getattr(_DEVICE_OUTPUTS, "allocate", None)
    _DEVICE_OUTPUTS.allocate = allocate
    try:
        yield
    finally:
        _DEVICE_OUTPUTS.allocate = previous


def out_f32(shape, on_device, numeric_mode, backend=None, n=None):
    """An uninitialised float32 output on the chosen side (device_outputs' allocator within one,
    for a non-empty device output: an empty torch tensor's address is NULL, which some entry
    points refuse for an output). ``backend``: the call's own (placement's), when ``shape``
    comes from its probes (a tuple of ints): the output is made without loading or checking
    again; ``n``: its element count, when the caller has it."""
    if on_device:
        allocate = getattr(_DEVICE_OUTPUTS, "allocate", None)
        if allocate is not None and all(shape):     # an empty one keeps a non-null address of ours
            return allocate(tuple(shape), numeric_mode)
        if backend is not None:
            return DeviceArray._fresh(backend, shape, n)
        return DeviceArray.empty(shape, numeric_mode=numeric_mode)
    return Array.empty(shape, "float32")


def plain_out(shape, n, on_device, backend):
    """The new float32 output of a plain path (``plain_f32_inputs``): ``shape`` (n elements) is
    its inputs', so a host Array is made without checking it again."""
    if on_device:
        return out_f32(shape, True, None, backend, n)
    return Array._empty_checked(shape, "float32", 4 * n)


_FLOAT_P = ffi.typeof("float *")


def plain_f32_inputs(xs):
    """(on_device, shape, n, [float *], keep) when every buffer of ``xs`` is a non-empty float32 one
    of ours (``mojo_train.Array`` or ``DeviceArray``, exactly those classes) or a plain contiguous
    float32 torch tensor, all on one side and of one shape -- the common call, whose checks are
    these field reads -- else None: the caller takes its general path, which probes every
    argument and refuses by name. ``keep`` holds the storage of each CPU torch tensor until the
    caller drops it (as the general path's probe does): memory another thread swaps out of the
    tensor during the native call stays alive."""
    side = shape = None
    ptrs, keep = [], []
    for x in xs:
        kind = type(x)
        if kind is DeviceArray:
            if x.dtype != "float32":
                return None
            dev, dims, ptr = True, x.shape, x._cptr
        elif kind is Array:
            if x._dtype != "float32":
                return None
            dev, dims, ptr = False, x._shape, ffi.cast(_FLOAT_P, x.address)
        elif _probe_kind(x) is _TORCH:
            fields = torch_fields(x)     # None for anything unusual (strided, sparse, a bit set, ...)
            if fields is None or fields[0] != "float32":
                return None
            dev, dims, ptr = fields[1], fields[2], ffi.cast(_FLOAT_P, fields[3])
            if not dev:
                keep.append(x.untyped_storage())
        else:
            return None
        if shape is None:
            side, shape = dev, dims
        elif dev != side or dims != shape:
            return None
        ptrs.append(ptr)
    n = 1
    for d in shape:
        n *= d
    return (side, tuple(shape), n, ptrs, keep) if n else None


def fptr(x):
    """``float *`` of an output we allocated, or of an input Probe (None -> NULL)."""
    if type(x) is DeviceArray:     # an op's own output: its pointer is made once
        return x._cptr
    if x is None:
        return ffi.NULL
    if isinstance(x, (_buffer.Probe, Array)):
        return ffi.cast(_FLOAT_P, x.address)
    return ffi.cast(_FLOAT_P, x.ptr)


def vptr(p):
    """``void *`` of an input Probe."""
    return ffi.cast("void *", p.address)


_SCRATCH = Array((1,), "float32")   # stands in for the address of an empty buffer


def fptr_nonnull(x):
    """``float *`` of an output or input; an empty buffer (address 0) gets a stand-in."""
    p = fptr(x)
    return p if p != ffi.NULL else ffi.cast("float *", _SCRATCH.address)


def out_arg(where, out, shape, inputs):
    """The Probe of a caller's ``out=`` (None when not given): a writable float32 buffer of
    exactly the result's ``shape`` (the element count alone is not enough), either disjoint
    from every input (``(name, Probe)`` pairs) or one of them itself (in place)."""
    if out is None:
        return None
    pout = _buffer.float32_tensor(out, "out", where, inplace=True, allow_empty=True)
    if tuple(pout.shape) != tuple(shape):
        raise ValueError(where_msg(where, "out has shape %r; the result's shape is %r"
                                   % (tuple(pout.shape), tuple(shape))))
    _buffer.refuse_overlap(where, ("out", pout), inputs)
    return pout


class Fresh:
    """``out=Fresh(buffer)``: an output buffer allocated for this one result and dropped by its
    owner on a refusal (the torch adapter's ``torch.empty`` outputs), so a native map may fuse its
    finiteness check into its one pass (MT_MAP_OUT_FRESH). Private: a user's ``out=`` is never
    fresh."""
    __slots__ = ("buffer",)

    def __init__(self, buffer):
        self.buffer = buffer


def unwrap_fresh(out):
    """(the out= buffer, whether it was declared Fresh)."""
    return (out.buffer, True) if isinstance(out, Fresh) else (out, False)


def map_flags(pout, fresh=False):
    """The ``flags`` of a native map (mojo_train.h, enum mt_map_flags): MT_MAP_OUT_FRESH when
    the output is the one this call allocates (no caller ``out=``) or a ``Fresh`` one, so the
    native finiteness check may ride along in the map's one pass; 0 keeps the pre-pass that
    leaves a caller's ``out=`` untouched on a refusal."""
    return _MAP_OUT_FRESH if pout is None or fresh else 0


def int_arg(value, name, where, low, high):
    """``value`` as an int in ``[low, high]``: TypeError for a non-int (bool included), else
    ValueError naming ``name`` and the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "%s must be an int, got %r" % (name, value)))
    v = int(value)
    if not low <= v <= high:
        raise ValueError(where_msg(where, "%s must be in [%d, %d], got %d" % (name, low, high, v)))
    return v


# ---- shapes of the layers (linear.py, rms_norm.py, elementwise.py's relu) ----------------------
def leading_rows(shape):
    """The rows of a ``(..., K)`` tensor: the product of every dimension but the last."""
    n = 1
    for d in shape[:-1]:
        n *= d
    return n


def at_least_1d(p, name, what, where):
    """Refuse a 0-d ``p``; ``what`` spells the expected shape (``"..., K"``)."""
    if not p.shape:
        raise ValueError(where_msg(where, "%s must have at least one dimension (%s), got a "
                                   "0-d tensor" % (name, what)))


def vector_of(p, n, name, where):
    """Refuse a ``p`` (None: not given) whose shape is not ``(n,)``."""
    if p is not None and tuple(p.shape) != (n,):
        raise ValueError(where_msg(where, "%s must have shape (%d,) (one per output), got %r"
                                   % (name, n, tuple(p.shape))))


def dy_like_x(pdy, px, where):
    """Refuse a gradient ``dy`` whose shape is not ``x``'s."""
    if tuple(pdy.shape) != tuple(px.shape):
        raise ValueError(where_msg(where, "dy must have x's shape %r, got %r"
                                   % (tuple(px.shape), tuple(pdy.shape))))
