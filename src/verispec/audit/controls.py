"""Negative controls: deliberately broken parts that the exhaustive audit must catch.

Each is a known way to lose exactness while every token still "looks" plausible:
- `resampling_p_verifier`: repairs a rejection by sampling p again instead of the residual
  norm(max(p - q, 0)) (the seed's example: p = (.1, .3, .6), q = (.4, .4, .2) emits
  (.14, .42, .44));
- `UntransformedQDraftModel`: samples its drafts after top-k but reports q from before it,
  breaking the transform contract (p and q must both be the distributions actually sampled);
- `UncroppedCacheTableLM`: a target whose rollback reports the cropped length while its cache
  keeps the rejected tokens, so later rows condition on them (visible with order-2 tables,
  where a row depends on the token before the pending one);
- `ArgmaxHeadVocab`: a trained head that drafts its argmax but reports its softmax as q (HF
  #32867's bug, here in a head's pruned vocabulary: a chosen token verified as if sampled);
- `with_replacement_siblings`: chosen tree siblings each accepted with the node's own p(x_s),
  as if every sibling were a fresh single draft, instead of r(x_s) with the rejected siblings
  removed and r renormalised (p = (.5, .3, .2), siblings (1, 0): token 0 gets .35, not .5);
- `stale_residual_siblings`: sampled tree siblings each tested against the node's p instead of
  the residual norm(max(r - q_s, 0)) left by the siblings rejected before them;
- keyed noise on the wrong key, under the coupled rule: `keyed_within_round` (row i keyed by
  i, so every round reuses the first round's noise), `keyed_by_round` (every row of a round on
  the noise of its first position) and `one_noise` (every position on one key's noise);
- `ratio_shortcut` with `IndependentNoiseDraftModel`: a coupled rule that accepts a sampled
  draft without the target's race where p(x)/q(x) is the largest ratio (then, on shared noise,
  the target's race picks x too), with drafts whose noise is not the target's.

None of these may be used outside the audit; `NEGATIVE_CONTROLS` pairs each with a scenario
where the damage shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from verispec.audit.exhaustive import Configuration, Scenario
from verispec.audit.trees import RANKED, TWO_ONE
from verispec.drafts import ROOT, Draft, TreeDraft, TreeVerdict, Verdict
from verispec.heads.untrained import tiny_head
from verispec.heads.vocab import HeadVocab
from verispec.models.tables import TableLM
from verispec.proposers import DraftModel
from verispec.proposers.eagle import EagleProposer
from verispec.randomness import Random, Round
from verispec.registry import PROPOSERS
from verispec.sampling import SamplingParams, probabilities
from verispec.verify import coupled, token_level


def resampling_p_verifier(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """BROKEN: token-level acceptance min(1, p_i(x_i) / q_i(x_i)) over p[k+1, V] and q[k, V],
    but a rejection at position i emits a fresh draw from p_i."""
    for i, x in enumerate(draft.tokens):
        if not rng.bernoulli(min(1.0, float(p[i, x] / draft.q[i, x]))):
            return Verdict(i, rng.categorical(p[i]))
    return Verdict(len(draft), rng.categorical(p[len(draft)]))


def with_replacement_siblings(p: torch.Tensor, draft: Draft | TreeDraft, rng: Random) -> Verdict | TreeVerdict:
    """BROKEN: on a chosen tree, accepts each sibling x_s with p_u(x_s) from the node's row
    p[n + 1, V] (never the renormalised r), then repairs from p_u without the rejected
    siblings. Chains (the empty draft of a plain step) go to the token rule."""
    if not draft.is_tree:
        return token_level(p, draft, rng)

    def siblings(p_row: torch.Tensor, children: list[int]) -> tuple[int | None, torch.Tensor]:
        residual = p_row.clone()
        for child in children:
            x = draft.tokens[child]
            if rng.bernoulli(float(p_row[x])):
                return child, residual
            residual[x] = 0.0
        return None, residual / residual.sum()

    return _walk(p, draft, rng, siblings)


def stale_residual_siblings(p: torch.Tensor, draft: Draft | TreeDraft, rng: Random) -> Verdict | TreeVerdict:
    """BROKEN: on a sampled tree, tests every sibling x_s with min(1, p_u(x_s) / q_s(x_s))
    against the node's row p_u, never against the residual the rejected siblings leave; all
    rejected: the repair from norm(max(p_u - q_s, 0)). Chains go to the token rule."""
    if not draft.is_tree:
        return token_level(p, draft, rng)

    def siblings(p_row: torch.Tensor, children: list[int]) -> tuple[int | None, torch.Tensor]:
        for child in children:
            x = draft.tokens[child]
            if rng.bernoulli(min(1.0, float(p_row[x] / draft.q[child, x]))):
                return child, p_row
        residual = (p_row - draft.q[children[-1]]).clamp_min(0.0)
        return None, residual / residual.sum()

    return _walk(p, draft, rng, siblings)


def _walk(p: torch.Tensor, tree: TreeDraft, rng: Random, siblings) -> TreeVerdict:
    """Down the tree from the root: `siblings(p_row, children)` picks the accepted child (or
    None and the repair distribution); a node without children draws the bonus from its row."""
    node, path = ROOT, []
    while True:
        children = tree.children(node)
        if not children:
            return TreeVerdict(tuple(path), rng.categorical(p[node + 1]))
        accepted, repair = siblings(p[node + 1], children)
        if accepted is None:
            return TreeVerdict(tuple(path), rng.categorical(repair))
        path.append(accepted)
        node = accepted


class UntransformedQDraftModel(DraftModel):
    """BROKEN: draws each token from q after top-k, but reports q[V] before top-k."""

    def _next(
        self, logits: torch.Tensor, rng: Random, context: Sequence[int], position: int
    ) -> tuple[int, torch.Tensor | None]:
        if self.sampling.greedy:
            return super()._next(logits, rng, context, position)
        token = rng.draw(position, probabilities(logits, self.sampling)[0])
        return token, probabilities(logits, replace(self.sampling, top_k=None))[0]


class UncroppedCacheTableLM(TableLM):
    """BROKEN: `rollback` lowers the reported `length` but keeps the rejected tokens cached,
    and `extend` appends after them."""

    def __init__(self, table: TableLM) -> None:
        super().__init__(table.rows, table.order)
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        super().reset()
        self._length = 0

    def prefill(self, ids: Sequence[int]) -> None:
        super().prefill(ids)
        self._length = len(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self._length += len(tokens)
        return super().extend(tokens, keep)

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}; {self._length} tokens processed")
        self._length = length


class ArgmaxHeadVocab(HeadVocab):
    """BROKEN: at temperature > 0 drafts the head's argmax, yet reports q [V] as if sampled."""

    def draw(
        self, logits: torch.Tensor, sampling: SamplingParams, rng: Random, position: int = 0
    ) -> tuple[int, torch.Tensor | None]:
        if sampling.greedy:
            return super().draw(logits, sampling, rng, position)
        return int(self.d2t[int(logits.argmax())]), self.q(logits, sampling)


