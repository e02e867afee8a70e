"""Our SGD, Adam, AdamW and clip_grad_norm_ against torch's, with torch in float64 as the reference.

Contract under test: for inputs in the fixed ranges of tests/tolerances.py, every optimizer and
option, with and without clipping, stays within the one bound stated there of torch's own
optimizer run in float64 on the same initial params and the same float32 gradients, after 50
steps (params, moments and every step's pre-clip norm); clip_grad_norm_ alone stays within it
for up to 64 tensors, one of them sometimes 2**20 + 7 long. torch's own float32 CPU optimizer
and clip keep the same bound (the calibration; the clip only below 2**20 + 7, see
tolerances.py). Our bits are not torch's (README, "Where our bits differ from torch's"): this
file says how far apart they may be. Data are drawn by numpy from hypothesis-drawn seeds.
``PYTHONPATH=. python tests/test_torch_reference.py N`` prints the figures of tolerances.py.
"""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mojo_train
import tolerances as tol

torch = pytest.importorskip("torch")

STEPS = tol.STEPS
_SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                       HealthCheck.too_slow])


# ---- hypothesis strategies over the fixed ranges of tolerances.py ------------------------------

def _log_uniform(low, high):
    return st.floats(0.0, 1.0).map(lambda u: float(low * (high / low) ** u))


def _in(bounds):
    return st.floats(*bounds)


def _decay(bounds):
    return st.one_of(st.just(0.0), _log_uniform(*bounds))


_shapes = st.lists(st.integers(*tol.SIZE_RANGE), min_size=1, max_size=tol.MAX_TENSORS)
_clip = st.one_of(st.none(), _in(tol.CLIP_RATIO_RANGE))


@st.composite
def sgd_options(draw):
    nesterov = draw(st.booleans())
    momentum = draw(_in(tol.MOMENTUM_RANGE)) if nesterov else draw(
        st.one_of(st.just(0.0), _in(tol.MOMENTUM_RANGE)))
    dampening = 0.0 if nesterov else draw(st.one_of(st.just(0.0), _in(tol.DAMPENING_RANGE)))
    return {"lr": draw(_log_uniform(*tol.LR_RANGE)), "momentum": momentum, "dampening": dampening,
            "weight_decay": draw(_decay(tol.WEIGHT_DECAY_RANGE)), "nesterov": nesterov,
            "maximize": draw(st.booleans())}


@st.composite
def adam_options(draw, kind):
    decay = tol.ADAM_WEIGHT_DECAY_RANGE if kind == "Adam" else tol.WEIGHT_DECAY_RANGE
    return {"lr": draw(_log_uniform(*tol.LR_RANGE)),
            "betas": (draw(_in(tol.BETA1_RANGE)), draw(_in(tol.BETA2_RANGE))),
            "eps": draw(_log_uniform(*tol.EPS_RANGE)), "weight_decay": draw(_decay(decay)),
            "maximize": draw(st.booleans())}


@st.composite
def cases(draw, kind):
    """(kind, options, sizes, seed, gradient exponent, clip ratio or None)."""
    options = draw(sgd_options() if kind == "SGD" else adam_options(kind))
    return {"kind": kind, "options": options, "sizes": draw(_shapes),
            "seed": draw(st.integers(0, 2**32 - 1)),
            "grad_exp": draw(st.integers(*tol.GRAD_EXP_RANGE)), "clip_ratio": draw(_clip)}


# ---- the data of one case: initial params and the STEPS float32 gradients -----------------------

def case_data(case):
    """Initial params U(-1, 1) and per-step gradients U(-1, 1) * 2**-grad_exp, float32, from the
    seed; max_norm = clip_ratio * the expected total norm of one step's gradients (or None)."""
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    sizes = case["sizes"]
    scale = np.float32(2.0 ** -case["grad_exp"])
    params = [rng.uniform(-1.0, 1.0, n).astype(np.float32) for n in sizes]
    grads = [[rng.uniform(-1.0, 1.0, n).astype(np.float32) * scale for n in sizes]
             for _ in range(STEPS)]
    max_norm = None
    if case["clip_ratio"] is not None:
        max_norm = case["clip_ratio"] * float(scale) * (sum(sizes) / 3.0) ** 0.5
    return params, grads, max_norm


def _flat(arrays):
    return np.concatenate([np.asarray(a, dtype=np.float64).ravel() for a in arrays])


# ---- running ours and torch's --------------------------------------------------------------

