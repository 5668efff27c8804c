"""`DraftingLayer`: the EAGLE head's decoder layer as `--proposer eagle` runs it.

The same computation as the transformers `LlamaDecoderLayer` it is built from, on one
sequence, with the fast runtime's parts (`verispec.models.runtimes.llama`):

    h = rms_norm(x)                      x[T, H]
    q, k, v = qkv(h)                     one fused prepacked projection -> [T, Hq + 2 Hkv, D]
    q, k = rope(q, k)                    both at once, from precomputed tables
    K, V = cache.update(k, v)            the head's cache (`BufferedLayer`), in float32
    x = x + o(attention(q, K, V))        torch's fused kernel in float32; no mask for one row
    x = x + down(silu(gate) * up)        gate and up from one fused projection

Transformers' layer runs seven projections and gets cos/sin computed per call by the head's
rotary module, with its mask and reshaping glue around them; a drafting step is one pair, so
those fixed costs are a large share of it (measured with `benchmarks/head_cost.py --forms
packed-hf-layer,for-drafting`: docs/results/implementation-choices.md).
The output is the same function up to summation order (the projections are fused, and the
tables hold transformers' own rounding of cos and sin). Drafting only: it holds no
parameters, so nothing trains through it.

It runs on the device of the layer it is built from (the target's: `checkpoint.new_head`), its
rotary tables and masks there too.

Attention runs in float32 whatever the head's dtype: the cache holds float32 keys and values
(3 x 64 numbers a position each, for SmolLM2's head) and the query is cast up, and the result
is cast back before `o`. torch's fused CPU kernel is slow for one bfloat16 query row, several
times slower than over a float32 cache and a sizeable part of a drafting step (docs/results/implementation-choices.md); its
softmax accumulates in float32 either way.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from verispec.models.attention import SdpaAttention
from verispec.models.formats.linear import fused_projection
from verispec.models.norm import rms_norm
from verispec.models.rope import RopeTables, rope_parameters


def _fused(*linears: nn.Linear, weight_format: str) -> nn.Module:
    """One projection in `weight_format` computing every linear's output side by side."""
    weights = [linear.weight.detach() for linear in linears]  # each [out, in]
    biases = [None if linear.bias is None else linear.bias.detach() for linear in linears]
    return fused_projection(weights, biases, weight_format)


class DraftingLayer(nn.Module):
    """Built from a trained `LlamaDecoderLayer` and its config (SiLU-gated, as Llama's), its
    projections in `weight_format` (`models.formats.linear.projection`: "float" prepacked, or "int8")."""

    def __init__(self, layer: LlamaDecoderLayer, config: LlamaConfig, weight_format: str = "float") -> None:
        super().__init__()
        if config.hidden_act != "silu":
            raise ValueError(f"the drafting layer's MLP is SiLU-gated and this head's uses {config.hidden_act!r}")
        attention, mlp = layer.self_attn, layer.mlp
        self.index = attention.layer_idx  # its layer in the head's cache
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = attention.head_dim
        self.intermediate = config.intermediate_size
        self.eps = config.rms_norm_eps
        fused = functools.partial(_fused, weight_format=weight_format)
        self.qkv = fused(attention.q_proj, attention.k_proj, attention.v_proj)  # [T, H] -> [T, (Hq + 2 Hkv) D]
        self.o = fused(attention.o_proj)  # [T, Hq D] -> [T, H]
        self.gate_up = fused(mlp.gate_proj, mlp.up_proj)  # [T, H] -> [T, 2 I]
        self.down = fused(mlp.down_proj)  # [T, I] -> [T, H]
        self.register_buffer("attention_norm", layer.input_layernorm.weight.detach(), persistent=False)  # [H]
        self.register_buffer("mlp_norm", layer.post_attention_layernorm.weight.detach(), persistent=False)  # [H]
        self.rope = RopeTables(*rope_parameters(config), self.attention_norm.dtype, device=self.attention_norm.device)
        self.attention = SdpaAttention(self.heads, self.kv_heads, self.head_dim)

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor | None, allowed: torch.Tensor | None, cache: DynamicCache
    ) -> torch.Tensor:
        """x [1, T, H] after the P pairs in `cache` (appended to it); positions LongTensor[1, T]
        (None: P..P+T-1), each below P + T (a tree node sits at its depth, after its ancestors'
        pairs), so the tables are sized without reading them back from the device; allowed bool
        [T, P + T] (None: causal). Returns [1, T, H]."""
        batch, t, _ = x.shape
        if batch != 1:
            raise ValueError(f"the drafting layer runs one sequence, got a batch of {batch}")
        past = cache.get_seq_length(self.index)
        self.rope.ensure(past + t)
        cos, sin = self.rope.at(slice(past, past + t) if positions is None else positions[0])  # [T, 1, D] each
        if allowed is None:
            allowed = self.attention.mask(past, t, x.dtype)  # None for one row
            allowed = None if allowed is None else allowed.to(x.device)
        x = x[0]  # [T, H]
        q_end, k_end = self.heads, self.heads + self.kv_heads
        qkv = self.qkv(rms_norm(x, self.attention_norm, self.eps)).view(t, k_end + self.kv_heads, self.head_dim)
        qk = self.rope.rotate(qkv[:, :k_end], cos, sin).float()  # [T, Hq + Hkv, D]
        new_values = qkv[None, :, k_end:].transpose(1, 2).float()  # [1, Hkv, T, D]
        keys, values = cache.update(qk[None, :, q_end:].transpose(1, 2), new_values, self.index)  # [1, Hkv, P + T, D]
        attended = self.attention(qk[None, :, :q_end].transpose(1, 2), keys, values, allowed)  # [T, Hq D] float32
        x = x + self.o(attended.to(x.dtype))
        gate_up = self.gate_up(rms_norm(x, self.mlp_norm, self.eps))  # [T, 2 I]
        x = x + self.down(nn.functional.silu(gate_up[:, : self.intermediate]) * gate_up[:, self.intermediate :])
        return x[None]
