"""Tree rounds against the slow reference, and greedy identity.

The engine (tree scoring in one forward, `keep_path`, rollback, the draft model's incremental
cache, EOS pruning, the budget cut) emits exactly the tokens of `reference_generate`, which
recomputes each node's row and each draft row from scratch, for the same random stream: over
random tables, prompts, random tree shapes (a constant shape or one that changes per round),
budgets, EOS ids, temperatures and filters, chosen trees (the draft's top-ranked tokens, and
lookup-like candidates from the context) and sampled ones (the draft model, random tokens).

Greedy identity: at temperature 0 a tree of any shape emits plain greedy decoding's tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import SamplingParams, TorchRandom, generate
from verispec.audit.trees import TopRankedDraft
from verispec.models.tables import random_table
from verispec.policies import KPolicy
from verispec.proposers import DraftModel, RandomTokens
from verispec.reference import reference_generate
from verispec.sampling import GREEDY
from verispec.stats import Stats
from verispec.tree_shape import TreeShape, fill


@st.composite
def shapes(draw, max_nodes: int = 7, max_depth: int = 3) -> TreeShape:
    """A random shape: nodes added one by one as the next-rank child of a random node."""
    paths: list[tuple[int, ...]] = []
    for _ in range(draw(st.integers(1, max_nodes))):
        parents = [()] + [path for path in paths if len(path) < max_depth]
        parent = draw(st.sampled_from(parents))
        rank = sum(1 for path in paths if path[:-1] == parent and len(path) == len(parent) + 1)
        paths.append((*parent, rank))
    return TreeShape.of(paths)


class ShapesInTurn(KPolicy):
    """A policy answering the given shapes round after round (cycling), so one request mixes
    trees of different sizes and depths."""

    trees = True

    def __init__(self, shapes: Sequence[TreeShape]) -> None:
        self.shapes = list(shapes)

    def begin(self) -> None:
        pass

    def choose(self, stats: Stats) -> TreeShape:
        return self.shapes[stats.rounds % len(self.shapes)]


class ContextCandidates:
    """Chosen trees from the context alone, as lookup continuations are: after a path, the
    tokens that followed its last token earlier in the context, most recent first, then the
    rest of the vocabulary in a fixed order (duplicates never: a candidate list is a ranking)."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def begin(self, prompt_ids, sampling) -> None:
        pass

    def commit(self, context) -> None:
        pass

    def propose_tree(self, context, shape, rng):
        def candidates(path):
            ids = [*context, *path]
            seen = [ids[i + 1] for i in range(len(ids) - 2, -1, -1) if ids[i] == ids[-1]]
            ranked = list(dict.fromkeys(seen + [(ids[-1] + j) % self.vocab_size for j in range(self.vocab_size)]))
            return ranked[: 3 - len(path) % 3]  # fewer candidates at some depths: nodes left out

        return fill(shape, candidates)

    propose_tree_stateless = propose_tree


@st.composite
def tree_requests(draw):
    vocab = draw(st.integers(2, 5))
    token = st.integers(0, vocab - 1)
    eos = draw(st.none() | token | st.lists(token, min_size=1, max_size=2))
    first_eos = eos[0] if isinstance(eos, list) else eos
    target = random_table(vocab, draw(st.integers(1, 2)), draw(st.integers(0, 10**6)),
                          zeros=draw(st.booleans()), eos_token_id=first_eos)
    # an order-3 draft sees two tokens before the pending one: a cache off by a token shows
    draft = random_table(vocab, draw(st.integers(1, 3)), draw(st.integers(0, 10**6)), zeros=draw(st.booleans()))
    sampling = SamplingParams(
        temperature=draw(st.sampled_from([0, 1, 0.5, 1.7])),
        top_k=draw(st.none() | st.integers(1, vocab)),
        top_p=draw(st.none() | st.sampled_from([0.3, 0.8, 1.0])),
        min_p=draw(st.none() | st.sampled_from([0.0, 0.1, 0.4])),
    )
    kind = draw(st.sampled_from(["draft", "ranked", "context", "random"]))
    make_proposer = {
        "draft": lambda: DraftModel(draft),
        "ranked": lambda: TopRankedDraft(draft),
        "context": lambda: ContextCandidates(vocab),
        "random": lambda: RandomTokens(vocab),
    }[kind]
    shape_list = draw(st.lists(shapes(), min_size=1, max_size=3))
    verifiers = ["auto", "greedy"] if sampling.greedy else ["auto", "token"] + (["point-mass"] if kind != "draft" else [])
    return dict(
        target=target,
        make_proposer=make_proposer,
        shapes=shape_list,
        prompt=draw(st.lists(token, min_size=1, max_size=8)),
        max_new_tokens=draw(st.integers(0, 10)),
        sampling=sampling,
        eos_token_id=eos,
        verifier=draw(st.sampled_from(verifiers)),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=150, deadline=None)
