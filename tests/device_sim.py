"""A simulated accelerator that counts synchronisations, for tests on the CPU.

`FakeDevice()` is a torch function mode; inside it, `DEVICE` (torch.device("cpu", 0)) plays a
GPU: a factory given `device=DEVICE` (`torch.zeros`, `arange`, ...) or a `.to(DEVICE)` copy
returns an `OnDevice` tensor (CPU data with a device's rules), and work among such tensors stays
on the device. Every call that makes the host wait for the device counts as one
synchronisation (`FakeDevice.syncs`, each with what made it in `FakeDevice.calls`):

- reading device data on the host: `.item()`, `.tolist()`, `.numpy()`, `.cpu()`, `.to("cpu")`,
  `float()`, `int()`, `bool()` of a device tensor;
- shapes that depend on device data: `nonzero`, `masked_select`, `unique`, indexing by a
  boolean device tensor;
- a copy from the host that is not `non_blocking` (`.to(DEVICE)`, `torch.tensor(data,
  device=DEVICE)`): from pageable memory CUDA waits for the device before it copies;
- `torch.cuda.synchronize()` (patched by `counting_cuda_synchronize`).

A host tensor of one or more dimensions combined with a device tensor raises, as on CUDA
(where it is an error, not a hidden copy), so no input reaches the device uncounted.
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

DEVICE = torch.device("cpu", 0)

READS = {
    torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu, torch.Tensor.__bool__,
    torch.Tensor.__float__, torch.Tensor.__int__, torch.Tensor.__index__, torch.Tensor.nonzero, torch.nonzero,
    torch.Tensor.masked_select, torch.masked_select, torch.Tensor.unique, torch.unique,
}
FROM_DATA = {torch.tensor, torch.as_tensor}
DEVICE_GETTER = torch.Tensor.device.__get__  # `x.device` (a new wrapper at each lookup: compare with ==)


class OnDevice(torch.Tensor):
    """CPU data living on the simulated device (see the module docstring). `strict`: a host
    tensor meeting a device tensor raises; off for code that makes its tensors on `x.device`
    (transformers' modules), which reads as the CPU here and is the GPU on a GPU."""

    strict = True

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func == DEVICE_GETTER:
            return DEVICE  # so what is made on `x.device` is made on the device
        if func in READS or (func is torch.Tensor.to and _names_host(args[1:], kwargs)):
            FakeDevice.count(func)
            with torch._C.DisableTorchFunctionSubclass():
                out = func(*args, **kwargs)
            return tree_map(lambda x: x.as_subclass(torch.Tensor) if isinstance(x, torch.Tensor) else x, out)
        if func is torch.Tensor.__getitem__ and any(
            isinstance(x, OnDevice) and x.dtype == torch.bool for x in tree_flatten(args[1:])[0]
        ):
            FakeDevice.count("boolean indexing")
        tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
        if OnDevice.strict and any(type(x) is torch.Tensor and x.ndim > 0 for x in tensors):
            raise RuntimeError("Expected all tensors to be on the same device, but found at least two "
                               f"devices, cuda:0 and cpu! ({getattr(func, '__name__', func)})")
        return super().__torch_function__(func, types, args, kwargs)


def _names_host(args: tuple, kwargs: dict) -> bool:
    """Whether Tensor.to's arguments name the host (the CPU without the simulated index)."""
    targets = [*args, kwargs.get("device")]
    return any(
        (isinstance(x, (str, torch.device)) and torch.device(x) == torch.device("cpu"))
        or (isinstance(x, torch.Tensor) and type(x) is torch.Tensor)
        for x in targets
    )


def _names_device(args: tuple, kwargs: dict) -> bool:
    return any(isinstance(x, (str, torch.device)) and torch.device(x) == DEVICE for x in [*args, kwargs.get("device")])


class FakeDevice(TorchFunctionMode):
    syncs = 0
    calls: list[str] = []

    @classmethod
    def count(cls, what) -> None:
        cls.syncs += 1
        cls.calls.append(getattr(what, "__name__", str(what)))

    @classmethod
    def reset(cls) -> None:
        cls.syncs, cls.calls = 0, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to and type(args[0]) is torch.Tensor and _names_device(args[1:], kwargs):
            if not kwargs.get("non_blocking", False):
                self.count("blocking copy to the device")
            rest = [torch.device("cpu") if _names_device((x,), {}) else x for x in args[1:]]
            device_kw = {**kwargs, "device": "cpu"} if "device" in kwargs else kwargs
            return func(args[0], *rest, **{**device_kw, "copy": True}).as_subclass(OnDevice)
        if _names_device((), kwargs) and func is not torch.Tensor.to:
            if func in FROM_DATA:
                self.count(f"{func.__name__}(data, device=...)")
            return func(*args, **{**kwargs, "device": "cpu"}).as_subclass(OnDevice)
        return func(*args, **kwargs)


def counting_cuda_synchronize(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args, **kwargs: FakeDevice.count("torch.cuda.synchronize"))
