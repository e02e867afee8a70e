"""clip_grad_norm_ through the public Python API (native/contracts/clip.md).

Contract under test: clip_grad_norm_ returns the pre-clip total and scales the gradients in
place with exactly the bits of the contract's tree replayed in Python (tests/_helpers.py), for
the 2-norm, the 1-norm and the max norm, where the summation order matters too; it is the clip
the optimizers apply with ``max_norm``; below ``max_norm`` it leaves the gradients alone; empty
tensors have norm 0; with torch's default ``error_if_nonfinite=False`` a non-finite total scales
the gradients as torch's does (NaN bits canonical), with ``error_if_nonfinite=True`` it is
refused; other norms, read-only gradients or gradients sharing memory are refused by name, and
a refusal writes nothing.
"""
import array
import contextlib
import inspect
import math
import re
import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mojo_train import SGD, clip_grad_norm_
from mojo_train._native import ffi

from _helpers import (EINVAL, add32, equal_grads, f32, flat, grads_for_step, make_optimizer, params_for, raw,
                      ref_clip, ref_norms, skip_unless_gradual_underflow, wide_array)

NORM_TYPES = (2.0, 1.0, math.inf)
NAN_BITS = struct.pack("<I", 0x7fc00000)

SIZES = (5, 300, 130)


# ---- the contract's bits -----------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_clip_grad_norm_returns_the_total_and_scales_in_place_with_the_contracts_bits(identical, norm_type):
    grads = [wide_array(n, 60 + j) for j, n in enumerate((4096 + 300, 7, 129, 3 * 4096))]
    total, coef, clipped = ref_clip([list(g) for g in grads], 2.0, norm_type)
    got = clip_grad_norm_(grads, 2.0, norm_type, numeric_mode=identical.numeric_mode)
    assert got == total and coef < 1.0
    assert flat(grads) == flat(clipped)


def test_clip_grad_norm_agrees_with_the_norms_of_the_pinned_tree(identical):
    grads = [wide_array(n, 70 + j) for j, n in enumerate((1, 128, 129, 4097, 2 * 4096 + 1))]
    norms, total = ref_norms(grads)
    assert clip_grad_norm_(grads, 1e9, numeric_mode=identical.numeric_mode) == total
    assert norms[0] == abs(grads[0][0])


def _rows_then_small():
    """Each lane: 1.0 in row 0, then 32 rows of 2**-12. Ascending rows round every small square
    away (1 + 2**-24 -> 1); a reversed fold would keep their sum (1 + 2**-19)."""
    return array.array("f", [1.0] * 128 + [2.0**-12] * (128 * 32))


def _chunks_then_small():
    """Chunk partials 1 then seven of 2**-24: the pairwise tree keeps 3 * 2**-23 of them, a
    serial fold of the partials rounds each away."""
    x = [0.0] * (8 * 4096)
    x[0] = 1.0
    for c in range(1, 8):
        x[c * 4096] = 2.0**-12
    return array.array("f", x)


@pytest.mark.parametrize("make, alternative", [
    (_rows_then_small, 11.313719749450684),        # sqrt(128 + 2**-12) in float32
    (_chunks_then_small, 1.0),                     # sqrt(1) after a serial fold
])
def test_the_norm_follows_the_contracts_tree_where_order_matters(identical, make, alternative):
    x = make()
    _, total = ref_norms([x])
    assert total != alternative                     # the input tells the two orders apart
    assert clip_grad_norm_([x], 1e9, numeric_mode=identical.numeric_mode) == total
    opt = SGD([array.array("f", [0.0] * len(x))], numeric_mode=identical.numeric_mode)
    assert opt.step([make()], max_norm=1e9) == total


def test_the_one_norm_adds_in_the_contracts_order_not_exactly(identical):
    x = array.array("f", [1.0] * 128 + [2.0**-24] * (128 * 32))   # each lane: 1, then 32 x 2**-24 -> 1
    exact = f32(math.fsum(abs(v) for v in x))
    _, total = ref_norms([x], 1.0)
    assert total == 128.0 != exact         # the exact sum keeps the small terms (128 + 2**-12)
    assert clip_grad_norm_([x], 1e9, 1.0, numeric_mode=identical.numeric_mode) == total


