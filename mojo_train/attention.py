"""Scaled dot-product attention: ``scaled_dot_product_attention`` and
``scaled_dot_product_attention_backward`` (torch's ``F.scaled_dot_product_attention`` and its
gradients).

Contract: native/contracts/attention.md. Scores are serial fma chains over D times ``scale``
(plus a float mask); the softmax is an online softmax over key blocks of 64 in ascending order
through the pinned exp, so no Tq x Tk matrix is ever stored; the backward takes the forward's
``out`` and log-sum-exp ``lse`` (``return_lse=True``) and recomputes the probabilities; dk and dv
(contractions over query rows) and dq run their chains in the orders the contract states. A
fully masked row gives out 0, lse -inf and zero gradients (torch's math backend gives NaN).
Tensors are float32 and C-contiguous, never cast: q ``(B, H, Tq, D)``, k and v ``(B, Hkv, Tk,
D)`` with ``1 <= D <= 128``; ``Hkv < H`` needs ``enable_gqa=True`` (query head h reads kv head
``h // (H // Hkv)``). ``attn_mask`` is bool (True keeps a pair) or float32 (added to the scores;
-inf masks), of any shape that broadcasts to ``(B, H, Tq, Tk)``. ``is_causal`` keeps key j for
query i iff ``j <= i`` (torch's top-left alignment when Tq != Tk) and is refused together with
a mask, as torch refuses it. A NaN or infinity in an input is refused by name (a float mask
may hold -inf, lse may hold -inf) and nothing the caller owns is written. Dropout
(``dropout_p > 0``, attention.md "Dropout") drops pairs of the probabilities by the dropout
rule of ``Generator.dropout``, each pair (b, h, i, j) at its own element of one stream drawn
from ``generator``; the forward returns the ``DropoutKey`` with ``return_lse=True`` and the
backward takes it back (``dropout_key=``). Outputs are new arrays on the inputs' side.
"""
import math
import numbers

from . import _buffer, _ops
from ._errors import where_msg
from ._native import ffi
from .random import DropoutKey, Generator, _key_shape, _nearest_f32, _uint64

__all__ = ["scaled_dot_product_attention", "scaled_dot_product_attention_backward"]

MAX_HEAD_DIM = 128        # MT_ATTN_MAX_D
_MASK_KINDS = {"bool": 1, "float32": 2}    # MT_ATTENTION_MASK_BOOL, MT_ATTENTION_MASK_FLOAT
_C_NAMES = {"mask": "attn_mask"}           # the C argument -> the caller's name


def _flag(value, name, where):
    if not isinstance(value, bool):
        raise TypeError(where_msg(where, "%s must be True or False, got %r" % (name, value)))
    return value


def _heads(q, k, v, enable_gqa, where):
    """Probes of q, k, v and the sizes (B, H, Hkv, Tq, Tk, D), every shape rule checked."""
    pq, pk, pv = (_ops.f32_in(x, n, where, ndim=4) for x, n in ((q, "q"), (k, "k"), (v, "v")))
    (b, h, tq, d), (bk, hkv, tk, dk) = pq.shape, pk.shape
    if tuple(pv.shape) != tuple(pk.shape):
        raise ValueError(where_msg(where, "v must have k's shape %r (B, Hkv, Tk, D), got %r"
                                   % (tuple(pk.shape), tuple(pv.shape))))
    if bk != b or dk != d:
        raise ValueError(where_msg(where, "k must be (B, Hkv, Tk, D) with q's B=%d and D=%d, got shape %r"
                                   % (b, d, tuple(pk.shape))))
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(where_msg(where, "q's last dimension D must be in [1, %d], got shape %r"
                                   % (MAX_HEAD_DIM, tuple(pq.shape))))
    for name, heads, p in (("q", h, pq), ("k", hkv, pk)):
        if heads < 1:
            raise ValueError(where_msg(where, "%s must have at least one head (dimension 1 >= 1), got shape %r"
                                       % (name, tuple(p.shape))))
    gqa = _flag(enable_gqa, "enable_gqa", where)          # checked whatever the heads
    if hkv != h and not gqa:
        raise ValueError(where_msg(where, "k and v have %d heads and q has %d; pass enable_gqa=True to share each "
                                   "kv head among H / Hkv query heads (torch refuses it too)" % (hkv, h)))
    if h % hkv:
        raise ValueError(where_msg(where, "q's H=%d heads must be a multiple of k's Hkv=%d heads (enable_gqa)"
                                   % (h, hkv)))
    return pq, pk, pv, (b, h, hkv, tq, tk, d)


