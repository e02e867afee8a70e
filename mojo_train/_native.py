"""Finding, loading and checking the native library (cffi in ABI mode, no compiler needed).

The cdef is read from the C header's marked block, never pasted. A library is named
``libmojo_train_<vendor>_<numeric_mode>.so`` and searched, in order, in ``$MOJO_TRAIN_LIBRARY_PATH``,
the package's own ``lib/`` folder, and ``native/build/`` of a source checkout. After dlopen
the library's own ``mt_vendor()``, ``mt_numeric_mode()`` and ``mt_abi_version()`` are read
back; a library that disagrees with what was asked is refused, naming the file and the
command that rebuilds it. Every path tried is kept for :func:`backend_info`.

A library file is checked before dlopen, so that a damaged one is refused instead of crashing
the process (a truncated ``.so`` otherwise dies of SIGBUS inside dlopen):

* ELF (Linux): the header must be a 64-bit shared object of this host's byte order and machine,
  and its program headers, its section headers and every section and loaded segment must lie
  within the file. A library of another machine, class or byte order is refused as that, naming
  its machine and this host's, not as damage. Mach-O (macOS) is not parsed here: dyld itself
  refuses a file whose segments extend past its end, and dlopen's failure is reported like any other.
* Digest (checked first, so that a damaged header is never reported as a foreign library):
  ``make`` writes ``<library>.sha256`` (``sha256sum -c`` format) beside every library it
  builds, before moving the library into place, and ``pip install`` copies it into ``lib/``. A
  library whose manifest does not match is refused. A library in the package's ``lib/`` or in
  ``native/build/`` without a manifest is refused too (our builds always write one). A library
  found through ``$MOJO_TRAIN_LIBRARY_PATH`` without one is loaded (a user's own build or copy)
  and ``backend_info()['tried']`` says it had no manifest; with one, it is checked.
* After dlopen every name the cdef declares must resolve: a library missing one (a stub, a
  stale or foreign build) is refused naming the first missing symbol.

A refused file raises :class:`BackendError` naming the file and the rebuild command; it never
falls back to a later folder. The ``MOJO_TRAIN_*`` environment variables the package and its
libraries read are validated when mojo_train is imported (:func:`check_environment`), and
again when they are used, so a bad value is a ValueError naming the variable.
"""
import atexit
import os
import re
import struct
import sys
import threading

import cffi

from ._errors import where_msg

NUMERIC_MODES = ("identical", "deterministic", "fast", "identical_ftz")
VENDORS = ("cpu", "cuda", "hip", "metal", "metal_emulated")
# Vendors whose device memory is shared storage the host addresses (Apple silicon's Metal): a
# DeviceArray there is exported as a CPU array.
SHARED_MEMORY_VENDORS = ("metal", "metal_emulated")
AUTO_ORDER = ("cuda", "hip", "metal", "cpu")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.dirname(_PACKAGE_DIR)
_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"



class BackendError(ImportError):
    """No library could be loaded for the vendor and numeric mode asked for."""


# ---- the environment ---------------------------------------------------------------------------

def _one_of(*choices):
    return lambda v: v in choices, "one of " + ", ".join(choices)


def _choices_any_case(choices):
    return lambda v: v.strip().lower() in choices, "one of " + ", ".join(choices) + " (any case)"


