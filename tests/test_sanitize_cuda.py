"""bench/sanitize_cuda.py's scheduling and --resume, with compute-sanitizer stubbed (no GPU here).

Contract under test: its docstring. A run the record says cannot finish before the deadline is
not started (named in the section's "Not started" sentence, not a row); a run with no recorded
time is started, and one reached after the deadline is named there too (not a crash: the record
is always written); a run killed at its timeout is a "not finished" row; an
exception in a run is a FAILED row; --resume leaves out only the card runs a section of the
same code (this commit, or this library's and selfcheck's digests) recorded ok with that tool's
canary and clean canary ok in the same section, and refuses to guess an unknown commit; --runs
and --mps (the daemon stubbed) do what the docstring says.
"""
import json
import os
import re
import sys

import pytest

from _helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import sanitize_cuda as S  # noqa: E402

HEADER = "| tool | run | errors reported | seconds | outcome |\n| --- | --- | --- | --- | --- |\n"


def _run(monkeypatch, tmp_path, record, argv, sanitized, commit="abc1234"):
    """main() over ``record`` (the text of an earlier record file); (exit code, rows {(tool, run):
    outcome} of the section it appended, the runs started)."""
    path = tmp_path / "sanitize-cuda.md"
    path.write_text(record)
    started = []

    def fake(tool, cmd, timeout, opts=()):
        started.append((tool, cmd[-1]) + ((tuple(opts),) if opts else ()))
        return sanitized(tool, cmd, timeout, opts) if opts else sanitized(tool, cmd, timeout)

    monkeypatch.setattr(S, "RECORD", str(path))
    monkeypatch.setattr(S.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(S, "sanitized", fake)
    monkeypatch.setattr(S, "commit", lambda: commit)
    monkeypatch.setattr(S, "gpu_name", lambda: "stub GPU")
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["sanitize_cuda.py", "--no-build"] + argv)
    with pytest.raises(SystemExit) as exit_:
        S.main()
    appended = path.read_text()[len(record):]
    waiting = re.search(r"Not started, [^:]*: (.*?)\.$", appended, re.M)
    rows = {key: "not started" for key in (tuple(item.split(" ", 1)) for item in waiting.group(1).split("; "))} \
        if waiting else {}
    for line in appended.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] in S.TOOLS:
            rows[(cells[0], cells[1])] = cells[4]
    return exit_.value.code, rows, started


def _ran(cmd):
    """What the canary program prints last when it ran to its end (nothing for a card)."""
    return "canary %s ran: no error\n" % cmd[1] if cmd[0] == S.CANARY else ""


def _clean(tool, cmd, timeout):
    """A live tool: the canary reports an error, everything else is clean."""
    planted = cmd[0] == S.CANARY and cmd[-1] != "clean"
    return (1 if planted else 0), 0.01, 0, _ran(cmd)


def test_a_run_the_record_says_cannot_finish_is_not_started_and_the_rest_run(monkeypatch, tmp_path):
    record = "## x, commit old\n\n" + HEADER + "| racecheck | optim 0/4 | 0 | 900 | ok |\n"
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--tools", "racecheck", "--cards", "optim",
                                                               "--deadline", "100"], _clean)
    assert rows[("racecheck", "optim 0/4")] == "not started"
    assert ("racecheck", "0/4") not in started and ("racecheck", "1/4") in started
    assert rows[("racecheck", "optim 3/4")] == "ok" and code == 1


def test_runs_after_the_deadline_are_recorded_unfinished_not_a_crash(monkeypatch, tmp_path):
    def slow(tool, cmd, timeout):
        if timeout <= 0:
            return None, 0.0, None, "[not started: the deadline had passed]"
        return _clean(tool, cmd, timeout)

    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule,random",
                                                     "--deadline", "-1", "--jobs", "1"], slow)
    assert rows[("memcheck", "schedule")] == rows[("memcheck", "random")] == "not started"
    assert code == 1


def test_an_exception_in_a_run_is_a_failed_row_and_the_record_is_written(monkeypatch, tmp_path):
    def broken(tool, cmd, timeout):
        if cmd[-1] == "1/2":
            raise OSError("no such file")
        return _clean(tool, cmd, timeout)

    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss"], broken)
    assert rows[("racecheck", "loss 1/2")] == "FAILED" and rows[("racecheck", "loss 0/2")] == "ok"
    assert code == 1


