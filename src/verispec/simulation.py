"""The k policies on simulated costs: the real engine and scheduler, a clock that charges what
a measured cost curve says, and drafts of controlled acceptance.

A policy (`AutoK`, `TreePolicy`, `BatchK` in the scheduler) is judged by tokens per second,
and what a second is depends on the machine: how a target forward's time grows with the rows
it scores, v(n) = t(n) / t(1), and what a drafted token costs, c t(1). Here nothing is
measured while running: a `SimulatedClock` advances only when a `SimulatedTarget` forward
charges t(1) v(rows) (one forward over every request's rows in a batched step) or a
`ChargedProposer` charges c t(1) per drafted level, so a run's seconds are exact and a policy
is tried against curves it has never met, on a CPU in seconds. The target is a rational table
(`verispec.models.tables`) and the proposer a `ControlledAcceptance` over its greedy
continuation, so everything else (the rounds, the verifier, the caches, the policies' own
learning from their rounds' timings) is the product's code.

The curves (`CURVES`) are measurements copied here as data, each with its source.
`policy_grid` runs the grid of docs/cost-model.md: each curve x acceptance x concurrency, the
auto policy against every fixed k and plain decoding (`benchmarks/policy_grid.py` prints it).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import torch

from verispec.batching import Scheduler
from verispec.cost import K_MAX, BatchCosts, ContextCosts, FixedCosts
from verispec.drafts import Draft, TreeDraft
from verispec.engine import generate
from verispec.models.base import ForwardingLM, SlotScoring, check_slots
from verispec.models.loading.format_costs import DEFAULT_BF16, DEFAULT_Q4  # --dtype auto's documented curves
from verispec.models.tables import TableLM, bigram
from verispec.policies import AutoK, KPolicy
from verispec.proposers.controlled import ControlledAcceptance
from verispec.randomness import Random
from verispec.request import Request
from verispec.sampling import GREEDY, SamplingParams
from verispec.tree_policy import TREE_NODES, TreePolicy
from verispec.tree_shape import TreeShape

STEP = 0.01  # seconds of one simulated one-row forward, t(1); every ratio is independent of it


@dataclass(frozen=True)
class Curve:
    """v(n) of a target forward over n rows at measured points (linear between them and beyond
    the last, as `BatchCosts`), and where the numbers come from. attention: what each scored
    row's attention costs per cached token it reads, in one-row forwards (0: nothing, as on
    the measured curves at their short contexts); a forward of n rows after a cache of L
    tokens then costs v(n) + attention n L, as attention that reads the cache once per row
    does (the fast runtime's deterministic float32 and q4)."""

    rows: tuple[int, ...]
    v: tuple[float, ...]
    source: str
    attention: float = 0.0

    @property
    def costs(self) -> BatchCosts:
        return BatchCosts(self.rows, self.v)

    def at(self, n: int, cached: int = 0) -> float:
        """One forward's cost in one-row forwards without context: n rows after `cached` tokens."""
        return self.costs.at(n) + self.attention * n * cached

    def profile(self, c: float, n_max: int) -> FixedCosts:
        """What a profile of this machine measures: c and v(1..n_max), t(1) = STEP; where
        attention costs, also after contexts of 1,024 and 4,096 tokens (`ContextCosts`; the
        cost is linear in the context, so the table's extension past its last point is exact)."""
        costs = FixedCosts(c, [self.at(n) for n in range(1, n_max + 1)], STEP)
        if not self.attention:
            return costs
        contexts = (1, 1024, 4096)  # a context of L tokens: the cache holds L - 1, the pending token is scored
        seconds = tuple(tuple(STEP * self.at(n, length - 1) for n in range(1, n_max + 1)) for length in contexts)
        return FixedCosts.of(ContextCosts(contexts, seconds, (c * STEP,) * len(contexts)))


CURVES: dict[str, Curve] = {
    "gpu-flat": Curve(
        (1, 2, 3, 5, 9, 17, 33, 65),
        (1.0, 1.168, 1.328, 1.307, 1.273, 1.305, 1.200, 1.206),
        "NVIDIA H200, the HF adapter (eager), SmolLM2-135M's shape with random weights, t(1) = 15.6 ms",
    ),
    "gpu-graph-135m": Curve(
        (1, 2, 5, 9, 17, 33, 65),
        (1.0, 1.297, 1.384, 1.396, 1.432, 1.448, 1.461),
        "NVIDIA H200, a static-cache CUDA-graph forward of SmolLM2-135M's shape, t(1) = 2.25 ms",
    ),
    "gpu-graph-8b": Curve(
        (1, 2, 5, 9, 17, 33, 65),
        (1.0, 1.130, 1.144, 1.178, 1.196, 1.204, 1.230),
        "NVIDIA H200, a static-cache CUDA-graph forward of a Llama-3-8B shape, t(1) = 6.51 ms",
    ),
    "cpu-bf16": Curve(
        DEFAULT_BF16.rows, DEFAULT_BF16.v,
        "2-core AMD EPYC, the fast runtime in bfloat16, the default model's batched forward "
        "(docs/results/concurrency-bf16-r3.json, header.batch_costs)",
    ),
    "cpu-q4": Curve(
        DEFAULT_Q4.rows, DEFAULT_Q4.v,
        "the fast runtime in q4: v(2..5) and v(9) its projections on a 2-core AMD EPYC "
        "(docs/runtime.md, exact q4 layers), v(8) and v(64) the whole forward on a 2-core Intel "
        "Xeon with AMX; its int4 kernel costs nearly in proportion to the rows",
    ),
    "compute-bound": Curve((1, 2), (1.0, 2.0), "v(n) = n: every row costs a whole forward"),
}


class SimulatedClock:
    """Seconds that pass only when a simulated forward or draft charges them."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def charge(self, seconds: float) -> None:
        self.now += seconds


class SimulatedTarget(ForwardingLM, SlotScoring):
    """A table target whose every forward (`extend`, `extend_tree`, `extend_slots` over all
    slots at once) charges the clock t(1) v(rows); prefill and `score` are free (the decode is
    measured). Slots share the clock and the curve."""

    def __init__(self, table: TableLM, curve: Curve, clock: SimulatedClock) -> None:
        super().__init__(table)
        self.curve, self.clock = curve, clock

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self._charge(len(tokens), len(tokens) * self.length)
        return self.inner.extend(tokens, keep)

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        self._charge(len(tokens), len(tokens) * self.length)
        return self.inner.extend_tree(tokens, parents)

    def keep_path(self, path: Sequence[int]) -> None:
        self.inner.keep_path(path)

    def new_slot(self, capacity: int = 256) -> SimulatedTarget:
        return SimulatedTarget(self.inner.new_slot(capacity), self.curve, self.clock)

    def extend_slots(self, slots: Sequence[SimulatedTarget], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        check_slots(slots, tokens, SimulatedTarget)
        self._charge(sum(len(rows) for rows in tokens), sum(len(rows) * slot.length for slot, rows in zip(slots, tokens)))
        return [slot.inner.extend(rows) for slot, rows in zip(slots, tokens)]

    def _charge(self, rows: int, reads: int) -> None:
        """One forward of `rows` rows that read `reads` cached tokens in all."""
        self.clock.charge(STEP * (self.curve.at(rows) + self.curve.attention * reads))


class ChargedProposer:
    """A proposer whose drafting charges the clock c t(1) per level: per token of a chain, per
    depth of a tree (a head drafts a tree level by level)."""

    def __init__(self, proposer: ControlledAcceptance, clock: SimulatedClock, c: float) -> None:
        self.proposer, self.clock, self.c = proposer, clock, c

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self.proposer.begin(prompt_ids, sampling)

    def commit(self, context: Sequence[int]) -> None:
        self.proposer.commit(context)

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        draft = self.proposer.propose(context, k, rng)
        self.clock.charge(self.c * STEP * len(draft))
        return draft

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        return self.proposer.propose_stateless(context, k, rng)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        draft = self.proposer.propose_tree(context, shape, rng)
        self.clock.charge(self.c * STEP * max(draft.depths, default=0))
        return draft

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return self.proposer.propose_tree_stateless(context, shape, rng)


VOCAB = 8
QUEUED = 4  # requests per slot in a simulated batch run
BATCHED_SHARE = 8  # a batched request's budget: this fraction of a lone request's


def cycle_table() -> TableLM:
    """A bigram table whose every row has one most likely token (1/2; the others 1/14): its
    greedy continuation is unique, and what a round costs does not depend on it."""
    rows = [[Fraction(1, 2) if b == (3 * a + 1) % VOCAB else Fraction(1, 14) for b in range(VOCAB)] for a in range(VOCAB)]
    return bigram(rows)


def greedy_continuation(table: TableLM, length: int):
    """prompt -> the table's greedy continuation of `length` tokens."""
    def continuation(prompt: Sequence[int]) -> list[int]:
        out, last = [], prompt[-1]
        for _ in range(length):
            row = table.distribution([last])
            last = max(range(len(row)), key=row.__getitem__)
            out.append(last)
        return out

    return continuation


def chain_acceptance(alpha: float, width: int = 4) -> list[list[float]]:
    """a(d, r) for a grid cell: the first candidate right with probability alpha, each next one
    with probability alpha of what the ones before it left (a top-k drafter of acceptance
    alpha whose lower ranks are as good as its first on what remains)."""
    return [[alpha * (1 - alpha) ** r for r in range(width)]]


@dataclass(frozen=True)
class Simulation:
    """Runs of one curve, acceptance and draft cost c; `tokens` tokens emitted per run in all;
    `k_max` the longest chain the auto policy considers (its profile measures v(n) to k_max + 1)."""

    curve: Curve
    acceptance: Sequence[Sequence[float]]
    c: float = 0.05
    tokens: int = 2048
    seed: int = 0
    k_max: int = K_MAX

    def policy(self, name: str | int) -> int | KPolicy:
        """A plan by name: an integer k (0: plain), 'auto' (`AutoK`) or 'tree' (`TreePolicy`),
        each measured policy starting from a correct profile of the curve."""
        if name == "auto":
            return AutoK(self.curve.profile(self.c, self.k_max + 1), k_max=self.k_max)
        if name == "tree":
            return TreePolicy(self.curve.profile(self.c, TREE_NODES + 1))
        return int(name)

    def throughput(self, name: str | int, concurrency: int = 1) -> float:
        """Tokens per simulated second with the plan `name`: one request of `tokens` tokens,
        or at concurrency > 1 a queue of QUEUED x `concurrency` requests of `tokens` /
        BATCHED_SHARE tokens each through the scheduler with `concurrency` slots
        (`BatchK` for 'auto'), so that most steps run full as in a loaded server and only the
        last requests drain."""
        clock, table = SimulatedClock(), cycle_table()
        target = SimulatedTarget(table, self.curve, clock)
        requests = 1 if concurrency == 1 else QUEUED * concurrency
        each = self.tokens if concurrency == 1 else max(1, self.tokens // BATCHED_SHARE)
        continuation = greedy_continuation(table, each)
        prompts = [(i % VOCAB, (5 * i + 3) % VOCAB) for i in range(requests)]

        def proposer(seed: int) -> ChargedProposer:
            return ChargedProposer(ControlledAcceptance(continuation, self.acceptance, VOCAB, seed), clock, self.c)

        if concurrency == 1:
            policy = self.policy(name)
            run = generate(
                target, proposer(self.seed) if policy != 0 else None, prompts[0], max_new_tokens=each,
                sampling=GREEDY, k=policy, clock=clock,
            )
            return len(run.tokens) / clock.now
        template = self.policy(name)

        def build(request: Request, slot: SimulatedTarget) -> tuple[ChargedProposer | None, int | KPolicy]:
            if template == 0:
                return None, 0
            return proposer(request.seed), copy.deepcopy(template)

        scheduler = Scheduler(
            target, build, max_slots=concurrency, clock=clock,
            batch_costs=self.curve.costs if name == "auto" else None,
        )
        jobs = [
            scheduler.submit(Request(
                prompt, each, seed=self.seed + i, proposer=None if template == 0 else "controlled",
                k=name if isinstance(name, str) else int(name),
            ))
            for i, prompt in enumerate(prompts)
        ]
        scheduler.run()
        return sum(len(job.tokens) for job in jobs) / clock.now


@dataclass(frozen=True)
class Cell:
    """One grid cell: the policy's and plain decoding's throughput, and each fixed k's."""

    curve: str
    alpha: float
    concurrency: int
    policy: str
    auto: float
    plain: float
    fixed: dict[int, float]

    @property
    def best_k(self) -> int:
        return max(self.fixed, key=self.fixed.__getitem__)

    @property
    def over_best(self) -> float:
        """The policy's throughput over the best fixed k's (k >= 1, chosen after the fact)."""
        return self.auto / self.fixed[self.best_k]

    @property
    def over_plain(self) -> float:
        return self.auto / self.plain

    def as_dict(self) -> dict:
        return {
            "curve": self.curve, "alpha": self.alpha, "concurrency": self.concurrency, "policy": self.policy,
            "over_best": self.over_best, "over_plain": self.over_plain, "best_k": self.best_k,
            "throughput": {"policy": self.auto, "plain": self.plain, **{f"k{k}": t for k, t in self.fixed.items()}},
        }


def grid_cell(
    curve: str, alpha: float, concurrency: int, *, policy: str = "auto", c: float = 0.05, tokens: int = 2048,
    ks: Sequence[int] = range(1, K_MAX + 1), seed: int = 0,
) -> Cell:
    """One cell: `policy` ('auto' or 'tree') against plain decoding and every k in `ks`."""
    sim = Simulation(CURVES[curve], chain_acceptance(alpha), c, tokens, seed)
    return Cell(
        curve, alpha, concurrency, policy, sim.throughput(policy, concurrency), sim.throughput(0, concurrency),
        {k: sim.throughput(k, concurrency) for k in ks},
    )
