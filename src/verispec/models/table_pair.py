"""The pair of rational tables a proposer is built on in the exhaustive audit.

Its own module so that the registry's audit builders (`ProposerKind.audit`) and the audit that
calls them share the type without either importing the other's layer: the registry never
imports `verispec.audit`.
"""

from __future__ import annotations

from dataclasses import dataclass

from verispec.models.tables import TableLM


@dataclass(frozen=True)
class Tables:
    """The rational models of a scenario: the target, and a second table a proposer may use as
    its draft model."""

    target: TableLM
    draft: TableLM
