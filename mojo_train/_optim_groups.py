"""Param groups of SGD, Adam and AdamW (optim.py): each group's hyper-parameters, checked as the
constructor checks its own, and the native group table a step hands to mt_sgd_step_groups /
mt_adam_step_groups (native/contracts/optim.md, "Param groups").

A group is a dict, torch's shape: ``{"params": [tensors], "lr": ..., ...}``. Keys it lacks take
the optimizer's defaults (its constructor's arguments); keys no group of that optimizer takes
are refused naming the group and the key. Values are checked when a group is made and again,
before a step, whenever one has changed (a user may write ``param_groups[1]["lr"] = 0.1``
between steps, as with torch); a step with a bad value is refused and changes nothing.
"""
import numbers
import operator

from ._buffer import _is_buffer
from ._errors import where_msg
from ._native import ffi
from ._optim_common import _real


def _nonneg(value, name, where):
    return _real(value, name, where)


def _any_real(value, name, where):
    return _real(value, name, where, low=None)


def _betas(value, name, where):
    if isinstance(value, (set, frozenset, dict)) or not hasattr(value, "__getitem__"):
        # a set's order is its hashes', a generator's is spent once: (beta1, beta2) could come out swapped
        raise TypeError(where_msg(where, "%s must be a pair (beta1, beta2) in order, such as a tuple, got a %s"
                                  % (name, type(value).__name__)))
    try:
        b1, b2 = value
    except (TypeError, ValueError):
        raise ValueError(where_msg(where, "%s must be a pair (beta1, beta2), got %r" % (name, value)))
    return (_real(b1, name + "[0]", where, 0.0, 1.0, True), _real(b2, name + "[1]", where, 0.0, 1.0, True))


def _bool(value, name, where):
    if not isinstance(value, bool):
        raise TypeError(where_msg(where, "%s must be a bool, got %r" % (name, value)))
    return value


def _switch(value, name, where):
    """A torch switch taken both ways (amsgrad): torch's message for another type."""
    if value is not True and value is not False:
        raise TypeError(where_msg(where, "%s must be True or False, got %r" % (name, value)))
    return value


def _schedule(value, name, where):
    if value is not None and not callable(getattr(value, "lr_at", None)):
        raise TypeError(where_msg(where, "%s must have an lr_at(step) method, got %r" % (name, value)))
    return value


# The hyper-parameters a group of each optimizer takes, in the order they are checked.
ADAM_HYPER = (("lr", _nonneg), ("betas", _betas), ("eps", _nonneg), ("weight_decay", _nonneg),
              ("amsgrad", _switch), ("maximize", _bool), ("lr_schedule", _schedule))
SGD_HYPER = (("lr", _nonneg), ("momentum", _nonneg), ("dampening", _any_real), ("weight_decay", _nonneg),
             ("nesterov", _bool), ("maximize", _bool), ("lr_schedule", _schedule))


def key_name(prefix, key):
    """How the user spells a hyper-parameter: ``lr`` (an argument) or ``params[1]['lr']``."""
    return key if prefix is None else "%s[%r]" % (prefix, key)


def check_values(hyper, values, prefix, where, skip=()):
    """``values`` (every key of ``hyper``) checked and normalized, a new dict; keys in ``skip``
    are taken as they are (a scheduled group's lr is not read)."""
    out = {}
    for key, check in hyper:
        out[key] = values[key] if key in skip else check(values[key], key_name(prefix, key), where)
    f32 = lambda key: float(ffi.cast("float", out[key]))       # the values the native step sees
    if "nesterov" in out and out["nesterov"] and (f32("momentum") == 0.0 or f32("dampening") != 0.0):
        raise ValueError(where_msg(where, "%snesterov=True needs momentum > 0 and dampening == 0 in float32, got "
                                          "momentum=%r, dampening=%r" % ("" if prefix is None else prefix + ": ",
                                                                        values["momentum"], values["dampening"])))
    return out


def group_values(hyper, group, defaults, prefix, where):
    """A new group's hyper-parameters: ``group``'s own (checked), the others from ``defaults``;
    a key no group takes is refused."""
    keys = [k for k, _ in hyper]
    unknown = [k for k in group if k != "params" and k not in keys]
    if unknown:
        raise ValueError(where_msg(where, "%s has unknown key %r; a group takes 'params' and %s"
                                   % (prefix, unknown[0], ", ".join(map(repr, keys)))))
    return check_values(hyper, dict(defaults, **{k: group[k] for k in keys if k in group}), prefix, where)


def split_params(params, where):
    """``params`` as a list of (tensors, group dict or None, name): one entry for a buffer or an
    iterable of buffers (named ``params``), one per group for a list of dicts (``params[i]``)."""
    if isinstance(params, dict):
        raise TypeError(where_msg(where, "params must be a float32 buffer, a list of them or a list of param "
                                         "groups (dicts), got a dict; pass [params] for one group"))
    if _is_buffer(params) or isinstance(params, (str, bytes)) or not hasattr(params, "__iter__"):
        return [(params, None, "params")]          # tensor_list names or refuses it
    items = params if type(params) in (list, tuple) else list(params)   # e.g. model.parameters()
    if not any(isinstance(x, dict) for x in items):
        return [(items, None, "params")]
    for i, x in enumerate(items):
        if not isinstance(x, dict):
            raise TypeError(where_msg(where, "params[%d] is a %s, but other items are dicts; pass a list of tensors "
                                             "or a list of param groups (dicts)" % (i, type(x).__name__)))
    return [(group_tensors(g, "params[%d]" % i, where), g, "params[%d]" % i) for i, g in enumerate(items)]


