"""Token trees on llama.cpp (`LlamaCppLM` as a `TreeScoring`), on the default model's GGUF file,
whose Q4_1/Q8_0 products compute every row alone: each node of a tree, one row of one
`llama_decode` in the sequences of the root-to-leaf paths through it, gets the bits its root path
gets as a chain; `keep_path` leaves the cache and the features exactly as the kept path extended
as a chain would, and gives the borrowed sequences back; a tree wider than the free sequences is
refused and leaves everything as it was; greedy tree decoding (prompt lookup, the EAGLE head,
whose second siblings are accepted) equals plain decoding on llama.cpp, and sampled tree rounds
equal the reference decoder's."""

from __future__ import annotations

import importlib.util
import random

import pytest
import torch
from test_tree_models import SHAPE, FixedShape, ShuffledOracle, first_child_path, path_to, refuse_tree_calls_out_of_order

from verispec.drafts import ROOT
from verispec.engine import generate
from verispec.models import DEFAULT_MODEL
from verispec.models.base import FINAL, TreeScoring
from verispec.models.runtimes.llamacpp import INSTALL
from verispec.proposers import PromptLookup
from verispec.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)
TAPS = [FINAL, 2]
PROMPT_LENGTHS = (3, 40, 120)

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason=f"needs llama-cpp-python: {INSTALL}"
)


def new_lm(taps=(), sequences: int = 16, matrices: set[str] | None = None, threads: int = 1):
    from verispec.models.loading.sources import locate
    from verispec.models.runtimes.llamacpp import LlamaCppLM

    lm = LlamaCppLM(locate(DEFAULT_MODEL), n_ctx=1024, n_threads=threads, sequences=sequences, matrices=matrices)
    if taps:
        lm.record_features(taps)
    return lm


@pytest.fixture(scope="module")
def lm():
    return new_lm()


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    return [rng.randrange(vocab) for _ in range(n)], [rng.randint(ROOT, i - 1) for i in range(n)]


@pytest.mark.parametrize("matrices", [None, {"Q4_K"}])
def test_tree_rows_are_their_paths_chain_rows_bit_for_bit(lm, matrices):
    """Every node's row equals its root path's last row as a chain; with a K-quant's pieces
    (`widest_piece` 3: told the file has Q4_K matrices) a tree is decoded in forwards of 2 or 3
    rows, whose later ones' nodes see their ancestors in the earlier ones' cells."""
    if matrices is not None:
        lm = new_lm(matrices=matrices)
        assert lm._shared.widest == 3
    assert isinstance(lm, TreeScoring)
    rng = random.Random(0)
    trees = [random_tree(rng, n, lm.vocab_size) for n in (1, 10, 6)]
    trees.append(([11, 12, 13, 14, 15, 16], [ROOT, ROOT, 0, 0, 1, 4]))  # two roots, a node of two paths' sequences
    for length, (tokens, parents) in zip((*PROMPT_LENGTHS, 60), trees):
        prompt = [rng.randrange(lm.vocab_size) for _ in range(length)]
        lm.prefill(prompt)
        tree = lm.extend_tree(tokens, parents)  # [n, V]
        assert tree.shape == (len(tokens), lm.vocab_size) and tree.dtype == torch.float32
        assert lm.length == length + len(tokens)
        for node in range(len(tokens)):
            lm.rollback(length)
            assert torch.equal(tree[node], lm.extend([tokens[i] for i in path_to(parents, node)])[-1]), (length, node)


