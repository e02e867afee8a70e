"""``python -m mojo_train demo --model gpt``: a small GPT on the demo's text, every bit pinned.

Model: x = token embedding + position embedding (context CONTEXT); BLOCKS pre-norm blocks of
x = x + attention(LayerNorm(x)) and x = x + MLP(LayerNorm(x)) with a GELU MLP (4x width); a
final LayerNorm and the fused LM head. Causal multi-head attention runs head by head: each head
has its own query, key and value projections (width -> head size) and its share of the output
projection, so the (B, T, D) rows of a linear layer are already a (B, 1, T, D) attention input
and no transpose is needed; the heads' outputs are summed by ``mojo_train.add`` in head order.
AdamW in two param groups (weight decay on matrices, none on norms, biases and embeddings), the
demo's warmup-cosine schedule and clipping at 1.0. ``--vendor cpu`` and ``--vendor cuda`` print
the same digests (the backward is written out by hand below, in one fixed order).
"""
import time

CONTEXT, WIDTH, HEADS, BLOCKS, STEPS, BATCH = 64, 64, 4, 4, 300, 16


class GPT:
    def __init__(self, mt, vocab, mode):
        self.mt, self.mode, self.vocab = mt, mode, vocab
        g = mt.Generator(4321, numeric_mode=mode)
        d, w = WIDTH // HEADS, WIDTH
        self.p = {"tok": g.normal((vocab, w), 0.0, 0.02), "pos": g.normal((CONTEXT, w), 0.0, 0.02)}
        for b in range(BLOCKS):
            for n in ("ln1", "ln2"):
                self.p["%d.%s.w" % (b, n)] = mt.Array.from_list([1.0] * w)
                self.p["%d.%s.b" % (b, n)] = mt.Array.zeros((w,))
            for h in range(HEADS):
                for n in ("q", "k", "v"):
                    self.p["%d.%s%d" % (b, n, h)] = g.kaiming_uniform((d, w), w)
                self.p["%d.o%d" % (b, h)] = g.kaiming_uniform((w, d), w)
            self.p["%d.o.b" % b] = mt.Array.zeros((w,))
            self.p["%d.fc" % b] = g.kaiming_uniform((4 * w, w), w)
            self.p["%d.fc.b" % b] = mt.Array.zeros((4 * w,))
            self.p["%d.proj" % b] = g.kaiming_uniform((w, 4 * w), 4 * w)
            self.p["%d.proj.b" % b] = mt.Array.zeros((w,))
        self.p["lnf.w"], self.p["lnf.b"] = mt.Array.from_list([1.0] * w), mt.Array.zeros((w,))
        self.p["head"] = g.kaiming_uniform((vocab, w), w)
        self.names = list(self.p)
        self.decayed = [n for n in self.names if self.p[n].ndim == 2 and n not in ("tok", "pos")]

    def groups(self):
        rest = [n for n in self.names if n not in self.decayed]
        return [{"params": [self.p[n] for n in self.decayed], "weight_decay": 0.1},
                {"params": [self.p[n] for n in rest], "weight_decay": 0.0}], self.decayed + rest

    def loss_and_grads(self, ids, targets, batch, train=True):
        """Mean cross-entropy of ``targets`` (int64, batch x CONTEXT rows) and, with ``train``, the
        gradients by name."""
        mt, m, nn, p = self.mt, self.mode, self.mt.nn, self.p
        n, w, d = batch * CONTEXT, WIDTH, WIDTH // HEADS
        pos = mt.Array.from_list(list(range(CONTEXT)) * batch, "int64")
        x = mt.add(mt.embedding_forward(p["tok"], ids, numeric_mode=m),
                   mt.embedding_forward(p["pos"], pos, numeric_mode=m), numeric_mode=m)
        saved = []
        for b in range(BLOCKS):
            h1 = mt.layer_norm_forward(x, p["%d.ln1.w" % b], p["%d.ln1.b" % b], numeric_mode=m)
            heads, y = [], None
            for h in range(HEADS):
                q, k, v = (nn.linear_forward(h1, p["%d.%s%d" % (b, s, h)], numeric_mode=m).reshape(batch, 1, CONTEXT, d)
                           for s in "qkv")
                o, lse = mt.scaled_dot_product_attention(q, k, v, is_causal=True, return_lse=True, numeric_mode=m)
                o = o.reshape(n, d)
                part = nn.linear_forward(o, p["%d.o%d" % (b, h)], p["%d.o.b" % b] if h == 0 else None,
                                         numeric_mode=m)
                y = part if y is None else mt.add(y, part, numeric_mode=m)
                heads.append((q, k, v, o, lse))
            x1 = mt.add(x, y, numeric_mode=m)
            h2 = mt.layer_norm_forward(x1, p["%d.ln2.w" % b], p["%d.ln2.b" % b], numeric_mode=m)
            a = nn.linear_forward(h2, p["%d.fc" % b], p["%d.fc.b" % b], numeric_mode=m)
            z = mt.gelu_forward(a, numeric_mode=m)
            x2 = mt.add(x1, nn.linear_forward(z, p["%d.proj" % b], p["%d.proj.b" % b], numeric_mode=m), numeric_mode=m)
            saved.append((x, h1, heads, x1, h2, a, z))
            x = x2
        hf = mt.layer_norm_forward(x, p["lnf.w"], p["lnf.b"], numeric_mode=m)
        if not train:
            return mt.linear_cross_entropy(hf, p["head"], targets, numeric_mode=m), None
        g = {}
        loss, dhf, g["head"] = mt.linear_cross_entropy(hf, p["head"], targets, return_grad=True, numeric_mode=m)
        dx, g["lnf.w"], g["lnf.b"] = mt.layer_norm_backward(dhf, x, p["lnf.w"], p["lnf.b"], numeric_mode=m)
        for b in reversed(range(BLOCKS)):
            x0, h1, heads, x1, h2, a, z = saved[b]
            dz, g["%d.proj" % b], g["%d.proj.b" % b] = nn.linear_backward(dx, z, p["%d.proj" % b], need_bias_grad=True,
                                                                           numeric_mode=m)
            da = mt.gelu_backward(dz, a, numeric_mode=m)
            dh2, g["%d.fc" % b], g["%d.fc.b" % b] = nn.linear_backward(da, h2, p["%d.fc" % b], need_bias_grad=True,
                                                                        numeric_mode=m)
            dn, g["%d.ln2.w" % b], g["%d.ln2.b" % b] = mt.layer_norm_backward(dh2, x1, p["%d.ln2.w" % b],
                                                                              p["%d.ln2.b" % b], numeric_mode=m)
            dx1 = mt.add(dx, dn, numeric_mode=m)                  # x1 feeds the residual and the norm
            dh1 = None
            for h in range(HEADS):
                q, k, v, o, lse = heads[h]
                do, g["%d.o%d" % (b, h)], *bias = nn.linear_backward(dx1, o, p["%d.o%d" % (b, h)],
                                                                    need_bias_grad=h == 0, numeric_mode=m)
                if h == 0:
                    g["%d.o.b" % b] = bias[0]
                dq, dk, dv = mt.scaled_dot_product_attention_backward(do.reshape(batch, 1, CONTEXT, d), q, k, v,
                                                                      o.reshape(batch, 1, CONTEXT, d), lse,
                                                                      is_causal=True, numeric_mode=m)
                for s, dpart in zip("qkv", (dq, dk, dv)):
                    dpart_in, g["%d.%s%d" % (b, s, h)] = nn.linear_backward(dpart.reshape(n, d), h1,
                                                                           p["%d.%s%d" % (b, s, h)], numeric_mode=m)
                    dh1 = dpart_in if dh1 is None else mt.add(dh1, dpart_in, numeric_mode=m)
            dn1, g["%d.ln1.w" % b], g["%d.ln1.b" % b] = mt.layer_norm_backward(dh1, x0, p["%d.ln1.w" % b],
                                                                               p["%d.ln1.b" % b], numeric_mode=m)
            dx = mt.add(dx1, dn1, numeric_mode=m)
        g["tok"] = mt.embedding_backward(dx, ids, self.vocab, numeric_mode=m)
        g["pos"] = mt.embedding_backward(dx, pos, CONTEXT, numeric_mode=m)
        return loss, g


