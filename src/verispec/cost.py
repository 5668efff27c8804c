"""The cost model of speculative decoding (the seed lesson's speed equation).

A round drafts k tokens (k draft steps, each costing c plain target steps) and scores the k + 1
positions [pending, x_1..x_k] in one target forward costing v(k + 1) plain steps. It emits
E tokens in expectation, so against plain decoding (one token per step)

    speedup(k) = E(k) / (k c + v(k + 1)).

With a constant, independent per-token acceptance alpha, E(alpha, k) = (1 - alpha^(k+1)) /
(1 - alpha) (k + 1 at alpha = 1). In general E = 1 + sum_{i=1..k} s_i where s_i = P(the first
i drafted tokens are all accepted), the survival measured by `Stats.survival()`.

    >>> round(expected_tokens(0.8, 6), 6)
    3.951424
    >>> round(speedup(expected_tokens(0.8, 6), k=6, c=0.1, v=1.0), 2)
    2.47

Plain decoding is the baseline: its speedup is 1 by definition, so `optimal_k` answers 0
(do not speculate) unless some k beats 1.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from verispec.checks import is_int, is_number
from verispec.k_spec import check_k
from verispec.stats import Stats

# Survival estimates are products of rates; allow their float round-off, nothing more.
TOLERANCE = 1e-9
# What `verispec.policies.AutoK` assumes before a request's first round, and what `--dtype auto`
# expects of a proposer (`models.loading.format_costs`): each drafted token accepted with this
# probability; a k > 0 only where it beats plain decoding by MARGIN; k up to K_MAX (the profile
# `k = auto` measures before a request, `verispec.profile.measured_autok`).
PRIOR_RATE = 0.5
MARGIN = 0.05
K_MAX = 8


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens emitted by a round of k drafts with constant acceptance alpha."""
    check_alpha(alpha)
    check_k(k, minimum=0)
    if alpha == 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def expected_tokens_from_survival(survival: Sequence[float]) -> float:
    """1 + sum_i s_i for survival s_i = P(first i drafted tokens accepted), i = 1..k."""
    return expected_tokens_by_k(survival)[-1]


def expected_tokens_by_k(survival: Sequence[float]) -> list[float]:
    """out[k] = 1 + s_1 + ... + s_k for k = 0..len(survival): E for every shorter draft too."""
    check_survival(survival)
    out = [1.0]
    for s in survival:
        out.append(out[-1] + s)
    return out


def survival_from_alpha(alpha: float, k: int) -> list[float]:
    """s_i = alpha^i, i = 1..k: the survival of constant, independent acceptance."""
    check_alpha(alpha)
    check_k(k, minimum=0)
    return [alpha**i for i in range(1, k + 1)]


def speedup(expected: float, k: int, c: float, v: float) -> float:
    """E / (k c + v): a round's tokens over its cost in plain target steps.

    expected: tokens the round emits (E, in [1, k + 1]); c: one draft step / one target step;
    v: v(k + 1), the target's time to score the round's k + 1 positions / one target step.
    """
    check_k(k, minimum=0)
    check_costs(c, v)
    if not 1 - TOLERANCE <= expected <= k + 1 + TOLERANCE:
        raise ValueError(
            f"expected tokens per round must lie in [1, k + 1] = [1, {k + 1}], got {expected!r}"
        )
    return expected / (k * c + v)


def speedup_by_k(c: float, v: Sequence[float], survival: Sequence[float]) -> list[float]:
    """Predicted speedup for every k the inputs cover: out[k] for k = 0..K.

    v: v[n - 1] = v(n), n = 1..; survival: s_1, s_2, ...; K = min(len(v) - 1, len(survival)).
    out[0] = 1.0: plain decoding is the baseline whatever the scoring costs.
    """
    check_v_curve(v)
    check_survival(survival)
    top = min(len(v) - 1, len(survival))
    expected = expected_tokens_by_k(survival[:top])
    return [1.0] + [speedup(expected[k], k, c, v[k]) for k in range(1, top + 1)]


def optimal_k(
    c: float,
    v: Sequence[float],
    *,
    survival: Sequence[float] | None = None,
    alpha: float | None = None,
    margin: float = 0.0,
) -> int:
    """The k maximising the predicted speedup, or 0 when no k beats 1 + margin.

    Give the measured survival (s_1..s_K) or a constant alpha (then K = len(v) - 1).

        >>> optimal_k(0.1, [1.0] * 11, alpha=0.8)
        6
        >>> optimal_k(0.1, [1.0] * 11, alpha=0.1)
        0
    """
    if (survival is None) == (alpha is None):
        raise ValueError("give exactly one of survival (measured) or alpha (constant acceptance)")
    if not is_number(margin, least=0):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    if survival is None:
        survival = survival_from_alpha(alpha, max(len(v) - 1, 0))
    ratios = speedup_by_k(c, v, survival)
    best = max(range(len(ratios)), key=ratios.__getitem__)
    return best if ratios[best] > 1 + margin else 0


