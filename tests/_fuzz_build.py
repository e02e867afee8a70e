"""The fuzz worker's hands: it turns an example's plain-data description into the objects a call
gets (buffers of every container the library takes, aliases and overlapping views of them,
lists, hostile non-buffers), and reads back the bytes of every caller buffer.

A description is nested plain data (tuples, lists, numbers, strings), so the hypothesis strategy
that draws it runs in the parent process, which shrinks it, while this module builds it in the
worker (tests/_fuzz_worker.py). Forms:

    ("lit", value)                   the value itself (numbers, strings, None, plain containers)
    ("buf", dtype, shape, kind, fill, seed, special)
                                     a buffer: ``kind`` is its container (KINDS), ``fill`` how its
                                     values are drawn (FILLS, or ("ids", low, high) for integers),
                                     ``special`` ((flat index, "nan" | "inf" | "-inf" | "-0"), ...)
    ("list", [spec, ...]) / ("tuple", [spec, ...]) / ("dict", {key: spec})
    ("alias", name, index)           the object built for argument ``name`` (item ``index`` of it
                                     when that is a list; None: the argument itself)
    ("view", name, index, start, shape, kind)
                                     a float32 view of ``shape`` into the memory of argument
                                     ``name`` (item ``index``), ``start`` elements in
    ("obj", what, *params)           a non-buffer object (OBJECTS), e.g. ("obj", "generator", 7)

Every host buffer is made over a numpy array of bytes (its "base"), which the torch tensors and
views share, so a snapshot is the bytes of each base: a write anywhere in the memory a caller
owns shows, in the gaps of a strided view too.
"""
import array
import random

import numpy as np

from _helpers import wide_array

try:
    import torch
except ImportError:       # the torch containers are then not drawn (see available_kinds)
    torch = None

import mojo_train as mt

# Containers. Writable host buffers: array.array (1-D), a memoryview of a bytearray, numpy, an
# Array, a torch tensor (with requires_grad: "torch_grad"); read-only: a memoryview of bytes;
# non-contiguous: a numpy view and a torch view of every other element, a transposed numpy
# matrix; "released": a released memoryview; "device": a DeviceArray (GPU vendors).
KINDS = ("array", "bytes_mv", "numpy", "Array", "torch", "torch_grad", "readonly", "numpy_strided",
         "torch_strided", "numpy_transposed", "released", "device")
HOST_KINDS = ("array", "bytes_mv", "numpy", "Array", "torch", "torch_grad", "readonly")
STRIDED_KINDS = ("numpy_strided", "torch_strided", "numpy_transposed")
FILLS = ("unit", "wide", "huge", "tiny", "zero", "pos")

_NP = {"float32": np.float32, "float64": np.float64, "float16": np.float16, "int8": np.int8,
       "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16,
       "uint32": np.uint32, "uint64": np.uint64, "bool": np.bool_, "complex64": np.complex64,
       "float32_be": np.dtype(">f4")}
_CHAR = {"float32": "f", "float64": "d", "int8": "b", "int16": "h", "int32": "i", "int64": "q",
         "uint8": "B", "uint16": "H", "uint32": "I", "uint64": "Q"}
_SPECIAL = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "-0": -0.0, "neg": -1.0}


def available_kinds(device):
    """The containers this process can build: torch ones when torch imports, "device" when the
    loaded vendor takes device buffers."""
    return tuple(k for k in KINDS if (torch is not None or not k.startswith("torch")) and (device or k != "device"))


def non_contiguous(kind, shape):
    """True when ``kind`` builds a buffer of ``shape`` that is really not C-contiguous (a view
    of fewer than two elements is contiguous whatever its strides)."""
    return kind in STRIDED_KINDS and count(shape) >= 2


def count(shape):
    n = 1
    for d in shape:
        n *= d
    return n


# ---- values -----------------------------------------------------------------------------------

def _values(dtype, n, fill, seed):
    """n values for ``dtype`` by ``fill`` (FILLS, or ("ids", low, high))."""
    rng = random.Random(seed)
    if isinstance(fill, (tuple, list)):
        _, low, high = fill
        return [rng.randint(low, high) for _ in range(n)]
    if dtype == "bool":
        return [rng.random() < 0.5 for _ in range(n)]
    if fill == "wide":
        return list(wide_array(n, seed, -30, 7))
    if fill == "huge":
        return [rng.choice((-1.0, 1.0)) * 10.0 ** rng.uniform(30, 38.5) for _ in range(n)]
    if fill == "tiny":
        return [rng.choice((-1.0, 1.0)) * rng.randint(1, 2 ** 23) * 2.0 ** -149 for _ in range(n)]
    if fill == "zero":
        return [0.0] * n
    if fill == "pos":
        return [rng.uniform(0.0, 1.0) for _ in range(n)]
    return [rng.uniform(-1.0, 1.0) for _ in range(n)]


