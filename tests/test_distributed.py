"""Data-parallel training over torch.distributed (gloo, CPU processes) ends in one process's bytes.

Contract under test (mojo_train/distributed.py; issue 15 points 1-3): in process groups of 1, 2
and 4 ranks, each rank holding the contiguous share ``contiguous_shard`` gives it of a 4096-token
batch (4 leaves: shares of 4, 2 and 1 leaves are aligned), ``reduce_gradients`` makes every
rank's gradients the single process's, so training the issue-13 model (tests/_torch_model.py, a
tiny size, the mean over the whole batch: ``num_items``) for 3 steps ends in the parameter and
AdamW-state bytes of one process -- through the native API (Arrays, packed into one flat buffer),
with each rank's share first split into 1024-token microbatches (``accumulate_grads``, then the
reduction), through ``mojo_train.torch`` modules with ``reduce_parameter_gradients`` after
``backward()``, and through torch's ``DistributedDataParallel`` with ``token_rule_hook``
replacing its all-reduce (one flat bucket, read in place). Refusals -- a misaligned split, a
float64 gradient on one rank, ranks passing other tokens, NaN on one rank, unequal initial
parameters -- are raised on every rank with the same type and text, nothing written on any
rank, and the group goes on working after them (no deadlock: the workers have a time limit).
Each rank sends 2 (N-1)/N of the gradient bytes. Torch's DistributedSampler interleaves ranks and
the order it implies changes the bits. Where the library takes device buffers and torch has a
GPU (issue 15 point 4 on one GPU), the workers also train the torch loop on CUDA tensors, which
reduce_gradients stages through host memory for gloo: the same bytes as one CPU process. The
batched transport NCCL takes (whole shards, ``batch_isend_irecv``) runs here on CPU tensors
over gloo (``D._BATCHED_ON_CPU_FOR_TESTS``): the same bytes, two batches and no single send, the
same volume and refusals; on two GPUs over NCCL: tests/test_distributed_nccl.py.

The workers (this file, run as a script) are one gloo world of 4 processes, started once per
identical library: groups of 4 are that world's default group, groups of 2 and 1 are
``new_subgroups`` of it (two pairs, four singles, side by side: every process runs every
scenario, and ``group=`` is exercised). Shards travel in pieces of 1000 floats there, so that
every shard is several pieces (a refusal in the first piece while later ones still arrive too).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")
if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
    pytest.skip("torch.distributed has no gloo here", allow_module_level=True)

import mojo_train as mt  # noqa: E402
from mojo_train import distributed as D  # noqa: E402
from mojo_train.torch import functional as F  # noqa: E402

from _torch_model import NativeLM, TorchLM, batch, torch_optimizer, torch_state_bytes  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB, WIDTH, BLOCKS, TOKENS, SEQ, STEPS = 97, 32, 1, 4096, 64, 3
WORKER_SECONDS = 150          # a deadlocked group is killed, and the test fails, after this
TRAININGS = ("native", "native_microbatches", "torch_reduce", "torch_ddp", "torch_reduce_batched", "torch_ddp_batched")
CUDA_TRAININGS = ("torch_reduce_cuda",)    # where the library takes device buffers and torch has a GPU
PROCESSES, WORLDS = 4, (1, 2, 4)       # one gloo world of 4 processes; groups of 1, 2 and 4 in it


# ---- the model: tests/_torch_model.py's, its mean divided by the whole batch ------------------

class ShareLM(NativeLM):
    """NativeLM whose gradients are returned (the optimizer's order) instead of stepped, for a
    share of a batch of ``tokens`` tokens: the loss's mean divides by ``tokens`` (num_items)."""

    def gradients(self, ids, targets, tokens):
        ids, targets = self._ids(ids), self._ids(targets)
        m, a, nn_ = self.mode, self.arrays, mt.nn
        x = mt.embedding_forward(a["embed.weight"], ids, numeric_mode=m)
        saved, grads = [], {}
        for k in range(self.blocks):
            h = nn_.rms_norm_forward(x, a["norms.%d.weight" % k], 1e-5, numeric_mode=m)
            z = nn_.linear_forward(h, a["linears.%d.weight" % k], a["linears.%d.bias" % k], numeric_mode=m)
            saved.append((x, h, z))
            x = mt.add(x, mt.silu_forward(z, numeric_mode=m), numeric_mode=m)
        _, dx, grads["head.linear.weight"] = mt.linear_cross_entropy(x, a["head.linear.weight"], targets,
                                                                     num_items=tokens, return_grad=True,
                                                                     numeric_mode=m)
        for k in reversed(range(self.blocks)):
            x_in, h, z = saved[k]
            dz = mt.silu_backward(dx, z, numeric_mode=m)
            dh, grads["linears.%d.weight" % k], grads["linears.%d.bias" % k] = nn_.linear_backward(
                dz, h, a["linears.%d.weight" % k], need_bias_grad=True, numeric_mode=m)
            dxn, grads["norms.%d.weight" % k] = nn_.rms_norm_backward(dh, x_in, a["norms.%d.weight" % k], 1e-5,
                                                                      numeric_mode=m)
            dx = mt.add(dx, dxn, numeric_mode=m)
        grads["embed.weight"] = mt.embedding_backward(dx, ids, self.vocab, numeric_mode=m)
        return [grads[n] for n in self.order]


class ShareTorchLM(TorchLM):
    """TorchLM whose head's mean divides by the whole batch's ``tokens`` (functional
    linear_cross_entropy with num_items; the head module has no such argument)."""

    def forward(self, ids, targets, tokens):
        x = self.embed(ids)
        for norm, linear in zip(self.norms, self.linears):
            x = x + self.act(linear(norm(x)))
        return F.linear_cross_entropy(x.reshape(-1, x.shape[-1]), self.head.linear.weight, targets.reshape(-1),
                                      num_items=tokens, numeric_mode=self.head.numeric_mode)


def _torch_model(numeric_mode):
    torch.manual_seed(0)
    return ShareTorchLM(VOCAB, WIDTH, BLOCKS, numeric_mode=numeric_mode)


def _share(step, rank, world):
    """This rank's contiguous rows (whole sequences) of step ``step``'s batch."""
    ids, targets = batch(step, VOCAB, TOKENS, SEQ)
    rows = D.contiguous_shard(len(ids), rank, world)
    return ids[rows.start:rows.stop].contiguous(), targets[rows.start:rows.stop].contiguous()


def train_native(numeric_mode, rank=0, world=1, microbatches=1, reduce=None):
    """STEPS AdamW steps of the native model on this rank's share (split into ``microbatches``
    accumulated microbatches), ``reduce`` applied to each step's gradients; the state bytes."""
    model = ShareLM(_torch_model(numeric_mode), numeric_mode=numeric_mode)
    for s in range(STEPS):
        ids, targets = _share(s, rank, world)
        rows = len(ids) // microbatches
        parts = [model.gradients(ids[k * rows:(k + 1) * rows], targets[k * rows:(k + 1) * rows], TOKENS)
                 for k in range(microbatches)]
        grads = parts[0] if microbatches == 1 else mt.accumulate_grads(parts, TOKENS // world)
        if reduce:
            reduce(grads)
        model.opt.step(grads)
    return model.state_bytes()


def train_torch(numeric_mode, rank=0, world=1, reduce=None, wrap=None, device="cpu"):
    """STEPS steps of the mojo_train.torch model on ``device``: ``reduce(model)`` after each
    backward, or the forward through ``wrap(model)`` (DDP); the state bytes."""
    model = _torch_model(numeric_mode).to(device)
    opt = torch_optimizer(model, numeric_mode=numeric_mode)
    run = wrap(model) if wrap else model
    for s in range(STEPS):
        ids, targets = (t.to(device) for t in _share(s, rank, world))
        opt.zero_grad()
        run(ids, targets, TOKENS).backward()
        if reduce:
            reduce(model)
        opt.step()
    return torch_state_bytes(model, opt)


# ---- the worker (this file run as a script): every scenario of one world size ------------------

def _outcome(fn, watched):
    """(exception type, message) of ``fn()`` or None, and whether the bytes of ``watched`` (a list
    of torch tensors, on the CPU or a GPU) stayed the same."""
    before = [t.cpu().numpy().tobytes() for t in watched]
    try:
        fn()
        error = None
    except Exception as exc:       # recorded; the parent checks the type and text
        error = [type(exc).__name__, str(exc)]
    return {"error": error, "unchanged": before == [t.cpu().numpy().tobytes() for t in watched]}


def _grads(rank, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(100 * seed + rank)
    return [torch.randn(300, 7, generator=g).to(device), torch.randn(61, generator=g).to(device)]


def _refusals(rank, world, group):
    last = world - 1
    out = {}
    grads = _grads(rank)
    out["misaligned"] = _outcome(lambda: D.reduce_gradients(grads, 3 * 1024 * world, group), grads)
    bad = [g.double() if rank == last else g for g in grads]
    out["float64_on_one_rank"] = _outcome(lambda: D.reduce_gradients(bad, 1024 * world, group), grads)
    out["other_tokens_on_one_rank"] = _outcome(
        lambda: D.reduce_gradients(grads, 1024 * world * (2 if rank == last else 1), group), grads)
    nan = _grads(rank)
    if rank == last:
        nan[0][0, 0] = float("nan")       # in the first piece of shard 0: later pieces still arrive
    out["nan_on_one_rank"] = _outcome(lambda: D.reduce_gradients(nan, 1024 * world, group), nan)
    params = [p.detach().clone() for p in _torch_model(None).parameters()]
    shapes = [p.reshape(-1) if rank == last and i == 2 else p.clone() for i, p in enumerate(params)]
    out["other_shape_parameters"] = _outcome(lambda: D.check_same_parameters(shapes, group), shapes)
    out["same_parameters"] = _outcome(lambda: D.check_same_parameters(params, group), params)
    if rank == last:
        params[1][0] += 1.0
    out["unequal_parameters"] = _outcome(lambda: D.check_same_parameters(params, group), params)
    return out


def _volume(rank, world, group, device="cpu"):
    """Bytes this rank sends point to point (and in small all_gathers) reducing 100,003 floats in
    two tensors (shards of unequal sizes when 2 or 4 ranks share them) on ``device``, and whether
    the result is the tree over every rank's gradients. The sends are counted one by one
    (``isend``) and in batches (``batch_isend_irecv``: the batched transport)."""
    dist, sent, small, batches, singles = torch.distributed, [], [], [], []
    isend, all_gather, batch = dist.isend, dist.all_gather, dist.batch_isend_irecv

    def counted_isend(tensor, *args, **kw):
        sent.append(tensor.numel() * tensor.element_size())
        singles.append(1)
        return isend(tensor, *args, **kw)

    def counted_all_gather(outputs, tensor, *args, **kw):
        small.append(tensor.numel() * tensor.element_size())
        return all_gather(outputs, tensor, *args, **kw)

    def counted_batch(ops):
        batches.append(len(ops))
        sent.extend(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is isend)
        return batch(ops)

    every = [[torch.randn(70001, generator=torch.Generator().manual_seed(j)),
              torch.randn(30002, generator=torch.Generator().manual_seed(50 + j))] for j in range(world)]
    mine = [t.clone().to(device) for t in every[rank]]
    dist.isend, dist.all_gather, dist.batch_isend_irecv = counted_isend, counted_all_gather, counted_batch
    try:
        D.reduce_gradients(mine, 1024 * world, group)
    finally:
        dist.isend, dist.all_gather, dist.batch_isend_irecv = isend, all_gather, batch
    want = [mt.accumulate_grads([every[j][i] for j in range(world)], 1024 * world).tobytes() for i in range(2)]
    return {"sent": sum(sent), "small": max(small), "tree": want == [t.cpu().numpy().tobytes() for t in mine],
            "batches": len(batches), "single_sends": len(singles)}


def _batched_refusals(rank, world, group, device="cpu"):
    """Refusals through the batched transport, gradients on ``device``: NaN on the last rank
    (after the exchange), other tokens on the last rank (before), and the host transport on the
    others with the batched one on the last rank (the ranks' signatures differ)."""
    last, out = world - 1, {}
    nan = _grads(rank, device=device)
    if rank == last:
        nan[0][0, 0] = float("nan")
    out["nan_on_one_rank"] = _outcome(lambda: D.reduce_gradients(nan, 1024 * world, group), nan)
    grads = _grads(rank, device=device)
    out["other_tokens_on_one_rank"] = _outcome(
        lambda: D.reduce_gradients(grads, 1024 * world * (2 if rank == last else 1), group), grads)
    if world > 1:    # the others pass numpy arrays (the host transport), the last rank torch tensors
        mixed = [g.cpu().numpy() for g in grads] if rank != last else grads
        out["transports_differ"] = _outcome(lambda: D.reduce_gradients(mixed, 1024 * world, group), grads)
    return out


# payload lengths around the agreement's slot (504 bytes after the length): one all_gather, or two
_GATHER_SIZES = (0, 500, 502, 504, 2000)


def _scenarios(rank, world, group, mode, save, cuda):
    """Every scenario in ``group`` (this process is its rank ``rank`` of ``world``); with ``cuda``
    also the torch loop on CUDA tensors."""
    report = {"refusals": _refusals(rank, world, group), "volume": _volume(rank, world, group),
              "gathered": [[b.hex() for b in D._gather_bytes(bytes([65 + rank]) * (n + 3 * rank), group)]
                           for n in _GATHER_SIZES]}
    reduce = lambda grads: D.reduce_gradients(grads, TOKENS, group)  # noqa: E731
    save("native", train_native(mode, rank, world, reduce=reduce))
    save("native_microbatches", train_native(mode, rank, world, microbatches=4 // world, reduce=reduce))
    report["parameters_digest"] = D.check_same_parameters(_torch_model(mode).parameters(), group)
    save("torch_reduce", train_torch(mode, rank, world, reduce=lambda model: D.reduce_parameter_gradients(
        model.parameters(), TOKENS, group)))

    def ddp(model):
        wrapped = torch.nn.parallel.DistributedDataParallel(model, process_group=group)
        wrapped.register_comm_hook(D.TokenRuleState(TOKENS, group), D.token_rule_hook)
        return wrapped
    save("torch_ddp", train_torch(mode, rank, world, wrap=ddp))
    D._BATCHED_ON_CPU_FOR_TESTS = True     # the batched transport (NCCL's) on CPU tensors over gloo
    try:
        save("torch_reduce_batched", train_torch(mode, rank, world, reduce=lambda model:
                                                 D.reduce_parameter_gradients(model.parameters(), TOKENS, group)))
        save("torch_ddp_batched", train_torch(mode, rank, world, wrap=ddp))     # the hook's bucket, batched
        report["batched"] = {"volume": _volume(rank, world, group), "refusals": _batched_refusals(rank, world, group)}
    finally:
        D._BATCHED_ON_CPU_FOR_TESTS = False
    if cuda:             # CUDA tensors over gloo: staged through host memory by reduce_gradients
        save("torch_reduce_cuda", train_torch(mode, rank, world, device="cuda", reduce=lambda model:
                                              D.reduce_parameter_gradients(model.parameters(), TOKENS, group)))
    return report


def worker(config):
    """One of PROCESSES gloo processes: for each world size N, the scenarios in its group of N
    (the default group for N = PROCESSES, else torch.distributed.new_subgroups' group: the
    processes [k N, (k + 1) N) run one group each, side by side)."""
    rank, out, mode = config["rank"], config["out"], config["numeric_mode"]
    dist = torch.distributed
    torch.set_num_threads(1)
    D.PIECE_ELEMENTS = 1000         # many pieces a shard (the model's gradients: about 10,000 floats)
    dist.init_process_group("gloo", init_method="file://" + config["rendezvous"], rank=rank, world_size=PROCESSES)
    reports = {}
    for world in WORLDS:
        group = None if world == PROCESSES else dist.new_subgroups(group_size=world)[0]

        def save(name, data):
            with open(os.path.join(out, "%s_world%d_rank%d.bin" % (name, world, rank)), "wb") as f:
                f.write(data)
        reports[world] = _scenarios(dist.get_rank(group), world, group, mode, save, config["cuda"])
    with open(os.path.join(out, "report_rank%d.json" % rank), "w") as f:
        json.dump(reports, f)
    dist.destroy_process_group()


# ---- the parent: run each world once, compare with one process ---------------------------------

_RUNS, _REFERENCES = {}, {}


def _need(mode):
    for feature in ("linear", "rms_norm", "embedding", "lm_head", "accumulate"):
        if not mode.has(feature):
            pytest.skip("this library has no %s (mt_features)" % feature)


def _run_processes(mode):
    """Run the PROCESSES workers once per library; {world: {"reports": [per process], "bytes":
    {scenario: [per process]}}} (process p is rank p % world of its group)."""
    out = tempfile.mkdtemp(prefix="mt_distributed_")
    try:
        _launch(mode, out)
        return _read_outcomes(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def run_workers(script, configs, envs, seconds=WORKER_SECONDS):
    """Run ``script`` once per rank with its JSON config and environment, collect every worker
    before any verdict (all killed, and the test failed, if one is still going after
    ``seconds``), and require each to exit 0 (its output's tail in the failure)."""
    procs = [subprocess.Popen([sys.executable, script, json.dumps(config)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for config, env in zip(configs, envs)]
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=seconds)[0])
        except subprocess.TimeoutExpired:     # every worker killed; what each printed goes in the failure
            tails = []
            for rank, q in enumerate(procs):
                if rank >= len(logs):         # not collected yet: killed, then read
                    q.kill()
                    logs.append(q.communicate()[0] or "")
                tails.append("worker %d:\n%s" % (rank, logs[rank][-3000:]))
            pytest.fail("the %d workers did not finish in %d s (a deadlock?)\n%s" % (len(procs), seconds,
                                                                                 "\n".join(tails)))
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, "worker %d failed:\n%s" % (rank, log[-4000:])


def test_workers_still_going_are_killed_and_what_each_printed_is_reported(tmp_path):
    """A deadlocked group must not cost the run its diagnosis: run_workers kills every worker
    after its time and puts what each printed into the failure."""
    script = tmp_path / "worker.py"
    script.write_text("import json, sys, time\nrank = json.loads(sys.argv[1])['rank']\n"
                      "print('worker', rank, 'started', flush=True)\nif rank == 1:\n    time.sleep(60)\n")
    with pytest.raises(pytest.fail.Exception) as failure:
        run_workers(str(script), [{"rank": 0}, {"rank": 1}], [dict(os.environ)] * 2, 3)
    text = str(failure.value)
    assert "did not finish in 3 s" in text and "worker 0 started" in text and "worker 1 started" in text, text


def _launch(mode, out):
    env = dict(os.environ, MOJO_TRAIN_VENDOR=mode.vendor, MOJO_TRAIN_NUM_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    configs = [{"rank": rank, "out": out, "numeric_mode": mode.numeric_mode, "cuda": _cuda_tensors(mode),
                "rendezvous": os.path.join(out, "rendezvous")} for rank in range(PROCESSES)]
    run_workers(os.path.abspath(__file__), configs, [env] * PROCESSES)


def _cuda_tensors(mode):
    """Whether the workers also train on CUDA tensors: a library taking device buffers and a
    torch with a GPU."""
    return bool(mode.has("device_buffers") and torch.cuda.is_available())


def _read_outcomes(out):
    runs = {world: {"reports": [], "bytes": {}} for world in WORLDS}
    for rank in range(PROCESSES):
        with open(os.path.join(out, "report_rank%d.json" % rank)) as f:
            reports = json.load(f)
        for world in WORLDS:
            runs[world]["reports"].append(reports[str(world)])
            for name in TRAININGS + CUDA_TRAININGS:
                path = os.path.join(out, "%s_world%d_rank%d.bin" % (name, world, rank))
                if name in CUDA_TRAININGS and not os.path.exists(path):
                    continue
                with open(path, "rb") as f:
                    runs[world]["bytes"].setdefault(name, []).append(f.read())
    return runs


def run_world(mode, world):
    """The PROCESSES processes' outcomes in their groups of ``world``."""
    key = (mode.vendor, mode.numeric_mode)
    if key not in _RUNS:
        _RUNS[key] = _run_processes(mode)
    return _RUNS[key][world]


def reference(mode, kind):
    """One process's state bytes, without torch.distributed: 'native' or 'torch'."""
    key = (mode.vendor, mode.numeric_mode, kind)
    if key not in _REFERENCES:
        _REFERENCES[key] = train_native(mode.numeric_mode) if kind == "native" else train_torch(mode.numeric_mode)
    return _REFERENCES[key]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("scenario, kind", [("native", "native"), ("native_microbatches", "native"),
                                            ("torch_reduce", "torch"), ("torch_ddp", "torch"),
                                            ("torch_reduce_batched", "torch"), ("torch_ddp_batched", "torch")])
def test_every_rank_ends_in_one_process_bytes(identical, world, scenario, kind):
    _need(identical)
    got = run_world(identical, world)["bytes"][scenario]
    want = reference(identical, kind)
    assert len(got) == PROCESSES
    for p, data in enumerate(got):
        assert data == want, "%s, groups of %d: process %d's parameters or AdamW state differ from one " \
                             "process's" % (scenario, world, p)


@pytest.mark.parametrize("world", WORLDS)
def test_cuda_tensors_staged_through_gloo_end_in_one_cpu_process_bytes(identical, world):
    """Issue 15 point 4 on one GPU: ranks sharing it, their torch model on CUDA tensors, the
    gradients staged through host memory for gloo, end in the bytes of one process on CPU tensors."""
    _need(identical)
    if not identical.has("device_buffers"):
        pytest.skip("this library has no device_buffers (mt_features)")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    got = run_world(identical, world)["bytes"]["torch_reduce_cuda"]
    want = reference(identical, "torch")
    assert len(got) == PROCESSES
    for p, data in enumerate(got):
        assert data == want, "CUDA tensors, groups of %d: process %d differs from one CPU process" % (world, p)


def test_the_torch_and_native_references_are_the_same_bytes(identical):
    _need(identical)
    assert reference(identical, "torch") == reference(identical, "native")


def test_one_process_on_a_share_differs_so_the_reduction_is_doing_the_work(identical):
    """The check above could not pass by accident: rank 0's share alone trains to other bytes."""
    _need(identical)
    assert train_native(identical.numeric_mode, 0, 2) != reference(identical, "native")


def _refusal_outcomes(mode, world, name):
    return [r["refusals"][name] for r in run_world(mode, world)["reports"]]


def _same_refusal_everywhere(outcomes, kind, *words):
    first = outcomes[0]["error"]
    assert first is not None and first[0] == kind, first
    for rank, outcome in enumerate(outcomes):
        assert outcome["error"] == first, "rank %d raised %r, rank 0 %r" % (rank, outcome["error"], first)
        assert outcome["unchanged"], "rank %d's gradients were written by a refused call" % rank
    for word in words:
        assert word in first[1], first[1]
    return first[1]


@pytest.mark.parametrize("world", [2, 4])
def test_a_misaligned_split_is_refused_on_every_rank_with_the_fix(identical, world):
    _need(identical)
    text = _same_refusal_everywhere(_refusal_outcomes(identical, world, "misaligned"), "ValueError",
                                    "mojo_train.distributed.reduce_gradients: rank 0 refused",
                                    "%d ranks over tokens=%d are not aligned" % (world, 3 * 1024 * world),
                                    "e.g. tokens=%d for %d ranks" % (4 * 1024 * world, world), "nothing was written")
    assert "3 leaves of 1024 tokens" in text


def test_one_process_never_refuses_the_split(identical):
    _need(identical)
    assert _refusal_outcomes(identical, 1, "misaligned") == [{"error": None, "unchanged": True}] * PROCESSES


@pytest.mark.parametrize("world", [2, 4])
def test_a_refusal_on_one_rank_reaches_every_rank(identical, world):
    _need(identical)
    _same_refusal_everywhere(_refusal_outcomes(identical, world, "float64_on_one_rank"), "TypeError",
                             "rank %d refused" % (world - 1), "float64")
    _same_refusal_everywhere(_refusal_outcomes(identical, world, "other_tokens_on_one_rank"), "ValueError",
                             "the ranks disagree", "rank %d passes tokens=%d" % (world - 1, 2048 * world))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_nan_on_one_rank_is_refused_on_every_rank_after_the_exchange(identical, world):
    _need(identical)
    _same_refusal_everywhere(_refusal_outcomes(identical, world, "nan_on_one_rank"), "ValueError",
                             "rank %d's gradients hold NaN or inf" % (world - 1))


@pytest.mark.parametrize("world", [2, 4])
def test_unequal_initial_parameters_are_refused_on_every_rank(identical, world):
    _need(identical)
    assert _refusal_outcomes(identical, world, "same_parameters")[0]["error"] is None
    _same_refusal_everywhere(_refusal_outcomes(identical, world, "unequal_parameters"), "ValueError",
                             "rank %d's tensor 1" % (world - 1), "different parameters")
    digests = {r["parameters_digest"] for r in run_world(identical, world)["reports"]}
    assert len(digests) == 1
    _same_refusal_everywhere(_refusal_outcomes(identical, world, "other_shape_parameters"), "ValueError",
                             "rank %d's tensor 2 has shape" % (world - 1), "different parameters")


@pytest.mark.parametrize("world", [1, 2, 4])
def test_each_rank_sends_a_ring_all_reduces_volume(identical, world):
    _need(identical)
    n = 100003
    for p, report in enumerate(run_world(identical, world)["reports"]):
        rank = p % world
        shard = (rank + 1) * n // world - rank * n // world
        v = report["volume"]
        assert v["tree"], "process %d's result is not the tree over its group's gradients" % p
        assert v["sent"] == 4 * ((n - shard) + (world - 1) * shard)    # about 2 (N-1)/N of 4n bytes
        assert v["batches"] == 0                                        # host buffers: pieces, one by one
        assert v["small"] < 4096                                        # the agreements: a few bytes


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_batched_transport_sends_a_ring_all_reduces_volume_and_refuses_alike(identical, world):
    """NCCL's transport (whole shards, batch_isend_irecv), run on CPU tensors over gloo: the same
    volume, the same tree, and its refusals on every rank with nothing written."""
    _need(identical)
    n = 100003
    reports = run_world(identical, world)["reports"]
    for p, report in enumerate(reports):
        rank = p % world
        shard = (rank + 1) * n // world - rank * n // world
        v = report["batched"]["volume"]
        assert v["tree"], "process %d's result is not the tree over its group's gradients" % p
        assert v["sent"] == 4 * ((n - shard) + (world - 1) * shard)
        assert (v["batches"], v["single_sends"]) == ((2, 0) if world > 1 else (0, 0)), v   # the batched path ran
    outcomes = lambda name: [r["batched"]["refusals"][name] for r in reports]  # noqa: E731
    _same_refusal_everywhere(outcomes("nan_on_one_rank"), "ValueError",
                             "rank %d's gradients hold NaN or inf" % (world - 1))
    if world > 1:
        _same_refusal_everywhere(outcomes("other_tokens_on_one_rank"), "ValueError", "the ranks disagree")
        _same_refusal_everywhere(outcomes("transports_differ"), "ValueError", "the ranks disagree",
                                 "whole shards on cpu")


def _one_rank_group(monkeypatch, backend):
    """A stand-in process group of one rank with ``backend`` (no messages: world 1), its
    agreement returning this rank's outcome or raising its refusal; the refusals agreed."""
    monkeypatch.setattr(D.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(D.dist, "get_world_size", lambda group=None: 1)
    monkeypatch.setattr(D.dist, "get_rank", lambda group=None: 0)
    monkeypatch.setattr(D.dist, "get_backend", lambda group=None: backend)
    agreed = []

    def agree(where, group, failure, **mine):
        agreed.append(failure)
        if failure:
            raise failure
        return [dict(mine, error=None)]
    monkeypatch.setattr(D, "_agree", agree)
    return agreed


@pytest.mark.parametrize("batched", [False, True])
def test_gradients_given_as_a_generator_are_read_once(monkeypatch, batched):
    """reduce_parameter_gradients' callers pass model.parameters(), a generator; reduce_gradients
    takes any iterable of buffers and reads it once."""
    _one_rank_group(monkeypatch, "gloo")
    monkeypatch.setattr(D, "_BATCHED_ON_CPU_FOR_TESTS", batched)
    grads = [torch.arange(6, dtype=torch.float32), torch.ones(3)]
    before = [g.clone() for g in grads]
    D.reduce_gradients((g for g in grads), 1024)
    assert all(torch.equal(g, b) for g, b in zip(grads, before))    # one rank: the tree of one part
    with pytest.raises(ValueError, match=r"grads is an empty list"):
        D.reduce_gradients((g for g in []), 1024)


def test_an_nccl_group_refuses_host_buffers_and_an_unknown_backend_is_refused(monkeypatch):
    """Decided locally and the same on every rank: host buffers cannot go over NCCL alone."""
    agreed = _one_rank_group(monkeypatch, "nccl")
    with pytest.raises(TypeError, match=r"backend is 'nccl', which moves CUDA tensors only, and grads are not all "
                                        r"CUDA torch tensors.*cpu:gloo,cuda:nccl"):
        D.reduce_gradients([torch.zeros(3)], None)
    assert len(agreed) == 1            # refused through the agreement: no rank waits alone
    monkeypatch.setattr(D.dist, "get_backend", lambda group=None: "mpi")
    with pytest.raises(NotImplementedError, match=r"backend is 'mpi'.*'gloo', 'nccl' or 'cpu:gloo,cuda:nccl'"):
        D.reduce_gradients([torch.zeros(3)], None)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_agreement_gathers_every_ranks_bytes_short_or_long(identical, world):
    """The agreement's gather: every rank's payload, in rank order, whether all fit the fixed slot
    or some rank's does not (then a second round; ranks of one call may straddle the edge)."""
    _need(identical)
    for p, report in enumerate(run_world(identical, world)["reports"]):
        want = [[(bytes([65 + r]) * (n + 3 * r)).hex() for r in range(world)] for n in _GATHER_SIZES]
        assert report["gathered"] == want, "process %d" % p


# ---- sharding, in this process --------------------------------------------------------------------

def test_contiguous_shard_cuts_equal_runs_in_rank_order():
    assert [D.contiguous_shard(64, r, 4) for r in range(4)] == [range(0, 16), range(16, 32), range(32, 48),
                                                                range(48, 64)]
    with pytest.raises(ValueError, match=r"n=6 items do not split into 4 equal shares"):
        D.contiguous_shard(6, 0, 4)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 3\]"):
        D.contiguous_shard(8, 4, 4)


def test_the_batch_sampler_gives_each_rank_its_run_of_every_global_batch():
    for shuffle in (False, True):
        ranks = [list(D.ContiguousBatchSampler(40, 8, r, 2, shuffle=shuffle, seed=3)) for r in range(2)]
        assert len(ranks[0]) == 5
        whole = [a + b for a, b in zip(*ranks)]
        order = sum(whole, [])
        assert sorted(order) == list(range(40))
        assert (order == list(range(40))) == (not shuffle)


def test_distributed_sampler_interleaves_and_that_order_changes_the_bits(identical):
    """torch's DistributedSampler gives rank 0 samples 0, 2, 4, ...; the batch the two ranks then
    hold is the single process's in another order, and a token-rule gradient over it has other bits."""
    _need(identical)
    from torch.utils.data import DistributedSampler
    assert list(DistributedSampler(range(8), num_replicas=2, rank=0, shuffle=False)) == [0, 2, 4, 6]
    g = torch.Generator().manual_seed(7)
    dc, a, w = torch.randn(4096, 16, generator=g), torch.randn(4096, 8, generator=g), torch.randn(16, 8, generator=g)
    interleaved = torch.cat([torch.arange(0, 4096, 2), torch.arange(1, 4096, 2)])
    mode = identical.numeric_mode
    in_order = mt.nn.linear_backward(dc, a, w, numeric_mode=mode)[1]
    reordered = mt.nn.linear_backward(dc[interleaved].contiguous(), a[interleaved].contiguous(), w,
                                      numeric_mode=mode)[1]
    assert in_order.tobytes() != reordered.tobytes()


def test_calls_outside_a_process_group_are_refused():
    with pytest.raises(RuntimeError, match="no process group"):
        D.reduce_gradients([torch.zeros(4)], 1024)
    with pytest.raises(RuntimeError, match="no process group"):
        D.contiguous_shard(8)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
