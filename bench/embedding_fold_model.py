"""A latency model of the embedding backward's fold kernel (k_fold, native/cuda/mt_gpu_embedding.cu),
for choosing its grid without a GPU.

    python bench/embedding_fold_model.py [--load-us 0.3] [--dy-us 0.7]

Keys: bench/embedding_cuda.py's Zipf rule (id = floor((V + 1) ** u) - 1, V = 50,304, T = 16,384)
with u drawn by numpy (seed 0), sorted as id << 32 | position, cut into (row, leaf of 1,024)
segments. A block walks keys i, i + G, ... in turn: each costs a dependent key load; a segment
start also costs its end's search (one probe, or about 2 log2(length) for a longer one) and its
fold (per group of 4 positions a key load then a dy-row load: fold_segment's chain). Blocks are
placed greedily on the resident slots (6 blocks of 256 threads an SM at 42 registers, 132 SMs),
each charged a launch cost of d us. Printed: the modelled kernel time for grids of 2,112 blocks
(16 an SM: the grid before the nineteenth session) and one block per 8, 4 and 1 keys, for d in
0, 0.5, 1 and 2 us. The ninth session's profile measured 66 us for the 2,112-block grid.
"""
import argparse
import heapq
import math

import numpy as np

V, T, LEAF, RESIDENT = 50304, 16384, 1024, 6 * 132


def segments():
    """(is a segment start, length of the segment starting there) for every sorted key."""
    u = np.random.default_rng(0).random(T)
    ids = np.clip(np.floor((V + 1.0) ** u) - 1, 0, V - 1).astype(np.int64)
    keys = np.sort((ids << 32) | np.arange(T))
    row, leaf = keys >> 32, (keys & 0xffffffff) // LEAF
    start = np.ones(T, bool)
    start[1:] = (row[1:] != row[:-1]) | (leaf[1:] != leaf[:-1])
    first = np.nonzero(start)[0]
    length = np.zeros(T, np.int64)
    length[first] = np.diff(np.append(first, T))
    return start, length


def kernel_us(grid, launch_us, load_us, dy_us, start, length):
    cost = np.zeros(grid)
    for i in range(T):
        b = i % grid
        cost[b] += load_us
        if start[i]:
            n = int(length[i])
            probes = 1 if n == 1 else 2 * math.ceil(math.log2(n + 1))
            cost[b] += probes * load_us + math.ceil(n / 4) * (load_us + dy_us)
    slots = [0.0] * RESIDENT
    for c in cost:
        heapq.heappush(slots, heapq.heappop(slots) + c + launch_us)
    return max(slots)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load-us", type=float, default=0.3, help="a dependent key load (L2)")
    ap.add_argument("--dy-us", type=float, default=0.7, help="a dy row load (DRAM)")
    a = ap.parse_args()
    start, length = segments()
    print("%d segments, the longest %d keys" % (start.sum(), length.max()))
    print("grid (blocks)        " + "".join("d=%-7g" % d for d in (0, 0.5, 1, 2)))
    for name, grid in (("16 an SM", 2112), ("8 keys a block", T // 8), ("4 keys a block", T // 4),
                       ("a key a block", T)):
        print("%-14s %5d " % (name, grid) + "".join(
            "%-9s" % ("%.1f us" % kernel_us(grid, d, a.load_us, a.dy_us, start, length)) for d in (0, 0.5, 1, 2)))


if __name__ == "__main__":
    main()
