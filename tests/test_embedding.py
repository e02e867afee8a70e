"""The embedding: a bit-exact gather, and a backward that is the token rule of
native/contracts/embedding.md on every vendor, numeric mode, plan, thread count and launch geometry.

Contract under test: native/contracts/embedding.md and mojo_train/embedding.py's docstrings
(refusals by name, the padding row, accumulation into grad, the exact microbatch splits), the
.npz files of mojo_train/_npz.py (numpy reads ours, we read numpy's, bad files are refused),
and that none of it imports numpy. The reconstruction below (numpy float32, one rounding per
addition) is the tests' independent replay of the contract.
"""
import array
import io
import itertools
import os
import pathlib
import pickle
import re
import shutil
import struct
import subprocess
import sys
import zipfile

import pytest

import mojo_train
from mojo_train import _cards_embedding, _native, _npz
from mojo_train._array import Array
from mojo_train.embedding import Embedding, embedding_backward, embedding_forward

from _helpers import EINVAL, ENONFINITE, REPO

LEAF = 1024


def _need(mode):
    if not mode.backend.has("embedding"):
        pytest.skip("the %s library has no embedding" % mode)


def _np():
    return pytest.importorskip("numpy")


def _skewed(np, n, vocab, power=3, seed=0):
    """Ids concentrated on small rows (floor(vocab * u**power)), as int64."""
    u = np.random.default_rng(seed).random(n)
    return np.minimum((vocab * u ** power).astype(np.int64), vocab - 1)


def _dy(np, n, d, seed=1, low=-1.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, (n, d)).astype(np.float32)


def _host(x):
    np = _np()
    return np.asarray(x.to_host() if hasattr(x, "to_host") else x)


def _bits(x):
    return _host(x).tobytes()


