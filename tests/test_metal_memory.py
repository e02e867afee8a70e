"""The Metal host layer's staging (native/metal/mt_metal_memory.c), run here through the
emulator (vendor metal_emulated): a host input that starts on a page and spans whole pages is
bound without a copy (Metal's newBufferWithBytesNoCopy on a Mac), any other host buffer through
a shared-storage twin. The bits are the same either way, and an op in place on such a range
(cross-entropy's gradient over its logits) writes only after its refusals."""
import mmap

import pytest

from mojo_train import _native
from mojo_train._native import ffi

from _helpers import ENONFINITE

PAGE = mmap.PAGESIZE


def _metal():
    try:
        return _native.load("identical", "metal_emulated").lib
    except OSError:
        pytest.skip("no metal_emulated library is built here (make metal-emulated)")


def _pages(values, pages):
    """A float32 array over `pages` fresh pages (mmap: page-aligned), holding `values` first; the
    mapping is kept alive by the returned pair."""
    mm = mmap.mmap(-1, pages * PAGE)
    p = ffi.cast("float *", ffi.from_buffer(mm))
    for i, v in enumerate(values):
        p[i] = v
    return mm, p


def _moved(lib, run):
    """(host->device, device->host) bytes the call `run` copied."""
    before, after = ffi.new("int64_t[2]"), ffi.new("int64_t[2]")
    assert lib.mt_transfer_bytes(before) == 0
    run()
    assert lib.mt_transfer_bytes(after) == 0
    return after[0] - before[0], after[1] - before[1]


def test_a_host_input_on_whole_pages_is_read_in_place_and_any_other_through_a_copy():
    lib, cpu = _metal(), _native.load("identical", "cpu").lib
    n = 2 * PAGE // 4
    values = [((i * 37) % 101 - 50) / 8.0 for i in range(n)]
    mm, x = _pages(values, 3)
    want, got, off = ffi.new("float[]", n), ffi.new("float[]", n), ffi.new("float[]", n - 1)
    assert cpu.mt_silu_forward(want, x, n, 0) == 0
    assert _moved(lib, lambda: lib.mt_silu_forward(got, x, n, 0)) == (0, 4 * n)            # no copy in
    assert bytes(ffi.buffer(got)) == bytes(ffi.buffer(want))
    assert _moved(lib, lambda: lib.mt_silu_forward(off, x + 1, n - 1, 0)) == (4 * (n - 1), 4 * (n - 1))
    assert bytes(ffi.buffer(off)) == bytes(ffi.buffer(want))[4:]
    assert _moved(lib, lambda: lib.mt_silu_forward(got, x, n - 1, 0))[0] == 4 * (n - 1)   # not whole pages
    assert [x[i] for i in range(n)] == values                                              # the input kept


def test_cross_entropy_in_place_on_whole_pages_gives_the_bits_of_a_separate_buffer_and_refuses_before_writing():
    lib, cpu = _metal(), _native.load("identical", "cpu").lib
    rows, vocab = 8, PAGE // 4            # the logits: 8 whole pages
    values = [float((i * 5) % 7) - 3.0 + (i % 3) / 4.0 for i in range(rows * vocab)]
    targets = ffi.new("int32_t[]", [(r * 97) % vocab for r in range(rows)])
    want_loss, want_grad, ref = ffi.new("float[1]"), ffi.new("float[]", rows * vocab), ffi.new("float[]", values)
    assert cpu.mt_cross_entropy(want_loss, ffi.NULL, want_grad, ref, targets, 4, rows, vocab, -100, 2, 0.1, 0) == 0
    mm, logits = _pages(values, rows)
    loss = ffi.new("float[1]")
    h2d, _ = _moved(lib, lambda: lib.mt_cross_entropy(loss, ffi.NULL, logits, logits, targets, 4, rows, vocab,
                                                      -100, 2, 0.1, 0))
    assert h2d < 4 * rows * vocab, h2d                      # the logits were not copied in
    assert bytes(ffi.buffer(loss)) == bytes(ffi.buffer(want_loss))
    assert bytes(ffi.buffer(logits, 4 * rows * vocab)) == bytes(ffi.buffer(want_grad))
    bad = list(values)
    bad[5 * vocab + 3] = float("nan")                       # row 5: refused before any write
    mm2, logits2 = _pages(bad, rows)
    before = bytes(ffi.buffer(logits2, 4 * rows * vocab))
    loss[0] = 7.0
    assert lib.mt_cross_entropy(loss, ffi.NULL, logits2, logits2, targets, 4, rows, vocab, -100, 2, 0.1, 0) == ENONFINITE
    assert bytes(ffi.buffer(logits2, 4 * rows * vocab)) == before and loss[0] == 7.0


def test_a_map_in_place_on_whole_pages_refuses_a_nonfinite_input_before_writing():
    """An elementwise op with out on its input, both on whole pages (read and written in place,
    no twin to drop): a NaN is refused and the buffer is as it was."""
    lib = _metal()
    n = 2 * PAGE // 4
    values = [float(i % 7) - 3.0 for i in range(n)]
    values[n - 5] = float("nan")
    mm, x = _pages(values, 2)
    before = bytes(ffi.buffer(x, 4 * n))
    for name, call in (("silu", lambda: lib.mt_silu_forward(x, x, n, 0)), ("add", lambda: lib.mt_add(x, x, x, n, 0)),
                       ("dropout", lambda: lib.mt_dropout_forward(x, x, 0.5, 1, 2, 0, n, 0))):
        assert call() == ENONFINITE, name
        assert bytes(ffi.buffer(x, 4 * n)) == before, name
