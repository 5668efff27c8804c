"""The `Proposer` protocol (its `Draft` lives in `verispec.drafts`).

Lifecycle (llama.cpp's begin / draft / accept): `begin` once per request, `propose` once per
round, `commit` after each round with the context as emitted, so that any state (a draft
model's cache, a lookup index) follows the emitted prefix and never a rejected suffix.

`propose_stateless` recomputes the same draft from the context alone; the slow reference
decoder uses it to check that the proposer's incremental state never drifts.

A `TreeProposer` also fills tree shapes (`verispec.tree_shape`): several continuations per
round, verified as a token tree.

An `ObservingProposer` also learns from the target's rows at its drafted positions (lookahead
decoding's Jacobi iteration, `verispec.proposers.lookahead`): the engine passes them right after
scoring, before verification, and the reference decoder passes its recomputed rows at the same
point. The rows are a deterministic function of the context and the draft, so a draft built
from the context and earlier rounds' rows is still a function of the emitted prefix (never of
a random draw), and the rules' guarantee holds round by round.

A `SourcedProposer` drafts each round from one of several sources (copying or a head) and says
which before the round, so each source gets its own k policy (`verispec.policies.PerSource`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch

from verispec.drafts import Draft, TreeDraft
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape


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


class TreeProposer(Proposer, Protocol):
    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        """A tree of at most the nodes of `shape` continuing `context`: each node the candidate
        of its rank after its ancestors (chosen, q None) or an independent sample from the
        proposal after them (q given)."""
        ...

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        """The tree `propose_tree` must return, recomputed from `context` alone (slow)."""
        ...


@runtime_checkable
class ObservingProposer(Protocol):
    def observe(self, context: Sequence[int], draft: Draft | TreeDraft, logits: torch.Tensor) -> None:
        """The target's raw logits[n + 1, V] (any device) for `[pending, *draft.tokens]` after
        `context` (its last token the pending one): row 0 after the pending token, row i + 1
        after drafted node i (a tree's rows see each node's own path). Called once per round,
        a plain step's empty draft included, before the verdict; use only what is a
        deterministic function of the rows (e.g. their argmax), never a random draw."""
        ...


@runtime_checkable
class SourcedProposer(Protocol):
    def source(self, context: Sequence[int]) -> str:
        """The name of the source that will draft after `context`, decided from the context
        alone, before the round's k is chosen."""
        ...

    def source_stateless(self, context: Sequence[int]) -> str:
        """The source `source` must name, recomputed from `context` alone (slow)."""
        ...


def draft_source(proposer: Proposer | None, context: Sequence[int], stateless: bool = False) -> str | None:
    """The source of the next round's draft; None for a proposer with one source."""
    if proposer is None or not isinstance(proposer, SourcedProposer):  # plain decoding skips the Protocol check
        return None
    return proposer.source_stateless(context) if stateless else proposer.source(context)
