"""The one error bound for comparisons with torch, and the fixed input ranges it holds over.

Only the comparisons with torch (tests/test_torch_reference.py, test_loss.py, test_linear.py,
test_rms_norm.py) use this: our own numeric modes are compared bit for bit elsewhere. The optimizers come first, then
cross-entropy's units and ranges (the same ATOL and RTOL); dense layers have a section below.
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

So the atol of a param is ATOL * lr * STEPS = 1.5e-4 * lr: it is measured against the distance
the params can travel, not against their O(1) size, and one missing, doubled or skipped Adam
step would exceed it thousands of times over. RTOL covers what float32 storage of a param
costs over STEPS steps: a half-ulp rounding each step, plus AdamW's factor (1 - lr*wd) rounded
to float32 and applied STEPS times.

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

Why Adam's (coupled) weight decay has its own, smaller range: with g + wd*p as the gradient,
an element where g + wd*p nearly cancels has v tiny next to eps**2 at step 1, and Adam's step
lr * g/(|g| + eps) turns the float32 rounding of wd*p (up to 2 * 2**-24 * wd * |p|) into a step
error of up to lr * 2**-23 * wd * |p| / eps; where decay dominates the gradient, p is driven to
0 and oscillates there with that same 1/eps gain, and 50 steps become chaotic. That is the
problem's conditioning, not our arithmetic: torch's own float32 Adam is as far from float64 as
ours there. At wd <= 1e-5 (and eps >= 1e-8) the step-1 error is at most 0.8 of the bound.

How the bound was chosen. Figures are "bound used" = the worst |ours - ref| / (ATOL * unit +
RTOL * |ref|) over every element of every case; above 1 is a failure. Command:
``PYTHONPATH=. python tests/test_torch_reference.py 4500`` (4,500 hypothesis-drawn optimizer
cases, about 1,500 each, every option, half clipped; 450 clip cases), CPU, torch 2.13:

                      ours identical   ours deterministic/fast   torch float32
    SGD   params           0.28              0.28                    0.28
          momentum buf     0.17              0.17                    0.17
    Adam  params           0.11              0.11                    0.11
          exp_avg_sq       0.17              0.17                    0.08
    AdamW params           0.50              0.23                    0.50
          exp_avg_sq       0.15              0.15                    0.05
    per-step norms         0.015             0.015                   0.023
    clip  grads, total     0.021             0.021                   0.022
    clip  with LARGE_TENSOR 0.029            0.029                   1.15 (outside)

So the bound is 2x the worst either needs. The worst (0.50, ours and torch float32 on the same
element: AdamW, lr = 1e-4, |p| ~ 0.5) is float32 storage of a param, whose worst case
STEPS * (2**-24 + 2**-25) = 4.5e-6 relative RTOL covers 2.2 times. ATOL is 2x the worst case of
our float32 betas in the moments (ours forms 1 - beta from float32(beta): for beta2 = 0.999
that is 1.3e-5 relative off, moving exp_avg_sq by up to 2**-25 * STEPS * G**2 = 1.5e-6 G**2;
torch rounds the double 1 - beta and needs less: 0.08 against our 0.17).

Outside these ranges, for the record (same command with ADAM_WEIGHT_DECAY_RANGE = (1e-4, 0.1),
3,000 cases): Adam's exp_avg uses 47 (ours identical), 88 (deterministic), 46 (torch float32)
of the bound, its params 14, 15, 15; with (1e-5, 1e-4) hypothesis soon finds cases above 1
(ours 1.7 at wd = 2.8e-5, lr = 0.1, k = 20; torch float32 1.8 at wd = 1e-4, lr = 0.1, k = 18).
torch float32's clip_grad_norm_ at LARGE_TENSOR is off by 1.2e-5 relative (ours: 2.2e-7):
torch's CPU float32 vector_norm folds each tensor through one 8- or 16-lane accumulator in one
linear pass. So torch float32 is calibrated on the clip test only below LARGE_TENSOR.

Cross-entropy (tests/test_loss.py). The reference is torch.nn.functional.cross_entropy in
float64 on the same float32 logits (num_items: its 'sum' divided by num_items), dlogits by
autograd. The bound is the same, elementwise, with these units (X = max(1, max |logit|) over
the batch, K = the rows not ignored, D = the mean's divisor, g = 1 for 'sum', 1/D for 'mean'):

    row losses ('none')   X       (lse - x_t cancels: its rounding is ulps of the logits)
    'sum'                 K * X   'mean'  K * X / D
    dlogits               g       (probabilities minus targets, scaled: absolute in units of g)

The mean of no rows (every row ignored) is checked apart: NaN on both sides, and our gradient
+0.0 where torch's is NaN. Input ranges: CE_ROWS rows, CE_VOCAB classes (plus fixed cases at
V = 50304), logits U(-1, 1) * 2**k with k in CE_LOGIT_EXP_RANGE, a fraction of ignored rows in
CE_IGNORE_CHOICES, label_smoothing 0 or in CE_SMOOTHING_RANGE, num_items None or 1..2N+1;
fixed cases add subnormal (2**-140) and large (1e4, 1e30) magnitudes.

Measured with ``PYTHONPATH=. python tests/test_loss.py 600`` (600 hypothesis-drawn cases),
CPU, torch 2.13, worst "bound used" (see above):

                      ours identical   ours deterministic/fast   torch float32
    row losses             0.015             0.015                   0.015
    sum / mean             0.022             0.022                   0.014
    dlogits                0.012             0.012                   0.029

So the optimizers' bound serves losses unchanged, with a margin of about 30 over the worst of
either (torch float32's dlogits); the units above are what is new.
"""
import numpy as np

