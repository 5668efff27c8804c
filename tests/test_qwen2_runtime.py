"""Qwen2 on the fast runtime: a tiny random `Qwen2ForCausalLM` built in code (nothing fetched),
with its q, k and v biases, an untied head and RoPE theta 1e6. Its float32 logits equal
transformers' within FP32_ATOL (bit for bit with transformers' own products); any history of
extends and rollbacks equals a full recompute; the biases ride on the fused projection in
every weight format."""

from __future__ import annotations

import random

import pytest
import torch
from test_hf_adapter import FP32_ATOL, check_random_history
from transformers import Qwen2Config, Qwen2ForCausalLM

from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.formats.linear import DenseLinear
from verispec.models.runtimes.llama import LlamaRuntime, fast_runtime_refusal
from verispec.models.formats.quant import Int4Linear, linear_for

VOCAB = 96


def tiny_qwen2(seed: int = 0, **overrides) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        rope_theta=1_000_000.0,
        tie_word_embeddings=False,
        initializer_range=0.2,  # wide logits: greedy gaps dwarf float32 rounding
        **overrides,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # transformers initialises biases to zero; the runtime must carry real ones
        for layer in model.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                linear.bias.normal_(0, 0.5)
    return model


@pytest.fixture(scope="module")
def model() -> Qwen2ForCausalLM:
    return tiny_qwen2()


def test_the_tiny_model_is_a_qwen2(model) -> None:
    attention = model.model.layers[0].self_attn
    assert attention.q_proj.bias is not None and attention.o_proj.bias is None
    assert model.lm_head.weight is not model.model.embed_tokens.weight
    assert model.config.rope_parameters["rope_theta"] == 1_000_000.0
    assert fast_runtime_refusal(model) is None


@pytest.mark.parametrize("length", [1, 7, 40])
def test_logits_equal_transformers(model, length: int) -> None:
    ids = [random.Random(length).randrange(VOCAB) for _ in range(length)]
    expected = HFCausalLM(model).score(ids)
    torch.testing.assert_close(LlamaRuntime.from_hf(model).score(ids), expected, atol=FP32_ATOL, rtol=0)
    assert torch.equal(LlamaRuntime.from_hf(model, "dense").score(ids), expected)  # transformers' own products


@pytest.mark.parametrize("deterministic", [False, True], ids=["sdpa", "deterministic"])
def test_rollback_equals_full_recompute(model, deterministic: bool) -> None:
    lm = LlamaRuntime.from_hf(model, deterministic=deterministic)
    check_random_history(lm, [3, 1, 4, 1, 5], seed=1, steps=40, atol=FP32_ATOL)


def test_the_biases_ride_on_every_weight_format(model) -> None:
    ids = [random.Random(9).randrange(VOCAB) for _ in range(12)]
    expected = HFCausalLM(model).score(ids)
    attention = model.model.layers[0].self_attn
    qkv_bias = torch.cat([attention.q_proj.bias, attention.k_proj.bias, attention.v_proj.bias])
    for fmt in ("q4", "int8"):  # weights quantized on load (another model); the biases as they are
        lm = LlamaRuntime.from_hf(model, fmt)
        assert torch.equal(lm.layers[0].qkv.bias, qkv_bias) and lm.layers[0].o.bias is None
    zeroed = tiny_qwen2()
    with torch.no_grad():
        for layer in zeroed.model.layers:
            for linear in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                linear.bias.zero_()
    assert not torch.allclose(LlamaRuntime.from_hf(zeroed).score(ids), expected, atol=1e-2)


def test_a_quantized_projection_adds_its_bias() -> None:
    weight = torch.randn(32, 64, generator=torch.Generator().manual_seed(0))
    bias = torch.randn(32, generator=torch.Generator().manual_seed(1))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    for fmt in ("q4", "int8", "float32"):
        plain, biased = linear_for(weight, fmt), linear_for(weight, fmt, bias=bias)
        assert torch.equal(biased(x), plain(x) + bias), fmt
    assert isinstance(linear_for(weight, "q4", bias=bias), Int4Linear)
    assert isinstance(linear_for(weight, "float32", bias=bias), DenseLinear)


def test_sliding_window_attention_is_refused() -> None:
    model = tiny_qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert "sliding-window" in fast_runtime_refusal(model)


def test_weight_bytes_count_each_tensor_once(model) -> None:
    from verispec.models.loading.memory import weight_bytes

    params = sum(p.numel() for p in model.parameters())
    # Prepacked: every parameter once, plus the head's packed copy beside the dense head.
    assert weight_bytes(LlamaRuntime.from_hf(model)) == 4 * (params + model.lm_head.weight.numel())
    # transformers' products: the head module and the dense head share one tensor.
    assert weight_bytes(LlamaRuntime.from_hf(model, "dense")) == 4 * params
    assert weight_bytes(LlamaRuntime.from_hf(model, "q4")) < weight_bytes(LlamaRuntime.from_hf(model, "dense")) / 3
