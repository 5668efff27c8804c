"""Tree scoring (`TreeScoring`) on real models: the HF adapter, the fast runtime and the static
runtime (its eager path: the fixed-shape forward with a tree's ancestry in its mask).

One forward over a token tree must give each node the logits `extend` gives its root path
(float32: within FP32_ATOL, the cached-forward tolerance of tests/test_hf_adapter.py; the
deterministic fast runtime: bit for bit where the attention guarantees it, see
`models.attention`: every node with `RowAttention` (float32), the first-child chain with
`InvariantAttention` (bfloat16); the deterministic static runtime: the first-child chain, whose
rows see what a chain's see in one fixed shape), and `keep_path` must leave the cache, and the
features, exactly as if the kept path had been extended as a chain, copying only the kept
nodes not yet in their slots. The engine on these models equals the reference decoder with a
chosen tree proposer, and greedy tree decoding equals plain greedy decoding.
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest
import torch
from clocks import FakeClock
from test_hf_adapter import FP32_ATOL, VOCAB, tiny_llama
from test_profile import TimedTable
from torch.utils._python_dispatch import TorchDispatchMode

from verispec import GREEDY, SamplingParams, generate
from verispec.drafts import ROOT
from verispec.models.attention import RowAttention
from verispec.models.base import FINAL, TreeScoring
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.formats.quantized import quantized_model
from verispec.models.scored_tree import ScoredTree
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.policies import KPolicy
from verispec.profile import Profile, measure_profile, representative_tree
from verispec.proposers import PromptLookup
from verispec.randomness import TorchRandom
from verispec.reference import reference_generate
from verispec.tree_shape import TreeShape, fill

# bfloat16 logits of magnitude ~3 round to steps of 2^-6; a path scored as a tree or a chain
# goes through two layers whose sums may round differently (measured worst 0.016 on SDPA).
BF16_ATOL = 0.1
KINDS = ["hf", "fast", "fast-deterministic", "static", "static-deterministic"]
QUANTIZED_KINDS = ["hf-q4", "fast-q4"]  # q4 weights: the quantized transformers copy, the fast runtime's


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def build(kind: str, dtype: torch.dtype = torch.float32, seed: int = 0):
    model = tiny_llama(seed).to(dtype)
    if kind == "hf":
        return HFCausalLM(model)
    if kind == "hf-q4":
        return HFCausalLM(quantized_model(model, "q4"))
    if kind == "fast-q4":
        return LlamaRuntime.from_hf(model, weight_format="q4")
    if kind.startswith("static"):  # 16 rows: the largest tree here (12 nodes) in one forward
        return StaticLlama.from_hf(model, deterministic=kind == "static-deterministic", rows=16, context=128)
    return LlamaRuntime.from_hf(model, deterministic=kind == "fast-deterministic")


def path_to(parents: list[int], node: int) -> list[int]:
    path = []
    while node != ROOT:
        path.append(node)
        node = parents[node]
    return path[::-1]


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    parents = [rng.randint(ROOT, i - 1) for i in range(n)]
    return [rng.randrange(VOCAB) for _ in range(n)], parents


def first_child_path(parents: list[int]) -> set[int]:
    """The first root, its first child, that one's first child, ...: the fast runtime lays
    trees out depth first, so these sit in a chain's slots, whatever the caller's order."""
    path, node = set(), parents.index(ROOT)
    while node is not None:
        path.add(node)
        node = next((child for child, parent in enumerate(parents) if parent == node), None)
    return path


def test_scored_tree_positions_mask_and_moves() -> None:
    tree = ScoredTree(start=3, parents=(ROOT, 0, 0, 1, ROOT, 4))
    assert tree.positions().tolist() == [3, 4, 4, 5, 3, 4]
    assert tree.visible().int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [0, 0, 0, 0, 1, 0],
        [0, 0, 0, 0, 1, 1],
    ]
    assert tree.allowed()[:, :3].all() and tree.allowed().shape == (6, 9)
    assert tree.moves([0, 1]) == ([], [])  # the first-child chain is in place
    assert tree.moves([0, 1, 3]) == ([6], [5])
    assert tree.moves([0, 2]) == ([5], [4])
    assert tree.moves([4, 5]) == ([7, 8], [3, 4])
    assert tree.moves([]) == ([], [])
    with pytest.raises(ValueError, match="not a root path"):
        tree.moves([0, 3])


@pytest.mark.parametrize("kind", KINDS + QUANTIZED_KINDS)
@pytest.mark.parametrize("seed", range(3))
def test_tree_rows_equal_their_paths_extended_as_chains(kind: str, seed: int) -> None:
    check_rows_against_paths(build(kind), kind, random.Random(seed), trees=4, sizes=(1, 12), atol=FP32_ATOL)


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_tree_rows_equal_their_paths_within_rounding(kind: str) -> None:
    check_rows_against_paths(build(kind, torch.bfloat16), kind, random.Random(5), trees=3, sizes=(10, 10), atol=BF16_ATOL)


def by_rows(lm) -> bool:
    """Whether every row of `lm` attends alone (`RowAttention`), so every tree node's row is its
    chain's bits, not only the first-child chain's."""
    return isinstance(getattr(lm, "attention", None), RowAttention)


def check_rows_against_paths(lm, kind: str, rng: random.Random, *, trees: int, sizes: tuple[int, int], atol: float) -> None:
    """`trees` random trees of sizes[0]..sizes[1] nodes after random prompts: each node's row
    [V] (float32) equals its root path extended as a chain within `atol`, and bit for bit on a
    deterministic runtime's first-child path (every node with row attention)."""
    for _ in range(trees):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 80))]
        tokens, parents = random_tree(rng, rng.randint(*sizes))
        lm.prefill(prompt)
        tree = lm.extend_tree(tokens, parents)  # [n, V]
        assert tree.shape == (len(tokens), VOCAB) and tree.dtype == torch.float32
        assert lm.length == len(prompt) + len(tokens)
        for node in range(len(tokens)):
            lm.rollback(len(prompt))
            chain = lm.extend([tokens[i] for i in path_to(parents, node)])[-1]
            if kind.endswith("-deterministic") and (node in first_child_path(parents) or by_rows(lm)):
                assert torch.equal(tree[node], chain)
            else:
                torch.testing.assert_close(tree[node], chain, atol=atol, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_keep_path_then_extend_equals_a_fresh_prefill_of_the_path(kind: str, dtype: torch.dtype) -> None:
    lm = build(kind, dtype)
    rng = random.Random(2)
    atol = FP32_ATOL if dtype == torch.float32 else BF16_ATOL
    for _ in range(5):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 70))]
        tokens, parents = random_tree(rng, rng.randint(1, 12))
        path = path_to(parents, rng.randrange(len(tokens)))
        after = [rng.randrange(VOCAB) for _ in range(3)]
        lm.prefill(prompt)
        lm.extend_tree(tokens, parents)
        lm.keep_path(path)
        assert lm.length == len(prompt) + len(path)
        kept = lm.extend(after)
        lm.prefill(prompt + [tokens[i] for i in path])
        fresh = lm.extend(after)
        if kind.endswith("-deterministic") and (set(path) <= first_child_path(parents) or by_rows(lm)):
            assert torch.equal(kept, fresh)
        else:
            torch.testing.assert_close(kept, fresh, atol=atol, rtol=0)


