"""Test-only: finds the reads that would make the host wait for the GPU, on a CPU.

On a GPU, `.item()`, `.tolist()`, `bool(t)`, `int(t)`, `.cpu()` or `.numpy()` of a
device tensor copies it to the host and blocks until every kernel queued before it
has run. On this CPU machine every tensor is a host tensor, so the device is
modelled instead: a tensor that existed before the probed call is a device tensor
unless the caller names it as a host mirror (`host=`), and a tensor the call makes
is a device tensor when any tensor it was made from is one. Each read of a device
tensor's value inside the call is reported with the innermost SGLang line that
made it. Reads made by Triton's interpreter (it runs the kernels on the host here,
a launch on a GPU) or by a test's shim are not SGLang's and are not reported.
"""

import os
import sys

import sglang
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

_SGLANG = os.path.dirname(sglang.__file__) + os.sep
_TORCH = os.path.dirname(torch.__file__) + os.sep

_READS = {
    torch.Tensor.item: "item()",
    torch.Tensor.tolist: "tolist()",
    torch.Tensor.__bool__: "bool()",
    torch.Tensor.__int__: "int()",
    torch.Tensor.__float__: "float()",
    torch.Tensor.__index__: "index()",
    torch.Tensor.cpu: "cpu()",
    torch.Tensor.numpy: "numpy()",
}


def _tensors(tree):
    return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]


def _reader():
    """The SGLang file:line that read a value, or None when the read is not SGLang's:
    Triton's interpreter running a kernel, or a test's own shim (the first frame
    outside torch decides)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(_TORCH):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(_SGLANG):
        return None
    return f"{frame.f_code.co_filename[len(_SGLANG):]}:{frame.f_lineno}"


class HostSyncProbe(TorchFunctionMode):
    """`with HostSyncProbe(host=[...]) as probe:` ...; `probe.reads` lists what blocked."""

    def __init__(self, host=()):
        super().__init__()
        self.made = WeakIdKeyDictionary()  # tensor made inside -> is a device tensor
        for t in host:
            if isinstance(t, torch.Tensor):
                self.made[t] = False
        self.reads = []

    def on_device(self, t):
        return self.made.get(t, True)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = _tensors((args, kwargs))
        if func in _READS and any(self.on_device(t) for t in inputs):
            where = _reader()
            if where is not None:
                self.reads.append(f"{_READS[func]} at {where}")
        out = func(*args, **kwargs)
        device = any(self.on_device(t) for t in inputs)
        for t in _tensors(out):
            if t not in self.made or device:
                self.made[t] = device
        return out
