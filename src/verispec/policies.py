"""Speculation-length (k) policies: how many tokens to draft in the next round.

A policy sees only the past (the request's `Stats`), so whatever it picks, the verifier's
exactness is untouched. It answers a `Plan` (`verispec.plan`): a chain's k (0: a plain
decoding step) or a tree shape.
"""

from __future__ import annotations

import copy
import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Protocol

from verispec.checks import is_int
from verispec.cost import (
    MARGIN, PRIOR_RATE, BatchCosts, Costs, FixedCosts, OnlineCosts, check_costs, check_v_curve, speedup, speedup_by_k,
)
from verispec.plan import AcceptanceCounts, Adjustable, Plan, chained_rates, smoothed_rate
from verispec.stats import Stats
from verispec.tree_shape import TreeShape


class KPolicy(Protocol):
    """What the engine asks a round's plan of. `trees` says whether its plans may be tree shapes
    (the engine then refuses block verification, defined for chains); verispec's policies
    subclass this class, whose chains-only False a tree policy overrides."""

    trees: bool = False

    def begin(self) -> None:
        """A new request."""
        ...

    def choose(self, stats: Stats) -> Plan:
        """The next round's plan: a chain's k >= 0 or a tree shape."""
        ...


class ConstantK(KPolicy):
    def __init__(self, k: int) -> None:
        if not is_int(k, least=0):
            raise ValueError(f"k must be an integer >= 0, got {k!r}")
        self.k = k

    def begin(self) -> None:
        pass

    def choose(self, stats: Stats) -> Plan:
        return Plan(self.k)


class ConstantTree(KPolicy):
    """The same tree shape every round (the engine cuts it to the budget), for trees whose
    shape is fixed in advance, as Medusa's and SpecInfer's are, and for the exhaustive audit.

    >>> ConstantTree(TreeShape.of([(0,), (1,)])).choose(Stats()).describe()
    'tree 2 nodes: 2'
    """

    trees = True

    def __init__(self, shape: TreeShape) -> None:
        if not isinstance(shape, TreeShape) or not len(shape):
            raise ValueError(f"a constant tree needs a TreeShape with at least one node, got {shape!r}")
        self.shape = shape

    def begin(self) -> None:
        pass

    def choose(self, stats: Stats) -> Plan:
        return Plan(shape=self.shape)


class HeuristicK(KPolicy):
    """HF transformers' assisted-generation schedule: k + 2 after a round that accepted every
    drafted token, k - 1 (at least 1) otherwise."""

    def __init__(self, start: int = 4) -> None:
        if not is_int(start, least=1):
            raise ValueError(f"the starting k must be an integer >= 1, got {start!r}")
        self.start = start
        self.k = start

    def begin(self) -> None:
        self.k = self.start

    def choose(self, stats: Stats) -> Plan:
        if stats.rounds and stats.drafted[-1] > 0:
            all_accepted = stats.accepted[-1] == stats.drafted[-1]
            self.k = self.k + 2 if all_accepted else max(1, self.k - 1)
        return Plan(self.k)


