"""Rewrites clang's LLVM IR of the CPU oracle so that every float32 operation obeys the flush rule
of the identical_ftz numeric mode (native/contracts/ftz.md; the rule's one definition is
native/include/mt_ftz.h).

    python3 native/cpu_oracle/mt_ftz_ir.py IN.ll OUT.ll
    python3 native/cpu_oracle/mt_ftz_ir.py --check-linked LIBRARY.ll
    python3 native/cpu_oracle/mt_ftz_ir.py --compile OUT.o CLANG LLVM_LINK SOURCE.c ... -- CFLAGS ...
    python3 native/cpu_oracle/mt_ftz_ir.py --compile-part ... (the same, for part of a library:
        a GPU library's host code, whose calls of the library's mt_* functions are external)

--compile is the whole build of C sources under the rule, as the Makefile runs it: each source
to IR (CLANG with CFLAGS, -O0 -Xclang -disable-O0-optnone), rewritten, all linked with the rule's
functions (native/include/mt_ftz.h compiled as plain IEEE code), checked (--check-linked), the
rule's functions made internal, then optimized (-O3) into one position-independent object.

IN.ll: one translation unit compiled with ``clang -O0 -Xclang -disable-O0-optnone -S -emit-llvm``
(unoptimized, so every operation of the source is still one instruction). Each float32 fadd, fsub,
fmul, fdiv, fneg becomes a call of mt_ftz_add / _sub / _mul / _div / _neg; fma, sqrt, fabs,
min/max and the integer roundings (as intrinsics or libm calls) of mt_ftz_fma / _sqrt / _abs /
_min / _max / _floor ...; an fcmp compares mt_ftz_in of its operands; fptrunc from double is
mt_ftz_from_double and fpext to double mt_ftz_to_double. Bit operations stay (load, store,
select, phi, copysign, bitcast), as do conversions from integers (never subnormal). Anything else
that computes on a float32 -- frem, a float operation in a form not listed, arithmetic on vectors
of floats (the build takes the portable loops), atomics, an unknown float intrinsic, a float
constant below FLT_MIN read by an instruction left as it was (a constant expression the compiler
folded by IEEE rules: not every fold shows, see ftz.md), a call of an external function that
takes or returns float -- stops the build with the line named.
Double arithmetic is host arithmetic on double values (the contract is float32's) and stays.
"""
import os
import re
import struct
import sys

BINARY = {"fadd": "mt_ftz_add", "fsub": "mt_ftz_sub", "fmul": "mt_ftz_mul", "fdiv": "mt_ftz_div"}
CALLS = {   # callee -> (primitive, arity)
    "llvm.fma.f32": ("mt_ftz_fma", 3), "fmaf": ("mt_ftz_fma", 3),
    "llvm.sqrt.f32": ("mt_ftz_sqrt", 1), "sqrtf": ("mt_ftz_sqrt", 1),
    "llvm.maxnum.f32": ("mt_ftz_max", 2), "fmaxf": ("mt_ftz_max", 2),
    "llvm.minnum.f32": ("mt_ftz_min", 2), "fminf": ("mt_ftz_min", 2),
    "llvm.floor.f32": ("mt_ftz_floor", 1), "floorf": ("mt_ftz_floor", 1),
    "llvm.ceil.f32": ("mt_ftz_ceil", 1), "ceilf": ("mt_ftz_ceil", 1),
    "llvm.trunc.f32": ("mt_ftz_trunc", 1), "truncf": ("mt_ftz_trunc", 1),
    "llvm.rint.f32": ("mt_ftz_rint", 1), "rintf": ("mt_ftz_rint", 1),
    "llvm.nearbyint.f32": ("mt_ftz_rint", 1), "nearbyintf": ("mt_ftz_rint", 1),
    "llvm.round.f32": ("mt_ftz_round", 1), "roundf": ("mt_ftz_round", 1),
    "llvm.fabs.f32": ("mt_ftz_abs", 1), "fabsf": ("mt_ftz_abs", 1),
}
BIT_OPS = {"llvm.copysign.f32", "copysignf"}
PRIMITIVES = {
    "mt_ftz_in": "float (float)", "mt_ftz_add": "float (float, float)", "mt_ftz_sub": "float (float, float)",
    "mt_ftz_mul": "float (float, float)", "mt_ftz_div": "float (float, float)",
    "mt_ftz_fma": "float (float, float, float)", "mt_ftz_sqrt": "float (float)",
    "mt_ftz_max": "float (float, float)", "mt_ftz_min": "float (float, float)",
    "mt_ftz_floor": "float (float)", "mt_ftz_ceil": "float (float)", "mt_ftz_trunc": "float (float)",
    "mt_ftz_rint": "float (float)", "mt_ftz_round": "float (float)",
    "mt_ftz_from_double": "float (double)", "mt_ftz_to_double": "double (float)",
    "mt_ftz_neg": "float (float)", "mt_ftz_abs": "float (float)",
}

