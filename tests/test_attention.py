"""scaled_dot_product_attention and its backward through the public API (mojo_train.attention,
re-exported by mojo_train and mojo_train.nn).

Contract under test: native/contracts/attention.md. In the identical numeric mode every output
is the contract's arithmetic step by step (replayed here in Python with float32 roundings, the
pinned exp and log compiled from mt_pinned.h): the online softmax over key blocks of 64, the
backward from out and lse, dk and dv chained over the group's query heads and rows; fully
masked rows give out 0, lse -inf and no gradient (as torch 2.13's attention; a plain softmax: NaN); masks broadcast,
is_causal and a bool tril mask, a float mask of 0/-inf and a bool mask give the same bits;
every refusal names its argument and writes nothing; the bytes do not depend on the thread
count; every numeric mode stays within tests/tolerances.py's bound of torch in float64.
``PYTHONPATH=. python tests/test_attention.py N`` prints the bound figures of tolerances.py.
"""
import math
import os
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train._native import ffi
from mojo_train.random import DropoutKey, Generator

import tolerances as tol
from _helpers import c_compiler, f32, fma32
from _layer_helpers import HYPOTHESIS, assert_c_refusals_write_nothing, assert_nonfinite_refused, \
    digests_over_thread_counts, print_family_figures

np = pytest.importorskip("numpy")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SDPA, SDPA_BWD = mt.scaled_dot_product_attention, mt.scaled_dot_product_attention_backward
NEG_INF = float("-inf")


# ---- data and calls ------------------------------------------------------------------------------

def inputs(b, h, hkv, tq, tk, d, seed, qk=1.0):
    """q, k, v, dout as float32 numpy arrays: q, k U(-qk, qk), v, dout U(-1, 1)."""
    rng = np.random.Generator(np.random.PCG64(seed))
    u = lambda shape, r: rng.uniform(-r, r, shape).astype(np.float32)   # noqa: E731
    return {"q": u((b, h, tq, d), qk), "k": u((b, hkv, tk, d), qk), "v": u((b, hkv, tk, d), 1.0),
            "dout": u((b, h, tq, d), 1.0)}


def run(mode, x, **kw):
    """(out, lse, dq, dk, dv) as numpy arrays, the forward's out and lse fed to the backward."""
    kw.setdefault("enable_gqa", x["q"].shape[1] != x["k"].shape[1])
    out, lse = SDPA(x["q"], x["k"], x["v"], return_lse=True, numeric_mode=mode, **kw)
    grads = SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out, lse, numeric_mode=mode, **kw)
    # reshape: on Python >= 3.12 numpy takes an Array through its buffer, which memoryview
    # cannot give zeros in its shape (an empty Array reads as 1-d: Array.memview)
    return tuple(np.asarray(a).reshape(a.shape) for a in (out, lse) + tuple(grads))


def same(xs, ys):
    return all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(xs, ys))


# ---- the contract replayed in Python -------------------------------------------------------------

@pytest.fixture(scope="module")
def pinned(tmp_path_factory):
    """mt_expf and mt_logf of mt_pinned.h, compiled alone (the replay's transcendental steps)."""
    cc = c_compiler()
    if not cc:
        pytest.skip("no C compiler: mt_pinned.h's exp and log are not compiled here")
    work = tmp_path_factory.mktemp("pinned")
    src, lib = work / "probe.c", work / "libprobe.so"
    src.write_text('#include "mt_pinned.h"\nfloat probe_exp(float x) { return mt_expf(x); }\n'
                   "float probe_log(float x) { return mt_logf(x); }\n")
    subprocess.run([cc, "-std=c99", "-O2", "-ffp-contract=off", "-fPIC", "-shared", "-I",
                    os.path.join(REPO, "native", "include"), str(src), "-o", str(lib)], check=True)
    import cffi
    pffi = cffi.FFI()
    pffi.cdef("float probe_exp(float x); float probe_log(float x);")
    return pffi.dlopen(str(lib))


def amax(m, s):
    """mt_attn_max: NaN is the greatest."""
    return s if (s > m or s != s) else m


def chain(us, vs):
    acc = 0.0
    for u, w in zip(us, vs):
        acc = fma32(u, w, acc)
    return acc


class Replay:
    """attention.md step by step on Python lists; keep(b, h, i, j) and add(b, h, i, j) are the masks."""

    def __init__(self, x, scale, pinned, keep=None, add=None, causal=False, drop=None):
        self.q, self.k, self.v, self.dout = (x[n].tolist() for n in ("q", "k", "v", "dout"))
        self.b, self.h, self.tq, self.d = x["q"].shape
        self.hkv, self.tk = x["k"].shape[1], x["k"].shape[2]
        self.scale, self.ex, self.lg = f32(scale), pinned.probe_exp, pinned.probe_log
        self.keep, self.add, self.causal = keep, add, causal
        self.drop = drop or (lambda b, h, i, j, x: x)          # attention.md "Dropout": x of pair (b, h, i, j)

    def kv(self, b, h):
        return b, h // (self.h // self.hkv)

    def score(self, b, h, i, j):
        g = self.kv(b, h)
        s = f32(chain(self.q[b][h][i], self.k[g[0]][g[1]][j]) * self.scale)
        if self.add is not None:
            s = f32(s + self.add(b, h, i, j))
        if (self.keep is not None and not self.keep(b, h, i, j)) or (self.causal and j > i):
            s = NEG_INF
        return s

    def forward_row(self, b, h, i):
        m, l, acc = NEG_INF, 0.0, [0.0] * self.d
        vrows = self.v[self.kv(b, h)[0]][self.kv(b, h)[1]]
        for j0 in range(0, self.tk, 64):
            s = {j: self.score(b, h, i, j) for j in range(j0, min(j0 + 64, self.tk))}
            live = [j for j in s if s[j] != NEG_INF]
            if not live:
                continue
            mb = NEG_INF
            for j in live:
                mb = amax(mb, s[j])
            mnew = amax(m, mb)
            alpha = self.ex(f32(m - mnew))
            p = {j: self.ex(f32(s[j] - mnew)) for j in live}
            l = f32(l * alpha)
            for j in live:
                l = f32(l + p[j])
            acc = [f32(a * alpha) for a in acc]
            for j in live:
                pj = self.drop(b, h, i, j, p[j])
                acc = [fma32(pj, vd, a) for vd, a in zip(vrows[j], acc)]
            m = mnew
        out = [0.0 if l == 0 else f32(a / l) for a in acc]
        return out, f32(m + self.lg(l))

    def run(self):
        out = [[[self.forward_row(b, h, i) for i in range(self.tq)] for h in range(self.h)] for b in range(self.b)]
        o = [[[r[0] for r in rows] for rows in heads] for heads in out]
        lse = [[[r[1] for r in rows] for rows in heads] for heads in out]
        return o, lse, self.backward(o, lse)

    def pair(self, b, h, i, j, o, lse):
        """(p, ds) of a live pair, or None."""
        s = self.score(b, h, i, j)
        if s == NEG_INF:
            return None
        g = self.kv(b, h)
        p = self.ex(f32(s - lse[b][h][i]))
        dp = self.drop(b, h, i, j, chain(self.dout[b][h][i], self.v[g[0]][g[1]][j]))
        delta = chain(self.dout[b][h][i], o[b][h][i])
        return self.drop(b, h, i, j, p), f32(p * f32(dp - delta))

    def backward(self, o, lse):
        d, group = self.d, self.h // self.hkv
        pairs = {(b, h, i, j): self.pair(b, h, i, j, o, lse) for b in range(self.b) for h in range(self.h)
                 for i in range(self.tq) for j in range(self.tk)}
        dq = [[[[0.0] * d for _ in range(self.tq)] for _ in range(self.h)] for _ in range(self.b)]
        dk = [[[[0.0] * d for _ in range(self.tk)] for _ in range(self.hkv)] for _ in range(self.b)]
        dv = [[[[0.0] * d for _ in range(self.tk)] for _ in range(self.hkv)] for _ in range(self.b)]
        for (b, h, i, j), pr in sorted(pairs.items()):          # (h, i) ascending per key: dk, dv
            if pr is not None:
                g = h // group
                dv[b][g][j] = [fma32(pr[0], x, a) for x, a in zip(self.dout[b][h][i], dv[b][g][j])]
                dk[b][g][j] = [fma32(pr[1], x, a) for x, a in zip(self.q[b][h][i], dk[b][g][j])]
                dq[b][h][i] = [fma32(pr[1], x, a) for x, a in zip(self.k[b][g][j], dq[b][h][i])]
        scaled = lambda t: [[[[f32(self.scale * a) for a in r] for r in rows] for rows in heads] for heads in t]  # noqa
        return scaled(dq), scaled(dk), dv