def _ndarray(dtype, shape, fill, seed, special):
    """A fresh C-contiguous numpy array of the values (dtype "bfloat16" is built as float32 and
    converted by torch later)."""
    n = count(shape)
    np_dtype = _NP["float32" if dtype == "bfloat16" else dtype]
    values = _values(dtype, n, fill, seed)
    if np.dtype(np_dtype).kind in "iu":
        info = np.iinfo(np_dtype)
        values = [min(max(int(v), int(info.min)), int(info.max)) for v in values]
    with np.errstate(over="ignore", invalid="ignore"):
        out = np.array(values, dtype=np_dtype).reshape(shape)
    for index, what in special:      # a float special in a float buffer, an int in an integer one
        kind = np.dtype(np_dtype).kind
        if n and (kind in "fc" if isinstance(what, str) else kind in "iu"):
            out.reshape(-1)[index % n] = _SPECIAL[what] if isinstance(what, str) else what
    return out


# ---- containers -------------------------------------------------------------------------------

class Built:
    """What the worker built for one example: ``objects[name]`` the argument as passed, and the
    bytes bases (numpy arrays sharing the caller's memory, or device arrays) under each name."""

    def __init__(self, numeric_mode):
        self.numeric_mode = numeric_mode
        self.objects, self.bases = {}, {}


def _wrap(values, kind, numeric_mode):
    """(object, base) for the numpy array ``values`` in container ``kind``."""
    shape, dtype = values.shape, values.dtype
    char = _CHAR.get(str(dtype)) if dtype.byteorder in "=|<" else None
    if kind == "array" and char and values.ndim == 1:
        obj = array.array(char, values.tobytes())
        return obj, np.frombuffer(obj, np.uint8) if len(obj) else np.zeros(0, np.uint8)
    if kind == "released":
        obj = memoryview(values)
        obj.release()
        return obj, values.reshape(-1).view(np.uint8)
    if kind in ("array", "bytes_mv", "readonly") and char and count(shape) and shape:
        raw = bytes(values.tobytes()) if kind == "readonly" else bytearray(values.tobytes())
        return memoryview(raw).cast("B").cast(char, shape), np.frombuffer(raw, np.uint8)
    if kind == "Array" and str(dtype) in mt._array._DTYPES and dtype.byteorder in "=|<":
        obj = mt.Array.from_bytes(values.tobytes(), shape, str(dtype))
        return obj, np.frombuffer(obj._buf, np.uint8) if obj.nbytes else np.zeros(0, np.uint8)
    if kind in ("torch", "torch_grad") and torch is not None and dtype.byteorder in "=|<" and dtype != np.uint16:
        obj = torch.from_numpy(values)
        if kind == "torch_grad" and dtype.kind == "f":
            obj.requires_grad_(True)
        return obj, values.reshape(-1).view(np.uint8)
    if kind == "readonly":
        values.setflags(write=False)
    return values, values.reshape(-1).view(np.uint8)


def _strided(values, kind):
    """(object, base): ``values`` seen through a non-contiguous view (every other element of a
    doubled last dimension; or a transposed copy)."""
    if kind == "numpy_transposed" and values.ndim == 2 and min(values.shape) >= 2:
        base = np.ascontiguousarray(values.T)
        return base.T, base.view(np.uint8).reshape(-1)
    base = np.zeros(values.shape + (2,), values.dtype)
    base[..., 0] = values
    view = base[..., 0]
    if kind == "torch_strided" and torch is not None and values.dtype.byteorder in "=|<":
        return torch.from_numpy(base)[..., 0], base.view(np.uint8).reshape(-1)
    return view, base.view(np.uint8).reshape(-1)


def _buffer(spec, numeric_mode):
    _, dtype, shape, kind, fill, seed, special = spec
    values = _ndarray(dtype, tuple(shape), fill, seed, special)
    if kind in STRIDED_KINDS:
        return _strided(values, kind)
    if kind == "device":
        if str(values.dtype) not in mt._array._DTYPES or values.dtype.byteorder not in "=|<":
            return _foreign_device(values, numeric_mode)
        dev = mt.to_device(mt.Array.from_bytes(values.tobytes(), values.shape, str(values.dtype)),
                           numeric_mode=numeric_mode)
        return dev, dev
    if dtype == "bfloat16" and torch is not None:
        obj = torch.from_numpy(values).to(torch.bfloat16)
        return obj, obj
    return _wrap(values, kind, numeric_mode)


