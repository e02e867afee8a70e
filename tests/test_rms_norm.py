"""rms_norm_forward and rms_norm_backward through the public API (mojo_train.rms_norm,
re-exported by mojo_train and mojo_train.nn).

Contract under test: native/contracts/rms_norm.md. Every refusal (wrong dtype, shape, eps,
pointer; a NaN or inf in any input, named) writes no output; the results' bytes do not depend
on the thread count, on the alignment of device buffers or on whether a GPU stages a row in
shared memory; in the identical numeric mode each row is the contract's arithmetic step by step
(replayed here in exact rational arithmetic) and dweight follows the token rule over rows;
every numeric mode stays within tests/tolerances.py's bound of torch in float64.
``PYTHONPATH=. python tests/test_rms_norm.py N`` prints the bound figures of tolerances.py.
"""
import json
import math
import os
import re
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mojo_train as mt
from mojo_train import Array
from mojo_train._native import ffi

import tolerances as tol
from _helpers import ENONFINITE, _lane_tree, _tree_fold, f32, fma32
from _layer_helpers import LEAF, SENTINEL, assert_c_refusals_write_nothing, assert_nonfinite_refused, c_in, \
    assert_within_bound, device_copy_at, digests_over_thread_counts, mat, need_device, print_family_figures, \
    rows_of, same_bits, token_tree, values, words
from _layer_helpers import HYPOTHESIS, outputs_sha as sha


# ---- the contract replayed in Python -----------------------------------------------------------

def chunk_tree(step_terms):
    """The chunk tree of clip.md over terms (u_i, v_i) folded as fma(u, v, acc) per lane."""
    partials = []
    for c0 in range(0, len(step_terms), 4096):
        acc = [0.0] * 128
        for i, (u, v) in enumerate(step_terms[c0:c0 + 4096]):
            acc[i % 128] = fma32(u, v, acc[i % 128])
        partials.append(_lane_tree(acc))
    return _tree_fold(partials)


def ref_rms_row(x, w, dy, eps):
    """(y, dx, r) of one row by rms_norm.md, every step rounded to float32."""
    dimf = f32(float(len(x)))
    ss = chunk_tree([(v, v) for v in x])
    r = f32(1.0 / f32(math.sqrt(f32(f32(ss / dimf) + eps))))
    w = w or [1.0] * len(x)
    y = [f32(f32(v * r) * wi) for v, wi in zip(x, w)]
    if dy is None:
        return y, None, r
    g = [f32(d * wi) for d, wi in zip(dy, w)]
    c = chunk_tree(list(zip(g, x)))
    k = f32(f32(c / dimf) * f32(f32(r * r) * r))
    dx = [f32(f32(r * gi) - f32(k * v)) for gi, v in zip(g, x)]
    return y, dx, r


# ---- refusals --------------------------------------------------------------------------------

def _refusals():
    """(function, args, exception, text of the message)."""
    x, g = mat((4, 6), 5), mat((6,), 6)
    rf, rb = mt.rms_norm_forward, mt.rms_norm_backward
    return [
        (rf, (x, mat((5,), 6)), ValueError, "weight must have shape (6,)"),
        (rf, (x, g, -1e-5), ValueError, "eps must be finite and >= 0"),
        (rf, (x, g, float("nan")), ValueError, "eps must be finite"),
        (rf, (x, g, 1e39), ValueError, "eps must be finite"),
        (rf, (x, g, "1e-5"), TypeError, "eps must be a real number"),
        (rf, (mat((3, 0), 1), None), ValueError, "D must be >= 1"),
        (rf, (mat((), 1), None), ValueError, "at least one dimension"),
        (rb, (mat((4, 5), 1), x, g), ValueError, "dy must have x's shape"),
    ]


REFUSALS = _refusals()


@pytest.mark.parametrize("i", range(len(REFUSALS)), ids=["%s: %s" % (r[0].__name__, r[3]) for r in REFUSALS])
def test_a_bad_argument_is_refused_naming_it(rms_norm_mode, i):
    fn, args, exc, text = REFUSALS[i]
    with pytest.raises(exc) as info:
        fn(*args, numeric_mode=rms_norm_mode.numeric_mode)
    assert "mojo_train.%s" % fn.__name__ in str(info.value) and text in str(info.value)


def _rf(m, d):
    return mt.rms_norm_forward(d["x"], d["w"], 1e-5, numeric_mode=m)


def _rb(m, d):
    return mt.rms_norm_backward(d["dy"], d["x"], d["w"], 1e-5, numeric_mode=m)


