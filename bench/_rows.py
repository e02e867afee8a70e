"""Shared by the row-norm benchmarks (bench/rms_norm_*.py, bench/layer_norm_*.py): the shapes, the
figures of one shape, their report line and the record, on the CPU (ours and torch's timed in
alternation, bench/linear_cpu.py's paired_medians) and on a GPU (bench/_gpu.py's timing loop,
16384 x 4096). Each benchmark keeps only what is its own: its inputs and the calls it times."""
from _gpu import copy_bandwidth, gpu_record, timed
from _timing import bench_args, cpu_record, cpu_torch
from linear_cpu import paired_medians

from mojo_train import _native

CPU_SHAPES = [(4096, 1024), (1024, 4096), (16384, 256)]
GPU_SHAPE = (16384, 4096)


def cpu_figures(rows, dim, fns, repeat, prepass=True):
    """Figures of fns = (ours forward, torch's forward, ours forward+backward, torch's), timed in
    alternation; the finiteness pre-pass's bytes (x forward; dy and x backward) as prepass_MB
    (0 with prepass=False: the check rides along with the pass that writes)."""
    fwd, tfwd, both, tboth = paired_medians(fns, repeat)
    return {"rows": rows, "dim": dim, "forward_ms": fwd * 1e3, "torch_forward_ms": tfwd * 1e3,
            "forward_vs_torch": tfwd / fwd, "fwd_bwd_ms": both * 1e3, "torch_fwd_bwd_ms": tboth * 1e3,
            "fwd_bwd_vs_torch": tboth / both,
            "prepass_MB": {"forward": 4 * rows * dim / 1e6 * prepass, "backward": 8 * rows * dim / 1e6 * prepass}}


def cpu_main(doc, op, bench):
    """The command line of a CPU benchmark of op ("rms_norm"): bench(rows, dim, repeat, mode) at
    every CPU_SHAPES shape, printed, recorded (--write) to bench/results/<op>_cpu.jsonl."""
    args = bench_args(doc, 15, mode=True)
    torch, _ = cpu_torch(args.mode)
    figures = [bench(r, d, args.repeat, args.mode) for r, d in CPU_SHAPES]
    for r in figures:
        print("%s %5d x %4d: forward %.3f ms (torch %.3f) = %.2fx torch; forward+backward %.3f ms "
              "(torch %.3f) = %.2fx" % (op, r["rows"], r["dim"], r["forward_ms"], r["torch_forward_ms"],
                                        r["forward_vs_torch"], r["fwd_bwd_ms"], r["torch_fwd_bwd_ms"],
                                        r["fwd_bwd_vs_torch"]))
    cpu_record(args, op + "_cpu", {op: figures}, torch)


def gpu_figures(torch, rows, dim, ours_forward, ours_backward, theirs, repeat, bw):
    """Figures of ours (forward, backward, both) and torch's forward+backward, each the median of
    repeat synchronized calls; bytes: the least any implementation moves (20 N D: forward reads x,
    writes y; backward reads dy and x, writes dx) and ours (28 N D: the parameter gradients' leaves
    read dy and x once more), against the copy bandwidth bw."""
    def ours():
        ours_forward()
        ours_backward()

    torch.cuda.synchronize()
    t_f, t_b, t_ours = timed(ours_forward, repeat), timed(ours_backward, repeat), timed(ours, repeat)
    t_theirs = timed(theirs, repeat, sync=torch.cuda.synchronize)
    least, moved = 20 * rows * dim, 28 * rows * dim
    return {"rows": rows, "dim": dim, "ours_ms": t_ours * 1e3, "ours_forward_ms": t_f * 1e3,
            "ours_backward_ms": t_b * 1e3, "torch_ms": t_theirs * 1e3, "ratio": t_ours / t_theirs,
            "least_bytes": least, "ours_bytes": moved, "floor_ms": least / bw * 1e3,
            "ours_of_copy_bw": moved / t_ours / bw, "torch_of_copy_bw": least / t_theirs / bw}


def gpu_report(op, what, r):
    """One line of a GPU figure; what names the parameters ("weight, dweight")."""
    print("%s %dx%d fwd+bwd (%s): ours %.3f ms (fwd %.3f + bwd %.3f; %.0f%% of copy bw for %.2f GB moved), "
          "torch %.3f ms, ratio %.2f; floor %.3f ms for the least %.2f GB"
          % (op, r["rows"], r["dim"], what, r["ours_ms"], r["ours_forward_ms"], r["ours_backward_ms"],
             100 * r["ours_of_copy_bw"], r["ours_bytes"] / 1e9, r["torch_ms"], r["ratio"], r["floor_ms"],
             r["least_bytes"] / 1e9))


def gpu_main(doc, op, what, bench):
    """The command line of a GPU benchmark of op: bench(torch, gpu, rows, dim, repeat, bw) at
    GPU_SHAPE (or --rows of its width) on the identical CUDA library, printed, recorded (--write) to <op>_cuda.jsonl."""
    args = bench_args(doc, 20, ("--rows", GPU_SHAPE[0], "rows (the record's key names the shape)"))
    import torch
    gpu = _native.load("identical", "cuda")
    bw = copy_bandwidth(torch)
    print("copy bandwidth %.2f TB/s (read + write)" % (bw / 1e12))
    rows, dim = args.rows, GPU_SHAPE[1]
    row = bench(torch, gpu, rows, dim, max(args.repeat, 10), bw)
    gpu_report(op, what, row)
    gpu_record(args, op + "_cuda", {"copy_TBps": bw / 1e12, "%s_%dx%d" % (op, rows, dim): row}, torch)
