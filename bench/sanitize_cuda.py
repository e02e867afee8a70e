"""`make sanitize-cuda`: compute-sanitizer's four tools over every card, on a GPU machine.

For each tool (memcheck, racecheck, initcheck, synccheck) it first runs a planted defect
(bench/sanitizer_canaries.cu) and requires the tool to report it, and the same kernels without
the defect to be clean -- so a zero below means the tool looked. Then it runs
``python -m mojo_train selfcheck --card <card>`` under the tool for every card with
MOJO_TRAIN_VENDOR=cuda: each card's cases on host buffers and on device buffers, the CUDA
identical library. The tool x card runs go in parallel (the sanitizers are bound by the host CPU).
Every run must end with compute-sanitizer's ``ERROR SUMMARY: 0 errors`` and the card passing.
The record (GPU, commit, the library's digest, the selfcheck digest, per tool x card: errors and
seconds) is appended to
bench/results/sanitize-cuda.md (and copied to $OUT when set). One GPU call cannot hold every
run (a racecheck shard of lm_head takes 4-5 minutes): runs start longest first by the times the
record holds, a run the record says cannot finish before --deadline is not started (its slot goes
to a shorter one), and --resume leaves out what a record already holds for the same code -- a
section at this commit, or one whose header names this CUDA library's digest and this selfcheck
digest (the cards and the mojo_train Python that runs them) -- so that successive calls, and
commits that change neither, complete the matrix. Not in the key: compute-sanitizer's and the
driver's versions (the header names the driver) and this script's tool options. ``--runs REGEX`` keeps only the card runs whose
label (e.g. "lm_head 36/44") the expression matches whole; the canaries always run. The runs a call never started are named in one
sentence of its section (windows counted under their run), not a row each; a run killed at its
timeout keeps a "not finished" row.

Under racecheck a few launches keep one SM busy for minutes, and processes on one GPU are
time-sliced, so more jobs add no throughput there. ``--mps`` starts an NVIDIA MPS control daemon
for the command (its own pipe and log folders) and stops it at the end: the processes' kernels
then share the SMs. The section says so; the canaries run under it like every card. A run whose
client the MPS server refused ("not ready", "busy or unavailable": seen when many start at once)
checked nothing and is started again while time is left, up to MPS_CLIENT_TRIES starts in all,
each later than the one before (MPS_RETRY_WAIT, doubled); its row is the last start's outcome,
and the section names those runs. Under MPS two starts are at least MPS_START_GAP apart. A canary row counts only when the canary program ran to its end
(its last line printed): a refused client "reports" its failed allocation as an error too.

A card line too slow for one call (racecheck over lm_head's one-row chunks over a 60,000-wide
vocabulary) is split by kernel launches: ``--windows K --window-launches W`` runs each card run
K times, run k checking only launches [kW, (k+1)W) (compute-sanitizer's --launch-skip and
--launch-count; the launches outside run unchecked) and the last every launch from (K-1)W on,
so the K runs check every launch of the run between them, whatever its launch count. With
``--launch-counts FILE`` (JSON: run label -> its kernel launches, written by ``--count-launches
FILE``, which runs each selected run once under ncu and counts its kernels) each run's W is
its own count over K, rounded up, and a run the file does not count runs whole (one selected run at
least must be counted); keep one file for every call of a matrix, since the window
labels (and so --resume's) follow from it. A run is covered when windows recorded ok in sections of
the same code (as --resume reads them) join from launch 0 to the open end. Each tool's windowing is first shown to work: a
canary with its defect in launch 3 must be reported by the window [3, 4), and by no window that
leaves launch 3 out -- one of them, from launch 10, past the canary's last launch (an empty
window must report 0 too). memcheck and racecheck only: a launch's findings under them depend
on that launch alone; initcheck's would not (memory written by an unchecked launch reads as
uninitialised) and synccheck's canary may hang when run unchecked.

    python bench/sanitize_cuda.py [--tools memcheck,racecheck] [--cards optim,loss] [--jobs N] [--shard-factor 2]
                                  [--resume] [--deadline S] [--windows K (--window-launches W | --launch-counts F)]
                                  [--count-launches F] [--runs REGEX] [--mps] [--status]
"""
import argparse
import concurrent.futures
import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from check_cuda import ROOT, commit, gpu_name  # noqa: E402  (one record header for the GPU records)

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
CARDS = tuple(sorted(f[:-len(".card")] for f in os.listdir(os.path.join(ROOT, "fixtures")) if f.endswith(".card")))
# Options per tool: memcheck pads every allocation (a run past the end cannot land in the next one)
# and reports device memory still allocated at exit; racecheck reports hazards and analysis.
TOOL_OPTIONS = {"memcheck": ["--leak-check", "full", "--padding", "64"], "racecheck": ["--racecheck-report", "all"],
                "initcheck": [], "synccheck": []}
