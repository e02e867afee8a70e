"""The attention GPU kernels, run on CPU threads, give the CPU oracle's bytes.

native/cuda/mt_gpu_attention_kernels.cuh is compiled as C++ over tests/c/attn_gpu_emulate.h
(one std::thread per GPU thread, real block barriers and warp shuffles, blocks in a shuffled
order) by the driver tests/c/attn_gpu_emulate.cc, which runs its cases' forward and backward and
compares out, lse, dq, dk, dv byte for byte with the identical CPU oracle's
(native/contracts/attention.md). No GPU is needed: this checks the kernels' order of operations
wherever the suite runs. The emulator's own checks (--self-test) and a sabotaged build (one more
rounding in out and ds, MT_SABOTAGE_ATTENTION) show the harness can fail.
"""
import os
import re
import shutil
import subprocess

import pytest

from mojo_train import _native

from _helpers import REPO

# -fsanitize=alignment: a 16-byte load or store (float4, cp.async's stand-in) at an address a GPU
# would fault on stops the run (the emulated shared memory keeps a GPU's offsets: its size is a
# multiple of 16 and it ends at a page)
FLAGS = ["-std=c++20", "-O1", "-ffp-contract=off", "-fsanitize=alignment", "-fno-sanitize-recover=alignment",
         "-Inative/include", "-Inative/common", "-Inative/cuda", "-Itests/c"]
SOURCE = "tests/c/attn_gpu_emulate.cc"


def _compiler():
    cxx = shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C/C++ compiler (g++ or c++) on PATH to build the GPU kernels' CPU emulation")
    return cxx


def _oracle_path():
    try:
        return _native.load("identical", "cpu").path
    except _native.BackendError as exc:
        pytest.skip("the cpu oracle's identical numeric mode is not built: %s" % str(exc).splitlines()[0])


def _build(tmp_path_factory, name, extra=()):
    exe = str(tmp_path_factory.mktemp("attn_emu") / name)
    done = subprocess.run([_compiler()] + FLAGS + list(extra) + [SOURCE, "-o", exe, "-ldl", "-lpthread"], cwd=REPO,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-4000:]
    return exe


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return _build(tmp_path_factory, "attn_emu")


def _run(args, timeout=600, **env):
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **env))


def test_the_emulator_runs_barriers_and_shuffles_and_reports_a_broken_kernel(driver):
    """Block reductions, butterflies and __syncthreads_or give the right values on real threads;
    a return before a barrier, mixed barrier kinds and a deadlock are reported, not hung on."""
    done = _run([driver, "--self-test"], timeout=120, EMU_DEADLOCK_MS="300")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 6 and all(line.startswith("ok self-test: ") for line in lines), done.stdout
    assert "deadlock: thread 0 at __syncthreads #1; threads 1-31 at __shfl_xor_sync #1" in done.stdout


def test_the_gpu_kernels_emulated_on_the_cpu_give_the_oracle_bits(driver):
    """Every case (sizes around the 64-wide tiles, D from 1 to 128, bool and float masks with
    broadcast and transposed strides, causal, other scales, large and overflowing logits, empty
    sizes, outputs not asked for, grouped-query heads): the forward's and the backward's bytes."""
    _every_case_gives_the_oracle_bits(driver)


def test_the_forward_in_query_tiles_of_128_rows_gives_the_same_bits(tmp_path_factory):
    """The forward built with MT_ATTN_FWD_ROWS=8 (eight query rows a thread, tiles of 128 query
    rows at D <= 64: the variant library an A/B of bench/attention_cuda.py loads, built with
    NVCC="nvcc -DMT_ATTN_FWD_ROWS=8") on every case: the tile's shape moves no chain, so the
    bytes are the oracle's."""
    _every_case_gives_the_oracle_bits(_build(tmp_path_factory, "attn_emu_fwd_rows8", ["-DMT_ATTN_FWD_ROWS=8"]))


def _every_case_gives_the_oracle_bits(driver):
    oracle = _oracle_path()
    done = _run([driver, oracle])
    out = done.stdout + done.stderr
    cases = [line for line in done.stdout.splitlines() if re.match(r"^(ok|MISMATCH|ERROR) B\d", line)]
    bad = [line for line in cases if not line.startswith("ok ")]
    assert not bad and done.returncode == 0, out[-12000:]
    assert len(cases) >= 50, out
    assert re.search(r"^%d of %d cases ok" % (len(cases), len(cases)), done.stdout, re.M), out


def test_one_more_rounding_in_the_kernels_is_a_mismatch(tmp_path_factory):
    """The sabotage build of the kernels (out = acc * (1/l), ds = p*dp - p*delta) against the
    true oracle: the harness names the differing elements, dq's by either way (the dk/dv
    kernel's relay and the dq kernel), and exits 1."""
    oracle = _oracle_path()
    sabotaged = _build(tmp_path_factory, "attn_emu_sabotaged", ["-DMT_SABOTAGE_ATTENTION"])
    done = _run([sabotaged, oracle, "Tq130_Tk130_D64_mask-none_scale-default"])
    assert done.returncode == 1, done.stdout + done.stderr
    assert re.search(r"^MISMATCH B2_H2_Hkv2_Tq130_Tk130_D64_mask-none_scale-default$", done.stdout, re.M), done.stdout
    assert re.search(r"^    out\[\d+,\d+,\d+,\d+\]: emulated 0x[0-9a-f]{8} .* elements differ$", done.stdout, re.M)
    for name in (r"dq \(relay\)", r"dq \(dq kernel\)", "dk"):      # both ways to dq, each compared
        assert re.search(r"^    %s\[" % name, done.stdout, re.M), (name, done.stdout)
