"""Linear layers: ``linear_forward`` / ``linear_backward`` (torch's ``F.linear`` and its
gradients) and ``mlp_inference_sessions`` (Linear-ReLU-Linear over independent batches).

Contract: native/contracts/linear.md. Every GEMM output is one fused multiply-add chain over
the contracted index in ascending order; contractions over rows (dweight, dbias) follow the
token rule (leaves of 1024 rows, a pairwise tree over leaves), so a gradient summed over
microbatches of whole, power-of-two-aligned leaves has the same bits as one big batch.
Float tensors are float32 and C-contiguous, never cast; inputs may carry leading batch
dimensions (``(..., K)``), which are flattened into rows. A NaN or infinity in any input is
refused (ValueError naming it) and nothing the caller owns is written. Outputs are new
arrays on the inputs' side: ``mojo_train.Array`` for host buffers, ``DeviceArray`` for device
buffers (which need a GPU vendor). ``mojo_train.nn`` re-exports every name here.
"""
from . import _buffer, _ops
from ._errors import where_msg

__all__ = ["linear_forward", "linear_backward", "mlp_inference_sessions"]


def _flag(value, name, where):
    if not isinstance(value, bool):
        raise TypeError(where_msg(where, "%s must be True or False, got %r" % (name, value)))
    return value


def _weight_matrix(pa, pw, a_name, where):
    """(n, k) of a (N, K) weight against an input whose last dimension is K."""
    _ops.at_least_1d(pa, a_name, "..., K", where)
    n, k = pw.shape
    if pa.shape[-1] != k:
        fix = ("; weight must be in torch's (out_features, in_features) layout and this one looks transposed: "
               "pass a contiguous copy of its transpose (np.ascontiguousarray(weight.T), weight.t().contiguous())"
               if pa.shape[-1] == n else "")
        raise ValueError(where_msg(where, "%s has K=%d in its last dimension (shape %r) but weight is "
                                   "(N, K) = %r%s" % (a_name, pa.shape[-1], tuple(pa.shape), tuple(pw.shape), fix)))
    return n, k


def linear_forward(a, weight, bias=None, *, numeric_mode=None):
    """``a @ weight.T + bias``, as ``torch.nn.functional.linear``.

    ``a`` is ``(..., K)`` (leading dimensions are rows), ``weight`` is ``(N, K)`` in torch's
    layout, ``bias`` is ``(N,)`` or None. Returns a new float32 array of shape ``(..., N)``.
    ``out[i, j]`` is the chain ``acc = fma(a[i, p], weight[j, p], acc)`` over ``p = 0..K-1``
    from +0.0, plus ``bias[j]`` in one rounded addition.
    """
    where = "linear_forward"
    pa = _ops.f32_in(a, "a", where)
    pw = _ops.f32_in(weight, "weight", where, ndim=2)
    pb = None if bias is None else _ops.f32_in(bias, "bias", where, ndim=1)
    n, k = _weight_matrix(pa, pw, "a", where)
    _ops.vector_of(pb, n, "bias", where)
    backend, on_device = _ops.placement(where, numeric_mode, a=pa, weight=pw, bias=pb)
    out = _ops.out_f32(tuple(pa.shape[:-1]) + (n,), on_device, numeric_mode)
    rc = backend.lib.mt_linear_forward(_ops.fptr(out), _ops.fptr(pa), _ops.fptr(pw), _ops.fptr(pb),
                                       _ops.leading_rows(pa.shape), n, k)
    backend.check(rc, where)
    return out


def linear_backward(dc, a, weight, *, need_input_grad=True, need_weight_grad=True,
                    need_bias_grad=False, numeric_mode=None):
    """Gradients of :func:`linear_forward`: ``(da, dweight)``, or ``(da, dweight, dbias)`` with
    ``need_bias_grad=True``.

    ``dc`` is the output's gradient ``(..., N)``, ``a`` the forward's input ``(..., K)`` (the
    same leading dimensions), ``weight`` its ``(N, K)`` weight. ``da = dc @ weight`` (shape of
    ``a``; a chain over N), ``dweight = dc.T @ a`` (``(N, K)``) and ``dbias = dc.sum(rows)``
    (``(N,)``) are contractions over the rows and follow the token rule. A gradient not asked
    for (``need_input_grad=False``: the first layer's; ``need_weight_grad=False``: a frozen
    weight's) is not computed and comes back as None.
    """
    where = "linear_backward"
    for name, v in (("need_input_grad", need_input_grad), ("need_weight_grad", need_weight_grad),
                    ("need_bias_grad", need_bias_grad)):
        _flag(v, name, where)
    pdc = _ops.f32_in(dc, "dc", where)
    pa = _ops.f32_in(a, "a", where)
    pw = _ops.f32_in(weight, "weight", where, ndim=2)
    n, k = _weight_matrix(pa, pw, "a", where)
    if tuple(pdc.shape) != tuple(pa.shape[:-1]) + (n,):
        raise ValueError(where_msg(where, "dc must have shape %r (a's leading dimensions, then N), "
                                   "got %r" % (tuple(pa.shape[:-1]) + (n,), tuple(pdc.shape))))
    backend, on_device = _ops.placement(where, numeric_mode, dc=pdc, a=pa, weight=pw)
    da = _ops.out_f32(tuple(pa.shape), on_device, numeric_mode) if need_input_grad else None
    dw = _ops.out_f32((n, k), on_device, numeric_mode) if need_weight_grad else None
    db = _ops.out_f32((n,), on_device, numeric_mode) if need_bias_grad else None
    rc = backend.lib.mt_linear_backward(_ops.fptr(da), _ops.fptr(dw), _ops.fptr(db), _ops.fptr(pdc),
                                        _ops.fptr(pa), _ops.fptr(pw), _ops.leading_rows(pa.shape), n, k)
    backend.check(rc, where)
    return (da, dw, db) if need_bias_grad else (da, dw)


