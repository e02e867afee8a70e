"""Tests for mojo_train._array (Array) and mojo_train._buffer (probing/packing).

Contract under test: float32 tensors are accepted from any buffer exporter
and everything else is refused by name, never cast; pack borrows memory
when it can and copies only when it must; Array owns its memory, shares
it on reshape and exports it to memoryview/numpy without copying.  The
library itself must never import numpy.
"""

import array
import os
import pickle
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mojo_train._array import Array
from mojo_train._buffer import (
    Probe, copy_bytes, float32_tensor, int_tensor, lie_end_to_end,
    normalize_format, offsets_for, pack, probe, tensor_list, unpack_into,
    zero_bytes)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def f32(*values):
    return array.array("f", values)


def fake_probe(nelems):
    """A Probe claiming ``nelems`` float32 elements, allocating nothing."""
    return Probe(None, None, "f", "float32", 4, (nelems,), nelems,
                 nelems * 4, False, True, address=0)


# ----- accepted float32 exporters ---------------------------------------

def test_float32_tensor_accepts_array_array():
    p = float32_tensor(f32(1, 2, 3), "x", "step")
    assert (p.dtype, p.format, p.shape, p.nelems, p.nbytes) == (
        "float32", "f", (3,), 3, 12)
    assert p.address != 0 and not p.readonly and p.c_contiguous


def test_float32_tensor_accepts_memoryview_and_cast_bytearray():
    buf = bytearray(16)
    p = float32_tensor(memoryview(buf).cast("f", (2, 2)), "x", "step",
                       inplace=True)
    assert p.shape == (2, 2) and p.nelems == 4


def test_float32_tensor_accepts_explicit_little_endian_format():
    view = memoryview(bytearray(8)).cast("B").cast("f")
    assert normalize_format("<f", 4) == ("f", "float32")
    assert normalize_format("=f", 4) == ("f", "float32")
    assert normalize_format("@f", 4) == ("f", "float32")
    assert float32_tensor(view, "x", "step").dtype == "float32"


def test_float32_tensor_accepts_numpy_float32():
    np = pytest.importorskip("numpy")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    p = float32_tensor(x, "x", "step", inplace=True)
    assert p.shape == (2, 3)
    assert p.address == x.__array_interface__["data"][0]


def test_float32_tensor_accepts_mojo_array_as_writable():
    a = Array((2, 3))
    p = float32_tensor(a, "x", "step", inplace=True)
    assert p.shape == (2, 3) and not p.readonly and p.address == a.address


def test_probe_keeps_the_object_alive():
    p = probe(f32(1, 2), "x", "step")
    assert isinstance(p.obj, array.array) and p.view.tolist() == [1.0, 2.0]


# ----- refusals -------------------------------------------------------------

def test_float32_tensor_refuses_float64_by_name():
    with pytest.raises(TypeError, match=r"mojo_train\.step: grad has dtype "
                       r"float64; mojo_train works in float32 only"):
        float32_tensor(array.array("d", [1.0]), "grad", "step")


def test_float32_tensor_refuses_float16_by_name():
    np = pytest.importorskip("numpy")
    assert normalize_format("e", 2) == ("e", "float16")
    with pytest.raises(TypeError, match="w has dtype float16;.*never casts"):
        float32_tensor(np.zeros(2, np.float16), "w", "step")


def test_float32_tensor_refuses_int32_by_name():
    with pytest.raises(TypeError, match="w has dtype int32"):
        float32_tensor(array.array("i", [1]), "w", "step")


def test_float32_tensor_refuses_numpy_float64_float16_and_big_endian():
    np = pytest.importorskip("numpy")
    for dt, shown in (("f8", "float64"), ("f2", "float16"),
                      (">f4", r"float32 \(big-endian\)")):
        with pytest.raises(TypeError, match="p has dtype " + shown):
            float32_tensor(np.zeros(3, dt), "p", "step")


