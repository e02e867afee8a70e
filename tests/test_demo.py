"""The end-to-end demo (mojo_train/_demo.py): it trains on the essay shipped in the package,
beats the text's unigram entropy on held-out characters, reports its progress, a summary and
an SVG a person can read, and its digests are a pure function of the code (run twice, and with
one thread or several, they are the same)."""
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from mojo_train import _demo, _native

from _helpers import REPO, python_path

PACKAGE = os.path.dirname(os.path.abspath(_demo.__file__))
SVG = "{http://www.w3.org/2000/svg}"
PROGRESS = re.compile(r"^step +(\d+)/(\d+)  train loss ([\d.]+)  lr ([\d.]+)  elapsed ([\d.]+) s$", re.M)


def _run(tmp_path, steps, threads=None, every=_demo.PRINT_EVERY, model="mlp", vendor="cpu"):
    lines = []
    b = _native.load("identical", "cpu")
    old = b.lib.mt_num_threads()
    if threads:
        b.lib.mt_set_num_threads(threads)
    try:
        rc = _demo.run(vendor=vendor, steps=steps, svg=str(tmp_path / "loss.svg"), every=every,
                       out=lines.append, model=model)
    finally:
        b.lib.mt_set_num_threads(old)
    text = "\n".join(lines)
    digests = re.findall(r"sha256  ([0-9a-f]{64})$", text, re.M)
    return rc, text, digests


def test_the_demo_learns_more_than_character_frequencies(tmp_path):
    rc, text, digests = _run(tmp_path, 300)
    held, entropy = map(float, re.search(r"held-out loss +([\d.]+) nats on \d+ characters; "
                                         r"unigram entropy of the text ([\d.]+) nats", text).groups())
    assert rc == 0 and held < entropy, text[-600:]
    assert len(digests) == 2


def test_the_demo_prints_a_progress_line_every_n_steps_and_at_the_first_and_last(tmp_path):
    rc, text, _ = _run(tmp_path, 60, every=25)
    rows = PROGRESS.findall(text)
    assert [int(r[0]) for r in rows] == [1, 25, 50, 60] and all(int(r[1]) == 60 for r in rows)
    elapsed = [float(r[4]) for r in rows]
    assert elapsed == sorted(elapsed) and all(float(r[3]) > 0 for r in rows)


def test_the_demo_summary_names_steps_time_digests_and_the_svg(tmp_path):
    rc, text, digests = _run(tmp_path, 3)
    summary = text[text.index("summary"):]
    assert re.search(r"steps +3 of %d characters each in [\d.]+ s" % _demo.BATCH, summary), summary
    assert len(digests) == 2 and digests[0] != digests[1]
    assert "loss curve SVG     %s" % (tmp_path / "loss.svg") in summary


def test_the_demo_svg_has_labelled_axes_and_states_the_first_and_last_loss(tmp_path):
    rc, text, _ = _run(tmp_path, 30, every=1)
    losses = [float(r[2]) for r in PROGRESS.findall(text)]
    root = ET.parse(str(tmp_path / "loss.svg")).getroot()
    texts = [t.text for t in root.iter(SVG + "text")]
    title = next(t for t in texts if t.startswith("Training loss"))
    assert "first %.4f, last %.4f nats" % (losses[0], losses[-1]) in title
    assert "step" in texts and "loss (nats)" in texts
    x_ticks = [float(t.text) for t in root.iter(SVG + "text") if t.get("text-anchor") == "middle"
               and re.fullmatch(r"[\d.]+", t.text or "")]
    y_ticks = [float(t.text) for t in root.iter(SVG + "text") if t.get("text-anchor") == "end"]
    assert x_ticks == sorted(x_ticks) and x_ticks[0] <= 1 and x_ticks[-1] >= 30
    assert len(y_ticks) >= 3 and y_ticks[0] <= min(losses) + 5e-5 and y_ticks[-1] >= max(losses) - 5e-5
    assert len(root.find(SVG + "polyline").get("points").split()) == 30


def test_the_demo_draws_a_one_step_run(tmp_path):
    rc, text, digests = _run(tmp_path, 1)
    texts = [t.text for t in ET.parse(str(tmp_path / "loss.svg")).getroot().iter(SVG + "text")]
    assert len(digests) == 2 and any(t.startswith("Training loss") and "(1 step)" in t for t in texts)


def test_the_demo_digests_do_not_depend_on_the_run_or_the_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    first = _run(tmp_path, 40)[2]
    assert _run(tmp_path, 40)[2] == first
    assert _run(tmp_path, 40, threads=1)[2] == first


def test_the_gpt_demo_learns_and_its_digests_do_not_depend_on_the_thread_count(tmp_path, monkeypatch):
    """The GPT (mojo_train/_demo_gpt.py: causal attention, LayerNorm, GELU): 40 steps already beat
    the unigram entropy on the held-out text; the full run's figures are in bench/results/demo.md."""
    if not _native.load("identical", "cpu").has("attention"):
        pytest.skip("this library has no attention (mt_features)")
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    rc, text, first = _run(tmp_path, 40, every=20, model="gpt")
    assert rc == 0 and len(first) == 2 and "gpt model" in text, text[-600:]
    assert [int(r[0]) for r in PROGRESS.findall(text)] == [1, 20, 40]
    assert _run(tmp_path, 3, threads=1, model="gpt")[2] == _run(tmp_path, 3, model="gpt")[2]


