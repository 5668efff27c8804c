"""What a run of any runtime returns, timed one way: `Outcome` (one request, `Clock` noting when
its tokens arrive) and `Served` (one request of a closed loop, on the loop's clock). verispec's
own runners and servers (`verispec.bench`) and its peers' (llama.cpp, vLLM, HF `generate`)
return the same types, so every method is measured alike.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from verispec.stats import Stats


@dataclass
class Outcome:
    """One request's result.

    tokens: the new token ids (EOS included when it ended the request).
    wall_seconds: from the call to the return. first_token_seconds: from the call to the first
    emitted token(s); first_tokens: how many arrived then (a speculative round emits several).
    tokens_per_round: new tokens emitted by each target forward after the prompt's.
    stats: the verispec engine's counters (None for HF methods).
    logits: float32 [len(tokens), V], row i the logits new token i was chosen from (HF with
    keep_logits only).
    peer: None when the tokens come from the target itself (verispec's engine, HF on the same
    model object), so greedy identity with plain decoding is required; else what other
    computation produced them (a peer runtime), whose output is compared but may differ.
    """

    tokens: list[int]
    wall_seconds: float
    first_token_seconds: float
    first_tokens: int
    tokens_per_round: list[int]
    stats: Stats | None = None
    logits: torch.Tensor | None = None
    peer: str | None = None

    @property
    def tokens_per_s(self) -> float:
        """New tokens per second of wall time, end to end (prefill included)."""
        return len(self.tokens) / self.wall_seconds if self.wall_seconds > 0 else float("inf")


@dataclass
class Clock:
    """Arrival times of emitted tokens: `emitted(n)` when n tokens came out together, or just
    `arrived()` when the round sizes are known otherwise."""

    start: float = field(default_factory=time.perf_counter)
    first_seconds: float | None = None
    per_round: list[int] = field(default_factory=list)

    def arrived(self) -> None:
        if self.first_seconds is None:
            self.first_seconds = time.perf_counter() - self.start

    def emitted(self, n: int) -> None:
        self.arrived()
        self.per_round.append(n)

    def outcome(self, tokens: list[int], stats: Stats | None = None) -> Outcome:
        wall = time.perf_counter() - self.start
        first = wall if self.first_seconds is None else self.first_seconds
        return Outcome(tokens, wall, first, self.per_round[0] if self.per_round else 0, self.per_round, stats)


@dataclass
class Served:
    """One finished request. key: the caller's (the prompt's index). tokens: the new ids (EOS
    included when it ended the request). submitted, first_token, finished: the server's clock
    (first_token None when nothing was emitted). stats: the verispec engine's counters (None
    for peers). peer: what computed the tokens when it is not verispec's target itself
    (`runners.Outcome.peer`)."""

    key: int
    tokens: list[int]
    submitted: float
    first_token: float | None
    finished: float
    stats: Stats | None = None
    peer: str | None = None

    @property
    def ttft(self) -> float:
        """Seconds from submission to the first token (prefill, queueing and the first round)."""
        return (self.first_token if self.first_token is not None else self.finished) - self.submitted

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first: (finished - first_token) / (n - 1)."""
        if self.first_token is None or len(self.tokens) < 2:
            return None
        return (self.finished - self.first_token) / (len(self.tokens) - 1)
