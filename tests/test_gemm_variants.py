"""bench/gemm_variants.py: its first variant (the reference every other tiling's bits are compared
with) is the library's own tiling, and a variant whose C differs in any product is called out."""
import os
import re
import sys

from _helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import gemm_variants as G  # noqa: E402


def test_the_reference_variant_is_the_librarys_tiling():
    # no -D flag: the header's own defaults, whatever they are
    assert G.VARIANTS[0][1].strip() == ""
    assert all(flags.strip() for _, flags in G.VARIANTS[1:])
    assert len({name for name, _ in G.VARIANTS}) == len(G.VARIANTS)


def test_every_flag_names_a_knob_of_the_header():
    text = open(os.path.join(REPO, "native", "cuda", "mt_gpu_gemm.cuh")).read()
    for _, flags in G.VARIANTS:
        for flag in flags.split():
            name = re.match(r"-D(MT_GEMM_\w+)=\d+$", flag).group(1)
            assert re.search(r"#ifndef %s\b" % name, text), name


LINES = ("sh0 8192x8192x8192 kk slices=1 ms=24.4 tflops=45.04 fnv=25bbe863738eac10\n"
         "sh0 777x1029x2049 rr slices=3 ms=0.12 tflops=26.1 fnv=695aeff2f4fda02c\n"
         "other 8192x8192x8192 kk slices=1 ms=1 tflops=1 fnv=0\n")


def test_parse_reads_only_its_variants_lines():
    rows = G.parse(LINES, "sh0")
    assert [(r["shape"], r["lay"], r["slices"], r["fnv"]) for r in rows] == [
        ("8192x8192x8192", "kk", "1", "25bbe863738eac10"), ("777x1029x2049", "rr", "3", "695aeff2f4fda02c")]


def test_a_changed_hash_or_a_missing_product_differs():
    ref = G.parse(LINES, "sh0")
    assert G.verdict(G.parse(LINES.replace("sh0 ", "x "), "x"), ref) == "same bits"
    assert G.verdict(G.parse(LINES.replace("695aeff2f4fda02c", "695aeff2f4fda02d"), "sh0"), ref) == "BITS DIFFER"
    assert G.verdict(ref[:1], ref) == "BITS DIFFER"


def test_the_lm_head_variant_is_what_mt_gpu_lm_head_cu_builds():
    text = open(os.path.join(REPO, "native", "cuda", "mt_gpu_lm_head.cu")).read()
    head = text[:text.index('#include "mt_gpu_gemm.cuh"')]
    defined = dict(re.findall(r"^#define (MT_GEMM_\w+) (\d+)$", head, re.M))
    flags = dict(f[2:].split("=") for f in dict(G.VARIANTS)["lm_head"].split())
    assert defined and defined == flags
