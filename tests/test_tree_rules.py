"""Token trees and their rules: `TreeDraft`, `TreeShape`, `fill`, `sample`, `ranked_top`, and
`tree_greedy` / `tree_recursive` checked exactly. Every random branch of a round (the sampled
tree's draws and the rule's) is enumerated with its probability (`audit.enumerate.outcomes`),
and the round's output, continued by the target, is compared with the target's own law
computed on Fractions (`audit.exact_target.autoregressive`)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch

from enumerated import EXACT, distribution, row

from verispec.audit.enumerate import ScriptedRandom
from verispec.audit.exact_target import autoregressive
from verispec.audit.oracle import round_distribution, token_level_verdicts, tree_round_distribution
from verispec.drafts import ROOT, Draft, TreeDraft, TreeVerdict, tree_depths
from verispec.models.tables import TableLM, random_row, random_table
from verispec.randomness import TorchRandom
from verispec.tree_shape import TreeShape, fill, ranked_top, sample
from verispec.verify import (
    greedy, point_mass, rule_chooser, token_level, tree_coupled, tree_greedy, tree_recursive,
)

F64 = torch.float64
SHAPES = [
    TreeShape.of([(0,), (1,)]),
    TreeShape.of([(0,), (1,), (0, 0)]),
    TreeShape.of([(0,), (1,), (2,), (0, 0), (1, 0)]),
    TreeShape.of([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)]),
    TreeShape.chain(3),
]


def max_difference(observed: dict, exact: dict) -> float:
    return max(abs(observed.get(key, 0.0) - float(exact.get(key, 0))) for key in observed.keys() | exact.keys())


# --- the data types -----------------------------------------------------------------------------


def test_tree_draft_navigation():
    tree = TreeDraft(tokens=(5, 7, 9, 4), parents=(ROOT, ROOT, 0, 2))
    assert tree.children(ROOT) == [0, 1] and tree.children(0) == [2] and tree.children(1) == []
    assert tree.depths == (1, 1, 2, 3) and tree.depth == 3 == max(tree_depths(tree.parents))
    assert tree.path_to(3) == (0, 2, 3) and tree.path_to(ROOT) == ()
    assert tree.path_tokens((0, 2, 3)) == (5, 9, 4)
    # the accepted path 0 -> 2: two children offered at the root (rank 0 taken), one under 0, one under 2
    assert tree.offers((0, 2)) == ([2, 1, 1], [0, 0])
    assert tree.offers(()) == ([2], [])


def test_tree_draft_refuses_a_bad_tree():
    with pytest.raises(ValueError, match="parent must be -1"):
        TreeDraft((1, 2), (ROOT, 1))
    with pytest.raises(ValueError, match="2 tokens but 1 parents"):
        TreeDraft((1, 2), (ROOT,))
    with pytest.raises(ValueError, match="q has 1 rows"):
        TreeDraft((1, 2), (ROOT, ROOT), torch.ones(1, 3, dtype=F64))


def test_pruned_drops_descendants_and_renumbers():
    q = torch.eye(4, dtype=F64)
    tree = TreeDraft((0, 1, 2, 3), (ROOT, ROOT, 0, 2), q)
    pruned = tree.pruned(lambda node: node != 0)  # node 0 goes, and 2 and 3 below it
    assert pruned.tokens == (1,) and pruned.parents == (ROOT,) and torch.equal(pruned.q, q[[1]])
    assert tree.pruned(lambda node: True) is tree


def test_chain_as_tree():
    chain = Draft((3, 1, 2))
    tree = TreeDraft.chain(chain)
    assert tree.parents == chain.parents == (ROOT, 0, 1) and tree.depth == chain.depth == 3
    for node in (ROOT, 0, 1, 2):  # a chain walks as the tree it is
        assert chain.children(node) == tree.children(node)
    assert Draft(()).children(ROOT) == [] and Draft(()).parents == ()


def test_shape_order_parents_and_cuts():
    shape = TreeShape.of([(0, 0), (1,), (0,), (0, 1), (0, 0, 0)])
    assert shape.paths == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert shape.parents == (ROOT, ROOT, 0, 0, 2)
    assert shape.depth == 3 and shape.describe() == "5 nodes: 2-2-1" and not shape.is_chain
    assert shape.truncated(1).paths == ((0,), (1,)) and shape.truncated(0).describe() == "0 nodes"
    assert TreeShape.chain(2).paths == ((0,), (0, 0)) and TreeShape.chain(2).is_chain


@pytest.mark.parametrize(("paths", "message"), [
    ([(0, 0)], "no parent"),
    ([(0,), (2,)], "no sibling of rank 1"),
    ([()], "nonempty"),
])
def test_shape_refuses_unclosed_paths(paths, message):
    with pytest.raises(ValueError, match=message):
        TreeShape.of(paths)


def test_fill_takes_ranks_and_leaves_out_what_is_missing():
    calls = []

    def candidates(path):
        calls.append(path)
        return {(): [7, 8], (7,): [9], (8,): []}[path]

    tree = fill(TreeShape.of([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (1, 0, 0)]), candidates)
    # (2,) has no third candidate; (0, 1) no second; (1, 0) none, nor its child (1, 0, 0)
    assert tree.tokens == (7, 8, 9) and tree.parents == (ROOT, ROOT, 0) and tree.q is None
    assert calls == [(), (7,), (8,)]  # once per filled parent


def test_ranked_top_breaks_ties_to_the_lower_id_and_drops_zeros():
    assert ranked_top(row(0.25, 0.5, 0.25, 0), 4) == [1, 0, 2]
    assert ranked_top(row(0.25, 0.5, 0.25, 0), 2) == [1, 0]


def test_sample_draws_one_categorical_per_node_in_shape_order():
    shape = TreeShape.of([(0,), (1,), (0, 0)])
    asked = []

    def proposal(path):
        asked.append(path)
        return row("1/2", "1/2") if not path else row(0, 1)

    script = [[1, [(0, 0.5), (1, 0.5)]], [0, [(0, 0.5), (1, 0.5)]]]
    rng = ScriptedRandom(script)
    tree = sample(shape, proposal, rng)
    assert tree.tokens == (1, 0, 1) and tree.parents == shape.parents
    assert rng.position == 3 and rng.probability == 0.25  # the third draw had one option
    assert asked == [(), (1,)]
    assert torch.equal(tree.q, torch.stack([row("1/2", "1/2"), row("1/2", "1/2"), row(0, 1)]))


# --- the rules on hand-computed cases -------------------------------------------------------------


def test_recursive_docstring_example_chosen_siblings():
    """p_u = (.5, .3, .2), chosen children (1, 0): token 1 .3; token 0 .7 * 5/7 = .5; token 2 .2."""
    p = torch.stack([row(".5", ".3", ".2"), row(1, 0, 0), row(1, 0, 0)])
    tree = TreeDraft((1, 0), (ROOT, ROOT))

    def first_token_and_path(rng):
        verdict = tree_recursive(p, tree, rng)
        return (*tree.path_tokens(verdict.path), verdict.next_token)[0], verdict.path

    first = distribution(first_token_and_path)
    expected = {(1, (0,)): Fraction(3, 10), (0, (1,)): Fraction(1, 2), (2, ()): Fraction(1, 5)}
    assert max_difference(first, expected) < EXACT


def test_recursive_sampled_siblings_residual_between_them():
    """Two siblings sampled from q = (1/2, 1/2, 0) with p = (1/4, 1/4, 1/2): after a rejection
    r = (0, 0, 1), so the second sibling is never accepted and the repair is token 2."""
    q = row("1/2", "1/2", 0)
    p = torch.stack([row("1/4", "1/4", "1/2"), row(1, 0, 0), row(1, 0, 0)])

    def run(rng):
        tree = sample(TreeShape.of([(0,), (1,)]), lambda path: q, rng)
        verdict = tree_recursive(p, tree, rng)
        return (*tree.path_tokens(verdict.path), verdict.next_token)[0]

    assert max_difference(distribution(run), {0: Fraction(1, 4), 1: Fraction(1, 4), 2: Fraction(1, 2)}) < EXACT


def test_tree_greedy_follows_the_argmax_path():
    logits = torch.log(torch.stack([row(".2", ".5", ".3"), row(".6", ".2", ".2"), row(".1", ".1", ".8"),
                                    row(".3", ".3", ".4")]))
    tree = TreeDraft((0, 1, 2), (ROOT, ROOT, 1))  # root argmax 1 (node 1), then argmax 2 (node 2)
    assert tree_greedy(logits, tree, None) == TreeVerdict((1, 2), 2)
    assert tree_greedy(logits, TreeDraft((0, 2), (ROOT, ROOT)), None) == TreeVerdict((), 1)


def test_rule_chooser_sends_trees_to_the_tree_rules():
    tree = TreeDraft((0,), (ROOT,))
    assert rule_chooser("auto", greedy_sampling=True)(tree) is tree_greedy
    for verifier in ("token", "point-mass"):
        assert rule_chooser(verifier, greedy_sampling=False)(tree) is tree_recursive
    for verifier in ("auto", "coupled"):
        assert rule_chooser(verifier, greedy_sampling=False)(tree) is tree_coupled
    with pytest.raises(ValueError, match="block verification is defined for chains"):
        rule_chooser("block", greedy_sampling=False)(tree)


# --- tree rules on chains are the chain rules -------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_on_a_chain_the_tree_rules_are_the_chain_rules(seed):
    rng = random.Random(seed)
    vocab, k = rng.randint(2, 5), rng.randint(0, 4)
    p = torch.tensor([[float(x) for x in random_row(vocab, rng, 12, zeros=True)] for _ in range(k + 1)], dtype=F64)
    q = torch.tensor([[float(x) for x in random_row(vocab, rng, 12, zeros=False)] for _ in range(k)], dtype=F64)
    tokens = tuple(rng.randrange(vocab) for _ in range(k))
    for draft, chain_rule in ((Draft(tokens, q.reshape(k, vocab)), token_level), (Draft(tokens), point_mass)):
        for stream in range(3):  # the same random stream gives the same verdict, draw for draw
            chain = chain_rule(p, draft, TorchRandom(stream))
            tree = tree_recursive(p, TreeDraft.chain(draft), TorchRandom(stream))
            assert (tree.n_accepted, tree.next_token) == (chain.n_accepted, chain.next_token)
    logits = torch.log(p)
    chain = greedy(logits, Draft(tokens), None)
    tree = tree_greedy(logits, TreeDraft.chain(Draft(tokens)), None)
    assert (tree.n_accepted, tree.next_token) == (chain.n_accepted, chain.next_token)


# --- one round's exact law ---------------------------------------------------------------------------


def float_row(model: TableLM, context) -> torch.Tensor:
    return torch.tensor([float(x) for x in model.distribution(list(context))], dtype=F64)


def tree_round(target: TableLM, draft: TableLM, context: tuple[int, ...], shape: TreeShape, chosen: bool, rng):
    """One round as the engine runs it at temperature 1: a tree from the draft table (its
    top-ranked tokens, or independent draws from its rows), the target's rows after the
    context and each node's path, the tree rule; returns the emitted tokens."""
    if chosen:
        width = max(path[-1] + 1 for path in shape.paths)
        tree = fill(shape, lambda path: ranked_top(float_row(draft, context + path), width))
    else:
        tree = sample(shape, lambda path: float_row(draft, context + path), rng)
    nodes = [ROOT, *range(len(tree))]
    p = torch.stack([float_row(target, context + tree.path_tokens(tree.path_to(node))) for node in nodes])
    verdict = tree_recursive(p, tree, rng)
    return (*tree.path_tokens(verdict.path), verdict.next_token)