STEPS = 50

RTOL = 1e-5
ATOL = 3e-6

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
ADAM_WEIGHT_DECAY_RANGE = (1e-6, 1e-5)
CLIP_RATIO_RANGE = (0.1, 2.0)

CE_ROWS = (0, 70)
CE_VOCAB = (1, 5000)
CE_LOGIT_EXP_RANGE = (-3, 6)
CE_IGNORE_CHOICES = (0.0, 0.3, 1.0)
CE_SMOOTHING_RANGE = (0.01, 0.95)


def ce_units(logits_absmax, kept, divisor, reduction):
    """The unit of each cross-entropy quantity (see the module docstring)."""
    x = max(1.0, float(logits_absmax))
    g = 1.0 if reduction != "mean" else (1.0 / divisor if divisor else 0.0)
    loss = {"none": x, "sum": kept * x, "mean": kept * x / divisor if divisor else 0.0}[reduction]
    return {"loss": loss, "dlogits": g}


def units(kind, options, g_unit):
    """The unit of every quantity an optimizer test compares (see the module docstring)."""
    lr_steps = options["lr"] * STEPS
    if kind == "SGD":
        buf = g_unit / (1.0 - options["momentum"])
        return {"params": lr_steps * buf, "momentum_buffer": buf, "norms": 0.0}
    return {"params": lr_steps, "exp_avg": g_unit, "exp_avg_sq": g_unit * g_unit, "norms": 0.0}


# No float32 result lies nearer a value than float32's grid allows: near zero that grid is the
# subnormals', 2**-149 apart. A bound below it (a tiny unit: tiny weights or probabilities
# scale cross-entropy's, 2026-12-03's long fuzz run) would fail every float32 result, torch's
# own included (torch float32 gave -0.0 for a loss of -1.8e-76), so the bound is at least that.
FLOAT32_GRID_AT_ZERO = 2.0 ** -149

# A mode that flushes (identical_ftz: its stated rule, native/contracts/ftz.md) gives 0 for a
# result below the smallest normal float, so near zero its grid is 2^-126, not the subnormals'.
# Found by hypothesis in 2026-12-05's fresh-clone CI: attention's dk and dv at tiny logits, 2e-42
# in float64, came out 0 on metal_emulated identical_ftz (176x a bound floored at 2^-149).
FLUSHED_GRID_AT_ZERO = 2.0 ** -126


def grid_at_zero(mode):
    """The floor of a comparison near zero for ``mode`` (a tests/conftest.py Mode): the flushed
    grid where the library declares that it flushes subnormals -- identical_ftz's stated rule
    (flush_rule), or a GPU fast mode's flushed arithmetic (approximate: cuda-fast flushed the same
    attention example as identical_ftz on an H100, thirtieth session) -- else float32's
    subnormal grid."""
    return FLUSHED_GRID_AT_ZERO if mode.has("flush_rule") or mode.has("approximate") else FLOAT32_GRID_AT_ZERO