@given(request=tree_requests())
def test_tree_engine_equals_the_full_recompute_reference(request):
    options = {key: request[key] for key in ("max_new_tokens", "sampling", "eos_token_id", "verifier")}
    target, prompt, seed = request["target"], request["prompt"], request["seed"]
    engine = generate(target, request["make_proposer"](), prompt, k=ShapesInTurn(request["shapes"]), seed=seed,
                      **options)
    reference = reference_generate(target, request["make_proposer"](), prompt, k=ShapesInTurn(request["shapes"]),
                                   rng=TorchRandom(seed), **options)
    assert engine.tokens == reference
    eos = options["eos_token_id"]
    eos_ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    assert len(reference) == options["max_new_tokens"] or reference[-1] in eos_ids
    assert not eos_ids & set(reference[:-1])


@settings(max_examples=40, deadline=None)
@given(shape=shapes(), seed=st.integers(0, 10**6), temperature=st.sampled_from([0, 1]),
       rounds=st.lists(st.tuples(st.booleans(), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=5))
def test_draft_model_trees_follow_the_context(shape, seed, temperature, rounds):
    """Rounds of trees and chains (a tree policy falls back to chains), each emitting part of
    its draft and one more token: every incremental tree equals the stateless one for the same
    draws, and leaves the draft's cache holding the context but its last token."""
    table = random_table(4, 3, seed)
    proposer = DraftModel(table)
    sampling = SamplingParams(temperature=temperature)
    context = [seed % 4]
    proposer.begin(context, sampling)
    for is_tree, n_accepted, next_token in rounds:
        if is_tree:
            tree = proposer.propose_tree(context, shape, TorchRandom(seed))
            assert table.length == len(context) - 1
            again = proposer.propose_tree_stateless(context, shape, TorchRandom(seed))
            assert (tree.tokens, tree.parents) == (again.tokens, again.parents)
            # sampled: every node drawn; chosen: a rank beyond the tokens with mass is left out
            assert len(tree) == len(shape) if temperature else len(tree) <= len(shape)
            assert (tree.q is None) == (temperature == 0)
            path = [tree.children(-1)[0]] if tree.children(-1) else []
            while path and tree.children(path[-1]):
                path.append(tree.children(path[-1])[-1])
            drafted = tree.path_tokens(path)
        else:
            drafted = proposer.propose(context, 3, TorchRandom(seed)).tokens
        context = context + list(drafted[:n_accepted]) + [next_token]
        proposer.commit(context)


@settings(max_examples=60, deadline=None)
@given(shape=shapes(), seed=st.integers(0, 10**6), vocab=st.integers(2, 6), max_new_tokens=st.integers(1, 12),
       kind=st.sampled_from(["draft", "context", "random"]))
def test_greedy_trees_emit_plain_greedy_decoding(shape, seed, vocab, max_new_tokens, kind):
    target = random_table(vocab, 2, seed, eos_token_id=0)
    proposer = {"draft": lambda: DraftModel(random_table(vocab, 2, seed + 1)),
                "context": lambda: ContextCandidates(vocab), "random": lambda: RandomTokens(vocab)}[kind]()
    prompt = [seed % vocab, (seed // vocab) % vocab]
    plain = generate(target, None, prompt, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=0, k=0)
    tree = generate(target, proposer, prompt, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=0,
                    k=ShapesInTurn([shape]))
    assert tree.tokens == plain.tokens
    assert tree.stats.tree_rounds >= 1 or max_new_tokens == 1 or len(plain.tokens) == 1