# Every MOJO_TRAIN_* variable read by mojo_train or its libraries: (is a value allowed?, what is).
# The native readers (file named) compare their values exactly, so these are exact too.
_ENVIRONMENT = {
    "MOJO_TRAIN_NUMERIC_MODE": _choices_any_case(NUMERIC_MODES),
    "MOJO_TRAIN_VENDOR": _choices_any_case(("auto",) + VENDORS),
    "MOJO_TRAIN_NUM_THREADS": (lambda v: v.isdigit() and v.isascii() and int(v) >= 1,
                               "a whole number >= 1 (at most 64 threads are used)"),  # mt_pool.c
    "MOJO_TRAIN_CPU_GEMM": _one_of("avx512", "avx2", "scalar"),     # mt_cpu_gemm.c's kernels
    "MOJO_TRAIN_LR_EXACT_ONLY": _one_of("0", "1"),                  # mt_schedule.c
    "MOJO_TRAIN_CE_GLOBAL": _one_of("0", "1"),                      # mt_gpu_loss.cu
    "MOJO_TRAIN_CE_CLUSTER": _one_of("0", "1"),                     # mt_gpu_loss.cu
    "MOJO_TRAIN_LM_ONE_STREAM": _one_of("0", "1"),                  # mt_gpu_lm_head.cu
    "MOJO_TRAIN_RMS_ONE_PASS": _one_of("0", "1"),                   # mt_gpu_rms_norm.cu
    "MOJO_TRAIN_RMS_RELAY": _one_of("0", "1"),                      # mt_gpu_rms_norm.cu
    "MOJO_TRAIN_MAP_RING": _one_of("0", "1"),                       # mt_gpu_elementwise.cu
    "MOJO_TRAIN_HOST_CACHE_MB": (lambda v: v.isdigit() and v.isascii(),
                                 "a whole number of MiB >= 0 (0: no cache)"),   # _host_blocks.py
}
# MOJO_TRAIN_LIBRARY_PATH is a list of folders; a folder that does not exist is only reported
# by backend_info() as absent, like the package's own folders.


def check_environment(environ=None):
    """Raise ValueError naming the first MOJO_TRAIN_* variable whose value is not allowed."""
    environ = os.environ if environ is None else environ
    for name, (ok, allowed) in _ENVIRONMENT.items():
        value = environ.get(name)
        if value is not None and not ok(value):
            raise ValueError("mojo_train: the environment variable %s must be %s, got %r; "
                             "unset it or give an allowed value" % (name, allowed, value))


def _header_path():
    for path in (os.path.join(_PACKAGE_DIR, "include", "mojo_train.h"),
                 os.path.join(_SOURCE_ROOT, "native", "include", "mojo_train.h")):
        if os.path.isfile(path):
            return path
    raise BackendError("mojo_train: mojo_train.h not found beside the package or in native/include")


def _read_header():
    """(the cdef block, the preprocessor's MT_ABI_VERSION) of mojo_train.h."""
    with open(_header_path()) as f:
        text = f.read()
    begin, end = text.index("/* MT_CDEF_BEGIN */"), text.index("/* MT_CDEF_END */")
    abi = int(re.search(r"^#define MT_ABI_VERSION (\d+)$", text, re.M).group(1))
    return text[begin + len("/* MT_CDEF_BEGIN */"):end], abi


def _read_cdef():
    return _read_header()[0]


_CDEF, ABI_VERSION = _read_header()
ffi = cffi.FFI()
ffi.cdef(_CDEF)


def _enum(name, prefix):
    """{lower-case name without ``prefix``: value} of ``enum <name>`` in the header."""
    return {k[len(prefix):].lower(): v for k, v in ffi.typeof("enum " + name).relements.items()}


# The header's constants, never retyped: status codes, reductions, schedules, feature bits.
STATUS = _enum("mt_error_code", "MT_")
REDUCTIONS = _enum("mt_reduction", "MT_REDUCTION_")
SCHEDULES = _enum("mt_schedule_kind", "MT_SCHEDULE_")
FEATURES = _enum("mt_feature", "MT_FEATURE_")
MAP_FLAGS = _enum("mt_map_flags", "MT_MAP_")           # {'out_fresh': 1}
# The built-in exception a torch user would catch, per status.
_ERRORS = {STATUS["einval"]: ValueError, STATUS["enonfinite"]: ValueError, STATUS["enomem"]: MemoryError,
           STATUS["edevice"]: RuntimeError, STATUS["eunsupported"]: NotImplementedError}

_lock = threading.Lock()
_loaded = {}          # (vendor, numeric mode), or ("environment", its two raw values) -> Backend
_attempts = {}        # (vendor, numeric mode) -> [(path, outcome)]
_last_choice = {}     # what the most recent default load chose, and why
_exit_handlers = set()   # the GPU library files whose exit handler is registered


