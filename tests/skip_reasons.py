"""The reviewed list of reasons a test may skip for, and the check that holds the suite to it.

A skip hides a test, so the suite accepts only three kinds (README "Tests"):
  library   a capability the library under test declares it lacks (its mt_features() bits,
            or a vendor that takes no device buffers);
  reference a capability the reference or the test environment lacks: an older torch, an
            optional package, a tool (C compiler, nvcc, hipcc, nm), a platform facility;
  chance    a stated chance of the test setup (an allocator placing two arrays end to end).
Every skip reason of a run is matched against REVIEWED below; conftest.py prints the skips
grouped by reason at the end of the run and fails the run (exit status 1) when a reason
matches no entry. Adding an entry is a review decision: say which kind it is.
"""
import re

REVIEWED = (
    # library: capabilities the library under test declares it lacks (mt_features)
    ("library", r"^this library has no \w+ \(mt_features\)$"),
    ("library", r".* has no cross_entropy \(MT_FEATURE_LOSS clear\)$"),
    ("library", r"^accumulate is not built into "),
    ("library", r"^linear_backward is not built into .* \(no linear feature\)$"),
    ("library", r"^the \S+ library has no embedding$"),
    ("library", r"^the loaded library has no schedules$"),
    ("library", r"^no schedules in "),
    ("library", r"^no Philox in this library$"),
    ("library", r"^needs Philox and a thread pool$"),
    ("library", r"^(no thread pool in this library|the vendor has no thread pool)$"),
    ("library", r"^(no device buffers|the vendor takes no device buffers|the loaded vendor takes no device buffers"
                r"|.* takes no device buffers)$"),
    ("library", r"^(this vendor takes device buffers|a GPU vendor takes device=True)$"),
    ("library", r"^IEEE-exact arithmetic is not this numeric mode's promise \(approximate division, flushed subnormals\)$"),
    ("library", r"^this numeric mode does not contract$"),
    ("library", r"^gradual underflow is not this numeric mode's promise \(it flushes by the stated rule of "
                r"native/contracts/ftz\.md: tests/test_ftz_rule\.py and its cards check that\)$"),
    ("library", r"^the library keeps its chunks in device memory \(device_buffers\): "),
    ("library", r"^no identical library for \w+$"),
    ("library", r"^the cpu oracle's \w+ numeric mode is not built( \(make\)$|: )"),
    ("library", r"^the C host links the CPU oracle, which is not built$"),
    ("library", r"^the example links the cpu oracle's identical library, which is not built$"),
    # reference: what the reference or the environment lacks
    ("reference", r"^could not import '(torch|numpy|mpmath|tolerances|expecttest)'"),
    ("reference", r"^torch \S+ has no (F|nn)\.\w+ \(added in [\d.]+\)$"),
    # test_torch_peer's counts are one torch's inputs (its docstring); another torch has other samples
    ("reference", r"^the docstring's counts are torch [\d.]+'s inputs; torch \S+ has others$"),
    ("reference", r"^(torch has no CUDA here|no CUDA/ROCm device for torch)$"),
    ("reference", r"^torch\.distributed has no gloo here$"),   # a torch built without distributed or gloo
    ("reference", r"^torch\.distributed has no NCCL here$"),   # a torch built without NCCL (CPU builds)
    ("reference", r"^this machine has fewer than two CUDA GPUs for torch \(NCCL needs one a rank\)$"),
    ("reference", r"^(nvcc|hipcc|nm|clang|gcc|compute-sanitizer) is not installed"),
    ("reference", r"^bash or tar is not installed$"),   # bench/device_steps.sh's tests
    ("reference", r"^make or sha256sum is not installed$"),   # its source stamp check (the Makefile's fallback is shasum)
    ("reference", r"^no cross compiler for another machine here \("),   # e.g. aarch64-linux-gnu-gcc (.ci/run installs it)
    ("reference", r"^.+ finds no C library headers for its target \(Debian: libc6-dev-\*-cross\)$"),   # .ci/run installs it
    ("reference", r"^the loader knows no ELF machine number for this host \("),   # a platform outside its table
    ("reference", r"^\S+ is not built \(make hip\)$"),
    ("reference", r"^objdump is not installed: the disassembly check needs it$"),
    ("reference", r"^the CPU library's target clones are x86-64's; this machine is \S+$"),   # hipcc here, that mode not built (.ci/run builds the identical one)
    ("reference", r"^nvcc compiled the kernel but cannot link a host program here"),
    ("reference", r"^no C(/C\+\+)? compiler"),
    ("reference", r"^make or cc is missing: cannot build the sabotage library$"),
    ("reference", r"^no make on PATH: the example target cannot run$"),
    ("reference", r"^no sha256sum here$"),
    ("reference", r"^no C compiler or make to build the sanitized library$"),
    ("reference", r"^a GPU runtime initialised in the parent cannot be used in a forked child"),
    ("reference", r"^the compiler does not take -march=native$"),
    ("reference", r"^this CPU cannot flush denormals$"),
    ("reference", r"^no fork here$"),
    ("reference", r"^cannot dlopen \S+: "),
    ("reference", r"^the buffer protocol from Python needs 3\.12$"),
    ("reference", r"^(no GPU library is built here|no \w+ library is built here)"),
    # chance: a stated chance of the test setup
    ("chance", r"^the allocator happened to place them end to end$"),
    ("chance", r"^every vendor's library loads here$"),            # nothing missing to test the refusal with
    ("chance", r"^every GPU vendor's identical library loads here: none is missing$"),
)

_COMPILED = [(kind, re.compile(pattern)) for kind, pattern in REVIEWED]


def classify(reason):
    """The kind ('library', 'reference', 'chance') of a skip reason, or None if unreviewed."""
    reason = reason.strip()
    if reason.startswith("Skipped: "):
        reason = reason[len("Skipped: "):]
    for kind, pattern in _COMPILED:
        if pattern.search(reason):
            return kind
    return None


def reason_of(report):
    """The skip reason of a pytest report (its longrepr is (path, line, 'Skipped: ...'))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text[len("Skipped: "):] if text.startswith("Skipped: ") else text


def table(reasons):
    """Lines of a table: count, kind and reason of every distinct skip reason, most first."""
    counts = {}
    for r in reasons:
        counts[r] = counts.get(r, 0) + 1
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ["%6d  %-9s  %s" % (n, classify(r) or "UNREVIEWED", r) for r, n in rows]
