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


def as_policy(k: int | KPolicy) -> KPolicy:
    return ConstantK(k) if isinstance(k, int) else k