class AutoK(KPolicy):
    """Each round, the k that the cost model predicts to be fastest, or 0 when none pays.

    The predicted speedup of k drafts is E(k) / (k c + v(k + 1)) (`verispec.cost`), with c and
    v(n) learned from this request's own round timings (`OnlineCosts`, with the measured
    `costs`, a `Profile`, as the prior: `cost_prior_weight` rounds' worth, decaying by
    `cost_memory` per round) and E(k) = 1 + s_1 + ... + s_k from this request's own acceptance
    so far. So a noisy or wrong profile cannot hold it on a losing k: the rounds of that k
    measure what it costs. Every v(n) is relative to a plain step, so when the rounds have not
    measured one lately (`OnlineCosts.stale`) it takes one plain step instead of speculating.
    The conditional acceptance at position i is estimated as

        r_i = (accepts_i + w m_i) / (attempts_i + w),   m_1 = prior_rate, m_i = r_{i-1},

    with counts that decay by `memory` per speculative round (recent rounds weigh more: the
    acceptance of prompt lookup comes and goes with the text), and s_i = r_1 ... r_i. The
    pseudo-count w = `prior_weight`, four rounds' worth, keeps a short unlucky run from
    stopping speculation: the probes that restart a stopped policy are single rounds, which
    seldom pay at a trained head's acceptance (about 0.4), so a policy stopped by chance stays
    stopped. The memory bounds the evidence at 1 / (1 - memory) = 20 rounds, so drafts that never
    land still bring r_1 down to w m_1 / (20 + w) = 0.08 and stop speculation within about a
    dozen rounds (`benchmarks/autok_settings.py` compares settings on the dev prompts; README,
    "Cost model, profiler, adaptive k"). Pulling each position towards the one before it (not towards a constant)
    lets a position that k has not reached yet inherit the evidence of its neighbours, so k
    can grow when drafts keep landing.

    When no k beats plain decoding by `margin`, the policy decodes plainly and probes: one
    speculative round, at the k the current estimates favour, after `probe_every` plain
    rounds, the wait doubling (up to `probe_cap`) while probes lose. A probe that pays off in
    its own round, (accepted + 1) / (k c + v(k + 1)) > 1 + margin, means the acceptance has
    changed: the old evidence is dropped, the wait is reset and speculation resumes if the
    fresh estimate says so.

    The context gate: c and v(n) are taken at the request's current context every round
    (`Stats.context_tokens`, `OnlineCosts.at`), from the costs' context table where the
    profile measured one (`verispec.cost.ContextCosts`; flat in context where it did not).
    Where a long context makes scoring k + 1 positions cost nearly k + 1 plain steps no k
    pays, and the policy decodes plainly; where even drafts that were all accepted could not
    pay, it does not probe either (`_could_pay`), so a long context costs it nothing over
    plain decoding; its acceptance evidence waits, and where the costs let speculation pay
    again (a shorter request, a cheaper segment of the curve) it drafts at once.

    In a batch (`verispec.batching`, `BatchK`) the batch may hold a request to fewer drafts
    than its policy chose, or none: a request held at k = 0 learns nothing of its acceptance,
    so an estimate lowered by a few unlucky rounds, or the prior itself where rows are dear,
    would keep it there for good. So after `probe_every` steps held at 0 its `adjustable`
    entry asks for a probe, which `BatchK` drafts whatever the rest of the batch does (when
    cheap); the wait doubles with each probe, without a cap (what a probe finds is pooled with
    the batch's evidence, `pooled`), until the batch drafts for it again.

    It reads only past rounds, so the verifier's exactness is untouched; it is deterministic
    given the sequence of `Stats` it sees (counts and seconds), so the engine and the reference
    decoder agree when both time their rounds on the same fake clock (`verispec.clocks`).
    `verispec.profile.measured_autok` builds one from a brief profile measured on the spot.

        >>> from verispec.cost import FixedCosts
        >>> AutoK(FixedCosts(c=0.0, v=[1.0] * 9)).choose(Stats()).k  # free drafts, flat v: k_max
        8
        >>> AutoK(FixedCosts(c=0.5, v=[1.0] * 9)).choose(Stats()).k  # costly drafts: plain first
        0
    """

    def __init__(
        self,
        costs: Costs,
        *,
        k_max: int | None = None,
        prior_rate: float = PRIOR_RATE,
        prior_weight: float = 4.0,
        memory: float = 0.95,
        margin: float = MARGIN,
        probe_every: int = 4,
        probe_cap: int = 32,
        cost_prior_weight: float = 1.0,
        cost_memory: float = 0.995,
    ) -> None:
        check_v_curve(costs.v)
        check_costs(costs.c, costs.v[0])
        k_max = checked_limit(k_max, len(costs.v) - 1, "k_max")
        if not 0 < prior_rate < 1:
            raise ValueError(f"prior_rate (acceptance assumed before data) must be in (0, 1), got {prior_rate!r}")
        if not prior_weight > 0:
            raise ValueError(f"prior_weight (pseudo-rounds of the prior) must be > 0, got {prior_weight!r}")
        if not 0 < memory <= 1:
            raise ValueError(f"memory (the decay per speculative round) must be in (0, 1], got {memory!r}")
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0, got {margin!r}")
        if not (is_int(probe_every, least=1) and is_int(probe_cap, least=probe_every)):
            raise ValueError(f"need integers 1 <= probe_every <= probe_cap, got {probe_every}, {probe_cap}")
        table = getattr(costs, "context_table", None)
        prior = FixedCosts(
            costs.c, list(costs.v[: k_max + 1]), getattr(costs, "step_seconds", None),
            None if table is None else table.prefix(k_max + 1),
        )
        self.costs = OnlineCosts(prior, prior_weight=cost_prior_weight, memory=cost_memory)
        self.k_max = k_max
        self.prior_rate = prior_rate
        self.prior_weight = prior_weight
        self.memory = memory
        self.margin = margin
        self.probe_every = probe_every
        self.probe_cap = probe_cap
        self.begin()

    @property
    def c(self) -> float:
        """The current estimate of c (the profile's before any timed round)."""
        return self.costs.c

    @property
    def v(self) -> list[float]:
        """The current estimate of v(1..k_max + 1)."""
        return self.costs.v

    def begin(self) -> None:
        self.costs.begin()
        self._seen_rounds = 0  # rounds whose timings `costs` has absorbed
        self._forget_acceptance()
        self._probing = False
        self._plain = 0  # plain rounds since speculation stopped or the last probe
        self._wait = self.probe_every
        self._held = 0  # batched steps in a row in which the batch drafted nothing for it
        self._hold_wait = self.probe_every
        self._batch_probe = False  # the last choice asks the batch for a probe

    def choose(self, stats: Stats) -> Plan:
        k = self._choose(stats)
        self._batch_probe = self._held >= self._hold_wait
        if self._batch_probe:
            self._held = 0
        return self._as_plan(k)

    def _as_plan(self, choice: int | TreeShape) -> Plan:
        """A chain whose k a batch may choose instead (`BatchK`), with what the batch weighs
        (`adjustable`)."""
        return Plan(choice, adjustable=self.adjustable(choice))

    def adjustable(self, k: int) -> Adjustable:
        """What `BatchK` plans this round from (k: what `choose` answered): the survival and c,
        the evidence behind the survival, and whether this round probes. Its k may be up to
        k_max, not only `choose`'s: `choose` weighs a forward of k + 1 rows alone, where v(2)
        may be 1.17 (the H200's), while in a batch one more row can cost nothing; the batch's
        own v(N) decides (the engine still cuts the plan to the budget)."""
        counts = AcceptanceCounts(tuple(self._attempts), tuple(self._accepts), self.prior_rate, self.prior_weight)
        return Adjustable(self.k_max, counts.survival(), self.c, probe=self._batch_probe, counts=counts)

    def _choose(self, stats: Stats) -> int | TreeShape:
        fresh = self._absorb(stats)
        self.costs.at(stats.context_tokens)
        if self._probing:
            self._probing = False
            if stats.drafted[-1] == 0:  # the proposer had nothing to offer: probe again
                self._probing = True
                return self._best()[0]
            if self._paid(stats) > 1 + self.margin:
                self._adopt(fresh)
                self._wait = self.probe_every
            else:
                self._wait = min(2 * self._wait, self.probe_cap)
        k, predicted = self._best()
        if predicted > 1 + self.margin:
            if self.costs.stale:
                return 0  # measure a plain step: the unit every v(n) is relative to
            self._plain = 0
            self._wait = self.probe_every
            return k
        if self._plain >= self._wait and self._could_pay():
            self._plain = 0
            self._probing = True
            return k
        self._plain += 1
        return 0

    def _could_pay(self) -> bool:
        """Whether some k up to k_max beats plain decoding by the margin at the current costs
        if every drafted token were accepted: where none does (a long context where scoring
        k + 1 positions costs nearly k + 1 steps), no acceptance a probe could find would
        make speculation pay, so none is drafted."""
        c, v = self.c, self.v
        return any((k + 1) / (k * c + v[k]) > 1 + self.margin for k in range(1, self.k_max + 1))

    def survival(self) -> list[float]:
        """The current estimate s_1..s_{k_max}."""
        return AcceptanceCounts(self._attempts, self._accepts, self.prior_rate, self.prior_weight).survival()

    def _best(self) -> tuple[int | TreeShape, float]:
        """The plan (here a k in 1..k_max) with the highest predicted speedup, and that speedup."""
        ratios = speedup_by_k(self.c, self.v, self.survival())
        k = max(range(1, len(ratios)), key=ratios.__getitem__)
        return k, ratios[k]

    def _absorb(self, stats: Stats) -> tuple[list[float], list[float]]:
        """Fold the rounds recorded since the last call into the decayed counts and the cost
        estimates; return the last round's own counts (a probe's fresh evidence)."""
        for r in range(self._seen_rounds, stats.rounds):
            drafted = stats.drafted[r]
            if shared_forward(stats, r):
                self._count_held(stats, r)
                continue  # its forward's seconds are the batch's, not those of drafted + 1 rows
            levels = self._draft_levels(stats, r)
            self.costs.observe(drafted + 1, stats.round_target_seconds[r], levels, stats.round_draft_seconds[r])
        fresh = self._absorb_acceptance(stats, stats.rounds - self._seen_rounds)
        self._seen_rounds = stats.rounds
        return fresh

    def _count_held(self, stats: Stats, r: int) -> None:
        """Batched round r: held at k = 0, or drafted (after a probe the wait doubles; a round
        the batch drafted for it on its own resets it)."""
        if stats.drafted[r] == 0:
            self._held += 1
            return
        if self._batch_probe:
            self._hold_wait *= 2
        else:
            self._hold_wait = self.probe_every  # the batch drafted for it on its own
        self._held = 0

    def _paid(self, stats: Stats) -> float:
        """The last round's own speedup: its emitted tokens over its predicted cost."""
        drafted, accepted = stats.drafted[-1], stats.accepted[-1]
        return speedup(accepted + 1, self._draft_levels(stats, stats.rounds - 1), self.c, self.v[drafted])

    def _draft_levels(self, stats: Stats, r: int) -> int:
        """The proposer steps round r took (c is the cost of one): a chain drafts one token per
        step."""
        return stats.drafted[r]

    def _forget_acceptance(self) -> None:
        self._attempts = [0.0] * self.k_max  # decayed rounds that reached position i + 1
        self._accepts = [0.0] * self.k_max  # ... and accepted it
        self._seen_attempts: list[int] = []  # the Stats counters already absorbed
        self._seen_accepts: list[int] = []

    def _adopt(self, fresh: tuple[list[float], list[float]]) -> None:
        """A probe paid off: its own counts replace the old evidence."""
        self._attempts, self._accepts = fresh

    def _absorb_acceptance(self, stats: Stats, new_rounds: int) -> tuple[list[float], list[float]]:
        """Decay the counts and add the chain position counters' growth since the last call
        (the last `new_rounds` rounds); return that growth."""
        new_attempts = counter_growth(stats.position_attempts, self._seen_attempts, self.k_max)
        new_accepts = counter_growth(stats.position_accepts, self._seen_accepts, self.k_max)
        self._seen_attempts = list(stats.position_attempts)
        self._seen_accepts = list(stats.position_accepts)
        if any(new_attempts):
            self._attempts = decayed(self._attempts, new_attempts, self.memory)
            self._accepts = decayed(self._accepts, new_accepts, self.memory)
        return new_attempts, new_accepts


