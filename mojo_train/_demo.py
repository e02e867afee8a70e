"""``python -m mojo_train demo``: a small character-level language model trained end to end on
the library's own ops, whose every bit is pinned (identical tier).

Model, per token: x = Embedding(id); h = RMSNorm(x); a = h @ W1.T + b1; z = dropout(SiLU(a));
r = x + z @ W2.T (the residual); loss = cross-entropy of r @ Wout.T against the next character
(the fused LM head). AdamW with a warmup-cosine schedule and gradient clipping at 1.0. The text
is the project's own contracts (native/contracts/*.md, shipped with the source), split 90/10
into training and held-out characters; batches are drawn by the library's Philox.

It prints a progress line per step, then the held-out loss against the text's unigram entropy
(which it must beat), the sha256 of the loss curve (float32 bytes) and of the final checkpoint,
and writes the loss curve as an SVG. ``--vendor cpu`` and ``--vendor cuda`` print the same
digests: that is the point.
"""
import hashlib
import math
import os
import struct
import time

_TEXT_DIRS = (os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "native", "contracts"),
              os.path.join(os.path.dirname(os.path.abspath(__file__)), "contracts"))


def _text():
    for d in _TEXT_DIRS:
        if os.path.isdir(d):
            names = sorted(n for n in os.listdir(d) if n.endswith(".md"))
            return "".join(open(os.path.join(d, n), encoding="utf-8").read() for n in names)
    raise FileNotFoundError("mojo_train demo: the shipped text (native/contracts/*.md) is missing")


def _svg(losses, path):
    w, h, lo, hi = 640, 320, min(losses), max(losses)
    pts = " ".join("%.1f,%.1f" % (20 + 600 * i / max(1, len(losses) - 1), 300 - 280 * (v - lo) / ((hi - lo) or 1))
                   for i, v in enumerate(losses))
    with open(path, "w") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d">'
                '<rect width="100%%" height="100%%" fill="white"/>'
                '<polyline fill="none" stroke="black" points="%s"/>'
                '<text x="24" y="16" font-size="12">training loss, %.3f to %.3f nats</text></svg>\n'
                % (w, h, pts, hi, lo))


class _Model:
    def __init__(self, mt, vocab, dim, hidden, mode):
        self.mt, self.mode = mt, mode
        g = mt.Generator(1234, numeric_mode=mode)
        self.emb = mt.Embedding(vocab, dim, generator=g, numeric_mode=mode)
        self.norm_w = mt.Array.from_list([1.0] * dim)
        self.w1 = g.kaiming_uniform((hidden, dim), dim)
        self.b1 = mt.Array.zeros((hidden,))
        self.w2 = g.kaiming_uniform((dim, hidden), hidden)
        self.wout = g.kaiming_uniform((vocab, dim), dim)
        self.gen, self.vocab = g, vocab
        self.params = [self.emb.weight, self.norm_w, self.w1, self.b1, self.w2, self.wout]

    def loss_and_grads(self, ids, targets, train=True):
        mt, m, nn = self.mt, self.mode, self.mt.nn
        x = self.emb.forward(ids)
        h = nn.rms_norm_forward(x, self.norm_w, 1e-5, numeric_mode=m)
        a = nn.linear_forward(h, self.w1, self.b1, numeric_mode=m)
        s = mt.silu_forward(a, numeric_mode=m)
        z, key = self.gen.dropout(s, 0.1 if train else 0.0)
        r = mt.add(x, nn.linear_forward(z, self.w2, numeric_mode=m), numeric_mode=m)
        if not train:
            return mt.linear_cross_entropy(r, self.wout, targets, numeric_mode=m), None
        loss, d_r, d_wout = mt.linear_cross_entropy(r, self.wout, targets, return_grad=True, numeric_mode=m)
        d_z, d_w2 = nn.linear_backward(d_r, z, self.w2, numeric_mode=m)
        d_a = mt.silu_backward(self.gen.dropout_backward(d_z, key), a, numeric_mode=m)
        d_h, d_w1, d_b1 = nn.linear_backward(d_a, h, self.w1, need_bias_grad=True, numeric_mode=m)
        d_xn, d_norm = nn.rms_norm_backward(d_h, x, self.norm_w, 1e-5, numeric_mode=m)
        d_emb = mt.embedding_backward(mt.add(d_r, d_xn, numeric_mode=m), ids, self.vocab, numeric_mode=m)
        return loss, [d_emb, d_norm, d_w1, d_b1, d_w2, d_wout]


def run(vendor=None, steps=150, batch=1024, svg="demo_loss.svg", out=print):
    if vendor:
        os.environ["MOJO_TRAIN_VENDOR"] = vendor
    import mojo_train as mt
    mode = "identical"
    text = _text()
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = [index[c] for c in text]
    split = len(data) * 9 // 10
    train, held = data[:split], data[split:]
    model = _Model(mt, len(chars), 48, 192, mode)
    sched = mt.WarmupCosineLR(3e-3, warmup_steps=max(1, steps // 10), total_steps=steps + 1, min_lr=3e-4)
    opt = mt.AdamW(model.params, lr_schedule=sched, weight_decay=0.01, numeric_mode=mode)
    draw = mt.Generator(99, numeric_mode=mode)
    losses, t0 = [], time.time()
    for step in range(1, steps + 1):
        u = draw.uniform((batch,)).tolist()
        pos = [int(v * (split - 1)) for v in u]
        ids = mt.Array.from_list([train[p] for p in pos], "int64")
        targets = mt.Array.from_list([train[p + 1] for p in pos], "int64")
        loss, grads = model.loss_and_grads(ids, targets)
        norm = opt.step(grads, max_norm=1.0)
        losses.append(loss)
        out("step %4d  loss %.4f  grad norm %.4f  lr %.6f" % (step, loss, norm, sched.lr_at(step)))
    held_ids = mt.Array.from_list(held[:-1], "int64")
    held_t = mt.Array.from_list(held[1:], "int64")
    held_loss, _ = model.loss_and_grads(held_ids, held_t, train=False)
    counts = [0] * len(chars)
    for c in train:
        counts[c] += 1
    entropy = -sum(n / len(train) * math.log(n / len(train)) for n in counts if n)
    curve = hashlib.sha256(struct.pack("<%df" % len(losses), *losses)).hexdigest()
    ckpt = hashlib.sha256(b"".join(bytes(p.tobytes()) for p in model.params)).hexdigest()
    _svg(losses, svg)
    out("held-out loss %.4f nats; unigram entropy of the text %.4f nats: %s" %
        (held_loss, entropy, "beaten" if held_loss < entropy else "NOT beaten"))
    out("loss curve sha256 %s" % curve)
    out("checkpoint sha256 %s" % ckpt)
    out("vendor %s, %d steps in %.1f s; loss curve written to %s" % (mt.backend_info()["vendor"], steps,
                                                                      time.time() - t0, svg))
    return 0 if held_loss < entropy else 1
