"""Whether two commits compile to the same CUDA device code, file by file (no GPU needed).

    python bench/ptx_compare.py <commit> [<other commit, default: the working tree>] [--mode identical] [--kernels]
    python bench/ptx_compare.py <commit> [<other>] [--mode identical] --sass

Each native/cuda/*.cu is compiled to PTX (compute_90) with the numeric mode's nvcc flags of the
Makefile, each side's native/ placed in turn at one temporary path and compiled twice, and the
two sides are compared after the register and label numbers and the anonymous-namespace hash
(derived from the path) are normalized. A file whose two compiles of one side differ is reported
as varying (nvcc 13 does so for mt_gpu_linear.cu: one GEMM kernel gains or loses a shared load
from one compile to the next), not as changed. A file is "same" when
nothing else differs, i.e. the kernels it defines are the same code. Used to show that a
compute-sanitizer record taken with one library covers a card run by another
(bench/results/sanitize-cuda.md): records are per library, and a sanitizer sees device code.
With ``--kernels`` a file that differs is taken apart by its entry points (each ``.entry`` to the
next; a non-inlined ``.func`` or data placed after a kernel counts as that kernel's text): the
kernels that differ, the kernels on one side only, how many are the same, and whether the text
before the first kernel (globals, constants, helpers declared there) differs -- a card whose
kernels are all "same", with that text the same too, ran the same device code though its file changed.

With ``--sass`` each file is compiled to sm_90 machine code instead (a cubin, ptxas included) and
each kernel's ``.text`` section is compared byte for byte (no disassembler needed): the decision
at the level the GPU runs, where PTX that differs only in the order nvcc emitted it, or varies
from one compile to the next, may still assemble to the same code (the thirty-fifth session's
attention forward switch: PTX "varies", every kernel's machine code the same).
"""
import argparse
import concurrent.futures
import difflib
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODE_FLAGS = {  # the Makefile's NVCC_MODE_<mode>
    "identical": ["-DMT_NUMERIC_MODE=0", "--fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false"],
    "deterministic": ["-DMT_NUMERIC_MODE=1", "--fmad=true", "-prec-div=true", "-prec-sqrt=true", "-ftz=false"],
    "fast": ["-DMT_NUMERIC_MODE=2", "--use_fast_math"],
}
_NAMES = [(re.compile(r"_GLOBAL__N__[0-9a-f]{8}_"), "_GLOBAL__N__00000000_"),
          (re.compile(r"%(f|rd|r|p|fd|rs|h)[0-9]+"), r"%\1N"),
          (re.compile(r"\$L__BB[0-9_]+"), "LBB")]


def normalized(text):
    """PTX with the path-derived namespace hash and the register and label numbers taken out."""
    for pattern, repl in _NAMES:
        text = pattern.sub(repl, text)
    return text


_ENTRY = re.compile(r"^[ \t]*(?:\.(?:visible|weak)[ \t]+)*\.entry[ \t]+([^\s(]+)\(", re.M)


def kernels(ptx):
    """{kernel name: its PTX, from its .entry line to the next one} of one file's PTX."""
    starts = [(m.start(), m.group(1)) for m in _ENTRY.finditer(ptx)]
    return {name: ptx[at:(starts[k + 1][0] if k + 1 < len(starts) else len(ptx))]
            for k, (at, name) in enumerate(starts)}


def demangled(names):
    """The names readable (c++filt when it is on PATH), in the order given."""
    if not names or not shutil.which("c++filt"):
        return list(names)
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
    return out if len(out) == len(names) else list(names)


def outside_kernels(ptx):
    """The PTX before the first .entry (globals, constants, non-inlined .func helpers declared
    there): what a kernel may read or call without it being in its own text."""
    first = _ENTRY.search(ptx)
    return ptx[:first.start()] if first else ptx


def kernel_lines(a, b):
    """Lines saying which kernels of one file differ between the PTX ``a`` and ``b``, and whether
    the text outside them does (then a kernel reading "same" may still call changed code)."""
    ka, kb = kernels(a), kernels(b)
    differ = sorted(n for n in set(ka) & set(kb) if ka[n] != kb[n])
    lines = ["      %d kernels the same; outside the kernels: %s" % (
        sum(1 for n in set(ka) & set(kb) if ka[n] == kb[n]),
        "same" if outside_kernels(a) == outside_kernels(b) else "DIFFERS (helpers or data every kernel may use)")]
    for what, names in (("differs", differ), ("only before", sorted(set(ka) - set(kb))),
                        ("only after", sorted(set(kb) - set(ka)))):
        lines += ["      %-11s %s" % (what, n) for n in demangled(names)]
    return lines


