"""Tests for mojo_train._dlpack (DLPack export and import in pure ctypes).

Contract under test: an exported capsule shares its memory without copying and keeps its
owner alive exactly as long as some consumer (or the unconsumed capsule) needs it; an
imported tensor reports the producer's address, shape, dtype, device and contiguity, takes
the capsule over by renaming it, and gives it back through the producer's deleter exactly
once.  Bad input is refused by name.  The library itself never imports numpy.
"""

import array
import gc
import subprocess
import sys
import threading
import weakref

import cffi
import pytest

from mojo_train import _dlpack
from mojo_train._dlpack import (DL_CPU, DL_CUDA, DL_ROCM, DTYPES, Imported, export_capsule,
                                from_object, import_capsule)

_FFI = cffi.FFI()
_UNRAISABLE = "ignore::pytest.PytestUnraisableExceptionWarning"


class Owner(bytearray):
    """A bytearray that can be weakly referenced, to watch when it is freed."""


class Producer:
    """A minimal DLPack producer around one of our capsules."""

    def __init__(self, capsule, device=(DL_CPU, 0)):
        self.capsule, self.device, self.calls = capsule, device, []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        capsule, self.capsule = self.capsule, None
        return capsule

    def __dlpack_device__(self):
        return self.device


def address_of(buf):
    return int(_FFI.cast("uintptr_t", _FFI.from_buffer(buf)))