def run_ours(case, numeric_mode):
    """STEPS steps through mojo_train: final params, moments and the per-step pre-clip norms."""
    params, grads, max_norm = case_data(case)
    params = [p.copy() for p in params]
    opt = getattr(mojo_train, case["kind"])(params, numeric_mode=numeric_mode, **case["options"])
    norms = [opt.step([x.copy() for x in g], max_norm=max_norm) for g in grads]
    out = {"params": _flat(params), "norms": np.array([n for n in norms if n is not None], float)}
    if case["kind"] == "SGD":
        if opt.exp_avg is not None:
            out["momentum_buffer"] = np.asarray(opt.exp_avg, dtype=np.float64)
    else:
        out["exp_avg"] = np.asarray(opt.exp_avg, dtype=np.float64)
        out["exp_avg_sq"] = np.asarray(opt.exp_avg_sq, dtype=np.float64)
    return out


def run_torch(case, dtype):
    """The same steps through torch.optim in ``dtype`` (its default CPU path), clipping with
    torch.nn.utils.clip_grad_norm_ in that dtype. Also returns each quantity's unit (see
    tolerances.py): G = the largest |effective gradient| seen (after clipping and coupled
    decay), the moments in units of G, params in units of the displacement scale."""
    params, grads, max_norm = case_data(case)
    ps = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in params]
    opt = getattr(torch.optim, case["kind"])(ps, **case["options"])
    decay = case["options"]["weight_decay"] if case["kind"] != "AdamW" else 0.0
    sign = -1.0 if case["options"]["maximize"] else 1.0
    norms, g_unit = [], 0.0
    for g in grads:
        for p, x in zip(ps, g):
            p.grad = torch.tensor(x, dtype=dtype)
        if max_norm is not None:
            norms.append(float(torch.nn.utils.clip_grad_norm_(ps, max_norm)))
        with torch.no_grad():
            g_unit = max(g_unit, max(float((sign * p.grad + decay * p).abs().max()) for p in ps))
        opt.step()
    out = {"params": _flat([p.detach() for p in ps]), "norms": np.array(norms, np.float64)}
    for name in ("momentum_buffer", "exp_avg", "exp_avg_sq"):
        if name in opt.state[ps[0]] and opt.state[ps[0]][name] is not None:
            out[name] = _flat([opt.state[p][name] for p in ps])
    return out, tol.units(case["kind"], case["options"], g_unit)


def compare(ours, ref, units, label):
    """Every quantity the reference has, through the one comparator."""
    assert set(ours) == set(ref), (label, sorted(ours), sorted(ref))
    for name in ref:
        tol.assert_close_to_reference(ours[name], ref[name], "%s %s" % (label, name),
                                      unit=units[name])


# ---- clip_grad_norm_ on its own ------------------------------------------------------------------

@st.composite
def clip_cases(draw):
    """Many tensors of sizes 1..3000, sometimes with one of 2**20 + 7 among them."""
    sizes = draw(st.lists(st.integers(*tol.SIZE_RANGE), min_size=1, max_size=tol.MAX_CLIP_TENSORS))
    if draw(st.booleans()):
        sizes.insert(draw(st.integers(0, len(sizes))), tol.LARGE_TENSOR)
    return {"sizes": sizes, "seed": draw(st.integers(0, 2**32 - 1)),
            "grad_exp": draw(st.integers(*tol.GRAD_EXP_RANGE)),
            "clip_ratio": draw(_in(tol.CLIP_RATIO_RANGE))}


def clip_data(case):
    """Gradients U(-1, 1) * 2**-grad_exp and max_norm = clip_ratio * their expected norm."""
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    scale = np.float32(2.0 ** -case["grad_exp"])
    grads = [rng.uniform(-1.0, 1.0, n).astype(np.float32) * scale for n in case["sizes"]]
    return grads, case["clip_ratio"] * float(scale) * (sum(case["sizes"]) / 3.0) ** 0.5


def clip_ours(case, numeric_mode):
    grads, max_norm = clip_data(case)
    total = mojo_train.clip_grad_norm_(grads, max_norm, numeric_mode=numeric_mode)
    return {"total_norm": np.array([total]), "grads": _flat(grads)}


def clip_torch(case, dtype):
    grads, max_norm = clip_data(case)
    ps = [torch.zeros(g.size, dtype=dtype, requires_grad=True) for g in grads]
    for p, g in zip(ps, grads):
        p.grad = torch.tensor(g, dtype=dtype)
    total = float(torch.nn.utils.clip_grad_norm_(ps, max_norm))
    return {"total_norm": np.array([total]), "grads": _flat([p.grad for p in ps])}


