"""Every float x with 2^-64 <= |x| <= 64 through SiLU and its gradient on a GPU: the fast float4
groups against the per-element path, byte for byte, in every exact mode (the fast mode's
division is approximate, and its groups keep it).

    python bench/silu_division_sweep.py [--chunk-log2 26] [--modes identical,identical_ftz,deterministic]

native/cuda/mt_gpu_elementwise.cu forms SiLU's quotient x / (1 + e) and its gradient's
reciprocal 1 / (1 + e) without div.rn's range check and slow path where a float4 group's four x
all lie in that range (``silu_fast``). The per-element path (taken when a buffer is not 16-byte
aligned) keeps the IEEE operators; the cards check it, and the aligned path, against the CPU
oracle on their inputs. This sweep is the proof for the rest: each chunk of consecutive floats is
run aligned (every group fast) and 4 bytes off alignment (every element on the IEEE path), with a
new output (the finiteness check fused) and into ``out=`` (the pre-pass), forward and backward
with dy = 1 (the gradient is dy * g(x) with one final rounding, so g(x) equal for every x gives
equal bytes for every dy). Prints each mode's count of floats and of differing results (0
expected) and exits 1 on any difference.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

LO_BITS, HI_BITS = 0x1F800000, 0x42800000     # 2^-64 and 64, both ends included


def chunks(chunk):
    """(first bits, count) of consecutive positive floats covering [2^-64, 64]."""
    start = LO_BITS
    while start <= HI_BITS:
        count = min(chunk, HI_BITS + 1 - start)
        yield start, count
        start += count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk-log2", type=int, default=26)
    ap.add_argument("--modes", default="identical,identical_ftz,deterministic")
    args = ap.parse_args()
    os.environ.setdefault("MOJO_TRAIN_VENDOR", "cuda")
    import torch
    from mojo_train import elementwise as ew

    def as_bits(y):
        return torch.as_tensor(y, device="cuda").view(torch.int32)

    def unaligned(t):
        buf = torch.empty(t.numel() + 4, device="cuda")
        view = buf[1:t.numel() + 1]
        view.copy_(t)
        return view

    failed = False
    for mode in args.modes.split(","):
        checked = differing = 0
        first = []
        for start, count in chunks(1 << args.chunk_log2):
            pos = torch.arange(start, start + count, dtype=torch.int64, device="cuda").to(torch.int32)
            for sign in (0, -0x80000000):
                x = (pos | sign).view(torch.float32) if sign else pos.view(torch.float32)
                ones = torch.ones_like(x)
                ux, uones = unaligned(x), unaligned(ones)
                out_a, out_u = torch.empty_like(x), unaligned(torch.empty_like(x))
                pairs = [
                    (ew.silu_forward(x, numeric_mode=mode), ew.silu_forward(ux, numeric_mode=mode), "forward"),
                    (ew.silu_backward(ones, x, numeric_mode=mode), ew.silu_backward(uones, ux, numeric_mode=mode),
                     "backward"),
                ]
                ew.silu_forward(x, out=out_a, numeric_mode=mode)
                ew.silu_forward(ux, out=out_u, numeric_mode=mode)
                pairs.append((out_a.clone(), out_u.clone(), "forward out="))
                ew.silu_backward(ones, x, out=out_a, numeric_mode=mode)
                ew.silu_backward(uones, ux, out=out_u, numeric_mode=mode)
                pairs.append((out_a, out_u, "backward out="))
                for fast, ieee, what in pairs:
                    diff = as_bits(fast) != as_bits(ieee)
                    n = int(diff.sum())
                    if n and len(first) < 8:
                        i = int(diff.nonzero()[0])
                        first.append("%s x=%r (bits %08x): fast %08x, IEEE %08x" % (
                            what, float(x[i]), int(x.view(torch.int32)[i]) & 0xFFFFFFFF,
                            int(as_bits(fast)[i]) & 0xFFFFFFFF, int(as_bits(ieee)[i]) & 0xFFFFFFFF))
                    differing += n
                checked += count
        torch.cuda.synchronize()
        print("%s: %d floats x in [2^-64, 64] and [-64, -2^-64], forward and backward, new output and out=: "
              "%d differing results" % (mode, checked, differing))
        for line in first:
            print("  " + line)
        failed |= differing != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
