"""``.npz`` files without numpy: a zip of ``.npy`` members.

Contract: :func:`write` stores each entry as ``<name>.npy`` (format 1.0, uncompressed, zip64
like ``numpy.savez``) -- float32, float64, int32, int64, uint32 and uint8 buffers in C order,
and ``str`` values as 0-d ``<U`` arrays -- so ``numpy.load`` reads them; the file appears
whole or not at all (written beside, then renamed). :func:`read` returns ``{name: Array or
str}`` and reads ``numpy.savez`` and ``numpy.savez_compressed`` files (``.npy`` formats 1.0,
2.0 and 3.0). Everything is checked and nothing is cast: the zip (CRCs included), the magic,
the header's keys, a little-endian dtype of ours, C order, the shape, and the exact byte
count. Sizes are checked against what the file can hold before anything is allocated (a
member's claimed size against its compressed size and the file's length, a header's claimed
shape against the bytes its member holds), so a damaged or crafted file cannot make us allocate
more than a small multiple of its own length. Every damaged file is a ValueError (``NpzError``)
naming the file and, where known, the member; a file that cannot be opened at all (missing,
unreadable) keeps the OSError ``open`` raises.
"""
import ast
import os
import struct
import zipfile
import zlib

from ._array import Array
from ._dtypes import ARRAY_DTYPES, DTYPES
from ._errors import where_msg
from ._probe import probe

_MAGIC = b"\x93NUMPY"
# .npy descr -> (our dtype, itemsize): an Array's dtypes, from the dtype table
_DESCR = {DTYPES[name].typestr: (name, DTYPES[name].itemsize) for name in ARRAY_DTYPES}
_DESCR_OF = {dtype: descr for descr, (dtype, _) in _DESCR.items()}
_HEADER_KEYS = {"descr", "fortran_order", "shape"}
# bytes a member's data may expand to per compressed byte (deflate's limit is 1032:1)
_EXPANSION = {zipfile.ZIP_STORED: 1, zipfile.ZIP_DEFLATED: 1032}
# what a damaged zip makes zipfile raise besides BadZipFile: a bad seek (OSError), an
# "encrypted" flag (RuntimeError), a bad method or version (NotImplementedError), short reads
_DAMAGE = (zipfile.BadZipFile, zlib.error, EOFError, UnicodeDecodeError, NotImplementedError,
           RuntimeError, OSError, struct.error, OverflowError)


class NpzError(ValueError):
    """A file or member that is not a well-formed .npz/.npy of what we read: the message is
    ``mojo_train.<where>: <text>``, ``text`` naming the file and, where known, the member."""

    def __init__(self, text, where="npz.read"):
        super().__init__(where_msg(where, text))
        self.text, self.where = text, where


def file_name(path, where):
    """``path`` as ``os.fspath`` gives it; anything else (a file object, None) is a TypeError."""
    try:
        return os.fspath(path)
    except TypeError:
        raise TypeError(where_msg(where, "path must be a file name (str, bytes or os.PathLike), got %s "
                                         "(for a file object, pass its name)" % type(path).__name__)) from None


# ---- writing ---------------------------------------------------------------------------------
def _npy_header(descr, shape):
    text = "{'descr': %r, 'fortran_order': False, 'shape': %r, }" % (descr, tuple(shape))
    size = len(_MAGIC) + 4 + len(text) + 1
    text += " " * (-size % 64) + "\n"                      # members align their data to 64 bytes
    return _MAGIC + b"\x01\x00" + struct.pack("<H", len(text)) + text.encode("latin1")


