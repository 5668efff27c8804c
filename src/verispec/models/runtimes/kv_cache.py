"""`KVCache`: keys and values of every layer in preallocated buffers, written by position.

Per layer, keys [kv_heads, capacity, head_dim] (or [kv_heads, head_dim, capacity] with
`keys_by_column`) and values [kv_heads, capacity, head_dim + extra]: a forward writes its new
positions in place and attention reads views of the first `end`.
Rolling back only moves `length`; nothing is copied or freed. After a token tree, `move`
copies only the kept nodes that are not yet in their slots (`ScoredTree.moves`). The capacity doubles when a
forward would pass it (one copy of the used prefix, amortised O(1) per token).

`value_ones`: each value row carries a constant 1 after its head_dim entries, so that one
product of attention weights with the values also yields the weights' sum (the softmax
denominator) with the same reduction (see `InvariantAttention`).

`keys_by_column`: keys are stored transposed, position along the last axis, so that the
scores' product q K^T reads a view whose rows are contiguous (a transposed view of keys
stored by row made bfloat16's batched product copy them on every call, several times the
product's own cost over a long cache: docs/results/implementation-choices.md).

Buffers start zeroed: positions past `length` hold finite values (zeros or the keys of
rolled-back tokens), never uninitialised memory that could be NaN.

`KVArena`: the caches of many slots in one buffer per layer, [slots, ...] of a `KVCache`'s
buffers; a slot's cache made on it (`KVCache(..., arena=...)`) holds views of its row, laid out
as a cache of its own, until it outgrows the arena's capacity and moves to buffers of its own
(the row is free again then, or when the cache goes; a row taken again holds finite stale values,
as a rolled-back cache's positions do).
So a forward over slots of equal length writes their new rows, and reads their caches, in one
call per layer (`KVArena.write`) instead of one per slot.
"""

from __future__ import annotations

import weakref

import torch


