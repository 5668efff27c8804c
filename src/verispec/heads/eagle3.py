"""The EAGLE-3 head in the standard layout (Li et al. 2503.01840): the architecture that vLLM's
`llama_eagle3.py`, speculators' `Eagle3Speculator` and SpecForge define, so a head trained here
is served by those engines unchanged (`verispec.heads.export`).

One step reads a pair (feature of position t, token t + 1), as `EagleHead` does, but keeps the
embedding and the feature apart until attention:

    hidden_t = fc(low ⊕ mid ⊕ high)_t           [H]   (fc [H, 3H], no bias; the taps [2, 15, 27]
                                                       of a 30-layer target, vLLM's default)
    e        = input_layernorm(embed(token_{t+1})) [H]  (the target's embedding, frozen)
    h        = hidden_norm(hidden_t)             [H]
    residual = hidden_t                          (norm_before_residual: h instead)
    x        = residual + o(attention(q, k, v of e ⊕ h))   q/k/v read 2H columns
    pre      = x + mlp(post_attention_layernorm(x))        [H]
    logits_t = lm_head(norm(pre))                [N]   the head's own output layer over d2t
    predicted_t = pre                            [H]   fed back as hidden_{t+1} while drafting

`EagleHead`'s layer instead mixes e and hidden_t with a biased linear into one H-wide input and
runs a standard decoder layer on it; no choice of weights maps one onto the other.

The module's interface is `EagleHead`'s (`fuse`, `new_cache`, `forward` with the same
arguments, `dtype`, `d2t`), so `EagleProposer` drafts with it and `eagle_steps` trains it as it
is. Its state names are speculators' (`fc`, `layers.0.hidden_norm`, `lm_head`, ...), d2t aside,
which verispec stores as target ids (vLLM as offsets).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from verispec.heads.config import HeadConfig
from verispec.heads.feature_head import FeatureHead
from verispec.models.formats.linear import fused_projection, packed_linears, projection
from verispec.models.rope import RopeTables, rope_parameters

NORM_BEFORE_RESIDUAL = "norm_before_residual"  # a key of HeadConfig.layer (default False)


def layer_config(config: HeadConfig) -> LlamaConfig:
    """The decoder layer's LlamaConfig from the head's `layer` fields."""
    fields = {key: value for key, value in config.layer.items() if key != NORM_BEFORE_RESIDUAL}
    return LlamaConfig(
        hidden_size=config.hidden_size, num_hidden_layers=1, vocab_size=config.target.vocab_size,
        bos_token_id=None, eos_token_id=None, pad_token_id=None, **fields,
    )


class Eagle3Layer(nn.Module):
    """The one decoder layer; names as in vLLM's `llama_eagle3.LlamaDecoderLayer`."""

    def __init__(self, config: LlamaConfig, norm_before_residual: bool) -> None:
        super().__init__()
        H = config.hidden_size
        self.heads, self.kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = H // self.heads
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(2 * H, self.heads * self.head_dim, bias=False)
        self.self_attn.k_proj = nn.Linear(2 * H, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.v_proj = nn.Linear(2 * H, self.kv_heads * self.head_dim, bias=False)
        self.self_attn.o_proj = nn.Linear(self.heads * self.head_dim, H, bias=False)
        self.post_attention_layernorm = LlamaRMSNorm(H, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)
        self.rope = RopeTables(*rope_parameters(config), torch.float32)  # moved to the input's device on first use
        self.qkv: nn.Module | None = None  # q, k and v fused, once `pack` ran (drafting)

    def pack(self, weight_format: str) -> None:
        """For drafting: q, k and v as one projection, every projection in `weight_format`, and
        attention over a float32 cache (as `DraftingLayer`'s, for the same reason: torch's
        fused kernel is slow for one bfloat16 query row)."""
        attention = self.self_attn
        self.qkv = fused_projection(
            [attention.q_proj.weight.detach(), attention.k_proj.weight.detach(), attention.v_proj.weight.detach()],
            [None, None, None], weight_format,
        )
        del attention.q_proj, attention.k_proj, attention.v_proj
        attention.o_proj = projection(attention.o_proj.weight.detach(), None, weight_format)
        packed_linears(self.mlp, weight_format)

    def forward(
        self, embedded: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor | None,
        cache: DynamicCache | None, end: int,
    ) -> torch.Tensor:
        """embedded, hidden [B, T, H]; positions LongTensor[B, T], all below `end`; allowed
        bool [T, P + T] over the P cached pairs and the new ones (None: every one, a single
        pair's causal mask). Returns the pre-norm output [B, T, H]."""
        B, T, _ = hidden.shape
        dtype = hidden.dtype
        if self.norm_before_residual:
            hidden = self.hidden_norm(hidden)
            residual, normed = hidden, hidden
        else:
            residual, normed = hidden, self.hidden_norm(hidden)
        x = torch.cat([self.input_layernorm(embedded), normed], dim=-1)  # [B, T, 2H], embedding first
        if self.qkv is None:
            attention = self.self_attn
            q, k, v = attention.q_proj(x), attention.k_proj(x), attention.v_proj(x)
        else:
            q, k, v = self.qkv(x).split([self.heads * self.head_dim, *[self.kv_heads * self.head_dim] * 2], dim=-1)
        q = self._rotated(q.view(B, T, self.heads, self.head_dim), positions, end)  # [B, Hq, T, D]
        k = self._rotated(k.view(B, T, self.kv_heads, self.head_dim), positions, end)  # [B, Hkv, T, D]
        v = v.view(B, T, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, Hkv, T, D]
        if self.qkv is not None:  # drafting: keys, values and the query in float32
            q, k, v = q.float(), k.float(), v.float()
        if cache is not None:
            k, v = cache.update(k, v, 0)  # [B, Hkv, P + T, D]
        attended = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)  # [B, Hq, T, D]
        attended = attended.transpose(1, 2).reshape(B, T, self.heads * self.head_dim).to(dtype)
        x = residual + self.self_attn.o_proj(attended)
        return x + self.mlp(self.post_attention_layernorm(x))

    def _rotated(self, x: torch.Tensor, positions: torch.Tensor, end: int) -> torch.Tensor:
        """x [B, T, heads, D] rotated at positions [B, T] (below `end`) -> [B, heads, T, D]."""
        B, T, heads, D = x.shape
        if self.rope.device != x.device:
            self.rope = RopeTables(self.rope.inv_freq, self.rope.scaling, torch.float32, device=x.device)
        self.rope.ensure(end)
        flat = positions.reshape(-1)
        cos = self.rope.cos[flat][:, None, :].to(x.dtype)  # [B T, 1, D]
        sin = self.rope.sin[flat][:, None, :].to(x.dtype)
        return self.rope.rotate(x.reshape(B * T, heads, D), cos, sin).view(B, T, heads, D).transpose(1, 2)