def test_resume_trusts_only_sections_at_this_commit_whose_tool_was_shown_live(monkeypatch, tmp_path):
    live = ("| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
            "| initcheck | canary | 0 | 1 | FAILED |\n| initcheck | canary clean | 0 | 1 | ok |\n")
    record = ("## x, commit abc1234\n\n" + HEADER + live +
              "| racecheck | loss 0/2 | 0 | 5 | ok |\n| initcheck | loss 0/2 | 0 | 5 | ok |\n"
              "## y, commit other99\n\n" + HEADER + live + "| racecheck | loss 1/2 | 0 | 5 | ok |\n")
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck,initcheck",
                                                               "--cards", "loss"], _clean)
    assert ("racecheck", "loss 0/2") not in rows                   # left out: ok here, tool live
    assert rows[("initcheck", "loss 0/2")] == "ok"                  # run again: its canary failed there
    assert rows[("racecheck", "loss 1/2")] == "ok"                  # run again: another commit's record
    assert code == 0 and "Resumed: 1 runs left out" in (tmp_path / "sanitize-cuda.md").read_text()


def test_resume_counts_card_lines_so_a_card_cut_into_more_shards_keeps_what_was_covered(monkeypatch, tmp_path):
    """optim is cut in 4; a section cut it in 2 and recorded 0/2 ok (its even lines): 0/4 and 2/4
    are covered, 1/4 and 3/4 are not; a whole-card row covers every shard."""
    live = "| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
    record = "## x, commit abc1234\n\n" + HEADER + live + "| racecheck | optim 0/2 | 0 | 5 | ok |\n"
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "optim"],
                               _clean)
    assert sorted(r for t, r in rows if r.startswith("optim")) == ["optim 1/4", "optim 3/4"] and code == 0
    assert "Resumed: 2 runs left out" in (tmp_path / "sanitize-cuda.md").read_text()
    assert S.card_line_count("optim") > 4
    done = {("racecheck", "optim"): set(range(S.card_line_count("optim")))}
    assert S.covered(done, "racecheck", "optim 3/4") and not S.covered(done, "memcheck", "optim 3/4")


def test_resume_refuses_an_unknown_commit(monkeypatch, tmp_path):
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--resume", "--tools", "racecheck", "--cards", "loss"],
                               _clean, commit="unknown")
    assert str(code).startswith("--resume needs the commit") and rows == {} and started == []


def test_a_section_names_its_library_and_resume_reads_the_commit_before_it(monkeypatch, tmp_path):
    """The header carries the CUDA library's digest (its Makefile manifest) and the selfcheck digest,
    so sections at two commits can be shown to have run one library; a section naming neither
    digest counts by its commit."""
    manifest = tmp_path / "lib.sha256"
    manifest.write_text("0123456789abcdef" + "0" * 48 + "  libmojo_train_cuda_identical.so\n")
    monkeypatch.setattr(S, "LIBRARY_MANIFEST", str(manifest))
    live = "| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
    record = "## x, commit abc1234, library 0123456789abcdef\n\n" + HEADER + live + "| racecheck | loss 0/2 | 0 | 5 | ok |\n"
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    assert ("racecheck", "loss 0/2") not in rows and rows[("racecheck", "loss 1/2")] == "ok"
    assert ", commit abc1234, library 0123456789abcdef, selfcheck %s\n" % S.selfcheck_digest() \
        in (tmp_path / "sanitize-cuda.md").read_text()[len(record):]
    monkeypatch.setattr(S, "LIBRARY_MANIFEST", str(tmp_path / "absent"))
    assert S.library_digest() == "unknown"


def _windowed_clean(tool, cmd, timeout, opts=()):
    """A live tool whose windows work: the windowed canary is reported only by a window that
    holds launch CANARY_AT."""
    if cmd[0] == S.CANARY and len(cmd) == 3:
        first, count = int(opts[opts.index("--launch-skip") + 1]), int(opts[opts.index("--launch-count") + 1])
        holds = first <= S.CANARY_AT and (count == 0 or S.CANARY_AT < first + count)
        return (1 if holds else 0), 0.01, 0, _ran(cmd)
    return _clean(tool, cmd, timeout)


def test_windows_split_each_run_by_launches_and_check_every_launch_between_them(monkeypatch, tmp_path):
    """--windows 3 --window-launches 50: launches [0, 50), [50, 100) and [100, end) of each run,
    through compute-sanitizer's --launch-skip/--launch-count; the canary's windows show it live."""
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "schedule",
                                                           "--windows", "3", "--window-launches", "50"],
                               _windowed_clean)
    assert code == 0
    for label in ("schedule launches 0-49", "schedule launches 50-99", "schedule launches 100-",
                  "canary launches 0-2", "canary launches 3-3", "canary launches 4-", "canary launches 10-"):
        assert rows[("racecheck", label)] == "ok", label
    assert ("racecheck", "schedule") not in rows
    opts = sorted(o for t, last, *o in started if last == "0/1" for o in o)
    assert opts == [("--launch-skip", "0", "--launch-count", "50"), ("--launch-skip", "100", "--launch-count", "0"),
                    ("--launch-skip", "50", "--launch-count", "50")]
    assert "Launch windows: each card run in 3 runs of 50" in (tmp_path / "sanitize-cuda.md").read_text()