CLIP_UNITS = {"total_norm": 0.0, "grads": 0.0}   # sums of squares and one scaling: relative only


# ---- the tests ----------------------------------------------------------------------------------

KINDS = ("SGD", "Adam", "AdamW")


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=40, **_SETTINGS)
@given(data=st.data())
def test_optimizer_stays_within_the_bound_of_torch_float64_for_50_steps(mode, kind, data):
    case = data.draw(cases(kind), label="case")
    ref, units = run_torch(case, torch.float64)
    compare(run_ours(case, mode.numeric_mode), ref, units, "%r %s" % (mode, kind))


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=25, **_SETTINGS)
@given(data=st.data())
def test_torch_float32_stays_within_the_same_bound(kind, data):
    """Calibration: the bound is one torch's own float32 optimizer also keeps."""
    case = data.draw(cases(kind), label="case")
    ref, units = run_torch(case, torch.float64)
    compare(run_torch(case, torch.float32)[0], ref, units, "torch float32 %s" % kind)


@settings(max_examples=20, **_SETTINGS)
@given(case=clip_cases())
def test_clip_grad_norm_stays_within_the_bound_of_torch_float64(mode, case):
    ref = clip_torch(case, torch.float64)
    compare(clip_ours(case, mode.numeric_mode), ref, CLIP_UNITS, "%r clip_grad_norm_" % (mode,))


@settings(max_examples=15, **_SETTINGS)
@given(case=clip_cases().filter(lambda c: tol.LARGE_TENSOR not in c["sizes"]))
def test_torch_float32_clip_grad_norm_stays_within_the_same_bound(case):
    """Calibration below LARGE_TENSOR (tolerances.py says why not at it)."""
    compare(clip_torch(case, torch.float32), clip_torch(case, torch.float64), CLIP_UNITS,
            "torch float32 clip_grad_norm_")


def test_clip_grad_norm_of_a_large_tensor_among_small_ones_matches_torch_float64(mode):
    case = {"sizes": [3, tol.LARGE_TENSOR, 1, 4096], "seed": 7, "grad_exp": 0, "clip_ratio": 0.5}
    ref = clip_torch(case, torch.float64)
    compare(clip_ours(case, mode.numeric_mode), ref, CLIP_UNITS, "%r clip_grad_norm_ large" % (mode,))


# ---- measuring: PYTHONPATH=. python tests/test_torch_reference.py [cases] ------------------------

def measure(n, numeric_modes=("identical", "deterministic", "fast")):
    """The figures of tolerances.py: worst bound-used per optimizer, implementation, quantity,
    over ``n`` hypothesis-drawn cases (about n/3 per optimizer) and n/10 clip cases ("clip-L":
    with a LARGE_TENSOR among them)."""
    from hypothesis import Phase
    worst = {}

    def note(key, used):
        worst[key] = max(worst.get(key, 0.0), used)

    @settings(max_examples=n, database=None, phases=[Phase.generate], **_SETTINGS)
    @given(data=st.data(), kind=st.sampled_from(KINDS))
    def sample(data, kind):
        case = data.draw(cases(kind))
        ref, units = run_torch(case, torch.float64)
        runs = {"torch float32": run_torch(case, torch.float32)[0]}
        runs.update({"ours " + t: run_ours(case, t) for t in numeric_modes})
        for who, got in runs.items():
            for name in ref:
                note((kind, who, name), tol.bound_used(got[name], ref[name], units[name])[0])

    @settings(max_examples=max(1, n // 10), database=None, phases=[Phase.generate], **_SETTINGS)
    @given(case=clip_cases())
    def sample_clip(case):
        ref = clip_torch(case, torch.float64)
        runs = {"torch float32": clip_torch(case, torch.float32)}
        runs.update({"ours " + t: clip_ours(case, t) for t in numeric_modes})
        kind = "clip" + ("-L" if tol.LARGE_TENSOR in case["sizes"] else "")
        for who, got in runs.items():
            for name in ref:
                note((kind, who, name), tol.bound_used(got[name], ref[name], CLIP_UNITS[name])[0])

    sample()
    sample_clip()
    for key in sorted(worst):
        print("%-6s %-20s %-16s %.3g" % (key + (worst[key],)))


if __name__ == "__main__":
    import sys
    measure(int(sys.argv[1]) if len(sys.argv) > 1 else 200)
