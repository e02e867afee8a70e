"""Data-parallel gradient reduction on GPUs over NCCL: ours against NCCL's all_reduce.

    python bench/distributed_cuda.py [--elements 104857600] [--world 2] [--repeat 9] [--mode identical] [--write]

What it measures (issue 15 point 6): ``--world`` processes spawned by this script, each on its
own GPU (``CUDA_VISIBLE_DEVICES``: the library's device 0; NVLink multicast off,
``NCCL_NVLS_ENABLE=0``), in one NCCL group, each holding ``--elements`` float32 gradients in
one CUDA tensor (100M: 400 MB, a DDP bucket or a flat gradient buffer), reduce them by
``mojo_train.distributed.reduce_gradients`` (the batched transport: whole shards exchanged by
``batch_isend_irecv``, the combine in rank order by the GPU library's ``mt_accumulate``, the
outcome agreed, the combined shards gathered; every rank sends 2 (N-1)/N of the bytes) and by
``torch.distributed.all_reduce`` (NCCL's sum, in an order of its choosing) of the same bytes,
in the same processes, alternated (each repeat: the buffers reset outside the timing, a
barrier and a device synchronization, then the call up to a device synchronization). Figures:
medians of rank 0's wall-clock (ms), ``ratio`` = ours / all_reduce (the bound: 1.2x), and
``same_bits`` (two ranks: a + b rounds once in either order, so ours must equal NCCL's sum).

Prediction, written before any run (no machine with two GPUs has been lent yet): NCCL's
all_reduce of 400 MB over NVLink between two H200s ~1.5-2.5 ms (a ring's 2 (N-1)/N of the
bytes at ~300-400 GB/s bus bandwidth); ours moves the same bytes point to point (~0.6-0.9 ms
each way), the combine reads 400 MB and writes 200 MB (~0.15 ms), and each of the two
agreements is a 512-byte all_gather read back to the host (~50-100 us each) plus a host
synchronization before the combine: ratio ~1.0-1.3.
"""
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import bench_args, worker_figures  # noqa: E402
from _gpu import gpu_record  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def worker(args):
    import torch
    import torch.distributed as dist
    from mojo_train import distributed as D
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="file://" + args.rendezvous, rank=args.rank, world_size=args.world,
                            timeout=datetime.timedelta(seconds=240))
    n, world = args.elements, args.world
    tokens = 1024 * world
    gen = torch.Generator().manual_seed(args.rank)
    original = torch.randn(n, generator=gen).cuda()
    ours, theirs = original.clone(), original.clone()

    def timed(call, target):
        target.copy_(original)
        torch.cuda.synchronize()
        dist.barrier()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    reduce = lambda: D.reduce_gradients(ours, tokens, numeric_mode=args.mode)  # noqa: E731
    all_reduce = lambda: dist.all_reduce(theirs)  # noqa: E731
    for _ in range(2):                                      # warm-up: connections, scratch, caches
        timed(reduce, ours)
        timed(all_reduce, theirs)
    times = {"ours": [], "all_reduce": []}
    for _ in range(args.repeat):
        times["ours"].append(timed(reduce, ours))
        times["all_reduce"].append(timed(all_reduce, theirs))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    figures = {"one_tensor": {"ours_ms": med["ours"], "all_reduce_ms": med["all_reduce"],
                              "ratio": med["ours"] / med["all_reduce"]}}
    if world == 2:
        figures["one_tensor"]["same_bits"] = bool(torch.equal(ours.view(torch.int32), theirs.view(torch.int32)))
    if args.rank == 0:
        figures["gpu"] = torch.cuda.get_device_name()
        with open(args.out, "w") as f:
            json.dump(figures, f)
    dist.destroy_process_group()


def main():
    args = bench_args(__doc__, 9, ("--elements", 100 * 2 ** 20), ("--world", 2),
                      ("--rank", -1, "internal: the worker's rank"), ("--rendezvous", "", "internal"),
                      ("--out", "", "internal"), mode=True)
    if args.rank >= 0:
        return worker(args)
    import torch
    if torch.cuda.device_count() < args.world:
        sys.exit("this machine has %d CUDA GPUs for torch; --world %d needs one a rank"
                 % (torch.cuda.device_count(), args.world))
    with tempfile.TemporaryDirectory(prefix="mt_bench_nccl_") as tmp:
        out, rendezvous = os.path.join(tmp, "figures.json"), os.path.join(tmp, "rendezvous")
        common = ["--elements", str(args.elements), "--world", str(args.world), "--repeat", str(args.repeat),
                  "--mode", args.mode, "--rendezvous", rendezvous, "--out", out]
        mask = os.environ.get("CUDA_VISIBLE_DEVICES")
        gpus = mask.split(",") if mask else [str(i) for i in range(torch.cuda.device_count())]
        envs = [dict(os.environ, MOJO_TRAIN_VENDOR="cuda", CUDA_VISIBLE_DEVICES=gpus[r], NCCL_NVLS_ENABLE="0",
                     PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
                for r in range(args.world)]          # each worker sees its own GPU as its device 0
        figures = worker_figures(os.path.abspath(__file__), envs, common, out)
    figures = dict({"elements": args.elements, "world": args.world, "mode": args.mode}, **figures)
    print(json.dumps(figures, indent=1))
    if figures["one_tensor"].get("same_bits") is False:    # not a timing: the two results differ
        sys.exit("reduce_gradients and all_reduce gave different bits for 2 ranks; nothing recorded")
    gpu_record(args, "distributed_cuda", figures, torch)


if __name__ == "__main__":
    main()
