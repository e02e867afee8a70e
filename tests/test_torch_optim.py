"""mojo_train.torch.optim (issue 13 point 2) and mojo_train.torch.utils.clip_grad_norm_: torch's
Optimizer classes stepped by the native grouped step. Bits: the same as mojo_train's own
optimizers given the same gradients (test_optim.py pins those), on CPU and CUDA tensors; torch's
format of state_dict, exchanged both ways with torch's optimizers; torch's LR schedulers; and
every refusal changing nothing."""
import copy
import io
import math
import pickle
import re

import pytest

torch = pytest.importorskip("torch")

import mojo_train as mt  # noqa: E402
import mojo_train.torch as mtt  # noqa: E402
from mojo_train.torch import optim  # noqa: E402

SHAPES = [(5, 3), (3,), (4, 4), (7,)]


def _params(seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter((torch.rand(s, generator=g) * 2 - 1).to(device)) for s in SHAPES]


def _grads(step, device="cpu"):
    g = torch.Generator().manual_seed(100 + step)
    return [(torch.rand(s, generator=g) * 2 - 1).to(device) for s in SHAPES]


def _step(opt, params, s):
    """One step of ``opt`` with step ``s``'s gradients as ``p.grad``."""
    for p, g in zip(params, _grads(s, params[0].device)):
        p.grad = g
    opt.step()


def _groups(params, **second):
    return [{"params": params[:2]}, dict({"params": params[2:]}, **second)]


def _bits(tensors):
    return b"".join(t.detach().cpu().numpy().tobytes() for t in tensors)


def _arrays(params):
    return [mt.Array.from_bytes(p.detach().numpy().tobytes(), tuple(p.shape), "float32") for p in params]


# (torch class, mojo_train class, constructor keywords, the second group's own keywords)
CONFIGS = [
    ("SGD", dict(lr=0.1), dict(lr=0.05)),
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1, weight_decay=0.01), dict(momentum=0.5, maximize=True)),
    ("SGD", dict(lr=0.1, momentum=0.9, nesterov=True), dict(momentum=0.5, lr=0.2)),
    ("Adam", dict(lr=0.01, weight_decay=0.1), dict(betas=(0.8, 0.99), eps=1e-6)),
    ("Adam", dict(lr=0.01, amsgrad=True), dict(amsgrad=False, maximize=True)),
    ("AdamW", dict(lr=0.01), dict(weight_decay=0.0, amsgrad=True)),
]


def _native_optimizer(name, arrays, kwargs, second, mode):
    return getattr(mt, name)(_groups(arrays, **second), numeric_mode=mode.numeric_mode, **kwargs)


def _need(mode):
    if not mode.has("optim"):
        pytest.skip("this library has no optim (mt_features)")


@pytest.mark.parametrize("name, kwargs, second", CONFIGS)
def test_a_step_is_mojo_trains_own_optimizer_step(mode, name, kwargs, second):
    _need(mode)
    params = _params()
    arrays = _arrays(params)
    ours = getattr(optim, name)(_groups(params, **second), numeric_mode=mode.numeric_mode, **kwargs)
    native = _native_optimizer(name, arrays, kwargs, second, mode)
    for s in range(4):
        grads = _grads(s)
        for p, g in zip(params, grads):
            p.grad = g.clone()
        ours.step()
        native.step([mt.Array.from_bytes(g.numpy().tobytes(), tuple(g.shape), "float32") for g in grads])
        assert _bits(params) == b"".join(a.tobytes() for a in arrays)
    if name != "SGD":
        assert _bits(ours.state[p]["exp_avg"] for p in params) == native.exp_avg.tobytes()
        assert [float(ours.state[p]["step"]) for p in params] == [4.0] * len(params)
    elif kwargs.get("momentum"):
        kept = [p for p in params if ours.state[p].get("momentum_buffer") is not None]
        assert kept, "a momentum group keeps buffers"


def test_adam_with_decoupled_weight_decay_is_adamw(identical):
    _need(identical)
    a, b = _params(), _params()
    opt_a = optim.Adam(a, lr=0.01, weight_decay=0.1, decoupled_weight_decay=True, numeric_mode=identical.numeric_mode)
    opt_b = optim.AdamW(b, lr=0.01, weight_decay=0.1, numeric_mode=identical.numeric_mode)
    plain = optim.Adam(_params(), lr=0.01, weight_decay=0.1, numeric_mode=identical.numeric_mode)
    for s in range(3):
        for opt in (opt_a, opt_b, plain):
            for p, g in zip(opt.param_groups[0]["params"], _grads(s)):
                p.grad = g
            opt.step()
    assert _bits(a) == _bits(b) != _bits(plain.param_groups[0]["params"])


