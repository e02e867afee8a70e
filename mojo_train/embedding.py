"""Embedding tables: torch.nn.Embedding's forward and dense backward, bit-pinned.

``embedding_forward(weight, ids)`` gathers rows (exact copies of their bits);
``embedding_backward(dy, ids, vocab)`` is the dense ``(vocab, d)`` gradient, each row's terms
summed by the token rule (native/contracts/embedding.md): positions cut into leaves of 1024,
each leaf folded in ascending position order from +0.0, the leaves combined by the pairwise
tree. No atomics, on any vendor, so the gradient is the same bits on the CPU oracle and every
GPU, for every thread count, launch geometry and plan. ``Embedding`` holds a table and calls
the two; there is no autograd here, and it never updates its table itself.

Refused by name, never cast or clamped: float (or bool) ids, ids outside ``[0, vocab)``,
empty ids or tables, NaN/inf in ``dy`` or in a gradient added into, and torch's
``max_norm``, ``scale_grad_by_freq=True`` and ``sparse=True``.
"""
import numbers

from . import _buffer, _native, _npz, _ops
from ._array import Array
from ._errors import where_msg
from ._native import numeric_mode_arg
from .device import DeviceArray, to_device, upload

__all__ = ["Embedding", "embedding_forward", "embedding_backward"]

_PLANS = {"auto": 0, "scan": 1, "sort": 2}
_FORMAT = "mojo_train.Embedding/1"     # the tag of files written by Embedding.save
_ENTRIES = ("format", "meta", "numeric_mode", "plan", "weight")     # what Embedding.save writes


# ---- arguments -------------------------------------------------------------------------------
def _positive(value, name, where):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(where_msg(where, "%s must be an int, got %r" % (name, value)))
    if value < 1:
        raise ValueError(where_msg(where, "%s must be >= 1, got %d" % (name, value)))
    return int(value)


def _padding(padding_idx, vocab, where):
    """padding_idx in [-vocab, vocab) as a row number (negative counts from the end), or -1."""
    if padding_idx is None:
        return -1
    if isinstance(padding_idx, bool) or not isinstance(padding_idx, numbers.Integral):
        raise TypeError(where_msg(where, "padding_idx must be an int or None, got %r" % (padding_idx,)))
    if not -vocab <= padding_idx < vocab:
        raise ValueError(where_msg(where, "padding_idx must be within [-%d, %d), got %d"
                                   % (vocab, vocab, padding_idx)))
    return int(padding_idx) % vocab


def _load_fail(path, why):
    raise _npz.NpzError("%s %s" % (path, why), "Embedding.load")


def _plan(plan, where):
    if not isinstance(plan, str) or plan not in _PLANS:
        raise ValueError(where_msg(where, "plan must be 'auto', 'scan' or 'sort' (every plan gives the "
                                   "same bits), got %r" % (plan,)))
    return _PLANS[plan]


def _ids(ids, where):
    """(Probe, id_bytes, shape) of ids: an integer buffer of any shape (int32/int64 used in place,
    other integer dtypes copied to int64) or a flat list of ints; empty ids are refused. The
    caller's ids are probed once."""
    if isinstance(ids, (list, tuple)) and any(isinstance(v, (list, tuple)) for v in ids):
        raise TypeError(where_msg(where, "ids as a list must be flat; pass an integer buffer for "
                                  "ids of several dimensions"))
    raw = _ops.int_probe(ids, "ids", where)
    shape = tuple(raw.shape)
    n = 1
    for s in shape:
        n *= s
    if n == 0:
        raise ValueError(where_msg(where, "ids is empty (shape %r); an embedding call needs at least "
                                   "one id" % (shape,)))
    probe, id_bytes = _ops.ids_in(raw, n, "ids", where)
    return probe, id_bytes, shape


def _dy(dy, shape, where):
    """The Probe of dy and its width d: dy has shape ids.shape + (d,), or (n, d)."""
    p = _ops.f32_in(dy, "dy", where)
    n = 1
    for s in shape:
        n *= s
    if len(p.shape) < 1 or (tuple(p.shape[:-1]) != shape and tuple(p.shape[:-1]) != (n,)):
        raise ValueError(where_msg(where, "dy has shape %r; ids of shape %r need dy of shape %r"
                                   % (tuple(p.shape), shape, shape + ("d",))))
    if p.shape[-1] == 0:
        raise ValueError(where_msg(where, "dy is empty (d = 0)"))
    return p, p.shape[-1]