class Costs(Protocol):
    """Measured costs in plain target steps (a `verispec.profile.Profile` is one).

    Optionally also `context_table`, a `ContextCosts` (the costs by context length), or None
    where the costs were measured at one context only: they are then taken as flat in context."""

    c: float  # one drafted token / one target step
    v: Sequence[float]  # v[n - 1] = v(n): scoring n new tokens / one target step
    step_seconds: float | None  # one plain target step in seconds, None when not measured


@dataclass(frozen=True)
class ContextCosts:
    """The costs' context axis: what a forward and a drafted token cost after each measured
    context length, in seconds.

    contexts [C]: increasing context lengths (tokens before the round's pending token);
    seconds [C][N]: seconds[i][n - 1] = t(n), the target's time to score n new tokens after
    contexts[i]; draft [C]: the proposer's seconds per drafted token there. At a context
    between two points each is linear in the context (attention reads every cached key, so its
    share grows linearly with them); below the first point it is the first point's; beyond the
    last it goes on along the last segment's slope where that rises (flat where it falls: more
    context never costs less, and a noisy fall must not be extended to nothing). So
    v(n, L) = t(n, L) / t(1, L) and c(L) = draft(L) / t(1, L) at every context L.

        >>> table = ContextCosts((1000, 5000), ((0.010, 0.012), (0.020, 0.040)), (0.001, 0.002))
        >>> [round(x, 6) for x in table.at(3000)[0]], table.at(3000)[1]
        ([0.015, 0.026], 0.0015)
        >>> [round(x, 6) for x in table.at(9000)[0]]
        [0.03, 0.068]
    """

    contexts: tuple[int, ...]
    seconds: tuple[tuple[float, ...], ...]
    draft: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.contexts or len(self.seconds) != len(self.contexts) or len(self.draft) != len(self.contexts):
            raise ValueError(
                f"a context table needs as many rows of t(n) and draft costs as contexts, got {len(self.contexts)} "
                f"contexts, {len(self.seconds)} rows and {len(self.draft)} draft costs"
            )
        if any(not is_int(n, least=0) for n in self.contexts) or any(b <= a for a, b in zip(self.contexts, self.contexts[1:])):
            raise ValueError(f"a context table's lengths must be increasing integers >= 0, got {self.contexts}")
        for length, row, draft in zip(self.contexts, self.seconds, self.draft):
            if len(row) != len(self.seconds[0]) or not row:
                raise ValueError("every context of a context table needs t(n) for the same n = 1..N, N >= 1")
            if not all(is_number(t, least=0, open_least=True) for t in row) or not is_number(draft, least=0):
                raise ValueError(
                    f"the seconds after {length} tokens must be finite, t(n) > 0 and a draft's >= 0, got {row} and {draft}"
                )

    @classmethod
    def flat(cls, costs: Costs) -> ContextCosts:
        """Costs measured at one context, taken as the same at every context, in plain steps
        (t(n) = v(n), draft = c)."""
        return cls((0,), (tuple(costs.v),), (costs.c,))

    @property
    def points(self) -> int:
        """N: t(n) is known for n = 1..N."""
        return len(self.seconds[0])

    def prefix(self, points: int) -> ContextCosts:
        """The same table for n = 1..points only."""
        return ContextCosts(self.contexts, tuple(row[:points] for row in self.seconds), self.draft)

    def costs_at(self, context: int) -> tuple[float, list[float]]:
        """c and v(1..N) after `context` tokens."""
        seconds, draft = self.at(context)
        return draft / seconds[0], [t / seconds[0] for t in seconds]

    def at(self, context: int) -> tuple[list[float], float]:
        """t(1..N) [N] and the seconds per drafted token after `context` tokens."""
        contexts = self.contexts
        if len(contexts) == 1 or context <= contexts[0]:
            return list(self.seconds[0]), self.draft[0]
        i = min(bisect.bisect_left(contexts, context), len(contexts) - 1)  # the segment i - 1 .. i
        low, high = self.seconds[i - 1], self.seconds[i]
        share = (context - contexts[i - 1]) / (contexts[i] - contexts[i - 1])

        def along(a: float, b: float) -> float:
            return a + (b - a) * share if share <= 1 or b > a else b

        return [along(a, b) for a, b in zip(low, high)], along(self.draft[i - 1], self.draft[i])


