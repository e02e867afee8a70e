"""RMSNorm's one-pass backward (CUDA's k_rms_backward_leaves) at the shapes that take it, each
against the CPU oracle's bytes: the program the sanitizers run over that kernel.

    compute-sanitizer --tool memcheck|racecheck|synccheck|initcheck --error-exitcode 9 \\
        python bench/rms_one_pass_shapes.py [N]

Backward with dweight at 7169 x 128 (8 leaves, the default geometry), 8300 x 256 at most 8 blocks
(one group walks 9 leaves) and 7169 x 4224 at most 24 blocks (two chunks); N keeps the first N.
Exits 1 when a shape's bytes differ from the oracle's. Needs the cpu and cuda identical libraries.
"""
import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mojo_train as mt  # noqa: E402
from mojo_train._native import load  # noqa: E402

SHAPES = [(7169, 128, 0), (8300, 256, 8), (7169, 4224, 24)]   # rows, dim, at most this many blocks (0: any)


def digest(*arrays):
    h = hashlib.sha256()
    for a in arrays:
        h.update(bytes(memoryview(a).cast("B")))
    return h.hexdigest()


def main():
    shapes = SHAPES[: int(sys.argv[1])] if len(sys.argv) > 1 else SHAPES
    lib = load("identical", "cuda").lib
    different = 0
    for rows, dim, blocks in shapes:
        os.environ["MOJO_TRAIN_VENDOR"] = "cpu"
        g = mt.Generator(rows + dim, numeric_mode="identical")
        x, dy, w = g.uniform((rows, dim), -1.0, 1.0), g.uniform((rows, dim), -1.0, 1.0), g.uniform((dim,), 0.5, 1.5)
        want = digest(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
        os.environ["MOJO_TRAIN_VENDOR"] = "cuda"
        assert lib.mt_set_launch_geometry(256, blocks) == 0
        try:
            got = digest(*mt.rms_norm_backward(dy, x, w, 1e-5, numeric_mode="identical"))
        finally:
            lib.mt_set_launch_geometry(256, 0)
        print(rows, dim, blocks, "same bits" if got == want else "DIFFERENT BITS", flush=True)
        different += got != want
    sys.exit(1 if different else 0)


if __name__ == "__main__":
    main()
