"""The chain GEMM's tilings side by side: build bench/gemm_variants.cu once per variant, run them.

    python bench/gemm_variants.py build [--out DIR] [--only NAME,...]   (here: needs nvcc, no GPU)
    python bench/gemm_variants.py run [--out DIR] [--repeat N]          (on the GPU machine)
    python bench/gemm_variants.py torch                                  (torch's cuBLAS, same products)

`build` compiles one small executable per entry of VARIANTS (the -D flags of
native/cuda/mt_gpu_gemm.cuh) into DIR (default native/build/gemm_variants, small enough to carry to
the device, unlike a whole library per variant). `run` runs each on the same eight products (linear
forward 8192^3 and 4096x11008x4096, the backward's da and dweight leaves at 8192x4096x4096, the LM
head's d_hidden and d_weight leaf of one 2048-row chunk at 768 x 50304, two edge shapes) and
prints one table: median ms and TFLOP/s per product, and whether the hash of C's
bytes equals the first variant's on every product. The contract fixes each output's chain, so a
tiling that prints another hash changed bits and is disqualified whatever its speed. A chosen
tiling then goes into the library and must pass the linear card (selfcheck) and the suite.
`torch` times torch's float32 products (TF32 off: cuBLAS's FFMA kernels) at the large shapes, for
the side-by-side figure. Profiles: `ncu --clock-control none --set full -k regex:k_gemm -c 1
DIR/library library 1 kk` (or kr, rr: one product, once); compute-sanitizer: the same executable
with `library 1 sanitize`.
"""
import argparse
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ptx_compare import MODE_FLAGS  # noqa: E402  (the Makefile's nvcc flags of each numeric mode)

VARIANTS = [
    ("library", ""),   # the header's defaults: the reference every other tiling's hashes are compared with
    ("lm_head", "-DMT_GEMM_BK_R=16 -DMT_GEMM_STAGES_R=3"),   # mt_gpu_lm_head.cu's (a test keeps them equal)
    ("epi_vec", "-DMT_GEMM_EPI_SCALAR=0"),   # float4 stores of C: the chains pinned to register quads (HIP's default)
    # seventeenth session, not yet run: with 4-byte stores of C, the tilings that lost before
    ("shape1", "-DMT_GEMM_SHAPE=1"),   # cuBLAS's thread tile, 8 x 16 chains, 128 threads
    ("fwd_bk32_s2", "-DMT_GEMM_BK=32 -DMT_GEMM_STAGES=2"),
    ("fwd_s4", "-DMT_GEMM_STAGES=4"),
]


def nvcc_command(out, flags):
    return ([os.environ.get("NVCC", "nvcc"), "-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90",
             "-Inative/include", "-Inative/common", "-Inative/cuda", "-Xcompiler", "-ffp-contract=off",
             '-DMT_VENDOR_NAME="cuda"', "-Xptxas", "-v"] + MODE_FLAGS["identical"] + flags.split()
            + ["-o", out, "bench/gemm_variants.cu"])


