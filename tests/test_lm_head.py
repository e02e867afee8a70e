"""The chunked LM head and the fused linear_cross_entropy (mojo_train.lm_head, mojo_train.loss).

Contract under test (mojo_train/lm_head.py, native/contracts/lm_head.md, loss.md, linear.md):
the result is bit for bit linear_forward -> cross_entropy -> linear_backward run separately,
whatever the chunk size; at most a chunk of logits is alive (the library's own memory counters show
it); refusals name the argument and write nothing the caller owns; the names, keywords and
defaults are torch 2.13's ``linear_cross_entropy``.
"""
import hashlib
import random

import numpy as np
import pytest

import mojo_train as mt
from mojo_train import loss, nn


@pytest.fixture
def head(mode):
    for need in ("lm_head", "loss", "linear"):
        if not mode.has(need):
            pytest.skip("this library has no %s (mt_features)" % need)
    return mode


def _sha(x):
    return hashlib.sha256(x.tobytes()).hexdigest()


def _inputs(rows, vocab, width, seed, ignored=0.0, scale=1.0):
    rnd = random.Random(seed)
    h = mt.Array.from_list([rnd.uniform(-scale, scale) for _ in range(rows * width)]).reshape(rows, width)
    w = mt.Array.from_list([rnd.uniform(-1, 1) for _ in range(vocab * width)]).reshape(vocab, width)
    b = mt.Array.from_list([rnd.uniform(-1, 1) for _ in range(vocab)])
    t = [rnd.randrange(vocab) if rnd.random() >= ignored else -100 for _ in range(rows)]
    return h, w, b, t


def _separate(h, w, b, t, mode, **ce):
    logits = nn.linear_forward(h, w, b, numeric_mode=mode.numeric_mode)
    value, dl = loss.cross_entropy(logits, t, return_grad=True, numeric_mode=mode.numeric_mode, **ce)
    grads = nn.linear_backward(dl, h, w, need_bias_grad=b is not None, numeric_mode=mode.numeric_mode)
    return (value,) + tuple(grads)


# What the fused head promises against the separate layers, by numeric mode (README "Numeric modes"): the
# identical and deterministic numeric modes run the very same arithmetic in both, so the bits agree at
# every chunk size; a library that declares MT_FEATURE_APPROXIMATE (a GPU's fast numeric mode:
# approximate exp, division and sqrt, subnormals flushed) lets the compiler round the two
# paths differently, and promises agreement within float32 rounding only.
APPROX_RTOL, APPROX_ATOL = 1e-5, 1e-6     # atol relative to the tensor's largest magnitude


def _agree(mode, got, want, what):
    """Assert that two (loss, *grads) tuples agree as the numeric mode promises."""
    if not mode.has("approximate"):
        assert (repr(got[0]),) + tuple(_sha(g) for g in got[1:]) == \
            (repr(want[0]),) + tuple(_sha(g) for g in want[1:]), what
        return
    for g, w in zip(got, want):
        g, w = np.asarray(g, dtype=np.float64), np.asarray(w, dtype=np.float64)
        atol = APPROX_ATOL * float(np.nanmax(np.abs(w), initial=0.0))
        assert np.allclose(g, w, rtol=APPROX_RTOL, atol=atol, equal_nan=True), what


CASES = [  # rows, vocab, width, label_smoothing, reduction, ignored fraction, bias
    (1, 3, 1, 0.0, "mean", 0.0, False),
    (5, 2, 4, 0.0, "sum", 0.0, True),
    (1023, 67, 9, 0.1, "mean", 0.1, True),
    (2500, 37, 13, 0.0, "mean", 0.3, False),
    (2049, 129, 7, 0.2, "sum", 0.5, True),
    (300, 50, 3, 0.0, "mean", 1.0, True),       # every row ignored: mean is nan, gradients zero
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "%dx%dx%d" % c[:3])
def test_linear_cross_entropy_is_bit_for_bit_the_separate_layers_at_every_chunk_size(head, case):
    rows, vocab, width, smooth, red, ignored, with_bias = case
    h, w, b, t = _inputs(rows, vocab, width, rows * 7 + vocab, ignored)
    b = b if with_bias else None
    want = _separate(h, w, b, t, head, label_smoothing=smooth, reduction=red)
    for chunk in (None, 1, 7, 1000, 1024, 1025, rows):
        got = loss.linear_cross_entropy(h, w, t, linear_bias=b, reduction=red, label_smoothing=smooth,
                                        return_grad=True, chunk_rows=chunk, numeric_mode=head.numeric_mode)
        _agree(head, got, want, "chunk_rows=%r" % chunk)


