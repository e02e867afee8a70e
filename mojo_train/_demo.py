"""``python -m mojo_train demo``: a small character-level language model trained end to end on
the library's own ops, whose every bit is pinned (identical numeric mode).

Model, per token: x = Embedding(id); h = RMSNorm(x); a = h @ W1.T + b1; z = dropout(SiLU(a));
r = x + z @ W2.T (the residual); loss = cross-entropy of r @ Wout.T against the next character
(the fused LM head). AdamW with a warmup-cosine schedule and gradient clipping at 1.0. The text
is a fixed essay shipped inside the package (mojo_train/data/demo_corpus.txt), so the digests
do not move when the documentation does; its first 90% of characters train, the last 10% are
held out; batches are drawn by the library's Philox.

A step's batch is BATCH = 4096 characters: four 1024-token leaves of the token rule, so 1, 2 or
4 processes can each take a contiguous, aligned share of it (``--distributed``,
mojo_train/_demo_distributed.py) and end in this process's bits. The dropout mask of a row is
the one stream element it has in the whole batch (one stream per step, offset by the row).

It prints a progress line every ``every`` steps (and at the first and the last), then a summary:
the held-out loss against the text's unigram entropy (which it must beat), the steps and time,
the sha256 of the loss curve (float32 bytes) and of the final checkpoint, and the path of the
SVG it writes (the loss per step, on labelled axes). ``--vendor cpu`` and ``--vendor cuda``
print the same digests: that is the point.
"""
import hashlib
import math
import os
import struct
import time
from importlib import resources

STEPS = 400          # the command line's default
BATCH = 4096         # characters per step: four 1024-token leaves (aligned shares for 1, 2 or 4 ranks)
PRINT_EVERY = 25
CORPUS = "data/demo_corpus.txt"


def _text():
    """The shipped essay, from the package (an installed wheel or a checkout alike)."""
    return resources.files(__package__).joinpath(CORPUS).read_text(encoding="utf-8")


def _nice_step(span, count):
    """The tick spacing 1, 2 or 5 times a power of ten that gives at most ``count`` ticks."""
    raw = span / count
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw)


def _ticks(lo, hi, count, whole=False):
    """(lo, hi, ticks): the range widened to whole ticks and the tick values in it."""
    step = _nice_step(hi - lo, count)
    step = max(1, round(step)) if whole else step
    lo, hi = math.floor(lo / step) * step, math.ceil(hi / step) * step
    return lo, hi, [lo + k * step for k in range(int(round((hi - lo) / step)) + 1)], step


def _label(value, step):
    return "%.*f" % (max(0, -math.floor(math.log10(step))), value)


# Plot area of the SVG: left, top, right, bottom (pixels of a 640 x 380 canvas).
_L, _T, _R, _B = 70, 40, 620, 320


def _axis(ticks, step, to_px, horizontal):
    parts = []
    for v in ticks:
        p = to_px(v)
        if horizontal:
            parts.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black"/>'
                         '<text x="%.1f" y="%d" text-anchor="middle">%s</text>'
                         % (p, _B, p, _B + 5, p, _B + 20, _label(v, step)))
        else:
            parts.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>'
                         '<text x="%d" y="%.1f" text-anchor="end">%s</text>'
                         % (_L, p, _R, p, _L - 6, p + 4, _label(v, step)))
    return "".join(parts)


