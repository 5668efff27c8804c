"""Trained-head proposers by name: `eagle[:DIR]` and `medusa[:DIR]`.

Without DIR the head shipped for the default model is loaded (package data under
`verispec/heads/default/<kind>`); with DIR, a head directory written by `verispec train --out`
(`verispec.heads.checkpoint`). Either is refused for a target of another shape.
"""

from __future__ import annotations

from pathlib import Path

import torch

from verispec.machine import native_bf16
from verispec.models import DEFAULT_MODEL
from verispec.models.base import CausalLM
from verispec.proposers.base import Proposer

HEAD_KINDS = ("eagle", "medusa")
# Package data of verispec.heads, found without importing it (that would import transformers).
SHIPPED = Path(__file__).resolve().parent.parent / "heads" / "default"


def default_head(kind: str) -> Path:
    """The directory of the `kind` head shipped for the default model (it may be absent)."""
    return SHIPPED / kind


def head_proposer(kind: str, directory: str | None, target: CausalLM, dtype: torch.dtype | None = None) -> Proposer:
    """An EAGLE or Medusa proposer for `target` (the engine's target, with a feature channel)
    with the head in `directory`, or the shipped one when None, packed for drafting and run in
    `dtype`. None: bfloat16 where the CPU computes it natively, else float32, whatever the
    target's dtype (a packed bfloat16 EAGLE step took 0.8 ms against 1.2 ms in float32 on a
    2-core AMD EPYC with AVX-512 BF16; emulated bfloat16 is slower). The dtype changes q,
    never the exactness of the output."""
    from verispec.heads import for_drafting, load_head
    from verispec.proposers.eagle import EagleProposer
    from verispec.proposers.medusa import MedusaProposer

    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; choose {' or '.join(HEAD_KINDS)}")
    if directory is None:
        directory = default_head(kind)
        if not directory.is_dir():
            raise ValueError(
                f"no {kind} head is shipped in this installation (looked in {directory}); train one with "
                f"`verispec train --model {DEFAULT_MODEL} --head {kind} --out DIR` and pass {kind}:DIR"
            )
    elif not Path(directory).is_dir():
        raise ValueError(f"{kind}:DIR needs a head directory; {directory} is not a directory")
    if dtype is None:
        dtype = torch.bfloat16 if native_bf16() else torch.float32
    head = load_head(directory, target, dtype)
    if head.config.kind != kind:
        raise ValueError(f"{directory} holds a {head.config.kind} head, not a {kind} head; use {head.config.kind}:{directory}")
    return (EagleProposer if kind == "eagle" else MedusaProposer)(for_drafting(head), target)
