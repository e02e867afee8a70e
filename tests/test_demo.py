"""The end-to-end demo (mojo_train/_demo.py): it trains, beats the text's unigram entropy on
held-out characters, and its digests are a pure function of the code (run twice, and with one
thread or several, they are the same)."""
import re

import pytest

from mojo_train import _demo, _native


def _run(tmp_path, steps, threads=None):
    lines = []
    b = _native.load("identical", "cpu")
    old = b.lib.mt_num_threads()
    if threads:
        b.lib.mt_set_num_threads(threads)
    try:
        rc = _demo.run(vendor="cpu", steps=steps, svg=str(tmp_path / "loss.svg"), out=lines.append)
    finally:
        b.lib.mt_set_num_threads(old)
    text = "\n".join(lines)
    digests = re.findall(r"sha256 ([0-9a-f]{64})", text)
    return rc, text, digests


def test_the_demo_learns_more_than_character_frequencies(tmp_path):
    rc, text, digests = _run(tmp_path, 300)
    held, entropy = map(float, re.search(r"held-out loss ([\d.]+) nats; unigram entropy of the text ([\d.]+)",
                                         text).groups())
    assert rc == 0 and held < entropy, text[-400:]
    assert len(digests) == 2 and (tmp_path / "loss.svg").read_text().startswith("<svg")
    assert text.count("\nstep ") == 299


def test_the_demo_digests_do_not_depend_on_the_run_or_the_thread_count(tmp_path, monkeypatch):
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    first = _run(tmp_path, 40)[2]
    assert _run(tmp_path, 40)[2] == first
    assert _run(tmp_path, 40, threads=1)[2] == first