def test_the_one_norm_sums_the_tensor_norms_by_the_tree_in_tensor_order(identical):
    """Norms 1, then 31 of 2**-24 each: the lanes keep them apart and the lane tree adds them
    pairwise (part of their sum survives), where a fold in tensor order rounds each away."""
    grads = [array.array("f", [1.0])] + [array.array("f", [2.0**-24]) for _ in range(31)]
    serial = 0.0
    for g in grads:
        serial = add32(serial, g[0])
    _, total = ref_norms(grads, 1.0)
    assert serial == 1.0 != total
    assert clip_grad_norm_(grads, 1e9, 1.0, numeric_mode=identical.numeric_mode) == total


@pytest.mark.parametrize("values, want", [
    ([0.5, -3.25, 2.0**-149, -0.0], 3.25),
    ([-2.0**-149, 0.0], 2.0**-149),                 # a subnormal is the max, exactly
    ([1.0, float("nan"), -7.0], float("nan")),      # NaN wins wherever it stands
    ([float("-inf"), float("nan")], float("nan")),
    ([float("-inf"), 1.0], float("inf")),
])
def test_the_max_norm_is_the_exact_largest_absolute_value_and_nan_propagates(mode, values, want):
    if 0 < abs(want) < 2.0**-126:
        skip_unless_gradual_underflow(mode)
    g = array.array("f", values)
    got = clip_grad_norm_([array.array("f", [0.0]), g], 1e9, "inf", numeric_mode=mode.numeric_mode)
    assert got == want or (want != want and got != got)


# ---- empty tensors ---------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_empty_tensors_have_norm_zero_and_stay_untouched(identical, norm_type):
    grads = [array.array("f"), wide_array(1000, 3), array.array("f"), array.array("f"), wide_array(4097, 4),
             array.array("f")]
    total, _, clipped = ref_clip([list(g) for g in grads], 0.5, norm_type)
    assert clip_grad_norm_(grads, 0.5, norm_type, numeric_mode=identical.numeric_mode) == total
    assert [len(g) for g in grads] == [0, 1000, 0, 0, 4097, 0]
    assert flat(grads) == flat(clipped)


@pytest.mark.parametrize("norm_type, sizes, seed", [(2.0, (5, 3, 3, 5, 1), 50), (1.0, (3, 2, 4, 1, 1), 70)])
def test_an_empty_tensor_keeps_its_place_in_the_vector_of_norms(identical, norm_type, sizes, seed):
    """Its norm 0 shifts the lanes of the tensors after it: the tree groups them otherwise."""
    full = [wide_array(n, seed + j, -30, 0) for j, n in enumerate(sizes)]
    with_empty = full[:1] + [array.array("f")] + full[1:3] + [array.array("f")] + full[3:]
    _, total = ref_norms(with_empty, norm_type)
    assert total != ref_norms(full, norm_type)[1]          # the input tells the two apart
    assert clip_grad_norm_(with_empty, 1e9, norm_type, numeric_mode=identical.numeric_mode) == total


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_only_empty_tensors_or_none_give_zero_and_change_nothing(mode, norm_type):
    assert clip_grad_norm_([], 1.0, norm_type, numeric_mode=mode.numeric_mode) == 0.0
    assert clip_grad_norm_((), 1.0, norm_type, numeric_mode=mode.numeric_mode) == 0.0
    empties = [array.array("f"), memoryview(bytearray()).cast("f")]
    assert clip_grad_norm_(empties, 1.0, norm_type, numeric_mode=mode.numeric_mode) == 0.0
    assert clip_grad_norm_(array.array("f"), 1.0, norm_type, numeric_mode=mode.numeric_mode) == 0.0


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_empty_torch_tensors_whose_data_pointer_is_null_are_taken(mode, norm_type):
    torch = pytest.importorskip("torch")
    grads = [torch.empty(0), torch.tensor([3.0, -4.0]), torch.zeros(0, 5)]
    assert grads[0].data_ptr() == 0                  # the C ABI sees NULL for it
    want = {2.0: 5.0, 1.0: 7.0, math.inf: 4.0}[norm_type]
    assert clip_grad_norm_(grads, 1.0, norm_type, numeric_mode=mode.numeric_mode) == pytest.approx(want)
    assert grads[1].tolist() == pytest.approx([3.0 / want, -4.0 / want], rel=1e-5)


