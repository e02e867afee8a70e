"""Shared by every benchmark: the median wall-clock of repeated runs after warm-up, the command
line (--repeat, --mode, --write and a script's own options) and the record in bench/results/."""
import argparse
import os
import statistics
import sys
import time

# Side by side with torch on the CPU, torch's idle OpenMP threads must not spin on the cores the
# next call (ours or torch's) needs: libgomp's default policy spins after each of torch's calls,
# and whichever side was timed next ran up to 2x slower (measured: GELU forward 5.3 ms against
# 3.05 ms alone; LayerNorm's C call 1.5 ms in a loop, 2.7 ms after each torch call). PASSIVE is
# read when torch first loads libgomp, so it is set here, on import, before any benchmark imports
# torch; a value the caller exported is kept.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def median_seconds(fn, repeat=15, warmup=3, sync=None):
    """Median of `repeat` timed calls of fn() after `warmup` untimed ones. sync (e.g.
    torch.cuda.synchronize), when given, runs after the warm-up and after each call, inside its time."""
    for _ in range(warmup):
        fn()
    if sync:
        sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        if sync:
            sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_args(doc, repeat, *options, mode=False):
    """A benchmark's parsed command line: its own ``options``, each (flag, default) or (flag,
    default, help) where the default's type is the option's (False: a switch), then --repeat
    (default ``repeat``), --mode (with mode=True: the numeric mode, identical by default) and
    --write. The description is doc's first line."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    for flag, default, *help_ in options:
        if default is False:
            ap.add_argument(flag, action="store_true", help=help_[0] if help_ else None)
        else:
            ap.add_argument(flag, type=type(default), default=default, help=help_[0] if help_ else None)
    ap.add_argument("--repeat", type=int, default=repeat)
    if mode:
        ap.add_argument("--mode", default="identical")
    ap.add_argument("--write", action="store_true", help="record in bench/results/")
    return ap.parse_args()


def record(args, name, figures):
    """With --write: append figures to bench/results/<name>.jsonl with the command that made them."""
    if args.write:
        write_result(name, figures, " ".join(["python"] + sys.argv))


def cpu_torch(mode):
    """(torch, threads): torch set to the thread count of our CPU library of numeric mode `mode`,
    so that both sides of a CPU benchmark use as many threads."""
    import torch
    from mojo_train._native import load
    threads = int(load(mode).lib.mt_num_threads())
    torch.set_num_threads(threads)
    return torch, threads


def cpu_record(args, name, figures, torch):
    """With --write: figures with the numeric mode, thread count, torch version and load average
    (figures may give their own) to bench/results/<name>.jsonl."""
    record(args, name, dict({"mode": args.mode, "threads": torch.get_num_threads(), "torch": torch.__version__,
                             "load_average": os.getloadavg()[0]}, **figures))


def write_result(name, figures, command):
    """Append one dated record (machine, commit, command, figures) to bench/results/<name>.jsonl."""
    import json
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = os.environ.get("MT_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        # MT_COMMIT / MT_DIRTY ("0" or "1"): for a copy of a tree whose .git is not that tree's (the
        # device machine's copy keeps the session's first .git), the caller states both.
        dirty = os.environ["MT_DIRTY"] == "1" if os.environ.get("MT_DIRTY") in ("0", "1") else bool(
            subprocess.run(["git", "status", "--porcelain", "--", "native", "mojo_train"],
                           cwd=root, capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = "unknown", False
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit,
              "dirty": dirty, "machine": _machine(), "command": command, "figures": figures}
    os.makedirs(os.path.join(root, "bench", "results"), exist_ok=True)
    with open(os.path.join(root, "bench", "results", name + ".jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def _machine():
    import platform
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return "%s, %d cores, %s" % (cpu, os.cpu_count() or 0, platform.platform())


def worker_figures(script, envs, common, out, timeout=300):
    """Run ``script --rank r`` + ``common`` with ``envs[r]`` for each rank (the data-parallel
    benchmarks' workers), wait for all (a stuck run is killed after ``timeout`` seconds), exit
    on any failure, and return the figures rank 0 wrote to ``out`` (JSON)."""
    import json
    import subprocess
    procs = [subprocess.Popen([sys.executable, script, "--rank", str(r)] + common, env=env)
             for r, env in enumerate(envs)]
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        sys.exit("the workers did not finish in %d s (a deadlock?)" % timeout)
    if any(codes):
        sys.exit("a worker failed: exit codes %s" % codes)
    with open(out) as f:
        return json.load(f)
