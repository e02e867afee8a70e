"""The torch adapter's host overhead, measured on the CPU at a size where kernels cost nothing.

    python bench/torch_adapter_cpu.py [--width 32] [--blocks 2] [--vocab 64] [--tokens 64]
                                               [--repeat 300] [--profile 200] [--threads 1] [--clock cpu]
                                               [--device cpu] [--mode identical] [--write]

What it measures: one training step of issue 13's model (tests/_torch_model.py: Embedding, blocks
of RMSNorm -> Linear -> SiLU with a residual, the fused LM head, AdamW in two param groups)
through mojo_train.torch (TorchLM, torch's autograd, our AdamW subclass) against the same step
through the native Python API (NativeLM), in one process, on CPU tensors at a tiny size (width
32, 2 blocks, vocabulary 64, 64 tokens by default) and --threads threads on both sides: the
kernels take microseconds, so a step's time is the host time of the Python around them. On a
GPU every native call synchronizes before it returns, so that host time leaves the GPU idle and
adds to the step (bench/results/NOTES.md, "2026-12-02: the torch adapter's step against the
native API's"); here it can be measured without one.

Figures: ``adapter_us`` and ``native_us``, medians of --repeat steps timed in alternation after
warm-up (the same batch each step; both sides end in the same bytes, checked after the timed
steps: ``same_bytes``), by --clock: ``cpu``, the process's CPU time (steadier on a loaded
machine), or ``wall``. ``--device cuda`` runs both sides on the GPU instead (CUDA tensors and
DeviceArrays, each step and phase synchronized, wall-clock): the host time a GPU step carries
where its kernels take microseconds. Phases, medians of --repeat steps: the adapter's
zero_grad, forward (``model(ids, targets)``), backward (``loss.backward()``) and optimizer step; the native side's
optimizer step (``mt.AdamW.step``) and the rest of its step (forward and backward). Then
cProfile over --profile adapter steps, enabled during one phase at a time: each phase's
profiled time split by where the Python runs (the adapter's modules, mojo_train's native API
modules, the probe of a buffer -- mojo_train/_probe.py and _dlpack.py --, torch's Python, C
builtins), and its costliest functions. cProfile inflates call-heavy code: read its figures as
shares, the unprofiled medians as times.

Record (2 cores, Python 3.11, torch 2.13 CPU, identical mode, 1 thread, CPU time; three runs of
each build, alternated, medians; bench/results/NOTES.md, "2026-12-02: the torch adapter's host
time on the CPU", holds the predictions, the outcomes and what remains):

Before: adapter 4746 us, native 1294 us a step (3.70x). Phases: forward 2077 us, backward 2015,
optimizer step 394 (native optimizer 82), zero_grad 47. Calls a step: forward 3320, backward
3373, step 672. The largest share of forward and backward: probing torch tensors through DLPack
(_probe.py, _dlpack.py), 39 a step; of the optimizer step: its Python checks and tables.

After (the adapter's own probes, the optimizer's step plan and kept group table): adapter 2678
us, native 1194 us (2.35x). Phases: forward 1106 us, backward 1051, step 281. Calls a step:
forward 2058, backward 2004, step 362.
"""
import cProfile
import os
import pstats
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

from _timing import bench_args, cpu_record  # noqa: E402
from linear_cpu import paired_medians  # noqa: E402

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("zero_grad", "forward", "backward", "step")
# where a profiled function's own time is counted: the first (path fragment, label) that matches
_PLACES = (("mojo_train/torch/", "adapter"), ("mojo_train/_probe.py", "probe"), ("mojo_train/_dlpack.py", "probe"),
           ("mojo_train/", "native API"), ("/torch/", "torch Python"))


class _TimedOptimizer:
    """A native optimizer whose ``step`` adds its time by ``clock`` to ``seconds``."""

    def __init__(self, opt, clock):
        self.opt, self.clock, self.seconds = opt, clock, []

    def step(self, grads):
        t0 = self.clock()
        out = self.opt.step(grads)
        self.seconds.append(self.clock() - t0)
        return out

    def __getattr__(self, name):
        return getattr(self.opt, name)


def _place(filename):
    if filename == "~":
        return "C builtins"
    path = filename.replace(os.sep, "/")
    for fragment, label in _PLACES:
        if fragment in path:
            return label
    return "other Python"


def _short(filename):
    """A profiled file's path: from the repository's root, or from site-packages."""
    path = filename.replace(os.sep, "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/")[-1]
    return os.path.relpath(filename, _ROOT).replace(os.sep, "/") if filename.startswith(_ROOT) else path


