"""Data-parallel gradients whose bits do not depend on the number of processes, over torch.distributed.

Contract (issue 15; the token rule of native/contracts/linear.md, the aligned splits of
native/contracts/accumulate.md). ``N`` ranks each compute the gradient of a contiguous share of
one batch of ``T`` tokens -- rank ``r`` the tokens ``[r T / N, (r + 1) T / N)`` -- and
``reduce_gradients`` turns them, on every rank, into the bits one process computes for the whole
batch. A rank's share is to the batch what a microbatch is to ``accumulate_grads``: when the
split is aligned (``accumulation_is_aligned(T, N)``: each share a power of two of whole
1024-token leaves), the single process's pairwise tree over leaves is the pairwise tree over the
ranks' own trees, and the sum ``accumulate_grads`` makes of the ranks' gradients in rank order
(``mt_accumulate``, the only code that adds gradients, called here on pieces of the shards) is
that top of the tree. The alignment rule is accumulate.py's own (``_alignment_problem``). A
misaligned split is refused before anything is sent.

Shard by contiguous runs (``contiguous_shard``, ``ContiguousBatchSampler``), never by torch's
``DistributedSampler``: it gives rank ``r`` the samples ``r, r + N, r + 2N, ...``, so the batch
the ranks hold together is the single process's batch in another order (rank 0's samples, then
rank 1's...), whose leaves hold other tokens: another tree, other bits, and yet another for every
``N``. A rank's loss must also be the whole batch's: a mean divides by ``T``, not by the share's
token count (``num_items=T`` in ``linear_cross_entropy`` / ``cross_entropy``; with a per-share
mean every rank's gradient would be ``N`` times too large).

The algorithm (per call; ``n`` = the elements of all gradients, shard ``j`` = the flattened
elements ``[j n / N, (j + 1) n / N)``; every rank sends ``2 (N - 1) n / N`` floats, a ring
all-reduce's volume, and receives as many):

1. Each rank checks its own arguments (alignment, float32 C-contiguous host buffers, the tokens and
   shapes it passes) and allocates its scratch; one small all_gather (two when a refusal's text
   is long) then tells every rank every rank's outcome, so a refusal on one rank is raised, with the same type
   and text, on every rank, before anything is sent or written (no rank is left waiting in a
   collective). The same happens in step 3.
2. Exchange: rank ``r`` sends shard ``j`` of its gradients to rank ``j`` and receives shard ``r``
   of every rank's (point-to-point ``isend``/``irecv`` in pieces of 4 MB, all posted at once: an
   all-to-all).
3. Combine: as soon as every rank's copy of a piece of shard ``r`` has arrived, rank ``r`` adds
   them by ``mt_accumulate``, in rank order, into a scratch shard (a NaN, an infinity or an
   overflowing sum is refused there, and agreed as in step 1, after every message completed).
4. Gather: rank ``r`` sends its combined shard to every rank (``isend``/``irecv``; gloo's
   ``all_gather`` measured three times slower than these on the same bytes), which write it into
   the gradients in place.

Gradients that lie end to end (one tensor, a DDP bucket, a flat buffer) are read and written in
place; otherwise they are copied into one flat buffer and back. Scratch, kept between calls
(``release_workspace`` frees it; a fresh buffer's page faults cost more than the combine):
``(N - 1) n / N`` floats received, ``n / N`` combined, plus ``n`` for the flat copy when one is
needed -- up to 2n floats, held by each thread that reduced (DDP's hook runs on autograd's
thread, which keeps its own) until ``release_workspace``.

Transports. Host buffers go over gloo as above. CUDA torch tensors take NCCL when the group has
it (``nccl``, or ``cpu:gloo,cuda:nccl`` with a GPU library loaded; with a CPU library they are
staged for gloo as below), all on cuda:0 (each rank's own GPU made its first visible one; another
index is refused, as by the torch adapter): the batched transport, which moves whole shards, each
step's sends and receives as one ``batch_isend_irecv`` (NCCL runs a batch's operations together,
so no send waits on a receive posted after it), the combine by the GPU library's
``mt_accumulate`` on the received shards in place (MOJO_TRAIN_VENDOR=cuda; torch's stream is
synchronized first), the outcome agreed, then the combined shards gathered straight into the
gradients (several tensors: packed into one flat copy on the device and back). The same bytes
travel as by gloo; the scratch lies on the GPU. The gathered gradients are ordered on torch's
current stream (NCCL's works do not block the host): torch's own use of them, and the torch
adapter's, follow it; code reading them on another stream waits for that one first. Written for issue 15 point 4; its logic runs
in the CPU tests on CPU tensors over gloo (``_BATCHED_ON_CPU_FOR_TESTS``); NCCL itself needs two
GPUs (``tests/test_distributed_nccl.py``), NOT YET RUN: no machine with two GPUs has been lent.
Under gloo alone CUDA torch tensors are staged through host memory (copied to the CPU, reduced
there, copied back): run on one H200 by groups of 1, 2 and 4 ranks of four processes sharing it
(tenth session; ``tests/test_distributed.py -k cuda``), ending in one CPU process's bytes. Host
buffers under NCCL alone are refused (TypeError naming the fix); a group with neither gloo nor
NCCL is refused (NotImplementedError).

This module is the only one of mojo_train that imports torch; ``import mojo_train`` does not import
it (tests/test_imports.py).
"""
import hashlib
import json
import re
import threading
import weakref

