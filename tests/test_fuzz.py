"""Hostile arguments to every public entry point (issue 12): each example is a clean refusal or
the oracle's result, never a crash, a partial write or an unclear error.

For each target of tests/_fuzz_targets.py (one per public callable; the exemptions are listed
there with their reasons) hypothesis draws calls -- every buffer container the library takes,
wrong dtypes and ranks, zero and huge shapes, NaN and infinities, read-only, released and strided
buffers, aliases and partial overlaps, extreme indices, wrong types, torch tensors with and
without grad -- and a worker process runs them (tests/_fuzz_worker.py: a crash is recorded and
the worker restarted). An example fails this suite when the worker reports any finding: a crash,
a partial write, an unclear error, a wrong outcome or a wrong result (the categories are
tests/_fuzz_worker.py's) -- unless it is a library defect listed, with its reproducer, in
tests/_fuzz_known.py, whose every entry is checked to still show until it is fixed.

Budget: MT_FUZZ_EXAMPLES examples per target (default in tests/_fuzz_run.py), derandomized, so
every run draws the same examples; the long run is ``make fuzz`` (bench/fuzz.py), recorded in
bench/results/fuzz.md. Every loadable vendor's identical numeric mode takes part (its oracles
are exact); device memory is drawn where the vendor takes it.
"""
import importlib
import inspect
import re

import pytest

from _fuzz_known import KNOWN, known
from _fuzz_run import ci_examples, context, describe, explore
from _fuzz_targets import EXEMPT, TARGETS
from _fuzz_targets_misc import SABOTAGE
from _fuzz_worker import Pool
from _helpers import skip_without
from mojo_train import _native

FUZZED = sorted(name for name in TARGETS if not name.startswith("harness."))

# The modules whose public names must each have a target or an exemption. Issue 13's
# mojo_train.torch joins the moment it exists: its names then need targets too.
PUBLIC_MODULES = ("mojo_train", "mojo_train.nn", "mojo_train.torch")

_POOLS = {}


@pytest.fixture(scope="module", autouse=True)
def _close_the_workers():
    yield
    while _POOLS:
        _POOLS.popitem()[1].close()


def pool_for(mode):
    """The worker pool of a (vendor, numeric mode), started once per module."""
    if mode.vendor not in _POOLS:
        _POOLS[mode.vendor] = Pool(mode.vendor)
    return _POOLS[mode.vendor]


# The op families (mt_features names) a target's calls need, by its name: where the library under
# test declares it lacks one (a family not built for that vendor yet), the target is skipped.
_FAMILIES = ((r"^(torch\.)?cross_entropy( |$)", "loss"), (r"^(chunked_lm_head_loss|linear_cross_entropy)$", "lm_head"),
             (r"^linear_(forward|backward)$|^mlp_inference_sessions$|^torch\.(nn\.)?[Ll]inear", "linear"),
             (r"rms_norm|RMSNorm", "rms_norm"), (r"layer_norm|LayerNorm", "layer_norm"),
             (r"[Ee]mbedding", "embedding"), (r"scaled_dot_product_attention", "attention"))


def families_of(name):
    return [family for pattern, family in _FAMILIES if re.search(pattern, name)]


@pytest.mark.parametrize("name", FUZZED)
def test_each_hostile_example_is_a_clean_refusal_or_the_oracles_result(identical, name):
    target = TARGETS[name]
    if target.device_only and not identical.has("device_buffers"):
        pytest.skip("the loaded vendor takes no device buffers")
    skip_without(identical, *families_of(name))

    def record(desc, verdict):
        assert verdict["finding"] is None or known(desc, verdict), describe(desc, verdict)

    explore(pool_for(identical), target, context(identical.vendor, identical.numeric_mode, identical.backend),
            ci_examples(target), record)


def test_each_known_defect_still_shows_in_its_example_until_it_is_fixed(identical):
    """tests/_fuzz_known.py's ledger stays true: when a defect is fixed this fails, and its entry
    goes. One test over the ledger, not one per entry: the ledger has been empty since 2026-12-03
    (an empty parametrization would be a skip no reason covers)."""
    for entry in KNOWN:
        what, target, category, pattern, desc = entry
        verdict = pool_for(identical).run(desc)
        assert verdict["finding"] and known(desc, verdict) is entry, "fixed? %s\n%r" % (what, verdict)


