"""Every refusal of the loss, LM-head and dense entry points names the caller's argument.

Contract under test (the project standard; mojo_train/_ops.py's ``check``, lm_head.py's
names, mojo_train/_loss_options.py): a bad argument raises ValueError, TypeError or
NotImplementedError (never a bare OverflowError, struct.error or cffi error) whose message
starts ``mojo_train.<entry point>:`` and names the argument as the caller spelled it
(``input``, ``linear_weight``, ``target`` for linear_cross_entropy even where the C library
calls them hidden, weight, targets), never a name internal to the library (``hidden`` for
linear_cross_entropy, ``logits row N`` for a loss that was given no logits, ``parts[i]``,
``dweight``, C size names). The caller's buffers are unchanged after the refusal.
"""
import re

import numpy as np
import pytest

import mojo_train as mt
from mojo_train import loss, nn

F32 = np.float32
ROWS, VOCAB, WIDTH = 6, 5, 4


def _tensors():
    rng = np.random.Generator(np.random.PCG64(11))
    u = lambda *shape: rng.uniform(-1, 1, shape).astype(F32)  # noqa: E731
    return {"x": u(ROWS, VOCAB), "h": u(ROWS, WIDTH), "w": u(VOCAB, WIDTH), "b": u(VOCAB),
            "t": np.array([0, 4, 1, 3, 2, 4], np.int64), "dc": u(ROWS, VOCAB), "g": u(WIDTH)}


def _nan(a, at=1):
    a = a.copy()
    a.reshape(-1)[at] = np.nan
    return a


def _strided(a):
    return np.repeat(a, 2, axis=-1)[..., ::2]


def _set(a, at, value):
    a = a.copy()
    a.reshape(-1)[at] = value
    return a


# Words an entry point's messages must never hold: the library's own names for what the
# caller called otherwise, and sizes the caller never passed.
_ALWAYS = [r"\bparts\[", r"\bdweight\b", r"\bn_rows\b", r"\btarget_bytes\b", r"\bloss_out\b", r"\brow_loss\b",
           r"\bd_hidden\b", r"\bd_weight\b", r"\bd_bias\b", r"\bvocab \(", r"\bmt_\w+"]
FORBIDDEN = {
    "cross_entropy": _ALWAYS + [r"\bhidden\b", r"\bvocab must\b"],
    "linear_cross_entropy": _ALWAYS + [r"\bhidden\b", r"(?<!linear_)\bweight\b", r"(?<!linear_)\bbias\b",
                                       r"\btargets\b", r"\blogits row\b"],
    "chunked_lm_head_loss": _ALWAYS + [r"\binput\b", r"\blinear_", r"\btarget\b", r"\blogits row\b",
                                       r"ignore_index"],
    "linear_forward": _ALWAYS + [r"\bm must\b", r"\bout \("],
    "linear_backward": _ALWAYS + [r"\bm must\b"],
    "rms_norm_forward": _ALWAYS + [r"\bdim must\b", r"\by is NULL\b"],
    "rms_norm_backward": _ALWAYS + [r"\bdim must\b", r"\bdx is NULL\b"],
    "relu_forward": _ALWAYS + [r"\bn must\b", r"\by is NULL\b"],
    "relu_backward": _ALWAYS + [r"\bn must\b", r"\bdx is NULL\b"],
}


def _nn(fn, args, **kw):
    """A call of ``fn(*args(tensors), **kw)`` under a numeric mode."""
    return lambda d, numeric_mode: fn(*args(d), numeric_mode=numeric_mode, **kw)


def _ce(x=None, t=None, **kw):
    return _nn(loss.cross_entropy, lambda d: (d["x"] if x is None else x(d), d["t"] if t is None else t(d)), **kw)


def _lce(h=None, w=None, t=None, **kw):
    return _nn(loss.linear_cross_entropy, lambda d: (d["h"] if h is None else h(d), d["w"] if w is None else w(d),
                                                     d["t"] if t is None else t(d)), **kw)


