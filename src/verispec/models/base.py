"""The `CausalLM` protocol: a causal language model with a cache that can roll back.

The engine, the reference decoder and the audit talk to models only through this protocol,
so the same engine is proved on tiny rational tables and runs unchanged on real models.

Cache contract: `length` is the number of tokens processed into the cache. `extend(tokens)`
processes `tokens` after them and returns the logits at each new position (row i is the
next-token distribution after `tokens[i]`). `rollback(length)` forgets every token after the
first `length`. After any sequence of extend/rollback calls the logits equal those of a fresh
full recomputation of the same prefix (`score`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch


class CausalLM(Protocol):
    vocab_size: int

    @property
    def length(self) -> int:
        """Tokens processed into the cache."""
        ...

    def reset(self) -> None:
        """Forget every processed token (a new request)."""
        ...

    def prefill(self, ids: Sequence[int]) -> None:
        """Reset, then process `ids` (possibly empty) without returning logits."""
        ...

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        """Process `tokens` (n >= 1) after the cached prefix; logits[n, V], or only the last
        `keep` rows (a model may then skip computing the others)."""
        ...

    def rollback(self, length: int) -> None:
        """Keep only the first `length` processed tokens (0 <= length <= self.length)."""
        ...

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        """Stateless full recomputation: logits[len(ids), V]; the cache is not touched."""
        ...


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Refuse ids outside [0, vocab_size). Models check before a forward: an embedding lookup
    failing half-way through the layers would leave the cache longer in some than in others."""
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside the model's vocabulary [0, {vocab_size})")


def check_extend(tokens: Sequence[int], keep: int | None, vocab_size: int) -> None:
    """Refuse what `CausalLM.extend` does not accept: no tokens, keep outside [1, n], bad ids."""
    n = len(tokens)
    if n == 0:
        raise ValueError("extend needs at least one token")
    if keep is not None and not 1 <= keep <= n:
        raise ValueError(f"keep must lie in [1, {n}] for {n} tokens, got {keep}")
    check_token_ids(tokens, vocab_size)
