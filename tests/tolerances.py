"""The one error bound for comparisons with torch, and the fixed input ranges it holds over.

Only tests/test_torch_reference.py uses this: our own tiers are compared bit for bit elsewhere.
Ours runs in float32; the reference is torch's own optimizer (default CPU path) in float64 on the
same float32 initial params and the same float32 gradients, clipping with
torch.nn.utils.clip_grad_norm_ in float64.

The bound, elementwise after STEPS steps:

    |ours - ref64| <= ATOL * unit + RTOL * |ref64|

``unit`` is the natural scale of the quantity compared, so that one (ATOL, RTOL) serves them all.
G is the largest |effective gradient| the reference saw (after maximize, clipping and coupled
weight decay), taken over all steps and elements:

    params        Adam, AdamW: lr * STEPS         (no Adam step moves a param much more than lr)
                  SGD: lr * STEPS * G / (1 - momentum)
    exp_avg       G             exp_avg_sq     G**2
    momentum buf  G / (1 - momentum)
    norms, clipped grads        0 (relative only: sums of squares and one scaling do not cancel)

So the atol of a param is ATOL * lr * STEPS = lr / 10**4: it is measured against the distance
the params can travel, not against their O(1) size, and one missing, doubled or skipped step
would exceed it ten-thousandfold. RTOL covers what float32 storage of a param costs over STEPS
steps: about STEPS half-ulps, plus AdamW's factor (1 - lr*wd) rounded to float32 and applied
STEPS times (STEPS * 2**-23 = 6e-6).

Input ranges (fixed; tests/test_torch_reference.py draws inside them):

    tensors       1..MAX_TENSORS per optimizer (1..MAX_CLIP_TENSORS for the clip test, sometimes
                  plus one of LARGE_TENSOR), each of SIZE_RANGE elements, 1-D
    params        U(-1, 1)                    gradients  U(-1, 1) * 2**-k, k in GRAD_EXP_RANGE
    lr            log-uniform LR_RANGE        eps        log-uniform EPS_RANGE
    betas         BETA1_RANGE, BETA2_RANGE    momentum   0 or MOMENTUM_RANGE, dampening 0 or
                  DAMPENING_RANGE (0 with nesterov)
    weight_decay  0 or log-uniform WEIGHT_DECAY_RANGE (SGD, AdamW), ADAM_WEIGHT_DECAY_RANGE (Adam)
    max_norm      None, or CLIP_RATIO_RANGE * the expected total norm of one step's gradients
    every flag    (nesterov, maximize) both ways

Why Adam's (coupled) weight decay has its own, smaller range: with g + wd*p in the gradient,
an element where g + wd*p nearly cancels has v tiny next to eps**2, and Adam's step
lr * g/(|g| + eps) then turns the float32 rounding of wd*p (about 2**-24 * wd * |p|) into a
step error of about lr * 2**-24 * wd * |p| / eps; near p = 0 the decay also feeds back through
that same 1/eps and the 50 steps become chaotic. That is the problem's conditioning, not our
arithmetic: torch's own float32 Adam is as far from float64 as ours there. Measured with
weight_decay up to 0.1 (5,000 Adam cases): worst bound-used of 860 (exp_avg) and 85 (params)
for torch float32, 970 and 70 for ours; with weight_decay <= 1e-4, at most 0.3 for both
(AdamW's decoupled decay never enters the normalisation and takes the full range).

How the bound was chosen (``python tests/test_torch_reference.py 2000``; 2,000 hypothesis-drawn
cases per optimizer, every option, half clipped; "bound used" = the worst
|ours - ref| / (ATOL * unit + RTOL * |ref|) over every element of every case):

    (filled in below from the measurement)

ATOL and RTOL are about 4x the worst torch float32 needs and 3x the worst ours needs. The
clip test at LARGE_TENSOR elements is the one place torch float32 falls outside the bound:
torch's CPU float32 vector_norm folds 2**20 squares through one 8- or 16-lane accumulator, and
measured 1.2e-5 relative error there (ours: 2.2e-7), so torch float32 is calibrated on the clip
test only below LARGE_TENSOR.
"""
import numpy as np

STEPS = 50

RTOL = 1e-5
ATOL = 2e-6

SIZE_RANGE = (1, 3000)
MAX_TENSORS = 4
MAX_CLIP_TENSORS = 64
LARGE_TENSOR = 2**20 + 7
GRAD_EXP_RANGE = (0, 20)
LR_RANGE = (1e-4, 1e-1)
EPS_RANGE = (1e-8, 1e-6)
BETA1_RANGE = (0.0, 0.99)
BETA2_RANGE = (0.9, 0.9999)
MOMENTUM_RANGE = (0.05, 0.95)
DAMPENING_RANGE = (0.0, 0.5)
WEIGHT_DECAY_RANGE = (1e-4, 1e-1)
ADAM_WEIGHT_DECAY_RANGE = (1e-6, 1e-4)
CLIP_RATIO_RANGE = (0.1, 2.0)


def units(kind, options, g_unit):
    """The unit of every quantity an optimizer test compares (see the module docstring)."""
    lr_steps = options["lr"] * STEPS
    if kind == "SGD":
        buf = g_unit / (1.0 - options["momentum"])
        return {"params": lr_steps * buf, "momentum_buffer": buf, "norms": 0.0}
    return {"params": lr_steps, "exp_avg": g_unit, "exp_avg_sq": g_unit * g_unit, "norms": 0.0}


def bound_used(ours, ref64, unit):
    """(worst |ours - ref| / bound, its index); a value above 1 is outside the bound."""
    ours = np.asarray(ours, dtype=np.float64).ravel()
    ref64 = np.asarray(ref64, dtype=np.float64).ravel()
    if ours.shape != ref64.shape:
        raise AssertionError("shapes differ: ours %s, reference %s" % (ours.shape, ref64.shape))
    if ours.size == 0:
        return 0.0, None
    err = np.abs(ours - ref64)
    bound = ATOL * unit + RTOL * np.abs(ref64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)
    ratio = np.where(np.isnan(ours), np.inf, ratio)
    i = int(np.argmax(ratio))
    return float(ratio[i]), i


def assert_close_to_reference(ours, ref64, what, unit=1.0):
    """Assert |ours - ref64| <= ATOL * unit + RTOL * |ref64| elementwise, naming the worst one."""
    used, i = bound_used(ours, ref64, unit)
    if used > 1.0:
        ours = np.asarray(ours, dtype=np.float64).ravel()
        ref64 = np.asarray(ref64, dtype=np.float64).ravel()
        raise AssertionError(
            "%s: outside the torch bound (ATOL=%g * unit=%g, RTOL=%g) by %.3gx at [%d]: "
            "ours=%r ref64=%r |diff|=%.3g" % (what, ATOL, unit, RTOL, used, i, ours[i], ref64[i],
                                              abs(ours[i] - ref64[i])))