def flat(nested):
    return np.array(nested, dtype=np.float64).astype(np.float32).ravel()


# (sizes, qk range, options): two key blocks and a partial third, GQA, causal with Tq != Tk, bool
# masks with dead rows, a float mask with -inf, large logits (mt_expf's full range), a negative scale.
REPLAYS = [
    ((1, 2, 1, 5, 70, 3), 1.0, {"is_causal": True}),
    ((1, 3, 3, 4, 130, 2), 1.0, {"mask": "bool"}),
    ((2, 2, 2, 3, 66, 5), 1.0, {"mask": "float"}),
    ((1, 2, 2, 3, 70, 4), 30.0, {}),
    ((1, 4, 2, 2, 65, 3), 1.0, {"scale": -0.75}),
]


def _mask_for(kind, shape, seed):
    rng = np.random.Generator(np.random.PCG64(seed))
    b, h, tq, tk = shape
    keep = rng.uniform(size=(tq, tk)) < 0.6
    keep[0, :] = False                                   # a fully masked row
    if kind == "bool":
        return keep
    return np.where(keep, rng.uniform(-3, 3, (b, h, tq, tk)), -np.inf).astype(np.float32)


def _replay_mask(opts, shape, seed, kw):
    """(keep, add) of the Replay for a case's mask option (also put into kw as attn_mask)."""
    if "mask" not in opts:
        return None, None
    mask = _mask_for(opts["mask"], shape, seed)
    kw["attn_mask"] = mask
    if mask.dtype == np.bool_:
        return (lambda bb, hh, i, j: bool(mask[i, j])), None
    return None, (lambda bb, hh, i, j: float(mask[bb, hh, i, j]))


@pytest.mark.parametrize("n", range(len(REPLAYS)), ids=[str(r[0]) for r in REPLAYS])
def test_every_output_is_the_contracts_arithmetic_step_by_step(attention_identical, pinned, n):
    (b, h, hkv, tq, tk, d), qk, opts = REPLAYS[n]
    x = inputs(b, h, hkv, tq, tk, d, 100 + n, qk)
    kw = {"is_causal": opts.get("is_causal", False), "scale": opts.get("scale")}
    keep, add = _replay_mask(opts, (b, h, tq, tk), n, kw)
    got = run("identical", x, **kw)
    scale = opts.get("scale", 1.0 / math.sqrt(d))
    o, lse, (dq, dk, dv) = Replay(x, scale, pinned, keep, add, kw["is_causal"]).run()
    for name, ours, ref in zip(("out", "lse", "dq", "dk", "dv"), got, (o, lse, dq, dk, dv)):
        assert np.array_equal(ours.ravel().view(np.uint32), flat(ref).view(np.uint32)), name


# ---- dropout (attention.md, "Dropout") -----------------------------------------------------------

def _replay_drop(key):
    """The Replay's dropout of a DropoutKey: pair (b, h, i, j) kept iff the uniform Generator(seed)
    draws at its stream element is >= p, then x * (1 / (1 - p)) in float32, else +0."""
    b_, h_, tq, tk = key.shape
    u = np.asarray(Generator(key.seed).uniform((key.size,), stream=key.stream, offset=key.offset))
    scale = f32(1.0 / f32(1.0 - key.p))

    def drop(b, h, i, j, x):
        return f32(x * scale) if u[((b * h_ + h) * tq + i) * tk + j] >= key.p else 0.0
    return drop


DROPOUT_REPLAYS = [
    ((1, 2, 1, 5, 70, 3), 0.3, {"is_causal": True}),
    ((2, 2, 2, 3, 66, 5), 0.5, {"mask": "float"}),
    ((1, 3, 3, 4, 130, 2), 0.125, {"mask": "bool"}),
]


@pytest.mark.parametrize("n", range(len(DROPOUT_REPLAYS)), ids=[str(r[0]) for r in DROPOUT_REPLAYS])
def test_dropout_is_the_contracts_arithmetic_step_by_step(attention_identical, pinned, n):
    (b, h, hkv, tq, tk, d), p, opts = DROPOUT_REPLAYS[n]
    x = inputs(b, h, hkv, tq, tk, d, 300 + n)
    kw = {"is_causal": opts.get("is_causal", False), "enable_gqa": h != hkv}
    keep, add = _replay_mask(opts, (b, h, tq, tk), n, kw)
    g = Generator(77 + n)
    g.next_stream()                                       # a stream other than 0
    out, lse, key = SDPA(x["q"], x["k"], x["v"], return_lse=True, dropout_p=p, generator=g, **kw)
    assert (key.seed, key.stream, key.offset, key.p, key.shape) == (77 + n, 1, 0, f32(p), (b, h, tq, tk))
    assert g.counter == 2                                 # the call took one stream
    grads = SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out, lse, dropout_key=key, **kw)
    got = [np.asarray(a).ravel() for a in (out, lse) + tuple(grads)]
    ref = Replay(x, 1.0 / math.sqrt(d), pinned, keep, add, kw["is_causal"], _replay_drop(key)).run()
    o, l_, (dq, dk, dv) = ref
    for name, ours, want in zip(("out", "lse", "dq", "dk", "dv"), got, (o, l_, dq, dk, dv)):
        assert np.array_equal(ours.view(np.uint32), flat(want).view(np.uint32)), name