try:
    import torch
    import torch.distributed as dist
except ImportError as exc:      # mojo_train itself runs without torch; this module drives torch.distributed
    raise ImportError("mojo_train.distributed needs PyTorch, which mojo_train itself does not depend on: "
                      "pip install torch (or pip install 'mojo_train[torch]')") from exc

from . import _buffer, _ops
from ._devices import device_of
from ._errors import where_msg
from ._native import ffi
from .accumulate import TOKEN_LEAF, _alignment_problem
from .device import DeviceArray

__all__ = ["reduce_gradients", "reduce_parameter_gradients", "check_same_parameters", "contiguous_shard",
           "ContiguousBatchSampler", "TokenRuleState", "token_rule_hook", "release_workspace"]

_MAX_TOKENS = 2 ** 62             # accumulate.py's bound
_MAX_INT32 = 2 ** 31 - 1
# The exception types a refusal keeps across ranks (the first that matches; NotImplementedError
# is a RuntimeError, RequiresGradError both a RuntimeError and a ValueError).
_KINDS = (NotImplementedError, TypeError, ValueError, RuntimeError)
_KIND_BY_NAME = {k.__name__: k for k in _KINDS}


# ---- sharding --------------------------------------------------------------------------------

def _world_and_rank(group, where):
    """(world size, rank) in ``group``, refusing when no process group exists."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(where_msg(where, "no process group: call torch.distributed.init_process_group "
                                     "first (or pass rank and world_size)"))
    return dist.get_world_size(group), dist.get_rank(group)


def contiguous_shard(n, rank=None, world_size=None, *, group=None):
    """The ``range`` of items (tokens, sequences or samples of one global batch, in batch order)
    that rank ``rank`` of ``world_size`` holds: ``[rank n / world_size, (rank + 1) n / world_size)``.

    ``rank`` and ``world_size`` default to the process group's (``group``, None: the default
    group). ``n`` must split into equal shares (ValueError otherwise): unequal shares cannot all be
    aligned subtrees of the batch. Slice a batch of sequences by it, ``rows =
    contiguous_shard(len(ids))``, ``ids[rows.start:rows.stop]``: whole sequences of one length keep
    each share's tokens contiguous in the flattened batch. Not torch's DistributedSampler (module docstring).
    """
    where = "distributed.contiguous_shard"
    if rank is None or world_size is None:
        world, me = _world_and_rank(group, where)
        world_size = world if world_size is None else world_size
        rank = me if rank is None else rank
    world_size = _ops.int_arg(world_size, "world_size", where, 1, _MAX_INT32)
    rank = _ops.int_arg(rank, "rank", where, 0, world_size - 1)
    n = _ops.int_arg(n, "n", where, 0, _MAX_TOKENS)
    if n % world_size:
        raise ValueError(where_msg(where, "n=%d items do not split into %d equal shares; every rank must "
                                   "hold the same count (a power of two of %d-token leaves) for its share "
                                   "to be an aligned subtree of the batch" % (n, world_size, TOKEN_LEAF)))
    share = n // world_size
    return range(rank * share, (rank + 1) * share)


class ContiguousBatchSampler:
    """A DataLoader ``batch_sampler`` for data-parallel training by the token rule: global batch
    ``b`` is samples ``[b B, (b + 1) B)`` of the dataset order (or of one permutation shared by
    every rank: ``shuffle=True``, drawn from ``seed + epoch`` by a seeded torch generator), and
    this rank gets its ``contiguous_shard`` of it. A last incomplete global batch is dropped
    (its token count would differ). ``DataLoader(dataset, batch_sampler=ContiguousBatchSampler(
    len(dataset), B))``; call ``set_epoch(e)`` before each epoch when shuffling, as with torch's
    DistributedSampler -- which this replaces (module docstring: why that one changes the bits)."""

    def __init__(self, num_samples, global_batch_size, rank=None, world_size=None, *, shuffle=False, seed=0,
                 group=None):
        where = "distributed.ContiguousBatchSampler"
        self.num_samples = _ops.int_arg(num_samples, "num_samples", where, 0, _MAX_TOKENS)
        self.global_batch_size = _ops.int_arg(global_batch_size, "global_batch_size", where, 1, _MAX_TOKENS)
        self.share = contiguous_shard(self.global_batch_size, rank, world_size, group=group)
        if not isinstance(shuffle, bool):
            raise TypeError(where_msg(where, "shuffle must be True or False, got %r" % (shuffle,)))
        self.shuffle, self.seed, self.epoch = shuffle, _ops.int_arg(seed, "seed", where, 0, 2 ** 62), 0

    def set_epoch(self, epoch):
        """The epoch whose permutation ``shuffle=True`` draws (the same on every rank)."""
        self.epoch = _ops.int_arg(epoch, "epoch", "distributed.ContiguousBatchSampler.set_epoch", 0, 2 ** 62)

    def __len__(self):
        return self.num_samples // self.global_batch_size

    def __iter__(self):
        order = range(self.num_samples)
        if self.shuffle:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.num_samples, generator=generator).tolist()
        for b in range(len(self)):
            start = b * self.global_batch_size
            yield [order[start + i] for i in self.share]


# ---- agreement: every rank learns every rank's outcome before anything is sent ----------------

def _backend(group):
    return str(dist.get_backend(group)).lower()


def _group_checked(group, where):
    """(world, rank) of ``group``, refusing (the same on every rank, so without a collective) a
    missing process group or a backend with neither gloo nor NCCL."""
    world, rank = _world_and_rank(group, where)
    backend = _backend(group)
    if "gloo" not in backend and "nccl" not in backend:
        raise NotImplementedError(where_msg(where, "the process group's backend is %r; this module moves "
                                            "gradients over gloo (host memory) or NCCL (CUDA tensors): create the "
                                            "group with backend='gloo', 'nccl' or 'cpu:gloo,cuda:nccl'" % backend))
    return world, rank


def _agreement_device(group):
    """Where the agreement's small tensors live: the CPU when the group has gloo, else (NCCL
    alone, which moves CUDA tensors only) the current CUDA device."""
    return torch.device("cpu") if "gloo" in _backend(group) else torch.device("cuda", torch.cuda.current_device())


_SLOT = 512      # bytes of one rank's outcome in the agreement's one fixed-size all_gather


def _gather_bytes(payload, group):
    """Every rank's ``payload`` (bytes), in rank order: one all_gather of a fixed slot (the length
    and the first bytes), and a second one only when some rank's payload does not fit (every rank
    sees every length, so all take the same branch)."""
    world, device = dist.get_world_size(group), _agreement_device(group)
    slot = torch.zeros(_SLOT, dtype=torch.uint8)
    head = len(payload).to_bytes(8, "little") + payload[:_SLOT - 8]
    slot[:len(head)] = torch.frombuffer(bytearray(head), dtype=torch.uint8)
    gathered = [torch.empty_like(slot, device=device) for _ in range(world)]
    dist.all_gather(gathered, slot.to(device), group=group)
    raw = [bytes(row) for row in torch.stack(gathered).cpu().tolist()]
    sizes = [int.from_bytes(r[:8], "little") for r in raw]
    if max(sizes) <= _SLOT - 8:
        return [r[8:8 + n] for r, n in zip(raw, sizes)]
    mine = torch.zeros(max(sizes), dtype=torch.uint8)
    if payload:
        mine[:len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    gathered = [torch.empty_like(mine, device=device) for _ in range(world)]
    dist.all_gather(gathered, mine.to(device), group=group)
    return [bytes(row[:size]) for row, size in zip(torch.stack(gathered).cpu().tolist(), sizes)]


def _kind(exc):
    return next((k for k in _KINDS if isinstance(exc, k)), RuntimeError)


def _agree(where, group, failure, **mine):
    """Every rank's outcome of its local step: ``failure`` (an exception or None) and the fields
    ``mine`` (JSON values). When any rank failed, every rank raises the first failing rank's
    refusal (its type among _KINDS, its text, the rank named); else returns every rank's fields,
    in rank order."""
    error = None
    if failure is not None:
        text, prefix = str(failure), "mojo_train.%s: " % where
        error = [_kind(failure).__name__, text[len(prefix):] if text.startswith(prefix) else text]
    outcomes = [json.loads(b.decode()) for b in _gather_bytes(json.dumps(dict(mine, error=error)).encode(), group)]
    for rank, outcome in enumerate(outcomes):
        if outcome["error"]:
            kind, text = outcome["error"]
            raise _KIND_BY_NAME[kind](where_msg(where, "rank %d refused, so every rank refuses and nothing was "
                                                "written: %s" % (rank, text))) from failure
    return outcomes


# ---- one rank's gradients, flat -----------------------------------------------------------------

def _misaligned(world, tokens, problem):
    per_rank = max(1, -(-tokens // (world * TOKEN_LEAF)))
    fix = world * TOKEN_LEAF * (1 << (per_rank - 1).bit_length())
    return ("%d ranks over tokens=%d are not aligned with the token rule (a rank's share is one microbatch of "
            "accumulate.md): %s; every rank must hold a power of two (1, 2, 4, ...) of whole %d-token leaves, "
            "e.g. tokens=%d for %d ranks; or pass tokens=None to combine anyway (the result then need not equal "
            "one process's bits)" % (world, tokens, problem, TOKEN_LEAF, fix, world))


def _staged(x, name, where):
    """(host buffer, the CUDA torch tensor it stages or None)."""
    if isinstance(x, DeviceArray):
        raise TypeError(where_msg(where, "%s is a DeviceArray; pass host buffers (x.to_host(), then "
                                  "mojo_train.to_device of the result) or CUDA torch tensors, which are "
                                  "staged through host memory" % name))
    if _buffer.is_torch_tensor(x) and x.device.type != "cpu":
        return x.detach().to("cpu"), x
    return x, None


def _items(tensors, name, where, inplace):
    """(whether ``tensors`` is one buffer, its buffers as a list, each one's argument name); with
    ``inplace``, a torch tensor requiring grad is refused (it is not a gradient)."""
    single = _buffer._is_buffer(tensors)
    if single:
        items = [tensors]
    elif isinstance(tensors, (str, bytes)) or not hasattr(tensors, "__iter__"):
        raise TypeError(where_msg(where, "%s must be a float32 buffer or a list of them, got %s"
                                  % (name, type(tensors).__name__)))
    else:
        items = list(tensors)
        if not items:
            raise ValueError(where_msg(where, "%s is an empty list" % name))
    names = [name] if single else ["%s[%d]" % (name, i) for i in range(len(items))]
    if inplace:
        for x, n in zip(items, names):
            if _buffer.is_torch_tensor(x) and x.requires_grad:
                raise ValueError(where_msg(where, "%s requires grad: it is a parameter or a result of autograd, "
                                           "not a gradient (reduce_gradients writes it in place); pass the "
                                           "gradients (p.grad), or reduce_parameter_gradients(parameters, tokens)"
                                           % n))
    return single, items, names


def _host_probes(tensors, name, where, inplace):
    """(Probes of host copies or the buffers themselves, [(device tensor, host copy)])."""
    single, items, names = _items(tensors, name, where, inplace)
    pairs = [_staged(x, n, where) for x, n in zip(items, names)]
    hosts = [h for h, _ in pairs]
    probes = _buffer.tensor_list(hosts[0] if single else hosts, name, where, inplace=inplace, allow_empty=True)
    return probes, [(d, h) for h, d in pairs if d is not None]


# Scratch kept between calls, float32 torch tensors by name, per thread (two threads reducing on
# two groups at once must not share it): a fresh buffer of this size costs its page faults on
# every call (measured: more than the combine itself). release_workspace() frees it.
_LOCAL = threading.local()
PIECE_ELEMENTS = 1 << 20      # a shard travels in pieces of 4 MB, each combined as soon as it arrived


class _Space(dict):
    """One thread's scratch buffers by (name, device) (a dict that a weak set can hold: hashed
    by identity)."""
    __hash__ = object.__hash__


# Every live thread's _Space, so that release_workspace reaches them all (DDP's hook runs on
# autograd's device threads); weak, so that a thread's buffers go with it.
_EVERY_WORKSPACE, _EVERY_LOCK = weakref.WeakSet(), threading.Lock()


def _workspace():
    space = _LOCAL.__dict__.get("buffers")
    if space is None:
        space = _LOCAL.buffers = _Space()
        with _EVERY_LOCK:
            _EVERY_WORKSPACE.add(space)
    return space


def _scratch(name, numel, device=None):
    """``numel`` float32 of the named scratch buffer on ``device`` (None: the CPU)."""
    space, key = _workspace(), (name, str(device or "cpu"))
    t = space.get(key)
    if t is None or t.numel() < numel:
        space.pop(key, None)
        t = space[key] = torch.empty(max(numel, 1), dtype=torch.float32, device=device or "cpu")
    return t[:numel]


def release_workspace():
    """Free the scratch buffers ``reduce_gradients`` keeps between calls, every thread's (DDP's
    hook runs on autograd's threads), in host memory and on the GPU (for gradients of ``n``
    floats over ``N`` ranks: ``n`` floats, plus ``n`` more when they do not lie end to end). A
    call running meanwhile keeps the buffers it holds until it returns."""
    with _EVERY_LOCK:
        spaces = list(_EVERY_WORKSPACE)
    for space in spaces:
        space.clear()


class _Share:
    """One rank's gradients as the reduction reads them: host Probes, one flat float32 torch view
    over them (their own memory when they lie end to end, else a packed copy), the shard bounds."""

    def __init__(self, where, grads, name, tokens, world, rank):
        self._common(where, tokens, world, rank)
        self.probes, self.staged = _host_probes(grads, name, where, inplace=True)
        self._shape(", pieces of %d" % PIECE_ELEMENTS)
        self._reserve()

    def _common(self, where, tokens, world, rank):
        """The checks and fields both transports share (before the gradients are read)."""
        if tokens is not None:
            tokens = _ops.int_arg(tokens, "tokens", where, 1, _MAX_TOKENS)
            problem = _alignment_problem(tokens, world)
            if problem:
                raise ValueError(where_msg(where, _misaligned(world, tokens, problem)))
        self.where, self.world, self.rank, self.tokens = where, world, rank, tokens
        self.packed = self._combine = None

    def _shape(self, transport):
        """n, the shard bounds and the signature every rank must agree on, from ``self.probes``."""
        self.n = sum(p.nelems for p in self.probes)
        shapes = [list(p.shape) for p in self.probes]
        self.signature = "tokens=%s, %d tensors of %d elements (shapes digest %s)%s" % (
            self.tokens, len(shapes), self.n, hashlib.sha256(json.dumps(shapes).encode()).hexdigest()[:12], transport)
        self.bounds = [j * self.n // self.world for j in range(self.world + 1)]

    device = None      # where the scratch lies (None: host memory)

    def _reserve(self):
        """Every scratch buffer the exchange will take, allocated now -- before the agreement --
        so that running out of memory is a refusal every rank hears of, not a rank gone missing
        from the messages the others wait for."""
        lo, hi = self.bounds[self.rank], self.bounds[self.rank + 1]
        if self.world > 1 and self.n:
            _scratch("received", (self.world - 1) * (hi - lo), self.device)
            _scratch("combined", hi - lo, self.device)
        if self.n and self._packs():
            _scratch("packed", self.n, self.device)

    def _packs(self):
        """Whether the gradients are copied into one flat buffer (they do not lie end to end)."""
        probes = [p for p in self.probes if p.nbytes]
        return not (len(probes) == 1 or _buffer.lie_end_to_end(probes))

    def flat(self):
        """The flat float32 view: the buffers' own memory when they lie end to end, else a scratch
        buffer that ``pack`` fills shard by shard and ``unpack`` empties."""
        probes = [p for p in self.probes if p.nbytes]
        if len(probes) == 1 or _buffer.lie_end_to_end(probes):
            return torch.frombuffer(_buffer.borrow_bytes(probes[0].address, 4 * self.n), dtype=torch.float32)
        self.packed = _scratch("packed", self.n)
        return self.packed

    def _copy_range(self, j, address, to_tensors):
        """Copy shard ``j``'s elements between the buffers and the float32 memory at ``address``."""
        lo, hi, start = self.bounds[j], self.bounds[j + 1], 0
        for p in self.probes:
            a, b = max(lo, start), min(hi, start + p.nelems)
            if a < b:
                flat, tensor = address + 4 * (a - lo), p.address + 4 * (a - start)
                _buffer.copy_bytes(tensor if to_tensors else flat, flat if to_tensors else tensor, 4 * (b - a))
            start += p.nelems

    def pack(self, j):
        """Shard ``j`` of the buffers into the packed flat (nothing to do when they are the flat)."""
        if self.packed is not None:
            self._copy_range(j, self.packed.data_ptr() + 4 * self.bounds[j], to_tensors=False)

    def unpack(self, j, flat, source):
        """Shard ``j``'s result, ``source`` (a float32 tensor), into the buffers."""
        if self.packed is not None:
            self._copy_range(j, source.data_ptr(), to_tensors=True)
        elif source.data_ptr() != self.shard(flat, j).data_ptr():
            self.shard(flat, j).copy_(source)

    def shard(self, flat, j):
        return flat[self.bounds[j]:self.bounds[j + 1]]

    def pieces(self, j):
        """The flattened ranges of shard ``j``'s pieces."""
        lo, hi = self.bounds[j], self.bounds[j + 1]
        return [(a, min(a + PIECE_ELEMENTS, hi)) for a in range(lo, hi, PIECE_ELEMENTS)]

    def combine(self, parts, out, numeric_mode):
        """``out`` = the pairwise tree over ``parts`` (every rank's copy of one piece of this rank's
        shard, in rank order): accumulate_grads's native call, ``mt_accumulate``, on torch views
        (accumulate_grads itself returns a new array a call, and probing its torch arguments
        cost more than the sum on 1 MB pieces). Its refusals say which rank's gradients and
        which tensors."""
        if self._combine is None:
            self._combine = (_ops.placement(self.where, numeric_mode)[0], ffi.new("float *[]", len(parts)))
        backend, table = self._combine
        for i, part in enumerate(parts):
            table[i] = ffi.cast("float *", part.data_ptr())
        rc = backend.lib.mt_accumulate(ffi.cast("float *", out.data_ptr()), table, len(parts), out.numel())
        try:
            backend.check(rc, "accumulate_grads")
        except ValueError as exc:
            text = str(exc).split(": ", 1)[-1]
            text = re.sub(r"\b(?:parts|microbatch_grads)\[(\d+)\] holds", r"rank \1's gradients hold", text)
            raise ValueError(where_msg(self.where, "combining shard %d (flattened elements [%d, %d), in %s): %s"
                                       % (self.rank, self.bounds[self.rank], self.bounds[self.rank + 1],
                                          self._tensors_of_shard(), text))) from None

    def _tensors_of_shard(self):
        lo, hi, start, names = self.bounds[self.rank], self.bounds[self.rank + 1], 0, []
        for i, p in enumerate(self.probes):
            if start < hi and start + p.nelems > lo:
                names.append(i)
            start += p.nelems
        return "tensor %d" % names[0] if len(names) == 1 else "tensors %d to %d" % (names[0], names[-1])

    def write_back(self):
        """After the gather: unstage CUDA tensors, bump torch versions."""
        for device_tensor, host in self.staged:
            device_tensor.copy_(host)
        _buffer.wrote(self.probes)