def test_windows_left_for_lack_of_time_are_counted_in_one_sentence_and_a_killed_one_is_a_row(monkeypatch, tmp_path):
    """Runs never started are named once, a run's windows counted under its label (a call of
    138 such windows wrote 138 rows before); a run killed at its timeout keeps its row."""
    def late(tool, cmd, timeout, opts=()):
        if cmd[0] == S.CANARY:
            return _windowed_clean(tool, cmd, timeout, opts) if opts else _clean(tool, cmd, timeout)
        skip = int(opts[opts.index("--launch-skip") + 1])
        if skip == 0:
            return None, 7.0, 124, "...\n[killed after 7 s]"
        return None, 0.0, None, "[not started: the deadline had passed]"

    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "schedule",
                                                     "--windows", "4", "--window-launches", "5"], late)
    text = (tmp_path / "sanitize-cuda.md").read_text()
    assert rows[("racecheck", "schedule launches 0-4")] == "not finished"
    assert "the next --resume runs them): racecheck schedule (3 windows)." in text
    assert "schedule launches 5-9" not in text and code == 1


def test_a_window_canary_that_does_not_see_its_defect_or_sees_it_outside_fails(monkeypatch, tmp_path):
    def unwindowed(tool, cmd, timeout, opts=()):     # the options ignored: every window sees the defect
        if cmd[0] == S.CANARY and len(cmd) == 3:
            return 1, 0.01, 0, _ran(cmd)
        return _clean(tool, cmd, timeout)

    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "schedule",
                                                     "--windows", "2", "--window-launches", "10"], unwindowed)
    assert rows[("racecheck", "canary launches 3-3")] == "ok"
    assert rows[("racecheck", "canary launches 0-2")] == rows[("racecheck", "canary launches 4-")] == "FAILED"
    assert code == 1


def test_resume_counts_a_run_whose_windows_join_across_sections_and_not_one_with_a_gap(monkeypatch, tmp_path):
    live = ("| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
            "| racecheck | canary launches 0-2 | 0 | 1 | ok |\n| racecheck | canary launches 3-3 | 1 | 1 | ok |\n"
            "| racecheck | canary launches 4- | 0 | 1 | ok |\n| racecheck | canary launches 10- | 0 | 1 | ok |\n")
    record = ("## x, commit abc1234\n\n" + HEADER + live +
              "| racecheck | loss 0/2 launches 0-9 | 0 | 5 | ok |\n| racecheck | loss 1/2 launches 0-9 | 0 | 5 | ok |\n"
              "## y, commit abc1234\n\n" + HEADER + live +
              "| racecheck | loss 0/2 launches 10- | 0 | 5 | ok |\n| racecheck | loss 1/2 launches 20- | 0 | 5 | ok |\n")
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    assert ("racecheck", "loss 0/2") not in rows          # [0, 10) + [10, end): joined
    assert rows[("racecheck", "loss 1/2")] == "ok"         # [0, 10) + [20, end): launches 10-19 unchecked
    assert code == 0


def test_windows_that_were_not_shown_live_do_not_count(monkeypatch, tmp_path):
    live = "| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
    record = ("## x, commit abc1234\n\n" + HEADER + live +
              "| racecheck | loss 0/2 launches 0- | 0 | 5 | ok |\n")
    code, rows, _ = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss"], _clean)
    assert rows[("racecheck", "loss 0/2")] == "ok"


def test_joined_spans():
    assert S.joined([(0, 9), (10, None)]) and S.joined([(10, None), (0, 12)]) and S.joined([(0, None)])
    assert not S.joined([(0, 9), (11, None)]) and not S.joined([(0, 9), (10, 19)]) and not S.joined([(1, None)])
    assert S.windows(3, 50) == [(0, 50), (50, 50), (100, None)]


def test_windows_refuse_initcheck_synccheck_and_a_missing_or_double_window_size(monkeypatch, tmp_path):
    for argv in (["--tools", "synccheck", "--windows", "2", "--window-launches", "5"],
                 ["--tools", "racecheck,initcheck", "--windows", "2", "--window-launches", "5"], ["--windows", "2"],
                 ["--tools", "racecheck", "--windows", "2", "--window-launches", "5", "--launch-counts", "x.json"]):
        code, rows, started = _run(monkeypatch, tmp_path, "", argv, _clean)
        assert code == 2 and rows == {} and started == []