def test_the_classes_are_torch_optimizers_with_torch_defaults():
    for name in ("SGD", "Adam", "AdamW"):
        ours, theirs = getattr(optim, name)(_params()), getattr(torch.optim, name)(_params())
        assert isinstance(ours, torch.optim.Optimizer)
        extra = {"lr_schedule": None, "steps_taken": 0}
        assert ours.defaults == dict(theirs.defaults, **extra)


@pytest.mark.parametrize("name, kwargs, second", CONFIGS)
def test_state_dicts_move_between_torch_and_mojo_train_with_their_bytes(identical, name, kwargs, second):
    _need(identical)
    params = _params()
    ours = getattr(optim, name)(_groups(params, **second), numeric_mode=identical.numeric_mode, **kwargs)
    for s in range(3):
        for p, g in zip(params, _grads(s)):
            p.grad = g
        ours.step()
    saved = _through_a_file(ours.state_dict())
    theirs = getattr(torch.optim, name)(_groups(_params(), **second), **kwargs)
    theirs.load_state_dict(saved)
    twin = [p.detach().clone().requires_grad_() for p in params]
    back = getattr(optim, name)(_groups(twin, **second), numeric_mode=identical.numeric_mode, **kwargs)
    back.load_state_dict(_through_a_file(theirs.state_dict()))

    def tensors(sd):
        return [(i, k, v.dtype, tuple(v.shape), v.numpy().tobytes()) for i, st in sorted(sd["state"].items())
                for k, v in sorted(st.items()) if isinstance(v, torch.Tensor)]
    assert tensors(theirs.state_dict()) == tensors(saved) == tensors(back.state_dict())
    assert bool(tensors(saved)) == (name != "SGD" or bool(kwargs.get("momentum"))), "the steps made state"
    # and the optimizer restored from torch's checkpoint goes on exactly as the original
    for opt, ps in ((ours, params), (back, twin)):
        _step(opt, ps, 9)
    assert _bits(params) == _bits(twin)


