"""`ProposerKind`: one kind of proposer as the registry lists it. Each proposer module declares
its own entry beside its builder (`KIND = ProposerKind(...)`, or one per family), and
`verispec.registry` imports the modules and registers their entries, so the import rules see
every edge from the registry to a builder.

    KIND = ProposerKind("lookup", "lookup", "chosen", build, "prompt lookup: ...", audit=audit_fixture)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables
    from verispec.proposers.base import Proposer
    from verispec.sampling import SamplingParams

Corpus = Sequence[Sequence[int]]


@dataclass(frozen=True)
class ProposerKind:
    """One kind of proposer.

    name: the one name (`lookup`), also the spec's first word.
    grammar: its spec, e.g. `draft:PATH` or `layerskip:L[:N]`; no ':' means no argument, `[:`
        right after the name an optional one.
    drafts: "sampled" when at temperature > 0 its drafts are sampled from a proposal q it
        reports (verified by the token or block rule), "chosen" when they are picked without a
        q (point-mass, token or block), "mixed" when some rounds' drafts are chosen and others
        sampled (token or block throughout, or auto: point-mass on the chosen rounds, block on
        the sampled ones).
    build(options, target, corpus): the proposer for its spec's parsed options (`parse`), the
        loaded target model and token-id sequences (e.g. encoded prompts). It checks only what
        needs the target (e.g. layerskip's L against the target's layers), never the text.
    description: one line for `verispec proposers` and the README.
    audit(tables): the proposer on the audit's rational tables (`tables.target`,
        `tables.draft`), or None with the reason in `not_audited`.
    example: a spec the greedy identity suite runs on the default model (None: leave it out).
    trees: whether it also fills tree shapes (`verispec.proposers.base.TreeProposer`), so a
        tree policy can ask it for several continuations per round.
    parse(argument): the typed options of the text after the first ':' ("" when none), every
        error of its format raised here; None: the text itself (None when empty).
    draft_cost: what `--dtype auto` expects a drafted token to cost, as a share of the fastest
        weight format's one-row target forward (`models.loading.format_costs.Drafting`), from
        the measurements its module cites; None where nothing measured says (the target's
        format is then weighed for plain decoding).
    """

    name: str
    grammar: str
    drafts: Literal["chosen", "sampled", "mixed"]
    build: Callable[[object, LoadedModel, Corpus], Proposer]
    description: str
    audit: Callable[[Tables], Proposer] | None = None
    not_audited: str = ""
    example: str | None = None
    trees: bool = False
    parse: Callable[[str], object] | None = None
    draft_cost: float | None = None

    def __post_init__(self) -> None:
        if self.drafts not in ("chosen", "sampled", "mixed"):
            raise ValueError(
                f"proposer {self.name!r}: drafts must be 'chosen', 'sampled' or 'mixed', got {self.drafts!r}"
            )
        if not self.grammar.startswith(self.name) or ":" in self.name or "-" in self.name or not self.name:
            raise ValueError(
                f"proposer {self.name!r}: the name is one word without ':' or '-', and the grammar "
                f"{self.grammar!r} starts with it"
            )
        if (self.audit is None) == (not self.not_audited):
            raise ValueError(f"proposer {self.name!r}: give either an audit builder or the reason it has none")

    @property
    def argument(self) -> Literal["none", "optional", "required"]:
        if ":" not in self.grammar:
            return "none"
        return "optional" if self.grammar.startswith(f"{self.name}[:") else "required"

    @property
    def rules(self) -> tuple[str, ...]:
        """The verification rules that are exact for its drafts: greedy at temperature 0; at
        temperature > 0 coupled, token and block, and point-mass too for chosen drafts (q None).
        Mixed drafts list `auto` (the coupled rule) for coupled, as the default they run with."""
        rules = {
            "sampled": ("greedy", "coupled", "token", "block"),
            "chosen": ("greedy", "coupled", "point-mass", "token", "block"),
            "mixed": ("greedy", "auto", "token", "block"),
        }
        return rules[self.drafts]

    def rules_for(self, sampling: SamplingParams) -> tuple[str, ...]:
        """The rules that are exact for its drafts under these transforms."""
        return ("greedy",) if sampling.greedy else self.rules[1:]

    def as_dict(self) -> dict:
        return {
            "name": self.name,
            "grammar": self.grammar,
            "drafts": self.drafts,
            "rules": list(self.rules),
            "audited": self.audit is not None,
            "not_audited": self.not_audited or None,
            "description": self.description,
            "trees": self.trees,
        }