# The (vendor, numeric mode) the running test computes in: conftest.py's mode fixtures set it for
# the test and restore it after. A comparison's floor near zero is that mode's grid unless the
# call names its own (twenty-fifth to thirtieth sessions: the floor came from each call site, and
# only attention's knew a flushing mode's).
MODE_UNDER_TEST = None


def floor_of_the_mode_under_test():
    return FLOAT32_GRID_AT_ZERO if MODE_UNDER_TEST is None else grid_at_zero(MODE_UNDER_TEST)

# A cross-entropy quantity in the subnormal range (tiny probabilities or class weights scale it:
# a loss of 3.7e-43 from three products of probabilities near 1e-39 and weights near 1e-3,
# 2026-12-03's thirteenth-session long fuzz run) is made of terms that each round onto that grid,
# so its error is a few spacings whatever the order: ours 1.42 spacings from float64 there, torch
# float32 0.42. The floor is one spacing per rounded term: CE_TERMS_PER_CLASS per class of a
# row's loss (its product and its addition), CE_TERMS_PER_GRADIENT for a gradient element.
CE_TERMS_PER_CLASS = 2
CE_TERMS_PER_GRADIENT = 4


def ce_floors(classes):
    """{quantity: the bound's floor} of cross-entropy over ``classes`` classes (see above)."""
    return {"loss": max(1, CE_TERMS_PER_CLASS * int(classes)) * FLOAT32_GRID_AT_ZERO,
            "dlogits": CE_TERMS_PER_GRADIENT * FLOAT32_GRID_AT_ZERO}


def bound_used(ours, ref64, unit, bound_of=None, floor=FLOAT32_GRID_AT_ZERO):
    """(worst |ours - ref| / bound, its index); a value above 1 is outside the bound (ATOL * unit +
    RTOL * |ref|, or ``bound_of(unit)`` for a family with its own bound, e.g. gelu_bound; never
    below ``floor``, at least FLOAT32_GRID_AT_ZERO)."""
    ours = np.asarray(ours, dtype=np.float64).ravel()
    ref64 = np.asarray(ref64, dtype=np.float64).ravel()
    if ours.shape != ref64.shape:
        raise AssertionError("shapes differ: ours %s, reference %s" % (ours.shape, ref64.shape))
    if ours.size == 0:
        return 0.0, None
    err = np.abs(ours - ref64)
    # |unit|: a unit is a magnitude, but a scale made of signed weights (cross-entropy's mean over
    # class weights that sum below zero) is negative, and a negative bound passed every error
    # (err / bound < 0) until the floor below made it fail (2026-12-03)
    bound = ATOL * np.abs(unit) + RTOL * np.abs(ref64) if bound_of is None else np.ravel(bound_of(unit))
    bound = np.maximum(bound, np.maximum(np.ravel(floor), FLOAT32_GRID_AT_ZERO))
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(err == 0, 0.0, err / bound)
    ratio = np.where(np.isnan(ours), np.inf, ratio)
    i = int(np.argmax(ratio))
    return float(ratio[i]), i


def assert_close_to_reference(ours, ref64, what, unit=1.0, floor=None):
    """Assert |ours - ref64| <= ATOL * unit + RTOL * |ref64| (at least ``floor``: by default the
    grid at zero of the mode under test) elementwise, naming the worst one."""
    if floor is None:
        floor = floor_of_the_mode_under_test()
    used, i = bound_used(ours, ref64, unit, floor=floor)
    if used > 1.0:
        ours = np.asarray(ours, dtype=np.float64).ravel()
        ref64 = np.asarray(ref64, dtype=np.float64).ravel()
        unit_i = np.broadcast_to(np.asarray(unit, dtype=np.float64).ravel(), ours.shape)[i]   # one, or per element
        raise AssertionError(
            "%s: outside the torch bound (ATOL=%g * unit=%g, RTOL=%g) by %.3gx at [%d]: "
            "ours=%r ref64=%r |diff|=%.3g" % (what, ATOL, unit_i, RTOL, used, i, ours[i], ref64[i],
                                              abs(ours[i] - ref64[i])))