class KVCache:
    def __init__(
        self,
        layers: int,
        kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        capacity: int = 256,
        value_ones: bool = False,
        keys_by_column: bool = False,
        arena: KVArena | None = None,
    ) -> None:
        self.kv_heads, self.head_dim, self.dtype = kv_heads, head_dim, dtype
        self.value_width = head_dim + int(value_ones)
        self.key_axis = 2 if keys_by_column else 1  # the keys' position axis
        self.arena, self.row = None, 0
        if arena is not None and arena.free and arena.capacity >= capacity:
            self.arena, self.row = arena, arena.free.pop()
            self._release = weakref.finalize(self, arena.free.append, self.row)  # the row is free again when this goes
            self.capacity = arena.capacity
            self.keys = [keys[self.row] for keys in arena.keys]
            self.values = [values[self.row] for values in arena.values]
        else:
            self.capacity = capacity
            self.keys = [self._zeros(head_dim, self.key_axis) for _ in range(layers)]
            self.values = [self._zeros(self.value_width, 1) for _ in range(layers)]
        self.length = 0

    def _zeros(self, width: int, axis: int) -> torch.Tensor:
        return zeroed((), self.kv_heads, self.capacity, width, self.head_dim, self.dtype, axis == 2)

    def ensure(self, length: int) -> None:
        """Make room for `length` positions, keeping the first `self.length`."""
        if length <= self.capacity:
            return
        self.capacity = max(length, 2 * self.capacity)
        if self.arena is not None:  # buffers of its own from now on (copied below); its row is free again
            self._release()
            self.arena = None
        for buffers, width, axis in ((self.keys, self.head_dim, self.key_axis), (self.values, self.value_width, 1)):
            for layer, old in enumerate(buffers):
                buffers[layer] = self._zeros(width, axis)
                buffers[layer].narrow(axis, 0, self.length).copy_(old.narrow(axis, 0, self.length))

    def write(
        self, layer: int, start: int, keys: torch.Tensor, values: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values [M, kv_heads, D] at positions start..start+M-1 of `layer`;
        returns views of that layer's first `width` positions (ensured beforehand): keys
        [kv_heads, width, D] ([kv_heads, D, width] by column) and values
        [kv_heads, width, D (+1 with value_ones)]."""
        m = keys.shape[0]
        stored = self.keys[layer]
        stored.narrow(self.key_axis, start, m).copy_(keys.permute(1, 0, 2) if self.key_axis == 1 else keys.permute(1, 2, 0))
        self.values[layer][:, start : start + m, : self.head_dim] = values.transpose(0, 1)
        return stored.narrow(self.key_axis, 0, width), self.values[layer][:, :width]

    def move(self, sources: torch.Tensor, destinations: torch.Tensor) -> None:
        """Copy the keys and values of positions `sources` to positions `destinations`
        (LongTensors [m]) in every layer; nothing else is written."""
        for buffers, axis in ((self.keys, self.key_axis), (self.values, 1)):
            leading = (slice(None),) * axis
            for buffer in buffers:
                buffer[(*leading, destinations)] = buffer[(*leading, sources)]

    def copy_prefix(self, source: KVCache, length: int) -> None:
        """Hold `source`'s first `length` positions (of the same layers and layout) as this
        cache's whole content."""
        self.ensure(length)
        for mine, theirs, axis in ((self.keys, source.keys, self.key_axis), (self.values, source.values, 1)):
            for buffer, other in zip(mine, theirs):
                buffer.narrow(axis, 0, length).copy_(other.narrow(axis, 0, length))
        self.length = length


def zeroed(
    slots: tuple[int, ...], kv_heads: int, capacity: int, width: int, head_dim: int, dtype: torch.dtype, by_column: bool
) -> torch.Tensor:
    """[*slots, kv_heads, capacity, width] zeros (ones past head_dim), or with the last two
    axes swapped by column."""
    buffer = torch.zeros(*slots, kv_heads, capacity, width, dtype=dtype)
    buffer[..., head_dim:] = 1
    return buffer.transpose(-2, -1).contiguous() if by_column else buffer


class KVArena:
    """Buffers for `slots` caches of `capacity` positions (module docstring): per layer
    [slots, ...] of a `KVCache`'s own, zeroed as its are; `free` the rows no cache holds yet."""

    def __init__(
        self, slots: int, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, capacity: int,
        value_ones: bool = False, keys_by_column: bool = False,
    ) -> None:
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.by_column = keys_by_column
        self.capacity = capacity
        width = head_dim + int(value_ones)
        self.keys = [zeroed((slots,), kv_heads, capacity, head_dim, head_dim, dtype, keys_by_column) for _ in range(layers)]
        self.values = [zeroed((slots,), kv_heads, capacity, width, head_dim, dtype, False) for _ in range(layers)]
        self.free = list(range(slots - 1, -1, -1))  # handed out from row 0 up

    def write(
        self, layer: int, rows: torch.Tensor, start: int, keys: torch.Tensor, values: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store keys, values [B M, kv_heads, D] (M rows for each of B caches, in `rows`
        order: LongTensor [B]) at positions start..start+M-1 of those caches' `layer`; returns
        their first `width` positions, gathered: keys [B, kv_heads, width, D] ([B, kv_heads, D,
        width] by column) and values [B, kv_heads, width, D (+1)]."""
        b = rows.numel()
        m = keys.shape[0] // b
        keys, values = keys.view(b, m, self.kv_heads, self.head_dim), values.view(b, m, self.kv_heads, self.head_dim)
        if self.by_column:
            self.keys[layer][rows, :, :, start : start + m] = keys.permute(0, 2, 3, 1)
            gathered = self.keys[layer][rows, :, :, :width]
        else:
            self.keys[layer][rows, :, start : start + m] = keys.transpose(1, 2)
            gathered = self.keys[layer][rows, :, :width]
        self.values[layer][rows, :, start : start + m, : self.head_dim] = values.transpose(1, 2)
        return gathered, self.values[layer][rows, :, :width]
