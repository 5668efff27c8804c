"""LlamaRuntime (the fast runtime) on tiny random Llama models built in code.

The same cache contract as HFCausalLM (tests/test_hf_adapter.py): after any history of
extends and rollbacks the logits equal a fresh full recomputation, within FP32_ATOL (cached
and full forwards sum attention in different orders). Against transformers' own forward on
the same weights: within FP32_ATOL too (oneDNN and MKL sum the projections in different
orders; measured worst ~5e-6 here, 2.4e-4 on the default model's logits of magnitude ~39),
and with transformers' own products (weight format "dense") bit for bit.

Deterministic mode: a row's logits are the same bits whatever rows are scored with it, in
float32 and bfloat16, so greedy speculative decoding equals plain greedy decoding bit for bit.
"""

from __future__ import annotations

import random

import pytest
import torch
from test_hf_adapter import FP32_ATOL, VOCAB, check_random_history, tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from verispec import GREEDY, SamplingParams, generate
from verispec.models.attention import InvariantAttention, RowAttention
from verispec.models.base import FINAL, FeatureChannel
from verispec.models.formats.linear import prepacks
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime, fast_runtime_refusal
from verispec.proposers import DraftModel, PromptLookup
from verispec.proposers.layer_skip import LayerSkip
from verispec.randomness import TorchRandom
from verispec.reference import reference_generate


pytestmark = pytest.mark.usefixtures("one_thread_per_module")


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama(0)


@pytest.fixture(scope="module", params=[False, True], ids=["sdpa", "deterministic"])
def target(model, request) -> LlamaRuntime:
    return LlamaRuntime.from_hf(model, deterministic=request.param)


@pytest.mark.parametrize("seed", range(3))
def test_random_histories_match_full_recomputation(target: LlamaRuntime, seed: int) -> None:
    prompt = [random.Random(seed).randrange(VOCAB) for _ in range(seed * 5)]
    check_random_history(target, prompt, seed, steps=60, atol=FP32_ATOL)


@pytest.mark.parametrize("length", [1, 2, 9, 70])
def test_with_transformers_products_the_logits_are_transformers_bits(model, length: int) -> None:
    """Every operation but the projections computes as transformers does (embedding, RMSNorm,
    RoPE's products and sums, attention, SiLU gate, head): with `F.linear` projections the
    float32 logits are transformers' own, bit for bit, so the prepacked runtime's only
    difference is oneDNN's summation order."""
    ids = [random.Random(length).randrange(VOCAB) for _ in range(length)]
    assert torch.equal(LlamaRuntime.from_hf(model, "dense").score(ids), HFCausalLM(model).score(ids))


def test_the_runtime_names_the_kernel_each_projection_computes_on(model) -> None:
    """`profile` reports these: the float32 projections on oneDNN's prepacked weights where
    torch has oneDNN, transformers' `F.linear` (MKL in float32) for the dense reference."""
    count = 4 * model.config.num_hidden_layers + 1  # qkv, o, gate_up, down per layer, and the head
    packed = "oneDNN prepacked float32" if prepacks(torch.float32) else "F.linear float32" + (" (MKL)" if torch.backends.mkl.is_available() else "")
    assert LlamaRuntime.from_hf(model).projection_kernels() == {packed: count}
    dense = "F.linear float32" + (" (MKL)" if torch.backends.mkl.is_available() else "")
    assert LlamaRuntime.from_hf(model, "dense").projection_kernels() == {dense: count}
    assert LlamaRuntime.from_hf(model, "int8").projection_kernels() == {"int8 aten._weight_int8pack_mm": count}


def test_consuming_the_model_releases_its_projections_and_keeps_the_logits(model) -> None:
    ids = [random.Random(3).randrange(VOCAB) for _ in range(20)]
    expected = LlamaRuntime.from_hf(model).score(ids)
    consumed = tiny_llama(0)  # the same weights
    lm = LlamaRuntime.from_hf(consumed, consume=True)
    layer = consumed.model.layers[0]
    assert layer.self_attn.q_proj.weight is None and layer.mlp.down_proj.weight is None
    # The embedding and the dense head are shared, not copied.
    assert lm.embed.data_ptr() == consumed.model.embed_tokens.weight.data_ptr()
    assert lm.output_embeddings().data_ptr() == consumed.lm_head.weight.data_ptr()
    assert torch.equal(lm.score(ids), expected)


