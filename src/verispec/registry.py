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

A new proposer is one module: its `Proposer` class, its builder, its audit fixture and its
entry (`KIND = ProposerKind(...)`, `verispec.proposers.kind`) beside them; this module imports
it and registers the entry, so the import rules (docs/design.md) see the edge.

This module imports no transformers (the CLI's help text reads it): the proposer modules import
it where they build, not at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

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

from verispec.proposers import (
    copy_or_head,
    draft_model,
    eagle3,
    layer_skip,
    lookahead,
    prompt_lookup,
    random_tokens,
    self_draft,
    suffix_index,
    trained,
)
from verispec.proposers.kind import Corpus, ProposerKind

if TYPE_CHECKING:
    from verispec.models.base import CausalLM
    from verispec.models.loading.load import LoadedModel
    from verispec.policies import KPolicy
    from verispec.proposers.base import Proposer
    from verispec.sampling import SamplingParams


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
# Each kind's entry lives beside its builder and audit fixture, in the module of what it builds.
for _kind in (
    prompt_lookup.KIND, suffix_index.KIND, lookahead.KIND, draft_model.KIND, layer_skip.KIND, self_draft.KIND,
    random_tokens.KIND, trained.EAGLE, eagle3.KIND, trained.MEDUSA, copy_or_head.LOOKUP_EAGLE, copy_or_head.LOOKUP_MEDUSA,
):
    register(_kind)