def test_float32_tensor_refuses_non_buffers_naming_the_type():
    with pytest.raises(TypeError, match=r"mojo_train\.step: x must be a "
                       r"buffer-protocol object .* got list"):
        float32_tensor([1.0, 2.0], "x", "step")


def test_float32_tensor_refuses_empty_unless_allowed():
    with pytest.raises(ValueError, match="x is empty"):
        float32_tensor(f32(), "x", "step")
    assert float32_tensor(f32(), "x", "step", allow_empty=True).nelems == 0


def test_float32_tensor_refuses_non_contiguous_numpy_slice():
    np = pytest.importorskip("numpy")
    x = np.zeros(10, np.float32)[::2]
    with pytest.raises(ValueError, match="x must be C-contiguous"):
        float32_tensor(x, "x", "step")
    with pytest.raises(ValueError, match="C-contiguous"):
        float32_tensor(np.zeros((3, 4), np.float32, order="F"), "x", "step")


def test_float32_tensor_refuses_read_only_memoryview_only_when_in_place():
    view = memoryview(bytes(8)).cast("f")
    assert float32_tensor(view, "x", "step").readonly
    with pytest.raises(ValueError, match="x is written in place and must be "
                       "writable"):
        float32_tensor(view, "x", "step", inplace=True)


def test_float32_tensor_refuses_read_only_numpy_only_when_in_place():
    np = pytest.importorskip("numpy")
    x = np.zeros(4, np.float32)
    x.flags.writeable = False
    assert float32_tensor(x, "x", "step").readonly
    with pytest.raises(ValueError, match="must be writable"):
        float32_tensor(x, "x", "step", inplace=True)


def test_int_tensor_accepts_every_integer_dtype():
    for code in "bBhHiIlLqQ":
        p = int_tensor(array.array(code, [1, 2]), "idx", "gather")
        assert p.dtype.startswith(("int", "uint"))
    assert int_tensor(array.array("l", [1]), "idx", "gather").dtype == (
        "int%d" % (8 * array.array("l").itemsize))


def test_int_tensor_refuses_float_and_bool_by_name():
    with pytest.raises(TypeError, match="idx has dtype float32"):
        int_tensor(f32(1), "idx", "gather")
    with pytest.raises(TypeError, match="idx has dtype bool"):
        int_tensor(memoryview(bytearray(2)).cast("?"), "idx", "gather")


def test_int_tensor_refuses_empty_and_strided():
    with pytest.raises(ValueError, match="idx is empty"):
        int_tensor(array.array("i"), "idx", "gather")
    view = memoryview(array.array("i", range(6)))[::2]
    with pytest.raises(ValueError, match="C-contiguous"):
        int_tensor(view, "idx", "gather")


def test_unknown_formats_report_the_raw_format_as_dtype():
    assert normalize_format("T{<f:a:}", 4) == ("T{<f:a:}", "T{<f:a:}")
    assert normalize_format("Zf", 8) == ("Zf", "Zf")
    assert normalize_format(">f", 4) == (">f", "float32 (big-endian)")


# ----- tensor lists ---------------------------------------------------------

def test_tensor_list_wraps_one_buffer():
    probes = tensor_list(f32(1, 2), "params", "step", inplace=True)
    assert len(probes) == 1 and probes[0].nelems == 2


def test_tensor_list_accepts_lists_tuples_and_generators():
    xs = [f32(1), f32(2, 3)]
    for seq in (xs, tuple(xs), (x for x in xs)):
        assert [p.nelems for p in tensor_list(seq, "params", "step",
                                              inplace=False)] == [1, 2]


def test_tensor_list_names_the_bad_item_by_index():
    with pytest.raises(TypeError, match=r"params\[1\] has dtype float64"):
        tensor_list([f32(1), array.array("d", [1])], "params", "step",
                    inplace=False)
    with pytest.raises(ValueError, match=r"params\[0\] is written in place"):
        tensor_list([memoryview(bytes(4)).cast("f")], "params", "step",
                    inplace=True)


