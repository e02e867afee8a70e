"""torch tensors and mojo_train buffers, for the adapter's autograd Functions.

Contract: ``float32`` and ``indices`` refuse, by the user's argument name, a tensor of a dtype
the native API would refuse (half and bfloat16 included: nothing is cast); ``refuse_autocast``
refuses a call made under ``torch.autocast`` for the inputs' device type; ``device_of`` requires
every tensor of a call on one device: the CPU, or cuda:0 (the GPU vendor's one device).
``dense`` is the tensor itself when it is C-contiguous, else ``tensor.contiguous()`` -- a copy,
what torch's own kernels make of a strided input. ``native`` makes a native call, its refusal
worded for the adapter's caller (``where``, the user's argument names). ``as_torch`` wraps what
a native call returned as a torch tensor without copying: a ``mojo_train.Array`` through
``torch.frombuffer`` over its own memory; on CUDA the outputs a native call allocates are
``torch.empty`` tensors already (``native`` lends it torch's caching allocator), returned as
they are, and any other ``DeviceArray`` goes through DLPack (the tensor keeps the array alive);
a loss returned as a Python float becomes a 0-d tensor on the inputs' device (4 bytes copied
there). No result is a view (in-place ops on it stay allowed in autograd).

``probed`` hands the native API, in place of a tensor, the ``Probe`` its own ``_buffer.probe``
would make of it (dtype, shape, sizes, address, contiguity, side, the tensor as ``obj`` and
``versioned``; on the CPU a memoryview over the memory, kept alive by the tensor), read from
torch's metadata -- ``data_ptr``, ``shape``, ``dtype``, ``numel`` -- instead of through a DLPack
capsule (CPU) or ``__cuda_array_interface__`` (CUDA): the same fields, so the same checks, bits
and refusals, at a fraction of the cost (on the CPU 3 us against 25 or more). Anything unusual
-- another dtype or layout, a strided, empty or negated view, a tensor subclass, another device
type -- is handed over as the tensor itself, which the native API probes as before.

Streams (CUDA). Every native CUDA entry point runs on the calling thread's per-thread default
stream (``cudaStreamPerThread``) and synchronizes it before returning (it reads back its
finiteness status), so its outputs are complete when it returns and torch may use them on any
stream. A thread that defers refusals (``mojo_train.deferred``) has its deferrable calls return
before they ran: on torch's default stream CUDA's rule below orders torch's later work after
them (and a dropped input's or output's memory, reused by torch on that stream, likewise); on
any other stream ``native`` waits for them after each call (``_complete_for_torch``). The
other way, work torch queued on its current stream -- which produced our inputs --
is ordered before ours only when that stream is the legacy default stream (the per-thread
stream is a blocking stream: its work waits for the legacy stream's, by CUDA's rule), not when it
is a stream of torch's pool (``torch.cuda.Stream()`` creates non-blocking ones). So
``wait_for_torch`` does nothing on torch's default stream (handle 0) and, on any other stream,
synchronizes it on the host before the native call: correct on every stream, no event, no
copy. The outputs a native call allocates on CUDA are ``torch.empty`` tensors made on torch's
current stream (torch's caching allocator): any earlier use of that memory was torch work on
that stream, finished before the call (by the rule above or the host synchronization), and the
call is complete when torch gets the tensor, so torch may reuse the memory at once when it drops
it. Under torch's deterministic algorithms torch.empty also queues a NaN fill, waited for
(``new_tensor``) where CUDA's rule does not order it. An error inside a call (not a refusal,
which comes after the call's synchronization) synchronizes the device before the outputs go back
to torch. (torch's ``cudaMallocAsync`` allocator backend on a non-default stream is not covered:
its reuse dependency is a stream wait that the per-thread stream does not see.) A
``DeviceArray`` of our own is freed through ``mt_device_free``, which synchronizes the device
first (so no stream still reads it).
"""
import torch

from .._array import Array
from .._buffer import Probe
from .._devices import device_of  # noqa: F401  (the adapter's device rule, shared with distributed)
from .._errors import where_msg
from .._ops import device_outputs, rename_arguments
from .._probe import _owned_view
from ..device import DeviceArray

class AutocastError(RuntimeError, TypeError):
    """A call under ``torch.autocast``: refused (a RuntimeError in torch's terms, a TypeError
    -- the dtype autocast would choose -- in ours)."""


def _tensor(t, name, where):
    if not isinstance(t, torch.Tensor):
        raise TypeError(where_msg(where, "%s must be a torch.Tensor, got %s" % (name, type(t).__name__)))
    return t


