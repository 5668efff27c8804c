"""`FeatureHead`: what the EAGLE and EAGLE-3 heads share.

Both read the target's fused features and token embeddings, draft over a pruned vocabulary
`d2t` (head index -> token id), and keep one buffered KV cache layer per decoder layer. This
base checks those inputs once and owns the cache and the compute dtype; each head adds its
layers, its `norm` and its `forward`.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import DynamicCache

from verispec.heads.config import HeadConfig
from verispec.heads.vocab import check_d2t
from verispec.models.runtimes.hf import BufferedLayer


class FeatureHead(nn.Module):
    """config: a `HeadConfig` of kind `kind`. d2t: LongTensor[N], head index -> token id.
    embedding: the target's input embedding [V, H] (kept by reference, frozen, not saved).

    A subclass sets `layer_config` (a LlamaConfig), `layers` (an nn.ModuleList) and `norm`.
    """

    def __init__(self, config: HeadConfig, kind: str, d2t: torch.Tensor, embedding: torch.Tensor) -> None:
        super().__init__()
        if config.kind != kind:
            raise ValueError(f"{type(self).__name__} needs a config of kind {kind!r}, got {config.kind!r}")
        H, V = config.hidden_size, config.target.vocab_size
        if tuple(embedding.shape) != (V, H):
            raise ValueError(f"the target's embedding has shape {tuple(embedding.shape)}, the head expects [{V}, {H}]")
        d2t = check_d2t(d2t, V)
        if d2t.numel() != config.vocab_size:
            raise ValueError(f"d2t holds {d2t.numel()} token ids, the config says N = {config.vocab_size}")
        self.config = config
        self.embedding = embedding.detach()  # [V, H], the target's: not a parameter, not saved
        self.register_buffer("d2t", d2t)  # [N]

    @property
    def dtype(self) -> torch.dtype:
        """What the head computes in (its norm is never packed, see `checkpoint.for_drafting`)."""
        return self.norm.weight.dtype

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for one sequence; roll back with `cache.crop(length - cache_length)`."""
        cache = DynamicCache(config=self.layer_config)
        cache.layers = [BufferedLayer() for _ in self.layers]
        return cache