def windows(mt, data, starts):
    """ids and next-character targets of the CONTEXT-long windows at ``starts``."""
    ids = [data[s + t] for s in starts for t in range(CONTEXT)]
    tgt = [data[s + t + 1] for s in starts for t in range(CONTEXT)]
    return mt.Array.from_list(ids, "int64"), mt.Array.from_list(tgt, "int64")


def train(mt, model, data, steps, out, every, mode):
    """``steps`` AdamW steps on random windows of ``data``; the loss of each step."""
    sched = mt.WarmupCosineLR(3e-3, warmup_steps=max(1, steps // 10), total_steps=steps + 1, min_lr=3e-4)
    groups, order = model.groups()
    opt = mt.AdamW(groups, lr_schedule=sched, numeric_mode=mode)
    draw = mt.Generator(99, numeric_mode=mode)
    losses, t0 = [], time.time()
    for step in range(1, steps + 1):
        starts = [int(u * (len(data) - CONTEXT - 1)) for u in draw.uniform((BATCH,)).tolist()]
        loss, grads = model.loss_and_grads(*windows(mt, data, starts), BATCH)
        opt.step([grads[n] for n in order], max_norm=1.0)
        losses.append(loss)
        if step == 1 or step % every == 0 or step == steps:
            out("step %4d/%d  train loss %.4f  lr %.6f  elapsed %.1f s"
                % (step, steps, loss, sched.lr_at(step), time.time() - t0))
    return losses


def held_out_loss(mt, model, data):
    """(mean loss, characters) over the held-out text's whole windows (the same on every vendor)."""
    starts = list(range(0, len(data) - CONTEXT - 1, CONTEXT))
    loss, _ = model.loss_and_grads(*windows(mt, data, starts), len(starts), train=False)
    return loss, len(starts) * CONTEXT


def digest_params(model):
    return [bytes(model.p[n].tobytes()) for n in model.names]
