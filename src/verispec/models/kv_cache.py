"""`KVCache`: keys and values of every layer in preallocated buffers, written by position.

One buffer per layer, [2, kv_heads, capacity, head_dim] (keys then values): a forward writes
its new positions in place and attention reads the views [kv_heads, :length, head_dim].
Rolling back only moves `length`; nothing is copied or freed. The capacity doubles when a
forward would pass it (one copy of the used prefix, amortised O(1) per token).

Buffers start zeroed: positions past `length` hold finite values (zeros or the keys of
rolled-back tokens), never uninitialised memory that could be NaN.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256) -> None:
        self.shape = (2, kv_heads, capacity, head_dim)
        self.dtype = dtype
        self.buffers = [torch.zeros(self.shape, dtype=dtype) for _ in range(layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.shape[2]

    def ensure(self, length: int) -> None:
        """Make room for `length` positions, keeping the first `self.length`."""
        if length <= self.capacity:
            return
        capacity = max(length, 2 * self.capacity)
        self.shape = (*self.shape[:2], capacity, self.shape[3])
        grown = []
        for buffer in self.buffers:
            new = torch.zeros(self.shape, dtype=self.dtype)
            new[:, :, : self.length] = buffer[:, :, : self.length]
            grown.append(new)
        self.buffers = grown

    def write(self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values [M, kv_heads, D] at positions start..start+M-1 of `layer`;
        returns that layer's keys and values [kv_heads, start+M, D] (views)."""
        end = start + keys.shape[0]
        buffer = self.buffers[layer]
        buffer[0, :, start:end] = keys.transpose(0, 1)
        buffer[1, :, start:end] = values.transpose(0, 1)
        return buffer[0, :, :end], buffer[1, :, :end]