# ---- the contract, replayed ------------------------------------------------------------------
def _tree(parts):
    """mt_tree_fold over float32 vectors: neighbours add, an odd last one rises."""
    s = list(parts)
    while len(s) > 1:
        nxt = [s[2 * k] + s[2 * k + 1] for k in range(len(s) // 2)]
        if len(s) % 2:
            nxt.append(s[-1])
        s = nxt
    return s[0]


def token_rule(np, dy, ids, vocab, pad=None, grad=None):
    """The backward by the contract: for each row, every leaf's partial (+0.0 when the leaf
    holds no term) folded in ascending position order, then the pairwise tree over ALL leaves."""
    n, d = dy.shape
    out = np.zeros((vocab, d), np.float32) if grad is None else grad.copy()
    leaves = -(-n // LEAF)
    for v in sorted(set(int(i) for i in ids)):
        if v == pad:
            continue
        parts = []
        for leaf in range(leaves):
            acc = np.zeros(d, np.float32)
            for p in range(leaf * LEAF, min(n, (leaf + 1) * LEAF)):
                if ids[p] == v:
                    acc = acc + dy[p]
            parts.append(acc)
        new = _tree(parts)
        out[v] = new if grad is None else out[v] + new
    return out


SHAPES = [  # (vocab, d, n, pad): odd widths, >2 leaves, repeated ids, padding
    (1, 3, 5, None), (7, 3, 3000, None), (50, 17, 3100, 3), (1000, 5, 5000, 0), (13, 33, 2049, -1),
    (3, 1, 1024, None), (300, 65, 1025, None),
]


@pytest.mark.parametrize("vocab, d, n, pad", SHAPES)
def test_backward_is_the_token_rule_reconstructed_in_python(mode, vocab, d, n, pad):
    _need(mode)
    np = _np()
    ids, dy = _skewed(np, n, vocab), _dy(np, n, d)
    p = None if pad is None else pad % vocab
    want = token_rule(np, dy, ids, vocab, p)
    for plan in ("scan", "sort", "auto"):
        got = embedding_backward(dy, ids, vocab, padding_idx=pad, plan=plan, numeric_mode=mode.numeric_mode)
        assert _bits(got) == want.tobytes(), plan


def test_accumulating_is_one_addition_per_row_with_terms(mode):
    _need(mode)
    np = _np()
    ids, dy = _skewed(np, 3000, 40), _dy(np, 3000, 6)
    grad = _dy(np, 40, 6, seed=9)
    grad[39] = -0.0                                  # untouched rows keep every bit, -0.0 too
    ids[ids == 39] = 38
    want = token_rule(np, dy, ids, 40, pad=2, grad=grad)
    want[2] = grad[2]
    got = grad.copy()
    out = embedding_backward(dy, ids, 40, padding_idx=2, grad=got, numeric_mode=mode.numeric_mode)
    assert out is got and got.tobytes() == want.tobytes()
    assert struct.pack("<f", -0.0) == got[39, 0].tobytes()


def test_rows_without_terms_and_the_padding_row_are_positive_zero(mode):
    _need(mode)
    np = _np()
    dy = np.full((4, 2), -1.0, np.float32)
    got = _host(embedding_backward(dy, [1, 1, 3, 3], 5, padding_idx=3, numeric_mode=mode.numeric_mode))
    assert got.tolist() == [[0, 0], [-2, -2], [0, 0], [0, 0], [0, 0]]
    assert not np.signbit(got[[0, 2, 3, 4]]).any()


@pytest.mark.parametrize("threads", [1, 3, 8])
def test_bits_do_not_depend_on_the_thread_count_or_launch_geometry(identical, threads):
    _need(identical)
    np = _np()
    ids, dy = _skewed(np, 9000, 2000), _dy(np, 9000, 70)
    want = embedding_backward(dy, ids, 2000, plan="sort", numeric_mode="identical")
    lib = identical.backend.lib
    before = int(lib.mt_num_threads())          # the configured threads (per block on a GPU)
    geometry = (threads, 0) if identical.vendor == "cpu" else ({1: 32, 3: 96, 8: 512}[threads], threads)
    assert lib.mt_set_launch_geometry(*geometry) == 0
    try:
        for plan in ("sort", "scan"):
            got = embedding_backward(dy, ids, 2000, plan=plan, numeric_mode="identical")
            assert _bits(got) == _bits(want), (plan, geometry)
    finally:
        lib.mt_set_launch_geometry(before, 0)


# ---- the forward -----------------------------------------------------------------------------
def test_forward_copies_every_bit_of_the_rows(mode):
    _need(mode)
    np = _np()
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    raw = table.view(np.uint32)
    raw[1, 0], raw[1, 1], raw[2, 2] = 0x7FA00001, 0x80000000, 1    # a signalling NaN, -0.0, a subnormal
    ids = np.array([[1, 2], [0, 1]], np.int32)
    out = _host(embedding_forward(table, ids, numeric_mode=mode.numeric_mode))
    assert out.shape == (2, 2, 3) and out.tobytes() == table[ids].tobytes()


@pytest.mark.parametrize("ids", [[3, 0], (3, 0), array.array("b", [3, 0]), array.array("Q", [3, 0]),
                                 array.array("i", [3, 0]), array.array("q", [3, 0])],
                         ids=["list", "tuple", "int8", "uint64", "int32", "int64"])
def test_forward_takes_any_integer_ids(ids):
    table = Array.from_list(range(8), "float32").reshape(4, 2)
    assert embedding_forward(table, ids).tolist() == [[6.0, 7.0], [0.0, 1.0]]


# ---- refusals --------------------------------------------------------------------------------
def _table():
    return Array.from_list([float(i) for i in range(12)], "float32").reshape(4, 3)


@pytest.mark.parametrize("ids, exc, words", [
    ([1.0], TypeError, "ids must hold integers"),
    ([True], TypeError, "ids must hold integers"),
    (array.array("f", [1.0]), TypeError, "ids has dtype float32"),
    (array.array("d", [1.0]), TypeError, "ids has dtype float64"),
    ([0, 4], ValueError, r"ids\[1\] = 4 is outside \[0, 4\)"),
    ([2, -1, 7], ValueError, r"ids\[1\] = -1 is outside"),
    ([1, -1, 2], ValueError, r"ids\[1\] = -1 is outside \[0, 4\)"),
    ([3, 2, -(1 << 40)], ValueError, r"ids\[2\] = -1099511627776 is outside \[0, 4\)"),
    ([3, 1 << 40, 0], ValueError, r"ids\[1\] = 1099511627776 is outside \[0, 4\)"),
    ([], ValueError, "ids is empty"),
    ([[1], [2]], TypeError, "must be flat"),
])
def test_bad_ids_are_refused_by_name(ids, exc, words):
    with pytest.raises(exc, match=words):
        embedding_forward(_table(), ids)
    dy = Array((len(ids), 3), "float32") if isinstance(ids, list) and ids and not isinstance(ids[0], list) else None
    if dy is not None:
        with pytest.raises(exc, match=words):
            embedding_backward(dy, ids, 4)


def test_nan_or_inf_in_dy_or_grad_is_refused_and_nothing_is_written(mode):
    _need(mode)
    np = _np()
    dy = _dy(np, 2000, 3)
    dy[1500, 2] = np.inf
    grad = np.ones((5, 3), np.float32)
    with pytest.raises(ValueError, match=r"dy\[1500, 2\] is NaN or inf; nothing was written"):
        embedding_backward(dy, np.zeros(2000, np.int64), 5, grad=grad, numeric_mode=mode.numeric_mode)
    dy[1500, 2] = 0.0
    grad[4, 1] = np.nan
    before = grad.tobytes()
    with pytest.raises(ValueError, match=r"^mojo_train\.embedding_backward: grad\[4, 1\] is NaN"):
        embedding_backward(dy, np.zeros(2000, np.int64), 5, grad=grad, numeric_mode=mode.numeric_mode)
    assert grad.tobytes() == before
    ids = np.zeros(2000, np.int64)
    ids[1999] = 5
    grad[4, 1] = 1.0
    before = grad.tobytes()
    with pytest.raises(ValueError, match=r"ids\[1999\] = 5 is outside \[0, 5\)"):
        embedding_backward(dy, ids, 5, grad=grad, numeric_mode=mode.numeric_mode)
    assert grad.tobytes() == before


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(vocab=0), ValueError, "vocab must be >= 1"),
    (dict(vocab=True), TypeError, "vocab must be an int"),
    (dict(padding_idx=4), ValueError, r"padding_idx must be within \[-4, 4\)"),
    (dict(padding_idx=1.0), TypeError, "padding_idx must be an int"),
    (dict(plan="fastest"), ValueError, "plan must be 'auto', 'scan' or 'sort'"),
    (dict(dy=Array((2, 3), "float64")), TypeError, "dy has dtype float64"),
    (dict(dy=Array((3, 3), "float32")), ValueError, r"dy has shape \(3, 3\)"),
    (dict(dy=Array((2, 0), "float32")), ValueError, "dy is empty"),
    (dict(grad=Array((4, 2), "float32")), ValueError, r"grad has shape \(4, 2\)"),
    (dict(grad=Array((4, 3), "float64")), TypeError, "grad has dtype float64"),
    (dict(grad=memoryview(bytes(48)).cast("f", (4, 3))), ValueError, "grad is written in place"),
])
def test_bad_backward_arguments_are_refused_by_name(kwargs, exc, words):
    args = dict(dy=Array((2, 3), "float32"), ids=[0, 1], vocab=4)
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        embedding_backward(args.pop("dy"), args.pop("ids"), args.pop("vocab"), **args)


def test_the_c_abi_refuses_a_bad_flags_word_and_id_width(mode):
    _need(mode)
    lib, ffi = mode.backend.lib, _native.ffi
    dw, dy = Array((2, 1), "float32"), Array((1, 1), "float32")
    ids = Array.from_list([0], "int64")
    args = (ffi.cast("float *", dw.address), ffi.cast("float *", dy.address), ffi.cast("void *", ids.address))
    assert lib.mt_embedding_backward(*args, 8, 1, 2, 1, -1, 1 << 3) == EINVAL
    assert b"flags word" in ffi.string(lib.mt_last_error())
    assert lib.mt_embedding_backward(*args, 8, 1, 2, 1, -1, 3 << 1) == EINVAL
    assert lib.mt_embedding_backward(*args, 2, 1, 2, 1, -1, 0) == EINVAL
    assert b"id_bytes" in ffi.string(lib.mt_last_error())
    assert lib.mt_embedding_backward(*args, 8, 0, 2, 1, -1, 0) == 0      # no ids: every row +0.0
    assert dw.tolist() == [[0.0], [0.0]]
    # the forward's flags: 0 or MT_MAP_OUT_FRESH (1); other bits refused, out untouched; a refused
    # id's words say whether out was declared fresh (then undefined) or untouched
    out, table = Array.from_list([7.0], "float32"), Array.from_list([1.0, 2.0], "float32")
    fwd = (ffi.cast("float *", out.address), ffi.cast("float *", table.address), ffi.cast("void *", ids.address))
    for flags in (2, 1 << 31):
        assert lib.mt_embedding_forward(*fwd, 8, 1, 2, 1, flags) == EINVAL
        assert b"flags" in ffi.string(lib.mt_last_error()) and out.tolist() == [7.0]
    bad = Array.from_list([-1], "int64")
    for flags, words in ((0, b"nothing was written"), (1, b"out's contents are undefined (declared fresh)")):
        assert lib.mt_embedding_forward(fwd[0], fwd[1], ffi.cast("void *", bad.address), 8, 1, 2, 1, flags) == EINVAL
        assert ffi.string(lib.mt_last_error()) == b"ids[0] = -1 is outside [0, 2) (vocab); " + words + (
            b"; no input was written" if flags else b"")
        assert out.tolist() == [7.0]       # a host output: never written on a refusal
    assert lib.mt_embedding_forward(*fwd, 8, 1, 2, 1, 1) == 0 and out.tolist() == [1.0]


