"""A head's pruned vocabulary (FR-Spec, Zhao et al. 2502.14856; EAGLE-3's `d2t`).

A head scores only N frequent tokens: `d2t` [N] maps head index -> target token id (sorted,
distinct). Drafting turns the head's logits [N] into q over the FULL vocabulary [V], zero
outside the N tokens, with the request's sampling transforms; the verifier uses that q as is,
so decoding stays exact and only acceptance can drop (when the target wants a token outside
the N). At temperature 0 the draft is the head's argmax, a chosen token (q None).

Transforms over the N tokens equal the transforms over the full row with -inf elsewhere:
temperature, top-k, top-p and min-p ignore tokens of probability 0.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.randomness import Random
from verispec.sampling import SamplingParams, probabilities
from verispec.tree_shape import ranked_top


def check_d2t(d2t: torch.Tensor | Sequence[int], vocab_size: int) -> torch.Tensor:
    """`d2t` as a sorted LongTensor[N] of distinct ids in [0, vocab_size) on the host, or a
    clear error."""
    ids = torch.as_tensor(d2t, dtype=torch.long).flatten().cpu()
    if ids.numel() == 0:
        raise ValueError("a head vocabulary needs at least one token id")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"head token id {bad} is outside the vocabulary [0, {vocab_size})")
    if ids.unique().numel() != ids.numel():
        raise ValueError("head token ids must be distinct; remove the repeated ids")
    if not bool((ids[1:] > ids[:-1]).all()):
        raise ValueError("head token ids must be sorted ascending")
    return ids


class HeadVocab:
    """d2t [N] inside a vocabulary of `vocab_size` V; draws drafts from a head's logits.

    >>> vocab = HeadVocab(torch.tensor([0, 2]), vocab_size=3)
    >>> vocab.q(torch.tensor([0.0, 0.0]), SamplingParams()).tolist()
    [0.5, 0.0, 0.5]
    """

    def __init__(self, d2t: torch.Tensor | Sequence[int], vocab_size: int) -> None:
        self.d2t = check_d2t(d2t, vocab_size)  # [N]
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return self.d2t.numel()

    def q(self, logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
        """The proposal over the full vocabulary: float64 [V] from the head's logits [N]."""
        return self._spread(probabilities(logits.reshape(1, -1), sampling)[0])

    def _spread(self, kept: torch.Tensor) -> torch.Tensor:
        """kept [N] -> [V], zero outside d2t."""
        return kept.new_zeros(self.vocab_size).index_copy_(0, self.d2t, kept)

    def draw(
        self, logits: torch.Tensor, sampling: SamplingParams, rng: Random, position: int = 0
    ) -> tuple[int, torch.Tensor | None]:
        """One drafted target token from the head's logits [N] for the round's `position`: the
        argmax at temperature 0 (chosen, q None), else a draw from q [V] (q returned).

        The draw is from q [V] itself (`Random.draw`), so in a keyed round a target token id
        has the target's noise; the stream's draw is the token a draw of a head index from the
        N kept entries would give (d2t is ascending and zeros leave the cumulative sums as
        they are)."""
        if sampling.greedy:
            # float32 (exact for any head dtype, same first maximum): torch's bfloat16 argmax
            # is slower than the cast and a float32 argmax together (docs/results/implementation-choices.md).
            return int(self.d2t[int(logits.float().argmax())]), None
        kept = probabilities(logits.reshape(1, -1), sampling)[0]  # [N]
        q = self._spread(kept)
        return rng.draw(position, q), q

    def ranked(self, logits: torch.Tensor, sampling: SamplingParams, width: int) -> list[int]:
        """The `width` best target token ids by the head's logits [N], best first, as chosen
        tree candidates (q None): at temperature 0 by the logits, ties to the lower id (so rank
        0 is `draw`'s argmax); else by q after the transforms, tokens it filters out left out."""
        if sampling.greedy:
            order = torch.sort(logits, descending=True, stable=True).indices[:width]
            return self.d2t[order].tolist()
        kept = probabilities(logits.reshape(1, -1), sampling)[0]  # [N]
        return self.d2t[ranked_top(kept, width)].tolist()

    def siblings(
        self, logits: torch.Tensor, sampling: SamplingParams, rng: Random, width: int, position: int = 0
    ) -> tuple[list[int], torch.Tensor | None]:
        """A tree node's `width` children from the head's logits [N] after it, at the round's
        `position`: at temperature 0 the best ones (`ranked`, chosen, q None); else independent
        draws from q with replacement (SpecInfer's sampled siblings, repeats allowed; in a keyed
        round sibling c races with choice c) and that q [V]."""
        if sampling.greedy:
            return self.ranked(logits, sampling, width), None
        kept = probabilities(logits.reshape(1, -1), sampling)[0]  # [N]
        q = self._spread(kept)
        return [rng.draw(position, q, choice) for choice in range(width)], q
