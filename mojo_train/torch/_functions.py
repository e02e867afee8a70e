"""The adapter's torch.autograd.Functions: each forward and backward is one call of mojo_train's
native API on the tensors' own memory, and nothing else computes.

Contract: the arguments were checked by mojo_train/torch/functional.py (dtype, autocast, one
device); ``where`` is the caller's entry point (``torch.nn.Linear``, ...), which the native
API's refusals are worded for (its argument names become the user's: ``a`` -> ``input``, ``dc``
-> ``grad_output``, ...; a backward's ``where`` ends in ``.backward``). Strided tensors are made
contiguous here (``_tensors.dense``: a copy, as torch's own kernels make) and handed to the
native API as the Probes ``_tensors.probed`` reads from torch's metadata, the ones its own checks
would make (the embedding's ids, a loss's class targets and an attention mask go as tensors: the
native API probes those itself; a mask's broadcast dimensions are narrowed to size 1 first,
``_tensors.unbroadcast``, as the native call broadcasts them without a copy). Outputs are torch tensors: ``torch.empty`` passed as ``out=``
where the native call takes one (SiLU, GELU, dropout); otherwise what the native call allocated:
on CUDA torch tensors already (``_tensors.native`` lends it torch's allocator), on the CPU its
Array wrapped without a copy (``_tensors.as_torch``). No output is a view (in-place ops on it
stay allowed).
Saved for backward: linear's input and weight, RMSNorm's input and weight, the embedding's ids,
SiLU's input, ReLU's output, dropout's key (never its mask), and the losses' gradients, which
the native losses return from the forward call. A loss's backward multiplies those by the
incoming gradient with torch's ``mul`` (one float32 rounding an element; exact, so the native
bits, when it is 1.0 as after ``loss.backward()``). Backwards are once-differentiable, and refuse
``create_graph=True`` by name (``once_differentiable`` below).
"""
import functools

import torch
from torch.autograd.function import once_differentiable as _torch_once_differentiable

from .. import attention as _attention
from .. import elementwise as _elementwise
from .. import layer_norm as _layer_norm
from .. import embedding as _embedding
from .. import linear as _linear
from .. import lm_head as _lm_head
from .. import loss as _loss
from .. import rms_norm as _rms_norm
from .._errors import where_msg
from .._ops import Fresh
from ._tensors import as_torch, dense, empty_like, native, probed, unbroadcast, wait_for_torch

# the native API's argument names -> the user's, per op
_LINEAR = {"a": "input", "dc": "grad_output"}
_ROWS = {"x": "input", "dy": "grad_output"}
_EMBEDDING = {"ids": "input", "dy": "grad_output"}
_LOSS = {"logits": "input", "targets": "target"}
_ATTENTION = {"q": "query", "k": "key", "v": "value", "dout": "grad_output"}


def once_differentiable(backward):
    """torch's ``once_differentiable``, and a refusal where the backward is asked to build a
    graph (``create_graph=True``: double backward, a gradient penalty, Hessian products; grad
    mode is on inside a backward exactly then). torch's decorator refuses only when the incoming
    gradient itself requires grad: with a constant one (``y.sum()``'s), the gradients came back
    as constants, and a penalty built on them was dropped from the next backward silently."""
    once = _torch_once_differentiable(backward)

    @functools.wraps(backward)
    def checked(ctx, *grads):
        if torch.is_grad_enabled():
            raise RuntimeError(where_msg(ctx.where + ".backward", "a differentiable gradient was asked for "
                                         "(create_graph=True: double backward, a gradient penalty); mojo_train's "
                                         "backwards are once-differentiable. Take this gradient with "
                                         "create_graph=False, or use torch's own layer where the graph is "
                                         "differentiated twice"))
        return once(ctx, *grads)
    return checked


def _incoming(dy):
    """A backward's incoming gradient, made dense, once torch's stream has produced it."""
    dy = dense(dy)
    wait_for_torch(dy.device)
    return dy


def _backward(ctx, names, fn, *args, **kwargs):
    """A backward's native call, its refusal worded for ``<where>.backward``."""
    return native(ctx.where + ".backward", names, fn, *args, **kwargs)


def _in_place(ctx, input, result):
    """``input`` holding ``result`` (copied in unless the native call wrote it there), marked
    dirty for autograd: the output of an ``inplace=True`` call."""
    if result is not input:
        input.copy_(result)
    ctx.mark_dirty(input)
    return input