def test_tensor_list_refuses_empty_list_and_non_iterables():
    with pytest.raises(ValueError, match="params is an empty list"):
        tensor_list([], "params", "step", inplace=False)
    with pytest.raises(TypeError, match="params must be a float32 buffer"):
        tensor_list(3.5, "params", "step", inplace=False)
    with pytest.raises(TypeError, match="params must be a float32 buffer"):
        tensor_list("abc", "params", "step", inplace=False)


# ----- offsets ---------------------------------------------------------------

def test_offsets_for_counts_elements_cumulatively():
    probes = tensor_list([f32(1), f32(1, 2, 3), f32(4, 5)], "p", "s",
                         inplace=False)
    offs = offsets_for(probes)
    assert offs.dtype == "int32" and offs.tolist() == [0, 1, 4, 6]


def test_offsets_for_refuses_more_than_int32_elements_naming_the_argument():
    ok = [fake_probe(2 ** 30), fake_probe(2 ** 30 - 1)]
    assert offsets_for(ok).tolist()[-1] == 2 ** 31 - 1
    with pytest.raises(ValueError, match=r"mojo_train\.step: params hold "
                       r"2147483648 elements in total, over the limit"):
        offsets_for([fake_probe(2 ** 30), fake_probe(2 ** 30)], "params", "step")


# ----- pack / unpack -------------------------------------------------------

def test_pack_borrows_a_single_tensor():
    x = f32(1, 2, 3)
    flat, packed = pack(tensor_list(x, "p", "s", inplace=True))
    assert packed is False and flat.format == "f" and len(flat) == 3
    flat[1] = 7.0
    assert x[1] == 7.0


def test_pack_borrows_views_end_to_end_of_one_mojo_array():
    a = Array(10)
    whole = a.memview()
    probes = tensor_list([whole[0:4], whole[4:10]], "p", "s", inplace=True)
    assert lie_end_to_end(probes)
    flat, packed = pack(probes)
    assert packed is False and len(flat) == 10
    flat[9] = 3.0
    flat[0] = 1.0
    assert a[9] == 3.0 and a[0] == 1.0


def test_pack_borrows_views_end_to_end_of_one_numpy_array():
    np = pytest.importorskip("numpy")
    base = np.zeros(12, np.float32)
    parts = [base[0:2].reshape(1, 2), base[2:6].reshape(2, 2), base[6:12]]
    flat, packed = pack(tensor_list(parts, "p", "s", inplace=True))
    assert packed is False
    flat[5] = 4.0
    assert base[5] == 4.0 and parts[1][1, 1] == 4.0


def test_pack_of_read_only_tensors_borrows_read_only():
    data = memoryview(bytes(16)).cast("f")
    flat, packed = pack(tensor_list([data[:2], data[2:]], "p", "s",
                                    inplace=False))
    assert packed is False and flat.readonly


def test_pack_copies_when_tensors_are_not_end_to_end_and_unpack_writes_back():
    a = Array.from_list([1, 2, 3, 4, 5, 6])
    whole = a.memview()
    probes = tensor_list([whole[3:6], whole[0:3]], "p", "s", inplace=True)
    assert not lie_end_to_end(probes)
    flat, packed = pack(probes)
    assert packed is True and isinstance(flat, Array)
    assert flat.tolist() == [4, 5, 6, 1, 2, 3]
    flat[0] = 40.0
    assert a[3] == 4.0  # a copy, not a view
    flat[5] = 30.0
    unpack_into(flat, probes)
    assert a.tolist() == [1, 2, 30, 40, 5, 6]