class _TensorShare(_Share):
    """One rank's gradients for the batched transport (module docstring: NCCL): torch tensors,
    all on one device, read and written by torch ops; one flat view (the tensor itself when
    there is one, else a packed copy in a scratch buffer on that device); whole shards move."""

    def __init__(self, where, grads, name, tokens, world, rank, numeric_mode):
        self._common(where, tokens, world, rank)
        single, self.tensors, names = _items(grads, name, where, inplace=True)
        self.probes = _buffer.tensor_list(grads if single else self.tensors, name, where, inplace=True,
                                          allow_empty=True)
        # one device, and on CUDA the GPU library's one device, cuda:0 (the adapter's own rule)
        self.device = device_of(where, **dict(zip(names, self.tensors)))
        self._shape(", whole shards on %s" % self.device.type)
        backend, _ = _ops.placement(where, numeric_mode, grads=self.probes[0])
        self._combine = (backend, ffi.new("float *[]", world))
        self._reserve()

    def _packs(self):
        return len([t for t in self.tensors if t.numel()]) > 1

    def flat(self):
        """The tensor itself (flattened) when it is the only nonempty one, else the packed copy."""
        if not self._packs():
            return next(t for t in self.tensors if t.numel()).view(-1)
        self.packed = _scratch("packed", self.n, self.device)
        torch.cat([t.reshape(-1) for t in self.tensors], out=self.packed)
        return self.packed

    def combine(self, parts, out, numeric_mode):
        if self.device.type == "cuda":     # what torch queued (NCCL's receives) is done before ours runs
            torch.cuda.current_stream(self.device).synchronize()
        _Share.combine(self, parts, out, numeric_mode)

    def write_back(self):
        """After the gather: the packed copy into the tensors, torch versions bumped."""
        if self.packed is not None:
            start = 0
            for t in self.tensors:
                t.view(-1).copy_(self.packed[start:start + t.numel()])
                start += t.numel()
        _buffer.wrote(self.probes)