def test_resume_runs_only_the_windows_a_partly_covered_run_lacks(monkeypatch, tmp_path):
    live = ("| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
            "| racecheck | canary launches 0-2 | 0 | 1 | ok |\n| racecheck | canary launches 3-3 | 1 | 1 | ok |\n"
            "| racecheck | canary launches 4- | 0 | 1 | ok |\n| racecheck | canary launches 10- | 0 | 1 | ok |\n")
    record = "## x, commit abc1234\n\n" + HEADER + live + "| racecheck | loss 0/2 launches 0-9 | 0 | 5 | ok |\n"
    code, rows, _ = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss",
                                                         "--windows", "2", "--window-launches", "10"], _windowed_clean)
    assert sorted(r for t, r in rows if r.startswith("loss")) == ["loss 0/2 launches 10-", "loss 1/2 launches 0-9",
                                                                  "loss 1/2 launches 10-"]
    assert code == 0


def test_launch_counts_give_each_run_its_own_window_size(monkeypatch, tmp_path):
    """W = the run's count over K, rounded up: 10 launches in 3 windows of 4, 2 in windows of 1."""
    counts = tmp_path / "counts.json"
    counts.write_text('{"loss 0/2": 10, "loss 1/2": 2}')
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss", "--windows", "3",
                                                           "--launch-counts", str(counts)], _windowed_clean)
    assert code == 0
    assert sorted(r for t, r in rows if r.startswith("loss")) == [
        "loss 0/2 launches 0-3", "loss 0/2 launches 4-7", "loss 0/2 launches 8-",
        "loss 1/2 launches 0-0", "loss 1/2 launches 1-1", "loss 1/2 launches 2-"]
    counts.write_text('{"loss 0/2": 10}')     # a run the file does not count runs whole
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss", "--windows", "3",
                                                           "--launch-counts", str(counts)], _windowed_clean)
    assert code == 0 and sorted(r for t, r in rows if r.startswith("loss")) == [
        "loss 0/2 launches 0-3", "loss 0/2 launches 4-7", "loss 0/2 launches 8-", "loss 1/2"]
    assert "Run whole, %s counting no launches for them: loss 1/2." % counts in (tmp_path / "sanitize-cuda.md").read_text()
    # with --resume, once the counted run is covered the file still serves: the rest run whole
    record = "\n".join(line for line in (tmp_path / "sanitize-cuda.md").read_text().splitlines()
                       if "| loss 1/2 |" not in line) + "\n"     # loss 0/2's windows covered, loss 1/2 not
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss",
                                                               "--windows", "3", "--launch-counts", str(counts)],
                               _windowed_clean)
    assert code == 0 and sorted(r for t, r in rows if r.startswith("loss")) == ["loss 1/2"]
    counts.write_text('{"lm_head 36/44": 10}')  # counts none of the selected runs: a file for another card
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss", "--windows", "3",
                                                           "--launch-counts", str(counts)], _windowed_clean)
    assert "counts none of the selected runs" in str(code) and started == []


NCU_CSV = """==PROF== Connected to process 1234
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","1234","python3","127.0.0.1","k_a(float *)","1","7","(256, 1, 1)","(132, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","12.5"
"1","1234","python3","127.0.0.1","k_b(float *, int)","1","7","(256, 1, 1)","(2, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","us","3.1"
card lm_head 1/1 passed
"""


def test_count_launches_counts_ncu_rows_and_refuses_a_run_that_counted_none(monkeypatch, tmp_path):
    out = tmp_path / "counts.json"
    calls = []

    class Done:
        def __init__(self, stdout, returncode=0):
            self.stdout, self.stderr, self.returncode = stdout, "", returncode

    def fake_run(cmd, **kw):
        calls.append(cmd)
        return Done(NCU_CSV if cmd[-1] == "0/2" else "==PROF== no kernels\n")

    monkeypatch.setattr(S.shutil, "which", lambda name: "/usr/bin/" + name)
    ready = []

    def fake_run_ready(cmd, *a, **kw):          # the daemon takes clients from the third try on
        if cmd[0] == S.CANARY:
            ready.append(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
            return S.subprocess.CompletedProcess(cmd, 0 if len(ready) >= 3 else 1, b"", b"")
        return fake_run(cmd, *a, **kw)

    monkeypatch.setattr(S.subprocess, "run", fake_run_ready)
    monkeypatch.setattr(S.time, "sleep", lambda s: None)
    monkeypatch.setattr(S, "mps_processes", lambda: [])
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["sanitize_cuda.py", "--no-build", "--tools", "racecheck", "--cards", "loss",
                                      "--count-launches", str(out)])
    with pytest.raises(SystemExit) as exit_:
        S.main()
    assert exit_.value.code == 1                         # loss 1/2 counted no launch: refused
    assert json.loads(out.read_text()) == {"loss 0/2": 2, "loss 1/2": 0}
    assert calls[0][:4] == ["ncu", "--metrics", "gpu__time_duration.sum", "--csv"]


