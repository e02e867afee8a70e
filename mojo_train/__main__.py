"""``python -m mojo_train <command>``: the cross-vendor self-check and backend information.

    selfcheck [--write] [--card NAME] [--shard K/N] [--numeric-mode identical|identical_ftz]
                         check every fixtures/*.card (or one; or every N-th line from the K-th,
                         counting from 0, so that N runs split a card) on every loadable vendor's
                         identical numeric mode -- only MOJO_TRAIN_VENDOR's when it names one --
                         then every fixtures/identical_ftz/*.card on every vendor whose
                         identical_ftz library loads (a vendor without one is listed as not
                         checked, unless --numeric-mode asked for it), and exit 1 on any mismatch
                         or missing card folder; --write first appends the cases defined in code
                         but missing from the cards, computed on the CPU oracle
    info [--vendor V] [--numeric-mode M]
                         print backend_info() (defaults: MOJO_TRAIN_VENDOR, MOJO_TRAIN_NUMERIC_MODE)
    demo [--model mlp|gpt] [--vendor V] [--steps N] [--print-every N] [--svg PATH] [--distributed]
                         train a small character-level language model; print its digests
                         (--distributed: one of N processes started by torchrun
                         --nproc_per_node=N -m mojo_train demo --distributed, N = 1, 2 or 4,
                         which print the same digests; needs torch)
    --version            print the version

A mistake on the command line or in those environment variables (a library that is not
built, --steps 0, an --svg path that cannot be written) ends with exit status 2 and one line
``mojo_train: error: ...`` on stderr, never a traceback.
"""
import argparse
import json
import os
import sys
import time

from . import __version__, _cards, _demo, _native, backend_info


class _Mistake(Exception):
    """A command-line or environment mistake: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line ``mojo_train: error: ...`` (exit 2), like ours."""

    def error(self, message):
        self.exit(2, "mojo_train: error: %s; see %s --help\n" % (message, self.prog))


def _fail(message):
    prefix = "mojo_train: "
    message = message[len(prefix):] if message.startswith(prefix) else message
    sys.stderr.write("mojo_train: error: %s\n" % " ".join(message.split()))
    return 2


def _why(exc, fix=True):
    """One line from a BackendError: its first sentence, what happened at each path, and (with
    ``fix``) the rebuild command unless a library was found but cannot run here (no device)."""
    lines = str(exc).splitlines()
    outcomes = sorted({l.split(": ", 1)[-1] for l in lines[1:] if l.startswith("  ")})
    build = [l.split("   (", 1)[0].lower() for l in lines[1:] if l.startswith("Build it with:")]
    first = lines[0].replace(" Tried:", "").rstrip(".")
    unusable = any(o.startswith("loaded but unusable") for o in outcomes)
    return "; ".join(["%s (paths tried: %s)" % (first, ", ".join(outcomes) or "none")]
                     + ([] if unusable or not fix else build))


def _backend(numeric_mode=None, vendor=None):
    """The library a command asks for, or a _Mistake saying in one line why it cannot load."""
    try:
        return _native.load(numeric_mode, vendor)
    except _native.BackendError as exc:
        raise _Mistake(_why(exc)) from None
    except ValueError as exc:     # MOJO_TRAIN_VENDOR / MOJO_TRAIN_NUMERIC_MODE name nothing known
        raise _Mistake(str(exc)) from None


def _loadable_vendors(numeric_mode="identical"):
    """(every vendor whose ``numeric_mode`` loads, [(vendor, why) of those that do not]); a
    vendor MOJO_TRAIN_VENDOR names must load its identical numeric mode (identical_ftz is built
    for fewer vendors: one without it is listed as not checked)."""
    vendors, absent = [], []
    try:
        asked = _native.default_vendor()
    except ValueError as exc:
        raise _Mistake(str(exc)) from None
    if asked != "auto" and numeric_mode == "identical":
        return [_backend("identical", asked).vendor], absent
    for vendor in (_native.VENDORS if asked == "auto" else (asked,)):
        try:
            _native.load(numeric_mode, vendor)
        except _native.BackendError as exc:
            absent.append((vendor, _why(exc, fix=False)))
            continue
        vendors.append(vendor)
    return vendors, absent


