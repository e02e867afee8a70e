"""Every benchmark target of the open issues beside its latest recorded figure, and whether it holds.

    python bench/targets.py [--results bench/results] [--all]

A target is a figure of one benchmark's records (bench/results/<name>.jsonl) bounded by a number
or by another figure of the same record (torch's time in the same process). It HOLDS when the
median over at least three processes -- the records of the latest commit in that file, one per
process -- meets the bound; with fewer it is UNPROVEN (the figure is still shown: torch's own
time moves by a third between processes on the H200, so one process proves nothing); NO RECORD
when no record has the figure. Against another figure, each process's ratio is taken first and
the median is of the ratios. A target named for a GPU ("(H200)" in its words) counts only the
records taken on that GPU (a record's figures name it as "gpu"; a record without the name predates
it and is taken as the H200 all of those ran on): an H100's figures can be written beside them
without standing in for the H200's. Exit status 0 always (this is a report; the issues decide).
``--all`` also lists every process's value.

To give a target three processes, run its benchmark three times with --write at one commit
(e.g. ``for i in 1 2 3; do python bench/embedding_cpu.py --write; done``).
"""
import argparse
import json
import os
import re
import statistics

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROCESSES = 3


class Target:
    """``issue``: where it is asked; ``what``: in words; ``name``: the record file; ``path``: the
    figure (dots between keys, ``list[key=value,...]`` picks a list's element); ``at_most`` or
    ``at_least``: a number, or a path of the same record (times ``factor``)."""

    def __init__(self, issue, what, name, path, at_most=None, at_least=None, factor=1.0, unit="ms"):
        self.issue, self.what, self.name, self.path, self.unit, self.factor = issue, what, name, path, unit, factor
        self.upper = at_most is not None
        self.bound = at_most if self.upper else at_least
        self.gpu = "H200" if re.search(r"\bH200", what) else None


def taken_on(record, gpu):
    """Whether a record counts for a target of ``gpu`` (None: any machine): the record's GPU name
    holds it as a word ("NVIDIA H200", not "NVIDIA GH200")."""
    name = record.get("figures", {}).get("gpu")
    return gpu is None or name is None or re.search(r"\b%s\b" % gpu, str(name)) is not None


