"""Data-parallel training over NCCL, each rank on its own GPU, ends in one CPU process's bytes.

Contract under test (mojo_train/distributed.py, "Transports"; issue 15 point 4): two processes,
each seeing one GPU as its device 0 (``CUDA_VISIBLE_DEVICES``), in an NCCL group (NVLink
multicast off: ``NCCL_NVLS_ENABLE=0``), train tests/test_distributed.py's torch model on CUDA
tensors for its 3 steps, each rank on its contiguous share of the 4096-token batch, reducing
with ``reduce_parameter_gradients`` -- and through ``DistributedDataParallel`` with
``token_rule_hook`` -- by the batched transport (whole shards, ``batch_isend_irecv``, the GPU
library's ``mt_accumulate``); both end in the parameter and AdamW-state bytes one CPU process
computes, a CPU library's process (``MOJO_TRAIN_VENDOR=cpu``). NaN, or other tokens, on one
rank are refused on both, nothing written; ``check_same_parameters`` agrees over NCCL alone
(its agreement's tensors on the GPU). Shards of unequal sizes (100,003 floats) end in the tree
over both ranks in two batches and no single sends, in an NCCL group and in a
``cpu:gloo,cuda:nccl`` one (its agreements over gloo, its first NCCL message a batch).

A hung worker prints its stack and exits (faulthandler) before the parent kills the group, and
a failed run is not repeated by the next test.

Needs a GPU library (MOJO_TRAIN_VENDOR=cuda) and two CUDA GPUs for torch; the batched
transport's logic also runs on CPU tensors over gloo in tests/test_distributed.py.
"""
import datetime
import faulthandler
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

import test_distributed as T  # noqa: E402  (the model, its training loops and the one-process reference)
from mojo_train import distributed as D  # noqa: E402

RANKS = 2
SCENARIOS = ("torch_reduce_nccl", "torch_ddp_nccl")
COLLECTIVE_SECONDS = 60      # a collective waiting longer fails (before faulthandler and the parent act)


def _recorded(fn):
    """fn()'s result, or {"error": [type, message]} when it raised: one scenario's failure is
    reported by its test instead of ending the worker."""
    try:
        return fn()
    except Exception as exc:
        return {"error": [type(exc).__name__, str(exc)]}