NONFINITE = [("rms_norm_forward", arg, _rf) for arg in ("x", "w")] + \
            [("rms_norm_backward", arg, _rb) for arg in ("dy", "x", "w")]


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("i", range(len(NONFINITE)), ids=["%s %s" % c[:2] for c in NONFINITE])
def test_a_nonfinite_input_is_refused_by_name_and_inputs_are_untouched(rms_norm_mode, i, bad):
    d = {"x": mat((37, 300), 5), "w": mat((300,), 6), "dy": mat((37, 300), 7)}
    assert_nonfinite_refused(*NONFINITE[i], rms_norm_mode.numeric_mode, d, bad)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("arg", ["dy", "x", "w"])
def test_a_nonfinite_input_of_a_backward_of_many_leaves_is_refused(rms_norm_mode, arg, bad):
    """7169 x 128 takes CUDA's one-pass backward (8 leaves, dim a multiple of 128); the poison
    sits in the middle, inside a leaf whose chains other blocks carry."""
    d = {"x": mat((7169, 128), 15), "w": mat((128,), 16), "dy": mat((7169, 128), 17)}
    assert_nonfinite_refused("rms_norm_backward", arg, _rb, rms_norm_mode.numeric_mode, d, bad)


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("arg", ["x", "w"])
def test_a_nonfinite_input_of_a_forward_of_many_rows_is_refused(rms_norm_mode, arg, bad):
    """7169 rows: a GPU block takes many rows, and looks at a row's x one by one only when its
    sum of squares is not finite, at w in its first row only; the poison sits in a late row."""
    d = {"x": mat((7169, 128), 24), "w": mat((128,), 25)}
    at = 7000 * 128 + 77 if arg == "x" else 77
    assert_nonfinite_refused("rms_norm_forward", arg, _rf, rms_norm_mode.numeric_mode, d, bad, at)


@pytest.mark.parametrize("zero", ["x", "w"])
def test_an_inf_dy_against_a_zero_is_refused_as_dy(rms_norm_mode, zero):
    """dy = inf where x or the weight is 0 makes the row's dot NaN, not inf (CUDA's one-pass
    backward looks at a window's values only when a row's sums are not finite: 7169 x 128)."""
    d = {"x": mat((7169, 128), 18), "w": mat((128,), 19), "dy": mat((7169, 128), 20)}
    at = 7169 // 2 * 128 + 5
    if zero == "x":
        d["x"].reshape(-1)[at] = 0.0
    else:
        d["w"].reshape(-1)[5] = 0.0
    assert_nonfinite_refused("rms_norm_backward", "dy", _rb, rms_norm_mode.numeric_mode, d, "inf", at)


@pytest.mark.parametrize("arg", ["dy", "x"])
def test_a_nonfinite_value_in_a_last_leaf_of_one_row_is_refused(rms_norm_mode, arg):
    """7169 rows: the eighth leaf holds one row, a window of one row."""
    d = {"x": mat((7169, 128), 24), "w": mat((128,), 25), "dy": mat((7169, 128), 26)}
    assert_nonfinite_refused("rms_norm_backward", arg, _rb, rms_norm_mode.numeric_mode, d, "nan", 7168 * 128 + 127)


@pytest.mark.parametrize("arg", ["dy", "x"])
def test_a_nonfinite_value_is_refused_when_one_group_walks_every_leaf(rms_norm_identical, arg):
    """At most 8 blocks: CUDA's one-pass backward walks the 9 leaves of 8300 x 256 with one
    group, the poison in the ninth leaf (whose windows sit further on in the group's ring)."""
    need_device(rms_norm_identical)
    lib = rms_norm_identical.backend.lib
    d = {"x": mat((8300, 256), 27), "w": mat((256,), 28), "dy": mat((8300, 256), 29)}
    assert lib.mt_set_launch_geometry(256, 8) == 0
    try:
        assert_nonfinite_refused("rms_norm_backward", arg, _rb, "identical", d, "inf", 8250 * 256 + 3)
    finally:
        lib.mt_set_launch_geometry(256, 0)


def test_cudas_backward_of_many_leaves_takes_the_one_pass_kernel(rms_norm_identical):
    """mt_launch_geometry reads back the one-pass kernel's launch (512 threads, 8 blocks a leaf);
    another vendor's backward (HIP: three kernels) records no launch of 512 threads."""
    need_device(rms_norm_identical)
    lib, seen = rms_norm_identical.backend.lib, ffi.new("int32_t[2]")
    mt.add(mat((1000,), 44), mat((1000,), 45))   # a map launch records its own geometry first
    assert lib.mt_launch_geometry(seen) == 0 and seen[0] != 512
    mt.rms_norm_backward(mat((7169, 128), 46), mat((7169, 128), 47), mat((128,), 48), numeric_mode="identical")
    assert lib.mt_launch_geometry(seen) == 0
    if rms_norm_identical.vendor == "cuda":
        assert (seen[0], seen[1]) == (512, 64)
    else:
        assert seen[0] != 512


