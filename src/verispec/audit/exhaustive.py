"""Exhaustive audit: every random branch of the real engine against the target's exact law.

For one configuration (rational table target and draft, proposer, verification rule, sampling
transforms, k, budget, EOS), `audit_configuration` runs `verispec.engine.generate` once per
path through its random choices (`outcomes` replays them with a `ScriptedRandom`), sums the
path probabilities per output sequence, and compares them with the distribution of plain
autoregressive decoding computed exactly from the table (`exact_target.target_sequences`).
Exactness means the two agree to float64 rounding: max |difference| <= TOLERANCE.

Configurations are every audited proposer kind of `verispec.registry` (those with an `audit`
builder on rational tables) crossed with the scenarios (`SCENARIOS`) and every verification
rule that is exact for the kind's drafts (`ProposerKind.rules_for`): greedy at temperature 0;
coupled, token and block for sampled drafts (q given); coupled, point-mass, token and block for
chosen drafts (q None). A proposer joins the audit through its registry entry.

Keyed rounds (the coupled rule): a race's outcomes are enumerated with the exact joint law of
races on one key (`verispec.audit.enumerate`), and on every path the tokens must also be plain
decoding's with the same noise (the same enumerating source, k = 0): the coupled rule's
identity, path by path, besides the law.

Tree rounds: a scenario with a `tree` shape asks for it every round (`ConstantTree`); its
configurations (the tree proposers, the tree rules) are listed in `verispec.audit.trees`.

Trained heads (eagle, medusa) join with untrained tiny float64 heads reading the table
target's deterministic features (`verispec.heads.untrained`): exactness must hold whatever
the weights, and an untrained q is far from p (many rejections, every repair path).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal

import torch

from verispec import verify
from verispec.audit.enumerate import outcomes
from verispec.audit.exact_target import target_sequences
from verispec.clocks import TickClock
from verispec.drafts import TreeDraft
from verispec.engine import generate
from verispec.models.base import CausalLM
from verispec.models.table_pair import Tables
from verispec.models.tables import TableLM, random_table
from verispec.cost import FixedCosts
from verispec.policies import AutoK, ConstantTree, HeuristicK, KPolicy
from verispec.registry import PROPOSERS, ProposerKind, proposer_kinds
from verispec.sampling import GREEDY, SamplingParams
from verispec.tree_shape import TreeShape

TOLERANCE = 1e-12


def audited_proposers() -> list[ProposerKind]:
    """The registry's proposer kinds that have an audit builder, in registry order."""
    return [kind for kind in proposer_kinds() if kind.audit is not None]




@dataclass(frozen=True)
class Scenario:
    """A request on random rational tables (`random_table` with these seeds).

    k_policy: "constant", "heuristic" or "auto".
    k: the constant speculation length, the starting k of `HeuristicK` (heuristic), or the
       largest k of `AutoK` (auto; fixed costs: drafts at 0.15 of a step, flat v, a
       probe after every plain round, so four tokens can visit speculating, plain and probing).
    zeros: whether table rows may hold exact zeros (zero support, and fewer branches).
    tree: a tree shape asked every round (`ConstantTree`) instead of k (then k is unused).
    """

    vocab: int
    order: int
    k: int
    max_new_tokens: int
    sampling: SamplingParams
    prompt: tuple[int, ...]
    eos_token_id: int | None = None
    k_policy: Literal["constant", "heuristic", "auto"] = "constant"
    seed: int = 0
    zeros: bool = True
    tree: TreeShape | None = None

    @property
    def name(self) -> str:
        speculation = self.k_label if self.tree is not None else f"k {self.k_label}"
        return (f"V{self.vocab}, order {self.order}, {speculation}, max {self.max_new_tokens}, "
                f"{self.sampling_label}, {self.eos_label}")

    @property
    def k_label(self) -> str:
        if self.tree is not None:
            return f"tree {self.tree.describe()}"
        labels = {"constant": str(self.k), "heuristic": f"heuristic from {self.k}", "auto": f"auto up to {self.k}"}
        return labels[self.k_policy]

    @property
    def sampling_label(self) -> str:
        s = self.sampling
        penalties = [f"repetition penalty {s.repetition_penalty:g}"] if s.repetition_penalty != 1 else []
        penalties += [f"min tokens {s.min_tokens}"] if s.min_tokens else []
        penalties += [f"grammar {s.grammar!r}"] if s.grammar is not None else []
        if s.greedy:
            return ", ".join(["greedy", *penalties])
        filters = (("top-k", s.top_k), ("top-p", s.top_p), ("min-p", s.min_p))
        return ", ".join([f"T {s.temperature:g}"] + [f"{n} {v:g}" for n, v in filters if v is not None] + penalties)

    @property
    def eos_label(self) -> str:
        return "no EOS" if self.eos_token_id is None else f"EOS {self.eos_token_id}"

    def tables(self) -> Tables:
        def table(seed: int) -> TableLM:
            return random_table(self.vocab, self.order, seed, zeros=self.zeros, eos_token_id=self.eos_token_id)

        return Tables(table(self.seed), table(self.seed + 1))

    def policy(self) -> int | KPolicy:
        if self.tree is not None:
            return ConstantTree(self.tree)
        if self.k_policy == "auto":
            return AutoK(FixedCosts(c=0.15, v=[1.0] * (self.k + 1)), margin=0.1, probe_every=1)
        return HeuristicK(self.k) if self.k_policy == "heuristic" else self.k


