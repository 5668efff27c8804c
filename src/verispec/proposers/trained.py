"""Trained-head proposers by name: `eagle[:DIR][:weights=F]` and `medusa[:DIR][:weights=F]`.

Without DIR the head shipped for the default model is loaded (package data under
`verispec/heads/default/<kind>`); with DIR, a head directory written by `verispec train --out`
(`verispec.heads.checkpoint`). Either is refused for a target of another shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from verispec.head_kind import HeadKind, head_kind
from verispec.machine import native_bf16
from verispec.models import DEFAULT_MODEL, weight_format
from verispec.models.base import CausalLM
from verispec.models.weight_format import HEAD, WeightFormat, head_packing
from verispec.proposers.base import Proposer
from verispec.proposers.kind import ProposerKind

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


HEAD_KINDS = (HeadKind.EAGLE, HeadKind.MEDUSA)
# A drafted token of the shipped head, as a share of q4's one-row target forward (the fastest
# format where it was measured): c = 0.027-0.042 for lookup+eagle at k 1-4 and auto
# (docs/results/autok-real-q4.md). The head drafts in its own format (`auto_head_format`),
# whatever the target's, so its seconds are the same beside a bfloat16 target.
HEAD_DRAFT_COST = 0.035  # what `head_proposer` builds (eagle3: `proposers.eagle3`)
# How a head drafts, by weight format (`models.weight_format.HEAD`): the dtype it computes in and
# its projections' route (`head_packing`). The head only proposes, so the choice changes q, never
# the output's law. "auto" (`auto_head_format`): on the CPU int8 where it computes bfloat16
# natively (its kernel takes bfloat16 activations), else float32; on a GPU the target's dtype.
HEAD_FORMATS = {fmt: head_packing(fmt) for fmt in HEAD}
# Package data of verispec.heads, found without importing it (that would import transformers).
SHIPPED = Path(__file__).resolve().parent.parent / "heads" / "default"


def default_head(kind: HeadKind) -> Path:
    """The directory of the `kind` head shipped for the default model (it may be absent)."""
    return SHIPPED / kind


def shipped(kind: HeadKind, spec: str | None = None) -> str | None:
    """`spec` (default: the kind's name) where a `kind` head is shipped for the default model,
    so the greedy identity suite runs it; None where none is."""
    return (spec or str(kind)) if default_head(kind).is_dir() else None


def auto_head_format(device: torch.device | str = "cpu", target_dtype: torch.dtype = torch.float32) -> WeightFormat:
    """How a head drafts beside a target on `device` computing in `target_dtype`. On a GPU: the
    target's dtype (bfloat16; float32 for a float32 or float16 target, float16 not being a head
    format), since torch's int8 kernel is the CPU's and a one-layer head's weights are few. On
    the CPU: int8 where it computes bfloat16 natively, else float32 (emulated bfloat16 is slower).

    The head's bfloat16 weights are read back from memory after every target forward and int8
    halves them, so an int8 round is cheaper at the same tau, and a packed bfloat16 step is
    cheaper than a float32 one where bfloat16 is native (docs/results/implementation-choices.md)."""
    if torch.device(device).type != "cpu":
        return WeightFormat.BFLOAT16 if target_dtype == torch.bfloat16 else WeightFormat.FLOAT32
    return WeightFormat.INT8 if native_bf16() else WeightFormat.FLOAT32


def head_proposer(
    kind: HeadKind | str, directory: str | None, target: CausalLM, head_format: WeightFormat | str = "auto"
) -> Proposer:
    """An EAGLE or Medusa proposer for `target` (the engine's target, with a feature channel)
    with the head in `directory`, or the shipped one when None, on the target's device, packed
    for drafting in `head_format` (one of `models.weight_format.HEAD`, or "auto":
    `auto_head_format`; a name is read by `drafting_format`), whatever the target's dtype."""
    from verispec.heads import for_drafting, load_head
    from verispec.proposers.eagle import EagleProposer
    from verispec.proposers.medusa import MedusaProposer

    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}; choose {' or '.join(HEAD_KINDS)}")
    dtype, route = HEAD_FORMATS[drafting_format(head_format, target)]
    if directory is None:
        directory = default_head(kind)
        if not directory.is_dir():
            raise ValueError(
                f"no {kind} head is shipped in this installation (looked in {directory}); train one with "
                f"`verispec train --model {DEFAULT_MODEL} --head {kind} --out DIR` and pass {kind}:DIR"
            )
    elif not Path(directory).is_dir():
        raise ValueError(f"{kind}:DIR needs a head directory; {directory} is not a directory")
    head = load_head(directory, target, dtype)
    if head.config.kind != kind:
        raise ValueError(f"{directory} holds a {head.config.kind} head, not a {kind} head; use {head.config.kind}:{directory}")
    return (EagleProposer if kind == HeadKind.EAGLE else MedusaProposer)(for_drafting(head, route), target)


