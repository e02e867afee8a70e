"""bench/ptx_compare.py's normalization: two compilations of one kernel from two paths compare
equal, and a real change in the code does not vanish in the normalization."""
import os
import struct
import sys

from _helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import ptx_compare as P  # noqa: E402

ONE = (".entry _ZN52_GLOBAL__N__1b5eab89_19_mt_gpu_attention_cu_cccdba2d9k_exampleEPKf(\n"
       "\tld.param.u64 \t%rd35, [_ZN52_GLOBAL__N__1b5eab89_19_mt_gpu_attention_cu_cccdba2d9k_exampleEPKf_param_0];\n"
       "\tadd.f32 \t%f12, %f3, %f4;\n\tsetp.lt.s32 \t%p2, %r7, %r9;\n\t@%p2 bra \t$L__BB0_4;\n")


def test_the_path_hash_and_the_register_and_label_numbers_are_taken_out():
    other = (ONE.replace("1b5eab89", "d4b3d2c1").replace("%rd35", "%rd36").replace("%f12", "%f14")
             .replace("%p2", "%p3").replace("$L__BB0_4", "$L__BB0_5"))
    assert other != ONE and P.normalized(other) == P.normalized(ONE)


def test_a_changed_operation_or_constant_still_differs():
    assert P.normalized(ONE.replace("add.f32", "sub.f32")) != P.normalized(ONE)
    assert P.normalized(ONE + "\tmov.f32 \t%f1, 0f3F800000;\n") != P.normalized(ONE + "\tmov.f32 \t%f1, 0f3F800001;\n")


def test_kernels_tells_which_entry_points_of_a_file_differ():
    # Two kernels; after the change one differs, one is the same, one is new and one is gone.
    k = lambda name, op: ".visible .entry %s(\n\t%s.f32 \t%%fN, %%fN, %%fN;\n\tret;\n}\n" % (name, op)  # noqa: E731
    before = P.normalized("// header\n" + k("k_same", "add") + k("k_changed", "add") + k("k_gone", "mul"))
    after = P.normalized("// header\n" + k("k_same", "add") + k("k_changed", "sub") + k("k_new", "mul"))
    internal = "\t// .globl\n.entry k_internal(\n\tret;\n}\n"      # no .visible: internal linkage
    assert sorted(P.kernels(before + internal)) == ["k_changed", "k_gone", "k_internal", "k_same"]
    assert sorted(P.kernels(before)) == ["k_changed", "k_gone", "k_same"]
    lines = [" ".join(line.split()) for line in P.kernel_lines(before, after)]
    assert lines == ["1 kernels the same; outside the kernels: same", "differs k_changed", "only before k_gone",
                     "only after k_new"]
    # a changed constant before the kernels is reported even where every kernel reads "same"
    table = P.kernel_lines(".const .f32 c = 0f3F800000;\n" + k("k_same", "add"),
                           ".const .f32 c = 0f3F800001;\n" + k("k_same", "add"))
    assert "outside the kernels: DIFFERS" in table[0] and len(table) == 1


def _elf(sections):
    """A 64-bit little-endian ELF holding ``sections`` ([(name, type, bytes)]) after a null
    section, with its section-name table last: what text_sections reads of a cubin."""
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    body, heads, at, name_at = b"", [(0, 0, 0, 0)], 64, 1
    for name, kind, data in sections + [(".shstrtab", 3, names)]:
        heads.append((name_at, kind, at + len(body), len(data)))
        body += data
        name_at += len(name) + 1
    shoff = 64 + len(body)
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9 + struct.pack("<HHIQQQIHHHHHH", 2, 190, 1, 0, 0, shoff, 0, 64,
                                                                       0, 0, 64, len(heads), len(heads) - 1)
    table = b"".join(struct.pack("<IIQQQQIIQQ", n, k, 0, 0, off, size, 0, 0, 1, 0) for n, k, off, size in heads)
    return header + body + table


def test_text_sections_reads_each_kernels_machine_code_from_a_cubin():
    elf = _elf([(".text.k_one", 1, b"\x01\x02\x03\x04"), (".nv.info.k_one", 1, b"\xff"),
                (".text.k_two", 1, b"\x05" * 16), (".text.k_empty", 8, b"")])
    assert P.text_sections(elf) == {"k_one": b"\x01\x02\x03\x04", "k_two": b"\x05" * 16}


def test_sass_report_names_the_kernels_that_differ_and_fails(capsys):
    before = {"a.cu": {"k_same": b"\x01", "k_changed": b"\x02", "k_gone": b"\x03"}, "b.cu": {"k": b"\x09"}}
    after = {"a.cu": {"k_same": b"\x01", "k_changed": b"\x04", "k_new": b"\x03"}, "b.cu": {"k": b"\x09"}}
    assert P.sass_report(before, before, after, after) == 1
    lines = [" ".join(line.split()) for line in capsys.readouterr().out.splitlines()]
    assert lines == ["a.cu differs: 3 of 3 kernels", "differs k_changed", "only before k_gone", "only after k_new",
                     "b.cu same (1 kernels)"]
    assert P.sass_report(before, before, before, before) == 0
    varying = dict(before, **{"b.cu": {"k": b"\x0a"}})
    assert P.sass_report(before, varying, before, before) == 1
    assert "b.cu varies from one compile to the next (ptxas): not decided" in " ".join(capsys.readouterr().out.split())
