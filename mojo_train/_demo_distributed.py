"""``torchrun --nproc_per_node=N -m mojo_train demo --distributed``: the demo's MLP trained by N
processes over torch.distributed (gloo), ending in the digests of ``python -m mojo_train demo``.

Each step's batch of ``_demo.BATCH`` characters is cut into N contiguous shares
(``distributed.contiguous_shard``); rank r computes the gradients of its share, its loss's mean
dividing by the whole batch (``num_items``), and the token rule's sum of its rows' losses;
``distributed.reduce_gradients`` then adds the ranks' gradients and loss sums by the top of the
single process's tree, so every rank holds the whole batch's gradients (and steps AdamW with
them) and the batch's loss sum, divided once by the batch, as one process divides. The
parameters are checked equal on every rank before the first step and after the last. Only rank
0 prints and writes the SVG. N must split the batch into aligned shares (a power of two of whole
1024-token leaves: N = 1, 2 or 4); any other N is refused before training, on every rank.

Torch is imported here only. The transport is gloo: mojo_train's buffers are host memory on
every vendor (with ``--vendor cuda`` every rank stages through the process's current CUDA device,
device 0: give each rank its own GPU with CUDA_VISIBLE_DEVICES).
"""
import os

from .accumulate import TOKEN_LEAF
from .random import _nearest_f32


class Refusal(Exception):
    """A group the demo cannot run in (no torch, not under torchrun, a misaligned split): one
    line on stderr and exit status 2, on every rank."""


class Ranks:
    """This process's place in the group: ``rank``, ``world``, its ``rows`` of every batch."""

    def __init__(self, mt, batch):
        try:
            import torch.distributed as dist
        except ImportError:
            raise Refusal("--distributed needs torch (pip install torch): its process groups carry the gradients")
        if not dist.is_available() or not dist.is_gloo_available():
            raise Refusal("--distributed needs a torch built with torch.distributed and gloo; this one has none")
        from . import distributed
        self.owned = not dist.is_initialized()      # a group this process already had is left to its owner
        if self.owned:
            missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
            if missing:
                raise Refusal("--distributed runs under torchrun, which sets %s: torchrun --nproc_per_node=N "
                               "-m mojo_train demo --distributed (N = 1, 2 or 4)" % ", ".join(missing))
            dist.init_process_group("gloo")
        self.mt, self.dist, self.reduce_gradients = mt, dist, distributed.reduce_gradients
        self.check_same = distributed.check_same_parameters
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        if not mt.accumulation_is_aligned(batch, self.world):
            self.close()
            raise Refusal("--distributed: %d processes cannot split the demo's batch of %d characters into aligned "
                           "shares (each a power of two of whole %d-token leaves), so their bits could not be one "
                           "process's; run 1, 2 or 4 processes (torchrun --nproc_per_node)"
                           % (self.world, batch, TOKEN_LEAF))
        self.rows = distributed.contiguous_shard(batch, self.rank, self.world)

    def reduce(self, grads, loss_sum, batch):
        """The whole batch's gradients (in place) and mean loss, from this rank's share's."""
        total = self.mt.Array.from_list([loss_sum])
        self.reduce_gradients(grads + [total], batch)
        # one float32 division, as the loss's mean: a quotient of two float32 values rounded from
        # double to float32 is the float32 quotient (double carries over twice float32's precision)
        return _nearest_f32(total.tolist()[0] / _nearest_f32(batch))

    def describe(self):
        return ", %d processes over gloo, this is rank %d" % (self.world, self.rank)

    def close(self):
        if self.owned:
            self.dist.destroy_process_group()