def context_table(costs: Costs) -> ContextCosts:
    """The costs by context length: `costs.context_table` where measured, else flat."""
    table = getattr(costs, "context_table", None)
    return table if table is not None else ContextCosts.flat(costs)


@dataclass(frozen=True)
class FixedCosts:
    """Costs given by hand (the seed's idealised v = 1, or numbers from elsewhere); optionally
    with a context axis (`context_table`, in seconds; c, v and step_seconds then are its costs
    at the first context)."""

    c: float
    v: Sequence[float]
    step_seconds: float | None = None
    context_table: ContextCosts | None = None

    def __post_init__(self) -> None:
        check_v_curve(self.v)
        check_costs(self.c, self.v[0])
        if self.step_seconds is not None:
            check_costs(0.0, self.step_seconds)
        if self.context_table is not None and self.context_table.points < len(self.v):
            raise ValueError(
                f"the context table has t(n) for n up to {self.context_table.points}, the costs v(n) up to {len(self.v)}"
            )

    @classmethod
    def of(cls, table: ContextCosts) -> FixedCosts:
        """The costs of a context table (c, v and the plain step at its first context)."""
        seconds, draft = table.at(table.contexts[0])
        return cls(draft / seconds[0], [t / seconds[0] for t in seconds], seconds[0], table)


# A round's forward more than this factor away from its current estimate counts as this factor
# away: one stall of a loaded machine moves an estimate by at most log(2) / its weight.
CLIP = 2.0
# t(1), the unit of c and v(n), is stale below this much recent evidence (in rounds).
FRESH = 0.5


