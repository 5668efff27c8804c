"""HFCausalLM on tiny random Llama models built in code (no download).

The cache contract: after any history of extends and rollbacks (what accepted and rejected
drafts leave behind), the logits equal a fresh full recomputation. Cached attention sums in a
different order than the full forward, so the equality is up to float32 rounding: FP32_ATOL
on logits of magnitude ~3 (measured worst case 5.5e-6 over 300 random steps).
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from verispec import GREEDY, generate
from verispec.models.runtimes.hf import HFCausalLM
from verispec.proposers import DraftModel, PromptLookup

FP32_ATOL = 1e-4
VOCAB = 64


def tiny_llama(seed: int, layers: int = 2, vocab: int = VOCAB) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        # A wide init spreads the logits, so greedy argmax gaps dwarf float32 rounding.
        initializer_range=0.2,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny forwards are dominated by thread synchronisation: one thread is several times
    faster than two on a busy machine, and the results are the same."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def target() -> HFCausalLM:
    return HFCausalLM(tiny_llama(0))


def check_random_history(lm: HFCausalLM, prompt: list[int], seed: int, steps: int, atol: float) -> float:
    """Extend by 1..6 random tokens (keeping all, one or every row) and roll back up to 7
    tokens at random, as accepted and rejected drafts do; every returned row must equal the
    full recomputation within atol. Returns the largest difference seen."""
    rng = random.Random(seed)
    context = list(prompt)
    lm.prefill(context)
    worst = 0.0
    for _ in range(steps):
        if context and rng.random() < 0.5:
            keep_length = rng.randint(max(0, len(context) - 7), len(context))
            lm.rollback(keep_length)
            del context[keep_length:]
        tokens = [rng.randrange(lm.vocab_size) for _ in range(rng.randint(1, 6))]
        keep = rng.choice([None, 1, len(tokens)])
        logits = lm.extend(tokens, keep=keep)
        context += tokens
        assert lm.length == len(context)
        assert logits.dtype == torch.float32
        assert logits.shape == (keep or len(tokens), lm.vocab_size)
        full = lm.score(context)[-logits.shape[0] :]
        torch.testing.assert_close(logits, full, atol=atol, rtol=0)
        worst = max(worst, float((logits - full).abs().max()))
    return worst


@pytest.mark.parametrize("seed", range(3))
def test_random_histories_match_full_recomputation(target: HFCausalLM, seed: int) -> None:
    prompt = [random.Random(seed).randrange(VOCAB) for _ in range(seed * 5)]
    check_random_history(target, prompt, seed, steps=60, atol=FP32_ATOL)


def test_only_kept_rows_reach_the_output_head(target: HFCausalLM) -> None:
    rows = []
    hook = target.model.lm_head.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[1]))
    try:
        target.prefill(list(range(3, 23)))
        target.extend([5, 6, 7, 8], keep=2)
        target.extend([9, 10, 11])
    finally:
        hook.remove()
    assert rows == [1, 2, 3]
    assert target.length == 27


def test_appending_and_rolling_back_never_copy_the_cache(target: HFCausalLM) -> None:
    target.prefill(list(range(3, 13)))
    layer = target.cache.layers[0]
    buffer = layer._key_buffer.data_ptr()
    target.extend([5, 6, 7])  # 13 positions fit the buffer sized at the prefill (20)
    target.rollback(11)
    target.extend([8])
    assert layer._key_buffer.data_ptr() == buffer == layer.keys.data_ptr()
    assert layer.keys.shape[-2] == target.length == 12


def test_prefill_resets_and_rollback_to_zero_forgets_everything(target: HFCausalLM) -> None:
    target.prefill([4, 5, 6])
    target.prefill([7])
    assert target.length == 1
    torch.testing.assert_close(target.extend([8]), target.score([7, 8])[-1:], atol=FP32_ATOL, rtol=0)
    target.rollback(0)
    assert target.length == 0
    torch.testing.assert_close(target.extend([9, 10]), target.score([9, 10]), atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda lm: lm.extend([]), "at least one token"),
        (lambda lm: lm.extend([1, 2], keep=3), "keep must lie in"),
        (lambda lm: lm.extend([1, 2], keep=0), "keep must lie in"),
        (lambda lm: lm.extend([VOCAB]), f"token id {VOCAB} is outside"),
        (lambda lm: lm.extend([-1]), "token id -1 is outside"),
        (lambda lm: lm.rollback(3), "cannot roll back to 3; 2 tokens processed"),
        (lambda lm: lm.rollback(-1), "cannot roll back to -1"),
        (lambda lm: lm.score([]), "at least one token"),
    ],
)
def test_bad_calls_raise_and_leave_the_cache_intact(target: HFCausalLM, call, message: str) -> None:
    target.prefill([3, 4])
    with pytest.raises(ValueError, match=message):
        call(target)
    assert target.length == 2
    torch.testing.assert_close(target.extend([5]), target.score([3, 4, 5])[-1:], atol=FP32_ATOL, rtol=0)


def test_sliding_window_models_are_refused() -> None:
    torch.manual_seed(0)
    config = MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
    )
    with pytest.raises(ValueError, match="cannot roll back to an arbitrary length"):
        HFCausalLM(MistralForCausalLM(config))


def plain_greedy(lm: HFCausalLM, prompt: list[int], n: int) -> tuple[list[int], float]:
    """Greedy decoding by full recomputation, and the smallest top-1/top-2 logit gap seen."""
    ids, gap = list(prompt), float("inf")
    for _ in range(n):
        top = lm.score(ids)[-1].topk(2)
        gap = min(gap, float(top.values[0] - top.values[1]))
        ids.append(int(top.indices[0]))
    return ids[len(prompt) :], gap


@pytest.mark.parametrize("proposer", ["prompt-lookup", "draft-model"])
def test_engine_greedy_equals_plain_greedy_and_hf_generate(target: HFCausalLM, proposer: str) -> None:
    n = 40
    prompts = [[5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41]]
    partial_rounds = 0
    for prompt in prompts:
        expected, gap = plain_greedy(target, prompt, n)
        # Precondition: no near-tie that float32 rounding could flip between code paths.
        assert gap > 10 * FP32_ATOL
        chosen = PromptLookup() if proposer == "prompt-lookup" else DraftModel(HFCausalLM(tiny_llama(1, layers=1)))
        ours = generate(target, chosen, prompt, max_new_tokens=n, sampling=GREEDY, k=4)
        assert ours.tokens == expected
        partial_rounds += sum(0 < a < d for a, d in zip(ours.stats.accepted, ours.stats.drafted))
        hf = target.model.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=n, eos_token_id=None, pad_token_id=0
        )
        assert hf[0, len(prompt) :].tolist() == expected
    # The histories above must include rollbacks after a partly accepted draft.
    assert partial_rounds > 0
