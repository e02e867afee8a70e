"""The one dtype table of mojo_train: every module that names, sizes or recognises a dtype
derives what it needs from ``TABLE`` (no module keeps a literal table of its own).

Each row gives a dtype's name, its canonical struct/buffer format char (None when the buffer
protocol has none), its itemsize, its DLPack type code (bits = 8 * itemsize, lanes 1) and
whether a ``mojo_train.Array`` (and so a DeviceArray and an .npz entry) holds it. The
array-interface typestr (``'<f4'``, ``'|u1'``) follows from the code and the size. Row order
is the order messages list dtypes in. Imports nothing of mojo_train: it is the bottom layer.
"""
import collections

# DLPack's DLDataTypeCode values
KDL_INT, KDL_UINT, KDL_FLOAT, KDL_BFLOAT, KDL_COMPLEX, KDL_BOOL = 0, 1, 2, 4, 5, 6
_KIND = {KDL_INT: "i", KDL_UINT: "u", KDL_FLOAT: "f", KDL_COMPLEX: "c", KDL_BOOL: "b"}  # typestr letters


class DType(collections.namedtuple("DType", "name char itemsize code array")):
    """One row of the table (see the module docstring)."""

    __slots__ = ()

    @property
    def typestr(self):
        """The little-endian array-interface typestr, e.g. ``'<f4'``; None for bfloat16."""
        kind = _KIND.get(self.code)
        return kind and ("|" if self.itemsize == 1 else "<") + kind + str(self.itemsize)

    @property
    def dlpack(self):
        """The DLPack ``(code, bits)`` pair."""
        return self.code, 8 * self.itemsize


TABLE = tuple(DType(*row) for row in (
    # name        char  size  DLPack code   Array
    ("float32",    "f", 4,    KDL_FLOAT,    True),
    ("float64",    "d", 8,    KDL_FLOAT,    True),
    ("int32",      "i", 4,    KDL_INT,      True),
    ("int64",      "q", 8,    KDL_INT,      True),
    ("uint32",     "I", 4,    KDL_UINT,     True),
    ("uint8",      "B", 1,    KDL_UINT,     True),
    ("int8",       "b", 1,    KDL_INT,      False),
    ("int16",      "h", 2,    KDL_INT,      False),
    ("uint16",     "H", 2,    KDL_UINT,     False),
    ("uint64",     "Q", 8,    KDL_UINT,     False),
    ("float16",    "e", 2,    KDL_FLOAT,    False),
    ("bfloat16",   None, 2,   KDL_BFLOAT,   False),
    ("complex64",  None, 8,   KDL_COMPLEX,  False),
    ("complex128", None, 16,  KDL_COMPLEX,  False),
    ("bool",       "?", 1,    KDL_BOOL,     False),
))

DTYPES = {d.name: d for d in TABLE}
# what an Array, a DeviceArray and an .npz entry hold, in the table's order
ARRAY_DTYPES = tuple(d.name for d in TABLE if d.array)
FLOAT_DTYPES = frozenset(d.name for d in TABLE if d.code == KDL_FLOAT)
INT_DTYPES = frozenset(d.name for d in TABLE if d.code in (KDL_INT, KDL_UINT))
# the dtypes a host buffer can hold, by struct char and by typestr without its byte order
BY_CHAR = {d.char: d.name for d in TABLE if d.char}
BY_TYPESTR = {d.typestr[1:]: d.name for d in TABLE if d.char}
BY_DLPACK = {d.dlpack: d.name for d in TABLE}
# struct chars memoryview.cast accepts: all of ours but half precision
CASTABLE = frozenset(c for c in BY_CHAR if c != "e")


def native_formats(name):
    """The buffer formats a native-order buffer of dtype ``name`` reports (``'f'``, ``'<f'``...)."""
    char = DTYPES[name].char
    return frozenset(prefix + char for prefix in ("", "<", "=", "@"))