def _through_a_file(state_dict):
    """A state_dict as torch.save writes it and torch.load (weights_only=True, its default) reads it."""
    buf = io.BytesIO()
    torch.save(state_dict, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def test_a_copied_or_pickled_optimizer_steps_as_the_original(identical):
    _need(identical)
    params = _params()
    ours = optim.AdamW(_groups(params, weight_decay=0.0), lr=0.01, numeric_mode=identical.numeric_mode)
    _step(ours, params, 0)
    model = {"params": params, "opt": ours}
    for twin in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert twin["opt"].numeric_mode == identical.numeric_mode
        _step(twin["opt"], twin["params"], 1)
    _step(ours, params, 1)
    assert _bits(twin["params"]) == _bits(params)


def test_a_schedule_is_saved_as_its_config_and_comes_back(identical):
    _need(identical)
    params = _params()
    cosine = mt.WarmupCosineLR(0.01, warmup_steps=2, total_steps=9)
    ours = optim.AdamW(params, lr_schedule=cosine, numeric_mode=identical.numeric_mode)
    _step(ours, params, 0)
    saved = _through_a_file(ours.state_dict())        # weights_only=True reads it: plain data
    assert saved["param_groups"][0]["lr_schedule"] == {"mojo_train_schedule": cosine.config()}
    twin = [p.detach().clone().requires_grad_() for p in params]
    back = optim.AdamW(twin, numeric_mode=identical.numeric_mode)
    back.load_state_dict(saved)
    assert back.param_groups[0]["lr_schedule"].config() == cosine.config()
    assert back.param_groups[0]["steps_taken"] == 1
    for opt, ps in ((ours, params), (back, twin)):
        _step(opt, ps, 1)
    assert _bits(params) == _bits(twin)


def test_adamw_stays_decoupled_when_it_loads_an_adam_checkpoint(identical):
    _need(identical)
    a, b = _params(), _params()
    adam = torch.optim.Adam(_params(), lr=0.01, weight_decay=0.1)
    ours = optim.AdamW(a, lr=0.01, weight_decay=0.1, numeric_mode=identical.numeric_mode)
    ours.load_state_dict(adam.state_dict())
    plain = optim.AdamW(b, lr=0.01, weight_decay=0.1, numeric_mode=identical.numeric_mode)
    for opt, ps in ((ours, a), (plain, b)):
        _step(opt, ps, 0)
    assert ours.param_groups[0]["decoupled_weight_decay"] is True and _bits(a) == _bits(b)


def test_a_checkpoint_with_a_number_for_step_is_loaded_as_torch_loads_it(identical):
    _need(identical)
    params = _params()
    ours = optim.Adam(params, lr=0.01, numeric_mode=identical.numeric_mode)
    _step(ours, params, 0)
    old = copy.deepcopy(ours.state_dict())    # torch's state_dict shares the state's dicts
    for st in old["state"].values():
        st["step"] = 1                      # torch before 1.12 saved a number
    twin = [p.detach().clone().requires_grad_() for p in params]
    back = optim.Adam(twin, lr=0.01, numeric_mode=identical.numeric_mode)
    back.load_state_dict(old)
    assert all(torch.is_tensor(st["step"]) and st["step"].dtype == torch.float32 for st in back.state.values())
    for opt, ps in ((ours, params), (back, twin)):
        _step(opt, ps, 1)
    assert _bits(params) == _bits(twin)


def test_sparse_and_strided_gradients(identical):
    _need(identical)
    emb = torch.nn.Embedding(5, 3, sparse=True)
    ours = optim.SGD(emb.parameters(), lr=0.1, numeric_mode=identical.numeric_mode)
    emb(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\]\.grad is sparse; .*to_dense"):
        ours.step()
    a, b = _params(), _params()
    opt_a = optim.AdamW(a, numeric_mode=identical.numeric_mode)
    opt_b = optim.AdamW(b, numeric_mode=identical.numeric_mode)
    for p, q, g in zip(a, b, _grads(0)):
        p.grad = g
        q.grad = g.t().contiguous().t() if g.ndim == 2 else g      # the same values, transposed in memory
    opt_a.step()
    opt_b.step()
    assert not b[0].grad.is_contiguous() and _bits(a) == _bits(b)


def test_a_negated_view_as_gradient_is_read_as_the_values_torch_sees(identical):
    """p.grad with torch's negation bit (memory holding -grad) steps like its materialized
    values, on the checked path and when a step plan is kept."""
    _need(identical)
    a, b = _params(), _params()
    opt_a = optim.AdamW(a, numeric_mode=identical.numeric_mode)
    opt_b = optim.AdamW(b, numeric_mode=identical.numeric_mode)
    for step in range(3):
        for p, q, g in zip(a, b, _grads(step)):
            p.grad = -g
            q.grad = g.clone()._neg_view()
            assert q.grad.is_neg()
        opt_a.step()
        opt_b.step()
        assert _bits(a) == _bits(b), step


def test_a_torch_lr_scheduler_sets_the_lr_each_step_reads(identical):
    _need(identical)
    params = _params()
    arrays = _arrays(params)
    ours = optim.AdamW(params, lr=0.01, numeric_mode=identical.numeric_mode)
    sched = torch.optim.lr_scheduler.StepLR(ours, step_size=2, gamma=0.5)
    native = mt.AdamW(arrays, lr=0.01, numeric_mode=identical.numeric_mode)
    for s in range(5):
        for p, g in zip(params, _grads(s)):
            p.grad = g
        native.lr = ours.param_groups[0]["lr"]
        ours.step()
        native.step([mt.Array.from_bytes(g.numpy().tobytes(), tuple(g.shape), "float32") for g in _grads(s)])
        sched.step()
    assert ours.param_groups[0]["lr"] == 0.01 * 0.25
    assert _bits(params) == b"".join(a.tobytes() for a in arrays)


def test_lr_schedule_drives_a_group_and_a_torch_scheduler_beside_it_is_refused(identical):
    _need(identical)
    params = _params()
    arrays = _arrays(params)
    cosine = mt.WarmupCosineLR(0.01, warmup_steps=2, total_steps=6)
    ours = optim.AdamW(_groups(params, lr_schedule=cosine), lr=0.003, numeric_mode=identical.numeric_mode)
    native = mt.AdamW(_groups(arrays, lr_schedule=cosine), lr=0.003, numeric_mode=identical.numeric_mode)
    for s in range(4):
        for p, g in zip(params, _grads(s)):
            p.grad = g
        ours.step()
        native.step([mt.Array.from_bytes(g.numpy().tobytes(), tuple(g.shape), "float32") for g in _grads(s)])
    assert _bits(params) == b"".join(a.tobytes() for a in arrays)
    assert [g["steps_taken"] for g in ours.param_groups] == [4, 4]
    torch.optim.lr_scheduler.LambdaLR(ours, lambda epoch: 1.0)       # writes 'initial_lr' into every group
    before = _bits(params)
    with pytest.raises(ValueError, match=r"param_groups\[1\] has both a torch LR scheduler"):
        ours.step()
    assert _bits(params) == before


def test_a_refused_step_writes_nothing_and_names_the_tensor(identical):
    _need(identical)
    params = _params()
    ours = optim.Adam(_groups(params), lr=0.01, numeric_mode=identical.numeric_mode)
    for p, g in zip(params, _grads(0)):
        p.grad = g
    params[3].grad[2] = math.nan
    before = _bits(params) + _bits(p.grad for p in params)
    # the CPU oracle names the tensor; a GPU's one status word says "grads"
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.optim\.Adam\.step: (param_groups\[1\]\['params'\]\[1\]"
                                         r"\.grad holds|grads hold) NaN or inf; nothing was written"):
        ours.step()
    assert _bits(params) + _bits(p.grad for p in params) == before
    assert ours.state_dict()["state"] == {} and not ours.state         # no state, not even empty entries
    assert [g["steps_taken"] for g in ours.param_groups] == [0, 0]
    params[3].grad[2] = 0.0
    ours.step()
    assert all(float(ours.state[p]["step"]) == 1.0 for p in params)


def test_gradients_sharing_memory_are_refused_naming_both(identical):
    _need(identical)
    params = _params()
    ours = optim.SGD(params, lr=0.1, momentum=0.9, numeric_mode=identical.numeric_mode)
    for p, g in zip(params, _grads(0)):
        p.grad = g
    shared = torch.zeros(10)
    params[1].grad, params[3].grad = shared[:3], shared[2:9]
    before = _bits(params)
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[1\]\.grad and "
                                         r"param_groups\[0\]\['params'\]\[3\]\.grad share memory"):
        ours.step()
    assert _bits(params) == before and not ours.state
    twice = optim.SGD([params[0], params[0]], lr=0.1, numeric_mode=identical.numeric_mode)   # torch only warns
    with pytest.raises(ValueError, match=r"\['params'\]\[0\] and param_groups\[0\]\['params'\]\[1\] are the same "
                                         r"parameter"):
        twice.step()
    assert _bits(params) == before