class Backend:
    """One loaded library: ``lib`` (the cffi handle), ``vendor``, ``numeric_mode``, ``path``."""

    def __init__(self, lib, vendor, numeric_mode, path):
        self.lib, self.vendor, self.numeric_mode, self.path = lib, vendor, numeric_mode, path
        self.features = int(lib.mt_features())

    def check(self, rc, where):
        """Raise the exception matching a nonzero status, with the library's message."""
        if rc:
            msg = ffi.string(self.lib.mt_last_error()).decode("utf-8", "replace")
            raise _ERRORS.get(rc, RuntimeError)(where_msg(where, msg))

    def has(self, feature):
        """Whether the library declares ``feature``: a name of the header's ``enum mt_feature``,
        lower case without its prefix (``"linear"``, ``"device_buffers"``)."""
        if feature not in FEATURES:
            raise ValueError("mojo_train: unknown feature %r; the features are %s"
                             % (feature, ", ".join(sorted(FEATURES))))
        return bool(self.features & FEATURES[feature])


def library_name(vendor, numeric_mode):
    return "libmojo_train_%s_%s%s" % (vendor, numeric_mode, _SUFFIX)


def rebuild_command(vendor, numeric_mode):
    target = "" if vendor == "cpu" else " " + vendor
    return "make%s   (in the source checkout; builds every numeric mode of %s)" % (target, vendor)


def _search_dirs():
    """(folder, is it one of ours) in search order; our folders' libraries need a manifest."""
    dirs = []
    env = os.environ.get("MOJO_TRAIN_LIBRARY_PATH")
    if env:
        dirs.extend((p, False) for p in env.split(os.pathsep) if p)
    dirs.append((os.path.join(_PACKAGE_DIR, "lib"), True))
    if os.path.isdir(os.path.join(_SOURCE_ROOT, "native", "include")):   # a source checkout
        dirs.append((os.path.join(_SOURCE_ROOT, "native", "build"), True))
    return dirs


# ---- the library file, before dlopen --------------------------------------------------------------

# ELF e_machine of the hosts we know (os.uname().machine); another host skips the machine check.
_ELF_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183, "ppc64le": 21, "ppc64": 21,
                 "s390x": 22, "riscv64": 243, "loongarch64": 258}
# what a refusal calls an e_machine (the number alone for any other)
_ELF_MACHINE_NAMES = {3: "32-bit x86", 40: "32-bit arm", 62: "x86-64", 183: "aarch64", 21: "ppc64",
                      22: "s390x", 243: "riscv", 258: "loongarch"}
_ELF_TYPES = {1: "a relocatable object (.o)", 2: "an executable", 4: "a core dump"}
_ELF_HEADER, _ELF_PHDR, _ELF_SHDR = 64, 56, 64
_PT_LOAD, _PT_DYNAMIC, _SHT_NOBITS, _ET_DYN = 1, 2, 8, 3
_DAMAGED = "is damaged or truncated: "
_REBUILD_HERE = "; it must be rebuilt on this machine"


def _machine_name(number):
    name = _ELF_MACHINE_NAMES.get(number)
    return "ELF machine %d" % number if name is None else "%s (ELF machine %d)" % (name, number)


