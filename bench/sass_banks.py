"""Register-bank conflicts of the chain GEMM's FFMA, counted from its SASS (no GPU needed), and
the dispatch stalls of ncu's per-instruction table beside them.

    python bench/sass_banks.py [-DMT_GEMM_...=V ...]
    python bench/sass_banks.py --ncu TABLE.csv [TABLE.csv ...]

The first compiles bench/gemm_variants.cu to a cubin for sm_90 with bench/gemm_variants.py's
nvcc command (the identical mode's flags) plus the given -D flags, disassembles it with nvdisasm
(`pip install nvidia-cuda-nvdisasm`, or CUDA's own on PATH), and prints, for each k_gemm<KA, KB>
kernel, its two largest loops: instructions, FFMA, and the FFMA whose three source registers
lie in one bank (register number mod 2). cuBLAS's FFMA kernel has none; fewer of them went with
half the dispatch stalls and 4% more speed on the H200 (sixteenth session, bench/results/NOTES.md),
though it is a proxy, not a measured per-instruction cause. Reuse flags are not counted as
relief: the count that tracked speed there ignores them.

The second reads tables written by `ncu --import R.ncu-rep --page source --csv --print-source
sass` (R from `ncu --set full -k regex:k_gemm -c 1 ...`, see gemm_variants.py) and prints, over
the hot instructions (executed at least half as often as the most executed one: the steady
loop), the share of each warp-stall reason, and the dispatch stalls per FFMA of the same-bank
FFMA against the others (ncu's text drops reuse flags; the bank rule is the same).
"""
import csv
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


def ncu_table(path):
    """[(instruction, times executed, {stall reason: samples})] of one ncu source table."""
    rows = list(csv.reader(open(path)))
    head = {name: i for i, name in enumerate(rows[1])}
    number = lambda x: float(x.replace(",", "") or 0)   # noqa: E731
    stalls = [h for h in rows[1] if h.startswith("stall_") and "Not Issued" not in h]
    return [(r[head["Source"]].strip(), number(r[head["Instructions Executed"]]),
             {h[6:]: number(r[head[h]]) for h in stalls}) for r in rows[2:] if len(r) >= len(head)]


def ncu_summary(table):
    """(stall shares of the hot instructions, dispatch samples per same-bank FFMA, per other FFMA)."""
    most = max(executed for _, executed, _ in table)
    hot = [(text, stalls) for text, executed, stalls in table if executed >= 0.5 * most]
    total = {}
    for _, stalls in hot:
        for reason, samples in stalls.items():
            total[reason] = total.get(reason, 0.0) + samples
    whole = sum(total.values()) or 1.0
    per = {True: [0, 0.0], False: [0, 0.0]}
    for text, stalls in hot:
        if text.startswith("FFMA"):
            per[same_bank(text)][0] += 1
            per[same_bank(text)][1] += stalls.get("dispatch", 0.0)
    shares = sorted(((100 * v / whole, k) for k, v in total.items()), reverse=True)
    return shares, [(n, d / n if n else 0.0) for n, d in (per[True], per[False])]


def compile_and_count(flags):
    from gemm_variants import nvcc_command
    with tempfile.TemporaryDirectory() as tmp:
        cubin = os.path.join(tmp, "gemm.cubin")
        command = nvcc_command(cubin, " ".join(flags))
        subprocess.run(command[:-3] + ["-cubin"] + command[-3:], cwd=ROOT, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        sass = subprocess.run([nvdisasm(), "-c", cubin], check=True, capture_output=True, text=True).stdout
    for name, (instrs, labels) in sorted(kernels(sass).items()):
        m = re.search(r"k_gemmILi(\d)ELi(\d)E", name)
        if not m:
            continue
        rows = ["%d instructions, %d FFMA, %d same-bank" % (len(seg), ffma, sum(map(same_bank, seg)))
                for ffma, seg in loops(instrs, labels)[:2]]
        print("k_gemm<%s, %s>: %s" % (m.group(1), m.group(2), " | ".join(rows)))


def main(argv):
    if argv[:1] == ["--ncu"]:
        for path in argv[1:]:
            shares, ((n3, d3), (n2, d2)) = ncu_summary(ncu_table(path))
            print("%s\n  stalls: %s\n  dispatch a sample unit: same-bank FFMA %.1f (%d), others %.1f (%d)"
                  % (path, ", ".join("%s %.1f%%" % (k, v) for v, k in shares[:8]), d3, n3, d2, n2))
        return
    compile_and_count(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
