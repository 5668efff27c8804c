"""The `Proposer` protocol and the `Draft` it returns.

Lifecycle (llama.cpp's begin / draft / accept): `begin` once per request, `propose` once per
round, `commit` after each round with the context as emitted, so that any state (a draft
model's cache, a lookup index) follows the emitted prefix and never a rejected suffix.

`propose_stateless` recomputes the same draft from the context alone; the slow reference
decoder uses it to check that the proposer's incremental state never drifts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from verispec.randomness import Random
from verispec.sampling import SamplingParams


@dataclass(frozen=True)
class Draft:
    """Drafted tokens and, when they were sampled, the proposal distribution they came from.

    tokens: the k' <= k drafted token ids, in order.
    q: float64 [k', V], q[i] the proposal distribution that tokens[i] was sampled from (after
       the sampling transforms). None when the tokens were chosen, not sampled (prompt lookup,
       argmax of a draft model): then the verifier treats each as a point mass.
    """

    tokens: tuple[int, ...]
    q: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.q is not None and tuple(self.q.shape[:1]) != (len(self.tokens),):
            raise ValueError(
                f"draft has {len(self.tokens)} tokens but q has {self.q.shape[0]} rows"
            )

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Draft:
        """The first n drafted tokens (and their q rows)."""
        return Draft(self.tokens[:n], None if self.q is None else self.q[:n])


EMPTY_DRAFT = Draft(())


class Proposer(Protocol):
    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        """Start a request: reset all per-request state."""
        ...

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """Up to k tokens continuing `context` (prompt plus everything emitted)."""
        ...

    def commit(self, context: Sequence[int]) -> None:
        """The round is over and `context` is what was emitted; follow it."""
        ...

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The draft `propose` must return, recomputed from `context` alone (slow)."""
        ...