def test_pack_copies_separate_numpy_arrays_and_unpack_writes_back():
    np = pytest.importorskip("numpy")
    xs = [np.full((2, 2), 1, np.float32), np.full(3, 2, np.float32)]
    probes = tensor_list(xs, "p", "s", inplace=True)
    if lie_end_to_end(probes):
        pytest.skip("the allocator happened to place them end to end")
    flat, packed = pack(probes)
    assert packed is True and flat.tolist() == [1, 1, 1, 1, 2, 2, 2]
    flat[4] = 9.0
    unpack_into(flat, probes)
    assert xs[1][0] == 9.0


def test_unpack_into_refuses_read_only_tensors_and_short_flat():
    data = memoryview(bytes(16)).cast("f")
    probes = tensor_list([data[2:], data[:2]], "p", "s", inplace=False)
    flat, _ = pack(probes)
    with pytest.raises(ValueError, match="read-only"):
        unpack_into(flat, probes)
    with pytest.raises(ValueError, match="flat holds 4 bytes"):
        unpack_into(Array(1), probes)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, width=32), min_size=1,
                         max_size=5), min_size=1, max_size=5))
def test_pack_then_unpack_round_trips_any_tensor_list(values):
    xs = [f32(*v) for v in values]
    probes = tensor_list(list(reversed(xs)), "p", "s", inplace=True)
    flat, packed = pack(probes)
    expected = [v for x in reversed(values) for v in x]
    assert list(flat) == expected
    for i in range(len(flat)):
        flat[i] = float(i)
    if packed:
        unpack_into(flat, probes)
    assert [v for x in reversed(xs) for v in x] == list(range(len(flat)))


