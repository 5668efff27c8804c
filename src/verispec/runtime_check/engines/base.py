"""The one protocol every engine under check meets, and how it says no.

An engine samples continuations and decodes greedily, with speculation off (`method` None) or
on (one of its `methods`). It passes every parameter it is given or raises `Refused` saying
why; it never drops one silently. `Crashed` says it failed on what it accepted. `Unavailable`
says an engine cannot start here and how to install what it needs. An engine that can show its
own logits also meets `GivesLogits`, so a greedy divergence is diagnosed in its numerics as well
as in verispec's; one that counts its drafts meets `CountsDrafts`, so a report says whether the
speculation under check drafted at all; one whose draft model the check may choose meets
`FitsDraft`, so the check runs it with a draft that accepts about half its tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from verispec.runtime_check.cases import SamplingCase


class Refused(Exception):
    """The engine refuses this parameter, method or mode (the message says which and why)."""


class Crashed(Refused):
    """The engine failed on a request it had accepted (it raised, or its process died): a
    failure, not a refusal; the message says what happened. A `Refused` so that every place
    that records a refusal records it, as failed."""


class Unavailable(Exception):
    """The engine cannot run here; the message says what to install (`make vllm-env`, ...)."""


class Engine(Protocol):
    """name: the engine's name in reports. methods: its speculative methods. dtype: the
    precision it computes in, which sets the near-tie tolerance of greedy diagnoses
    (`verispec.identity.NEAR_TIE`)."""

    name: str
    methods: tuple[str, ...]
    dtype: str

    def versions(self) -> dict[str, str]:
        """Name -> version of everything that decides its output (runtime, libraries)."""
        ...

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        """n independent continuations of at most `length` new tokens (cut at EOS) under
        `case`, each seeded from `seed` + i; speculation by `method`, or none."""
        ...

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        """Greedy continuations of every prompt, `concurrency` requests in flight at once."""
        ...


@runtime_checkable
class GivesLogits(Protocol):
    """An engine that can show the logits it decodes from (optional beside `Engine`)."""

    def logits(self, prefix: Sequence[int]) -> torch.Tensor | None:
        """Its own logits for the token after `prefix`, float [V], from one forward of its
        own over the prefix (its weights and kernels); None when it cannot give them."""
        ...


@runtime_checkable
class CountsDrafts(Protocol):
    """An engine that can say how much it speculated (optional beside `Engine`)."""

    def drafts(self) -> tuple[int, int | None]:
        """Tokens drafted, and accepted (None when it cannot tell), over every speculative
        sample it has drawn so far."""
        ...


@runtime_checkable
class FitsDraft(Protocol):
    """An engine that takes a draft model the check may choose (optional beside `Engine`)."""

    def fit_draft(
        self, prompts: Sequence[Sequence[int]], methods: Sequence[str], case: SamplingCase, length: int
    ) -> list[str]:
        """Choose, for those of `methods` that take a draft model, one accepting about half
        (`power.ACCEPTANCE`) of its tokens in samples of `length` after `prompts` under `case`
        (called before each parameter's samples); a line per draft chosen, saying which and
        what it accepts there."""
        ...
