"""Proposers that fill tree shapes (prompt lookup, the suffix index, EAGLE-2's expansion,
Medusa's candidate tree, lookup+head): the incremental tree equals the stateless one after any
commits, the tree never exceeds its shape, siblings come in rank order, a chain shape is the
chain where that is the definition, and the engine equals the reference decoder (and greedy
tree decoding equals plain greedy decoding) with each of them on rational tables."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.drafts import ROOT, TreeDraft
from verispec.heads.untrained import tiny_head
from verispec.models.tables import TableLM, random_table
from verispec.policies import KPolicy
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.proposers.suffix_index import SuffixIndex
from verispec.reference import reference_generate
from verispec.registry import PROPOSERS
from verispec.tree_shape import TreeShape, widest

VOCAB = 5
KINDS = ("lookup", "suffix", "eagle", "medusa", "lookup+eagle", "lookup+medusa")
DYNAMIC = "eagle dynamic"  # EAGLE-2's own node choice within the shape's size (not a registry kind)
PROPOSERS_UNDER_TEST = (*KINDS, DYNAMIC)
SHAPES = [
    TreeShape.chain(3),
    TreeShape.of([(0,), (1,), (2,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]),
    TreeShape.of([(0,), (1,), (0, 0), (1, 0), (0, 0, 0), (0, 0, 1), (1, 0, 0), (0, 0, 0, 0)]),
    TreeShape.of([(0,), (1,), (2,), (3,)]),
]


def build(kind: str, table: TableLM):
    """Each tree-capable kind on a table (heads: untrained float64 heads on its features)."""
    if kind == "lookup":
        return PromptLookup(max_ngram=2)
    if kind == "suffix":
        return SuffixIndex([[4, 3, 2, 1, 0, 4, 3, 2, 1, 0, 1, 1]], max_match=3, min_prob=0.05)
    if kind == DYNAMIC:
        return EagleProposer(tiny_head("eagle", table), table, dynamic=True)
    if kind in ("eagle", "medusa"):
        return (EagleProposer if kind == "eagle" else MedusaProposer)(tiny_head(kind, table), table)
    return CopyOrHead(PromptLookup(min_ngram=2), build(kind.removeprefix("lookup+"), table))


def sampling_of(temperature: float) -> SamplingParams:
    return GREEDY if temperature == 0 else SamplingParams(temperature=temperature)


def follow(table: TableLM, context: list[int]) -> None:
    """Put the table where the engine leaves it between rounds: all but the pending token."""
    table.reset()
    table.prefill(context[:-1])


def same_tree(a: TreeDraft, b: TreeDraft) -> bool:
    """Equal tokens, parents and q rows (bit for bit: the same computation either way)."""
    if (a.tokens, a.parents) != (b.tokens, b.parents) or (a.q is None) != (b.q is None):
        return False
    return a.q is None or torch.equal(a.q, b.q)


def check_in_shape(tree: TreeDraft, shape: TreeShape, dynamic: bool = False) -> None:
    """At most the shape's nodes and depth; chosen siblings distinct (a repeated chosen sibling
    could never be accepted), sampled ones with a q row that gives them mass."""
    assert len(tree) <= len(shape) and tree.depth <= shape.depth
    for node in [ROOT, *range(len(tree))]:
        siblings = [tree.tokens[child] for child in tree.children(node)]
        assert len(siblings) <= widest(shape)
        if tree.q is None:
            assert len(set(siblings)) == len(siblings)
    if tree.q is not None:
        assert tree.q.dtype == torch.float64 and tree.q.shape == (len(tree), VOCAB)
        assert all(float(tree.q[i, token]) > 0 for i, token in enumerate(tree.tokens))
    if dynamic:
        return
    # Each drafted node sits at a path of the shape: its ranks are its sibling indices.
    for node in range(len(tree)):
        path = tree.path_to(node)
        ranks = tuple(tree.children(tree.parents[n]).index(n) for n in path)
        assert ranks in shape.paths


# --- incremental == stateless, shapes, ranks --------------------------------------------------


@settings(max_examples=25, deadline=None)
@given(
    kind=st.sampled_from(PROPOSERS_UNDER_TEST),
    seed=st.integers(0, 10**6),
    temperature=st.sampled_from([0.0, 1.0, 0.7]),
    prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=6),
    steps=st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=4), max_size=6),
    shapes=st.lists(st.sampled_from(range(len(SHAPES))), min_size=1, max_size=3),
)
def test_tree_equals_stateless_after_any_commits(kind, seed, temperature, prompt, steps, shapes):
    table = random_table(VOCAB, 2, seed % 7)
    proposer = build(kind, table)
    context = list(prompt)
    proposer.begin(context, sampling_of(temperature))
    for round_, step in enumerate([[], *steps]):
        context += step
        follow(table, context)
        if step:
            proposer.commit(context)
        for index in shapes:  # several trees per round: drafted state must not leak
            shape = SHAPES[index]
            tree = proposer.propose_tree(context, shape, TorchRandom(seed + round_))
            assert same_tree(tree, proposer.propose_tree_stateless(context, shape, TorchRandom(seed + round_)))
            check_in_shape(tree, shape, dynamic=kind == DYNAMIC)


def test_lookup_ranks_its_copy_first_then_by_frequency_then_recency():
    lookup = PromptLookup()
    context = [1, 2, 1, 2, 1, 3, 1]  # the 1-gram 1 is followed by 3 last, by 2 twice before
    lookup.begin(context, GREEDY)
    shape = TreeShape.of([(0,), (1,), (0, 0), (1, 0), (1, 0, 0)])
    tree = lookup.propose_tree(context, shape, None)
    assert tree == TreeDraft((3, 2, 1, 1, 3), (ROOT, ROOT, 0, 1, 3))  # after 2 1: 3 (t = 3) before 2 (t = 1)
    assert lookup.propose(context, 3, None).tokens == (3, 1)  # the chain copies the most recent
    # After the copy: by count, equal counts to the most recent occurrence.
    context = [7, 1, 4, 1, 9, 1, 4, 1, 5, 1, 5, 1, 6, 1]
    lookup.begin(context, GREEDY)
    assert lookup.propose_tree(context, TreeShape.of([(0,), (1,), (2,), (3,)]), None).tokens == (6, 5, 4, 9)


@settings(max_examples=60, deadline=None)
@given(context=st.lists(st.integers(0, 3), min_size=2, max_size=30), k=st.integers(1, 6))
def test_lookup_chain_shape_is_its_chain_while_the_copy_lasts(context, k):
    lookup = PromptLookup(max_ngram=2)
    lookup.begin(context, GREEDY)
    chain = lookup.propose(context, k, None).tokens
    assert lookup.propose_tree(context, TreeShape.chain(k), None).tokens[: len(chain)] == chain


@settings(max_examples=40, deadline=None)
@given(context=st.lists(st.integers(0, 3), min_size=2, max_size=30), index=st.integers(0, len(SHAPES) - 1))
def test_lookup_siblings_follow_the_count_of_their_occurrences(context, index):
    lookup = PromptLookup(max_ngram=2)
    lookup.begin(context, GREEDY)
    tree = lookup.propose_tree(context, SHAPES[index], None)
    starts = lookup._starts(context)
    for node in [ROOT, *range(len(tree))]:
        path = tree.path_tokens(tree.path_to(node)) if node != ROOT else ()
        following = [t for t in starts if tuple(context[t : t + len(path)]) == path and t + len(path) < len(context)]
        counts = [sum(context[t + len(path)] == tree.tokens[child] for t in following) for child in tree.children(node)]
        assert all(counts)  # drafted only where some occurrence continues
        if counts:  # the most recent occurrence's token first, then by count
            assert tree.tokens[tree.children(node)[0]] == context[following[-1] + len(path)]
            assert counts[1:] == sorted(counts[1:], reverse=True)


def test_suffix_index_chain_shape_is_its_chain_and_siblings_by_count():
    suffix = SuffixIndex(max_match=3, min_prob=0)
    context = [5, 6, 7, 5, 6, 8, 5, 6]
    suffix.begin(context, GREEDY)
    for k in range(1, 6):
        assert suffix.propose_tree(context, TreeShape.chain(k), None).tokens == suffix.propose(context, k, None).tokens
    tree = suffix.propose_tree(context, TreeShape.of([(0,), (1,), (0, 0)]), None)
    assert tree == TreeDraft((8, 7, 5), (ROOT, ROOT, 0))  # the docstring's example
    # min_prob drops the rank-1 sibling whose path probability is 1/2 < 0.6 ...
    strict = SuffixIndex(max_match=3, min_prob=0.6)
    strict.begin(context, GREEDY)
    assert strict.propose_tree(context, TreeShape.of([(0,), (1,)]), None).tokens == ()
    # ... and min_count a sibling seen once, keeping the one seen twice.
    twice = SuffixIndex(max_match=1, min_count=2, min_prob=0)
    twice.begin([1, 2, 1, 2, 1, 3, 1], GREEDY)
    assert twice.propose_tree([1, 2, 1, 2, 1, 3, 1], TreeShape.of([(0,), (1,)]), None).tokens == (2,)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("seed", range(4))
def test_head_chain_shape_at_temperature_0_is_the_argmax_chain(kind, seed):
    table = random_table(VOCAB, 2, seed)
    proposer = build(kind, table)
    context = random.Random(seed).choices(range(VOCAB), k=7)
    proposer.begin(context, GREEDY)
    follow(table, context)
    for k in (1, 2, 3):
        chain = proposer.propose(context, k, TorchRandom(0))
        assert proposer.propose_tree(context, TreeShape.chain(k), TorchRandom(0)).tokens == chain.tokens


def eagle_rows_after(proposer: EagleProposer, context: list[int], path: tuple[int, ...]) -> torch.Tensor:
    """The head's logits [N] after `path`, drafted as a chain in a cache of its own (no tree
    mask): what a tree node's children must be ranked by."""
    with torch.inference_mode():
        return _eagle_rows_after(proposer, context, path)