def test_parameters_without_a_gradient_are_skipped_as_torch_skips_them(identical):
    _need(identical)
    params = _params()
    ours = optim.AdamW(params, lr=0.01, numeric_mode=identical.numeric_mode)
    for p, g in zip(params, _grads(0)):
        p.grad = g
    params[2].grad = None
    before = params[2].detach().clone()
    ours.step()
    assert torch.equal(params[2], before) and params[2] not in ours.state
    assert float(ours.state[params[0]]["step"]) == 1.0


def test_closure_zero_grad_and_add_param_group_are_torchs(identical):
    _need(identical)
    params = _params()
    ours = optim.SGD(params[:2], lr=0.1, numeric_mode=identical.numeric_mode)
    ours.add_param_group({"params": params[2:], "lr": 0.2, "name": "late"})
    assert ours.param_groups[1]["name"] == "late" and ours.param_groups[1]["momentum"] == 0

    def closure():
        ours.zero_grad()
        loss = sum((p * p).sum() for p in params)
        loss.backward()
        return loss
    before = [p.detach().clone() for p in params]
    loss = ours.step(closure)
    assert isinstance(loss, torch.Tensor)
    lrs = [0.1, 0.1, 0.2, 0.2]
    for p, b, lr in zip(params, before, lrs):      # d(p*p)/dp = 2p: p - lr * 2p, one rounding each
        assert torch.equal(p.detach(), b - torch.tensor(lr, dtype=torch.float32) * (2 * b))
    ours.zero_grad()
    assert all(p.grad is None for p in params)


