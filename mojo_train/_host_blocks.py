"""A bounded cache of large host blocks for ``Array.empty`` (the outputs ops allocate).

Why: a fresh large block comes from the kernel (glibc maps every request above its mmap
threshold, at most 32 MiB), and the first write to each of its 4 KiB pages is a page fault that
also zeroes the page. For a 131 MB ``cross_entropy`` gradient that is 15 to 30 ms here, longer
than the op's own pass over it; a block used before is written at memory speed. So a block of at
least ``MIN_BYTES`` that Python frees is kept (up to ``MAX_BLOCKS`` blocks and
``limit_bytes()`` bytes together; the least recently freed goes first) and handed to the next
request of exactly its size.

Contract: a block is handed out again only after cffi's free callback ran, i.e. after every
Python object holding it (the Array, its memoryviews, numpy or torch views of it) is gone: the
same moment ``free`` would have run. Its content is unspecified, as ``empty``'s always is.
``MOJO_TRAIN_HOST_CACHE_MB`` (read at import; default 1024, 0 disables) bounds the bytes held; a
value that is not a whole number >= 0 is refused at the package's import with the other
variables (``_native._ENVIRONMENT``; ``python -m mojo_train`` says it in one line); this module
also keeps the error for its first large ``Array.empty`` and ``limit_bytes()``, should the
package's check change. ``release()`` (``mojo_train.release_host_cache()``) returns every cached
block to the C library at once; a ``malloc`` that fails releases the cache and tries once more
before MemoryError. No call ever waits: when the lock is taken (another thread, or a garbage
collection inside the allocator's own critical section) a request is served by ``malloc`` and a
freed block goes straight to ``free``; a child process made by ``fork`` gets a fresh lock (the
parent's may have been held by a thread the child does not have). AddressSanitizer cannot see a
use after free of a cached block: ``make asan-test`` and ``tsan-test`` run with the cache off.
"""
import collections
import os
import threading

import cffi

MIN_BYTES = 1 << 20
MAX_BLOCKS = 8

_ffi = cffi.FFI()
_ffi.cdef("void *malloc(size_t size); void free(void *ptr);")
_libc = _ffi.dlopen(None)
_NULL = _ffi.NULL


def _limit_from_environment():
    """(bytes, None), or (0, the ValueError to raise at first use) for a bad value."""
    text = os.environ.get("MOJO_TRAIN_HOST_CACHE_MB", "1024")
    try:
        mb = int(text)
    except ValueError:
        mb = None
    if mb is None or mb < 0:
        return 0, ValueError("MOJO_TRAIN_HOST_CACHE_MB must be a whole number of MiB >= 0 (0: no cache), got %r"
                             % text)
    return mb << 20, None


_limit, _limit_error = _limit_from_environment()
_lock = threading.Lock()
_sizes = {}                                   # address -> bytes, for every block handed out by _alloc
_cached = collections.OrderedDict()           # address -> (pointer, bytes), oldest freed first
_held = [0]                                   # bytes in _cached


def limit_bytes():
    """The most bytes the cache holds (ValueError for a bad MOJO_TRAIN_HOST_CACHE_MB)."""
    if _limit_error is not None:
        raise _limit_error
    return _limit


def _new_lock_in_child():
    global _lock
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_in_child)


def held_bytes():
    """The bytes of the blocks cached now (freed by Python, not yet reused or released)."""
    return _held[0]


def _alloc(nbytes):
    limit_bytes()
    if _lock.acquire(blocking=False):
        try:
            for address, (ptr, size) in _cached.items():
                if size == nbytes:
                    del _cached[address]
                    _held[0] -= size
                    _sizes[address] = size
                    return ptr
        finally:
            _lock.release()
    ptr = _libc.malloc(nbytes)
    if ptr == _NULL and _held[0]:
        release()                                 # idle cached blocks before MemoryError
        ptr = _libc.malloc(nbytes)
    if ptr != _NULL:
        _sizes[int(_ffi.cast("uintptr_t", ptr))] = nbytes
    return ptr


def _free(ptr):
    address = int(_ffi.cast("uintptr_t", ptr))
    size = _sizes.pop(address, None)
    if size is not None and size <= _limit and _lock.acquire(blocking=False):
        try:
            while _cached and (len(_cached) >= MAX_BLOCKS or _held[0] + size > _limit):
                _, (old, old_size) = _cached.popitem(last=False)
                _held[0] -= old_size
                _libc.free(old)
            _cached[address] = (ptr, size)
            _held[0] += size
            return
        finally:
            _lock.release()
    _libc.free(ptr)


def release():
    """``mojo_train.release_host_cache()``: return every host block the library keeps for reuse
    (large ``Array.empty`` outputs freed by Python, at most MOJO_TRAIN_HOST_CACHE_MB together,
    default 1024) to the C library at once; the bytes released."""
    with _lock:
        freed = _held[0]
        while _cached:
            _, (ptr, _size) = _cached.popitem(last=False)
            _libc.free(ptr)
        _held[0] = 0
    return freed


# Blocks of at least MIN_BYTES for Array.empty: content unspecified (never cleared).
new_block = _ffi.new_allocator(alloc=_alloc, free=_free, should_clear_after_alloc=False)