# ---- the functions ---------------------------------------------------------------------------
def embedding_forward(weight, ids, *, numeric_mode=None):
    """``weight[ids]``: the rows of a float32 ``(V, d)`` table at integer ``ids`` (any shape).

    Returns float32 of shape ``ids.shape + (d,)``: a ``mojo_train.Array``, or a ``DeviceArray``
    when the inputs are device memory. Every bit of a row is copied (NaN payloads and -0.0
    too). Ids outside ``[0, V)`` are refused naming the first such (flat) position.
    """
    where = "embedding_forward"
    if numeric_mode is None:
        out = _gather_plain(where, weight, ids)
        if out is not None:
            return out
    w = _table(weight, where)
    pi, id_bytes, shape = _ids(ids, where)
    return _gather(where, w, pi, id_bytes, shape, numeric_mode)


_ID_BYTES = {"int32": 4, "int64": 8}
_VOID_P = _ops.ffi.typeof("void *")


def _gather_plain(where, weight, ids):
    """embedding_forward of the common call -- a non-empty float32 (V, d) table and non-empty
    int32 or int64 ids, both our own DeviceArrays (or both Arrays), the environment's numeric
    mode -- without the probes: the same native call as ``_gather``; None when it does not
    apply (the general path then runs, with its refusals)."""
    kind = type(weight)
    if kind is not type(ids) or (kind is not DeviceArray and kind is not Array):
        return None
    wshape, ishape = weight.shape, ids.shape
    id_bytes = _ID_BYTES.get(ids.dtype)
    if weight.dtype != "float32" or id_bytes is None or len(wshape) != 2 or not wshape[0] or not wshape[1]:
        return None
    n = 1
    for s in ishape:
        n *= s
    if not n:
        return None
    on_device = kind is DeviceArray
    backend = _native.load()
    if on_device and backend.vendor == "cpu":
        return None
    vocab, d = wshape
    out = _ops.plain_out(tuple(ishape) + (d,), n * d, on_device, backend)
    if on_device:      # cffi passes any pointer as the ids' void *
        op, wp, ip = out._cptr, weight._cptr, ids._cptr
    else:
        op, wp, ip = _ops.fptr(out), _ops.fptr(weight), _ops.ffi.cast(_VOID_P, ids.address)
    rc = backend.lib.mt_embedding_forward(op, wp, ip, id_bytes, n, vocab, d, _ops.map_flags(None))
    if rc:
        backend.check(rc, where)
    return out


def _table(weight, where):
    """The Probe of a float32 (V, d) table, refused by name when empty."""
    w = _ops.f32_in(weight, "weight", where, ndim=2)
    if w.nelems == 0:
        raise ValueError(where_msg(where, "weight is empty (shape %r)" % (tuple(w.shape),)))
    return w


def _gather(where, w, pi, id_bytes, shape, numeric_mode):
    """embedding_forward's native call on checked Probes: table ``w``, ids ``pi`` of ``shape``. The
    output is this call's own, so it is declared fresh (a GPU checks the ids inside the gather)."""
    backend, on_device = _ops.placement(where, numeric_mode, weight=w, ids=pi)
    vocab, d = w.shape
    out = _ops.out_f32(shape + (d,), on_device, numeric_mode, backend)
    rc = backend.lib.mt_embedding_forward(_ops.fptr(out), _ops.fptr(w), _ops.vptr(pi), id_bytes, pi.nelems,
                                          vocab, d, _ops.map_flags(None))
    if rc:
        try:
            backend.check(rc, where)
        except ValueError as exc:       # the undefined output is ours, dropped: nothing of the caller's was written
            raise ValueError(str(exc).replace(_FRESH_TAIL, "; nothing was written")) from None
    return out


_FRESH_TAIL = "; out's contents are undefined (declared fresh); no input was written"   # mt_embedding.h's


def embedding_backward(dy, ids, vocab, *, padding_idx=None, grad=None, plan="auto", numeric_mode=None):
    """The gradient of ``embedding_forward`` with respect to the ``(vocab, d)`` table.

    ``dy``: float32 of shape ``ids.shape + (d,)`` (or ``(n, d)``). Row ``v`` of the result is
    the token rule (native/contracts/embedding.md) over the positions whose id is ``v``; rows
    no position names, and the ``padding_idx`` row (negative counts from the end), are +0.0.

    ``grad``: a float32 ``(vocab, d)`` gradient to add into, IN PLACE: rows with terms become
    ``grad + new`` (one addition each), every other row (the padding row too) keeps its bits;
    ``grad`` is returned. See ``Embedding.backward`` for the microbatch splits this reproduces
    exactly. ``plan`` ('auto', 'scan', 'sort') decides only how positions are grouped by row:
    every plan gives the same bits. The result is on the side (host or device) of the inputs.
    """
    where = "embedding_backward"
    vocab, pad, flags = _backward_options(vocab, padding_idx, plan, where)
    pi, id_bytes, shape = _ids(ids, where)
    g, d = _dy(dy, shape, where)
    return _scatter(where, g, pi, id_bytes, vocab, d, pad, flags, grad, numeric_mode)