CANARY = os.path.join(ROOT, "native", "build", "sanitizer_canaries")
# The cards that take minutes under a sanitizer are split into shards (selfcheck --shard K/N) that
# run side by side; a first full run at 017eeb6 (host backtraces on) took 4-8 minutes for these.
# racecheck costs ~70 ms a launch (probes of the seventh session): clip's many-tensor lines and
# lm_head's many-chunk and wide-vocabulary lines (45 s alone, over 560 s two at a time among
# a dozen racecheck runs, eighth session) get one line a shard.
SHARDS = {"clip": 32, "lm_head": 44, "accumulate": 4, "optim": 4, "linear": 2, "loss": 2}
# The count of findings each tool prints last (racecheck its own summary: errors and warnings).
SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) errors?, (\d+) warnings?\)")


def sanitized(tool, cmd, timeout, opts=()):
    """(errors reported or None when no summary came, seconds, exit status, output) of ``cmd``
    under compute-sanitizer's ``tool`` with the options ``opts`` (a launch window); a run still
    going after ``timeout`` seconds is killed."""
    # Device backtraces only: a host backtrace captures the Python stack at every allocation and
    # launch, and keeps those frames -- with every array they hold -- alive until exit, so each
    # DeviceArray would read as a leak (and the cards with thousands of tensors crawl).
    full = ["compute-sanitizer", "--tool", tool, "--print-limit", "20", "--show-backtrace", "device"] \
        + TOOL_OPTIONS[tool] + list(opts) + cmd
    t0 = time.time()
    if timeout <= 0:
        return None, 0.0, None, "[not started: the deadline had passed]"
    p = subprocess.Popen(full, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env=dict(os.environ, MOJO_TRAIN_VENDOR="cuda", PYTHONUNBUFFERED="1"), start_new_session=True)
    try:
        out, _ = p.communicate(timeout=timeout)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        out, rc = (out or "") + "\n[killed after %.0f s]" % timeout, 124
    found = SUMMARY.findall(out)
    return (sum(int(x or 0) for x in found[-1]) if found else None), time.time() - t0, rc, out


def build(canary_only=False):
    """The CUDA identical library (make) and the canary program (nvcc)."""
    os.makedirs(os.path.dirname(CANARY), exist_ok=True)
    steps = [["nvcc", "-O1", "-gencode", "arch=compute_90,code=sm_90", "-o", CANARY, "bench/sanitizer_canaries.cu"]]
    if not canary_only:
        steps.append(["make", "--no-print-directory", "native/build/libmojo_train_cuda_identical.so"])
    with concurrent.futures.ThreadPoolExecutor(len(steps)) as pool:
        done = list(pool.map(lambda c: subprocess.run(c, cwd=ROOT, capture_output=True, text=True), steps))
    for cmd, p in zip(steps, done):
        if p.returncode:
            sys.exit("build failed: %s\n%s" % (" ".join(cmd), (p.stdout + p.stderr)[-3000:]))


RECORD = os.path.join(ROOT, "bench", "results", "sanitize-cuda.md")
LIBRARY_MANIFEST = os.path.join(ROOT, "native", "build", "libmojo_train_cuda_identical.so.sha256")


def library_digest():
    """The first 16 hex digits of the CUDA identical library's sha256 (its manifest, written by
    the Makefile next to it), or "unknown": sections at different commits with the same digest
    ran the same library."""
    try:
        with open(LIBRARY_MANIFEST) as f:
            return f.read().split()[0][:16]
    except (OSError, IndexError):
        return "unknown"


def selfcheck_digest():
    """The first 16 hex digits of a sha256 over what runs the cards besides the library: every card
    file (fixtures/, and the package's own fixtures/ that an installed package reads first) and the
    mojo_train package's Python sources (names and bytes, in name order)."""
    h = hashlib.sha256()
    files = [os.path.join("fixtures", f) for f in os.listdir(os.path.join(ROOT, "fixtures")) if f.endswith(".card")]
    for folder, _, names in os.walk(os.path.join(ROOT, "mojo_train")):
        files += [os.path.relpath(os.path.join(folder, n), ROOT) for n in names if n.endswith((".py", ".card"))]
    for rel in sorted(files):
        h.update(rel.encode() + b"\0")
        with open(os.path.join(ROOT, rel), "rb") as f:
            h.update(f.read() + b"\0")
    return h.hexdigest()[:16]


