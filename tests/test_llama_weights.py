"""The one reader of a transformers Llama/Qwen2 checkpoint (`models.formats.llama_weights`): the layout
both runtimes build from, read a layer at a time, and each runtime's refusal in its own words."""

from __future__ import annotations

import pytest
import torch
from test_hf_adapter import VOCAB, tiny_llama
from test_qwen2_runtime import tiny_qwen2
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.formats.llama_weights import read_llama
from verispec.models.runtime import Runtime
from verispec.models.runtimes.static_llama import StaticLlama

BUILDS = {Runtime.FAST: LlamaRuntime.from_hf, Runtime.STATIC: StaticLlama.from_hf}

pytestmark = pytest.mark.usefixtures("one_thread_per_module")


def test_the_layout_stacks_q_k_v_and_gate_up_and_carries_qwen2s_biases() -> None:
    llama = tiny_llama(0)
    read = read_llama(llama, Runtime.FAST)
    layer, attn, mlp, s = next(read.layers()), llama.model.layers[0].self_attn, llama.model.layers[0].mlp, read.shape
    assert torch.equal(layer.qkv.weight(), torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert layer.qkv.weight().shape == ((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden)
    assert torch.equal(layer.gate_up.weight(), torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert read.biased == () and layer.qkv.bias() is None and not read.tied
    qwen2 = tiny_qwen2(0)
    read = read_llama(qwen2, Runtime.STATIC, dtype=torch.bfloat16)
    attn = qwen2.model.layers[0].self_attn
    bias = next(read.layers()).qkv.bias()  # [(Hq + 2 Hkv) D]
    assert read.biased == ("qkv",) and read.embed.dtype == bias.dtype == torch.bfloat16
    assert torch.equal(bias, torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).to(torch.bfloat16))


def test_consuming_releases_a_layer_once_the_next_is_asked_for() -> None:
    model = tiny_llama(0)
    layers = read_llama(model, Runtime.FAST, consume=True).layers()
    first, second = (layer.self_attn.q_proj for layer in model.model.layers)
    next(layers)
    assert first.weight is not None
    next(layers)
    assert first.weight is None and second.weight is not None
    next(layers, None)
    assert second.weight is None and model.model.layers[1].mlp.down_proj.weight is None


@pytest.mark.parametrize("runtime", BUILDS)
def test_each_runtime_refuses_what_it_cannot_read_in_its_own_words(runtime: Runtime) -> None:
    torch.manual_seed(0)
    mistral = MistralForCausalLM(MistralConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2,
    ))
    with pytest.raises(ValueError, match=f"^{runtime.named} runs Llama-architecture models and this is 'mistral'"):
        BUILDS[runtime](mistral)
    dynamic = tiny_llama(0)
    dynamic.config.rope_parameters = {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}
    with pytest.raises(ValueError, match=f"^{runtime.named} cannot read this model: rope type 'dynamic' changes its "
                                         "frequencies with the sequence length.*; use runtime 'hf'$"):
        BUILDS[runtime](dynamic)


def test_biases_past_qkv_run_on_the_fast_runtime_and_the_static_one_refuses_them() -> None:
    """Llama's attention_bias (q, k, v and o) and mlp_bias: the fast runtime carries every bias
    on its projections, bit for bit with transformers' products; the static runtime adds one to
    q, k and v only and says so rather than dropping the others."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, initializer_range=0.2, attention_bias=True, mlp_bias=True,
    ))
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith(".bias"):
                parameter.normal_(std=0.2)  # transformers starts them at zero, which would hide a dropped one
    assert read_llama(model, Runtime.FAST).biased == ("qkv", "o", "gate_up", "down")
    ids = list(range(3, 40))
    assert torch.equal(LlamaRuntime.from_hf(model, "dense").score(ids), HFCausalLM(model).score(ids))
    with pytest.raises(ValueError, match="the static runtime adds a bias to q, k and v only and this model's o, gate_up, down"):
        StaticLlama.from_hf(model)
