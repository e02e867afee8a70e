"""The fuzz suite's crash isolation: a persistent worker process runs one example at a time, and
``Pool`` (in the parent) feeds it, records a worker that dies as a crash of that example and
starts a new one.

The worker is spawned, not forked (``python tests/_fuzz_worker.py``, the same interpreter and
environment, MOJO_TRAIN_VENDOR included), so it works where a GPU runtime initialised in the
parent would not survive a fork. Messages are pickled frames (4-byte length, then the bytes):
the parent sends an example's description, the worker answers with a verdict. The worker's own
stdout is moved to stderr, so nothing a library prints can corrupt the channel.

Per example (``execute``): build the arguments (tests/_fuzz_build.py), snapshot every caller
buffer, call, then classify:

  refused   the exception is a TypeError, ValueError or IndexError -- or a type the example's
            faults allow (MemoryError for a genuinely huge shape, NotImplementedError for a
            documented unsupported option, ...); its message starts ``mojo_train.`` (or is
            Python's own refusal of the call's signature) and names a faulted argument; every
            caller buffer, and the called object's state, is byte-identical to the snapshot.
  accepted  the example had no hard fault; the result is the target's oracle's; no argument
            but the ones the call documents as written changed.

Anything else is a finding, in one of these categories: "crash" (the worker died or hung),
"partial write", "unclear error" (another exception type, no prefix, the argument not named),
"wrong outcome" (a valid call refused, an invalid one accepted), "wrong result" (the oracle
disagrees, or an input was written), "harness error" (the suite's own code failed).
"""
import os
import pickle
import re
import select
import signal
import struct
import subprocess
import sys
import tempfile
import time
import traceback

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
CATEGORIES = ("crash", "partial write", "unclear error", "wrong outcome", "wrong result", "harness error")
ALLOWED = ("TypeError", "ValueError", "IndexError")
SIGNATURE = re.compile(r"^[\w.<>]+\(\) (got an unexpected keyword argument|got multiple values|missing \d+ required"
                       r"|takes (from )?\d+ (to \d+ )?positional|takes no arguments)")


# ---- frames -----------------------------------------------------------------------------------

def send(fd, obj):
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(struct.pack("<I", len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exactly(fd, n, deadline):
    chunks, left = [], n
    while left:
        if deadline is not None:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise TimeoutError
        chunk = os.read(fd, left)
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def recv(fd, timeout=None):
    deadline = None if timeout is None else time.monotonic() + timeout
    (n,) = struct.unpack("<I", _read_exactly(fd, 4, deadline))
    return pickle.loads(_read_exactly(fd, n, deadline))


# ---- the parent's side ------------------------------------------------------------------------

class Pool:
    """One worker process for one vendor, restarted after a crash. ``run(desc)`` returns the
    verdict: ``{"outcome": "accepted" | "refused" | "crash" | "harness", "finding": None or
    (category, text)}``. ``pids``: every worker started, in order."""

    def __init__(self, vendor=None, timeout=120.0, env=None):
        from _helpers import python_path
        self.env = dict(os.environ, **(env or {}))
        self.env["PYTHONPATH"] = python_path(REPO, TESTS)
        if vendor:
            self.env["MOJO_TRAIN_VENDOR"] = vendor
        self.timeout, self.proc, self.pids, self.crashes = timeout, None, [], 0

    def _start(self):
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, env=self.env, cwd=REPO)
        self.pids.append(self.proc.pid)
        try:
            hello = recv(self.proc.stdout.fileno(), self.timeout)
        except (EOFError, TimeoutError):
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            self.log.seek(0)
            raise RuntimeError("the fuzz worker did not start; its stderr:\n%s"
                               % self.log.read().decode("utf-8", "replace")[-3000:]) from None
        assert hello == ("ready", self.proc.pid), hello

    def run(self, desc):
        if self.proc is None:
            self._start()
        try:
            send(self.proc.stdin.fileno(), desc)
            return recv(self.proc.stdout.fileno(), self.timeout)
        except (EOFError, BrokenPipeError, TimeoutError) as exc:
            return self._crashed(exc)

    def _crashed(self, exc):
        hung = isinstance(exc, TimeoutError)
        if hung:
            self.proc.kill()
        rc = self.proc.wait()
        self.log.seek(0)
        tail = self.log.read().decode("utf-8", "replace")[-1500:]
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.proc, self.crashes = None, self.crashes + 1
        how = ("hung for over %.0f s" % self.timeout if hung else
               "killed by %s" % signal.Signals(-rc).name if rc < 0 else "exited with status %d" % rc)
        return {"outcome": "crash", "finding": ("crash", "the worker %s; its stderr ends:\n%s" % (how, tail))}

    def close(self):
        if self.proc is not None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)
            self.proc.stdout.close()
            self.proc = None


