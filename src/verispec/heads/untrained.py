"""Untrained heads: for table targets, what the exhaustive audit, the property test and the
statistical test run the head proposers with; for a real target, a seeded EAGLE-3 head that
checks another engine's EAGLE-3 path (`benchmarks/vllm_check.py`, `verispec check-runtime vllm`).

Exactness must hold whatever the weights, so seeded random weights serve; being untrained,
their q is far from p, which visits many rejections and every repair path.
"""

from __future__ import annotations

from pathlib import Path

import torch

from verispec.head_kind import HeadKind
from verispec.heads.checkpoint import Head, new_head, save_head, target_info
from verispec.heads.config import FINAL, HeadConfig, default_layer, eagle3_layers
from verispec.models.tables import TableLM

TINY_LAYER = {"num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 8,
              "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu"}


def tiny_head(kind: str, target: TableLM, seed: int = 0, heads: int = 3) -> Head:
    """A float64 head for a table target: EAGLE and EAGLE-3 fusing two taps, Medusa with
    `heads` heads on the FINAL feature; its vocabulary pruned to every token but the last, so
    q has an exact zero where p may not. Weights from a private seeded generator.

    >>> tiny_head("medusa", random_table(4, 1, seed=0)).d2t.tolist()
    [0, 1, 2]
    """
    vocab = target.vocab_size
    config = HeadConfig(
        kind, target_info(target, "table"), (FINAL,) if kind == HeadKind.MEDUSA else (FINAL, 1),
        vocab_size=max(1, vocab - 1), layer={} if kind == HeadKind.MEDUSA else TINY_LAYER, trained_output=kind == HeadKind.EAGLE3,
        heads=heads if kind == HeadKind.MEDUSA else 0,
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return new_head(config, torch.arange(config.vocab_size), target).double().eval()


def seeded_eagle3(target, directory: Path, seed: int = 0) -> Path:
    """A seeded EAGLE-3 head for `target` (a `LoadedModel`) saved in `directory` as `verispec
    train` saves one: vLLM's default taps, a draft vocabulary of 8192 every other id (so d2t and
    t2d are exercised)."""
    lm = target.lm
    config = HeadConfig(
        "eagle3", target_info(lm, target.name), eagle3_layers(lm.num_layers), vocab_size=8192, trained_output=True,
        layer={**default_layer(target.config), "max_position_embeddings": target.config.max_position_embeddings},
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        head = new_head(config, torch.arange(0, 2 * 8192, 2), lm)
    return save_head(head, directory)
