"""Development probe: cross_entropy 8192 x 50304 on the GPU alone (no torch timing), for A/B
builds and for ncu (`ncu --kernel-name regex:k_ce_rows ... python bench/dev_probe_ce.py`).

    MOJO_TRAIN_VENDOR=cuda python bench/dev_probe_ce.py [--repeat N] [--label TEXT]

Prints the median of N synchronized fwd+bwd calls and of N forward-only calls.
"""
import argparse
import array
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from loss_cuda import MEAN, DeviceBuffer, _call, ffi  # noqa: E402
from optim_cuda import timed  # noqa: E402

from mojo_train import _native  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    gpu = _native.load(vendor="cuda", numeric_mode="identical")
    rows, vocab = a.rows, a.vocab
    logits = DeviceBuffer(gpu, (rows, vocab)).fill_uniform(11, 0, -8.0, 8.0)
    dlogits, loss = DeviceBuffer(gpu, (rows, vocab)), DeviceBuffer(gpu, (1,))
    targets = DeviceBuffer(gpu, (rows,), "int32")
    targets.upload(array.array("i", [i * 7919 % vocab for i in range(rows)]).tobytes())
    tptr, lib = targets.ptr("void *"), gpu.lib

    def both():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, dlogits.ptr(), logits.ptr(), tptr, 4, rows, vocab,
                                        -100, MEAN, 0.0, 0), "mt_cross_entropy")

    def forward():
        _call(gpu, lib.mt_cross_entropy(loss.ptr(), ffi.NULL, ffi.NULL, logits.ptr(), tptr, 4, rows, vocab,
                                        -100, MEAN, 0.0, 0), "mt_cross_entropy")

    t_both, t_fwd = timed(both, a.repeat), timed(forward, a.repeat)
    print("%s ce %dx%d: fwd+bwd %.3f ms, forward %.3f ms" % (a.label, rows, vocab, t_both * 1e3, t_fwd * 1e3))


if __name__ == "__main__":
    main()