@pytest.mark.parametrize("chosen", [True, False], ids=["chosen", "sampled"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.describe())
@pytest.mark.parametrize("seed", range(4))
def test_one_round_continued_by_the_target_is_the_target(seed, shape, chosen):
    vocab = 3 if len(shape) <= 3 or chosen else 2
    target = random_table(vocab, 2, seed, zeros=seed % 2 == 0)
    draft = random_table(vocab, 2, seed + 50, zeros=seed % 2 == 1)
    context = (seed % vocab, (seed + 1) % vocab)
    emitted = distribution(lambda rng: tree_round(target, draft, context, shape, chosen, rng))
    length = shape.depth + 1
    next_row = lambda seq: target.distribution([*context, *seq])  # noqa: E731
    continued = autoregressive(emitted, next_row, length)
    exact = autoregressive({(): Fraction(1)}, next_row, length)
    assert max_difference(continued, exact) < EXACT


def test_a_round_accepts_more_than_a_chain_with_a_wider_tree():
    """The point of a tree: with siblings the expected accepted length does not drop."""
    target, draft = random_table(3, 2, 7), random_table(3, 2, 8)
    context = (0, 1)

    def expected_accepted(shape):
        emitted = distribution(lambda rng: tree_round(target, draft, context, shape, True, rng))
        return sum(prob * (len(seq) - 1) for seq, prob in emitted.items())

    chain, tree = expected_accepted(TreeShape.chain(2)), expected_accepted(TreeShape.of([(0,), (1,), (0, 0), (1, 0)]))
    assert tree > chain


# --- the rational oracle's tree rounds ------------------------------------------------------------


@pytest.mark.parametrize("chosen", [True, False], ids=["chosen", "sampled"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.describe())
@pytest.mark.parametrize("seed", range(3))
def test_the_rule_enumerated_equals_the_rational_oracle(seed, shape, chosen):
    """`verify.tree_recursive` (float64, every branch enumerated) against its restatement on
    Fractions (`oracle.tree_round_distribution`), with rows that depend on the drafted path."""
    vocab = 3 if len(shape) <= 3 or chosen else 2
    target, draft = random_table(vocab, 2, seed + 10), random_table(vocab, 2, seed + 60)
    context = (seed % vocab, 1)
    emitted = distribution(lambda rng: tree_round(target, draft, context, shape, chosen, rng))
    p = lambda path: target.distribution([*context, *path])  # noqa: E731
    q = lambda path: draft.distribution([*context, *path])  # noqa: E731
    exact = tree_round_distribution(p, q, shape, chosen)
    assert max_difference(emitted, exact) < EXACT
    assert set(emitted) == set(exact)  # no output the exact law lacks, none missing
    length = shape.depth + 1
    assert autoregressive(exact, p, length) == autoregressive({(): Fraction(1)}, p, length)


def test_the_oracle_on_a_chain_is_the_token_level_round():
    third, two_thirds = Fraction(1, 3), Fraction(2, 3)
    p, q = (lambda _: (third, two_thirds)), (lambda _: (two_thirds, third))
    assert tree_round_distribution(p, q, TreeShape.chain(2), chosen=False) == round_distribution(p, q, 2, token_level_verdicts)