def _write(numeric_mode):
    folder = next((d for d in _cards.fixtures_dirs() if os.path.isdir(d)), _cards.fixtures_dirs()[-1])
    folder = os.path.join(folder, _cards.card_folder(numeric_mode))
    os.makedirs(folder, exist_ok=True)
    for name in _cards.CASES:
        path = os.path.join(folder, name + _cards.CARD_SUFFIX)
        print("%s: appended %d case(s) from the cpu oracle" % (path, len(_cards.write_missing(path, numeric_mode))))
    return _cards.card_paths(numeric_mode)


def _has_device(vendor, numeric_mode="identical"):
    return _native.load(numeric_mode, vendor).has("device_buffers")


def _lacks_family(card, vendor, numeric_mode="identical"):
    """Whether the card is a family's whose feature bit the vendor's library does not declare
    (a family not built for that vendor yet: its card is skipped there, not failed)."""
    return card in _native.FEATURES and not _native.load(numeric_mode, vendor).has(card)


def _check_card_name(card):
    known = sorted(set(_cards.CASES) | {_cards.card_name(p) for p in _cards.card_paths()})
    if card is not None and card not in known:
        raise _Mistake("--card %r names no card; the cards are: %s" % (card, ", ".join(known)))


def _shard(text):
    """--shard K/N as (k, n): 0 <= k < n."""
    k, sep, n = (text or "").partition("/")
    try:
        k, n = int(k), int(n)
    except ValueError:
        k = n = None
    if not sep or n is None or not 0 <= k < n:
        raise argparse.ArgumentTypeError("%r is not K/N with 0 <= K < N (e.g. 0/4)" % text)
    return k, n


def selfcheck(write=False, card=None, shard=(0, 1), numeric_mode=None):
    """Every card of each card numeric mode (identical, identical_ftz; or the one asked for) on
    every vendor whose library of that mode loads; 0 when every line checked passed."""
    _check_card_name(card)
    rows, failures, checked, notes, missing = [], [], 0, [], []
    for mode in (_cards.CARD_MODES if numeric_mode is None else (numeric_mode,)):
        paths = _write(mode) if write else _cards.card_paths(mode)
        if card is not None:
            paths = [p for p in paths if _cards.card_name(p) == card]
        if not paths:
            missing.append("no %s cards found (looked in %s)" % (mode, ", ".join(
                os.path.join(d, _cards.card_folder(mode)) for d in _cards.fixtures_dirs())))
            continue
        vendors, absent = _loadable_vendors(mode)
        # the identical mode must load somewhere (and where MOJO_TRAIN_VENDOR points); another mode
        # must when it was asked for by name
        if not vendors and (mode == "identical" or numeric_mode is not None):
            for vendor, why in absent:
                print("%s: %s" % (vendor, why))
            print("no vendor's %s numeric mode could be loaded: nothing was checked" % mode)
            return 1
        for path in paths:
            for vendor, device in [(v, d) for v in vendors for d in (False, True) if not d or _has_device(v, mode)]:
                where = vendor + (" (device buffers)" if device else "") + ("" if mode == "identical" else " " + mode)
                name = _cards.card_name(path)
                if _lacks_family(name, vendor, mode):
                    rows.append((name, where, "skipped", "(no %s in mt_features)" % name))
                    continue
                start = time.perf_counter()
                results = _cards.check_card(path, vendor, device, shard, mode)
                seconds = time.perf_counter() - start
                run = [r for r in results if not r.skipped]
                skipped = sorted({r.skipped for r in results if r.skipped})
                rows.append((name, where, "%d/%d" % (sum(r.ok for r in run), len(run)), "%.2fs" % seconds
                             + "".join("  (%d lines skipped: %s)" % (sum(r.skipped == why for r in results), why)
                                       for why in skipped)))
                failures += [(name, where, r) for r in run if not r.ok]
                checked += len(run)
        notes += ["not checked on %s%s (no library of it loads here): %s"
                  % (vendor, "" if mode == "identical" else " " + mode, why) for vendor, why in absent]
    width = max([len("card")] + [len(r[0]) for r in rows])
    for row in [("card", "vendor", "passed", "time")] + rows:
        print("%-*s %-38s %-10s %s" % ((width,) + row))
    for name, where, r in failures:
        print("FAIL %s on %s: %s\n     mismatching: %s" % (name, where, r.case, ", ".join(r.mismatches)))
    print("%s: %d card lines checked on %s, %d failed" % ("FAILED" if failures else "passed", checked,
                                                          ", ".join(sorted({r[1] for r in rows})), len(failures)))
    for note in notes:      # a vendor without a library here is not a failure
        print(note)
    for line in missing:    # a card folder the package should hold is
        print("FAILED: " + line)
    return 1 if failures or missing else 0