# torch's own point-to-point functions, as P2POp requires them (taken once: P2POp refuses any other).
_ISEND, _IRECV = dist.isend, dist.irecv


def _batched(ops):
    """Run the point-to-point ``ops`` (P2POp) as one batch (NCCL groups them, so no send waits
    for a receive posted later) and wait for all of them."""
    if ops:
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def _p2p(pairs, group):
    """The P2POps of ``pairs`` [(tensor, torch's isend or irecv, group rank)], empties skipped."""
    return [dist.P2POp(op, tensor, _peer(group, j), group) for tensor, op, j in pairs if tensor.numel()]


def _reduce_batched(share, group, numeric_mode):
    """Steps 2 to 4 by the batched transport: whole shards exchanged in one batch, the combine,
    the agreement on its outcome, the combined shards gathered in a second batch."""
    world, rank, where = share.world, share.rank, share.where
    lo, hi = share.bounds[rank], share.bounds[rank + 1]
    flat = share.flat()
    received = _scratch("received", (world - 1) * (hi - lo), share.device).view(world - 1, hi - lo)
    combined = _scratch("combined", hi - lo, share.device)
    peers = [j for j in range(world) if j != rank]
    _batched(_p2p([pair for i, j in enumerate(peers)
                   for pair in ((share.shard(flat, j), _ISEND, j), (received[i], _IRECV, j))], group))
    failure = None
    try:
        if hi > lo:
            parts = [flat[lo:hi] if j == rank else received[peers.index(j)] for j in range(world)]
            share.combine(parts, combined, numeric_mode)
    except Exception as exc:       # agreed below: every rank refuses, nothing written
        failure = exc
    _agree(where, group, failure)
    if world == 1:        # the tree of one part is that part: the gradients already hold the result
        return
    _batched(_p2p([pair for j in peers for pair in ((combined, _ISEND, j), (share.shard(flat, j), _IRECV, j))],
                  group))
    flat[lo:hi].copy_(combined)
    share.write_back()