# ---- dense layers (tests/test_linear.py, tests/test_rms_norm.py) ------------------------------------
"""The same bound, |ours - ref64| <= ATOL * unit + RTOL * |ref64|, holds for linear and RMSNorm
against torch in float64 (ours in every numeric mode, on the same float32 inputs, U(-1, 1) entries and
RMSNorm weights U(0.5, 1.5), shapes drawn in the ranges below). A dot product's unit is the sum
of the absolute values of its terms: the K products of a linear output (``|a| @ |w|.T``, plus
``|bias|``), the N of ``da``, the M rows of ``dweight`` and ``dbias``. It does NOT scale with
K: the rigorous bound of a K-term chain is K * 2**-24 * unit, but rounding errors of terms of
random sign add like a random walk while the unit grows like K, so the worst error seen stays
near 5 * 2**-24 * unit for K = 1..4096 (torch float32 alike: 4.8 at K = 100; its blocked
sums do better at large K: 0.7 at K = 4096, ours 4.1), which ATOL = 3e-6 = 50 * 2**-24
covers ten times over. RMSNorm: y's unit is |x| * r * |w| (itself: a few roundings);
dx = r*g - k*x cancels, so its unit is the size of both terms, r*|g| + |x| * r**3/D *
sum|g*x| (g = dy * w, r the float64 row scale); dweight's is sum over rows of |dy * x * r|.
Figures, "bound used" as above (worst over all outputs), ``PYTHONPATH=. python
tests/test_linear.py 200`` and ``tests/test_rms_norm.py 200`` (200 cases each):

                   ours identical   ours fast   torch float32
    linear out          0.070         0.070        0.048
    linear da           0.052         0.052        0.052
    linear dweight      0.060         0.060        0.047
    linear dbias        0.032         0.032        0.015
    rms_norm y          0.020         0.020        0.020
    rms_norm dx         0.057         0.055        0.058
    rms_norm dweight    0.044         0.044        0.033

(Before the two files were split, one generator drew both ops' cases and ours reached 0.083.)
So ours uses at most 0.070 of the bound (3.5 * 2**-24 * unit), torch float32 0.058: the bound
is loose on purpose, as above -- the bits are pinned by test_linear.py's and test_rms_norm.py's
replays of the chains, not by this comparison, which checks that the formulas are torch's.
"""

DENSE_ROWS_RANGE = (1, 2600)     # M rows / tokens (over 2048: three leaves of the token rule)
DENSE_OUT_RANGE = (1, 70)        # N outputs
DENSE_K_RANGE = (1, 1100)        # K inputs
RMS_DIM_RANGE = (1, 4200)        # D (over 4096: two chunks of the row tree)
RMS_ELEMENTS = 2 ** 19           # rows are drawn up to min(DENSE_ROWS_RANGE[1], RMS_ELEMENTS / D)
RMS_EPS = (0.0, 1e-6, 1e-5, 2.0 ** -23)


def linear_units(a, w, dc, bias=None):
    """The unit of every output of linear_forward / linear_backward (float64 arrays)."""
    a, w, dc = (np.abs(np.asarray(v, dtype=np.float64)) for v in (a, w, dc))
    out = a @ w.T
    if bias is not None:
        out = out + np.abs(np.asarray(bias, dtype=np.float64))
    return {"out": out, "da": dc @ w, "dweight": dc.T @ a, "dbias": dc.sum(axis=0)}


def rms_units(x, w, dy, eps):
    """The unit of y, dx and dweight of RMSNorm over the last dimension (float64 arrays)."""
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    d = x.shape[-1]
    w = np.ones(d) if w is None else np.asarray(w, dtype=np.float64)
    r = 1.0 / np.sqrt((x * x).mean(axis=-1, keepdims=True) + float(eps))
    g = dy * w
    dx = r * np.abs(g) + np.abs(x) * r ** 3 / d * np.abs(g * x).sum(axis=-1, keepdims=True)
    return {"y": np.abs(x) * r * np.abs(w), "dx": dx, "dweight": np.abs(dy * x * r).sum(axis=0)}