@pytest.mark.parametrize("big", ["x", "dy"])
def test_sums_that_overflow_from_finite_values_are_not_refused(rms_norm_mode, big, monkeypatch):
    """A row of x at 1e30 (its squares overflow to inf) or of dy at 3e38 (dy * w overflows) is
    finite input: no refusal, and the oracle's bits (7169 x 128: CUDA's one-pass backward, whose
    window with such a row then looks at every value; and the forward, which looks at a row's x
    one by one only when its sum is not finite)."""
    x, dy, w = mat((7169, 128), 21), mat((7169, 128), 22), mat((128,), 23, 0.5, 1.5)
    row = (x if big == "x" else dy).reshape(-1)
    for c in range(128):
        row[3000 * 128 + c] = 1e30 if big == "x" else 3e38
    mode = rms_norm_mode.numeric_mode
    got = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode=mode), mt.rms_norm_forward(x, w, 1e-5, numeric_mode=mode))
    if mode == "identical":
        monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
        assert got == sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"),
                          mt.rms_norm_forward(x, w, 1e-5, numeric_mode="identical"))


@pytest.mark.parametrize("rows", [0, 3])
def test_a_nonfinite_weight_is_refused_with_or_without_rows(rms_norm_mode, rows):
    """With no rows, no kernel reads the weight along the way: it is still checked."""
    x, dy = mat((rows, 128), 8), mat((rows, 128), 9)
    w = mat((128,), 10).reshape(-1)
    w[0] = float("nan")
    for call in (lambda: mt.rms_norm_forward(x, w, numeric_mode=rms_norm_mode.numeric_mode),
                 lambda: mt.rms_norm_backward(dy, x, w, numeric_mode=rms_norm_mode.numeric_mode)):
        with pytest.raises(ValueError, match="weight holds NaN or inf"):
            call()


def _c_cases(lib, keep):
    """(text of the message, call(outputs)); the inputs stay alive in ``keep``."""
    keep += [mat(shape, seed) for shape, seed in (((6, 4), 4), ((4,), 5), ((6, 4), 6))]
    x, g, dy = (c_in(v) for v in keep)
    N, inf = ffi.NULL, float("inf")
    return [
        ("dim must be >= 1", lambda o: lib.mt_rms_norm_forward(o[0], x, g, 1e-5, 6, 0)),
        ("rows must be >= 0", lambda o: lib.mt_rms_norm_forward(o[0], x, g, 1e-5, -6, 4)),
        ("too large", lambda o: lib.mt_rms_norm_forward(o[0], x, g, 1e-5, 2**40, 2**40)),
        ("eps must be finite and >= 0", lambda o: lib.mt_rms_norm_forward(o[0], x, g, -1.0, 6, 4)),
        ("eps must be finite and >= 0", lambda o: lib.mt_rms_norm_backward(o[0], o[1], dy, x, g, inf, 6, 4)),
        ("y is NULL", lambda o: lib.mt_rms_norm_forward(N, x, g, 1e-5, 6, 4)),
        ("dweight was asked for but weight is NULL",
         lambda o: lib.mt_rms_norm_backward(o[0], o[1], dy, x, N, 1e-5, 6, 4)),
        ("dy is NULL", lambda o: lib.mt_rms_norm_backward(o[0], o[1], N, x, g, 1e-5, 6, 4)),
    ]


def test_the_c_entries_refuse_bad_sizes_pointers_and_eps_writing_nothing(rms_norm_mode):
    keep = []
    assert_c_refusals_write_nothing(rms_norm_mode.backend.lib, _c_cases(rms_norm_mode.backend.lib, keep))


def test_every_nan_written_is_the_canonical_quiet_nan(rms_norm_identical):
    """eps = 0 on rows of zeros: r = inf and x * r = 0 * inf. x86 and NVIDIA make NaNs of other
    signs and payloads; the contract writes 0x7fc00000 in y, dx and dweight."""
    x = Array.from_list([0.0] * 8, "float32").reshape((2, 4))
    w, dy = mat((4,), 41, 0.5, 1.5), mat((2, 4), 43)
    y = mt.rms_norm_forward(x, w, 0.0, numeric_mode="identical")
    dx, dw = mt.rms_norm_backward(dy, x, w, 0.0, numeric_mode="identical")
    assert all(words(t) == {"7fc00000"} for t in (y, dx, dw))