def test_dropout_zero_with_a_generator_is_attention_without_dropout_and_draws_nothing(attention_mode):
    x, g = inputs(1, 2, 2, 5, 70, 4, 5), Generator(3)
    plain = run(attention_mode.numeric_mode, x)
    out, lse = SDPA(x["q"], x["k"], x["v"], return_lse=True, dropout_p=0.0, generator=g,
                    numeric_mode=attention_mode.numeric_mode)
    assert same((np.asarray(out), np.asarray(lse)), plain[:2]) and g.counter == 0


def test_dropout_draws_a_new_stream_each_call_and_the_key_replays_it(attention_mode):
    m, x, g = attention_mode.numeric_mode, inputs(1, 2, 2, 4, 9, 3, 6), Generator(9)
    out1, lse1, key1 = SDPA(x["q"], x["k"], x["v"], return_lse=True, dropout_p=0.4, generator=g, numeric_mode=m)
    out2, _, key2 = SDPA(x["q"], x["k"], x["v"], return_lse=True, dropout_p=0.4, generator=g, numeric_mode=m)
    assert (key1.stream, key2.stream) == (0, 1) and np.asarray(out1).tobytes() != np.asarray(out2).tobytes()
    again = SDPA(x["q"], x["k"], x["v"], dropout_p=0.4, generator=Generator(9), numeric_mode=m)
    assert np.asarray(again).tobytes() == np.asarray(out1).tobytes()
    a = SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out1, lse1, dropout_key=key1, numeric_mode=m)
    b = SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out1, lse1, dropout_p=0.4, dropout_key=key1, numeric_mode=m)
    assert all(np.asarray(u).tobytes() == np.asarray(w).tobytes() for u, w in zip(a, b))


def test_a_refused_dropout_call_does_not_advance_the_generator(attention_mode):
    x, g = inputs(1, 1, 1, 3, 4, 2, 8), Generator(4)
    x["q"][0, 0, 1, 1] = float("nan")
    with pytest.raises(ValueError, match="q holds NaN or inf"):
        SDPA(x["q"], x["k"], x["v"], dropout_p=0.5, generator=g, numeric_mode=attention_mode.numeric_mode)
    assert g.counter == 0


def test_dropout_matches_torchs_formula_in_float64_on_the_same_mask(attention_mode):
    """torch's dropout(softmax(s)) @ v and its autograd in float64, with our kept pairs as its
    mask: the stated attention tolerance of tests/tolerances.py holds for every output."""
    torch = pytest.importorskip("torch")
    m, (b, h, tq, tk, d), p = attention_mode.numeric_mode, (2, 3, 7, 70, 8), 0.35
    x, g = inputs(b, h, h, tq, tk, d, 12), Generator(21)
    out, lse, key = SDPA(x["q"], x["k"], x["v"], return_lse=True, dropout_p=p, generator=g, numeric_mode=m)
    dq, dk, dv = SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out, lse, dropout_key=key, numeric_mode=m)
    u = np.asarray(Generator(21).uniform((key.size,), stream=key.stream)).reshape(b, h, tq, tk)
    kept = torch.tensor((u >= np.float32(p)).astype(np.float64))
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=n != "dout") for n, a in x.items()}
    probs = torch.softmax(t["q"] @ t["k"].transpose(-1, -2) / math.sqrt(d), dim=-1)
    ref = (probs * kept / (1.0 - float(np.float32(p)))) @ t["v"]
    ref.backward(t["dout"])
    # tests/tolerances.py's attention units, every weight p and |v| scaled by 1 / (1 - p): a dropped
    # attention's every term is a plain one's times at most that scale, twice (p~ = p s, dp~ = dp s)
    sd = 1.0 / (1.0 - float(np.float32(p)))
    units = tol.attention_units(x["q"], x["k"], x["v"] * sd, x["dout"], np.asarray(ref.detach()),
                                probs.detach().numpy() * sd, np.ones((b, h, tq, tk), bool), 1 / math.sqrt(d), 0.0)
    for name, ours, want in (("out", out, ref), ("dq", dq, t["q"].grad), ("dk", dk, t["k"].grad),
                             ("dv", dv, t["v"].grad)):
        ours, want = np.asarray(ours, dtype=np.float64), want.detach().numpy()
        bound = tol.ATOL * units[name] + tol.RTOL * np.abs(want)
        assert (np.abs(ours - want) <= bound).all(), (name, (np.abs(ours - want) / bound).max())
    assert 0.25 < 1.0 - kept.mean().item() < 0.45          # about p of the pairs dropped


def test_a_score_that_overflows_makes_its_row_the_canonical_nan(attention_identical):
    x = inputs(1, 1, 1, 3, 5, 2, 7)
    x["q"][0, 0, 1] = 3e19
    x["k"][0, 0, 2] = 3e19                               # q1 . k2 = 1.8e39: +inf
    out, lse = SDPA(x["q"], x["k"], x["v"], return_lse=True, numeric_mode="identical")
    out, lse = np.asarray(out), np.asarray(lse)
    assert (out[0, 0, 1].view(np.uint32) == 0x7fc00000).all() and lse[0, 0, 1].view(np.uint32) == 0x7fc00000
    assert np.isfinite(out[0, 0, [0, 2]]).all() and np.isfinite(lse[0, 0, [0, 2]]).all()
    with pytest.raises(ValueError, match="out holds NaN or inf"):
        SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out, lse, numeric_mode="identical")


# ---- fully masked rows, masks and their equivalences ---------------------------------------------

def test_a_fully_masked_row_gives_zero_out_minus_inf_lse_and_no_gradient(attention_mode):
    m = attention_mode.numeric_mode
    x = inputs(1, 2, 2, 6, 70, 8, 11)
    mask = np.ones((6, 70), dtype=bool)
    mask[2] = False
    out, lse, dq, dk, dv = run(m, x, attn_mask=mask)
    assert (out[:, :, 2].view(np.uint32) == 0).all() and (lse[:, :, 2] == -np.inf).all()
    assert (dq[:, :, 2].view(np.uint32) == 0).all() and np.isfinite(out).all()
    y = {k: v.copy() for k, v in x.items()}
    y["q"][:, :, 2] = 5.0
    y["dout"][:, :, 2] = -7.0                            # the dead row's inputs take part in nothing
    assert same(run(m, y, attn_mask=mask)[3:], (dk, dv))