def _sampled(temperature: float = 1.0, **filters) -> SamplingParams:
    return SamplingParams(temperature=temperature, **filters)


# Seeds picked for many distinct outputs at a few hundred branches each. Branch counts grow as
# vocab^(k * rounds): vocab 4 runs with the smaller k and budgets.
SCENARIOS: list[Scenario] = [
    Scenario(3, 2, 3, 4, GREEDY, (1, 2, 0, 1, 2)),
    Scenario(4, 1, 2, 4, GREEDY, (3, 1, 2, 3, 1), eos_token_id=0, seed=3),
    Scenario(3, 2, 1, 4, GREEDY, (1, 2, 1, 2), eos_token_id=0, k_policy="heuristic", seed=5),
    Scenario(3, 2, 3, 4, _sampled(), (1, 2, 0, 1, 2), seed=22),
    Scenario(3, 2, 2, 4, _sampled(), (1, 2, 1, 2), eos_token_id=0, seed=26),
    Scenario(4, 1, 1, 3, _sampled(), (3, 1, 2, 3, 1), eos_token_id=0, seed=46, zeros=False),
    Scenario(4, 2, 3, 2, _sampled(), (3, 1, 2, 3, 1), eos_token_id=0, seed=2),
    Scenario(2, 2, 3, 4, _sampled(), (0, 1, 0, 1), seed=54),
    Scenario(4, 2, 2, 3, _sampled(0.5), (3, 1, 2, 3, 1), seed=24),
    Scenario(3, 1, 3, 4, _sampled(0.5), (1, 2, 0, 1, 2), eos_token_id=1, seed=4),
    Scenario(4, 1, 2, 3, _sampled(top_k=2), (3, 1, 2, 3, 1), eos_token_id=0, seed=26),
    Scenario(3, 2, 2, 4, _sampled(top_p=0.7), (1, 2, 0, 1, 2), seed=10),
    Scenario(4, 1, 2, 3, _sampled(0.5, min_p=0.3), (3, 1, 2, 3, 1), eos_token_id=0, seed=26),
    Scenario(4, 2, 1, 3, _sampled(top_k=3, top_p=0.8, min_p=0.15), (3, 1, 2, 3, 1), seed=18),
    Scenario(3, 2, 1, 4, _sampled(), (1, 2, 1, 2), eos_token_id=0, k_policy="heuristic", seed=50),
    Scenario(3, 2, 2, 4, _sampled(), (1, 2, 1, 2), eos_token_id=0, k_policy="auto", seed=30),
    # The penalties that read each row's context (the server's repetition_penalty, min_tokens).
    Scenario(3, 1, 2, 3, _sampled(0.5, repetition_penalty=3.0, min_tokens=2), (1, 2, 1), eos_token_id=0, seed=26),
    Scenario(3, 2, 2, 4, SamplingParams(temperature=0.0, repetition_penalty=2.0, min_tokens=1), (1, 2, 0, 1, 2),
             eos_token_id=0, seed=22),
]


@dataclass(frozen=True)
class Configuration:
    """One audited run: a scenario, a proposer and a verification rule. `target_model` may
    wrap the target table (the negative controls swap in a broken cache)."""

    scenario: Scenario
    proposer: ProposerKind
    verifier: str | verify.Verifier
    target_model: Callable[[TableLM], CausalLM] = field(default=lambda table: table)

    @property
    def rule(self) -> str:
        """The rule's name; for a tree scenario, the tree rule a named verifier sends trees to."""
        if isinstance(self.verifier, str) and self.scenario.tree is not None:
            tree_rule = verify.rule_chooser(self.verifier, self.scenario.sampling.greedy)(TreeDraft((), ()))
            return tree_rule.__name__.replace("_", "-")
        return self.verifier if isinstance(self.verifier, str) else self.verifier.__name__

    @property
    def name(self) -> str:
        return f"{self.proposer.name} | {self.rule} | {self.scenario.name}"