def float32(t, name, where, *, of_model=True):
    """``t``, a float32 torch tensor; TypeError naming its dtype (half, bfloat16, float64, ...)
    otherwise (its fix names ``model.float()`` too when ``of_model``: an input or parameter)."""
    _tensor(t, name, where)
    if t.dtype != torch.float32:
        raise TypeError(where_msg(where, "%s has dtype %s; mojo_train computes in float32 only and never "
                                  "casts (convert with %s.float()%s)"
                                  % (name, t.dtype, name, ", or a model with model.float()" if of_model else "")))
    return t


def indices(t, name, where):
    """``t``, a torch tensor of an integer dtype (TypeError naming the dtype otherwise)."""
    _tensor(t, name, where)
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise TypeError(where_msg(where, "%s has dtype %s; class or row indices must be integers "
                                  "(convert with %s.long())" % (name, t.dtype, name)))
    return t


def refuse_autocast(where, device):
    """AutocastError when ``torch.autocast`` is on for ``device``'s type."""
    if torch.is_autocast_enabled(device.type):
        raise AutocastError(where_msg(where, "called under torch.autocast(%r) (which would run it in %s); "
                                      "mojo_train computes in float32 only and never casts: call it outside "
                                      "autocast, e.g. inside torch.autocast(%r, enabled=False)"
                                      % (device.type, torch.get_autocast_dtype(device.type), device.type)))


def _cuda_device(args, kwargs):
    """The CUDA device of the first CUDA tensor (or Probe of one) among a native call's
    arguments, or None: a call on the CPU."""
    for a in args + tuple(kwargs.values()):
        t = a.obj if isinstance(a, Probe) else a
        if isinstance(t, torch.Tensor) and t.is_cuda:
            return t.device
    return None


def _torch_outputs(device):
    """device_outputs' allocator: each output a float32 ``torch.empty`` on ``device`` (torch's
    caching allocator, on torch's current stream), viewed as a DeviceArray that keeps it alive."""
    def allocate(shape, numeric_mode):
        t = new_tensor(shape, torch.float32, device)
        return DeviceArray._borrowing(shape, t.data_ptr(), t, numeric_mode=numeric_mode)
    return allocate


