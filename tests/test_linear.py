"""linear and mlp_inference_sessions through the public API (mojo_train.linear, re-exported by
mojo_train and mojo_train.nn); ReLU's tests wait in the marked block at the end.

Contract under test: native/contracts/linear.md. Every refusal (wrong dtype, shape, size,
pointer; a NaN or inf in any input, named) writes no output; the results' bytes do not
depend on the thread count, on the CPU's GEMM kernel (AVX-512, AVX2, scalar) or on the
alignment of device buffers; in the identical numeric mode each GEMM output is the fma chain over its
index in ascending order (replayed here in exact rational arithmetic), and contractions over
rows (dweight, dbias) follow the token rule -- per-leaf results combined by the pairwise
tree, which is also the exactness of gradient accumulation over aligned microbatches; every
numeric mode stays within tests/tolerances.py's bound of torch in float64; mlp_inference_sessions is
the composition of the layers and ignores how rows are split.
``PYTHONPATH=. python tests/test_linear.py N`` prints the bound figures of tolerances.py.
"""
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train import Array, nn
from mojo_train._native import ffi

import tolerances as tol
from _helpers import EINVAL, ENONFINITE, REPO, bits, f32, fma32
from _layer_helpers import LEAF, SENTINEL, assert_c_refusals_write_nothing, assert_nonfinite_refused, c_in, \
    assert_within_bound, device_copy_at, digests_over_thread_counts, mat, need_device, print_family_figures, \
    rows_of, same_bits, token_tree, values
from _layer_helpers import HYPOTHESIS, outputs_sha as sha


# ---- the contract replayed in Python -----------------------------------------------------------

def chain(us, vs):
    """acc = fma(u_p, v_p, acc) from +0.0 in ascending p, each fma rounded once."""
    acc = 0.0
    for u, v in zip(us, vs):
        acc = fma32(u, v, acc)
    return acc


# ---- refusals: the Python layer --------------------------------------------------------------

