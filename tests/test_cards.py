"""The cards (fixtures/*.card): every vendor's identical numeric mode reproduces every line, a
sabotaged build fails its card, and the card files are read strictly and only ever grow.

Contract under test: mojo_train/_cards.py's docstring.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from mojo_train import _cards, _native
from mojo_train import __main__ as cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARDS = sorted(glob.glob(os.path.join(REPO, "fixtures", "*" + _cards.CARD_SUFFIX)))
FTZ_CARDS = sorted(glob.glob(os.path.join(REPO, "fixtures", "identical_ftz", "*" + _cards.CARD_SUFFIX)))
HEADER = "# mojo_train card x; contract optimizer v1; inputs: Philox"
DIGEST = "0" * 64

# Share of a card's lines its sabotage build must break. Chosen from what was seen when the
# cards were written: SABOTAGE=optim breaks 92 of 104 optim lines (a fused multiply-add shows
# in almost every update of more than a few elements; the escapes are the size-1/3 cases and
# subnormal cases, where fused and unfused round alike); SABOTAGE=clip breaks 11 of 63 clip
# lines (reversing a chunk's row order moves a sum of squares by an ulp now and then, and the
# sqrt and the coarser roundings up the tree absorb most of that: only the cases with hundreds
# of per-tensor norms see it for sure, while size-1/3 and subnormal cases cannot see it).
MIN_BROKEN = {"optim": 0.5, "clip": 0.1}
DEFAULT_MIN_BROKEN = 0.25

_CHECK_IN_CHILD = """
import json, sys
from mojo_train import _cards, _native
results = _cards.check_card(sys.argv[1], "cpu")
print(json.dumps({"path": _native.load("identical", "cpu").path, "total": len(results),
                  "failed": sum(not r.ok for r in results)}))