def test_logits_match_transformers_on_the_same_weights(model, target: LlamaRuntime) -> None:
    hf = HFCausalLM(model)
    ids = [random.Random(7).randrange(VOCAB) for _ in range(70)]
    torch.testing.assert_close(target.score(ids), hf.score(ids), atol=FP32_ATOL, rtol=0)
    target.prefill(ids[:60])
    hf.prefill(ids[:60])
    torch.testing.assert_close(target.extend(ids[60:]), hf.extend(ids[60:]), atol=FP32_ATOL, rtol=0)


def test_only_kept_rows_reach_the_output_head(target: LlamaRuntime) -> None:
    rows = []
    forward = target.head.forward
    target.head.forward = lambda x: rows.append(x.shape[0]) or forward(x)
    try:
        target.prefill(list(range(3, 23)))
        target.extend([5, 6, 7, 8], keep=2)
        target.extend([9, 10, 11])
    finally:
        del target.head.forward
    assert rows == [2, 3]  # the prefill keeps none
    assert target.length == 27


def test_appending_and_rolling_back_never_copy_the_cache(target: LlamaRuntime) -> None:
    target.prefill(list(range(3, 13)))
    keys = target.cache.keys[0]
    target.extend([5, 6, 7])
    target.rollback(11)
    target.extend([8])
    assert target.cache.keys[0] is keys and target.length == 12
    target.prefill([i % VOCAB for i in range(300)])  # past the capacity: the buffers grow once
    assert target.cache.capacity >= 300 and target.length == 300


def test_prefill_resets_and_rollback_to_zero_forgets_everything(target: LlamaRuntime) -> None:
    target.prefill([4, 5, 6])
    target.prefill([7])
    assert target.length == 1
    torch.testing.assert_close(target.extend([8]), target.score([7, 8])[-1:], atol=FP32_ATOL, rtol=0)
    target.rollback(0)
    torch.testing.assert_close(target.extend([9, 10]), target.score([9, 10]), atol=FP32_ATOL, rtol=0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda lm: lm.extend([]), "at least one token"),
        (lambda lm: lm.extend([1, 2], keep=3), "keep must lie in"),
        (lambda lm: lm.extend([VOCAB]), f"token id {VOCAB} is outside"),
        (lambda lm: lm.rollback(3), "cannot roll back to 3; 2 tokens processed"),
        (lambda lm: lm.score([]), "at least one token"),
        (lambda lm: lm.record_features([3]), "feature tap 3 is neither 'final' nor a layer number in 1..2"),
    ],
)
def test_bad_calls_raise_and_leave_the_cache_intact(target: LlamaRuntime, call, message: str) -> None:
    target.prefill([3, 4])
    with pytest.raises(ValueError, match=message):
        call(target)
    assert target.length == 2
    torch.testing.assert_close(target.extend([5]), target.score([3, 4, 5])[-1:], atol=FP32_ATOL, rtol=0)


