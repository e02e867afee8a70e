"""clip_grad_norm_ through the public Python API (native/contracts/clip.md).

Contract under test: clip_grad_norm_ returns the pre-clip total and scales the gradients in
place with exactly the bits of the contract's tree replayed in Python (tests/_helpers.py),
where the summation order matters too; it is the clip the optimizers apply with ``max_norm``;
below ``max_norm`` it leaves the gradients alone; what it does not implement (other norms,
``error_if_nonfinite=False``) and a non-finite total, read-only gradients or gradients sharing
memory are refused by name, and a refusal writes nothing.
"""
import array
import re

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from mojo_train import SGD, clip_grad_norm_

from _helpers import (equal_grads, flat, grads_for_step, make_optimizer, params_for, raw, ref_clip, ref_norms,
                      wide_array)

SIZES = (5, 300, 130)


# ---- the contract's bits -----------------------------------------------------------------------

def test_clip_grad_norm_returns_the_total_and_scales_in_place_with_the_contracts_bits(identical):
    grads = [wide_array(n, 60 + j) for j, n in enumerate((4096 + 300, 7, 129, 3 * 4096))]
    total, coef, clipped = ref_clip([list(g) for g in grads], 2.0)
    got = clip_grad_norm_(grads, 2.0, numeric_mode=identical.numeric_mode)
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
    (dict(norm_type=1.0), NotImplementedError, "norm_type"),
    (dict(norm_type=float("inf")), NotImplementedError, "norm_type"),
    (dict(norm_type="fro"), NotImplementedError, "norm_type"),
    (dict(error_if_nonfinite=False), NotImplementedError, "error_if_nonfinite=False is not supported: a non-finite"),
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
                                    dict(error_if_nonfinite=True, foreach=True)])
def test_clip_grad_norm_takes_torchs_switches_at_values_asking_for_nothing_we_lack(mode, kwargs):
    plain, switched = grads_for_step(SIZES, 1), grads_for_step(SIZES, 1)
    total = clip_grad_norm_(plain, 0.5, numeric_mode=mode.numeric_mode)
    assert clip_grad_norm_(switched, 0.5, numeric_mode=mode.numeric_mode, **kwargs) == total
    assert [raw(g) for g in switched] == [raw(g) for g in plain] != [raw(g) for g in grads_for_step(SIZES, 1)]


@pytest.mark.parametrize("poison", [float("nan"), float("inf"), 3e38])
def test_clip_grad_norm_refuses_a_nonfinite_total_and_writes_nothing(mode, poison):
    grads = grads_for_step(SIZES, 1)
    grads[1][5] = poison
    if poison == 3e38:
        grads[1][6] = poison
    before = [raw(g) for g in grads]
    with pytest.raises(ValueError, match="grads|overflow"):
        clip_grad_norm_(grads, 1.0, numeric_mode=mode.numeric_mode)
    assert [raw(g) for g in grads] == before


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