def _live_library(monkeypatch, tmp_path, digest="0123456789abcdef"):
    manifest = tmp_path / "lib.sha256"
    manifest.write_text(digest + "0" * 48 + "  libmojo_train_cuda_identical.so\n")
    monkeypatch.setattr(S, "LIBRARY_MANIFEST", str(manifest))
    return "| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"


def test_resume_counts_another_commits_section_only_with_this_library_and_this_selfcheck(monkeypatch, tmp_path):
    """Another commit's rows count when its header names this library's digest and this
    selfcheck digest; with another selfcheck digest (a card or the package changed), or no
    library digest known here, they do not."""
    live = _live_library(monkeypatch, tmp_path)
    here = S.selfcheck_digest()
    assert len(here) == 16 and int(here, 16) >= 0
    record = ("## x, commit old0001, library 0123456789abcdef, selfcheck %s\n\n" % here + HEADER + live +
              "| racecheck | loss 0/2 | 0 | 5 | ok |\n"
              "## y, commit old0002, library 0123456789abcdef, selfcheck ffffffffffffffff\n\n" + HEADER + live +
              "| racecheck | loss 1/2 | 0 | 5 | ok |\n")
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    assert ("racecheck", "loss 0/2") not in rows and rows[("racecheck", "loss 1/2")] == "ok" and code == 0
    monkeypatch.setattr(S, "LIBRARY_MANIFEST", str(tmp_path / "absent"))     # digest "unknown": commit only
    code, rows, started = _run(monkeypatch, tmp_path, record.replace("0123456789abcdef", "unknown"),
                               ["--resume", "--tools", "racecheck", "--cards", "loss"], _clean)
    assert rows[("racecheck", "loss 0/2")] == "ok" and rows[("racecheck", "loss 1/2")] == "ok"


def test_selfcheck_digest_follows_the_cards_and_the_package(monkeypatch, tmp_path):
    """The digest covers every card file and every Python file of mojo_train: a change to
    either changes it."""
    root = tmp_path / "root"
    (root / "fixtures").mkdir(parents=True)
    (root / "mojo_train" / "torch").mkdir(parents=True)
    (root / "fixtures" / "a.card").write_text("x 1\n")
    (root / "mojo_train" / "__init__.py").write_text("")
    (root / "mojo_train" / "torch" / "m.py").write_text("A = 1\n")
    monkeypatch.setattr(S, "ROOT", str(root))
    first = S.selfcheck_digest()
    (root / "mojo_train" / "torch" / "m.py").write_text("A = 2\n")
    second = S.selfcheck_digest()
    (root / "fixtures" / "a.card").write_text("x 2\n")
    third = S.selfcheck_digest()
    (root / "mojo_train" / "notes.txt").write_text("not Python")
    assert len({first, second, third}) == 3 and S.selfcheck_digest() == third


def test_runs_keeps_only_the_card_runs_it_matches_whole_and_every_canary(monkeypatch, tmp_path):
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss,optim",
                                                           "--runs", "optim [13]/4"], _clean)
    assert sorted(r for t, r in rows) == ["canary", "canary clean", "optim 1/4", "optim 3/4"] and code == 0
    assert "(runs optim [13]/4)" in (tmp_path / "sanitize-cuda.md").read_text()
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss",
                                                           "--runs", "oss 1/2"], _clean)
    assert code == 2 and rows == {} and started == []       # a partial match is no match, and none is refused
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "loss",
                                                           "--runs", "loss ("], _clean)
    assert code == 2 and rows == {} and started == []