def _mask(attn_mask, sizes, is_causal, where):
    """(Probe or None, kind, strides of (b, h, i, j)) of the mask, broadcast to (B, H, Tq, Tk)."""
    if attn_mask is None:
        return None, 0, (0, 0, 0, 0)
    if is_causal:
        raise ValueError(where_msg(where, "is_causal=True and attn_mask were both given (torch refuses them "
                                   "together); fold the causal pattern into attn_mask"))
    p = _buffer.probe(attn_mask, "attn_mask", where)
    if p.dtype not in _MASK_KINDS:
        raise TypeError(where_msg(where, "attn_mask has dtype %s; a bool mask (True keeps a pair) or a float32 "
                                  "mask (added to the scores) is required, and mojo_train never casts" % p.dtype))
    if not p.c_contiguous:
        raise ValueError(where_msg(where, "attn_mask must be C-contiguous (got a strided view of shape %r); %s"
                                   % (tuple(p.shape), _buffer.contiguous_fix(p.obj, "attn_mask"))))
    b, h, _, tq, tk, _ = sizes
    full = (b, h, tq, tk)
    shape = tuple(p.shape)
    if not 1 <= len(shape) <= 4 or any(m not in (1, f) for m, f in zip(shape[::-1], full[::-1])):
        raise ValueError(where_msg(where, "attn_mask of shape %r does not broadcast to (B, H, Tq, Tk) = %r"
                                   % (shape, full)))
    if 0 in full:       # no pair reads the mask: strides 0 (a mask (0, 1, 2^31, 2^31)'s reach past 2^60)
        return p, _MASK_KINDS[p.dtype], (0, 0, 0, 0)
    shape4 = (1,) * (4 - len(shape)) + shape
    strides, step = [0, 0, 0, 0], 1
    for dim in range(3, -1, -1):
        strides[dim] = step if shape4[dim] != 1 else 0
        step *= shape4[dim]
    return p, _MASK_KINDS[p.dtype], tuple(strides)


def _scale(scale, d, where):
    """The scores' factor as float32: 1 / sqrt(D) in double rounded once (torch's default)."""
    if scale is None:
        value = 1.0 / math.sqrt(d)
    elif isinstance(scale, bool) or not isinstance(scale, numbers.Real):
        raise TypeError(where_msg(where, "scale must be a real number or None, got %r" % (scale,)))
    else:
        value = scale       # _nearest_f32 gives None past float32 (a numpy scalar compared with 1e39 warned)
    f = _nearest_f32(value)
    if f is None or not math.isfinite(f):
        raise ValueError(where_msg(where, "scale must be finite in float32, got %r" % (scale,)))
    return f


