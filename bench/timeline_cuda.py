"""Where a multi-kernel call's wall time goes on the GPU: the union of every kernel's interval on
every stream (torch.profiler's CUPTI trace sees ours too), the idle gaps between them with the
kernels on either side, and each kernel's busy time per stream.

    python bench/timeline_cuda.py [--cases lm_head,linear_backward] [--repeat N]

bench/profile_cuda.py sums kernel times, which counts twice what two streams run at once (the LM
head's d_hidden beside its weight gradient); this one takes the union. A call's wall time minus
its busy time is time no kernel ran: host work before the first launch, synchronizations inside
the call and their round trips, the final read-back. Prints a table; records nothing.
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import cuda_torch, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

import mojo_train as mt  # noqa: E402


def _lm_head(torch):
    r, w, v = 8192, 768, 50304
    g = torch.Generator(device="cuda").manual_seed(0)
    h = torch.randn(r, w, device="cuda", generator=g)
    wt = torch.randn(v, w, device="cuda", generator=g) * 0.02
    t = torch.randint(0, v, (r,), device="cuda", generator=g)
    return lambda: mt.linear_cross_entropy(h, wt, t, return_grad=True, numeric_mode="identical")


def _linear_backward(torch):
    from mojo_train.linear import linear_backward
    m, k, n = 8192, 4096, 4096
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m, k, device="cuda", generator=g)
    wt = torch.randn(n, k, device="cuda", generator=g)
    dy = torch.randn(m, n, device="cuda", generator=g)
    return lambda: linear_backward(dy, x, wt, numeric_mode="identical")


CASES = {"lm_head": _lm_head, "linear_backward": _linear_backward}


def kernels_of(torch, fn):
    """[(start_us, end_us, stream, name)] of every GPU kernel, memset and copy of one call of fn,
    and the call's wall interval (first CPU event to the last GPU end)."""
    from torch.profiler import ProfilerActivity
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    path = tempfile.mktemp(suffix=".json")
    prof.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    os.unlink(path)
    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e.get("args", {}).get("stream", -1), e["name"])
           for e in ev if e.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    cpu = [float(e["ts"]) for e in ev if e.get("cat") in ("cpu_op", "python_function", "user_annotation")]
    t0 = min(cpu + [g[0] for g in gpu]) if gpu else 0.0
    return sorted(gpu), t0


def report(name, gpu, t0, wall_us):
    if not gpu:
        print("%s: no GPU events in the trace" % name)
        return
    busy, gaps, end = 0.0, [], t0
    prev = "(call start)"
    for s, e, _, k in gpu:
        if s > end:
            gaps.append((s - end, end - t0, prev, k))
        if e > end:
            busy += e - max(s, end)
            end = e
            prev = k
    span = end - t0
    print("%s: timed wall %.1f us a call; traced call %.1f us, GPU busy %.1f us (%.1f%%), idle %.1f us"
          % (name, wall_us, span, busy, 100 * busy / span, span - busy))
    print("  largest gaps (us at, length, after -> before):")
    for length, at, a, b in sorted(gaps, reverse=True)[:12]:
        print("    at %9.1f  %8.1f us  %s -> %s" % (at, length, a[:60], b[:60]))
    per = {}
    for s, e, st, k in gpu:
        key = (st, k[:90])
        c = per.setdefault(key, [0, 0.0])
        c[0] += 1
        c[1] += e - s
    print("  busy by stream and kernel (count, us):")
    for (st, k), (c, us) in sorted(per.items(), key=lambda kv: -kv[1][1])[:16]:
        print("    stream %-4s %4d x %10.1f us  %s" % (st, c, us, k))


def main():
    args = bench_args(__doc__, 5, ("--cases", ",".join(CASES)))
    torch = cuda_torch()
    for name in args.cases.split(","):
        fn = CASES[name](torch)
        fn()
        torch.cuda.synchronize()
        wall = timed(fn, args.repeat, warmup=1, sync=torch.cuda.synchronize)
        gpu, t0 = kernels_of(torch, fn)
        report(name, gpu, t0, wall * 1e6)
        del fn
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
