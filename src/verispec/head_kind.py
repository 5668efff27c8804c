"""The kinds of trained head, named once: `HeadKind`. A leaf, so that what names a kind (the
proposer kinds, `verispec train --head`, the export formats) need not import the heads, which
import transformers.

    >>> head_kind("eagle3") is HeadKind.EAGLE3, HeadKind.MEDUSA == "medusa"
    (True, True)
"""

from __future__ import annotations

from enum import StrEnum


class HeadKind(StrEnum):
    """The kinds of trained head: one value here, one class each in `verispec.heads`, and the
    proposer kinds, `verispec train --head` and the export formats read it."""

    EAGLE = "eagle"  # one decoder layer (or `depth`), autoregressive in feature space (`heads.eagle`)
    EAGLE3 = "eagle3"  # the standard EAGLE-3 layer vLLM serves (`heads.eagle3`)
    MEDUSA = "medusa"  # K residual heads on one feature (`heads.medusa`)

    def __repr__(self) -> str:
        return repr(self.value)  # messages quote a kind as the user writes it: 'medusa'


def head_kind(value: str, option: str = "head kind") -> HeadKind:
    """`value` as a `HeadKind`, or a ValueError naming the kinds."""
    try:
        return HeadKind(value)
    except ValueError:
        raise ValueError(f"{option} must be {', '.join(list(HeadKind)[:-1])} or {list(HeadKind)[-1]}, got {value!r}") from None