def test_the_lm_head_lives_in_lm_head_and_keeps_its_loss_import_path():
    from mojo_train import lm_head
    assert loss.linear_cross_entropy is lm_head.linear_cross_entropy is mt.linear_cross_entropy
    assert loss.chunked_lm_head_loss is lm_head.chunked_lm_head_loss is mt.chunked_lm_head_loss


def test_chunked_lm_head_loss_is_the_mean_cross_entropy_of_the_logits(head):
    h, w, _, t = _inputs(1500, 41, 6, 3)
    got = loss.chunked_lm_head_loss(h, w, t, return_grad=True, chunk_rows=100, numeric_mode=head.numeric_mode)
    _agree(head, got, _separate(h, w, None, t, head), "chunk_rows=100")
    _agree(head, (loss.chunked_lm_head_loss(h, w, t, numeric_mode=head.numeric_mode),), got[:1], "forward only")


def test_forward_only_and_per_row_losses_match_cross_entropy(head):
    h, w, b, t = _inputs(700, 23, 5, 11, ignored=0.2)
    logits = nn.linear_forward(h, w, b, numeric_mode=head.numeric_mode)
    rows = loss.cross_entropy(logits, t, reduction="none", numeric_mode=head.numeric_mode)
    got = loss.linear_cross_entropy(h, w, t, linear_bias=b, reduction="none", chunk_rows=64,
                                    numeric_mode=head.numeric_mode)
    mean = loss.linear_cross_entropy(h, w, t, linear_bias=b, numeric_mode=head.numeric_mode, num_items=999)
    _agree(head, (mean, got), (loss.cross_entropy(logits, t, num_items=999, numeric_mode=head.numeric_mode), rows),
           "reduction='none' and num_items=999")


def test_leading_dimensions_are_rows(head):
    h, w, b, t = _inputs(24, 11, 5, 5)
    flat = loss.linear_cross_entropy(h, w, t, return_grad=True, numeric_mode=head.numeric_mode)
    batched = loss.linear_cross_entropy(h.reshape(4, 6, 5), w, mt.Array.from_list(t, "int64").reshape(4, 6),
                                        return_grad=True, numeric_mode=head.numeric_mode)
    assert batched[0] == flat[0] and batched[1].shape == (4, 6, 5)
    assert batched[1].tobytes() == flat[1].tobytes() and batched[2].tobytes() == flat[2].tobytes()


def test_at_most_a_chunk_of_logits_is_ever_alive(head):
    if head.has("device_buffers"):
        pytest.skip("the library keeps its chunks in device memory (device_buffers): these host-side "
                    "inputs measure host memory; bench/lm_head_cuda.py measures the GPU's")
    rows, vocab, width = 4096, 1000, 8
    h, w, _, t = _inputs(rows, vocab, width, 9)
    before = mt.memory_stats(reset=True, numeric_mode=head.numeric_mode)
    loss.linear_cross_entropy(h, w, t, return_grad=True, chunk_rows=64, numeric_mode=head.numeric_mode)
    peak = mt.memory_stats(numeric_mode=head.numeric_mode)["peak"] - before["current"]
    logits = rows * vocab * 4
    # two chunks of logits (values, gradients), log2(4) + 1 weight partials, packed weights
    expected = 2 * 64 * vocab * 4 + 4 * vocab * width * 4 + 2 * vocab * width * 4 + rows * 8
    # and each pool thread's GEMM packing buffer (mt_cpu_gemm.c: MB x KC = 96 x 256 floats and
    # 128 bytes of alignment; the weight is packed once): 98,432 bytes a thread, whatever the logits
    gemm = int(head.backend.lib.mt_num_threads()) * (96 * 256 * 4 + 128)
    assert 0 < peak <= 1.5 * expected + gemm and 1.5 * expected < logits / 4, (peak, expected, gemm, logits)


@pytest.mark.parametrize("kwargs, exc, message", [
    ({"weight": [1.0]}, TypeError, "weight= is not supported: per-class"),
    ({"options": object()}, TypeError, "options= is not supported: .* chunk_rows"),
    ({"colour": 1}, TypeError, "unexpected keyword argument 'colour'"),
    ({"reduction": "none", "return_grad": True}, NotImplementedError, "reduction='none' has no gradient"),
    ({"reduction": "avg"}, ValueError, "reduction must be 'mean', 'sum' or 'none', got 'avg'"),
    ({"label_smoothing": 1.0}, ValueError, r"label_smoothing must be in \[0, 1\)"),
    ({"num_items": 0}, ValueError, "num_items must be >= 1"),
    ({"chunk_rows": 0}, ValueError, "chunk_rows must be >= 1"),
])
def test_refusals_name_the_argument(head, kwargs, exc, message):
    h, w, b, t = _inputs(10, 5, 3, 1)
    with pytest.raises(exc, match="^mojo_train.linear_cross_entropy: .*" + message):
        loss.linear_cross_entropy(h, w, t, numeric_mode=head.numeric_mode, **kwargs)