"""


def _cpu_identical():
    try:
        return _native.load("identical", "cpu")
    except _native.BackendError as exc:
        pytest.skip("the cpu oracle's identical numeric mode is not built: %s" % str(exc).splitlines()[0])


def _name(path):
    return _cards.card_name(path)


def test_there_are_cards_to_check():
    assert CARDS, "no fixtures/*.card files; make them with python -m mojo_train selfcheck --write"


@pytest.mark.parametrize("path", CARDS, ids=_name)
def test_every_line_of_the_card_matches_on_this_identical_vendor(path, identical):
    if _name(path) in _native.FEATURES and not identical.has(_name(path)):
        pytest.skip("this library has no %s (mt_features)" % _name(path))
    results = _cards.check_card(path, identical.vendor)
    failed = ["%s: %s" % (r.case, ", ".join(r.mismatches)) for r in results if not r.ok and not r.skipped]
    assert results and not failed, "%d of %d lines differ on %s:\n%s" % (
        len(failed), len(results), identical, "\n".join(failed))
    # a line is left out only for a family the library declares it lacks
    for r in results:
        assert not r.skipped or r.skipped.startswith("needs ") and not all(
            identical.has(f) for f in r.skipped[len("needs "):].split(" (")[0].split(", ")), r


@pytest.mark.parametrize("name", sorted(_cards.CASES))
def test_every_case_defined_in_code_has_a_line_in_its_card(name):
    path = os.path.join(REPO, "fixtures", name + _cards.CARD_SUFFIX)
    have = {_cards.case_key(line.case) for line in _cards.read_card(path).lines}
    missing = [spec for spec in _cards.CASES[name]()
               if _cards.case_key(_cards.parse_case(spec, "code")) not in have]
    assert not missing, "run python -m mojo_train selfcheck --write; missing:\n" + "\n".join(missing)


@pytest.mark.parametrize("path", CARDS, ids=_name)
def test_every_card_file_has_a_sabotage_op(path):
    macro = "MT_SABOTAGE_" + _name(path).upper()
    sources = glob.glob(os.path.join(REPO, "native", "include", "*.h"))
    for folder in ("common", "cpu_oracle"):
        sources += glob.glob(os.path.join(REPO, "native", folder, "*.[ch]"))
    users = [s for s in sources if macro in open(s, encoding="utf-8").read()]
    assert users, ("%s has no sabotage: no native source uses %s, so make SABOTAGE=%s would build "
                   "an intact library and the card could not prove it notices a change"
                   % (os.path.basename(path), macro, _name(path)))


def _build_sabotage(op):
    if not shutil.which("make") or not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("make or cc is missing: cannot build the sabotage library")
    build = subprocess.run(["make", "SABOTAGE=" + op], cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    return os.path.join(REPO, "native", "build", "sabotage-" + op)


@pytest.mark.parametrize("path", CARDS, ids=_name)
def test_a_sabotaged_build_fails_its_card(path, capsys, request):
    op = _name(path)
    libdir = _build_sabotage(op)
    env = dict(os.environ, MOJO_TRAIN_LIBRARY_PATH=libdir, MOJO_TRAIN_VENDOR="cpu",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    child = subprocess.run([sys.executable, "-c", _CHECK_IN_CHILD, path], cwd=REPO, env=env,
                           capture_output=True, text=True)
    assert child.returncode == 0, child.stdout + child.stderr
    got = json.loads(child.stdout.strip().splitlines()[-1])
    assert os.path.dirname(got["path"]) == libdir, "the child did not load the sabotage build"
    floor = MIN_BROKEN.get(op, DEFAULT_MIN_BROKEN)
    assert got["failed"] >= 1 and got["failed"] >= floor * got["total"], (
        "SABOTAGE=%s breaks only %d of %d lines of %s.card (needs %.0f%%): the card lacks teeth"
        % (op, got["failed"], got["total"], op, 100 * floor))
    if request.config.getoption("verbose") > 0:     # pytest -v: how many teeth the card has
        with capsys.disabled():
            print("\n  as expected, make SABOTAGE=%s breaks %d of %d lines of %s.card (needs %.0f%%)"
                  % (op, got["failed"], got["total"], op, 100 * floor))


# ---- identical_ftz (native/contracts/ftz.md): its own cards, with teeth for the flush --------------
def _cpu_ftz():
    try:
        return _native.load("identical_ftz", "cpu")
    except _native.BackendError:
        pytest.skip("the cpu oracle's identical_ftz numeric mode is not built (make)")


def test_every_card_has_an_identical_ftz_card():
    assert sorted(map(_name, FTZ_CARDS)) == sorted(map(_name, CARDS)), \
        "run python -m mojo_train selfcheck --write --numeric-mode identical_ftz"


@pytest.mark.parametrize("path", FTZ_CARDS, ids=_name)
def test_every_line_of_the_identical_ftz_card_matches_on_the_cpu_oracle(path):
    _cpu_ftz()
    assert _cards.read_card(path).contract.endswith("+" + _cards.FTZ_CONTRACT)
    results = _cards.check_card(path, "cpu", numeric_mode="identical_ftz")
    failed = ["%s: %s" % (r.case, ", ".join(r.mismatches)) for r in results if not r.ok]
    assert results and not failed, "%d of %d lines differ:\n%s" % (len(failed), len(results), "\n".join(failed))


@pytest.mark.parametrize("name", sorted(_cards.CASES))
def test_every_case_defined_in_code_has_a_line_in_its_identical_ftz_card(name):
    path = os.path.join(REPO, "fixtures", "identical_ftz", name + _cards.CARD_SUFFIX)
    have = {_cards.case_key(line.case) for line in _cards.read_card(path).lines}
    assert all(_cards.case_key(_cards.parse_case(spec, "code")) in have for spec in _cards.CASES[name]())


# The learning-rate schedules are exempt from the rule (native/contracts/ftz.md, "Exempt": their
# values are decided exactly, the same in both modes), so their card cannot tell a flush from none.
NO_SUBNORMAL_CASES = {"schedule"}


@pytest.mark.parametrize("path", FTZ_CARDS, ids=_name)
def test_a_library_without_the_flush_fails_the_identical_ftz_cards(path):
    """The sabotage control of the flush: the identical library (gradual underflow, no flush) runs
    the identical_ftz card's lines and must fail some; the cases that differ are the subnormal
    inputs, the products that round up to FLT_MIN and the negative tiny results."""
    _cpu_identical()
    results = _cards.check_card(path, "cpu", numeric_mode="identical")
    failed = sum(not r.ok for r in results)
    if _name(path) in NO_SUBNORMAL_CASES:
        assert failed == 0
    else:
        assert failed >= 1, "%s.card's identical_ftz lines all hold without the flush: no teeth" % _name(path)


# ---- the reader -----------------------------------------------------------------------------
GOOD_SPEC = "sgd seed=1 sizes=3 steps=3 lr=1e-2 p=-1,1 g=-1,1"
GOOD_LINE = "%s | params=%s grads=%s" % (GOOD_SPEC, DIGEST, DIGEST)
MALFORMED = [
    (GOOD_SPEC + " params=%s grads=%s" % (DIGEST, DIGEST), "no ' | '"),
    ("rmsprop seed=1 | params=%s" % DIGEST, "a case starts with one of"),
    (GOOD_SPEC + " colour=red | params=%s grads=%s" % (DIGEST, DIGEST), "takes no key 'colour'"),
    (GOOD_SPEC + " lr=1e-3 | params=%s grads=%s" % (DIGEST, DIGEST), "key 'lr' given twice"),
    (GOOD_SPEC.replace("sizes=3", "sizes=0,0") + " | params=%s grads=%s" % (DIGEST, DIGEST),
     "bad value for sizes"),   # optimizer cases take empty tensors, but not only empty ones
    (GOOD_SPEC.replace("lr=1e-2", "lr=nan") + " | params=%s grads=%s" % (DIGEST, DIGEST),
     "bad value for lr"),
    (GOOD_SPEC.replace(" steps=3", "") + " | params=%s grads=%s" % (DIGEST, DIGEST), "lacks steps"),
    ("%s | params=%s grads=XYZ" % (GOOD_SPEC, DIGEST), "64 lowercase hex"),
    ("%s | params=%s" % (GOOD_SPEC, DIGEST), "has outputs params, grads"),
    ("%s | params=%s grads=%s exp_avg=%s" % (GOOD_SPEC, DIGEST, DIGEST, DIGEST), "has outputs"),
    (GOOD_LINE.replace("lr=1e-2", "lr=0.01"), "the same case as line 2"),
]


@pytest.mark.parametrize("row, reason", MALFORMED, ids=[r for _, r in MALFORMED])
def test_the_reader_refuses_a_malformed_line_naming_file_line_and_reason(tmp_path, row, reason):
    path = tmp_path / "x.card"
    path.write_text("%s\n%s\n# a comment\n%s\n" % (HEADER, GOOD_LINE, row))
    with pytest.raises(_cards.CardError) as info:
        _cards.read_card(str(path))
    assert "x.card:4:" in str(info.value) and reason in str(info.value)


def test_the_reader_refuses_a_card_without_its_header(tmp_path):
    path = tmp_path / "x.card"
    path.write_text(GOOD_LINE + "\n")
    with pytest.raises(_cards.CardError, match=r"x.card:1: the first line must be"):
        _cards.read_card(str(path))
    (tmp_path / "y.card").write_text(HEADER + "\n")      # the header names another card
    with pytest.raises(_cards.CardError, match=r"y.card:1:"):
        _cards.read_card(str(tmp_path / "y.card"))


def test_the_reader_takes_a_well_formed_card(tmp_path):
    path = tmp_path / "x.card"
    path.write_text("%s\n\n%s\n" % (HEADER, GOOD_LINE))
    card = _cards.read_card(str(path))
    assert (card.name, card.contract, len(card.lines)) == ("x", "optimizer v1", 1)
    assert card.lines[0].case.args["sizes"] == (3,) and card.lines[0].lineno == 3
    assert _cards.format_line(card.lines[0].case, card.lines[0].digests) == GOOD_LINE


def test_sizes_take_repeats_and_powers_of_two_take_their_exact_value():
    case = _cards.parse_case("clip seed=0 sizes=2x3,5 g=-2**-127,2**-127 max_norm=0", "t")
    assert case.args["sizes"] == (2, 2, 2, 5) and case.args["g"] == (-2.0 ** -127, 2.0 ** -127)


def test_the_comparator_names_every_differing_or_missing_output():
    want = {"a": "1", "b": "2", "c": "3"}
    assert _cards.compare(want, dict(want)) == []
    assert _cards.compare(want, {"a": "1", "b": "9", "d": "4"}) == ["b", "c", "d"]


# ---- append-only ----------------------------------------------------------------------------
def _copy_card(tmp_path, name="clip"):
    src = os.path.join(REPO, "fixtures", name + _cards.CARD_SUFFIX)
    with open(src, encoding="utf-8") as f:
        rows = f.read().splitlines(keepends=True)
    return str(tmp_path / os.path.basename(src)), rows


def _flip(row, output):
    """``row`` with the first hex digit of ``output``'s digest changed."""
    j = row.index(" %s=" % output) + len(output) + 2
    return row[:j] + ("1" if row[j] == "0" else "0") + row[j + 1:]


