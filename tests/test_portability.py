"""The CPU oracle on other hosts: what a build for an unsupported byte order does.

`make portability` (README "Reliability") runs every card against the CPU oracle built by
clang and for aarch64; this file holds what belongs in the suite: a big-endian build stops at
compile time with a message that says why (mt_pinned.h), while a little-endian target of the
same compiler passes the same check, so the refusal is the byte order's, not the cross target's.
"""
import glob
import shutil
import subprocess

import pytest

from _helpers import REPO, skip_without_c_library

MESSAGE = "mojo_train: big-endian hosts are not supported"
INCLUDES = ["-Inative/include", "-Inative/common", "-Inative/cpu_oracle", "-D_GNU_SOURCE"]


def _header_check(target):
    """clang's syntax check of mt_pinned.h alone for ``target`` (this machine has no big-endian
    C library, so the header is checked by itself, as every oracle source includes it)."""
    if not shutil.which("clang"):
        pytest.skip("clang is not installed: the cross-target checks need it (.ci/run installs it)")
    return subprocess.run(["clang", "--target=" + target, "-fsyntax-only"] + INCLUDES + ["-x", "c", "-"],
                          input='#include "mt_pinned.h"\n', cwd=REPO, capture_output=True, text=True)


@pytest.mark.parametrize("target", ["s390x-linux-gnu", "powerpc64-linux-gnu", "aarch64_be-linux-gnu"])
def test_the_pinned_header_stops_a_big_endian_target_naming_the_byte_order(target):
    done = _header_check(target)
    assert done.returncode != 0
    assert MESSAGE in done.stderr, done.stderr[-2000:]


def test_the_pinned_header_passes_a_little_endian_cross_target():
    if shutil.which("clang"):
        skip_without_c_library(["clang", "--target=aarch64-linux-gnu"])
    done = _header_check("aarch64-linux-gnu")
    assert (done.returncode, done.stderr) == (0, "")


def test_the_oracle_sources_do_not_compile_when_the_compiler_says_big_endian():
    """The whole CPU library's sources, with this host's C library and __BYTE_ORDER__ restated
    as big-endian: the build stops, and every error it reports is the byte order's message."""
    if not shutil.which("gcc"):
        pytest.skip("gcc is not installed: the sources cannot be compiled here")
    sources = sorted(glob.glob(REPO + "/native/cpu_oracle/*.c")) + sorted(glob.glob(REPO + "/native/common/*.c"))
    done = subprocess.run(["gcc", "-std=c11", "-fsyntax-only", "-U__BYTE_ORDER__", "-D__BYTE_ORDER__=__ORDER_BIG_ENDIAN__"]
                          + INCLUDES + sources, cwd=REPO, capture_output=True, text=True)
    errors = [line for line in done.stderr.splitlines() if " error: " in line]
    assert done.returncode != 0
    assert errors and all(MESSAGE in line for line in errors), done.stderr[-2000:]