def _argmax_eagle(tables) -> EagleProposer:
    proposer = EagleProposer(tiny_head("eagle", tables.target), tables.target)
    proposer.vocab = ArgmaxHeadVocab(proposer.vocab.d2t, proposer.vocab.vocab_size)
    return proposer


def keyed_within_round(p: torch.Tensor, draft: Draft, rng: Round) -> Verdict:
    """BROKEN: the coupled rule with row i's noise keyed by i, its position within the round."""
    return coupled(p, draft, Round(rng.base, 0, rng.keyed))


def keyed_by_round(p: torch.Tensor, draft: Draft, rng: Round) -> Verdict:
    """BROKEN: the coupled rule with every row of a round on the noise of the round's first
    position."""
    return coupled(p, draft, _OneKey(rng, rng.start))


def one_noise(p: torch.Tensor, draft: Draft, rng: Round) -> Verdict:
    """BROKEN: the coupled rule with every position of the request on one key's noise."""
    return coupled(p, draft, _OneKey(rng, 0))


for _rule in (keyed_within_round, keyed_by_round, one_noise):
    _rule.keyed = True


class _OneKey(Round):
    """A round whose races all run on the noise of absolute position `key`."""

    def __init__(self, rng: Round, key: int) -> None:
        super().__init__(rng.base, rng.start, rng.keyed)
        self.key = key

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.base.race(self.key, probs, choice)