def info(vendor=None, numeric_mode=None):
    _backend(numeric_mode, vendor)
    print(json.dumps(backend_info(numeric_mode, vendor), indent=2))
    return 0


def _check_writable(path, option):
    """A _Mistake unless ``path`` can be written (checked before a run, not after it)."""
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise _Mistake("%s %s is a folder; give a file name such as %s"
                       % (option, path, os.path.join(path, "demo_loss.svg")))
    if not os.path.isdir(folder):
        raise _Mistake("%s %s: the folder %s does not exist" % (option, path, folder))
    if not os.access(path if os.path.exists(path) else folder, os.W_OK):
        raise _Mistake("%s %s cannot be written (no permission, or a read-only file system)" % (option, path))


def demo(vendor=None, steps=None, svg="demo_loss.svg", every=_demo.PRINT_EVERY, model="mlp", distributed=False):
    """Train a small character-level model end to end (mojo_train/_demo.py): the MLP, or the GPT
    (mojo_train/_demo_gpt.py). ``steps`` None: the model's default. ``distributed``: this
    process is one rank of a torchrun group (mojo_train/_demo_distributed.py)."""
    _check_writable(svg, "--svg")
    _backend("identical", vendor)
    if not distributed:
        return _demo.run(vendor=vendor, steps=steps, svg=svg, every=every, model=model)
    if model != "mlp":
        raise _Mistake("--distributed trains the MLP demo only: the GPT demo's batch is one 1024-token leaf, "
                       "which no split into processes aligns; drop --model gpt")
    import mojo_train as mt
    from . import _demo_distributed
    try:
        ranks = _demo_distributed.Ranks(mt, _demo.BATCH)
    except _demo_distributed.Refusal as exc:
        raise _Mistake(str(exc)) from None
    try:
        return _demo.run(vendor=vendor, steps=steps, svg=svg, every=every, model=model, ranks=ranks)
    finally:
        ranks.close()


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a whole number >= 1, got %r" % text) from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1, got %d" % value)
    return value


def _parser():
    parser = _Parser(prog="python -m mojo_train", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version="mojo_train %s" % __version__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("selfcheck", help="check every card on every loadable identical vendor")
    check.add_argument("--write", action="store_true", help="first append missing cases (cpu oracle)")
    check.add_argument("--card", help="check this card only (e.g. optim)")
    check.add_argument("--shard", type=_shard, default=(0, 1), metavar="K/N",
                       help="only every N-th case line from the K-th (0-based): N runs split the cards")
    check.add_argument("--numeric-mode", choices=_cards.CARD_MODES, default=None,
                       help="the cards of this numeric mode only (default: identical, then identical_ftz)")
    i = sub.add_parser("info", help="print backend_info()")
    i.add_argument("--vendor", choices=("auto",) + _native.VENDORS, default=None)
    i.add_argument("--numeric-mode", choices=_native.NUMERIC_MODES, default=None)
    d = sub.add_parser("demo", help="train a small character-level language model end to end")
    d.add_argument("--vendor", choices=("auto",) + _native.VENDORS, default=None)
    d.add_argument("--model", choices=("mlp", "gpt"), default="mlp",
                   help="mlp: the character MLP (400 steps); gpt: a 4-block GPT (causal attention, LayerNorm, "
                        "GELU; 300 steps)")
    d.add_argument("--steps", type=_positive_int, default=None, help="training steps (>= 1; default: the model's)")
    d.add_argument("--print-every", type=_positive_int, default=_demo.PRINT_EVERY,
                   help="print a progress line every N steps (and at the first and last)")
    d.add_argument("--svg", default="demo_loss.svg", help="where the loss curve is written")
    d.add_argument("--distributed", action="store_true",
                   help="run as one of the processes torchrun starts (torchrun --nproc_per_node=N -m mojo_train demo "
                        "--distributed, N = 1, 2 or 4): the same digests as one process (MLP only; needs torch)")
    return parser


def main(argv=None):
    args = _parser().parse_args(argv)
    try:
        if args.command == "selfcheck":
            return selfcheck(args.write, args.card, args.shard, args.numeric_mode)
        if args.command == "demo":
            return demo(args.vendor, args.steps, args.svg, args.print_every, args.model, args.distributed)
        return info(args.vendor, args.numeric_mode)
    except (_Mistake, NotImplementedError) as exc:
        return _fail(str(exc))


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:     # the reader went away (| head): stop quietly, as cat does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
