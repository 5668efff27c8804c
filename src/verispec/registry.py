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

A new proposer is one module (its `Proposer` class) plus one `register(ProposerKind(...))` call
in this file (or in the module that defines it, imported before use).

This module stays light (no torch, no transformers at import): the CLI's help text reads it.
Builders import what they need when they run.
"""

from __future__ import annotations

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


def _lookup(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.prompt_lookup import PromptLookup

    return PromptLookup()


def _suffix(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.suffix_index import SuffixIndex

    return SuffixIndex(corpus)


def _draft(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.models.load import load_model
    from verispec.proposers.draft_model import DraftModel

    draft = load_model(argument, dtype=target.dtype)
    return DraftModel(draft.lm, tokenizers=(target.tokenizer, draft.tokenizer))


def _layerskip(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.layer_skip import LayerSkip

    total = target.config.num_hidden_layers
    vocab_size = target.lm.vocab_size
    parts = argument.split(":")
    if len(parts) > 2:
        raise ValueError(f"layerskip needs layerskip:L or layerskip:L:N, got 'layerskip:{argument}'")
    layers = _integer(parts[0], "layerskip:L needs an integer number of layers L")
    if not 1 <= layers < total:
        raise ValueError(f"layerskip:L needs 1 <= L < {total} (the target has {total} layers), got {layers}")
    head_tokens = None
    if len(parts) == 2:
        head_tokens = _integer(parts[1], "layerskip:L:N needs an integer number of head tokens N")
        if not 1 <= head_tokens <= vocab_size:
            raise ValueError(f"layerskip:L:N needs 1 <= N <= {vocab_size} (the vocabulary size), got {head_tokens}")
    return LayerSkip(target.lm, layers, head_tokens, corpus)


def _selfdraft(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.self_draft import FORMATS, SelfDraft

    fmt = argument or "q4"
    if fmt not in FORMATS:
        raise ValueError(f"selfdraft:FORMAT takes q4 or int8, got 'selfdraft:{argument}'")
    gguf = target.source if fmt == "q4" and target.source.is_file() else None
    return SelfDraft(target.transformers_model(), fmt, gguf=gguf, runtime=target.runtime)


def _random(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.random_tokens import RandomTokens

    return RandomTokens(target.lm.vocab_size)


LOOKAHEAD_OPTIONS = {"W": "window", "N": "ngram", "G": "pool"}


def _lookahead(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.lookahead import LookaheadProposer

    return LookaheadProposer(**lookahead_options(argument))


def lookahead_options(argument: str) -> dict[str, int]:
    """The keyword arguments of `lookahead:W=5:N=4:G=5` (any of the three, in any order).

    >>> lookahead_options("N=3:W=8")
    {'ngram': 3, 'window': 8}
    """
    options: dict[str, int] = {}
    for part in argument.split(":") if argument else []:
        key, equals, value = part.partition("=")
        if not equals or key not in LOOKAHEAD_OPTIONS:
            raise ValueError(
                f"lookahead options are W=window, N=n-gram size and G=pool width joined by ':' "
                f"(e.g. lookahead:W=5:N=4:G=5), got {part!r} in 'lookahead:{argument}'"
            )
        if LOOKAHEAD_OPTIONS[key] in options:
            raise ValueError(f"lookahead option {key} is given twice in 'lookahead:{argument}'")
        options[LOOKAHEAD_OPTIONS[key]] = _integer(value, f"lookahead option {key} needs an integer")
    return options


def _integer(text: str, message: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{message}, got {text!r}") from None


def _audit_lookup(tables: Tables) -> Proposer:
    from verispec.proposers.prompt_lookup import PromptLookup

    return PromptLookup(max_ngram=3)


def _audit_suffix(tables: Tables) -> Proposer:
    from verispec.proposers.suffix_index import SuffixIndex

    # A corpus (the vocabulary descending, twice) makes its drafts differ from prompt
    # lookup's; min_prob 0 drafts whenever anything matched.
    return SuffixIndex([[*range(tables.target.vocab_size - 1, -1, -1)] * 2], min_prob=0)


def _audit_draft(tables: Tables) -> Proposer:
    from verispec.proposers.draft_model import DraftModel

    return DraftModel(tables.draft)


def _audit_random(tables: Tables) -> Proposer:
    from verispec.proposers.random_tokens import RandomTokens

    return RandomTokens(tables.target.vocab_size)


def _audit_lookahead(tables: Tables) -> Proposer:
    from verispec.proposers.lookahead import LookaheadProposer

    # Bigrams, so the pool offers continuations from the second round of a 3-4 token request.
    return LookaheadProposer(window=3, ngram=2, pool=2)


def _head(kind: str) -> Callable[[str, LoadedModel, Corpus], Proposer]:
    def build(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
        from verispec.proposers.trained import head_proposer

        directory, head_format = head_options(kind, argument)
        return head_proposer(kind, directory, target.lm, head_format)

    return build


def head_options(kind: str, argument: str) -> tuple[str | None, str]:
    """The head directory (None: the shipped head) and head format of `eagle[:DIR][:weights=F]`.

    >>> head_options("eagle", "heads/mine:weights=bfloat16")
    ('heads/mine', 'bfloat16')
    >>> head_options("eagle", "")
    (None, 'auto')
    """
    from verispec.proposers.trained import HEAD_FORMATS

    directory, _, last = argument.rpartition(":")
    if not last.startswith("weights="):
        return argument or None, "auto"
    head_format = last.removeprefix("weights=")
    if head_format != "auto" and head_format not in HEAD_FORMATS:
        raise ValueError(
            f"{kind}:...:weights=F takes auto, {', '.join(HEAD_FORMATS)}; got {head_format!r} in '{kind}:{argument}'"
        )
    return directory or None, head_format


def _audit_head(kind: str) -> Callable[[Tables], Proposer]:
    def build(tables: Tables) -> Proposer:
        from verispec.heads.untrained import tiny_head
        from verispec.proposers.eagle import EagleProposer
        from verispec.proposers.medusa import MedusaProposer

        # An untrained float64 head on the table's deterministic features: exactness must not
        # depend on the weights, and an untrained q rejects often (every repair path).
        proposer = EagleProposer if kind == "eagle" else MedusaProposer
        return proposer(tiny_head(kind, tables.target), tables.target)

    return build


# The shortest n-gram match whose continuation `lookup+HEAD` copies instead of asking the head.
# 1: lookup drafts whenever it would alone and the head fills only the rounds it has nothing
# for, so the combination never drafts worse than lookup. Measured (bf16, 6 extraction / rag /
# translation dev prompts, greedy, k 4, an untrained EAGLE head): tokens per round 2.15 at 1,
# 1.83 at 2 (the head took lookup's one-token-match rounds and lost them), lookup alone 2.12.
COPY_MIN_MATCH = 1
# The audit's tables have 2-4 tokens, where a one-token match nearly always exists: its builder
# asks for two tokens so the head drafts too (the choice's exactness does not depend on it; the
# reference-equality property test draws it from 1..3).
AUDIT_COPY_MIN_MATCH = 2


def _copy_or_head(kind: str) -> Callable[[str, LoadedModel, Corpus], Proposer]:
    def build(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
        from verispec.proposers.copy_or_head import CopyOrHead
        from verispec.proposers.prompt_lookup import PromptLookup

        return CopyOrHead(PromptLookup(min_ngram=COPY_MIN_MATCH), _head(kind)(argument, target, corpus))

    return build


def _audit_copy_or_head(kind: str) -> Callable[[Tables], Proposer]:
    def build(tables: Tables) -> Proposer:
        from verispec.proposers.copy_or_head import CopyOrHead
        from verispec.proposers.prompt_lookup import PromptLookup

        return CopyOrHead(PromptLookup(min_ngram=AUDIT_COPY_MIN_MATCH), _audit_head(kind)(tables))

    return build


def _shipped(kind: str, spec: str | None = None) -> str | None:
    """`spec` (default: `kind`) when a `kind` head is shipped for the default model, so the
    identity suite runs it; None when none is."""
    from verispec.proposers.trained import default_head

    return (spec or kind) if default_head(kind).is_dir() else None


def _default_draft() -> str:
    from verispec.models import DEFAULT_MODEL

    return f"draft:{DEFAULT_MODEL}"


register(ProposerKind(
    "lookup", "lookup", "chosen", _lookup,
    "prompt lookup: continues the longest recent n-gram match in the request itself",
    audit=_audit_lookup, example="lookup", trees=True,
))
register(ProposerKind(
    "suffix", "suffix", "chosen", _suffix,
    "suffix index over the request and a corpus; drafts the most frequent continuation",
    audit=_audit_suffix, example="suffix", trees=True,
))
register(ProposerKind(
    "lookahead", "lookahead[:W=5:N=4:G=5]", "chosen", _lookahead,
    "lookahead decoding: Jacobi guesses on a window of W tokens feed a pool of N-grams (G per first token)",
    audit=_audit_lookahead, example="lookahead", trees=True,
))
register(ProposerKind(
    "draft", "draft:PATH", "sampled", _draft,
    "a smaller model with the target's tokenizer (.gguf file, checkpoint directory or name)",
    audit=_audit_draft, example=_default_draft(), trees=True,
))
register(ProposerKind(
    "layerskip", "layerskip:L[:N]", "sampled", _layerskip,
    "the target's first L layers and its head (pruned to N tokens when N is given)",
    not_audited="it needs a transformer's layers, which the audit's rational tables lack; its "
    "drafts are sampled with their q like draft's, whose rules the audit covers",
    example="layerskip:8",
))
register(ProposerKind(
    "selfdraft", "selfdraft[:FORMAT]", "sampled", _selfdraft,
    "the target's own weights on int4 kernels (FORMAT q4, the default; a GGUF's own 4-bit blocks) or int8",
    not_audited="it needs a transformer's weights to quantize, which the audit's rational tables "
    "lack; its drafts are sampled with their q like draft's, whose rules the audit covers",
    example="selfdraft:q4",
))
register(ProposerKind(
    "random", "random", "sampled", _random,
    "uniform random tokens: the baseline an adaptive k must learn to turn off",
    audit=_audit_random, example="random", trees=True,
))
register(ProposerKind(
    "eagle", "eagle[:DIR][:weights=F]", "sampled", _head("eagle"),
    "a trained EAGLE-style head drafting in the target's feature space (DIR: from verispec train; "
    "none: the head shipped for the default model; F: how it drafts, auto, int8, bfloat16 or float32)",
    audit=_audit_head("eagle"), example=_shipped("eagle"), trees=True,
))


def _eagle3(argument: str, target: LoadedModel, corpus: Corpus) -> Proposer:
    from verispec.proposers.eagle3 import eagle3_proposer

    directory, head_format = head_options("eagle3", argument)
    return eagle3_proposer(directory, target.lm, head_format)


def _audit_eagle3(tables: Tables) -> Proposer:
    from verispec.heads.untrained import tiny_head
    from verispec.proposers.eagle import EagleProposer

    return EagleProposer(tiny_head("eagle3", tables.target), tables.target)


register(ProposerKind(
    "eagle3", "eagle3[:DIR][:weights=F]", "sampled", _eagle3,
    "a trained EAGLE-3 head in the standard layout vLLM serves (DIR: from verispec train --head eagle3, or a "
    "speculators-format checkpoint; F as for eagle)",
    audit=_audit_eagle3, trees=True,
))
register(ProposerKind(
    "medusa", "medusa[:DIR][:weights=F]", "sampled", _head("medusa"),
    "K trained residual heads on the target's last feature (DIR: from verispec train; none: the "
    "shipped head; F as for eagle)",
    audit=_audit_head("medusa"), example=_shipped("medusa"), trees=True,
))
register(ProposerKind(
    "lookup+eagle", "lookup+eagle[:DIR][:weights=F]", "mixed", _copy_or_head("eagle"),
    "prompt lookup's draft whenever it has one (chosen), else the EAGLE-style head's sampled draft (DIR and F as for eagle)",
    audit=_audit_copy_or_head("eagle"), example=_shipped("eagle", "lookup+eagle"), trees=True,
))
register(ProposerKind(
    "lookup+medusa", "lookup+medusa[:DIR][:weights=F]", "mixed", _copy_or_head("medusa"),
    "prompt lookup's draft whenever it has one (chosen), else the Medusa heads' sampled draft (DIR and F as for medusa)",
    audit=_audit_copy_or_head("medusa"), example=_shipped("medusa", "lookup+medusa"), trees=True,
))
