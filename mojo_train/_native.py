"""Finding, loading and checking the native library (cffi in ABI mode, no compiler needed).

The cdef is read from the C header's marked block, never pasted. A library is named
``libmojo_train_<vendor>_<tier>.so`` and searched, in order, in ``$MOJO_TRAIN_LIBRARY_PATH``,
the package's own ``lib/`` folder, and ``native/build/`` of a source checkout. After dlopen
the library's own ``mt_vendor()``, ``mt_numeric_mode()`` and ``mt_abi_version()`` are read
back; a library that disagrees with what was asked is refused, naming the file and the
command that rebuilds it. Every path tried is kept for :func:`backend_info`.
"""
import os
import sys
import threading

import cffi

ABI_VERSION = 2
TIERS = ("identical", "deterministic", "fast")
VENDORS = ("cpu", "cuda", "hip", "metal")
AUTO_ORDER = ("cuda", "hip", "metal", "cpu")

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCE_ROOT = os.path.dirname(_PACKAGE_DIR)
_SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"

# Error codes of mojo_train.h and the built-in exception a torch user would catch.
_ERRORS = {1: ValueError, 2: ValueError, 3: MemoryError, 4: RuntimeError, 5: NotImplementedError}


class BackendError(ImportError):
    """No library could be loaded for the vendor and numeric mode asked for."""


def _header_path():
    for path in (os.path.join(_PACKAGE_DIR, "include", "mojo_train.h"),
                 os.path.join(_SOURCE_ROOT, "native", "include", "mojo_train.h")):
        if os.path.isfile(path):
            return path
    raise BackendError("mojo_train: mojo_train.h not found beside the package or in native/include")


def _read_cdef():
    with open(_header_path()) as f:
        text = f.read()
    begin, end = text.index("/* MT_CDEF_BEGIN */"), text.index("/* MT_CDEF_END */")
    return text[begin + len("/* MT_CDEF_BEGIN */"):end]


ffi = cffi.FFI()
ffi.cdef(_read_cdef())

_lock = threading.Lock()
_loaded = {}          # (vendor, tier) -> Backend
_attempts = {}        # (vendor, tier) -> [(path, outcome)]
_last_choice = {}     # what the most recent default load chose, and why


class Backend:
    """One loaded library: ``lib`` (the cffi handle), ``vendor``, ``tier``, ``path``."""

    def __init__(self, lib, vendor, tier, path):
        self.lib, self.vendor, self.tier, self.path = lib, vendor, tier, path
        self.features = int(lib.mt_features())

    def check(self, rc, where):
        """Raise the exception matching a nonzero status, with the library's message."""
        if rc:
            msg = ffi.string(self.lib.mt_last_error()).decode("utf-8", "replace")
            raise _ERRORS.get(rc, RuntimeError)("mojo_train.%s: %s" % (where, msg))

    def has(self, feature_bit):
        return bool(self.features & feature_bit)


def library_name(vendor, tier):
    return "libmojo_train_%s_%s%s" % (vendor, tier, _SUFFIX)


def rebuild_command(vendor, tier):
    target = "" if vendor == "cpu" else " " + vendor
    return "make%s   (in the source checkout; builds every tier of %s)" % (target, vendor)


def _search_dirs():
    dirs = []
    env = os.environ.get("MOJO_TRAIN_LIBRARY_PATH")
    if env:
        dirs.extend(p for p in env.split(os.pathsep) if p)
    dirs.append(os.path.join(_PACKAGE_DIR, "lib"))
    if os.path.isdir(os.path.join(_SOURCE_ROOT, "native", "include")):   # a source checkout
        dirs.append(os.path.join(_SOURCE_ROOT, "native", "build"))
    return dirs


def _read_identity(lib):
    return (ffi.string(lib.mt_vendor()).decode(), ffi.string(lib.mt_numeric_mode()).decode(),
            int(lib.mt_abi_version()))


