"""Lookahead decoding (`verispec.proposers.lookahead`): the Jacobi update, the n-grams along the
diagonals, the window's shift after commit, the trie's distinct siblings, the incremental state
against its recomputation from the observation log, the engine against the full-recompute
reference (which observes its own recomputed rows), greedy identity on tiny Llamas (the fast
runtime and the HF adapter), and the CLI.

Exactness at temperature > 0 is the exhaustive audit's (lookahead is a registered, audited
tree proposer: chain and tree configurations on rational tables, T = 1 and 0.5, EOS, budgets);
its drafts are chosen (q None), so the statistical test, which is there for sampled trees, adds
nothing the audit does not enumerate exactly.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_hf_adapter import tiny_llama
from test_tree_reference import ShapesInTurn, shapes
from transformers.utils import logging as hf_logging

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.bench.quick import tiny_llama as quick_llama
from verispec.bench.quick import tiny_tokenizer
from verispec.cli import main
from verispec.clocks import TickClock
from verispec.cost import FixedCosts
from verispec.drafts import ROOT, Draft, TreeDraft
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.tables import random_table
from verispec.policies import AutoK
from verispec.proposers import PromptLookup
from verispec.proposers.base import ObservingProposer
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.lookahead import LookaheadProposer, Observation, diagonal_ngrams, first_child_path
from verispec.reference import reference_generate
from verispec.registry import build_proposer
from verispec.tree_shape import TreeShape

V = 10


def one_hot_rows(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """logits[len(tokens), vocab] whose argmax in row i is tokens[i]."""
    rows = torch.zeros(len(tokens), vocab)
    rows[range(len(tokens)), tokens] = 1.0
    return rows


def started(prompt: list[int], **options) -> LookaheadProposer:
    proposer = LookaheadProposer(**options)
    proposer.begin(prompt, GREEDY)
    return proposer


# ---- the pieces -----------------------------------------------------------------------------


def test_the_first_window_copies_the_text_w_tokens_back():
    assert started([1, 2, 3, 4, 5, 6], window=4).guesses == (3, 4, 5, 6)
    assert started([7, 8], window=4).guesses == (7, 7, 7, 8)  # context[max(p - W, 0)]


def test_a_jacobi_step_sets_each_guess_to_the_argmax_after_the_one_before():
    proposer = started([1, 2, 3], window=3, ngram=3)
    draft = proposer.propose([1, 2, 3], 3, TorchRandom(0))
    assert draft.tokens == (1, 2, 3)  # no n-grams yet: the window
    proposer.observe([1, 2, 3], draft, one_hot_rows([5, 6, 7, 8]))
    # rows after the pending 3, then after the guesses 1, 2, 3 at positions 3, 4, 5: new guesses
    # for positions 3, 4, 5 (the one for 6 lies beyond the window)
    assert proposer.guesses == (5, 6, 7)
    assert proposer._log == [Observation(2, (3, 1, 2, 3), (5, 6, 7, 8))]


def test_a_tree_observes_its_first_child_path_only():
    tree = TreeDraft(tokens=(4, 9, 5, 8, 6), parents=(ROOT, ROOT, 0, 0, 2))
    assert first_child_path(tree) == [0, 2, 4] and first_child_path(Draft((1, 2))) == [0, 1]
    proposer = started([1, 2, 3], window=4)
    # rows: 0 after the pending token, i + 1 after node i; nodes 1 and 3 are siblings off the path
    proposer.observe([1, 2, 3], tree, one_hot_rows([4, 5, 0, 6, 0, 7]))
    assert proposer._log[-1] == Observation(2, (3, 4, 5, 6), (4, 5, 6, 7)) and proposer.guesses == (4, 5, 6, 7)


def test_ngrams_follow_the_diagonals_of_successive_levels():
    first, second = Observation(9, (7, 4), (5, 6)), Observation(10, (5, 6), (8, 9))
    assert diagonal_ngrams([first, second], 3) == [(7, 5, 8), (4, 6, 9)]
    assert diagonal_ngrams([first, second], 2) == [(5, 8), (6, 9)]  # the last level's own links
    assert diagonal_ngrams([second], 3) == []  # too few levels
    # round 2 fed 9 at 11 where round 1 guessed 6: that diagonal is broken
    assert diagonal_ngrams([first, Observation(10, (5, 9), (8, 9))], 3) == [(7, 5, 8)]
    # round 1 guessed 5 at 10 but 2 was emitted there: no n-gram runs through it
    assert diagonal_ngrams([first, Observation(10, (2, 6), (8, 9))], 3) == [(4, 6, 9)]
    third = Observation(11, (8, 9), (3, 4))
    assert diagonal_ngrams([first, second, third], 4) == [(7, 5, 8, 3), (4, 6, 9, 4)]


def test_two_rounds_collect_the_ngrams_of_the_worked_example():
    """The module docstring's example: N = 3 collects 7 5 8 and 4 6 9 over two rounds."""
    context = [0] * 9 + [7]  # the pending 7 at position 9
    proposer = started(context, window=2, ngram=3, pool=2)
    proposer.observe(context, Draft((4,)), one_hot_rows([5, 6]))
    assert proposer.guesses == (5, 6)
    context = context + [5]
    proposer.commit(context)
    assert proposer.guesses == (6, 5)  # position 12 enters with context[12 - 2]
    proposer.observe(context, Draft((6,)), one_hot_rows([8, 9]))
    assert proposer.continuations(7) == [(5, 8)] and proposer.continuations(4) == [(6, 9)]
    assert proposer.guesses == (8, 9)
    assert proposer.propose([*context, 7], 4, TorchRandom(0)).tokens == (5, 8)  # the pool's before the window


