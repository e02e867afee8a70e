"""Dropout and the normal fill on a GPU, side by side with torch in one process.

    python bench/random_cuda.py [--log2n 28] [--repeat 40] [--write]

Buffers are torch CUDA tensors of 2**log2n float32, passed to mojo_train directly (through
__cuda_array_interface__, no copy); torch allocates from its caching allocator. Ours is timed
returning a new output (``ours_api_ms``: declared fresh, MT_MAP_OUT_FRESH, so the finiteness
check rides along in the one pass: 8 bytes an element) and into a preallocated ``out=``
(``ours_out_ms``, and the raw C call: a pre-pass first, 12 bytes). Every figure: the median wall-clock of --repeat
synchronized calls after warm-up (ours synchronizes before returning: it reads the refusal
word), and the bytes each side must move as a fraction of the measured device-to-device copy
bandwidth (torch's y.copy_(x) over the same 2**log2n floats: read + write).
Bytes: dropout forward/backward, ours into out=: the finiteness pre-pass reads x (nothing is
written when x holds NaN or inf), then read x + write y = 12 per element; a new output 8;
torch: 8 (its dropout also writes its 1-byte mask: 9). normal and uniform fills: write 4. Before timing, the first 2**20 outputs are
checked against the CPU oracle. SiLU and add: bench/elementwise_cuda.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _gpu import fp, gpu_record, matches_cpu_oracle, over_floats, timed  # noqa: E402

import mojo_train as mt  # noqa: E402
from mojo_train._native import load  # noqa: E402

P = 0.1


def bench(torch, n, repeat, bw):
    lib = load("identical").lib
    x = torch.rand(n, device="cuda") * 4 - 2
    y, dx = torch.empty_like(x), torch.empty_like(x)
    gen = mt.Generator(1234, numeric_mode="identical")
    _, key = gen.dropout(x, P, stream=0, out=y)
    torch.cuda.synchronize()
    rows = {"dropout_matches_cpu": matches_cpu_oracle(torch, x, y, "mt_dropout_forward", P, 1234, 0, 0)}
    ours_api = timed(lambda: gen.dropout(x, P, stream=0), repeat)
    ours_out = timed(lambda: gen.dropout(x, P, stream=0, out=y), repeat)
    ours_raw = timed(lambda: lib.mt_dropout_forward(fp(y), fp(x), P, 1234, 0, 0, n, 0), repeat)
    ours_bwd = timed(lambda: gen.dropout_backward(x, key), repeat)
    fresh = gen.dropout(x, P, stream=0)[0]
    rows["dropout_fresh_equals_out"] = bool(torch.equal(torch.as_tensor(fresh, device="cuda").view(torch.int32),
                                                        y.view(torch.int32)))
    theirs = timed(lambda: torch.nn.functional.dropout(x, P, training=True), repeat, sync=torch.cuda.synchronize)
    rows["dropout"] = {"elements": n, "p": P, "ours_api_ms": ours_api * 1e3, "ours_out_ms": ours_out * 1e3,
                       "ours_raw_c_ms": ours_raw * 1e3, "ours_backward_ms": ours_bwd * 1e3, "torch_ms": theirs * 1e3,
                       "ours_of_copy_bw": 8 * n / ours_api / bw, "ours_raw_of_copy_bw": 12 * n / ours_raw / bw,
                       "torch_of_copy_bw": 9 * n / theirs / bw}
    normal = timed(lambda: lib.mt_normal_fill(fp(y), 1234, 1, 0, 0.0, 1.0, n), repeat)
    normal_t = timed(lambda: y.normal_(), repeat, sync=torch.cuda.synchronize)
    rows["normal"] = {"normal_ms": normal * 1e3, "normal_torch_ms": normal_t * 1e3,
                      "normal_of_copy_bw": 4 * n / normal / bw}
    uniform = timed(lambda: lib.mt_uniform_fill(fp(y), 1234, 2, 0, 0.0, 1.0, n), repeat)
    uniform_t = timed(lambda: y.uniform_(), repeat, sync=torch.cuda.synchronize)
    rows["uniform"] = {"uniform_ms": uniform * 1e3, "uniform_torch_ms": uniform_t * 1e3,
                       "uniform_of_copy_bw": 4 * n / uniform / bw}
    return rows


def main():
    args, torch, rows = over_floats(__doc__, bench)
    d, o = rows["dropout"], rows["normal"]
    print("dropout p=%.1f over 2^%d: ours %.3f ms new output (%.0f%% of copy bw at 8 bytes), %.3f ms into out= (raw C "
          "call %.3f ms, %.0f%% at 12), backward %.3f ms; torch %.3f ms (%.0f%% at 9 bytes/element); matches the cpu "
          "oracle: %s, fresh equals out=: %s"
          % (P, args.log2n, d["ours_api_ms"], 100 * d["ours_of_copy_bw"], d["ours_out_ms"], d["ours_raw_c_ms"],
             100 * d["ours_raw_of_copy_bw"], d["ours_backward_ms"], d["torch_ms"], 100 * d["torch_of_copy_bw"],
             rows["dropout_matches_cpu"], rows["dropout_fresh_equals_out"]))
    print("normal fill %.3f ms (%.0f%%; torch normal_ %.3f ms)"
          % (o["normal_ms"], 100 * o["normal_of_copy_bw"], o["normal_torch_ms"]))
    u = rows["uniform"]
    print("uniform fill %.3f ms (%.0f%%; torch uniform_ %.3f ms)"
          % (u["uniform_ms"], 100 * u["uniform_of_copy_bw"], u["uniform_torch_ms"]))
    gpu_record(args, "random_cuda", rows, torch)


if __name__ == "__main__":
    main()