def section_key(header):
    """What a section header says ran: (commit, library digest, selfcheck digest), None where absent."""
    got = [re.search(r"\b%s ([^\s,]+)" % w, header) for w in ("commit", "library", "selfcheck")]
    return tuple(m.group(1) if m else None for m in got)


def record_sections(with_mps=False):
    """The record's sections as [((commit, library, selfcheck), [(tool, run, seconds or None, outcome),
    ...])], in file order; ``with_mps``: [(..., rows, whether its runs ran under MPS)]."""
    sections = []
    if os.path.exists(RECORD):
        for line in open(RECORD):
            if line.startswith("## "):
                sections.append((section_key(line), [], False))
                continue
            if sections and line.startswith("Command:") and " at a time under MPS" in line:
                sections[-1] = sections[-1][:2] + (True,)
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if sections and len(cells) == 5 and cells[0] in TOOLS:
                sections[-1][1].append((cells[0], cells[1], int(cells[3]) if cells[3].isdigit() else None, cells[4]))
    return sections if with_mps else [sec[:2] for sec in sections]


def card_line_count(card):
    """The case lines of fixtures/<card>.card (what selfcheck --shard K/N divides)."""
    with open(os.path.join(ROOT, "fixtures", card + ".card")) as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#"))


WINDOW = re.compile(r"(.*) launches (\d+)-(\d*)")
# The windowed canary: its defect in launch CANARY_AT, clean launches before and after it.
CANARY_AT = 3


def windows(k, w):
    """[(first launch, launch count or None for every launch after)] of ``k`` windows of ``w``."""
    return [(i * w, w if i < k - 1 else None) for i in range(k)]


# The windowed canary's runs: the window holding the defect, the windows before and after it,
# and one past its last launch (CANARY_AT + 2 clean launches follow the defect).
CANARY_WINDOWS = ((0, CANARY_AT), (CANARY_AT, 1), (CANARY_AT + 1, None), (CANARY_AT + 7, None))
WINDOW_TOOLS = ("memcheck", "racecheck")


def window_label(run, first, count):
    return "%s launches %d-%s" % (run, first, "" if count is None else first + count - 1)


def window_options(first, count):
    """compute-sanitizer's options checking launches [first, first + count) (count None: all after)."""
    return ["--launch-skip", str(first), "--launch-count", "0" if count is None else str(count)]


def joined(spans):
    """Whether the spans [(first, last or None for open)] cover every launch from 0 on."""
    reach = 0
    for first, last in sorted(spans, key=lambda x: x[0]):
        if first > reach:
            return False
        if last is None:
            return True
        reach = max(reach, last + 1)
    return False


def run_lines(run, count):
    """(card, the card's line indices) that a run label covers: "card" every line, "card K/N" the
    lines whose index is K modulo N (selfcheck's --shard)."""
    m = re.fullmatch(r"(\S+) (\d+)/(\d+)", run)
    if not m:
        return run, set(range(count(run)))
    card, k, n = m.group(1), int(m.group(2)), int(m.group(3))
    return card, set(range(k, count(card), n))


def ok_at_this_commit(count=card_line_count, windows_ok=None):
    """{(tool, card): the card's line indices} that sections at this commit (or with this library's
    and this selfcheck's digests) recorded ok (not the
    canaries), each counted only from a section where that tool's canary and clean canary were ok
    (the tool was shown live there). Lines, not run labels: a card re-cut into more shards keeps
    what shards of another cut already covered. ``windows_ok`` (a set), when given, receives the
    (tool, label) of every launch window recorded ok from a section where windowing was shown live."""
    here = commit()
    if here == "unknown":
        sys.exit("--resume needs the commit (run from a git checkout, or set MT_COMMIT)")
    lib, harness = library_digest(), selfcheck_digest()
    done, spans = {}, {}
    for (at, at_lib, at_harness), rows in record_sections():
        same_run = lib != "unknown" and at_lib == lib and at_harness == harness
        if at != here and not same_run:
            continue
        ok = {(tool, run) for tool, run, _, outcome in rows if outcome == "ok"}
        live = {t for t in TOOLS if (t, "canary") in ok and (t, "canary clean") in ok}
        windowed = {t for t in live if all((t, window_label("canary", a, n)) in ok for a, n in CANARY_WINDOWS)}
        for tool, run in ok:
            if tool not in live or run.startswith("canary"):
                continue
            m = WINDOW.fullmatch(run)
            if m:                     # a launch window: counted once the windows join (below)
                if tool in windowed:
                    if windows_ok is not None:
                        windows_ok.add((tool, run))
                    spans.setdefault((tool, m.group(1)), []).append(
                        (int(m.group(2)), int(m.group(3)) if m.group(3) else None))
                continue
            card, lines = run_lines(run, count)
            done.setdefault((tool, card), set()).update(lines)
    for (tool, run), got in spans.items():
        if joined(got):
            card, lines = run_lines(run, count)
            done.setdefault((tool, card), set()).update(lines)
    return done