def group_tensors(group, prefix, where):
    """The tensors of a group dict, as a list (a single buffer is a list of one, as in torch)."""
    if "params" not in group:
        raise ValueError(where_msg(where, "%s has no 'params' key; a param group is a dict holding its tensors "
                                          "under 'params'" % prefix))
    tensors = group["params"]
    if _is_buffer(tensors):
        return [tensors]
    if isinstance(tensors, (str, bytes, dict)) or not hasattr(tensors, "__iter__"):
        raise TypeError(where_msg(where, "%s['params'] must be a float32 buffer or a list of them, got %s"
                                         % (prefix, type(tensors).__name__)))
    tensors = list(tensors)
    if not tensors:
        raise ValueError(where_msg(where, "%s['params'] is an empty list" % prefix))
    return tensors


def group_name(i):
    return "param_groups[%d]" % i


class NativeGroups:
    """The cffi group table of a step and the tensor -> group map, kept in step with the
    optimizer's ``param_groups``: a group is checked again only when one of its values changed
    since it was last written (``raw``), so an unchanged group costs a tuple compare.
    ``values[i]`` holds group i's checked values; ``changed`` is set when any was rewritten."""

    def __init__(self, ctype, hyper, flags_of):
        self.ctype, self.hyper, self.flags_of = ctype, hyper, flags_of
        self.keys = tuple(k for k, _ in hyper)
        self.get = operator.itemgetter(*self.keys)
        self.table = ffi.new("%s[]" % ctype, 0)
        self.tensor_group = ffi.new("int32_t[]", 0)
        self.raw, self.lists, self.names, self.sizes, self.values, self.lrs = [], [], [], [], [], []
        self.changed = False

    def rebuild(self, groups, sizes, names):
        """A new table for ``groups`` (checked dicts) whose tensors number ``sizes``; ``names``
        are the prefixes messages use for each group."""
        table = ffi.new("%s[]" % self.ctype, len(groups))
        tg = ffi.new("int32_t[]", sum(sizes))
        j = 0
        for i, size in enumerate(sizes):
            for _ in range(size):
                tg[j] = i
                j += 1
        self.table, self.tensor_group, self.names, self.sizes = table, tg, list(names), list(sizes)
        self.raw, self.values, self.lrs = [None] * len(groups), [None] * len(groups), [0.0] * len(groups)
        self.lists = [g["params"] for g in groups]

    def sync(self, groups, t, where):
        """Check changed groups and write them into the table; a scheduled group's lr is its
        schedule's ``lr_at(t)``. Returns the first group's lr (a float)."""
        raws = self.raw
        if len(groups) != len(raws):
            raise ValueError(where_msg(where, "param_groups holds %d groups, the optimizer was given %d; add groups "
                                              "with add_param_group" % (len(groups), len(raws))))
        first = None
        for i, group in enumerate(groups):
            params = group.get("params")
            if params is not self.lists[i] or len(params) != self.sizes[i]:
                raise ValueError(where_msg(where, "%s['params'] was changed after the group was added; tensors are "
                                                  "added with add_param_group" % group_name(i)))
            try:
                raw = self.get(group)
            except KeyError as e:
                raise ValueError(where_msg(where, "%s lacks %r; every group holds %s"
                                           % (group_name(i), e.args[0], ", ".join(map(repr, self.keys)))))
            sched = raw[-1]
            if raw != raws[i]:
                skip = ("lr",) if sched is not None else ()
                self._write(i, check_values(self.hyper, dict(zip(self.keys, raw)), self.names[i], where, skip))
                raws[i] = raw
            lr = self.lrs[i] if sched is None else self._scheduled(sched, i, t, where)
            if first is None:
                first = lr
        return first

    def _scheduled(self, sched, i, t, where):
        name = "%s.lr_at(%d)" % (key_name(self.names[i], "lr_schedule"), t)
        lr = _real(sched.lr_at(t), name, where)
        self.table[i].lr = lr
        return float(self.table[i].lr)

    def _write(self, i, values):
        row = self.table[i]
        for key, _ in self.hyper:
            if key == "betas":
                row.beta1, row.beta2 = values["betas"]
            elif key in ("lr", "eps", "weight_decay", "momentum", "dampening") and not (
                    key == "lr" and values["lr_schedule"] is not None):
                setattr(row, key, values[key])
        row.flags = self.flags_of(values)
        self.values[i], self.lrs[i], self.changed = values, float(row.lr), True


def flags(lib, values, decoupled=False):
    """The MT_OPTIM_* bits of a group's values."""
    bits = lib.MT_OPTIM_MAXIMIZE if values["maximize"] else 0
    if values.get("nesterov"):
        bits |= lib.MT_OPTIM_NESTEROV
    if values.get("amsgrad"):
        bits |= lib.MT_OPTIM_AMSGRAD
    if decoupled:
        bits |= lib.MT_OPTIM_DECOUPLED
    return bits


def saved_groups(groups, sizes, hyper):
    """param_groups as state_dict holds them: each group's values (a schedule as its config(),
    None without one) and the indices of its tensors."""
    out, start = [], 0
    for group, size in zip(groups, sizes):
        entry = {}
        for key, _ in hyper:
            value = group[key]
            if key == "lr_schedule":
                value = value.config() if value is not None and callable(getattr(value, "config", None)) else None
            entry[key] = value
        entry["params"] = list(range(start, start + size))
        start += size
        out.append(entry)
    return out


def is_index_list(value, want):
    return (type(value) in (list, tuple) and len(value) == len(want)
            and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) and v == w
                    for v, w in zip(value, want)))
