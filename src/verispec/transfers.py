"""Copies between the host and a model's device, several tensors in one.

On a GPU every copy the host waits for is a synchronisation: the host stops until the device
has finished all the work queued before it, and the device idles until the host queues more.
A step therefore moves its inputs in one copy that the host does not wait for (`to_device`:
from pinned memory, `non_blocking`), and what the host must read back in one copy
(`to_host_all`): tensors of any dtypes and shapes packed as bytes into one buffer (each part
padded to 8 bytes, so every dtype's view of its part stays aligned), copied once, viewed back.
On the CPU `to_host_all` returns plain host tensors as they are; `to_device` costs a
concatenation of the parts.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

Layout = list[tuple[torch.dtype, torch.Size, int, int]]  # per tensor: dtype, shape, bytes, padding


def packed(tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, Layout]:
    """The tensors' bytes in one uint8 buffer [bytes] where they are, and how to view them back."""
    parts, layout = [], []
    for tensor in tensors:
        raw = tensor.contiguous().reshape(-1).view(torch.uint8)  # [bytes]
        pad = -raw.numel() % 8
        parts += [raw, raw.new_zeros(pad)] if pad else [raw]
        layout.append((tensor.dtype, tensor.shape, raw.numel(), pad))
    return torch.cat(parts), layout


def unpacked(buffer: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """`packed`'s tensors as views of `buffer` (wherever it now is)."""
    out, at = [], 0
    for dtype, shape, size, pad in layout:
        out.append(buffer[at : at + size].view(dtype).reshape(shape))
        at += size + pad
    return out


def to_host_all(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """Every tensor of `tensors` (on one device) on the host in ONE copy, the host's one wait.

    >>> [t.tolist() for t in to_host_all([torch.tensor([3, 1]), torch.tensor([True]), torch.tensor([[0.5]])])]
    [[3, 1], [True], [[0.5]]]
    """
    if all(type(tensor) is torch.Tensor and tensor.device.type == "cpu" for tensor in tensors):
        return list(tensors)  # plain host tensors: nothing to copy (a subclass may be a device's)
    if len(tensors) == 1:
        return [tensors[0].cpu()]
    buffer, layout = packed(tensors)
    return unpacked(buffer.cpu(), layout)


def to_device(tensors: Sequence[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """Host tensors on `device` in one copy the host does not wait for: packed, pinned (on
    CUDA) and copied `non_blocking`; the device's stream orders the copy before the work that
    reads it. Pinned memory stays the copy's until it is done (torch's caching host allocator
    records the copy), so the host buffers may go at once."""
    buffer, layout = packed(tensors)
    if device.type == "cuda":
        buffer = buffer.pin_memory()
    return unpacked(buffer.to(device, non_blocking=True), layout)


def synchronize() -> None:
    """Wait for the work queued on the GPU (none to wait for on the CPU), so a timer that reads
    no result reads the work and not only its launch (a prefill, a profile's forward)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