# Private: tests set it (in their worker processes) to run the batched transport on CPU torch
# tensors over gloo, so that its logic is tested where no two GPUs are.
_BATCHED_ON_CPU_FOR_TESTS = False


def _takes_batched(where, grads, group, numeric_mode):
    """Whether a call takes the batched transport: every gradient a CUDA torch tensor, the group
    has NCCL, and the loaded library takes device buffers (with gloo in the group and a CPU
    library, CUDA tensors are staged through host memory instead); or, for tests, every gradient
    a CPU torch tensor. ``grads``: one buffer or a list."""
    items = [grads] if _buffer._is_buffer(grads) else grads
    if not isinstance(items, list) or not items or not all(_buffer.is_torch_tensor(t) for t in items):
        return False
    if all(t.device.type == "cuda" for t in items) and "nccl" in _backend(group):
        return "gloo" not in _backend(group) or _ops.load(_ops.numeric_mode_arg(numeric_mode, where)).vendor != "cpu"
    return _BATCHED_ON_CPU_FOR_TESTS and all(t.device.type == "cpu" for t in items)


def _peer(group, j):
    return j if group is None else dist.get_global_rank(group, j)


def _post(send, receive, j, group, tag=0):
    """The works of sending ``send`` to and receiving ``receive`` from group rank ``j`` (empties skipped)."""
    works = []
    if send is not None and send.numel():
        works.append(dist.isend(send, _peer(group, j), group=group, tag=tag))
    if receive is not None and receive.numel():
        works.append(dist.irecv(receive, _peer(group, j), group=group, tag=tag))
    return works