@pytest.mark.parametrize("make, exc, pattern", [
    (lambda ps: optim.Adam(ps, capturable=True), NotImplementedError, r"capturable=True is not supported"),
    (lambda ps: optim.SGD(ps, differentiable=True), NotImplementedError, r"differentiable=True is not supported"),
    (lambda ps: optim.AdamW(ps, lr=-1.0), ValueError, r"lr must be finite and >= 0"),
    (lambda ps: optim.SGD(ps, momentum=0.0, nesterov=True), ValueError, r"nesterov=True needs momentum > 0"),
    (lambda ps: optim.Adam([{"params": ps[:1]}, {"params": ps[1:], "betas": (1.5, 0.9)}]), ValueError,
     r"param_groups\[1\]\['betas'\]\[0\] must be finite"),
    (lambda ps: optim.AdamW([torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]), TypeError,
     r"param_groups\[0\]\['params'\]\[0\] has dtype torch.float64"),
    (lambda ps: optim.SGD(ps, numeric_mode="exact"), ValueError, r"numeric_mode"),
])
def test_options_mojo_train_lacks_are_refused_by_name(make, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make(_params())


def test_a_tensor_lr_is_read_as_its_value(identical):
    _need(identical)
    a, b = _params(), _params()
    opt_a = optim.AdamW(a, lr=torch.tensor(0.01), numeric_mode=identical.numeric_mode)
    opt_b = optim.AdamW(b, lr=0.01, numeric_mode=identical.numeric_mode)
    for opt, ps in ((opt_a, a), (opt_b, b)):
        _step(opt, ps, 0)
    assert _bits(a) == _bits(b)


def test_a_non_contiguous_parameter_is_refused_before_anything_is_written(identical):
    _need(identical)
    base = torch.nn.Parameter(torch.rand(4, 6))
    view = torch.nn.Parameter(base.detach().t())         # a transposed leaf
    ours = optim.SGD([view], lr=0.1, numeric_mode=identical.numeric_mode)
    view.grad = torch.ones(6, 4)
    before = view.detach().clone()
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]\[0\] is not contiguous"):
        ours.step()
    assert torch.equal(view.detach(), before)


def test_clip_grad_norm_scales_p_grad_as_mojo_trains_clip(identical):
    _need(identical)
    params = _params()
    for p, g in zip(params, _grads(0)):
        p.grad = g * 10
    params[1].grad = None                       # skipped, as torch skips it
    reference = [p.grad.clone() for p in params if p.grad is not None]
    want = mt.clip_grad_norm_(reference, 1.0, numeric_mode=identical.numeric_mode)
    total = mtt.nn.utils.clip_grad_norm_(params, 1.0, numeric_mode=identical.numeric_mode)
    assert isinstance(total, torch.Tensor) and total.item() == want > 1.0
    assert _bits(p.grad for p in params if p.grad is not None) == _bits(reference)
    assert mtt.clip_grad_norm_ is mtt.utils.clip_grad_norm_ is mtt.nn.utils.clip_grad_norm_


def test_clip_grad_norm_refuses_a_non_finite_total_as_torch_does_and_writes_nothing(identical):
    _need(identical)
    params = _params()
    for p, g in zip(params, _grads(0)):
        p.grad = g
    params[2].grad[0, 1] = math.inf
    before = _bits(p.grad for p in params)
    with pytest.raises(RuntimeError, match=r"parameters\[2\]\.grad holds NaN or inf|the total gradient norm is not "
                                           r"finite") as info:
        mtt.clip_grad_norm_(params, 1.0, error_if_nonfinite=True, numeric_mode=identical.numeric_mode)
    assert isinstance(info.value, ValueError)
    assert _bits(p.grad for p in params) == before


@pytest.mark.parametrize("name, kwargs, second", CONFIGS)
def test_cuda_tensors_step_to_the_cpu_bytes(identical, name, kwargs, second):
    _need(identical)
    if not identical.has("device_buffers"):
        pytest.skip("the vendor takes no device buffers")
    if not torch.cuda.is_available():
        pytest.skip("torch has no CUDA here")
    results = []
    for device in ("cpu", "cuda:0"):
        params = _params(device=device)
        ours = getattr(optim, name)(_groups(params, **second), numeric_mode=identical.numeric_mode, **kwargs)
        for s in range(4):
            for p, g in zip(params, _grads(s, device)):
                p.grad = g
            mtt.clip_grad_norm_(params, 0.5, numeric_mode=identical.numeric_mode)
            ours.step()
        state = [v for p in params for k, v in sorted(ours.state[p].items()) if isinstance(v, torch.Tensor)]
        results.append(_bits(params) + _bits(state))
    assert results[0] == results[1]


