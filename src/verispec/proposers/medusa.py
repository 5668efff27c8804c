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

from verispec.drafts import Draft, TreeDraft
from verispec.proposers.head import HeadProposer
from verispec.randomness import Random
from verispec.sampling import to_host
from verispec.tree_shape import TreeShape, fill, widest, with_q


class MedusaProposer(HeadProposer):
    """Drafts with `head` (a `MedusaHead`) for `target` (a `CausalLM` with a `FeatureChannel`:
    the very object the engine drives)."""

    def commit(self, context: Sequence[int]) -> None:
        """Nothing to follow: the drafts read only the target's newest feature."""

    def _state(self, context: Sequence[int]) -> torch.Tensor:
        """The target's feature [1, F] of the newest processed position, n - 2."""
        self.check_target_follows(context)
        n = len(context)
        return self.target.features(self.taps, n - 2, n - 1)

    def _recomputed(self, context: Sequence[int]) -> torch.Tensor:
        """The same feature [1, F], from the target's stateless recomputation."""
        return self.target.score_features(list(context[:-1]), self.taps)[-1:]

    def _draft(self, feature: torch.Tensor, k: int, rng: Random) -> Draft:
        """Up to k tokens from the feature [1, F]: token i from head i."""
        logits = to_host(self.head(feature)[0])  # [K, N]
        tokens, q_rows = [], []
        for i in range(min(k, logits.shape[0])):
            token, q = self.vocab.draw(logits[i], self.sampling, rng, i)
            tokens.append(token)
            q_rows.append(q)
        return self.as_draft(tokens, q_rows)

    def _tree(self, feature: torch.Tensor, shape: TreeShape, rng: Random) -> TreeDraft:
        """`shape` filled from the feature [1, F]: depth d's nodes from head d - 1."""
        logits = to_host(self.head(feature)[0])  # [K, N]
        width = widest(shape)
        q_at: dict[int, torch.Tensor] = {}  # depth - 1 -> head q [V] its nodes were drawn from

        best = functools.cache(lambda depth: self.vocab.ranked(logits[depth], self.sampling, width))

        def candidates(path: tuple[int, ...]) -> list[int]:
            if len(path) >= logits.shape[0]:
                return []
            if self.sampling.greedy:  # the same best tokens under every parent of a depth
                return best(len(path))
            tokens, q = self.vocab.siblings(logits[len(path)], self.sampling, rng, width, len(path))
            if q is not None:
                q_at[len(path)] = q
            return tokens

        tree = fill(shape, candidates)
        return tree if self.sampling.greedy else with_q(tree, lambda path: q_at[len(path)])