def covered(done, tool, run, count=card_line_count):
    """Whether the lines of ``run`` under ``tool`` are all in ``done`` (ok_at_this_commit's map)."""
    card, lines = run_lines(run, count)
    return lines <= done.get((tool, card), set())


def index_ranges(indices):
    """"0-12, 36, 39" for {0, ..., 12, 36, 39}."""
    out, run = [], []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
        run = [i]
    if run:
        out.append(str(run[0]) if len(run) == 1 else "%d-%d" % (run[0], run[-1]))
    return ", ".join(out)


def print_status(tools, cards):
    """--status: per card and tool, the card lines the record covers for this code and those left,
    with the launch windows recorded for a line not yet covered; exit status 1 when a line is left."""
    windows_ok = set()
    done = ok_at_this_commit(windows_ok=windows_ok)
    print("commit %s, library %s, selfcheck %s" % (commit(), library_digest(), selfcheck_digest()))
    left = False
    for card in cards:
        n = card_line_count(card)
        for tool in tools:
            got = done.get((tool, card), set())
            missing = set(range(n)) - got
            left |= bool(missing)
            print("%-10s %-9s %4d/%-4d lines%s" % (card, tool, len(got), n,
                                                  "; left: " + index_ranges(missing) if missing else ""))
            runs = {}
            for t, label in windows_ok:
                m = WINDOW.fullmatch(label)
                if t == tool and run_lines(m.group(1), card_line_count)[0] == card:
                    runs.setdefault(m.group(1), []).append(int(m.group(2)))
            for run, firsts in sorted(runs.items()):
                if not covered(done, tool, run):
                    print("%22s%s: windows recorded from launches %s" % ("", run, ", ".join(map(str, sorted(firsts)))))
    sys.exit(1 if left else 0)


def recorded_seconds(mps=False):
    """{(tool, run): the time its latest finished run took}, over the record's sections that ran as
    this command will (under MPS or not: time-sliced processes take several times longer)."""
    return {(tool, run): seconds for _, rows, under in record_sections(with_mps=True) if under == mps
            for tool, run, seconds, outcome in rows if outcome == "ok" and seconds is not None}


def not_started_sentence(waiting):
    """The runs that never started (no time left before --deadline), in one sentence instead of a
    row each: a run's windows are counted under the run's label."""
    if not waiting:
        return ""
    groups = {}
    for tool, what, *_ in waiting:
        m = WINDOW.fullmatch(what)
        key = (tool, m.group(1) if m else what)
        groups[key] = groups.get(key, 0) + (1 if m else 0)
    items = ["%s %s%s" % (tool, run, " (%d windows)" % n if n else "") for (tool, run), n in sorted(groups.items())]
    return " Not started, no time being left before the deadline (the next --resume runs them): %s." % "; ".join(items)


def launch_counts(path):
    """{run label: kernel launches} from a --count-launches file."""
    with open(path) as f:
        return {k: int(v) for k, v in json.load(f).items()}


NCU_ROW = re.compile(r'^"[^"]*",.*"gpu__time_duration\.sum"', re.M)


MPS_READY_TRIES = 60     # seconds, about, that a daemon may take to start or to stop


def mps_processes():
    """The pids of this machine's MPS control and server processes (read from /proc)."""
    pids = []
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else ():
        try:
            with open("/proc/%s/comm" % pid) as f:
                if f.read().startswith("nvidia-cuda-mps"):
                    pids.append(int(pid))
        except (OSError, ValueError):
            continue
    return pids


def mps_control(command, timeout=30):
    """(exit status, output) of one command to this process's MPS control daemon (stdin), bounded."""
    try:
        p = subprocess.run(["nvidia-cuda-mps-control"], input=command + "\n", text=True, capture_output=True,
                           env=dict(os.environ), timeout=timeout)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None, "[no answer in %d s]" % timeout