def _refusals():
    """(function, args, keywords, exception, text of the message)."""
    a, w, b, dc = mat((4, 3), 1), mat((5, 3), 2), mat((5,), 3), mat((4, 5), 4)
    w2, b2 = mat((2, 5), 7), mat((2,), 8)
    f64 = memoryview(bytearray(8 * 12)).cast("d", (4, 3))
    strided = memoryview(bytearray(4 * 24)).cast("f", (4, 6))[::2]
    lf, lb, mlp = mt.linear_forward, mt.linear_backward, mt.mlp_inference_sessions
    return [
        (lf, (f64, w), {}, TypeError, "a has dtype float64"),
        (lf, (a, mat((5, 4), 2)), {}, ValueError, "K=3"),
        (lf, (a, mat((3, 5), 2)), {}, ValueError, "looks transposed: pass a contiguous copy of its transpose"),
        (lf, (a, mat((15,), 2)), {}, ValueError, "weight must be 2-D"),
        (lf, (a, w, mat((4,), 3)), {}, ValueError, "bias must have shape (5,)"),
        (lf, (mat((), 1), w), {}, ValueError, "at least one dimension"),
        (lf, (strided, mat((5, 6), 2)), {}, ValueError, "C-contiguous"),
        (lb, (mat((4, 4), 4), a, w), {}, ValueError, "dc must have shape (4, 5)"),
        (lb, (dc, a, w), {"need_bias_grad": 1}, TypeError, "need_bias_grad must be True or False"),
        (mlp, (a, w, b, w2, b2), {}, TypeError, "inputs must be a list"),
        (mlp, ([a, mat((2, 4), 9)], w, b, w2, b2), {}, ValueError, "inputs[1] is (2, 4) but weight1 takes width 3"),
        (mlp, ([a], w, b, mat((2, 4), 7), b2), {}, ValueError, "weight1 has hidden=5"),
        (mlp, ([a], w, b, w2, mat((3,), 8)), {}, ValueError, "bias2 must have shape (2,)"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("i", range(len(REFUSALS)), ids=["%s: %s" % (r[0].__name__, r[4]) for r in REFUSALS])
def test_a_bad_argument_is_refused_naming_it(linear_mode, i):
    fn, args, kwargs, exc, text = REFUSALS[i]
    with pytest.raises(exc) as info:
        fn(*args, numeric_mode=linear_mode.numeric_mode, **kwargs)
    assert "mojo_train.%s" % fn.__name__ in str(info.value) and text in str(info.value)


def _lf(m, d):
    return mt.linear_forward(d["a"], d["weight"], d["bias"], numeric_mode=m)


def _lb(m, d):
    return mt.linear_backward(d["dc"], d["a"], d["weight"], need_bias_grad=True, numeric_mode=m)


NONFINITE = [("linear_forward", arg, _lf) for arg in ("a", "weight", "bias")] + \
            [("linear_backward", arg, _lb) for arg in ("dc", "a", "weight")]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("i", range(len(NONFINITE)), ids=["%s %s" % c[:2] for c in NONFINITE])
def test_a_nonfinite_input_is_refused_by_name_and_inputs_are_untouched(linear_mode, i, bad):
    d = {"a": mat((37, 300), 1), "weight": mat((5, 300), 2), "bias": mat((5,), 3), "dc": mat((37, 5), 4)}
    assert_nonfinite_refused(*NONFINITE[i], linear_mode.numeric_mode, d, bad)


# ---- refusals: the C entries write nothing ---------------------------------------------------

def _c_cases(lib, keep):
    """(text of the message, call(outputs)); the inputs stay alive in ``keep``."""
    keep += [mat(shape, seed) for seed, shape in enumerate(((6, 4), (3, 4), (3,), (6, 3)))]
    a, w, b, dc = (c_in(v) for v in keep)
    N = ffi.NULL
    return [
        ("m must be >= 0", lambda o: lib.mt_linear_forward(o[0], a, w, N, -1, 3, 4)),
        ("k must be >= 0", lambda o: lib.mt_linear_forward(o[0], a, w, N, 6, 3, -4)),
        ("too large", lambda o: lib.mt_linear_forward(o[0], a, w, N, 2**40, 3, 2**40)),
        ("out is NULL", lambda o: lib.mt_linear_forward(N, a, w, N, 6, 3, 4)),
        ("a is NULL", lambda o: lib.mt_linear_forward(o[0], N, w, b, 6, 3, 4)),
        ("weight is NULL", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], dc, a, N, 6, 3, 4)),
        ("dc is NULL", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], N, a, w, 6, 3, 4)),
        ("n must be >= 0", lambda o: lib.mt_linear_backward(o[0], o[1], o[2], dc, a, w, 6, -3, 4)),
    ]


def test_the_c_entries_refuse_bad_sizes_and_pointers_writing_nothing(linear_mode):
    keep = []
    assert_c_refusals_write_nothing(linear_mode.backend.lib, _c_cases(linear_mode.backend.lib, keep))


def test_the_c_entries_refuse_a_nonfinite_input_before_writing_any_output(linear_mode):
    lib = linear_mode.backend.lib
    a, w, dc = mat((6, 4), 1), mat((3, 4), 2), mat((6, 3), 4)
    wr = w.reshape(-1)
    wr[11] = float("inf")
    outs = [ffi.new("float[]", [SENTINEL] * n) for n in (24, 12, 3)]
    assert lib.mt_linear_backward(outs[0], outs[1], outs[2], c_in(dc), c_in(a), c_in(wr), 6, 3, 4) == ENONFINITE
    assert "weight holds NaN or inf" in ffi.string(lib.mt_last_error()).decode()
    assert all(o[i] == SENTINEL for o, n in zip(outs, (24, 12, 3)) for i in range(n))