@pytest.mark.parametrize("kind", KINDS)
def test_features_after_keep_path_are_those_of_the_kept_path(kind: str) -> None:
    lm = build(kind)
    taps = [FINAL, 1]
    lm.record_features(taps)
    rng = random.Random(4)
    context = [rng.randrange(VOCAB) for _ in range(9)]
    lm.prefill(context)
    for _ in range(6):  # tree rounds, each keeping a random root path
        tokens, parents = random_tree(rng, rng.randint(1, 9))
        lm.extend_tree(tokens, parents)
        path = path_to(parents, rng.randrange(len(tokens)))
        lm.keep_path(path)
        context += [tokens[i] for i in path]
    assert lm.length == len(context)
    torch.testing.assert_close(lm.features(taps, 0, lm.length), lm.score_features(context, taps), atol=FP32_ATOL, rtol=0)


class WrittenElements(TorchDispatchMode):
    """Counts the floating-point elements every in-place op writes (index_put_: its values;
    copy_: its source; any other in-place op: its whole destination). Integer writes are the
    index tensors being built."""

    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func._schema.is_mutable and args[0].is_floating_point():
            name = func.overloadpacket.__name__
            self.written += args[2].numel() if name in ("index_put_", "_index_put_impl_") else (
                args[1].numel() if name == "copy_" else args[0].numel()
            )
        return out


