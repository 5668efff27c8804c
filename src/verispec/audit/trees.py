"""Tree rounds in the exhaustive audit: every tree rule, chosen and sampled, with EOS and the budget.

A tree scenario asks for the same `TreeShape` every round (`ConstantTree`); the engine cuts it
to the budget (`remaining - 1` deep) and drops the nodes below an EOS. Its configurations
cross the scenarios with every audited proposer whose registry entry fills trees
(`ProposerKind.trees`) and with `ranked`, a chosen-tree proposer that exists for the audit:

- temperature 0: `tree_greedy` (the draft's top-ranked children);
- temperature > 0: `tree_coupled` (auto: the child equal to the target's keyed sample), and
  `tree_recursive` (token): for sampled children (the draft model, random tokens) SpecInfer's
  residual r <- norm(max(r - q_s, 0)) between siblings; for chosen children (`ranked`: the
  draft table's top-ranked tokens, as lookup continuations or EAGLE-2's top-k are chosen)
  point-mass siblings without replacement, r(x_s) <- 0 and renormalise.

The rule is the one `auto`, `token` (or `greedy`) sends a tree to; the audit's rule column names it.
"""

from __future__ import annotations

import dataclasses

from verispec.audit.exhaustive import Configuration, Scenario, Tables, audited_proposers
from verispec.models.loading.load import LoadedModel
from verispec.proposers.draft_model import DraftModel
from verispec.registry import Corpus, ProposerKind
from verispec.sampling import GREEDY, SamplingParams
from verispec.tree_shape import TreeShape


class TopRankedDraft(DraftModel):
    """Chosen trees at every temperature: a node's children are the draft's top-ranked tokens
    after its path (q None), verified as point masses without replacement."""

    @property
    def _chosen_children(self) -> bool:
        return True


def _audit_only(argument: str, target: LoadedModel, corpus: Corpus) -> DraftModel:
    raise ValueError("ranked is the audit's chosen-tree proposer on rational tables; it has no spec")


RANKED = ProposerKind(
    "ranked", "ranked", "chosen", _audit_only,
    "the draft table's top-ranked tokens after each node, chosen: point-mass siblings (audit only)",
    audit=lambda tables: TopRankedDraft(tables.draft), trees=True,
)

TWO_ONE = TreeShape.of([(0,), (1,), (0, 0)])  # 3 nodes: 2-1
THREE_TWO = TreeShape.of([(0,), (1,), (2,), (0, 0), (1, 0)])  # 5 nodes: 3-2
DEEP = TreeShape.of([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])  # 5 nodes: 2-2-1, cut by a budget of 3


COUPLED_TOKENS = 3  # the coupled rule's budget in tree configurations (`tree_configurations`)


def _tree(vocab, order, shape, max_new_tokens, sampling, prompt, eos=None, seed=0, zeros=True) -> Scenario:
    return Scenario(vocab, order, 0, max_new_tokens, sampling, prompt, eos_token_id=eos, seed=seed,
                    zeros=zeros, tree=shape)


# Branch counts grow as vocab^nodes per sampled round (random tokens sample even at
# temperature 0): the scenarios keep 3-node trees on three or four tokens, or five nodes on two
# tokens or under a budget of 3 (the first round cut to depth 2, the next to depth 1).
TREE_SCENARIOS: list[Scenario] = [
    _tree(3, 2, DEEP, 3, GREEDY, (1, 2, 0, 1, 2)),
    _tree(4, 1, TWO_ONE, 3, GREEDY, (3, 1, 2, 3, 1), eos=0, seed=3),
    _tree(3, 2, TWO_ONE, 4, SamplingParams(), (1, 2, 0, 1, 2), seed=22),
    _tree(3, 2, DEEP, 3, SamplingParams(), (1, 2, 1, 2), eos=0, seed=26),
    _tree(2, 2, THREE_TWO, 3, SamplingParams(), (0, 1, 0, 1), seed=54),
    _tree(4, 1, TWO_ONE, 3, SamplingParams(temperature=0.5, top_k=2), (3, 1, 2, 3, 1), eos=0, seed=26),
    _tree(3, 2, TWO_ONE, 3, SamplingParams(top_p=0.7), (1, 2, 0, 1, 2), seed=10),
    _tree(3, 2, TWO_ONE, 3, SamplingParams(repetition_penalty=2.0, min_tokens=1), (1, 2, 1, 2), eos=0, seed=26),
]


def tree_proposers(proposers: list[ProposerKind] | None = None) -> list[ProposerKind]:
    """The audited kinds that fill trees (of `proposers`, default all), then `ranked` when the
    selection is the default or includes the draft model whose table it ranks."""
    kinds = audited_proposers() if proposers is None else proposers
    trees = [kind for kind in kinds if kind.trees]
    return trees + [RANKED] if proposers is None or any(kind.name == "draft" for kind in kinds) else trees


def tree_configurations(
    proposers: list[ProposerKind] | None = None, scenarios: list[Scenario] | None = None
) -> list[Configuration]:
    """Every tree proposer on every tree scenario, with `greedy` at temperature 0 and `auto`
    (coupled) and `token` (recursive rejection) otherwise (`ranked` only at temperature > 0:
    at 0 it is the draft model). The coupled rule runs at most 3 new tokens: it enumerates the
    target's race and every drafted child's at each position, and a fourth token multiplied
    the branches of a 2-1 tree past a minute per proposer (two rounds still run within 3)."""
    return [
        Configuration(dataclasses.replace(scenario, max_new_tokens=min(scenario.max_new_tokens, COUPLED_TOKENS))
                      if rule == "auto" else scenario, kind, rule)
        for kind in tree_proposers(proposers)
        for scenario in (TREE_SCENARIOS if scenarios is None else scenarios)
        if not (kind is RANKED and scenario.sampling.greedy)
        for rule in (("greedy",) if scenario.sampling.greedy else ("auto", "token"))
    ]
