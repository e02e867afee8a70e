"""README's examples run as written: each ```python block under a heading that README marks
``(run by tests/test_readme.py)`` is extracted and run in a fresh interpreter outside the
source tree, and its printed results are checked."""
import os
import re
import subprocess
import sys

import pytest

from _helpers import python_path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARK = "(run by tests/test_readme.py)"


def examples():
    """{heading: code} of every marked section's first python block."""
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    found = {}
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        heading = section.splitlines()[0]
        if MARK in heading:
            m = re.search(r"```python\n(.*?)```", section, re.S)
            assert m, "README section %r is marked but has no python block" % heading
            found[heading.replace(MARK, "").strip()] = m.group(1)
    return found


def run_example(code, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(code)
    env = dict(os.environ, PYTHONPATH=python_path(ROOT))
    p = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path), env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_readme_marks_its_runnable_examples():
    assert {"A first training loop", "Set up"} <= set(examples())


def test_the_readme_mlp_example_learns_xor(tmp_path):
    pytest.importorskip("numpy")
    out = run_example(examples()["A first training loop"], tmp_path)
    losses = [float(v) for v in re.findall(r"loss (\d+\.\d+)", out)]
    accuracy = float(re.search(r"accuracy (\d\.\d+)", out).group(1))
    assert len(losses) >= 3 and losses[-1] < losses[0] / 10, out
    assert accuracy >= 0.95, out


def test_the_readme_set_up_example_steps_adamw(tmp_path):
    out = run_example(examples()["Set up"], tmp_path)
    assert re.search(r"total norm 0\.31\d+", out), out