def shared_forward(stats: Stats, r: int) -> bool:
    """Whether round r's forward also scored other requests' rows (`verispec.batching`)."""
    rows = stats.round_batch_rows
    return r < len(rows) and rows[r] > stats.drafted[r] + 1


def checked_limit(limit: int | None, measured: int, name: str) -> int:
    """`limit` (None: `measured`), the most drafted tokens or tree nodes a plan may hold, checked
    to be an integer in [1, measured]: v(n) is known up to n = measured + 1."""
    top = measured if limit is None else limit
    if not is_int(top, 1, measured):
        raise ValueError(
            f"{name} must be an integer in [1, {measured}] (v(n) is measured up to n = {measured + 1}), got {limit!r}"
        )
    return top


def decayed(counts: list[float], new: list[float], memory: float) -> list[float]:
    """Counts that lose `memory` of their weight per round, plus a round's new counts."""
    return [memory * x + d for x, d in zip(counts, new)]


def counter_growth(now: list[int], before: list[int], length: int) -> list[float]:
    """How much each of the first `length` counters grew since `before` (lists of counters
    grow as deeper positions are reached; a missing counter is 0)."""
    def at(counters: list[int], i: int) -> int:
        return counters[i] if i < len(counters) else 0

    return [float(at(now, i) - at(before, i)) for i in range(length)]