class Eagle3Head(FeatureHead):
    """config: a `HeadConfig` of kind "eagle3" (one layer, trained output; `layer` may hold
    `norm_before_residual`). d2t: LongTensor[N], head index -> token id (ascending).
    embedding: the target's input embedding [V, H] (frozen, not saved). output_weight: the
    target's output weight [V, H], whose rows for d2t start `lm_head` (then trained).

    Saved state: d2t, fc, layers.0.*, norm, lm_head.
    """

    def __init__(
        self, config: HeadConfig, d2t: torch.Tensor, embedding: torch.Tensor, output_weight: torch.Tensor | None = None
    ) -> None:
        super().__init__(config, "eagle3", d2t, embedding)
        H = config.hidden_size
        self.layer_config = layer_config(config)
        self.fc = nn.Linear(config.feature_size, H, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(self.layer_config, bool(config.layer.get(NORM_BEFORE_RESIDUAL, False)))])
        self.norm = LlamaRMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(H, config.vocab_size, bias=False)
        if output_weight is not None:  # start from the target's own rows: a fresh head drafts as the target's row would
            with torch.no_grad():
                self.lm_head.weight.copy_(output_weight.detach()[self.d2t.to(output_weight.device)])

    @property
    def fuse(self) -> nn.Module:
        """The fusion of the taps [F -> H] (`EagleHead.fuse`'s role), vLLM's `fc`."""
        return self.fc

    def forward(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        cache: DynamicCache | None = None,
        *,
        positions: torch.Tensor | None = None,
        allowed: torch.Tensor | None = None,
        logits_to_keep: int = 0,
        logits_at: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As `EagleHead.forward`: tokens LongTensor[B, T] (token t + 1 of each pair), hidden
        [B, T, H] (the fused feature of position t, or the head's own prediction of it).
        Returns logits [B, T, N] (or of the last `logits_to_keep` pairs, or [M, N] where
        `logits_at` holds) and predicted features [B, T, H] (the pre-norm output)."""
        dtype = self.dtype
        B, T = tokens.shape
        past = 0 if cache is None else cache.get_seq_length()
        if positions is None:  # a chain: no read back from the device to size the rotary tables
            positions, end = torch.arange(past, past + T, device=tokens.device).expand(B, T), past + T  # [B, T]
        else:
            end = int(positions.max()) + 1
        if allowed is None and T > 1:
            allowed = torch.ones(T, past + T, dtype=torch.bool, device=tokens.device).tril(past)  # [T, P + T]
        elif allowed is not None and T == 1 and bool(allowed.all()):
            allowed = None  # one pair seeing every cached one: attention without a mask
        embedded = nn.functional.embedding(tokens, self.embedding).to(dtype)  # [B, T, H]
        h = self.layers[0](embedded, hidden.to(dtype), positions, allowed, cache, end)  # [B, T, H]
        if logits_at is not None:
            return self.lm_head(self.norm(h[logits_at])), h
        return self.lm_head(self.norm(h[:, -logits_to_keep:] if logits_to_keep else h)), h

    def for_drafting(self, weight_format: str = "float") -> Eagle3Head:
        """In place: the projections packed in `weight_format` (see `checkpoint.for_drafting`)."""
        self.layers[0].pack(weight_format)
        self.fc = projection(self.fc.weight.detach(), None, weight_format)
        self.lm_head = projection(self.lm_head.weight.detach(), None, weight_format)
        return self