# ---- the worker's side ------------------------------------------------------------------------

class Check:
    """What an oracle sees: the built arguments after the call (``args``), their values before it
    (``before``), the literal values passed (``lit``), the result, the called object."""

    def __init__(self, desc, built, before, result, subject):
        self.desc, self.args, self.result, self.subject = desc, built.objects, result, subject
        self.values_before, self.mode = before, desc["numeric_mode"]

    def has(self, name):
        return name in self.args

    def before(self, name):
        """The values of argument ``name`` before the call (None when not a buffer or not given)."""
        return self.values_before.get(name)

    def lit(self, name, default=None):
        return self.args[name] if name in self.args else default


def _values(obj):
    from _fuzz_build import host_values
    if isinstance(obj, (list, tuple)):
        values = [_values(o) for o in obj]
        return None if values and all(v is None for v in values) else values
    try:
        return host_values(obj) if _is_buffer(obj) else None
    except (TypeError, ValueError):
        return None


def _is_buffer(obj):
    import mojo_train as mt
    if isinstance(obj, (mt.Array, mt.DeviceArray)) or type(obj).__module__.startswith(("torch", "numpy")):
        return True
    try:
        memoryview(obj).release()
        return True
    except (TypeError, ValueError):
        return False


def _root(name, specs):
    """The argument (or pool buffer) whose memory argument ``name`` is: aliases and views lead
    to what they alias or view."""
    spec = specs.get(name)
    while isinstance(spec, tuple) and spec and spec[0] in ("alias", "view"):
        name, spec = spec[1], specs.get(spec[1])
    return name


def _written(desc, target):
    """The buffers a successful call may write: the target's arguments, and every argument or
    pool buffer sharing memory with one of them."""
    specs = dict(desc.get("pool", {}), **{n: s for n, s, _ in desc["args"]})
    writes = set(target.writes_for(desc) if hasattr(target, "writes_for") else target.writes)
    roots = {_root(n, specs) for n in writes if n in specs}
    return writes | {n for n in specs if _root(n, specs) in roots}


def _names_argument(text, names):
    from mojo_train._ops import _ARGUMENT
    for n in names:        # a one-letter name must stand as a name ("x has", "x's"), not as a word ("a copy")
        pattern = _ARGUMENT % re.escape(n) + "|(?<![\\w.])%s's\\b" % re.escape(n) if len(n) == 1 else \
            r"(?<![\w])%s(?![\w])" % re.escape(n)
        if re.search(pattern, text):
            return True
    return False


def _refusal_problem(desc, exc, target):
    """None when ``exc`` is a clean refusal of this example, else why not."""
    kind = type(exc).__name__
    text = str(exc)
    extra = set(target.refusal_types).union(*(f[3] for f in desc["faults"]))
    bases = {c.__name__ for c in type(exc).__mro__}
    if not bases & (set(ALLOWED) | extra):
        return "%s is not a refusal type here (allowed: %s): %r" % (kind, ", ".join(sorted(set(ALLOWED) | extra)),
                                                                     text[:300])
    if kind == "MemoryError" or isinstance(exc, MemoryError):
        return None
    if isinstance(exc, TypeError) and SIGNATURE.match(text):
        return None
    if isinstance(exc, OSError) and "OSError" in extra:
        pass                  # the system's refusal of a path: its message names the file, not the entry point
    elif not text.startswith("mojo_train."):
        return "the message does not start with 'mojo_train.<entry point>:': %r" % text[:300]
    if hasattr(target, "names_in_refusal"):       # words the target's refusals must hold (a file's name)
        words = target.names_in_refusal(desc)
        if not any(w in text for w in words):
            return "the message holds none of %s: %r" % (", ".join(map(repr, words)), text[:300])
        return None
    names = desc["blame"] or [n for n, _, _ in desc["args"]]
    if len([n for n, _, _ in desc["args"] if n != "numeric_mode"]) < 2:
        return None           # a call of one argument: the refusal is about it, naming it adds nothing
    if names and not _names_argument(text, names):
        return "the message names none of %s: %r" % (", ".join(names), text[:300])
    return None


