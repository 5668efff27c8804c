"""The EAGLE-style head (Li et al. 2401.15077 EAGLE-1; 2503.01840 EAGLE-3): one decoder layer
that drafts autoregressively in feature space.

One step reads a pair (feature of position t, token t + 1) and predicts the feature of
position t + 1 and, through the output layer, the distribution of token t + 2:

    hidden_t = fuse(target features_t)        [H]   (EAGLE-3: low ⊕ mid ⊕ high -> H; EAGLE-1:
                                                      the FINAL feature, fuse is the identity)
    x_t      = fc(embed(token_{t+1}) ⊕ hidden_t)  [2H -> H]   (the target's embedding, frozen)
    h_t      = decoder layers(x_0..x_t)        [H]   (`depth` transformers Llama decoder layers, causal;
                                                      EAGLE's is one)
    logits_t = output(norm(h_t))               [N]   over the pruned vocabulary d2t
    predicted_t = h_t                          [H]   fed back as hidden_{t+1} while drafting

While drafting, positions past the target's last processed token have no target feature, so
the head feeds its own `predicted` back (feature-space autoregression); its KV cache holds the
pairs and rolls back when the verifier rejects.

Training (teacher forcing) on sequences ids [B, T + 1] with target features [B, T + 1, F]:

    logits, predicted = head(ids[:, 1:], head.fuse(features[:, :-1]))
    # logits [B, T, N]: row t is the head's distribution of ids[:, t + 2] (compare with the
    #   target's row t + 1 restricted to head.d2t; the last row predicts past the sequence)
    # predicted [B, T, H]: row t approximates head.fuse(features[:, t + 1]) (EAGLE-1's feature
    #   loss); an unrolled step (training-time test) feeds `predicted` back as `hidden`
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm, LlamaRotaryEmbedding

from verispec.heads.config import HeadConfig
from verispec.heads.drafting_layer import DraftingLayer
from verispec.heads.feature_head import FeatureHead


class FrozenRows(nn.Module):
    """An output layer that is the target's output rows for the head vocabulary: rows [N, H],
    a buffer that is neither trained nor saved (the target supplies it at load)."""

    def __init__(self, rows: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("rows", rows.detach().clone(), persistent=False)  # [N, H]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [..., H] -> logits [..., N]."""
        return nn.functional.linear(hidden, self.rows)


def output_layer(config: HeadConfig, d2t: torch.Tensor, output_weight: torch.Tensor | None) -> nn.Module:
    """A trained Linear(H, N) or the target's output rows `output_weight[d2t]` (frozen)."""
    if config.trained_output:
        return nn.Linear(config.hidden_size, config.vocab_size, bias=False)
    if output_weight is None:
        raise ValueError("a head with the target's output rows needs the target's output weight [V, H]")
    if tuple(output_weight.shape) != (config.target.vocab_size, config.hidden_size):
        raise ValueError(
            f"the target's output weight has shape {tuple(output_weight.shape)}, the head expects "
            f"[{config.target.vocab_size}, {config.hidden_size}]"
        )
    return FrozenRows(output_weight.detach()[d2t.to(output_weight.device)].float())


def fuse_layer(config: HeadConfig) -> nn.Module:
    """EAGLE-3's fc over concatenated taps [F -> H]; the identity for a single tap."""
    if config.feature_size == config.hidden_size:
        return nn.Identity()
    return nn.Linear(config.feature_size, config.hidden_size, bias=False)


