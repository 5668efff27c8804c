"""`SlotCache`: the static runtime's KV cache, every slot's keys and values in one buffer per layer.

Per layer, keys and values [slots, kv_heads, width, head_dim]: slot s's position t lives at
[s, :, t]. A forward writes its rows in place by (slot, position) and attention reads the
first B slots' whole width as views, masked per row by position; nothing is gathered or
copied. `lengths[s]` is how many positions slot s has processed: rolling back moves it,
nothing else. The buffers are allocated once, zeroed (positions past a length hold finite
values: zeros, or keys of rolled-back or padding rows, never uninitialised memory that could
be NaN, which a -inf mask would turn into NaN rather than zero).

They grow only when asked for more slots or positions than they hold (`ensure`): a new buffer,
the used part copied once; whoever holds views of the old ones (CUDA graphs) must drop them
(`generation` counts the reallocations).
"""

from __future__ import annotations

import torch


class SlotCache:
    def __init__(
        self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
        slots: int, width: int,
    ) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.slots, self.width = slots, width
        self.keys = [self._zeros() for _ in range(layers)]
        self.values = [self._zeros() for _ in range(layers)]
        self.lengths = [0] * slots
        self.generation = 0

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.slots, self.kv_heads, self.width, self.head_dim, dtype=self.dtype, device=self.device)

    def ensure(self, slots: int, width: int) -> bool:
        """Hold at least `slots` slots (exactly that many when it grows: the slots fix the
        shape of a deterministic step) of `width` positions (doubling at least when it grows);
        True if the buffers were reallocated."""
        if slots <= self.slots and width <= self.width:
            return False
        old_slots, old_width = self.slots, self.width
        self.slots = max(slots, old_slots)
        self.width = max(width, 2 * old_width) if width > old_width else old_width
        for buffers in (self.keys, self.values):
            for layer, old in enumerate(buffers):
                buffers[layer] = self._zeros()
                buffers[layer][:old_slots, :, :old_width] = old
        self.lengths += [0] * (self.slots - old_slots)
        self.generation += 1
        return True

    def copy_slot(self, source: int, destination: int) -> None:
        """Slot `destination` holds slot `source`'s processed positions, and its length."""
        length = self.lengths[source]
        for buffers in (self.keys, self.values):
            for buffer in buffers:
                buffer[destination, :, :length] = buffer[source, :, :length]
        self.lengths[destination] = length

    def bytes_per_token(self) -> int:
        """Bytes one position of one slot takes in every layer (keys and values)."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype.itemsize
