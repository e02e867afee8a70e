"""bench/sass_banks.py's reading of nvdisasm's text: kernels, loops and same-bank FFMA."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import sass_banks as S  # noqa: E402

SASS = """
.text._ZN7mt_gemm6k_gemmILi0ELi0EEEvNS0_6paramsE:
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   FFMA R8, R2, R4.reuse, R6 ;
        /*0020*/                   FFMA R9, R3, R4, R7 ;
        /*0030*/                   FFMA R10, -R2, R5, R6 ;
        /*0040*/                   LDS.128 R4, [R0+0x10] ;
        /*0050*/               @P0 BRA `(.L_x_3) ;
        /*0060*/                   FFMA R11, R2, R4, R6 ;
        /*0070*/                   EXIT ;
"""


def test_same_bank_needs_all_three_sources_in_one_bank():
    assert S.same_bank("FFMA R8, R2, R4.reuse, R6")       # 2, 4, 6: all even (a reuse flag is no relief)
    assert S.same_bank("FFMA R10, -R3, R5, |R7|")         # signs and absolute values read the register
    assert not S.same_bank("FFMA R9, R3, R4, R7")         # 3, 4, 7: two banks
    assert not S.same_bank("FFMA R9, R2, 0.5, R6")        # an immediate: two registers
    assert not S.same_bank("FADD R8, R2, R4")


def test_the_loop_is_the_branch_back_and_only_its_instructions_count():
    (name, (instrs, labels)), = S.kernels(SASS).items()
    assert "k_gemmILi0ELi0E" in name and labels == {"3": 0x10}
    (ffma, seg), = S.loops(instrs, labels)
    assert ffma == 3 and len(seg) == 5                    # 0x10 .. 0x50: the FFMA after the branch is outside
    assert sum(map(S.same_bank, seg)) == 1                # R2 R4 R6; not R3 R4 R7, nor -R2 R5 R6


def test_the_ncu_table_counts_only_the_hot_instructions(tmp_path):
    table = tmp_path / "t.csv"
    table.write_text(
        '"Kernel Name","k_gemm",\n'
        '"Address","Source","Instructions Executed","stall_dispatch","stall_selected","stall_dispatch (Not Issued)"\n'
        '"0x0","      MOV R1, c[0x0][0x28]","10","50","0","7"\n'          # cold: not in the loop
        '"0x10","      FFMA R8, R2, R4, R6","100","6","4","1"\n'            # same bank
        '"0x20","      FFMA R9, R3, R4, R7","100","2","8","1"\n'
        '"0x30","      FFMA R10, R3, R4, R8","60","0","10","1"\n')
    shares, ((n3, d3), (n2, d2)) = S.ncu_summary(S.ncu_table(str(table)))
    assert dict((k, round(v, 3)) for v, k in shares) == {"dispatch": 26.667, "selected": 73.333}
    assert (n3, d3) == (1, 6.0) and (n2, d2) == (2, 1.0)
