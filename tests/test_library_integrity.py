"""A damaged library file is refused at load, never a crash.

Contract under test (mojo_train/_native.py's docstring): before dlopen runs any of a file's
code the loader checks its sha256 against the ``<library>.sha256`` manifest that ``make`` writes
beside it, then that it is an ELF shared library of this host's machine, class and byte order
whose header tables, segments and sections lie within it; after dlopen every name the cdef
declares must resolve. A refused file raises BackendError naming the file, saying what it is
(damaged or truncated, built for another machine, not an ELF file, incomplete) and the rebuild
command. Our own folders (the package's ``lib/``, ``native/build/``) need the manifest; a
library found through MOJO_TRAIN_LIBRARY_PATH without one loads, and backend_info says so.

Every load attempt runs in a child process, so a crash is a failed test, not a dead run.
"""
import hashlib
import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap

import pytest

from mojo_train import _native

from _helpers import REPO, python_path, skip_without_c_library
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


# Single-bit flips at named places of the file: ELF header fields, a program header, an entry of
# the section header table, the code and the read-only data. The manifest catches every one.
def _elf_tables(data):
    """(e_phoff, e_shoff, e_shnum, program headers) of an ELF shared library's bytes."""
    e = "<" if data[5] == 1 else ">"
    phoff, shoff = struct.unpack_from(e + "QQ", data, 32)
    phnum, shnum = struct.unpack_from(e + "H", data, 56)[0], struct.unpack_from(e + "H", data, 60)[0]
    return phoff, shoff, shnum, [struct.unpack_from(e + "IIQQQQQQ", data, phoff + 56 * i) for i in range(phnum)]


def _middle_of_segment(data, flags):
    """The middle byte of the file bytes of the PT_LOAD segment with these p_flags bits."""
    segment = next(s for s in _elf_tables(data)[3] if s[0] == 1 and s[1] & 7 == flags)
    return segment[2] + segment[5] // 2


