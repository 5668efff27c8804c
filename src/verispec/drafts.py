"""What crosses the seam between proposers and verification rules: a `Draft` (drafted tokens
and the q they were sampled from) and the rule's `Verdict` on it. Plain data, so proposers,
the rules and the engine all depend on this module and none of them on another.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


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


@dataclass(frozen=True)
class Verdict:
    """A rule's decision on a round: `n_accepted` drafted tokens kept (a prefix of the draft),
    then `next_token`, the repair token (after a rejection) or the bonus token (all accepted).
    `fallback`: the repair token came from p because rounding left the residual with no mass
    (see `verispec.verify`); False in every round that exact arithmetic can produce."""

    n_accepted: int
    next_token: int
    fallback: bool = False