def test_commit_shifts_the_window_to_the_emitted_prefix():
    proposer = started([1, 2, 3], window=3)
    proposer.observe([1, 2, 3], Draft((1, 2)), one_hot_rows([5, 6, 7]))
    assert proposer.guesses == (5, 6, 7)
    proposer.commit([1, 2, 3, 5])  # position 3 emitted: its guess drops, position 6 enters
    assert proposer.guesses == (6, 7, 5)  # context[6 - 3]
    proposer.commit([1, 2, 3, 5, 6, 8, 4, 2])  # past the whole window
    assert proposer.guesses == (8, 4, 2)


def test_the_pool_keeps_the_g_most_recent_distinct_continuations():
    proposer = started([0], ngram=2, pool=2)
    for gram in [(1, 2), (1, 3), (1, 2), (1, 4), (1, 3)]:
        proposer._collect(gram)
    assert proposer.continuations(1) == [(3,), (4,)]
    assert started([0], ngram=2, pool=0).continuations(1) == []


def test_the_trie_has_distinct_siblings_window_first():
    proposer = started([1, 2], window=3, ngram=3, pool=3)
    proposer._guesses = [4, 5, 6]
    for gram in [(2, 4, 9), (2, 7, 1), (2, 4, 5)]:
        proposer._collect(gram)
    assert proposer.continuations(2) == [(4, 5), (7, 1), (4, 9)]
    shape = TreeShape.of([(0,), (1,), (2,), (0, 0), (0, 1), (0, 2), (1, 0), (0, 0, 0)])
    tree = proposer.propose_tree([1, 2], shape, TorchRandom(0))
    # root: 4 (window, and twice in the pool), 7; after 4: 5 (window and pool), 9; after 4 5: 6
    assert tree.tokens == (4, 7, 5, 9, 1, 6) and tree.parents == (ROOT, ROOT, 0, 0, 1, 2)
    assert tree.q is None


def test_options_are_checked():
    for options, says in [({"window": 0}, "window W"), ({"ngram": 1}, "n-gram size N"), ({"pool": -1}, "pool width G")]:
        with pytest.raises(ValueError, match=says):
            LookaheadProposer(**options)
    assert isinstance(LookaheadProposer(), ObservingProposer)


# ---- the incremental state against its recomputation ------------------------------------------


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), window=st.integers(1, 5), ngram=st.integers(2, 4), pool=st.integers(0, 3),
       rounds=st.lists(st.tuples(shapes(), st.integers(0, 4), st.booleans()), min_size=1, max_size=8))
def test_incremental_drafts_equal_the_recomputed_ones(seed, window, ngram, pool, rounds):
    """Random rounds (a tree or a chain; random rows; a random number of emitted tokens): the
    window and pool updated round by round give the drafts recomputed from the log."""
    rng = random.Random(seed)
    context = [rng.randrange(4) for _ in range(rng.randrange(1, 6))]
    proposer = started(context, window=window, ngram=ngram, pool=pool)
    for shape, emitted, is_tree in rounds:
        tree = proposer.propose_tree(context, shape, TorchRandom(0))
        assert tree == proposer.propose_tree_stateless(context, shape, TorchRandom(0))
        chain = proposer.propose(context, len(shape), TorchRandom(0))
        assert chain == proposer.propose_stateless(context, len(shape), TorchRandom(0))
        draft = tree if is_tree else chain
        proposer.observe(context, draft, one_hot_rows([rng.randrange(4) for _ in range(len(draft) + 1)], 4))
        context = context + [rng.randrange(4) for _ in range(emitted + 1)]
        proposer.commit(context)


