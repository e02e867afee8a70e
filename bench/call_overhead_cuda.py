"""What one small call costs on the host, ours against torch's, on a GPU (the part of every figure
that is not the kernel).

    python bench/call_overhead_cuda.py [--n 4096] [--repeat 400] [--write]

Every figure is the median wall-clock of --repeat calls over n floats (small: the kernels take a
few microseconds, so what is left is the host's part and one round trip to the GPU). Ours
synchronizes before it returns (its status read); torch's calls are followed by
torch.cuda.synchronize(), as in every benchmark here. Figures, in microseconds:
  torch_add          torch.add(x, y) on torch CUDA tensors
  add_fresh          mojo_train.elementwise.add(x, y) on the same torch tensors (a new output)
  add_fresh_device   the same on mojo_train DeviceArrays
  add_out            add(x, y, out=z) (the finiteness pre-pass first: two kernels)
  c_add              the native mt_add alone into a kept output, through cffi (no Python wrapper)
  probe              the Python description of one torch CUDA tensor (_ops.f32_in)
  alloc_free         a DeviceArray of n floats made and dropped (mt_device_alloc / mt_device_free)
  torch_sync         torch.cuda.synchronize() on an idle GPU
  embedding_forward  64 ids into a (1024, 768) table, ours (DeviceArrays) and torch's (torch_...)
  c_embedding_forward   the native mt_embedding_forward alone into a kept output (MT_MAP_OUT_FRESH)
  c_alloc_free       the native mt_device_alloc and mt_device_free of n floats alone (no Python objects)
So add_fresh - c_add is the Python wrapper, c_add - torch_sync the native call's own host time;
alloc_free - c_alloc_free is a DeviceArray's Python part.
The same at 2**--big-log2n floats (default 28, bench/elementwise_cuda.py's size; --big-repeat
calls): big_add (ours through the API, a new output each call), big_add_c (the native call into
a kept output), big_add_torch, big_alloc_free (a DeviceArray of that size made and dropped): what
a large call adds on the host beside its kernel. With deferred refusals on (mojo_train.deferred:
the call queues its kernels, the output's allocation and free do not synchronize; each call then
``mt.synchronize()``): deferred_add_fresh_device, deferred_embedding_forward, deferred_big_add,
deferred_big_alloc_free, deferred_sync (on an idle GPU); and per call of ten queued before one
synchronization (the host's part alone while the GPU is busy): deferred_add_queued10 against
torch_add_queued10, deferred_c_add_queued10 (the native call alone), deferred_alloc_free_queued10.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import cuda_torch, fp, gpu_record, timed  # noqa: E402
from _timing import bench_args  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train import _ops, elementwise as ew  # noqa: E402
from mojo_train._native import ffi, load  # noqa: E402
from mojo_train.embedding import embedding_forward  # noqa: E402


def _profile(call, sync, what, calls=5000):
    """cProfile of `calls` calls of `what` (deferring: queued, so the host's part alone): the top functions."""
    import cProfile
    import pstats
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        call()
    sync()
    prof.disable()
    print("cProfile of %d %s (tottime, then cumtime):" % (calls, what))
    pstats.Stats(prof).sort_stats("tottime").print_stats(22)
    pstats.Stats(prof).sort_stats("cumtime").print_stats(12)


def main():
    args = bench_args(__doc__, 400, ("--n", 4096), ("--big-log2n", 28), ("--big-repeat", 20),
                      ("--cprofile", False, "print a cProfile of deferred small adds and of waiting small "
                                            "embedding forwards (not recorded)"))
    torch = cuda_torch()
    n, r = args.n, args.repeat
    gen = torch.Generator(device="cuda").manual_seed(0)
    x, y = (torch.rand(n, device="cuda", generator=gen) for _ in range(2))
    z = torch.empty_like(x)
    xd, yd = mt.to_device(x.cpu().numpy()), mt.to_device(y.cpu().numpy())
    lib = load("identical", "cuda").lib
    sync = torch.cuda.synchronize
    us = {}
    us["torch_add"] = timed(lambda: torch.add(x, y), r, sync=sync)
    us["add_fresh"] = timed(lambda: ew.add(x, y), r)
    us["add_fresh_device"] = timed(lambda: ew.add(xd, yd), r)
    us["add_out"] = timed(lambda: ew.add(x, y, out=z), r)
    fresh = _ops.map_flags(None)
    us["c_add"] = timed(lambda: lib.mt_add(fp(z), fp(x), fp(y), n, fresh), r)
    us["probe"] = timed(lambda: _ops.f32_in(x, "x", "add"), r)
    us["alloc_free"] = timed(lambda: mt.DeviceArray.empty((n,)), r)
    slot = ffi.new("void **")
    us["c_alloc_free"] = timed(lambda: (lib.mt_device_alloc(slot, 4 * n), lib.mt_device_free(slot[0])), r)
    us["torch_sync"] = timed(sync, r)
    table = torch.rand(1024, 768, device="cuda", generator=gen)
    ids = torch.randint(0, 1024, (64,), device="cuda", generator=gen)
    table_d, ids_d = mt.to_device(table.cpu().numpy()), mt.to_device(ids.cpu().numpy())
    us["embedding_forward"] = timed(lambda: embedding_forward(table_d, ids_d), r)
    kept = mt.DeviceArray((64, 768))
    eargs = (ffi.cast("float *", kept.ptr), ffi.cast("float *", table_d.ptr), ffi.cast("void *", ids_d.ptr), 8, 64,
             1024, 768, fresh)
    us["c_embedding_forward"] = timed(lambda: lib.mt_embedding_forward(*eargs), r)
    us["torch_embedding_forward"] = timed(lambda: torch.nn.functional.embedding(ids, table), r, sync=sync)
    big = 1 << args.big_log2n
    xb, yb = (torch.rand(big, device="cuda", generator=gen) for _ in range(2))
    zb = torch.empty_like(xb)
    rb = args.big_repeat
    us["big_add"] = timed(lambda: ew.add(xb, yb), rb)
    us["big_add_c"] = timed(lambda: lib.mt_add(fp(zb), fp(xb), fp(yb), big, fresh), rb)
    us["big_add_torch"] = timed(lambda: torch.add(xb, yb), rb, sync=sync)
    us["big_alloc_free"] = timed(lambda: mt.DeviceArray.empty((big,)), rb)
    msync = mt.synchronize
    with mt.deferred_refusals():
        us["deferred_add_fresh_device"] = timed(lambda: ew.add(xd, yd), r, sync=msync)
        us["deferred_embedding_forward"] = timed(lambda: embedding_forward(table_d, ids_d), r, sync=msync)
        us["deferred_big_add"] = timed(lambda: ew.add(xb, yb), rb, sync=msync)
        us["deferred_big_alloc_free"] = timed(lambda: mt.DeviceArray.empty((big,)), rb, sync=msync)
        us["deferred_sync"] = timed(msync, r)
        # ten calls queued, then one synchronization: what the host costs when the GPU is busy
        us["deferred_add_queued10"] = timed(lambda: [ew.add(xd, yd) for _ in range(10)], r // 10, sync=msync) / 10
        us["torch_add_queued10"] = timed(lambda: [torch.add(x, y) for _ in range(10)], r // 10, sync=sync) / 10
        us["deferred_c_add_queued10"] = timed(lambda: [lib.mt_add(fp(z), fp(x), fp(y), n, fresh) for _ in range(10)],
                                              r // 10, sync=msync) / 10
        us["deferred_alloc_free_queued10"] = timed(lambda: [mt.DeviceArray.empty((n,)) for _ in range(10)], r // 10,
                                                   sync=msync) / 10
        if args.cprofile:
            _profile(lambda: ew.add(xd, yd), msync, "deferred small adds on DeviceArrays")
    if args.cprofile:
        _profile(lambda: embedding_forward(table_d, ids_d), msync, "waiting small embedding forwards on DeviceArrays")
    us = {k: v * 1e6 for k, v in us.items()}
    assert ew.add(x, y).to_host().tobytes() == (x + y).cpu().numpy().tobytes(), "add differs from torch's"
    print("  ".join("%s %.1f us" % kv for kv in us.items()))
    gpu_record(args, "call_overhead_cuda", {"n": n, "big_n": big, "us": us}, torch)


if __name__ == "__main__":
    main()
