"""Issue 13's model, written twice: with mojo_train.torch modules and its AdamW (a torch training
loop, torch's autograd), and against mojo_train's native API (the same arithmetic called by
hand). tests/test_torch_model.py requires the two to end in the same bytes on CPU and CUDA
tensors; bench/torch_overhead_cuda.py times one step of each.

Model: ids -> Embedding(vocab, width) -> ``blocks`` x [x = x + SiLU(Linear(RMSNorm(x)))] ->
LinearCrossEntropyLoss(width, vocab) (the fused LM head, mean over tokens). AdamW in two param
groups: weight decay on the matrices (embedding, linears, head), none on norms and biases.
"""
import torch

import mojo_train as mt
from mojo_train.torch import nn, optim

EPS = 1e-5          # RMSNorm's eps, explicit in both versions
LR, DECAY = 3e-3, 0.1


class TorchLM(nn.Module):
    """The model as a torch user writes it, with mojo_train.torch's modules."""

    def __init__(self, vocab, width, blocks, numeric_mode=None):
        super().__init__()
        kw = {"numeric_mode": numeric_mode}
        self.embed = nn.Embedding(vocab, width, **kw)
        self.norms = nn.ModuleList([nn.RMSNorm(width, eps=EPS, **kw) for _ in range(blocks)])
        self.linears = nn.ModuleList([nn.Linear(width, width, **kw) for _ in range(blocks)])
        self.act = nn.SiLU(**kw)
        self.head = nn.LinearCrossEntropyLoss(width, vocab, **kw)

    def forward(self, ids, targets):
        x = self.embed(ids)
        for norm, linear in zip(self.norms, self.linears):
            x = x + self.act(linear(norm(x)))
        return self.head(x.reshape(-1, x.shape[-1]), targets.reshape(-1))

    def param_groups(self):
        """The two groups: (decayed matrices, undecayed norms and biases), each in module order."""
        decay = [p for p in self.parameters() if p.ndim == 2]
        rest = [p for p in self.parameters() if p.ndim != 2]
        return [{"params": decay, "weight_decay": DECAY}, {"params": rest, "weight_decay": 0.0}]


def torch_optimizer(model, numeric_mode=None):
    return optim.AdamW(model.param_groups(), lr=LR, numeric_mode=numeric_mode)


def torch_step(model, opt, ids, targets):
    """One training step of the torch loop; the loss (a 0-d tensor)."""
    opt.zero_grad()
    loss = model(ids, targets)
    loss.backward()
    opt.step()
    return loss


class NativeLM:
    """The same model against the native API: its parameters are copies of ``model``'s (bytes), on
    the device when ``device`` (DeviceArrays), and its backward is written out by hand."""

    def __init__(self, model, device=False, numeric_mode=None):
        self.mode, self.blocks, self.device = numeric_mode, len(model.linears), device
        arrays = {}
        for name, p in model.named_parameters():
            host = mt.Array.from_bytes(p.detach().cpu().numpy().tobytes(), tuple(p.shape), "float32")
            arrays[name] = mt.to_device(host, numeric_mode=numeric_mode) if device else host
        self.arrays = arrays
        self.vocab = model.embed.num_embeddings
        groups = [[n for n, p in model.named_parameters() if p.ndim == 2],
                  [n for n, p in model.named_parameters() if p.ndim != 2]]
        self.order = groups[0] + groups[1]          # the optimizer's tensor order: group 0, then group 1
        self.opt = mt.AdamW([{"params": [arrays[n] for n in groups[0]], "weight_decay": DECAY},
                             {"params": [arrays[n] for n in groups[1]], "weight_decay": 0.0}], lr=LR,
                            numeric_mode=numeric_mode)

    def step(self, ids, targets):
        """Forward, backward and the AdamW step on ``ids`` and ``targets`` (torch int64 tensors on
        the CPU, copied into mojo_train arrays); the loss (a float)."""
        ids, targets = self._ids(ids), self._ids(targets)
        m, a, nn_ = self.mode, self.arrays, mt.nn
        x = mt.embedding_forward(a["embed.weight"], ids, numeric_mode=m)
        saved, grads = [], {}
        for k in range(self.blocks):
            h = nn_.rms_norm_forward(x, a["norms.%d.weight" % k], EPS, numeric_mode=m)
            z = nn_.linear_forward(h, a["linears.%d.weight" % k], a["linears.%d.bias" % k], numeric_mode=m)
            saved.append((x, h, z))
            x = mt.add(x, mt.silu_forward(z, numeric_mode=m), numeric_mode=m)
        loss, dx, grads["head.linear.weight"] = mt.linear_cross_entropy(x, a["head.linear.weight"], targets,
                                                                        return_grad=True, numeric_mode=m)
        for k in reversed(range(self.blocks)):
            x_in, h, z = saved[k]
            dz = mt.silu_backward(dx, z, numeric_mode=m)
            dh, grads["linears.%d.weight" % k], grads["linears.%d.bias" % k] = nn_.linear_backward(
                dz, h, a["linears.%d.weight" % k], need_bias_grad=True, numeric_mode=m)
            dxn, grads["norms.%d.weight" % k] = nn_.rms_norm_backward(dh, x_in, a["norms.%d.weight" % k], EPS,
                                                                      numeric_mode=m)
            dx = mt.add(dx, dxn, numeric_mode=m)   # x feeds the residual and the norm: autograd's sum
        grads["embed.weight"] = mt.embedding_backward(dx, ids, self.vocab, numeric_mode=m)
        self.opt.step([grads[n] for n in self.order])
        return loss

    def _ids(self, t):
        if not isinstance(t, torch.Tensor):        # already mojo_train's (a benchmark makes them beforehand)
            return t
        host = mt.Array.from_bytes(t.numpy().tobytes(), tuple(t.shape), "int64")
        return mt.to_device(host, numeric_mode=self.mode) if self.device else host

    def state_bytes(self):
        """Parameters (module order), then exp_avg and exp_avg_sq (the optimizer's order)."""
        out = b"".join(_host(self.arrays[n]).tobytes() for n in self.arrays)
        return out + _host(self.opt.exp_avg).tobytes() + _host(self.opt.exp_avg_sq).tobytes()


def torch_state_bytes(model, opt):
    """As NativeLM.state_bytes: parameters in module order, then each moment over the params in
    the optimizer's order (group 0's, then group 1's)."""
    out = b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())
    order = [p for g in opt.param_groups for p in g["params"]]
    for key in ("exp_avg", "exp_avg_sq"):
        out += b"".join(opt.state[p][key].detach().cpu().numpy().tobytes() for p in order)
    return out


def batch(step, vocab, tokens, seq=64):
    """The ids and next-token targets of one step, (tokens // seq, seq) int64, from a seeded torch
    generator (CPU): the same on every device."""
    g = torch.Generator().manual_seed(1000 + step)
    ids = torch.randint(0, vocab, (tokens // seq, seq), generator=g)
    targets = torch.randint(0, vocab, (tokens // seq, seq), generator=g)
    return ids, targets


def _host(array):
    return array.to_host() if isinstance(array, mt.DeviceArray) else array
