"""bench/device_steps.sh, the steps of a GPU call: what can be checked without a GPU (its usage,
an unknown step reported in the archive it returns)."""
import os
import shutil
import subprocess
import tarfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "device_steps.sh")


@pytest.fixture
def bash():
    path = shutil.which("bash")
    if path is None or shutil.which("tar") is None:
        pytest.skip("bash or tar is not installed")
    return path


def test_no_step_prints_the_usage_and_exits_2(bash):
    out = subprocess.run([bash, SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    for step in ("cards", "suite", "test=FILE", "bench=NAME", "ncu=KERNEL:NAME", "sanitize", "prepare"):
        assert step in out.stdout, step


def test_an_unknown_step_is_named_in_the_archive(bash, tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    out = subprocess.run([bash, SCRIPT, "no_such_step"], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    with tarfile.open(tmp_path / "logs.tgz") as t:
        steps = t.extractfile("logs/steps.txt").read().decode()
    assert "unknown step no_such_step" in steps and "no_such_step done" in steps
    assert not (tmp_path / "logs").exists()   # only the archive comes back
