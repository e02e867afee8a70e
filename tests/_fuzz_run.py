"""Running fuzz targets: what tests/test_fuzz.py (a bounded, reproducible budget per target) and
bench/fuzz.py (the long run, a recorded random seed) share.

``explore`` draws ``examples`` examples of one target with hypothesis in this process (so a
failing example shrinks), runs each in the worker pool, and hands every (description, verdict)
to ``record``; ``record`` may raise to fail the example (the test does; the long run counts).
"""
import os

from hypothesis import HealthCheck, Phase, given, seed as hypothesis_seed, settings

from _fuzz_build import available_kinds
from _fuzz_spec import Ctx

DEFAULT_EXAMPLES = 50          # per target in `make test` (about 40 s here); MT_FUZZ_EXAMPLES overrides


def context(vendor, numeric_mode, backend):
    """What the strategies need to know of the vendor under test."""
    device = bool(backend.has("device_buffers"))
    return Ctx(vendor, numeric_mode, device, available_kinds(device))


def ci_examples(target):
    """The CI budget of one target: MT_FUZZ_EXAMPLES (default DEFAULT_EXAMPLES) times its share."""
    n = int(os.environ.get("MT_FUZZ_EXAMPLES", DEFAULT_EXAMPLES))
    return max(1, int(round(n * target.examples)))


def explore(pool, target, ctx, examples, record, seed=None, shrink=True):
    """Run ``examples`` hypothesis examples of ``target``; ``seed`` None: derandomized (the same
    examples on every run), else that seed."""
    phases = (Phase.explicit, Phase.generate) + ((Phase.shrink,) if shrink else ())
    config = settings(max_examples=examples, deadline=None, database=None, derandomize=seed is None,
                      phases=phases, suppress_health_check=list(HealthCheck), report_multiple_bugs=False)

    @config
    @given(desc=target.strategy(ctx))
    def one(desc):
        record(desc, pool.run(desc))

    if seed is not None:
        one = hypothesis_seed(seed)(one)
    one()


def describe(desc, verdict):
    """A finding in a few lines: the target, the example's arguments and faults, the verdict."""
    category, text = verdict["finding"]
    faults = "; ".join("%s [%s] %s" % (", ".join(f[0]) or "-", f[2], f[1]) for f in desc["faults"]) or "none"
    args = ", ".join("%s=%s" % (n, _short(s)) for n, s, _ in desc["args"])
    return "%s: %s\n  call: %s(%s)\n  setup: %s\n  faults: %s (expect %s)\n  %s" % (
        category, desc["target"], desc["target"], args, _short(desc.get("setup")), faults, desc["expect"], text)


def _short(spec, limit=300):
    text = repr(spec)
    return text if len(text) <= limit else text[:limit] + "..."