def test_the_c_abi_takes_null_for_an_empty_tensor_and_refuses_other_norm_types(mode):
    lib = mode.backend.lib
    x = ffi.new("float[]", [3.0, 4.0])
    table, offsets, out = ffi.new("float *[]", [ffi.NULL, x]), ffi.new("int32_t[]", [0, 0, 2]), ffi.new("float[2]")
    assert lib.mt_clip_grad_norm(table, out, offsets, 1.0, 2.0, 1, 2) == 0
    assert list(out) == pytest.approx([5.0, 1.0 / (5.0 + 1e-6)]) and list(x) == pytest.approx([0.6, 0.8])
    norms, total = ffi.new("float[2]"), ffi.new("float[1]")
    assert lib.mt_grad_norms(norms, total, table, offsets, math.inf, 2) == 0
    assert list(norms) == [0.0, 4.0 * list(out)[1]] and total[0] == norms[1]
    before = list(x)
    for bad in (3.0, 0.0, -math.inf, math.nan):
        assert lib.mt_clip_grad_norm(table, out, offsets, 1e-3, bad, 1, 2) == EINVAL
        assert "norm_type" in ffi.string(lib.mt_last_error()).decode()
        assert lib.mt_grad_norms(norms, total, table, offsets, bad, 2) == EINVAL
    assert list(x) == before
    table[1] = ffi.NULL                               # a non-empty tensor still needs its pointer
    assert lib.mt_clip_grad_norm(table, out, offsets, 1.0, 2.0, 1, 2) == EINVAL


@pytest.mark.parametrize("norm_type", NORM_TYPES)
@pytest.mark.parametrize("sizes", [(1,), (7, 3000, 1), (4097, 0, 129, 4096), (2**20 + 7, 300)])
def test_each_norm_type_stays_within_the_bound_of_torch_float64(mode, norm_type, sizes):
    """tests/tolerances.py: norms and clipped gradients are compared relatively (unit 0)."""
    torch = pytest.importorskip("torch")
    tolerances = pytest.importorskip("tolerances")
    grads = [wide_array(n, 90 + j, -20, 0) for j, n in enumerate(sizes)]
    ref = [torch.tensor(list(g), dtype=torch.float64, requires_grad=True) for g in grads]
    for t, g in zip(ref, grads):
        t.grad = torch.tensor(list(g), dtype=torch.float64)
    # torch refuses the inf norm of an empty tensor (ours is 0): give it the others only
    want = float(torch.nn.utils.clip_grad_norm_([t for t in ref if t.numel()], 0.25, norm_type))
    got = clip_grad_norm_(grads, 0.25, norm_type, numeric_mode=mode.numeric_mode)
    assert abs(got - want) <= tolerances.RTOL * abs(want)
    for ours, t in zip(grads, ref):
        theirs = t.grad.tolist()
        assert all(abs(a - b) <= tolerances.RTOL * abs(b) for a, b in zip(ours, theirs))


# ---- non-finite totals: torch's default scales, error_if_nonfinite=True refuses --------------------

def test_error_if_nonfinite_defaults_to_torchs_false():
    torch = pytest.importorskip("torch")
    ours = inspect.signature(clip_grad_norm_).parameters
    theirs = inspect.signature(torch.nn.utils.clip_grad_norm_).parameters
    assert ours["error_if_nonfinite"].default is False is theirs["error_if_nonfinite"].default
    assert ours["norm_type"].default == theirs["norm_type"].default == 2.0


def _poisoned(poison, where):
    grads = grads_for_step((5, 300, 130), 1)
    for j, i in where:
        grads[j][i] = poison
    return grads


