"""bench/ptx_compare.py's normalization: two compilations of one kernel from two paths compare
equal, and a real change in the code does not vanish in the normalization."""
import os
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