def exported(shape=(2, 3), dtype="float32", device_type=DL_CPU, nbytes=None):
    """(capsule, weakref to its freshly made owner, owner address); the owner is not kept."""
    size = 1
    for extent in shape:
        size *= extent
    owner = Owner(nbytes if nbytes is not None else max(size, 1) * DTYPES[dtype][1] // 8)
    address = address_of(owner)
    capsule = export_capsule(address, shape, dtype, device_type, 0, owner)
    return capsule, weakref.ref(owner), address


@pytest.fixture(autouse=True)
def no_export_outlives_its_test():
    gc.collect()
    before = _dlpack.live_exports()
    yield
    gc.collect()
    assert _dlpack.live_exports() == before


# ---- export: sharing memory with consumers ------------------------------------------------

def test_numpy_sees_what_we_write_into_the_exported_buffer():
    np = pytest.importorskip("numpy")
    owner = array.array("f", [0.0] * 6)
    address = address_of(owner)
    view = np.from_dlpack(Producer(export_capsule(address, (2, 3), "float32", DL_CPU, 0,
                                                  owner)))
    assert view.shape == (2, 3) and view.dtype == np.float32
    assert view.__array_interface__["data"][0] == address
    owner[4] = 7.5
    assert view[1, 1] == 7.5


def test_torch_writes_through_an_exported_capsule_land_in_our_buffer():
    torch = pytest.importorskip("torch")
    owner = bytearray(6 * 4)
    capsule = export_capsule(address_of(owner), (2, 3), "float32", DL_CPU, 0, owner)
    tensor = torch.from_dlpack(Producer(capsule))
    tensor[1, 2] = 5.0
    assert tensor.data_ptr() == address_of(owner)
    assert memoryview(owner).cast("f")[5] == 5.0


def test_torch_accepts_a_bare_capsule_and_frees_the_owner_with_the_tensor():
    torch = pytest.importorskip("torch")
    capsule, owner, address = exported((4,), "int64")
    tensor = torch.from_dlpack(capsule)
    del capsule
    gc.collect()
    assert tensor.dtype == torch.int64 and tensor.data_ptr() == address
    assert owner() is not None
    del tensor
    gc.collect()
    assert owner() is None


def test_an_exported_capsule_describes_c_contiguous_memory_with_real_strides():
    capsule, owner, address = exported((2, 3, 4), "float64")
    with import_capsule(capsule) as imported:
        assert imported.address == address
        assert imported.shape == (2, 3, 4) and imported.strides == (12, 4, 1)
        assert imported.dtype == "float64" and imported.c_contiguous
        assert (imported.device_type, imported.device_id) == (DL_CPU, 0)
        assert imported.readonly is False and imported.nbytes == 2 * 3 * 4 * 8


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_every_dtype_name_survives_a_round_trip(dtype):
    capsule, owner, _ = exported((3,), dtype)
    with import_capsule(capsule) as imported:
        assert imported.dtype == dtype


@pytest.mark.parametrize("device_type", [DL_CUDA, DL_ROCM])
def test_device_capsules_carry_their_device(device_type):
    capsule = export_capsule(0x7000_0000, (8,), "float32", device_type, 3, None)
    with import_capsule(capsule) as imported:
        assert (imported.device_type, imported.device_id) == (device_type, 3)
        assert imported.address == 0x7000_0000


# ---- lifetime: the deleter runs exactly once ------------------------------------------------

def test_the_capsule_keeps_its_owner_alive_until_a_consumer_is_done():
    capsule, owner, _ = exported()
    gc.collect()
    assert owner() is not None
    imported = import_capsule(capsule)
    del capsule
    gc.collect()
    assert owner() is not None
    imported.close()
    gc.collect()
    assert owner() is None


def test_an_unconsumed_capsule_frees_its_owner_when_dropped():
    capsule, owner, _ = exported()
    assert _dlpack.live_exports() >= 1
    del capsule
    gc.collect()
    assert owner() is None


def test_our_deleter_runs_exactly_once_however_often_the_consumer_closes(monkeypatch):
    released = []
    real = _dlpack._release
    monkeypatch.setattr(_dlpack, "_release", lambda ptr: (released.append(ptr), real(ptr)))
    capsule, owner, _ = exported()
    imported = import_capsule(capsule)
    del capsule  # renamed: dropping it must not run the deleter
    gc.collect()
    assert released == [] and owner() is not None
    imported.close()
    imported.close()
    del imported
    gc.collect()
    assert len(released) == 1 and owner() is None


def test_dropping_the_imported_tensor_gives_it_back():
    capsule, owner, _ = exported()
    imported = import_capsule(capsule)
    del capsule, imported
    gc.collect()
    assert owner() is None


def test_numpy_frees_our_owner_once_its_view_is_gone():
    np = pytest.importorskip("numpy")
    capsule, owner, _ = exported((5,), "int32")
    view = np.from_dlpack(Producer(capsule))
    del capsule
    gc.collect()
    assert owner() is not None and view.shape == (5,)
    del view
    gc.collect()
    assert owner() is None


def test_the_deleter_may_run_on_another_thread():
    capsule, owner, _ = exported()
    imported = import_capsule(capsule)
    del capsule
    worker = threading.Thread(target=imported.close)
    worker.start()
    worker.join()
    gc.collect()
    assert imported.closed and owner() is None


@pytest.mark.filterwarnings(_UNRAISABLE)
def test_a_capsule_a_consumer_refuses_still_frees_its_owner():
    np = pytest.importorskip("numpy")
    capsule, owner, _ = exported((2,), "float32", device_type=DL_ROCM)
    producer = Producer(capsule, device=(DL_ROCM, 0))
    del capsule
    # numpy drops the capsule with its error already set; a ctypes destructor cannot hand
    # that error back, so Python may report a SystemError instead: some error is enough.
    with pytest.raises(Exception):
        np.from_dlpack(producer)
    gc.collect()
    assert owner() is None


@pytest.mark.filterwarnings(_UNRAISABLE)
def test_a_capsule_dropped_while_an_error_is_pending_still_frees_its_owner():
    owners = []

    def capsules_then_failure():
        capsule, owner, _ = exported()
        owners.append(owner)
        yield capsule
        raise KeyError("the producer failed")

    with pytest.raises((KeyError, SystemError)):
        list(capsules_then_failure())  # list() drops its items with the error set
    gc.collect()
    assert owners and owners[0]() is None


# ---- import: other producers -------------------------------------------------------------

@pytest.mark.parametrize("name", ["float32", "float64", "float16", "int8", "int32", "int64",
                                  "uint8", "bool", "complex64"])
def test_importing_a_numpy_array_gives_its_address_shape_and_dtype(name):
    np = pytest.importorskip("numpy")
    arr = np.zeros((3, 4), dtype=name)
    with from_object(arr) as imported:
        assert imported.address == arr.__array_interface__["data"][0]
        assert imported.shape == (3, 4) and imported.dtype == name
        assert imported.c_contiguous and (imported.device_type, imported.device_id) == (1, 0)


def test_a_transposed_or_strided_numpy_array_is_not_c_contiguous():
    np = pytest.importorskip("numpy")
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    with from_object(arr.T) as transposed, from_object(arr[:, ::2]) as strided:
        assert transposed.shape == (4, 3) and transposed.strides == (1, 4)
        assert not transposed.c_contiguous
        assert strided.strides == (4, 2) and not strided.c_contiguous
        assert transposed.address == arr.__array_interface__["data"][0]


def test_numpy_memory_stays_alive_until_the_import_is_closed():
    np = pytest.importorskip("numpy")
    arr = np.arange(4, dtype=np.float32)
    watch = weakref.ref(arr)
    imported = from_object(arr)
    del arr
    gc.collect()
    assert watch() is not None
    assert bytes(_FFI.buffer(_FFI.cast("char *", imported.address), 16)) == \
        array.array("f", [0, 1, 2, 3]).tobytes()
    imported.close()
    gc.collect()
    assert watch() is None


@pytest.mark.parametrize("name", ["float32", "float64", "float16", "bfloat16", "int8",
                                  "int32", "int64", "uint8", "bool"])
def test_importing_a_torch_tensor_gives_its_address_shape_and_dtype(name):
    torch = pytest.importorskip("torch")
    tensor = torch.zeros((2, 5), dtype=getattr(torch, name))
    with from_object(tensor) as imported:
        assert imported.address == tensor.data_ptr()
        assert imported.shape == (2, 5) and imported.dtype == name
        assert imported.c_contiguous and imported.strides in (None, (5, 1))


def test_a_transposed_torch_tensor_is_not_c_contiguous_but_a_size_one_axis_is_ignored():
    torch = pytest.importorskip("torch")
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    odd = torch.empty(3, 1, 4).as_strided((3, 1, 4), (4, 99, 1))
    with from_object(base.t()) as transposed, from_object(odd) as size_one:
        assert transposed.shape == (4, 3) and not transposed.c_contiguous
        assert size_one.c_contiguous
    with from_object(base[1:]) as offset:
        assert offset.address == base.data_ptr() + 4 * 4 and offset.c_contiguous


def test_torch_memory_stays_alive_until_the_import_is_closed():
    torch = pytest.importorskip("torch")
    tensor = torch.arange(6, dtype=torch.float32)
    imported = from_object(tensor)
    del tensor  # the import holds the storage, not the Python Tensor
    gc.collect()
    assert memoryview(_FFI.buffer(_FFI.cast("char *", imported.address), 24)).cast("f")[5] \
        == 5.0
    imported.close()


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA/ROCm device for torch")
    return torch, (DL_ROCM if torch.version.hip else DL_CUDA)


def test_importing_a_gpu_tensor_reports_its_device_and_address():
    torch, kind = cuda_torch()
    tensor = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    with from_object(tensor) as imported:
        assert (imported.device_type, imported.device_id) == (kind, tensor.device.index)
        assert imported.address == tensor.data_ptr()
        assert imported.shape == (2, 3) and imported.dtype == "float32"
    with from_object(tensor.t()) as transposed:
        assert not transposed.c_contiguous


def test_torch_writes_into_gpu_memory_we_export_and_frees_the_owner_after():
    torch, kind = cuda_torch()
    owner = torch.zeros(6, device="cuda")
    device = (kind, owner.device.index)
    watch = weakref.ref(owner)
    capsule = export_capsule(owner.data_ptr(), (2, 3), "float32", device[0], device[1], owner)
    view = torch.from_dlpack(Producer(capsule, device=device))
    view[1, 2] = 4.0
    assert view.data_ptr() == owner.data_ptr() and owner[5].item() == 4.0
    del owner, capsule
    gc.collect()
    assert watch() is not None
    del view
    gc.collect()
    assert watch() is None


def test_zero_dimensional_tensors_round_trip():
    np = pytest.importorskip("numpy")
    capsule, owner, address = exported((), "float32")
    memoryview(_FFI.buffer(_FFI.cast("char *", address), 4)).cast("f")[0] = 2.5
    scalar = np.from_dlpack(Producer(capsule))
    assert scalar.shape == () and scalar[()] == 2.5
    with from_object(np.array(1.0)) as imported:
        assert imported.shape == () and imported.c_contiguous


def test_empty_tensors_round_trip_even_with_a_null_address():
    np = pytest.importorskip("numpy")
    empty = np.from_dlpack(Producer(export_capsule(0, (0, 3), "float32", DL_CPU, 0, None)))
    assert empty.shape == (0, 3)
    with import_capsule(export_capsule(0, (4, 0), "int8", DL_CPU, 0, None)) as imported:
        assert imported.shape == (4, 0) and imported.address == 0 and imported.c_contiguous
    with from_object(np.zeros((0, 3))) as imported:
        assert imported.shape == (0, 3) and imported.c_contiguous


# ---- from_object ---------------------------------------------------------------------------

def test_from_object_passes_stream_none_to_the_producer():
    capsule, owner, _ = exported()
    producer = Producer(capsule)
    from_object(producer).close()
    assert producer.calls == [None]


def test_from_object_calls_producers_that_take_no_stream_keyword():
    capsule, owner, _ = exported()

    class OldProducer:
        def __dlpack__(self):
            return capsule

    with from_object(OldProducer()) as imported:
        assert imported.shape == (2, 3)
    del capsule


def test_from_object_names_the_type_that_has_no_dlpack():
    with pytest.raises(TypeError, match="from_object: bytearray does not support DLPack"):
        from_object(bytearray(4))


# ---- refusals ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["floaty", "float", "f4", "", None, 32])
def test_bad_dtype_names_are_refused_by_name(dtype):
    with pytest.raises(TypeError, match="unsupported dtype %r" % (dtype,)):
        export_capsule(0x1000, (2,), dtype, DL_CPU, 0, None)


@pytest.mark.parametrize("shape", [(-1,), (2, -3), ("2",), 5])
def test_bad_shapes_are_refused(shape):
    with pytest.raises((TypeError, ValueError), match="export_capsule: shape"):
        export_capsule(0x1000, shape, "float32", DL_CPU, 0, None)


def test_a_null_address_for_a_non_empty_tensor_is_refused():
    with pytest.raises(ValueError, match="non-null"):
        export_capsule(0, (2,), "float32", DL_CPU, 0, None)


def test_a_capsule_can_be_taken_over_only_once():
    capsule, owner, _ = exported()
    with import_capsule(capsule):
        with pytest.raises(ValueError, match="already consumed"):
            import_capsule(capsule)


def test_things_that_are_not_dltensor_capsules_are_refused():
    with pytest.raises(TypeError, match="got bytes"):
        import_capsule(b"dltensor")
    with pytest.raises(ValueError, match="not named 'dltensor'"):
        import_capsule(_dlpack._capsule_new(0x1000, b"other", _dlpack._DESTRUCTOR_T()))


def test_imported_is_what_import_capsule_returns():
    capsule, owner, _ = exported()
    with import_capsule(capsule) as imported:
        assert isinstance(imported, Imported) and "float32" in repr(imported)
    assert "closed" in repr(imported)


def test_the_library_never_imports_numpy():
    code = "import sys, mojo_train._dlpack; assert 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