class PerSource:
    """A policy per draft source, each choosing from its own source's rounds only.

    A combined proposer (`lookup+eagle`, `verispec.proposers.copy_or_head`) drafts some rounds
    by copying and the others with a trained head, and says which before each round, from the
    context alone (`SourcedProposer.source`). Their acceptance and their cost per drafted token
    differ: one policy fed both would pick one k for a mixture, too short for the copies and
    too long for the head, or stop speculating in both. Here each source gets a fresh copy of
    `policy`, reading `stats.by_source[name]`, so a head that does not pay is turned off (its
    rounds decode plainly and probe) while copying keeps its own k. Every choice still reads
    the past only, so exactness is untouched. A proposer with one source (source None) is
    driven by `policy` itself, on the request's whole `Stats`.
    """

    def __init__(self, policy: KPolicy) -> None:
        self.policy = policy
        self.by_source: dict[str, KPolicy] = {}

    def begin(self) -> None:
        self.policy.begin()
        self.by_source = {}

    def choose(self, stats: Stats, source: str | None) -> Plan:
        """The plan of `source`'s policy, naming the source."""
        if source is None:
            return Plan.of(self.policy.choose(stats))
        if source not in self.by_source:
            self.by_source[source] = copy.deepcopy(self.policy)
            self.by_source[source].begin()
        return replace(Plan.of(self.by_source[source].choose(stats.source(source))), source=source)