# ---- LayerNorm (tests/test_layer_norm.py) --------------------------------------------------------
"""The same bound, |ours - ref64| <= ATOL * unit + RTOL * |ref64|, holds for LayerNorm against
torch.nn.functional.layer_norm in float64 (ours in every numeric mode, on the same float32
inputs: x U(-1, 1), weight U(0.5, 1.5) and bias U(-1, 1) when given, dy U(-1, 1); D and rows
drawn in RMSNorm's ranges above, eps from LN_EPS below, weight and bias each present or not).
The units follow RMSNorm's, with the mean's rounding in them: a float32 mean is off by a few ulps of mean|x|,
which moves every x - mean by that much, so the size of a normalized element is taken as
``xa = r * (|x - mean| + mean|x|)`` (r, mean in float64). Then y's unit is ``xa * |w| + |b|``;
dx = r * ((g - mean g) - xhat * mean(g xhat)) cancels, so its unit is the size of its terms,
``r * (|g| + mean|g| + xa * mean(|g| xa))`` (g = dy * w); dweight's is the sum over rows of
``|dy| * xa``, dbias's the sum over rows of ``|dy|``.
Figures, "bound used" as above (worst over all outputs), ``PYTHONPATH=. python
tests/test_layer_norm.py 200`` (200 cases):

                     ours identical   ours fast   torch float32
    layer_norm y          0.027         0.027        0.034
    layer_norm dx         0.020         0.020        0.023
    layer_norm dweight    0.025         0.025        0.022
    layer_norm dbias      0.034         0.034        0.028

So ours uses at most 0.034 of the bound, as torch float32 does (0.034, its y): the dense
layers' bound serves LayerNorm unchanged, loose on purpose as there -- the bits are pinned by
test_layer_norm.py's replay of the contract, not by this comparison.
"""

LN_EPS = (1e-6, 1e-5, 1e-3)      # eps = 0 on a constant row is NaN on both sides (tested apart)


def ln_units(x, w, b, dy, eps):
    """The unit of y, dx, dweight and dbias of LayerNorm over the last dimension (float64 arrays)."""
    x, dy = np.asarray(x, dtype=np.float64), np.asarray(dy, dtype=np.float64)
    d = x.shape[-1]
    w = np.ones(d) if w is None else np.abs(np.asarray(w, dtype=np.float64))
    b = np.zeros(d) if b is None else np.abs(np.asarray(b, dtype=np.float64))
    mean = x.mean(axis=-1, keepdims=True)
    r = 1.0 / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + float(eps))
    xa = r * (np.abs(x - mean) + np.abs(x).mean(axis=-1, keepdims=True))
    g = np.abs(dy) * w
    dx = r * (g + g.mean(axis=-1, keepdims=True) + xa * (g * xa).mean(axis=-1, keepdims=True))
    return {"y": xa * w + b, "dx": dx, "dweight": (np.abs(dy) * xa).sum(axis=0), "dbias": np.abs(dy).sum(axis=0)}


# ---- attention (tests/test_attention.py) ----------------------------------------------------------
"""The same bound, |ours - ref64| <= ATOL * unit + RTOL * |ref64|, holds for attention against
torch's math formulation in float64 (softmax(q @ k.T * scale + mask) @ v by autograd; rows with a
live key only: a fully masked row is NaN there and defined as 0 here, tested apart), ours in every
numeric mode on the same float32 inputs: q, k U(-1, 1) * 2**e with e in ATT_LOGIT_EXP_RANGE (scores
up to about 2**(2e) * sqrt(D)), v and dout U(-1, 1), shapes, heads, masks and is_causal drawn in
the ranges below. A score is a chain of D products times scale: its error is a few ulps of
A_ij = |scale| * sum_d |q_id k_jd| (+ |mask_ij|), and the row's softmax moves by that much in
every p, so every unit carries S_i = 1 + max over live j of A_ij:

    out_id   S_i * sum_j p_ij |v_jd|           lse_i   S_i
    dv_jd    sum over the group's (h, i) of p_ij * S_i * |dout_id|
    dq_id    |scale| * sum_j p_ij E_ij S_i |k_jd|      dk_jd  |scale| * sum_(h,i) p_ij E_ij S_i |q_id|

with E_ij = sum_d |dout_id v_jd| + sum_d |dout_id out_id| (the sizes of the terms of dp_ij and
delta_i, which ds_ij = p_ij (dp_ij - delta_i) cancels). No unit is below ATT_SUBNORMAL_FLOOR =
8 * 2**-149 / ATOL: results in the subnormal range (large logits make some p_ij near 1e-40, and
then dk_jd, dv_jd subnormal) carry an absolute error of a few spacings 2**-149 on every side, one
rounding onto that grid per term (seen: ours 1.2 spacings, torch float32 3.7), so there the bound
is 8 spacings; it concerns only outputs whose unit is below 4e-39. Figures, "bound used" as above (worst over
all outputs), ``PYTHONPATH=. python tests/test_attention.py 1000`` (1000 cases, 3 minutes), CPU,
torch 2.13 (torch float32: F.scaled_dot_product_attention, its default CPU backend, and the
logsumexp of its float32 scores for lse):

                       ours identical   ours fast   torch float32
    attention out           0.068         0.068        0.068
    attention lse           0.035         0.035        0.035
    attention dq            0.032         0.032        0.033
    attention dk            0.200         0.200        0.746
    attention dv            0.167         0.167        0.143

So the optimizers' (ATOL, RTOL) serve attention with these units, torch float32's dk coming
nearest (0.75), ours at most 0.20 of the bound. As for the
dense layers, the bits are pinned by test_attention.py's replay of the contract, not here.
"""