def _elf_problem(f, size):
    """Why the open file ``f`` of ``size`` bytes is not a whole ELF shared library for this
    host, as "<is/was> ...", or None: a library of another machine, class, byte order or type
    says so; otherwise header, program and section header tables, segments and sections must
    all lie within the file (dlopen maps them unchecked, and touching a page past the end is
    SIGBUS), and anything else is damage."""
    head = f.read(_ELF_HEADER)
    if head[:4] != b"\x7fELF":
        if b"\x7fELF".startswith(head):
            return _DAMAGED + "%d bytes, less than an ELF header" % size
        return "is not an ELF file (it begins %r; %d bytes): it is damaged, truncated or not a library" % (
            head[:8], size)
    if len(head) < _ELF_HEADER:
        return _DAMAGED + "%d bytes, less than an ELF header (%d)" % (size, _ELF_HEADER)
    if head[4] not in (1, 2) or head[5] not in (1, 2):
        return _DAMAGED + "ELF class %d, data encoding %d (1 or 2 each)" % (head[4], head[5])
    e = "<" if head[5] == 1 else ">"
    e_type, machine = struct.unpack_from(e + "HH", head, 16)     # at the same place in both classes
    host = os.uname().machine
    want = _ELF_MACHINES.get(host.lower())
    if want is not None and machine != want:
        foreign = machine in _ELF_MACHINE_NAMES
        return "was built for %s, but this host is %s (ELF machine %d)%s%s" % (
            _machine_name(machine), host, want, "" if foreign else ", or is damaged", _REBUILD_HERE)
    if head[4] != 2:
        return "is a 32-bit library (ELF class 1), but this host loads 64-bit ones" + _REBUILD_HERE
    if head[5] != (1 if sys.byteorder == "little" else 2):
        return "is a %s-endian library, but this host is %s-endian%s" % (
            "big" if head[5] == 2 else "little", sys.byteorder, _REBUILD_HERE)
    if e_type != _ET_DYN:
        if e_type in _ELF_TYPES:
            return "is %s (ELF type %d), not a shared library" % (_ELF_TYPES[e_type], e_type)
        return _DAMAGED + "ELF type %d is not a shared object" % e_type
    (phoff, shoff, _, _, phentsize, phnum, shentsize, shnum, _) = struct.unpack_from(e + "QQIHHHHHH", head, 32)
    if phentsize != _ELF_PHDR or phnum == 0 or (shnum and shentsize != _ELF_SHDR):
        return _DAMAGED + "ELF header tables have unexpected entry sizes"
    problem = (_elf_table_problem(f, size, e, "segment", phoff, phnum)
               or _elf_table_problem(f, size, e, "section", shoff, shnum))
    return problem and _DAMAGED + problem


# item: (table, entry size, entry layout, indices of type / file offset / file size, checked?)
_ELF_TABLES = {
    "segment": ("program header", _ELF_PHDR, "IIQQQQQQ", (0, 2, 5), lambda t: t in (_PT_LOAD, _PT_DYNAMIC)),
    "section": ("section header", _ELF_SHDR, "IIQQQQIIQQ", (1, 4, 5), lambda t: t != _SHT_NOBITS),
}


def _elf_table_problem(f, size, e, item, off, count):
    """Why an ELF header table, or one of its segments or sections with file bytes, reaches
    past the end of the file, or None."""
    table, entry, fmt, (t, o, n), checked = _ELF_TABLES[item]
    if off + count * entry > size:
        return "its %s table ends at byte %d, past the end of the file (%d bytes)" % (
            table, off + count * entry, size)
    f.seek(off)
    rows = f.read(count * entry)
    for i in range(count):
        row = struct.unpack_from(e + fmt, rows, i * entry)
        if checked(row[t]) and row[o] + row[n] > size:
            return "its %s %d ends at byte %d, past the end of the file (%d bytes)" % (
                item, i, row[o] + row[n], size)
    return None


def _sha256(path):
    import hashlib        # only when a library is loaded: importing it costs ~4 ms
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _digest_problem(path, ours):
    """(why the library does not match its manifest or None, a note for backend_info)."""
    manifest = path + ".sha256"
    try:
        with open(manifest, encoding="ascii", errors="replace") as f:
            fields = f.read(4096).split()
    except FileNotFoundError:
        if ours:
            return "has no digest manifest %s beside it, which every build writes" % manifest, ""
        return None, " (no manifest: its sha256 was not checked)"
    if (len(fields) != 2 or not re.fullmatch(r"[0-9a-f]{64}", fields[0])
            or fields[1].lstrip("*") != os.path.basename(path)):
        return "has a malformed digest manifest %s" % manifest, ""
    got = _sha256(path)
    if got != fields[0]:
        return ("is damaged or truncated, or was rewritten after the build (stripped, repackaged): "
                "its sha256 is %s..., its digest manifest %s says %s... (a library changed on purpose "
                "loads from a folder of MOJO_TRAIN_LIBRARY_PATH without a manifest)"
                % (got[:12], manifest, fields[0][:12])), ""
    return None, ""