class OnlineCosts:
    """c and v(n) learned from a request's own rounds, with measured costs as the prior, at the
    request's current context (`at`).

    The prior gives, at every context length L, the seconds t0(n, L) of a forward scoring n
    positions and d0(L) of a drafted token (`context_table`: measured at several lengths, or
    flat). Each round is a measurement: its target forward scored n = k' + 1 positions in t
    seconds after a context of L tokens, its proposer spent d seconds on k' drafted tokens.
    What is learned is how far the machine is from the prior, y = log t - log t0(n, L), the
    same at every context: per n, the y of the rounds that scored n positions are averaged
    with weights that decay by `memory` per round (each clipped to within a factor `CLIP` of
    the current estimate), and blended with a prior worth `prior_weight` rounds observed
    before the first, which decays with them (w = prior_weight memory^rounds):

        b_1 = (w a + sum_1) / (w + W_1),          a = log of the prior's unit in seconds
        b_n = (w b_1 + sum_n) / (w + W_n),        log t(n, L) = log t0(n, L) + b_n

    with W_n and sum_n the decayed count and sum of y for n. So evidence overrides the prior
    after a round or two, and a v(n) that no round has scored is the prior's, scaled by the
    current plain step t(1): a machine that got slower or faster as a whole moves every t(n)
    with it. (The measured n's do not rescale the others: a jagged v(n), such as fp32 MKL's,
    higher at n = 3 than at 2 and 4 (docs/results/implementation-choices.md), is jagged n by n,
    and a prior the evidence has not contradicted is what lets a policy try another k.) Then at
    context L

        v(n) = t(n, L) / t(1, L),    c = (d0(L) e^a + (D - P) / (w + K)) / t(1, L)

    with K the decayed drafted tokens, D their seconds and P what the prior predicted for them
    (k' d0(L) e^a per round, at its context; at least 0 in all). With costs flat in context
    these are the decayed means of log t(n) and of the seconds per drafted token, each blended
    with the prior. A measured table is in seconds (a = 0); flat costs are in plain steps, a
    the log of their `step_seconds` or, for costs given without seconds, the first timed
    round's y.

    Only plain steps measure t(1), which every v(n) is relative to, so `stale` says when they
    have gone unmeasured for long (a policy then takes one plain step). A prior in seconds (a
    profile's, or flat costs with `step_seconds`) measured t(1) too, worth its decayed weight:
    a request begun on a measured profile does not spend a round of its own on a plain step
    until about 140 rounds have gone without one (prior weight 1, memory 0.995); a short
    request drafts from its first round to its last. Rounds without timings
    (seconds <= 0: no clock) teach nothing; before any timed round, c and v are the prior's
    own at the current context.

        >>> costs = OnlineCosts(FixedCosts(c=0.0, v=[1.0, 1.0]), prior_weight=1.0, memory=1.0)
        >>> costs.observe(1, 0.010, 0, 0.0); costs.observe(2, 0.016, 1, 0.0)
        >>> round(costs.v[1], 3)  # half way, in logs, from the prior's 1.0 to the measured 1.6
        1.265
    """

    def __init__(self, prior: Costs, *, prior_weight: float = 1.0, memory: float = 0.995) -> None:
        check_v_curve(prior.v)
        check_costs(prior.c, prior.v[0])
        if not is_number(prior_weight, least=0, open_least=True):
            raise ValueError(f"cost_prior_weight (rounds the profile is worth) must be > 0, got {prior_weight!r}")
        if not is_number(memory, 0, 1, open_least=True):
            raise ValueError(f"cost_memory (the decay per round) must be in (0, 1], got {memory!r}")
        self.table = context_table(prior).prefix(len(prior.v))
        step = getattr(prior, "step_seconds", None)
        # a: the log seconds of the table's unit (a measured table is in seconds; a flat one in
        # plain steps, whose seconds are the prior's step_seconds or, unknown, the first round's)
        measured = getattr(prior, "context_table", None) is not None
        self.prior_anchor = 0.0 if measured else (None if step is None else math.log(step))
        self.prior_weight = float(prior_weight)
        self.memory = float(memory)
        self.context = 0  # the context length the estimates are at (`at`)
        self.begin()

    def begin(self) -> None:
        """A new request: forget the rounds, keep the prior."""
        n = self.table.points
        self._weight = [0.0] * n  # [n - 1]: decayed count of rounds that scored n positions
        self._sum = [0.0] * n  # [n - 1]: ... their decayed sum of (clipped) y
        self._drafted = 0.0  # decayed drafted tokens
        self._draft_seconds = 0.0  # ... the proposer's decayed seconds
        self._draft_predicted = 0.0  # ... and the prior's seconds for them
        self._anchor = self.prior_anchor  # a
        self._prior_now = self.prior_weight  # the prior's weight, decayed like a round's
        self._timed = False  # has any round come with timings
        self._update()

    def at(self, context: int) -> None:
        """Move c and v to a context of `context` tokens (the next round's)."""
        if context != self.context:
            self.context = context
            self._update()

    def observe(self, scored: int, target_seconds: float, drafted: int, draft_seconds: float) -> None:
        """One round at the current context: its forward scored `scored` positions in
        `target_seconds`; the proposer drafted `drafted` tokens in `draft_seconds`."""
        if not target_seconds > 0 or not 1 <= scored <= self.table.points:
            return
        prior_seconds, prior_draft = self.table.at(self.context)
        y = math.log(target_seconds) - math.log(prior_seconds[scored - 1])
        if self._anchor is None:
            self._anchor = y
        estimate = self._offsets()[scored - 1]
        clip = math.log(CLIP)
        y = min(max(y, estimate - clip), estimate + clip)
        m = self.memory
        self._timed = True
        self._prior_now *= m
        self._weight = [m * w for w in self._weight]
        self._sum = [m * s for s in self._sum]
        self._weight[scored - 1] += 1.0
        self._sum[scored - 1] += y
        self._drafted = m * self._drafted + drafted
        self._draft_seconds = m * self._draft_seconds + max(draft_seconds, 0.0)
        self._draft_predicted = m * self._draft_predicted + drafted * prior_draft * math.exp(self._anchor)
        self._update()

    @property
    def stale(self) -> bool:
        """Timed rounds have come in, but hardly any plain step lately (nor a prior in seconds,
        decayed as a round): t(1) needs measuring."""
        seconds_prior = self._prior_now if self.prior_anchor is not None else 0.0
        return self._timed and self._weight[0] + seconds_prior < FRESH

    def _offsets(self) -> list[float]:
        """b_n for n = 1..N, as in the class docstring (all 0 before the first timed round of
        costs without seconds)."""
        if self._anchor is None:
            return [0.0] * len(self._weight)  # no timed round yet: the prior in its own unit
        w, weight, total = self._prior_now, self._weight, self._sum
        base = (w * self._anchor + total[0]) / (w + weight[0])
        return [base] + [(w * base + total[i]) / (w + weight[i]) for i in range(1, len(weight))]

    def _update(self) -> None:
        """c and v at the current context from the prior there and the offsets learned (the
        prior's own values, unrounded, while every offset is a)."""
        prior_t, prior_draft = self.table.at(self.context)
        b = self._offsets()
        self.v = [1.0] + [t / prior_t[0] * math.exp(b_n - b[0]) for t, b_n in zip(prior_t[1:], b[1:])]
        a = self._anchor or 0.0
        learned = (self._draft_seconds - self._draft_predicted) / (self._prior_now + self._drafted) / math.exp(a)
        self.c = max(0.0, prior_draft + learned) / prior_t[0] * math.exp(a - b[0])