ELF_PLACES = {
    "ELF magic": lambda d: 1, "ELF class": lambda d: 4, "ELF data encoding": lambda d: 5, "e_type": lambda d: 16,
    "e_machine": lambda d: 18, "e_phoff": lambda d: 32, "e_shoff": lambda d: 45, "e_phnum": lambda d: 56,
    "e_shstrndx": lambda d: 62,
    "a program header's file size": lambda d: _elf_tables(d)[0] + 32 + 2,
    "the section table's middle entry's offset": lambda d: _elf_tables(d)[1] + 64 * (_elf_tables(d)[2] // 2) + 24 + 2,
    "the code": lambda d: _middle_of_segment(d, 5),                 # PF_R | PF_X
    "the read-only data": lambda d: _middle_of_segment(d, 4),       # PF_R
    "the last byte": lambda d: len(d) - 1,                           # the section table's, from ld
}


@pytest.mark.parametrize("place", list(ELF_PLACES))
def test_a_library_with_one_bit_flipped_is_refused_by_its_manifest(identical, tmp_path, place):
    data = bytearray(library_bytes(identical.backend))
    data[ELF_PLACES[place](data)] ^= 1 << 2
    path = copy_library(identical.backend, tmp_path, True, bytes(data))
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    # the digest is checked first: a flipped e_type or e_machine is damage, not a foreign file
    assert_refused(out, path, identical.vendor, identical.numeric_mode,
                   "is damaged or truncated, or was rewritten after the build")


def _header_field_bits(data):
    """(offset, bit) of every bit of the ELF header fields the loader reads before dlopen, where
    any flip must be seen without a manifest: the magic, class and data encoding, e_type,
    e_machine, the table entry sizes, and the bits of the table offsets at or above the file's size."""
    high = len(data).bit_length()
    fields = [(i, b) for i in (0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 54, 55, 58, 59) for b in range(8)]
    return fields + [(at + b // 8, b % 8) for at in (32, 40) for b in range(high, 64)]


def test_every_flip_of_a_header_field_the_loader_reads_is_refused_without_a_manifest(identical, tmp_path):
    data = library_bytes(identical.backend)
    path = str(copy_library(identical.backend, tmp_path, manifest=False))
    unseen, said = [], {}
    with open(path, "r+b") as f:
        for at, bit in _header_field_bits(data):
            f.seek(at)
            f.write(bytes([data[at] ^ (1 << bit)]))
            f.flush()
            problem, _ = _native._file_problem(path, False)
            f.seek(at)
            f.write(data[at:at + 1])
            f.flush()
            if problem is None:
                unseen.append((at, bit))
            elif at in (18, 19):
                said[(at, bit)] = problem
    assert unseen == []
    assert len(said) == 16 and all("or is damaged" in p for p in said.values()), said   # no machine is one bit away
    assert _native._file_problem(path, False) == (None, " (no manifest: its sha256 was not checked)")


def _manifest_of(path, text):
    (path.parent / (path.name + ".sha256")).write_text(text(path.name, hashlib.sha256(path.read_bytes()).hexdigest()))


MANIFESTS = {
    "empty": (lambda name, digest: "", "malformed digest manifest"),
    "blank lines": (lambda name, digest: "\n\n  \n", "malformed digest manifest"),
    "not a digest": (lambda name, digest: "not a digest\n", "malformed digest manifest"),
    "a digest without a name": (lambda name, digest: digest + "\n", "malformed digest manifest"),
    "a short digest": (lambda name, digest: "%s  %s\n" % (digest[:63], name), "malformed digest manifest"),
    "naming another file": (lambda name, digest: "%s  libsomething_else.so\n" % digest, "malformed digest manifest"),
    "two entries": (lambda name, digest: "%s  %s\n" % (digest, name) * 2, "malformed digest manifest"),
    "binary bytes": (lambda name, digest: "\x00\xff\x7fELF", "malformed digest manifest"),
    "another file's digest": (lambda name, digest: "%s  %s\n" % (hashlib.sha256(b"other").hexdigest(), name),
                              "is damaged or truncated, or was rewritten after the build"),
}


@pytest.mark.parametrize("manifest", list(MANIFESTS))
def test_a_bad_manifest_is_refused(identical, tmp_path, manifest):
    path = copy_library(identical.backend, tmp_path, manifest=False)
    text, words = MANIFESTS[manifest]
    _manifest_of(path, text)
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, words, str(path) + ".sha256")


def test_the_good_manifest_of_a_copy_loads(identical, tmp_path):
    path = copy_library(identical.backend, tmp_path, manifest=False)
    _manifest_of(path, lambda name, digest: "%s *%s\n" % (digest, name))      # sha256sum's binary mark
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert out.startswith("LOADED"), out


# ---- a library of another machine, or no library at all ------------------------------------------------

def _host_machine():
    number = _native._ELF_MACHINES.get(os.uname().machine.lower())
    if number is None:
        pytest.skip("the loader knows no ELF machine number for this host (%s)" % os.uname().machine)
    return number


def _patched(data, *changes):
    data = bytearray(data)
    for at, fmt, value in changes:
        struct.pack_into(fmt, data, at, value)
    return bytes(data)


def _foreign(data, host):
    """(bytes, words the refusal must say) for each way a file is a library of another machine."""
    other, name = (62, "x86-64") if host != 62 else (183, "aarch64")
    host_words = "this host is %s (ELF machine %d); it must be rebuilt on this machine" % (os.uname().machine, host)
    e = "<" if sys.byteorder == "little" else ">"
    swapped = ">" if e == "<" else "<"
    return {
        "another machine": (_patched(data, (18, e + "H", other)),
                            ("was built for %s (ELF machine %d), but " % (name, other), host_words)),
        "32-bit": (_patched(data, (4, "B", 1)), ("is a 32-bit library (ELF class 1), but this host loads 64-bit",)),
        "other byte order": (_patched(data, (5, "B", 2 if e == "<" else 1), (16, swapped + "H", 3),
                                      (18, swapped + "H", host)),
                             ("is a %s-endian library, but this host is %s-endian" % (
                                 "big" if e == "<" else "little", sys.byteorder),)),
        "an executable": (_patched(data, (16, e + "H", 2)), ("is an executable (ELF type 2), not a shared library",)),
    }


@pytest.mark.parametrize("how", ["another machine", "32-bit", "other byte order", "an executable"])
def test_a_library_for_another_machine_is_refused_as_that_not_as_damage(identical, tmp_path, how):
    data, words = _foreign(library_bytes(identical.backend), _host_machine())[how]
    path = copy_library(identical.backend, tmp_path, manifest=False, data=data)
    write_manifest(path)                        # a true digest: the file is whole, only foreign
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode, *words)
    assert "damaged" not in out


CROSS = {62: "aarch64-linux-gnu-gcc", 183: "x86_64-linux-gnu-gcc"}      # host machine -> another's compiler


def test_a_library_cross_built_for_another_machine_is_refused_naming_both_machines(identical, tmp_path):
    host = _host_machine()
    cc = shutil.which(CROSS.get(host, ""))
    if cc is None:
        pytest.skip("no cross compiler for another machine here (%s)" % CROSS.get(host, "none known"))
    skip_without_c_library([cc])
    libdir = tmp_path / "lib"
    libdir.mkdir()
    lib = _build_stub(cc, tmp_path, libdir, identical)
    write_manifest(lib)
    out = load_in_child(libdir, identical.vendor, identical.numeric_mode)
    machine = {62: "aarch64 (ELF machine 183)", 183: "x86-64 (ELF machine 62)"}[host]
    assert_refused(out, lib, identical.vendor, identical.numeric_mode, "was built for " + machine,
                   "this host is %s (ELF machine %d)" % (os.uname().machine, host))
    assert "damaged" not in out


NOT_ELF = {"a shell script": b"#!/bin/sh\nexit 0\n", "text": b"this is not a library\n" * 10,
           "a zip": b"PK\x03\x04" + bytes(200), "a Windows DLL": b"MZ\x90\x00" + bytes(500),
           "a Mach-O dylib": b"\xcf\xfa\xed\xfe" + bytes(4000), "zeros": bytes(4096)}


@pytest.mark.parametrize("manifest", [False, True], ids=["no manifest", "with its manifest"])
@pytest.mark.parametrize("what", list(NOT_ELF))
def test_a_file_that_is_not_elf_is_refused_saying_so(identical, tmp_path, what, manifest):
    path = copy_library(identical.backend, tmp_path, manifest=False, data=NOT_ELF[what])
    if manifest:
        write_manifest(path)
    out = load_in_child(tmp_path, identical.vendor, identical.numeric_mode)
    assert_refused(out, path, identical.vendor, identical.numeric_mode,
                   "is not an ELF file (it begins %r; %d bytes)" % (NOT_ELF[what][:8], len(NOT_ELF[what])))


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


# ---- stubs: one that exports only the identity functions, and one dlopen must not run ---------------------

STUB = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((visibility("default"))) int mt_abi_version(void) { return %d; }
__attribute__((visibility("default"))) const char *mt_vendor(void) { return "%s"; }
__attribute__((visibility("default"))) const char *mt_numeric_mode(void) { return "%s"; }
%s
const char *stub_note(void) { return "STUB-NOTE: bytes dlopen maps but never checks"; }
/* what dlopen runs before any symbol is looked up: it leaves a file where STUB_MARKER says */
__attribute__((constructor)) static void stub_loaded(void) {
    const char *marker = getenv("STUB_MARKER");
    FILE *f = marker ? fopen(marker, "w") : NULL;
    if (f) { fputs("dlopen ran the stub's code\n", f); fclose(f); }
}
"""
FEATURES = '__attribute__((visibility("default"))) uint64_t mt_features(void) { return 0xffffffffu; }'


def _host_cc():
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler to build the stub")
    return cc


def _build_stub(cc, tmp_path, libdir, mode, with_features=True):
    """The stub, built by ``cc`` into ``libdir`` under the library's name for ``mode``."""
    src = tmp_path / "stub.c"
    src.write_text(STUB % (_native.ABI_VERSION, mode.vendor, mode.numeric_mode, FEATURES if with_features else ""))
    stub = libdir / _native.library_name(mode.vendor, mode.numeric_mode)
    res = subprocess.run([cc, "-shared", "-fPIC", "-o", str(stub), str(src)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    return stub


@pytest.mark.parametrize("with_features", [True, False], ids=["all four identity functions", "no mt_features"])
def test_a_stub_exporting_only_identity_functions_is_refused_naming_a_missing_symbol(identical, tmp_path,
                                                                                   with_features):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    stub = _build_stub(_host_cc(), tmp_path, libdir, identical, with_features)
    write_manifest(stub)                     # a stub with a true digest is still refused
    out = load_in_child(libdir, identical.vendor, identical.numeric_mode)
    assert_refused(out, stub, identical.vendor, identical.numeric_mode, "does not export mt_")
    named = out.split("does not export ", 1)[1].split()[0].rstrip(":,")
    assert named in declared_functions()
    if with_features:
        assert named not in IDENTITY and "which mojo_train.h declares" in out
    else:
        assert named == "mt_features" and "not a mojo_train library" in out


def _note_flipped(stub):
    data = bytearray(stub.read_bytes())
    data[data.index(b"STUB-NOTE") + 3] ^= 1
    return bytes(data)


# how the stub is damaged -> (its bytes and manifest are made by..., what the refusal says, does dlopen run it?)
STUB_DAMAGES = {
    "none: the true manifest": (lambda stub: write_manifest(stub), "does not export mt_", True),
    "a bit of its data flipped after its manifest was written": (
        lambda stub: (write_manifest(stub), stub.write_bytes(_note_flipped(stub))),
        "is damaged or truncated, or was rewritten after the build", False),
    "truncated to half, no manifest": (lambda stub: stub.write_bytes(stub.read_bytes()[:len(stub.read_bytes()) // 2]),
                                       "is damaged or truncated", False),
    "e_machine of another machine, with its manifest": (
        lambda stub: (stub.write_bytes(_foreign(stub.read_bytes(), _host_machine())["another machine"][0]),
                      write_manifest(stub)), "was built for", False),
}


@pytest.mark.parametrize("damage", list(STUB_DAMAGES))
def test_a_refused_file_is_refused_before_dlopen_runs_any_of_its_code(identical, tmp_path, damage):
    libdir = tmp_path / "lib"
    libdir.mkdir()
    stub = _build_stub(_host_cc(), tmp_path, libdir, identical)
    make, words, runs = STUB_DAMAGES[damage]
    make(stub)
    marker = tmp_path / "ran"
    out = load_in_child(libdir, identical.vendor, identical.numeric_mode, STUB_MARKER=str(marker))
    assert_refused(out, stub, identical.vendor, identical.numeric_mode, words)
    assert marker.exists() == runs, (damage, out)