def test_empty_shapes_are_answered_without_reading_anything(linear_mode):
    m = linear_mode.numeric_mode
    out = mt.linear_forward(mat((0, 3), 1), mat((4, 3), 2), numeric_mode=m)
    assert out.shape == (0, 4)
    out = mt.linear_forward(mat((2, 0), 1), mat((3, 0), 2), mat((3,), 3), numeric_mode=m)
    assert values(out) == values(mat((3,), 3)) * 2             # empty chains: +0.0 + bias
    da, dw, db = mt.linear_backward(mat((0, 3), 1), mat((0, 2), 2), mat((3, 2), 3),
                                    need_bias_grad=True, numeric_mode=m)
    assert da.shape == (0, 2) and values(dw) == [0.0] * 6 and values(db) == [0.0] * 3
    assert all(bits(v) == 0 for v in values(dw) + values(db))  # +0.0, never -0.0
    assert mt.mlp_inference_sessions([], mat((4, 3), 1), None, mat((2, 4), 2), None, numeric_mode=m).shape == (0, 2)


def test_leading_dimensions_are_rows_and_skipped_gradients_are_none(linear_mode):
    m = linear_mode.numeric_mode
    a3, w, b = mat((2, 3, 5), 161), mat((4, 5), 162), mat((4,), 163)
    a2 = a3.reshape(6, 5)
    out = mt.linear_forward(a3, w, b, numeric_mode=m)
    assert out.shape == (2, 3, 4) and sha(out) == sha(mt.linear_forward(a2, w, b, numeric_mode=m))
    one = mt.linear_forward(mat((5,), 164), w, numeric_mode=m)
    assert one.shape == (4,) and sha(one) == sha(mt.linear_forward(mat((1, 5), 164), w, numeric_mode=m))
    dc3 = mat((2, 3, 4), 165)
    da, dw = mt.linear_backward(dc3, a3, w, numeric_mode=m)
    da2, dw2, db2 = mt.linear_backward(dc3.reshape(6, 4), a2, w, need_bias_grad=True, numeric_mode=m)
    assert da.shape == (2, 3, 5) and sha(da, dw) == sha(da2, dw2)
    none, dw3, db3 = mt.linear_backward(dc3, a3, w, need_input_grad=False, need_bias_grad=True, numeric_mode=m)
    assert none is None and sha(dw3, db3) == sha(dw2, db2)
    assert mt.linear_backward(dc3, a3, w, need_weight_grad=False, numeric_mode=m)[1] is None


# ---- linear: the chains (identical numeric mode) -------------------------------------------------------

def test_linear_forward_outputs_are_fma_chains_over_k_in_ascending_order(linear_identical):
    m, n, k = 5, 7, 300
    a, w, b = mat((m, k), 11, wide=True), mat((n, k), 12, wide=True), mat((n,), 13)
    out = values(mt.linear_forward(a, w, b, numeric_mode="identical"))
    nob = values(mt.linear_forward(a, w, numeric_mode="identical"))
    av, wv, bv = values(a), values(w), values(b)
    reversed_differs = False
    for i, j in ((0, 0), (4, 6), (2, 3), (3, 1)):
        row, col = av[i * k:(i + 1) * k], wv[j * k:(j + 1) * k]
        want = chain(row, col)
        assert bits(nob[i * n + j]) == bits(want)
        assert bits(out[i * n + j]) == bits(f32(want + bv[j]))
        reversed_differs |= bits(chain(row[::-1], col[::-1])) != bits(want)
    assert reversed_differs, "these inputs cannot tell the chain's order"


def test_linear_backward_da_is_the_chain_over_n_and_dweight_the_chain_over_rows(linear_identical):
    m, n, k = 40, 67, 9
    dc, a, w = mat((m, n), 21, wide=True), mat((m, k), 22, wide=True), mat((n, k), 23, wide=True)
    da, dw, db = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    dcv, av, wv = values(dc), values(a), values(w)
    for i, p in ((0, 0), (39, 8), (17, 4)):
        want = chain(dcv[i * n:(i + 1) * n], [wv[j * k + p] for j in range(n)])
        assert bits(values(da)[i * k + p]) == bits(want)
    for j, p in ((0, 0), (66, 8), (30, 5)):
        want = chain([dcv[i * n + j] for i in range(m)], [av[i * k + p] for i in range(m)])
        assert bits(values(dw)[j * k + p]) == bits(want)
    for j in (0, 13, 66):
        acc = 0.0
        for i in range(m):
            acc = f32(acc + dcv[i * n + j])
        assert bits(values(db)[j]) == bits(acc)