def _clh(h=None, w=None, t=None, **kw):
    return _nn(loss.chunked_lm_head_loss, lambda d: (d["h"] if h is None else h(d), d["w"] if w is None else w(d),
                                                     d["t"] if t is None else t(d)), **kw)


BIG = 2 ** 64 + 3
LF, LB, RF, RB = nn.linear_forward, nn.linear_backward, nn.rms_norm_forward, nn.rms_norm_backward
RELU, RELUB = nn.relu_forward, nn.relu_backward
CASES = [  # (entry point, what is bad, call on the tensors, the caller's name the message must hold)
    ("cross_entropy", "float64 logits", _ce(x=lambda d: d["x"].astype(np.float64)), "logits"),
    ("cross_entropy", "strided logits", _ce(x=lambda d: _strided(d["x"])), "logits"),
    ("cross_entropy", "0-D logits", _ce(x=lambda d: d["x"].reshape(-1)[:1].reshape(())), "logits"),
    # 1-D logits are torch's unbatched (C,) input: a target list of N is then the mistake
    ("cross_entropy", "1-D logits with N targets", _ce(x=lambda d: d["x"].reshape(-1)), "targets"),
    ("cross_entropy", "NaN logits", _ce(x=lambda d: _nan(d["x"], 7)), "logits row 1"),
    ("cross_entropy", "NaN logits with the gradient", _ce(x=lambda d: _nan(d["x"], 7), return_grad=True),
     "logits row 1"),
    ("cross_entropy", "NaN logits, weighted, per row", _ce(x=lambda d: _nan(d["x"], 7), reduction="none",
                                                           weight=np.ones(VOCAB, F32)), "logits row 1"),
    ("cross_entropy", "2**24 classes", _ce(x=lambda d: mt.Array.empty((1, 2 ** 24), "float32"),
                                           t=lambda d: [0]), "logits"),
    ("cross_entropy", "a target beyond int64 in a list", _ce(t=lambda d: [0, BIG, 0, 0, 0, 0]), "targets[1]"),
    ("cross_entropy", "a uint64 target beyond int64", _ce(t=lambda d: d["t"].astype(np.uint64) * 0 + 2 ** 63),
     "targets[0]"),
    ("cross_entropy", "a target out of range", _ce(t=lambda d: _set(d["t"], 2, 9)), "targets[2] = 9"),
    ("cross_entropy", "targets of another length", _ce(t=lambda d: d["t"][:4]), "targets"),
    ("cross_entropy", "text targets", _ce(t=lambda d: ["1"] * ROWS), "targets"),
    ("cross_entropy", "ignore_index beyond int64", _ce(ignore_index=BIG), "ignore_index"),
    ("cross_entropy", "label_smoothing beyond float", _ce(label_smoothing=10 ** 400), "label_smoothing"),
    ("linear_cross_entropy", "float64 input", _lce(h=lambda d: d["h"].astype(np.float64)), "input"),
    ("linear_cross_entropy", "strided input", _lce(h=lambda d: _strided(d["h"])), "input"),
    ("linear_cross_entropy", "1-D input", _lce(h=lambda d: d["h"].reshape(-1)), "input"),
    ("linear_cross_entropy", "NaN input", _lce(h=lambda d: _nan(d["h"])), "input holds NaN"),
    ("linear_cross_entropy", "NaN linear_weight", _lce(w=lambda d: _nan(d["w"])), "linear_weight holds NaN"),
    ("linear_cross_entropy", "NaN linear_bias", _lce(linear_bias=_nan(np.ones(VOCAB, F32))),
     "linear_bias holds NaN"),
    ("linear_cross_entropy", "linear_bias of another length", _lce(linear_bias=np.ones(VOCAB + 1, F32)),
     "linear_bias"),
    ("linear_cross_entropy", "widths that differ", _lce(w=lambda d: d["w"][:, :3].copy()), "linear_weight"),
    ("linear_cross_entropy", "2**24 classes", _lce(w=lambda d: mt.Array.empty((2 ** 24, 1), "float32"),
                                                   h=lambda d: np.ones((1, 1), F32), t=lambda d: [0]),
     "linear_weight"),
    ("linear_cross_entropy", "width 0", _lce(h=lambda d: np.ones((ROWS, 0), F32),
                                             w=lambda d: np.ones((VOCAB, 0), F32)), "linear_weight"),
    ("linear_cross_entropy", "a target out of range", _lce(t=lambda d: _set(d["t"], 2, 9)), "target[2] = 9"),
    ("linear_cross_entropy", "a target beyond int64", _lce(t=lambda d: [BIG] * ROWS), "target[0]"),
    ("linear_cross_entropy", "a uint64 target beyond int64",
     _lce(t=lambda d: d["t"].astype(np.uint64) * 0 + 2 ** 63), "target[0]"),
    ("linear_cross_entropy", "a target of another shape", _lce(t=lambda d: d["t"].reshape(2, 3)), "target"),
    ("linear_cross_entropy", "logits that overflow float32",
     _lce(h=lambda d: np.full((ROWS, WIDTH), 3e38, F32), w=lambda d: np.full((VOCAB, WIDTH), 3e38, F32)),
     "input row 0"),
    ("linear_cross_entropy", "ignore_index beyond int64", _lce(ignore_index=BIG), "ignore_index"),
    ("linear_cross_entropy", "chunk_rows beyond int64", _lce(chunk_rows=BIG), "chunk_rows"),
    ("linear_cross_entropy", "num_items beyond int64", _lce(num_items=BIG), "num_items"),
    ("chunked_lm_head_loss", "NaN hidden", _clh(h=lambda d: _nan(d["h"])), "hidden holds NaN"),
    ("chunked_lm_head_loss", "NaN weight", _clh(w=lambda d: _nan(d["w"])), "weight holds NaN"),
    ("chunked_lm_head_loss", "float64 weight", _clh(w=lambda d: d["w"].astype(np.float64)), "weight"),
    ("chunked_lm_head_loss", "a target of -100", _clh(t=lambda d: _set(d["t"], 3, -100)),
     "targets[3] = -100"),
    ("chunked_lm_head_loss", "a target of -2**63", _clh(t=lambda d: _set(d["t"], 3, -2 ** 63)),
     "targets[3] = -9223372036854775808"),
    ("chunked_lm_head_loss", "logits that overflow float32",
     _clh(h=lambda d: np.full((ROWS, WIDTH), 3e38, F32), w=lambda d: np.full((VOCAB, WIDTH), 3e38, F32)),
     "hidden row 0"),
    ("chunked_lm_head_loss", "chunk_rows beyond int64", _clh(chunk_rows=BIG), "chunk_rows"),
    ("linear_forward", "float64 a", _nn(LF, lambda d: (d["h"].astype(np.float64), d["w"])), "a"),
    ("linear_forward", "NaN a", _nn(LF, lambda d: (_nan(d["h"]), d["w"])), "a holds NaN"),
    ("linear_forward", "NaN weight", _nn(LF, lambda d: (d["h"], _nan(d["w"]))), "weight holds NaN"),
    ("linear_forward", "NaN bias", _nn(LF, lambda d: (d["h"], d["w"], _nan(d["b"]))), "bias holds NaN"),
    ("linear_forward", "bias of another length", _nn(LF, lambda d: (d["h"], d["w"], d["b"][:3])), "bias"),
    ("linear_forward", "widths that differ", _nn(LF, lambda d: (d["h"][:, :3].copy(), d["w"])), "a"),
    ("linear_backward", "NaN dc", _nn(LB, lambda d: (_nan(d["dc"]), d["h"], d["w"])), "dc holds NaN"),
    ("linear_backward", "NaN a", _nn(LB, lambda d: (d["dc"], _nan(d["h"]), d["w"])), "a holds NaN"),
    ("linear_backward", "NaN weight", _nn(LB, lambda d: (d["dc"], d["h"], _nan(d["w"]))), "weight holds NaN"),
    ("linear_backward", "dc of another shape", _nn(LB, lambda d: (d["dc"][:3].copy(), d["h"], d["w"])), "dc"),
    ("rms_norm_forward", "NaN x", _nn(RF, lambda d: (_nan(d["h"]),)), "x holds NaN"),
    ("rms_norm_forward", "NaN weight", _nn(RF, lambda d: (d["h"], _nan(d["g"]))), "weight holds NaN"),
    ("rms_norm_forward", "strided x", _nn(RF, lambda d: (_strided(d["h"]),)), "x"),
    ("rms_norm_forward", "eps beyond float", _nn(RF, lambda d: (d["h"],), eps=10 ** 400), "eps"),
    ("rms_norm_forward", "no features", _nn(RF, lambda d: (np.ones((ROWS, 0), F32),)), "x"),
    ("rms_norm_backward", "NaN dy", _nn(RB, lambda d: (_nan(d["h"]), d["h"], d["g"])), "dy holds NaN"),
    ("rms_norm_backward", "NaN x", _nn(RB, lambda d: (d["h"], _nan(d["h"]), d["g"])), "x holds NaN"),
    ("rms_norm_backward", "NaN weight", _nn(RB, lambda d: (d["h"], d["h"], _nan(d["g"]))), "weight holds NaN"),
    ("rms_norm_backward", "dy of another shape", _nn(RB, lambda d: (d["h"][:2].copy(), d["h"])), "dy"),
    ("relu_forward", "NaN x", _nn(RELU, lambda d: (_nan(d["h"]),)), "x holds NaN"),
    ("relu_forward", "int32 x", _nn(RELU, lambda d: (d["t"].astype(np.int32),)), "x"),
    ("relu_backward", "NaN dy", _nn(RELUB, lambda d: (_nan(d["h"]), d["h"])), "dy holds NaN"),
    ("relu_backward", "NaN x", _nn(RELUB, lambda d: (d["h"], _nan(d["h"]))), "x holds NaN"),
    ("relu_backward", "shapes that differ", _nn(RELUB, lambda d: (d["h"], d["h"][:2].copy())), "dy"),
]

