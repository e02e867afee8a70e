"""Metal, on a machine without Apple's tools (issue 17 point 3): every .metal source of
native/metal compiles as C++ through the shim (native/metal/shim/metal_stdlib), and the
float-behaviour probe's C half (the cases, the identical_ftz rule's answers, the report) compiles
and runs here, with the rule's own answers standing in for an Apple GPU's.

The shim checks syntax, names and types only; whether a kernel is valid Metal is Apple's
compiler's to say (.github/workflows/macos.yml).
"""
import glob
import json
import os
import shutil
import subprocess

import pytest

from _helpers import c_compiler

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
METAL = os.path.join(REPO, "native", "metal")
SOURCES = sorted(glob.glob(os.path.join(METAL, "*.metal")))


def _cxx():
    cxx = next((shutil.which(c) for c in ("clang++", "g++", "c++") if shutil.which(c)), None)
    if not cxx:
        pytest.skip("no C/C++ compiler: the Metal sources are not compile-checked here")
    return cxx


def test_there_are_metal_sources():
    assert SOURCES, "no native/metal/*.metal"


@pytest.mark.parametrize("source", SOURCES, ids=os.path.basename)
def test_every_metal_source_compiles_as_cxx_through_the_shim(source):
    cxx = _cxx()
    quiet = ["-Wno-unknown-attributes", "-Wno-unknown-pragmas"] if "clang" in cxx else \
        ["-Wno-attributes", "-Wno-unknown-pragmas"]
    run = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wall", "-Werror", *quiet, "-x", "c++",
                          "-I", os.path.join(METAL, "shim"), "-I", METAL, "-I", os.path.join(REPO, "native", "include"),
                          source], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_shim_catches_a_type_error(tmp_path):
    cxx = _cxx()
    bad = tmp_path / "bad.metal"
    bad.write_text('#include <metal_stdlib>\nusing namespace metal;\n'
                   'kernel void k(device float *x [[buffer(0)]]) { x[0] = as_type<float>(1.0); }\n')
    run = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-x", "c++", "-I", os.path.join(METAL, "shim"),
                          str(bad)], capture_output=True, text=True)
    assert run.returncode != 0 and "as_type" in run.stderr    # a double is not 4 bytes


PROBE_MAIN = r"""
#include <stdlib.h>
#include <string.h>
#include "mt_ftz_probe_cases.h"
int main(int argc, char **argv) {   /* the rule's answers stand in for a GPU's; "zeros": a device that computes nothing */
    uint32_t *hw = malloc(4 * (size_t)mt_probe_count);
    for (int k = 0; k < mt_probe_count; ++k) hw[k] = argc > 1 ? 0u : mt_probe_rule(&mt_probe_cases[k]);
    int differ = mt_probe_report(stdout, hw, 32, "the rule itself");
    return differ < 0 ? 2 : differ ? 1 : 0;
}
"""


def test_the_probes_report_says_what_the_rule_says_when_a_device_follows_it(tmp_path):
    cc = c_compiler()
    if not cc:
        pytest.skip("no C compiler: the probe's C half is not compiled here")
    main, exe = tmp_path / "main.c", tmp_path / "probe"
    main.write_text(PROBE_MAIN)
    subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-I", METAL, "-I", os.path.join(REPO, "native", "include"),
                    str(main), os.path.join(METAL, "mt_ftz_probe_cases.c"), "-o", str(exe), "-lm"], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    report = json.loads(run.stdout)
    assert report["verdicts"] == {"subnormal inputs read as zero": True, "results below FLT_MIN flushed": True,
                                  "tininess": "before rounding", "sign of a flushed negative result": "-0",
                                  "normal cases neither rule nor IEEE (the device computed nothing trustworthy)": 0,
                                  "cases that differ from the rule": 0}
    # the rule's own neg and abs (ftz.md rule 5), not bit flips
    rows = {c["question"]: c for c in report["cases"]}
    assert rows["negation of a subnormal"]["rule"] == "80000000" and rows["fabs of a negative subnormal"]["rule"] == "00000000"
    questions = " ".join(c["question"] for c in report["cases"])
    for asked in ("smallest subnormal + 0.0", "FLT_MIN * 0.5", "rounds up to FLT_MIN", "-FLT_MIN * 0.5",
                  "> 0", "copy", "select", "division", "sqrt"):
        assert asked in questions, asked
    # the cases tell the two behaviours apart: most of the subnormal ones differ between rule and IEEE
    assert sum(c["rule"] != c["ieee"] for c in report["cases"]) >= 15
    # a device whose every answer is 0 (a paravirtual GPU running nothing) is told, not taken as flushing
    zeros = subprocess.run([str(exe), "zeros"], capture_output=True, text=True)
    assert zeros.returncode == 2 and json.loads(zeros.stdout)["verdicts"][
        "normal cases neither rule nor IEEE (the device computed nothing trustworthy)"] >= 4
