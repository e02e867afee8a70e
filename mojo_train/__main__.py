"""``python -m mojo_train <command>``: the cross-vendor self-check and backend information.

    selfcheck [--write] [--card NAME]
                         check every fixtures/*.card (or one) on every loadable vendor's
                         identical tier -- only MOJO_TRAIN_VENDOR's when it names one -- and
                         exit 1 on any mismatch; --write first appends the cases defined in
                         code but missing from the cards, computed on the CPU oracle
    info                 print backend_info() for the default vendor and numeric mode
    demo [--vendor V]    train a small character-level language model; print its digests
"""
import argparse
import json
import os
import sys
import time

from . import _cards, _native, backend_info


def _why(exc):
    """One line from a BackendError: its first sentence and what happened at each path."""
    lines = str(exc).splitlines()
    outcomes = sorted({l.split(": ", 1)[-1] for l in lines[1:] if l.startswith("  ")})
    return "%s (paths tried: %s)" % (lines[0].replace(" Tried:", ""), ", ".join(outcomes) or "none")


def _loadable_vendors():
    vendors = []
    asked = _native.default_vendor()
    for vendor in (_native.VENDORS if asked == "auto" else (asked,)):
        try:
            _native.load("identical", vendor)
        except _native.BackendError as exc:
            print("skipped %s: %s" % (vendor, _why(exc)))
            continue
        vendors.append(vendor)
    return vendors


def _write(paths):
    folder = next((d for d in _cards.fixtures_dirs() if os.path.isdir(d)), _cards.fixtures_dirs()[-1])
    os.makedirs(folder, exist_ok=True)
    for name in _cards.CASES:
        path = os.path.join(folder, name + _cards.CARD_SUFFIX)
        print("%s: appended %d case(s) from the cpu oracle" % (path, len(_cards.write_missing(path))))
    return _cards.card_paths()


def _has_device(vendor):
    return _native.load("identical", vendor).has(1 << 9)   # MT_FEATURE_DEVICE_BUFFERS


def selfcheck(write=False, card=None):
    paths = _write(_cards.card_paths()) if write else _cards.card_paths()
    if card is not None:
        paths = [p for p in paths if _cards.card_name(p) == card]
    if not paths:
        print("no cards found (looked in %s)" % ", ".join(_cards.fixtures_dirs()))
        return 1
    vendors = _loadable_vendors()
    if not vendors:
        print("no vendor's identical tier could be loaded: nothing was checked")
        return 1
    rows, failures = [], []
    for path in paths:
        for vendor, device in [(v, d) for v in vendors for d in (False, True) if not d or _has_device(v)]:
            start = time.perf_counter()
            results = _cards.check_card(path, vendor, device)
            seconds = time.perf_counter() - start
            passed = sum(r.ok for r in results)
            where = vendor + (" (device buffers)" if device else "")
            rows.append((_cards.card_name(path), where, "%d/%d" % (passed, len(results)), "%.2fs" % seconds))
            failures += [(rows[-1][0], where, r) for r in results if not r.ok]
    print("%-10s %-24s %-10s %s" % ("card", "vendor", "passed", "time"))
    for row in rows:
        print("%-10s %-24s %-10s %s" % row)
    for card, vendor, r in failures:
        print("FAIL %s on %s: %s\n     mismatching: %s" % (card, vendor, r.case, ", ".join(r.mismatches)))
    return 1 if failures else 0


def info():
    print(json.dumps(backend_info(), indent=2))
    return 0


def demo(vendor=None, steps=400, svg="demo_loss.svg"):
    """Train the small character-level model end to end (mojo_train/_demo.py)."""
    from . import _demo
    return _demo.run(vendor=vendor, steps=steps, svg=svg)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m mojo_train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("selfcheck", help="check every card on every loadable identical vendor")
    check.add_argument("--write", action="store_true", help="first append missing cases (cpu oracle)")
    check.add_argument("--card", help="check this card only (e.g. optim)")
    sub.add_parser("info", help="print backend_info()")
    d = sub.add_parser("demo", help="train a small character-level language model end to end")
    d.add_argument("--vendor", choices=("cpu", "cuda", "hip", "metal"), default=None)
    d.add_argument("--steps", type=int, default=400)
    d.add_argument("--svg", default="demo_loss.svg", help="where the loss curve is written")
    args = parser.parse_args(argv)
    try:
        if args.command == "selfcheck":
            return selfcheck(args.write, args.card)
        if args.command == "demo":
            return demo(args.vendor, args.steps, args.svg)
        return {"info": info}[args.command]()
    except NotImplementedError as exc:
        print("NotImplementedError: %s" % exc, file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
