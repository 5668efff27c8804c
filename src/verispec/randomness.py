"""The one door through which randomness enters verispec.

Every random decision of the engine, the proposers and the verifiers is a call to
`bernoulli(prob)` or `categorical(probs)` on an injected `Random`. The default wraps a seeded
`torch.Generator` (same seed, same output); the exhaustive audit substitutes an object that
walks every branch of every call and weighs each outcome by its probability.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch


class Random(Protocol):
    def bernoulli(self, prob: float) -> bool:
        """True with probability `prob` (0 <= prob <= 1)."""
        ...

    def categorical(self, probs: torch.Tensor) -> int:
        """An index drawn from `probs` (float64 [V], non-negative, summing to 1)."""
        ...


class TorchRandom:
    """Seeded default: one float64 uniform u per call. `bernoulli` is u < prob; `categorical`
    inverts the CDF: the first index whose cumulative mass exceeds u * total, never an index
    of probability 0 (25x faster than torch.multinomial over a 49k vocabulary)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)

    def bernoulli(self, prob: float) -> bool:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64)) < prob

    def categorical(self, probs: torch.Tensor) -> int:
        cdf = torch.cumsum(probs, dim=0)
        total = float(cdf[-1])
        if not 0 < total < math.inf:
            # NaN or no mass: the search would return len(probs), which is no token at all.
            raise ValueError(
                f"cannot draw from probabilities summing to {total}; they must be non-negative "
                "with a positive finite sum (check the logits and the sampling transforms)"
            )
        u = float(torch.rand((), generator=self.generator, dtype=torch.float64))
        return int(torch.searchsorted(cdf, u * total, right=True))


class NoDraws:
    """A `Random` for a call that must not draw, such as a deterministic copy proposer asked
    which source will draft (`CopyOrHead.source`): a draw there would shift the request's
    random stream, so it is refused."""

    def bernoulli(self, prob: float) -> bool:
        raise RuntimeError("this call must not draw randomness (bernoulli was called)")

    def categorical(self, probs: torch.Tensor) -> int:
        raise RuntimeError("this call must not draw randomness (categorical was called)")


NO_DRAWS = NoDraws()