def as_policy(k: int | KPolicy) -> KPolicy:
    if isinstance(k, str):
        raise ValueError(
            f"k={k!r}: give an integer >= 0 or a policy object; k = auto needs measured costs, "
            "AutoK(Profile.load(FILE)) or verispec.profile.measured_autok(target, proposer, prompt_ids)"
        )
    return ConstantK(k) if isinstance(k, int) else k


def pooled(adjustable: Sequence[Adjustable]) -> list[Adjustable]:
    """Each request's survival from its own counts and the batch's (empirical Bayes): per
    position i, the batch's rate R_i = (A_i + w M_i) / (N_i + w) from every request's counts
    summed (A_i accepts of N_i attempts) and the prior once (M_1 the prior rate, M_i = R_(i-1));
    the variance of the requests' true rates around it, b_i (DerSimonian and Laird's moment
    estimate: the spread of the requests' rates beyond what their attempts explain); then each
    request's r_i = (a_i + t_i R_i) / (n_i + t_i), t_i = R_i (1 - R_i) / b_i pseudo-rounds of
    the batch (b_i = 0: the batch's rate). Requests alike, whose rates differ by chance, are
    planned alike, and a request with few rounds of its own (just admitted, or held at k = 0,
    where it learns nothing) plans from the batch's evidence, not from the prior: drafting
    follows the estimate, and 8 requests each smoothed towards the prior would count it 8
    times. Requests whose acceptance really differs (lookup on a document beside a chat) keep
    their own. Unchanged when any entry's counts are unknown or there are fewer than two."""
    if len(adjustable) < 2 or any(entry.counts is None for entry in adjustable):
        return list(adjustable)
    counts = [entry.counts for entry in adjustable]
    depth = min(len(c.attempts) for c in counts)
    weight = statistics.fmean(c.prior_weight for c in counts)
    batch = statistics.fmean(c.prior_rate for c in counts)
    rates = [[] for _ in counts]
    for i in range(depth):
        attempts = [c.attempts[i] for c in counts]
        accepts = [c.accepts[i] for c in counts]
        batch = smoothed_rate(math.fsum(accepts), math.fsum(attempts), batch, weight)
        spread = between_variance(accepts, attempts)
        pull = max(weight, batch * (1 - batch) / spread) if spread > 0 else math.inf
        for own, n, a in zip(rates, attempts, accepts):
            own.append(smoothed_rate(a, n, batch, pull) if pull < math.inf else batch)
    out = []
    for entry, own in zip(adjustable, rates):
        c = entry.counts  # positions beyond the shortest entry's: its own, chained on from the pooled
        own += chained_rates(c.accepts[depth:], c.attempts[depth:], own[-1] if own else batch, c.prior_weight)
        out.append(replace(entry, survival=list(itertools.accumulate(own, lambda s, r: s * r))))
    return out


def between_variance(accepts: Sequence[float], attempts: Sequence[float]) -> float:
    """The variance of the true rates of the groups whose counts these are, beyond the binomial
    noise of their attempts (DerSimonian and Laird's moment estimate, at least 0)."""
    total = math.fsum(attempts)
    groups = [(a, n) for a, n in zip(accepts, attempts) if n > 0]
    scale = total - math.fsum(n * n for _, n in groups) / total if total > 0 else 0.0
    if len(groups) < 2 or scale <= 0:
        return 0.0
    mean = math.fsum(accepts) / total
    q = math.fsum(n * (a / n - mean) ** 2 for a, n in groups)
    return max(0.0, (q - (len(groups) - 1) * mean * (1 - mean)) / scale)


