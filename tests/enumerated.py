"""Helpers for tests that compute a rule's law exactly by enumerating its random branches
(`verispec.audit.enumerate.outcomes`) instead of sampling it."""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction

import torch

from verispec.audit.enumerate import outcomes

EXACT = 1e-12


def row(*probs) -> torch.Tensor:
    """A float64 distribution row from exact values: row("1/3", "2/3")."""
    return torch.tensor([float(Fraction(x)) for x in probs], dtype=torch.float64)


def distribution(run) -> dict:
    """result -> probability, summed over every branch of `run(rng)`; the branches sum to 1."""
    dist: dict = defaultdict(float)
    for prob, result in outcomes(run):
        dist[result] += prob
    assert abs(sum(dist.values()) - 1) < EXACT
    return dict(dist)