_BIN = re.compile(r"^(\s*%[\w.]+ = )(fadd|fsub|fmul|fdiv) ((?:[a-z]+ )*)float (.*)$")
_CMP = re.compile(r"^(\s*%[\w.]+ = )fcmp ((?:[a-z]+ )*)([a-z]+) float (.*)$")
_NEG = re.compile(r"^(\s*%[\w.]+ = )fneg ((?:[a-z]+ )*)float ([^,]+?)(, !.*)?\s*$")
_TRUNC = re.compile(r"^(\s*%[\w.]+ = )fptrunc double (.*?) to float(, !.*)?\s*$")
_EXT = re.compile(r"^(\s*%[\w.]+ = )fpext float (.*?) to double(, !.*)?\s*$")
# What is left after the rewrite must not compute on a float: any of these naming float (or a
# type the contract does not know) is refused.
_FLOAT_OP = re.compile(r"= (fadd|fsub|fmul|fdiv|frem|fneg|fcmp [a-z]+|fptrunc|fpext)\b.*\b(float|half|bfloat|x86_fp80|fp128)\b"
                       r"|= (fptrunc|fpext) \w+ .* to (half|bfloat|x86_fp80|fp128)\b")
# A float constant below FLT_MIN in the IR: a constant expression the compiler folded (IEEE, not the
# rule) -- or a subnormal literal; refused either way.
_FLOAT_CONST = re.compile(r"\bfloat (0x[0-9A-Fa-f]{16}|[-+]?\d+\.\d+e[-+]\d+)")
_CALL = re.compile(r"^(\s*(?:%[\w.]+ = )?(?:tail |musttail |notail )?call [^@]*?)@([\w.$]+)\((.*)$")
_DEFINE = re.compile(r"^define .*?@([\w.$]+)\(")
_DECLARE = re.compile(r"^declare .*?@([\w.$]+)\(")


class Refused(Exception):
    """An instruction touching float32 that the rule does not cover."""


