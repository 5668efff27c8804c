"""Tree rounds in the exhaustive audit: every tree configuration matches the target's exact
law, the configurations cover every tree rule (greedy, chosen siblings, sampled siblings) with
EOS and budget cuts, the enumeration of the engine's random choices walks tree rounds, and the
two tree negative controls are caught while the correct rule passes on the same scenario."""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import pytest
import torch

from verispec.audit.controls import NEGATIVE_CONTROLS, stale_residual_siblings, with_replacement_siblings
from verispec.audit.enumerate import outcomes
from verispec.audit.exhaustive import TOLERANCE, Configuration, audit_configuration, select_proposers
from verispec.audit.report import all_configurations
from verispec.audit.trees import RANKED, TREE_SCENARIOS, TWO_ONE, tree_configurations
from verispec.clocks import TickClock
from verispec.drafts import ROOT, TreeDraft
from verispec.engine import generate
from verispec.policies import ConstantTree
from verispec.registry import PROPOSERS
from verispec.tree_shape import TreeShape

CONFIGURATIONS = tree_configurations()
TREE_CONTROLS = {
    "tree siblings verified with replacement": with_replacement_siblings,
    "tree residual not updated between siblings": stale_residual_siblings,
}


@pytest.mark.parametrize("config", CONFIGURATIONS, ids=lambda c: c.name)
def test_tree_configuration_matches_the_target(config):
    result = audit_configuration(config)
    assert result.error is None
    assert result.max_abs_diff <= TOLERANCE
    assert result.drafted > 0 and result.sequences >= 1


def test_tree_configurations_cover_every_tree_rule():
    assert all("tree" in c.name for c in CONFIGURATIONS)
    kinds = {(c.proposer.name, c.rule) for c in CONFIGURATIONS}
    assert {("draft", "tree-greedy"), ("draft", "tree-recursive"), ("ranked", "tree-recursive"),
            ("draft", "tree-coupled"), ("ranked", "tree-coupled")} <= kinds
    assert all(kind.trees for kind in {c.proposer for c in CONFIGURATIONS})
    # at temperature > 0 the draft model samples its children and ranked chooses them
    tables = TREE_SCENARIOS[2].tables()
    for proposer, sampled in ((PROPOSERS["draft"].audit(tables), True), (RANKED.audit(tables), False)):
        proposer.begin([1, 2], TREE_SCENARIOS[2].sampling)  # one after the other: they share the draft's cache
        assert (proposer.propose_tree([1, 2], TWO_ONE, _FirstBranch()).q is not None) == sampled
    assert any(s.eos_token_id is not None for s in TREE_SCENARIOS if not s.sampling.greedy)
    assert any(s.eos_token_id is not None for s in TREE_SCENARIOS if s.sampling.greedy)
    assert any(s.max_new_tokens - 1 < s.tree.depth for s in TREE_SCENARIOS)  # the budget cuts the shape
    assert any(max(path[-1] for path in s.tree.paths) >= 2 for s in TREE_SCENARIOS)  # three siblings
    assert {s.sampling.temperature for s in TREE_SCENARIOS} >= {0, 1, 0.5}


class _FirstBranch:
    """Takes the first option of every draw (enough to look at one drafted tree)."""

    def bernoulli(self, prob: float) -> bool:
        return True

    def categorical(self, probs: torch.Tensor) -> int:
        return int((probs > 0).nonzero()[0])

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.categorical(probs)


def test_the_audit_lists_tree_configurations_per_proposer():
    draft_only = all_configurations(select_proposers(["draft"]))
    names = [c.name for c in draft_only]
    assert any(name.startswith("draft | tree-recursive | ") and "tree 3 nodes: 2-1" in name for name in names)
    assert any(name.startswith("ranked | tree-recursive | ") for name in names)  # ranks the draft's table
    every = all_configurations()
    assert all(c.proposer.trees for c in every if c.scenario.tree is not None)
    assert {c.proposer.name for c in every if c.scenario.tree is not None} >= {"draft", "random", "ranked"}


def test_enumeration_walks_tree_rounds():
    """Every branch of a sampled tree request replays deterministically, the branch
    probabilities sum to 1, and every speculative round of every branch was a tree."""
    scenario = TREE_SCENARIOS[3]
    tables = scenario.tables()
    proposer = PROPOSERS["draft"].audit(tables)
    mass, shapes = 0.0, defaultdict(int)

    def run(rng):
        generation = generate(tables.target, proposer, scenario.prompt, max_new_tokens=scenario.max_new_tokens,
                              sampling=scenario.sampling, eos_token_id=scenario.eos_token_id, rng=rng,
                              k=ConstantTree(scenario.tree), clock=TickClock())
        return generation.stats

    for probability, stats in outcomes(run):
        mass += probability
        speculative = sum(1 for drafted in stats.drafted if drafted)
        assert stats.tree_rounds == speculative >= 1  # a plain step (budget 1) is the only chain round
        shapes[tuple(stats.drafted)] += 1
    assert abs(mass - 1) < 1e-12
    # the first round drafts the shape cut to depth 2 (4 nodes), or fewer below an EOS
    assert {drafted[0] for drafted in shapes} <= {1, 2, 3, 4} and any(d[0] == 4 for d in shapes)


@pytest.mark.parametrize("name", TREE_CONTROLS)
def test_tree_negative_controls_are_caught(name):
    control = NEGATIVE_CONTROLS[name]
    assert control.verifier is TREE_CONTROLS[name] and control.scenario.tree is not None
    broken = audit_configuration(control)
    assert broken.error is None and not broken.passed and broken.max_abs_diff > 1e-3
    correct = audit_configuration(Configuration(control.scenario, control.proposer, "token"))
    assert correct.passed and correct.rule == "tree-recursive"  # the rule, not the scenario, is at fault


@pytest.mark.parametrize("name", TREE_CONTROLS)
def test_tree_controls_are_exact_without_siblings(name):
    """On a chain shape each node has one child and the broken sibling rules are the correct
    ones: the audit catches them through the siblings, not through anything else."""
    control = NEGATIVE_CONTROLS[name]
    chain = dataclasses.replace(control, scenario=dataclasses.replace(control.scenario, tree=TreeShape.chain(2)))
    assert audit_configuration(chain).passed


def test_with_replacement_siblings_on_the_docstring_example():
    """p_u = (.5, .3, .2), chosen siblings (1, 0): the broken rule gives token 0 .7 * .5 = .35."""
    p = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0, 0], [1.0, 0, 0]], dtype=torch.float64)
    tree = TreeDraft((1, 0), (ROOT, ROOT))
    first = defaultdict(float)
    for probability, verdict in outcomes(lambda rng: with_replacement_siblings(p, tree, rng)):
        first[(*tree.path_tokens(verdict.path), verdict.next_token)[0]] += probability
    assert first[0] == pytest.approx(0.35) and first[1] == pytest.approx(0.3) and first[2] == pytest.approx(0.35)