def test_write_missing_never_rewrites_a_line_a_changed_digest_is_a_mismatch(tmp_path):
    _cpu_identical()
    path, rows = _copy_card(tmp_path)
    i = next(k for k, r in enumerate(rows) if " sizes=3 " in r)        # a small case
    spec = rows[i].partition(" | ")[0]
    rows[i] = _flip(rows[i], "total")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(rows)
    before = open(path, "rb").read()
    assert _cards.write_missing(path) == []
    assert open(path, "rb").read() == before
    bad = [(r.case, r.mismatches) for r in _cards.check_card(path, "cpu") if not r.ok]
    assert bad == [(spec, ["total"])]


def test_write_missing_appends_a_missing_case_and_leaves_the_rest_alone(tmp_path):
    _cpu_identical()
    path, rows = _copy_card(tmp_path)
    i = next(k for k, r in enumerate(rows) if " sizes=1 " in r)
    removed = rows.pop(i)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(rows)
    assert _cards.write_missing(path) == [removed.partition(" | ")[0]]
    assert open(path, encoding="utf-8").read() == "".join(rows) + removed


def test_write_missing_refuses_a_card_of_another_contract(tmp_path):
    path = tmp_path / "optim.card"
    path.write_text("# mojo_train card optim; contract optimizer v0; inputs: Philox\n")
    with pytest.raises(_cards.CardError, match="contract bump starts a new card file"):
        _cards.write_missing(str(path))
    assert path.read_text().count("\n") == 1