def test_mps_runs_every_job_under_a_daemon_it_starts_and_stops(monkeypatch, tmp_path):
    """--mps: the control daemon is started (-d) and told to start a server; the runs wait until it
    lists the server and the clean canary has run under it; it is told to quit after the last, and the command
    waits for the processes the daemon started (not another user's MPS process that was there
    before); every run sees the daemon's pipe folder; the section says "under MPS"."""
    calls, seen, ready, slept = [], [], [], []
    real_run = S.subprocess.run
    quit_checks = []

    def fake_run(cmd, *a, **kw):
        if cmd[0] == S.CANARY:                  # the daemon takes clients from the third try on
            ready.append(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
            return S.subprocess.CompletedProcess(cmd, 0 if len(ready) >= 3 else 1, b"", b"")
        if cmd[0] != "nvidia-cuda-mps-control":
            return real_run(cmd, *a, **kw)
        calls.append((tuple(cmd), kw.get("input"), kw["env"].get("CUDA_MPS_PIPE_DIRECTORY")))
        return S.subprocess.CompletedProcess(cmd, 0, "4242\n" if kw.get("input") == "get_server_list\n" else "", "")

    def processes():                            # 7: somebody else's; 100, 101: ours, gone 3 checks after quit
        if not any(c[1] == "quit\n" for c in calls):
            return [7] if not calls else [7, 100, 101]
        quit_checks.append(1)
        return [7, 100, 101] if len(quit_checks) < 3 else [7]

    def clean_seeing(tool, cmd, timeout):
        seen.append(os.environ.get("CUDA_MPS_PIPE_DIRECTORY"))
        return _clean(tool, cmd, timeout)

    monkeypatch.setattr(S.subprocess, "run", fake_run)
    monkeypatch.setattr(S.time, "sleep", lambda s: slept.append(s))
    monkeypatch.setattr(S, "mps_processes", processes)
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule", "--mps"],
                               clean_seeing)
    assert code == 0 and rows[("memcheck", "schedule")] == "ok"
    assert [(c[0], c[1]) for c in calls] == [(("nvidia-cuda-mps-control", "-d"), None),
                                             (("nvidia-cuda-mps-control",), "start_server -uid %d\n" % os.getuid()),
                                             (("nvidia-cuda-mps-control",), "get_server_list\n"),
                                             (("nvidia-cuda-mps-control",), "quit\n")]
    assert len({c[2] for c in calls}) == 1 and set(seen) == set(ready) == {calls[0][2]}
    assert len(ready) == 3 and len(seen) == 3              # no run before the daemon took a client
    gaps = [s for s in slept if s < 1]                    # the spacing of starts (3 runs: 2 gaps at most)
    assert len(quit_checks) == 3 and len(slept) - len(gaps) == 2 + 2   # two tries to start, two waits for ours to exit
    assert len(gaps) <= 2 and all(0 < s <= S.MPS_START_GAP for s in gaps)
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert "at a time under MPS" in (tmp_path / "sanitize-cuda.md").read_text()


def test_mps_refuses_when_the_daemon_lists_no_server(monkeypatch, tmp_path):
    """A client that cannot reach the daemon runs without MPS: the daemon must list the server it
    was told to start, or the command ends with a message before any run."""
    def fake_run(cmd, *a, **kw):
        return S.subprocess.CompletedProcess(cmd, 0, b"" if cmd[0] == S.CANARY else "", "")

    monkeypatch.setattr(S.subprocess, "run", fake_run)
    monkeypatch.setattr(S.time, "sleep", lambda s: None)
    monkeypatch.setattr(S, "mps_processes", lambda: [])
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule", "--mps"],
                               _clean)
    assert "lists no server" in str(code) and started == []


def test_mps_refuses_to_run_when_no_program_runs_under_the_daemon(monkeypatch, tmp_path):
    """A daemon that never takes a client ends the command with a message, and is still told to
    quit; no run is started."""
    quits = []

    def fake_run(cmd, *a, **kw):
        if cmd[0] == S.CANARY:
            return S.subprocess.CompletedProcess(cmd, 1, b"", b"")
        if kw.get("input") == "quit\n":
            quits.append(cmd)
        return S.subprocess.CompletedProcess(cmd, 0, "4242\n" if kw.get("input") == "get_server_list\n" else "", "")

    monkeypatch.setattr(S.subprocess, "run", fake_run)
    monkeypatch.setattr(S.time, "sleep", lambda s: None)
    monkeypatch.setattr(S, "mps_processes", lambda: [])
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule", "--mps"],
                               _clean)
    assert "no CUDA program ran under the MPS daemon" in str(code) and started == [] and len(quits) == 1


def test_times_from_time_sliced_runs_do_not_stop_a_run_under_mps(monkeypatch, tmp_path):
    """A run that took 900 s time-sliced is started under --mps (no time under MPS recorded), and
    a time recorded under MPS is what an MPS command goes by."""
    record = ("## x, commit old\n\nCommand: `make sanitize-cuda`; 3 runs, 8 at a time, 900 s in all.\n\n" + HEADER +
              "| racecheck | optim 0/4 | 0 | 900 | ok |\n"
              "## y, commit old\n\nCommand: `make sanitize-cuda`; 3 runs, 8 at a time under MPS, 900 s in all.\n\n"
              + HEADER + "| racecheck | optim 1/4 | 0 | 900 | ok |\n")
    path = tmp_path / "sanitize-cuda.md"
    path.write_text(record)
    monkeypatch.setattr(S, "RECORD", str(path))
    assert S.recorded_seconds() == {("racecheck", "optim 0/4"): 900}
    assert S.recorded_seconds(mps=True) == {("racecheck", "optim 1/4"): 900}
    monkeypatch.setattr(S, "mps_daemon", lambda: __import__("contextlib").nullcontext())
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--tools", "racecheck", "--cards", "optim", "--mps",
                                                               "--deadline", "100"], _clean)
    assert rows[("racecheck", "optim 0/4")] == "ok" and rows[("racecheck", "optim 1/4")] == "not started"