def predicted_speedup(stats: Stats, costs: Costs) -> float:
    """The speedup the cost model predicts for a finished run, from its measured survival.

    Each round r that drafted k_r tokens is predicted to emit 1 + s_1 + ... + s_{k_r} tokens
    for k_r c + v(k_r + 1) target steps, so runs with a varying k (adaptive policies, prompt
    lookup finding no match) are costed round by round. Positions no round ever reached count
    as rejected (s_i = 0), the conservative reading of no evidence.
    """
    if stats.rounds == 0:
        raise ValueError("the run has no rounds; generate at least one token before predicting")
    check_v_curve(costs.v)
    check_costs(costs.c, costs.v[0])
    longest = max(stats.drafted)
    if longest + 1 > len(costs.v):
        raise ValueError(
            f"the run drafted k = {longest} but the profile measured v(n) only up to "
            f"n = {len(costs.v)}; profile again with --k-max {longest} or more"
        )
    survival = stats.survival()
    survival += [0.0] * (longest - len(survival))
    expected = expected_tokens_by_k(survival)
    tokens = math.fsum(expected[k] for k in stats.drafted)
    steps = math.fsum(k * costs.c + costs.v[k] for k in stats.drafted)
    return tokens / steps


def check_alpha(alpha: float) -> None:
    if not is_number(alpha, 0, 1):
        raise ValueError(f"alpha (per-token acceptance) must be a number in [0, 1], got {alpha!r}")


def check_costs(c: float, v: float) -> None:
    if not is_number(c, least=0):
        raise ValueError(f"c (draft step / target step) must be a finite number >= 0, got {c!r}")
    if not is_number(v, least=0, open_least=True):
        raise ValueError(f"v (scoring time / target step) must be a finite number > 0, got {v!r}")


def check_v_curve(v: Sequence[float]) -> None:
    if len(v) == 0:
        raise ValueError("v(n) needs at least v(1); measure it with `verispec profile`")
    for n, value in enumerate(v, start=1):
        if not is_number(value, least=0, open_least=True):
            raise ValueError(f"v({n}) must be a finite number > 0, got {value!r}")


def check_survival(survival: Sequence[float]) -> None:
    """s_i are probabilities of nested events, so 1 >= s_1 >= s_2 >= ... >= 0."""
    previous = 1.0
    for i, s in enumerate(survival, start=1):
        if not is_number(s, 0, 1):
            raise ValueError(f"survival s_{i} must be a probability in [0, 1], got {s!r}")
        if s > previous + TOLERANCE:
            raise ValueError(
                f"survival must not increase: s_{i} = {s} > s_{i - 1} = {previous} "
                "(P(first i accepted) cannot exceed P(first i - 1 accepted))"
            )
        previous = s


@dataclass(frozen=True)
class BatchCosts:
    """v(n) over the rows n one batched forward scores (all requests' together), relative to
    one row: measured points `rows` [P] (increasing, starting at 1) and `v` [P] (v(1) = 1),
    linear between them and beyond the last (`verispec.profile.measure_batch_costs`). What
    `verispec.batching.BatchK` plans each step's k from.

        >>> BatchCosts((1, 8, 16), (1.0, 1.5, 2.5)).at(12)
        2.0
    """

    rows: tuple[int, ...]
    v: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.v) or len(self.rows) < 2 or self.rows[0] != 1:
            raise ValueError(f"batch costs need >= 2 points starting at 1 row, got rows {self.rows}")
        if any(b <= a for a, b in zip(self.rows, self.rows[1:])):
            raise ValueError(f"batch cost rows must increase, got {self.rows}")
        if any(not x > 0 for x in self.v):
            raise ValueError(f"v(n) must be > 0, got {self.v}")

    def at(self, n: int) -> float:
        """v(n) by linear interpolation (and extrapolation past the last point)."""
        rows, v = self.rows, self.v
        i = next((i for i in range(1, len(rows)) if n <= rows[i]), len(rows) - 1)
        slope = (v[i] - v[i - 1]) / (rows[i] - rows[i - 1])
        return v[i - 1] + slope * (n - rows[i - 1])