# ---- microbatches ----------------------------------------------------------------------------
def _sym_token_rule(tokens, leaf):
    """The token rule's expression tree over symbols: in-leaf left folds, then the pairwise tree."""
    chains = []
    for i in range(0, len(tokens), leaf):
        acc = tokens[i]
        for t in tokens[i + 1:i + leaf]:
            acc = (acc, t)
        chains.append(acc)
    return _tree_sym(chains)


def _tree_sym(s):
    while len(s) > 1:
        s = [(s[2 * k], s[2 * k + 1]) for k in range(len(s) // 2)] + ([s[-1]] if len(s) % 2 else [])
    return s[0]


def _sym_running_sum(tokens, sizes, leaf):
    total, start = None, 0
    for size in sizes:
        part = _sym_token_rule(tokens[start:start + size], leaf)
        total, start = part if total is None else (total, part), start + size
    return total


def exact_split(sizes, leaf=LEAF):
    """Embedding.backward's docstring rule. The first leaf may hold M_1 followed by
    microbatches of one position each (a one-position microbatch continues the leaf's chain);
    from there, with S leaves covered (S a power of two, whole leaves), each microbatch but the
    last covers S more whole leaves (so S doubles), and the last covers 1..S leaves."""
    i, covered = 1, sizes[0]
    while i < len(sizes) and covered < leaf and sizes[i] == 1:
        covered, i = covered + 1, i + 1
    if i == len(sizes):
        return True
    whole = covered // leaf
    if covered % leaf or whole & (whole - 1):
        return False
    for size in sizes[i:-1]:
        if size != whole * leaf:
            return False
        whole *= 2
    return -(-sizes[-1] // leaf) <= whole


def _recursive_split(sizes, leaf):
    """The same rule read off the tree from the end: the last microbatch must be the leaves
    after the largest power of two P below L; the rest must cover P leaves, recursively; inside
    one leaf only one-position microbatches may follow the first."""
    k, total = len(sizes), sum(sizes)
    leaves = -(-total // leaf)
    while k > 1:
        if leaves == 1:
            return all(s == 1 for s in sizes[1:k])
        p = 1 << ((leaves - 1).bit_length() - 1)
        if sum(sizes[:k - 1]) != p * leaf:
            return False
        k, leaves = k - 1, p
    return True


def _compositions(total):
    for cuts in itertools.product((0, 1), repeat=total - 1):
        sizes, run = [], 1
        for c in cuts:
            if c:
                sizes.append(run)
                run = 0
            run += 1
        yield sizes + [run]


@pytest.mark.parametrize("leaf, max_tokens", [(1, 13), (2, 14), (3, 13), (4, 14)])
def test_the_microbatch_condition_holds_for_every_split_of_small_batches(leaf, max_tokens):
    """Symbolic proof over every composition: a running sum of microbatch gradients has the
    unsplit gradient's expression tree exactly when exact_split says so."""
    checked = 0
    for total in range(1, max_tokens + 1):
        tokens = ["t%d" % i for i in range(total)]
        whole = _sym_token_rule(tokens, leaf)
        for sizes in _compositions(total):
            same = _sym_running_sum(tokens, sizes, leaf) == whole
            assert same == exact_split(sizes, leaf) == _recursive_split(sizes, leaf), (leaf, sizes)
            checked += 1
    assert checked > 2000


@pytest.mark.parametrize("sizes, exact", [
    ((2048, 1500), True), ((1024, 1024, 1900), True), ((4096, 4000), True), ((1024, 1024, 2048, 300), True),
    ((2048, 2048, 2048), True), ((1000, 1, 1, 1, 21, 1024), False), ((1020, 1, 1, 1, 1, 1024), True),
    ((1024, 2500), False), ((1000, 2548), False), ((1024, 1024, 1024, 1024), False), ((3072, 1000), False)])
def test_microbatches_reproduce_the_unsplit_gradient_exactly_when_aligned(identical, sizes, exact):
    _need(identical)
    np = _np()
    n = sum(sizes)
    ids, dy = _skewed(np, n, 50, power=2), _dy(np, n, 8)
    whole = _host(embedding_backward(dy, ids, 50, numeric_mode="identical"))
    grad, start = None, 0
    for size in sizes:
        part = slice(start, start + size)
        if grad is None:
            grad = _host(embedding_backward(dy[part], ids[part], 50, numeric_mode="identical")).copy()
        else:
            embedding_backward(dy[part], ids[part], 50, grad=grad, numeric_mode="identical")
        start += size
    assert exact_split(list(sizes)) == exact
    assert (grad.tobytes() == whole.tobytes()) == exact


def test_equal_microbatches_of_whole_leaves_are_exact_by_the_pairwise_tree(identical):
    """The docstring's alternative: gradients of equal microbatches of 2^j whole leaves (the
    last may be shorter) combined by mt_tree_fold -- what mt_accumulate computes -- are the
    unsplit gradient, where the running sum of the same microbatches is not."""
    _need(identical)
    np = _np()
    for size, count, tail in ((1024, 4, 1000), (2048, 3, 2048), (1024, 5, 1)):
        n = size * count + tail
        ids, dy = _skewed(np, n, 40, power=2), _dy(np, n, 5)
        whole = _bits(embedding_backward(dy, ids, 40))
        cuts = list(range(0, n, size)) + [n]
        parts = [_host(embedding_backward(dy[a:b], ids[a:b], 40)) for a, b in zip(cuts, cuts[1:])]
        assert _tree(parts).tobytes() == whole
        running = parts[0].copy()
        for a, b in zip(cuts[1:], cuts[2:]):
            embedding_backward(dy[a:b], ids[a:b], 40, grad=running)
        assert (running.tobytes() == whole) == exact_split([b - a for a, b in zip(cuts, cuts[1:])])


# ---- torch, float64 --------------------------------------------------------------------------
def test_backward_is_within_the_torch_float64_bound():
    torch = pytest.importorskip("torch")
    np = _np()
    sys.path.insert(0, os.path.dirname(__file__))
    from tolerances import assert_close_to_reference
    for vocab, d, n, pad in [(50304, 16, 16384, None), (100, 64, 20000, 0), (7, 3, 3000, 2)]:
        ids, dy = _skewed(np, n, vocab), _dy(np, n, d)
        weight = torch.zeros(vocab, d, dtype=torch.float64, requires_grad=True)
        torch.nn.functional.embedding(torch.from_numpy(ids), weight, padding_idx=pad).backward(
            torch.from_numpy(dy.astype(np.float64)))
        ref = weight.grad.numpy()
        ours = _host(embedding_backward(dy, ids, vocab, padding_idx=pad))
        scale = np.zeros((vocab, d))
        np.add.at(scale, ids, np.abs(dy.astype(np.float64)))
        # unit: the largest sum of |terms| of a row, the scale a sum's rounding error is measured in
        assert_close_to_reference(ours, ref, "embedding dweight %r" % ((vocab, d, n),), unit=float(scale.max()))


# ---- the layer -------------------------------------------------------------------------------
def test_the_layer_owns_a_copy_of_its_table_and_gathers_like_the_function():
    np = _np()
    table = np.arange(12, dtype=np.float32).reshape(4, 3)
    emb = Embedding(4, 3, padding_idx=-1, weight=table)
    table[0, 0] = 99.0
    assert emb.padding_idx == 3 and emb.weight.tolist()[0][0] == 0.0
    assert emb([0, 3]).tolist() == [[0.0, 1.0, 2.0], [9.0, 10.0, 11.0]]          # the padding row is kept
    emb.weight = table
    assert emb.forward([0]).tolist() == [[99.0, 1.0, 2.0]]
    with pytest.raises(ValueError, match=r"weight has shape \(3, 4\), want \(4, 3\)"):
        emb.weight = np.zeros((3, 4), np.float32)
    with pytest.raises(TypeError, match="weight has dtype float64"):
        Embedding(4, 3, weight=np.zeros((4, 3)))
    assert repr(emb) == "Embedding(4, 3, padding_idx=3)"


def test_layer_backward_is_the_function_and_refuses_a_frozen_table():
    np = _np()
    table = np.ones((30, 4), np.float32)
    ids, dy = _skewed(np, 2500, 30), _dy(np, 2500, 4)
    emb = Embedding(30, 4, padding_idx=1, weight=table, plan="scan")
    assert _bits(emb.backward(ids, dy)) == _bits(embedding_backward(dy, ids, 30, padding_idx=1, plan="sort"))
    with pytest.raises(ValueError, match="dy rows have 4 columns, embedding_dim is 5"):
        Embedding(30, 5, weight=np.ones((30, 5), np.float32)).backward(ids, dy)
    frozen = Embedding.from_pretrained(table)
    assert frozen.freeze and frozen.forward([2]).tolist() == [[1.0] * 4]
    with pytest.raises(RuntimeError, match="frozen"):
        frozen.backward(ids, dy)
    assert not Embedding.from_pretrained(table, freeze=False).freeze


@pytest.mark.parametrize("kwargs, exc, words", [
    (dict(max_norm=1.0), ValueError, "max_norm is refused"),
    (dict(norm_type=1.0), ValueError, "norm_type only takes 2.0"),
    (dict(scale_grad_by_freq=True), ValueError, "scale_grad_by_freq=True is refused"),
    (dict(sparse=True), ValueError, "sparse=True is refused"),
    (dict(sparse=0), TypeError, "sparse must be True or False, got 0"),     # np.False_ was read as True
    (dict(scale_grad_by_freq=None), TypeError, "scale_grad_by_freq must be True or False, got None"),
    (dict(_weight=None), TypeError, "_weight= is not taken"),
    (dict(device="cuda"), TypeError, "device= is not taken"),
    (dict(dtype="float16"), TypeError, "dtype= is not taken"),
    (dict(colour="red"), TypeError, "unexpected keyword argument 'colour'"),
    (dict(plan="fast"), ValueError, "plan must be"),
    (dict(padding_idx=4), ValueError, "padding_idx must be within"),
    (dict(weight=None), ValueError, "pass exactly one of weight= "),
])
def test_the_layer_refuses_torch_options_it_does_not_implement(kwargs, exc, words):
    args = dict(weight=Array((4, 3), "float32"))
    args.update(kwargs)
    with pytest.raises(exc, match=words):
        Embedding(4, 3, **args)


def test_a_generator_draws_the_table_and_zeroes_the_padding_row():
    gen = mojo_train.random.Generator(7)
    emb = Embedding(10, 4, padding_idx=2, generator=gen)
    rows = emb.weight.tolist()
    assert rows[2] == [0.0] * 4 and any(x != 0.0 for x in rows[0])


def test_the_layer_pickles_with_its_table():
    np = _np()
    emb = Embedding(5, 2, padding_idx=0, weight=np.arange(10, dtype=np.float32).reshape(5, 2), plan="sort")
    back = pickle.loads(pickle.dumps(emb))
    assert (back.weight.tobytes(), back.padding_idx, back.plan) == (emb.weight.tobytes(), 0, "sort")


# ---- .npz ------------------------------------------------------------------------------------
def test_save_and_load_round_trip_and_numpy_reads_the_file(tmp_path):
    np = _np()
    table = _dy(np, 6, 3)
    emb = Embedding.from_pretrained(table, freeze=False, padding_idx=-2, plan="scan")
    path = str(tmp_path / "emb.npz")
    emb.save(path)
    with np.load(path) as z:
        assert z["weight"].dtype == np.float32 and z["weight"].tobytes() == table.tobytes()
        assert str(z["format"]) == "mojo_train.Embedding/1" and z["meta"].tolist() == [6, 3, 4, 0]
    back = Embedding.load(path)
    assert (back.weight.tobytes(), back.padding_idx, back.plan, back.freeze) == (table.tobytes(), 4, "scan", False)


def test_we_read_what_numpy_savez_writes_without_casting(tmp_path):
    np = _np()
    arrays = {"f": np.arange(6, dtype=np.float32).reshape(2, 3), "d": np.array([1.5]), "i": np.int32(7),
              "q": np.arange(3, dtype=np.int64), "u": np.array([1, 2], np.uint32), "b": np.zeros((0, 2), np.uint8),
              "s": np.array("text é")}
    for save in (np.savez, np.savez_compressed):
        path = str(tmp_path / ("%s.npz" % save.__name__))
        save(path, **arrays)
        got = _npz.read(path)
        assert got.pop("s") == "text é"
        for name, value in got.items():
            assert value.dtype == arrays[name].dtype.name and value.shape == arrays[name].shape, name
            assert value.tobytes() == arrays[name].tobytes(), name
    ours = str(tmp_path / "ours.npz")
    _npz.write(ours, {k: (Array.from_buffer(np.asarray(v)) if k != "s" else "text é")
                      for k, v in arrays.items()})
    with np.load(ours) as z:
        for name, value in arrays.items():
            assert z[name].dtype == value.dtype and z[name].shape == value.shape and z[name].tobytes() == value.tobytes()


def _corrupted(tmp_path, how):
    np = _np()
    path = str(tmp_path / "x.npz")
    if how in ("fortran", "big-endian", "object", "float16"):
        value = {"fortran": np.asfortranarray(np.ones((2, 3), np.float32)), "big-endian": np.ones(3, ">f4"),
                 "object": np.array([None, 1], object), "float16": np.ones(2, np.float16)}[how]
        np.savez(path, weight=value)
        return path
    np.savez(path, weight=np.ones(100, np.float32))
    data = bytearray(open(path, "rb").read())
    if how == "truncated":
        data = data[:len(data) // 2]
    elif how == "flipped":
        data[200] ^= 0xFF               # inside the member's data: its CRC no longer matches
    elif how in ("short", "long", "magic", "header", "plain"):       # well-formed zips, bad members
        blob = _npz._npy_header("<f4", (100,)) + bytes(396 if how == "short" else 400) + (b"x" if how == "long" else b"")
        if how == "magic":
            blob = b"\x93NUMPX" + blob[6:]
        elif how == "header":
            blob = blob.replace(b"'shape'", b"'shapes'")
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("weight.npy" if how != "plain" else "weight.txt", blob)
        return path
    open(path, "wb").write(bytes(data))
    return path


@pytest.mark.parametrize("how, words", [
    ("truncated", "not a readable .npz"), ("flipped", "Bad CRC"), ("magic", "bad magic"),
    ("header", "keys descr, fortran_order, shape"), ("plain", "every member of an .npz is a .npy"),
    ("short", "truncated: shape"), ("long", "more bytes than its header"), ("fortran", "Fortran-ordered"),
    ("big-endian", "'>f4' is not read"), ("object", "'|O' is not read"), ("float16", "'<f2' is not read")])
def test_bad_npz_files_are_refused_clearly(tmp_path, how, words):
    path = _corrupted(tmp_path, how)
    with pytest.raises(ValueError, match=words):
        _npz.read(path)


def test_load_refuses_a_file_of_something_else(tmp_path):
    np = _np()
    path = str(tmp_path / "other.npz")
    np.savez(path, format=np.array("something/1"), weight=np.ones((2, 2), np.float32))
    with pytest.raises(ValueError, match="not an Embedding"):
        Embedding.load(path)
    np.savez(path, format=np.array("mojo_train.Embedding/1"), weight=np.ones((2, 2)), plan=np.array("auto"),
             numeric_mode=np.array(""), meta=np.array([2, 2, -1, 0]))
    with pytest.raises(ValueError, match="expected float32, got float64"):
        Embedding.load(path)


# Layers whose files the damage tests take apart: every stored setting away from its default, all
# at their defaults, and a table of signed zeros, subnormals and extremes.
SAVED_LAYERS = {
    "settings": dict(shape=(3, 2), values=[0.5 * k - 1.0 for k in range(6)], padding_idx=1, plan="sort",
                     numeric_mode="identical", freeze=True),
    "defaults": dict(shape=(1, 1), values=[0.25]),
    "extremes": dict(shape=(4, 3), values=[-0.0, 0.0, 1e-45, -1e-45, 3.4028235e38, -3.4028235e38, 1.1754944e-38,
                                           -1.0, 2.0 ** -20, 7.0, -0.0, 1.5],
                     padding_idx=-1, plan="scan", numeric_mode="fast"),
}


def _saved_layer(tmp_path, which="settings"):
    """(path, bytes, fields) of a small saved layer (SAVED_LAYERS[which])."""
    spec = dict(SAVED_LAYERS[which])
    (v, d), table = spec.pop("shape"), array.array("f", spec.pop("values"))
    freeze = spec.pop("freeze", False)
    emb = Embedding(v, d, weight=memoryview(table).cast("B").cast("f", (v, d)), **spec)
    emb.freeze = freeze
    path = str(tmp_path / ("%s.npz" % which))
    emb.save(path)
    return path, open(path, "rb").read(), _fields(emb)


def _fields(emb):
    return (emb.weight.tobytes(), emb.num_embeddings, emb.embedding_dim, emb.padding_idx, emb.plan,
            emb.numeric_mode, emb.freeze)


def _load_outcome(path, fields):
    """'original' when ``path`` loads as ``fields``, 'refused: <message>' for a ValueError of
    Embedding.load naming the file, else what went wrong."""
    try:
        got = _fields(Embedding.load(path))
    except ValueError as exc:
        text = str(exc)
        ok = text.startswith("mojo_train.Embedding.load: ") and path in text
        return ("refused: " if ok else "a badly worded refusal: ") + text
    except BaseException as exc:            # MemoryError, OSError, KeyError, struct.error... are defects
        return "%s: %s" % (type(exc).__name__, exc)
    return "original" if got == fields else "a different layer loaded: %r" % (got,)


def _payloads(blob):
    """[(first, end)] byte ranges of the members' stored data: what the zip's CRC-32s cover."""
    ranges = []
    with zipfile.ZipFile(io.BytesIO(blob)) as zf:
        for info in zf.infolist():
            name_len, extra_len = struct.unpack_from("<HH", blob, info.header_offset + 26)
            first = info.header_offset + 30 + name_len + extra_len
            ranges.append((first, first + info.compress_size))
    return ranges


@pytest.mark.parametrize("which", list(SAVED_LAYERS))
def test_every_truncation_of_a_saved_file_is_refused_naming_it(tmp_path, which):
    _, blob, fields = _saved_layer(tmp_path, which)
    damaged = str(tmp_path / "damaged.npz")
    with open(damaged, "wb") as f:
        f.write(blob)
    outcomes = {}
    for n in range(len(blob) - 1, -1, -1):      # each a prefix of the one before: cut it in place
        os.truncate(damaged, n)
        outcomes[n] = _load_outcome(damaged, fields)
    assert {n: o for n, o in outcomes.items() if not o.startswith("refused: ")} == {}
    assert len(outcomes) == len(blob)


@pytest.mark.parametrize("which", list(SAVED_LAYERS))
def test_every_single_bit_flip_of_a_saved_file_loads_the_original_or_is_refused(tmp_path, which):
    """len * 8 files. A flip in a member's data is refused by the zip's CRC-32; a flip elsewhere
    is refused by a structure check or lies in a field the reader ignores (times, attributes,
    the local headers' copies of the directory's fields), and then the layer is the original."""
    _, blob, fields = _saved_layer(tmp_path, which)
    payload = {i for first, end in _payloads(blob) for i in range(first, end)}
    damaged = str(tmp_path / "damaged.npz")
    with open(damaged, "wb") as f:
        f.write(blob)
    problems, loaded, refused = {}, 0, 0
    fd = os.open(damaged, os.O_WRONLY)
    try:
        for i in range(len(blob)):
            for bit in range(8):
                os.pwrite(fd, bytes([blob[i] ^ (1 << bit)]), i)
                outcome = _load_outcome(damaged, fields)
                os.pwrite(fd, blob[i:i + 1], i)
                if i in payload and "Bad CRC-32" not in outcome:
                    problems[(i, bit)] = "a payload flip not refused by the CRC: " + outcome
                elif outcome == "original":
                    loaded += 1
                elif outcome.startswith("refused: "):
                    refused += 1
                else:
                    problems[(i, bit)] = outcome
    finally:
        os.close(fd)
    assert problems == {}
    assert loaded + refused == 8 * len(blob) and refused > 8 * len(payload)     # headers were refused too
    assert _load_outcome(damaged, fields) == "original"                          # the file was put back


def _crafted(tmp_path, how):
    """A small .npz (CRCs right) whose claims need a GiB: a .npy header's shape, or the zip
    directory's uncompressed size of a stored or a deflated member."""
    path = str(tmp_path / ("%s.npz" % how))
    if how == "npy-shape":
        blob = _npz._npy_header("<f4", (2 ** 28,)) + bytes(64)
        with zipfile.ZipFile(path, "w") as zf:
            zf.writestr("weight.npy", blob)
        return path
    method = zipfile.ZIP_STORED if how == "stored-size" else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(path, "w", method) as zf:
        zf.writestr("weight.npy", _npz._npy_header("<f4", (16,)) + bytes(64))
    data = bytearray(open(path, "rb").read())
    directory = data.rindex(b"PK\x01\x02")           # the one central directory entry
    struct.pack_into("<I", data, directory + 24, 2 ** 30)     # its uncompressed size
    open(path, "wb").write(bytes(data))
    return path


@pytest.mark.parametrize("how, words", [("npy-shape", r"shape \(268435456,\) of <f4 needs 1073741824 bytes, "
                                                      r"the member holds 64"),
                                        ("stored-size", "claims 1073741824 bytes from"),
                                        ("deflated-size", "claims 1073741824 bytes from")])
def test_a_file_claiming_a_huge_array_is_refused_before_allocating(tmp_path, how, words):
    import tracemalloc
    path = _crafted(tmp_path, how)
    assert os.path.getsize(path) < 2000
    tracemalloc.start()
    try:
        with pytest.raises(ValueError, match=words):
            _npz.read(path)
        with pytest.raises(ValueError, match=r"^mojo_train\.Embedding\.load: .*" + words):
            Embedding.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2 ** 20, peak


def _rewritten(tmp_path, **changes):
    path, _, _ = _saved_layer(tmp_path)
    entries = {k: v for k, v in _npz.read(path).items()}
    entries.update(changes)
    _npz.write(path, {k: v for k, v in entries.items() if v is not None})
    return path


@pytest.mark.parametrize("change, words", [
    (dict(numeric_mode="exact"), "has numeric_mode 'exact'; it is '' .* or one of identical"),
    (dict(plan="fastest"), "has plan 'fastest'; a plan is one of auto, scan, sort"),
    (dict(extra=Array.from_list([1.0])), "unexpected entries extra"),
    (dict(meta=Array.from_list([3, 2, 3, 1], "int64")), r"bad settings \[3, 2, 3, 1\]"),
    (dict(meta=Array.from_list([3, 2, -1, 2], "int64")), r"bad settings \[3, 2, -1, 2\]"),
    (dict(meta=Array.from_list([3, 2, -1, 0], "int32")), "expected int64, got int32"),
    (dict(weight=Array((2, 3))), r"expected shape \(3, 2\), got \(2, 3\)"),
    (dict(format="mojo_train.Embedding/2"), "not an Embedding"),
    (dict(plan=None), "entry 'plan' is missing"),
    (dict(numeric_mode=Array.from_list([0], "uint8")), "expected text, got an array")])
def test_load_checks_every_stored_field_naming_the_file(tmp_path, change, words):
    path = _rewritten(tmp_path, **change)
    with pytest.raises(ValueError, match=r"^mojo_train\.Embedding\.load: %s.*%s" % (re.escape(path), words)):
        Embedding.load(path)


def test_load_takes_every_numeric_mode_save_writes(tmp_path):
    for mode in ("", "identical", "deterministic", "fast"):
        back = Embedding.load(_rewritten(tmp_path, numeric_mode=mode))
        assert back.numeric_mode == (mode or None)


def test_save_and_load_take_a_file_name_and_refuse_a_file_object_by_name(tmp_path):
    path, _, fields = _saved_layer(tmp_path)
    layer = Embedding.load(pathlib.Path(path))
    assert _fields(layer) == fields and _fields(Embedding.load(os.fsencode(path))) == fields
    for where, call in (("load", lambda f: Embedding.load(f)), ("save", layer.save)):
        with open(path, "r+b") as f:
            with pytest.raises(TypeError, match=r"^mojo_train\.Embedding\.%s: path must be a file name \(str, bytes "
                                                r"or os\.PathLike\), got BufferedRandom" % where):
                call(f)
    with pytest.raises(TypeError, match=r"^mojo_train\.Embedding\.load: path must be a file name.*got NoneType"):
        Embedding.load(None)
    assert _fields(Embedding.load(path)) == fields          # the refused save wrote nothing


def test_load_of_a_missing_file_is_file_not_found_not_damage(tmp_path):
    with pytest.raises(FileNotFoundError):
        Embedding.load(str(tmp_path / "absent.npz"))


# ---- numpy stays out -------------------------------------------------------------------------
def test_the_embedding_and_npz_never_import_numpy(tmp_path):
    code = (
        "import sys, array\n"
        "import mojo_train\n"
        "from mojo_train.embedding import Embedding, embedding_backward\n"
        "t = array.array('f', range(12))\n"
        "e = Embedding(4, 3, padding_idx=0, weight=memoryview(t).cast('B').cast('f', (4, 3)))\n"
        "y = e.forward([1, 2, 2])\n"
        "g = e.backward([1, 2, 2], y)\n"
        "e.save(sys.argv[1]); e2 = Embedding.load(sys.argv[1])\n"
        "assert g.tolist()[2] == [12.0, 14.0, 16.0], g.tolist()\n"
        "assert 'numpy' not in sys.modules, 'numpy was imported'\n"
    )
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "e.npz")], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ---- device buffers --------------------------------------------------------------------------
def test_device_buffers_give_the_host_bits_and_stay_on_the_device(identical):
    _need(identical)
    if not identical.has("device_buffers"):
        pytest.skip("the vendor takes no device buffers")
    np = _np()
    ids, dy = _skewed(np, 5000, 300), _dy(np, 5000, 9)
    want = _bits(embedding_backward(dy, ids, 300, padding_idx=0))
    got = embedding_backward(mojo_train.to_device(dy), mojo_train.to_device(ids), 300, padding_idx=0)
    assert isinstance(got, mojo_train.DeviceArray) and _bits(got) == want
    emb = Embedding(300, 9, weight=mojo_train.to_device(_dy(np, 300, 9)))
    out = emb.forward(ids, device=True)
    assert isinstance(out, mojo_train.DeviceArray) and out.shape == (5000, 9)
    assert _bits(out) == _bits(emb.forward(ids))


# ---- the GPU kernels, run thread by thread on the CPU ----------------------------------------
def _emulated_library(tmp_path):
    cxx, cc = shutil.which("g++") or shutil.which("c++"), shutil.which("cc")
    if not cxx or not cc:
        pytest.skip("no C/C++ compiler to build the GPU emulation")
    lib = str(tmp_path / "libemb_emulated.so")
    flags = ["-O1", "-fPIC", "-ffp-contract=off", "-Inative/include", "-Inative/common", "-Itests/c",
             "-fsanitize=alignment", "-fno-sanitize-recover=alignment"]
    host = str(tmp_path / "mt_host.o")
    subprocess.run([cc, "-std=c11", "-c", "native/common/mt_host.c", "-o", host, "-D_GNU_SOURCE"] + flags,
                   cwd=REPO, check=True, capture_output=True)
    build = subprocess.run([cxx, "-std=c++17", "-shared", "-o", lib, "-x", "c++", "tests/c/emb_gpu_emulate.cc",
                            "-x", "none", host, "-lpthread"] + flags, cwd=REPO, capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    return lib


# The forward's paths: (output on the device, flags, the thread has a mapped status word). A host
# output's device twin is fresh (the gather checks the ids) whatever the flags; a device output
# takes k_check first unless it is declared fresh (MT_MAP_OUT_FRESH = 1).
_FORWARD_MODES = [(False, 0, 1), (False, 1, 0), (True, 0, 1), (True, 1, 1), (True, 1, 0)]


def _emulated_forward(np, ffi, emu, table, ids, flags, out_on_device):
    """(status, output bytes) of the emulated forward into an output that starts as 3.5s."""
    n, d = len(ids), table.shape[1]
    host = np.full((n, d), 3.5, np.float32)
    out = emu.emu_device_alloc(host.nbytes, 0) if out_on_device else ffi.cast("void *", host.ctypes.data)
    if out_on_device:
        ffi.memmove(out, host.tobytes(), host.nbytes)
    try:
        rc = emu.mt_embedding_forward(ffi.cast("float *", out), ffi.cast("float *", table.ctypes.data),
                                      ffi.cast("void *", ids.ctypes.data), ids.itemsize, n, table.shape[0], d, flags)
        return rc, bytes(ffi.buffer(out, host.nbytes))
    finally:
        if out_on_device:
            emu.emu_device_free(out)


def test_the_gpu_kernels_emulated_on_the_cpu_give_the_oracle_bits(tmp_path):
    """native/cuda/mt_gpu_embedding.cu has no block or warp cooperation, so running its
    threads one at a time (blocks in a scrambled order) is a valid schedule: its host glue and
    kernels, compiled as C++ (tests/c/emb_gpu_emulate.cc), must give the oracle's bits."""
    np = _np()
    from cffi import FFI
    ffi = FFI()
    ffi.cdef("int mt_embedding_backward(float *, const float *, const void *, int32_t, int64_t, int64_t, int64_t,"
             " int64_t, int32_t); int mt_embedding_forward(float *, const float *, const void *, int32_t, int64_t,"
             " int64_t, int64_t, uint32_t); void emu_geometry(int, int, int, int); const char *mt_last_error(void);"
             " void *emu_device_alloc(int64_t, int); void emu_device_free(void *);")
    emu = ffi.dlopen(_emulated_library(tmp_path))
    oracle = _native.load("identical", "cpu")
    # (40, 300) and (2, 257): more columns than a block's group (EMB_COLS x threads), so with 2
    # blocks the fold and tree kernels walk several column groups (gridDim.y > 1); d = 300, 4 and
    # 1032: the forward's 16-byte words (1032: more than a lane's batch a row), the others 4-byte
    cases = [(7, 3, 3000, -1, 0), (50, 17, 3100, 3, 1), (1000, 5, 5000, 0, 0), (13, 33, 2049, 12, 1),
             (300, 65, 1025, -1, 0), (1, 2, 6000, -1, 1), (2000, 9, 9000, 5, 0), (3, 2, 70001, 1, 1),
             (40, 300, 5000, 2, 1), (2, 257, 4100, -1, 0), (9, 4, 700, -1, 0), (30, 1032, 300, 7, 1)]
    for (vocab, d, n, pad, acc), (threads, blocks, part_cap) in itertools.product(
            cases, [(32, 0, 1), (64, 3, 0), (96, 7, 1), (32, 2, 1), (32, 2, 0)]):
        ids, dy = _skewed(np, n, vocab).astype(np.int32), _dy(np, n, d)
        start = _dy(np, vocab, d, seed=5)
        want = start.copy()
        oracle.check(oracle.lib.mt_embedding_backward(_native.ffi.cast("float *", want.ctypes.data),
                     _native.ffi.cast("float *", dy.ctypes.data), _native.ffi.cast("void *", ids.ctypes.data), 4,
                     n, vocab, d, pad, acc), "oracle")
        emu.emu_geometry(threads, blocks, part_cap, 1)
        for plan in (1, 2):
            got = start.copy()
            rc = emu.mt_embedding_backward(ffi.cast("float *", got.ctypes.data), ffi.cast("float *", dy.ctypes.data),
                                           ffi.cast("void *", ids.ctypes.data), 4, n, vocab, d, pad, acc | plan << 1)
            assert rc == 0, ffi.string(emu.mt_last_error())
            assert got.tobytes() == want.tobytes(), (vocab, d, n, pad, acc, plan, threads, blocks, part_cap)
        table = _dy(np, vocab, d, seed=6)
        for out_on_device, flags, mapped in _FORWARD_MODES:
            emu.emu_geometry(threads, blocks, part_cap, mapped)
            got = _emulated_forward(np, ffi, emu, table, ids, flags, out_on_device)
            assert got == (0, table[ids].tobytes()), (vocab, d, n, out_on_device, flags, mapped, threads, blocks)
    # a refused id (one too large, one negative, ids far outside the table: a gather that copied a
    # refused row would read far outside it): the oracle's words in every mode; a caller's output
    # (host, or on the device without MT_MAP_OUT_FRESH) untouched
    table = _dy(np, 6, 8, seed=7)
    for out_on_device, flags, mapped in _FORWARD_MODES:
        emu.emu_geometry(32, 2, 1, mapped)
        for ids, at in (([0, 5, 2, 6, 1, -1], 3), ([1, -1, 2, 0, 3, 4], 1), ([0, 1, 2, 3, 4, 1 << 40], 5),
                        ([0, 1, 2, -(1 << 40), 4, 5], 3)):
            ids = np.array(ids, np.int64)
            rc, got = _emulated_forward(np, ffi, emu, table, ids, flags, out_on_device)
            assert rc == EINVAL
            words = b"out's contents are undefined (declared fresh); no input was written" if flags else (
                b"nothing was written")
            assert ffi.string(emu.mt_last_error()) == b"ids[%d] = %d is outside [0, 6) (vocab); %s" % (
                at, ids[at], words)
            if not (out_on_device and flags):
                assert got == np.full((6, 8), 3.5, np.float32).tobytes()
        ids = np.array([0, 5, 2, 4, 1, 3], np.int64)
        assert _emulated_forward(np, ffi, emu, table, ids, flags, out_on_device) == (0, table[ids].tobytes())
    # a device table 4 bytes past a 16-byte boundary: the 4-byte words (the emulated uint4 is
    # 16-byte aligned and the emulation is built to stop at a misaligned access)
    emu.emu_geometry(32, 2, 1, 1)
    table = _dy(np, 6, 8, seed=8)
    raw = emu.emu_device_alloc(table.nbytes + 16, 0)
    try:
        shifted = ffi.cast("char *", raw) + 4
        ffi.memmove(shifted, table.tobytes(), table.nbytes)
        ids = np.array([5, 0, 3], np.int64)
        for flags in (0, 1):
            out = np.full((3, 8), 3.5, np.float32)
            assert emu.mt_embedding_forward(ffi.cast("float *", out.ctypes.data), ffi.cast("float *", shifted),
                                            ffi.cast("void *", ids.ctypes.data), 8, 3, 6, 8, flags) == 0
            assert out.tobytes() == table[ids].tobytes()
    finally:
        emu.emu_device_free(raw)
    bad = np.zeros((3, 2), np.float32)
    bad[2, 1] = np.nan
    got = np.ones((4, 2), np.float32)
    ids = np.array([0, 1, 2], np.int64)
    assert emu.mt_embedding_backward(ffi.cast("float *", got.ctypes.data), ffi.cast("float *", bad.ctypes.data),
                                     ffi.cast("void *", ids.ctypes.data), 8, 3, 4, 2, -1, 1) == ENONFINITE
    assert ffi.string(emu.mt_last_error()) == b"dy[2, 1] is NaN or inf; nothing was written"
    assert got.tolist() == [[1.0, 1.0]] * 4
    ids[1] = 9
    assert emu.mt_embedding_backward(ffi.cast("float *", got.ctypes.data), ffi.cast("float *", bad.ctypes.data),
                                     ffi.cast("void *", ids.ctypes.data), 8, 3, 4, 2, -1, 0) == EINVAL
    assert ffi.string(emu.mt_last_error()).startswith(b"ids[1] = 9 is outside [0, 4)")


def test_the_card_rule_for_ids_is_skewed():
    ids = _cards_embedding.skewed_ids(_native.load("identical", "cpu"), 1, 5000, 1000, 3).tolist()
    assert min(ids) == 0 and max(ids) < 1000 and ids.count(0) > 300


@pytest.mark.parametrize("start, words", [(3, r"grad and dy overlap in memory without being the same buffer "
                                              r"\(grad starts 12 bytes after dy\)"),
                                          (0, r"grad is dy itself; grad must be a buffer of its own")])
def test_backward_refuses_a_grad_sharing_memory_with_dy_naming_both(mode, start, words):
    _need(mode)
    store = array.array("f", [0.25 * k for k in range(30)])
    dy = memoryview(store)[:12].cast("B").cast("f", (4, 3))
    grad = memoryview(store)[start:start + 12].cast("B").cast("f", (4, 3))
    before = store.tobytes()
    with pytest.raises(ValueError, match=r"mojo_train\.embedding_backward: " + words):
        embedding_backward(dy, [0, 1, 2, 3], 4, grad=grad, numeric_mode=mode.numeric_mode)
    assert store.tobytes() == before


def test_an_id_out_of_range_says_nothing_was_written_when_the_output_was_the_calls_own(mode):
    """The gather declares its own new output fresh, and the C words for a fresh output ("out's
    contents are undefined") were passed on to a caller who passed no out: that output is
    dropped, so nothing of the caller's was written."""
    with pytest.raises(ValueError, match=r"^mojo_train\.embedding_forward: ids\[1\] = 4 is outside \[0, 4\) "
                                         r"\(vocab\); nothing was written$"):
        embedding_forward(_table(), [0, 4], numeric_mode=mode.numeric_mode)
    emb = Embedding(4, 3, weight=_table(), numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError, match=r"is outside \[0, 4\) \(vocab\); nothing was written$"):
        emb.forward([5])