def split_operands(text):
    """Top-level comma-separated operands of an instruction's tail."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def _touches_float(line):
    return re.search(r"\bfloat\b", line) is not None


def rewrite_line(line, fresh):
    """The rewritten line(s) of one instruction; fresh() names a new value."""
    m = _BIN.match(line)
    if m:
        ops = split_operands(m.group(4))
        return ["%scall float @%s(float %s, float %s)" % (m.group(1), BINARY[m.group(2)], ops[0], ops[1])]
    m = _CMP.match(line)
    if m:
        ops = split_operands(m.group(4))
        a, b = fresh(), fresh()
        indent = re.match(r"^\s*", line).group(0)
        return ["%s%s = call float @mt_ftz_in(float %s)" % (indent, a, ops[0]),
                "%s%s = call float @mt_ftz_in(float %s)" % (indent, b, ops[1]),
                "%sfcmp %s%s float %s, %s" % (m.group(1), m.group(2), m.group(3), a, b)]
    m = _NEG.match(line)
    if m:
        return ["%scall float @mt_ftz_neg(float %s)" % (m.group(1), m.group(3).strip())]
    m = _TRUNC.match(line)
    if m:
        return ["%scall float @mt_ftz_from_double(double %s)" % (m.group(1), m.group(2).strip())]
    m = _EXT.match(line)
    if m:
        return ["%scall double @mt_ftz_to_double(float %s)" % (m.group(1), m.group(2).strip())]
    m = _CALL.match(line)
    if m and m.group(2) in CALLS:
        prim, arity = CALLS[m.group(2)]
        args = split_operands(m.group(3).rsplit(")", 1)[0])
        if len(args) != arity or not all(a.startswith("float ") for a in args):
            raise Refused("unexpected arguments")
        return ["%s@%s(%s)" % (m.group(1).replace(" fast ", " "), prim, ", ".join(args))]
    return None


def check_untouched(line):
    """Raise for an instruction left as it was that computes on float32: frem, a float atomic, a
    vector of floats, or an intrinsic of float this script does not map (bit operations pass)."""
    if not line.startswith(" ") or not re.search(r"\b(float|half|bfloat|x86_fp80|fp128)\b", line):
        return      # top-level entities (types, globals, declarations: checked after linking)
    s = line.strip()
    if re.search(r"= (fadd|fsub|fmul|fdiv|frem|fneg|fcmp [a-z]+|fptrunc|fpext|[a-z ]*call[^@]*@llvm\.[\w.]*v\d+f32)\b.*"
                 r"<\s*\d+\s+x\s+(float|double)\s*>", s):
        raise Refused("arithmetic on a vector of floats (build with -DMT_NO_CLONES: the portable loops)")
    if re.search(r"(^|= )frem\b|atomicrmw\s+(volatile\s+)?f(add|sub|max|min)\b", s):
        raise Refused("an operation the rule does not cover")
    if _FLOAT_OP.search(s):
        raise Refused("a float operation in a form this rewrite does not know")
    for c in _FLOAT_CONST.findall(s):
        value = struct.unpack("<d", struct.pack("<Q", int(c, 16)))[0] if c.startswith("0x") else float(c)
        if 0 < abs(value) < 2.0 ** -126:
            raise Refused("a float constant below FLT_MIN (%s: a folded constant expression?)" % c)
    m = _CALL.match(line)
    if m and m.group(2).startswith("llvm.") and m.group(2) not in BIT_OPS and \
            re.search(r"\bf32\b|call float\b", m.group(2) + " " + m.group(1)):
        raise Refused("the intrinsic %s" % m.group(2))


def check_linked(text, part=False):
    """Raise for a function the linked code calls but does not define (a libm routine, say) whose
    signature has a float and that the rule does not map. With ``part`` (a GPU library's host
    code), ``mt_*`` functions may be external: its kernels' launchers, built by the GPU compiler."""
    defined = set()
    for line in text.splitlines():
        d = _DEFINE.match(line)
        if d:
            defined.add(d.group(1))
    for line in text.splitlines():
        d = _DECLARE.match(line)
        if not d or d.group(1) in defined or not _touches_float(line.split("@", 1)[0] + line.split("(", 1)[-1]):
            continue
        name = d.group(1)
        if name in BIT_OPS or name in PRIMITIVES or name in CALLS or name.startswith("llvm."):
            continue
        if part and name.startswith("mt_"):    # the library's own, from its other part
            continue
        raise Refused("the library calls %s, which takes or returns float and is not defined in it:\n  %s"
                      % (name, line.strip()))