NONFINITE = [  # (poison, positions, norm types whose total it makes non-finite)
    (float("nan"), [(1, 5)], NORM_TYPES),
    (float("inf"), [(2, 129)], NORM_TYPES),
    (float("-inf"), [(0, 0)], NORM_TYPES),
    (float("nan"), [(0, 4), (2, 0)], NORM_TYPES),
    (3e38, [(1, 5), (1, 6)], (2.0, 1.0)),      # finite gradients whose squares / sum overflow
]


@pytest.mark.parametrize("poison, where, norm_types", NONFINITE)
@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_a_nonfinite_total_scales_the_gradients_as_torch_does_by_default(mode, poison, where, norm_types, norm_type):
    if norm_type not in norm_types:
        where = []                                   # the max norm of finite gradients: a plain clip
    torch = pytest.importorskip("torch")
    grads = _poisoned(poison, where)
    theirs = [torch.tensor(list(g), requires_grad=True) for g in grads]
    for t, g in zip(theirs, grads):
        t.grad = torch.tensor(list(g))
    want = float(torch.nn.utils.clip_grad_norm_(theirs, 1.0, norm_type))
    got = clip_grad_norm_(grads, 1.0, norm_type, numeric_mode=mode.numeric_mode)
    assert (got != got and want != want) or got == pytest.approx(want, rel=1e-5)
    for ours, t in zip(grads, theirs):
        ref = t.grad.tolist()
        assert [v != v for v in ours] == [v != v for v in ref]
        assert [math.copysign(1, v) if v == 0 else v for v in ours if v == v] == \
            pytest.approx([math.copysign(1, v) if v == 0 else v for v in ref if v == v], rel=1e-5)


@pytest.mark.parametrize("poison, where, norm_types", NONFINITE)
def test_a_nonfinite_total_writes_the_contracts_bits_and_canonical_nans(identical, poison, where, norm_types):
    for norm_type in norm_types:
        grads = _poisoned(poison, where)
        total, coef, clipped = ref_clip([list(g) for g in grads], 1.0, norm_type)
        assert not math.isfinite(total) and coef != 1.0
        got = clip_grad_norm_(grads, 1.0, norm_type, error_if_nonfinite=False, numeric_mode=identical.numeric_mode)
        assert struct.pack("<f", got) == struct.pack("<f", total)
        assert b"".join(raw(g) for g in grads) == array.array("f", flat(clipped)).tobytes()
        nans = [v for g in grads for v in g if v != v]
        assert bool(nans) == (not math.isfinite(poison))      # overflow alone: coefficient 0, zeros
        assert all(struct.pack("<f", v) == NAN_BITS for v in nans)


@pytest.mark.parametrize("norm_type, want_total, want_grads", [
    (1.0, math.inf, "zeros"),       # 1e38 * 4: the 1-norm overflows; coefficient 0
    (2.0, math.inf, "zeros"),       # the squares overflow
    (math.inf, 1e38, "scaled"),     # the max norm stays finite, exact
])
def test_huge_gradients_overflow_the_sums_to_inf_and_become_zeros(mode, norm_type, want_total, want_grads):
    """max_norm 1000 keeps the coefficient 1e-35 normal, so the fast mode (approximate division,
    which returns 0 for a divisor above 2**126) must scale too: its division is the exact one."""
    values = [1e38, -1e38, 1e38, -1e38]
    g = array.array("f", values)
    total = clip_grad_norm_([g], 1e3, norm_type, numeric_mode=mode.numeric_mode)
    assert total == f32(want_total)
    if want_grads == "zeros":
        assert raw(g) == array.array("f", [0.0, -0.0, 0.0, -0.0]).tobytes()      # g * 0 keeps the sign
    else:
        assert list(g) == pytest.approx([1e3, -1e3, 1e3, -1e3], rel=1e-6)
    again = array.array("f", values)
    with pytest.raises(ValueError, match="overflow") if want_grads == "zeros" else contextlib.nullcontext():
        clip_grad_norm_([again], 1e3, norm_type, error_if_nonfinite=True, numeric_mode=mode.numeric_mode)
    assert (raw(again) == array.array("f", values).tobytes()) == (want_grads == "zeros")   # refused: untouched