def _file_problem(path, ours):
    """(why ``path`` must not be dlopened, as "<is/has> ...", or None; a note for backend_info)."""
    try:
        problem, note = _digest_problem(path, ours)    # first: a file unlike its manifest is damaged,
        if problem is None and _SUFFIX == ".so":        # whatever machine its damaged header names
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                problem = _elf_problem(f, size)
        return problem, note
    except OSError as e:            # unreadable (permissions, a folder of that name, ...)
        return "cannot be read: %s" % (e.strerror or e), ""


def _missing_symbol(lib, names):
    """The first of ``names`` that ``lib`` does not export, or None."""
    for name in names:
        try:
            getattr(lib, name)
        except AttributeError:
            return name
    return None


def _read_identity(lib):
    return (ffi.string(lib.mt_vendor()).decode(), ffi.string(lib.mt_numeric_mode()).decode(),
            int(lib.mt_abi_version()))


def _refuse(vendor, numeric_mode, tried, path, outcome, message):
    """Record ``path`` as refused and raise BackendError: "<path> <message>. Rebuild with: ..."."""
    _attempts[(vendor, numeric_mode)] = tried + [(path, "refused: " + outcome)]
    raise BackendError("mojo_train: %s %s. Rebuild with: %s" % (path, message, rebuild_command(vendor, numeric_mode)))


_IDENTITY = ("mt_vendor", "mt_numeric_mode", "mt_abi_version", "mt_features")


def _check_exports(lib, vendor, numeric_mode, tried, path):
    """Refuse a dlopened library that is not the one asked for or lacks a declared name."""
    missing = _missing_symbol(lib, _IDENTITY)
    if missing:
        _refuse(vendor, numeric_mode, tried, path, "does not export " + missing,
                "does not export %s: it is not a mojo_train library" % missing)
    got = _read_identity(lib)
    if got != (vendor, numeric_mode, ABI_VERSION):
        _refuse(vendor, numeric_mode, tried, path, "reports %s/%s/abi %d" % got,
                "reports vendor %r, numeric mode %r, ABI %d but %r/%r/ABI %d was asked for; "
                "the file is stale or misplaced" % (got + (vendor, numeric_mode, ABI_VERSION)))
    missing = _missing_symbol(lib, dir(lib))     # cffi lists every name the cdef declares
    if missing:
        _refuse(vendor, numeric_mode, tried, path, "does not export " + missing,
                "does not export %s, which mojo_train.h declares; it is incomplete or from "
                "another build" % missing)


def _try_load(vendor, numeric_mode):
    check_environment()           # the library reads some variables itself, from now on
    tried = []
    for d, ours in _search_dirs():
        path = os.path.join(d, library_name(vendor, numeric_mode))
        if not os.path.isfile(path):
            tried.append((path, "absent"))
            continue
        problem, note = _file_problem(path, ours)
        if problem:
            _refuse(vendor, numeric_mode, tried, path, problem, problem)
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            tried.append((path, "dlopen failed: %s" % e))
            continue
        _check_exports(lib, vendor, numeric_mode, tried, path)
        reason = _device_problem(lib, vendor)
        if reason:
            tried.append((path, "loaded but unusable: " + reason + note))
            continue
        tried.append((path, "loaded" + note))
        _attempts[(vendor, numeric_mode)] = tried
        if vendor != "cpu" and path not in _exit_handlers:   # once a file (tests reload after _forget)
            _exit_handlers.add(path)
            atexit.register(_release_device_cache_at_exit, lib)
        return Backend(lib, vendor, numeric_mode, path)
    _attempts[(vendor, numeric_mode)] = tried
    return None