def rewrite(text):
    """The whole module rewritten, with the primitives declared; Refused names the first line left."""
    out, n = [], [0]
    defined, declared = set(), set()

    def fresh():
        n[0] += 1
        return "%%ftz.%d" % n[0]

    for i, line in enumerate(text.splitlines()):
        d = _DEFINE.match(line)
        if d:
            defined.add(d.group(1))
        d = _DECLARE.match(line)
        if d:
            declared.add(d.group(1))
        try:
            new = rewrite_line(line, fresh)
            if new is None:
                check_untouched(line)
                out.append(line)
            else:
                out.extend(new)
        except Refused as e:
            raise Refused("line %d: %s:\n  %s" % (i + 1, e, line.strip()))
    for name, sig in PRIMITIVES.items():
        if name not in defined and name not in declared:
            ret, args = sig.split(" ", 1)
            out.append("declare %s @%s%s" % (ret, name, args))
    return "\n".join(out) + "\n"


RULE_HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "include", "mt_ftz.h")


# Sources compiled as they are (IEEE): the learning-rate schedules, whose values are decided
# exactly by their own proof (native/contracts/schedule.md), not computed by a sequence of float32
# operations the rule could apply to (ftz.md, "Exempt").
EXEMPT = ("mt_schedule.c",)


def compile_sources(out, clang, llvm_link, sources, cflags, part=False):
    """The object ``out`` of C ``sources`` with every float32 operation under the rule (but EXEMPT's)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="mt_ftz_ir.") as work:
        rewritten = []
        for i, src in enumerate(sources):
            ll, ftz = os.path.join(work, "%d.ll" % i), os.path.join(work, "%d.ftz.ll" % i)
            subprocess.run([clang, *cflags, "-O0", "-Xclang", "-disable-O0-optnone", "-S", "-emit-llvm", src, "-o", ll],
                           check=True)
            with open(ll) as f:
                text = f.read() if os.path.basename(src) in EXEMPT else rewrite(f.read())
            with open(ftz, "w") as f:
                f.write(text)
            rewritten.append(ftz)
        rule, linked = os.path.join(work, "rule.ll"), os.path.join(work, "linked.ll")
        target = [f for f in cflags if f.startswith("--target=")]      # a cross build's
        subprocess.run([clang, *target, "-x", "c", "-std=c11", "-O2", "-fPIC", "-fno-fast-math", "-fno-math-errno",
                        "-ffp-contract=off", "-DMT_FTZ_FN=", "-S", "-emit-llvm", RULE_HEADER, "-o", rule], check=True)
        subprocess.run([llvm_link, "-S", "-o", linked, *rewritten, rule], check=True)
        with open(linked) as f:
            text = f.read()
        check_linked(text, part)
        internal = re.sub(r"^define (?:dso_local |hidden )*(float|double) @(mt_ftz_\w+)\(",
                          r"define internal \1 @\2(", text, flags=re.M)
        final = os.path.join(work, "final.ll")
        with open(final, "w") as f:
            f.write(internal)
        subprocess.run([clang, *target, "-O3", "-fPIC", "-c", final, "-o", out], check=True)


def main(argv):
    if len(argv) >= 6 and argv[1] in ("--compile", "--compile-part"):
        rest = argv[5:]
        cut = rest.index("--") if "--" in rest else len(rest)
        try:
            compile_sources(argv[2], argv[3], argv[4], rest[:cut], rest[cut + 1:], argv[1] == "--compile-part")
        except Refused as e:
            sys.exit("mt_ftz_ir: %s" % e)
        return
    if len(argv) == 3 and argv[1] == "--check-linked":
        with open(argv[2]) as f:
            text = f.read()
        try:
            check_linked(text)
        except Refused as e:
            sys.exit("%s: %s" % (argv[2], e))
        return
    if len(argv) != 3:
        sys.exit(__doc__)
    with open(argv[1]) as f:
        text = f.read()
    try:
        new = rewrite(text)
    except Refused as e:
        sys.exit("%s: %s" % (argv[1], e))
    with open(argv[2], "w") as f:
        f.write(new)


if __name__ == "__main__":
    main(sys.argv)
