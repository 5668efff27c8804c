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

from verispec.stats import Stats

# Survival estimates are products of rates; allow their float round-off, nothing more.
TOLERANCE = 1e-9


def check_k(k: object, *, minimum: int = 1, name: str = "k (drafted tokens per round)") -> int:
    """k as an int >= minimum. Speculative commands need minimum 1: k = 0 would decode plainly
    while reporting itself as speculative; the cost model allows 0 (plain decoding)."""
    if isinstance(k, bool) or not isinstance(k, int) or k < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {k!r}")
    return k


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
    if not math.isfinite(margin) or margin < 0:
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


@dataclass(frozen=True)
class FixedCosts:
    """Costs given by hand (the seed's idealised v = 1, or numbers from elsewhere)."""

    c: float
    v: Sequence[float]

    def __post_init__(self) -> None:
        check_v_curve(self.v)
        check_costs(self.c, self.v[0])


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
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 <= alpha <= 1:
        raise ValueError(f"alpha (per-token acceptance) must be a number in [0, 1], got {alpha!r}")


def check_costs(c: float, v: float) -> None:
    if isinstance(c, bool) or not isinstance(c, (int, float)) or not (math.isfinite(c) and c >= 0):
        raise ValueError(f"c (draft step / target step) must be a finite number >= 0, got {c!r}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
        raise ValueError(f"v (scoring time / target step) must be a finite number > 0, got {v!r}")


def check_v_curve(v: Sequence[float]) -> None:
    if len(v) == 0:
        raise ValueError("v(n) needs at least v(1); measure it with `verispec profile`")
    for n, value in enumerate(v, start=1):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
            raise ValueError(f"v({n}) must be a finite number > 0, got {value!r}")


def check_survival(survival: Sequence[float]) -> None:
    """s_i are probabilities of nested events, so 1 >= s_1 >= s_2 >= ... >= 0."""
    previous = 1.0
    for i, s in enumerate(survival, start=1):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s <= 1:
            raise ValueError(f"survival s_{i} must be a probability in [0, 1], got {s!r}")
        if s > previous + TOLERANCE:
            raise ValueError(
                f"survival must not increase: s_{i} = {s} > s_{i - 1} = {previous} "
                "(P(first i accepted) cannot exceed P(first i - 1 accepted))"
            )
        previous = s