def test_empty_rows_are_answered_without_reading_anything(rms_norm_mode):
    m = rms_norm_mode.numeric_mode
    assert mt.rms_norm_forward(mat((0, 5), 1), None, numeric_mode=m).shape == (0, 5)
    dx, dg = mt.rms_norm_backward(mat((0, 5), 1), mat((0, 5), 2), mat((5,), 3), numeric_mode=m)
    assert dx.shape == (0, 5) and values(dg) == [0.0] * 5


def test_leading_dimensions_are_rows_and_no_weight_has_no_dweight(rms_norm_mode):
    m = rms_norm_mode.numeric_mode
    x3, dy3 = mat((2, 3, 7), 166), mat((2, 3, 7), 167)
    y = mt.rms_norm_forward(x3, None, numeric_mode=m)
    assert y.shape == (2, 3, 7) and sha(y) == sha(mt.rms_norm_forward(x3.reshape(6, 7), None, numeric_mode=m))
    dx, dw = mt.rms_norm_backward(dy3, x3, None, numeric_mode=m)
    assert dw is None and dx.shape == (2, 3, 7)
    assert sha(dx) == sha(mt.rms_norm_backward(dy3.reshape(6, 7), x3.reshape(6, 7), None, numeric_mode=m)[0])


# ---- the contract's arithmetic (identical numeric mode) -------------------------------------------------

@pytest.mark.parametrize("dim, affine", [(1, True), (5, False), (300, True), (5000, True), (4097, False)])
def test_rms_norm_is_the_contracts_arithmetic_row_by_row(rms_norm_identical, dim, affine):
    rows, eps = 2, 1e-5
    x, dy = mat((rows, dim), 51 + dim, wide=True), mat((rows, dim), 52 + dim, wide=True)
    w = mat((dim,), 53, 0.5, 1.5) if affine else None
    y = values(mt.rms_norm_forward(x, w, eps, numeric_mode="identical"))
    dx, dw = mt.rms_norm_backward(dy, x, w, eps, numeric_mode="identical")
    xv, dyv, wv = values(x), values(dy), values(w) if affine else None
    dweight = [0.0] * dim
    for i in range(rows):
        sl = slice(i * dim, (i + 1) * dim)
        ry, rdx, r = ref_rms_row(xv[sl], wv, dyv[sl], f32(eps))
        assert same_bits(y[sl], ry) and same_bits(values(dx)[sl], rdx)
        dweight = [fma32(d, f32(v * r), acc) for d, v, acc in zip(dyv[sl], xv[sl], dweight)]
    if affine:
        assert same_bits(values(dw), dweight)
    else:
        assert dw is None


def test_rms_norm_eps_none_is_float32_machine_epsilon(rms_norm_identical):
    x, w = mat((3, 8), 61, -1e-4, 1e-4), mat((8,), 62)
    assert sha(mt.rms_norm_forward(x, w, numeric_mode="identical")) == sha(
        mt.rms_norm_forward(x, w, 2.0 ** -23, numeric_mode="identical"))
    assert sha(mt.rms_norm_forward(x, w, numeric_mode="identical")) != sha(
        mt.rms_norm_forward(x, w, 1e-5, numeric_mode="identical"))


def test_rms_norm_dweight_follows_the_token_rule_over_rows(rms_norm_identical):
    rows, dim = 3 * LEAF - 700, 37
    x, dy, w = mat((rows, dim), 71, wide=True), mat((rows, dim), 72, wide=True), mat((dim,), 73)
    dx, dw = mt.rms_norm_backward(dy, x, w, 1e-6, numeric_mode="identical")
    parts = [mt.rms_norm_backward(rows_of(dy, r0, min(r0 + LEAF, rows)), rows_of(x, r0, min(r0 + LEAF, rows)),
                                  w, 1e-6, numeric_mode="identical") for r0 in range(0, rows, LEAF)]
    assert same_bits(values(dw), token_tree([values(p[1]) for p in parts]))
    assert same_bits(values(dx), sum((values(p[0]) for p in parts), []))


# ---- determinism: threads, alignment, rows too wide for shared memory ----------------------------

def test_outputs_do_not_depend_on_the_thread_count(rms_norm_mode):
    x, g, dy = mat((2600, 300), 97), mat((300,), 98), mat((2600, 300), 99)
    digest = lambda: sha(mt.rms_norm_forward(x, g, numeric_mode=rms_norm_mode.numeric_mode),  # noqa: E731
                         *mt.rms_norm_backward(dy, x, g, numeric_mode=rms_norm_mode.numeric_mode))
    assert len(digests_over_thread_counts(rms_norm_mode, digest)) == 1


