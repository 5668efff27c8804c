"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's
longest matching suffix (Saxena's prompt-lookup decoding; HF `prompt_lookup_num_tokens`).

The drafts are chosen, not sampled, so they are verified as point masses. The index maps each
n-gram (n = min_ngram..max_ngram) to the position right after its most recent occurrence that
has a continuation; it grows by one position per emitted token, never by a rescan.
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.drafts import EMPTY_DRAFT, Draft
from verispec.randomness import Random
from verispec.sampling import SamplingParams


class PromptLookup:
    def __init__(self, max_ngram: int = 3, min_ngram: int = 1) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self._continuation: list[dict[tuple[int, ...], int]] = []
        self._indexed = 0

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._continuation = [{} for _ in range(self.max_ngram)]
        self._indexed = 0
        self.commit(prompt_ids)

    def commit(self, context: Sequence[int]) -> None:
        # Position t becomes the continuation of every n-gram ending at t - 1.
        for t in range(max(self._indexed, 1), len(context)):
            for n in range(1, min(self.max_ngram, t) + 1):
                self._continuation[n - 1][tuple(context[t - n : t])] = t
        self._indexed = len(context)

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        for n in range(min(self.max_ngram, len(context) - 1), self.min_ngram - 1, -1):
            start = self._continuation[n - 1].get(tuple(context[-n:]))
            if start is not None:
                return Draft(tuple(context[start : start + k]))
        return EMPTY_DRAFT

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The seed's rescan: longest suffix first, most recent earlier match first."""
        tokens = list(context)
        for n in range(min(self.max_ngram, len(tokens) - 1), self.min_ngram - 1, -1):
            suffix = tokens[-n:]
            for start in range(len(tokens) - n - 1, -1, -1):
                if tokens[start : start + n] == suffix:
                    return Draft(tuple(tokens[start + n : start + n + k]))
        return EMPTY_DRAFT