def _eagle_rows_after(proposer: EagleProposer, context: list[int], path: tuple[int, ...]) -> torch.Tensor:
    cache, logits, predicted = proposer._recomputed(context)
    for token in path:
        step_logits, step_predicted = proposer.head(torch.tensor([[token]]), predicted[None, None], cache)
        logits, predicted = step_logits[0, -1], step_predicted[0, -1]
    return logits


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_eagle_children_come_from_the_head_after_their_own_path(temperature, seed):
    """The tree mask keeps branches apart: each node's children are the top tokens (T = 0) or
    draws from q (T > 0, each with that q as its row) of a chain-style head run on that node's
    path alone."""
    table = random_table(VOCAB, 2, seed)
    proposer = build("eagle", table)
    context = random.Random(seed).choices(range(VOCAB), k=6)
    proposer.begin(context, sampling_of(temperature))
    follow(table, context)
    shape = SHAPES[2]
    tree = proposer.propose_tree(context, shape, TorchRandom(seed))
    assert len(tree) == len(shape)  # 4 head tokens, widths <= 2: every node is filled
    assert (tree.q is None) == (temperature == 0)
    for node in [ROOT, *range(len(tree))]:
        children = tree.children(node)
        if not children:
            continue
        path = tree.path_tokens(tree.path_to(node)) if node != ROOT else ()
        logits = eagle_rows_after(proposer, context, path)
        if temperature == 0:
            assert [tree.tokens[child] for child in children] == proposer.vocab.ranked(logits, GREEDY, len(children))
        else:
            for child in children:
                assert torch.allclose(tree.q[child], proposer.vocab.q(logits, proposer.sampling), atol=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_eagle_dynamic_tree_keeps_the_most_confident_nodes(seed):
    """Against a brute-force EAGLE-2: expand the w most confident nodes of each level into
    their top w tokens, keep the n most confident of all (confidence from chain-style head runs
    on each path alone)."""
    table = random_table(VOCAB, 2, seed)
    proposer = build(DYNAMIC, table)
    context = random.Random(seed).choices(range(VOCAB), k=6)
    proposer.begin(context, GREEDY)
    follow(table, context)
    shape = SHAPES[2]  # 8 nodes, depth 4, widest 2
    tree = proposer.propose_tree(context, shape, None)
    d2t = proposer.vocab.d2t.tolist()

    def children(path):
        logits = eagle_rows_after(proposer, context, path)
        log_probs = torch.log_softmax(logits.double(), dim=-1)
        return [(t, float(log_probs[d2t.index(t)])) for t in proposer.vocab.ranked(logits, GREEDY, 2)]

    confidence, made, frontier = {(): 0.0}, [], [()]
    for _ in range(shape.depth):
        level = [((*parent, t), confidence[parent] + lp) for parent in frontier for t, lp in children(parent)]
        confidence.update(level)
        made += [path for path, _ in level]
        frontier = sorted((path for path, _ in level), key=lambda path: -confidence[path])[:2]
    best = sorted(made, key=lambda path: -confidence[path])[: len(shape)]
    drafted = {tree.path_tokens(tree.path_to(node)) for node in range(len(tree))}
    assert len(tree) == len(shape) and drafted == set(best)
    check_in_shape(tree, shape, dynamic=True)


def test_medusa_sampled_tree_draws_each_node_from_its_heads_q():
    table = random_table(VOCAB, 2, 2)
    proposer = build("medusa", table)
    context = [3, 0, 2, 2]
    proposer.begin(context, SamplingParams(temperature=0.8))
    follow(table, context)
    with torch.inference_mode():
        logits = proposer.head(table.features(proposer.taps, len(context) - 2, len(context) - 1))[0]  # [K, N]
    tree = proposer.propose_tree(context, SHAPES[1], TorchRandom(5))
    assert len(tree) == len(SHAPES[1])
    for node in range(len(tree)):
        assert torch.equal(tree.q[node], proposer.vocab.q(logits[tree.depths[node] - 1], proposer.sampling))
    # Siblings are independent draws: the same stream draws the same tree, another may differ.
    assert same_tree(proposer.propose_tree(context, SHAPES[1], TorchRandom(5)), tree)
    assert any(proposer.propose_tree(context, SHAPES[1], TorchRandom(s)).tokens != tree.tokens for s in range(6, 12))


def test_medusa_node_of_depth_d_rank_r_is_head_d_rank_r():
    table = random_table(VOCAB, 2, 3)
    proposer = build("medusa", table)
    context = [1, 4, 2, 0]
    proposer.begin(context, GREEDY)
    follow(table, context)
    logits = proposer.head(table.features(proposer.taps, len(context) - 2, len(context) - 1))[0]  # [K, N]
    ranked = [proposer.head.d2t[torch.sort(row, descending=True, stable=True).indices].tolist() for row in logits]
    shape = TreeShape.of([(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0), (0, 0, 0, 0)])  # depth 4 > K = 3
    tree = proposer.propose_tree(context, shape, None)
    assert tree.depth == 3 and len(tree) == 6
    for node in range(len(tree)):
        depth, rank = tree.depths[node], tree.children(tree.parents[node]).index(node)
        assert tree.tokens[node] == ranked[depth - 1][rank]


def test_copy_or_head_tree_copies_when_lookup_has_a_tree_else_asks_the_head():
    table = random_table(VOCAB, 2, 1)
    proposer = build("lookup+medusa", table)
    shape = SHAPES[1]
    for context, copies in (([1, 2, 3, 1, 2], True), ([0, 1, 2, 3, 4], False)):
        proposer.begin(context, GREEDY)
        follow(table, context)
        tree = proposer.propose_tree(context, shape, None)
        assert len(tree)
        assert (tree == proposer.copy.propose_tree(context, shape, None)) == copies
        assert (tree == proposer.head.propose_tree(context, shape, None)) != copies


def test_short_contexts_and_empty_shapes_draft_empty_trees():
    table = random_table(VOCAB, 2, 0)
    for kind in KINDS:
        proposer = build(kind, table)
        proposer.begin([2], GREEDY)
        follow(table, [2])
        if kind != "suffix":  # a corpus may continue even one token
            assert len(proposer.propose_tree([2], SHAPES[1], None)) == 0
            assert len(proposer.propose_tree_stateless([2], SHAPES[1], None)) == 0
        proposer.begin([2, 2, 2], GREEDY)
        follow(table, [2, 2, 2])
        assert len(proposer.propose_tree([2, 2, 2], TreeShape(()), None)) == 0


def test_the_registry_marks_exactly_these_kinds_as_tree_proposers():
    """The draft model and random tokens fill trees too (tests/test_tree_reference.py covers them),
    lookahead (tests/test_lookahead.py) and the EAGLE-3 head (tests/test_eagle3.py)."""
    expected = (*KINDS, "draft", "random", "lookahead", "eagle3")
    assert sorted(name for name, kind in PROPOSERS.items() if kind.trees) == sorted(expected)


# --- whole requests: engine == reference, greedy identity -------------------------------------


class Shapes(KPolicy):
    """A tree policy for tests: cycles through shapes, with a chain round and a plain round."""

    trees = True

    def __init__(self, shapes: list[TreeShape | int]) -> None:
        self.shapes = shapes
        self.round = 0

    def begin(self) -> None:
        self.round = 0

    def choose(self, stats) -> TreeShape | int:
        self.round += 1
        return self.shapes[(self.round - 1) % len(self.shapes)]


POLICY = [SHAPES[1], SHAPES[2], 2, SHAPES[3], SHAPES[0], 0]


@pytest.mark.parametrize("kind", PROPOSERS_UNDER_TEST)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_equals_reference_with_tree_rounds(kind, temperature):
    for seed in range(6):
        table = random_table(VOCAB, 2, seed, eos_token_id=VOCAB - 1)
        prompt = random.Random(seed).choices(range(VOCAB - 1), k=1 + seed % 4)
        options = dict(max_new_tokens=12, sampling=sampling_of(temperature), eos_token_id=VOCAB - 1)
        ours = generate(table, build(kind, table), prompt, rng=TorchRandom(seed), k=Shapes(POLICY), **options)
        slow = reference_generate(table, build(kind, table), prompt, rng=TorchRandom(seed), k=Shapes(POLICY), **options)
        assert ours.tokens == slow
        assert ours.stats.tree_rounds > 0


@pytest.mark.parametrize("kind", PROPOSERS_UNDER_TEST)
def test_greedy_tree_decoding_equals_plain_greedy_decoding(kind):
    for seed in range(4):
        table = random_table(VOCAB, 2, seed)
        prompt = [seed % VOCAB, 1, 2, 1]
        plain = generate(table, None, prompt, max_new_tokens=16, sampling=GREEDY, k=0)
        tree = generate(table, build(kind, table), prompt, max_new_tokens=16, sampling=GREEDY, k=Shapes(POLICY[:2]))
        assert tree.tokens == plain.tokens
        assert tree.stats.tree_rounds > 0