def _changed(before, after, names):
    return sorted(n for n in names if before.get(n) != after.get(n))


def execute(desc):
    """Run one example; return its verdict (see the module docstring)."""
    from _fuzz_build import Built, build, snapshot
    from _fuzz_targets import TARGETS
    target = TARGETS[desc["target"]]
    built = Built(desc["numeric_mode"])
    try:
        subject = target.setup(desc, built)
        for name, spec in desc.get("pool", {}).items():     # memory the arguments view, not passed
            build(spec, built, name)
        args, kwargs = [], {}
        for name, spec, kw in desc["args"]:
            obj, _ = build(spec, built, name)
            (kwargs.__setitem__(name, obj) if kw else args.append(obj))
        values = {name: _values(obj) for name, obj in built.objects.items()}
        before, state = snapshot(built), target.state(subject)
    except Exception:
        return {"outcome": "harness", "finding": ("harness error", "building: " + traceback.format_exc()[-2000:])}
    try:
        result = target.call(subject, args, kwargs)
    except Exception as exc:          # noqa: BLE001  (every exception is classified)
        return _refused(desc, exc, target, built, before, state, subject)
    return _accepted(desc, target, built, before, values, result, subject)


def _refused(desc, exc, target, built, before, state, subject):
    from _fuzz_build import snapshot
    changed = _changed(before, snapshot(built), before)
    if changed or target.state(subject) != state:
        what = ", ".join(changed) or "the called object's state"
        return {"outcome": "refused", "finding": ("partial write", "refused with %s: %s, but wrote %s"
                                                  % (type(exc).__name__, str(exc)[:300], what))}
    problem = _refusal_problem(desc, exc, target)
    if problem:
        return {"outcome": "refused", "finding": ("unclear error", problem)}
    if desc["expect"] == "accept":
        return {"outcome": "refused", "finding": ("wrong outcome", "refused a valid call: %s: %s"
                                                  % (type(exc).__name__, str(exc)[:300]))}
    return {"outcome": "refused", "finding": None}


def _accepted(desc, target, built, before, values, result, subject):
    from _fuzz_build import snapshot
    if desc["expect"] == "refuse":
        faults = "; ".join("%s: %s" % (", ".join(f[0]), f[1]) for f in desc["faults"] if f[2] == "hard")
        return {"outcome": "accepted", "finding": ("wrong outcome", "accepted a call it must refuse (%s)" % faults)}
    after = snapshot(built)
    wrote = _changed(before, after, set(before) - _written(desc, target))
    if wrote:
        return {"outcome": "accepted", "finding": ("wrong result", "wrote into input %s" % ", ".join(wrote))}
    try:
        target.check(Check(desc, built, values, result, subject))
    except AssertionError as exc:
        return {"outcome": "accepted", "finding": ("wrong result", str(exc)[:2000] or "the oracle disagrees")}
    except Exception:
        return {"outcome": "accepted", "finding": ("harness error", "oracle: " + traceback.format_exc()[-2000:])}
    return {"outcome": "accepted", "finding": None}


def main():
    channel = os.dup(1)
    os.dup2(2, 1)                 # a stray print goes to stderr, never into the channel
    sys.path[:0] = [TESTS, REPO]
    import _fuzz_targets  # noqa: F401  (imports mojo_train, numpy, torch and the oracles once)
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        pass
    send(channel, ("ready", os.getpid()))
    inp = sys.stdin.fileno()
    while True:
        try:
            desc = recv(inp)
        except EOFError:
            return
        send(channel, execute(desc))


if __name__ == "__main__":
    main()
