"""Data-parallel gradient reduction on the CPU over gloo: ours against gloo's all_reduce.

    python bench/distributed_cpu.py [--elements 16777216] [--world 2] [--tensors 64] [--threads 1]
                                    [--repeat 9] [--mode identical] [--write]

What it measures: ``--world`` gloo processes on this machine (spawned by this script, a file
rendezvous), each holding ``--elements`` float32 gradients (16M: 64 MB), reduce them by
``mojo_train.distributed.reduce_gradients`` (the exchange of shards, the combine in rank order by
accumulate_grads, the gather: every rank sends 2 (N-1)/N of the bytes) and by
``torch.distributed.all_reduce`` (gloo's own sum, in an order of its choosing) of the same bytes,
in the same processes, timed in alternation (each repeat: both buffers reset to the rank's
gradients outside the timing, a barrier, the call). Two layouts: ``one tensor`` (read and written
in place: a DDP bucket or a flat gradient buffer) and ``--tensors`` separate tensors of the same
total (packed into one flat copy and back; gloo's all_reduce still gets one flat tensor: what DDP's
buckets give it). Figures: medians of rank 0's wall-clock (ms) and ``ratio`` = ours / all_reduce
(issue 15's bound on CPU: 1.5x); ``same_bits`` (two ranks only): ours equals gloo's sum bit for bit,
as it must for two ranks (one rounding of a + b either way).

Prediction, written before the first run (2 cores, loaded by other sessions, 1 thread a rank):
from probes of the collectives alone, gloo all_reduce of 64 MB 150-220 ms, our exchange and
gather as point-to-point messages 75-85 ms each, the combine of two 32 MB halves ~25 ms (warm
output 10 ms; a fresh output's page faults cost the rest), the received half another ~15 ms of
page faults: ours ~200 ms, ratio 1.0-1.3 for one tensor; the packed layout adds a 64 MB copy
each way and a fresh flat buffer, ratio 1.2-1.6.

Outcome (three runs with --write, 15 repeats each, 2026-12-02; the machine shared with other
sessions, load average 200 to 870 during the runs, so wall-clock figures are inflated and the
process CPU times are given beside them):
- one tensor (16M floats, read and written in place): ours 246-306 ms, all_reduce 238-281 ms,
  ratio 1.03-1.10 (CPU time 0.97-1.05): within issue 15's 1.5x. Same bits as gloo's sum: yes.
- 64 tensors: ours 417-437 ms; against gloo's all_reduce of a flat buffer already packed,
  1.61-2.08x (CPU 1.47-1.71): ours packs the tensors into one flat buffer and unpacks it (two
  64 MB copies); against the same all_reduce with the copies DDP's buckets make, 0.96-1.37x
  (CPU 0.91-1.00). Gradients kept in one flat buffer (views of it) take the one-tensor path.
- What the prediction missed: the first version (accumulate_grads on the whole shard after the
  whole exchange, fresh buffers every call, shards as single messages) measured 2.3x (one
  tensor) and 5.5x (64 tensors). A fresh 32 MB buffer costs 15-20 ms of page faults, and
  accumulate_grads per call probes its torch arguments through DLPack and returns a new array;
  keeping the scratch between calls and calling mt_accumulate on 4 MB pieces as they arrive
  (into the scratch) gave the figures above.
"""
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, cpu_record, worker_figures  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _time(dist, reset, call, repeat, warmup=2):
    """(wall seconds, process CPU seconds) of each ``call()`` after ``reset()`` and a barrier
    (reset outside the timing). The CPU time counts every thread of the process, gloo's too, and
    the kernel's copies of the loopback transport; a rank waiting for its peer spends none."""
    times = []
    for k in range(warmup + repeat):
        reset()
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        call()
        if k >= warmup:
            times.append((time.perf_counter() - t0, time.process_time() - c0))
    return times


