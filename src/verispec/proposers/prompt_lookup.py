"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's
longest matching suffix (Saxena's prompt-lookup decoding; HF `prompt_lookup_num_tokens`).

The drafts are chosen, not sampled, so they are verified as point masses. The index maps each
n-gram (n = min_ngram..max_ngram) to the positions right after its occurrences that have a
continuation, oldest first; it grows by one position per emitted token, never by a rescan.

Trees (`propose_tree`): every occurrence of the longest matching suffix offers its
continuation, and the continuations form a trie. After a drafted path, the candidates are the
tokens that follow it in the occurrences whose continuation starts with that path: first the
token of the most recent such occurrence (what `propose` copies), then the others by how many
occurrences they follow, ties to the most recent. So a chain shape is `propose`'s draft for as
long as that copy lasts, and siblings only add to it. Worked example: in the context
1 2 1 2 1 3 1 the longest earlier suffix is the 1-gram 1, followed by 3 most recently and by
2 twice before: first-level candidates 3, 2; after 3 comes 1, after 2 comes 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from verispec.drafts import EMPTY_DRAFT, Draft, TreeDraft
from verispec.proposers.kind import ProposerKind
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape, fill

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


class PromptLookup:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._continuations: list[dict[tuple[int, ...], list[int]]] = []  # n - 1 -> n-gram -> positions
        self._indexed = 0

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._continuations = [{} for _ in range(self.max_ngram)]
        self._indexed = 0
        self.commit(prompt_ids)

    def commit(self, context: Sequence[int]) -> None:
        # Position t becomes the continuation of every n-gram ending at t - 1.
        for t in range(max(self._indexed, 1), len(context)):
            for n in range(1, min(self.max_ngram, t) + 1):
                self._continuations[n - 1].setdefault(tuple(context[t - n : t]), []).append(t)
        self._indexed = len(context)

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        starts = self._starts(context)
        return Draft(tuple(context[starts[-1] : starts[-1] + k])) if starts else EMPTY_DRAFT

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return continuation_tree(context, self._starts(context), shape)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        """The rescan: every earlier occurrence of the longest matching suffix."""
        tokens = list(context)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            starts = [start + n for start in range(len(tokens) - n) if tokens[start : start + n] == suffix]
            if starts:
                return continuation_tree(tokens, starts, shape)
        return continuation_tree(tokens, [], shape)

    def _starts(self, context: Sequence[int]) -> list[int]:
        """The positions after each earlier occurrence of the longest matching suffix, oldest
        first ([] when none matches)."""
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            starts = self._continuations[n - 1].get(tuple(context[-n:]))
            if starts:
                return starts
        return []

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The seed's rescan: longest suffix first, most recent earlier match first."""
        tokens = list(context)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return Draft(tuple(tokens[start + n : start + n + k]))
        return EMPTY_DRAFT


def continuation_tree(context: Sequence[int], starts: Sequence[int], shape: TreeShape) -> TreeDraft:
    """The trie of the continuations context[t:] for t in `starts` (ascending), filled into
    `shape`: after a path, the next tokens of the continuations that begin with it, the most
    recent occurrence's (the largest t) first, then the most frequent, ties to the most recent."""
    following: dict[tuple[int, ...], list[int]] = {(): list(starts)}  # path -> its occurrences

    def candidates(path: tuple[int, ...]) -> list[int]:
        by_token: dict[int, list[int]] = {}
        for t in following[path]:
            if t + len(path) < len(context):
                by_token.setdefault(int(context[t + len(path)]), []).append(t)
        latest = max(by_token, key=lambda x: by_token[x][-1], default=None)
        ranked = sorted(by_token, key=lambda x: (x == latest, len(by_token[x]), by_token[x][-1]), reverse=True)
        for token in ranked:
            following[(*path, token)] = by_token[token]
        return ranked

    return fill(shape, candidates)


def build(options: None, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> PromptLookup:
    """`lookup`: prompt lookup with its defaults."""
    return PromptLookup()


def audit_fixture(tables: Tables) -> PromptLookup:
    """`lookup` on the audit's tables: n-grams up to 3 tokens (a table's request is 2-4 tokens)."""
    return PromptLookup(max_ngram=3)


KIND = ProposerKind(
    "lookup", "lookup", "chosen", build,
    "prompt lookup: continues the longest recent n-gram match in the request itself",
    audit=audit_fixture, example="lookup", trees=True,
    draft_cost=0.0,  # a table look-up: c = 0.0001 in `verispec profile` (docs/cost-model.md)
)