def profile_split(profiles, steps):
    """Per phase: ({place: profiled ms a step}, [(ms a step, function), ...] costliest first,
    function calls a step)."""
    out = {}
    for phase, prof in profiles.items():
        st = pstats.Stats(prof)
        stats = st.stats
        places, funcs = {}, []
        for (filename, line, name), (_, _, tottime, _, _) in stats.items():
            label = _place(filename)
            places[label] = places.get(label, 0.0) + tottime * 1e3 / steps
            short = name if filename == "~" else "%s:%d(%s)" % (_short(filename), line, name)
            funcs.append((tottime * 1e3 / steps, short))
        funcs.sort(reverse=True)
        out[phase] = ({k: round(v, 4) for k, v in sorted(places.items(), key=lambda kv: -kv[1])}, funcs[:8],
                      st.total_calls / steps)
    return out


def main():
    args = bench_args(__doc__, 300, ("--width", 32), ("--blocks", 2), ("--vocab", 64), ("--tokens", 64),
                      ("--profile", 200, "adapter steps under cProfile"), ("--threads", 1),
                      ("--clock", "cpu", "cpu: the process's CPU time (steadier on a shared machine); wall"),
                      ("--device", "cpu", "cpu, or cuda: both sides on the GPU, synchronized, wall-clock"), mode=True)
    gpu = args.device == "cuda"
    if gpu:
        os.environ.setdefault("MOJO_TRAIN_VENDOR", "cuda")
    import torch
    from mojo_train._native import load
    from _torch_model import NativeLM, TorchLM, batch, torch_optimizer, torch_state_bytes, torch_step
    load(args.mode).lib.mt_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = TorchLM(args.vocab, args.width, args.blocks, numeric_mode=args.mode)
    native = NativeLM(model, device=gpu, numeric_mode=args.mode)
    model = model.to(args.device)
    opt = torch_optimizer(model, numeric_mode=args.mode)
    ids, targets = batch(0, args.vocab, args.tokens, seq=min(64, args.tokens))
    native_ids, native_targets = native._ids(ids), native._ids(targets)
    ids, targets = ids.to(args.device), targets.to(args.device)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    clock = time.process_time if args.clock == "cpu" and not gpu else time.perf_counter
    timed_opt = native.opt = _TimedOptimizer(native.opt, clock)

    def adapter_step():
        torch_step(model, opt, ids, targets)
        sync()

    def native_step():
        native.step(native_ids, native_targets)
        sync()

    adapter_s, native_s = paired_medians([adapter_step, native_step], args.repeat, clock=clock)
    same = torch_state_bytes(model, opt) == native.state_bytes()
    native_opt_s = statistics.median(timed_opt.seconds[-args.repeat:])

    def phases(profiles=None):
        marks = []
        for phase in PHASES:
            if profiles:
                profiles[phase].enable()
            marks.append(clock())
            if phase == "zero_grad":
                opt.zero_grad()
            elif phase == "forward":
                phases.loss = model(ids, targets)
            elif phase == "backward":
                phases.loss.backward()
            else:
                opt.step()
            sync()
            marks.append(clock())
            if profiles:
                profiles[phase].disable()
        return [b - a for a, b in zip(marks[::2], marks[1::2])]

    per_phase = [phases() for _ in range(args.repeat)]
    phase_us = {p: statistics.median(t[k] for t in per_phase) * 1e6 for k, p in enumerate(PHASES)}
    profiles = {p: cProfile.Profile() for p in PHASES}
    for _ in range(args.profile):
        phases(profiles)
    split = profile_split(profiles, args.profile)

    rows = {"device": args.device, "clock": "wall" if clock is time.perf_counter else "cpu", "width": args.width,
            "blocks": args.blocks, "vocab": args.vocab, "tokens": args.tokens,
            "adapter_us": adapter_s * 1e6, "native_us": native_s * 1e6, "ratio": adapter_s / native_s,
            "same_bytes": same, "adapter_phases_us": phase_us,
            "native_phases_us": {"optimizer step": native_opt_s * 1e6,
                                 "forward and backward": (native_s - native_opt_s) * 1e6},
            "profiled_ms_per_step": {p: split[p][0] for p in PHASES},
            "calls_per_step": {p: split[p][2] for p in PHASES}}
    print("training step on %s, width %d, %d blocks, vocab %d, %d tokens, %d thread(s): torch adapter %.0f us, "
          "native API %.0f us (%.2fx); same bytes after the timed steps: %s"
          % (args.device, args.width, args.blocks, args.vocab, args.tokens, args.threads, rows["adapter_us"],
             rows["native_us"], rows["ratio"], same))
    print("adapter phases (us): " + ", ".join("%s %.0f" % kv for kv in phase_us.items()))
    print("native phases (us): optimizer step %.0f, forward and backward %.0f"
          % (native_opt_s * 1e6, (native_s - native_opt_s) * 1e6))
    print("cProfile over %d adapter steps (profiled ms a step: inflated, read as shares):" % args.profile)
    for phase in PHASES:
        places, funcs, calls = split[phase]
        print("  %-9s %d calls a step; %s" % (phase, calls, ", ".join("%s %.3f" % kv for kv in places.items())))
        for ms, name in funcs[:5]:
            print("              %.3f  %s" % (ms, name))
    cpu_record(args, "torch_adapter_cpu", rows, torch)


if __name__ == "__main__":
    main()
