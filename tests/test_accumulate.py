"""Gradient accumulation: accumulate_grads, accumulation_is_aligned, step_accumulated.

Contract under test (native/contracts/accumulate.md): microbatch gradients meet elementwise in
the pairwise tree of clip.md step 4 (replayed here in Python with every addition rounded to
float32); a split is aligned -- the accumulated gradient has the unsplit batch's bits for every
contraction that follows the token rule -- exactly when accumulation_is_aligned says so, which
a symbolic comparison of the two trees checks exhaustively for small leaf sizes; aligned splits
reproduce the token-rule reduction of the whole batch bit for bit (replayed in Python, and
through linear_backward where it is built); misaligned ones are refused by name; NaN/inf and
overflow are refused; nothing the caller passed is ever written.
"""
import array
import os
import random
import struct

import pytest

import mojo_train as mt
from mojo_train import Array, _cards, accumulate_grads, accumulation_is_aligned

from _helpers import f32, raw, skip_unless_gradual_underflow

LEAF = 1024


@pytest.fixture
def acc(mode):
    if not mode.backend.has("accumulate"):
        pytest.skip("accumulate is not built into %r" % mode)
    return mode


def f32s(values):
    return array.array("f", values)


# ---- trees, symbolically ----------------------------------------------------------------------

def tree_fold(items, add):
    """mt_tree_fold: neighbours (2k, 2k+1) add level by level, an odd last one rises."""
    s = list(items)
    while len(s) > 1:
        nxt = [add(s[2 * k], s[2 * k + 1]) for k in range(len(s) // 2)]
        if len(s) % 2:
            nxt.append(s[-1])
        s = nxt
    return s[0]


def stack_fold(items, add):
    """The library's construction: push, merge once per trailing one bit, fold from the top."""
    st = []
    for k, v in enumerate(items):
        c = k + 1
        while c % 2 == 0:
            v = add(st.pop(), v)
            c //= 2
        st.append(v)
    acc_ = st.pop()
    while st:
        acc_ = add(st.pop(), acc_)
    return acc_


def sym_add(a, b):
    return ("+", a, b)


def token_rule(start, stop, leaf):
    """The token rule over tokens [start, stop) as an expression: chains over leaves, then the tree."""
    leaves = [("chain", s, min(s + leaf, stop)) for s in range(start, stop, leaf)]
    return tree_fold(leaves, sym_add)


def split_tree(tokens, steps, leaf):
    m = tokens // steps
    return tree_fold([token_rule(i * m, (i + 1) * m, leaf) for i in range(steps)], sym_add)


def rule(tokens, steps, leaf):
    if steps == 1:
        return True
    if tokens % steps:
        return False
    m = tokens // steps
    return m % leaf == 0 and (m // leaf) & (m // leaf - 1) == 0


@pytest.mark.parametrize("n", range(1, 130))
def test_the_stack_construction_is_the_pairwise_tree(n):
    items = [("x", i) for i in range(n)]
    assert stack_fold(items, sym_add) == tree_fold(items, sym_add)


@pytest.mark.parametrize("leaf", [1, 2, 3, 4, 5, 8])
def test_a_split_gives_the_unsplit_tree_exactly_when_the_rule_says_so(leaf):
    for tokens in range(1, 97):
        for steps in range(1, tokens + 1):
            if tokens % steps:
                continue
            same = split_tree(tokens, steps, leaf) == token_rule(0, tokens, leaf)
            assert same == rule(tokens, steps, leaf), (tokens, steps, leaf)


def test_accumulation_is_aligned_is_the_rule_at_the_real_leaf_length():
    for m in (1, 512, 1000, 1024, 1536, 2048, 3072, 4096, 5120, 8192, 16384 + 1024):
        for steps in range(1, 10):
            tokens = m * steps
            if tokens // LEAF > 200:
                continue
            same = split_tree(tokens, steps, LEAF) == token_rule(0, tokens, LEAF)
            assert accumulation_is_aligned(tokens, steps) == same == rule(tokens, steps, LEAF), (tokens, steps)
    assert not accumulation_is_aligned(4097, 2) and accumulation_is_aligned(4097, 1)
    assert accumulation_is_aligned(3 * 1024 * 2 ** 20, 3)


@pytest.mark.parametrize("args, exc", [((0, 1), ValueError), ((1024, 0), ValueError), ((1024.0, 1), TypeError),
                                       ((1024, True), TypeError), (("1024", 1), TypeError)])
def test_accumulation_is_aligned_refuses_non_positive_or_non_int_arguments(args, exc):
    with pytest.raises(exc):
        accumulation_is_aligned(*args)


# ---- the bits of the tree --------------------------------------------------------------------

def _value(rng):
    kind = rng.random()
    if kind < 0.05:
        return rng.choice([0.0, -0.0])
    if kind < 0.12:
        return struct.unpack("<f", struct.pack("<I", rng.randrange(1, 0x800000) | (rng.randrange(2) << 31)))[0]
    return f32(rng.choice([-1, 1]) * rng.uniform(0.5, 1.0) * 2.0 ** rng.randrange(-30, 30))


def f32_add(a, b):
    return f32(a + b)   # one float32 addition: exact in binary64, then rounded once


@pytest.mark.parametrize("steps", [1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 31, 33, 64])
@pytest.mark.parametrize("n", [1, 255, 256, 257, 1000])
def test_accumulate_is_the_pairwise_tree_with_float32_additions(acc, steps, n):
    skip_unless_gradual_underflow(acc)
    rng = random.Random(steps * 1000 + n)
    parts = [[_value(rng) for _ in range(n)] for _ in range(steps)]
    got = accumulate_grads([f32s(p) for p in parts], None, numeric_mode=acc.numeric_mode)
    want = f32s(tree_fold(col, f32_add) for col in zip(*parts))
    assert raw(got) == raw(want)


def test_negative_zeros_stay_negative_and_mixed_zeros_give_positive_zero(acc):
    got = accumulate_grads([f32s([-0.0, -0.0, 0.0]), f32s([-0.0, 0.0, -0.0]), f32s([-0.0, -0.0, -0.0])], None,
                           numeric_mode=acc.numeric_mode)
    assert [struct.pack("<f", x) for x in got.tolist()] == [struct.pack("<f", x) for x in (-0.0, 0.0, 0.0)]


# ---- aligned splits reproduce the unsplit batch --------------------------------------------------

def chain(values):
    a = 0.0
    for v in values:
        a = f32_add(a, v)
    return a


def token_rule_sum(per_token, start, stop):
    """dbias-like reduction of rows [start, stop): chains over leaves, the pairwise tree over leaves."""
    n = len(per_token[0])
    out = []
    for i in range(n):
        leaves = [chain(per_token[t][i] for t in range(s, min(s + LEAF, stop))) for s in range(start, stop, LEAF)]
        out.append(tree_fold(leaves, f32_add))
    return out


@pytest.mark.parametrize("tokens, steps", [(8192, 1), (8192, 2), (8192, 4), (8192, 8), (6144, 3), (5120, 5),
                                           (6144, 6), (3 * 4096, 3)])
def test_an_aligned_split_reproduces_the_unsplit_token_rule_bit_for_bit(acc, tokens, steps):
    assert accumulation_is_aligned(tokens, steps)
    rng = random.Random(tokens + steps)
    per_token = [[_value(rng) for _ in range(3)] for _ in range(tokens)]
    whole = token_rule_sum(per_token, 0, tokens)
    m = tokens // steps
    micro = [f32s(token_rule_sum(per_token, i * m, (i + 1) * m)) for i in range(steps)]
    got = accumulate_grads(micro, tokens, numeric_mode=acc.numeric_mode)
    assert raw(got) == raw(f32s(whole))


def _linear_backward_or_skip(mode):
    if not mode.backend.has("linear"):
        pytest.skip("linear_backward is not built into %r (no linear feature)" % mode)


def _rows(values, rows, cols):
    return Array.from_list(values).reshape(rows, cols)


@pytest.mark.parametrize("tokens, steps", [(4096, 4), (4096, 2), (8192, 4), (3072, 3), (2048, 1)])
def test_linear_backward_on_aligned_microbatches_accumulates_to_the_whole_batchs_bits(identical, tokens, steps):
    mode = identical
    _linear_backward_or_skip(mode)
    if not mode.backend.has("accumulate"):
        pytest.skip("accumulate is not built into %r" % mode)
    k, n = 6, 5
    rng = random.Random(tokens * 10 + steps)
    a = [_value(rng) for _ in range(tokens * k)]
    dc = [_value(rng) for _ in range(tokens * n)]
    w = _rows([_value(rng) for _ in range(n * k)], n, k)
    _, dw, db = mt.linear_backward(_rows(dc, tokens, n), _rows(a, tokens, k), w, need_bias_grad=True,
                                   numeric_mode=mode.numeric_mode)
    m = tokens // steps
    parts = []
    for i in range(steps):
        _, dwi, dbi = mt.linear_backward(_rows(dc[i * m * n:(i + 1) * m * n], m, n),
                                         _rows(a[i * m * k:(i + 1) * m * k], m, k), w, need_bias_grad=True,
                                         need_input_grad=False, numeric_mode=mode.numeric_mode)
        parts.append([dwi, dbi])
    got_w, got_b = accumulate_grads(parts, tokens, numeric_mode=mode.numeric_mode)
    assert raw(got_w) == raw(dw) and raw(got_b) == raw(db)


def test_the_card_gives_every_aligned_split_of_a_batch_the_unsplit_batchs_digests():
    card = _cards.read_card(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                         "fixtures", "accumulate.card"))
    unsplit, splits = {}, []
    for line in card.lines:
        if line.case.op == "accumulate_linear":
            batch = tuple(sorted((k, v) for k, v in line.case.args.items() if k != "parts"))
            if line.case.args["parts"] == 1:
                unsplit[batch] = line.digests
            else:
                splits.append((batch, line))
    assert splits and all(unsplit[batch] == line.digests for batch, line in splits), splits


def test_accumulation_keeps_its_old_import_path_in_schedule():
    from mojo_train import accumulate, schedule
    assert schedule.accumulate_grads is accumulate.accumulate_grads is mt.accumulate_grads
    assert schedule.accumulation_is_aligned is accumulate.accumulation_is_aligned is mt.accumulation_is_aligned
    assert schedule.TOKEN_LEAF == accumulate.TOKEN_LEAF == LEAF


# ---- structure and refusals ----------------------------------------------------------------------

def test_lists_of_tensors_keep_their_structure_and_shapes(acc):
    mb = [[Array.from_list([1.0, 2.0, 3.0, 4.0]).reshape(2, 2), f32s([0.5])] for _ in range(3)]
    out = accumulate_grads(mb, 3 * 1024, numeric_mode=acc.numeric_mode)
    assert isinstance(out, list) and len(out) == 2
    assert out[0].shape == (2, 2) and out[0].tolist() == [[3.0, 6.0], [9.0, 12.0]] and out[1].tolist() == [1.5]
    single = accumulate_grads([f32s([1.0]), f32s([2.0])], None, numeric_mode=acc.numeric_mode)
    assert isinstance(single, Array) and single.tolist() == [3.0]


@pytest.mark.parametrize("tokens, say", [(3001, "not divisible"), (3 * 1000, "whole number"),
                                         (3 * 3 * 1024, "power of two")])
def test_a_misaligned_split_is_refused_saying_why(acc, tokens, say):
    with pytest.raises(ValueError, match=say):
        accumulate_grads([f32s([1.0])] * 3, tokens, numeric_mode=acc.numeric_mode)


@pytest.mark.parametrize("grads, exc, say", [
    (f32s([1.0]), TypeError, "list"),
    ([], ValueError, "empty"),
    ([f32s([1.0]), f32s([1.0, 2.0])], ValueError, "shape"),
    ([[f32s([1.0])], [f32s([1.0]), f32s([2.0])]], ValueError, "tensors"),
    ([f32s([1.0]), [f32s([1.0])]], TypeError, "structure"),
    ([array.array("d", [1.0]), array.array("d", [1.0])], TypeError, "float32"),
    ([f32s([1.0]), f32s([float("nan")])], ValueError, r"^mojo_train\.accumulate_grads: microbatch_grads\[1\] holds"),
    ([f32s([float("inf")]), f32s([1.0])], ValueError, r"^mojo_train\.accumulate_grads: microbatch_grads\[0\] holds"),
    ([[f32s([1.0]), f32s([1.0])], [f32s([1.0]), f32s([float("nan")])]], ValueError,
     r"^mojo_train\.accumulate_grads: microbatch_grads\[1\]\[1\] holds"),
    ([f32s([3e38]), f32s([3e38])], ValueError, r"the sum of microbatch_grads\[\*\] overflows"),
])
def test_bad_microbatch_gradients_are_refused_by_name_and_nothing_is_written(acc, grads, exc, say):
    before = [raw(g) if not isinstance(g, list) else [raw(x) for x in g] for g in grads] \
        if isinstance(grads, list) else raw(grads)
    with pytest.raises(exc, match=say):
        accumulate_grads(grads, None, numeric_mode=acc.numeric_mode)
    after = [raw(g) if not isinstance(g, list) else [raw(x) for x in g] for g in grads] \
        if isinstance(grads, list) else raw(grads)
    assert before == after


def test_tokens_must_be_a_positive_int_or_none(acc):
    for bad, exc in ((0, ValueError), (1.5, TypeError), ("8", TypeError)):
        with pytest.raises(exc, match="tokens"):
            accumulate_grads([f32s([1.0])], bad, numeric_mode=acc.numeric_mode)


def test_empty_tensors_accumulate_to_empty_tensors(acc):
    out = accumulate_grads([[f32s([]), f32s([2.0])], [f32s([]), f32s([3.0])]], None, numeric_mode=acc.numeric_mode)
    assert out[0].tolist() == [] and out[1].tolist() == [5.0]


def test_device_microbatches_accumulate_on_the_device_with_the_hosts_bits(acc):
    if not acc.backend.has("device_buffers"):
        pytest.skip("%r takes no device buffers" % acc)
    rng = random.Random(3)
    host = [f32s(_value(rng) for _ in range(3000)) for _ in range(5)]
    dev = [mt.to_device(h, numeric_mode=acc.numeric_mode) for h in host]
    got = accumulate_grads(dev, 5 * 1024, numeric_mode=acc.numeric_mode)
    assert type(got) is mt.DeviceArray
    assert raw(got.to_host()) == raw(accumulate_grads(host, 5 * 1024, numeric_mode=acc.numeric_mode))


# ---- optimizers ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cls", [mt.SGD, mt.Adam, mt.AdamW])
def test_step_accumulated_is_accumulate_then_step(acc, cls):
    rng = random.Random(1)
    shapes = (7, 300)
    p1 = [f32s(_value(rng) for _ in range(n)) for n in shapes]
    p2 = [f32s(p) for p in p1]
    a = cls(p1, lr=0.01, accumulation_steps=4, numeric_mode=acc.numeric_mode)
    b = cls(p2, lr=0.01, numeric_mode=acc.numeric_mode)
    for t in range(3):
        mb = [[f32s(_value(rng) * 1e-3 for _ in range(n)) for n in shapes] for _ in range(4)]
        kept = [[raw(g) for g in m] for m in mb]
        a.step_accumulated(mb, 4 * 2048, max_norm=0.5)
        b.step(accumulate_grads(mb, 4 * 2048, numeric_mode=acc.numeric_mode), max_norm=0.5)
        assert [[raw(g) for g in m] for m in mb] == kept        # microbatch gradients never written
    assert [raw(p) for p in p1] == [raw(p) for p in p2]
    assert a.t == 3 and a.total_norm_ == b.total_norm_


def test_step_accumulated_refuses_a_wrong_count_or_a_misaligned_split_and_changes_nothing(acc):
    p = f32s([1.0, 2.0])
    opt = mt.AdamW(p, accumulation_steps=2, numeric_mode=acc.numeric_mode)
    before = (raw(p), raw(opt.exp_avg), opt.t)
    step = r"^mojo_train\.AdamW\.step_accumulated: "
    with pytest.raises(ValueError, match=step + r"microbatch_grads holds 3 .*accumulation_steps=2"):
        opt.step_accumulated([f32s([1.0, 1.0])] * 3, 3 * 1024)
    with pytest.raises(ValueError, match=step + r".*not aligned"):
        opt.step_accumulated([f32s([1.0, 1.0])] * 2, 3000)
    with pytest.raises(TypeError, match="list"):
        opt.step_accumulated(f32s([1.0, 1.0]), 2048)
    # the microbatches against params, before anything is combined (2026-12-03: the step's own
    # 'grads' was named, after combining); a NaN is named by microbatch, said of this call
    with pytest.raises(ValueError, match=step + r"microbatch_grads\[1\] has 2 tensors for 1 parameters"):
        opt.step_accumulated([[f32s([1.0, 1.0])], [f32s([1.0, 1.0]), f32s([1.0, 1.0])]], None)
    with pytest.raises(ValueError, match=step + r"microbatch_grads\[0\]\[0\] has shape \(3,\), params has \(2,\)"):
        opt.step_accumulated([[f32s([1.0, 1.0, 1.0])], [f32s([1.0, 1.0])]], None)
    with pytest.raises(ValueError, match=step + r"microbatch_grads\[1\] holds NaN or inf"):
        opt.step_accumulated([f32s([1.0, 1.0]), f32s([1.0, float("nan")])], None)
    assert (raw(p), raw(opt.exp_avg), opt.t) == before
    opt.step_accumulated([f32s([1.0, 1.0])] * 2, None)
    assert opt.t == 1


def test_step_accumulated_takes_an_empty_tensor_as_step_does(acc):
    """A 0-element parameter: step and accumulate_grads take its gradients, and so does
    step_accumulated (until 2026-12-03 it refused 'microbatch_grads[0][1] is empty')."""
    p, q = f32s([1.0, 2.0]), f32s([])
    opt = mt.SGD([p, q], lr=0.5, accumulation_steps=2, numeric_mode=acc.numeric_mode)
    opt.step_accumulated([[f32s([1.0, 1.0]), f32s([])]] * 2, None)
    assert opt.t == 1 and list(p) == [0.0, 1.0]


@pytest.mark.parametrize("bad, exc", [(0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError)])
def test_accumulation_steps_must_be_a_positive_int(bad, exc):
    with pytest.raises(exc, match="accumulation_steps"):
        mt.SGD(f32s([1.0]), accumulation_steps=bad)


def test_state_dict_carries_the_schedule_lr_and_accumulation_steps_and_resumes_bit_identically(acc):
    sched = mt.WarmupCosineLR(0.05, warmup_steps=2, total_steps=9, min_lr=0.005)
    p1 = f32s([1.0, -1.0, 0.25])
    opt = mt.AdamW(p1, lr_schedule=sched, accumulation_steps=2, numeric_mode=acc.numeric_mode)
    rng = random.Random(9)
    grads = [[f32s(_value(rng) for _ in range(3)) for _ in range(2)] for _ in range(6)]
    for t in range(3):
        opt.step_accumulated(grads[t], 2048)
    state = opt.state_dict()
    assert state["lr_schedule"] == sched.config() and state["accumulation_steps"] == 2
    p2 = f32s(p1)
    resumed = mt.AdamW(p2, accumulation_steps=2, numeric_mode=acc.numeric_mode)   # no schedule given: it comes back
    resumed.load_state_dict(state)
    assert resumed.lr_schedule == sched
    for t in range(3, 6):
        opt.step_accumulated(grads[t], 2048)
        resumed.step_accumulated(grads[t], 2048)
    assert raw(p1) == raw(p2) and resumed.lr_ == sched.lr_at(6)
    other = mt.AdamW(f32s(p2), accumulation_steps=4, numeric_mode=acc.numeric_mode)
    with pytest.raises(ValueError, match="accumulation_steps=2"):
        other.load_state_dict(state)
    clash = mt.AdamW(f32s(p2), accumulation_steps=2, lr_schedule=mt.ConstantLR(0.1), numeric_mode=acc.numeric_mode)
    with pytest.raises(ValueError, match="lr_schedule"):
        clash.load_state_dict(state)
    assert clash.t == 0 and clash.lr_schedule == mt.ConstantLR(0.1)


def test_a_plain_lr_is_carried_by_the_state_dict(acc):
    opt = mt.SGD(f32s([1.0]), lr=0.1, numeric_mode=acc.numeric_mode)
    opt.lr = 0.025
    fresh = mt.SGD(f32s([1.0]), lr=0.1, numeric_mode=acc.numeric_mode)
    fresh.load_state_dict(opt.state_dict())
    assert fresh.lr == 0.025 and fresh.lr_schedule is None
