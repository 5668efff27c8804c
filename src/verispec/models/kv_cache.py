"""`KVCache`: keys and values of every layer in preallocated buffers, written by position.

Per layer, keys [kv_heads, capacity, head_dim] and values [kv_heads, capacity, head_dim + extra]:
a forward writes its new positions in place and attention reads views of the first `end`.
Rolling back only moves `length`; nothing is copied or freed. After a token tree, `move`
copies only the kept nodes that are not yet in their slots (`ScoredTree.moves`). The capacity doubles when a
forward would pass it (one copy of the used prefix, amortised O(1) per token).

`value_ones`: each value row carries a constant 1 after its head_dim entries, so that one
product of attention weights with the values also yields the weights' sum (the softmax
denominator) with the same reduction (see `InvariantAttention`).

Buffers start zeroed: positions past `length` hold finite values (zeros or the keys of
rolled-back tokens), never uninitialised memory that could be NaN.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int = 256, value_ones: bool = False
    ) -> None:
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.value_width = head_dim + int(value_ones)
        self.capacity = capacity
        self.keys = [self._zeros(head_dim) for _ in range(layers)]
        self.values = [self._zeros(self.value_width) for _ in range(layers)]
        self.length = 0

    def _zeros(self, width: int) -> torch.Tensor:
        buffer = torch.zeros(self.kv_heads, self.capacity, width, dtype=self.dtype)
        buffer[..., self.head_dim :] = 1
        return buffer

    def ensure(self, length: int) -> None:
        """Make room for `length` positions, keeping the first `self.length`."""
        if length <= self.capacity:
            return
        self.capacity = max(length, 2 * self.capacity)
        for buffers, width in ((self.keys, self.head_dim), (self.values, self.value_width)):
            for layer, old in enumerate(buffers):
                buffers[layer] = self._zeros(width)
                buffers[layer][:, : self.length] = old[:, : self.length]

    def write(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values [M, kv_heads, D] at positions start..start+M-1 of `layer`;
        returns views of that layer's first `width` positions (ensured beforehand): keys
        [kv_heads, width, D] and values [kv_heads, width, D (+1 with value_ones)]."""
        end = start + keys.shape[0]
        self.keys[layer][:, start:end] = keys.transpose(0, 1)
        self.values[layer][:, start:end, : self.head_dim] = values.transpose(0, 1)
        return self.keys[layer][:, :width], self.values[layer][:, :width]

    def move(self, sources: torch.Tensor, destinations: torch.Tensor) -> None:
        """Copy the keys and values of positions `sources` to positions `destinations`
        (LongTensors [m]) in every layer; nothing else is written."""
        for buffer in (*self.keys, *self.values):
            buffer[:, destinations] = buffer[:, sources]