def test_copy_bytes_and_zero_bytes_work_on_addresses():
    src, dst = Array.from_list([1, 2, 3]), Array(3)
    copy_bytes(dst.address, src.address, 8)
    assert dst.tolist() == [1, 2, 0]
    zero_bytes(src.address + 4, 8)
    assert src.tolist() == [1, 0, 0]
    big = Array((3 << 20) // 4 + 1, "uint8").reshape(-1)
    big[len(big) - 1] = 5
    zero_bytes(big.address, big.nbytes)
    assert big[len(big) - 1] == 0


# ----- Array -------------------------------------------------------------

def test_array_has_shape_dtype_sizes_and_is_zero_filled():
    a = Array((2, 3), "float64")
    assert (a.shape, a.dtype, a.itemsize, a.size, a.nbytes, a.ndim) == (
        (2, 3), "float64", 8, 6, 48, 2)
    assert a.tolist() == [[0.0] * 3] * 2
    assert Array(4).shape == (4,) and Array(4).dtype == "float32"
    assert Array.zeros((2,), "uint8").tolist() == [0, 0]
    assert Array.empty(3, "int64").size == 3


def test_array_supports_zero_d_and_zero_sized_shapes():
    s = Array(())
    assert (s.shape, s.size, s.ndim, s.nbytes, s.tolist()) == ((), 1, 0, 4, 0.0)
    with pytest.raises(TypeError, match="0-d"):
        len(s)
    z = Array((2, 0), "int32")
    assert z.size == 0 and z.tolist() == [[], []] and len(z) == 2


def test_array_refuses_bad_dtype_by_name_and_bad_shapes():
    with pytest.raises(TypeError, match="'complex64'"):
        Array(3, "complex64")
    for bad in (-1, (2, -3), (2.5,), "ab", (True,), None):
        with pytest.raises(ValueError, match="bad shape"):
            Array(bad)


def test_an_empty_array_may_have_large_dimensions_but_not_past_int64s_count():
    """Zeros left out, a shape's dimensions multiply to at most 2**63 - 1: the native calls take
    products of dimensions as int64, and (2**40, 2**40, 0) or (0, 2**63) overflowed cffi's int64
    in linear, cross_entropy, the norms and attention. (0, 2**61), which torch makes, stays."""
    assert Array.empty((2 ** 40, 0)).shape == (2 ** 40, 0) and Array.empty((0, 2 ** 61)).size == 0
    assert Array.empty((0, 2 ** 63 - 1), "uint8").size == 0
    for bad in ((2 ** 40, 2 ** 40, 0), (0, 2 ** 63), (0, 2 ** 31, 2 ** 32)):
        for make in (Array, Array.empty, lambda shape: Array.from_bytes(b"", shape, "float32")):
            with pytest.raises(ValueError, match=r"bad shape .* nonzero dimensions must fit int64"):
                make(bad)
    # repr of an empty Array names its shape without tolist() (2**40 empty lists)
    assert repr(Array.empty((2 ** 40, 0))) == "Array(shape=(1099511627776, 0), dtype='float32')"


def test_array_from_list_validates_ints_for_int_dtypes():
    assert Array.from_list([1, -2], "int32").tolist() == [1, -2]
    with pytest.raises(TypeError, match="not an integer"):
        Array.from_list([1.5], "int32")
    with pytest.raises(ValueError, match="does not fit in dtype uint8"):
        Array.from_list([256], "uint8")
    with pytest.raises(TypeError, match="not a number"):
        Array.from_list(["1"], "float32")
    assert Array.from_list([1, 2.5]).tolist() == [1.0, 2.5]


def test_array_int_indexing_on_one_d_only():
    a = Array.from_list([1, 2, 3], "int64")
    a[-1] = 9
    assert (a[0], a[2], list(a), len(a)) == (1, 9, [1, 2, 9], 3)
    with pytest.raises(IndexError):
        a[3]
    with pytest.raises(TypeError, match="1-d"):
        Array((2, 2))[0]
    with pytest.raises(TypeError, match="1-d"):
        iter(Array((2, 2)))
    with pytest.raises(TypeError, match="index must be an int"):
        a[0:1]


def test_array_reshape_shares_memory_and_infers_minus_one():
    a = Array(6)
    b = a.reshape(2, -1)
    c = a.reshape((3, 2))
    assert b.shape == (2, 3) and c.shape == (3, 2)
    assert b.address == a.address
    b.memview()[1, 2] = 5.0
    assert a[5] == 5.0 and c.tolist()[2][1] == 5.0
    for bad in ((4, -1), (-1, -1), (7,)):
        with pytest.raises(ValueError):
            a.reshape(*bad)


def test_array_copy_and_bytes_are_independent():
    a = Array.from_list([1, 2])
    b = a.copy()
    b[0] = 5
    assert a[0] == 1.0 and b.address != a.address
    c = Array.from_bytes(a.tobytes(), (2, 1), "float32")
    assert c.tolist() == [[1.0], [2.0]]
    with pytest.raises(ValueError, match="got 8 bytes"):
        Array.from_bytes(a.tobytes(), 3, "float32")


def test_array_from_buffer_copies_keeping_shape_and_dtype():
    src = memoryview(array.array("d", range(6))).cast("B").cast("d", (2, 3))
    a = Array.from_buffer(src)
    assert a.shape == (2, 3) and a.dtype == "float64"
    assert a.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert Array.from_buffer(array.array("i", [7]), "int32").tolist() == [7]
    with pytest.raises(TypeError, match="has dtype float64, not float32"):
        Array.from_buffer(src, "float32")
    with pytest.raises(TypeError, match="does not support"):
        Array.from_buffer(array.array("h", [1]))


def test_array_from_buffer_copies_strided_numpy_in_c_order():
    np = pytest.importorskip("numpy")
    x = np.arange(12, dtype=np.float32).reshape(3, 4).T
    a = Array.from_buffer(x)
    assert a.shape == (4, 3) and a.tolist() == x.tolist()


def test_array_memview_is_writable_with_format_and_shape():
    a = Array((2, 2), "int32")
    m = a.memview()
    assert (m.format, m.shape, m.readonly) == ("i", (2, 2), False)
    m[1, 0] = 3
    assert a.tolist() == [[0, 0], [3, 0]]


def test_array_pickles_round_trip():
    for a in (Array.from_list([1, 2, 3], "uint32").reshape(3, 1),
              Array(()), Array((0, 4), "float64")):
        b = pickle.loads(pickle.dumps(a))
        assert (b.shape, b.dtype, b.tolist()) == (a.shape, a.dtype, a.tolist())
        assert b.address != a.address or a.nbytes == 0


def test_numpy_asarray_of_array_is_zero_copy():
    np = pytest.importorskip("numpy")
    a = Array((2, 3), "float32")
    n = np.asarray(a)
    assert n.dtype == np.float32 and n.shape == (2, 3)
    n[1, 2] = 4.5
    assert a.tolist()[1][2] == 4.5
    assert np.asarray(Array(5, "uint8")).dtype == np.uint8
    assert np.asarray(Array((), "int64")).shape == ()


@pytest.mark.skipif(sys.version_info < (3, 12),
                    reason="the buffer protocol from Python needs 3.12")
def test_memoryview_of_array_works_on_python_312():
    a = Array((2, 2))
    with memoryview(a) as m:
        assert m.shape == (2, 2) and m.format == "f"
        m[0, 1] = 2.0
    assert a.tolist() == [[0.0, 2.0], [0.0, 0.0]]


def test_library_never_imports_numpy():
    code = (
        "import sys, array\n"
        "import mojo_train\n"
        "from mojo_train._array import Array\n"
        "from mojo_train._buffer import tensor_list, pack, offsets_for\n"
        "xs = [array.array('f', [1, 2]), array.array('f', [3])]\n"
        "ps = tensor_list(xs, 'p', 's', inplace=True)\n"
        "flat, packed = pack(ps)\n"
        "assert list(flat) == [1, 2, 3], list(flat)\n"
        "assert offsets_for(ps).tolist() == [0, 2, 3]\n"
        "assert Array((2, 2)).reshape(-1).tolist() == [0.0] * 4\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ----- refusals say the fix ------------------------------------------------

@pytest.mark.parametrize("dtype", ["float64", "float16"])
def test_a_numpy_array_of_another_float_dtype_is_refused_saying_astype(dtype):
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"^mojo_train\.step: weight has dtype %s; .*never casts "
                       r"\(convert with weight\.astype\(np\.float32\)\)$" % dtype):
        float32_tensor(np.zeros(3, dtype), "weight", "step")


def test_float_ids_are_refused_saying_astype_int64():
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError, match=r"ids has dtype float32; .*\(convert with ids\.astype\(np\.int64\)\)$"):
        int_tensor(np.zeros(3, np.float32), "ids", "forward")