@pytest.mark.parametrize("keyword", ["ignore_index", "reduction", "label_smoothing", "num_items", "linear_bias"])
def test_chunked_lm_head_loss_refuses_what_only_linear_cross_entropy_takes(head, keyword):
    h, w, b, t = _inputs(10, 5, 3, 1)
    with pytest.raises(TypeError, match="chunked_lm_head_loss: %s= is not taken .* linear_cross_entropy has it"
                       % keyword):
        loss.chunked_lm_head_loss(h, w, t, numeric_mode=head.numeric_mode, **{keyword: 0})


def test_chunked_lm_head_loss_refuses_every_target_outside_the_classes_with_no_ignore_index(head):
    # -100 and -2**63 (the native "no ignore index") are targets like any other here: never ignored
    h, w, _, t = _inputs(10, 5, 3, 1)
    for bad in (-100, -2 ** 63, 5):
        targets = np.array(t[:4] + [bad] + t[5:], np.int64)
        before = targets.tobytes()
        with pytest.raises(ValueError, match=r"targets\[4\] = %d is outside \[0, 5\) \(there is no ignore "
                           r"index\)" % bad):
            loss.chunked_lm_head_loss(h, w, targets, return_grad=True, numeric_mode=head.numeric_mode)
        assert targets.tobytes() == before


def test_torch_defaults_none_are_accepted(head):
    h, w, b, t = _inputs(10, 5, 3, 1)
    assert loss.linear_cross_entropy(h, w, t, weight=None, options=None, numeric_mode=head.numeric_mode) == \
        loss.linear_cross_entropy(h, w, t, numeric_mode=head.numeric_mode)


def test_bad_targets_and_shapes_are_refused_by_name(head):
    h, w, b, t = _inputs(10, 5, 3, 1)
    with pytest.raises(ValueError, match=r"linear_cross_entropy: target\[3\] = 5 is outside \[0, 5\)"):
        loss.linear_cross_entropy(h, w, t[:3] + [5] + t[4:], numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match="last dimension of input is 3 but linear_weight has width 4"):
        loss.linear_cross_entropy(h, mt.Array((5, 4)), t, numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match="linear_bias has 4 elements"):
        loss.linear_cross_entropy(h, w, t, linear_bias=mt.Array((4,)), numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match="target has 9 elements"):
        loss.linear_cross_entropy(h, w, t[:9], numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match=r"target must have shape \(2, 5\), got \(10,\)"):
        loss.linear_cross_entropy(h.reshape(2, 5, 3), w, t, numeric_mode=head.numeric_mode)
    with pytest.raises(TypeError, match="float32"):
        loss.chunked_lm_head_loss(mt.Array((10, 3), "float64"), w, t, numeric_mode=head.numeric_mode)


def test_nonfinite_inputs_are_refused_and_callers_buffers_untouched(head):
    h, w, b, t = _inputs(10, 5, 3, 1)
    flat = h.reshape(30)
    flat[13] = float("nan")
    before = (h.tobytes(), w.tobytes(), b.tobytes())
    with pytest.raises(ValueError, match="linear_cross_entropy: input holds NaN or inf"):
        loss.linear_cross_entropy(h, w, t, linear_bias=b, return_grad=True, numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match="chunked_lm_head_loss: hidden holds NaN or inf"):
        loss.chunked_lm_head_loss(h, w, t, return_grad=True, numeric_mode=head.numeric_mode)
    assert (h.tobytes(), w.tobytes(), b.tobytes()) == before


