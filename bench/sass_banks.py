"""Register-bank conflicts of the chain GEMM's FFMA, counted from its SASS (no GPU needed).

    python bench/sass_banks.py [-DMT_GEMM_...=V ...]

Compiles bench/gemm_variants.cu to a cubin for sm_90 with the identical mode's flags (the
Makefile's, from ptx_compare.MODE_FLAGS) plus the given -D flags, disassembles it with nvdisasm
(`pip install nvidia-cuda-nvdisasm`, or CUDA's own on PATH), and prints, for each k_gemm<KA, KB>
kernel, its two largest loops: instructions, FFMA, and the FFMA whose three source registers
lie in one bank (register number mod 2). cuBLAS's FFMA kernel has none; fewer of them went with
half the dispatch stalls and 4% more speed on the H200 (sixteenth session, bench/results/NOTES.md),
though it is a proxy, not a measured per-instruction cause. Reuse flags are not counted as
relief: the count that tracked speed there ignores them.
"""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
_LABEL = re.compile(r"^\.L_x_(\d+):")
_KERNEL = re.compile(r"^\.text\.(\S+):")


def kernels(sass):
    """{mangled name: ([(address, instruction)], {label: address})} of nvdisasm's text."""
    out, name = {}, None
    pending = []
    for line in sass.splitlines():
        m = _KERNEL.match(line)
        if m:
            name, pending = m.group(1), []
            out[name] = ([], {})
            continue
        if name is None:
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m:
            addr = int(m.group(1), 16)
            out[name][0].append((addr, m.group(2)))
            for label in pending:
                out[name][1][label] = addr
            pending = []
    return out


def loops(instrs, labels):
    """The kernel's loops (a branch back to a label at or before it), largest FFMA count first:
    [(ffma, instructions)]."""
    found = []
    for addr, text in instrs:
        m = re.search(r"BRA\b.*\.L_x_(\d+)", text)
        if m and m.group(1) in labels and labels[m.group(1)] <= addr:
            seg = [t for a, t in instrs if labels[m.group(1)] <= a <= addr]
            found.append((sum(t.startswith("FFMA") for t in seg), seg))
    return sorted(found, key=lambda x: (-x[0], len(x[1])))


def same_bank(text):
    """True for an FFMA whose three source registers are all even or all odd."""
    if not text.startswith("FFMA"):
        return False
    regs = [int(r) for r in re.findall(r"-?\|?R(\d+)", text.split(None, 1)[1].split(",", 1)[1])]
    return len(regs) == 3 and len({r % 2 for r in regs}) == 1


def nvdisasm():
    found = shutil.which("nvdisasm")
    if found:
        return found
    try:
        import nvidia  # the pip package nvidia-cuda-nvdisasm installs nvidia/cu*/bin/nvdisasm
        for base in nvidia.__path__:
            hits = glob.glob(os.path.join(base, "cu*", "bin", "nvdisasm"))
            if hits:
                return hits[0]
    except ImportError:
        pass
    sys.exit("sass_banks: no nvdisasm (pip install nvidia-cuda-nvdisasm, or put CUDA's bin on PATH)")


def main(flags):
    from ptx_compare import MODE_FLAGS
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "gemm.cubin")
        subprocess.run([os.environ.get("NVCC", "nvcc"), "-O3", "-std=c++17", "-gencode", "arch=compute_90,code=sm_90",
                        "-Inative/include", "-Inative/common", "-Inative/cuda", "-Xcompiler", "-ffp-contract=off",
                        '-DMT_VENDOR_NAME="cuda"'] + MODE_FLAGS["identical"] + flags
                       + ["-cubin", "-o", cubin, "bench/gemm_variants.cu"], cwd=ROOT, check=True)
        sass = subprocess.run([nvdisasm(), "-c", cubin], check=True, capture_output=True, text=True).stdout
    for name, (instrs, labels) in sorted(kernels(sass).items()):
        m = re.search(r"k_gemmILi(\d)ELi(\d)E", name)
        if not m:
            continue
        rows = ["%d instructions, %d FFMA, %d same-bank" % (len(seg), ffma, sum(map(same_bank, seg)))
                for ffma, seg in loops(instrs, labels)[:2]]
        print("k_gemm<%s, %s>: %s" % (m.group(1), m.group(2), " | ".join(rows)))


if __name__ == "__main__":
    main(sys.argv[1:])
