"""Shared test helpers: float32 rounding in pure Python, the contract's arithmetic replayed
element by element (the tests' independent oracle for the identical numeric mode), deterministic
input data, and a byte snapshot of an optimizer's whole state.

Rounding: a binary32 + - * / or sqrt computed in binary64 and then rounded to binary32 is
the correctly rounded binary32 result (53 >= 2*24 + 2, Figueroa 1995), so ``f32(a * b)``
replays one C float operation exactly. An fma is rounded once from the exact rational.
"""
import array
import hashlib
import math
import os
import random
import struct
from fractions import Fraction

# ---- tools ----------------------------------------------------------------------------------
def c_compiler():
    """The C compiler the tests compile small programs with: $CC, cc, gcc or clang, or None."""
    import shutil
    return next((shutil.which(c) for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)


# ---- what a numeric mode promises about subnormals ----------------------------------------
GRADUAL_UNDERFLOW_SKIPS = {
    "approximate": "IEEE-exact arithmetic is not this numeric mode's promise (approximate division, flushed subnormals)",
    "flush_rule": "gradual underflow is not this numeric mode's promise (it flushes by the stated rule of "
                  "native/contracts/ftz.md: tests/test_ftz_rule.py and its cards check that)",
}


def skip_without(mode, *families):
    """Skip (pytest) where the library under test declares it lacks one of ``families`` (the
    mt_features names: "linear", "loss", ...): a family not built for that vendor yet."""
    import pytest
    for family in families:
        if not mode.has(family):
            pytest.skip("this library has no %s (mt_features)" % family)
    return mode


def skip_unless_gradual_underflow(backend):
    """Skip (pytest) where the library under test declares it does not keep subnormals: CUDA's
    fast numeric mode (approximate) and identical_ftz (flush_rule)."""
    import pytest
    for feature, why in GRADUAL_UNDERFLOW_SKIPS.items():
        if backend.has(feature):
            pytest.skip(why)


# ---- float32 rounding ---------------------------------------------------------------------


def f32(x):
    """The float32 nearest to the float ``x`` (round half to even; +-inf where that rounding
    overflows, which struct refuses to pack: the fuzz run of 2026-12-03 met it in RMSNorm's
    exact oracle, r * r * r of a huge reciprocal square root)."""
    try:
        return struct.unpack("<f", struct.pack("<f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def bits(x):
    return struct.unpack("<I", struct.pack("<f", x))[0]


def from_bits(u):
    return struct.unpack("<f", struct.pack("<I", u))[0]


def _next_up(x):
    u = bits(x)
    if x == 0.0:
        return from_bits(1)
    return from_bits(u + 1) if x > 0 else from_bits(u - 1)


def _next_down(x):
    return -_next_up(-x)


def round_f32(q):
    """The float32 nearest to the rational ``q`` (ties to even), for finite in-range q."""
    q = Fraction(q)
    c = f32(float(q))
    best = None
    for cand in (_next_down(c), c, _next_up(c)):
        d = abs(Fraction(cand) - q)
        key = (d, bits(cand) & 1)
        if best is None or key < best[0]:
            best = (key, cand)
    return best[1]


def ulps_apart(a, b):
    """Distance between two finite float32 values of the same sign, in units in the last place."""
    return abs(bits(a) - bits(b))


def fma32(a, b, c):
    if not (math.isfinite(a) and math.isfinite(b) and math.isfinite(c)):
        return f32(a * b + c)                # IEEE's NaN and inf rules: nothing left to round
    q = Fraction(a) * Fraction(b) + Fraction(c)
    if abs(q) >= 2 ** 128 - 2 ** 103:        # at or past the halfway point to 2**128: inf
        return math.copysign(math.inf, q)
    if not q:                                # Fractions have no -0: IEEE's sign of an exact zero
        negative = math.copysign(1.0, a) * math.copysign(1.0, b) < 0 and math.copysign(1.0, c) < 0
        return -0.0 if negative and (a == 0 or b == 0) and c == 0 else 0.0
    return round_f32(q)


# ---- data -----------------------------------------------------------------------------------


def f32_array(n, seed, low=-1.0, high=1.0):
    """``n`` float32 values drawn by Python's own generator (not the library's)."""
    rng = random.Random(seed)
    return array.array("f", (rng.uniform(low, high) for _ in range(n)))


def wide_array(n, seed, low_exp=-14, high_exp=4):
    """``n`` float32 values of random sign and magnitudes spread over 2**low_exp..2**high_exp:
    sums of their squares depend on the order of the fold, so a reordered tree shows."""
    rng = random.Random(seed)
    return array.array("f", (rng.choice((-1.0, 1.0)) * 2.0 ** rng.uniform(low_exp, high_exp)
                             for _ in range(n)))


def thread_counts(mode, counts=(1, 2, 3, 5)):
    """Yields under each of ``counts`` threads for a library with a thread pool (its own count
    restored after), else once (None) under its own launch geometry."""
    lib = mode.backend.lib
    if not mode.has("threads"):
        yield None
        return
    before = lib.mt_num_threads()
    try:
        for n in counts:
            assert lib.mt_set_num_threads(n) == 0
            yield n
    finally:
        assert lib.mt_set_num_threads(before) == 0


def sha(*buffers):
    h = hashlib.sha256()
    for b in buffers:
        h.update(b if isinstance(b, bytes) else raw(b))
    return h.hexdigest()


def raw(x):
    """The bytes of any buffer, torch tensors included (or None)."""
    if x is None:
        return None
    if type(x).__module__.startswith("torch"):
        import torch
        return bytes(x.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist())
    if hasattr(x, "tobytes") and not isinstance(x, memoryview):
        return x.tobytes()
    return memoryview(x).tobytes()


def snapshot(opt, *buffers):
    """Every byte a refused call could have touched: the given buffers (params, grads, ...)
    and the optimizer's params, exp_avg, exp_avg_sq, max_exp_avg_sq, buf_initialized, t, the
    per-tensor steps, per-step reports, every group's hyper-parameters (lr_schedule by
    identity), defaults and accumulation_steps, which load_state_dict sets."""
    state = {"buffers": [raw(b) for b in buffers]}
    if opt is not None:
        state["params"] = [raw(p) for p in opt.params]
        for name in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq", "buf_initialized"):
            state[name] = raw(getattr(opt, name, None))
        for name in ("t", "lr_", "total_norm_", "clip_coef_"):
            state[name] = getattr(opt, name)
        state["steps"] = getattr(opt, "steps", None)
        state["groups"] = [{k: (id(v), v) for k, v in g.items() if k != "params"} for g in opt.param_groups]
        state["group_params"] = [[id(p) for p in g["params"]] for g in opt.param_groups]
        state["defaults"] = {k: (id(v), v) for k, v in opt.defaults.items()}
        state["accumulation_steps"] = opt.accumulation_steps
    return state


# ---- the contract replayed in Python (identical numeric mode) ----------------------------------------

LANES, CHUNK = 128, 4096


def add32(a, b):
    """a + b in float32, a sum past FLT_MAX rounding to +-inf as IEEE does (f32 alone refuses)."""
    s = a + b
    if math.isfinite(s) and abs(s) >= 2.0 ** 128 - 2.0 ** 103:     # at or past the halfway point to 2**128
        return math.copysign(math.inf, s)
    return f32(s)


def canonical(x):
    """x, or the canonical NaN (0x7fc00000 packed) when x is a NaN: the contracts' NaN bits."""
    return float("nan") if x != x else x


def _lane_tree(acc):
    acc = list(acc)
    h = LANES // 2
    while h >= 1:
        for lane in range(h):
            acc[lane] = add32(acc[lane], acc[lane + h])
        h //= 2
    return acc[0]


def _chunk_sumsq(x):
    acc = [0.0] * LANES
    for i, v in enumerate(x):
        acc[i % LANES] = fma32(v, v, acc[i % LANES])
    return _lane_tree(acc)


def _tree_fold(s):
    s = list(s)
    if not s:
        return 0.0
    while len(s) > 1:
        nxt = [add32(s[2 * k], s[2 * k + 1]) for k in range(len(s) // 2)]
        if len(s) % 2:
            nxt.append(s[-1])
        s = nxt
    return s[0]


def _sumsq(x):
    return _tree_fold([_chunk_sumsq(x[c:c + CHUNK]) for c in range(0, len(x), CHUNK)])


def _chunk_sumabs(x):
    acc = [0.0] * LANES
    for i, v in enumerate(x):
        acc[i % LANES] = add32(acc[i % LANES], abs(v))
    return _lane_tree(acc)


def _sumabs(x):
    return _tree_fold([_chunk_sumabs(x[c:c + CHUNK]) for c in range(0, len(x), CHUNK)])


def _maxabs(x):
    m = 0.0
    for v in x:
        if abs(v) > m or v != v:        # a NaN stays, as clip.md's mt_max_abs
            m = abs(v)
    return m


def ref_norms(tensors, norm_type=2.0):
    """(per-tensor norms, total) by the length-only tree of mt_pinned.h (clip.md): the 2-norm
    (finite gradients whose squares stay in range), the 1-norm or the max norm (any gradients)."""
    if norm_type == 2.0:
        norms = [f32(math.sqrt(_sumsq(list(t)))) for t in tensors]
        return norms, f32(math.sqrt(_sumsq(norms)))
    fold = _sumabs if norm_type == 1.0 else _maxabs
    norms = [canonical(fold(list(t))) for t in tensors]
    return norms, canonical(fold(norms))


def ref_clip(grads, max_norm, norm_type=2.0):
    """(total, coef, clipped grads as lists) for the contract's clip (error_if_nonfinite off:
    a non-finite total scales too)."""
    _, total = ref_norms(grads, norm_type)
    coef = f32(f32(max_norm) / f32(total + f32(1e-6)))
    coef = 1.0 if coef >= 1.0 else canonical(coef)
    if coef != 1.0:
        grads = [[canonical(f32(g * coef)) for g in t] for t in grads]
    else:
        grads = [list(t) for t in grads]
    return total, coef, grads


def ref_adam(p, g, m, v, lr, beta1, beta2, eps, wd, maximize, decoupled, bc1, bc2, vmax=None):
    """One step over flat lists; bc1/bc2 are the float32 bias corrections 1 - beta**t. With
    ``vmax`` (max_exp_avg_sq, a list), AMSGrad: vmax = max(vmax, v') (vmax on a tie) and the
    denominator from it."""
    lr, beta1, beta2, eps, wd = (f32(x) for x in (lr, beta1, beta2, eps, wd))
    omb1, omb2 = f32(1.0 - beta1), f32(1.0 - beta2)
    step_size = f32(lr / bc1)
    sqrt_bias2 = f32(math.sqrt(bc2))
    decay = f32(1.0 - f32(lr * wd))
    for i in range(len(p)):
        pv, gi = p[i], g[i]
        if maximize:
            gi = -gi
        if wd != 0.0:
            if decoupled:
                pv = f32(pv * decay)
            else:
                gi = f32(f32(wd * pv) + gi)
        mv = f32(f32(omb1 * f32(gi - m[i])) + m[i])
        vv = f32(f32(omb2 * f32(gi * gi)) + f32(v[i] * beta2))
        if vmax is not None:
            vmax[i] = vv if vv > vmax[i] else vmax[i]
        denom = f32(f32(f32(math.sqrt(vv if vmax is None else vmax[i])) / sqrt_bias2) + eps)
        p[i] = f32(pv - f32(step_size * f32(mv / denom)))
        m[i], v[i] = mv, vv


def ref_sgd(p, g, buf, initialized, lr, momentum, dampening, wd, nesterov, maximize):
    lr, momentum, dampening, wd = (f32(x) for x in (lr, momentum, dampening, wd))
    omd = f32(1.0 - dampening)
    for i in range(len(p)):
        pv, gi = p[i], g[i]
        if maximize:
            gi = -gi
        if wd != 0.0:
            gi = f32(f32(wd * pv) + gi)
        if momentum != 0.0:
            b = f32(f32(omd * gi) + f32(buf[i] * momentum)) if initialized else gi
            buf[i] = b
            gi = f32(f32(momentum * b) + gi) if nesterov else b
        p[i] = f32(f32(-lr * gi) + pv)


# ---- optimizers used across test files and their subprocesses ---------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (class name, keyword arguments); every option of each optimizer appears somewhere.
KINDS = {
    "sgd": ("SGD", dict(lr=0.1)),
    "sgd_momentum": ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.25, weight_decay=0.01)),
    "sgd_nesterov": ("SGD", dict(lr=0.05, momentum=0.8, nesterov=True, weight_decay=0.02, maximize=True)),
    "adam": ("Adam", dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)),
    "adam_maximize": ("Adam", dict(lr=1e-2, maximize=True)),
    "adamw": ("AdamW", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)),
}


def make_optimizer(kind, params, numeric_mode, **overrides):
    import mojo_train
    cls, kwargs = KINDS[kind]
    kwargs = dict(kwargs, **overrides)
    return getattr(mojo_train, cls)(params, numeric_mode=numeric_mode, **kwargs)


def state_buffers(opt):
    """The optimizer's state arrays that exist (exp_avg, exp_avg_sq, buf_initialized)."""
    return [getattr(opt, n) for n in ("exp_avg", "exp_avg_sq", "buf_initialized")
            if getattr(opt, n, None) is not None]


def grads_for_step(sizes, t, scale=3.0):
    """The gradients of step ``t`` (one-based), the same in every process."""
    return [f32_array(n, 7919 * t + j, -scale, scale) for j, n in enumerate(sizes)]


def params_for(sizes, seed=0):
    return [f32_array(n, 104729 * seed + j) for j, n in enumerate(sizes)]


EQUAL = (64, 64, 64, 64)   # four tensors of one size: any one may stand where another is expected


def equal_grads(container, t):
    """Step ``t``'s gradients for EQUAL as mojo_train.Arrays (``container="Array"``) or array.arrays."""
    from mojo_train import Array
    values = [g.tolist() for g in grads_for_step(EQUAL, t)]
    return [Array.from_list(v) for v in values] if container == "Array" else [array.array("f", v) for v in values]


def flat(tensors):
    """The values of a list of float32 buffers (or of lists of floats), concatenated."""
    out = []
    for t in tensors:
        out.extend(memoryview(t).cast("B").cast("f").tolist() if not isinstance(t, list) else t)
    return out


def digest(opt):
    """sha256 of params, state and t."""
    return sha(*(list(opt.params) + state_buffers(opt) + [str(opt.t).encode()]))


def portable_calls(code):
    """The names called in C source `code`, its comments and CUDA device code's unguarded
    sequences (`#if MT_MATH_UNGUARDED` .. `#else`: the GPU's own instructions, never a CPU's)
    left out: what a section of the pinned headers calls on every vendor."""
    import re
    code = re.sub(r"/\*.*?\*/", "", code, flags=re.S)
    code = re.sub(r"#if MT_MATH_UNGUARDED\n.*?#else\n", "", code, flags=re.S)
    assert "double" not in code
    return set(re.findall(r"\b([A-Za-z_]\w*)\s*\(", code))


def python_path(*first):
    """PYTHONPATH for a child interpreter: ``first`` ahead of the caller's own PYTHONPATH, which
    may hold what the package needs (cffi lives in a --target folder on the GPU machine)."""
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(p) for p in first] + ([rest] if rest else []))


# The header's status codes (mojo_train.h enum mt_error_code), for tests that call C directly.
from mojo_train._native import STATUS as _STATUS  # noqa: E402
EINVAL, ENONFINITE = _STATUS["einval"], _STATUS["enonfinite"]


def skip_without_c_library(compiler):
    """Skip (a stated chance of the setup) when ``compiler`` -- an argument list such as
    ``["aarch64-linux-gnu-gcc"]`` or ``["clang", "--target=aarch64-linux-gnu"]`` -- finds no C
    library headers for its target: Debian's cross compilers recommend, not require, them
    (libc6-dev-<arch>-cross; .ci/run installs it)."""
    import subprocess
    import pytest
    done = subprocess.run(list(compiler) + ["-fsyntax-only", "-x", "c", "-"], input="#include <stdint.h>\n",
                          capture_output=True, text=True)
    if done.returncode != 0 and ("No such file" in done.stderr or "file not found" in done.stderr):
        pytest.skip("%s finds no C library headers for its target (Debian: libc6-dev-*-cross)" % " ".join(compiler))