def test_feature_channel_follows_the_cache_and_matches_transformers(model) -> None:
    lm = LlamaRuntime.from_hf(model)
    assert isinstance(lm, FeatureChannel) and (lm.hidden_size, lm.num_layers) == (32, 2)
    taps = [FINAL, 1]
    lm.record_features(taps)
    rng = random.Random(3)
    context = [rng.randrange(VOCAB) for _ in range(6)]
    lm.prefill(context)
    for _ in range(12):  # accepted and rejected drafts: extend, then roll back some
        tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))]
        lm.extend(tokens, keep=1)
        context += tokens
        keep = rng.randint(len(context) - len(tokens), len(context))
        lm.rollback(keep)
        del context[keep:]
    kept = lm.features(taps, 0, lm.length)  # [T, 2 H]
    torch.testing.assert_close(kept, lm.score_features(context, taps), atol=FP32_ATOL, rtol=0)
    with torch.inference_mode():
        hidden = model(torch.tensor([context]), output_hidden_states=True).hidden_states
    # transformers' entries: the embeddings, then each layer's output, the last one after the norm.
    torch.testing.assert_close(kept[:, :32], hidden[-1][0], atol=FP32_ATOL, rtol=0)
    torch.testing.assert_close(kept[:, 32:], hidden[1][0], atol=FP32_ATOL, rtol=0)
    logits = lm.extend([5])
    torch.testing.assert_close(logits, lm.features([FINAL], lm.length - 1, lm.length) @ lm.output_embeddings().T,
                               atol=FP32_ATOL, rtol=0)
    assert torch.equal(lm.input_embeddings(), model.model.embed_tokens.weight)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_rows_do_not_depend_on_how_many_are_scored(dtype) -> None:
    lm = LlamaRuntime.from_hf(tiny_llama(3).to(dtype), deterministic=True)
    rng = random.Random(1)
    for _ in range(4):
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 90))]
        tokens = [rng.randrange(VOCAB) for _ in range(8)]
        lm.prefill(prompt)
        together = lm.extend(tokens)  # [8, V]
        for n in range(1, 8):
            lm.rollback(len(prompt))
            assert torch.equal(lm.extend(tokens[:n]), together[:n])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_deterministic_greedy_speculative_is_plain_greedy_bit_for_bit(dtype) -> None:
    lm = LlamaRuntime.from_hf(tiny_llama(0).to(dtype), deterministic=True)
    for prompt in ([5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41]):
        plain = generate(lm, None, prompt, max_new_tokens=40, sampling=GREEDY, k=0)
        for k in (1, 3, 6):
            assert generate(lm, PromptLookup(), prompt, max_new_tokens=40, sampling=GREEDY, k=k).tokens == plain.tokens


@pytest.mark.parametrize("proposer", ["prompt-lookup", "draft-model"])
def test_engine_greedy_equals_plain_greedy(target: LlamaRuntime, proposer: str) -> None:
    n = 40
    for prompt in ([5, 9, 14, 5, 9, 30], [17], [40, 41, 42, 43, 40, 41]):
        plain = generate(target, None, prompt, max_new_tokens=n, sampling=GREEDY, k=0)
        chosen = PromptLookup() if proposer == "prompt-lookup" else DraftModel(LlamaRuntime.from_hf(tiny_llama(1, layers=1)))
        assert generate(target, chosen, prompt, max_new_tokens=n, sampling=GREEDY, k=4).tokens == plain.tokens


@pytest.mark.parametrize("seed", range(2))
def test_layer_skip_on_the_fast_runtime_shares_its_layers_and_equals_the_reference(target: LlamaRuntime, seed) -> None:
    proposer = LayerSkip(target, 1, 40, corpus=[list(range(0, VOCAB, 2))])
    draft = proposer.model
    assert isinstance(draft, LlamaRuntime) and draft.layers[0] is target.layers[0] and draft.cache is not target.cache
    check_random_history(draft, [3, 4, 5], seed, steps=20, atol=FP32_ATOL)
    options = dict(max_new_tokens=16, sampling=SamplingParams(temperature=1.0), k=3)
    prompt = [1, 17, 33, 49, 5]
    engine = generate(target, proposer, prompt, rng=TorchRandom(seed), **options)
    fresh = LayerSkip(target, 1, 40, corpus=[list(range(0, VOCAB, 2))])
    assert engine.tokens == reference_generate(target, fresh, prompt, rng=TorchRandom(seed), **options)


def test_rope_scaling_matches_transformers() -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.2,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
    )
    model = LlamaForCausalLM(config)
    ids = list(range(3, 60))
    torch.testing.assert_close(LlamaRuntime.from_hf(model).score(ids), HFCausalLM(model).score(ids), atol=FP32_ATOL, rtol=0)


def test_unsupported_models_are_refused_with_the_reason() -> None:
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    ))
    assert "runs Llama-architecture models and this is 'mistral'" in fast_runtime_refusal(mistral)
    with pytest.raises(ValueError, match="use runtime 'hf'"):
        LlamaRuntime.from_hf(mistral)
    dynamic = tiny_llama(0)
    dynamic.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    assert "changes its frequencies with the sequence length" in fast_runtime_refusal(dynamic)
    assert "not float16" in fast_runtime_refusal(tiny_llama(0).half())
    assert "not float16" in fast_runtime_refusal(tiny_llama(0), torch.float16)  # the dtype asked for
    assert fast_runtime_refusal(tiny_llama(0), torch.bfloat16) is None