FAMILY_OF = {"rms_norm_forward": "rms_norm", "rms_norm_backward": "rms_norm", "relu_forward": "elementwise",
             "relu_backward": "elementwise"}
_NEEDS = {"cross_entropy": ("loss",), "linear_cross_entropy": ("lm_head", "loss", "linear"),
          "chunked_lm_head_loss": ("lm_head", "loss", "linear")}


@pytest.mark.parametrize("entry, what, call, name", CASES, ids=["%s-%s" % c[:2] for c in CASES])
def test_a_refusal_names_the_callers_argument_and_no_internal_name(mode, entry, what, call, name):
    for need in _NEEDS.get(entry, (FAMILY_OF.get(entry, "linear"),)):
        if not mode.has(need):
            pytest.skip("this library has no %s (mt_features)" % need)
    tensors = _tensors()
    before = {k: v.tobytes() for k, v in tensors.items()}
    with pytest.raises(Exception) as info:
        call(tensors, mode.numeric_mode)
    message = str(info.value)
    assert type(info.value) in (ValueError, TypeError, NotImplementedError), (type(info.value), message)
    assert message.startswith("mojo_train.%s: " % entry), message
    assert re.search(r"(?<![\w.])%s(?![\w])" % re.escape(name), message), (name, message)
    for word in FORBIDDEN[entry]:
        assert not re.search(word, message), (word, message)
    assert {k: v.tobytes() for k, v in tensors.items()} == before


def test_every_entry_point_under_test_has_cases():
    assert {c[0] for c in CASES} == set(FORBIDDEN)
