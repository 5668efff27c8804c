"""Controlled acceptance: a measuring tool that drafts with an acceptance you set.

`ControlledAcceptance` knows the target's own plain greedy continuation of the prompt and
drafts it, each drafted token right with a probability you choose: a(d, r) = P(the rank-r
candidate at draft depth d is the continuation's token | its parent is and ranks < r are
not), Sequoia's positional acceptance; a chain drafts rank 0 at every depth, so a(d, 0) is
its per-position acceptance (a constant alpha, or any survival profile). A wrong candidate
is another token, so greedy verification rejects it. A run with it shows what a proposer of
that acceptance would gain on this machine and target, before anyone trains one, to compare
with `verispec cost`'s prediction (docs/benchmarking.md); the policy simulation runs it on
rational tables (`verispec.simulation`).

It is not a proposer for generation and is not in the registry: it needs the continuation
before decoding starts (the bench computes it by plain greedy decoding, untimed), it decodes
greedily only, and its drafts cost nothing to make.

Its coins are drawn once per output position from its own generator, seeded by `seed` and
the prompt: the token at
output position p is drafted right when u_p < a(d, 0) (u_p uniform; a tree: the rank r with
a(d, 0) + ... + a(d, r - 1) <= u_p < a(d, 0) + ... + a(d, r)). A round reveals the coins only
up to its first rejection, whose position the repair token then takes, so each round sees
fresh coins with the stated law; and every k policy run on the same prompt and seed meets the
same coins, which makes their comparison much less noisy than independent draws would, while
different prompts meet different coins.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Sequence

from verispec.drafts import Draft, TreeDraft
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape, fill

Continuation = Callable[[Sequence[int]], Sequence[int]]
"""prompt ids -> the target's plain greedy continuation (at least as long as the budget)."""


def check_acceptance_table(acceptance: Sequence[Sequence[float]]) -> list[list[float]]:
    """a[d][r] as floats, each a probability, each depth's ranks summing to at most 1."""
    table = [[float(a) for a in row] for row in acceptance]
    if not table or not all(table):
        raise ValueError("controlled acceptance needs at least one depth with at least one rank")
    for d, row in enumerate(table, start=1):
        if any(not 0 <= a <= 1 for a in row) or sum(row) > 1 + 1e-9:
            raise ValueError(f"acceptance at depth {d} must be probabilities summing to at most 1, got {row}")
    return table


class ControlledAcceptance:
    """Drafts `continuation(prompt)` with controlled acceptance (module docstring).

    continuation: the target's plain greedy continuation of a prompt. acceptance: a[d][r] for
    depths d = 1.. (the last row repeats deeper). vocab_size: the target's, for the wrong
    tokens (at least widest rank + 2). seed: the coins' generator.

        >>> oracle = ControlledAcceptance(lambda prompt: [5, 6, 7, 8], [[1.0]], vocab_size=10)
        >>> oracle.begin([1, 2], SamplingParams(temperature=0))
        >>> oracle.propose([1, 2, 5], 2, None).tokens  # the continuation after 5, all right
        (6, 7)
    """

    def __init__(
        self, continuation: Continuation, acceptance: Sequence[Sequence[float]], vocab_size: int, seed: int = 0
    ) -> None:
        self.acceptance = check_acceptance_table(acceptance)
        width = max(len(row) for row in self.acceptance)
        if vocab_size < width + 2:
            raise ValueError(f"a vocabulary of {vocab_size} tokens cannot hold {width} candidates and a wrong one")
        self.continuation = continuation
        self.vocab_size = vocab_size
        self.seed = seed
        self._start = 0
        self._reference: list[int] = []
        self._coins: list[float] = []

    @classmethod
    def alpha(cls, continuation: Continuation, alpha: float, vocab_size: int, seed: int = 0) -> ControlledAcceptance:
        """Every drafted token right with probability alpha (a chain's constant acceptance)."""
        return cls(continuation, [[alpha]], vocab_size, seed)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        if not sampling.greedy:
            raise ValueError(
                "controlled acceptance drafts the plain greedy continuation; decode greedily (temperature 0)"
            )
        self._start = len(prompt_ids)
        self._reference = [int(t) for t in self.continuation(prompt_ids)]
        coins = random.Random(f"{self.seed}:{','.join(map(str, prompt_ids))}")
        self._coins = [coins.random() for _ in self._reference]

    def commit(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The chain: rank 0 of each depth's candidates, for up to k positions."""
        at = len(context) - self._start
        tokens, right = [], True
        for d in range(min(k, len(self._reference) - at)):
            token = self._candidates(at + d, d, right)[0]
            right = right and token == self._reference[at + d]
            tokens.append(token)
        return Draft(tuple(tokens))

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        return self.propose(context, k, rng)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        at = len(context) - self._start
        width = 1 + max((path[-1] for path in shape.paths), default=0)

        def candidates(path: tuple[int, ...]) -> Sequence[int]:
            d = len(path)
            if at + d >= len(self._reference):
                return ()
            on_path = list(path) == self._reference[at : at + d]
            return self._candidates(at + d, d, on_path, width)

        return fill(shape, candidates)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return self.propose_tree(context, shape, rng)

    def _candidates(self, position: int, depth: int, right_so_far: bool, width: int = 1) -> list[int]:
        """`width` distinct ranked candidates for output `position` at draft depth `depth` + 1:
        the continuation's token at the rank its coin gives (when the path to it is right),
        other tokens elsewhere."""
        right = self._reference[position]
        wrong = (t % self.vocab_size for t in itertools.count(right + 1))
        out = [next(wrong) for _ in range(width)]
        if right_so_far:
            row = self.acceptance[min(depth, len(self.acceptance) - 1)]
            rank = next((r for r, edge in enumerate(itertools.accumulate(row)) if self._coins[position] < edge), None)
            if rank is not None and rank < width:
                out.insert(rank, right)
                out.pop()
        return out