def native(where, names, fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` (a mojo_train entry point); its refusal is raised again as from
    ``where``, with its argument names replaced by the user's (``names``: native -> user). On
    CUDA, the outputs the call allocates are torch tensors (``_torch_outputs``), which
    ``as_torch`` returns as they are."""
    device = _cuda_device(args, kwargs)
    try:
        if device is None:
            return fn(*args, **kwargs)
        try:
            with device_outputs(_torch_outputs(device)):
                out = fn(*args, **kwargs)
            _complete_for_torch(device)
            return out
        except BaseException:
            # A refusal comes after the call's synchronization, but an internal error (a scratch
            # allocation failing after a launch) may leave kernels writing into the torch outputs,
            # which go back to torch's allocator now: let them finish first.
            torch.cuda.synchronize(device)
            raise
    except (ValueError, TypeError, IndexError, NotImplementedError) as exc:
        text = str(exc)
        if not text.startswith("mojo_train."):
            raise
        text = text.split(": ", 1)[1]
        if "(deferred: call" in text:    # an earlier call's refusal: its own argument names
            names = None
        raise type(exc)(where_msg(where, rename_arguments(text, names) if names else text)) from None


def dense(t):
    """``t`` when C-contiguous (no copy), else ``t.contiguous()`` (a copy); None stays None. A
    negated view (``t.is_neg()``: torch's lazy negation bit, e.g. ``x._neg_view()`` or the
    imaginary part of a conjugate) is materialized first: its memory holds ``-t``."""
    if t is None:
        return None
    if t.is_neg():
        t = t.resolve_neg()
    return t if t.is_contiguous() else t.contiguous()


def unbroadcast(t, full):
    """``t`` with each broadcast dimension (stride 0, size above 1, as ``expand`` makes) narrowed
    to size 1, when ``t``'s shape broadcasts to ``full``: a view of the same memory that still
    broadcasts to it, for a native call that broadcasts by itself (an attention mask:
    ``mask.expand(B, H, T, T)`` is then not copied B*H times by ``dense``). A ``t`` that does not
    broadcast to ``full`` is returned as it is, so that the native call refuses it by the shape
    the caller gave. None stays None."""
    if t is None or t.dim() > len(full) or any(
            n not in (1, f) for n, f in zip(reversed(t.shape), reversed(full))):
        return t
    for dim in range(t.dim()):
        if t.stride(dim) == 0 and t.shape[dim] > 1:
            t = t.narrow(dim, 0, 1)
    return t


# dtypes ``probed`` describes: (struct format, mojo_train's dtype name, itemsize), as _probe.py names them
_PROBED = {torch.float32: ("f", "float32", 4), torch.int64: ("q", "int64", 8), torch.int32: ("i", "int32", 4)}
_PLAIN = (torch.Tensor, torch.nn.Parameter)
# torch's current-stream handle of a CUDA device index, without a Stream object (None: this torch lacks it)
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def probed(t):
    """The native API's Probe of ``t`` made from torch's metadata (module docstring), or ``t``
    itself (None stays None) when it is not a plain, non-empty, C-contiguous float32, int64 or
    int32 tensor on the CPU or a CUDA device. Pass the result only where the native API takes a
    Probe in place of the tensor (``f32_in``, ``out_arg``, ``ids_in``)."""
    if t is None or type(t) not in _PLAIN:
        return t
    row = _PROBED.get(t.dtype)
    if row is None or t.layout is not torch.strided or not t.is_contiguous() or t.is_neg():
        return t
    fmt, dtype, itemsize = row
    nelems = t.numel()
    if not nelems:
        return t
    device = t.is_cuda
    if not device and not t.is_cpu:
        return t
    shape, address, nbytes = tuple(t.shape), t.data_ptr(), nelems * itemsize
    view = None if device else _owned_view(t, address, nbytes, fmt, shape)
    p = Probe(t, view, fmt, dtype, itemsize, shape, nelems, nbytes, False, True, address)
    p.device, p.versioned = device, t
    return p


def _complete_for_torch(device):
    """After a native call on ``device``: when the calling thread defers refusals
    (mojo_train.deferred) and torch's current stream is not the legacy default stream, wait for
    the queued calls (raising a refusal among them), so the outputs are complete on that stream,
    which is not ordered with ours (see the module docstring); on the default stream CUDA's
    rule orders torch's later work after ours, and nothing waits."""
    if device.type != "cuda":
        return
    if _RAW_STREAM is not None and device.index is not None and _RAW_STREAM(device.index) == 0:
        return
    if torch.cuda.current_stream(device).cuda_stream == 0:
        return
    from .. import deferred
    if deferred.deferred_refusals_enabled():
        deferred.synchronize()


def wait_for_torch(device):
    """Before a native call on ``device``: on CUDA, unless torch's current stream is the legacy
    default stream (handle 0, torch's default), whose work the per-thread stream of the native
    call waits for by CUDA's own rule, wait on the host until that stream has finished the work
    queued on it (see the module docstring); nothing on the CPU. The handle is read through
    torch's raw accessor (the value ``torch.cuda.current_stream(device).cuda_stream`` gives,
    without building a Stream object) where torch has it."""
    if device.type == "cuda":
        if _RAW_STREAM is not None and device.index is not None and _RAW_STREAM(device.index) == 0:
            return
        stream = torch.cuda.current_stream(device)
        if stream.cuda_stream != 0:
            stream.synchronize()


def _fills_new_memory():
    """Whether torch.empty queues a fill of the new memory (deterministic algorithms with
    ``torch.utils.deterministic.fill_uninitialized_memory``, on by default there)."""
    if not torch.are_deterministic_algorithms_enabled():
        return False
    deterministic = getattr(torch.utils, "deterministic", None)
    return bool(getattr(deterministic, "fill_uninitialized_memory", True))


def new_tensor(shape, dtype, device):
    """``torch.empty(shape)`` for a native call to write. Under torch's deterministic algorithms
    torch.empty queues a NaN fill on torch's current stream; on a stream other than the legacy
    default one (whose work ours waits for by CUDA's rule) that fill is waited for here, so it
    cannot land after the native call's writes."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.is_cuda and _fills_new_memory():
        wait_for_torch(t.device)
    return t


def empty_like(t):
    """A new C-contiguous tensor shaped like ``t`` on its device, for a native ``out=``."""
    return new_tensor(t.shape, t.dtype, t.device)


def as_torch(result, device):
    """A native result as a torch tensor on ``device``, sharing its memory (see the module
    docstring); None stays None."""
    if result is None:
        return None
    if isinstance(result, float):
        return torch.tensor(result, dtype=torch.float32, device=device)
    if isinstance(result, DeviceArray):
        owner = result._borrowed_from()        # a torch tensor made by _torch_outputs: itself
        if isinstance(owner, torch.Tensor):
            return owner if tuple(owner.shape) == tuple(result.shape) else owner.view(result.shape).detach()
        return torch.from_dlpack(result)
    if isinstance(result, Array):
        if result.nbytes == 0:
            return torch.empty(result.shape, dtype=torch.float32)
        # detached: a view made inside a Function's forward could not be modified in place later
        return torch.frombuffer(result.memview().cast("B"), dtype=torch.float32).view(result.shape).detach()
    return result       # already a torch tensor (an out= the call wrote)
