"""Which GPT layouts keep one process's bits under data parallelism (README, "Data-parallel
training"): a small GPT through ``mojo_train.torch``, three AdamW steps, trained in one process and
by two gloo ranks on contiguous halves of each batch (``reduce_parameter_gradients``), compared by
the sha256 of the parameters.

    python bench/distributed_layouts.py [plain tied posbcast]

Layouts: ``plain`` (positions looked up per token, ``pos(arange(t).expand(b, t))``: every gradient
is a token-rule sum), ``tied`` (the head's weight is the token embedding's: autograd adds the two
gradients on each rank before the ranks combine), ``posbcast`` (``tok(idx) + pos(arange(t))``: the
(t, d) operand's gradient is torch's sum over the rank's rows). Prints, per layout, the two digests
and whether they are equal. Thirty-seventh session, this 2-core CPU (torch 2.13): plain equal, tied
and posbcast not.
"""
import hashlib
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from mojo_train import distributed as D  # noqa: E402
from mojo_train.torch import functional as F  # noqa: E402
from mojo_train.torch import nn, optim  # noqa: E402

VOCAB, T, DM, HEADS, B, STEPS = 65, 32, 32, 2, 64, 3
TOKENS = B * T        # 2048: 1024 a rank with two ranks (an aligned share)


class GPT(nn.Module):
    def __init__(self, layout):
        super().__init__()
        self.layout = layout
        self.tok, self.pos = nn.Embedding(VOCAB, DM), nn.Embedding(T, DM)
        self.ln1, self.qkv, self.proj = nn.LayerNorm(DM), nn.Linear(DM, 3 * DM), nn.Linear(DM, DM)
        self.ln2, self.fc, self.act, self.fc2 = nn.LayerNorm(DM), nn.Linear(DM, 4 * DM), nn.GELU(), nn.Linear(4 * DM, DM)
        self.lnf, self.head = nn.LayerNorm(DM), nn.Linear(DM, VOCAB, bias=False)
        if layout == "tied":
            self.head.weight = self.tok.weight

    def forward(self, idx, tgt):
        b, t = idx.shape
        positions = torch.arange(t) if self.layout == "posbcast" else torch.arange(t).expand(b, t)
        x = self.tok(idx) + self.pos(positions)
        q, k, v = self.qkv(self.ln1(x)).split(DM, 2)
        q, k, v = (z.view(b, t, HEADS, DM // HEADS).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, DM)
        x = x + self.proj(att)
        x = x + self.fc2(self.act(self.fc(self.ln2(x))))
        return F.cross_entropy(self.head(self.lnf(x)).view(-1, VOCAB), tgt.view(-1), num_items=TOKENS)


def batch(step):
    ids = torch.randint(0, VOCAB, (B, T + 1), generator=torch.Generator().manual_seed(step))
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def train(layout, world=1):
    torch.manual_seed(0)
    model = GPT(layout)
    opt = optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(STEPS):
        ids, tgt = batch(step)
        rows = D.contiguous_shard(len(ids)) if world > 1 else slice(0, len(ids))
        opt.zero_grad()
        model(ids[rows.start:rows.stop], tgt[rows.start:rows.stop]).backward()
        if world > 1:
            D.reduce_parameter_gradients(model.parameters(), tokens=TOKENS)
        opt.step()
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def rank_main(rank, world, layout, init, queue):
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        queue.put((rank, train(layout, world)))
    finally:
        dist.destroy_process_group()


def main(layouts):
    ctx = mp.get_context("spawn")
    for layout in layouts:
        one = train(layout)
        with tempfile.TemporaryDirectory() as tmp:
            queue = ctx.Queue()
            init = "file://" + os.path.join(tmp, "rendezvous")
            procs = [ctx.Process(target=rank_main, args=(r, 2, layout, init, queue)) for r in range(2)]
            for p in procs:
                p.start()
            digests = sorted(queue.get(timeout=300) for _ in procs)
            for p in procs:
                p.join()
        ranks = {d for _, d in digests}
        print("%-9s one process %s  two ranks %s  equal: %s"
              % (layout, one, ",".join(sorted(ranks)), ranks == {one}))


if __name__ == "__main__":
    main(sys.argv[1:] or ["plain", "tied", "posbcast"])
