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

from verispec.cost import check_k

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
    build(argument, target, corpus): the proposer for the text after the first ':' ("" when
        none), the loaded target model and token-id sequences (e.g. encoded prompts).
    description: one line for `verispec proposers` and the README.
    audit(tables): the proposer on the audit's rational tables (`tables.target`,
        `tables.draft`), or None with the reason in `not_audited`.
    example: a spec the greedy identity suite runs on the default model (None: leave it out).
    trees: whether it also fills tree shapes (`verispec.proposers.base.TreeProposer`), so a
        tree policy can ask it for several continuations per round.
    """

    name: str
    grammar: str
    drafts: Literal["chosen", "sampled", "mixed"]
    build: Callable[[str, LoadedModel, Corpus], Proposer]
    description: str
    audit: Callable[[Tables], Proposer] | None = None
    not_audited: str = ""
    example: str | None = None
    trees: bool = False

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


def parse_spec(spec: str) -> tuple[ProposerKind, str]:
    """A spec's kind and its argument ("" when none); checks the grammar, not the argument's
    value (that needs the target: `build_proposer`)."""
    name, colon, argument = spec.strip().partition(":")
    kind = PROPOSERS.get(name)
    if kind is None:
        raise ValueError(f"unknown proposer {spec!r}; choose {proposer_grammar(', ')}")
    if kind.argument == "none" and colon:
        raise ValueError(f"{name} takes no argument, got {spec!r}; write just {name!r}")
    if kind.argument == "required" and not argument:
        raise ValueError(f"{name} needs an argument: write {kind.grammar}, got {spec!r}")
    return kind, argument


def build_proposer(spec: str, target: LoadedModel, corpus: Corpus = ()) -> Proposer:
    """The proposer `spec` names, for the loaded `target`; corpus: token-id sequences (e.g.
    encoded prompts) that `suffix` indexes and from which `layerskip:L:N` picks its N most
    frequent tokens."""
    kind, argument = parse_spec(spec)
    return kind.build(argument, target, corpus)


# ---- k policies -------------------------------------------------------------------------

K_POLICIES: dict[str, str] = {
    "N": "constant: N drafted tokens per round (an integer >= 1)",
    "auto": "AutoK: the cost model's best k per round (profiles first)",
    "auto:PROFILE.json": "AutoK on a profile from `verispec profile --out`",
    "heuristic": "HF's schedule: k + 2 after a full accept, else k - 1",
    "tree": "the cost model's best token tree, chain or plain step per round (profiles first)",
    "tree:PROFILE.json": "the tree policy on a profile from `verispec profile --out` (trees up to its k_max nodes)",
    "tree:W1xW2x...": "a constant tree: each node at depth d - 1 has the top W_d candidates as children",
}
K_GRAMMAR = "an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x..."
K_HELP = f"Tokens drafted per round: {K_GRAMMAR} (trees need a proposer that fills them)."
# The most nodes a constant tree may have: a typo such as tree:9x9x9x9 (7380 nodes) is refused
# rather than scored.
TREE_SHAPE_BOUND = 256


@dataclass(frozen=True)
class KSpec:
    """A parsed k policy: kind "constant" (k), "heuristic", "auto" (profile: a file, or None to
    measure one now) or "tree" (widths: a constant tree's children per node at each depth; else
    the tree policy on `profile` or on one measured now)."""

    kind: Literal["constant", "heuristic", "auto", "tree"]
    k: int | None = None
    profile: str | None = None
    widths: tuple[int, ...] | None = None


def parse_k(text: str, *, option: str = "--k") -> KSpec:
    """A k policy spec (`K_GRAMMAR`).

        >>> parse_k("tree:2x2x1")
        KSpec(kind='tree', k=None, profile=None, widths=(2, 2, 1))
    """
    spec = text.strip()
    if spec in ("heuristic", "auto", "tree"):
        return KSpec(spec)
    for kind in ("auto", "tree"):
        if spec.startswith(f"{kind}:"):
            argument = spec.removeprefix(f"{kind}:")
            if not argument:
                what = "auto:PROFILE.json needs the profile's path" if kind == "auto" else (
                    "tree:PROFILE.json or tree:W1xW2x... needs a profile's path or the widths"
                )
                raise ValueError(f"{option} {what}, got {text!r}")
            if kind == "tree" and set(argument) <= set("0123456789x"):
                return KSpec("tree", widths=tree_widths(argument, option))
            return KSpec(kind, profile=argument)
    try:
        k = int(spec)
    except ValueError:
        raise ValueError(f"{option} must be {K_GRAMMAR}, got {text!r}") from None
    if k < 1:
        raise ValueError(
            f"{option} must be {K_GRAMMAR}, got {text!r}; k = 0 would decode plainly "
            "(plain decoding is the baseline every comparison already runs)"
        )
    return KSpec("constant", k=k)


def tree_widths(text: str, option: str = "--k") -> tuple[int, ...]:
    """The widths of `tree:W1xW2x...`: integers >= 1, at most TREE_SHAPE_BOUND nodes in all."""
    parts = text.split("x")
    if not all(part.isdigit() for part in parts) or any(int(part) < 1 for part in parts):
        raise ValueError(
            f"{option} tree:W1xW2x... needs widths that are integers >= 1 joined by 'x' (e.g. tree:3x2x1), "
            f"got tree:{text}"
        )
    widths = tuple(int(part) for part in parts)
    nodes, level = 0, 1
    for width in widths:
        level *= width
        nodes += level
        if nodes > TREE_SHAPE_BOUND:
            raise ValueError(
                f"{option} tree:{text} has more than {TREE_SHAPE_BOUND} nodes (each node at depth d - 1 has "
                f"W_d children); give smaller widths or fewer depths"
            )
    return widths


def check_policy_proposer(k: str | KSpec, proposer: str, *, option: str = "--k") -> None:
    """Refuse a tree policy for a proposer kind that cannot fill tree shapes (before any work)."""
    parsed = parse_k(k, option=option) if isinstance(k, str) else k
    kind, _ = parse_spec(proposer)
    if parsed.kind != "tree" or kind.trees:
        return
    able = [entry.name for entry in PROPOSERS.values() if entry.trees]
    choose = f"choose a proposer that does ({', '.join(able)})" if able else "no registered proposer fills trees"
    raise ValueError(
        f"{option} {k if isinstance(k, str) else 'tree'} drafts token trees, which proposer {kind.name} cannot "
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
    example="layerskip:8",
))
register(ProposerKind(
    "selfdraft", "selfdraft[:FORMAT]", "sampled", _ref(_P + "self_draft", "build"),
    "the target's own weights on int4 kernels (FORMAT q4, the default; a GGUF's own 4-bit blocks) or int8",
    not_audited="it needs a transformer's weights to quantize, which the audit's rational tables "
    "lack; its drafts are sampled with their q like draft's, whose rules the audit covers",
    example="selfdraft:q4",
))
register(ProposerKind(
    "random", "random", "sampled", _ref(_P + "random_tokens", "build"),
    "uniform random tokens: the baseline an adaptive k must learn to turn off",
    audit=_ref(_P + "random_tokens", "audit_fixture"), example="random", trees=True,
))
register(ProposerKind(
    "eagle", "eagle[:DIR][:weights=F]", "sampled", _ref(_P + "trained", "build", "eagle"),
    "a trained EAGLE-style head drafting in the target's feature space (DIR: from verispec train; "
    "none: the head shipped for the default model; F: how it drafts, auto, int8, bfloat16 or float32)",
    audit=_ref(_P + "trained", "audit_fixture", "eagle"), example=_shipped("eagle"), trees=True,
))
register(ProposerKind(
    "eagle3", "eagle3[:DIR][:weights=F]", "sampled", _ref(_P + "eagle3", "build"),
    "a trained EAGLE-3 head in the standard layout vLLM serves (DIR: from verispec train --head eagle3, or a "
    "speculators-format checkpoint; F as for eagle)",
    audit=_ref(_P + "trained", "audit_fixture", "eagle3"), trees=True,
))
register(ProposerKind(
    "medusa", "medusa[:DIR][:weights=F]", "sampled", _ref(_P + "trained", "build", "medusa"),
    "K trained residual heads on the target's last feature (DIR: from verispec train; none: the "
    "shipped head; F as for eagle)",
    audit=_ref(_P + "trained", "audit_fixture", "medusa"), example=_shipped("medusa"), trees=True,
))
register(ProposerKind(
    "lookup+eagle", "lookup+eagle[:DIR][:weights=F]", "mixed", _ref(_P + "copy_or_head", "build", "eagle"),
    "prompt lookup's draft whenever it has one (chosen), else the EAGLE-style head's sampled draft (DIR and F as for eagle)",
    audit=_ref(_P + "copy_or_head", "audit_fixture", "eagle"), example=_shipped("eagle", "lookup+eagle"), trees=True,
))
register(ProposerKind(
    "lookup+medusa", "lookup+medusa[:DIR][:weights=F]", "mixed", _ref(_P + "copy_or_head", "build", "medusa"),
    "prompt lookup's draft whenever it has one (chosen), else the Medusa heads' sampled draft (DIR and F as for medusa)",
    audit=_ref(_P + "copy_or_head", "audit_fixture", "medusa"), example=_shipped("medusa", "lookup+medusa"),
    trees=True,
))