# ---- the step plan (mojo_train/torch/_optim_plan.py): a step that succeeded is reused by the next
# while nothing it depends on changed, and rebuilt when anything did. Two worlds take the same
# steps and the same changes: one optimizer kept for every step (its plan, its group table), and
# a fresh optimizer each step, loaded from the previous one's state_dict (no plan): the same bytes
# and the same refusals, step after step.
def _scale_(t, by):
    with torch.no_grad():
        return t.mul_(by)


def _replace_param_data(opt, params):
    params[1].data = _scale_(params[1].detach().clone(), 0.5)          # new memory, same shape


def _replace_state_tensor(opt, params):
    st = opt.state[params[2]]
    st["exp_avg"] = _scale_(st["exp_avg"].clone(), 2.0)


def _replace_state_data(opt, params):
    st = opt.state[params[0]]
    st["exp_avg_sq"].data = _scale_(st["exp_avg_sq"].clone(), 3.0)     # the same object, new memory


def _write_step_count(opt, params):
    opt.state[params[3]]["step"].fill_(10.0)


def _change_lr_and_betas(opt, params):
    opt.param_groups[0]["lr"] = 0.02
    opt.param_groups[1]["betas"] = (0.8, 0.95)
    opt.param_groups[1]["weight_decay"] = 0.05


def _switch_amsgrad_on(opt, params):
    opt.param_groups[0]["amsgrad"] = True


def _clear_a_state(opt, params):
    opt.state[params[1]].clear()


def _no_grad_for_one(opt, params):
    params[2].grad = None               # and on every later step (_NO_GRAD_FROM_NOW_ON)


# (change, whether the kept optimizer's plan survives it)
CHANGES = [
    (_replace_param_data, False), (_replace_state_tensor, False), (_replace_state_data, False),
    (_write_step_count, True), (_change_lr_and_betas, True), (_switch_amsgrad_on, False),
    (_clear_a_state, False), (_no_grad_for_one, False),
]


_NO_GRAD_FROM_NOW_ON = {_no_grad_for_one: {2}}


def _world_bits(opt, params):
    out = _bits(params)
    for p in params:
        for key in sorted(opt.state.get(p, {})):
            out += key.encode() + _bits([opt.state[p][key]])
    return out + repr([g["steps_taken"] for g in opt.param_groups]).encode()


def _fresh(opt, params, mode):
    new = optim.Adam(_groups(params), lr=0.01, numeric_mode=mode.numeric_mode)
    new.load_state_dict(opt.state_dict())
    return new


def _grads_of(params, s, keep_none=()):
    g = torch.Generator().manual_seed(300 + s)
    for j, p in enumerate(params):
        if j not in keep_none:
            p.grad = torch.rand(p.shape, generator=g) * 2 - 1


@pytest.mark.parametrize("change, survives", CHANGES, ids=[c.__name__.strip("_") for c, _ in CHANGES])
def test_the_step_plan_is_reused_until_something_it_holds_changes(identical, change, survives):
    _need(identical)
    kept_params, fresh_params = _params(), _params()
    kept = optim.Adam(_groups(kept_params), lr=0.01, numeric_mode=identical.numeric_mode)
    fresh = optim.Adam(_groups(fresh_params), lr=0.01, numeric_mode=identical.numeric_mode)
    plans = []
    for s in range(5):
        fresh = _fresh(fresh, fresh_params, identical)
        for opt, params in ((kept, kept_params), (fresh, fresh_params)):
            _grads_of(params, s, _NO_GRAD_FROM_NOW_ON.get(change, ()) if s > 3 else ())
            if s == 3:
                change(opt, params)
            opt.step()
        plans.append(kept._plan)
        assert fresh._plan is not None and _world_bits(kept, kept_params) == _world_bits(fresh, fresh_params), s
    assert plans[2] is plans[1]                         # nothing changed: the plan served
    assert (plans[3] is plans[2]) == survives           # the change: kept or rebuilt, the same bytes either way
    assert plans[4] is plans[3]                         # and the new plan serves the next step