@pytest.mark.parametrize("chunk_rows", [None, 1, 3])
def test_logits_that_overflow_name_the_callers_row_in_every_chunk(head, chunk_rows):
    # finite inputs whose product overflows float32 from row 5 on: the row of input is named,
    # counted from the first row of the call, not of the chunk
    h, w, b, t = _inputs(10, 5, 3, 1)
    flat = h.reshape(30)
    for i in range(15, 30):
        flat[i] = 3e38
    big = mt.Array.from_list([1e38] * 15).reshape(5, 3)      # rows 0-4: |logit| <= 3e38 + 1, finite
    with pytest.raises(ValueError, match=r"linear_cross_entropy: the logits of input row 5 \(input @ "
                       r"linear_weight.T \+ linear_bias\) overflow float32"):
        loss.linear_cross_entropy(h, big, t, linear_bias=b, return_grad=True, chunk_rows=chunk_rows,
                                  numeric_mode=head.numeric_mode)
    with pytest.raises(ValueError, match=r"chunked_lm_head_loss: the logits of hidden row 5 \(hidden @ "
                       r"weight.T\) overflow float32") as refused:
        loss.chunked_lm_head_loss(h, big, t, chunk_rows=chunk_rows, numeric_mode=head.numeric_mode)
    # what may have been written: nothing when row 5 is in the first chunk; else the earlier chunks'
    assert str(refused.value).endswith("nothing was written" if chunk_rows is None else
                                       "d_hidden, d_weight, d_bias and row_loss left undefined (earlier chunks "
                                       "were computed), loss_out not written"), str(refused.value)


def test_agrees_with_torch_linear_cross_entropy_in_float64(head):
    torch = pytest.importorskip("torch")
    if not hasattr(torch.nn.functional, "linear_cross_entropy"):
        pytest.skip("torch %s has no F.linear_cross_entropy (added in 2.13)" % torch.__version__)
    import numpy as np
    import tolerances as tol
    h, w, b, t = _inputs(300, 40, 16, 21, ignored=0.1)
    got = loss.linear_cross_entropy(h, w, t, linear_bias=b, label_smoothing=0.05, return_grad=True,
                                    numeric_mode=head.numeric_mode)
    th, tw, tb = (torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=True) for x in (h, w, b))
    ref = torch.nn.functional.linear_cross_entropy(th, tw, torch.tensor(t), linear_bias=tb, label_smoothing=0.05)
    ref.backward()
    logits = (th @ tw.T + tb).detach()
    dl = torch.autograd.functional.jacobian(
        lambda z: torch.nn.functional.cross_entropy(z, torch.tensor(t), label_smoothing=0.05), logits).abs()
    units = tol.linear_units(np.asarray(h), np.asarray(w), dl.numpy(), np.asarray(b))
    tol.assert_close_to_reference([got[0]], [ref.item()], "loss", unit=float(logits.abs().max()))
    tol.assert_close_to_reference(got[1], th.grad.numpy(), "d_input", unit=units["da"].ravel())
    tol.assert_close_to_reference(got[2], tw.grad.numpy(), "d_linear_weight", unit=units["dweight"].ravel())
    tol.assert_close_to_reference(got[3], tb.grad.numpy(), "d_linear_bias", unit=units["dbias"].ravel())


def test_a_width_of_zero_through_the_c_abi_is_the_separate_layers_on_the_bias(head):
    """width 0 (Python refuses it; the C ABI takes it): the logits are the bias on every row, so the
    loss is cross_entropy's of those rows, d_bias linear_backward's of its gradient, and d_weight
    and d_hidden hold nothing, as the numeric mode promises (`_agree`: the same bits, or float32
    rounding in a GPU's fast mode, whose chunked d_bias rounds apart from one linear_backward).
    (Until 2026-12-05 the oracle asked for a leaf of zero bytes and answered MT_ENOMEM with
    d_weight given, where Metal computed the call.)"""
    from mojo_train._native import ffi
    lib, rows, vocab = head.backend.lib, 1030, 5
    bias = ffi.new("float[]", [0.5, -1.25, 2.0, 0.0, -0.75])
    targets = ffi.new("int32_t[]", [(r * 3) % vocab for r in range(rows)])
    logits = ffi.new("float[]", [bias[j] for _ in range(rows) for j in range(vocab)])
    want_loss, dlogits, want_db = ffi.new("float[1]"), ffi.new("float[]", rows * vocab), ffi.new("float[]", vocab)
    assert lib.mt_cross_entropy(want_loss, ffi.NULL, dlogits, logits, targets, 4, rows, vocab, -100, 2, 0.0, 0) == 0
    assert lib.mt_linear_backward(ffi.NULL, ffi.NULL, want_db, dlogits, ffi.new("float[1]"), ffi.new("float[1]"),
                                  rows, vocab, 0) == 0
    loss, db, one = ffi.new("float[1]"), ffi.new("float[]", vocab), ffi.new("float[1]")
    rc = lib.mt_lm_head_loss(loss, ffi.NULL, one, one, db, one, one, bias, targets, 4, rows, vocab, 0, -100, 2,
                             0.0, 0, 700)
    assert rc == 0, ffi.string(lib.mt_last_error()).decode()
    as_array = lambda buf: np.frombuffer(ffi.buffer(buf), dtype=np.float32)   # noqa: E731
    _agree(head, (loss[0], as_array(db)), (want_loss[0], as_array(want_db)), "width 0")


