"""The one check of the options the losses share: ``cross_entropy``, ``linear_cross_entropy``
and ``chunked_lm_head_loss`` all validate theirs here, so a value refused by one is refused
by every one, with the same words.

Contract: ``loss_options`` returns what the native call takes (a ``LossOptions``) or raises
before anything is allocated: TypeError for a wrong type (bool is never an int, a string is
never a number), ValueError for a value out of range, NotImplementedError for
``return_grad=True`` with ``reduction='none'``. Every message starts ``mojo_train.<where>:``
and names the keyword as the caller spelled it.
"""
import collections
import numbers
import operator

from ._errors import where_msg
from . import _native
from ._native import ffi

REDUCTIONS = _native.REDUCTIONS      # mojo_train.h enum mt_reduction
INT64_MIN, INT64_MAX = -2 ** 63, 2 ** 63 - 1
MAX_VOCAB = 2 ** 24   # the loss contract's bound on the classes (native/contracts/loss.md)
# mojo_train.h's MT_NO_IGNORE_INDEX: the ignore_index that ignores no row (a target equal to
# it is refused as out of range); chunked_lm_head_loss passes it, a caller may not.
NO_IGNORE_INDEX = INT64_MIN
NO_IGNORE = object()   # ignore_index=NO_IGNORE: the call has no ignore index (chunked_lm_head_loss)

LossOptions = collections.namedtuple(
    "LossOptions", "reduction ignore_index label_smoothing num_items return_grad chunk_rows")
LossOptions.__doc__ = """The native values: reduction code, int64 ignore_index, float32 label_smoothing,
num_items (0: the non-ignored count), return_grad, chunk_rows (0: the library's choice)."""


def integer(value, name, where, low=INT64_MIN):
    """``value`` as an int in [low, 2**63 - 1]: any integer-like (``operator.index``) but bool."""
    if isinstance(value, bool):
        raise TypeError(where_msg(where, "%s must be an int, got the bool %r" % (name, value)))
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(where_msg(where, "%s must be an int, got %r (%s)"
                                  % (name, value, type(value).__name__))) from None
    if not low <= v <= INT64_MAX:
        bound = "fit in int64" if low == INT64_MIN else "be >= %d (and fit in int64)" % low
        raise ValueError(where_msg(where, "%s must %s, got %d" % (name, bound, v)))
    return v


def _reduction(value, where):
    if not isinstance(value, str) or value not in REDUCTIONS:
        raise ValueError(where_msg(where, "reduction must be 'mean', 'sum' or 'none', got %r" % (value,)))
    return REDUCTIONS[value]


def _ignore_index(value, where):
    if value is NO_IGNORE:
        return NO_IGNORE_INDEX
    v = integer(value, "ignore_index", where)
    if v == NO_IGNORE_INDEX:
        raise ValueError(where_msg(where, "ignore_index -2**63 is reserved: the native library reads it as "
                                   "'no ignore index' (MT_NO_IGNORE_INDEX), so a target of -2**63 would be "
                                   "refused instead of ignored; use another value, e.g. torch's -100"))
    return v


def _smoothing(value, where):
    """label_smoothing as the float32 the native call sees: finite and in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(where_msg(where, "label_smoothing must be a real number (a float), got %r (%s)"
                                  % (value, type(value).__name__)))
    try:
        v32 = float(ffi.cast("float", float(value)))
    except OverflowError:
        v32 = float("inf")
    if not 0.0 <= v32 < 1.0:         # NaN fails too
        raise ValueError(where_msg(where, "label_smoothing must be in [0, 1) (as float32), got %r" % (value,)))
    return v32


def _return_grad(value, reduction, where):
    if not isinstance(value, bool):
        raise TypeError(where_msg(where, "return_grad must be a bool (True or False), got %r" % (value,)))
    if value and reduction == REDUCTIONS["none"]:
        raise NotImplementedError(where_msg(
            where, "return_grad=True with reduction='none' is not supported: reduction='none' has no gradient "
            "here (native/contracts/loss.md does not define where a per-row upstream gradient would enter the "
            "arithmetic); use reduction='sum' (the gradient of the sum of the row losses) or 'mean'"))
    return value


def _num_items(value, reduction, where):
    if value is None:
        return 0
    v = integer(value, "num_items", where, 1)
    if reduction != REDUCTIONS["mean"]:
        raise ValueError(where_msg(where, "num_items is the divisor of reduction='mean'; with another "
                                   "reduction it would be ignored, so it is refused"))
    return v


def loss_options(where, *, reduction="mean", ignore_index=-100, label_smoothing=0.0, num_items=None,
                 return_grad=False, chunk_rows=None):
    """Check every shared option of ``where`` (refusing the first bad one by name) and return
    the ``LossOptions`` the native call takes."""
    red = _reduction(reduction, where)
    grad = _return_grad(return_grad, red, where)
    ignore = _ignore_index(ignore_index, where)
    eps = _smoothing(label_smoothing, where)
    items = _num_items(num_items, red, where)
    chunk = 0 if chunk_rows is None else integer(chunk_rows, "chunk_rows", where, 1)
    return LossOptions(red, ignore, eps, items, grad, chunk)