def test_keep_path_leaves_the_cache_and_features_of_the_path_as_a_chain():
    """Rounds of a tree and a kept root path (the first-child path, in its chain's cells;
    another, whose nodes past the first-child path's are owed to the next forward, here a tree's;
    none; one rolled back into its owed nodes) against the same paths extended as a chain: the
    same cache bits, the same features, every sequence back."""
    lm, chain = new_lm(TAPS), new_lm(TAPS)
    free = len(lm._shared.free)
    rng = random.Random(1)
    for length in PROMPT_LENGTHS:
        prompt = [rng.randrange(lm.vocab_size) for _ in range(length)]
        lm.prefill(prompt)
        chain.prefill(prompt)
        for round_ in range(3):
            tokens, parents = random_tree(rng, rng.randint(2, 9), lm.vocab_size)
            off = sorted(set(range(len(tokens))) - first_child_path(parents)) or [0]
            leaf = max(first_child_path(parents)) if round_ == 0 else rng.choice(off)
            path = path_to(parents, leaf) if round_ < 2 else []
            lm.extend_tree(tokens, parents)
            assert len(lm._shared.free) < free or len(first_child_path(parents)) == len(tokens)
            lm.keep_path(path)
            assert len(lm._shared.free) == free
            if path:
                chain.extend([tokens[i] for i in path])
        lm.extend_tree([5, 6, 7], [ROOT, ROOT, 1])
        lm.keep_path([1, 2])  # both off the first-child path: owed to the next forward
        lm.rollback(lm.length - 1)  # one of them dropped before it was decoded
        chain.extend([6])
        assert lm.length == chain.length
        assert torch.equal(lm.features(TAPS, 0, lm.length), chain.features(TAPS, 0, chain.length))
        after = [rng.randrange(lm.vocab_size) for _ in range(3)]
        assert torch.equal(lm.extend(after), chain.extend(after)), length


def test_past_256_positions_on_two_threads_a_lone_row_is_padded_in_trees_too():
    """Two threads past `LONE_ROW_CELLS` cached positions: a one-node tree takes the padded
    two-row forward a chain's lone token takes, and a kept node owed to the next forward is
    decoded in front of its rows."""
    lm = new_lm(threads=2)
    prompt = list(range(1000, 1270))
    lm.prefill(prompt)
    assert lm._shared.pads_a_lone_row(lm.length)
    chain = [lm.extend([7]), lm.extend([9]), lm.extend([11, 12])]
    lm.rollback(len(prompt))
    assert torch.equal(lm.extend_tree([7], [ROOT]), chain[0])
    lm.keep_path([0])
    lm.extend_tree([8, 9, 10], [ROOT, ROOT, 1])
    lm.keep_path([1])  # node 1 is not on the first-child path: owed
    assert torch.equal(lm.extend([11, 12]), chain[2])


def test_tree_calls_out_of_order_are_refused_and_leave_the_cache_intact(lm):
    chain = new_lm()
    free = len(lm._shared.free)
    refuse_tree_calls_out_of_order(lm, lm.vocab_size, lambda: lm.extend_slots([lm], [[9]]))
    chain.prefill([3, 4, 5])
    assert torch.equal(lm.extend([9]), chain.extend([7, 8, 9])[-1:])
    lm.extend_tree([6, 7], [ROOT, ROOT])
    lm.rollback(4)  # back to before the tree: the tree and its sequences are given back
    assert len(lm._shared.free) == free
    chain.rollback(4)
    assert torch.equal(lm.extend([9]), chain.extend([9]))


def test_a_tree_wider_than_the_free_sequences_is_refused_and_slots_still_work():
    lm = new_lm(sequences=3)
    slot = lm.new_slot()  # one sequence left besides the two taken
    ids = list(range(100, 140))
    lm.prefill(ids[:20])
    slot.prefill(ids[:7])
    wide = ([50, 51, 52, 53], [ROOT, 0, 0, ROOT])  # three leaves: three sequences
    with pytest.raises(ValueError, match="a token tree of 3 leaves needs 3 llama.cpp sequences .* 2 are free"):
        lm.extend_tree(*wide)
    assert lm.length == 20 and lm._shared.free == [2]
    rows = lm.extend_tree([50, 51, 52], [ROOT, 0, 0])  # two leaves
    assert lm._shared.free == []
    lm.keep_path([0, 2])
    assert lm._shared.free == [2]
    alone = new_lm()
    alone.prefill(ids[:7])
    got = lm.extend_slots([lm, slot], [[60, 61], ids[7:10]])  # lm's owed node 2 first
    torch.testing.assert_close(got[1], alone.extend(ids[7:10]), atol=1e-3, rtol=0)  # cells of two sequences: rounding
    alone.prefill(ids[:20])
    chain = alone.extend([50, 52, 60, 61])
    torch.testing.assert_close(rows[[0, 2]], chain[:2], atol=1e-3, rtol=0)
    torch.testing.assert_close(got[0], chain[2:], atol=1e-3, rtol=0)
    del slot
    lm.extend_tree(*wide)
    assert lm._shared.free == []
    lm.rollback(20)
    assert sorted(lm._shared.free) == [1, 2]


