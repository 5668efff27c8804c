"""The EAGLE-3 head in the standard layout as a proposer: `eagle3:DIR[:weights=F]`.

DIR is either a head directory of `verispec train --head eagle3` or an EAGLE-3 checkpoint in
speculators' format (what `verispec export-head --format speculators` writes, and what
speculators, SpecForge and vLLM users share), read by `verispec.heads.export.read_speculators`
for a Llama-family target with the same vocabulary.

Drafting is `EagleProposer`'s (a chain or a tree, the head's q over its pruned vocabulary,
verified by the exact rules): `Eagle3Head` has `EagleHead`'s interface, and only the layer
inside differs. The head proposes; the verifier alone decides what is emitted, so no weight
and no weight format changes the output's law.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from verispec.head_kind import HeadKind
from verispec.models.base import CausalLM
from verispec.models.weight_format import WeightFormat
from verispec.proposers import trained
from verispec.proposers.base import Proposer
from verispec.proposers.kind import ProposerKind

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.proposers.trained import HeadSpec


def eagle3_proposer(
    directory: str | None, target: CausalLM, head_format: WeightFormat | str | None = "auto"
) -> Proposer:
    """An `EagleProposer` drafting with the EAGLE-3 head in `directory` for `target`, packed
    in `head_format` (as `proposers.trained.head_proposer` takes it)."""
    from verispec.heads import for_drafting
    from verispec.heads.export import load_eagle3
    from verispec.proposers.eagle import EagleProposer
    from verispec.proposers.trained import HEAD_FORMATS, drafting_format

    if directory is None:
        raise ValueError(
            "no eagle3 head is shipped; train one with `verispec train --head eagle3 --out DIR` "
            "(or give an EAGLE-3 checkpoint in speculators' format) and pass eagle3:DIR"
        )
    if not Path(directory).is_dir():
        raise ValueError(f"eagle3:DIR needs a head directory; {directory} is not a directory")
    dtype, route = HEAD_FORMATS[drafting_format(head_format, target)]
    head = load_eagle3(directory, target, dtype)
    return EagleProposer(for_drafting(head, route), target)


def build(spec: HeadSpec, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> Proposer:
    """`eagle3[:DIR][:weights=F]`."""
    return eagle3_proposer(spec.directory, target.lm, spec.weights)


KIND = ProposerKind(
    "eagle3", "eagle3[:DIR][:weights=F]", "sampled", build,
    "a trained EAGLE-3 head in the standard layout vLLM serves (DIR: from verispec train --head eagle3, or a "
    "speculators-format checkpoint; F as for eagle)",
    audit=partial(trained.audit_fixture, HeadKind.EAGLE3), trees=True, parse=partial(trained.parse, HeadKind.EAGLE3),
)