def worker(config):
    rank, out, mode = config["rank"], config["out"], config["numeric_mode"]
    dist = torch.distributed
    faulthandler.dump_traceback_later(T.WORKER_SECONDS - 30, exit=True)   # a hang prints where it is
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="file://" + config["rendezvous"], rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=COLLECTIVE_SECONDS))

    def save(name, data):
        with open(os.path.join(out, "%s_rank%d.bin" % (name, rank)), "wb") as f:
            f.write(data)

    report = {"parameters_digest": D.check_same_parameters(T._torch_model(mode).cuda().parameters())}
    save("torch_reduce_nccl", T.train_torch(mode, rank, RANKS, device="cuda", reduce=lambda model:
                                            D.reduce_parameter_gradients(model.parameters(), T.TOKENS)))

    def ddp(model):
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
        wrapped.register_comm_hook(D.TokenRuleState(T.TOKENS), D.token_rule_hook)
        return wrapped
    save("torch_ddp_nccl", T.train_torch(mode, rank, RANKS, device="cuda", wrap=ddp))
    nan = [g.cuda() for g in T._grads(rank)]
    if rank == RANKS - 1:
        nan[0][0, 0] = float("nan")
    report["nan_on_one_rank"] = T._outcome(lambda: D.reduce_gradients(nan, 1024 * RANKS), nan)
    report["refusals"] = T._batched_refusals(rank, RANKS, None, device="cuda")
    report["volume"] = _recorded(lambda: T._volume(rank, RANKS, None, device="cuda"))
    report["volume_mixed"] = _recorded(lambda: T._volume(
        rank, RANKS, dist.new_group(backend="cpu:gloo,cuda:nccl", timeout=datetime.timedelta(seconds=COLLECTIVE_SECONDS)),
        device="cuda"))
    with open(os.path.join(out, "report_rank%d.json" % rank), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


_RUNS = {}


def _pythonpath():
    """The repository and this folder (test_distributed), before the caller's PYTHONPATH."""
    return os.pathsep.join([T.ROOT, os.path.dirname(os.path.abspath(__file__))] +
                           [p for p in [os.environ.get("PYTHONPATH")] if p])


def visible_gpus():
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (all when it is unset)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return mask.split(",") if mask else [str(i) for i in range(torch.cuda.device_count())]


def _run(mode):
    """The workers' outcomes, run once per library: a failed run fails every test that asks
    again without running the workers again (a hang costs minutes of a GPU machine)."""
    key = (mode.vendor, mode.numeric_mode)
    if key not in _RUNS:
        try:
            _RUNS[key] = _launch(mode)
        except BaseException as exc:       # pytest.fail's exception included
            _RUNS[key] = exc
    if isinstance(_RUNS[key], BaseException):
        raise _RUNS[key]
    return _RUNS[key]


def _launch(mode):
    out = tempfile.mkdtemp(prefix="mt_nccl_")
    try:
        gpus = visible_gpus()
        envs = [dict(os.environ, MOJO_TRAIN_VENDOR=mode.vendor, CUDA_VISIBLE_DEVICES=gpus[rank], NCCL_NVLS_ENABLE="0",
                     PYTHONPATH=_pythonpath())
                for rank in range(RANKS)]          # each worker sees its own GPU as its device 0
        configs = [{"rank": rank, "out": out, "numeric_mode": mode.numeric_mode,
                    "rendezvous": os.path.join(out, "rendezvous")} for rank in range(RANKS)]
        T.run_workers(os.path.abspath(__file__), configs, envs, T.WORKER_SECONDS + 30)
        run = {"bytes": {}, "reports": []}
        for rank in range(RANKS):
            for name in SCENARIOS:
                with open(os.path.join(out, "%s_rank%d.bin" % (name, rank)), "rb") as f:
                    run["bytes"].setdefault(name, []).append(f.read())
            with open(os.path.join(out, "report_rank%d.json" % rank)) as f:
                run["reports"].append(json.load(f))
        return run
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _need_two_gpus(mode):
    T._need(mode)
    if not mode.has("device_buffers"):
        pytest.skip("this library has no device_buffers (mt_features)")
    if not (torch.distributed.is_available() and torch.distributed.is_nccl_available()):
        pytest.skip("torch.distributed has no NCCL here")
    if len(visible_gpus()) < RANKS or torch.cuda.device_count() < RANKS:
        pytest.skip("this machine has fewer than two CUDA GPUs for torch (NCCL needs one a rank)")


_CPU_REFERENCE = {}


def cpu_reference(mode):
    """One process's state bytes (tests/test_distributed.py's torch training) computed by the CPU
    library, in a process of its own (MOJO_TRAIN_VENDOR=cpu): this process's library is the GPU's."""
    if mode.numeric_mode not in _CPU_REFERENCE:
        code = "import sys, test_distributed as T; sys.stdout.buffer.write(T.train_torch(%r))" % mode.numeric_mode
        env = dict(os.environ, MOJO_TRAIN_VENDOR="cpu",
                   PYTHONPATH=_pythonpath())
        done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=T.WORKER_SECONDS)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        _CPU_REFERENCE[mode.numeric_mode] = done.stdout
    return _CPU_REFERENCE[mode.numeric_mode]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_gpus_over_nccl_end_in_one_cpu_process_bytes(identical, scenario):
    _need_two_gpus(identical)
    got = _run(identical)["bytes"][scenario]
    want = cpu_reference(identical)
    assert len(got) == RANKS
    for rank, data in enumerate(got):
        assert data == want, "%s: rank %d's parameters or AdamW state differ from one CPU process's" % (scenario, rank)


def test_nan_on_one_gpu_is_refused_on_both_and_parameters_agree_over_nccl(identical):
    _need_two_gpus(identical)
    reports = _run(identical)["reports"]
    T._same_refusal_everywhere([r["nan_on_one_rank"] for r in reports], "ValueError",
                               "rank %d's gradients hold NaN or inf" % (RANKS - 1))
    assert len({r["parameters_digest"] for r in reports}) == 1
    outcomes = lambda name: [r["refusals"][name] for r in reports]  # noqa: E731
    T._same_refusal_everywhere(outcomes("nan_on_one_rank"), "ValueError",
                               "rank %d's gradients hold NaN or inf" % (RANKS - 1))
    T._same_refusal_everywhere(outcomes("other_tokens_on_one_rank"), "ValueError", "the ranks disagree")
    # rank 0 passes numpy arrays, which an NCCL group cannot move: refused there, agreed by all
    T._same_refusal_everywhere(outcomes("transports_differ"), "TypeError", "rank 0 refused",
                               "moves CUDA tensors only")


@pytest.mark.parametrize("kind", ["volume", "volume_mixed"])
def test_shards_of_unequal_sizes_are_the_tree_in_two_batches(identical, kind):
    """100,003 floats in two tensors over 2 GPUs: the tree over both ranks' gradients, moved in
    the two batches of the batched transport and no single send; in an NCCL group and in a
    cpu:gloo,cuda:nccl one."""
    _need_two_gpus(identical)
    for rank, report in enumerate(_run(identical)["reports"]):
        v = report[kind]
        assert "error" not in v, "rank %d: %s" % (rank, v.get("error"))
        assert v["tree"], "rank %d's result is not the tree over both ranks' gradients" % rank
        assert (v["batches"], v["single_sends"]) == (2, 0), v


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
