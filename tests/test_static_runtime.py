"""StaticLlama (the static runtime: fixed shapes over a static cache, CUDA graphs on CUDA) through
its eager path on the CPU, on tiny random Llama and Qwen2 models built in code.

The cache contract: after any history of extends and rollbacks the logits equal a fresh full
recomputation (`score`); bit for bit with deterministic scoring, within float32 rounding
without it. Against transformers on the same weights: within float32 rounding. Deterministic
scoring: a row's logits are the same bits whatever rows or slots come with it, so greedy
speculative decoding, alone and in a batch, equals plain greedy decoding bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_hf_adapter import FP32_ATOL, VOCAB, check_random_history, tiny_llama
from test_qwen2_runtime import tiny_qwen2

from verispec import GREEDY, SamplingParams, generate
from verispec.batching import Scheduler
from verispec.models.base import FINAL, FeatureChannel, SlotScoring
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.proposers import DraftModel, PromptLookup
from verispec.randomness import TorchRandom
from verispec.reference import reference_generate
from verispec.request import Request

MODELS = {"llama": lambda: tiny_llama(0), "qwen2": lambda: tiny_qwen2(0)}


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module", params=list(MODELS))
def model(request):
    return MODELS[request.param]()


@pytest.fixture(scope="module", params=[True, False], ids=["deterministic", "smallest-bucket"])
def target(model, request) -> StaticLlama:
    return StaticLlama.from_hf(model, deterministic=request.param, rows=4, slots=3, context=32)


def test_it_implements_the_protocols_and_runs_eagerly_here(target: StaticLlama) -> None:
    assert isinstance(target, SlotScoring) and isinstance(target, FeatureChannel)
    assert not target.model.use_graphs and target.device.type == "cpu"
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        StaticLlama.from_hf(tiny_llama(0), graphs=True)


@pytest.mark.parametrize("seed", range(2))
def test_random_histories_match_full_recomputation(target: StaticLlama, seed: int) -> None:
    vocab = target.vocab_size
    prompt = [random.Random(seed).randrange(vocab) for _ in range(seed * 9)]
    worst = check_random_history(target, prompt, seed, steps=40, atol=FP32_ATOL)
    if target.deterministic:
        assert worst == 0  # every forward in one shape: the rows are the recomputation's bits


def test_logits_match_transformers_on_the_same_weights(model, target: StaticLlama) -> None:
    ids = [random.Random(1).randrange(target.vocab_size) for _ in range(40)]  # past the cache's 32 positions
    torch.testing.assert_close(target.score(ids), HFCausalLM(model).score(ids), atol=FP32_ATOL, rtol=0)


def test_steps_write_in_place_and_rollback_moves_a_length(model) -> None:
    lm = StaticLlama.from_hf(model, rows=4, context=64)
    buffers = [t.data_ptr() for t in (*lm.model.cache.keys, *lm.model.cache.values)]
    lm.prefill([3, 4, 5, 6, 7, 8])
    for _ in range(5):
        lm.extend([9, 10, 11])
        lm.rollback(lm.length - 2)
    assert lm.length == 11 and [t.data_ptr() for t in (*lm.model.cache.keys, *lm.model.cache.values)] == buffers
    lm.extend(list(range(60)))  # past the 64 positions: grows once, by doubling
    assert lm.model.cache.width == 128 and lm.model.cache.generation == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_deterministic_rows_do_not_depend_on_how_many_rows_or_slots_come_with_them(dtype) -> None:
    lm = StaticLlama.from_hf(tiny_llama(3), dtype=dtype, rows=8, slots=3, context=128)
    other = lm.new_slot()
    rng = random.Random(1)
    for _ in range(3):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 90))]
        tokens = [rng.randrange(VOCAB) for _ in range(11)]  # past the row bucket: two forwards
        lm.prefill(prompt)
        together = lm.extend(tokens)  # [11, V]
        for n in (1, 2, 5, 8, 9):
            lm.rollback(len(prompt))
            assert torch.equal(lm.extend(tokens[:n]), together[:n])
        other.prefill(prompt[: len(prompt) // 2])
        lm.rollback(len(prompt))
        beside = lm.extend_slots([other, lm], [tokens[:3], tokens[:6]])
        assert torch.equal(beside[1], together[:6])


def test_deterministic_prompts_and_steps_each_take_one_shape(model) -> None:
    """Prompts go in their own shape [slots, prefill_rows], every step with logits in
    [slots, rows] (the row bucket k_max + 1 wide): so a plain step pays for `rows` rows, not for
    the prompt's, and plain and speculative runs prefill alike."""
    lm = StaticLlama.from_hf(model, rows=5, prefill_rows=16, slots=2, context=64)
    shapes = []
    original = lm.model._forward
    lm.model._forward = lambda *args: shapes.append(tuple(args[1].shape)) or original(*args)
    lm.prefill(list(range(1, 21)))  # 20 tokens: two prompt forwards
    lm.extend([3])
    lm.extend([4, 5, 6, 7, 8, 9])  # 6 rows: two steps
    assert shapes == [(2, 16), (2, 16), (2, 5), (2, 5), (2, 5)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_reads_what_the_slots_cached_and_a_row_s_bits_do_not_depend_on_it(dtype) -> None:
    """A step's attention reads the narrowest width bucket that holds its slots' lengths
    (256, 512, ...), a graph per bucket; another slot's long context widens the step, and the
    row's bits stay (masked positions are exact zeros in any width)."""
    lm = StaticLlama.from_hf(tiny_llama(2).to(dtype), rows=4, prefill_rows=64, slots=2, context=1024)
    other = lm.new_slot(1024)
    widths = []
    original = lm.model._forward
    lm.model._forward = lambda *args: widths.append(args[6].shape[0]) or original(*args)
    prompt = [random.Random(3).randrange(VOCAB) for _ in range(40)]
    lm.prefill(prompt)
    alone = lm.extend([7, 8, 9])
    assert widths[-1] == 256  # 43 positions and 4 rows: the narrowest bucket
    other.prefill([random.Random(4).randrange(VOCAB) for _ in range(600)])
    lm.rollback(len(prompt))
    widths.clear()
    beside = lm.extend([7, 8, 9])
    assert widths == [1024] and torch.equal(beside, alone)


def test_slots_score_their_own_rows_in_one_forward(target: StaticLlama) -> None:
    hf = HFCausalLM(tiny_llama(0)) if target.vocab_size == VOCAB else None
    a, b = target.new_slot(), target.new_slot()
    target.prefill([5, 6, 7, 8])
    a.prefill([1, 2])
    b.prefill([9, 9, 9, 9, 9, 9, 9])
    calls = []
    original = target.model._forward
    target.model._forward = lambda *args: calls.append(args[1].shape) or original(*args)
    try:
        rows = target.extend_slots([b, target, a], [[3, 4, 5], [1], [6, 7]])
    finally:
        target.model._forward = original
    assert len(calls) == 1 and [r.shape[0] for r in rows] == [3, 1, 2]
    assert (a.length, b.length, target.length) == (4, 10, 5)
    for slot, ids, got in ((b, [9] * 7 + [3, 4, 5], rows[0]), (target, [5, 6, 7, 8, 1], rows[1]), (a, [1, 2, 6, 7], rows[2])):
        torch.testing.assert_close(got, slot.score(ids)[-got.shape[0]:], atol=FP32_ATOL, rtol=0)
        if hf is not None:
            torch.testing.assert_close(got, hf.score(ids)[-got.shape[0]:], atol=FP32_ATOL, rtol=0)
    with pytest.raises(ValueError, match="same slot twice"):
        target.extend_slots([a, a], [[1], [2]])


def test_a_dropped_slot_returns_to_the_cache(model) -> None:
    lm = StaticLlama.from_hf(model, rows=2, slots=2, context=16)
    slot = lm.new_slot()
    index = slot.index
    del slot
    assert lm.new_slot().index == index and lm.model.cache.slots == 2


def test_features_follow_the_cache(model) -> None:
    lm = StaticLlama.from_hf(model, rows=4, context=32)
    lm.record_features([1, FINAL])
    lm.prefill([4, 5, 6, 7, 8, 9])
    lm.extend([10, 11, 12])
    lm.rollback(7)
    kept = lm.features([1, FINAL], 0, 7)
    torch.testing.assert_close(kept, lm.score_features([4, 5, 6, 7, 8, 9, 10], [1, FINAL]), atol=FP32_ATOL, rtol=0)
    logits = lm.extend([3])
    torch.testing.assert_close(logits, lm.features([FINAL], 7, 8) @ lm.output_embeddings().T, atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize("seed", range(2))
def test_engine_equals_the_full_recompute_reference(target: StaticLlama, seed: int) -> None:
    vocab = target.vocab_size
    options = dict(max_new_tokens=14, sampling=SamplingParams(temperature=1.0), k=3)
    prompt = [1, 17, 33, 49, 5]
    for make in (PromptLookup, lambda: DraftModel(StaticLlama.from_hf(tiny_llama(1, layers=1, vocab=vocab), rows=4))):
        engine = generate(target, make(), prompt, rng=TorchRandom(seed), **options)
        assert engine.tokens == reference_generate(target, make(), prompt, rng=TorchRandom(seed), **options)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_greedy_speculative_is_plain_greedy_alone_and_in_a_batch(dtype) -> None:
    lm = StaticLlama.from_hf(tiny_llama(0).to(dtype), rows=4, context=32)
    prompts = [[5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41]]
    scheduler = Scheduler(lm, lambda request, slot: (PromptLookup(), request.k), max_slots=3)  # reserves 3 slots
    assert lm.model.cache.slots == 4
    plain = [generate(lm, None, p, max_new_tokens=30, sampling=GREEDY, k=0).tokens for p in prompts]
    for prompt, expected in zip(prompts, plain):
        for k in (1, 3, 6):
            assert generate(lm, PromptLookup(), prompt, max_new_tokens=30, sampling=GREEDY, k=k).tokens == expected
    jobs = [scheduler.submit(Request(tuple(p), 30, sampling=GREEDY, proposer="lookup", k=k)) for p, k in zip(prompts, (2, 5, 3))]
    scheduler.run()
    assert max(scheduler.step_rows) > 4 and [job.tokens for job in jobs] == plain


@pytest.mark.slow
def test_default_model_greedy_speculative_is_plain_greedy(default_float32) -> None:
    prompt = default_float32.encode("Repeat after me three times: the quick brown fox jumps over the lazy dog.")
    exact = StaticLlama.from_hf(default_float32.model, rows=4, context=64)  # float32: transformers' logits
    torch.testing.assert_close(exact.score(prompt), default_float32.lm.score(prompt), atol=3e-4, rtol=0)
    lm = StaticLlama.from_hf(default_float32.model, dtype=torch.bfloat16, rows=4, context=64)
    options = dict(max_new_tokens=24, sampling=GREEDY, eos_token_id=default_float32.eos_token_id)
    plain = generate(lm, None, prompt, k=0, **options)
    assert len(plain.tokens) > 5
    assert generate(lm, PromptLookup(), prompt, k=4, **options).tokens == plain.tokens


def test_what_the_static_runtime_does_not_run_is_refused_with_the_reason() -> None:
    from verispec.proposers.layer_skip import LayerSkip

    lm = StaticLlama.from_hf(tiny_llama(0), rows=2, context=16)
    with pytest.raises(ValueError, match="layer skip drafts with the target's own first layers .* StaticLlama"):
        LayerSkip(lm, 1)
    with pytest.raises(ValueError, match="rows must lie in 1..128"):
        lm.variant(rows=200)


def test_without_deterministic_scoring_the_note_says_output_may_part_from_plain() -> None:
    from pathlib import Path
    from types import SimpleNamespace

    from verispec.models.loading.load import LoadedModel

    def note(deterministic: bool) -> str | None:
        lm = SimpleNamespace(deterministic=deterministic)
        return LoadedModel("m", lm, None, None, (), torch.bfloat16, Path("/no/such/dir"), runtime="static").target_note

    assert note(True) is None
    assert "--no-deterministic" in note(False) and "may part from plain decoding at near ties" in note(False)