T1024, T4096 = "attention[T=1024,B=8,is_causal=True]", "attention[T=4096,B=2,is_causal=True]"
TARGETS = [
    Target("16.1", "linear forward 8192^3, TFLOP/s >= torch's (H200)", "linear_cuda",
           "rows[op=forward,m=8192,n=8192].ours_TFLOPs", at_least="rows[op=forward,m=8192,n=8192].torch_TFLOPs",
           unit="TFLOP/s"),
    Target("16.1", "linear backward 8192x4096x4096 <= torch's time (H200)", "linear_cuda",
           "rows[op=backward,m=8192,n=4096].ours_ms", at_most="rows[op=backward,m=8192,n=4096].torch_ms"),
    Target("16.2", "linear_cross_entropy 8192x768x50304 fwd+bwd <= torch's time (H200)", "lm_head_cuda",
           "ours_ms", at_most="torch_ms"),
    # The issue's "at most 835 MB" (torch "4545") quotes this benchmark's own %.0f print at the time
    # it was written: 835.125 MiB (62e0c80, the file's first record; torch 4544.6). The bound is
    # that figure, so the target asks for no more memory than then, not for 0.125 MiB less.
    Target("16.2", "linear_cross_entropy extra memory (H200)", "lm_head_cuda", "ours_extra_mb", at_most=835.125,
           unit="MB"),
    Target("16.3", "cross_entropy 8192x50304 fwd+bwd (H200)", "loss_cuda", "cross_entropy_8192x50304.ours_ms",
           at_most=1.0),
    Target("16.4", "embedding backward through the API (H200)", "embedding_cuda", "backward.ours_ms", at_most=0.25),
    Target("16.4", "embedding forward <= torch's time (H200)", "embedding_cuda", "forward.ours_ms",
           at_most="forward.torch_ms"),
    Target("16.5", "SiLU 2^28 <= torch's time (H200)", "elementwise_cuda", "elementwise.silu_ms",
           at_most="elementwise.silu_torch_ms"),
    Target("16.5", "add 2^28 <= torch's time (H200)", "elementwise_cuda", "elementwise.add_ms",
           at_most="elementwise.add_torch_ms"),
    Target("16.5", "normal fill <= torch's time (H200)", "random_cuda", "normal.normal_ms",
           at_most="normal.normal_torch_ms"),
    Target("16.6", "RMSNorm 16384x4096 fwd+bwd (H200)", "rms_norm_cuda", "rms_norm_16384x4096.ours_ms", at_most=0.45),
    Target("16.7", "AdamW 100M in one tensor (H200)", "optim_cuda", "adamw_100M_1.ours_ms", at_most=0.85),
    Target("16.7", "AdamW 100M in 200 tensors (H200)", "optim_cuda", "adamw_100M_200.ours_ms", at_most=0.90),
    Target("16.8", "AdamW 10M <= 1.15x torch's fused time (CPU)", "optim_cpu", "large.ours_ms",
           at_most="large.torch_fused_ms", factor=1.15),
    Target("16.8", "RMSNorm 4096x1024 forward <= torch's time (CPU)", "rms_norm_cpu",
           "rms_norm[rows=4096,dim=1024].forward_ms", at_most="rms_norm[rows=4096,dim=1024].torch_forward_ms"),
    Target("16.8", "RMSNorm 4096x1024 fwd+bwd <= torch's time (CPU)", "rms_norm_cpu",
           "rms_norm[rows=4096,dim=1024].fwd_bwd_ms", at_most="rms_norm[rows=4096,dim=1024].torch_fwd_bwd_ms"),
    Target("16.8", "cross_entropy(return_grad=True) 1024x32000 through the API (CPU)", "loss_cpu",
           "cross_entropy.ours_ms", at_most=25),
    Target("16.8", "embedding backward <= torch's time (CPU)", "embedding_cpu", "embedding.backward_ms",
           at_most="embedding.torch_backward_ms"),
    Target("14.4", "attention B=8 H=12 T=1024 D=64 causal fwd+bwd <= torch's efficient (H200)", "attention_cuda",
           T1024 + ".fwd_bwd_ms", at_most=T1024 + ".torch_efficient_ms"),
    Target("14.4", "the same, faster than torch's math backend (a must; H200)", "attention_cuda", T1024 + ".fwd_bwd_ms",
           at_most=T1024 + ".torch_math_ms"),
    Target("14.4", "attention B=2 T=4096 fwd+bwd <= torch's efficient (H200)", "attention_cuda",
           T4096 + ".fwd_bwd_ms", at_most=T4096 + ".torch_efficient_ms"),
    Target("14.4", "LayerNorm 16384x4096 fwd+bwd <= torch's 0.88 ms (H200)", "layer_norm_cuda",
           "layer_norm_16384x4096.ours_ms", at_most=0.88),
    Target("14.4", "GELU 2^28 fwd+bwd <= torch's 2.03 ms (H200)", "elementwise_cuda", "gelu_none.fwd_bwd_ms",
           at_most=2.03),
    Target("14.4", "attention B=1 H=4 T=256 D=64 causal fwd+bwd <= torch's time (CPU)", "attention_cpu",
           "attention[is_causal=True].fwd_bwd_ms", at_most="attention[is_causal=True].torch_fwd_bwd_ms"),
    Target("14.4", "LayerNorm 4096x1024 fwd+bwd <= torch's time (CPU)", "layer_norm_cpu",
           "layer_norm[rows=4096,dim=1024].fwd_bwd_ms", at_most="layer_norm[rows=4096,dim=1024].torch_fwd_bwd_ms"),
    Target("14.4", "GELU fwd+bwd <= torch's time (CPU)", "elementwise_cpu", "gelu[approximate=none].fwd_bwd_vs_torch",
           at_least=1.0, unit="x torch's speed"),
    Target("13.6", "a training step through the torch adapter <= 1.10x the native API's (H200)", "torch_adapter_cuda",
           "adapter_ms", at_most="native_ms", factor=1.10),
    Target("15.6", "reduce_gradients 16M floats, 2 ranks, <= 1.5x gloo's all_reduce (CPU)", "distributed_cpu",
           "one_tensor.ours_ms", at_most="one_tensor.all_reduce_ms", factor=1.5),
    Target("15.6", "reduce_gradients 100M floats, 2 H200s, <= 1.2x NCCL's all_reduce", "distributed_cuda",
           "one_tensor.ours_ms", at_most="one_tensor.all_reduce_ms", factor=1.2),
]