def row_elements(lm) -> int:
    """Elements of one position's keys and values over all layers, and of its features."""
    if isinstance(lm, HFCausalLM):
        cache = sum(layer.keys[..., :1, :].numel() + layer.values[..., :1, :].numel() for layer in lm.cache.layers)
    elif isinstance(lm, StaticLlama):  # one slot's position: [Hkv, D] per layer
        cache = sum(k[0, :, :1].numel() + v[0, :, :1].numel() for k, v in zip(lm.model.cache.keys, lm.model.cache.values))
    else:
        cache = sum(k[:, :1].numel() + v[:, :1].numel() for k, v in zip(lm.cache.keys, lm.cache.values))
    return cache + len(lm._features.taps) * lm.hidden_size


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(
    ("parents", "path", "moved"),
    [
        ([ROOT, 0, 1, 0, 1, 3], [0, 1, 2], 0),  # the first-child chain is in place
        ([ROOT, 0, 1, 0, 1, 3], [0, 1, 4], 1),  # only the last node moves
        ([ROOT, 0, 1, 0, 1, 3], [0, 3, 5], 2),
        ([ROOT, ROOT, 1, 2], [1, 2, 3], 3),  # a second root: its whole path moves
        ([ROOT, ROOT, 1, 2], [], 0),
    ],
)
def test_keep_path_copies_only_the_nodes_not_in_their_slots(kind: str, parents, path, moved: int) -> None:
    lm = build(kind)
    lm.record_features([FINAL])
    lm.prefill(list(range(3, 20)))
    tokens = [30 + i for i in range(len(parents))]
    lm.extend_tree(tokens, parents)
    with WrittenElements() as counter:
        lm.keep_path(path)
    assert counter.written == moved * row_elements(lm)
    torch.testing.assert_close(lm.extend([9]), lm.score(list(range(3, 20)) + [tokens[i] for i in path] + [9])[-1:],
                               atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize(("kind", "moved"), [("hf", 1), ("fast", 0), ("fast-deterministic", 0), ("static", 0),
                                             ("static-deterministic", 0)])
def test_the_fast_runtime_lays_a_tree_out_depth_first(kind: str, moved: int) -> None:
    """A tree drafted breadth first, as the engine's proposers fill them: the fast runtime (and
    the static one) puts
    its first-child path in a chain's slots, so keeping that path copies nothing (the HF
    adapter keeps the caller's order and moves node 3), and the rows still come back in the
    caller's order."""
    lm = build(kind)
    lm.record_features([FINAL])
    prompt = list(range(3, 20))
    lm.prefill(prompt)
    tokens, parents = [30, 31, 32, 33, 34], [ROOT, 0, 0, 1, 2]
    lm.extend_tree(tokens, parents)
    with WrittenElements() as counter:
        lm.keep_path([0, 1, 3])
    assert counter.written == moved * row_elements(lm)
    expected = lm.score(prompt + [30, 31, 33, 9])[-1:]
    torch.testing.assert_close(lm.extend([9]), expected, atol=FP32_ATOL, rtol=0)
    lm.prefill(prompt)
    chain = lm.extend([30, 32, 34])  # node 4's root path, row by row
    lm.prefill(prompt)
    torch.testing.assert_close(lm.extend_tree(tokens, parents)[[0, 2, 4]], chain, atol=FP32_ATOL, rtol=0)


def refuse_tree_calls_out_of_order(lm, vocab: int, *pending: Callable[[], object]) -> None:
    """After [3, 4, 5]: keep_path without a tree and bad trees are refused, the cache intact;
    with the tree [6, 7, 8] (parents -1, -1, 1) scored, every call but keep_path and a rollback
    to its start (`pending`: the model's own others too), and a path not in it; then the path
    [1, 2] (tokens 7, 8) is kept."""
    assert isinstance(lm, TreeScoring)
    lm.prefill([3, 4, 5])
    with pytest.raises(ValueError, match="keep_path needs a tree"):
        lm.keep_path([0])
    with pytest.raises(ValueError, match="parent must be -1 or an earlier node"):
        lm.extend_tree([6, 7], [ROOT, 1])
    with pytest.raises(ValueError, match=f"token id {vocab} is outside"):
        lm.extend_tree([6, vocab], [ROOT, 0])
    assert lm.length == 3
    lm.extend_tree([6, 7, 8], [ROOT, ROOT, 1])
    for call in (lambda: lm.extend([9]), lambda: lm.extend_tree([9], [ROOT]), lambda: lm.rollback(4),
                 lambda: lm.record_features([FINAL]), *pending):
        with pytest.raises(ValueError, match="tree is pending"):
            call()
    with pytest.raises(ValueError, match="not a root path"):
        lm.keep_path([0, 2])
    lm.keep_path([1, 2])


@pytest.mark.parametrize("kind", KINDS)
def test_tree_calls_out_of_order_are_refused_and_leave_the_cache_intact(kind: str) -> None:
    lm = build(kind)
    refuse_tree_calls_out_of_order(lm, VOCAB)
    torch.testing.assert_close(lm.extend([9]), lm.score([3, 4, 5, 7, 8, 9])[-1:], atol=FP32_ATOL, rtol=0)
    lm.extend_tree([6, 7], [ROOT, 0])
    lm.rollback(4)  # back to before the tree: the tree is forgotten
    torch.testing.assert_close(lm.extend([9]), lm.score([3, 4, 5, 7, 9])[-1:], atol=FP32_ATOL, rtol=0)


class ShuffledOracle:
    """A chosen tree proposer (not a real one): ranks the candidates after a path by a model's
    own logits, with the best two swapped, so that greedy verification accepts second
    siblings and keep_path has nodes to move."""

    def __init__(self, lm) -> None:
        self.lm = lm

    def begin(self, prompt, sampling) -> None:
        pass

    def commit(self, context) -> None:
        pass

    def propose_tree(self, context, shape, rng):
        def candidates(path):
            ranked = self.lm.score([*context, *path])[-1].argsort(descending=True).tolist()
            return [ranked[1], ranked[0], *ranked[2:4]]

        return fill(shape, candidates)

    propose_tree_stateless = propose_tree


class FixedShape(KPolicy):
    trees = True

    def __init__(self, shape: TreeShape) -> None:
        self.shape = shape

    def begin(self) -> None:
        pass

    def choose(self, stats) -> TreeShape:
        return self.shape


SHAPE = TreeShape.of([(0,), (1,), (0, 0), (1, 0), (1, 1), (1, 1, 0), (1, 1, 1), (1, 1, 1, 0)])


@pytest.mark.parametrize("kind", KINDS + QUANTIZED_KINDS)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_with_trees_equals_the_reference(kind: str, temperature: float) -> None:
    lm = build(kind)
    options = dict(max_new_tokens=14, sampling=SamplingParams(temperature=temperature), k=FixedShape(SHAPE),
                   eos_token_id=2)
    for seed, prompt in enumerate(([5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43])):
        engine = generate(lm, ShuffledOracle(lm), prompt, rng=TorchRandom(seed), **options)
        assert engine.tokens == reference_generate(lm, ShuffledOracle(lm), prompt, rng=TorchRandom(seed), **options)
        assert engine.stats.tree_rounds > 0


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tree_decoding_is_plain_greedy_decoding(kind: str) -> None:
    lm = build(kind)
    for prompt in ([5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41]):
        plain = generate(lm, None, prompt, max_new_tokens=30, sampling=GREEDY, k=0)
        tree = generate(lm, ShuffledOracle(lm), prompt, max_new_tokens=30, sampling=GREEDY, k=FixedShape(SHAPE))
        assert tree.tokens == plain.tokens
        # second siblings were accepted, so keep_path had nodes to move
        assert any(len(ranks) > 1 and ranks[1] for ranks in tree.stats.rank_accepts)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_model_tree_rows_equal_their_paths(default_float32, dtype: torch.dtype) -> None:
    ids = default_float32.encode("Summarize: the cat sat on the mat, then it slept in the sun all afternoon.")
    tokens, parents = ids[-9:], [ROOT, 0, 1, 0, 3, ROOT, 5, 1, 7]
    prompt = ids[:-9]
    # float32 logits reach ~39 (steps of 3.8e-6), bfloat16 ones steps of 0.25: tree and chain
    # forwards sum in different orders through 30 layers.
    atol = 2e-4 if dtype == torch.float32 else 1.0
    try:
        model = default_float32.model.to(dtype)
        for lm in (HFCausalLM(model), LlamaRuntime.from_hf(model), LlamaRuntime.from_hf(model, deterministic=True)):
            lm.prefill(prompt)
            tree = lm.extend_tree(tokens, parents)
            for node in range(len(tokens)):
                lm.rollback(len(prompt))
                chain = lm.extend([tokens[i] for i in path_to(parents, node)])[-1]
                if getattr(lm, "deterministic", False) and (node in first_child_path(parents) or by_rows(lm)):
                    assert torch.equal(tree[node], chain)
                else:
                    torch.testing.assert_close(tree[node], chain, atol=atol, rtol=0)
    finally:
        default_float32.model.to(torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_model_greedy_tree_decoding_is_plain_greedy(default_float32, dtype: torch.dtype) -> None:
    try:
        lm = LlamaRuntime.from_hf(default_float32.model.to(dtype), deterministic=True)
        prompt = default_float32.encode("Repeat after me three times: the quick brown fox jumps over the lazy dog.")
        options = dict(max_new_tokens=24, sampling=GREEDY, eos_token_id=default_float32.eos_token_id)
        plain = generate(lm, None, prompt, k=0, **options)
        assert generate(lm, ShuffledOracle(lm), prompt, k=FixedShape(SHAPE), **options).tokens == plain.tokens
    finally:
        default_float32.model.to(torch.float32)


class TimedTreeTable(TimedTable):
    """A timed table whose tree rounds cost `mask` more per position than a chain's forward,
    and whose keep_path costs `compaction` per row moved."""

    def __init__(self, clock: FakeClock, mask: float, compaction: float) -> None:
        super().__init__(clock, fixed=0.030, per_token=0.005)
        self.mask, self.compaction = mask, compaction
        self.kept: list[list[int]] = []

    def extend_tree(self, tokens, parents) -> torch.Tensor:
        self.clock.now += self.fixed + (self.per_token + self.mask) * len(tokens)
        self._tree = ScoredTree(self.table.length, tuple(parents))
        return self.table.extend_tree(tokens, parents)

    def keep_path(self, path) -> None:
        self.clock.now += self.compaction * len(self._tree.moves(path)[0])
        self.kept.append(list(path))
        self.table.keep_path(path)


def test_profile_times_tree_rounds_beside_chains_of_as_many_positions(tmp_path) -> None:
    clock = FakeClock()
    target = TimedTreeTable(clock, mask=0.001, compaction=0.0005)
    profile = measure_profile(target, PromptLookup(), [0, 1, 2, 3, 0, 1, 2], k_max=2, repeats=3, warmup=1,
                              clock=clock, tree_nodes=6)
    step = 0.035
    assert len(profile.v) == 3 and len(profile.tree_v) == len(profile.tree_chain_v) == 7
    assert profile.tree_chain_v == pytest.approx([(0.030 + 0.005 * n) / step for n in range(1, 8)])
    moved = [len(ScoredTree(0, tuple([ROOT, *(p + 1 for p in representative_tree(n - 1).parents)])).moves(path)[0])
             for n, path in zip(range(1, 8), target.kept[:7])]
    assert profile.tree_v == pytest.approx([(0.030 + 0.006 * n + 0.0005 * m) / step for n, m in zip(range(1, 8), moved)])
    assert profile.tree_shapes[6] == representative_tree(6).describe() == "6 nodes: 2-3-1"
    assert target.kept[6] == [0, 1, 3, 6]  # the pending token, then the deepest path: ranks (0,), (0, 0), (0, 0, 0)
    path = tmp_path / "p.json"
    profile.save(path)
    assert Profile.load(path) == profile
    old = profile.to_dict()
    for key in ("tree_v", "tree_chain_v", "tree_score", "tree_shapes"):
        del old[key]
    assert Profile.from_dict(old).tree_v is None  # profiles written before trees still load


def test_profile_of_trees_refuses_a_model_without_tree_scoring() -> None:
    with pytest.raises(ValueError, match="cannot score a token tree in one forward"):
        measure_profile(TimedTable(FakeClock(), 0.01, 0.001), PromptLookup(), [0, 1, 2], k_max=2, tree_nodes=3)