# Where a head ships for the model, lookup+eagle with auto k (on the CPU and on a GPU, where the
# head drafts on the target's device): it copies where the context repeats itself and drafts with
# the head elsewhere. In the kept runs (docs/benchmarking.md#results) it was the fastest
# verispec method of the q4 run (q4 is what --dtype auto picks where the CPU has native bf16),
# and ahead of lookup alone in bfloat16, on the dev prompts and on the copy-heavy categories. Elsewhere prompt lookup: it needs
# no head, and auto k turns it off where it finds nothing to copy.
BEST_WITH_HEAD = "lookup+eagle"
BEST_WITHOUT_HEAD = "lookup"
DEFAULT_PROPOSER_HELP = (
    f"{BEST_WITH_HEAD} for a model that ships an EAGLE head (the default model), else {BEST_WITHOUT_HEAD}"
)


def default_proposer(model: str) -> str:
    """The proposer `generate`, `demo` and `serve` use when none is named, on any device: the
    best measured one for `model`, `BEST_WITH_HEAD` where a head ships for it, else
    `BEST_WITHOUT_HEAD`.

    >>> default_proposer("/models/another-checkpoint")
    'lookup'
    """
    if model == DEFAULT_MODEL and (default_head(HeadKind.EAGLE) / "config.json").exists():
        return BEST_WITH_HEAD
    return BEST_WITHOUT_HEAD


@dataclass(frozen=True)
class HeadSpec:
    """`KIND[:DIR][:weights=F]`: the head's kind (eagle, eagle3, medusa), its directory (None:
    the shipped head) and how it drafts (a key of `HEAD_FORMATS`, or "auto")."""

    kind: HeadKind
    directory: str | None = None
    weights: WeightFormat | None = None  # None: auto (`auto_head_format`)

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", head_kind(self.kind))  # a name given is read once


def parse(kind: HeadKind, argument: str) -> HeadSpec:
    """The options of `kind[:DIR][:weights=F]`.

    >>> parse("eagle", "heads/mine:weights=bfloat16")
    HeadSpec(kind='eagle', directory='heads/mine', weights=<WeightFormat.BFLOAT16: 'bfloat16'>)
    >>> parse("eagle", "")
    HeadSpec(kind='eagle', directory=None, weights=None)
    """
    directory, _, last = argument.rpartition(":")
    if not last.startswith("weights="):
        return HeadSpec(kind, argument or None)
    head_format = last.removeprefix("weights=")
    if head_format != "auto" and head_format not in HEAD:
        raise ValueError(f"{kind}:...:weights=F takes auto, {', '.join(HEAD)}; got {head_format!r} in '{kind}:{argument}'")
    return HeadSpec(kind, directory or None, None if head_format == "auto" else WeightFormat(head_format))


def drafting_format(head_format: WeightFormat | str | None, target: object = None) -> WeightFormat:
    """The format a head drafts in beside `target` (None: a CPU target): `head_format`, or
    `auto_head_format` for None or "auto"; int8 is refused for a target off the CPU. Where the
    target computes is where its embedding lives (a target without a feature channel counts as
    the CPU's here: loading a head refuses it with the reason, `heads.checkpoint.check_target`)."""
    embeddings = getattr(target, "input_embeddings", None)
    weights = embeddings() if callable(embeddings) else torch.empty(0)  # [V, H]
    if head_format is None or head_format == "auto":
        return auto_head_format(weights.device, weights.dtype)
    fmt = weight_format.parse(head_format, HEAD)
    if fmt is WeightFormat.INT8 and weights.device.type != "cpu":
        raise ValueError(
            f"a head drafts in int8 on torch's CPU kernel and this target runs on {weights.device}; "
            "use weights=auto (the target's dtype), bfloat16 or float32"
        )
    return fmt


def build(spec: HeadSpec, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> Proposer:
    """An EAGLE or Medusa proposer for the loaded target."""
    return head_proposer(spec.kind, spec.directory, target.lm, spec.weights)


def audit_fixture(kind: HeadKind, tables: Tables) -> Proposer:
    """A `kind` proposer (eagle, eagle3 or medusa) on the audit's tables."""
    from verispec.heads.untrained import tiny_head
    from verispec.proposers.eagle import EagleProposer
    from verispec.proposers.medusa import MedusaProposer

    # An untrained float64 head on the table's deterministic features: exactness must not
    # depend on the weights, and an untrained q rejects often (every repair path).
    proposer = MedusaProposer if kind == HeadKind.MEDUSA else EagleProposer
    return proposer(tiny_head(kind, tables.target), tables.target)


EAGLE = ProposerKind(
    "eagle", "eagle[:DIR][:weights=F]", "sampled", build,
    "a trained EAGLE-style head drafting in the target's feature space (DIR: from verispec train; "
    "none: the head shipped for the default model; F: how it drafts, auto, int8, bfloat16 or float32)",
    audit=partial(audit_fixture, HeadKind.EAGLE), example=shipped(HeadKind.EAGLE), trees=True,
    parse=partial(parse, HeadKind.EAGLE), draft_cost=HEAD_DRAFT_COST,
)
MEDUSA = ProposerKind(
    "medusa", "medusa[:DIR][:weights=F]", "sampled", build,
    "K trained residual heads on the target's last feature (DIR: from verispec train; none: the "
    "shipped head; F as for eagle)",
    audit=partial(audit_fixture, HeadKind.MEDUSA), example=shipped(HeadKind.MEDUSA), trees=True,
    parse=partial(parse, HeadKind.MEDUSA), draft_cost=HEAD_DRAFT_COST,
)
