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