@pytest.mark.parametrize("poison, where, norm_type", [(poison, where, p) for poison, where, norm_types in NONFINITE
                                                      for p in norm_types])
def test_error_if_nonfinite_refuses_a_nonfinite_total_and_writes_nothing(mode, poison, where, norm_type):
    grads = _poisoned(poison, where)
    before = [raw(g) for g in grads]
    with pytest.raises(ValueError, match=r"^mojo_train\.clip_grad_norm_: .*(grads|overflow)"):
        clip_grad_norm_(grads, 1.0, norm_type, error_if_nonfinite=True, numeric_mode=mode.numeric_mode)
    assert [raw(g) for g in grads] == before


@pytest.mark.parametrize("norm_type", NORM_TYPES)
def test_subnormal_gradients_and_coefficients_keep_gradual_underflow(identical, norm_type):
    """Magnitudes 2**-149 .. 2**-60: subnormal inputs (their squares vanish), subnormal products."""
    grads = [wide_array(n, 80 + j, -149, -60) for j, n in enumerate((1023, 5, 4097))]
    total, coef, clipped = ref_clip([list(g) for g in grads], 1e-27, norm_type)
    assert 0 < coef < 1 and any(0 < abs(v) < 2.0**-126 for t in clipped for v in t)
    assert any(0 < abs(v) < 2.0**-126 for g in grads for v in g)
    assert clip_grad_norm_(grads, 1e-27, norm_type, numeric_mode=identical.numeric_mode) == total
    assert flat(grads) == flat(clipped)


# ---- the optimizers' clip ----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_clip_grad_norm_is_the_clip_the_optimizers_apply(mode, kind):
    g1, g2 = grads_for_step(SIZES, 1), grads_for_step(SIZES, 1)
    total = clip_grad_norm_(g1, 0.5, numeric_mode=mode.numeric_mode)
    opt = make_optimizer(kind, params_for(SIZES), mode.numeric_mode)
    assert opt.step(g2, max_norm=0.5) == total
    assert [raw(g) for g in g1] == [raw(g) for g in g2]


def test_clip_grad_norm_below_max_norm_leaves_grads_alone(mode):
    grads = grads_for_step(SIZES, 1)
    before = [raw(g) for g in grads]
    total = clip_grad_norm_(grads, 1e6, numeric_mode=mode.numeric_mode)
    assert total > 0 and [raw(g) for g in grads] == before


# ---- what it takes and what it refuses -----------------------------------------------------------

@pytest.mark.parametrize("kwargs, exc, match", [
    (dict(norm_type=3.0), NotImplementedError, r"norm_type=3\.0 is not implemented; the pinned norms are 2, 1 and inf"),
    (dict(norm_type=0), NotImplementedError, "norm_type=0 is not implemented"),
    (dict(norm_type=float("-inf")), NotImplementedError, "norm_type=-inf is not implemented"),
    (dict(norm_type=float("nan")), NotImplementedError, "norm_type=nan is not implemented"),
    (dict(norm_type=10 ** 400), NotImplementedError, "norm_type=1000.* is not implemented"),
    (dict(norm_type="fro"), ValueError, "norm_type='fro' is not a number; pass 2, 1 or 'inf'"),
    (dict(norm_type=True), TypeError, "norm_type must be a real number or 'inf', got True"),
    (dict(norm_type=None), TypeError, "norm_type must be a real number or 'inf', got None"),
    (dict(error_if_nonfinite=1), TypeError, "error_if_nonfinite must be True or False"),
    (dict(foreach="yes"), TypeError, "foreach must be None, True or False"),
    (dict(foreach=True, error_if_nonfinite=None), TypeError, "error_if_nonfinite"),
    (dict(max_norm=-1.0), ValueError, "max_norm"),
    (dict(max_norm=float("nan")), ValueError, "max_norm"),
])
def test_clip_grad_norm_refuses_what_it_does_not_implement_by_name(mode, kwargs, exc, match):
    grads = grads_for_step(SIZES, 1)
    before = [raw(g) for g in grads]
    kwargs = dict(kwargs)
    max_norm = kwargs.pop("max_norm", 1.0)
    with pytest.raises(exc, match=match):
        clip_grad_norm_(grads, max_norm, numeric_mode=mode.numeric_mode, **kwargs)
    assert [raw(g) for g in grads] == before