@contextlib.contextmanager
def mps_daemon():
    """An NVIDIA MPS control daemon for the block (--mps): its pipe and log folders fresh, this
    process's environment pointing there (the sanitized runs inherit it). The block starts once the
    daemon lists the server it was told to start (a client that cannot reach a daemon runs without
    MPS, silently) and the clean canary has run, and ends once the processes it started have exited
    (at most MPS_READY_TRIES seconds): the next command's daemon then finds the GPU free."""
    if not shutil.which("nvidia-cuda-mps-control"):
        sys.exit("--mps: nvidia-cuda-mps-control is not on PATH (it comes with the NVIDIA driver)")
    before = set(mps_processes())
    base = tempfile.mkdtemp(prefix="mt_mps_")
    env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(base, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(base, "log")}
    for folder in env.values():
        os.makedirs(folder)
    try:
        p = subprocess.run(["nvidia-cuda-mps-control", "-d"], env=dict(os.environ, **env), capture_output=True,
                           text=True, timeout=30)
        why = None if p.returncode == 0 else "exit %d: %s" % (p.returncode, (p.stdout + p.stderr)[-500:])
    except subprocess.TimeoutExpired:
        why = "no answer in 30 s"
    if why:
        shutil.rmtree(base, ignore_errors=True)
        sys.exit("--mps: the MPS control daemon did not start (%s)" % why)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        # A daemon starts a server on a client's demand: sixteen clients arriving together while it
        # starts (or after the one that started it has left) are refused ("MPS server is not ready",
        # "busy or unavailable", seen on the H200). The server is started first, and must be listed
        # (a client that cannot reach a daemon would run without MPS, silently); then one client runs.
        mps_control("start_server -uid %d" % os.getuid())
        for _ in range(MPS_READY_TRIES):
            rc, servers = mps_control("get_server_list")
            if rc == 0 and re.search(r"\d", servers):
                break
            time.sleep(1)
        else:
            sys.exit("--mps: the MPS daemon lists no server after start_server (%s): the run would not be "
                     "under MPS" % servers.strip()[-200:])
        for _ in range(MPS_READY_TRIES):
            try:
                if subprocess.run([CANARY, "clean"], capture_output=True, timeout=60).returncode == 0:
                    break
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        else:
            sys.exit("--mps: no CUDA program ran under the MPS daemon within %d tries" % MPS_READY_TRIES)
        yield
    finally:
        mps_control("quit")
        for _ in range(MPS_READY_TRIES):
            if not set(mps_processes()) - before:
                break
            time.sleep(1)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(base, ignore_errors=True)


# What a process prints when the MPS server takes no client (yet): the card's loader, the CUDA
# runtime's words (also in the canary's message), compute-sanitizer's report of the API error.
# compute-sanitizer's "Device not supported" and the canary's failed first cudaMalloc ("unspecified
# launch failure") are the same refusal seen through the tool: fourteenth session, the first sixteen
# starts of a call, before any launch.
MPS_REFUSAL = re.compile(r"MPS server is not ready|busy or unavailable|Error: Device not supported|^cudaMalloc failed: ",
                         re.M)
MPS_CLIENT_TRIES = 5
MPS_RETRY_WAIT = 3       # seconds before the second start of a refused run, doubled before each later one
MPS_START_GAP = 0.5      # seconds between two starts of sanitized processes under MPS



def mps_refused(result):
    """Whether a run (sanitized's result) failed because the MPS server took no client: it checked
    nothing, and may start again."""
    _, _, rc, out = result
    return rc not in (0, None) and MPS_REFUSAL.search(out or "") is not None


def card_runs(cards, shard_factor):
    """[(run label, card, selfcheck's --shard)] of every card's runs: a slow card (SHARDS) cut into
    its shards times ``shard_factor``, any other card one run."""
    runs = []
    for c in cards:
        n = SHARDS.get(c, 1) * (max(1, shard_factor) if c in SHARDS else 1)
        runs += [(c if n == 1 else "%s %d/%d" % (c, k, n), c, "%d/%d" % (k, n)) for k in range(n)]
    return runs


def canary_ran(what, tool, out):
    """Whether the canary program of the run ``what`` printed its last line ("canary <variant> ran")."""
    return ("canary %s ran" % ("clean" if what == "canary clean" else tool)) in (out or "")


def selected(label, only):
    """Whether --runs (a compiled expression, or None: every run) keeps the card run ``label``."""
    return only is None or only.fullmatch(label) is not None


