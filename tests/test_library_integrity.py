"""A damaged library file is refused at load, never a crash.

Contract under test (mojo_train/_native.py's docstring): before dlopen the loader checks the
file's ELF header tables, segments and sections lie within it, and its sha256 against the
``<library>.sha256`` manifest that ``make`` writes beside it; after dlopen every name the
cdef declares must resolve. A refused file raises BackendError naming the file, saying it is
damaged or truncated (or incomplete) and the rebuild command. Our own folders (the package's
``lib/``, ``native/build/``) need the manifest; a library found through
MOJO_TRAIN_LIBRARY_PATH without one loads, and backend_info says so.

Every load attempt runs in a child process, so a crash is a failed test, not a dead run.
"""
import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from mojo_train import _native

from _helpers import REPO, python_path
from test_native import declared_functions, run_python

IDENTITY = ("mt_abi_version", "mt_vendor", "mt_numeric_mode", "mt_features")

LOAD = """
    import json
    from mojo_train import _native
    try:
        b = _native.load(%r, %r)
    except _native.BackendError as e:
        print('REFUSED'); print(e)
    else:
        print('LOADED'); print(json.dumps(_native.backend_info(%r, %r)))
"""


def load_in_child(libdir, vendor, numeric_mode, **env):
    """Load (vendor, numeric mode) in a fresh interpreter searching ``libdir`` first."""
    out = run_python(LOAD % (numeric_mode, vendor, numeric_mode, vendor),
                     dict(env, MOJO_TRAIN_LIBRARY_PATH=str(libdir), MOJO_TRAIN_VENDOR=vendor))
    assert out.returncode == 0, "the child died (%d): %s" % (out.returncode, out.stderr[-2000:])
    return out.stdout


def write_manifest(path, data=None):
    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    with open(str(path) + ".sha256", "w") as f:
        f.write("%s  %s\n" % (hashlib.sha256(data).hexdigest(), os.path.basename(str(path))))


def copy_library(backend, folder, manifest=True, data=None):
    """A copy of ``backend``'s file in ``folder`` (``data`` instead of its bytes when given),
    with the built library's own manifest beside it when ``manifest``."""
    path = folder / os.path.basename(backend.path)
    if data is None:
        shutil.copyfile(backend.path, path)
    else:
        path.write_bytes(data)
    if manifest:
        shutil.copyfile(backend.path + ".sha256", str(path) + ".sha256")
    return path


def library_bytes(backend):
    with open(backend.path, "rb") as f:
        return f.read()


def assert_refused(stdout, path, vendor, numeric_mode, *words):
    assert stdout.startswith("REFUSED"), stdout
    assert str(path) in stdout
    assert "Rebuild with: " + _native.rebuild_command(vendor, numeric_mode) in stdout
    for w in words:
        assert w in stdout, (w, stdout)


# ---- make writes the manifests --------------------------------------------------------------------

def test_every_built_library_has_a_manifest_that_matches_it(identical):
    manifest = identical.backend.path + ".sha256"
    with open(manifest) as f:
        digest, name = f.read().split()
    assert name == os.path.basename(identical.backend.path)
    assert digest == hashlib.sha256(library_bytes(identical.backend)).hexdigest()


def test_sha256sum_accepts_the_manifest_make_writes(identical):
    tool = shutil.which("sha256sum")
    if tool is None:
        pytest.skip("no sha256sum here")
    folder, name = os.path.split(identical.backend.path)
    res = subprocess.run([tool, "-c", name + ".sha256"], cwd=folder, capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == name + ": OK", res.stdout + res.stderr


# ---- good copies load ---------------------------------------------------------------------------------

def test_a_good_copy_with_its_manifest_loads_from_the_library_path(identical, tmp_path):
    path = copy_library(identical.backend, tmp_path)
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert out.startswith("LOADED"), out
    info = json.loads(out.splitlines()[1])
    assert info["path"] == str(path)
    assert info["tried"][-1] == {"vendor": identical.vendor, "path": str(path), "outcome": "loaded"}


def test_a_copy_without_a_manifest_loads_from_the_library_path_and_backend_info_says_so(identical, tmp_path):
    path = copy_library(identical.backend, tmp_path, manifest=False)
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert out.startswith("LOADED"), out
    tried = json.loads(out.splitlines()[1])["tried"]
    assert tried[-1]["path"] == str(path)
    assert tried[-1]["outcome"].startswith("loaded") and "no manifest" in tried[-1]["outcome"]


# ---- truncation and damage -----------------------------------------------------------------------------

TRUNCATIONS = {"empty": lambda n: 0, "1 byte": lambda n: 1, "63 bytes": lambda n: 63,
               "64 bytes": lambda n: 64, "65 bytes": lambda n: 65, "4096 bytes": lambda n: 4096,
               "a quarter": lambda n: n // 4, "half": lambda n: n // 2,
               "less a page": lambda n: n - 4096, "less 64 bytes": lambda n: n - 64,
               "less 1 byte": lambda n: n - 1}


@pytest.mark.parametrize("manifest", [False, True], ids=["no manifest", "with manifest"])
@pytest.mark.parametrize("cut", list(TRUNCATIONS))
def test_a_truncated_library_is_refused_not_a_crash(identical, tmp_path, cut, manifest):
    data = library_bytes(identical.backend)
    length = TRUNCATIONS[cut](len(data))
    path = copy_library(identical.backend, tmp_path, manifest, data[:length])
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, "is damaged or truncated")