class EagleHead(FeatureHead):
    """config: a `HeadConfig` of kind "eagle". d2t: LongTensor[N], head index -> token id.
    embedding: the target's input embedding [V, H] (kept by reference, frozen, not saved).
    output_weight: the target's output head weight [V, H] (needed unless config.trained_output).

    Saved state (`state_dict`): d2t, fuse, fc, layers, norm, and output when trained.
    """

    def __init__(
        self,
        config: HeadConfig,
        d2t: torch.Tensor,
        embedding: torch.Tensor,
        output_weight: torch.Tensor | None = None,
    ) -> None:
        super().__init__(config, "eagle", d2t, embedding)
        H, V = config.hidden_size, config.target.vocab_size
        self.layer_config = LlamaConfig(
            hidden_size=H, num_hidden_layers=config.depth, vocab_size=V, bos_token_id=None, eos_token_id=None, pad_token_id=None,
            **config.layer,
        )
        self.layer_config._attn_implementation = "sdpa"
        self.fuse = fuse_layer(config)
        self.fc = nn.Linear(2 * H, H, bias=True)
        self.layers = nn.ModuleList(LlamaDecoderLayer(self.layer_config, layer_idx=i) for i in range(config.depth))
        self.rotary = LlamaRotaryEmbedding(self.layer_config)
        self.norm = LlamaRMSNorm(H, eps=self.layer_config.rms_norm_eps)
        self.output = output_layer(config, self.d2t, output_weight)

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
        """tokens: LongTensor[B, T], token t + 1 of each pair; hidden: [B, T, H], the fused
        feature of position t (or the head's own prediction of it). With a cache the pairs
        continue the cached ones (P of them) and are appended to it.

        positions: LongTensor[B, T], rotary positions (default P..P+T-1); allowed: bool
        [T, P + T], which cached and new pairs each new pair attends to (default causal). A
        training-time-test unroll passes its own: step j at positions t + j, attending to the
        causal prefix of step 0 and to its own earlier steps' diagonal.

        Returns logits [B, T, N] (the distribution of token t + 2 over d2t; of the last
        `logits_to_keep` pairs only when it is above 0, as the output layer over N tokens costs
        most of a long catch-up; of the pairs where the bool mask `logits_at` [B, T] holds, as
        [M, N] in row-major order, when given, as fitting scores only some of them) and
        predicted features [B, T, H] (of position t + 1)."""
        dtype = self.dtype
        embedded = nn.functional.embedding(tokens, self.embedding).to(dtype)  # [B, T, H]
        x = self.fc(torch.cat([embedded, hidden.to(dtype)], dim=-1))  # [B, T, H]
        h = self._decoder(x, positions, allowed, cache)  # [B, T, H]
        if logits_at is not None:
            return self.output(self.norm(h[logits_at])), h
        return self.output(self.norm(h[:, -logits_to_keep:] if logits_to_keep else h)), h

    def _decoder(
        self, x: torch.Tensor, positions: torch.Tensor | None, allowed: torch.Tensor | None, cache: DynamicCache | None
    ) -> torch.Tensor:
        """The decoder layers over x [B, T, H] (`forward` says what positions and allowed mean):
        `DraftingLayer`s once `for_drafting` put them in, else transformers' own."""
        if isinstance(self.layers[0], DraftingLayer):
            for layer in self.layers:
                x = layer(x, positions, allowed, cache)
            return x
        B, T, _ = x.shape
        past = 0 if cache is None else cache.get_seq_length()
        if positions is None:
            positions = torch.arange(past, past + T, device=x.device).expand(B, T)  # [B, T]
        if allowed is None:
            allowed = torch.ones(T, past + T, dtype=torch.bool, device=x.device).tril(past)  # [T, P + T]
        rotary = self.rotary(x, positions)
        for layer in self.layers:
            x = layer(
                x,
                attention_mask=allowed[None, None],
                position_ids=positions,
                cache=cache,
                use_cache=cache is not None,
                position_embeddings=rotary,
            )
        return x

    def deepened_from(self, depth: int) -> None:
        """Make layers `depth`.. the identity (their attention output and MLP down projections
        zero, biases included, so each adds nothing to its residual stream): a head whose first
        `depth` layers hold a shallower head's weights then computes exactly what that head
        computes, and fitting grows the new layers from there."""
        with torch.no_grad():
            for layer in self.layers[depth:]:
                for projection in (layer.self_attn.o_proj, layer.mlp.down_proj):
                    projection.weight.zero_()
                    if projection.bias is not None:
                        projection.bias.zero_()