@pytest.mark.parametrize("model,steps", [("mlp", 5), ("gpt", 3)])
def test_the_demos_on_the_emulated_metal_library_give_the_cpu_digests(tmp_path, monkeypatch, model, steps):
    """Every op the demos use has Metal kernels (issue 17): run by the emulator, the Metal
    library's training run and checkpoint are the CPU oracle's, bit for bit (a few steps: the
    emulator runs a launch's threads one after another)."""
    try:
        _native.load("identical", "metal_emulated")
    except OSError:
        pytest.skip("no metal_emulated library is built here (make metal-emulated)")
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    cpu = _run(tmp_path, steps, model=model)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "metal_emulated")
    metal = _run(tmp_path, steps, model=model, vendor="metal_emulated")
    assert metal[0] == cpu[0] and "metal_emulated vendor" in metal[1], metal[1][-600:]   # rc 1: too few steps to learn
    assert len(cpu[2]) == 2 and metal[2] == cpu[2], (metal[2], cpu[2])


def test_the_demo_text_ships_inside_the_package_not_in_the_checkout(tmp_path):
    """A copy of the package alone (as a wheel installs it) still finds the demo's text."""
    pkg = tmp_path / "mojo_train"
    shutil.copytree(PACKAGE, pkg, ignore=shutil.ignore_patterns("__pycache__", "lib", "include"))
    shutil.copytree(os.path.join(os.path.dirname(PACKAGE), "native", "include"), pkg / "include")
    code = "from mojo_train import _demo; import sys; sys.stdout.write(_demo._text())"
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=python_path(tmp_path)))
    assert run.returncode == 0, run.stderr
    with open(os.path.join(PACKAGE, _demo.CORPUS), encoding="utf-8") as f:
        assert run.stdout == f.read() == _demo._text()
    assert len(set(run.stdout)) > 20


# ---- torchrun --nproc_per_node=N -m mojo_train demo --distributed (issue 15 point 5) ----------

def _torchrun(tmp_path, processes, steps):
    """The demo as ``processes`` gloo ranks started by torch's launcher (torchrun's module), on
    the cpu vendor; the completed process."""
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("torch.distributed has no gloo here")
    env = dict(os.environ, PYTHONPATH=python_path(REPO), MOJO_TRAIN_VENDOR="cpu", OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node=%d" % processes, "-m", "mojo_train", "demo", "--distributed",
                           "--steps", str(steps), "--svg", str(tmp_path / "loss.svg")],
                          cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("processes", [1, 2, 4])
def test_the_distributed_demo_prints_one_process_digests(tmp_path, processes):
    """Each rank computes a contiguous quarter, half or all of every 4096-character batch; the
    reduced gradients and loss sums give one process's loss curve and checkpoint bytes (a rank
    that trained on its share alone, or on the whole batch, would print other digests)."""
    (tmp_path / "one").mkdir()
    rc, _, expected = _run(tmp_path / "one", 3)      # rc 1: 3 steps do not beat the unigram entropy
    run = _torchrun(tmp_path, processes, 3)
    assert run.returncode == rc and "mojo_train: error" not in run.stderr, (run.stdout + run.stderr)[-3000:]
    assert re.findall(r"sha256  ([0-9a-f]{64})$", run.stdout, re.M) == expected, run.stdout[-2000:]
    assert run.stdout.count("summary (") == 1           # rank 0 alone prints
    assert "%d processes over gloo, this is rank 0" % processes in run.stdout
    assert os.path.getsize(str(tmp_path / "loss.svg")) > 0


def test_a_distributed_demo_that_cannot_split_the_batch_is_refused_on_every_rank(tmp_path):
    run = _torchrun(tmp_path, 3, 2)
    refusals = [l for l in run.stderr.splitlines() if l.startswith("mojo_train: error: --distributed: 3 processes")]
    assert run.returncode != 0 and len(refusals) == 3, run.stderr[-3000:]
    assert "run 1, 2 or 4 processes" in refusals[0] and "step " not in run.stdout
    assert not os.path.exists(str(tmp_path / "loss.svg"))


def test_the_distributed_demo_outside_torchrun_says_how_to_start_it(tmp_path):
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    run = subprocess.run([sys.executable, "-m", "mojo_train", "demo", "--distributed", "--svg",
                          str(tmp_path / "loss.svg")], cwd=str(tmp_path), capture_output=True, text=True, timeout=120,
                         env=dict(env, PYTHONPATH=python_path(REPO)))
    assert run.returncode == 2 and run.stderr.startswith("mojo_train: error: --distributed runs under torchrun"), run.stderr
    assert "torchrun --nproc_per_node=N -m mojo_train demo --distributed" in run.stderr and "step " not in run.stdout