@pytest.mark.parametrize("blocks", [8, 24, 200])
def test_the_backward_of_many_leaves_gives_the_same_bits_with_any_number_of_blocks(rms_norm_identical, blocks,
                                                                                  monkeypatch):
    """At most `blocks` blocks a launch: CUDA's one-pass backward then walks the 9 leaves with
    1, 3 or 9 groups of 8 blocks at once; the CPU oracle's bits every time."""
    need_device(rms_norm_identical)
    lib = rms_norm_identical.backend.lib
    x, dy, w = mat((8300, 256), 31), mat((8300, 256), 32), mat((256,), 33, 0.5, 1.5)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    want = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    assert lib.mt_set_launch_geometry(256, blocks) == 0
    try:
        assert sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical")) == want
    finally:
        lib.mt_set_launch_geometry(256, 0)


@pytest.mark.parametrize("switch", [("MOJO_TRAIN_RMS_ONE_PASS", "0"), ("MOJO_TRAIN_RMS_RELAY", "1")],
                         ids=["three_kernels", "relay"])
def test_the_other_backward_paths_still_give_the_cards_bits(rms_norm_identical, switch):
    """MOJO_TRAIN_RMS_ONE_PASS=0 keeps CUDA's row kernel and dweight leaves where the one-pass
    kernel would run (the card's lines of 8 leaves and more); MOJO_TRAIN_RMS_RELAY=1 runs the relay
    (row blocks handing r to column walkers) there instead. Other vendors read neither. In a
    process of its own: the variables are read once."""
    env = dict(os.environ, MOJO_TRAIN_VENDOR=rms_norm_identical.vendor)
    env[switch[0]] = switch[1]
    out = subprocess.run([sys.executable, "-m", "mojo_train", "selfcheck", "--card", "rms_norm"], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(r"^rms_norm\s+%s\s+(\d+)/\1\b" % rms_norm_identical.vendor, out.stdout, re.M), out.stdout
    # which kernel ran: the launch geometry after a map's, then after a backward of 8 leaves
    probe = subprocess.run([sys.executable, "-c", _PATH_PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert probe.returncode == 0, probe.stderr[-3000:]
    before, after = [tuple(map(int, line.split())) for line in probe.stdout.split("\n")[:2]]
    if rms_norm_identical.vendor == "cuda" and switch[0] == "MOJO_TRAIN_RMS_RELAY":
        assert after[0] == 128 and after[1] > 8 and after != before   # 8 walkers (dim 128) and row blocks
    elif rms_norm_identical.vendor == "cuda":
        assert after == before   # CUDA's three kernels record no launch



def test_the_relay_gives_the_oracles_bits_with_one_row_block_and_refuses_without_writing(rms_norm_identical):
    """MOJO_TRAIN_RMS_RELAY=1 (a process of its own, tests/_rms_relay_probe.py): the CPU oracle's
    bits at widths only the relay takes on CUDA (132, 1028: not multiples of 128), also under a
    launch cap of walkers + 1 (one row block feeds every walker); a NaN in x, dy or weight is
    refused by name and leaves a device dweight untouched. On CUDA the recorded geometry shows the
    relay ran: 128 threads, the cap's blocks where capped, more than the walkers otherwise."""
    need_device(rms_norm_identical)
    env = dict(os.environ, MOJO_TRAIN_RMS_RELAY="1", MOJO_TRAIN_VENDOR=rms_norm_identical.vendor)
    # the mojo_train this process imported (a source tree or an installed package): a script's own
    # folder, not the working directory, heads its path
    env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(mt.__file__)))] +
                                        ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    out = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "_rms_relay_probe.py")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(found) == 9, out.stdout
    walkers = {128: 8, 132: 8, 1028: 27}
    for f in found:
        cuda = rms_norm_identical.vendor == "cuda"
        if f["case"] == "bits":
            assert f["same"], f
            if cuda and f["cap"]:
                assert f["geometry"] == [128, f["cap"]], f
            elif cuda:
                assert f["geometry"][0] == 128 and f["geometry"][1] > walkers[f["dim"]], f
        else:
            assert f["rc"] == ENONFINITE and f["dweight_untouched"], f
            assert f["message"].startswith(("weight" if f["bad"] == "w" else f["bad"]) + " holds NaN"), f
            if cuda:
                assert f["geometry"][0] == 128 and f["geometry"][1] > 8, f

_PATH_PROBE = """
import mojo_train as mt
from mojo_train._native import ffi, load
lib, seen = load("identical").lib, ffi.new("int32_t[2]")
g = mt.Generator(5, numeric_mode="identical")
mt.add(g.uniform((1000,), -1.0, 1.0), g.uniform((1000,), -1.0, 1.0))
assert lib.mt_launch_geometry(seen) == 0
print(seen[0], seen[1])
x, dy, w = g.uniform((7169, 128), -1.0, 1.0), g.uniform((7169, 128), -1.0, 1.0), g.uniform((128,), 0.5, 1.5)
mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical")
assert lib.mt_launch_geometry(seen) == 0
print(seen[0], seen[1])
"""