@pytest.mark.parametrize("kwargs", [dict(foreach=None), dict(foreach=False), dict(foreach=True),
                                    dict(error_if_nonfinite=True, foreach=True), dict(error_if_nonfinite=False),
                                    dict(norm_type=2), dict(norm_type="2"), dict(norm_type=2.0)])
def test_clip_grad_norm_takes_torchs_switches_at_values_asking_for_nothing_we_lack(mode, kwargs):
    plain, switched = grads_for_step(SIZES, 1), grads_for_step(SIZES, 1)
    total = clip_grad_norm_(plain, 0.5, numeric_mode=mode.numeric_mode)
    assert clip_grad_norm_(switched, 0.5, numeric_mode=mode.numeric_mode, **kwargs) == total
    assert [raw(g) for g in switched] == [raw(g) for g in plain] != [raw(g) for g in grads_for_step(SIZES, 1)]


@pytest.mark.parametrize("spelling, norm_type", [(1, 1.0), ("1", 1.0), (float("inf"), math.inf), ("inf", math.inf),
                                                 ("Infinity", math.inf), (math.inf, math.inf)])
def test_norm_type_takes_torchs_spellings(mode, spelling, norm_type):
    """torch reads norm_type with float(), so 'inf' is the max norm there too."""
    plain, spelled = grads_for_step(SIZES, 1), grads_for_step(SIZES, 1)
    total = clip_grad_norm_(plain, 0.5, norm_type, numeric_mode=mode.numeric_mode)
    assert clip_grad_norm_(spelled, 0.5, spelling, numeric_mode=mode.numeric_mode) == total
    assert [raw(g) for g in spelled] == [raw(g) for g in plain]


def test_clip_grad_norm_refuses_read_only_grads(mode):
    frozen = [memoryview(array.array("f", [3.0, 4.0]).tobytes()).cast("f")]
    with pytest.raises(ValueError, match="writable|read-only"):
        clip_grad_norm_(frozen, 1.0, numeric_mode=mode.numeric_mode)


# ---- gradients in memory of their own ------------------------------------------------------------

def test_clip_grad_norm_refuses_a_gradient_listed_twice_and_writes_nothing(mode):
    for container in ("Array", "array.array"):
        g = equal_grads(container, 1)
        before = [raw(x) for x in g]
        for _ in range(2):            # a second call is checked as well (nothing remembered)
            with pytest.raises(ValueError,
                               match=r"^mojo_train\.clip_grad_norm_: grads\[1\] and grads\[2\] share memory"):
                clip_grad_norm_([g[0], g[1], g[1], g[3]], 0.5, numeric_mode=mode.numeric_mode)
        assert [raw(x) for x in g] == before
    big = array.array("f", [3.0] * 100)
    with pytest.raises(ValueError, match=r"grads\[0\] and grads\[1\] share memory"):
        clip_grad_norm_([memoryview(big)[:60], memoryview(big)[50:]], 0.5, numeric_mode=mode.numeric_mode)
    assert big.tolist() == [3.0] * 100


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(0, 47), st.integers(1, 16)), min_size=1, max_size=6))
def test_gradients_are_refused_exactly_when_two_share_a_byte_and_the_two_named_do(mode, slices):
    big = array.array("f", [1.0] * 64)
    grads = [memoryview(big)[a:a + n] for a, n in slices]
    overlapping = {(i, j) for i in range(len(slices)) for j in range(i + 1, len(slices))
                   if slices[i][0] < sum(slices[j]) and slices[j][0] < sum(slices[i])}
    try:
        clip_grad_norm_(grads, 1e9, numeric_mode=mode.numeric_mode)
    except ValueError as e:
        named = tuple(int(x) for x in re.findall(r"grads\[(\d+)\]", str(e)))
        assert named in overlapping, (str(e), overlapping)
    else:
        assert not overlapping
    assert big.tolist() == [1.0] * 64