def test_a_strided_numpy_array_is_refused_saying_ascontiguousarray():
    np = pytest.importorskip("numpy")
    x = np.zeros((4, 4), np.float32).T
    with pytest.raises(ValueError, match=r"^mojo_train\.step: x must be C-contiguous \(got a strided view "
                       r"of shape \(4, 4\)\); pass np\.ascontiguousarray\(x\)$"):
        float32_tensor(x, "x", "step")


def test_a_strided_in_place_argument_is_told_the_copy_takes_the_writes():
    np = pytest.importorskip("numpy")
    out = np.zeros(8, np.float32)[::2]
    with pytest.raises(ValueError, match=r"pass np\.ascontiguousarray\(out\) \(it is written in place: the "
                       r"copy then receives the result, not out\)$"):
        float32_tensor(out, "out", "add", inplace=True)


def test_a_plain_buffer_of_another_dtype_is_told_to_convert_without_a_library_name():
    with pytest.raises(TypeError, match=r"grads\[1\] has dtype float64; .*\(convert it to float32 first\)$"):
        tensor_list([f32(1.0), array.array("d", [1.0])], "grads", "clip", inplace=True)
    strided = memoryview(f32(1, 2, 3, 4))[::2]
    with pytest.raises(ValueError, match=r"x must be C-contiguous .*; copy it into a contiguous buffer$"):
        float32_tensor(strided, "x", "step")