_PICK = re.compile(r"^([^\[\]]+)\[([^\]]*)\]$")


def figure(record, path):
    """The value at ``path`` in a record's figures, or None."""
    node = record.get("figures", {})
    for part in path.split("."):
        match = _PICK.match(part)
        key = match.group(1) if match else part
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
        if match:
            wanted = dict(kv.split("=", 1) for kv in match.group(2).split(","))
            node = next((row for row in node if isinstance(row, dict)
                         and all(str(row.get(k)) == v for k, v in wanted.items())), None)
            if node is None:
                return None
    return node if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def records(results, name):
    path = os.path.join(results, name + ".jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def evaluate(target, results):
    """(status, shown value, bound in words, commit, processes, per-process values)."""
    rows = [r for r in records(results, target.name)
            if figure(r, target.path) is not None and taken_on(r, target.gpu)]
    if not rows:
        return "NO RECORD", None, _bound_words(target), None, 0, []
    commit = rows[-1]["commit"]
    rows = [r for r in rows if r["commit"] == commit]
    values = [figure(r, target.path) for r in rows]
    if isinstance(target.bound, str):
        pairs = [(v, figure(r, target.bound)) for v, r in zip(values, rows)]
        pairs = [(v, b * target.factor) for v, b in pairs if b]
        if not pairs:
            return "NO RECORD", None, _bound_words(target), commit, 0, []
        margins = [v / b for v, b in pairs]
        margin, value = statistics.median(margins), statistics.median(v for v, _ in pairs)
        meets = margin <= 1.0 if target.upper else margin >= 1.0
        shown = "%.4g %s (%.3gx the bound)" % (value, target.unit, margin)
    else:
        value = statistics.median(values)
        meets = value <= target.bound if target.upper else value >= target.bound
        shown = "%.4g %s" % (value, target.unit)
    if len(values) < PROCESSES:
        status = "UNPROVEN (%d process%s; %s)" % (len(values), "es"[:2 * (len(values) != 1)],
                                                   "would hold" if meets else "misses")
    else:
        status = "HOLDS" if meets else "MISSES"
    return status, shown, _bound_words(target), commit, len(values), values


def _bound_words(target):
    word = "<=" if target.upper else ">="
    if isinstance(target.bound, str):
        return "%s %s%s" % (word, "%.2fx " % target.factor if target.factor != 1.0 else "", target.bound.split(".")[-1])
    return "%s %g %s" % (word, target.bound, target.unit)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "results"))
    ap.add_argument("--all", action="store_true", help="also list every process's value")
    args = ap.parse_args()
    counts = {}
    for t in TARGETS:
        status, shown, bound, commit, n, values = evaluate(t, args.results)
        kind = status.split(" (")[0]
        counts[kind] = counts.get(kind, 0) + 1
        print("%-5s %-82s %s" % (t.issue, t.what, status))
        if shown is not None:
            print("      %s: %s, bound %s; commit %s, %s.jsonl"
                  % ("median of %d" % n if n > 1 else "one process", shown, bound, commit, t.name))
            if args.all:
                print("      every process: %s" % ", ".join("%.4g" % v for v in values))
    print("\n" + ", ".join("%d %s" % (n, s) for s, n in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
