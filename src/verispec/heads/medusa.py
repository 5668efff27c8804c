"""Medusa heads (Cai et al. 2401.10774): K residual blocks on the target's last feature.

Head i (0-based) reads the feature of position t and predicts token t + 2 + i: the target's
own row at t already gives token t + 1, so the heads guess the tokens after it, all from the
same feature and independently of each other's guesses:

    h_i      = hidden_t + SiLU(W_i hidden_t + b_i)    [H]  (Medusa's ResBlock; W_i = 0 at init,
                                                             so a fresh head is the target's row)
    logits_i = output(h_i)                            [N]  over the pruned vocabulary d2t

Training on sequences with target features [B, T, F]:

    logits = head(features)   # [B, T, K, N]: [:, t, i] is the distribution of token t + 2 + i
"""

from __future__ import annotations

import torch
from torch import nn

from verispec.head_kind import HeadKind
from verispec.heads.config import HeadConfig
from verispec.heads.eagle import fuse_layer, output_layer
from verispec.heads.vocab import check_d2t


class ResBlock(nn.Module):
    """hidden + SiLU(linear(hidden)), the linear layer starting at zero (the identity)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.linear = nn.Linear(size, size)
        nn.init.zeros_(self.linear.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return hidden + nn.functional.silu(self.linear(hidden))


class MedusaHead(nn.Module):
    """config: a `HeadConfig` of kind "medusa" (K = config.heads). d2t: LongTensor[N].
    output_weight: the target's output head weight [V, H] (unless config.trained_output); the
    K heads share one output layer.

    Saved state: d2t, fuse (several taps only), blocks, and output when trained."""

    def __init__(self, config: HeadConfig, d2t: torch.Tensor, output_weight: torch.Tensor | None = None) -> None:
        super().__init__()
        if config.kind != HeadKind.MEDUSA:
            raise ValueError(f"MedusaHead needs a config of kind 'medusa', got {config.kind!r}")
        d2t = check_d2t(d2t, config.target.vocab_size)
        if d2t.numel() != config.vocab_size:
            raise ValueError(f"d2t holds {d2t.numel()} token ids, the config says N = {config.vocab_size}")
        self.config = config
        self.register_buffer("d2t", d2t)  # [N]
        self.fuse = fuse_layer(config)
        self.blocks = nn.ModuleList(ResBlock(config.hidden_size) for _ in range(config.heads))
        self.output = output_layer(config, d2t, output_weight)
        # Follows the head's dtype through `.to()`; not saved. Its projections may be packed
        # (`checkpoint.for_drafting`), after which they hold no parameters to read it from.
        self.register_buffer("dtype_marker", torch.zeros(()), persistent=False)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """features [..., F] -> logits [..., K, N]."""
        hidden = self.fuse(features.to(self.dtype))  # [..., H]
        return torch.stack([self.output(block(hidden)) for block in self.blocks], dim=-2)

    @property
    def dtype(self) -> torch.dtype:
        """What the head computes in."""
        return self.dtype_marker.dtype