@pytest.mark.parametrize("change, error", [
    ("nan", r"holds NaN or inf; nothing was written|grads hold NaN or inf"),
    ("shared", r"param_groups\[0\]\['params'\]\[1\]\.grad and param_groups\[1\]\['params'\]\[1\]\.grad share "
               r"memory"),
    ("state shape", r"the state 'exp_avg' of param_groups\[1\]\['params'\]\[0\] is a torch.float32 tensor of shape "
                    r"\(2, 2\)"),
    ("param shape", r"param_groups\[0\]\['params'\]\[0\]\.grad has shape \(5, 3\), the parameter \(3, 5\)"),
])
def test_a_refusal_after_planned_steps_is_the_checked_paths_and_writes_nothing(identical, change, error):
    _need(identical)
    kept_params, fresh_params = _params(), _params()
    kept = optim.Adam(_groups(kept_params), lr=0.01, numeric_mode=identical.numeric_mode)
    fresh = optim.Adam(_groups(fresh_params), lr=0.01, numeric_mode=identical.numeric_mode)
    for s in range(3):
        fresh = _fresh(fresh, fresh_params, identical)
        for opt, params in ((kept, kept_params), (fresh, fresh_params)):
            _grads_of(params, s)
            opt.step()
    fresh = _fresh(fresh, fresh_params, identical)
    messages = []
    for opt, params in ((kept, kept_params), (fresh, fresh_params)):
        _grads_of(params, 3)
        if change == "nan":
            params[3].grad[1] = math.nan
        elif change == "shared":
            shared = torch.zeros(40)
            params[1].grad, params[3].grad = shared[:3], shared[2:9]
        elif change == "state shape":
            opt.state[params[2]]["exp_avg"] = torch.zeros(2, 2)
        else:
            params[0].data = params[0].detach().clone().t().contiguous()     # (3, 5); its grad stays (5, 3)
        before = _world_bits(opt, params)
        with pytest.raises((ValueError, TypeError)) as info:
            opt.step()
        messages.append((type(info.value), str(info.value)))
        assert _world_bits(opt, params) == before
    assert messages[0] == messages[1]
    assert re.search(error, messages[0][1]), messages[0][1]


def test_the_sgd_plan_follows_momentum_and_its_buffers(identical):
    _need(identical)
    results, plans = [], []
    for keep in (True, False):
        params = _params()
        opt = optim.SGD(_groups(params, momentum=0.5), lr=0.1, momentum=0.9, numeric_mode=identical.numeric_mode)
        for s in range(7):
            if not keep:
                fresh = optim.SGD(_groups(params, momentum=0.5), lr=0.1, momentum=0.9,
                                  numeric_mode=identical.numeric_mode)
                fresh.load_state_dict(opt.state_dict())
                opt = fresh
            _grads_of(params, s)
            if s == 2:
                opt.state[params[0]]["momentum_buffer"] = _scale_(opt.state[params[0]]["momentum_buffer"].clone(),
                                                                  0.5)
            if s == 3:
                opt.param_groups[1]["momentum"] = 0.0          # its buffers stay, unread
            if s == 4:
                opt.param_groups[0]["lr"] = 0.05
            if s == 5:
                opt.param_groups[1]["momentum"] = 0.7            # back on: the buffers kept are read again
            opt.step()
            if keep:
                plans.append(opt._plan)
        results.append(_bits(params) + _bits(opt.state[p]["momentum_buffer"] for p in params))
    assert results[0] == results[1]
    # the kept optimizer's plan: made, reused, rebuilt for the new buffer, for momentum off, kept for
    # the lr, rebuilt for momentum back on, reused
    assert [a is b for a, b in zip(plans, plans[1:])] == [True, False, False, True, False, True]


def _state_bits(opt):
    sd = opt.state_dict()
    return sorted((k, key, _bits([v]) if torch.is_tensor(v) else v) for k, st in sd["state"].items()
                  for key, v in st.items())


@pytest.mark.parametrize("name, kwargs, key, value", [
    ("AdamW", dict(lr=0.01), "exp_avg_sq", -1.0),
    ("AdamW", dict(lr=0.01), "exp_avg", math.nan),
    ("Adam", dict(lr=0.01), "exp_avg", -math.inf),
    ("Adam", dict(lr=0.01, amsgrad=True), "max_exp_avg_sq", -0.5),
    ("SGD", dict(lr=0.1, momentum=0.9), "momentum_buffer", math.inf),
    ("AdamW", dict(lr=0.01), "exp_avg", None),              # absent beside a step count
])
def test_load_state_dict_refuses_moments_that_would_step_into_nan_and_loads_nothing(identical, name, kwargs, key,
                                                                                     value):
    """The native load_state_dict's rules for the state a step reads (finite moments, second
    moments >= 0) hold for the adapter's too: a step does not scan its state, so a negative
    exp_avg_sq loaded as it was stepped the parameter into NaN with no refusal."""
    _need(identical)
    params = _params()
    opt = getattr(optim, name)(params, numeric_mode=identical.numeric_mode, **kwargs)
    _step(opt, params, 0)
    bad = copy.deepcopy(opt.state_dict())       # torch's state_dict shares each state dict with the optimizer
    entry = bad["state"][2]
    if value is None:
        del entry[key]
        pattern = r"state\[2\] has a step count but no %s" % key
    else:
        entry[key].view(-1)[3] = value
        pattern = r"state\[2\]\['%s'\] holds %s at flat index 3; (a second moment must be >= 0 and not NaN|it " \
                  r"must be finite)" % (key, re.escape(repr(value)))
    before, params_before = _state_bits(opt), _bits(params)
    with pytest.raises(ValueError, match=r"^mojo_train\.torch\.optim\.%s\.load_state_dict: %s" % (name, pattern)):
        opt.load_state_dict(bad)
    assert _state_bits(opt) == before and _bits(params) == params_before
    _step(opt, params, 1)                                     # and the optimizer steps on from its own state
    assert all(torch.isfinite(p).all() for p in params)


