"""Tensors that are not buffer-protocol objects: torch CPU tensors through DLPack work like
host buffers; device memory handed to a vendor without device buffers is refused by name
(never dereferenced)."""
import pytest

import mojo_train as mt


class FakeDeviceTensor:
    """Exports __cuda_array_interface__ for an address no CPU may touch."""

    def __init__(self, n):
        self.__cuda_array_interface__ = {"version": 3, "shape": (n,), "typestr": "<f4",
                                         "data": (0x10, False), "strides": None}


def test_a_host_only_vendor_refuses_device_memory_by_name(mode):
    if mode.has("device_buffers"):
        pytest.skip("this vendor takes device buffers")
    with pytest.raises(TypeError, match=r"params\[0\] is device memory"):
        mt.AdamW([FakeDeviceTensor(8)], numeric_mode=mode.numeric_mode)
    with pytest.raises(TypeError, match=r"grads\[0\] is device memory"):
        mt.clip_grad_norm_([FakeDeviceTensor(8)], 1.0, numeric_mode=mode.numeric_mode)
    p = mt.Array((8,))
    opt = mt.AdamW([p], numeric_mode=mode.numeric_mode)
    with pytest.raises(TypeError, match=r"grads\[0\] is device memory"):
        opt.step([FakeDeviceTensor(8)])
    assert opt.t == 0


def test_torch_cpu_tensors_work_through_dlpack_like_host_buffers(mode):
    torch = pytest.importorskip("torch")
    p_ours, g = mt.Array.from_list([0.5] * 9), mt.Array.from_list([0.25] * 9)
    p_torch = torch.full((9,), 0.5)
    opt_a = mt.AdamW([p_ours], numeric_mode=mode.numeric_mode)
    opt_b = mt.AdamW([p_torch], numeric_mode=mode.numeric_mode)
    opt_a.step([g])
    opt_b.step([torch.full((9,), 0.25)])
    assert p_torch.numpy().tobytes() == p_ours.tobytes()
    opt_b.load_state_dict(dict(opt_a.state_dict(), exp_avg=torch.zeros(9)))
    assert opt_b.exp_avg.tobytes() == bytes(36)


def test_parameters_that_share_memory_are_refused_naming_both(mode):
    w = mt.Array((16,))
    with pytest.raises(ValueError, match=r"params\[0\] and params\[1\] share memory"):
        mt.SGD([w, w], numeric_mode=mode.numeric_mode)
    with pytest.raises(ValueError, match=r"params\[0\] and params\[2\] share memory"):
        mt.AdamW([w, mt.Array((4,)), w.reshape(4, 4)], numeric_mode=mode.numeric_mode)
    halves = [memoryview(w.memview().cast("B")[:32]).cast("f"), memoryview(w.memview().cast("B")[32:]).cast("f")]
    mt.AdamW(halves, numeric_mode=mode.numeric_mode)     # adjacent is fine


def test_a_gradient_list_reused_and_then_changed_is_seen_afresh(mode):
    a, b, c = mt.Array.from_list([3.0, 4.0]), mt.Array.from_list([0.0, 0.0]), mt.Array.from_list([6.0, 8.0])
    grads = [a, b]
    assert mt.clip_grad_norm_(grads, 1e9, numeric_mode=mode.numeric_mode) == 5.0
    assert mt.clip_grad_norm_(grads, 1e9, numeric_mode=mode.numeric_mode) == 5.0     # the remembered table
    grads[1] = c                                                              # same list, new member
    assert mt.clip_grad_norm_(grads, 1e9, numeric_mode=mode.numeric_mode) == pytest.approx(125 ** 0.5)
    p = [mt.Array((2,)), mt.Array((2,))]
    opt = mt.SGD(p, lr=1.0, numeric_mode=mode.numeric_mode)
    opt.step(grads)
    grads[0] = mt.Array.from_list([1.0, 1.0])
    opt.step(grads)
    assert p[0].tolist() == [-4.0, -5.0] and p[1].tolist() == [-12.0, -16.0]


@pytest.mark.parametrize("shape", [(-2, -3), (4, -1), (True, 2), (2.0, 3), "ab"])
def test_an_interface_shape_that_is_not_non_negative_ints_is_refused_by_name(mode, shape):
    """An op's new output is shaped by its input's probe without another check (the device
    outputs of DeviceArray._fresh), so a foreign exporter's shape is checked when it is probed."""
    fake = FakeDeviceTensor(6)
    fake.__cuda_array_interface__["shape"] = shape
    with pytest.raises(ValueError, match=r"silu_forward: x's __cuda_array_interface__ has shape .*non-negative ints"):
        mt.silu_forward(fake, numeric_mode=mode.numeric_mode)
