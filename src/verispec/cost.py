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

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from verispec.checks import is_number
from verispec.k_spec import check_k
from verispec.stats import Stats

# Survival estimates are products of rates; allow their float round-off, nothing more.
TOLERANCE = 1e-9


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
    """Measured costs in plain target steps (a `verispec.profile.Profile` is one)."""

    c: float  # one drafted token / one target step
    v: Sequence[float]  # v[n - 1] = v(n): scoring n new tokens / one target step
    step_seconds: float | None  # one plain target step in seconds, None when not measured


@dataclass(frozen=True)
class FixedCosts:
    """Costs given by hand (the seed's idealised v = 1, or numbers from elsewhere)."""

    c: float
    v: Sequence[float]
    step_seconds: float | None = None

    def __post_init__(self) -> None:
        check_v_curve(self.v)
        check_costs(self.c, self.v[0])
        if self.step_seconds is not None:
            check_costs(0.0, self.step_seconds)


# A round's forward more than this factor away from its current estimate counts as this factor
# away: one stall of a loaded machine moves an estimate by at most log(2) / its weight.
CLIP = 2.0
# t(1), the unit of c and v(n), is stale below this much recent evidence (in rounds).
FRESH = 0.5


class OnlineCosts:
    """c and v(n) learned from a request's own rounds, with measured costs as the prior.

    Each round is a measurement: its target forward scored n = k' + 1 positions in t seconds,
    its proposer spent d seconds on k' drafted tokens. Per n, the log seconds of the rounds
    that scored n positions are averaged with weights that decay by `memory` per round (each
    clipped to within a factor `CLIP` of the current estimate), and blended with a prior worth
    `prior_weight` rounds observed before the first, which decays with them (w = prior_weight
    memory^rounds):

        log t(1) = (w a + sum_1) / (w + W_1),                  a = log of the prior's plain step
        log t(n) = (w (log t(1) + log v0(n)) + sum_n) / (w + W_n)

    with v0, c0 the prior's curve and draft cost, W_n and sum_n the decayed count and sum for n.
    So evidence overrides the prior after a round or two, and a v(n) that no round has scored
    is the prior's, scaled by the current plain step t(1): a machine that got slower or faster
    as a whole moves every t(n) with it. (The measured n's do not rescale the others:
    a jagged v(n), such as fp32 MKL's, higher at n = 3 than at 2 and 4 (docs/results/implementation-choices.md), is
    jagged n by n, and a prior the evidence has not contradicted is what lets a policy try
    another k.) Then

        v(n) = t(n) / t(1),    c = (w c0 e^a + sum of d) / (w + sum of k') / t(1).

    a is the prior's `step_seconds`, or for costs given without seconds the first round's
    log t - log v0(n). Only plain steps measure t(1), which every v(n) is relative to, so
    `stale` says when they have gone unmeasured for long (a policy then takes one plain step).
    Rounds without timings (seconds <= 0: no clock) teach nothing; before any timed round,
    c and v are the prior's own.

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
        self.prior_c = float(prior.c)
        self.prior_v = [float(x) for x in prior.v]
        self.prior_step = getattr(prior, "step_seconds", None)
        self.prior_weight = float(prior_weight)
        self.memory = float(memory)
        self.begin()

    def begin(self) -> None:
        """A new request: forget the rounds, keep the prior."""
        n = len(self.prior_v)
        self._weight = [0.0] * n  # [n - 1]: decayed count of rounds that scored n positions
        self._log_sum = [0.0] * n  # [n - 1]: ... their decayed sum of (clipped) log seconds
        self._drafted = 0.0  # decayed drafted tokens
        self._draft_seconds = 0.0  # ... and the proposer's decayed seconds
        self._anchor = None if self.prior_step is None else math.log(self.prior_step)
        self._prior_now = self.prior_weight  # the prior's weight, decayed like a round's
        self._timed = False  # has any round come with timings
        self.c, self.v = self.prior_c, list(self.prior_v)

    def observe(self, scored: int, target_seconds: float, drafted: int, draft_seconds: float) -> None:
        """One round: its forward scored `scored` positions in `target_seconds`; the proposer
        drafted `drafted` tokens in `draft_seconds`."""
        if not target_seconds > 0 or not 1 <= scored <= len(self.prior_v):
            return
        if self._anchor is None:
            self._anchor = math.log(target_seconds) - math.log(self.prior_v[scored - 1])
        estimate = self._log_seconds()[scored - 1]
        clip = math.log(CLIP)
        x = min(max(math.log(target_seconds), estimate - clip), estimate + clip)
        m = self.memory
        self._timed = True
        self._prior_now *= m
        self._weight = [m * w for w in self._weight]
        self._log_sum = [m * s for s in self._log_sum]
        self._weight[scored - 1] += 1.0
        self._log_sum[scored - 1] += x
        self._drafted = m * self._drafted + drafted
        self._draft_seconds = m * self._draft_seconds + max(draft_seconds, 0.0)
        log_t = self._log_seconds()
        self.v = [1.0] + [math.exp(x - log_t[0]) for x in log_t[1:]]
        w = self._prior_now
        seconds_per_draft = (w * self.prior_c * math.exp(self._anchor) + self._draft_seconds) / (w + self._drafted)
        self.c = seconds_per_draft / math.exp(log_t[0])

    @property
    def stale(self) -> bool:
        """Timed rounds have come in, but hardly any plain step lately: t(1) needs measuring."""
        return self._timed and self._weight[0] < FRESH

    def _log_seconds(self) -> list[float]:
        """log t(n) for n = 1..len(v), as in the class docstring."""
        w, weight, total = self._prior_now, self._weight, self._log_sum
        log_v0 = [math.log(x) for x in self.prior_v]
        base = (w * self._anchor + total[0]) / (w + weight[0])
        return [base] + [(w * (base + log_v0[i]) + total[i]) / (w + weight[i]) for i in range(1, len(weight))]


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
