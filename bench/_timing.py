"""Shared timing for the benchmarks: median wall-clock of repeated runs after warm-up."""
import statistics
import time


def median_seconds(fn, repeat=15, warmup=3):
    """Median of `repeat` timed calls of fn() after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def write_result(name, figures, command):
    """Append one dated record (machine, commit, command, figures) to bench/results/<name>.jsonl."""
    import json
    import os
    import platform
    import subprocess
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        commit = os.environ.get("MT_COMMIT") or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "native", "mojo_train"],
                                    cwd=root, capture_output=True, text=True).stdout.strip())
    except OSError:
        commit, dirty = "unknown", False
    record = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()), "commit": commit,
              "dirty": dirty, "machine": _machine(), "command": command, "figures": figures}
    os.makedirs(os.path.join(root, "bench", "results"), exist_ok=True)
    with open(os.path.join(root, "bench", "results", name + ".jsonl"), "a") as f:
        f.write(json.dumps(record) + "\n")


def _machine():
    import os
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