def _exchange_and_combine(share, flat, group, numeric_mode):
    """Steps 2 and 3: every piece of every other shard sent to its owner, every piece of this
    rank's shard received from every rank and combined as soon as all its copies arrived (all
    messages posted at once, tagged by piece). Returns (combined shard, the combine's failure or
    None); every message has completed either way."""
    world, rank = share.world, share.rank
    lo, hi = share.bounds[rank], share.bounds[rank + 1]
    received = _scratch("received", (world - 1) * (hi - lo)).view(world - 1, hi - lo)
    combined = _scratch("combined", hi - lo)
    peers = [j for j in range(world) if j != rank]
    arriving = [[w for i, j in enumerate(peers) for w in _post(None, received[i, a - lo:b - lo], j, group, k)]
                for k, (a, b) in enumerate(share.pieces(rank))]
    sending = []
    for j in peers[rank:] + peers[:rank]:          # rank + 1 first, so that ranks send to different ranks
        share.pack(j)
        sending += [w for k, (a, b) in enumerate(share.pieces(j)) for w in _post(flat[a:b], None, j, group, k)]
    share.pack(rank)
    failure = None
    for k, (a, b) in enumerate(share.pieces(rank)):
        for work in arriving[k]:
            work.wait()
        if failure is None:
            parts = [flat[a:b] if j == rank else received[peers.index(j), a - lo:b - lo] for j in range(world)]
            try:
                share.combine(parts, combined[a - lo:b - lo], numeric_mode)
            except Exception as exc:   # agreed by the caller, after every message has completed
                failure = exc
    for work in sending:
        work.wait()
    return combined, failure


