"""KVCache on its own: writes, views, growth and moves, in both key layouts (by row for the
fused and row attentions, by column for bfloat16's invariant attention)."""

from __future__ import annotations

import pytest
import torch

from verispec.models.runtimes.kv_cache import KVCache

LAYERS, HEADS, D = 2, 3, 4


def rows(start: int, m: int) -> torch.Tensor:
    """Distinct keys [M, heads, D] for positions start..start+m-1."""
    return torch.arange(start * HEADS * D, (start + m) * HEADS * D, dtype=torch.float32).view(m, HEADS, D)


def keys_at(cache: KVCache, layer: int, width: int) -> torch.Tensor:
    """The layer's first `width` keys as [heads, width, D], whatever the layout."""
    keys = cache.keys[layer].narrow(cache.key_axis, 0, width)
    return keys if cache.key_axis == 1 else keys.transpose(1, 2)


@pytest.mark.parametrize("by_column", [False, True], ids=["by-row", "by-column"])
def test_writes_growth_and_moves_keep_every_position(by_column: bool) -> None:
    cache = KVCache(LAYERS, HEADS, D, torch.float32, capacity=4, value_ones=by_column, keys_by_column=by_column)
    cache.ensure(6)  # doubles past 4, keeping nothing yet
    for layer in range(LAYERS):
        keys, values = cache.write(layer, 0, rows(0, 6) + layer, -rows(0, 6), 6)
        assert keys.shape == ((HEADS, 6, D) if not by_column else (HEADS, D, 6))
        assert values.shape == (HEADS, 6, D + by_column)
    cache.length = 6
    cache.ensure(20)  # grows again: the 6 written positions survive
    expected = rows(0, 6).transpose(0, 1)  # [heads, 6, D]
    for layer in range(LAYERS):
        assert torch.equal(keys_at(cache, layer, 6), expected + layer)
    cache.move(torch.tensor([4, 5]), torch.tensor([1, 2]))
    moved = expected[:, [0, 4, 5, 3, 4, 5]]
    for layer in range(LAYERS):
        assert torch.equal(keys_at(cache, layer, 6), moved + layer)
        values = cache.values[layer][:, :6]
        assert torch.equal(values[..., :D], -moved)
        if by_column:
            assert torch.equal(values[..., D:], torch.ones(HEADS, 6, 1))  # the ones column stays