@pytest.mark.parametrize("output, over", [("row_loss", "weight"), ("d_hidden", "hidden"), ("d_weight", "bias"),
                                          ("d_hidden", "targets"), ("loss_out", "d_weight"), ("d_bias", "d_weight")])
def test_an_output_over_another_buffer_is_refused_by_name_and_nothing_is_written(head, output, over):
    """Through the C ABI an output may not share memory with an input or another output: refused
    with EINVAL naming both before anything is written. (Until 2026-12-05 nothing checked it: an
    output over the weight was written chunk by chunk, before a later chunk's refusal, and the
    oracle and Metal gave different bytes; a fuzzer's finding.)"""
    from mojo_train._native import ffi
    lib, rows, vocab, width = head.backend.lib, 40, 8, 8
    vals = lambda count, s: [float(((i * 7 + s) * 13) % 17) / 16.0 - 0.5 for i in range(count)]
    pad = [0.0] * (rows * width)      # every buffer has room for any output laid over it: one overlap a call
    bufs = {"hidden": ffi.new("float[]", vals(rows * width, 1) + pad),
            "weight": ffi.new("float[]", vals(vocab * width, 2) + pad), "bias": ffi.new("float[]", vals(vocab, 3) + pad),
            "targets": ffi.new("int64_t[]", [r % vocab for r in range(rows)] + [0] * (rows * width)),
            "loss_out": ffi.new("float[1]"), "row_loss": ffi.new("float[]", rows),
            "d_hidden": ffi.new("float[]", rows * width), "d_weight": ffi.new("float[]", vocab * width + len(pad)),
            "d_bias": ffi.new("float[]", vocab)}
    bufs[output] = ffi.cast("float *", bufs[over])
    reduction = 0 if output == "row_loss" else 2
    grads = [ffi.NULL] * 3 if reduction == 0 else [bufs["d_hidden"], bufs["d_weight"], bufs["d_bias"]]
    before = {name: bytes(ffi.buffer(b)) for name, b in bufs.items() if name != output}
    rc = lib.mt_lm_head_loss(bufs["loss_out"] if reduction else ffi.NULL, bufs["row_loss"], *grads, bufs["hidden"],
                             bufs["weight"], bufs["bias"], bufs["targets"], 8, rows, vocab, width, -100, reduction,
                             0.0, 0, 16)
    message = ffi.string(lib.mt_last_error()).decode()
    assert rc != 0 and ("%s and %s overlap" % (output, over) in message or "%s and %s overlap" % (over, output) in message), message
    assert {name: bytes(ffi.buffer(b)) for name, b in bufs.items() if name != output} == before


def test_sizes_beyond_two_to_the_sixty_elements_are_refused_by_name(head):
    """rows x width or vocab x width past 2^60 elements (no byte count of them fits) is refused
    before any pointer is read (a fuzzer's width 2^62 read out of bounds, 2026-12-05)."""
    from mojo_train._native import ffi
    lib, loss, one = head.backend.lib, ffi.new("float[1]"), ffi.new("float[1]")
    rc = lib.mt_lm_head_loss(loss, ffi.NULL, ffi.NULL, ffi.NULL, ffi.NULL, one, one, ffi.NULL, ffi.NULL, 4, 0, 1,
                             1 << 62, -100, 1, 0.0, 0, 0)
    assert rc != 0 and "weight (vocab x width)" in ffi.string(lib.mt_last_error()).decode()


def test_rows_past_two_to_the_sixty_bytes_are_refused_even_with_no_width(head):
    """width 0 bounds nothing by rows x width: rows is bounded on its own (its targets' bytes),
    before any byte count of it is formed (a reviewer's finding, 2026-12-05)."""
    from mojo_train._native import ffi
    lib, rows, one = head.backend.lib, ffi.new("float[1]"), ffi.new("float[1]")
    rc = lib.mt_lm_head_loss(ffi.NULL, rows, ffi.NULL, ffi.NULL, ffi.NULL, one, one, ffi.NULL, one, 8, 1 << 62, 2, 0,
                             -100, 0, 0.0, 0, 0)
    assert rc != 0 and "targets (rows" in ffi.string(lib.mt_last_error()).decode()