def _foreign_device(values, numeric_mode):
    """Device memory of a dtype mojo_train cannot hold (float16, bool, ...): a torch CUDA tensor
    where torch has CUDA, else the bytes as a uint8 DeviceArray (one more dimension of the item
    size), which is refused for its dtype all the same."""
    if torch is not None and torch.cuda.is_available() and values.dtype.byteorder in "=|<" and \
            values.dtype != np.uint16:
        obj = torch.from_numpy(np.ascontiguousarray(values)).cuda()
        return obj, obj
    raw = np.frombuffer(values.tobytes(), np.uint8).reshape(values.shape + (values.dtype.itemsize,))
    dev = mt.to_device(mt.Array.from_bytes(raw.tobytes(), raw.shape, "uint8"), numeric_mode=numeric_mode)
    return dev, dev


def _view(spec, built):
    """A float32 view into the memory of an argument built before (an overlap of it)."""
    _, name, index, start, shape, kind = spec
    base = built.bases[name] if index is None else built.bases[name][index]
    host = np.frombuffer(base, np.uint8) if not isinstance(base, np.ndarray) else base
    n = count(shape)
    start = max(0, min(start, host.size // 4 - n))
    view = host[4 * start:4 * (start + n)].view(np.float32).reshape(shape)
    if kind == "torch" and torch is not None and view.flags.writeable:
        return torch.from_numpy(view), host
    return (memoryview(view) if kind == "bytes_mv" and view.ndim and n else view), host


class Unbufferable:
    """An object that is no buffer and no number: what a confused caller passes."""

    def __repr__(self):
        return "Unbufferable()"


def _object(spec, built):
    what = spec[1]
    if what == "object":
        return Unbufferable()
    if what == "generator":
        return mt.Generator(spec[2], numeric_mode=built.numeric_mode)
    if what == "dropout_key":
        return mt.DropoutKey(*spec[2])
    if what == "schedule":
        kind, args = spec[2], spec[3]
        return getattr(mt, kind)(**args)
    raise ValueError("unknown object spec %r" % (spec,))


def build(spec, built, name=None):
    """(object, base) for one spec; ``name`` registers a top-level argument's base."""
    tag = spec[0] if isinstance(spec, tuple) and spec and isinstance(spec[0], str) else "lit"
    if tag == "lit":
        obj, base = (spec[1] if isinstance(spec, tuple) and spec and spec[0] == "lit" else spec), None
    elif tag == "buf":
        obj, base = _buffer(spec, built.numeric_mode)
    elif tag == "dict":
        parts = {k: build(s, built) for k, s in spec[1].items()}
        obj, base = {k: p[0] for k, p in parts.items()}, [parts[k][1] for k in sorted(parts)]
    elif tag in ("list", "tuple"):
        parts = [build(s, built) for s in spec[1]]
        obj = [p[0] for p in parts] if tag == "list" else tuple(p[0] for p in parts)
        base = [p[1] for p in parts]
    elif tag == "alias":
        _, of, index = spec
        obj = built.objects[of] if index is None else built.objects[of][index]
        base = built.bases[of] if index is None else built.bases[of][index]
    elif tag == "view":
        obj, base = _view(spec, built)
    elif tag == "obj":
        obj, base = _object(spec, built), None
    else:
        raise ValueError("unknown spec %r" % (spec,))
    if name is not None:
        built.objects[name], built.bases[name] = obj, base
    return obj, base


# ---- reading back -----------------------------------------------------------------------------

def base_bytes(base):
    """The bytes of a base (None, a numpy array, a device array or a torch tensor; lists nest)."""
    if base is None:
        return None
    if isinstance(base, list):
        return [base_bytes(b) for b in base]
    if isinstance(base, np.ndarray):
        return base.tobytes()
    if isinstance(base, mt.DeviceArray):
        return base.to_host().tobytes()
    flat = base.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""


def snapshot(built):
    """{argument name: its bytes}, every caller buffer (lists nest)."""
    return {name: base_bytes(base) for name, base in built.bases.items()}


def host_values(obj):
    """A numpy copy of a buffer's elements in their logical shape (torch, device, Array,
    memoryview, numpy); None stays None."""
    if obj is None:
        return None
    if isinstance(obj, mt.DeviceArray):
        obj = obj.to_host()
    if isinstance(obj, mt.Array):
        return np.array(obj.memview() if obj.size else [], dtype=_NP[obj.dtype]).reshape(obj.shape)
    if torch is not None and isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        return (t.float() if t.dtype == torch.bfloat16 else t).numpy().copy()
    if isinstance(obj, memoryview) and obj.ndim == 0:
        return np.array(obj.tolist(), dtype=_NP["float32"] if obj.format == "f" else None)
    return np.array(obj, copy=True)
