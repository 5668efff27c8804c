"""Random tokens: a proposer that knows nothing, drafting from the uniform distribution.

Its drafts are almost never accepted, which makes it the yardstick for the k policies: an
adaptive `k` must learn to stop speculating with it. It is a sampled proposer: q is the
uniform distribution after the request's sampling transforms (the transforms of all-zero
logits, so a nucleus keeps a fixed subset of the tied tokens), each token is drawn from q
through the request's rng (`Random.draw`: keyed by position in a coupled round), and q is returned for the token-level or block rule. At
temperature 0 the tokens are drawn from the uniform distribution just the same and returned
without q: the greedy rule reads only the target's argmax.

Trees: every node an independent draw from the same q (`tree_shape.sample`, one
`rng.draw` per node in the shape's order), q rows recorded at temperature > 0 for
SpecInfer's rule and left out at temperature 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from verispec.checks import is_int
from verispec.drafts import Draft, TreeDraft
from verispec.proposers.kind import ProposerKind
from verispec.randomness import Random
from verispec.sampling import SamplingParams, probabilities
from verispec.tree_shape import TreeShape, sample

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


class RandomTokens:
    def __init__(self, vocab_size: int) -> None:
        if not is_int(vocab_size, least=1):
            raise ValueError(f"vocab_size must be an integer >= 1, got {vocab_size!r}")
        self.vocab_size = vocab_size
        self.sampling = SamplingParams()
        self._q = self._uniform(self.sampling)  # q[V]

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.sampling = sampling
        self._q = self._uniform(sampling)

    def commit(self, context: Sequence[int]) -> None:
        """Nothing to follow: the drafts ignore the context."""

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        tokens = tuple(rng.draw(i, self._q) for i in range(k))
        if self.sampling.greedy or not tokens:
            return Draft(tokens)
        return Draft(tokens, self._q.expand(len(tokens), -1))  # q[k, V], one row per token

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        return self.propose(context, k, rng)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        tree = sample(shape, lambda path: self._q, rng)
        return TreeDraft(tree.tokens, tree.parents) if self.sampling.greedy else tree

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return self.propose_tree(context, shape, rng)

    def _uniform(self, sampling: SamplingParams) -> torch.Tensor:
        """q[V]: the uniform distribution, after the transforms when sampling."""
        if sampling.greedy:
            return torch.full((self.vocab_size,), 1.0 / self.vocab_size, dtype=torch.float64)
        return probabilities(torch.zeros(1, self.vocab_size, dtype=torch.float64), sampling)[0]


def build(options: None, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> RandomTokens:
    """`random`: uniform tokens over the target's vocabulary."""
    return RandomTokens(target.lm.vocab_size)


def audit_fixture(tables: Tables) -> RandomTokens:
    return RandomTokens(tables.target.vocab_size)


KIND = ProposerKind(
    "random", "random", "sampled", build,
    "uniform random tokens: the baseline an adaptive k must learn to turn off",
    audit=audit_fixture, example="random", trees=True,
)