def _c_backward_on_device(lib, host, rows, dim, with_dx=True):
    """mt_rms_norm_backward through the C ABI on device copies of host's x, dy, w, into a dweight
    of SENTINELs (and a dx, or NULL): (rc, the device dweight)."""
    dev = {k: device_copy_at(host[k], 0, "identical") for k in ("x", "dy", "w")}
    dw = device_copy_at(Array.from_list([SENTINEL] * dim, "float32"), 0, "identical")
    dx = mt.DeviceArray((rows, dim), "float32", numeric_mode="identical") if with_dx else None
    ptr = lambda a: ffi.cast("float *", a.ptr) if a is not None else ffi.NULL   # noqa: E731
    rc = lib.mt_rms_norm_backward(ptr(dx), ptr(dw), ptr(dev["dy"]), ptr(dev["x"]), ptr(dev["w"]), 1e-5, rows, dim)
    return rc, dw


@pytest.mark.parametrize("bad", ["dy", "x", "w"])
def test_a_refused_backward_of_many_leaves_never_writes_a_device_dweight(rms_norm_identical, bad):
    """Device buffers are written in place, so here a refusal is seen in dweight itself: the
    one-pass kernel raises the flags, and the fold that writes dweight reads them first."""
    need_device(rms_norm_identical)
    lib, rows, dim = rms_norm_identical.backend.lib, 7169, 128
    host = {"x": mat((rows, dim), 51), "dy": mat((rows, dim), 52), "w": mat((dim,), 53, 0.5, 1.5)}
    poisoned = host[bad].reshape(-1)
    poisoned[poisoned.size // 2] = float("nan")
    rc, dw = _c_backward_on_device(lib, host, rows, dim)
    assert rc == ENONFINITE
    assert ffi.string(lib.mt_last_error()).decode().startswith(("weight" if bad == "w" else bad) + " holds NaN")
    assert values(dw) == [SENTINEL] * dim


@pytest.mark.parametrize("dim", [8320, 16512])
def test_wide_rows_of_many_leaves_give_the_oracles_bits(rms_norm_identical, dim, monkeypatch):
    """CUDA's one-pass backward at windows of 8 rows (dim 8320: three chunks) and of 4 rows
    with a second float4 a thread (dim 16512: five chunks, the last of one lane row)."""
    need_device(rms_norm_identical)
    rows = 7 * LEAF + 1
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    g = mt.Generator(61, numeric_mode="identical")   # Python's generator would take minutes for 118M floats
    x, dy, w = g.uniform((rows, dim), -1.0, 1.0), g.uniform((rows, dim), -1.0, 1.0), g.uniform((dim,), 0.5, 1.5)
    want = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    assert sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical")) == want


# Backwards of 8 leaves and more with rows of thousands of columns: (rows, dim). A last leaf of
# one row and 3840 columns (CUDA's one-pass kernel: dim % 128 == 0); two chunks, the second of
# 904 floats, and a width off a multiple of 4 (CUDA's three kernels). The twenty-sixth session
# wrote them for a sliced kernel that was measured slower and removed (bench/results/NOTES.md).
WIDE = [(8 * LEAF + 1, 3840), (8 * LEAF, 5000), (8 * LEAF, 4099)]


def _wide_inputs(rows, dim, seed, monkeypatch):
    """x, dy, w as host Arrays (mojo_train's CPU generator: Python's would take minutes); the
    vendor is the CPU afterwards."""
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", "cpu")
    g = mt.Generator(seed, numeric_mode="identical")
    return g.uniform((rows, dim), -1.0, 1.0), g.uniform((rows, dim), -1.0, 1.0), g.uniform((dim,), 0.5, 1.5)


def _launch_before(lib):
    """The launch geometry after a device SiLU records one of its own: the one-pass RMSNorm
    kernel records its launch over it, the three kernels record nothing."""
    mt.silu_forward(device_copy_at(mat((1000,), 9), 0, "identical"), numeric_mode="identical")
    seen = ffi.new("int32_t[2]")
    assert lib.mt_launch_geometry(seen) == 0
    return (seen[0], seen[1])


@pytest.mark.parametrize("rows, dim", WIDE, ids=["%dx%d" % c for c in WIDE])
def test_a_wide_backward_of_many_leaves_gives_the_oracles_bits(rms_norm_identical, rows, dim, monkeypatch):
    """The CPU oracle's bits on every vendor. On CUDA, mt_launch_geometry tells the path: a
    device SiLU first records a launch of its own, then the one-pass kernel records its launch
    (512 threads, blocks in groups of 8) where dim is a multiple of 128, and the three kernels,
    which record nothing, leave the SiLU's."""
    need_device(rms_norm_identical)
    lib, seen = rms_norm_identical.backend.lib, ffi.new("int32_t[2]")
    x, dy, w = _wide_inputs(rows, dim, rows + dim, monkeypatch)
    want = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    before = _launch_before(lib)
    got = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    assert lib.mt_launch_geometry(seen) == 0
    if rms_norm_identical.vendor == "cuda":
        if dim % 128 == 0:
            assert (seen[0], seen[1] % 8) == (512, 0) and (seen[0], seen[1]) != before
        else:
            assert (seen[0], seen[1]) == before
    assert got == want


def test_a_wide_backward_reads_unaligned_device_buffers_and_a_row_of_huge_values(rms_norm_identical, monkeypatch):
    """Device buffers 4 bytes off alignment, and a row of x at 1e30 (its squares overflow: finite
    input, not refused): the host call's bits, which are the oracle's."""
    need_device(rms_norm_identical)
    rows, dim = WIDE[0]
    x, dy, w = _wide_inputs(rows, dim, 71, monkeypatch)
    flat = x.reshape(-1)
    for c in range(dim):
        flat[3000 * dim + c] = 1e30
    want = sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    lib, seen = rms_norm_identical.backend.lib, ffi.new("int32_t[2]")
    dev = [device_copy_at(v, 4, "identical") for v in (dy, x, w)]
    before = _launch_before(lib)
    assert sha(*mt.rms_norm_backward(*dev, 1e-5, numeric_mode="identical")) == want
    assert lib.mt_launch_geometry(seen) == 0
    if rms_norm_identical.vendor == "cuda":   # rows off 16 bytes: the three kernels, not the one-pass
        assert (seen[0], seen[1]) == before


@pytest.mark.parametrize("rows, dim", WIDE[:2], ids=["%dx%d" % c for c in WIDE[:2]])
def test_a_wide_backward_without_dx_gives_the_oracles_dweight(rms_norm_identical, rows, dim, monkeypatch):
    """dx = NULL through the C ABI (device buffers): dweight alone, the oracle's bits."""
    need_device(rms_norm_identical)
    x, dy, w = _wide_inputs(rows, dim, 76, monkeypatch)
    want = mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical")[1].tobytes()
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    rc, dw = _c_backward_on_device(rms_norm_identical.backend.lib, {"x": x, "dy": dy, "w": w}, rows, dim,
                                   with_dx=False)
    assert rc == 0
    assert dw.to_host().tobytes() == want


@pytest.mark.parametrize("eps", [1e-5, 0.0])
def test_a_wide_backward_takes_special_rows_as_the_oracle_does(rms_norm_identical, eps, monkeypatch):
    """Rows of subnormal x, of squares that underflow, of +-1e15 (r**3 subnormal), of zeros (at
    eps = 0: r = inf, the canonical NaN), in a last leaf of 100 rows: the oracle's bits."""
    need_device(rms_norm_identical)
    rows, dim = 8 * LEAF + 100, 3840
    x, dy, w = _wide_inputs(rows, dim, 75, monkeypatch)
    flat = x.reshape(-1)
    for row, value in ((10, 1e-39), (2000, 1e-25), (5000, 1e15), (8 * LEAF + 99, 0.0)):
        for c in range(dim):
            flat[row * dim + c] = value if c % 2 else -value
    want = sha(*mt.rms_norm_backward(dy, x, w, eps, numeric_mode="identical"))
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    assert sha(*mt.rms_norm_backward(dy, x, w, eps, numeric_mode="identical")) == want


@pytest.mark.parametrize("arg, at", [("x", -1), ("dy", 4 * LEAF * 3840 + 17), ("w", 3839)])
def test_a_nonfinite_input_of_a_wide_backward_is_refused(rms_norm_identical, arg, at, monkeypatch):
    """x's last value (the one-row leaf), dy inside the fifth leaf, the weight's last column."""
    need_device(rms_norm_identical)
    rows, dim = WIDE[0]
    x, dy, w = _wide_inputs(rows, dim, 72, monkeypatch)
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    d = {"x": x, "dy": dy, "w": w}
    assert_nonfinite_refused("rms_norm_backward", arg, _rb, "identical", d, "inf", at % d[arg].size)


def test_a_refused_wide_backward_never_writes_a_device_dweight(rms_norm_identical, monkeypatch):
    need_device(rms_norm_identical)
    rows, dim = WIDE[0]
    x, dy, w = _wide_inputs(rows, dim, 73, monkeypatch)
    dy.reshape(-1)[rows * dim // 2] = float("nan")
    monkeypatch.setenv("MOJO_TRAIN_VENDOR", rms_norm_identical.vendor)
    lib = rms_norm_identical.backend.lib
    rc, dw = _c_backward_on_device(lib, {"x": x, "dy": dy, "w": w}, rows, dim)
    assert rc == ENONFINITE
    assert ffi.string(lib.mt_last_error()).decode().startswith("dy holds NaN")
    assert values(dw) == [SENTINEL] * dim


# (rows, dim, offset): rows off 16-byte alignment (the scalar walk); a row of 40000 floats is too
# wide for a GPU to stage x and dy of the backward in shared memory, one of 65539 even x alone.
@pytest.mark.parametrize("rows, dim, offset", [(7, 4096, 4), (3, 4097, 0), (2, 40000, 0), (2, 65539, 4)])
def test_device_buffers_give_the_host_bits_whatever_the_alignment_and_width(rms_norm_identical, rows, dim, offset):
    need_device(rms_norm_identical)
    t = "identical"
    x, dy, w = mat((rows, dim), 191, wide=True), mat((rows, dim), 192), mat((dim,), 193, 0.5, 1.5)
    dev = [device_copy_at(v, offset, t) for v in (x, dy, w)]
    assert sha(mt.rms_norm_forward(dev[0], dev[2], 1e-5, numeric_mode=t)) == \
        sha(mt.rms_norm_forward(x, w, 1e-5, numeric_mode=t))
    assert sha(*mt.rms_norm_backward(dev[1], dev[0], dev[2], 1e-5, numeric_mode=t)) == \
        sha(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode=t))


# ---- torch in float64 (tests/tolerances.py) ---------------------------------------------------------

@st.composite
def rms_cases(draw):
    dim = draw(st.integers(*tol.RMS_DIM_RANGE))
    rows = min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))
    return {"rows": draw(st.integers(tol.DENSE_ROWS_RANGE[0], rows)), "dim": dim,
            "affine": draw(st.booleans()), "eps": draw(st.sampled_from(tol.RMS_EPS)),
            "seed": draw(st.integers(0, 2**32 - 1))}


