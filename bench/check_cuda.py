"""`make check-cuda`: everything that proves the CUDA backend, in one command on a GPU machine.

Steps (each can be run alone: ``--steps build,cards``): ``build`` makes the CUDA libraries of
every numeric mode and every sabotage library at once, in parallel (prebuilt ones are reused when up to
date; a fresh clone builds in about two minutes on 16 cores); ``cards`` checks every card on
the CUDA identical numeric mode (selfcheck); ``suite`` runs the whole test suite with
MOJO_TRAIN_VENDOR=cuda (pytest-xdist when installed) and prints its skips grouped by reason;
the suite itself fails on a skip whose reason is not reviewed (tests/skip_reasons.py);
``sabotage`` proves each sabotage build fails its card on the GPU; ``demo`` trains the demo on
the cpu and cuda vendors and requires the same digests; ``bench`` runs the GPU benchmarks. The whole command fits one 10-minute GPU call from a fresh clone. Ends with a short
table; the dated record (GPU, commit, outcomes, skip table and figures) is appended to
bench/results/check-cuda.md (and copied to $OUT when set).
"""
import argparse
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One sabotage per card file (fixtures/<op>.card is failed by make cuda SABOTAGE=<op>).
SABOTAGE_OPS = tuple(sorted(f[:-len(".card")] for f in os.listdir(os.path.join(ROOT, "fixtures"))
                            if f.endswith(".card")))
# GPU benchmarks, each side by side with torch in one process; those not written yet are skipped.
BENCHMARKS = ("bench/optim_cuda.py", "bench/clip_cuda.py", "bench/loss_cuda.py", "bench/rms_norm_cuda.py",
              "bench/layer_norm_cuda.py", "bench/attention_cuda.py", "bench/linear_cuda.py --quick", "bench/random_cuda.py",
              "bench/elementwise_cuda.py",
              "bench/embedding_cuda.py", "bench/lm_head_cuda.py", "bench/cross_device_cuda.py",
              "bench/torch_adapter_cuda.py")


def run(name, cmd, env=None, expect_fail=False, timeout=420, must_print=None):
    t0 = time.time()
    full_env = dict(os.environ, **(env or {}))
    try:
        p = subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout)
        rc, out = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as e:
        partial = e.stdout or ""         # bytes on some Pythons even with text=True
        rc, out = 124, (partial.decode(errors="replace") if isinstance(partial, bytes) else partial) + "\n[timed out]"
    ok = (rc != 0) if expect_fail else (rc == 0)
    if must_print is not None:      # a sabotage must fail by mismatching lines, not by crashing
        ok = ok and must_print in out
    if not ok or name in ("test suite", "benchmarks"):
        safe = "".join(c if c.isalnum() else "_" for c in name)
        with open(os.path.join(LOGS, safe + ".log"), "w") as f:
            f.write(out)
    lines = out.strip().splitlines()
    failed = [l for l in lines[:-12] if l.startswith(("FAILED ", "ERROR "))]   # every one, not only the tail's
    tail = "\n".join(failed + lines[-12:])
    print("=== %s (%s, %.0f s)\n%s\n" % (name, "ok" if ok else "FAILED rc=%d" % rc, time.time() - t0, tail), flush=True)
    return {"step": name, "ok": ok, "seconds": time.time() - t0, "tail": tail, "out": out.strip()}


def gpu_name():
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout.strip()
    except OSError:
        return "unknown"


