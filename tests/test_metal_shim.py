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
import re
import subprocess
import sys

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
                          "-I", os.path.join(REPO, "native", "common"), source], capture_output=True, text=True)
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
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "mt_ftz_probe_cases.h"
#include "mt_ftz_probe_ops.h"
int main(int argc, char **argv) {   /* the rule's answers stand in for a GPU's; "zeros": a device that computes nothing */
    uint32_t *hw = malloc(4 * (size_t)mt_probe_count);
    for (int k = 0; k < mt_probe_count; ++k) {
        const mt_probe_case *c = &mt_probe_cases[k];
        hw[k] = argc > 1 && !strcmp(argv[1], "zeros") ? 0u : mt_probe_rule(c);
        if (argc > 1 && !strcmp(argv[1], "contracting") && c->op == MT_PROBE_MULADD) {   /* a device that fuses */
            float a, b, cc, r;
            memcpy(&a, &c->a, 4); memcpy(&b, &c->b, 4); memcpy(&cc, &c->c, 4);
            r = fmaf(a, b, cc);
            memcpy(&hw[k], &r, 4);
        }
    }
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
                                  "a * b + c contracted (fp contract(off) not honoured)": False,
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
    # a device that fuses a * b + c against the pragma is told so
    fused = subprocess.run([str(exe), "contracting"], capture_output=True, text=True)
    assert fused.returncode == 1 and json.loads(fused.stdout)["verdicts"][
        "a * b + c contracted (fp contract(off) not honoured)"] is True
    # a device whose every answer is 0 (a paravirtual GPU running nothing) is told, not taken as flushing
    zeros = subprocess.run([str(exe), "zeros"], capture_output=True, text=True)
    assert zeros.returncode == 2 and json.loads(zeros.stdout)["verdicts"][
        "normal cases neither rule nor IEEE (the device computed nothing trustworthy)"] >= 4


# ---- the library's kernel sources (issue 17 point 2) ----------------------------------------------
LIBRARY_SOURCES = sorted(glob.glob(os.path.join(METAL, "mt_metal_*.metal")))
KERNEL = re.compile(r"^kernel\s+void\s+(\w+)\s*\((.*?)\)\s*\{", re.S | re.M)


def _kernels():
    """{name: parameter text} of every kernel of the library's sources."""
    found = {}
    for path in LIBRARY_SOURCES:
        with open(path) as f:
            for m in KERNEL.finditer(f.read()):
                assert m.group(1) not in found, "kernel %s defined twice" % m.group(1)
                found[m.group(1)] = m.group(2)
    return found


def _listed():
    with open(os.path.join(METAL, "mt_metal_kernels.h")) as f:
        return re.findall(r"X\((mt_k_\w+)\)", f.read())


def test_every_kernel_is_listed_once_and_none_uses_a_barrier_the_emulator_cannot_run():
    kernels, listed = _kernels(), _listed()
    assert kernels and len(listed) == len(set(listed)) and set(kernels) == set(listed), \
        sorted(set(kernels) ^ set(listed))
    for path in LIBRARY_SOURCES:       # the emulator runs a group's threads one after another
        with open(path) as f:
            assert "threadgroup" not in f.read().replace("thread_position_in_threadgroup", ""), path


def test_every_kernel_binds_its_buffers_at_indices_in_parameter_order_then_its_coordinates():
    """The emulator binds arguments by position and Metal by index: they agree only so."""
    for name, params in _kernels().items():
        indices = [int(i) for i in re.findall(r"\[\[buffer\((\d+)\)\]\]", params)]
        assert indices == list(range(len(indices))), (name, indices)
        parts = [p.strip() for p in params.split(",")]
        coords = [i for i, p in enumerate(parts) if p.startswith("MT_ID_")]
        assert coords == list(range(len(parts) - len(coords), len(parts))), name   # coordinates last
        assert len(indices) + len(coords) == len(parts), name                      # nothing unbound


def test_the_embedded_source_is_every_library_kernel_with_its_includes_inlined(tmp_path):
    out = tmp_path / "source.c"
    subprocess.run([sys.executable, os.path.join(METAL, "mt_metal_amalgamate.py"), str(out)], check=True)
    text = out.read_text()
    assert text.startswith("/* generated") and "const char mt_metal_source[]" in text
    import ast
    body = text[text.index("=") + 1:text.rindex(";")]
    source = "".join(ast.literal_eval(line) for line in body.split("\n") if line.strip())
    assert not re.search(r'^\s*#\s*include\s+"', source, re.M)
    for name in _kernels():
        assert "kernel void %s(" % name in source
    metal = tmp_path / "all.metal"
    metal.write_text(source)
    cxx = _cxx()
    quiet = ["-Wno-unknown-attributes", "-Wno-unknown-pragmas"] if "clang" in cxx else \
        ["-Wno-attributes", "-Wno-unknown-pragmas"]
    run = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", *quiet, "-x", "c++", "-I", os.path.join(METAL, "shim"),
                          str(metal)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_the_shim_refuses_a_device_pointer_where_a_thread_pointer_is_wanted(tmp_path):
    cxx = _cxx()
    if "clang" not in cxx:
        pytest.skip("clang is not installed: only clang models address spaces (%s erases them)" % cxx)
    bad = tmp_path / "bad.metal"
    bad.write_text('#include "mt_metal_kernel.h"\n'
                   'kernel void k(device float *p [[buffer(0)]], MT_ID_GRID(i)) {\n'
                   '    float c; mt_sincospif(p[i], &p[0], &c); }\n')
    run = subprocess.run([cxx, "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", "-Wno-unknown-pragmas",
                          "-x", "c++", "-I", os.path.join(METAL, "shim"), "-I", METAL,
                          "-I", os.path.join(REPO, "native", "include"), str(bad)], capture_output=True, text=True)
    assert run.returncode != 0 and "mt_sincospif" in run.stderr