def _reduce(where, collect, name, tokens, group, numeric_mode):
    world, rank = _group_checked(group, where)
    share, failure = None, None
    try:
        grads = collect()
        if not _buffer._is_buffer(grads) and not isinstance(grads, (str, bytes)) and hasattr(grads, "__iter__"):
            grads = list(grads)            # once: a generator is read here, not by each step below
        if _takes_batched(where, grads, group, numeric_mode):
            share = _TensorShare(where, grads, name, tokens, world, rank, numeric_mode)
        elif "gloo" not in _backend(group):
            raise TypeError(where_msg(where, "the process group's backend is %r, which moves CUDA tensors only, "
                                      "and %s are not all CUDA torch tensors: pass the CUDA tensors themselves, "
                                      "or create the group with backend='cpu:gloo,cuda:nccl' (host buffers then "
                                      "go over gloo)" % (_backend(group), name)))
        else:
            share = _Share(where, grads, name, tokens, world, rank)
    except Exception as exc:     # any local refusal goes through the agreement: no rank waits alone
        failure = exc
    outcomes = _agree(where, group, failure, signature=share and share.signature)
    for j, outcome in enumerate(outcomes):
        if outcome["signature"] != outcomes[0]["signature"]:
            raise ValueError(where_msg(where, "the ranks disagree, so every rank refuses and nothing was written: "
                                       "rank 0 passes %s, rank %d passes %s; every rank passes the whole batch's "
                                       "tokens and gradients of the same shapes, of one kind (host buffers, or "
                                       "torch tensors on the same kind of device)"
                                       % (outcomes[0]["signature"], j, outcome["signature"])))
    if not share.n:
        return
    if isinstance(share, _TensorShare):
        _reduce_batched(share, group, numeric_mode)
        return
    flat = share.flat()
    combined, failure = _exchange_and_combine(share, flat, group, numeric_mode)    # 2. and 3.
    _agree(where, group, failure)
    if world == 1:        # the tree of one part is that part: the gradients already hold the result
        return
    peers = [j for j in range(world) if j != rank]                                 # 4. the gather
    arriving = [_post(None, share.shard(flat, j), j, group) for j in peers]
    sending = [w for j in peers for w in _post(combined, None, j, group)]
    share.unpack(rank, flat, combined)
    for j, works in zip(peers, arriving):
        for work in works:
            work.wait()
        share.unpack(j, flat, share.shard(flat, j))
    for work in sending:
        work.wait()
    share.write_back()


def reduce_gradients(grads, tokens, group=None, *, numeric_mode=None):
    """Turn this rank's gradients of its share of the batch into the whole batch's, in place, on
    every rank of ``group`` (None: the default process group): the bits one process computes.

    grads : a float32 C-contiguous buffer or a list of them (mojo_train Arrays, torch CPU tensors,
        numpy arrays...; CUDA torch tensors, over NCCL when the group has it, else staged
        through host memory for gloo: module docstring), the
        gradients of this rank's tokens ``contiguous_shard(tokens)``, the same shapes on every
        rank. A ``DeviceArray`` is refused. Written in place; returned.
    tokens : the whole batch's token count (all ranks together), the same on every rank. Ranks
        holding ``tokens / N`` tokens each are aligned when that is a power of two times 1024
        (``accumulation_is_aligned(tokens, N)``); otherwise ValueError saying the fix.
        ``tokens=None`` skips the check (the combine is still the tree over ranks; its bits then
        need not be one process's).

    Composes with microbatch accumulation: a rank may first combine its aligned microbatches,
    ``share = accumulate_grads(microbatch_grads, tokens // N)``, then ``reduce_gradients(share,
    tokens)``. A refusal on any rank -- a misaligned split, a bad buffer, ranks passing other
    tokens or shapes, NaN, an infinity or an overflowing sum -- is raised on every rank, same type
    and text, with no gradient written on any rank. Collective: every rank of the group must call
    it, in the same order as its other collectives. Threads: each thread keeps its own scratch;
    two threads may reduce at once on two different groups, never on one. A rank interrupted
    mid-call (KeyboardInterrupt) leaves the others waiting until the group's timeout (pass
    ``timeout=`` to ``init_process_group``).
    """
    _reduce("distributed.reduce_gradients", lambda: grads, "grads", tokens, group, numeric_mode)
    return grads