def test_load_state_dict_checks_the_moments_as_torch_casts_them(identical):
    """torch's load casts a float64 state to the parameter's float32: 1e39 becomes inf there."""
    _need(identical)
    params = _params()
    opt = optim.AdamW(params, lr=0.01, numeric_mode=identical.numeric_mode)
    _step(opt, params, 0)
    sd = copy.deepcopy(opt.state_dict())
    sd["state"][0]["exp_avg"] = sd["state"][0]["exp_avg"].double()
    sd["state"][0]["exp_avg"][0, 0] = 1e39
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg'\] holds inf at flat index 0 as float32 \(torch's "
                                         r"load casts it so\); it must be finite"):
        opt.load_state_dict(sd)
    sd["state"][0]["exp_avg"][0, 0] = 1e30                    # finite in float32: taken, as torch takes it
    opt.load_state_dict(sd)
    assert opt.state[params[0]]["exp_avg"].dtype == torch.float32


@pytest.mark.parametrize("betas", [{0.999, 0.9}, (b for b in (0.9, 0.999))], ids=["set", "generator"])
def test_betas_without_an_order_are_refused_by_name(betas):
    with pytest.raises(TypeError, match=r"^mojo_train\.torch\.optim\.AdamW: betas must be a pair \(beta1, beta2\) "
                                        r"in order"):
        optim.AdamW(_params(), betas=betas)


def test_a_second_moment_a_step_overflowed_to_inf_loads_back(identical):
    """A gradient past ~1.8e19 squares to inf: exp_avg_sq = +inf is what a step writes (the
    parameter moves by exp_avg / inf = 0), so the optimizer's own state_dict loads back."""
    _need(identical)
    params = _params()
    opt = optim.AdamW(params, lr=0.01, numeric_mode=identical.numeric_mode)
    for p, g in zip(params, _grads(0)):
        p.grad = g
    params[1].grad[0] = 4e19
    opt.step()
    assert math.isinf(float(opt.state[params[1]]["exp_avg_sq"][0])) and all(torch.isfinite(p).all() for p in params)
    opt.load_state_dict(copy.deepcopy(opt.state_dict()))
    _step(opt, params, 1)
    assert all(torch.isfinite(p).all() for p in params)


@pytest.mark.parametrize("copied", [copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))], ids=["deepcopy", "pickle"])
def test_a_copied_optimizer_keeps_its_state_dict_hooks(identical, copied):
    """torch's pickled state keeps no hook: a deep copy or an unpickled optimizer had none, so it
    loaded a negative exp_avg_sq without a word and saved its schedule as an object."""
    _need(identical)
    params = _params()
    opt = optim.AdamW(params, lr=0.01, numeric_mode=identical.numeric_mode, lr_schedule=mt.ConstantLR(0.01))
    _step(opt, params, 0)
    twin = copied(opt)
    assert twin.state_dict()["param_groups"][0]["lr_schedule"] == {"mojo_train_schedule": mt.ConstantLR(0.01).config()}
    bad = copy.deepcopy(twin.state_dict())
    bad["state"][0]["exp_avg_sq"].view(-1)[0] = -1.0
    with pytest.raises(ValueError, match=r"state\[0\]\['exp_avg_sq'\] holds -1\.0"):
        twin.load_state_dict(bad)
    assert len(twin._optimizer_load_state_dict_pre_hooks) == len(opt._optimizer_load_state_dict_pre_hooks)
