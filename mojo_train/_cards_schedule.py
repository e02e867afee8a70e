"""Cards of the learning-rate schedules (fixtures/schedule.card, contract schedule v1): cases
and the runner, registered with _cards.

A schedule has no tensor inputs, so nothing is drawn: a case ``lr kind=K peak=P [min=M]
warmup=W [total=T] first=F n=N`` is the schedule ``K`` (constant, warmup_linear,
warmup_cosine) built through the public classes (``ConstantLR``, ``WarmupLinearLR``,
``WarmupCosineLR``) and its output ``values`` the float32 bytes of ``lr_at(t)`` for
``t = F .. F + N - 1``. The values are exact (schedule.md), so the card is what lets
``python -m mojo_train selfcheck`` prove, without mpmath, that a library gives their bits.
"""
import struct

from . import _card_format as _cards
from .schedule import ConstantLR, WarmupCosineLR, WarmupLinearLR

_CLASSES = {"constant": ConstantLR, "warmup_linear": WarmupLinearLR, "warmup_cosine": WarmupCosineLR}


def _kind(text):
    if text not in _CLASSES:
        raise ValueError("%r is not one of %s" % (text, ", ".join(sorted(_CLASSES))))
    return text


_KEYS = {"kind": _kind, "peak": _cards._number, "min": _cards._number, "warmup": _cards._count,
         "total": _cards._count, "first": _cards._count, "n": _cards._count}


def _run(case, backend):
    a = case.args
    kwargs = {"warmup_steps": a["warmup"]}
    if a["kind"] != "constant":
        kwargs.update(total_steps=a["total"], min_lr=a.get("min", 0.0))
    schedule = _CLASSES[a["kind"]](a["peak"], numeric_mode=_cards.mode(), **kwargs)
    values = [schedule.lr_at(t) for t in range(a["first"], a["first"] + a["n"])]
    return {"values": _cards._sha(raw=struct.pack("<%df" % len(values), *values))}


FLT_MAX = "3.4028234663852886e38"
BIG = 2 ** 53


def _cases():
    specs = [
        "kind=constant peak=1e-3 warmup=0 first=1 n=10", "kind=constant peak=1e-3 warmup=7 first=1 n=20",
        "kind=constant peak=3e-4 warmup=1000 first=1 n=1100", "kind=constant peak=0.1 warmup=3 first=1 n=5",
        "kind=constant peak=%s warmup=3 first=1 n=5" % FLT_MAX, "kind=constant peak=2**-140 warmup=10 first=1 n=12",
        "kind=constant peak=0.1 warmup=%d first=%d n=64" % (BIG, BIG - 60),
    ]
    for kind in ("warmup_linear", "warmup_cosine"):
        specs += ["kind=%s %s" % (kind, s) for s in (
            "peak=1e-3 min=0 warmup=10 total=100 first=1 n=120",
            "peak=3e-4 min=3e-5 warmup=100 total=1000 first=1 n=1100",
            "peak=0.1 min=1e-4 warmup=1 total=1000 first=1 n=1000",
            "peak=6e-4 min=6e-5 warmup=2000 total=600000 first=1 n=2100",
            "peak=6e-4 min=6e-5 warmup=2000 total=600000 first=300000 n=2000",
            "peak=1.0 min=0 warmup=6 total=18 first=1 n=20",         # cos^2 rational at a/d = 1/3, 1/2, 2/3
            "peak=0.5 min=0.5 warmup=4 total=40 first=1 n=45",       # peak == min
            "peak=%s min=1.0 warmup=5 total=50 first=1 n=60" % FLT_MAX,
            "peak=2**-130 min=2**-140 warmup=5 total=50 first=1 n=60",   # subnormal values
            "peak=0.7 min=0.1 warmup=%d total=%d first=%d n=64" % (BIG // 2, BIG, BIG // 2 + 1000),
            "peak=0.7 min=0 warmup=3 total=%d first=%d n=64" % (BIG, BIG - 32),
        )]
    return ["lr " + s for s in specs]


_cards.register("schedule", "schedule v1", _cases, {
    "lr": (_KEYS, ("kind", "peak", "warmup", "first", "n"), lambda case: ("values",), _run),
}, ("no drawn inputs: a case is the schedule's arguments (min and total default to 0 and are",
    "not given for constant); values = the float32 bytes of lr_at(first .. first + n - 1)."))