def _dropout(dropout_p, generator, where):
    """dropout_p as a float32 in [0, 1) (as a Python float); a generator is needed above 0."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, numbers.Real):
        raise TypeError(where_msg(where, "dropout_p must be a real number, got %r" % (dropout_p,)))
    p32 = _nearest_f32(dropout_p)                # None: beyond a double, or beyond float32
    if p32 is None or not 0.0 <= p32 < 1.0:
        raise ValueError(where_msg(where, "dropout_p must be in [0, 1) after rounding to float32, got %r%s"
                                   % (dropout_p, " (1 would drop every pair)" if p32 == 1.0 else "")))
    if generator is not None and not isinstance(generator, Generator):
        raise TypeError(where_msg(where, "generator must be a mojo_train.Generator or None, got %s"
                                  % type(generator).__name__))
    return p32


def _forward_dropout(p32, generator, where):
    """(p, seed, stream, offset) of a forward: one stream of ``generator`` (taken on success)."""
    if p32 == 0.0:
        return (0.0, 0, 0, 0)
    if generator is None:
        raise ValueError(where_msg(where, "dropout_p > 0 needs generator=mojo_train.Generator(seed): the pairs it "
                                   "drops are drawn from it, and the backward regenerates them"))
    return (p32, generator.seed, generator._take(None, where, commit=False), 0)


def _backward_dropout(p32, dropout_key, sizes, where):
    """(p, seed, stream, offset) of a backward, from the forward's key."""
    if dropout_key is None:
        if p32 > 0.0:
            raise ValueError(where_msg(where, "dropout_p > 0 needs dropout_key=, the DropoutKey the forward returned "
                                       "(return_lse=True gives (out, lse, dropout_key)); the generator cannot "
                                       "replay it"))
        return (0.0, 0, 0, 0)
    if not isinstance(dropout_key, DropoutKey):
        raise TypeError(where_msg(where, "dropout_key must be the forward's DropoutKey, got %s"
                                  % type(dropout_key).__name__))
    b, h, _, tq, tk, _ = sizes
    if _key_shape(dropout_key, "dropout_key", where) not in (None, (b, h, tq, tk)):
        raise ValueError(where_msg(where, "dropout_key is of pairs %r; this call's are (B, H, Tq, Tk) = %r"
                                   % (tuple(dropout_key.shape), (b, h, tq, tk))))
    if dropout_key.size != b * h * tq * tk:
        raise ValueError(where_msg(where, "dropout_key covers %r pairs; this call has B*H*Tq*Tk = %d"
                                   % (dropout_key.size, b * h * tq * tk)))
    key_p = None if isinstance(dropout_key.p, bool) else _nearest_f32(dropout_key.p)   # a key built by hand
    if key_p is None or key_p != dropout_key.p or not 0.0 < key_p < 1.0:
        raise ValueError(where_msg(where, "dropout_key's p must be a float32 in (0, 1), as the forward's, got %r"
                                   % (dropout_key.p,)))
    if p32 not in (0.0, key_p):
        raise ValueError(where_msg(where, "dropout_p is %r but dropout_key's p is %r; pass the forward's"
                                   % (p32, key_p)))
    return (key_p,) + tuple(_uint64(getattr(dropout_key, n), "dropout_key." + n, where)
                            for n in ("seed", "stream", "offset"))


def _prepare(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa, generator, where):
    """Every check that reads no tensor data: (pq, pk, pv, mask, sizes, scalars, dropout_p as
    float32)."""
    p32 = _dropout(dropout_p, generator, where)
    pq, pk, pv, sizes = _heads(q, k, v, enable_gqa, where)
    causal = _flag(is_causal, "is_causal", where)
    pm, kind, strides = _mask(attn_mask, sizes, causal, where)
    return pq, pk, pv, pm, sizes, (kind,) + strides + (int(causal), _scale(scale, sizes[5], where)), p32


def _backend(where, numeric_mode, **probes):
    backend, on_device = _ops.placement(where, numeric_mode, **probes)
    if not backend.has("attention"):
        raise NotImplementedError(where_msg(where, "the %s library (%s numeric mode) has no attention "
                                            "(MT_FEATURE_ATTENTION clear); the cpu oracle has it "
                                            "(MOJO_TRAIN_VENDOR=cpu)" % (backend.vendor, backend.numeric_mode)))
    return backend, on_device


def _mask_ptr(pm):
    return ffi.NULL if pm is None else _ops.vptr(pm)