def ratio_shortcut(p: torch.Tensor, draft: Draft, rng: Random) -> Verdict:
    """The coupled rule, but a sampled draft x_i with the largest ratio p_i(x)/q_i(x) is
    accepted without the target's race: exact only when the draft raced on the target's noise
    (then E_x/p_i(x) = (E_x/q_i(x)) q_i(x)/p_i(x) <= E_y/p_i(y) for every y)."""
    if draft.q is None:
        return coupled(p, draft, rng)
    for i, x in enumerate(draft.tokens):
        ratios = p[i] / draft.q[i]  # [V]: inf where only p has mass, NaN where neither has
        ratios = torch.where(p[i] > 0, ratios, torch.zeros_like(ratios))
        if float(ratios[x]) >= float(ratios.max()):
            continue
        sample = rng.race(i, p[i])
        if sample != x:
            return Verdict(i, sample)
    return Verdict(len(draft), rng.race(len(draft), p[len(draft)]))


ratio_shortcut.keyed = True


class IndependentNoiseDraftModel(DraftModel):
    """BROKEN with `ratio_shortcut`: draws its drafts with noise of their own (choice 1), not
    the target's, in keyed rounds."""

    def _next(
        self, logits: torch.Tensor, rng: Random, context: Sequence[int], position: int
    ) -> tuple[int, torch.Tensor | None]:
        if self.sampling.greedy:
            return super()._next(logits, rng, context, position)
        q = probabilities(self._penalised(logits, context), self.sampling)[0]
        return rng.draw(position, q, 1), q


DRAFT = PROPOSERS["draft"]
_UNTRANSFORMED_Q = replace(
    DRAFT, description="a draft model reporting q before top-k", audit=lambda tables: UntransformedQDraftModel(tables.draft)
)
_ARGMAX_HEAD = replace(PROPOSERS["eagle"], description="an EAGLE head drafting its argmax with a softmax q",
                       audit=_argmax_eagle)

NEGATIVE_CONTROLS: dict[str, Configuration] = {
    "repair by resampling p": Configuration(
        Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22), DRAFT, resampling_p_verifier
    ),
    "q taken before top-k": Configuration(
        Scenario(4, 1, 2, 3, SamplingParams(top_k=2), (3, 1, 2, 3, 1), seed=46, zeros=False),
        _UNTRANSFORMED_Q,
        "token",
    ),
    "head argmax verified as sampled": Configuration(
        Scenario(3, 2, 2, 4, SamplingParams(), (1, 2, 0, 1, 2), seed=22), _ARGMAX_HEAD, "token"
    ),
    "tree siblings verified with replacement": Configuration(
        Scenario(3, 2, 0, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22, tree=TWO_ONE), RANKED, with_replacement_siblings
    ),
    "tree residual not updated between siblings": Configuration(
        Scenario(3, 2, 0, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22, tree=TWO_ONE), DRAFT, stale_residual_siblings
    ),
    "coupled noise keyed by position within the round": Configuration(
        Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22), DRAFT, keyed_within_round
    ),
    "coupled noise keyed by round": Configuration(
        Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22), DRAFT, keyed_by_round
    ),
    "coupled noise reused across positions": Configuration(
        Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22), DRAFT, one_noise
    ),
    "draft noise not the target's where the rule assumes it": Configuration(
        Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0, 1, 2), seed=22),
        replace(DRAFT, description="a draft model racing on noise of its own",
                audit=lambda tables: IndependentNoiseDraftModel(tables.draft)),
        ratio_shortcut,
    ),
    "target cache not cropped": Configuration(
        Scenario(3, 2, 2, 4, SamplingParams(), (1, 2, 0, 1, 2), seed=22),
        DRAFT,
        "token",
        target_model=UncroppedCacheTableLM,
    ),
}
