"""Issue 13 point 5: a torch model written with mojo_train.torch modules and its AdamW (two param
groups) trains 30 steps to the same parameter and optimizer-state bytes as the same model written
against the native API, on CPU tensors and on CUDA tensors (tests/_torch_model.py holds both)."""
import copy

import pytest

torch = pytest.importorskip("torch")

from _torch_model import NativeLM, TorchLM, batch, torch_optimizer, torch_state_bytes, torch_step  # noqa: E402

VOCAB, WIDTH, BLOCKS, TOKENS, STEPS = 97, 48, 2, 256, 30


def _need(mode, *features):
    for feature in ("linear", "rms_norm", "embedding", "lm_head") + features:
        if not mode.has(feature):
            pytest.skip("this library has no %s (mt_features)" % feature)


def _model(mode):
    torch.manual_seed(0)
    return TorchLM(VOCAB, WIDTH, BLOCKS, numeric_mode=mode.numeric_mode)


def _train_torch(model, mode, device):
    model = model.to(device)
    opt = torch_optimizer(model, numeric_mode=mode.numeric_mode)
    losses = []
    for s in range(STEPS):
        ids, targets = batch(s, VOCAB, TOKENS)
        losses.append(torch_step(model, opt, ids.to(device), targets.to(device)).item())
    return torch_state_bytes(model, opt), losses


def test_the_torch_loop_ends_in_the_native_api_bytes(identical):
    _need(identical)
    model = _model(identical)
    native = NativeLM(model, numeric_mode=identical.numeric_mode)
    native_losses = [native.step(*batch(s, VOCAB, TOKENS)) for s in range(STEPS)]
    got, losses = _train_torch(model, identical, "cpu")
    assert got == native.state_bytes()
    assert losses == native_losses
    assert losses[-1] < losses[0]           # it learns (the batches repeat no pattern but the unigram)


def test_cuda_tensors_end_in_the_cpu_bytes(identical):
    _need(identical, "device_buffers")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    model = _model(identical)
    native = NativeLM(model, device=True, numeric_mode=identical.numeric_mode)
    on_cpu, cpu_losses = _train_torch(copy.deepcopy(model), identical, "cpu")
    on_cuda, cuda_losses = _train_torch(model, identical, "cuda:0")
    native_losses = [native.step(*batch(s, VOCAB, TOKENS)) for s in range(STEPS)]
    assert on_cuda == on_cpu == native.state_bytes()
    assert cuda_losses == cpu_losses == native_losses