def test_under_mps_a_run_whose_client_was_refused_starts_again_and_is_named(monkeypatch, tmp_path):
    """The MPS server refused the first two starts of optim 1/4's client and every start of optim
    2/4's: the first passes on its third start and is named; the second fails after
    MPS_CLIENT_TRIES starts. Without --mps the same failure is not retried."""
    starts = {}

    def flaky(tool, cmd, timeout):
        key = cmd[-1]
        starts[key] = starts.get(key, 0) + 1
        if (key == "1/4" and starts[key] <= 2) or key == "2/4":
            return None, 0.1, 1, "mojo_train: error: ... MPS server is not ready to accept new MPS client requests"
        return _clean(tool, cmd, timeout)

    monkeypatch.setattr(S, "mps_daemon", lambda: __import__("contextlib").nullcontext())
    monkeypatch.setattr(S.time, "sleep", lambda s: None)
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "optim", "--mps"], flaky)
    assert rows[("racecheck", "optim 1/4")] == "ok" and starts["1/4"] == 3
    assert rows[("racecheck", "optim 2/4")] == "FAILED" and starts["2/4"] == S.MPS_CLIENT_TRIES and code == 1
    assert starts["0/4"] == 1
    text = (tmp_path / "sanitize-cuda.md").read_text()
    assert "Started again because the MPS server refused their client" in text and "racecheck optim 1/4" in text
    starts.clear()
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "optim"], flaky)
    assert starts["1/4"] == 1 and rows[("racecheck", "optim 1/4")] == "FAILED"


def test_a_canary_counts_only_when_it_ran_to_its_end_not_when_its_client_was_refused(monkeypatch, tmp_path):
    """Under MPS a refused client reports its failed allocation as an error: the planted canary's
    "error" then proves nothing. A canary row is ok only when the program printed its last line,
    and a section whose canary was refused does not let --resume trust its card rows."""
    def refused_canary(tool, cmd, timeout):
        if cmd[0] == S.CANARY:
            return 1, 0.01, 2, "cudaMalloc failed: CUDA-capable device(s) is/are busy or unavailable\n"
        return _clean(tool, cmd, timeout)

    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule"], refused_canary)
    assert rows[("memcheck", "canary")] == rows[("memcheck", "canary clean")] == "FAILED" and code == 1
    assert rows[("memcheck", "schedule")] == "ok"
    record = (tmp_path / "sanitize-cuda.md").read_text()
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "memcheck", "--cards",
                                                               "schedule"], _clean)
    assert rows[("memcheck", "schedule")] == "ok"     # run again: the earlier section's canary was not live
    assert "Resumed" not in (tmp_path / "sanitize-cuda.md").read_text()[len(record):]
    silent = lambda tool, cmd, timeout: (1, 0.01, 0, "") if cmd[0] == S.CANARY else _clean(tool, cmd, timeout)  # noqa: E731
    code, rows, _ = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule"], silent)
    assert rows[("memcheck", "canary")] == "FAILED"   # an error but no "canary memcheck ran": it did not run


def test_resume_needs_the_same_library_not_only_the_same_selfcheck(monkeypatch, tmp_path):
    live = _live_library(monkeypatch, tmp_path, digest="0123456789abcdef")
    record = ("## x, commit old0001, library fedcba9876543210, selfcheck %s\n\n" % S.selfcheck_digest() + HEADER +
              live + "| racecheck | loss 0/2 | 0 | 5 | ok |\n")
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--resume", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    assert rows[("racecheck", "loss 0/2")] == "ok" and code == 0      # run again: another library


def test_a_refused_client_is_not_started_again_after_the_deadline(monkeypatch, tmp_path):
    """Retries take the time left: with the deadline passed after the first start, the run is one
    FAILED row (its refusal), not a "not started" one, and it is not named as started again."""
    clock = [1000.0]
    monkeypatch.setattr(S.time, "time", lambda: clock[0])
    monkeypatch.setattr(S.time, "sleep", lambda s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr(S, "mps_daemon", lambda: __import__("contextlib").nullcontext())
    starts = []

    def refused_late(tool, cmd, timeout):
        if cmd[0] != S.CANARY and cmd[-1] == "1/4":
            starts.append(timeout)
            clock[0] += 50
            return None, 50.0, 1, "MPS server is not ready to accept new MPS client requests"
        return _clean(tool, cmd, timeout)

    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "optim", "--mps",
                                                           "--deadline", "40", "--jobs", "1"], refused_late)
    assert len(starts) == 1 and rows[("racecheck", "optim 1/4")] == "FAILED"
    assert "Started again" not in (tmp_path / "sanitize-cuda.md").read_text()