def reduce_parameter_gradients(parameters, tokens, group=None, *, numeric_mode=None):
    """``reduce_gradients`` over the ``.grad`` of every parameter that requires grad (e.g.
    ``model.parameters()``), in order: the DDP-style step of a torch loop, called after
    ``loss.backward()`` and before ``optimizer.step()``. A parameter requiring grad without a
    ``.grad`` is refused (on every rank). Returns the list of gradients."""
    where = "distributed.reduce_parameter_gradients"
    grads = []

    def collect():
        params = [p for p in parameters if p.requires_grad]
        missing = [i for i, p in enumerate(params) if p.grad is None]
        if missing:
            raise ValueError(where_msg(where, "parameter %d (of those requiring grad, in order) has no .grad: run "
                                       "backward first; a parameter this step did not use has none, and every rank "
                                       "must reduce the same gradients (give it a zero .grad on every rank)"
                                       % missing[0]))
        grads.extend(p.grad for p in params)
        return grads

    _reduce(where, collect, "grads", tokens, group, numeric_mode)
    return grads


def check_same_parameters(params, group=None):
    """Refuse, on every rank, parameters that are not the same bytes on every rank of ``group``.

    params : a float32 buffer or an iterable of them (``model.parameters()``, Arrays; CUDA tensors
        are read through host memory: not yet run on a GPU). Compares the SHA-256 of each tensor's bytes and
        its shape with rank 0's; ValueError naming the first rank and tensor that differ. Call it
        once before training: data-parallel bits equal one process's only from equal starts.
    Returns the SHA-256 (hex) over every tensor's digest, the same on every rank.
    """
    where = "distributed.check_same_parameters"
    _group_checked(group, where)
    digests, failure = None, None
    try:
        probes, _ = _host_probes(params, "params", where, inplace=False)
        digests = [[list(p.shape), hashlib.sha256(_buffer.borrow_bytes(p.address, p.nbytes, True)).hexdigest()]
                   for p in probes]
    except Exception as exc:     # agreed, as every local refusal
        failure = exc
    outcomes = _agree(where, group, failure, digests=digests)
    first = outcomes[0]["digests"]
    for rank, outcome in enumerate(outcomes[1:], 1):
        theirs = outcome["digests"]
        differ = [i for i, (a, b) in enumerate(zip(first, theirs)) if a != b]
        if len(theirs) != len(first) or differ:
            if not differ:
                what = "rank %d has %d tensors where rank 0 has %d" % (rank, len(theirs), len(first))
            elif theirs[differ[0]][0] != first[differ[0]][0]:
                what = ("rank %d's tensor %d has shape %s where rank 0's has shape %s"
                        % (rank, differ[0], tuple(theirs[differ[0]][0]), tuple(first[differ[0]][0])))
            else:
                what = ("rank %d's tensor %d (shape %s) holds other bytes than rank 0's"
                        % (rank, differ[0], tuple(theirs[differ[0]][0])))
            raise ValueError(where_msg(where, "the ranks start from different parameters: %s; start every "
                                       "rank alike (seed every rank the same before building the model, or copy "
                                       "rank 0's: torch.distributed.broadcast(p, src=0) for each p under "
                                       "torch.no_grad())" % what))
    return hashlib.sha256("".join(d for _, d in first).encode()).hexdigest()


# ---- DistributedDataParallel --------------------------------------------------------------------

class TokenRuleState:
    """The state of ``token_rule_hook``: ``tokens``, the whole batch's token count (set it again
    when the batch changes), ``group``, the process group DDP was given (None: the default), and
    ``numeric_mode``."""

    def __init__(self, tokens, group=None, numeric_mode=None):
        self.tokens, self.group, self.numeric_mode = tokens, group, numeric_mode


def token_rule_hook(state, bucket):
    """A ``DistributedDataParallel`` communication hook replacing DDP's all-reduce (whose order
    depends on the world size) by ``reduce_gradients`` on each gradient bucket:
    ``ddp_model.register_comm_hook(TokenRuleState(tokens), token_rule_hook)`` before the first
    step. The combine is elementwise, so DDP's bucketing changes no bit; DDP itself divides by
    nothing when a hook is registered (the loss's mean divides by the whole batch: num_items).
    Accumulate microbatches with ``accumulate_grads``, not DDP's ``no_sync`` (a running sum into
    ``.grad``, which is not the pairwise tree from four microbatches on). The hook runs
    synchronously (no overlap of communication with the backward). A refusal inside it (NaN, an
    overflowing sum) is raised on every rank, but it ends that DDP object (torch's reducer cannot
    resume after a hook raised) and buckets reduced before it hold their results: where refusals
    must be recoverable, call ``reduce_parameter_gradients`` after ``backward`` instead."""
    buffer = bucket.buffer()
    reduce_gradients(buffer, state.tokens, state.group, numeric_mode=state.numeric_mode)
    future = torch.futures.Future()
    future.set_result(buffer)
    return future