# ---- the engine -------------------------------------------------------------------------------


class RowsSeen:
    """An observing proposer that drafts the context's last tokens and records every
    observation (context length, draft tokens, the rows' argmax and shape)."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []

    def begin(self, prompt_ids, sampling) -> None:
        self.seen = []

    def commit(self, context) -> None:
        pass

    def propose(self, context, k, rng):
        return Draft(tuple(context[-k:]))

    propose_stateless = propose

    def observe(self, context, draft, logits) -> None:
        self.seen.append((len(context), draft.tokens, logits.argmax(-1).tolist(), tuple(logits.shape)))


def test_engine_and_reference_observe_the_same_rows_every_round():
    target = random_table(4, 2, 3)
    options = dict(max_new_tokens=9, sampling=SamplingParams(temperature=1.0))
    engine, reference = RowsSeen(), RowsSeen()
    generation = generate(target, engine, [1, 2, 3], seed=5, k=AutoK(FixedCosts(c=0.4, v=[1, 1.5, 2, 3])), **options)
    reference_generate(target, reference, [1, 2, 3], rng=TorchRandom(5), k=AutoK(FixedCosts(c=0.4, v=[1, 1.5, 2, 3])),
                       **options)
    assert engine.seen == reference.seen and len(engine.seen) == generation.stats.rounds
    assert all(shape == (len(tokens) + 1, 4) for _, tokens, _, shape in engine.seen)
    assert any(not tokens for _, tokens, _, _ in engine.seen)  # plain steps observe their one row too


def test_copy_or_head_passes_the_rows_to_a_sub_proposer_that_observes():
    lookahead = LookaheadProposer(window=3)
    generation = generate(random_table(4, 2, 1), CopyOrHead(PromptLookup(min_ngram=2), lookahead), [1, 2, 3, 1],
                          max_new_tokens=8, sampling=GREEDY, k=3)
    assert len(lookahead._log) == generation.stats.rounds


@st.composite
def requests(draw):
    vocab = draw(st.integers(2, 5))
    token = st.integers(0, vocab - 1)
    eos = draw(st.none() | token)
    target = random_table(vocab, draw(st.integers(1, 2)), draw(st.integers(0, 10**6)), zeros=draw(st.booleans()),
                          eos_token_id=eos)
    sampling = SamplingParams(temperature=draw(st.sampled_from([0, 1, 0.5])),
                              top_k=draw(st.none() | st.integers(1, vocab)))
    options = draw(st.fixed_dictionaries({"window": st.integers(1, 5), "ngram": st.integers(2, 4),
                                          "pool": st.integers(0, 3)}))
    policy = draw(st.sampled_from(["trees", "chain", "auto"]))
    shape_list = draw(st.lists(shapes(), min_size=1, max_size=3))
    k = draw(st.integers(1, 5))
    make_k = {
        "trees": lambda: ShapesInTurn(shape_list),
        "chain": lambda: k,
        # learns c from the rounds' drafting (and observing) seconds on a tick clock
        "auto": lambda: AutoK(FixedCosts(c=0.1, v=[1.0] * (k + 1), step_seconds=0.001), probe_every=1),
    }[policy]
    verifiers = ["auto", "greedy"] if sampling.greedy else ["auto", "point-mass", "token"]
    if not sampling.greedy and policy != "trees":
        verifiers.append("block")  # a chain rule: it refuses trees
    return dict(target=target, options=options, make_k=make_k, prompt=draw(st.lists(token, min_size=1, max_size=8)),
                max_new_tokens=draw(st.integers(0, 14)), sampling=sampling, eos_token_id=eos,
                verifier=draw(st.sampled_from(verifiers)), seed=draw(st.integers(0, 2**31 - 1)))


@settings(max_examples=150, deadline=None)
@given(request=requests())
def test_engine_equals_the_full_recompute_reference(request):
    options = {key: request[key] for key in ("max_new_tokens", "sampling", "eos_token_id", "verifier")}
    target, prompt, seed = request["target"], request["prompt"], request["seed"]
    engine = generate(target, LookaheadProposer(**request["options"]), prompt, k=request["make_k"](), seed=seed,
                      clock=TickClock(), **options)
    reference = reference_generate(target, LookaheadProposer(**request["options"]), prompt, k=request["make_k"](),
                                   rng=TorchRandom(seed), clock=TickClock(), **options)
    assert engine.tokens == reference


def test_a_drifting_window_is_caught_by_the_reference(monkeypatch):
    """Negative control: a commit that shifts the window one position too far makes the
    engine's drafts differ from the recomputed ones, and the outputs part (under point-mass
    verification: under the coupled rule the drafts move the acceptance, never a token)."""
    target, prompt = random_table(4, 2, 7, zeros=False), [1, 2, 3, 1, 2]
    options = dict(max_new_tokens=20, sampling=SamplingParams(temperature=1.0), k=3, verifier="point-mass")
    shifted = LookaheadProposer.commit

    def drifting(self, context):
        shifted(self, [*context, 0])

    def differ() -> bool:
        return any(
            generate(target, LookaheadProposer(3, 3, 2), prompt, seed=seed, **options).tokens
            != reference_generate(target, LookaheadProposer(3, 3, 2), prompt, rng=TorchRandom(seed), **options)
            for seed in range(10)
        )

    assert not differ()
    monkeypatch.setattr(LookaheadProposer, "commit", drifting)
    assert differ()


@settings(max_examples=60, deadline=None)
@given(shape=shapes(), seed=st.integers(0, 10**6), vocab=st.integers(2, 6), max_new_tokens=st.integers(1, 16),
       k=st.integers(1, 5), trees=st.booleans())
def test_greedy_lookahead_is_plain_greedy_decoding_on_tables(shape, seed, vocab, max_new_tokens, k, trees):
    target = random_table(vocab, 2, seed, eos_token_id=0)
    prompt = [seed % vocab, (seed // vocab) % vocab]
    plain = generate(target, None, prompt, max_new_tokens=max_new_tokens, sampling=GREEDY, eos_token_id=0, k=0)
    policy = ShapesInTurn([shape]) if trees else k
    run = generate(target, LookaheadProposer(3, 3, 2), prompt, max_new_tokens=max_new_tokens, sampling=GREEDY,
                   eos_token_id=0, k=policy)
    assert run.tokens == plain.tokens


@pytest.mark.parametrize("kind", ["fast", "hf"])
def test_greedy_lookahead_is_plain_greedy_decoding_on_a_tiny_llama(kind):
    torch.set_num_threads(1)
    model = tiny_llama(0)
    lm = HFCausalLM(model) if kind == "hf" else LlamaRuntime.from_hf(model)
    shape = TreeShape.of([(0,), (1,), (2,), (0, 0), (1, 0), (0, 0, 0)])
    accepted = 0
    for prompt in ([5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41, 42]):
        plain = generate(lm, None, prompt, max_new_tokens=30, sampling=GREEDY, k=0)
        for policy in (4, ShapesInTurn([shape])):
            run = generate(lm, LookaheadProposer(), prompt, max_new_tokens=30, sampling=GREEDY, k=policy)
            assert run.tokens == plain.tokens
            accepted += sum(run.stats.accepted)
    assert accepted > 0  # some drafts were accepted, so the rounds did more than plain steps


# ---- the CLI ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("lookahead") / "target"
    tokenizer = tiny_tokenizer()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        quick_llama(len(tokenizer)).save_pretrained(root)
        tokenizer.save_pretrained(root)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return root


@pytest.mark.parametrize("k", ["4", "auto", "tree", "tree:2x2x1"])
def test_generate_runs_lookahead_at_every_kind_of_k(capsys, checkpoint, k):
    argv = ["generate", "--model", str(checkpoint), "--proposer", "lookahead:W=4:N=3", "--k", k,
            "--max-new-tokens", "12", "--no-chat", "--dtype", "float32", "abcabcabc"]
    assert main(argv) == 0, capsys.readouterr().err


@pytest.mark.parametrize("spec, says", [
    ("lookahead:W=0", "lookahead's window W must be an integer >= 1, got 0"),
    ("lookahead:K=3", "lookahead options are W=window, N=n-gram size and G=pool width"),
    ("lookahead:N=two", "lookahead option N needs an integer, got 'two'"),
    ("lookahead:G=1:G=2", "lookahead option G is given twice"),
])
def test_a_bad_option_is_one_error_line(capsys, checkpoint, spec, says):
    assert main(["generate", "--model", str(checkpoint), "--proposer", spec, "--no-chat", "abc"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip()] and err.startswith("error: ")
    assert says in err


def test_the_spec_builds_the_options():
    proposer = build_proposer("lookahead:G=2:W=7", None)
    assert (proposer.window, proposer.ngram, proposer.pool) == (7, 4, 2)
