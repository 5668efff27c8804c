"""RMSNorm (Zhang and Sennrich 1910.07467) as the Llama-family runtimes and heads apply it."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x[M, H] -> weight * x / sqrt(mean(x^2) + eps), the statistics in float32."""
    return nn.functional.rms_norm(x, weight.shape, weight, eps)
