"""The exact rational oracle: the one-step identity on the quarter grid, whole rounds of the
token-level and block rules, the seed's negative control, and agreement with the float rules
that the engine runs (`verispec.verify`)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
import torch

from verispec import verify
from verispec.audit.enumerate import outcomes
from verispec.audit.oracle import (
    block_verdicts,
    expected_accepted,
    one_step_failures,
    quarter_simplex,
    repair_by_resampling_p,
    round_distribution,
    round_is_exact,
    token_level_step,
    token_level_verdicts,
)
from verispec.drafts import Draft
from verispec.models.tables import random_row, random_table

RULES = {"token": token_level_verdicts, "block": block_verdicts}
F = Fraction


def fixed(row):
    return lambda prefix: row


def test_quarter_simplex_is_every_distribution_on_the_grid():
    grid = quarter_simplex()
    assert len(grid) == len(set(grid)) == 15  # compositions of 4 into 3 parts: C(6, 2)
    assert all(sum(p) == 1 and all(x in {F(i, 4) for i in range(5)} for x in p) for p in grid)
    assert (F(1), F(0), F(0)) in grid  # zero support


def test_one_token_level_step_emits_p_on_every_quarter_grid_pair():
    assert one_step_failures() == []


def test_identical_p_and_q_never_divide_the_empty_residual():
    # Fraction raises ZeroDivisionError on x / 0, so returning at all proves the r = 0 branch.
    for p in quarter_simplex():
        assert token_level_step(p, p) == p


def test_seed_example_accepted_and_residual_mass():
    p, q = (F(1, 10), F(3, 10), F(6, 10)), (F(4, 10), F(4, 10), F(2, 10))
    assert token_level_step(p, q) == p


def test_negative_control_repair_by_resampling_p_is_biased():
    p, q = (F(1, 10), F(3, 10), F(6, 10)), (F(4, 10), F(4, 10), F(2, 10))
    assert repair_by_resampling_p(p, q) == (F(14, 100), F(42, 100), F(44, 100))
    failures = one_step_failures(repair_by_resampling_p)
    assert failures and all(p != q for p, q in failures)  # identical pairs never reject


def test_block_toy_from_the_design_notes():
    p, q = fixed((F(1, 3), F(2, 3))), fixed((F(2, 3), F(1, 3)))
    alpha = F(2, 3)  # sum min(p, q): context-free rows accept independently
    assert expected_accepted(round_distribution(p, q, 2, token_level_verdicts)) == alpha + alpha**2 == F(10, 9)
    assert expected_accepted(round_distribution(p, q, 2, block_verdicts)) == F(11, 9)


@pytest.mark.parametrize("rule", RULES)
def test_one_round_is_exact_on_every_quarter_grid_pair(rule):
    grid = quarter_simplex()
    assert all(round_is_exact(fixed(p), fixed(q), 2, RULES[rule]) for p in grid for q in grid)


@pytest.mark.parametrize("seed", range(6))
def test_rounds_are_exact_and_block_never_accepts_less_on_context_dependent_tables(seed):
    target = random_table(3, 2, seed, denominator=6)
    draft = random_table(3, 2, seed + 100, denominator=6, zeros=False)
    context = [seed % 3]
    p = lambda prefix: target.distribution([*context, *prefix])  # noqa: E731
    q = lambda prefix: draft.distribution([*context, *prefix])  # noqa: E731
    for k in (1, 2, 3):
        assert round_is_exact(p, q, k, token_level_verdicts)
        assert round_is_exact(p, q, k, block_verdicts)
        token = expected_accepted(round_distribution(p, q, k, token_level_verdicts))
        block = expected_accepted(round_distribution(p, q, k, block_verdicts))
        assert block >= token


def test_round_check_fails_for_a_biased_rule():
    def resample_p(p, q, drafts):
        out = token_level_verdicts(p, q, drafts)
        rejected = sum(mass for (n, _), mass in out.items() if n == 0)
        biased = {key: mass for key, mass in out.items() if key[0] > 0}
        for y, py in enumerate(p[0]):  # the rejection mass at position 0 spread over p, not the residual
            biased[(0, y)] = biased.get((0, y), F(0)) + rejected * py
        return biased

    p, q = fixed((F(1, 10), F(3, 10), F(6, 10))), fixed((F(4, 10), F(4, 10), F(2, 10)))
    assert round_is_exact(p, q, 1, token_level_verdicts)
    assert not round_is_exact(p, q, 1, resample_p)


@pytest.mark.parametrize("rule", RULES)
def test_float_rules_match_the_oracle(rule):
    """Drafts sampled from q, then the engine's own rule, every branch enumerated: the float64
    output distribution equals the rational one."""
    float_rule = verify.token_level if rule == "token" else verify.block
    rng = random.Random(7)
    pairs = [((F(1, 3), F(2, 3)), (F(2, 3), F(1, 3)))]
    pairs += [(random_row(3, rng, 8, True), random_row(3, rng, 8, False)) for _ in range(10)]
    k = 2
    for p_row, q_row in pairs:
        p = torch.tensor([[float(x) for x in p_row]] * (k + 1), dtype=torch.float64)
        q = torch.tensor([[float(x) for x in q_row]] * k, dtype=torch.float64)

        def run(r):
            tokens = tuple(r.categorical(q[i]) for i in range(k))
            verdict = float_rule(p, Draft(tokens, q), r)
            return (*tokens[: verdict.n_accepted], verdict.next_token)

        observed: dict[tuple[int, ...], float] = {}
        for probability, out in outcomes(run):
            observed[out] = observed.get(out, 0.0) + probability
        exact = round_distribution(fixed(p_row), fixed(q_row), k, RULES[rule])
        assert observed.keys() == exact.keys()
        assert max(abs(observed[s] - float(exact[s])) for s in exact) <= 1e-12
