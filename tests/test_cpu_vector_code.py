"""The CPU oracle's vector code runs its fused multiply-adds as instructions.

mt_pinned.h's routines are ``static inline``; where the compiler keeps one out of line, it is
compiled once for the baseline x86-64, where ``fmaf`` is a call into libm, instead of inside the
MT_SIMD target clones (AVX2, AVX-512) that call it. The bits are the same either way (libm's
fmaf is correctly rounded), so no card notices, but the hot loops run many times slower (an
RMSNorm forward 6.6x, the clip's norm 14x: bench/results/NOTES.md). MT_HD_INLINE forces the
inlining. This test disassembles the identical CPU library and lists the functions that call
``fmaf@plt``: only a clone's baseline form (``.default``, taken on a CPU without FMA) and the
reviewed per-row or fallback code below may.
"""
import os
import platform
import re
import shutil
import subprocess

import pytest

from _helpers import REPO

LIBRARY = os.path.join(REPO, "native", "build", "libmojo_train_cpu_identical.so")
# calls of libm's fmaf that are reviewed: the GEMM's scalar kernel (MOJO_TRAIN_CPU_GEMM=scalar
# only), the (N, C, d...) cross-entropy's strided rows, and scalars once per row or per tensor
ALLOWED = {"kern_scalar", "nd_row", "nd_row_tail", "fwd_tile", "ce_body", "mt_adam_plan",
           "mt_host_one_minus_pow"}


def fmaf_callers():
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the CPU library's target clones are x86-64's; this machine is %s" % platform.machine())
    if not shutil.which("objdump"):
        pytest.skip("objdump is not installed: the disassembly check needs it")
    if not os.path.isfile(LIBRARY):
        pytest.skip("the cpu oracle's identical numeric mode is not built (make)")
    text = subprocess.run(["objdump", "-d", LIBRARY], capture_output=True, text=True, check=True).stdout
    callers, fn = set(), None
    for line in text.splitlines():
        m = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        if m:
            fn = m.group(1)
        elif fn and re.search(r"call.*<fmaf@plt>", line):
            callers.add(fn)
    return callers


def test_no_vector_code_calls_libms_fmaf():
    offenders = sorted(f for f in fmaf_callers() if not f.endswith(".default") and f not in ALLOWED)
    assert not offenders, ("these functions call libm's fmaf (compiled out of line for the baseline target): "
                           "mark the mt_pinned.h routine they call MT_HD_INLINE: %s" % offenders)


def test_the_check_sees_the_clones_baseline_forms():
    """The disassembly is read: a clone's baseline form does call fmaf, so the parse finds callers."""
    assert any(f.endswith(".default") for f in fmaf_callers())
