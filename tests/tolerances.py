"""Draft: ranges only (bound to be set from measurements)."""
import numpy as np

STEPS = 50
SIZE_RANGE = (1, 3000)
MAX_TENSORS = 4
GRAD_EXP_RANGE = (0, 20)
LR_RANGE = (1e-4, 1e-1)
MOMENTUM_RANGE = (0.05, 0.95)
DAMPENING_RANGE = (0.0, 0.5)
WEIGHT_DECAY_RANGE = (1e-4, 1e-1)
ADAM_WEIGHT_DECAY_RANGE = (1e-4, 1e-1)
BETA1_RANGE = (0.0, 0.99)
BETA2_RANGE = (0.9, 0.9999)
EPS_RANGE = (1e-8, 1e-6)
CLIP_RATIO_RANGE = (0.1, 2.0)

RTOL = 1e-5
ATOL = 1e-5


def assert_close_to_reference(ours, ref64, what, unit=1.0):
    ours = np.asarray(ours, dtype=np.float64)
    ref64 = np.asarray(ref64, dtype=np.float64)
    assert ours.shape == ref64.shape, (what, ours.shape, ref64.shape)
    err = np.abs(ours - ref64)
    bound = ATOL * unit + RTOL * np.abs(ref64)
    bad = ~(err <= bound)
    if bad.any():
        i = int(np.argmax(np.where(bad, err / bound, 0)))
        raise AssertionError("%s: %d of %d elements off; worst [%d] ours=%r ref=%r err=%g bound=%g"
                             % (what, int(bad.sum()), err.size, i, ours[i], ref64[i], err[i], bound[i]))


def units(kind, options, g_unit):
    lr_steps = options["lr"] * STEPS
    if kind == "SGD":
        buf = g_unit / (1.0 - options["momentum"])
        return {"params": lr_steps * buf, "momentum_buffer": buf, "norms": 0.0}
    return {"params": lr_steps, "exp_avg": g_unit, "exp_avg_sq": g_unit * g_unit, "norms": 0.0}
MAX_CLIP_TENSORS = 64
LARGE_TENSOR = 2**20 + 7
