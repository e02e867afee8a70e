"""The torch tensors' device rule, shared by the torch adapter and ``mojo_train.distributed``
(torch-free itself: it reads only the tensors' ``device``, so no module of the package imports
the adapter for it)."""
from ._errors import where_msg

_DEVICE_TYPES = ("cpu", "cuda")


def device_of(where, **tensors):
    """The one device of the given tensors (None skipped): ValueError when they are on
    different devices or on one that is neither the CPU nor CUDA."""
    given = [(name, t.device) for name, t in tensors.items() if t is not None]
    name0, dev = given[0]
    for name, d in given[1:]:
        if d != dev:
            raise ValueError(where_msg(where, "%s is on %s but %s is on %s; put every tensor of the call on "
                                       "one device" % (name0, dev, name, d)))
    if dev.type not in _DEVICE_TYPES:
        raise ValueError(where_msg(where, "%s is on %s; mojo_train runs on the CPU and on CUDA devices"
                                   % (name0, dev)))
    if dev.type == "cuda" and dev.index not in (None, 0):
        raise ValueError(where_msg(where, "%s is on %s; mojo_train's GPU vendor uses one device, cuda:0 (its "
                                   "DeviceArrays say so): make that GPU the first visible one "
                                   "(CUDA_VISIBLE_DEVICES)" % (name0, dev)))
    return dev