def test_status_prints_what_the_record_covers_and_exits_1_while_a_line_is_left(monkeypatch, tmp_path, capsys):
    live = "| racecheck | canary | 5 | 1 | ok |\n| racecheck | canary clean | 0 | 1 | ok |\n"
    n = S.card_line_count("loss")
    record = "## x, commit abc1234\n\n" + HEADER + live + "| racecheck | loss 0/2 | 0 | 5 | ok |\n"
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--status", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    out = capsys.readouterr().out
    odd = set(range(1, n, 2))
    assert code == 1 and started == [] and rows == {}
    assert "loss       racecheck %4d/%-4d lines; left: %s" % (n - len(odd), n, S.index_ranges(odd)) in out
    record += "| racecheck | loss 1/2 | 0 | 5 | ok |\n"
    code, rows, started = _run(monkeypatch, tmp_path, record, ["--status", "--tools", "racecheck", "--cards", "loss"],
                               _clean)
    assert code == 0 and "%d/%-4d lines\n" % (n, n) in capsys.readouterr().out
    assert S.index_ranges({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8" and S.index_ranges(set()) == ""


def _mps_on_a_fake_clock(monkeypatch, slept, clock):
    """--mps with its daemon stubbed, time.time() reading ``clock[0]`` and time.sleep(s) adding s to
    it (and to ``slept``): waits cost no real time and are counted."""
    def sleep(s):
        slept.append(s)
        clock[0] += s
    monkeypatch.setattr(S, "mps_daemon", lambda: __import__("contextlib").nullcontext())
    monkeypatch.setattr(S.time, "sleep", sleep)
    monkeypatch.setattr(S.time, "time", lambda: clock[0])


def test_under_mps_a_retried_run_is_judged_by_its_last_start_and_starts_are_spaced(monkeypatch, tmp_path):
    """Fourteenth session: a run refused on its first start (its card FAILed for lack of a device)
    that passed on its second was recorded FAILED, since the FAIL line of the first start's output
    was judged; and the canaries' refusal came through compute-sanitizer as "Device not supported"
    and "cudaMalloc failed: unspecified launch failure", which were not taken for a refusal. Now
    both are started again, each row is its last start's outcome, the log keeps both starts, the
    second start waits MPS_RETRY_WAIT, and no two starts are closer than MPS_START_GAP."""
    starts, slept, clock = {}, [], [1000.0]
    refusals = {
        "card": "FAIL optim on cuda: ... device allocation failed: CUDA-capable device(s) is/are busy or unavailable\n",
        "sanitizer": "========= Error: Device not supported. Please refer to ...\ncudaMalloc failed: unspecified "
                     "launch failure\n",
        "canary": "cudaMalloc failed: unspecified launch failure\n"}

    def flaky(tool, cmd, timeout):
        key = (cmd[0] == S.CANARY, cmd[-1])
        starts[key] = starts.get(key, 0) + 1
        if starts[key] == 1 and key in ((False, "1/4"), (True, "clean"), (True, "racecheck")):
            why = "card" if not key[0] else ("sanitizer" if key[1] == "clean" else "canary")
            return 1, 0.1, 2, refusals[why]
        return _clean(tool, cmd, timeout)

    _mps_on_a_fake_clock(monkeypatch, slept, clock)
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "racecheck", "--cards", "optim", "--mps",
                                                           "--jobs", "1"], flaky)
    assert code == 0 and set(rows.values()) == {"ok"}
    assert starts[(False, "1/4")] == starts[(True, "clean")] == starts[(True, "racecheck")] == 2
    assert S.MPS_RETRY_WAIT in slept and S.MPS_START_GAP in slept
    text = (tmp_path / "sanitize-cuda.md").read_text()
    assert "racecheck optim 1/4" in text and "racecheck canary clean" in text
    for what in refusals.values():
        assert S.mps_refused((None, None, 1, what))
    assert not S.mps_refused((None, None, 1, "lm_head 3/44 FAIL: mismatching bits\n"))


def test_a_retry_never_sleeps_past_the_deadline(monkeypatch, tmp_path):
    """A run refused just before the deadline waits at most until the deadline (not the whole
    back-off), and is then not started again: the record is written inside the call."""
    slept, clock = [], [1000.0]

    def refused(tool, cmd, timeout):
        clock[0] += 1.0
        if cmd[0] != S.CANARY:
            return None, 1.0, 1, "MPS server is not ready to accept new MPS client requests"
        return _clean(tool, cmd, timeout)

    _mps_on_a_fake_clock(monkeypatch, slept, clock)
    code, rows, started = _run(monkeypatch, tmp_path, "", ["--tools", "memcheck", "--cards", "schedule", "--mps",
                                                           "--jobs", "1", "--deadline", "10"], refused)
    assert max(slept) <= 10 and clock[0] <= 1000.0 + 10 + 2
    assert rows[("memcheck", "schedule")] in ("FAILED", "not started") and code == 1