def _try_load(vendor, tier):
    tried = []
    for d in _search_dirs():
        path = os.path.join(d, library_name(vendor, tier))
        if not os.path.isfile(path):
            tried.append((path, "absent"))
            continue
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            tried.append((path, "dlopen failed: %s" % e))
            continue
        got = _read_identity(lib)
        if got != (vendor, tier, ABI_VERSION):
            _attempts[(vendor, tier)] = tried + [(path, "refused: reports %s/%s/abi %d" % got)]
            raise BackendError(
                "mojo_train: %s reports vendor %r, numeric mode %r, ABI %d but %r/%r/ABI %d was "
                "asked for; the file is stale or misplaced. Rebuild with: %s"
                % (path, got[0], got[1], got[2], vendor, tier, ABI_VERSION,
                   rebuild_command(vendor, tier)))
        reason = _device_problem(lib, vendor)
        if reason:
            tried.append((path, "loaded but unusable: " + reason))
            continue
        tried.append((path, "loaded"))
        _attempts[(vendor, tier)] = tried
        return Backend(lib, vendor, tier, path)
    _attempts[(vendor, tier)] = tried
    return None


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


def _normalize(value, allowed, what, env):
    v = str(value).strip().lower()
    if v not in allowed:
        raise ValueError("mojo_train: %s must be one of %s, got %r (from %s)"
                         % (what, ", ".join(allowed), value, env))
    return v


def default_tier():
    return _normalize(os.environ.get("MOJO_TRAIN_NUMERIC_MODE", "identical"), TIERS,
                      "numeric_mode", "MOJO_TRAIN_NUMERIC_MODE")


def default_vendor():
    return _normalize(os.environ.get("MOJO_TRAIN_VENDOR", "auto"), ("auto",) + VENDORS,
                      "vendor", "MOJO_TRAIN_VENDOR")


def load(numeric_mode=None, vendor=None):
    """The Backend for (vendor, numeric_mode); defaults from the environment.

    A vendor named explicitly never falls back; ``auto`` takes the first of cuda, hip,
    metal, cpu that loads and has a device.
    """
    tier = default_tier() if numeric_mode is None else _normalize(numeric_mode, TIERS, "numeric_mode", "numeric_mode=")
    vendor = default_vendor() if vendor is None else _normalize(vendor, ("auto",) + VENDORS, "vendor", "vendor=")
    key = (vendor, tier)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        order = AUTO_ORDER if vendor == "auto" else (vendor,)
        for v in order:
            backend = _loaded.get((v, tier)) or _try_load(v, tier)
            if backend is not None:
                _loaded[(v, tier)] = _loaded[key] = backend
                _last_choice.update(asked=vendor, tier=tier, chose=v)
                return backend
        lines = ["  %s: %s" % (p, why) for v in order for p, why in _attempts.get((v, tier), [])]
        raise BackendError(
            "mojo_train: no %s library for numeric_mode=%r could be loaded (vendor=%r). Tried:\n%s\n"
            "Build it with: %s" % ("/".join(order), tier, vendor, "\n".join(lines),
                                    rebuild_command(order[-1], tier)))


def backend_info(numeric_mode=None, vendor=None):
    """What loads for (vendor, numeric_mode), and every path tried on the way."""
    b = load(numeric_mode, vendor)
    tried = []
    asked = default_vendor() if vendor is None else _normalize(vendor, ("auto",) + VENDORS, "vendor", "vendor=")
    for v in (AUTO_ORDER if asked == "auto" else (asked,)):
        tried.extend({"vendor": v, "path": p, "outcome": why} for p, why in _attempts.get((v, b.tier), []))
        if v == b.vendor:
            break
    return {
        "vendor": b.vendor, "numeric_mode": b.tier, "abi_version": int(b.lib.mt_abi_version()),
        "path": b.path, "features": b.features, "threads": int(b.lib.mt_num_threads()),
        "asked_vendor": asked, "tried": tried,
        "reason": "the %s vendor was asked for explicitly" % b.vendor if asked != "auto"
        else "auto: the first of %s that loaded" % ", ".join(AUTO_ORDER),
    }


def _forget():
    """Drop cached libraries (tests use this after changing the environment)."""
    with _lock:
        _loaded.clear()
        _attempts.clear()