def count_launches(args, tools, cards, only=None):
    """--count-launches: each selected card run (after --resume's leaving out, for the first tool)
    once under ncu with one metric; its kernel rows counted; the JSON written; exit status 1 if a
    run failed or counted none (a window plan from a wrong count would check too little)."""
    if not shutil.which("ncu"):
        sys.exit("ncu is not on PATH (it comes with the CUDA toolkit)")
    done = ok_at_this_commit() if args.resume else {}
    runs = [r for r in card_runs(cards, args.shard_factor) if not covered(done, tools[0], r[0]) and selected(r[0], only)]
    counts, ok = {}, True
    for what, card, shard in runs:
        cmd = ["ncu", "--metrics", "gpu__time_duration.sum", "--csv", sys.executable, "-m", "mojo_train", "selfcheck",
               "--card", card, "--shard", shard]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout,
                           env=dict(os.environ, MOJO_TRAIN_VENDOR="cuda"))
        counts[what] = len(NCU_ROW.findall(p.stdout))
        good = p.returncode == 0 and counts[what] > 0 and "FAIL " not in p.stdout
        ok &= good
        print("%-16s %6d launches%s" % (what, counts[what], "" if good else "  FAILED (exit %d):\n%s" % (
            p.returncode, (p.stdout + p.stderr)[-2000:])), flush=True)
    with open(args.count_launches, "w") as f:
        json.dump(counts, f, indent=1, sort_keys=True)
    out = os.environ.get("OUT")
    if out and os.path.dirname(os.path.abspath(args.count_launches)) != os.path.abspath(out):
        shutil.copy(args.count_launches, out)
    sys.exit(0 if ok else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default=",".join(TOOLS))
    ap.add_argument("--cards", default=",".join(CARDS))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--timeout", type=int, default=540, help="seconds per sanitized run")
    ap.add_argument("--deadline", type=int, default=560,
                    help="seconds for the whole command: runs still going then are killed and recorded "
                         "as unfinished, so the record is written inside one 10-minute GPU call")
    ap.add_argument("--no-build", action="store_true", help="use the libraries and canary already built")
    ap.add_argument("--resume", action="store_true",
                    help="leave out the card runs this file's earlier sections at this commit (or with this "
                         "library's and selfcheck's digests) record ok (the same "
                         "libraries and shards; the canaries always run)")
    ap.add_argument("--shard-factor", type=int, default=1,
                    help="cut each slow card into this many times its shards (more, shorter runs side by side)")
    ap.add_argument("--windows", type=int, default=1,
                    help="split each card run into this many launch windows (the last open-ended)")
    ap.add_argument("--window-launches", type=int, default=0, help="kernel launches a window checks")
    ap.add_argument("--launch-counts", default="",
                    help="JSON file of each run's kernel launches: a window checks its run's count over --windows; "
                         "runs the file does not count run whole")
    ap.add_argument("--count-launches", default="",
                    help="count each selected run's kernel launches under ncu into this JSON file, then exit")
    ap.add_argument("--runs", default="", help="only the card runs whose label this regular expression matches "
                    "whole (e.g. 'lm_head (36|39|42)/44'); the canaries always run")
    ap.add_argument("--status", action="store_true",
                    help="print what the record covers for this code (as --resume reads it), per card and tool, "
                         "and exit (1 if a line is not covered); needs no GPU")
    ap.add_argument("--mps", action="store_true",
                    help="run under an NVIDIA MPS control daemon started for this command (kernels of the "
                         "processes share the SMs instead of being time-sliced)")
    args = ap.parse_args()
    tools = [t for t in args.tools.split(",") if t]
    cards = [c for c in args.cards.split(",") if c]
    unknown = sorted(set(tools) - set(TOOLS)) + sorted(set(cards) - set(CARDS))
    if unknown:
        ap.error("unknown tool(s) or card(s): %s" % ", ".join(unknown))
    if args.windows < 1 or (args.windows > 1 and (args.window_launches < 1) == (not args.launch_counts)):
        ap.error("--windows K needs K >= 1, and when K > 1 either --window-launches W >= 1 or --launch-counts FILE")
    if args.windows > 1 and set(tools) - set(WINDOW_TOOLS):
        ap.error("--windows serves memcheck and racecheck only (initcheck would take memory an unchecked launch "
                 "wrote for uninitialised; synccheck's canary may hang when run unchecked)")
    try:
        only = re.compile(args.runs) if args.runs else None
    except re.error as exc:
        ap.error("--runs: not a regular expression (%s)" % exc)
    if only is not None:
        labels = [what for what, _, _ in card_runs(cards, args.shard_factor)]
        if not any(selected(lab, only) for lab in labels):
            ap.error("--runs %r matches none of the selected cards' runs (e.g. %s)" % (args.runs, ", ".join(labels[:3])))
    if args.count_launches:
        if args.mps:
            ap.error("--mps does not apply to --count-launches (ncu counts the launches of one process at a time)")
        return count_launches(args, tools, cards, only)
    if args.status:
        return print_status(tools, cards)
    if not shutil.which("compute-sanitizer"):
        sys.exit("compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
    t_start = time.time()
    if not args.no_build:
        build()
    # (run label, tool, command, compute-sanitizer's launch-window options)
    jobs = [("canary", t, [CANARY, t], ()) for t in tools] + [("canary clean", t, [CANARY, "clean"], ()) for t in tools]
    if args.windows > 1:
        jobs += [(window_label("canary", a, n), t, [CANARY, t, str(CANARY_AT)], window_options(a, n))
                 for t in tools for a, n in CANARY_WINDOWS]
    jobs += [(what, t, [sys.executable, "-m", "mojo_train", "selfcheck", "--card", c, "--shard", shard], ())
             for t in tools for what, c, shard in card_runs(cards, args.shard_factor) if selected(what, only)]
    counts = launch_counts(args.launch_counts) if args.windows > 1 and args.launch_counts else {}
    # with --launch-counts, only the runs the file counts are cut (the others run whole, and the
    # section names them); one selected run at least must be counted there (a file for other cards
    # is a mistake), judged before --resume leaves out what is covered
    cut = lambda what: args.windows > 1 and not what.startswith("canary") and (  # noqa: E731
        not args.launch_counts or what in counts)
    selected_runs = [j[0] for j in jobs if not j[0].startswith("canary")]
    if args.launch_counts and args.windows > 1 and selected_runs and not any(map(cut, selected_runs)):
        sys.exit("%s counts none of the selected runs (count them with --count-launches)" % args.launch_counts)
    windows_ok = set()       # with --resume: windows already recorded ok are not run again
    done = ok_at_this_commit(windows_ok=windows_ok) if args.resume else {}
    resumed = len([j for j in jobs if not j[0].startswith("canary") and covered(done, j[1], j[0])])
    jobs = [j for j in jobs if j[0].startswith("canary") or not covered(done, j[1], j[0])]
    whole = sorted({j[0] for j in jobs if args.windows > 1 and not j[0].startswith("canary") and not cut(j[0])})
    if args.windows > 1:      # each card run left that is cut becomes its windows
        size = lambda what: -(-counts[what] // args.windows) if args.launch_counts else args.window_launches  # noqa: E731
        jobs = [j for j in jobs if not cut(j[0])] + [
            (window_label(what, a, n), tool, cmd, window_options(a, n))
            for what, tool, cmd, _ in jobs if cut(what)
            for a, n in windows(args.windows, max(1, size(what)))
            if (tool, window_label(what, a, n)) not in windows_ok]
    # The canaries first (is each tool live?), then the longest runs by the record (runs it has no
    # time for first), so that the last ones to start are the short ones.
    took = recorded_seconds(args.mps)
    jobs.sort(key=lambda j: (not j[0].startswith("canary"), -took.get((j[1], j[0]), float("inf"))))
    deadline = t_start + args.deadline

    def start(job):
        what, tool, cmd, opts = job
        left = min(args.timeout, deadline - time.time())
        before = took.get((tool, what))
        if before is not None and before > left:     # it could not finish: leave the slot to another run
            why = "[not started: it took %.0f s before, %.0f s are left]" % (before, left)
            return what, tool, None, 0.0, None, why, why
        refused, first = 0, ""
        try:
            got = sanitized_gated(what, tool, cmd, left, opts)   # left <= 0: not started, by sanitized
            # A client the MPS server refused checked nothing: start it again while time is left
            # (the time the run took before must still fit, as for its first start), later each time.
            while args.mps and mps_refused(got) and refused < MPS_CLIENT_TRIES - 1:
                time.sleep(min(MPS_RETRY_WAIT * 2 ** refused, max(0.0, deadline - time.time())))
                left = min(args.timeout, deadline - time.time())
                if left <= 0 or (before is not None and before > left):
                    break
                refused += 1
                first = first or got[3]
                got = sanitized_gated(what, tool, cmd, left, opts)
        except Exception as exc:        # recorded as a failed run: the record is written whatever happens
            got = None, 0.0, None, "[could not run: %r]" % (exc,)
        # the outcome is the last start's; the log keeps the first refused start's output too
        log = got[3]
        if refused:
            retried.append((tool, what))
            log = ("[started %d times: the MPS server refused the client before; the first start's output:]\n%s\n"
                   "[the last start's output:]\n%s" % (refused + 1, first, got[3]))
        return (what, tool) + got + (log,)

    gate, last_start = threading.Lock(), [0.0]

    def sanitized_gated(what, tool, cmd, left, opts):
        """sanitized(), started at least MPS_START_GAP after the previous start under --mps (sixteen
        clients arriving in one second were refused); a run the wait leaves too little time for
        (by its recorded time) is not started."""
        if args.mps:
            with gate:
                wait = last_start[0] + MPS_START_GAP - time.time()
                if wait > 0:
                    time.sleep(wait)
                last_start[0] = time.time()
            left = min(left, deadline - time.time())
            before = took.get((tool, what))
            if before is not None and before > left:
                return None, 0.0, None, "[not started: it took %.0f s before, %.0f s are left]" % (before, left)
        return sanitized(tool, cmd, left, opts)

    results, retried = [], []
    with (mps_daemon() if args.mps else contextlib.nullcontext()), concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(start, j) for j in jobs]
        for f in concurrent.futures.as_completed(futures):   # each line as it ends
            what, tool, errors, seconds, rc, out, _ = f.result()
            results.append(f.result())
            print("%-9s %-16s errors=%-5s %5.0f s rc=%s" % (tool, what, errors, seconds, rc), flush=True)
    rows, ok = [], True
    for what, tool, errors, seconds, rc, out, log in results:
        window = WINDOW.fullmatch(what)
        if what == "canary" or (window and window.group(1) == "canary" and int(window.group(2)) == CANARY_AT):
            # the planted defect must be reported by a canary that ran to its end (a client the MPS
            # server refused reports the failed allocation as an error too)
            good = errors is not None and errors > 0 and canary_ran(what, tool, out) and not mps_refused(
                (None, None, 1, out))
        elif what == "canary clean" or (window and window.group(1) == "canary"):   # the defect left out
            good = errors == 0 and rc == 0 and canary_ran(what, tool, out)
        else:                         # a card: no finding, every case passed, no FAIL line
            good = errors == 0 and rc == 0 and "FAIL " not in out
        ok &= good
        rows.append((tool, what, errors, seconds, good, out, log))
        if not good:
            print("FAILED %s %s:\n%s\n" % (tool, what, "\n".join(log.strip().splitlines()[-30:])), flush=True)
    waiting = [r for r in rows if r[5].startswith("[not started")]
    table = ["| tool | run | errors reported | seconds | outcome |", "| --- | --- | --- | --- | --- |"]
    table += ["| %s | %s | %s | %.0f | %s |" % (t, w, "-" if e is None else e, s, "ok" if g else
                                                 ("not finished" if "[killed" in o else "FAILED"))
              for t, w, e, s, g, o, _ in sorted(rows, key=lambda r: (TOOLS.index(r[0]), r[1]))
              if not o.startswith("[not started")]
    record = ["", "## %s, %s, commit %s, library %s, selfcheck %s" % (
                  time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), gpu_name(), commit(), library_digest(),
                  selfcheck_digest()),
              "", "Command: `make sanitize-cuda`%s; %d runs, %d at a time%s, %.0f s in all. A canary row must report "
              "errors (the tool is live); a clean canary and every card must report 0.%s"
              % (("" if (tools, cards) == (list(TOOLS), list(CARDS)) else " (tools %s; cards %s)" % (",".join(tools), ",".join(cards)))
                 + (" (runs %s)" % args.runs if args.runs else ""),
                 len(jobs), args.jobs, " under MPS" if args.mps else "", time.time() - t_start,
                 (" Resumed: %d runs left out, their card lines recorded ok in earlier sections at this commit or with this "
                  "library and selfcheck." % resumed
                  if resumed else "") +
                 (" Launch windows: each card run in %d runs of %s kernel launches (the last: every launch after); the "
                  "canary's window holding its defect (launch %d) must report it, the others 0."
                  % (args.windows, args.window_launches or "its count (%s) over %d, rounded up," % (
                      args.launch_counts, args.windows), CANARY_AT) if args.windows > 1 else "") +
                 (" Run whole, %s counting no launches for them: %s." % (args.launch_counts, "; ".join(whole))
                  if whole else "") +
                 not_started_sentence(waiting) +
                 (" Started again because the MPS server refused their client (they had checked nothing): %s."
                  % "; ".join("%s %s" % r for r in sorted(retried)) if retried else "")),
              ""] + table
    path = RECORD
    if not os.path.exists(path):
        record = ["# compute-sanitizer over the cards (make sanitize-cuda)", "",
                  "Appended by bench/sanitize_cuda.py, one section per run."] + record
    with open(path, "a") as f:
        f.write("\n".join(record) + "\n")
    if os.environ.get("OUT"):          # the record, and every run's output in one archive
        shutil.copy(path, os.environ["OUT"])
        with tarfile.open(os.path.join(os.environ["OUT"], "sanitize_cuda_logs.tar.gz"), "w:gz") as tar:
            for tool, what, _, _, _, _, out in rows:
                data = out.encode()
                info = tarfile.TarInfo("logs/%s-%s.log" % (tool, what.replace(" ", "_")))
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    print("\n".join(table))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
