"""Trained heads that draft from the target's own features: EAGLE-style and Medusa.

- `config`: `HeadConfig`, what a head is (its target, features, vocabulary, architecture);
- `vocab`: the pruned head vocabulary (d2t) and q over the full vocabulary;
- `eagle`: `EagleHead`, decoder layers (EAGLE's one) drafting in feature space with a KV cache;
- `eagle3`: `Eagle3Head`, EAGLE-3's standard layer (vLLM's `llama_eagle3`, speculators), which
  `export` writes in speculators' format and reads back;
- `drafting_layer`: `DraftingLayer`, the EAGLE decoder layer as drafting runs it;
- `medusa`: `MedusaHead`, K residual heads on one feature;
- `checkpoint`: `new_head`, `save_head`, `load_head` (a directory `--proposer eagle:DIR` loads),
  `read_weights` and `load_weights` (a saved state, e.g. to continue fitting it), `for_drafting`
  (a loaded head with its projections prepacked, as the proposers run it), `write_head`;
- `average`: `average_heads`, the weighted mean of heads of one architecture and vocabulary
  (a head and the head continued from it: weight-space ensembling).

The proposers that drive them are `verispec.proposers.eagle` and `verispec.proposers.medusa`.
"""

from verispec.heads.average import average_heads
from verispec.heads.checkpoint import (
    for_drafting, load_head, load_weights, new_head, read_config, read_weights, save_head, target_info, write_head,
)
from verispec.heads.config import HeadConfig, HeadKind, TargetInfo, default_layer, eagle3_layers
from verispec.heads.eagle import EagleHead
from verispec.heads.eagle3 import Eagle3Head
from verispec.heads.medusa import MedusaHead
from verispec.heads.vocab import HeadVocab

__all__ = [
    "Eagle3Head", "EagleHead", "HeadConfig", "HeadKind", "HeadVocab", "MedusaHead", "TargetInfo", "average_heads", "default_layer", "eagle3_layers",
    "for_drafting", "load_head", "load_weights", "new_head", "read_config", "read_weights", "save_head", "target_info",
    "write_head",
]
