"""Projections of the fast runtime: one module per weight format, built by `projection`.

Every projection maps activations x[M, in] to y[M, out] in the runtime's activation dtype.
The runtime never looks inside one, so a new weight format (a quantized layout, say) is a new
module here and a new branch in `projection`, and nothing else changes.
"""

from __future__ import annotations

import torch
from torch import nn


class DenseLinear(nn.Module):
    """y = x W^T (+ b) with W[out, in] kept in the activation dtype (float32 or bfloat16)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        super().__init__()
        self.weight = weight  # [out, in]
        self.bias = bias  # [out] or None

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x[M, in] -> y[M, out]."""
        return nn.functional.linear(x, self.weight, self.bias)


def projection(weight: torch.Tensor, bias: torch.Tensor | None = None, weight_format: str = "dense") -> nn.Module:
    """The projection module for `weight` [out, in] (and `bias` [out]) in `weight_format`.

    "dense": the weight as given, in its own dtype.
    """
    if weight_format == "dense":
        return DenseLinear(weight.contiguous(), None if bias is None else bias.contiguous())
    raise ValueError(f"unknown weight format {weight_format!r}; the fast runtime knows: dense")
