"""The cost model against the seed lesson's numbers and against direct simulation."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from verispec.cost import (
    FixedCosts,
    expected_tokens,
    expected_tokens_from_survival,
    optimal_k,
    predicted_speedup,
    speedup,
    speedup_by_k,
    survival_from_alpha,
)
from verispec.stats import Stats


def test_expected_tokens_matches_the_seed():
    assert expected_tokens(0.7, 5) == pytest.approx(2.94117, abs=1e-12)  # (1 - .7^6) / .3, exactly
    assert expected_tokens(0.8, 6) == pytest.approx(3.951424, abs=1e-12)
    assert expected_tokens(0.7, 5) != pytest.approx(3.03, abs=1e-2)  # the seed's wrong answer


def test_expected_tokens_limits():
    assert expected_tokens(1, 5) == 6
    assert expected_tokens(1.0, 0) == 1
    assert expected_tokens(0, 7) == 1
    # the closed form is continuous at alpha = 1
    assert expected_tokens(1 - 1e-9, 5) == pytest.approx(6, rel=1e-6)


@pytest.mark.parametrize("alpha", [0.0, 0.1, 0.5, 0.7, 0.8, 0.99, 1.0])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_closed_form_is_the_survival_sum_of_constant_alpha(alpha, k):
    direct = sum(Fraction(alpha) ** i for i in range(k + 1))  # 1 + alpha + ... + alpha^k
    assert expected_tokens(alpha, k) == pytest.approx(float(direct), rel=1e-12)
    assert expected_tokens_from_survival(survival_from_alpha(alpha, k)) == pytest.approx(float(direct), rel=1e-12)


def test_survival_form_is_the_mean_of_simulated_rounds():
    """Rounds with position-dependent acceptance: E = 1 + sum of survival, not 1 + sum of the
    marginal rates. 20000 simulated rounds; the mean's standard error is < 0.008, so a 0.04
    tolerance fails falsely with probability < 1e-6."""
    rates = [0.9, 0.6, 0.3]  # conditional acceptance at positions 1..3
    rng = random.Random(1)
    total = 0
    for _ in range(20000):
        accepted = 0
        while accepted < len(rates) and rng.random() < rates[accepted]:
            accepted += 1
        total += accepted + 1
    survival = [0.9, 0.9 * 0.6, 0.9 * 0.6 * 0.3]
    assert expected_tokens_from_survival(survival) == pytest.approx(total / 20000, abs=0.04)
    assert expected_tokens_from_survival(survival) != pytest.approx(1 + sum(rates), abs=0.1)


def test_speedup_matches_the_seed():
    assert speedup(expected_tokens(0.8, 6), 6, c=0.1, v=1.0) == pytest.approx(2.4696, abs=1e-4)
    assert speedup(expected_tokens(0.1, 6), 6, c=0.1, v=1.0) == pytest.approx(0.6944, abs=1e-4)


def test_speedup_by_k_and_optimal_k_agree_with_brute_force():
    c, v = 0.1, [1.0, 1.05, 1.1, 1.2, 1.3, 1.45, 1.6, 1.8, 2.0]
    for alpha in (0.3, 0.6, 0.8, 0.95):
        by_hand = [1.0] + [expected_tokens(alpha, k) / (k * c + v[k]) for k in range(1, len(v))]
        ratios = speedup_by_k(c, v, survival_from_alpha(alpha, len(v) - 1))
        assert ratios == pytest.approx(by_hand, rel=1e-12)
        best = max(range(len(by_hand)), key=by_hand.__getitem__)
        assert optimal_k(c, v, alpha=alpha) == (best if by_hand[best] > 1 else 0)


def test_optimal_k_on_the_seed_costs():
    flat = [1.0] * 21  # v(n) = 1 for n = 1..21: the seed's idealised cost
    assert optimal_k(0.1, flat, alpha=0.8) == 6  # E/(1 + .1k) peaks at k = 6 for alpha .8
    assert optimal_k(0.1, flat, alpha=0.1) == 0  # nothing beats plain decoding
    assert optimal_k(0.0, flat, alpha=0.5) == 20  # free drafts, flat v: draft as far as measured
    # a margin turns a marginal win into "do not speculate"
    assert optimal_k(0.1, flat, alpha=0.2) == 1
    assert optimal_k(0.1, flat, alpha=0.2, margin=0.2) == 0


def test_optimal_k_stops_where_survival_stops():
    assert optimal_k(0.0, [1.0] * 9, survival=[0.9, 0.8]) == 2


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: expected_tokens(1.2, 3), "alpha"),
        (lambda: expected_tokens(-0.1, 3), "alpha"),
        (lambda: expected_tokens(0.5, -1), "k "),
        (lambda: expected_tokens(0.5, 2.0), "k "),
        (lambda: expected_tokens(0.5, True), "k "),
        (lambda: speedup(2.0, 3, c=-0.1, v=1.0), "c "),
        (lambda: speedup(2.0, 3, c=0.1, v=0.0), "v "),
        (lambda: speedup(2.0, 3, c=0.1, v=float("nan")), "v "),
        (lambda: speedup(5.0, 3, c=0.1, v=1.0), "expected tokens"),
        (lambda: speedup(0.5, 3, c=0.1, v=1.0), "expected tokens"),
        (lambda: expected_tokens_from_survival([0.5, 0.7]), "must not increase"),
        (lambda: expected_tokens_from_survival([1.5]), "survival"),
        (lambda: speedup_by_k(0.1, [], [0.5]), "v\\(n\\)"),
        (lambda: speedup_by_k(0.1, [1.0, -1.0], [0.5]), "v\\(2\\)"),
        (lambda: optimal_k(0.1, [1.0, 1.0], survival=[0.5], alpha=0.5), "exactly one"),
        (lambda: optimal_k(0.1, [1.0, 1.0]), "exactly one"),
        (lambda: optimal_k(0.1, [1.0, 1.0], alpha=0.5, margin=-1), "margin"),
        (lambda: FixedCosts(c=0.1, v=[0.0]), "v\\(1\\)"),
    ],
)
def test_bad_values_raise_clear_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def stats_of(rounds: list[tuple[int, int]]) -> Stats:
    stats = Stats()
    for drafted, accepted in rounds:
        stats.record(drafted, accepted, accepted + 1)
    return stats


def test_predicted_speedup_of_a_constant_k_run_is_the_speed_equation():
    rounds = [(4, 4), (4, 2), (4, 0), (4, 3), (4, 4), (4, 1)]
    stats = stats_of(rounds)
    costs = FixedCosts(c=0.2, v=[1.0, 1.1, 1.2, 1.3, 1.4])
    expected = expected_tokens_from_survival(stats.survival()[:4])
    assert predicted_speedup(stats, costs) == pytest.approx(speedup(expected, 4, 0.2, 1.4))


def test_predicted_speedup_costs_a_varying_k_round_by_round():
    stats = stats_of([(2, 2), (0, 0), (1, 0)])
    costs = FixedCosts(c=0.5, v=[1.0, 1.2, 1.4])
    s = stats.survival()  # s_1 = 1/2, s_2 = 1
    assert s == [0.5, 0.5]
    tokens = (1 + s[0] + s[1]) + 1 + (1 + s[0])
    steps = (2 * 0.5 + 1.4) + 1.0 + (0.5 + 1.2)
    assert predicted_speedup(stats, costs) == pytest.approx(tokens / steps)


def test_predicted_speedup_treats_unreached_positions_as_rejected():
    stats = stats_of([(1, 1), (3, 0)])  # position 2 never attempted
    assert stats.survival() == [0.5]
    costs = FixedCosts(c=0.0, v=[1.0] * 4)
    assert predicted_speedup(stats, costs) == pytest.approx((1.5 + 1.5) / 2)


def test_predicted_speedup_needs_rounds_and_enough_profile():
    with pytest.raises(ValueError, match="no rounds"):
        predicted_speedup(Stats(), FixedCosts(c=0.1, v=[1.0, 1.1]))
    with pytest.raises(ValueError, match="--k-max 3"):
        predicted_speedup(stats_of([(3, 1)]), FixedCosts(c=0.1, v=[1.0, 1.1]))