def _backward_options(vocab, padding_idx, plan, where):
    """(vocab, padding row or -1, flags word without the accumulate bit), checked."""
    vocab = _positive(vocab, "vocab", where)
    return vocab, _padding(padding_idx, vocab, where), _plan(plan, where) << 1


def _scatter(where, g, pi, id_bytes, vocab, d, pad, flags, grad, numeric_mode):
    """embedding_backward's native call on checked Probes (dy ``g`` of width ``d``, ids ``pi``);
    ``grad``, when given, is checked here and added into."""
    pg = None
    if grad is not None:
        pg = _buffer.float32_tensor(grad, "grad", where, inplace=True)
        if tuple(pg.shape) != (vocab, d):
            raise ValueError(where_msg(where, "grad has shape %r, the gradient is (%d, %d)"
                                       % (tuple(pg.shape), vocab, d)))
        _buffer.refuse_overlap(where, ("grad", pg), [("dy", g), ("ids", pi)], in_place=False)
        flags |= 1
    backend, on_device = _ops.placement(where, numeric_mode, dy=g, ids=pi, grad=pg)
    out = grad if grad is not None else _ops.out_f32((vocab, d), on_device, numeric_mode, backend)
    rc = backend.lib.mt_embedding_backward(_ops.fptr(pg if pg is not None else out), _ops.fptr(g), _ops.vptr(pi),
                                           id_bytes, pi.nelems, vocab, d, pad, flags)
    # the C library's name of the table added into is the caller's grad
    _ops.check(backend, rc, where, rewrite=lambda text: text.replace("dweight (the gradient accumulated into)", "grad"))
    _buffer.wrote(pg)
    return out


# ---- the layer -------------------------------------------------------------------------------
# torch keywords this layer does not take, and why.
_REFUSED = {
    "_weight": "pass the table as weight= (or use Embedding.from_pretrained)",
    "_freeze": "use Embedding.from_pretrained(..., freeze=)",
    "device": "the table lives where its buffer lives: pass weight=mojo_train.to_device(table) "
              "for a GPU table",
    "dtype": "tables are float32 only: other dtypes are refused, never cast",
}


def _refuse_torch_options(max_norm, norm_type, scale_grad_by_freq, sparse, kwargs, where):
    if max_norm is not None:
        raise ValueError(where_msg(where, "max_norm is refused: torch renormalizes the gathered rows "
                                   "of the table in place during the forward, a write outside the "
                                   "embedding contract"))
    if norm_type != 2.0:
        raise ValueError(where_msg(where, "norm_type only takes 2.0 (it means nothing without "
                                   "max_norm, which is refused)"))
    for name, flag in (("scale_grad_by_freq", scale_grad_by_freq), ("sparse", sparse)):
        if not isinstance(flag, bool):      # np.False_ is not read as True (torch refuses a numpy bool too)
            raise TypeError(where_msg(where, "%s must be True or False, got %r" % (name, flag)))
    if scale_grad_by_freq is not False:
        raise ValueError(where_msg(where, "scale_grad_by_freq=True is refused: the gradient is the "
                                   "token rule's plain sum, without a division by id counts"))
    if sparse is not False:
        raise ValueError(where_msg(where, "sparse=True is refused: the gradient is the dense "
                                   "(num_embeddings, embedding_dim) table"))
    for name in kwargs:
        if name in _REFUSED:
            raise TypeError(where_msg(where, "%s= is not taken: %s" % (name, _REFUSED[name])))
        raise TypeError(where_msg(where, "unexpected keyword argument %r" % name))


def _own_table(weight, shape, numeric_mode, where):
    """The layer's own copy of a float32 table of ``shape``: an Array for host memory, a
    DeviceArray for device memory. ``weight`` may be the Probe its caller made."""
    p = _buffer.float32_tensor(weight, "weight", where)
    if tuple(p.shape) != shape:
        raise ValueError(where_msg(where, "weight has shape %r, want %r" % (tuple(p.shape), shape)))
    if not p.device:
        return Array._from_probe(p)
    out = DeviceArray.empty(shape, numeric_mode=numeric_mode)
    out._copy(out.ptr, p.address, p.nbytes)
    return out