def text_sections(elf):
    """{section name: bytes} of the ``.text.*`` sections of a 64-bit little-endian ELF (a cubin:
    one such section a kernel, its machine code)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_at = struct.unpack_from("<HHH", elf, 0x3A)
    heads = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + k * entsize) for k in range(count)]
    strings = heads[names_at][4]
    out = {}
    for name_off, kind, _, _, offset, size, _, _, _, _ in heads:
        name = elf[strings + name_off:elf.index(b"\0", strings + name_off)].decode()
        if name.startswith(".text.") and kind != 8:      # 8: SHT_NOBITS
            out[name[len(".text."):]] = elf[offset:offset + size]
    return out


def ptx_of(tree, mode, scratch, sass=False):
    """{file name: normalized PTX} of every native/cuda/*.cu in ``tree``, compiled into the
    folder ``scratch`` (never into the tree); with ``sass``, {file name: {kernel: its sm_90
    machine code}} instead."""
    sources = sorted(f for f in os.listdir(os.path.join(tree, "native", "cuda")) if f.endswith(".cu"))

    def one(name):
        out = os.path.join(scratch, name + (".cubin" if sass else ".ptx"))
        target = ["-gencode", "arch=compute_90,code=sm_90", "-cubin"] if sass else ["-arch=compute_90", "-ptx"]
        cmd = ["nvcc", "-O3", "-std=c++17", "-Inative/include", "-Inative/common",
               "-Inative/cuda"] + MODE_FLAGS[mode] + target + [os.path.join("native", "cuda", name), "-o", out]
        done = subprocess.run(cmd, cwd=tree, capture_output=True, text=True)
        if done.returncode != 0:
            return name, None
        if sass:
            with open(out, "rb") as f:
                return name, text_sections(f.read())
        with open(out) as f:
            return name, normalized(f.read())

    with concurrent.futures.ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        return dict(pool.map(one, sources))


def place_sources(commit, tree):
    """native/ of ``commit`` (None: the working tree) at ``tree``/native, replacing what was there;
    returns ``tree``."""
    shutil.rmtree(tree, ignore_errors=True)
    os.makedirs(tree)
    if commit is None:
        shutil.copytree(os.path.join(ROOT, "native"), os.path.join(tree, "native"),
                        ignore=shutil.ignore_patterns("build"))
    else:
        archive = subprocess.run(["git", "archive", commit, "native"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "x", "-C", tree], input=archive.stdout, check=True)
    return tree


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("commit")
    ap.add_argument("other", nargs="?", help="default: the working tree")
    ap.add_argument("--mode", default="identical", choices=sorted(MODE_FLAGS))
    ap.add_argument("--kernels", action="store_true", help="for a file that differs, which kernels differ")
    ap.add_argument("--sass", action="store_true", help="compare each kernel's sm_90 machine code instead of PTX")
    args = ap.parse_args()
    if not shutil.which("nvcc"):
        sys.exit("nvcc is not on PATH")
    # Both sides compiled from one path in turn (the anonymous-namespace hash nvcc derives from
    # it is in every name), each twice: nvcc 13's code for mt_gpu_linear.cu is not the same from
    # one compile to the next (the same file, path and flags: one GEMM kernel gains or loses a
    # shared load), and such a file is reported as varying rather than as changed.
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        sides = []
        for commit in (args.commit, args.other):
            place_sources(commit, tree)
            sides.append([ptx_of(tree, args.mode, tempfile.mkdtemp(dir=tmp), args.sass) for _ in range(2)])
    (a, a2), (b, b2) = sides
    print("device code (%s mode, %s), %s against %s:" % (
        args.mode, "sm_90 machine code" if args.sass else "compute_90 PTX", args.commit, args.other or "the working tree"))
    if args.sass:
        return sass_report(a, a2, b, b2)
    differing = 0
    for name in sorted(set(a) | set(b)):
        if a.get(name) is None or b.get(name) is None:
            print("  %-26s %s" % (name, "absent or not compiling on one side"))
            differing += 1
            continue
        if a.get(name) != a2.get(name) or b.get(name) != b2.get(name):
            print("  %-26s %s" % (name, "varies from one compile to the next (nvcc): not decided"))
            differing += 1
            continue
        lines_a, lines_b = a[name].splitlines(), b[name].splitlines()
        same = lines_a == lines_b
        differing += not same
        changed = 0 if same else sum(1 for line in difflib.unified_diff(lines_a, lines_b, lineterm="", n=0)
                                     if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        print("  %-26s %s" % (name, "same" if same else "differs (%d lines added or removed, of %d)" % (
            changed, len(lines_a))))
        if args.kernels and not same:
            print("\n".join(kernel_lines(a[name], b[name])))
    return 1 if differing else 0


def sass_report(a, a2, b, b2):
    """Per file: same (every kernel's machine code), varies, or the kernels that differ."""
    differing = 0
    for name in sorted(set(a) | set(b)):
        if a.get(name) is None or b.get(name) is None:
            print("  %-26s %s" % (name, "absent or not compiling on one side"))
            differing += 1
        elif a[name] != a2[name] or b[name] != b2[name]:
            print("  %-26s %s" % (name, "varies from one compile to the next (ptxas): not decided"))
            differing += 1
        elif a[name] == b[name]:
            print("  %-26s same (%d kernels)" % (name, len(a[name])))
        else:
            differing += 1
            ka, kb = a[name], b[name]
            differ = sorted(k for k in set(ka) & set(kb) if ka[k] != kb[k])
            print("  %-26s differs: %d of %d kernels" % (name, len(differ) + len(set(ka) ^ set(kb)), len(ka)))
            for what, names in (("differs", differ), ("only before", sorted(set(ka) - set(kb))),
                                ("only after", sorted(set(kb) - set(ka)))):
                for n in demangled(names):
                    print("      %-11s %s" % (what, n))
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