ATT_BATCH_RANGE = (1, 2)
ATT_HEADS = ((1, 1), (2, 2), (3, 3), (2, 1), (4, 2), (6, 2), (4, 1))   # (H, Hkv)
ATT_T_RANGE = (1, 150)           # Tq and Tk, each (over 64 and 128: two and three key blocks)
ATT_D_RANGE = (1, 128)
ATT_LOGIT_EXP_RANGE = (-2, 3)
ATT_MASKS = ("none", "causal", "bool", "float")
ATT_ELEMENTS = 2 ** 21           # B * H * Tq * Tk * D at most (shapes are redrawn smaller above it)
ATT_SUBNORMAL_FLOOR = 8 * 2.0 ** -149 / ATOL


class _AttentionMagnitudes:
    """What attention_units and attention_flush_floors share: the inputs in float64, |k| and |v|
    repeated over each kv head's query heads, E_ij (below) and the sum over a kv head's group."""

    def __init__(self, q, k, v, dout, out):
        self.q, self.k, self.v, self.dout, self.out = (np.asarray(x, dtype=np.float64) for x in (q, k, v, dout, out))
        self.b, self.hkv, self.tk, self.d = self.k.shape
        self.group = self.q.shape[1] // self.hkv
        self.ke, self.ve = (np.repeat(np.abs(x), self.group, axis=1) for x in (self.k, self.v))
        self.e = (np.abs(self.dout) @ np.swapaxes(self.ve, -1, -2)
                  + (np.abs(self.dout) * np.abs(self.out)).sum(axis=-1, keepdims=True))

    def per_kv(self, x):   # (B, H, Tk, D) summed over each kv head's query heads
        return x.reshape(self.b, self.hkv, self.group, self.tk, self.d).sum(axis=2)


def attention_units(q, k, v, dout, out, p, live, scale, mask_abs):
    """The units of out, lse, dq, dk, dv (float64 arrays): q, dout, out (B, H, Tq, D); k, v
    (B, Hkv, Tk, D); p the reference's probabilities and live the kept pairs (B, H, Tq, Tk);
    mask_abs |float mask| broadcast to (B, H, Tq, Tk), or 0."""
    m = _AttentionMagnitudes(q, k, v, dout, out)
    a = abs(scale) * (np.abs(m.q) @ np.swapaxes(m.ke, -1, -2)) + mask_abs
    s = 1.0 + np.where(live, a, 0.0).max(axis=-1, initial=0.0)[..., None]
    w = p * m.e * s
    units = {"out": s * (p @ m.ve), "lse": s[..., 0], "dq": abs(scale) * (w @ m.ke),
             "dk": abs(scale) * m.per_kv(np.swapaxes(w, -1, -2) @ np.abs(m.q)),
             "dv": m.per_kv(np.swapaxes(p * s, -1, -2) @ np.abs(m.dout))}
    return {name: np.maximum(u, ATT_SUBNORMAL_FLOOR) for name, u in units.items()}


