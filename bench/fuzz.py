"""The long fuzz run (issue 12): tests/test_fuzz.py's targets with a large example budget and a
random seed, every example counted instead of stopping at the first finding.

    python bench/fuzz.py --examples 100000          (make fuzz)

The budget is split over the targets by their share (tests/_fuzz_spec.py, Target.examples);
targets that need device memory run where the vendor (MOJO_TRAIN_VENDOR, default cpu) takes
it. Per target it records examples, accepted, refused, crashes, partial writes, unclear errors,
wrong outcomes, wrong results, harness errors and seconds, then the first distinct findings
with the example that shows each (its description is plain data: run it again with
tests/_fuzz_worker.py's execute). A section is appended to bench/results/fuzz.md (--out) with
the command, seed, commit and machine.
"""
import argparse
import datetime
import os
import platform
import random
import re
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[:0] = [os.path.join(REPO, "tests"), REPO]

COLUMNS = ("examples", "accepted", "refused", "crash", "partial write", "unclear error", "wrong outcome",
           "wrong result", "harness error")


def arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100000, help="examples in all (default 100000)")
    parser.add_argument("--seed", type=int, default=None, help="hypothesis seed (default: a random one, recorded)")
    parser.add_argument("--targets", default="", help="only targets whose name holds this text")
    parser.add_argument("--numeric-mode", default="identical", help="the numeric mode under test (the exact oracles' one)")
    parser.add_argument("--out", default=os.path.join(HERE, "results", "fuzz.md"), help="the record to append to")
    parser.add_argument("--findings", type=int, default=3, help="distinct findings recorded per target")
    return parser.parse_args()


class Tally:
    """The counts and first distinct findings of one target."""

    def __init__(self, keep):
        self.counts = dict.fromkeys(COLUMNS, 0)
        self.findings, self.keep, self.seconds = {}, keep, 0.0

    def record(self, desc, verdict):
        from _fuzz_known import known
        from _fuzz_run import describe
        self.counts["examples"] += 1
        if verdict["outcome"] in ("accepted", "refused"):
            self.counts[verdict["outcome"]] += 1
        if verdict["finding"]:
            category, text = verdict["finding"]
            self.counts[category] += 1
            key = (category, re.sub(r"[\d.e+-]+|'[^']*'", "#", text)[:80])
            if key not in self.findings and len(self.findings) < self.keep:
                entry = known(desc, verdict)
                self.findings[key] = describe(desc, verdict) + (
                    "\n  (a known defect, tests/_fuzz_known.py: %s)" % entry[0] if entry else "\n  (NEW: not in tests/_fuzz_known.py)")


def budget(targets, total):
    """Examples per target: ``total`` split by their shares, at least one each."""
    weight = sum(t.examples for t in targets)
    return {t.name: max(1, int(round(total * t.examples / weight))) for t in targets}


def explore_one(pool, target, ctx, examples, tally, seed):
    """``examples`` examples of one target into ``tally`` (returns how many hypothesis drew); a
    failure of the suite's own strategy is counted as a harness error and the run goes on."""
    from _fuzz_run import explore
    start, before = time.monotonic(), tally.counts["examples"]
    try:
        explore(pool, target, ctx, examples, tally.record, seed=seed, shrink=False)
    except Exception:
        tally.counts["harness error"] += 1
        tally.findings[("harness error", "strategy")] = "harness error: %s\n%s" % (target.name,
                                                                                  traceback.format_exc()[-1500:])
    tally.seconds += time.monotonic() - start
    print("%-40s %s %.1fs" % (target.name, " ".join("%d" % tally.counts[c] for c in COLUMNS), tally.seconds), flush=True)
    return tally.counts["examples"] - before


