"""The HIP build (make hip): the CUDA sources compiled for AMD gfx90a export the whole ABI.

Contract under test: every function declared between MT_CDEF_BEGIN and MT_CDEF_END in
mojo_train.h is a defined, exported (T) dynamic symbol of each built
native/build/libmojo_train_hip_<numeric mode>.so, and the library names itself hip and its numeric mode.
HIP is compile-checked only (native/hip/README.md): this runs where hipcc is installed and
`make hip` has run; elsewhere it skips.
"""
import os
import re
import shutil
import subprocess

import pytest

from mojo_train import _native

from _helpers import REPO

HEADER = os.path.join(REPO, "native", "include", "mojo_train.h")
BUILD = os.path.join(REPO, "native", "build")


def declared_functions():
    with open(HEADER) as f:
        text = f.read()
    block = text.split("/* MT_CDEF_BEGIN */", 1)[1].split("/* MT_CDEF_END */", 1)[0]
    return re.findall(r"\b(mt_\w+)\s*\(", re.sub(r"/\*.*?\*/", "", block, flags=re.S))


def hip_library(numeric_mode):
    if not shutil.which("hipcc"):
        pytest.skip("hipcc is not installed: the HIP build is not compiled here")
    path = os.path.join(BUILD, _native.library_name("hip", numeric_mode))
    if not os.path.isfile(path):
        pytest.skip("%s is not built (make hip)" % path)
    return path


def test_header_parse_finds_the_abi():
    names = declared_functions()
    assert len(names) == len(set(names)) and len(names) >= 20
    for name in ("mt_abi_version", "mt_adamw_step", "mt_device_alloc", "mt_launch_geometry"):
        assert name in names


@pytest.mark.parametrize("numeric_mode", _native.NUMERIC_MODES)
def test_hip_library_exports_every_declared_function(numeric_mode):
    path = hip_library(numeric_mode)
    nm = shutil.which("nm")
    if not nm:
        pytest.skip("nm is not installed")
    out = subprocess.run([nm, "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    exported = {f[2] for f in (line.split() for line in out.splitlines()) if len(f) == 3 and f[1] == "T"}
    missing = [n for n in declared_functions() if n not in exported]
    assert not missing, "%s does not export %s" % (path, ", ".join(missing))


@pytest.mark.parametrize("numeric_mode", _native.NUMERIC_MODES)
def test_hip_library_names_itself(numeric_mode):
    path = hip_library(numeric_mode)
    try:
        lib = _native.ffi.dlopen(path)
    except OSError as e:   # e.g. the HIP runtime (libamdhip64) is not installed beside hipcc
        pytest.skip("cannot dlopen %s: %s" % (path, e))
    assert _native._read_identity(lib) == ("hip", numeric_mode, _native.ABI_VERSION)