LONG_TEXT = (
    "The committee met on Monday to review the budget for the coming year. Several members asked "
    "for more money for the parks, while others wanted to cut spending on roads. After a long "
    "debate they agreed to a compromise that keeps both programs. "
) * 6


@pytest.mark.slow
def test_default_model_logits_match_transformers(default_float32) -> None:
    hf = default_float32.lm
    fast = LlamaRuntime.from_hf(default_float32.model)
    dense = LlamaRuntime.from_hf(default_float32.model, "dense")
    for text in ("Summarize: the cat sat on the mat, then it slept in the sun all afternoon.", LONG_TEXT):
        ids = default_float32.encode(text)
        expected = hf.score(ids)
        # transformers' products: transformers' bits; everything else computes as it does.
        assert torch.equal(dense.score(ids), expected)
        # Logits reach ~39 in magnitude (a float32 step is 3.8e-6 there), the residual stream
        # ~2.5e4; oneDNN sums the projections in another order than MKL: measured 1.1e-4..2.4e-4
        # per Spec-Bench prompt of 40-1,376 tokens (`benchmarks/logits_vs_hf.py`), where
        # transformers itself is up to 1.7e-4 from the float64 model and 1.1e-4 from its own
        # eager attention.
        torch.testing.assert_close(fast.score(ids), expected, atol=3e-4, rtol=0)
        assert len(ids) > 300 or text != LONG_TEXT


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_default_model_deterministic_greedy_speculative_is_plain_greedy(default_float32, dtype) -> None:
    lm = LlamaRuntime.from_hf(default_float32.model.to(dtype), deterministic=True)
    try:
        prompt = default_float32.encode("Repeat after me three times: the quick brown fox jumps over the lazy dog.")
        options = dict(max_new_tokens=40, sampling=GREEDY, eos_token_id=default_float32.eos_token_id)
        plain = generate(lm, None, prompt, k=0, **options)
        for proposer in (PromptLookup(), LayerSkip(lm, 6)):
            assert generate(lm, proposer, prompt, k=4, **options).tokens == plain.tokens
    finally:
        default_float32.model.to(torch.float32)


@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "attention"), [("q4", RowAttention), ("bfloat16", InvariantAttention)])
def test_default_model_scores_a_row_the_same_whatever_rows_come_with_it(dtype: str, attention: type) -> None:
    """Deterministic by default: rows scored 1..7 at a time, and tree nodes, get the bits of the
    same rows scored 8 at a time as a chain, after contexts on both sides of the attention's
    width steps and up to 1,500 positions. q4 (int4 projections that treat rows independently)
    attends row by row (`RowAttention`); bfloat16 through batched products whose rows do not
    depend on M (`InvariantAttention`). Their logits round to bfloat16, where exact ties are
    common, so without this a speculative greedy run leaves plain greedy decoding at ties (the
    fused attention, the negative control, differs)."""
    from verispec import load_model

    loaded = load_model(dtype=dtype)
    lm = loaded.lm
    assert lm.deterministic and isinstance(lm.attention, attention)
    fused = LlamaRuntime(lm.shape, lm.embed, lm.layers, lm.norm, lm.head, lm.rope)
    rng = random.Random(0)
    differ = {"deterministic": 0, "fused": 0}
    for length in (5, 62, 70, 300, 1500):
        prompt = [rng.randrange(2000, 20000) for _ in range(length)]
        tokens = [rng.randrange(2000, 20000) for _ in range(8)]
        for name, runtime in (("deterministic", lm), ("fused", fused)):
            runtime.reset()
            runtime.prefill(prompt)
            together = runtime.extend(tokens)  # [8, V]
            for n in range(1, 8):
                runtime.rollback(length)
                differ[name] += not torch.equal(runtime.extend(tokens[:n]), together[:n])
        lm.rollback(length)
        parents = [-1, 0, 0, 2, -1, 4, 1, 3]
        tree = lm.extend_tree(tokens, parents)  # [8, V]
        for node in range(8):
            path = [node]
            while parents[path[-1]] >= 0:
                path.append(parents[path[-1]])
            lm.rollback(length)
            assert torch.equal(lm.extend([tokens[i] for i in reversed(path)])[-1], tree[node])
    assert differ["deterministic"] == 0
    assert differ["fused"] > 0  # measured (2 threads, 2-core AMD EPYC, lengths 5-2,600): q4 28 of 42, bfloat16 37 of 63