@dataclass(frozen=True)
class Result:
    """paths: engine runs (random branches) walked; sequences: distinct outputs compared;
    drafted: drafted tokens summed over the paths (0 would mean speculation was never tried);
    unlike_plain: paths of keyed rounds whose tokens are not plain decoding's with the same
    noise (the coupled rule's identity; 0 to pass)."""

    proposer: str
    rule: str
    scenario: Scenario
    paths: int
    sequences: int
    drafted: int
    max_abs_diff: float
    seconds: float
    error: str | None = None
    unlike_plain: int = 0

    @property
    def name(self) -> str:
        return f"{self.proposer} | {self.rule} | {self.scenario.name}"

    @property
    def passed(self) -> bool:
        return self.error is None and self.max_abs_diff <= TOLERANCE and self.unlike_plain == 0


def select_proposers(names: list[str]) -> list[ProposerKind]:
    """The audited proposer kinds with these registry names, in the order given."""
    audited = {kind.name: kind for kind in audited_proposers()}
    for name in names:
        if name not in audited:
            reason = f" ({PROPOSERS[name].not_audited})" if name in PROPOSERS else ""
            raise ValueError(
                f"proposer {name!r} is not audited{reason}; choose from {', '.join(audited)}"
                if name in PROPOSERS else f"unknown proposer {name!r}; choose from {', '.join(audited)}"
            )
    return [audited[name] for name in names]


def default_configurations(
    proposers: list[ProposerKind] | None = None, scenarios: list[Scenario] | None = None
) -> list[Configuration]:
    return [
        Configuration(scenario, kind, rule)
        for kind in (audited_proposers() if proposers is None else proposers)
        for scenario in (SCENARIOS if scenarios is None else scenarios)
        for rule in kind.rules_for(scenario.sampling)
    ]


def engine_sequences(config: Configuration, tables: Tables) -> tuple[dict[tuple[int, ...], float], int, int, int]:
    """The engine's output distribution summed over every random branch, the number of
    branches, the drafted tokens summed over them, and the branches (keyed rounds only) whose
    tokens are not plain decoding's with the same noise."""
    s = config.scenario
    target = config.target_model(tables.target)
    proposer = config.proposer.audit(tables)
    policy = s.policy()

    keyed = verify.keyed_rounds(config.verifier, s.sampling.greedy)

    def run(rng) -> tuple[tuple[int, ...], int]:
        # Every replay must choose the same k's: AutoK learns from round timings, so they
        # come from a tick clock, not the machine's.
        options = dict(max_new_tokens=s.max_new_tokens, sampling=s.sampling, eos_token_id=s.eos_token_id, rng=rng,
                       verifier=config.verifier, clock=TickClock())
        generation = generate(target, proposer, s.prompt, k=policy, **options)
        plain = generate(target, None, s.prompt, k=0, **options).tokens if keyed else generation.tokens
        return tuple(generation.tokens), sum(generation.stats.drafted), plain != generation.tokens

    dist: dict[tuple[int, ...], float] = {}
    paths = drafted = unlike_plain = 0
    with single_threaded_torch():
        for probability, (tokens, n_drafted, differs) in outcomes(run):
            dist[tokens] = dist.get(tokens, 0.0) + probability
            paths += 1
            drafted += n_drafted
            unlike_plain += differs
    return dist, paths, drafted, unlike_plain


@contextmanager
def single_threaded_torch() -> Iterator[None]:
    """Tiny tensors gain nothing from intra-op threads, and on a busy machine waking them
    costs a tiny softmax a hundred times its work (docs/results/implementation-choices.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def audit_configuration(config: Configuration) -> Result:
    """Compare the engine with the exact target distribution; an exception is a failure."""
    start = time.perf_counter()
    s = config.scenario
    labels = (config.proposer.name, config.rule, s)
    try:
        tables = s.tables()
        exact = target_sequences(tables.target, s.prompt, sampling=s.sampling,
                                 max_new_tokens=s.max_new_tokens, eos_token_id=s.eos_token_id)
        observed, paths, drafted, unlike_plain = engine_sequences(config, tables)
    except Exception as error:  # the audit reports every failure instead of stopping at one
        return Result(*labels, 0, 0, 0, float("inf"), time.perf_counter() - start,
                      f"{type(error).__name__}: {error}")
    return Result(*labels, paths, len(exact.keys() | observed.keys()), drafted,
                  max_abs_difference(exact, observed), time.perf_counter() - start, unlike_plain=unlike_plain)


def max_abs_difference(exact: dict[tuple[int, ...], Fraction], observed: dict[tuple[int, ...], float]) -> float:
    """max over every sequence of |exact - observed| (a missing sequence counts as 0)."""
    return max(abs(float(exact.get(seq, 0)) - observed.get(seq, 0.0)) for seq in exact.keys() | observed.keys())