def test_torchs_attention_agrees_on_a_fully_masked_row_where_a_plain_softmax_is_nan():
    """torch 2.13's math and CPU flash backends give the contract's answer (out 0, dq 0); the
    formula softmax(s) @ v, and torch's math backend before its safe softmax, give NaN."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q, k, v = (torch.tensor(inputs(1, 1, 1, 3, 3, 4, 19)[n], dtype=torch.float64, requires_grad=True)
               for n in ("q", "k", "v"))
    mask = torch.tensor([[True, True, False], [False, False, False], [True, False, True]])
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION):
        q.grad = None
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        out.backward(torch.ones_like(out))
        assert (out[0, 0, 1] == 0).all() and (q.grad[0, 0, 1] == 0).all(), backend
    s = (q @ k.transpose(-1, -2)).masked_fill(~mask, float("-inf"))
    assert torch.isnan(torch.softmax(s, dim=-1)[0, 0, 1]).all()


def test_no_keys_at_all_is_every_row_fully_masked(attention_mode):
    x = inputs(2, 2, 1, 3, 0, 5, 12)
    out, lse, dq, dk, dv = run(attention_mode.numeric_mode, x)
    assert out.shape == (2, 2, 3, 5) and (out == 0).all() and (lse == -np.inf).all() and (dq == 0).all()
    assert dk.shape == dv.shape == (2, 1, 0, 5)


def test_no_query_rows_give_zero_key_gradients(attention_mode):
    x = inputs(1, 2, 2, 0, 9, 4, 13)
    out, lse, dq, dk, dv = run(attention_mode.numeric_mode, x)
    assert out.shape == (1, 2, 0, 4) and lse.shape == (1, 2, 0) and (dk == 0).all() and (dv == 0).all()


def test_a_call_without_pairs_takes_a_mask_whose_strides_would_reach_past_2_60(attention_mode):
    """B = 0: no pair reads the mask, so its strides are not formed (those of a mask (0, 1, 2^31,
    2^31), which holds no memory, reach 2^62), as the same call without a mask."""
    q = mt.Array.empty((0, 1, 2 ** 31, 8), "float32")
    mask = mt.Array.empty((0, 1, 2 ** 31, 2 ** 31), "float32")
    out, lse = SDPA(q, q, q, attn_mask=mask, return_lse=True, numeric_mode=attention_mode.numeric_mode)
    grads = SDPA_BWD(q, q, q, q, out, lse, attn_mask=mask, numeric_mode=attention_mode.numeric_mode)
    assert out.shape == (0, 1, 2 ** 31, 8) and lse.shape == (0, 1, 2 ** 31)
    assert [tuple(g.shape) for g in grads] == [tuple(q.shape)] * 3


def test_a_numpy_scalar_scale_is_its_value_and_warns_of_nothing(attention_mode):
    import warnings
    x = inputs(1, 2, 2, 5, 9, 4, 16)
    want = SDPA(x["q"], x["k"], x["v"], scale=0.5, numeric_mode=attention_mode.numeric_mode)
    with warnings.catch_warnings():
        warnings.simplefilter("error")      # comparing np.float32 with 1e39 warned of an overflow
        got = SDPA(x["q"], x["k"], x["v"], scale=np.float32(0.5), numeric_mode=attention_mode.numeric_mode)
        with pytest.raises(ValueError, match="scale must be finite"):
            SDPA(x["q"], x["k"], x["v"], scale=np.float32("nan"), numeric_mode=attention_mode.numeric_mode)
    assert same([np.asarray(got)], [np.asarray(want)])


def test_a_refusals_reason_is_the_one_that_applies(attention_mode):
    """The dropout_p and shape messages say why only where it is why (a negative p does not
    'drop every pair'; a wrong dout is not 'the forward's lse')."""
    x = inputs(1, 2, 2, 3, 4, 5, 17)
    m = attention_mode.numeric_mode
    messages = {}
    for p in (-0.1, 1.0):
        with pytest.raises(ValueError) as info:
            SDPA(x["q"], x["k"], x["v"], dropout_p=p, generator=Generator(1), numeric_mode=m)
        messages[p] = str(info.value)
    assert "1 would drop every pair" in messages[1.0] and "would drop" not in messages[-0.1], messages
    out, lse = SDPA(x["q"], x["k"], x["v"], return_lse=True, numeric_mode=m)
    with pytest.raises(ValueError) as info:
        SDPA_BWD(x["dout"][:, :1].copy(), x["q"], x["k"], x["v"], out, lse, numeric_mode=m)
    assert "dout must have shape" in str(info.value) and "lse" not in str(info.value), str(info.value)
    with pytest.raises(ValueError, match=r"lse must have shape .* \(the forward's with return_lse=True\)"):
        SDPA_BWD(x["dout"], x["q"], x["k"], x["v"], out, np.zeros((1, 2), np.float32), numeric_mode=m)


def test_is_causal_is_a_top_left_tril_mask_bit_for_bit(attention_mode):
    for tq, tk in ((40, 100), (100, 40), (70, 70)):
        x = inputs(1, 2, 2, tq, tk, 16, tq + tk)
        tril = np.tril(np.ones((tq, tk), dtype=bool))
        assert same(run(attention_mode.numeric_mode, x, is_causal=True),
                    run(attention_mode.numeric_mode, x, attn_mask=tril)), (tq, tk)


def test_a_float_mask_of_zero_and_minus_inf_is_the_bool_mask(attention_mode):
    x = inputs(1, 3, 3, 20, 90, 12, 14)
    keep = np.random.Generator(np.random.PCG64(3)).uniform(size=(20, 90)) < 0.5
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    assert same(run(attention_mode.numeric_mode, x, attn_mask=keep),
                run(attention_mode.numeric_mode, x, attn_mask=additive))


@pytest.mark.parametrize("shape", [(70,), (9, 70), (3, 1, 70), (1, 3, 9, 70), (2, 1, 1, 70), (2, 3, 9, 1)])
def test_a_broadcast_mask_gives_the_bits_of_its_expanded_copy(attention_mode, shape):
    x = inputs(2, 3, 3, 9, 70, 6, 15)
    mask = np.random.Generator(np.random.PCG64(4)).uniform(-2, 2, shape).astype(np.float32)
    full = np.ascontiguousarray(np.broadcast_to(mask, (2, 3, 9, 70)))
    assert same(run(attention_mode.numeric_mode, x, attn_mask=mask),
                run(attention_mode.numeric_mode, x, attn_mask=full))


def test_many_key_blocks_for_one_kv_head_give_the_oracles_bits(attention_identical, monkeypatch):
    """11 key blocks (the last one partial) for one (batch, kv head) pair and its two query heads:
    on a GPU the dk/dv kernel's blocks carry dq's chains from key block to key block, nearly each
    waiting on the one before (attention.md, "dq by relay"). Causal and not, every output equals
    the cpu oracle's bytes, and causal equals its explicit top-left tril mask."""
    m, vendor = attention_identical.numeric_mode, attention_identical.vendor
    x = inputs(1, 2, 1, 700, 700, 40, 23)
    for kw in ({"is_causal": True}, {}):
        got = run(m, x, **kw)
        monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
        want = run(m, x, **kw)
        monkeypatch.setenv("MOJO_TRAIN_VENDOR", vendor)
        assert same(got, want), (vendor, kw)
    assert same(run(m, x, is_causal=True), run(m, x, attn_mask=np.tril(np.ones((700, 700), dtype=bool))))


def test_grouped_query_heads_read_their_kv_head(attention_mode):
    """out and dq are per query head: GQA gives the bits of k and v repeated per head."""
    m = attention_mode.numeric_mode
    x = inputs(2, 6, 2, 30, 80, 10, 16)
    rep = dict(x, k=np.repeat(x["k"], 3, axis=1), v=np.repeat(x["v"], 3, axis=1))
    got, plain = run(m, x, is_causal=True), run(m, rep, is_causal=True)
    assert same(got[:3], plain[:3])
    for ours, per_head in zip(got[3:], plain[3:]):      # one chain over the group's heads vs their sum
        np.testing.assert_allclose(ours, per_head.reshape(2, 2, 3, 80, 10).sum(axis=2), rtol=1e-5, atol=1e-6)


def test_the_default_scale_is_one_over_sqrt_d_correctly_rounded(attention_mode):
    for d in range(1, 129):
        f = np.float32(1.0 / math.sqrt(d))
        lo, hi = np.nextafter(f, np.float32(0)), np.nextafter(f, np.float32(np.inf))
        # f is correctly rounded iff 1/d lies strictly between the squares of the midpoints around f
        mid_lo, mid_hi = (Fraction(float(lo)) + Fraction(float(f))) / 2, (Fraction(float(f)) + Fraction(float(hi))) / 2
        assert mid_lo ** 2 < Fraction(1, d) < mid_hi ** 2, d
    x = inputs(1, 1, 1, 5, 7, 6, 17)
    assert same(run(attention_mode.numeric_mode, x), run(attention_mode.numeric_mode, x,
                                                          scale=float(np.float32(1 / math.sqrt(6)))))


def test_torch_tensors_and_a_torch_bool_mask_are_read_as_numpy_ones(attention_mode):
    """Without return_lse the forward returns out alone, the bits of the return_lse call's."""
    torch = pytest.importorskip("torch")
    m = attention_mode.numeric_mode
    x = inputs(1, 2, 2, 5, 8, 4, 18)
    keep = np.random.Generator(np.random.PCG64(5)).uniform(size=(5, 8)) < 0.7
    t = {n: torch.tensor(a, requires_grad=True) for n, a in x.items()}
    out = SDPA(t["q"], t["k"], t["v"], attn_mask=torch.tensor(keep), numeric_mode=m)
    assert same([np.asarray(out)], run(m, x, attn_mask=keep)[:1])


# ---- refusals ------------------------------------------------------------------------------------

def _refusals():
    """(function, args, keywords, exception, text of the message)."""
    x = inputs(1, 2, 2, 3, 4, 5, 1)
    q, k, v, do = x["q"], x["k"], x["v"], x["dout"]
    out, lse = np.zeros_like(q), np.zeros((1, 2, 3), np.float32)
    f, b = SDPA, SDPA_BWD
    return [
        (f, (q[0], k, v), {}, ValueError, "q must be 4-D"),
        (f, (q, k, np.ascontiguousarray(v[:, :, :3])), {}, ValueError, "v must have k's shape"),
        (f, (q, np.ascontiguousarray(k[..., :4]), np.ascontiguousarray(v[..., :4])), {}, ValueError, "k must be (B, Hkv, Tk, D) with q's"),
        (f, (np.zeros((1, 1, 2, 129), np.float32),) * 3, {}, ValueError, "D must be in [1, 128]"),
        (f, (q, k[:, :1].copy(), v[:, :1].copy()), {}, ValueError, "pass enable_gqa=True"),
        (f, (np.zeros((1, 3, 3, 5), np.float32), k, v), {"enable_gqa": True}, ValueError, "must be a multiple"),
        (f, (q, k, v), {"is_causal": True, "attn_mask": np.ones((3, 4), bool)}, ValueError,
         "is_causal=True and attn_mask were both given"),
        (f, (q, k, v), {"attn_mask": np.ones((3, 4), np.int32)}, TypeError, "attn_mask has dtype int32"),
        (f, (q, k, v), {"attn_mask": np.ones((3, 4), np.float64)}, TypeError, "attn_mask has dtype float64"),
        (f, (q, k, v), {"attn_mask": np.ones((4, 3), bool)}, ValueError, "does not broadcast"),
        (f, (q, k, v), {"attn_mask": np.ones((1, 1, 1, 3, 4), bool)}, ValueError, "does not broadcast"),
        (f, (q, k, v), {"attn_mask": np.ones((4, 3), bool).T}, ValueError, "attn_mask must be C-contiguous"),
        (f, (q, k, v), {"dropout_p": 0.1}, ValueError, "dropout_p > 0 needs generator=mojo_train.Generator(seed)"),
        (f, (q, k, v), {"dropout_p": -0.1}, ValueError, "dropout_p must be in [0, 1) after rounding"),
        (f, (q, k, v), {"dropout_p": 1.0, "generator": Generator(1)}, ValueError, "dropout_p must be in [0, 1)"),
        (f, (q, k, v), {"dropout_p": True}, TypeError, "dropout_p must be a real number"),
        (f, (q, k, v), {"generator": 3}, TypeError, "generator must be a mojo_train.Generator"),
        (f, (q, k, v), {"scale": float("nan")}, ValueError, "scale must be finite"),
        (f, (q, k, v), {"scale": 1e39}, ValueError, "scale must be finite"),
        (f, (q, k, v), {"scale": "0.5"}, TypeError, "scale must be a real number"),
        (f, (q, k, v), {"is_causal": 1}, TypeError, "is_causal must be True or False"),
        (f, (q, k, v), {"return_lse": None}, TypeError, "return_lse must be True or False"),
        (f, (q.astype(np.float64), k, v), {}, TypeError, "q has dtype float64"),
        (b, (do, q, k, v, out, lse[0]), {}, ValueError, "lse must have shape (1, 2, 3)"),
        (b, (do[:, :1].copy(), q, k, v, out, lse), {}, ValueError, "dout must have shape (1, 2, 3, 5)"),
        (b, (do, q, k, v, out, lse), {"dropout_p": 0.5}, ValueError, "dropout_p > 0 needs dropout_key="),
        (b, (do, q, k, v, out, lse), {"dropout_key": (1, 2, 0, 0.5)}, TypeError, "dropout_key must be the forward's"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(1, 2, 0, 0.5, 24, (1, 2, 3, 3))}, ValueError,
         "dropout_key is of pairs (1, 2, 3, 3)"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(1, 2, 0, 0.5, 24, 24)}, TypeError,
         "dropout_key.shape must be None or a tuple of ints"),
        (b, (do, q, k, v, out, lse), {"dropout_p": 0.25, "dropout_key": DropoutKey(1, 2, 0, 0.5, 24, (1, 2, 3, 4))},
         ValueError, "dropout_p is 0.25 but dropout_key's p is 0.5"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(1, 2, 0, 0.3, 24, (1, 2, 3, 4))}, ValueError,
         "dropout_key's p must be a float32 in (0, 1)"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(1, 2, 0, 0.5, 25, None)}, ValueError,
         "dropout_key covers 25 pairs"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(-1, 2, 0, 0.5, 24, None)}, ValueError,
         "dropout_key.seed must be in [0, 2**64)"),
        (b, (do, q, k, v, out, lse), {"dropout_key": DropoutKey(1, 2**64, 0, 0.5, 24, None)}, ValueError,
         "dropout_key.stream must be in [0, 2**64)"),
        (f, (q, k, v), {"dropout_p": 10 ** 400, "generator": Generator(1)}, ValueError, "dropout_p must be in [0, 1)"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("n", range(len(REFUSALS)), ids=["%s: %s" % (r[0].__name__, r[4]) for r in REFUSALS])
def test_a_bad_argument_is_refused_naming_it(attention_mode, n):
    fn, args, kw, exc, text = REFUSALS[n]
    with pytest.raises(exc) as info:
        fn(*args, numeric_mode=attention_mode.numeric_mode, **kw)
    assert str(info.value).startswith("mojo_train.%s: " % fn.__name__) and text in str(info.value), str(info.value)


def _fwd(m, d):
    return SDPA(d["q"], d["k"], d["v"], numeric_mode=m)


def _bwd(m, d):
    return SDPA_BWD(d["dout"], d["q"], d["k"], d["v"], d["out"], d["lse"], numeric_mode=m)


NONFINITE = [("scaled_dot_product_attention", n, _fwd) for n in ("q", "k", "v")] + \
            [("scaled_dot_product_attention_backward", n, _bwd) for n in ("dout", "q", "k", "v", "out")]


def _saved_inputs(m):
    x = inputs(1, 2, 2, 9, 70, 8, 21)
    out, lse = SDPA(x["q"], x["k"], x["v"], return_lse=True, numeric_mode=m)
    return dict(x, out=np.array(out), lse=np.array(lse))


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("n", range(len(NONFINITE)), ids=["%s %s" % c[:2] for c in NONFINITE])
def test_a_nonfinite_input_is_refused_by_name_and_inputs_are_untouched(attention_mode, n, bad):
    assert_nonfinite_refused(*NONFINITE[n], attention_mode.numeric_mode, _saved_inputs(attention_mode.numeric_mode),
                             bad)


@pytest.mark.parametrize("bad", ["nan", "inf"])
def test_lse_and_a_float_mask_take_minus_inf_but_not_nan_or_plus_inf(attention_mode, bad):
    m = attention_mode.numeric_mode
    d = _saved_inputs(m)
    mask = np.zeros((9, 70), np.float32)
    mask[3, 5] = -np.inf
    SDPA(d["q"], d["k"], d["v"], attn_mask=mask, numeric_mode=m)              # -inf: a masked pair
    mask[4, 6] = float(bad)
    with pytest.raises(ValueError, match=r"^mojo_train.scaled_dot_product_attention: attn_mask holds NaN or \+inf"):
        SDPA(d["q"], d["k"], d["v"], attn_mask=mask, numeric_mode=m)
    d["lse"][0, 1, 2] = float(bad)
    before = {k: v.tobytes() for k, v in d.items()}
    with pytest.raises(ValueError, match=r"lse holds NaN or \+inf"):
        _bwd(m, d)
    assert {k: v.tobytes() for k, v in d.items()} == before


def _c_cases(lib, keep):
    """(text of the message, call(outputs)) of the C entries; inputs stay alive in ``keep``."""
    x = inputs(1, 1, 1, 2, 3, 4, 22)
    keep += [x[n] for n in ("q", "k", "v", "dout")] + [np.zeros(2, np.float32), np.ones(6, np.uint8)]
    q, k, v, do, lse, mb = (ffi.cast("float *", a.ctypes.data) for a in keep[-6:])
    N, inf = ffi.NULL, float("inf")
    nodrop = (0.0, 0, 0, 0)                                                  # dropout_p, seed, stream, offset
    fw = lambda o, *a: lib.mt_attention_forward(o[0], o[1], q, k, v, *(a + nodrop[len(a) - 14:]))   # noqa: E731
    bw = lambda o, *a: lib.mt_attention_backward(o[0], o[1], o[2], do, q, k, v, do, lse,            # noqa: E731
                                                 *(a + nodrop[len(a) - 14:]))
    size = (1, 1, 1, 2, 3, 4)
    return [
        ("D must be in [1, 128]", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 1, 1, 2, 3, 0)),
        ("D must be in [1, 128]", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 1, 1, 2, 3, 129)),
        ("H must be a multiple of Hkv", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 3, 2, 2, 3, 4)),
        ("Hkv must be >= 1", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 1, 0, 2, 3, 4)),
        ("Tq must be >= 0", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 1, 1, -2, 3, 4)),
        ("too large", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 2**40, 1, 1, 2**20, 3, 4)),
        # B*H is capped though Tq = Tk = 0 leaves every tensor empty (the message says so)
        ("too large (B*H, B*Hkv, each tensor and B*H*Tq*Tk", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 2**62, 2, 2, 0,
                                                                         0, 4)),
        ("scale must be finite", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, inf, *size)),
        ("is_causal must be 0 or 1", lambda o: fw(o, N, 0, 0, 0, 0, 0, 2, 1.0, *size)),
        ("mask_kind must be", lambda o: fw(o, mb, 3, 0, 0, 3, 1, 0, 1.0, *size)),
        ("is_causal=1 needs mask_kind MT_ATTENTION_MASK_NONE", lambda o: fw(o, mb, 1, 0, 0, 3, 1, 1, 1.0, *size)),
        ("mask must be NULL", lambda o: fw(o, mb, 0, 0, 0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("mask is NULL", lambda o: fw(o, N, 1, 0, 0, 3, 1, 0, 1.0, *size)),
        ("mask_si must be >= 0", lambda o: fw(o, mb, 1, 0, 0, -3, 1, 0, 1.0, *size)),
        # each stride's reach below 2^60, their sum past it (the mask's byte count would overflow)
        ("reach past 2^60 elements together", lambda o: fw(o, mb, 2, 2**59, 2**59, 2**59, 2**59, 0, 1.0,
                                                           2, 2, 2, 2, 2, 4)),
        ("out is NULL", lambda o: lib.mt_attention_forward(N, o[1], q, k, v, N, 0, 0, 0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("q is NULL", lambda o: lib.mt_attention_forward(o[0], o[1], N, k, v, N, 0, 0, 0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("out and q overlap", lambda o: lib.mt_attention_forward(q, o[1], q, k, v, N, 0, 0, 0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("lse is NULL", lambda o: lib.mt_attention_backward(o[0], o[1], o[2], do, q, k, v, do, N, N, 0, 0, 0, 0,
                                                            0, 0, 1.0, *size, *nodrop)),
        ("dk and dv overlap", lambda o: lib.mt_attention_backward(o[0], o[1], o[1], do, q, k, v, do, lse, N, 0, 0,
                                                                  0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("dq and dout overlap", lambda o: lib.mt_attention_backward(do, o[1], o[2], do, q, k, v, do, lse, N, 0, 0,
                                                                    0, 0, 0, 0, 1.0, *size, *nodrop)),
        ("H must be >= 1", lambda o: bw(o, N, 0, 0, 0, 0, 0, 0, 1.0, 1, 0, 1, 2, 3, 4)),
        ("dropout_p: p must be in [0, 1)", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, *size, 1.0, 1, 2, 0)),
        ("dropout_p: p must be in [0, 1)", lambda o: bw(o, N, 0, 0, 0, 0, 0, 0, 1.0, *size, -0.5, 1, 2, 0)),
        ("dropout: offset + n must be <= 2^64 - 1", lambda o: fw(o, N, 0, 0, 0, 0, 0, 0, 1.0, *size, 0.5, 1, 2,
                                                                 2**64 - 5)),
    ]


def test_the_c_entries_refuse_bad_arguments_writing_nothing(attention_mode):
    keep = []
    assert_c_refusals_write_nothing(attention_mode.backend.lib, _c_cases(attention_mode.backend.lib, keep))


# ---- determinism -------------------------------------------------------------------------------------

def test_outputs_do_not_depend_on_the_thread_count(attention_mode):
    x = inputs(2, 4, 2, 150, 140, 40, 31)
    mask = np.random.Generator(np.random.PCG64(6)).uniform(size=(2, 1, 150, 140)) < 0.8

    def digest():
        import hashlib
        h = hashlib.sha256()
        for kw in ({"is_causal": True}, {"attn_mask": mask}):
            for a in run(attention_mode.numeric_mode, x, **kw):
                h.update(a.tobytes())
        return h.hexdigest()
    assert len(digests_over_thread_counts(attention_mode, digest)) == 1


_DIGEST_CHILD = """
import hashlib, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_attention import inputs, run
h = hashlib.sha256()
x = inputs(1, 4, 2, 70, 130, 40, 41)   # 2 (b, kv head) items: fused on 1 thread, two passes on 2
for kw in ({}, {"is_causal": True}):
    for a in run("identical", x, **kw):
        h.update(a.tobytes())
print(h.hexdigest())
"""


def test_the_vector_kernels_give_the_portable_codes_bits(attention_identical):
    """The oracle's AVX-512 loops and its portable C (MOJO_TRAIN_CPU_GEMM=scalar forces them, as
    for the GEMM), each with one thread (the fused backward) and two (two passes)."""
    digests = set()
    for kernel in ("avx512", "avx2", "scalar"):
        for threads in ("1", "2"):
            env = dict(os.environ, MOJO_TRAIN_CPU_GEMM=kernel, MOJO_TRAIN_NUM_THREADS=threads,
                       MOJO_TRAIN_VENDOR=attention_identical.vendor,
                       PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
            child = subprocess.run([sys.executable, "-c", _DIGEST_CHILD, os.path.dirname(__file__)], env=env,
                                   capture_output=True, text=True)
            assert child.returncode == 0, child.stderr
            digests.add(child.stdout.strip())
    assert len(digests) == 1, digests


# ---- torch in float64 (tests/tolerances.py) ------------------------------------------------------------

@st.composite
def attention_cases(draw):
    h, hkv = draw(st.sampled_from(tol.ATT_HEADS))
    case = {"b": draw(st.integers(*tol.ATT_BATCH_RANGE)), "h": h, "hkv": hkv,
            "tq": draw(st.integers(*tol.ATT_T_RANGE)), "tk": draw(st.integers(*tol.ATT_T_RANGE)),
            "d": draw(st.integers(*tol.ATT_D_RANGE)), "exp": draw(st.integers(*tol.ATT_LOGIT_EXP_RANGE)),
            "mask": draw(st.sampled_from(tol.ATT_MASKS)), "seed": draw(st.integers(0, 2**32 - 1))}
    return _fit(case)


def _fit(case):
    """Halve the longest of Tq, Tk, D until the case is within tol.ATT_ELEMENTS."""
    while case["b"] * case["h"] * case["tq"] * case["tk"] * case["d"] > tol.ATT_ELEMENTS:
        key = max(("tq", "tk", "d"), key=lambda n: case[n])
        case[key] = max(1, case[key] // 2)
    return case


def _case_inputs(case):
    x = inputs(case["b"], case["h"], case["hkv"], case["tq"], case["tk"], case["d"], case["seed"],
               2.0 ** case["exp"])
    rng = np.random.Generator(np.random.PCG64(case["seed"] + 1))
    kw, shape = {}, (case["b"], 1, case["tq"], case["tk"])
    if case["mask"] == "causal":
        kw["is_causal"] = True
    elif case["mask"] == "bool":
        kw["attn_mask"] = rng.uniform(size=shape) < 0.7
    elif case["mask"] == "float":
        kw["attn_mask"] = np.where(rng.uniform(size=shape) < 0.8, rng.uniform(-4, 4, shape), -np.inf).astype(np.float32)
    return x, kw


def _torch64(torch, x, kw, group):
    """out, lse, dq, dk, dv, p, live of torch's math formulation in float64 (autograd)."""
    t = {n: torch.tensor(a, dtype=torch.float64, requires_grad=n != "dout") for n, a in x.items()}
    k, v = (t[n].repeat_interleave(group, dim=1) for n in ("k", "v"))
    d = x["q"].shape[-1]
    s = (t["q"] @ k.transpose(-1, -2)) * float(np.float32(1 / math.sqrt(d)))
    tq, tk = s.shape[-2:]
    live = torch.ones(s.shape, dtype=torch.bool)
    if kw.get("is_causal"):
        live = live & torch.ones(tq, tk, dtype=torch.bool).tril()
    mask = kw.get("attn_mask")
    if mask is not None and mask.dtype == np.bool_:
        live = live & torch.tensor(mask)
    elif mask is not None:
        live = live & torch.tensor(mask != -np.inf)
        s = s + torch.tensor(np.where(mask == -np.inf, 0, mask), dtype=torch.float64)
    s = s.masked_fill(~live, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    dead = ~live.any(dim=-1, keepdim=True)               # a fully masked row: p = 0 (NaN in softmax)
    p = torch.softmax(s.masked_fill(dead, 0.0), dim=-1) * live
    out = p @ v
    out.backward(t["dout"])
    return [a.detach().numpy() for a in (out, lse, t["q"].grad, t["k"].grad, t["v"].grad, p)] + [live.numpy()]


def _torch32(torch, x, kw, group):
    """out, lse, dq, dk, dv of torch in float32: its default attention, lse as logsumexp of its
    float32 scores (its attention returns none)."""
    t = {n: torch.tensor(a, requires_grad=n != "dout") for n, a in x.items()}
    mask = kw.get("attn_mask")
    tmask = None if mask is None else torch.tensor(mask)
    out = torch.nn.functional.scaled_dot_product_attention(t["q"], t["k"], t["v"], attn_mask=tmask,
                                                           is_causal=kw.get("is_causal", False), enable_gqa=group > 1)
    out.backward(t["dout"])
    s = (t["q"] @ t["k"].repeat_interleave(group, dim=1).transpose(-1, -2)).detach() * (1 / math.sqrt(x["q"].shape[-1]))
    if kw.get("is_causal"):
        s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    elif tmask is not None:
        s = s.masked_fill(~tmask, float("-inf")) if tmask.dtype == torch.bool else s + tmask
    return [a.detach().numpy() for a in (out, torch.logsumexp(s, dim=-1), t["q"].grad, t["k"].grad, t["v"].grad)]


def attention_vs_torch(case, numeric_mode, dtype=None, floors=False):
    """{output: (ours or torch's in dtype, torch float64, unit)}; lse over rows with a live key;
    with ``floors``, each tuple ends with the output's floor in a flushing mode as well."""
    torch = pytest.importorskip("torch")
    x, kw = _case_inputs(case)
    group = case["h"] // case["hkv"]
    out, lse, dq, dk, dv, p, live = _torch64(torch, x, kw, group)
    if dtype is None:
        got = dict(zip(("out", "lse", "dq", "dk", "dv"), run(numeric_mode, x, **kw)))
    else:
        got = dict(zip(("out", "lse", "dq", "dk", "dv"), _torch32(torch, x, kw, group)))
    mask = kw.get("attn_mask")
    mask_abs = 0.0 if mask is None or mask.dtype == np.bool_ else np.abs(np.where(mask == -np.inf, 0, mask))
    units = tol.attention_units(x["q"], x["k"], x["v"], x["dout"], out, p, live,
                                1 / math.sqrt(case["d"]), mask_abs)
    floors = tol.attention_flush_floors(x["q"], x["k"], x["v"], x["dout"], out, p, live, 1 / math.sqrt(case["d"]))
    ref = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    pick = {"lse": live.any(axis=-1)}                     # -inf on fully masked rows (tested apart)
    result = {}
    for name in got:
        sel = pick.get(name)
        ours, want = got[name], ref[name]
        unit, floor = (np.broadcast_to(a[name], ref[name].shape) for a in (units, floors))
        if sel is not None:
            ours, want, unit, floor = ours[sel], want[sel], unit[sel], floor[sel]
        result[name] = (ours, want, unit.ravel(), floor.ravel()) if floors else (ours, want, unit.ravel())
    return result


@settings(max_examples=25, **HYPOTHESIS)
@given(case=attention_cases())
@example(case={"b": 2, "h": 1, "hkv": 1, "tq": 2, "tk": 4, "d": 1, "exp": 3, "mask": "none", "seed": 0})  # flushed dk, dv
@example(case={"b": 2, "h": 1, "hkv": 1, "tq": 1, "tk": 14, "d": 2, "exp": 3, "mask": "none", "seed": 0})  # flushed p, dk normal
def test_attention_stays_within_the_bound_of_torch_float64(attention_mode, case):
    """Within the bound of torch's float64 (tests/tolerances.py); in a mode that flushes, each
    output's floor is the flush's own error carried through (attention_flush_floors)."""
    outputs = attention_vs_torch(case, attention_mode.numeric_mode, floors=True)
    flushes = tol.floor_of_the_mode_under_test() == tol.FLUSHED_GRID_AT_ZERO
    for name, (ours, ref, unit, floor) in outputs.items():
        tol.assert_close_to_reference(ours, ref, "%r attention %r: %s" % (attention_mode, case, name), unit=unit,
                                      floor=floor if flushes else None)


def test_a_comparisons_floor_near_zero_is_the_grid_of_the_mode_under_test(attention_mode):
    """conftest.py's mode fixtures hand the mode to tolerances.py: a mode that declares it flushes
    (identical_ftz's rule, a GPU fast mode's approximate arithmetic) floors its comparisons at
    2^-126 (its grid at zero), the others at 2^-149; a result 2^-130 from float64's passes the
    first and fails the second."""
    flushes = attention_mode.has("flush_rule") or attention_mode.has("approximate")
    assert tol.floor_of_the_mode_under_test() == (2.0 ** -126 if flushes else 2.0 ** -149)
    if flushes:
        tol.assert_close_to_reference([0.0], [2.0 ** -130], "flushed", unit=0.0)
    else:
        with pytest.raises(AssertionError, match="outside the torch bound"):
            tol.assert_close_to_reference([0.0], [2.0 ** -130], "subnormal", unit=0.0)


def _figures_case(rng):
    h, hkv = rng.choice(tol.ATT_HEADS)
    return _fit({"b": rng.randint(*tol.ATT_BATCH_RANGE), "h": h, "hkv": hkv, "tq": rng.randint(*tol.ATT_T_RANGE),
                 "tk": rng.randint(*tol.ATT_T_RANGE), "d": rng.randint(*tol.ATT_D_RANGE),
                 "exp": rng.randint(*tol.ATT_LOGIT_EXP_RANGE), "mask": rng.choice(tol.ATT_MASKS),
                 "seed": rng.getrandbits(32)})


if __name__ == "__main__":   # worst share of the bound used per output: ours (identical, fast), torch float32
    print_family_figures("attention", _figures_case, attention_vs_torch, int(sys.argv[1]) if len(sys.argv) > 1 else 200)


def test_a_call_without_a_mask_ignores_its_mask_strides(identical):
    """With mask_kind NONE the strides are not checked (no mask is read): any values give the
    bits of zeros, and no vendor's index arithmetic multiplies them (INT64_MAX overflowed there
    before 2026-12-05, a sanitizer's finding)."""
    if not identical.has("attention"):
        pytest.skip("this library has no attention (mt_features)")
    from mojo_train._native import ffi
    lib, B, H, Hkv, T, D = identical.backend.lib, 1, 6, 2, 3, 2
    vals = lambda count, s: [float(((i * 7 + s) * 13) % 17) / 8.0 - 1.0 for i in range(count)]
    q, k, v = (ffi.new("float[]", vals(n, s)) for n, s in ((B * H * T * D, 1), (B * Hkv * T * D, 2),
                                                          (B * Hkv * T * D, 3)))
    outs = []
    for strides in ((0, 0, 0, 0), (36, 2**63 - 1, 2, 1)):
        out, lse = ffi.new("float[]", B * H * T * D), ffi.new("float[]", B * H * T)
        assert lib.mt_attention_forward(out, lse, q, k, v, ffi.NULL, 0, *strides, 1, 0.5, B, H, Hkv, T, T, D,
                                        0.0, 0, 0, 0) == 0
        outs.append(bytes(ffi.buffer(out)) + bytes(ffi.buffer(lse)))
    assert outs[0] == outs[1]
