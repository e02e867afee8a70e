"""Data-parallel training over NCCL, each rank on its own GPU, ends in one CPU process's bytes.

Contract under test (mojo_train/distributed.py, "Transports"; issue 15 point 4): two processes,
each seeing one GPU as its device 0 (``CUDA_VISIBLE_DEVICES``), in an NCCL group (NVLink
multicast off: ``NCCL_NVLS_ENABLE=0``), train tests/test_distributed.py's torch model on CUDA
tensors for its 3 steps, each rank on its contiguous share of the 4096-token batch, reducing
with ``reduce_parameter_gradients`` -- and through ``DistributedDataParallel`` with
``token_rule_hook`` -- by the batched transport (whole shards, ``batch_isend_irecv``, the GPU
library's ``mt_accumulate``); both end in the parameter and AdamW-state bytes one CPU process
computes. NaN on one rank is refused on both, nothing written; ``check_same_parameters`` agrees
over NCCL alone (its agreement's tensors on the GPU).

Needs a GPU library (MOJO_TRAIN_VENDOR=cuda) and two CUDA GPUs for torch; the batched
transport's logic also runs on CPU tensors over gloo in tests/test_distributed.py.
"""
import datetime
import json
import os
import shutil
import sys
import tempfile

import pytest

torch = pytest.importorskip("torch")

import test_distributed as T  # noqa: E402  (the model, its training loops and the one-process reference)
from mojo_train import distributed as D  # noqa: E402

RANKS = 2
SCENARIOS = ("torch_reduce_nccl", "torch_ddp_nccl")


def worker(config):
    rank, out, mode = config["rank"], config["out"], config["numeric_mode"]
    dist = torch.distributed
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method="file://" + config["rendezvous"], rank=rank, world_size=RANKS,
                            timeout=datetime.timedelta(seconds=T.WORKER_SECONDS))

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
    with open(os.path.join(out, "report_rank%d.json" % rank), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


_RUNS = {}


def visible_gpus():
    """The GPUs this process may use, as CUDA_VISIBLE_DEVICES names them (all when it is unset)."""
    mask = os.environ.get("CUDA_VISIBLE_DEVICES")
    return mask.split(",") if mask else [str(i) for i in range(torch.cuda.device_count())]


def _run(mode):
    key = (mode.vendor, mode.numeric_mode)
    if key in _RUNS:
        return _RUNS[key]
    out = tempfile.mkdtemp(prefix="mt_nccl_")
    try:
        gpus = visible_gpus()
        envs = [dict(os.environ, MOJO_TRAIN_VENDOR=mode.vendor, CUDA_VISIBLE_DEVICES=gpus[rank], NCCL_NVLS_ENABLE="0",
                     PYTHONPATH=os.pathsep.join([T.ROOT, os.path.dirname(os.path.abspath(__file__))] +
                                                [p for p in [os.environ.get("PYTHONPATH")] if p]))
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
        _RUNS[key] = run
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


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_two_gpus_over_nccl_end_in_one_cpu_process_bytes(identical, scenario):
    _need_two_gpus(identical)
    got = _run(identical)["bytes"][scenario]
    want = T.reference(identical, "torch")
    assert len(got) == RANKS
    for rank, data in enumerate(got):
        assert data == want, "%s: rank %d's parameters or AdamW state differ from one CPU process's" % (scenario, rank)


def test_nan_on_one_gpu_is_refused_on_both_and_parameters_agree_over_nccl(identical):
    _need_two_gpus(identical)
    reports = _run(identical)["reports"]
    T._same_refusal_everywhere([r["nan_on_one_rank"] for r in reports], "ValueError",
                               "rank %d's gradients hold NaN or inf" % (RANKS - 1))
    assert len({r["parameters_digest"] for r in reports}) == 1


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))
