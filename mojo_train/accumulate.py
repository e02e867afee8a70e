"""Gradient accumulation: ``accumulate_grads`` and ``accumulation_is_aligned``.

Contract: native/contracts/accumulate.md. ``accumulate_grads`` adds microbatch gradients
elementwise by the pairwise tree over microbatches (``mt_accumulate``, one call per tensor);
when the split is aligned with the token rule (``accumulation_is_aligned``) that tree is the
unsplit batch's own tree, so the result has the unsplit gradient's bits. Nothing the caller
passed is written; results are new arrays on the inputs' side. ``mojo_train.schedule``
re-exports these names (their home before the accumulate family had its own module).
"""
import re

from . import _buffer, _ops
from ._errors import where_msg
from ._native import ffi

__all__ = ["accumulate_grads", "accumulation_is_aligned", "TOKEN_LEAF"]

TOKEN_LEAF = 1024                 # MT_TOKEN_LEAF of mt_pinned.h (the token rule)
_MAX_TOKENS = 2 ** 62             # the largest token count taken


def _alignment_problem(tokens, steps):
    """None when `steps` microbatches over `tokens` tokens are aligned; else why not."""
    if steps == 1:
        return None
    if tokens % steps:
        return "tokens=%d is not divisible by %d microbatches" % (tokens, steps)
    m = tokens // steps
    if m % TOKEN_LEAF:
        return ("each microbatch holds %d tokens, not a whole number of %d-token leaves"
                % (m, TOKEN_LEAF))
    leaves = m // TOKEN_LEAF
    if leaves & (leaves - 1):
        return ("each microbatch holds %d leaves of %d tokens; an aligned microbatch holds a power of "
                "two (1, 2, 4, ...)" % (leaves, TOKEN_LEAF))
    return None


def accumulation_is_aligned(tokens, accumulation_steps):
    """Whether ``accumulation_steps`` equal microbatches over ``tokens`` tokens, combined by
    ``accumulate_grads``, give exactly the bits of one unsplit batch (accumulate.md).

    True when ``accumulation_steps == 1``, or when each microbatch holds ``tokens /
    accumulation_steps`` tokens, a power of two times the token leaf (1024): then the unsplit
    batch's pairwise tree over leaves is the pairwise tree over the microbatches' own trees.
    """
    where = "accumulation_is_aligned"
    tokens = _ops.int_arg(tokens, "tokens", where, 1, _MAX_TOKENS)
    steps = _ops.int_arg(accumulation_steps, "accumulation_steps", where, 1, 2 ** 31 - 1)
    return _alignment_problem(tokens, steps) is None


def _entries(microbatch_grads, where):
    """(single, [[Probe per tensor] per microbatch])."""
    if _buffer._is_buffer(microbatch_grads) or not isinstance(microbatch_grads, (list, tuple)):
        raise TypeError(where_msg(where, "microbatch_grads must be a list with one gradient (a float32 "
                                  "buffer or a list of them) per microbatch, got %s"
                                  % type(microbatch_grads).__name__))
    if not microbatch_grads:
        raise ValueError(where_msg(where, "microbatch_grads is empty: no microbatches"))
    single = _buffer._is_buffer(microbatch_grads[0])
    out = []
    for i, entry in enumerate(microbatch_grads):
        name = "microbatch_grads[%d]" % i
        if single != _buffer._is_buffer(entry) or (not single and not isinstance(entry, (list, tuple))):
            raise TypeError(where_msg(where, "%s is a %s but microbatch_grads[0] is a %s; every microbatch "
                                      "has the same structure" % (name, type(entry).__name__,
                                                                  type(microbatch_grads[0]).__name__)))
        tensors = [entry] if single else list(entry)
        probes = [_ops.f32_in(x, name if single else "%s[%d]" % (name, j), where) for j, x in enumerate(tensors)]
        if out and len(probes) != len(out[0]):
            raise ValueError(where_msg(where, "%s has %d tensors, microbatch_grads[0] has %d"
                                       % (name, len(probes), len(out[0]))))
        for j, p in enumerate(probes):
            if out and tuple(p.shape) != tuple(out[0][j].shape):
                raise ValueError(where_msg(where, "%s tensor %d has shape %r, microbatch_grads[0]'s has %r"
                                           % (name, j, tuple(p.shape), tuple(out[0][j].shape))))
        out.append(probes)
    if not out[0]:
        raise ValueError(where_msg(where, "microbatch_grads[0] is an empty list of tensors"))
    return single, out


def _as_microbatches(tensor):
    """A rewrite for _ops.check: the C library's parts[k] is microbatch_grads[k] (then ``tensor``,
    "[j]" for a list's tensor j), and an overflowing sum is that tensor's."""
    def rewrite(text):
        text = re.sub(r"\bparts\[(\d+)\]", lambda m: "microbatch_grads[%s]%s" % (m.group(1), tensor), text)
        return text.replace("the sum overflows float32 (inf) although every part is finite",
                            "the sum of microbatch_grads[*]%s overflows float32 (inf) although every microbatch's "
                            "is finite" % tensor)
    return rewrite


def accumulate_grads(microbatch_grads, tokens, *, numeric_mode=None):
    """The sum of microbatch gradients by the pairwise tree over microbatches.

    ``microbatch_grads`` holds one entry per microbatch, in microbatch order: a float32 buffer,
    or a list of them, every entry with the same shapes. Elementwise, microbatches meet in the
    pairwise tree of clip.md step 4 (neighbours add, an odd last one rises), not a running sum.
    ``tokens`` is the whole step's token count: a split that ``accumulation_is_aligned``
    rejects raises ValueError saying why (``tokens=None`` skips the check; the sum is then
    still the tree, but need not equal the unsplit batch's bits). NaN, infinity, or a sum that
    overflows float32 is refused. Returns new arrays on the inputs' side (``Array`` or
    ``DeviceArray``), one entry's structure; nothing the caller passed is written.
    """
    where = "accumulate_grads"
    single, entries = _entries(microbatch_grads, where)
    steps = len(entries)
    if tokens is not None:
        tokens = _ops.int_arg(tokens, "tokens", where, 1, _MAX_TOKENS)
        problem = _alignment_problem(tokens, steps)
        if problem:
            raise ValueError(where_msg(where, "%d microbatches over tokens=%d are not aligned with the token "
                                       "rule: %s; pass tokens=None to combine them anyway (the result then "
                                       "need not equal the unsplit batch's bits)" % (steps, tokens, problem)))
    flat = {("microbatch_grads[%d]" % i) + ("" if single else "[%d]" % j): p
            for i, e in enumerate(entries) for j, p in enumerate(e)}
    backend, on_device = _ops.placement(where, numeric_mode, **flat)
    table = ffi.new("float *[]", steps)
    results = []
    for j, first in enumerate(entries[0]):
        out = _ops.out_f32(tuple(first.shape), on_device, numeric_mode)
        for i in range(steps):
            table[i] = _ops.fptr(entries[i][j])
        rc = backend.lib.mt_accumulate(_ops.fptr(out), table, steps, first.nelems)
        _ops.check(backend, rc, where, rewrite=_as_microbatches("" if single else "[%d]" % j))
        results.append(out)
    return results[0] if single else results
