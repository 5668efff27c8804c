"""Rotary position embeddings (RoFormer, Su et al. 2104.09864) from precomputed tables.

The tables hold cos and sin for every position up to a capacity that doubles on demand, in
the model's dtype, computed exactly as transformers' Llama computes them per forward
(float32 angles position * inv_freq, both halves of the head repeated, times the rope type's
attention scaling, then cast), so a float32 forward matches transformers' rounding.
Rope types whose frequencies depend on the sequence length (dynamic NTK, LongRoPE) cannot be
tabulated once and are refused.
"""

from __future__ import annotations

import torch

# Rope types whose inverse frequencies change with the current sequence length.
LENGTH_DEPENDENT = ("dynamic", "longrope")


def rope_parameters(config) -> tuple[torch.Tensor, float]:
    """(inv_freq[D/2] float32, attention scaling) of a transformers config, by its rope type."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    parameters = getattr(config, "rope_parameters", None) or {}
    kind = parameters.get("rope_type", "default")
    if kind in LENGTH_DEPENDENT:
        raise ValueError(
            f"rope type {kind!r} changes its frequencies with the sequence length, which precomputed tables cannot follow"
        )
    if kind == "default":
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        base = parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
        return inv_freq, 1.0
    if kind not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unknown rope type {kind!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[kind](config)
    return inv_freq.float(), float(scaling)


class RopeTables:
    """cos[P, D] and signed sin[P, D] for positions 0..P-1 in `dtype` on `device`; `rotate`
    applies them.

    The signed sin is (-sin, +sin) over the two halves of a head, so that rotating x = (x1, x2)
    is x * cos + (x2, x1) * signed_sin = (x1 cos - x2 sin, x2 cos + x1 sin): transformers'
    `q * cos + rotate_half(q) * sin` with the same products and sums, so the same bits (a
    flip, two products and a sum; `addcmul` would save a kernel, but its fused multiply-add
    rounds once where transformers rounds twice: an ulp apart in ~15% of float32 entries).
    """

    def __init__(
        self, inv_freq: torch.Tensor, scaling: float, dtype: torch.dtype, capacity: int = 1024,
        device: torch.device | str = "cpu",
    ) -> None:
        self.inv_freq = inv_freq  # [D/2] float32
        self.scaling = scaling
        self.dtype = dtype
        self.device = torch.device(device)
        self.cos = self.sin = torch.empty(0)
        self.ensure(capacity)

    def ensure(self, positions: int) -> None:
        """Make the tables cover positions 0..positions-1 (doubling, so growth is amortised);
        computed on the host, as transformers computes them, then put on the device."""
        if positions <= self.cos.shape[0]:
            return
        capacity = max(positions, 2 * self.cos.shape[0])
        angles = torch.arange(capacity, dtype=torch.float)[:, None] * self.inv_freq[None, :]  # [P, D/2]
        angles = torch.cat((angles, angles), dim=-1)  # [P, D]
        half = angles.shape[-1] // 2
        sign = torch.cat((-torch.ones(half), torch.ones(half)))  # [D]
        self.cos = (angles.cos() * self.scaling).to(self.dtype).to(self.device)
        self.sin = ((angles.sin() * self.scaling).to(self.dtype) * sign.to(self.dtype)).contiguous().to(self.device)

    def at(self, positions: slice | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, signed sin) [M, 1, D] at `positions` (a slice of M positions, or a LongTensor
        [M], e.g. a token tree's depth positions): looked up once per forward, for every layer."""
        return self.cos[positions][:, None, :], self.sin[positions][:, None, :]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x[M, heads, D] with (cos, sin) from `at` -> rotated copy [M, heads, D]."""
        m, heads, d = x.shape
        swapped = x.reshape(m, heads, 2, d // 2).flip(2).reshape(m, heads, d)  # (x2, x1)
        return (x * cos).add_(swapped * sin)