def _member(value, name):
    """(header, data bytes-like) of one entry."""
    if isinstance(value, str):
        data = value.encode("utf-32-le")
        return _npy_header("<U%d" % max(len(value), 1), ()), data or b"\0\0\0\0"
    where = "npz.write"
    p = probe(value, name, where)
    if p.device:
        raise TypeError(where_msg(where, "%s is device memory; pass .to_host()" % name))
    if p.dtype not in _DESCR_OF:
        raise TypeError(where_msg(where, "%s has dtype %s; .npz entries are %s or str"
                                  % (name, p.dtype, ", ".join(_DESCR_OF))))
    if not p.c_contiguous:
        raise ValueError(where_msg(where, "%s must be C-contiguous" % name))
    view = value.memview() if isinstance(value, Array) else p.view
    return _npy_header(_DESCR_OF[p.dtype], p.shape), view.cast("B") if p.nbytes else b""


def write(path, arrays):
    """Write ``arrays`` ({name: buffer or str}, names without '/') to ``path`` as .npz."""
    path = file_name(path, "npz.write")
    members = []
    for name, value in arrays.items():
        if not isinstance(name, str) or not name or "/" in name:
            raise ValueError(where_msg("npz.write", "bad entry name %r" % (name,)))
        members.append((name + ".npy",) + _member(value, name))
    tmp = "%s.%d.tmp" % (os.fsdecode(path), os.getpid())     # a bytes path too (not "b'...'")
    try:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
            for member, header, data in members:
                with zf.open(member, "w", force_zip64=True) as f:
                    f.write(header)
                    f.write(data)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


# ---- reading ---------------------------------------------------------------------------------
def _fail(path, member, why):
    raise NpzError("%s%s: %s" % (path, " (%s)" % member if member else "", why))


def _exact(f, n, path, member, what):
    data = f.read(n)
    if len(data) != n:
        _fail(path, member, "truncated: %s needs %d bytes, the member holds %d" % (what, n, len(data)))
    return data