def attention_flush_floors(q, k, v, dout, out, p, live, scale):
    """In a mode that flushes (identical_ftz's rule, a GPU fast mode), the floors of out, lse, dq,
    dk, dv (float64 arrays; shapes as attention_units'). A p_ij or ds_ij = p_ij (dp_ij - delta_i)
    below 2^-126 may become 0 and so lose up to F = 2^-126, times what multiplies it afterwards;
    a product or chain partial below 2^-126 loses up to F once. With P_ij = 1 where the
    reference's p_ij < 2F, D_ij = 1 where its |ds_ij| < 2F (twice F: ours may round across it),
    and every sum over live pairs:

        out_id  F * sum_j (P_ij |v_jd| + 1)           dv_jd  F * sum_(h,i) (P_ij |dout_id| + 1)
        dq_id   |scale| F * sum_j ((P_ij |dp_ij - delta_i| + D_ij) |k_jd| + 1)
        dk_jd   |scale| F * sum_(h,i) ((P_ij |dp_ij - delta_i| + D_ij) |q_id| + 1)

    Found by hypothesis in 2026-12-07's fresh-clone CI: a dk of -1.2456e-38 in float64 (1.06 x
    2^-126) came out 0 on identical_ftz (cpu and metal_emulated alike, before and after that
    session's change): its p_ij near 1e-39 were flushed, then multiplied by |dp_ij - delta_i|
    |q_id| |scale| > 1. The single floor 2^-126 of FLUSHED_GRID_AT_ZERO covered only outputs that
    are themselves tiny. Where nothing is near 2^-126 this adds at most (Tq or Tk) x F."""
    m = _AttentionMagnitudes(q, k, v, dout, out)
    f = FLUSHED_GRID_AT_ZERO
    lv = live.astype(np.float64)
    vr = np.repeat(m.v, m.group, axis=1)
    gap = m.dout @ np.swapaxes(vr, -1, -2) - (m.dout * m.out).sum(axis=-1, keepdims=True)   # dp_ij - delta_i
    flushed_p = lv * (p < 2 * f)
    c = flushed_p * np.abs(gap) + lv * (np.abs(p * gap) < 2 * f)   # a ds_ij's loss, in units of F
    steps_q, steps_k = lv.sum(axis=-1, keepdims=True), np.swapaxes(lv, -1, -2).sum(axis=-1, keepdims=True)
    floors = {"out": f * (flushed_p @ m.ve + steps_q), "lse": np.full(m.q.shape[:-1], f),
              "dq": abs(scale) * f * (c @ m.ke + steps_q),
              "dk": abs(scale) * f * m.per_kv(np.swapaxes(c, -1, -2) @ np.abs(m.q) + steps_k),
              "dv": f * m.per_kv(np.swapaxes(flushed_p, -1, -2) @ np.abs(m.dout) + steps_k)}
    return {name: np.maximum(x, f) for name, x in floors.items()}


# ---- GELU (tests/test_elementwise.py) ---------------------------------------------------------------
"""GELU against torch's float64 ``gelu`` and autograd on the same float32 inputs, both approximations:

    |ours - ref64| <= GELU_ULPS * 2**-24 * unit + 2**-149,    unit = |x| for y, |dy| for dx

y's error is the rounding of 1 + erf(u) (1 + tanh(v)) times |x| / 2 whatever the sign of x -- so
|x|, not |y|: below x = -3, y is tiny and its relative error large, in torch float32 as in ours;
dx's is |dy| times the absolute roundings of a factor of size at most 1.13 (|gelu'|), largest
where 1 - tanh**2 cancels ('tanh', |x| near 5). 2**-149, one step of the subnormal grid, admits
the rounding of a subnormal y = x * 0.5 (or dx). Figures: the worst share of the bound used over
the test's inputs (binades 2**-30..2**7 of both signs, a dense run over [-12, 12], the edges of
elementwise.md; dy in [-2, 2]), ``PYTHONPATH=. python tests/test_elementwise.py``, CPU, torch 2.13:

                   ours identical   ours fast   torch float32
    'none'  y           0.121            0.121         0.141   (elementwise v3: A&S 7.1.26, torch's own
            dx          0.117            0.117         0.118    formula; v2 0.043, 0.073; v1 0.046, 0.076)
    'tanh'  y           0.046            0.046         0.046
            dx          0.274            0.274         0.482   (17.4 * 2**-24 * |dy|, at x = 5.06)

(x subnormal left out of these figures: y = x * 0.5 rounded onto the grid uses 0.5 of the bound,
ours and torch's alike.)

GELU_ULPS is twice the worst torch float32 needs; torch float32 is measured without |x| >= 2**64,
where its tanh gradient is NaN (x * x overflows) and its erf y at 3.4e38 inf. Ours is finite there
and the test keeps those inputs.
"""
GELU_ULPS = 36


def gelu_bound(unit):
    """The GELU bound of outputs whose unit is ``unit`` (see above), for bound_used's bound_of."""
    return GELU_ULPS * 2.0 ** -24 * np.abs(np.asarray(unit, dtype=np.float64)) + 2.0 ** -149
