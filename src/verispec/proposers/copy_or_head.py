"""A copy proposer and a trained head in one: per round, copy when the text repeats, else ask
the head (e.g. `lookup+eagle`).

Copying (prompt lookup, the suffix index) wins where the answer quotes its request:
extraction, RAG, translation of names and numbers. A head wins on fresh text. The choice is
made from the context alone, before any random draw: the copy proposer's draft when it finds
one, else the head's. With `PromptLookup()` the head fills exactly the rounds lookup alone
would decode plainly; `PromptLookup(min_ngram=2)` hands it the one-token-match rounds too.

Exactness holds round by round, because each round's draft carries its own provenance: a
copied draft is chosen (q None: point mass, and greedy at temperature 0) and a head draft is
sampled with its q (token-level or block). The engine picks the rule per draft
(`verify.rule_chooser`, "auto"), so every round is verified by a rule exact for it. The choice
depends on the emitted context only, like any proposer's draft, so the rules' guarantee (each
round's output follows p given that context) holds whichever sub-proposer drafted.

State: both sub-proposers `begin`, `commit` (and, when they learn from the target's rows,
`observe`) every round, whichever drafted, so each follows the emitted prefix. An EAGLE head
that did not draft for some rounds stays aligned: its cache holds pairs built from the
target's true features up to where it last drafted, and its next `propose` appends the pairs
of every position emitted since (the target keeps the features of every processed position),
in one head forward.

Sources: `source(context)` names the round's drafter ('copy' or 'head') before k is chosen,
so the engine keeps one k policy per source (`verispec.policies.PerSource`): with `--k auto`
copying keeps the long k its matches earn while a head that does not pay is turned off, its
rounds decoded plainly (with probes) rather than dragging the copy rounds' k down with it. It
assumes what prompt lookup and the suffix index do: a copy proposer that drafts at k = 1 drafts
at every k (and its tree has a node), and it does not draw from the round's randomness.

Trees: the same choice per round, `copy`'s tree when it has any node, else `head`'s tree. Each
tree carries its own provenance (lookup's chosen, q None; a head's sampled with q rows at
temperature > 0), so `tree_recursive` verifies every round by the rule of its siblings. Merging
them (the copy as rank 0, the head's picks as its siblings) would rank a copied token above
the head's best even where the head is surer, and would make the head expand the copied paths
too; the per-round choice keeps lookup's rounds as cheap as lookup's own trees.

    >>> proposer = CopyOrHead(PromptLookup(), EagleProposer(head, target))
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import TYPE_CHECKING

import torch

from verispec.drafts import Draft, TreeDraft
from verispec.head_kind import HeadKind
from verispec.proposers import trained
from verispec.proposers.base import ObservingProposer, Proposer, TreeProposer
from verispec.proposers.kind import ProposerKind
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.randomness import NO_DRAWS, Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables
    from verispec.proposers.trained import HeadSpec


COPY, HEAD = "copy", "head"


class CopyOrHead:
    """`copy`'s draft (or tree) when it drafts anything, else `head`'s; trees need both to be
    `TreeProposer`s."""

    def __init__(self, copy: Proposer | TreeProposer, head: Proposer | TreeProposer) -> None:
        self.copy = copy
        self.head = head

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.copy.begin(prompt_ids, sampling)
        self.head.begin(prompt_ids, sampling)

    def source(self, context: Sequence[int]) -> str:
        return COPY if len(self.copy.propose(context, 1, NO_DRAWS)) else HEAD

    def source_stateless(self, context: Sequence[int]) -> str:
        return COPY if len(self.copy.propose_stateless(context, 1, NO_DRAWS)) else HEAD

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        copied = self.copy.propose(context, k, rng)
        return copied if len(copied) else self.head.propose(context, k, rng)

    def commit(self, context: Sequence[int]) -> None:
        self.copy.commit(context)
        self.head.commit(context)

    def observe(self, context: Sequence[int], draft: Draft | TreeDraft, logits: torch.Tensor) -> None:
        """Pass the round's rows to each sub-proposer that learns from them, whichever drafted."""
        for proposer in (self.copy, self.head):
            if isinstance(proposer, ObservingProposer):
                proposer.observe(context, draft, logits)

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        copied = self.copy.propose_stateless(context, k, rng)
        return copied if len(copied) else self.head.propose_stateless(context, k, rng)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        copied = self.copy.propose_tree(context, shape, rng)
        return copied if len(copied) else self.head.propose_tree(context, shape, rng)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        copied = self.copy.propose_tree_stateless(context, shape, rng)
        return copied if len(copied) else self.head.propose_tree_stateless(context, shape, rng)


# The shortest n-gram match whose continuation `lookup+HEAD` copies instead of asking the head.
# 1: lookup drafts whenever it would alone and the head fills only the rounds it has nothing
# for, so the combination never drafts worse than lookup. Measured (bf16, 6 extraction / rag /
# translation dev prompts, greedy, k 4, an untrained EAGLE head): tokens per round 2.15 at 1,
# 1.83 at 2 (the head took lookup's one-token-match rounds and lost them), lookup alone 2.12.
COPY_MIN_MATCH = 1
# The audit's tables have 2-4 tokens, where a one-token match nearly always exists: its builder
# asks for two tokens so the head drafts too (the choice's exactness does not depend on it; the
# reference-equality property test draws it from 1..3).
AUDIT_COPY_MIN_MATCH = 2


def build(spec: HeadSpec, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> Proposer:
    """`lookup+KIND[:DIR][:weights=F]` (KIND eagle or medusa): lookup, else the head `spec` names."""
    return CopyOrHead(PromptLookup(min_ngram=COPY_MIN_MATCH), trained.build(spec, target, corpus))


def audit_fixture(kind: str, tables: Tables) -> Proposer:
    """`lookup+KIND` on the audit's tables, with an untrained head."""
    return CopyOrHead(PromptLookup(min_ngram=AUDIT_COPY_MIN_MATCH), trained.audit_fixture(kind, tables))


LOOKUP_EAGLE = ProposerKind(
    "lookup+eagle", "lookup+eagle[:DIR][:weights=F]", "mixed", build,
    "prompt lookup's draft whenever it has one (chosen), else the EAGLE-style head's sampled draft (DIR and F as for eagle)",
    audit=partial(audit_fixture, HeadKind.EAGLE), example=trained.shipped(HeadKind.EAGLE, "lookup+eagle"), trees=True,
    parse=partial(trained.parse, HeadKind.EAGLE), draft_cost=trained.HEAD_DRAFT_COST,  # the head's where lookup has nothing
)
LOOKUP_MEDUSA = ProposerKind(
    "lookup+medusa", "lookup+medusa[:DIR][:weights=F]", "mixed", build,
    "prompt lookup's draft whenever it has one (chosen), else the Medusa heads' sampled draft (DIR and F as for medusa)",
    audit=partial(audit_fixture, HeadKind.MEDUSA), example=trained.shipped(HeadKind.MEDUSA, "lookup+medusa"), trees=True,
    parse=partial(trained.parse, HeadKind.MEDUSA), draft_cost=trained.HEAD_DRAFT_COST,
)