def _parse_header(text, path, member):
    try:
        header = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        _fail(path, member, "the .npy header is not a Python literal: %r" % text[:80])
    if not isinstance(header, dict) or set(header) != _HEADER_KEYS:
        _fail(path, member, "the .npy header must be a dict with keys descr, fortran_order, shape; "
                            "got %r" % (text[:80],))
    shape, descr = header["shape"], header["descr"]
    if (not isinstance(shape, tuple) or
            not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        _fail(path, member, "bad shape %r" % (shape,))
    if header["fortran_order"] is not False and sum(d != 1 for d in shape) > 1:
        _fail(path, member, "Fortran-ordered data is not read (mojo_train never transposes); "
                            "save a C-ordered array")
    if not isinstance(descr, str) or (descr not in _DESCR and not _is_str_descr(descr)):
        _fail(path, member, "dtype %r is not read (little-endian %s, or <U text; nothing is cast "
                            "or byte-swapped)" % (descr, ", ".join(d for d, _ in _DESCR.values())))
    return descr, shape


def _is_str_descr(descr):
    digits = descr[2:]
    return descr.startswith("<U") and digits.isascii() and digits.isdigit() and len(digits) < 19 and int(digits) > 0


def _check_sizes(info, file_bytes, path):
    """Refuse a member whose claimed sizes the file cannot hold, before it is read."""
    member = info.filename
    expansion = _EXPANSION.get(info.compress_type)
    if expansion is None:
        _fail(path, member, "compression method %d is not read (numpy writes stored or deflated members)"
              % info.compress_type)
    if info.compress_size > file_bytes:
        _fail(path, member, "the zip directory claims %d compressed bytes; the whole file holds %d"
              % (info.compress_size, file_bytes))
    if info.file_size > expansion * info.compress_size or (expansion == 1 and info.file_size != info.compress_size):
        _fail(path, member, "the zip directory claims %d bytes from %d compressed bytes, which that "
                            "compression cannot give" % (info.file_size, info.compress_size))


class _Member:
    """A member's stream with the count of bytes it has left (from the zip directory)."""

    def __init__(self, f, info, path):
        self.f, self.left, self.path, self.name = f, info.file_size, path, info.filename

    def claim(self, n, what):
        """Refuse ``n`` bytes of ``what`` that the member cannot hold; nothing is allocated."""
        if n > self.left:
            _fail(self.path, self.name, "truncated: %s needs %d bytes, the member holds %d" % (what, n, self.left))

    def exact(self, n, what):
        self.claim(n, what)
        data = _exact(self.f, n, self.path, self.name, what)
        self.left -= n
        return data


def _read_member(zf, info, path, file_bytes):
    member = info.filename
    _check_sizes(info, file_bytes, path)
    with zf.open(info) as f:
        m = _Member(f, info, path)
        if m.exact(6, "the magic") != _MAGIC:
            _fail(path, member, "not a .npy member (bad magic)")
        major, _minor = m.exact(2, "the version")
        if major not in (1, 2, 3):
            _fail(path, member, ".npy format version %d is not read (1, 2, 3 are)" % major)
        size_fmt = "<H" if major == 1 else "<I"
        hlen = struct.unpack(size_fmt, m.exact(struct.calcsize(size_fmt), "the header length"))[0]
        text = m.exact(hlen, "the header").decode("utf-8" if major == 3 else "latin1")
        descr, shape = _parse_header(text, path, member)
        n = 1
        for d in shape:
            n *= d
        if _is_str_descr(descr):
            if shape != ():
                _fail(path, member, "text entries are 0-d; got shape %r" % (shape,))
            raw = m.exact(4 * int(descr[2:]), "the text")
            value = raw.decode("utf-32-le", errors="strict").rstrip("\0")
        else:
            dtype, itemsize = _DESCR[descr]
            m.claim(n * itemsize, "shape %r of %s" % (shape, descr))
            buf = bytearray(n * itemsize)
            got = f.readinto(buf) if buf else 0
            if got != len(buf):
                _fail(path, member, "truncated: shape %r of %s needs %d bytes, the member holds %d"
                      % (shape, descr, len(buf), got))
            value = Array._wrap(buf, shape, dtype)
        if f.read(1):
            _fail(path, member, "the member holds more bytes than its header describes")
    return value


def read(path):
    """{name: Array or str} of the .npz at ``path``; NpzError (a ValueError) when damaged or
    malformed. A file that cannot be opened keeps open's OSError (FileNotFoundError...)."""
    path = file_name(path, "npz.read")
    out = {}
    with open(path, "rb") as fp:
        try:
            file_bytes = os.fstat(fp.fileno()).st_size
            with zipfile.ZipFile(fp) as zf:
                for info in zf.infolist():
                    if not info.filename.endswith(".npy"):
                        _fail(path, info.filename, "every member of an .npz is a .npy file")
                    name = info.filename[:-4]
                    if name in out:
                        _fail(path, info.filename, "the member appears twice")
                    out[name] = _read_member(zf, info, path, file_bytes)
        except NpzError:
            raise
        except (ValueError,) + _DAMAGE as exc:        # zipfile's own ValueErrors (a bad seek) too
            raise NpzError("%s is not a readable .npz: %s: %s" % (path, type(exc).__name__, exc)) from None
    return out


def entry(arrays, name, path, dtype=None, shape=None):
    """arrays[name], checked: present; an Array of ``dtype`` (``str`` for text) and ``shape``."""
    if name not in arrays:
        _fail(path, None, "entry %r is missing (entries: %s)" % (name, ", ".join(sorted(arrays)) or "none"))
    value = arrays[name]
    if dtype is str:
        if not isinstance(value, str):
            _fail(path, name + ".npy", "expected text, got an array")
        return value
    if not isinstance(value, Array) or (dtype is not None and value.dtype != dtype):
        _fail(path, name + ".npy", "expected %s, got %s" % (dtype, "text" if isinstance(value, str) else value.dtype))
    if shape is not None and value.shape != tuple(shape):
        _fail(path, name + ".npy", "expected shape %r, got %r" % (tuple(shape), value.shape))
    return value