def scaled_dot_product_attention(q, k, v, *, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False, generator=None, return_lse=False, numeric_mode=None):
    """Attention as ``torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask,
    dropout_p, is_causal, scale, enable_gqa=enable_gqa)``: ``softmax(q @ k.T * scale + mask) @ v``
    per (batch, head), by the contract's online softmax (native/contracts/attention.md).

    ``q`` is ``(B, H, Tq, D)``, ``k`` and ``v`` ``(B, Hkv, Tk, D)`` (``Hkv`` divides ``H`` with
    ``enable_gqa=True``; else ``Hkv == H``), float32, ``1 <= D <= 128``. ``attn_mask``: bool (True
    keeps a pair) or float32 (added; finite or -inf), broadcastable to ``(B, H, Tq, Tk)``.
    ``is_causal``: key j visible to query i iff ``j <= i``. ``scale``: None for ``1/sqrt(D)``
    (rounded once to float32). ``dropout_p`` in [0, 1) (after rounding to float32): above 0 each
    pair of the probabilities is dropped (+0) or kept and scaled by ``1 / (1 - p)``, by the rule
    of ``Generator.dropout`` at its own element of one stream that ``generator`` (a
    ``mojo_train.Generator``, required then) gives the call -- the generator's counter advances
    once, as for ``Generator.dropout``. Returns ``out`` ``(B, H, Tq, D)``, or ``(out, lse)`` with
    ``return_lse=True`` (``lse`` ``(B, H, Tq)``: what the backward takes), and with dropout
    ``(out, lse, dropout_key)`` (a ``DropoutKey`` of shape ``(B, H, Tq, Tk)``: the backward's
    ``dropout_key=``). ``lse`` is of the probabilities before dropout. A fully masked row gives
    out 0 and lse -inf.
    """
    where = "scaled_dot_product_attention"
    pq, pk, pv, pm, sizes, opts, p32 = _prepare(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                                generator, where)
    _flag(return_lse, "return_lse", where)
    drop = _forward_dropout(p32, generator, where)
    backend, on_device = _backend(where, numeric_mode, q=pq, k=pk, v=pv, attn_mask=pm)
    b, h, _, tq, tk, d = sizes
    out = _ops.out_f32((b, h, tq, d), on_device, numeric_mode)
    lse = _ops.out_f32((b, h, tq), on_device, numeric_mode)
    rc = backend.lib.mt_attention_forward(_ops.fptr(out), _ops.fptr(lse), _ops.fptr(pq), _ops.fptr(pk),
                                          _ops.fptr(pv), _mask_ptr(pm), *opts, *sizes, *drop)
    _ops.check(backend, rc, where, _C_NAMES)
    if not p32:
        return (out, lse) if return_lse else out
    generator._take(None, where)                  # the stream is used: the counter advances
    key = DropoutKey(drop[1], drop[2], drop[3], p32, b * h * tq * tk, (b, h, tq, tk))
    return (out, lse, key) if return_lse else out


def _saved(dout, out, lse, sizes, where):
    """Probes of dout, out (q's shape) and lse ((B, H, Tq))."""
    b, h, _, tq, _, d = sizes
    pdo, po = _ops.f32_in(dout, "dout", where), _ops.f32_in(out, "out", where)
    plse = _ops.f32_in(lse, "lse", where)
    for name, p, shape in (("dout", pdo, (b, h, tq, d)), ("out", po, (b, h, tq, d)), ("lse", plse, (b, h, tq))):
        if tuple(p.shape) != shape:
            raise ValueError(where_msg(where, "%s must have shape %r, got %r%s" % (
                name, shape, tuple(p.shape), " (the forward's with return_lse=True)" if name == "lse" else "")))
    return pdo, po, plse


def scaled_dot_product_attention_backward(dout, q, k, v, out, lse, *, attn_mask=None, dropout_p=0.0,
                                          is_causal=False, scale=None, enable_gqa=False, generator=None,
                                          dropout_key=None, numeric_mode=None):
    """Gradients of :func:`scaled_dot_product_attention`: ``(dq, dk, dv)``.

    ``dout`` is the gradient of ``out``; ``out`` and ``lse`` are the forward's (``return_lse=True``),
    from the same inputs and keywords, which are passed again here. The probabilities are
    recomputed as ``exp(score - lse)``; ``dk`` and ``dv`` (``(B, Hkv, Tk, D)``) sum over the query
    heads that share a kv head. A fully masked row contributes nothing (its dq row is 0). With
    dropout, ``dropout_key`` is the forward's third result (``dropout_p`` may be left 0 or given
    as the forward's; ``generator`` is not read: the key replays the forward's stream).
    """
    where = "scaled_dot_product_attention_backward"
    pq, pk, pv, pm, sizes, opts, p32 = _prepare(q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                                generator, where)
    drop = _backward_dropout(p32, dropout_key, sizes, where)
    pdo, po, plse = _saved(dout, out, lse, sizes, where)
    backend, on_device = _backend(where, numeric_mode, dout=pdo, q=pq, k=pk, v=pv, out=po, lse=plse, attn_mask=pm)
    dq = _ops.out_f32(tuple(pq.shape), on_device, numeric_mode)
    dk = _ops.out_f32(tuple(pk.shape), on_device, numeric_mode)
    dv = _ops.out_f32(tuple(pv.shape), on_device, numeric_mode)
    rc = backend.lib.mt_attention_backward(_ops.fptr(dq), _ops.fptr(dk), _ops.fptr(dv), _ops.fptr(pdo),
                                           _ops.fptr(pq), _ops.fptr(pk), _ops.fptr(pv), _ops.fptr(po),
                                           _ops.fptr(plse), _mask_ptr(pm), *opts, *sizes, *drop)
    _ops.check(backend, rc, where, _C_NAMES)
    return dq, dk, dv