def commit():
    if os.environ.get("MT_COMMIT"):
        return os.environ["MT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def build_all():
    """make (the CPU oracle, which the suite compares against), make cuda (every numeric mode) and every
    sabotage library, as parallel make processes."""
    t0 = time.time()
    jobs = [("cpu", ["make", "-j3"]), ("cuda", ["make", "-j3", "cuda"])]
    jobs += [("sabotage " + op, ["make", "cuda", "SABOTAGE=" + op]) for op in SABOTAGE_OPS]
    procs = [(name, subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for name, cmd in jobs]
    outs = [(name, p.communicate()[0], p.returncode) for name, p in procs]
    failed = [(name, out) for name, out, rc in outs if rc]
    out = "\n".join("%s: %s" % (name, "FAILED\n" + o if rc else "ok") for name, o, rc in outs)
    ok = not failed
    tail = "\n".join(out.strip().splitlines()[-12:])
    print("=== build (%s, %.0f s)\n%s\n" % ("ok" if ok else "FAILED", time.time() - t0, tail), flush=True)
    if not ok:
        with open(os.path.join(LOGS, "build.log"), "w") as f:
            f.write(out)
    return {"step": "build (every numeric mode and sabotage library)", "ok": ok, "seconds": time.time() - t0,
            "tail": tail, "out": out}


def skip_table(out):
    """The suite's skips-by-reason section (printed by tests/conftest.py), or a line saying none."""
    lines = out.splitlines()
    start = next((i for i, l in enumerate(lines) if "skips by reason" in l), None)
    if start is None:
        return ["(no test skipped)"]
    rows = []
    for l in lines[start + 1:]:
        if not re.match(r"^\s*\d+\s+(library|reference|chance|UNREVIEWED)\s", l) and not l.startswith("UNREVIEWED"):
            break
        rows.append(l)
    return rows


STEPS = ("build", "cards", "suite", "sabotage", "demo", "bench")


def demo_step(py, model="mlp"):
    """The demo (``--model``) trained on the cpu vendor and on cuda: the runs end with the same digests."""
    t0 = time.time()
    runs = {v: run("demo %s on %s" % (model, v), [py, "-m", "mojo_train", "demo", "--model", model, "--vendor", v,
                                                  "--svg", os.path.join(LOGS, "demo_%s_%s.svg" % (model, v))])
            for v in ("cpu", "cuda")}
    digests = {v: re.findall(r"(?:loss curve|checkpoint) sha256\s+([0-9a-f]{64})", r["out"]) for v, r in runs.items()}
    ok = all(r["ok"] for r in runs.values()) and len(digests["cpu"]) == 2 and digests["cpu"] == digests["cuda"]
    tail = "cpu  %s\ncuda %s" % (" ".join(digests["cpu"]), " ".join(digests["cuda"]))
    print("=== demo %s digests, cpu and cuda (%s)\n%s\n" % (model, "equal" if ok else "FAILED", tail), flush=True)
    return {"step": "demo --model %s: the same digests on cpu and cuda" % model, "ok": ok,
            "seconds": time.time() - t0, "tail": tail, "out": tail}
LOGS = tempfile.mkdtemp(prefix="check_cuda_logs_")   # every step's full log, archived into $OUT


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", default=",".join(STEPS), help="comma-separated subset of " + ",".join(STEPS))
    args = ap.parse_args()
    want = [s.strip() for s in args.steps.split(",") if s.strip()]
    bad = [s for s in want if s not in STEPS]
    if bad:
        ap.error("unknown step(s) %s; the steps are %s" % (", ".join(bad), ", ".join(STEPS)))
    py = sys.executable
    cuda = {"MOJO_TRAIN_VENDOR": "cuda", "PYTHONUNBUFFERED": "1"}
    steps, skips = [], None
    if "build" in want:
        steps.append(build_all())
    if "cards" in want:
        steps.append(run("cards (selfcheck)", [py, "-m", "mojo_train", "selfcheck"], cuda))
    if "suite" in want:
        xdist = ["-n", str(max(4, (os.cpu_count() or 8) - 4))] if importlib.util.find_spec("xdist") else []
        steps.append(run("test suite", [py, "-m", "pytest", "-q", "-p", "no:cacheprovider"] + xdist + ["tests"],
                         cuda, timeout=480))
        skips = skip_table(steps[-1]["out"])
        print("skips by reason:\n" + "\n".join(skips), flush=True)
    for op in SABOTAGE_OPS if "sabotage" in want else ():
        lib = os.path.join(ROOT, "native", "build", "sabotage-" + op)
        steps.append(run("sabotage %s fails its cards" % op, [py, "-m", "mojo_train", "selfcheck", "--card", op],
                         dict(cuda, MOJO_TRAIN_LIBRARY_PATH=lib), expect_fail=True,
                         must_print="FAIL %s on cuda" % op))
    script = ("import runpy, sys, os\n"
              "for b in sys.argv[1:]:\n"
              "    path, *extra = b.split()\n"
              "    if os.path.exists(path):\n"
              "        sys.argv = [path, '--write'] + extra; print('#', b, flush=True)\n"
              "        runpy.run_path(path, run_name='__main__')\n")
    if "demo" in want:
        steps.append(demo_step(py))
        steps.append(demo_step(py, "gpt"))
    if "bench" in want:
        steps.append(run("benchmarks", [py, "-c", script] + list(BENCHMARKS), cuda))
    table = ["| step | outcome | seconds |", "| --- | --- | --- |"]
    table += ["| %s | %s | %.0f |" % (s["step"], "ok" if s["ok"] else "FAILED", s["seconds"]) for s in steps]
    print("\n".join(table))
    record = ["", "## %s, %s, commit %s" % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu_name(), commit()),
              "", "Command: `make check-cuda`" + ("" if want == list(STEPS) else " (steps: %s)" % ",".join(want)),
              ""] + table
    if skips is not None:
        record += ["", "Skips of the suite by reason (tests/skip_reasons.py):", "", "```"] + skips + ["```"]
    demo = [s["out"] for s in steps if s["step"].startswith("demo")]
    if demo:
        record += ["", "Demo digests (loss curve, checkpoint):", "", "```", demo[0], "```"]
    bench = [s["out"] for s in steps if s["step"] == "benchmarks"]
    if bench:
        record += ["", "Benchmark output:", "", "```", bench[0], "```"]
    path = os.path.join(ROOT, "bench", "results", "check-cuda.md")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as f:
        f.write("\n".join(record) + "\n")
    if os.environ.get("OUT"):       # one archive: the device returns at most 8 files
        shutil.copy(path, os.environ["OUT"])
        with tarfile.open(os.path.join(os.environ["OUT"], "check_cuda.tar.gz"), "w:gz") as tar:
            tar.add(LOGS, arcname="logs")
            for b in BENCHMARKS:
                jl = os.path.join(ROOT, "bench", "results", os.path.basename(b.split()[0])[:-3] + ".jsonl")
                if os.path.exists(jl):
                    tar.add(jl, arcname="results/" + os.path.basename(jl))
    sys.exit(0 if all(s["ok"] for s in steps) else 1)


if __name__ == "__main__":
    main()