def rms_vs_torch(case, numeric_mode, dtype=None):
    import numpy as np
    torch = pytest.importorskip("torch")
    rng = np.random.Generator(np.random.PCG64(case["seed"]))
    rows, dim, eps = case["rows"], case["dim"], case["eps"]
    x, dy = rng.uniform(-1, 1, (rows, dim)).astype(np.float32), rng.uniform(-1, 1, (rows, dim)).astype(np.float32)
    w = rng.uniform(0.5, 1.5, dim).astype(np.float32) if case["affine"] else None

    def torch_run(dt):
        tx = torch.tensor(x, dtype=dt, requires_grad=True)
        tw = None if w is None else torch.tensor(w, dtype=dt, requires_grad=True)
        y = torch.nn.functional.rms_norm(tx, (dim,), tw, float(np.float32(eps)))
        y.backward(torch.tensor(dy, dtype=dt))
        out = {"y": y.detach().numpy(), "dx": tx.grad.numpy()}
        if w is not None:
            out["dweight"] = tw.grad.numpy()
        return out

    ref = torch_run(torch.float64)
    if dtype is None:
        got = {"y": np.asarray(mt.rms_norm_forward(x, w, eps, numeric_mode=numeric_mode))}
        dx, dwt = mt.rms_norm_backward(dy, x, w, eps, numeric_mode=numeric_mode)
        got["dx"] = np.asarray(dx)
        if w is not None:
            got["dweight"] = np.asarray(dwt)
    else:
        got = torch_run(dtype)
    units = tol.rms_units(x, w, dy, np.float32(eps))
    return {key: (got[key], ref[key], units[key].ravel()) for key in ref}


@settings(max_examples=20, **HYPOTHESIS)
@given(case=rms_cases())
def test_rms_norm_stays_within_the_bound_of_torch_float64(rms_norm_mode, case):
    assert_within_bound(rms_vs_torch(case, rms_norm_mode.numeric_mode), "%r rms_norm %r" % (rms_norm_mode, case))


def _figures_case(rng):
    dim = rng.randint(*tol.RMS_DIM_RANGE)
    return {"rows": rng.randint(1, min(tol.DENSE_ROWS_RANGE[1], max(tol.RMS_ELEMENTS // dim, 1))),
            "dim": dim, "affine": rng.random() < 0.5, "eps": rng.choice(tol.RMS_EPS), "seed": rng.getrandbits(32)}


if __name__ == "__main__":   # worst share of the bound used per output: ours (identical, fast), torch float32
    print_family_figures("rms_norm", _figures_case, rms_vs_torch, int(sys.argv[1]) if len(sys.argv) > 1 else 200)
