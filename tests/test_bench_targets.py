"""bench/targets.py, the one command that puts every benchmark target beside its latest figure.

Contract under test: its docstring. A target holds only when the median over at least three
processes (records of the latest commit) meets it; fewer are unproven whatever they show; a
bound given as another figure is compared per process as a ratio; records of older commits do
not count; a missing figure is NO RECORD; and every target of the table finds its figure in the latest
record of its benchmark (so a renamed key cannot silently turn a target into NO RECORD).
"""
import json
import os
import re
import subprocess
import sys

import pytest

from _helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import targets as T  # noqa: E402


def _write(folder, name, rows):
    with open(os.path.join(str(folder), name + ".jsonl"), "w") as f:
        for commit, figures in rows:
            f.write(json.dumps({"commit": commit, "figures": figures}) + "\n")


def test_three_processes_meeting_the_bound_hold_and_fewer_are_unproven(tmp_path):
    t = T.Target("x", "x", "b", "a.ms", at_most=1.0)
    _write(tmp_path, "b", [("old", {"a": {"ms": 9.0}})] + [("new", {"a": {"ms": v}}) for v in (0.9, 1.2, 0.8)])
    assert T.evaluate(t, str(tmp_path))[0] == "HOLDS"                 # median 0.9; the old 9.0 ignored
    _write(tmp_path, "b", [("new", {"a": {"ms": v}}) for v in (0.9, 1.2, 1.1)])
    assert T.evaluate(t, str(tmp_path))[0] == "MISSES"
    _write(tmp_path, "b", [("new", {"a": {"ms": 0.5}}), ("new", {"a": {"ms": 0.6}})])
    assert T.evaluate(t, str(tmp_path))[0] == "UNPROVEN (2 processes; would hold)"


def test_a_bound_that_is_another_figure_is_a_per_process_ratio_with_its_factor(tmp_path):
    t = T.Target("x", "x", "b", "rows[op=f].ours", at_most="rows[op=f].torch", factor=1.1)
    rows = [{"op": "g", "ours": 100.0, "torch": 1.0}]
    _write(tmp_path, "b", [("c", {"rows": rows + [{"op": "f", "ours": o, "torch": th}]})
                           for o, th in ((10.5, 10.0), (21.0, 20.0), (11.5, 10.0))])
    status, shown = T.evaluate(t, str(tmp_path))[:2]
    assert status == "HOLDS" and "0.955x the bound" in shown           # ratios 0.955, 0.955, 1.045 of 1.1x
    t_at_least = T.Target("x", "x", "b", "rows[op=f].ours", at_least="rows[op=f].torch", factor=1.1)
    assert T.evaluate(t_at_least, str(tmp_path))[0] == "MISSES"


def test_a_missing_file_or_figure_is_no_record(tmp_path):
    assert T.evaluate(T.Target("x", "x", "none", "a", at_most=1), str(tmp_path))[0] == "NO RECORD"
    _write(tmp_path, "b", [("c", {"a": {"other": 1.0}})])
    assert T.evaluate(T.Target("x", "x", "b", "a.ms", at_most=1), str(tmp_path))[0] == "NO RECORD"


@pytest.mark.parametrize("target", T.TARGETS, ids=["%s %s" % (t.issue, t.path) for t in T.TARGETS])
def test_every_target_finds_its_figures_in_its_benchmarks_latest_record(target):
    """A renamed key would silently turn a target into NO RECORD: every target whose benchmark
    has a record finds its figure (and its bound's) in the latest one."""
    rows = T.records(os.path.join(REPO, "bench", "results"), target.name)
    if not rows:
        assert target.name == "distributed_cuda"       # issue 15 point 6: not yet run (it needs two GPUs)
        return
    for path in [target.path] + ([target.bound] if isinstance(target.bound, str) else []):
        assert T.figure(rows[-1], path) is not None, (target.name, path)


def test_the_command_prints_one_status_per_target():
    run = subprocess.run([sys.executable, os.path.join(REPO, "bench", "targets.py")], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr
    statuses = re.findall(r"^\d+\.\d+ .*  (HOLDS|MISSES|UNPROVEN|NO RECORD)", run.stdout, re.M)
    assert len(statuses) == len(T.TARGETS)


def test_a_target_named_for_the_h200_counts_only_the_h200s_records(tmp_path):
    """An H100's records (written the same way) never stand in for the H200's: the latest H200
    commit decides; a record without a GPU name predates the field and counts."""
    t = T.Target("x", "x (H200)", "b", "a.ms", at_most=1.0)
    h200 = [("c1", {"a": {"ms": 0.9}, "gpu": "NVIDIA H200"}) for _ in range(3)]
    h100 = [("c2", {"a": {"ms": 2.0}, "gpu": "NVIDIA H100 80GB HBM3"}) for _ in range(3)]
    _write(tmp_path, "b", h200 + h100)
    status, _, _, commit = T.evaluate(t, str(tmp_path))[:4]
    assert (status, commit) == ("HOLDS", "c1")
    assert T.evaluate(T.Target("x", "x", "b", "a.ms", at_most=1.0), str(tmp_path))[0] == "MISSES"  # any GPU: c2
    _write(tmp_path, "b", h100 + [("c0", {"a": {"ms": 0.5}}) for _ in range(3)])
    assert T.evaluate(t, str(tmp_path))[3] == "c0"
    gh200 = [("c3", {"a": {"ms": 2.0}, "gpu": "NVIDIA GH200 480GB"}) for _ in range(3)]
    _write(tmp_path, "b", h200 + gh200)
    assert T.evaluate(t, str(tmp_path))[3] == "c1"                       # the name as a word