# ---- the harness has teeth: sabotaged entry points are reported as what they are ----------------

@pytest.mark.parametrize("sabotage", SABOTAGE, ids=lambda t: t.name)
def test_the_harness_reports_a_sabotaged_entry_point_in_its_category(identical, sabotage):
    pool = pool_for(identical)
    ctx = context(identical.vendor, identical.numeric_mode, identical.backend)
    seen = []
    explore(pool, sabotage, ctx, 3, lambda desc, verdict: seen.append(verdict), shrink=False)
    assert seen and all(v["finding"] and v["finding"][0] == sabotage.category for v in seen), seen


def test_a_crashed_worker_is_replaced_and_the_next_example_runs(identical):
    pool = Pool(identical.vendor)
    ctx = context(identical.vendor, identical.numeric_mode, identical.backend)
    try:
        verdicts = []
        for target in (TARGETS["harness.abort"], TARGETS["add"]):
            explore(pool, target, ctx, 1, lambda desc, verdict: verdicts.append(verdict), shrink=False)
        crash, after = verdicts
        assert crash["outcome"] == "crash" and "SIGABRT" in crash["finding"][1]
        assert after["finding"] is None and pool.crashes == 1 and len(set(pool.pids)) == 2
    finally:
        pool.close()


# ---- every public callable has a target or a stated exemption ------------------------------------

def _public_modules():
    for name in PUBLIC_MODULES:
        try:
            yield name, importlib.import_module(name)
        except ImportError:
            continue


def _class_attributes(cls):
    """Public methods and properties a class defines (inherited ones from the library too, not
    from builtins)."""
    seen = {}
    for klass in reversed(cls.__mro__):
        if klass.__module__.startswith("mojo_train"):
            for attr, value in vars(klass).items():
                if not attr.startswith("_") and (callable(value) or isinstance(value, (property, classmethod,
                                                                                       staticmethod))):
                    seen[attr] = value
    return sorted(seen)


def public_callables():
    """Every public callable, by its canonical name (mojo_train.<name> where the top level
    exports the same object): functions, classes, and the classes' public methods and
    properties."""
    import mojo_train
    names = set()
    for module_name, module in _public_modules():
        for attr in getattr(module, "__all__", ()):
            obj = getattr(module, attr)
            if not callable(obj):
                continue
            canonical = "mojo_train.%s" % attr if getattr(mojo_train, attr, None) is obj else "%s.%s" % (module_name, attr)
            names.add(canonical)
            if inspect.isclass(obj):
                names.update("%s.%s" % (canonical, a) for a in _class_attributes(obj))
    return names


def test_every_public_callable_has_a_fuzz_target_or_a_stated_exemption():
    covered = {c for t in TARGETS.values() for c in t.covers}
    missing = sorted(public_callables() - covered - set(EXEMPT))
    assert not missing, "public callables with neither a fuzz target nor an exemption: %s" % missing


def test_the_targets_and_exemptions_name_public_callables_only():
    public = public_callables() | {"mojo_train.Array.__getitem__", "mojo_train.Array.__setitem__"}
    stale = sorted(c for t in TARGETS.values() for c in t.covers if c not in public)
    assert not stale and set(EXEMPT) <= public, (stale, sorted(set(EXEMPT) - public))
    assert all(reason.strip() for reason in EXEMPT.values())


def test_the_family_map_names_real_families_and_finds_the_family_of_each_layer_target():
    assert {f for _, f in _FAMILIES} <= set(_native.FEATURES)
    assert families_of("linear_forward") == ["linear"] and families_of("torch.nn.Linear.forward") == ["linear"]
    assert families_of("cross_entropy positions") == ["loss"] and families_of("torch.cross_entropy") == ["loss"]
    assert families_of("linear_cross_entropy") == ["lm_head"] and families_of("Embedding.backward") == ["embedding"]
    assert families_of("SGD.step") == [] and families_of("silu_forward") == []
