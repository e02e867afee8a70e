"""Every skip the suite can take has a reviewed reason (tests/skip_reasons.py), and the gate
tells reviewed reasons from others: a new skip reason fails here, on every machine, before it
can hide a test on the one machine where it fires."""
import os
import re

import pytest

import skip_reasons

TESTS = os.path.dirname(os.path.abspath(__file__))
LITERAL = re.compile(r"""(?:pytest\.skip\(|reason=)\s*("(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')""")


def literal_reasons():
    """(file, reason) for every literal skip reason in the suite, with %r/%s filled in."""
    found = []
    for name in sorted(os.listdir(TESTS)):
        if name.endswith(".py"):
            with open(os.path.join(TESTS, name)) as f:
                for m in LITERAL.finditer(f.read()):
                    text = eval(m.group(1))      # a plain string literal
                    found.append((name, text.replace("%r", "cpu-identical").replace("%s", "x")))
    return found


def test_the_suite_has_skip_reasons_to_check():
    assert len(literal_reasons()) > 30


@pytest.mark.parametrize("where, reason", literal_reasons(), ids=lambda v: v[:60])
def test_every_literal_skip_reason_of_the_suite_is_reviewed(where, reason):
    assert skip_reasons.classify(reason), "%s skips for an unreviewed reason: %r" % (where, reason)


@pytest.mark.parametrize("reason, kind", [
    ("this library has no linear (mt_features)", "library"),
    ("could not import 'torch': No module named 'torch'", "reference"),
    ("torch 2.11.0+cu130 has no F.linear_cross_entropy (added in 2.13)", "reference"),
    ("torch 2.11.0+cu130 has no nn.LinearCrossEntropyLoss (added in 2.13)", "reference"),
    ("the docstring's counts are torch 2.13's inputs; torch 2.11.0+cu130 has others", "reference"),
    ("the allocator happened to place them end to end", "chance"),
    ("linear_backward is not built yet", None),
    ("skipped for now", None),
])
def test_the_gate_classifies_reasons(reason, kind):
    assert skip_reasons.classify(reason) == kind