def run(args, vendor):
    from mojo_train import _native
    from _fuzz_run import context
    from _fuzz_targets import TARGETS
    from _fuzz_worker import Pool
    backend = _native.load(args.numeric_mode, vendor)
    ctx = context(vendor, args.numeric_mode, backend)
    targets = [t for name, t in sorted(TARGETS.items()) if not name.startswith("harness.") and args.targets in name
               and (ctx.device or not t.device_only)]
    pool, tallies = Pool(vendor), {t.name: Tally(args.findings) for t in targets}
    try:
        # hypothesis stops early on a target whose examples it has exhausted: later passes give the
        # rest of the budget to the targets that drew all they were asked for
        for round_ in range(4):
            done = sum(t.counts["examples"] for t in tallies.values())
            if done >= args.examples:
                break
            shares, open_ = budget(targets, args.examples - done), []
            for i, target in enumerate(targets):
                drew = explore_one(pool, target, ctx, shares[target.name], tallies[target.name],
                                   args.seed + 1000 * round_ + i)
                if drew >= shares[target.name]:
                    open_.append(target)
            targets = open_
    finally:
        pool.close()
    skipped = sorted(t.name for name, t in TARGETS.items() if t.device_only and not ctx.device)
    return tallies, skipped


def commit():
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True).stdout.strip()
        if out.returncode:
            return "unknown (not a git checkout)"
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except OSError:
        return "unknown"


def library(numeric_mode):
    """The library the run checked, as a path under the repository when it is one (make
    fuzz-asan's is native/build/asan/...: the sanitized build), and whether it is sanitized."""
    import mojo_train
    path = mojo_train.backend_info(numeric_mode)["path"]
    shown = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
    sanitized = os.path.basename(os.path.dirname(path)) in ("asan", "tsan")
    return shown + (" (AddressSanitizer + UBSan: a finding kills its worker, counted as a crash)"
                    if sanitized else "")


def report(args, vendor, tallies, skipped, seconds):
    total = {c: sum(t.counts[c] for t in tallies.values()) for c in COLUMNS}
    lines = ["", "## %s, %s-%s, commit %s" % (datetime.datetime.now().strftime("%Y-%m-%d %H:%M"), vendor,
                                              args.numeric_mode, commit()), "",
             "Command: `python bench/fuzz.py --examples %d%s` (seed %d: `--seed %d` repeats this run). Library: %s. "
             "Machine: %s, %d cores, Python %s. %.0f s in all."
             % (args.examples, " --targets %s" % args.targets if args.targets else "", args.seed, args.seed,
                library(args.numeric_mode), platform.platform(), os.cpu_count(), platform.python_version(), seconds), "",
             "Totals: " + ", ".join("%s %d" % (c, total[c]) for c in COLUMNS) + ".", "",
             "| target | " + " | ".join(COLUMNS) + " | seconds |", "|---" * (len(COLUMNS) + 2) + "|"]
    for name, t in tallies.items():
        lines.append("| %s | %s | %.1f |" % (name, " | ".join(str(t.counts[c]) for c in COLUMNS), t.seconds))
    if skipped:
        lines += ["", "Not run (the vendor takes no device buffers): %s." % ", ".join(skipped)]
    found = [(name, text) for name, t in tallies.items() for text in t.findings.values()]
    lines += ["", "Findings (the first %d distinct ones per target, each with the example that shows it):" % args.findings
              if found else "No findings.", ""]
    for name, text in found:
        lines += ["```", text.strip(), "```"]
    with open(args.out, "a") as f:
        f.write("\n".join(lines) + "\n")
    return total


def main():
    args = arguments()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2 ** 32)
    vendor = os.environ.get("MOJO_TRAIN_VENDOR", "cpu")
    vendor = "cpu" if vendor == "auto" else vendor
    start = time.monotonic()
    tallies, skipped = run(args, vendor)
    total = report(args, vendor, tallies, skipped, time.monotonic() - start)
    print("totals: %s; recorded in %s" % (", ".join("%s %d" % (c, total[c]) for c in COLUMNS), args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