class Embedding:
    """A lookup table with torch.nn.Embedding's forward and its dense backward.

    ``Embedding(num_embeddings, embedding_dim, padding_idx=None, *, weight=None,
    generator=None, plan='auto', numeric_mode=None)``

    The table is given or drawn, never both:

    - ``weight=``: a float32 ``(num_embeddings, embedding_dim)`` buffer (a CPU torch tensor,
      one that requires grad included, is read through its data), COPIED into the
      layer's own table (a ``mojo_train.Array``; a ``DeviceArray`` when ``weight`` is device
      memory, which keeps the table on the GPU). Writing into the buffer you passed later does
      not reach the layer; update ``layer.weight`` in place (an optimizer step on it) or assign
      a new table (copied the same way). As in torch, a given table's padding row is kept.
    - ``generator=``: a ``mojo_train.random.Generator``; the table is its
      ``normal((num_embeddings, embedding_dim))`` draw (N(0, 1), torch's initialization) and
      the padding row is then zeroed, as torch does.

    ``padding_idx`` (negative counts from the end): the forward gathers that row like any
    other; the backward gives it no gradient. ``plan``: how the backward groups positions by
    row ('auto', 'scan', 'sort'; every plan gives the same bits). torch's ``max_norm``,
    ``norm_type`` other than 2.0, ``scale_grad_by_freq=True`` and ``sparse=True`` are refused
    by name. A layer pickles with a host copy of its table; ``save``/``load`` use ``.npz``.
    """

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, *, weight=None, generator=None,
                 plan="auto", numeric_mode=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=False,
                 sparse=False, **kwargs):
        where = "Embedding"
        _refuse_torch_options(max_norm, norm_type, scale_grad_by_freq, sparse, kwargs, where)
        self.num_embeddings = _positive(num_embeddings, "num_embeddings", where)
        self.embedding_dim = _positive(embedding_dim, "embedding_dim", where)
        pad = _padding(padding_idx, self.num_embeddings, where)
        self.padding_idx = None if pad < 0 else pad
        _plan(plan, where)
        self.plan, self.numeric_mode, self.freeze = plan, numeric_mode_arg(numeric_mode, where), False
        self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse = None, 2.0, False, False
        shape = (self.num_embeddings, self.embedding_dim)
        if (weight is None) == (generator is None):
            raise ValueError(where_msg(where, "pass exactly one of weight= (a float32 %r table) and "
                                       "generator= (a mojo_train.random.Generator: N(0, 1) draws, like "
                                       "torch's initialization)%s" % (shape, "" if weight is None else
                                                                      "; got both")))
        if weight is not None:
            self._weight = _own_table(weight, shape, numeric_mode, where)
        else:
            drawn = generator.normal(shape)
            fresh = type(drawn) is Array and drawn.dtype == "float32" and drawn.shape == shape
            self._weight = drawn if fresh else _own_table(drawn, shape, numeric_mode, where)
            if self.padding_idx is not None:
                self._zero_row(self.padding_idx)

    @classmethod
    def from_pretrained(cls, embeddings, freeze=True, padding_idx=None, max_norm=None, norm_type=2.0,
                        scale_grad_by_freq=False, sparse=False, *, plan="auto", numeric_mode=None):
        """A layer over a copy of the float32 ``(V, d)`` table ``embeddings``, as torch's.

        ``freeze=True`` (torch's default) marks the table as not trained: ``backward`` then
        refuses (torch would give it no gradient); pass ``freeze=False`` to train it.
        """
        p = _ops.f32_in(embeddings, "embeddings", "Embedding.from_pretrained", ndim=2)
        if p.nelems == 0:
            raise ValueError(where_msg("Embedding.from_pretrained", "embeddings is empty (shape %r)" % (tuple(p.shape),)))
        # weight=p: the table's Probe, so that embeddings is probed once
        layer = cls(p.shape[0], p.shape[1], padding_idx, weight=p, plan=plan, numeric_mode=numeric_mode,
                    max_norm=max_norm, norm_type=norm_type, scale_grad_by_freq=scale_grad_by_freq, sparse=sparse)
        if not isinstance(freeze, bool):
            raise TypeError(where_msg("Embedding.from_pretrained", "freeze must be a bool, got %r" % (freeze,)))
        layer.freeze = freeze
        return layer

    # -- the table --
    @property
    def weight(self):
        """The layer's float32 (num_embeddings, embedding_dim) table (an Array or DeviceArray)."""
        return self._weight

    @weight.setter
    def weight(self, value):
        self._weight = _own_table(value, (self.num_embeddings, self.embedding_dim), self.numeric_mode,
                                  "Embedding.weight")

    def _zero_row(self, row):
        w, nbytes = self._weight, self.embedding_dim * 4
        if isinstance(w, DeviceArray):
            zeros = Array((self.embedding_dim,), "float32")
            w._copy(w.ptr + row * nbytes, zeros.address, nbytes)
        else:
            _buffer.zero_bytes(w.address + row * nbytes, nbytes)

    # -- the two calls --
    def forward(self, ids, device=False):
        """``weight[ids]``: float32 of shape ``ids.shape + (embedding_dim,)``.

        ``device=False`` returns a host ``mojo_train.Array``; ``device=True`` a ``DeviceArray``
        (a GPU vendor is needed). A device table (``weight=`` device memory) is gathered on the
        device, and with ``device=False`` the result is copied back. A host table is read like
        any host buffer: on a GPU vendor it is uploaded for each call (the whole table), so a
        table used on a GPU is best kept there.
        """
        where = "Embedding.forward"
        table = self._weight
        if not isinstance(device, bool):
            raise TypeError(where_msg(where, "device must be a bool, got %r" % (device,)))
        if device and not _native.load(self.numeric_mode).has("device_buffers"):
            raise ValueError(where_msg(where, "device=True but the loaded vendor takes no device buffers; set "
                                       "MOJO_TRAIN_VENDOR=cuda"))
        if device or isinstance(table, DeviceArray):
            pi, id_bytes, shape = _ids(ids, where)
            if not pi.device:       # our own upload of the checked ids, probed as such
                pi = _buffer.probe(upload(pi, self.numeric_mode), "ids", "embedding_forward")
            if not isinstance(table, DeviceArray):
                table = to_device(table, numeric_mode=self.numeric_mode)
            w = _table(table, "embedding_forward")
            out = _gather("embedding_forward", w, pi, id_bytes, shape, self.numeric_mode)
            return out if device else out.to_host()
        return embedding_forward(table, ids, numeric_mode=self.numeric_mode)

    __call__ = forward

    def backward(self, ids, dy, grad=None):
        """The dense (num_embeddings, embedding_dim) gradient of ``forward(ids)`` for ``dy``.

        ``dy``: float32 of shape ``ids.shape + (embedding_dim,)``, on the host or the device
        (the gradient comes back on the same side). Row ``v`` is the token rule over the
        positions holding ``v`` (leaves of 1024 positions folded in ascending order, combined
        by the pairwise tree); rows no position names, and the padding row, are +0.0.

        ``grad``: a previous (num_embeddings, embedding_dim) gradient, updated IN PLACE and
        returned: rows with terms become ``grad + new`` (one addition), other rows keep their
        bits. Running this over consecutive microbatches ``M_1, ..., M_k`` of one batch
        (``g = backward(M_1)``, then ``backward(M_i, grad=g)``) gives the unsplit gradient BIT
        FOR BIT exactly when, counting leaves of 1024 positions: after ``M_1``, only
        one-position microbatches follow while the first leaf is not full; from there the
        positions covered so far are ``S`` whole leaves, ``S`` a power of two, each further
        microbatch but the last covers exactly ``S`` more whole leaves (``S`` doubles), and
        the last covers 1 to ``S`` leaves (its last leaf may be short). Two microbatches: the
        first holds ``2^j`` whole leaves (1024, 2048, 4096, ... positions), the second at most
        as many. Why: the pairwise tree over ``L >= 2`` leaves adds the tree of its first
        ``P`` leaves (``P`` the largest power of two below ``L``) to the tree of the rest, and
        the running sum's last step adds the total so far to the last microbatch's tree; these
        agree exactly when the last microbatch is the leaves from ``P`` on and the earlier ones
        give the tree of those ``P`` leaves, recursively down to one leaf, whose serial chain
        only one-position microbatches extend (native/contracts/embedding.md). Other splits,
        e.g. four equal microbatches of 1024, round differently; combine equal microbatches of
        ``2^j`` whole leaves by the pairwise tree over their gradients instead (mt_accumulate),
        which is exact.

        Refused: a layer made by ``from_pretrained(freeze=True)``; ids outside the table;
        NaN/inf in ``dy`` or ``grad`` (nothing is written).
        """
        where = "Embedding.backward"
        if self.freeze:
            raise RuntimeError(where_msg(where, "this table is frozen (from_pretrained(freeze=True)), so it "
                                         "gets no gradient; build it with freeze=False to train it"))
        pi, id_bytes, shape = _ids(ids, where)
        g, d = _dy(dy, shape, where)
        if d != self.embedding_dim:
            raise ValueError(where_msg(where, "dy rows have %d columns, embedding_dim is %d"
                                       % (d, self.embedding_dim)))
        # embedding_backward's checks and call on the Probes made here (its messages, its name)
        vocab, pad, flags = _backward_options(self.num_embeddings, self.padding_idx, self.plan, "embedding_backward")
        return _scatter("embedding_backward", g, pi, id_bytes, vocab, d, pad, flags, grad, self.numeric_mode)

    # -- persistence --
    def __getstate__(self):
        state = dict(self.__dict__)
        if isinstance(self._weight, DeviceArray):
            state["_weight"] = self._weight.to_host()     # a host copy; DeviceArrays do not pickle
        return state

    def save(self, path):
        """Write the table and settings to ``path`` as an ``.npz`` (numpy.load reads it)."""
        path = _npz.file_name(path, "Embedding.save")
        table = self._weight.to_host() if isinstance(self._weight, DeviceArray) else self._weight
        meta = [self.num_embeddings, self.embedding_dim, -1 if self.padding_idx is None else self.padding_idx,
                int(self.freeze)]
        return _npz.write(path, {"format": _FORMAT, "weight": table, "meta": Array.from_list(meta, "int64"),
                                 "plan": self.plan, "numeric_mode": self.numeric_mode or ""})

    @classmethod
    def load(cls, path):
        """A layer from a file written by ``save`` (host table).

        Every stored field is checked and nothing is cast: the entries (exactly those ``save``
        writes), the format tag, ``meta`` (int64 ``[num_embeddings, embedding_dim,
        padding_idx or -1, freeze]``), the float32 table's shape, ``plan`` and ``numeric_mode``.
        A damaged, truncated or crafted file is a ValueError naming the file (a claimed size the
        file cannot hold is refused before anything is allocated); a missing file is
        FileNotFoundError, as ``open`` raises it.
        """
        path = _npz.file_name(path, "Embedding.load")
        try:
            return cls._from_arrays(_npz.read(path), path)
        except _npz.NpzError as exc:
            if exc.where == "Embedding.load":
                raise
            raise _npz.NpzError(exc.text, "Embedding.load") from None

    @classmethod
    def _from_arrays(cls, arrays, path):
        bad = sorted(set(arrays) - set(_ENTRIES))
        if bad:
            _load_fail(path, "unexpected entries %s (an Embedding file holds %s)" % (", ".join(bad), ", ".join(_ENTRIES)))
        tag = _npz.entry(arrays, "format", path, str)
        if tag != _FORMAT:
            _load_fail(path, "holds %r, not an Embedding (%r)" % (tag, _FORMAT))
        meta = _npz.entry(arrays, "meta", path, "int64", (4,)).tolist()
        v, d, pad, freeze = meta
        if v < 1 or d < 1 or freeze not in (0, 1) or not -1 <= pad < v:
            _load_fail(path, "has bad settings %r (want num_embeddings >= 1, embedding_dim >= 1, padding_idx in "
                             "[-1, num_embeddings), freeze 0 or 1)" % (meta,))
        weight = _npz.entry(arrays, "weight", path, "float32", (v, d))
        plan = _npz.entry(arrays, "plan", path, str)
        if plan not in _PLANS:
            _load_fail(path, "has plan %r; a plan is one of %s" % (plan, ", ".join(_PLANS)))
        mode = _npz.entry(arrays, "numeric_mode", path, str)
        try:
            mode = numeric_mode_arg(mode or None, "Embedding.load")
        except ValueError:
            _load_fail(path, "has numeric_mode %r; it is '' (the environment's) or one of %s"
                             % (mode, ", ".join(_native.NUMERIC_MODES)))
        layer = cls(v, d, None if pad < 0 else pad, weight=weight, plan=plan, numeric_mode=mode)
        layer.freeze = bool(freeze)
        return layer

    def __repr__(self):
        extra = "" if self.padding_idx is None else ", padding_idx=%d" % self.padding_idx
        return "Embedding(%d, %d%s)" % (self.num_embeddings, self.embedding_dim, extra)
