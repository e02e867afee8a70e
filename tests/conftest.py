"""The suite runs once per loadable (vendor, numeric mode). MOJO_TRAIN_VENDOR, when set to a vendor,
narrows it to that vendor; otherwise every vendor whose library loads here takes part.
Tests skip by capability (mt_features bits), never by vendor name."""
import os

import pytest

from mojo_train import _native
from _helpers import skip_without


class Mode:
    """A (vendor, numeric mode) pair under test: pass ``numeric_mode=mode.numeric_mode``."""

    def __init__(self, vendor, numeric_mode, backend):
        self.vendor, self.numeric_mode, self.backend = vendor, numeric_mode, backend

    def has(self, name):
        return self.backend.has(name)

    def __repr__(self):
        return "%s-%s" % (self.vendor, self.numeric_mode)


def _vendors():
    v = os.environ.get("MOJO_TRAIN_VENDOR", "auto").strip().lower()
    return _native.VENDORS if v == "auto" else (v,)


def _loadable(numeric_modes):
    out = []
    for vendor in _vendors():
        for numeric_mode in numeric_modes:
            try:
                out.append((vendor, numeric_mode, _native.load(numeric_mode, vendor)))
            except _native.BackendError:
                continue
    return out


def _numeric_modes():
    """The numeric modes the fixtures run: all, or those MOJO_TRAIN_TEST_NUMERIC_MODES lists (a
    comma-separated subset; `make asan-test` in CI runs the identical mode only, to fit CI's time)."""
    asked = os.environ.get("MOJO_TRAIN_TEST_NUMERIC_MODES", "").strip()
    if not asked:
        return _native.NUMERIC_MODES
    modes = tuple(m.strip() for m in asked.split(",") if m.strip())
    unknown = [m for m in modes if m not in _native.NUMERIC_MODES]
    if unknown:
        raise pytest.UsageError("MOJO_TRAIN_TEST_NUMERIC_MODES names %s; the numeric modes are %s"
                                % (", ".join(unknown), ", ".join(_native.NUMERIC_MODES)))
    return modes


ALL = _loadable(_numeric_modes())
IDENTICAL = [c for c in ALL if c[1] == "identical"]


def _mode_fixture(request, monkeypatch):
    vendor, numeric_mode, backend = request.param
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", vendor)
    mode = Mode(vendor, numeric_mode, backend)
    try:                        # the comparisons' floor near zero follows the mode (tolerances.py)
        import tolerances
    except ImportError:         # no numpy: no comparison with float64 runs either
        tolerances = None
    if tolerances is not None:
        monkeypatch.setattr(tolerances, "MODE_UNDER_TEST", mode)
    return mode


@pytest.fixture(params=ALL, ids=lambda c: "%s-%s" % c[:2])
def mode(request, monkeypatch):
    """Every loadable vendor x numeric mode."""
    return _mode_fixture(request, monkeypatch)


@pytest.fixture(params=IDENTICAL, ids=lambda c: "%s-%s" % c[:2])
def identical(request, monkeypatch):
    """Every loadable vendor's identical numeric mode."""
    return _mode_fixture(request, monkeypatch)


def _having(mode, feature):
    return skip_without(mode, feature)


def _family_fixtures(family):
    """The fixtures <family>_mode (every loadable vendor x numeric mode) and <family>_identical
    (every identical numeric mode), each skipped where the library lacks the family's feature bit."""
    @pytest.fixture(name=family + "_mode")
    def in_every_mode(mode):
        return _having(mode, family)

    @pytest.fixture(name=family + "_identical")
    def in_identical(identical):
        return _having(identical, family)

    return in_every_mode, in_identical


# linear_mode, linear_identical, rms_norm_mode, ...: one pair per family with a feature bit of its own
for _family in ("linear", "rms_norm", "layer_norm", "elementwise", "random", "attention", "optim", "clip", "loss",
                "lm_head", "embedding", "accumulate", "schedule"):
    globals()[_family + "_mode"], globals()[_family + "_identical"] = _family_fixtures(_family)


# ---- the skip gate: every skip reason must be a reviewed one (tests/skip_reasons.py) ----------

_skips = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        import skip_reasons
        _skips.append(skip_reasons.reason_of(report))


def pytest_collectreport(report):
    """A whole module skipped at collection (module-level importorskip or skip) counts too."""
    if report.skipped:
        import skip_reasons
        _skips.append(skip_reasons.reason_of(report))


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _skips:
        return
    import skip_reasons
    terminalreporter.section("skips by reason (tests/skip_reasons.py)")
    for line in skip_reasons.table(_skips):
        terminalreporter.write_line(line)
    unknown = sorted({r for r in _skips if skip_reasons.classify(r) is None})
    if unknown:
        terminalreporter.write_line("UNREVIEWED skip reasons (the run fails): %d" % len(unknown), red=True)


def pytest_sessionfinish(session, exitstatus):
    import skip_reasons
    if exitstatus == 0 and any(skip_reasons.classify(r) is None for r in _skips):
        session.exitstatus = 1