def _layout(dist, D, grads, originals, flat_for_gloo, tokens, repeat, mode):
    """Times per repeat, alternated: ours on ``grads``; gloo's all_reduce of ``flat_for_gloo``
    holding the same values; and, for several tensors, gloo's all_reduce with the copies into one
    flat buffer and back that DDP's buckets make ("bucketed")."""
    times = {"ours": [], "all_reduce": [], "bucketed": []}

    def reset():
        for g, o in zip(grads, originals):
            g.copy_(o)
        offset = 0
        for o in originals:
            flat_for_gloo[offset:offset + o.numel()].copy_(o.reshape(-1))
            offset += o.numel()

    def bucketed():
        views = flat_for_gloo.split([g.numel() for g in grads])
        for v, g in zip(views, grads):
            v.copy_(g.reshape(-1))
        dist.all_reduce(flat_for_gloo)
        for v, g in zip(views, grads):
            g.copy_(v.view_as(g))
    for _ in range(repeat):
        times["ours"] += _time(dist, reset, lambda: D.reduce_gradients(grads, tokens, numeric_mode=mode), 1, 0)
        times["all_reduce"] += _time(dist, reset, lambda: dist.all_reduce(flat_for_gloo), 1, 0)
        if len(grads) > 1:
            times["bucketed"] += _time(dist, reset, bucketed, 1, 0)
    return times


def worker(args):
    import torch
    import torch.distributed as dist
    from mojo_train import distributed as D
    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method="file://" + args.rendezvous, rank=args.rank, world_size=args.world)
    n, world, rank = args.elements, args.world, args.rank
    tokens = 1024 * world
    gen = torch.Generator().manual_seed(rank)
    one = torch.randn(n, generator=gen)
    flat = torch.empty(n)
    figures = {}
    # warm-up of both, untimed (first touches of every buffer, gloo's connections)
    _time(dist, lambda: None, lambda: D.reduce_gradients([one.clone()], tokens, numeric_mode=args.mode), 1, 1)
    figures["one_tensor"] = _figures(_layout(dist, D, [one], [one.clone()], flat, tokens, args.repeat, args.mode))
    if world == 2:                      # a + b rounds once whichever order: the bits must agree
        mine = one.clone()
        D.reduce_gradients([mine], tokens, numeric_mode=args.mode)
        flat.copy_(one)
        dist.all_reduce(flat)
        figures["one_tensor"]["same_bits"] = bool(torch.equal(mine.view(torch.int32), flat.view(torch.int32)))
    sizes = [n // args.tensors + (1 if k < n % args.tensors else 0) for k in range(args.tensors)]
    pieces = [p.clone() for p in one.split(sizes)]      # separate allocations: not end to end
    figures["%d_tensors" % args.tensors] = _figures(_layout(dist, D, pieces, [p.clone() for p in pieces], flat,
                                                            tokens, args.repeat, args.mode))
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(figures, f)
    dist.destroy_process_group()


def _figures(times):
    """Medians (ms) by wall clock and by process CPU time (``cpu_``), and ``ratio``: ours over
    all_reduce (``bucketed_ratio``: over the bucketed all_reduce)."""
    out = {}
    for clock, i in (("", 0), ("cpu_", 1)):
        med = {k: statistics.median(t[i] for t in v) for k, v in times.items() if v}
        out.update({clock + k + "_ms": m * 1e3 for k, m in med.items()})
        out[clock + "ratio"] = med["ours"] / med["all_reduce"]
        if "bucketed" in med:
            out[clock + "bucketed_ratio"] = med["ours"] / med["bucketed"]
    return out


def main():
    args = bench_args(__doc__, 9, ("--elements", 16 * 2 ** 20), ("--world", 2), ("--tensors", 64),
                      ("--threads", 1, "threads a rank (torch's and mojo_train's pool)"),
                      ("--rank", -1, "internal: the worker's rank"), ("--rendezvous", "", "internal"),
                      ("--out", "", "internal"), mode=True)
    if args.rank >= 0:
        return worker(args)
    import torch
    with tempfile.TemporaryDirectory(prefix="mt_bench_distributed_") as tmp:
        out, rendezvous = os.path.join(tmp, "figures.json"), os.path.join(tmp, "rendezvous")
        env = dict(os.environ, MOJO_TRAIN_NUM_THREADS=str(args.threads), OMP_NUM_THREADS=str(args.threads),
                   PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
        common = ["--elements", str(args.elements), "--world", str(args.world), "--tensors", str(args.tensors),
                  "--threads", str(args.threads), "--repeat", str(args.repeat), "--mode", args.mode,
                  "--rendezvous", rendezvous, "--out", out]
        figures = worker_figures(os.path.abspath(__file__), [env] * args.world, common, out)
    figures = dict({"elements": args.elements, "world": args.world, "tensors": args.tensors}, **figures)
    print(json.dumps(figures, indent=1))
    torch.set_num_threads(args.threads)
    cpu_record(args, "distributed_cpu", figures, torch)


if __name__ == "__main__":
    main()