# 34 leaves: a GPU folds more than 32 leaf partials in two passes of its tree.
@pytest.mark.parametrize("m", [3 * LEAF - 324, 6 * LEAF + 3, 33 * LEAF + 5])
def test_dweight_and_dbias_are_per_leaf_results_met_in_the_pairwise_tree(linear_identical, m):
    n, k = 5, 3
    dc, a, w = mat((m, n), 31, wide=True), mat((m, k), 32, wide=True), mat((n, k), 33)
    da, dw, db = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    leaves = [(r0, min(r0 + LEAF, m)) for r0 in range(0, m, LEAF)]
    parts = [mt.linear_backward(rows_of(dc, r0, r1), rows_of(a, r0, r1), w, need_bias_grad=True,
                                numeric_mode="identical") for r0, r1 in leaves]
    assert same_bits(values(dw), token_tree([values(p[1]) for p in parts]))
    assert same_bits(values(db), token_tree([values(p[2]) for p in parts]))
    assert same_bits(values(da), sum((values(p[0]) for p in parts), []))
    if len(parts) >= 4:                 # from four leaves on, a left-to-right fold is another tree
        serial = values(parts[0][1])
        for p in parts[1:]:
            serial = [f32(s + v) for s, v in zip(serial, values(p[1]))]
        assert not same_bits(serial, values(dw)), "these inputs cannot tell the tree from a serial fold"


