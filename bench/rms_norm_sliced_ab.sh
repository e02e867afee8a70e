#!/bin/bash
# bench/rms_norm_sliced_ab.sh -- RMSNorm's backward, the one-pass kernel against the sliced one
# (MOJO_TRAIN_RMS_SLICED=1), in alternating processes (torch's own time moves between processes).
# Variants: one-pass, sliced (32 rows a slice), and where .whl/v16 holds a library built with
# -DRMS_SLICE_ROWS=16, sliced at 16 rows. Run after bench/device_steps.sh has set the build up:
#     bash bench/rms_norm_sliced_ab.sh ROUNDS > $OUT/ab.txt
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
for round in $(seq "${1:-3}"); do
    echo "== round $round one-pass"
    MOJO_TRAIN_RMS_SLICED=0 timeout 120 python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    echo "== round $round sliced32"
    MOJO_TRAIN_RMS_SLICED=1 timeout 120 python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    if [ -f .whl/v16/libmojo_train_cuda_identical.so ]; then
        echo "== round $round sliced16"
        MOJO_TRAIN_LIBRARY_PATH=$PWD/.whl/v16 MOJO_TRAIN_RMS_SLICED=1 timeout 120 \
            python3 bench/rms_norm_cuda.py --repeat 20 2>&1
    fi
done
