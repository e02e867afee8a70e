#!/bin/bash
# bench/rms_norm_sliced_ab.sh -- RMSNorm's backward, the one-pass kernel against the sliced one
# (MOJO_TRAIN_RMS_SLICED=1), in alternating processes (torch's own time moves between processes).
# Variants: one-pass, sliced, and sliced from each library folder .whl/v*/ (a variant built
# here, e.g. `make BUILD=/tmp/v16 NVCC="nvcc -DRMS_SLICE_ROWS=16" /tmp/v16/libmojo_train_cuda_identical.so`
# copied with its .sha256 into .whl/v16/). Run after bench/device_steps.sh has set the build up:
#     bash bench/rms_norm_sliced_ab.sh ROUNDS > $OUT/ab.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for round in $(seq "${1:-3}"); do
    echo "== round $round one-pass"
    MOJO_TRAIN_RMS_SLICED=0 timeout 120 python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    echo "== round $round sliced32"
    MOJO_TRAIN_RMS_SLICED=1 timeout 120 python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    for v in .whl/v*/; do
        [ -f "$v/libmojo_train_cuda_identical.so" ] || continue
        echo "== round $round sliced $(basename "$v")"
        MOJO_TRAIN_LIBRARY_PATH=$PWD/$v MOJO_TRAIN_RMS_SLICED=1 timeout 120 \
            python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    done
done