class LinearFunction(torch.autograd.Function):
    """``input @ weight.T + bias``: mojo_train.linear_forward / linear_backward."""

    @staticmethod
    def forward(ctx, input, weight, bias, numeric_mode, where):
        x, w, b = dense(input), dense(weight), dense(bias)
        wait_for_torch(x.device)
        y = native(where, _LINEAR, _linear.linear_forward, probed(x), probed(w), probed(b),
                   numeric_mode=numeric_mode)
        ctx.save_for_backward(x, w)
        ctx.numeric_mode, ctx.has_bias, ctx.where = numeric_mode, bias is not None, where
        return as_torch(y, x.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        x, w = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        dy = _incoming(dy)
        grads = _backward(ctx, _LINEAR, _linear.linear_backward, probed(dy), probed(x), probed(w),
                          need_input_grad=need_x, need_weight_grad=need_w,
                          need_bias_grad=bool(ctx.has_bias and need_b), numeric_mode=ctx.numeric_mode)
        dx, dw, db = (tuple(grads) + (None,))[:3]
        return as_torch(dx, dy.device), as_torch(dw, dy.device), as_torch(db, dy.device), None, None


def _norm_rows(input, normalized_shape, *params):
    """(x, x as rows of D, each parameter as a vector of D or None): the last
    ``len(normalized_shape)`` dimensions flattened into one (views, no copy of dense tensors)."""
    x = dense(input)
    d = 1
    for s in normalized_shape:
        d *= s
    rows = x.view(tuple(x.shape[:x.dim() - len(normalized_shape)]) + (d,))
    return x, rows, tuple(None if p is None else dense(p).view(d) for p in params)


def _norm_forward(ctx, fn, input, params, normalized_shape, eps, numeric_mode, where):
    """A row normalization's forward (``fn``: rms_norm_forward or layer_norm_forward over the
    trailing dimensions flattened into rows of D); saves what its backward reads."""
    x, rows, flat = _norm_rows(input, normalized_shape, *params)
    wait_for_torch(x.device)
    y = native(where, _ROWS, fn, probed(rows), *map(probed, flat), eps, numeric_mode=numeric_mode)
    ctx.save_for_backward(rows, *flat)
    ctx.eps, ctx.numeric_mode, ctx.where = eps, numeric_mode, where
    ctx.shape, ctx.normalized_shape = x.shape, normalized_shape
    return as_torch(y, x.device).view(x.shape).detach()   # not a view: in-place ops on it stay allowed


def _norm_backward(ctx, fn, dy):
    """(dx, then each parameter's gradient shaped like it, or None): ``fn`` is the backward."""
    rows, *flat = ctx.saved_tensors
    dy = _incoming(dy).view(rows.shape)
    dx, *grads = _backward(ctx, _ROWS, fn, probed(dy), probed(rows), *map(probed, flat), ctx.eps,
                           numeric_mode=ctx.numeric_mode)
    shaped = tuple(None if g is None else as_torch(g, dy.device).view(ctx.normalized_shape) for g in grads)
    return (as_torch(dx, dy.device).view(ctx.shape),) + shaped


class RMSNormFunction(torch.autograd.Function):
    """RMS normalization over the last ``len(normalized_shape)`` dimensions, flattened into one
    row of D elements (a view): mojo_train.rms_norm_forward / rms_norm_backward."""

    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, numeric_mode, where):
        return _norm_forward(ctx, _rms_norm.rms_norm_forward, input, (weight,), normalized_shape, eps, numeric_mode,
                             where)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _norm_backward(ctx, _rms_norm.rms_norm_backward, dy) + (None, None, None, None)


