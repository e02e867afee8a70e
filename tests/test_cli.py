"""``python -m mojo_train``: --version, and every mistake on the command line or in the
MOJO_TRAIN_* environment ends with exit status 2 and one line ``mojo_train: error: ...`` on
stderr, naming what was wrong, never a traceback, and with nothing trained or written.

Contract under test: mojo_train/__main__.py's docstring.
"""
import os
import subprocess
import sys

import pytest

import mojo_train
from mojo_train import __main__ as cli
from mojo_train import _native

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cli(*args, **env):
    return subprocess.run([sys.executable, "-m", "mojo_train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, **env))


def _absent_gpu_vendor():
    for vendor in ("cuda", "hip", "metal"):
        try:
            _native.load("identical", vendor)
        except _native.BackendError:
            return vendor
    pytest.skip("every GPU vendor's identical library loads here: none is missing")


def test_version_prints_the_package_version_and_exits_0():
    run = _cli("--version")
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "mojo_train %s" % mojo_train.__version__


MISTAKES = [    # (arguments, environment, what the error line must name)
    (["demo", "--steps", "0"], {}, "--steps"),
    (["demo", "--steps", "-3"], {}, "--steps"),
    (["demo", "--steps", "ten"], {}, "--steps"),
    (["demo", "--print-every", "0"], {}, "--print-every"),
    (["demo", "--vendor", "nvidia"], {}, "--vendor"),
    (["demo", "--svg", "{tmp}/no/such/folder/loss.svg"], {}, "--svg"),
    (["demo", "--svg", "{tmp}"], {}, "is a folder"),
    (["demo", "--model", "gpt", "--distributed"], {}, "drop --model gpt"),
    (["info", "--numeric-mode", "exact"], {}, "--numeric-mode"),
    (["selfcheck", "--card", "nosuch"], {}, "--card 'nosuch'"),
    (["selfcheck", "--shard", "4/4"], {}, "--shard"),
    (["selfcheck", "--shard", "1"], {}, "--shard"),
    (["selfcheck", "--shard", "-1/2"], {}, "--shard"),
    (["frobnicate"], {}, "frobnicate"),
    ([], {}, "command"),
]


def _assert_one_line_error(run, names):
    assert run.returncode == 2, run.stdout + run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("mojo_train: error: "), run.stderr
    assert names in lines[0] and "Traceback" not in run.stderr
    assert "step " not in run.stdout


@pytest.mark.parametrize("args, env, names", MISTAKES, ids=[" ".join(a) or "nothing" for a, _, _ in MISTAKES])
def test_a_command_line_mistake_is_one_line_on_stderr_with_exit_status_2(tmp_path, args, env, names):
    run = _cli(*[a.format(tmp=tmp_path) for a in args], **env)
    _assert_one_line_error(run, names)
    assert sorted(os.listdir(tmp_path)) == []            # nothing written


def test_the_shards_of_a_card_check_every_line_once():
    """--shard K/N for K = 0..N-1 together check what the whole card checks, each line once."""
    def counted(*extra):
        run = _cli("selfcheck", "--card", "schedule", *extra, MOJO_TRAIN_VENDOR="cpu")
        assert run.returncode == 0, run.stdout + run.stderr
        row = next(l for l in run.stdout.splitlines() if l.startswith("schedule"))
        return int(row.split()[2].split("/")[0])
    whole = counted()
    assert whole > 3
    assert [counted("--shard", "%d/3" % k) for k in range(3)] == [len(range(k, whole, 3)) for k in range(3)]


@pytest.mark.parametrize("command", ["demo", "info"])
def test_a_vendor_whose_library_is_not_built_is_one_line_naming_the_fix(tmp_path, command):
    vendor = _absent_gpu_vendor()
    extra = ["--svg", str(tmp_path / "loss.svg")] if command == "demo" else []
    run = _cli(command, "--vendor", vendor, *extra)
    _assert_one_line_error(run, "no %s library" % vendor)
    assert "make %s" % vendor in run.stderr or "unusable" in run.stderr   # the fix, or why not
    assert not (tmp_path / "loss.svg").exists()


# `import mojo_train` itself refuses a bad MOJO_TRAIN_* value (_native.check_environment), before
# the command line runs; these cover a value that goes bad after the import.
@pytest.mark.parametrize("command, name", [("demo", "MOJO_TRAIN_VENDOR"), ("info", "MOJO_TRAIN_VENDOR"),
                                           ("info", "MOJO_TRAIN_NUMERIC_MODE"), ("selfcheck", "MOJO_TRAIN_VENDOR")])
def test_a_bad_environment_variable_is_one_line_on_stderr_with_exit_status_2(
        tmp_path, monkeypatch, capsys, command, name):
    monkeypatch.setenv(name, "bogus")
    extra = ["--svg", str(tmp_path / "loss.svg")] if command == "demo" else []
    assert cli.main([command, *extra]) == 2
    out, err = capsys.readouterr()
    assert err.startswith("mojo_train: error: ") and err.count("\n") == 1 and name in err, err
    assert "step " not in out and not (tmp_path / "loss.svg").exists()


@pytest.mark.parametrize("name", ["MOJO_TRAIN_VENDOR", "MOJO_TRAIN_NUMERIC_MODE", "MOJO_TRAIN_NUM_THREADS"])
def test_a_bad_environment_variable_before_the_import_is_one_line_too(name):
    _assert_one_line_error(_cli("info", **{name: "bogus"}), name)
