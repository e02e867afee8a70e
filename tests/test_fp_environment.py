"""The identical numeric mode does not depend on the calling process's floating-point settings or on
how the process was started: flush-to-zero set by someone else (torch.set_flush_denormal, a
library built with -ffast-math) changes no bit, and a forked child can still step."""
import os
import subprocess
import sys
import textwrap

import pytest

from mojo_train import _cards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CARDS = [os.path.join(REPO, "fixtures", name) for name in ("optim.card", "clip.card")]


def test_cards_hold_when_the_caller_flushes_denormals_to_zero(identical):
    torch = pytest.importorskip("torch")
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        for path in CARDS:
            results = _cards.check_card(path, identical.vendor)
            assert all(r.ok or r.skipped for r in results), [r.case for r in results if not r.ok][:3]
    finally:
        torch.set_flush_denormal(False)


def test_a_subnormal_result_comes_back_as_itself_when_the_caller_flushes_denormals(identical):
    """Scalars handed back as Python floats (a norm, a loss) are decoded from their bits, not by
    the FPU, which under denormals-are-zero would read a subnormal float32 as 0."""
    torch = pytest.importorskip("torch")
    import array
    import mojo_train
    tiny = 2.0 ** -130                                  # a float32 subnormal, a normal double
    grads = [array.array("f", [tiny, -tiny / 2])]
    if not torch.set_flush_denormal(True):
        pytest.skip("this CPU cannot flush denormals")
    try:
        total = mojo_train.clip_grad_norm_(grads, 1.0, norm_type=float("inf"), numeric_mode=identical.numeric_mode)
    finally:
        torch.set_flush_denormal(False)
    assert total == tiny


def test_float32_bits_and_float32_at_round_trip_every_kind_of_value():
    import math
    import struct
    from mojo_train._array import Array, float32_at, float32_bits
    values = [0.0, -0.0, 2.0 ** -149, -(2.0 ** -149), 2.0 ** -126 - 2.0 ** -149, 2.0 ** -126, 1.0, -1.5,
              3.4028234663852886e38, float("inf"), -float("inf"), 1.0 + 2.0 ** -24, 1.0 + 3 * 2.0 ** -24,
              2.0 ** -150, 2.0 ** -150 * 3, 1e-40, math.pi]
    for v in values:
        assert float32_bits(v) == struct.unpack("<I", struct.pack("<f", v))[0], v
        a = Array.from_list([v], "float32")
        assert float32_at(a.address) == struct.unpack("<f", struct.pack("<f", v))[0], v
    assert float32_bits(float("nan")) == 0x7FC00000
    assert float32_bits(3.5e38) == 0x7F800000              # beyond FLT_MAX's rounding: +inf


def test_a_forked_child_can_step_after_the_parent_used_the_thread_pool(identical):
    if not hasattr(os, "fork"):
        pytest.skip("no fork here")
    if identical.has("device_buffers"):
        pytest.skip("a GPU runtime initialised in the parent cannot be used in a forked child "
                    "(a documented CUDA/HIP limitation); the thread pool is the CPU vendor's")
    code = textwrap.dedent("""
        import os, sys
        import mojo_train as mt
        p, g = mt.Array((1 << 20,)), mt.Array((1 << 20,))
        opt = mt.AdamW([p], numeric_mode="identical")
        opt.step([g])
        pid = os.fork()
        if pid == 0:
            opt.step([g])
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
    """)
    env = dict(os.environ, MOJO_TRAIN_VENDOR=identical.vendor, MOJO_TRAIN_NUM_THREADS="2",
               PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, timeout=60)
    assert done.returncode == 0