def test_auto_passes_over_a_damaged_gpu_library_and_says_so_while_an_explicit_vendor_refuses(tmp_path):
    cpu = _native.load("identical", "cpu")
    fake = tmp_path / _native.library_name("cuda", "identical")
    fake.write_bytes(library_bytes(cpu)[:4096])             # a truncated file where CUDA's would be
    out = load_in_child(tmp_path, "auto", "identical")
    assert out.startswith("LOADED"), out
    info = json.loads(out.splitlines()[1])
    assert info["vendor"] != "cuda"
    refused = [t for t in info["tried"] if t["path"] == str(fake)]
    assert refused and "damaged or truncated" in refused[0]["outcome"], info["tried"]
    assert_refused(load_in_child(tmp_path, "cuda", "identical"), fake, "cuda", "identical", "damaged")


# Single-byte damages: the ELF magic, class, e_machine, e_shoff, the first program header,
# and bytes through the file. The manifest catches every one; without it most load unnoticed.
DAMAGES = {"magic": lambda n: 1, "class": lambda n: 4, "machine": lambda n: 18, "shoff": lambda n: 45,
           "program header": lambda n: 64 + 8, "a third in": lambda n: n // 3, "half way": lambda n: n // 2,
           "last byte": lambda n: n - 1}


@pytest.mark.parametrize("where", list(DAMAGES))
def test_a_library_damaged_in_one_byte_is_refused_by_its_manifest(identical, tmp_path, where):
    data = bytearray(library_bytes(identical.backend))
    data[DAMAGES[where](len(data))] ^= 0x5A
    path = copy_library(identical.backend, tmp_path, True, bytes(data))
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, "is damaged or truncated")


def test_a_malformed_manifest_is_refused(identical, tmp_path):
    path = copy_library(identical.backend, tmp_path, manifest=False)
    (tmp_path / (path.name + ".sha256")).write_text("not a digest\n")
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, "malformed digest manifest")


def test_a_manifest_naming_another_file_is_refused(identical, tmp_path):
    path = copy_library(identical.backend, tmp_path, manifest=False)
    digest = hashlib.sha256(library_bytes(identical.backend)).hexdigest()
    (tmp_path / (path.name + ".sha256")).write_text("%s  libsomething_else.so\n" % digest)
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, "malformed digest manifest")


# ---- our own folders need the manifest ---------------------------------------------------------------

def _installed_package(tmp_path, backend, manifest):
    """A copy of the package as pip installs it: mojo_train/ with lib/ and include/."""
    root = tmp_path / "site"
    pkg = root / "mojo_train"
    shutil.copytree(os.path.join(REPO, "mojo_train"), pkg,
                    ignore=shutil.ignore_patterns("lib", "include", "__pycache__"))
    (pkg / "include").mkdir()
    shutil.copyfile(os.path.join(REPO, "native", "include", "mojo_train.h"), pkg / "include" / "mojo_train.h")
    (pkg / "lib").mkdir()
    return root, copy_library(backend, pkg / "lib", manifest)


def _load_installed(root, vendor, numeric_mode):
    env = {k: v for k, v in os.environ.items() if k != "MOJO_TRAIN_LIBRARY_PATH"}
    env.update(PYTHONPATH=python_path(root), MOJO_TRAIN_VENDOR=vendor)
    res = subprocess.run([sys.executable, "-c", textwrap.dedent(LOAD % (numeric_mode, vendor, numeric_mode, vendor))],
                         cwd=str(root), env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return res.stdout


def test_an_installed_library_without_its_manifest_is_refused(identical, tmp_path):
    root, path = _installed_package(tmp_path, identical.backend, manifest=False)
    out = _load_installed(root, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, "has no digest manifest",
                   str(path) + ".sha256")


def test_an_installed_library_with_its_manifest_loads(identical, tmp_path):
    root, path = _installed_package(tmp_path, identical.backend, manifest=True)
    out = _load_installed(root, identical.vendor, identical.numeric_mode)
    assert out.startswith("LOADED"), out
    info = json.loads(out.splitlines()[1])
    assert info["path"] == str(path) and info["tried"][-1]["outcome"] == "loaded"


# ---- a stub that exports only the identity functions ----------------------------------------------------

STUB = r"""
#include <stdint.h>
__attribute__((visibility("default"))) int mt_abi_version(void) { return %d; }
__attribute__((visibility("default"))) const char *mt_vendor(void) { return "%s"; }
__attribute__((visibility("default"))) const char *mt_numeric_mode(void) { return "%s"; }
%s
"""
FEATURES = '__attribute__((visibility("default"))) uint64_t mt_features(void) { return 0xffffffffu; }'


@pytest.mark.parametrize("with_features", [True, False], ids=["all four identity functions", "no mt_features"])
def test_a_stub_exporting_only_identity_functions_is_refused_naming_a_missing_symbol(identical, tmp_path,
                                                                                   with_features):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the stub")
    src = tmp_path / "stub.c"
    src.write_text(STUB % (_native.ABI_VERSION, identical.vendor, identical.numeric_mode, FEATURES if with_features else ""))
    libdir = tmp_path / "lib"
    libdir.mkdir()
    stub = libdir / _native.library_name(identical.vendor, identical.numeric_mode)
    res = subprocess.run([cc, "-shared", "-fPIC", "-o", str(stub), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    write_manifest(stub)                     # a stub with a true digest is still refused
    out = load_in_child(libdir, identical.vendor, identical.numeric_mode)
    assert_refused(out, stub, identical.vendor, identical.numeric_mode, "does not export mt_")
    named = out.split("does not export ", 1)[1].split()[0].rstrip(":,")
    assert named in declared_functions()
    if with_features:
        assert named not in IDENTITY and "which mojo_train.h declares" in out
    else:
        assert named == "mt_features" and "not a mojo_train library" in out
