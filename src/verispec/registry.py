"""Every proposer kind and k policy a user can name, each defined once.

A proposer kind has one name, used everywhere: the CLI's `--proposer` spec, the benchmark's
method names (`verispec-<spec>-k4`), the exhaustive audit (`verispec audit --proposer NAME`),
the greedy identity suite and JSON output. Its entry holds the spec grammar, the builder, whether
its drafts are chosen or sampled (and so which verification rules are exact for them), how the
audit builds it on rational tables (or why it cannot), and a one-line description.

    >>> sorted(PROPOSERS)
    ['draft', 'eagle', 'eagle3', 'layerskip', 'lookahead', 'lookup', 'lookup+eagle', 'lookup+medusa', 'medusa', 'random', 'selfdraft', 'suffix']
    >>> PROPOSERS["lookup"].rules
    ('greedy', 'point-mass', 'token', 'block')
    >>> parse_k("auto:fast.json")
    KSpec(kind='auto', k=None, profile='fast.json', widths=None)

A new proposer is one module (its `Proposer` class, its builder and its audit fixture) plus one
`register(ProposerKind(...))` call in this file (or in the module that defines it, imported
before use).

This module stays light (no torch, no transformers at import): the CLI's help text reads it.
Builders import what they need when they run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from verispec.k_spec import (  # the k grammar, re-exported: the registry names every policy
    K_GRAMMAR,
    K_HELP,
    K_POLICIES,
    TREE_SHAPE_BOUND,
    KSpec,
    check_k,
    parse_k,
    tree_widths,
)

if TYPE_CHECKING:
    from verispec.models.table_pair import Tables
    from verispec.models.base import CausalLM
    from verispec.models.load import LoadedModel
    from verispec.policies import KPolicy
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
        temperature > 0 token and block, and point-mass too for chosen drafts (q None). Mixed
        drafts list `auto`, the one setting that verifies rounds of one request by different
        rules (point-mass and block), so the audit runs it too."""
        rules = {
            "sampled": ("greedy", "token", "block"),
            "chosen": ("greedy", "point-mass", "token", "block"),
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


PROPOSERS: dict[str, ProposerKind] = {}


def register(kind: ProposerKind) -> ProposerKind:
    """Add a proposer kind; a second kind with a registered name is refused."""
    if kind.name in PROPOSERS:
        raise ValueError(f"a proposer named {kind.name!r} is already registered")
    PROPOSERS[kind.name] = kind
    return kind


def proposer_kinds() -> list[ProposerKind]:
    return list(PROPOSERS.values())


def proposer_grammar(separator: str = " | ") -> str:
    """Every spec, e.g. 'lookup | suffix | draft:PATH | layerskip:L[:N] | random'."""
    return separator.join(kind.grammar for kind in PROPOSERS.values())


def proposer_help() -> str:
    """The CLI's help for --proposer."""
    return f"{proposer_grammar()} (`verispec proposers` describes each)."


@dataclass(frozen=True)
class ProposerSpec:
    """A proposer spec, parsed once where it enters (the CLI, the bench, `build_proposer`):
    its kind, the kind's typed options (`ProposerKind.parse`: e.g. a `HeadSpec` for
    `eagle:DIR:weights=int8`, None for `lookup`) and the text it was read from.

        >>> parse_spec("layerskip:8")
        ProposerSpec(kind='layerskip', options=LayerSkipSpec(layers=8, head_tokens=None), text='layerskip:8')
    """

    kind: ProposerKind
    options: object = None
    text: str = ""

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"ProposerSpec(kind={self.kind.name!r}, options={self.options!r}, text={self.text!r})"


def parse_spec(spec: str | ProposerSpec) -> ProposerSpec:
    """A spec's kind and typed options; every error of the text is raised here (what needs the
    target, such as layerskip's L against its layers, is checked by the builder). A parsed spec
    is returned as it is."""
    if isinstance(spec, ProposerSpec):
        return spec
    text = spec.strip()
    name, colon, argument = text.partition(":")
    kind = PROPOSERS.get(name)
    if kind is None:
        raise ValueError(f"unknown proposer {spec!r}; choose {proposer_grammar(', ')}")
    if kind.argument == "none" and colon:
        raise ValueError(f"{name} takes no argument, got {spec!r}; write just {name!r}")
    if kind.argument == "required" and not argument:
        raise ValueError(f"{name} needs an argument: write {kind.grammar}, got {spec!r}")
    options = kind.parse(argument) if kind.parse is not None else (argument or None)
    return ProposerSpec(kind, options, text)


def build_proposer(spec: str | ProposerSpec, target: LoadedModel, corpus: Corpus = ()) -> Proposer:
    """The proposer `spec` names (a parsed spec, or its text, parsed here), for the loaded
    `target`; corpus: token-id sequences (e.g. encoded prompts) that `suffix` indexes and from
    which `layerskip:L:N` picks its N most frequent tokens."""
    parsed = parse_spec(spec)
    return parsed.kind.build(parsed.options, target, corpus)


# ---- k policies -------------------------------------------------------------------------

def check_policy_proposer(k: str | KSpec, proposer: str | ProposerSpec, *, option: str = "--k") -> None:
    """Refuse a tree policy for a proposer kind that cannot fill tree shapes (before any work)."""
    parsed = parse_k(k, option=option) if isinstance(k, str) else k
    kind = parse_spec(proposer).kind
    if parsed.kind != "tree" or kind.trees:
        return
    able = [entry.name for entry in PROPOSERS.values() if entry.trees]
    choose = f"choose a proposer that does ({', '.join(able)})" if able else "no registered proposer fills trees"
    raise ValueError(
        f"{option} {parsed.text or 'tree'} drafts token trees, which proposer {kind.name} cannot "
        f"fill; {choose}, or give a chain policy (an integer k or auto)"
    )


def build_policy(
    spec: str | KSpec,
    target: CausalLM,
    proposer: Proposer | None,
    prompt_ids: Sequence[int],
    sampling: SamplingParams | None = None,
) -> KPolicy:
    """The k policy a spec names; `auto` and `tree` profile `proposer` on `target` after
    `prompt_ids`. A tree needs a target that scores trees and a proposer that fills them."""
    from verispec.policies import AutoK, ConstantK, HeuristicK
    from verispec.profile import Profile, measured_autok

    parsed = parse_k(spec) if isinstance(spec, str) else spec
    if parsed.kind == "constant":
        return ConstantK(parsed.k)
    if parsed.kind == "heuristic":
        return HeuristicK()
    if parsed.kind == "tree":
        return _tree_policy(parsed, target, proposer, prompt_ids, sampling)
    if parsed.profile is not None:
        return AutoK(Profile.load(parsed.profile))
    if proposer is None:
        raise ValueError("k = auto measures the proposer's cost; give a proposer or an integer k")
    return measured_autok(target, proposer, prompt_ids, sampling=sampling)


def _tree_policy(
    parsed: KSpec, target: CausalLM, proposer: Proposer | None, prompt_ids: Sequence[int], sampling: SamplingParams | None
) -> KPolicy:
    from verispec.engine import tree_target
    from verispec.profile import Profile
    from verispec.tree_policy import TreePolicy, measured_tree_policy, shape_from_widths

    tree_target(target)
    if proposer is None or not hasattr(proposer, "propose_tree"):
        what = "no proposer" if proposer is None else type(proposer).__name__
        raise ValueError(f"k = tree drafts token trees, which {what} cannot fill; give a proposer that fills trees")
    if parsed.widths is not None:
        from verispec.policies import ConstantTree

        return ConstantTree(shape_from_widths(parsed.widths))
    if parsed.profile is not None:
        return TreePolicy(Profile.load(parsed.profile))
    return measured_tree_policy(target, proposer, prompt_ids, sampling=sampling)


# ---- the proposer kinds -----------------------------------------------------------------
# Each builder and audit fixture lives beside what it builds; the table names them, and a
# reference imports its module when first called, so reading the table imports no proposer.


def _ref(module: str, name: str, *bound: str) -> Callable:
    """`module.name`, imported when called; `bound` goes first (a family's kind, e.g. "eagle")."""

    def call(*args):
        return getattr(importlib.import_module(module), name)(*bound, *args)

    call.__qualname__ = call.__name__ = f"{module}.{name}{bound or ''}"
    return call


def _shipped(kind: str, spec: str | None = None) -> str | None:
    """`spec` (default: `kind`) when a `kind` head is shipped for the default model, so the
    identity suite runs it; None when none is."""
    from verispec.proposers.trained import default_head

    return (spec or kind) if default_head(kind).is_dir() else None


def _default_draft() -> str:
    from verispec.models import DEFAULT_MODEL

    return f"draft:{DEFAULT_MODEL}"


_P = "verispec.proposers."
register(ProposerKind(
    "lookup", "lookup", "chosen", _ref(_P + "prompt_lookup", "build"),
    "prompt lookup: continues the longest recent n-gram match in the request itself",
    audit=_ref(_P + "prompt_lookup", "audit_fixture"), example="lookup", trees=True,
))
register(ProposerKind(
    "suffix", "suffix", "chosen", _ref(_P + "suffix_index", "build"),
    "suffix index over the request and a corpus; drafts the most frequent continuation",
    audit=_ref(_P + "suffix_index", "audit_fixture"), example="suffix", trees=True,
))
register(ProposerKind(
    "lookahead", "lookahead[:W=5:N=4:G=5]", "chosen", _ref(_P + "lookahead", "build"),
    "lookahead decoding: Jacobi guesses on a window of W tokens feed a pool of N-grams (G per first token)",
    audit=_ref(_P + "lookahead", "audit_fixture"), example="lookahead", trees=True,
    parse=_ref(_P + "lookahead", "parse"),
))
register(ProposerKind(
    "draft", "draft:PATH", "sampled", _ref(_P + "draft_model", "build"),
    "a smaller model with the target's tokenizer (.gguf file, checkpoint directory or name)",
    audit=_ref(_P + "draft_model", "audit_fixture"), example=_default_draft(), trees=True,
))
register(ProposerKind(
    "layerskip", "layerskip:L[:N]", "sampled", _ref(_P + "layer_skip", "build"),
    "the target's first L layers and its head (pruned to N tokens when N is given)",
    not_audited="it needs a transformer's layers, which the audit's rational tables lack; its "
    "drafts are sampled with their q like draft's, whose rules the audit covers",
    example="layerskip:8", parse=_ref(_P + "layer_skip", "parse"),
))
register(ProposerKind(
    "selfdraft", "selfdraft[:FORMAT]", "sampled", _ref(_P + "self_draft", "build"),
    "the target's own weights on int4 kernels (FORMAT q4, the default; a GGUF's own 4-bit blocks) or int8",
    not_audited="it needs a transformer's weights to quantize, which the audit's rational tables "
    "lack; its drafts are sampled with their q like draft's, whose rules the audit covers",
    example="selfdraft:q4", parse=_ref(_P + "self_draft", "parse"),
))
register(ProposerKind(
    "random", "random", "sampled", _ref(_P + "random_tokens", "build"),
    "uniform random tokens: the baseline an adaptive k must learn to turn off",
    audit=_ref(_P + "random_tokens", "audit_fixture"), example="random", trees=True,
))
register(ProposerKind(
    "eagle", "eagle[:DIR][:weights=F]", "sampled", _ref(_P + "trained", "build"),
    "a trained EAGLE-style head drafting in the target's feature space (DIR: from verispec train; "
    "none: the head shipped for the default model; F: how it drafts, auto, int8, bfloat16 or float32)",
    audit=_ref(_P + "trained", "audit_fixture", "eagle"), example=_shipped("eagle"), trees=True,
    parse=_ref(_P + "trained", "parse", "eagle"),
))
register(ProposerKind(
    "eagle3", "eagle3[:DIR][:weights=F]", "sampled", _ref(_P + "eagle3", "build"),
    "a trained EAGLE-3 head in the standard layout vLLM serves (DIR: from verispec train --head eagle3, or a "
    "speculators-format checkpoint; F as for eagle)",
    audit=_ref(_P + "trained", "audit_fixture", "eagle3"), trees=True,
    parse=_ref(_P + "trained", "parse", "eagle3"),
))
register(ProposerKind(
    "medusa", "medusa[:DIR][:weights=F]", "sampled", _ref(_P + "trained", "build"),
    "K trained residual heads on the target's last feature (DIR: from verispec train; none: the "
    "shipped head; F as for eagle)",
    audit=_ref(_P + "trained", "audit_fixture", "medusa"), example=_shipped("medusa"), trees=True,
    parse=_ref(_P + "trained", "parse", "medusa"),
))
register(ProposerKind(
    "lookup+eagle", "lookup+eagle[:DIR][:weights=F]", "mixed", _ref(_P + "copy_or_head", "build"),
    "prompt lookup's draft whenever it has one (chosen), else the EAGLE-style head's sampled draft (DIR and F as for eagle)",
    audit=_ref(_P + "copy_or_head", "audit_fixture", "eagle"), example=_shipped("eagle", "lookup+eagle"), trees=True,
    parse=_ref(_P + "trained", "parse", "eagle"),
))
register(ProposerKind(
    "lookup+medusa", "lookup+medusa[:DIR][:weights=F]", "mixed", _ref(_P + "copy_or_head", "build"),
    "prompt lookup's draft whenever it has one (chosen), else the Medusa heads' sampled draft (DIR and F as for medusa)",
    audit=_ref(_P + "copy_or_head", "audit_fixture", "medusa"), example=_shipped("medusa", "lookup+medusa"),
    trees=True, parse=_ref(_P + "trained", "parse", "medusa"),
))