def _release_device_cache_at_exit(lib):
    """Python's exit handler for a loaded GPU library: the device blocks its mt_device_free kept
    idle go back (and none is kept after: arrays dropped later in the interpreter's teardown are
    freed too), while the GPU runtime is still up -- so a leak checker such as compute-sanitizer's
    memcheck finds every block freed. C exit handlers run after the runtime may be gone."""
    try:
        lib.mt_device_release_cache(1)
    except Exception:   # pragma: no cover - an exit handler never raises
        pass


def _device_problem(lib, vendor):
    """Why a GPU library cannot run here (no device, no driver), or None."""
    if vendor == "cpu":
        return None
    count = ffi.new("int32_t *")
    rc = lib.mt_device_count(count)
    if rc or count[0] <= 0:
        why = ffi.string(lib.mt_last_error()).decode("utf-8", "replace")
        return why or "no %s device is visible" % vendor
    return None


def _normalize(value, allowed, what, env, where=None):
    v = str(value).strip().lower()
    if v not in allowed:
        raise ValueError("mojo_train%s: %s must be one of %s, got %r (from %s)"
                         % ("." + where if where else "", what, ", ".join(allowed), value, env))
    return v


def numeric_mode_arg(numeric_mode, where):
    """``numeric_mode=`` as given to ``where`` (a constructor): None (the environment's numeric mode, read
    when the library is loaded) or a numeric mode name in any case; anything else is a ValueError now."""
    if numeric_mode is None:
        return None
    return _normalize(numeric_mode, NUMERIC_MODES, "numeric_mode", "numeric_mode=", where)


_NOW = object()   # default_numeric_mode / default_vendor: read the environment now


def default_numeric_mode(raw=_NOW):
    """MOJO_TRAIN_NUMERIC_MODE's numeric mode: of the environment now, or of ``raw`` (a value of
    _environment_key: str or bytes, None when unset)."""
    value = os.environ.get("MOJO_TRAIN_NUMERIC_MODE") if raw is _NOW else raw
    return _normalize(_text(value, "identical"), NUMERIC_MODES, "numeric_mode", "MOJO_TRAIN_NUMERIC_MODE")


def default_vendor(raw=_NOW):
    """MOJO_TRAIN_VENDOR's vendor, as default_numeric_mode."""
    value = os.environ.get("MOJO_TRAIN_VENDOR") if raw is _NOW else raw
    return _normalize(_text(value, "auto"), ("auto",) + VENDORS, "vendor", "MOJO_TRAIN_VENDOR")


# CPython keeps os.environ's values in a dict of bytes on POSIX (os.environ._data): reading it
# is one dict lookup, where os.environ.get encodes the name and decodes the value.
_BYTES_ENVIRON = os.name == "posix" and type(getattr(os.environ, "_data", None)) is dict and \
    getattr(os.environ, "encodekey", lambda k: None)("A") == b"A"


def _environment_key():
    """The raw values of the two variables load() depends on, read from the os.environ of now
    (a test may replace the object): from its own bytes mapping where it has one (every write
    through os.environ, monkeypatch included, updates it), else through .get."""
    env = os.environ
    data = getattr(env, "_data", None) if _BYTES_ENVIRON else None
    if type(data) is dict:
        return ("environment", data.get(b"MOJO_TRAIN_NUMERIC_MODE"), data.get(b"MOJO_TRAIN_VENDOR"))
    return ("environment", env.get("MOJO_TRAIN_NUMERIC_MODE"), env.get("MOJO_TRAIN_VENDOR"))


def _text(value, default):
    """An environment value (str, or bytes from _environment_key) as a str; default when unset."""
    if value is None:
        return default
    return os.fsdecode(value) if isinstance(value, bytes) else value


def load(numeric_mode=None, vendor=None):
    """The Backend for (vendor, numeric_mode); defaults from the environment.

    A vendor named explicitly never falls back, and a refused library (damaged, stale,
    incomplete) raises naming the file; ``auto`` takes the first of cuda, hip, metal, cpu that
    loads and has a device, passing over refused libraries (each is listed in the error when
    none loads, and in ``backend_info()["tried"]``).
    """
    if numeric_mode is None and vendor is None:   # every call of every op: the environment's, once per value
        key = _environment_key()
        backend = _loaded.get(key)
        if backend is None:   # from the key's own values, so that the cache and the load agree
            backend = _load(default_numeric_mode(key[1]), default_vendor(key[2]))
            with _lock:
                _loaded[key] = backend
        return backend
    return _load(numeric_mode, vendor)