class LayerNormFunction(torch.autograd.Function):
    """Layer normalization over the last ``len(normalized_shape)`` dimensions, flattened into one
    row of D elements (a view): mojo_train.layer_norm_forward / layer_norm_backward."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, numeric_mode, where):
        return _norm_forward(ctx, _layer_norm.layer_norm_forward, input, (weight, bias), normalized_shape, eps,
                             numeric_mode, where)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        return _norm_backward(ctx, _layer_norm.layer_norm_backward, dy) + (None, None, None, None)


class GELUFunction(torch.autograd.Function):
    """GELU (``approximate`` 'none' or 'tanh'): mojo_train.gelu_forward / gelu_backward into
    torch.empty outputs."""

    @staticmethod
    def forward(ctx, input, approximate, numeric_mode, where):
        x = dense(input)
        y = empty_like(x)
        wait_for_torch(x.device)
        native(where, _ROWS, _elementwise.gelu_forward, probed(x), approximate, out=Fresh(probed(y)),
               numeric_mode=numeric_mode)
        ctx.save_for_backward(x)
        ctx.approximate, ctx.numeric_mode, ctx.where = approximate, numeric_mode, where
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dy = _incoming(dy)
        dx = empty_like(dy)
        _backward(ctx, _ROWS, _elementwise.gelu_backward, probed(dy), probed(x), ctx.approximate,
                  out=Fresh(probed(dx)), numeric_mode=ctx.numeric_mode)
        return dx, None, None, None


class AttentionFunction(torch.autograd.Function):
    """Scaled dot-product attention: mojo_train.scaled_dot_product_attention (its output and
    log-sum-exp, saved) and scaled_dot_product_attention_backward (which recomputes the
    probabilities from them). ``options`` are the keywords both take; no gradient flows to
    ``attn_mask``."""

    @staticmethod
    def forward(ctx, query, key, value, attn_mask, options, numeric_mode, where):
        q, k, v = dense(query), dense(key), dense(value)
        # the native call broadcasts: no B*H copies of an expanded mask
        full = tuple(q.shape[:3]) + (k.shape[2],) if q.dim() == 4 and k.dim() == 4 else ()   # else refused natively
        mask = dense(unbroadcast(attn_mask, full))
        wait_for_torch(q.device)
        res = native(where, _ATTENTION, _attention.scaled_dot_product_attention, probed(q), probed(k),
                     probed(v), attn_mask=mask, return_lse=True, numeric_mode=numeric_mode, **options)
        (out, lse), ctx.key = res[:2], (res[2] if len(res) == 3 else None)   # dropout: its DropoutKey
        out, lse = as_torch(out, q.device), as_torch(lse, q.device)
        ctx.save_for_backward(q, k, v, out, lse, mask)
        ctx.options, ctx.numeric_mode, ctx.where = options, numeric_mode, where
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse, mask = ctx.saved_tensors
        dout = _incoming(dout)
        options = {n: x for n, x in ctx.options.items() if n not in ("dropout_p", "generator")}
        dq, dk, dv = _backward(ctx, _ATTENTION, _attention.scaled_dot_product_attention_backward, probed(dout),
                               probed(q), probed(k), probed(v), probed(out), probed(lse), attn_mask=mask,
                               dropout_key=ctx.key, numeric_mode=ctx.numeric_mode, **options)
        return as_torch(dq, q.device), as_torch(dk, q.device), as_torch(dv, q.device), None, None, None, None


class EmbeddingFunction(torch.autograd.Function):
    """Rows of ``weight`` at integer ``ids``: mojo_train.embedding_forward / embedding_backward
    (the dense (num_embeddings, embedding_dim) gradient, the ``padding_idx`` row +0.0)."""

    @staticmethod
    def forward(ctx, ids, weight, padding_idx, numeric_mode, where):
        i, w = dense(ids), dense(weight)
        wait_for_torch(w.device)
        y = native(where, _EMBEDDING, _embedding.embedding_forward, probed(w), i, numeric_mode=numeric_mode)
        ctx.save_for_backward(i)
        ctx.vocab, ctx.padding_idx, ctx.numeric_mode, ctx.where = w.shape[0], padding_idx, numeric_mode, where
        return as_torch(y, w.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (ids,) = ctx.saved_tensors
        dy = _incoming(dy)
        dw = _backward(ctx, _EMBEDDING, _embedding.embedding_backward, probed(dy), ids, ctx.vocab,
                    padding_idx=ctx.padding_idx, numeric_mode=ctx.numeric_mode)
        return None, as_torch(dw, dy.device), None, None, None


class SiLUFunction(torch.autograd.Function):
    """``x * sigmoid(x)``: mojo_train.silu_forward / silu_backward into torch.empty outputs.
    In place (``inplace=True``), the input is kept as a copy first: the backward needs it."""

    @staticmethod
    def forward(ctx, input, inplace, numeric_mode, where):
        x = dense(input)
        if inplace and x is input:
            x = x.clone()                       # the input, kept for the backward
        y = input if inplace and input.is_contiguous() and not input.is_neg() else empty_like(x)
        wait_for_torch(x.device)
        native(where, _ROWS, _elementwise.silu_forward, probed(x), out=probed(y) if y is input else Fresh(probed(y)),
               numeric_mode=numeric_mode)
        ctx.save_for_backward(x)
        ctx.numeric_mode, ctx.where = numeric_mode, where
        return _in_place(ctx, input, y) if inplace else y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        dy = _incoming(dy)
        dx = empty_like(dy)
        _backward(ctx, _ROWS, _elementwise.silu_backward, probed(dy), probed(x), out=Fresh(probed(dx)),
                  numeric_mode=ctx.numeric_mode)
        return dx, None, None, None


class ReLUFunction(torch.autograd.Function):
    """``max(x, 0)``: mojo_train.relu_forward / relu_backward. The backward reads the output
    (``y > 0`` exactly where ``x > 0``), so ``inplace=True`` needs no copy of the input; it
    writes the result back into the input (one copy: relu_forward takes no ``out=``)."""

    @staticmethod
    def forward(ctx, input, inplace, numeric_mode, where):
        x = dense(input)
        wait_for_torch(x.device)
        y = as_torch(native(where, _ROWS, _elementwise.relu_forward, probed(x), numeric_mode=numeric_mode),
                     x.device)
        if inplace:
            y = _in_place(ctx, input, y)
        ctx.save_for_backward(y)
        ctx.numeric_mode, ctx.where = numeric_mode, where
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        y = dense(y)            # a copy (if any) on torch's stream, before the wait for it
        dy = _incoming(dy)
        dx = _backward(ctx, {"x": "the output", "dy": "grad_output"}, _elementwise.relu_backward,
                    probed(dy), probed(y), numeric_mode=ctx.numeric_mode)
        return as_torch(dx, dy.device), None, None, None


class DropoutFunction(torch.autograd.Function):
    """Inverted dropout by a mojo_train.Generator: the forward keeps the DropoutKey, the backward
    regenerates the mask from it (Generator.dropout / dropout_backward, into torch outputs)."""

    @staticmethod
    def forward(ctx, input, p, inplace, generator, where):
        x = dense(input)
        out = x if inplace and x is input else empty_like(x)
        wait_for_torch(x.device)
        _, ctx.key = native(where, _ROWS, generator.dropout, probed(x), p,
                            out=probed(out) if out is x else Fresh(probed(out)))
        ctx.generator, ctx.where = generator, where
        return _in_place(ctx, input, out) if inplace else out

    @staticmethod
    @once_differentiable
    def backward(ctx, dy):
        dy = _incoming(dy)
        dx = empty_like(dy)
        _backward(ctx, _ROWS, ctx.generator.dropout_backward, probed(dy), ctx.key, out=Fresh(probed(dx)))
        return dx, None, None, None, None


def _is_one(upstream):
    """True when a loss's incoming gradient is the 0-d 1.0 of ``loss.backward()`` (read once a
    backward: on CUDA, item() costs a sync the call makes anyway)."""
    return upstream.dim() == 0 and upstream.item() == 1.0


def _scaled(grad, upstream, one):
    """A loss's saved gradient times the incoming gradient of the loss (see the module
    docstring); ``one``: ``_is_one(upstream)``, when the saved bits are the result, no multiply."""
    if grad is None:
        return None
    return grad if one else grad * upstream


class CrossEntropyFunction(torch.autograd.Function):
    """mojo_train.cross_entropy(return_grad=True): the loss and d loss / d logits in one call;
    ``options`` are its keywords, passed through as they are."""

    @staticmethod
    def forward(ctx, logits, target, want_grad, numeric_mode, options, where):
        x, t = dense(logits), dense(target)
        wait_for_torch(x.device)
        result = native(where, _LOSS, _loss.cross_entropy, probed(x), t, return_grad=want_grad,
                        numeric_mode=numeric_mode, **options)
        loss, dlogits = result if want_grad else (result, None)
        ctx.save_for_backward(as_torch(dlogits, x.device))
        ctx.where = where
        return as_torch(loss, x.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, upstream):
        (dlogits,) = ctx.saved_tensors
        return _scaled(dlogits, upstream, dlogits is not None and _is_one(upstream)), None, None, None, None, None


class LinearCrossEntropyFunction(torch.autograd.Function):
    """mojo_train.linear_cross_entropy (the chunked LM head, no logits kept) with
    ``return_grad=True``: loss, d_input, d_linear_weight and d_linear_bias in one call."""

    @staticmethod
    def forward(ctx, input, linear_weight, linear_bias, target, want_grad, numeric_mode, options, where):
        h, w, b, t = dense(input), dense(linear_weight), dense(linear_bias), dense(target)
        wait_for_torch(h.device)
        ctx.where = where
        result = native(where, {}, _lm_head.linear_cross_entropy, probed(h), probed(w), probed(t),
                        linear_bias=probed(b), return_grad=want_grad,
                        numeric_mode=numeric_mode, **options)
        if not want_grad:
            ctx.save_for_backward(None, None, None)
            return as_torch(result, h.device)
        grads = (tuple(result[1:]) + (None,))[:3]
        ctx.save_for_backward(*(as_torch(g, h.device) for g in grads))
        return as_torch(result[0], h.device)

    @staticmethod
    @once_differentiable
    def backward(ctx, upstream):
        d_input, d_weight, d_bias = ctx.saved_tensors
        one = (d_input is not None or d_weight is not None or d_bias is not None) and _is_one(upstream)
        return (_scaled(d_input, upstream, one), _scaled(d_weight, upstream, one), _scaled(d_bias, upstream, one),
                None, None, None, None, None)
