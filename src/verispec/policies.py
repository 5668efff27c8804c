"""Speculation-length (k) policies: how many tokens to draft in the next round.

A policy sees only the past (the request's `Stats`), so whatever it picks, the verifier's
exactness is untouched. k = 0 means a plain decoding step.
"""

from __future__ import annotations

from typing import Protocol

from verispec.stats import Stats


class KPolicy(Protocol):
    def begin(self) -> None:
        """A new request."""
        ...

    def choose(self, stats: Stats) -> int:
        """k >= 0 for the next round."""
        ...


class ConstantK:
    def __init__(self, k: int) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        self.k = k

    def begin(self) -> None:
        pass

    def choose(self, stats: Stats) -> int:
        return self.k


class HeuristicK:
    """HF transformers' assisted-generation schedule: k + 2 after a round that accepted every
    drafted token, k - 1 (at least 1) otherwise."""

    def __init__(self, start: int = 4) -> None:
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError(f"the starting k must be an integer >= 1, got {start!r}")
        self.start = start
        self.k = start

    def begin(self) -> None:
        self.k = self.start

    def choose(self, stats: Stats) -> int:
        if stats.rounds and stats.drafted[-1] > 0:
            all_accepted = stats.accepted[-1] == stats.drafted[-1]
            self.k = self.k + 2 if all_accepted else max(1, self.k - 1)
        return self.k


def as_policy(k: int | KPolicy) -> KPolicy:
    return ConstantK(k) if isinstance(k, int) else k