def build(out_dir, only):
    os.makedirs(out_dir, exist_ok=True)
    procs = []
    for name, flags in VARIANTS:
        if only and name not in only:
            continue
        procs.append((name, subprocess.Popen(nvcc_command(os.path.join(out_dir, name), flags), cwd=ROOT,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    failed = 0
    for name, proc in procs:
        log = proc.communicate()[0]
        if proc.returncode:
            failed += 1
            print("%s: build failed\n%s" % (name, log[-3000:]))
            continue
        # ptxas's lines per kernel: registers and spills of the forward's k_gemm<0,0> and of the
        # output-contiguous layouts' <0,2> (da) and <2,2> (dweight), whose tiling may differ
        lines = log.splitlines()
        summary = []
        for kernel, label in (("k_gemmILi0ELi0E", "<0,0>"), ("k_gemmILi0ELi2E", "<0,2>"), ("k_gemmILi2ELi2E", "<2,2>")):
            for i, line in enumerate(lines):
                if kernel in line and "Function properties" in line:
                    props = " ".join(l.split("ptxas info    :")[-1].strip() for l in lines[i + 1:i + 3])
                    spill = re.search(r"(\d+) bytes spill stores", props)
                    regs = re.search(r"Used (\d+) registers", props)
                    summary.append("%s %s regs, %s B spilled" % (label, regs.group(1) if regs else "?",
                                                                  spill.group(1) if spill else "?"))
        print("%-14s built; %s" % (name, "; ".join(summary)))
    return failed


def parse(stdout, name):
    """The harness's lines for variant `name`: one dict per product (shape, lay, slices, ms, tflops, fnv)."""
    rows = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) > 3 and words[0] == name:
            rows.append(dict([("shape", words[1]), ("lay", words[2])] + [kv.split("=", 1) for kv in words[3:]]))
    return rows


def verdict(rows, reference):
    """'same bits' when every product's hash is the reference variant's, in the same products."""
    same = [(r["shape"], r["lay"], r["fnv"]) for r in rows] == [(r["shape"], r["lay"], r["fnv"]) for r in reference]
    return "same bits" if same else "BITS DIFFER"


def run(out_dir, repeat):
    table, reference = [], None
    for name, _ in VARIANTS:
        exe = os.path.join(out_dir, name)
        if not os.path.exists(exe):
            print("%s: not built" % name)
            if reference is None:
                sys.exit("%s (the library's tiling, the reference for every hash) is not built: nothing compared" % name)
            continue
        proc = subprocess.run([exe, name, str(repeat)], capture_output=True, text=True)
        rows = parse(proc.stdout, name)
        if proc.returncode or not rows:
            print("%s: failed (rc %d)\n%s" % (name, proc.returncode, (proc.stdout + proc.stderr)[-2000:]))
            if reference is None:   # no other tiling may stand in for the library's own
                sys.exit("%s (the library's tiling, the reference for every hash) failed: nothing compared" % name)
            continue
        if reference is None:
            reference = rows
            print("reference hashes (%s): %s" % (name, " ".join(r["fnv"] for r in rows)))
        same = verdict(rows, reference)
        table.append((name, same, rows))
        print("%-14s %-11s %s" % (name, same, "  ".join("%s %s %s ms %s TF/s" % (r["shape"], r["lay"], r["ms"], r["tflops"])
                                                        for r in rows)), flush=True)
    return table


def torch_times(repeat):
    """torch's float32 products at the harness's large shapes: median of `repeat` event-timed calls."""
    import torch
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)

    def rand(*shape):
        return torch.rand(*shape, device="cuda", generator=g) * 2 - 1

    a, w, a2, w2 = rand(8192, 8192), rand(8192, 8192), rand(4096, 4096), rand(11008, 4096)
    dc, w3, a3 = rand(8192, 4096), rand(4096, 4096), rand(8192, 4096)
    for name, fn, m, n, k in (("8192x8192x8192 forward", lambda: F.linear(a, w), 8192, 8192, 8192),
                              ("4096x11008x4096 forward", lambda: F.linear(a2, w2), 4096, 11008, 4096),
                              ("8192x4096x4096 da (dc @ w)", lambda: dc @ w3, 8192, 4096, 4096),
                              ("4096x4096x8192 dweight (dc.T @ a)", lambda: dc.t() @ a3, 4096, 4096, 8192)):
        for _ in range(3):
            fn()
        ms = []
        for _ in range(repeat):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            ms.append(start.elapsed_time(end))
        med = sorted(ms)[len(ms) // 2]
        print("torch %-34s ms=%.4f tflops=%.2f" % (name, med, 2.0 * m * n * k / (med * 1e-3) / 1e12), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["build", "run", "torch"])
    ap.add_argument("--out", default=os.path.join(ROOT, "native", "build", "gemm_variants"))
    ap.add_argument("--only", default="", help="comma-separated variant names (build)")
    ap.add_argument("--repeat", type=int, default=10)
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)   # nvcc runs in the repository root, the variants where we are
    if args.what == "build":
        sys.exit(1 if build(args.out, [n for n in args.only.split(",") if n]) else 0)
    if args.what == "torch":
        torch_times(args.repeat)
        return
    run(args.out, args.repeat)


if __name__ == "__main__":
    main()
