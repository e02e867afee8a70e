"""mojo_train: neural-network training primitives whose identical tier gives the same
float32 bits on every vendor (the C CPU oracle, CUDA, HIP, Metal).

Run-time dependency: cffi only; numpy is never imported. Tensors are any buffer-protocol
object (array.array, memoryview, numpy arrays, mojo_train.Array); float tensors must be
float32 and are never cast. See README.md for the feature table and native/contracts/ for
the arithmetic each op is pinned to.
"""
from ._array import Array
from ._native import BackendError, backend_info
from .device import DeviceArray, to_device, transfer_bytes
from .optim import SGD, Adam, AdamW, clip_grad_norm_

__version__ = "0.1.0"

__all__ = ["Array", "BackendError", "backend_info", "DeviceArray", "to_device", "transfer_bytes",
           "SGD", "Adam", "AdamW", "clip_grad_norm_",
           "__version__"]
