"""Every op family has its room at every layer, under one name (CONTRIBUTING.md, "The house").

A family is a contract in native/contracts/ (math.md, the pinned routines every family shares,
and ftz.md, the identical_ftz numeric mode's rule over every family, are not families). Each must have its CPU oracle source (or, host-only, its native/common/
source), its GPU source or a host-only note in the contract's opening lines, its Python
module, its card generator and card, and its test file; a benchmark, where there is one, is
named by the family too.
"""
import os
import re

import pytest

from mojo_train import _native

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACTS = os.path.join(ROOT, "native", "contracts")
NOT_FAMILIES = {"README", "math", "ftz"}
FAMILIES = sorted(f[:-3] for f in os.listdir(CONTRACTS) if f.endswith(".md") and f[:-3] not in NOT_FAMILIES)


def exists(*parts):
    return os.path.isfile(os.path.join(ROOT, *parts))


def host_only(family):
    """A host-only family says so in its contract's first 15 lines."""
    with open(os.path.join(CONTRACTS, family + ".md")) as f:
        head = "".join(f.readline() for _ in range(15))
    return "host-only" in head


def test_the_families_are_the_ones_the_house_names():
    assert FAMILIES == sorted(["optim", "clip", "loss", "lm_head", "linear", "rms_norm", "embedding", "random",
                               "elementwise", "accumulate", "schedule", "layer_norm", "attention"])


@pytest.mark.parametrize("family", FAMILIES)
def test_a_family_has_every_layer_under_its_name(family):
    missing = []
    if not (exists("native", "cpu_oracle", "mt_cpu_%s.c" % family)
            or (host_only(family) and exists("native", "common", "mt_%s.c" % family))):
        missing.append("native/cpu_oracle/mt_cpu_%s.c" % family)
    if not (exists("native", "cuda", "mt_gpu_%s.cu" % family) or host_only(family)):
        missing.append("native/cuda/mt_gpu_%s.cu (or a host-only note in the contract)" % family)
    for parts in (("mojo_train", "%s.py" % family), ("mojo_train", "_cards_%s.py" % family),
                  ("fixtures", "%s.card" % family), ("tests", "test_%s.py" % family)):
        if not exists(*parts):
            missing.append("/".join(parts))
    if family not in _native.FEATURES:
        missing.append("a feature bit MT_FEATURE_%s in mojo_train.h" % family.upper())
    assert not missing, "family %s lacks %s" % (family, ", ".join(missing))


def _named_files(folder, pattern):
    path = os.path.join(ROOT, *folder)
    return [m.group(1) for f in sorted(os.listdir(path)) for m in [re.match(pattern, f)] if m]


@pytest.mark.parametrize("folder, pattern", [
    (("native", "cpu_oracle"), r"mt_cpu_(\w+)\.c$"),
    (("native", "cuda"), r"mt_gpu_(\w+)\.cu$"),
    (("fixtures",), r"(\w+)\.card$"),
    (("mojo_train",), r"_cards_(\w+)\.py$"),
    (("bench",), r"(\w+?)_(?:cpu|cuda)\.py$"),
])
def test_every_family_named_file_belongs_to_a_family(folder, pattern):
    """No file carries a family-like name that is not a family (a second name for one op)."""
    shared = {"gemm", "tensors", "vendor", "pool", "runtime", "cross_device", "check", "sanitize", "profile",
              "torch_adapter", "distributed", "call_overhead", "deferred", "timeline"}
    # not ops: shared parts (distributed: the collective around every op; call_overhead: every call's host part;
    # deferred: when every deferrable call's refusal is told; timeline: where a multi-kernel call's GPU time goes)
    strays = [n for n in _named_files(folder, pattern) if n not in FAMILIES and n not in shared]
    assert not strays, "%s: %s" % ("/".join(folder), strays)