# ---- the command line -----------------------------------------------------------------------
def test_selfcheck_prints_the_table_and_exits_1_naming_a_failing_case(tmp_path, monkeypatch, capsys):
    _cpu_identical()
    path, rows = _copy_card(tmp_path)
    rows = [r for r in rows if r.startswith("#") or " sizes=1 " in r]
    victim = rows[-1]
    rows[-1] = _flip(victim, "grads")
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(rows)
    monkeypatch.setattr(_cards, "card_paths", lambda numeric_mode="identical": [path])
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    assert cli.selfcheck(numeric_mode="identical") == 1
    out = capsys.readouterr().out
    assert "card" in out and "vendor" in out and "FAIL clip on cpu" in out
    assert victim.partition(" | ")[0] in out and "mismatching: grads" in out
    assert re.search(r"^FAILED: \d+ card lines checked on cpu, 1 failed$", out, re.M)


def test_selfcheck_exits_0_when_every_card_matches():
    run = subprocess.run([sys.executable, "-m", "mojo_train", "selfcheck"], cwd=REPO,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    for path in CARDS:
        assert _name(path) in run.stdout
    # one line says the outcome; vendors without a library here come after it, as not checked
    lines = run.stdout.splitlines()
    outcome = [k for k, line in enumerate(lines) if re.match(r"passed: \d+ card lines checked on \w+", line)]
    assert len(outcome) == 1 and lines[outcome[0]].endswith(", 0 failed")
    assert all(line.startswith("not checked on ") for line in lines[outcome[0] + 1:])
    assert not any(line.startswith("skipped ") for line in lines)


def test_demo_runs_from_the_command_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    cli.main(["demo", "--steps", "20", "--svg", str(tmp_path / "c.svg")])
    out = capsys.readouterr().out
    assert "step   20" in out and "checkpoint sha256" in out and (tmp_path / "c.svg").exists()


def test_info_prints_what_loads():
    _cpu_identical()
    run = subprocess.run([sys.executable, "-m", "mojo_train", "info"], cwd=REPO,
                         capture_output=True, text=True, env=dict(os.environ, MOJO_TRAIN_VENDOR="cpu"))
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["vendor"] == "cpu"


@pytest.mark.parametrize("geometry", [(256, 0), (64, 5), (512, 3)])
def test_every_card_holds_on_device_buffers_at_any_launch_geometry(identical, geometry):
    if not identical.has("device_buffers"):
        pytest.skip("the vendor takes no device buffers")
    lib = identical.backend.lib
    assert lib.mt_set_launch_geometry(*geometry) == 0
    rms_ran = False
    try:
        for path in CARDS:
            if _name(path) in _native.FEATURES and not identical.has(_name(path)):
                continue     # a family this library declares it lacks (its own test says so)
            results = _cards.check_card(path, identical.vendor, device=True)
            assert results and all(r.ok or r.skipped for r in results), [r for r in results if not r.ok][:3]
            seen = _native.ffi.new("int32_t[2]")
            assert lib.mt_launch_geometry(seen) == 0
            # every launch takes the set threads a block but CUDA's one-pass RMSNorm backward (512
            # whatever the setting; tests/test_rms_norm.py reads it back): the rms_norm card's last,
            # still the last launch after a card that launches nothing (schedule)
            rms_ran = rms_ran or _name(path) == "rms_norm"
            one_pass = rms_ran and identical.vendor == "cuda" and seen[0] == 512
            assert seen[0] == geometry[0] or one_pass, (_name(path), seen[0])
    finally:
        lib.mt_set_launch_geometry(256, 0)