def mlp_inference_sessions(inputs, weight1, bias1, weight2, bias2, *, numeric_mode=None):
    """Independent batches of rows through one Linear-ReLU-Linear model:
    ``relu(x @ weight1.T + bias1) @ weight2.T + bias2`` for every session ``x``, the results
    concatenated in order into one ``(total rows, out_width)`` array.

    ``inputs`` is a list (or tuple) of ``(rows_i, width)`` float32 sessions; a session may
    have no rows, and the list may be empty. ``weight1`` is ``(hidden, width)``, ``weight2``
    ``(out_width, hidden)``; the biases are ``(hidden,)`` and ``(out_width,)`` or None. Each
    output row depends on its input row only, so the result does not depend on how the rows
    are split into sessions. Shapes that disagree are refused (ValueError naming them).
    """
    where = "mlp_inference_sessions"
    if not isinstance(inputs, (list, tuple)):
        raise TypeError(where_msg(where, "inputs must be a list of (rows, width) float32 sessions, "
                                  "got %s" % type(inputs).__name__))
    pw1 = _ops.f32_in(weight1, "weight1", where, ndim=2)
    pw2 = _ops.f32_in(weight2, "weight2", where, ndim=2)
    pb1 = None if bias1 is None else _ops.f32_in(bias1, "bias1", where, ndim=1)
    pb2 = None if bias2 is None else _ops.f32_in(bias2, "bias2", where, ndim=1)
    hidden, width = pw1.shape
    out_width, hidden2 = pw2.shape
    if hidden2 != hidden:
        raise ValueError(where_msg(where, "weight2 is (out_width, hidden) = %r but weight1 has hidden=%d"
                                   % (tuple(pw2.shape), hidden)))
    _ops.vector_of(pb1, hidden, "bias1", where)
    _ops.vector_of(pb2, out_width, "bias2", where)
    sessions = [_ops.f32_in(x, "inputs[%d]" % i, where, ndim=2) for i, x in enumerate(inputs)]
    for i, p in enumerate(sessions):
        if p.shape[1] != width:
            raise ValueError(where_msg(where, "inputs[%d] is %r but weight1 takes width %d"
                                       % (i, tuple(p.shape), width)))
    probes = {"inputs[%d]" % i: p for i, p in enumerate(sessions)}
    backend, on_device = _ops.placement(where, numeric_mode, weight1=pw1, bias1=pb1, weight2=pw2,
                                        bias2=pb2, **probes)
    rows = sum(p.shape[0] for p in sessions)
    x = _joined(sessions, rows, width, backend, on_device, numeric_mode)
    h = _ops.out_f32((rows, hidden), on_device, numeric_mode)
    r = _ops.out_f32((rows, hidden), on_device, numeric_mode)
    out = _ops.out_f32((rows, out_width), on_device, numeric_mode)
    lib = backend.lib
    _ops.check(backend, lib.mt_linear_forward(_ops.fptr(h), _ops.fptr(x), _ops.fptr(pw1), _ops.fptr(pb1),
                                              rows, hidden, width), where, _MLP_NAMES[0])
    _ops.check(backend, lib.mt_relu_forward(_ops.fptr(r), _ops.fptr(h), rows * hidden), where, _MLP_NAMES[1])
    _ops.check(backend, lib.mt_linear_forward(_ops.fptr(out), _ops.fptr(r), _ops.fptr(pw2), _ops.fptr(pb2),
                                              rows, out_width, hidden), where, _MLP_NAMES[2])
    return out


# The caller's names for the C arguments of mlp_inference_sessions' three calls. Inputs are
# checked finite by the first; the hidden layer is then non-finite only when it overflowed.
_MLP_NAMES = ({"a": "inputs", "weight": "weight1", "bias": "bias1"},
              {"x": "the hidden layer inputs @ weight1.T + bias1, which overflowed float32,"},
              {"a": "the hidden layer", "weight": "weight2", "bias": "bias2"})


def _joined(sessions, rows, width, backend, on_device, numeric_mode):
    """The sessions' rows in one (rows, width) buffer: the one non-empty session itself, or
    a copy made on the sessions' side."""
    full = [p for p in sessions if p.nelems]
    if len(full) == 1:
        return full[0]
    x = _ops.out_f32((rows, width), on_device, numeric_mode)
    dst = x.ptr if on_device else x.address
    for p in full:
        if on_device:
            void = _ops.ffi.cast
            rc = backend.lib.mt_memcpy(void("void *", dst), void("void *", p.address), p.nbytes)
            backend.check(rc, "mlp_inference_sessions")
        else:
            _buffer.copy_bytes(dst, p.address, p.nbytes)
        dst += p.nbytes
    return x