def test_reserved_slots_hold_a_tree_round_each():
    """The scheduler's slots score their trees in the same step, each before its keep_path:
    `reserve_slots` holds a `--k tree` round's sequences for every slot (up to llama.cpp's 256)."""
    from verispec.models.runtimes.llamacpp import MAX_SEQUENCES, TREE_SEQUENCES

    lm = new_lm()
    lm.reserve_slots(3)
    assert lm._shared.sequences == 4 * TREE_SEQUENCES
    slots = [lm.new_slot() for _ in range(3)]
    widest = [ROOT] + [0] * (TREE_SEQUENCES - 1)  # the pending token and 15 leaves under it, plus one more root
    for i, slot in enumerate(slots):
        slot.prefill(list(range(50 + i, 60 + i)))
        slot.extend_tree(list(range(200, 200 + TREE_SEQUENCES)) + [300], widest + [ROOT])
    for slot in slots:
        slot.keep_path([0, 1])
    assert len(lm._shared.free) == 4 * TREE_SEQUENCES - 4
    lm.reserve_slots(100)
    assert lm._shared.sequences == MAX_SEQUENCES


def test_reserved_slots_hold_a_request_context_each():
    """n_ctx is one request's positions: the cache holds that many for every reserved slot, so
    slots whose prompts fill most of n_ctx each decode together (a cache of n_ctx in all held
    barely one), and what outgrows the cache is refused, naming its size."""
    lm = new_lm()
    lm.reserve_slots(2)
    slots = [lm, lm.new_slot(), lm.new_slot()]
    for i, slot in enumerate(slots):
        slot.prefill([50 + i + j % 300 for j in range(lm.n_ctx - 100)])
    rows = lm.extend_slots(slots, [[7], [8, 9], [10]])
    assert [tuple(r.shape) for r in rows] == [(1, lm.vocab_size), (2, lm.vocab_size), (1, lm.vocab_size)]
    assert lm.n_ctx == 1024 and lm._shared.n_ctx == 3 * 1024
    with pytest.raises(ValueError, match="exceed the llama.cpp cache of 3072 positions"):
        slots[1].extend(list(range(400)))


PROMPTS = [
    "Repeat this list exactly, twice: alpha, bravo, charlie, delta, echo, foxtrot, golf, hotel.",
    "Write a Python function that returns the n-th Fibonacci number.",
]


def test_greedy_tree_decoding_is_plain_decoding():
    from verispec.models.loading.load import load_model
    from verispec.registry import build_proposer

    loaded = load_model(DEFAULT_MODEL, runtime="llamacpp")
    lm = loaded.lm
    eagle = build_proposer("eagle", loaded)
    moved = 0
    for text in PROMPTS:
        ids = loaded.encode(text, chat=True)
        plain = generate(lm, None, ids, max_new_tokens=24, k=0, sampling=GREEDY).tokens
        for proposer in (PromptLookup(), eagle):
            run = generate(lm, proposer, ids, max_new_tokens=24, k=FixedShape(SHAPE), sampling=GREEDY)
            assert run.tokens == plain, (text, type(proposer).__name__)
            assert run.stats.tree_rounds > 0
            moved += any(len(ranks) > 1 and ranks[1] for ranks in run.stats.rank_accepts)
    assert moved  # the head's second siblings were accepted: keep_path decoded nodes again


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_with_trees_equals_the_reference_decoder(lm, temperature):
    """Sampled and greedy tree rounds (second siblings accepted, so kept nodes are owed) against
    the reference decoder, which recomputes every row with `score`: equal where the prompt is at
    most 3 tokens (llama.cpp decodes a longer prompt in one forward of its own rounding)."""
    from verispec.randomness import TorchRandom
    from verispec.reference import reference_generate

    options = dict(max_new_tokens=10, sampling=SamplingParams(temperature=temperature), k=FixedShape(SHAPE))
    for seed, prompt in enumerate(([5, 9, 14], [17])):
        engine = generate(lm, ShuffledOracle(lm), prompt, rng=TorchRandom(seed), **options)
        assert engine.tokens == reference_generate(lm, ShuffledOracle(lm), prompt, rng=TorchRandom(seed), **options)
        assert engine.stats.tree_rounds > 0
