"""examples/train_xor.c: a C program trains a small network through mojo_train.h alone, built
and run outside the repository (a temporary folder holding only the header and the source),
the way `make example` and a C host elsewhere would.

Contract under test: the README's "Using it from C" and the example's header comment.
"""
import os
import re
import shutil
import subprocess

import pytest

from mojo_train import _native

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(REPO, "examples", "train_xor.c")
HEADER = os.path.join(REPO, "native", "include", "mojo_train.h")


def _compiler():
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH: the C example cannot be built")
    return cc


def _cpu_library():
    try:
        return _native.load("identical", "cpu").path
    except _native.BackendError:
        pytest.skip("the example links the cpu oracle's identical library, which is not built")


def _build_and_run(tmp_path, *defines):
    """Copy the source and the header alone into tmp_path, build there, run there."""
    cc, lib = _compiler(), _cpu_library()
    for path in (SOURCE, HEADER):
        shutil.copy(path, tmp_path)
    libdir, libname = os.path.dirname(lib), os.path.basename(lib)[3:].rsplit(".", 1)[0]
    cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pedantic", "-I", ".", *defines,
           "train_xor.c", "-L", libdir, "-l" + libname, "-Wl,-rpath," + libdir, "-o", "train_xor"]
    built = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, " ".join(cmd) + "\n" + built.stderr
    return subprocess.run([str(tmp_path / "train_xor")], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def _losses(stdout):
    return [float(v) for v in re.findall(r"^step +\d+ +loss ([\d.]+)$", stdout, re.M)]


def test_the_c_example_learns_xor_from_outside_the_repository(tmp_path):
    run = _build_and_run(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    losses = _losses(run.stdout)
    assert len(losses) >= 3 and losses[-1] < losses[0] / 10, run.stdout
    predictions = re.findall(r"-> (\d) \(want (\d)\)", run.stdout)
    assert len(predictions) == 4 and all(got == want for got, want in predictions), run.stdout
    assert run.stdout.rstrip().endswith("learned")


def test_the_c_example_exits_1_when_training_is_too_short_to_learn(tmp_path):
    run = _build_and_run(tmp_path, "-DSTEPS=1")
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.rstrip().endswith("FAILED")


def test_make_example_builds_it_beside_the_library_and_runs_it_from_another_folder(tmp_path):
    _compiler()
    _cpu_library()
    if shutil.which("make") is None:
        pytest.skip("no make on PATH: the example target cannot run")
    run = subprocess.run(["make", "-s", "example"], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, TMPDIR=str(tmp_path)), timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "learned" in run.stdout and os.path.isfile(os.path.join(REPO, "native", "build", "train_xor"))