def test_gradients_of_aligned_microbatches_add_up_to_the_full_batch_exactly(linear_identical):
    """Two microbatches of 2048 rows (two leaves each) are the tree's two halves."""
    m, n, k = 4 * LEAF, 6, 4
    dc, a, w = mat((m, n), 41, wide=True), mat((m, k), 42, wide=True), mat((n, k), 43)
    full = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical")
    halves = [mt.linear_backward(rows_of(dc, r0, r0 + m // 2), rows_of(a, r0, r0 + m // 2), w,
                                 need_bias_grad=True, numeric_mode="identical") for r0 in (0, m // 2)]
    for out in (1, 2):
        summed = [f32(x + y) for x, y in zip(values(halves[0][out]), values(halves[1][out]))]
        assert same_bits(values(full[out]), summed)


# ---- determinism: threads, kernels, alignment ---------------------------------------------------

_INPUTS = {}


def _all_outputs(numeric_mode):
    if not _INPUTS:
        _INPUTS.update(a=mat((300, 1100), 91), w=mat((70, 1100), 92), b=mat((70,), 93), dc=mat((300, 70), 94),
                       big_dc=mat((2600, 70), 95), big_a=mat((2600, 33), 96), big_w=mat((70, 33), 100))
    d = _INPUTS
    return sha(mt.linear_forward(d["a"], d["w"], d["b"], numeric_mode=numeric_mode),
               *mt.linear_backward(d["dc"], d["a"], d["w"], need_bias_grad=True, numeric_mode=numeric_mode),
               *mt.linear_backward(d["big_dc"], d["big_a"], d["big_w"], need_bias_grad=True, numeric_mode=numeric_mode))


def test_outputs_do_not_depend_on_the_thread_count(linear_mode):
    assert len(digests_over_thread_counts(linear_mode, lambda: _all_outputs(linear_mode.numeric_mode))) == 1


_GEMM_HOST = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include "mt_cpu_gemm.h"
#include "mt_host.h"
#include "mt_pinned.h"
static uint32_t state = 12345u;
static float draw(void) {                   /* wide magnitudes: any reordering shows */
    state = state * 1664525u + 1013904223u;
    float v = (float)((state >> 8) & 0xffff) / 65536.0f - 0.5f;
    return v * (float)(1u << ((state >> 3) & 15));
}
static uint64_t hash(const float *x, int64_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)x;
    for (int64_t i = 0; i < 4 * n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}
int main(void) {
    int64_t n = 67, k = 1031;
    uint64_t h = 1469598103934665603ull;
    for (int64_t m = 61; m < 300; m += 142) {   /* one block of rows, then several */
        float *a = malloc(sizeof(float) * m * k), *b = malloc(sizeof(float) * k * n);
        float *c = malloc(sizeof(float) * m * n), *bias = malloc(sizeof(float) * n);
        for (int64_t i = 0; i < m * k; ++i) a[i] = draw();
        for (int64_t i = 0; i < k * n; ++i) b[i] = draw();
        for (int64_t i = 0; i < n; ++i) bias[i] = draw();
        mt_fp_env env;
        mt_fp_begin(&env);
        /* row-major B, transposed B, a chain continued over two calls, transposed A */
        if (mt_cpu_gemm(c, n, a, k, 1, b, n, 1, m, n, k, 0, bias)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, k, 1, b, 1, k, m, n, k, 0, NULL)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, k, 1, b, n, 1, m, n, 500, 0, NULL)) return 1;
        if (mt_cpu_gemm(c, n, a + 500, k, 1, b + 500 * n, n, 1, m, n, k - 500, 1, bias)) return 1;
        h = hash(c, m * n, h);
        if (mt_cpu_gemm(c, n, a, 1, m, b, n, 1, m, n, k, 0, NULL)) return 1;
        h = hash(c, m * n, h);
        mt_fp_end(&env);
        free(a); free(b); free(c); free(bias);
    }
    printf("%s %016llx\n", mt_cpu_gemm_kernel(), (unsigned long long)h);
    return 0;
}
"""


def test_every_gemm_kernel_gives_the_same_bits_as_the_scalar_one(tmp_path):
    """The CPU oracle's AVX-512, AVX2 and scalar kernels (MOJO_TRAIN_CPU_GEMM), on chains of
    every stride layout the dense ops use, one continued over two calls."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    src = tmp_path / "gemm_host.c"
    src.write_text(_GEMM_HOST)
    exe = tmp_path / "gemm_host"
    oracle, common = (os.path.join(REPO, "native", d) for d in ("cpu_oracle", "common"))
    sources = [os.path.join(d, f) for d in (oracle, common) for f in sorted(os.listdir(d)) if f.endswith(".c")]
    build = subprocess.run([cc, "-std=c11", "-O1", "-ffp-contract=off", "-fno-fast-math", "-D_GNU_SOURCE",
                            "-I", os.path.join(REPO, "native", "include"), "-I", oracle, "-I", common, str(src)]
                           + sources
                           + ["-o", str(exe), "-lm", "-pthread"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    seen = {}
    for kernel in ("avx512", "avx2", "scalar"):
        for threads in ("1", "2"):
            run = subprocess.run([str(exe)], capture_output=True, text=True,
                                 env=dict(os.environ, MOJO_TRAIN_CPU_GEMM=kernel, MOJO_TRAIN_NUM_THREADS=threads))
            assert run.returncode == 0, run.stderr
            name, digest = run.stdout.split()
            seen.setdefault(name, set()).add(digest)
    assert "scalar" in seen
    assert len(set().union(*seen.values())) == 1, seen


# ---- mlp_inference_sessions ---------------------------------------------------------------------

def _mlp_weights():
    return mat((40, 13), 111), mat((40,), 112), mat((7, 40), 113), mat((7,), 114)


def test_mlp_sessions_are_linear_relu_linear_of_the_concatenated_rows(linear_mode):
    w1, b1, w2, b2 = _mlp_weights()
    sessions = [mat((r, 13), 120 + r) for r in (3, 0, 1200, 1)]
    out = mt.mlp_inference_sessions(sessions, w1, b1, w2, b2, numeric_mode=linear_mode.numeric_mode)
    x = Array.from_bytes(b"".join(s.tobytes() for s in sessions), (1204, 13), "float32")
    h = nn.relu_forward(mt.linear_forward(x, w1, b1, numeric_mode=linear_mode.numeric_mode), numeric_mode=linear_mode.numeric_mode)
    want = mt.linear_forward(h, w2, b2, numeric_mode=linear_mode.numeric_mode)
    assert out.shape == (1204, 7) and sha(out) == sha(want)


def test_mlp_sessions_do_not_depend_on_how_rows_are_split(linear_mode):
    w1, b1, w2, b2 = _mlp_weights()
    x = mat((500, 13), 130)
    splits = [(500,), (1, 499), (250, 0, 250), (100,) * 5, (7, 3, 490)]
    digests = set()
    for split in splits:
        sessions, r0 = [], 0
        for r in split:
            sessions.append(rows_of(x, r0, r0 + r))
            r0 += r
        digests.add(sha(mt.mlp_inference_sessions(sessions, w1, b1, w2, b2, numeric_mode=linear_mode.numeric_mode)))
    assert len(digests) == 1


def test_mlp_sessions_without_biases(linear_mode):
    w1, _, w2, _ = _mlp_weights()
    x = mat((9, 13), 140)
    out = mt.mlp_inference_sessions([x], w1, None, w2, None, numeric_mode=linear_mode.numeric_mode)
    h = nn.relu_forward(mt.linear_forward(x, w1, numeric_mode=linear_mode.numeric_mode), numeric_mode=linear_mode.numeric_mode)
    assert sha(out) == sha(mt.linear_forward(h, w2, numeric_mode=linear_mode.numeric_mode))


# ---- device buffers ----------------------------------------------------------------------------

def test_device_inputs_give_device_outputs_with_the_host_bits(linear_mode):
    if not linear_mode.has("device_buffers"):
        pytest.skip("the vendor takes no device buffers")
    t = linear_mode.numeric_mode
    a, w, b, dc = mat((33, 70), 151), mat((9, 70), 152), mat((9,), 153), mat((33, 9), 154)
    dev = [mt.to_device(v, numeric_mode=t) for v in (a, w, b, dc)]
    out = mt.linear_forward(dev[0], dev[1], dev[2], numeric_mode=t)
    assert isinstance(out, mt.DeviceArray) and sha(out) == sha(mt.linear_forward(a, w, b, numeric_mode=t))
    grads = mt.linear_backward(dev[3], dev[0], dev[1], need_bias_grad=True, numeric_mode=t)
    assert sha(*grads) == sha(*mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode=t))
    with pytest.raises(ValueError, match="on the device but"):
        mt.linear_forward(dev[0], w, numeric_mode=t)


@pytest.mark.parametrize("offset", [4, 8, 12])
def test_device_buffers_off_16_byte_alignment_give_the_aligned_bits(linear_identical, offset):
    """Device pointers 4, 8 or 12 bytes past an alignment take the GEMM's narrower loaders."""
    need_device(linear_identical)
    a, w, b, dc = mat((65, 130), 171), mat((67, 130), 172), mat((67,), 173), mat((65, 67), 174)
    dev = [device_copy_at(v, offset, "identical") for v in (a, w, b, dc)]
    out = mt.linear_forward(dev[0], dev[1], dev[2], numeric_mode="identical")
    assert sha(out) == sha(mt.linear_forward(a, w, b, numeric_mode="identical"))
    grads = mt.linear_backward(dev[3], dev[0], dev[1], need_bias_grad=True, numeric_mode="identical")
    assert sha(*grads) == sha(*mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode="identical"))


# ---- torch in float64 (tests/tolerances.py) ---------------------------------------------------------

@st.composite
def linear_cases(draw):
    return {"m": draw(st.integers(*tol.DENSE_ROWS_RANGE)), "n": draw(st.integers(*tol.DENSE_OUT_RANGE)),
            "k": draw(st.integers(*tol.DENSE_K_RANGE)), "bias": draw(st.booleans()),
            "seed": draw(st.integers(0, 2**32 - 1))}


def linear_vs_torch(case, numeric_mode, dtype=None):
    """{name: (ours or torch-in-dtype, float64 reference, unit)} for one linear case."""
    import numpy as np
    torch = pytest.importorskip("torch")
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    m, n, k = case["m"], case["n"], case["k"]
    a, w, dc = (rng.uniform(-1, 1, s).astype(np.float32) for s in ((m, k), (n, k), (m, n)))
    b = rng.uniform(-1, 1, n).astype(np.float32) if case["bias"] else None
    T = {key: torch.tensor(v, dtype=torch.float64) for key, v in (("a", a), ("w", w), ("dc", dc))}
    ref = {"out": T["a"] @ T["w"].T, "da": T["dc"] @ T["w"], "dweight": T["dc"].T @ T["a"],
           "dbias": T["dc"].sum(0)}
    if b is not None:
        ref["out"] = ref["out"] + torch.tensor(b, dtype=torch.float64)
    if dtype is None:
        got = {"out": mt.linear_forward(a, w, b, numeric_mode=numeric_mode)}
        got["da"], got["dweight"], got["dbias"] = mt.linear_backward(dc, a, w, need_bias_grad=True, numeric_mode=numeric_mode)
        got = {key: np.asarray(v) for key, v in got.items()}
    else:
        t = {key: torch.tensor(v) for key, v in (("a", a), ("w", w), ("dc", dc))}
        got = {"out": t["a"] @ t["w"].T, "da": t["dc"] @ t["w"], "dweight": t["dc"].T @ t["a"], "dbias": t["dc"].sum(0)}
        if b is not None:
            got["out"] = got["out"] + torch.tensor(b)
        got = {key: v.numpy() for key, v in got.items()}
    units = tol.linear_units(a, w, dc, b)
    return {key: (got[key], ref[key].numpy(), units[key].ravel()) for key in ref}


@settings(max_examples=20, **HYPOTHESIS)
@given(case=linear_cases())
def test_linear_stays_within_the_bound_of_torch_float64(linear_mode, case):
    assert_within_bound(linear_vs_torch(case, linear_mode.numeric_mode), "%r linear %r" % (linear_mode, case))


def _figures_case(rng):
    return {"m": rng.randint(*tol.DENSE_ROWS_RANGE), "n": rng.randint(*tol.DENSE_OUT_RANGE),
            "k": rng.randint(*tol.DENSE_K_RANGE), "bias": rng.random() < 0.5, "seed": rng.getrandbits(32)}


if __name__ == "__main__":   # worst share of the bound used per output: ours (identical, fast), torch float32
    print_family_figures("linear", _figures_case, linear_vs_torch, int(sys.argv[1]) if len(sys.argv) > 1 else 200)


@pytest.mark.parametrize("which", ["out on a", "out on weight", "da on dc", "dweight on a", "dbias on dc"])
def test_an_output_over_an_input_gives_the_bits_of_a_separate_buffer(linear_mode, which):
    """The oracle takes an output that is one of the inputs (n == k here, so out fits a) and gives
    the bits of a separate output; so must every vendor on host buffers. (Until 2026-12-05 Metal
    staged such an output and its input as one twin and read inputs its threads had overwritten.)"""
    lib, m, n = linear_mode.backend.lib, 37, 29
    k = n
    vals = lambda count, s: [float(((i * 7 + s) * 13) % 17) / 8.0 - 1.0 for i in range(count)]
    a, w, b, dc = (vals(m * k, 1), vals(n * k, 2), vals(n, 3), vals(m * n, 4))
    if which.startswith("out"):
        want = ffi.new("float[]", m * n)
        assert lib.mt_linear_forward(want, ffi.new("float[]", a), ffi.new("float[]", w), ffi.new("float[]", b),
                                     m, n, k) == 0
        ca, cw = ffi.new("float[]", a), ffi.new("float[]", w)
        out = ca if which == "out on a" else cw
        if which == "out on weight":            # out (m x n) over weight (n x k): m == n rows needed
            m = n
            want = ffi.new("float[]", m * n)
            assert lib.mt_linear_forward(want, ffi.new("float[]", a[:m * k]), ffi.new("float[]", w),
                                         ffi.new("float[]", b), m, n, k) == 0
            ca = ffi.new("float[]", a[:m * k])
        assert lib.mt_linear_forward(out, ca, cw, ffi.new("float[]", b), m, n, k) == 0
        assert bytes(ffi.buffer(out, 4 * m * n)) == bytes(ffi.buffer(want)), which
        return
    outs = {"da": m * k, "dweight": n * k, "dbias": n}
    name = which.split()[0]
    want = ffi.new("float[]", outs[name])
    args = {o: ffi.NULL for o in outs}
    args[name] = want
    assert lib.mt_linear_backward(args["da"], args["dweight"], args["dbias"], ffi.new("float[]", dc),
                                  ffi.new("float[]", a), ffi.new("float[]", w), m, n, k) == 0
    cdc, ca = ffi.new("float[]", dc), ffi.new("float[]", a)
    args[name] = cdc if which.endswith("dc") else ca
    assert lib.mt_linear_backward(args["da"], args["dweight"], args["dbias"], cdc, ca, ffi.new("float[]", w),
                                  m, n, k) == 0
    assert bytes(ffi.buffer(args[name], 4 * outs[name])) == bytes(ffi.buffer(want)), which


@pytest.mark.parametrize("which", ["da on a", "da on dc", "dweight on a", "dweight on weight", "dbias on dc",
                                   "da on dc, dweight on a"])
def test_every_output_of_a_backward_with_one_over_an_input_gets_the_bits_of_separate_buffers(linear_mode, which):
    """da, dweight and dbias all asked for, one (or two) of them over an input another still reads
    (n == k, so da fits over a and dweight over weight): each gets the bits of separate buffers.
    (Until 2026-12-05 the oracle and Metal wrote da over dc or a before dweight read it.)"""
    lib, m, n = linear_mode.backend.lib, 37, 29
    k = n
    vals = lambda count, s: [float(((i * 7 + s) * 13) % 17) / 8.0 - 1.0 for i in range(count)]
    a, w, dc = vals(m * k, 1), vals(n * k, 2), vals(m * n, 4)
    sizes = {"da": m * k, "dweight": n * k, "dbias": n}
    want = {o: ffi.new("float[]", c) for o, c in sizes.items()}
    assert lib.mt_linear_backward(want["da"], want["dweight"], want["dbias"], ffi.new("float[]", dc),
                                  ffi.new("float[]", a), ffi.new("float[]", w), m, n, k) == 0
    ins = {"dc": ffi.new("float[]", dc), "a": ffi.new("float[]", a), "weight": ffi.new("float[]", w)}
    outs = {o: ffi.new("float[]", c) for o, c in sizes.items()}
    for part in which.split(", "):
        o, target = part.split(" on ")
        outs[o] = ins[target]
    assert lib.mt_linear_backward(outs["da"], outs["dweight"], outs["dbias"], ins["dc"], ins["a"], ins["weight"],
                                  m, n, k) == 0
    for o in ("da", "dweight", "dbias"):
        assert bytes(ffi.buffer(outs[o], 4 * sizes[o])) == bytes(ffi.buffer(want[o])), (which, o)


@pytest.mark.parametrize("first, second, shift", [("da", "dweight", 0), ("dweight", "dbias", 2), ("da", "dbias", 5)])
def test_backward_outputs_over_each_other_are_refused_by_name_before_anything_is_written(linear_mode, first, second,
                                                                                         shift):
    """Two outputs sharing memory (the same start, or one inside the other) have no answer a
    separate buffer would give: refused with EINVAL naming both, every buffer as it was (a
    fuzzer found the oracle and Metal keeping different ones, 2026-12-05)."""
    lib, m, n, k = linear_mode.backend.lib, 6, 5, 5
    vals = lambda count, s: [float(((i * 7 + s) * 13) % 17) / 8.0 - 1.0 for i in range(count)]
    block = ffi.new("float[]", vals(64, 9))
    outs = {"da": ffi.new("float[]", m * k), "dweight": ffi.new("float[]", n * k), "dbias": ffi.new("float[]", n)}
    outs[first], outs[second] = block, block + shift
    dc, a, w = ffi.new("float[]", vals(m * n, 1)), ffi.new("float[]", vals(m * k, 2)), ffi.new("float[]", vals(n * k, 3))
    before = [bytes(ffi.buffer(x)) for x in (block, dc, a, w)]
    rc = lib.mt_linear_backward(outs["da"], outs["dweight"], outs["dbias"], dc, a, w, m, n, k)
    assert rc == EINVAL and "%s and %s overlap" % (first, second) in ffi.string(lib.mt_last_error()).decode()
    assert [bytes(ffi.buffer(x)) for x in (block, dc, a, w)] == before