def _load(numeric_mode, vendor):
    """load() of the named (or None: the environment's) numeric mode and vendor."""
    numeric_mode = default_numeric_mode() if numeric_mode is None else _normalize(numeric_mode, NUMERIC_MODES, "numeric_mode", "numeric_mode=")
    vendor = default_vendor() if vendor is None else _normalize(vendor, ("auto",) + VENDORS, "vendor", "vendor=")
    key = (vendor, numeric_mode)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        order = AUTO_ORDER if vendor == "auto" else (vendor,)
        for v in order:
            try:
                backend = _loaded.get((v, numeric_mode)) or _try_load(v, numeric_mode)
            except BackendError:
                if vendor != "auto":
                    raise
                backend = None    # auto goes on; the refusal stays in backend_info()["tried"]
            if backend is not None:
                _loaded[(v, numeric_mode)] = _loaded[key] = backend
                _last_choice.update(asked=vendor, numeric_mode=numeric_mode, chose=v)
                return backend
        lines = ["  %s: %s" % (p, why) for v in order for p, why in _attempts.get((v, numeric_mode), [])]
        raise BackendError(
            "mojo_train: no %s library for numeric_mode=%r could be loaded (vendor=%r). Tried:\n%s\n"
            "Build it with: %s" % ("/".join(order), numeric_mode, vendor, "\n".join(lines),
                                    rebuild_command(order[-1], numeric_mode)))


def backend_info(numeric_mode=None, vendor=None):
    """What loads for (vendor, numeric_mode), and every path tried on the way."""
    if numeric_mode is not None:            # refused as backend_info's own arguments, before load() reads them
        numeric_mode = _normalize(numeric_mode, NUMERIC_MODES, "numeric_mode", "numeric_mode=", "backend_info")
    if vendor is not None:
        vendor = _normalize(vendor, ("auto",) + VENDORS, "vendor", "vendor=", "backend_info")
    try:
        b = load(numeric_mode, vendor)
    except BackendError as exc:             # the loader's message, from this entry point
        raise BackendError(where_msg("backend_info", str(exc).split("mojo_train: ", 1)[-1])) from None
    tried = []
    asked = default_vendor() if vendor is None else _normalize(vendor, ("auto",) + VENDORS, "vendor", "vendor=")
    for v in (AUTO_ORDER if asked == "auto" else (asked,)):
        tried.extend({"vendor": v, "path": p, "outcome": why} for p, why in _attempts.get((v, b.numeric_mode), []))
        if v == b.vendor:
            break
    return {
        "vendor": b.vendor, "numeric_mode": b.numeric_mode, "abi_version": int(b.lib.mt_abi_version()),
        "path": b.path, "features": b.features, "threads": int(b.lib.mt_num_threads()),
        "asked_vendor": asked, "tried": tried,
        "reason": "the %s vendor was asked for explicitly" % b.vendor if asked != "auto"
        else "auto: the first of %s that loaded" % ", ".join(AUTO_ORDER),
    }


def _check_environment_at_import():
    """check_environment(), except that ``python -m mojo_train ...`` (whose package import runs
    this before the command line exists: sys.argv[0] is '-m' then) ends with one line on
    stderr and exit status 2 instead of a traceback."""
    try:
        check_environment()
    except ValueError as e:
        if getattr(sys, "argv", [])[:1] == ["-m"]:
            sys.stderr.write("mojo_train: error: %s\n" % str(e).replace("mojo_train: ", "", 1))
            raise SystemExit(2)
        raise


_check_environment_at_import()


def _forget():
    """Drop cached libraries (tests use this after changing the environment)."""
    with _lock:
        _loaded.clear()
        _attempts.clear()