def _svg(losses, path):
    """The loss per step as an SVG line chart: labelled axes and a title with the first and last loss."""
    n, lo, hi = len(losses), min(losses), max(losses)
    xlo, xhi, xt, xs = _ticks(0, n, 5, whole=True)
    ylo, yhi, yt, ys = _ticks(lo - 0.5 * (hi == lo), hi + 0.5 * (hi == lo), 6)
    x = lambda v: _L + (_R - _L) * (v - xlo) / (xhi - xlo)
    y = lambda v: _B - (_B - _T) * (v - ylo) / (yhi - ylo)
    points = " ".join("%.1f,%.1f" % (x(i + 1), y(v)) for i, v in enumerate(losses))
    with open(path, "w", encoding="utf-8") as f:
        f.write('<svg xmlns="http://www.w3.org/2000/svg" width="640" height="380" font-family="sans-serif" '
                'font-size="12"><rect width="100%%" height="100%%" fill="white"/>%s%s'
                '<path d="M%d %dV%dH%d" fill="none" stroke="black"/>'
                '<polyline fill="none" stroke="#1f5fa8" stroke-width="1.5" points="%s"/>'
                '<text x="%d" y="24" font-size="14">Training loss per step: first %.4f, last %.4f nats (%d step%s)</text>'
                '<text x="%d" y="%d" text-anchor="middle">step</text>'
                '<text transform="translate(18 %d) rotate(-90)" text-anchor="middle">loss (nats)</text></svg>\n'
                % (_axis(yt, ys, y, False), _axis(xt, xs, x, True), _L, _T, _B, _R, points,
                   _L, losses[0], losses[-1], n, "s"[:n != 1], (_L + _R) // 2, _B + 45, (_T + _B) // 2))


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

    def loss_and_grads(self, ids, targets, train=True, tokens=None, first_row=0, with_sum=False):
        """(mean loss, gradients in ``params`` order[, the rows' loss sum]) of the rows ``ids`` ->
        ``targets``. ``tokens``: the whole batch's rows (the mean's divisor) when these rows are
        the share starting at row ``first_row`` of it; ``with_sum`` also returns the token rule's
        sum of the rows' losses (what ranks add up to the batch's loss)."""
        mt, m, nn = self.mt, self.mode, self.mt.nn
        x = self.emb.forward(ids)
        h = nn.rms_norm_forward(x, self.norm_w, 1e-5, numeric_mode=m)
        a = nn.linear_forward(h, self.w1, self.b1, numeric_mode=m)
        s = mt.silu_forward(a, numeric_mode=m)
        if train:            # the step's stream, row r's mask at its place in the whole batch
            z, key = self.gen.dropout(s, 0.1, offset=first_row * s.shape[1], stream=self.gen.next_stream())
        else:
            z, key = self.gen.dropout(s, 0.0)
        r = mt.add(x, nn.linear_forward(z, self.w2, numeric_mode=m), numeric_mode=m)
        if not train:
            return mt.linear_cross_entropy(r, self.wout, targets, numeric_mode=m), None
        loss, d_r, d_wout = mt.linear_cross_entropy(r, self.wout, targets, num_items=tokens, return_grad=True,
                                                    numeric_mode=m)
        d_z, d_w2 = nn.linear_backward(d_r, z, self.w2, numeric_mode=m)
        d_a = mt.silu_backward(self.gen.dropout_backward(d_z, key), a, numeric_mode=m)
        d_h, d_w1, d_b1 = nn.linear_backward(d_a, h, self.w1, need_bias_grad=True, numeric_mode=m)
        d_xn, d_norm = nn.rms_norm_backward(d_h, x, self.norm_w, 1e-5, numeric_mode=m)
        d_emb = mt.embedding_backward(mt.add(d_r, d_xn, numeric_mode=m), ids, self.vocab, numeric_mode=m)
        grads = [d_emb, d_norm, d_w1, d_b1, d_w2, d_wout]
        if with_sum:
            return loss, grads, mt.linear_cross_entropy(r, self.wout, targets, reduction="sum", numeric_mode=m)
        return loss, grads


def _split(text):
    """(vocabulary, training ids, held-out ids): the first 90% of characters train."""
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    data = [index[c] for c in text]
    split = len(data) * 9 // 10
    return chars, data[:split], data[split:]


def _unigram_entropy(ids, vocab):
    """Nats per character of a forecaster that knows only the characters' frequencies."""
    counts = [0] * vocab
    for c in ids:
        counts[c] += 1
    return -sum(n / len(ids) * math.log(n / len(ids)) for n in counts if n)


def _train(mt, model, train, steps, batch, every, out, ranks=None):
    """``steps`` AdamW steps on random characters of ``train``; the loss of each step.
    ``ranks`` (mojo_train/_demo_distributed.py's Ranks, or None for one process): this process
    computes its contiguous share of each batch, and the ranks' gradients and loss sums become
    the whole batch's."""
    sched = mt.WarmupCosineLR(3e-3, warmup_steps=max(1, steps // 10), total_steps=steps + 1, min_lr=3e-4)
    opt = mt.AdamW(model.params, lr_schedule=sched, weight_decay=0.01, numeric_mode=model.mode)
    draw = mt.Generator(99, numeric_mode=model.mode)
    rows = ranks.rows if ranks else range(batch)
    losses, t0 = [], time.time()
    for step in range(1, steps + 1):
        pos = [int(v * (len(train) - 1)) for v in draw.uniform((batch,)).tolist()][rows.start:rows.stop]
        ids = mt.Array.from_list([train[p] for p in pos], "int64")
        targets = mt.Array.from_list([train[p + 1] for p in pos], "int64")
        if ranks:
            _, grads, loss_sum = model.loss_and_grads(ids, targets, tokens=batch, first_row=rows.start, with_sum=True)
            loss = ranks.reduce(grads, loss_sum, batch)
        else:
            loss, grads = model.loss_and_grads(ids, targets)
        opt.step(grads, max_norm=1.0)
        losses.append(loss)
        if step == 1 or step % every == 0 or step == steps:
            out("step %4d/%d  train loss %.4f  lr %.6f  elapsed %.1f s"
                % (step, steps, loss, sched.lr_at(step), time.time() - t0))
    return losses


def _digest(chunks):
    return hashlib.sha256(b"".join(chunks)).hexdigest()


def run(vendor=None, steps=None, batch=BATCH, svg="demo_loss.svg", every=PRINT_EVERY, out=print, model="mlp",
        ranks=None):
    """Train, evaluate on the held-out tenth, write the SVG, print the summary. ``model``: 'mlp'
    (the character MLP above) or 'gpt' (mojo_train/_demo_gpt.py; ``batch`` is then its own).
    ``ranks``: the process group's share of the work (MLP only; mojo_train/_demo_distributed.py),
    whose rank 0 alone prints and writes the SVG.

    Returns 0 when the held-out loss beats the unigram entropy, else 1.
    """
    if vendor:
        os.environ["MOJO_TRAIN_VENDOR"] = vendor
    import mojo_train as mt
    t0 = time.time()
    chars, train, held = _split(_text())
    if model == "gpt":
        from . import _demo_gpt as gpt
        steps = gpt.STEPS if steps is None else steps
        net = gpt.GPT(mt, len(chars), "identical")
        losses = gpt.train(mt, net, train, steps, out, every, "identical")
        held_loss, held_chars = gpt.held_out_loss(mt, net, held)
        batch, checkpoint = gpt.BATCH * gpt.CONTEXT, gpt.digest_params(net)
    else:
        steps = STEPS if steps is None else steps
        net = _Model(mt, len(chars), 48, 192, "identical")
        if ranks:
            ranks.check_same(net.params)
            out = out if ranks.rank == 0 else (lambda line: None)
        losses = _train(mt, net, train, steps, batch, every, out, ranks)
        held_loss, _ = net.loss_and_grads(mt.Array.from_list(held[:-1], "int64"),
                                          mt.Array.from_list(held[1:], "int64"), train=False)
        held_chars = len(held) - 1
        checkpoint = [bytes(p.tobytes()) for p in net.params]
    entropy = _unigram_entropy(train, len(chars))
    if ranks:
        ranks.check_same(net.params)      # every rank ends with the same checkpoint: the claim, checked
    if not ranks or ranks.rank == 0:
        _svg(losses, svg)
    beaten = held_loss < entropy
    out("summary (%s vendor, identical numeric mode, %s model%s)" % (mt.backend_info("identical")["vendor"], model,
                                                                      ranks.describe() if ranks else ""))
    out("  held-out loss      %.4f nats on %d characters; unigram entropy of the text %.4f nats: %s"
        % (held_loss, held_chars, entropy, "beaten" if beaten else "NOT beaten"))
    out("  steps              %d of %d characters each in %.1f s (training text: %d characters)"
        % (steps, batch, time.time() - t0, len(train)))
    out("  loss curve sha256  %s" % _digest([struct.pack("<%df" % len(losses), *losses)]))
    out("  checkpoint sha256  %s" % _digest(checkpoint))
    out("  loss curve SVG     %s" % os.path.abspath(svg))
    return 0 if beaten else 1
