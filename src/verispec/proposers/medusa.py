"""Medusa heads as a proposer (Cai et al. 2401.10774): K heads read the target's feature of
the last processed position and guess the K tokens after the pending one, each on its own.

When `propose(context)` is called the target has processed every emitted token but the pending
one (the engine's cache contract), so the newest feature is that of position n - 2 of a
context of n tokens; head i guesses token n + i, the (i + 1)-th token after the pending token
n - 1 (`verispec.heads.medusa`). The features come from the target the engine drives, through
its `FeatureChannel` (see `verispec.proposers.eagle` for the seam); Medusa keeps no state of its
own, so `commit` has nothing to follow.

Each drafted token is sampled from its head's q (pruned vocabulary spread to the full one,
after the request's sampling transforms) and verified by the token-level or block rule; the
heads ignore each other's draws, which the rules allow: q_i only has to be the distribution
token i was drawn from. At temperature 0 each token is its head's argmax (chosen, q None).
Medusa's own "typical acceptance" is not exact, so it is not used. A round drafts at most K
tokens; a context of one token has no feature yet and drafts nothing.

Trees (`propose_tree`, Medusa's candidate tree, `generate_medusa_buffers`): a shape node at
depth d of rank r takes head d - 1's r-th candidate, whatever its ancestors are (the heads
never see each other's guesses), cut at depth K. At temperature 0 the candidates are the
head's best tokens, chosen (q None; rank 0 is `propose`'s argmax), so the tree is the shape's
slice of the Cartesian product of the heads' top lists. At temperature > 0 each node's
children are independent draws from its head's q with replacement (SpecInfer's sampled
siblings, q rows given), which accepted more than the top tokens as point masses on Spec-Bench
dev at depth 1 (0.156 vs 0.110 at w = 1, 0.268 vs 0.261 at w = 4; see `verispec.proposers.eagle`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from verispec.heads.checkpoint import check_target
from verispec.heads.medusa import MedusaHead
from verispec.heads.vocab import HeadVocab
from verispec.models.base import CausalLM, FeatureChannel
from verispec.drafts import EMPTY_DRAFT, Draft, TreeDraft
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape, fill, widest, with_q


class MedusaProposer:
    """Drafts with `head` for `target` (a `CausalLM` with a `FeatureChannel`: the very object
    the engine drives)."""

    def __init__(self, head: MedusaHead, target: CausalLM) -> None:
        check_target(head.config, target)
        self.head = head
        self.target: FeatureChannel = target
        self.taps = head.config.feature_layers
        target.record_features(self.taps)
        self.vocab = HeadVocab(head.d2t, head.config.target.vocab_size)
        self.sampling = SamplingParams()

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.sampling = sampling

    def commit(self, context: Sequence[int]) -> None:
        """Nothing to follow: the drafts read only the target's newest feature."""

    @torch.inference_mode()
    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        if len(context) < 2 or k < 1:
            return EMPTY_DRAFT
        return self._draft(self._feature(context), k, rng)

    @torch.inference_mode()
    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        if len(context) < 2 or k < 1:
            return EMPTY_DRAFT
        return self._draft(self.target.score_features(list(context[:-1]), self.taps)[-1:], k, rng)

    @torch.inference_mode()
    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        if len(context) < 2 or not len(shape):
            return TreeDraft((), ())
        return self._tree(self._feature(context), shape, rng)

    @torch.inference_mode()
    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        if len(context) < 2 or not len(shape):
            return TreeDraft((), ())
        return self._tree(self.target.score_features(list(context[:-1]), self.taps)[-1:], shape, rng)

    def _feature(self, context: Sequence[int]) -> torch.Tensor:
        """The target's feature [1, F] of the newest processed position, n - 2."""
        n = len(context)
        if self.target.length != n - 1:
            raise RuntimeError(
                f"the target has processed {self.target.length} tokens, the heads expect {n - 1} (all but the "
                "pending token): the proposer must draft for the target the engine drives"
            )
        return self.target.features(self.taps, n - 2, n - 1)

    def _draft(self, feature: torch.Tensor, k: int, rng: Random) -> Draft:
        """Up to k tokens from the feature [1, F]: token i from head i."""
        logits = self.head(feature)[0]  # [K, N]
        tokens, q_rows = [], []
        for i in range(min(k, logits.shape[0])):
            token, q = self.vocab.draw(logits[i], self.sampling, rng)
            tokens.append(token)
            q_rows.append(q)
        if self.sampling.greedy:
            return Draft(tuple(tokens))
        return Draft(tuple(tokens), torch.stack(q_rows))

    def _tree(self, feature: torch.Tensor, shape: TreeShape, rng: Random) -> TreeDraft:
        """`shape` filled from the feature [1, F]: depth d's nodes from head d - 1."""
        logits = self.head(feature)[0]  # [K, N]
        width = widest(shape)
        q_at: dict[int, torch.Tensor] = {}  # depth - 1 -> head q [V] its nodes were drawn from

        best = functools.cache(lambda depth: self.vocab.ranked(logits[depth], self.sampling, width))

        def candidates(path: tuple[int, ...]) -> list[int]:
            if len(path) >= logits.shape[0]:
                return []
            if self.sampling.greedy:  # the same best tokens under every parent of a depth
                return best(len(path))
            tokens, q = self.vocab.siblings(logits[len(path)], self.sampling, rng, width)
            if q is not None:
                q_at[len(path)] = q
            return tokens

        tree = fill(shape, candidates)
        return tree if self.sampling.greedy else with_q(tree, lambda path: q_at[len(path)])