# A probe that costs a batched step more than this share of its forward is not drafted: where
# rows are dear (v(n) nearly proportional to n) probing would cost more than it could find.
PROBE_SHARE = 0.2


class BatchK:
    """Each auto request's k for the batch's committed tokens per second, not its own.

    A step emits E = sum_i (1 + s_i1 + ... + s_ik_i) tokens in T = sum_i c_i k_i + v(N) time
    (in one-row forwards; N = sum_i (k_i + 1) rows, v from `BatchCosts`). Starting from
    k_i = 0, it adds one draft at a time, the one that gives the highest E / T next, until every
    request is at the k its own policy chose (which already weighs its acceptance and its own
    cost, and probes when it stopped), and keeps the point of that path with the highest E / T.
    A step in v(N) (a kernel's row blocking) thus does not stop it short of a longer chain that
    pays. With v flat it drafts as each request would alone, and as the forward turns
    compute-bound (v(N) rising with N) it drafts less, or not at all. Fixed-k requests keep
    their k; their rows count in N; so do a probing request's (`Adjustable.probe`), which
    drafts its k whatever the rest when that costs at most `PROBE_SHARE` of the step's forward.
    """

    def __init__(self, costs: BatchCosts) -> None:
        self.costs = costs

    def adjust(self, plans: Sequence[Plan], tokens: Sequence[float]) -> list[int | None]:
        """The batch's k for each of a step's plans that lets a batch choose it
        (`Plan.adjustable`), None for the others (kept as their policy chose them: their rows
        count in N and their `tokens`, each request's tokens per round so far, in E). Each
        request's engine applies its own (`Decoding.plan`)."""
        adjustable = [i for i, plan in enumerate(plans) if plan.adjustable is not None]
        fixed = [i for i, plan in enumerate(plans) if plan.adjustable is None]
        ks = self.plan(
            [plans[i].adjustable for i in adjustable],
            sum(plans[i].nodes + 1 for i in fixed),
            sum(tokens[i] for i in fixed),
        )
        adjustments: list[int | None] = [None] * len(plans)
        for i, k in zip(adjustable, ks):
            adjustments[i] = k
        return adjustments

    def plan(self, adjustable: Sequence[Adjustable], fixed_rows: int = 0, fixed_tokens: float = 0.0) -> list[int]:
        """The k of each adjustable request, beside fixed-k requests that score `fixed_rows`
        rows and are expected to emit `fixed_tokens` tokens this step."""
        adjustable = pooled(adjustable)
        ks = self._probes(adjustable, fixed_rows + len(adjustable))
        rows = fixed_rows + len(adjustable) + sum(ks)
        tokens = fixed_tokens + len(adjustable) + sum(sum(e.survival[:k]) for e, k in zip(adjustable, ks))
        drafting = sum(e.c * k for e, k in zip(adjustable, ks))
        best_ks, best_rate = list(ks), tokens / self.costs.at(rows)
        while True:
            pick, pick_rate = None, 0.0
            forward = self.costs.at(rows + 1)  # one more row, whichever request drafts it
            for i, entry in enumerate(adjustable):
                if ks[i] >= entry.most:
                    continue
                rate = (tokens + entry.survival[ks[i]]) / (drafting + entry.c + forward)
                if pick is None or rate > pick_rate:
                    pick, pick_rate = i, rate
            if pick is None:
                return best_ks
            tokens += adjustable[pick].survival[ks[pick]]
            drafting += adjustable[pick].c
            ks[pick] += 1
            rows += 1
            if pick_rate > best_rate:
                best_ks, best_rate = list(ks), pick_rate

    def _probes(self, adjustable: Sequence[Adjustable], rows: int) -> list[int]:
        """The drafts of the probing requests whose probe costs at most PROBE_SHARE of the
        step's forward (over `rows` rows before them); 0 for the rest."""
        ks = []
        for entry in adjustable:
            extra = entry.c + self.costs.at(rows + 1) - self.costs.at(rows)
            probe = entry.probe and entry.most > 0 and extra <= PROBE_SHARE * self.costs.at(rows)
            ks.append(1 if probe else 0)
            rows += ks[-1]
        return ks
