"""The suite runs once per loadable (vendor, numeric mode). MOJO_TRAIN_VENDOR, when set to a vendor,
narrows it to that vendor; otherwise every vendor whose library loads here takes part.
Tests skip by capability (mt_features bits), never by vendor name."""
import os

import pytest

from mojo_train import _native


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


ALL = _loadable(_native.NUMERIC_MODES)
IDENTICAL = [c for c in ALL if c[1] == "identical"]


def _mode_fixture(request, monkeypatch):
    vendor, numeric_mode, backend = request.param
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", vendor)
    return Mode(vendor, numeric_mode, backend)


@pytest.fixture(params=ALL, ids=lambda c: "%s-%s" % c[:2])
def mode(request, monkeypatch):
    """Every loadable vendor x numeric mode."""
    return _mode_fixture(request, monkeypatch)


@pytest.fixture(params=IDENTICAL, ids=lambda c: "%s-%s" % c[:2])
def identical(request, monkeypatch):
    """Every loadable vendor's identical numeric mode."""
    return _mode_fixture(request, monkeypatch)


def _having(mode, feature):
    if not mode.has(feature):
        pytest.skip("this library has no %s (mt_features)" % feature)
    return mode


@pytest.fixture
def linear_mode(mode):
    """Every loadable vendor x numeric mode whose library has the linear family (MT_FEATURE_LINEAR)."""
    return _having(mode, "linear")


@pytest.fixture
def linear_identical(identical):
    """Every loadable vendor's identical numeric mode, where it has the linear family."""
    return _having(identical, "linear")


@pytest.fixture
def rms_norm_mode(mode):
    """Every loadable vendor x numeric mode whose library has RMSNorm (MT_FEATURE_RMS_NORM)."""
    return _having(mode, "rms_norm")


@pytest.fixture
def rms_norm_identical(identical):
    """Every loadable vendor's identical numeric mode, where it has RMSNorm."""
    return _having(identical, "rms_norm")


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
