"""Verification rules, checked exactly: every random branch of a rule (and of the draft it
verifies) is enumerated with its probability (`verispec.audit.enumerate.outcomes`), so each
expectation below is computed, not sampled."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest
import torch

from enumerated import EXACT, distribution, row

from verispec.audit.enumerate import outcomes
from verispec.drafts import Draft, Verdict
from verispec.models.tables import random_row, random_table
from verispec.verify import RULES, block, coupled, greedy, keyed_rounds, point_mass, rule_chooser, token_level

F64 = torch.float64


def assert_same(actual: dict, expected: dict) -> None:
    for key in set(actual) | set(expected):
        assert abs(actual.get(key, 0.0) - float(expected.get(key, 0))) < EXACT, key


class NeverAccepts:
    """Forces every Bernoulli to fail (a rejection at each chance); categorical takes the mode."""

    def bernoulli(self, prob: float) -> bool:
        return False

    def categorical(self, probs: torch.Tensor) -> int:
        return int(probs.argmax())


class NoRandomness:
    def bernoulli(self, prob: float) -> bool:
        raise AssertionError("this rule must not draw randomness")

    categorical = bernoulli


# --- hand-computed verdicts -----------------------------------------------------------------

SEED_P, SEED_Q = row(".1", ".3", ".6"), row(".4", ".4", ".2")


def verdicts(rule, p: torch.Tensor, draft: Draft) -> dict:
    def run(rng) -> tuple[int, int]:
        verdict = rule(p, draft, rng)
        return verdict.n_accepted, verdict.next_token

    return distribution(run)


def test_token_level_on_the_seed_rows():
    bonus = row("1/2", "1/2", 0)
    p = torch.stack([SEED_P, bonus])
    q = SEED_Q.unsqueeze(0)
    # x = 0: accept with p/q = .25; the residual (0, 0, .4) sends every rejection to token 2.
    assert_same(verdicts(token_level, p, Draft((0,), q)), {(1, 0): 0.125, (1, 1): 0.125, (0, 2): 0.75})
    # x = 1: accept with .75; rejections also repaired with token 2.
    assert_same(verdicts(token_level, p, Draft((1,), q)), {(1, 0): 0.375, (1, 1): 0.375, (0, 2): 0.25})
    # x = 2: p > q, accepted without a draw.
    assert_same(verdicts(token_level, p, Draft((2,), q)), {(1, 0): 0.5, (1, 1): 0.5})


def test_point_mass_on_the_seed_rows():
    p = torch.stack([SEED_P, row(0, 0, 1)])
    # Accept x = 1 with p(1) = .3; on rejection draw from (.1, 0, .6) / .7.
    assert_same(verdicts(point_mass, p, Draft((1,))), {(1, 2): 0.3, (0, 0): 0.1, (0, 2): 0.6})
    # A token the target never emits is always rejected.
    p0 = torch.stack([row(0, ".5", ".5"), row(1, 0, 0)])
    assert_same(verdicts(point_mass, p0, Draft((0,))), {(0, 1): 0.5, (0, 2): 0.5})


TOY_P, TOY_Q = row("1/3", "2/3"), row("2/3", "1/3")


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        # w = (1/2, 1/4): h_2 = 1/4, Z_1 = 0 so h_1 = 0; tau = 0 repairs from (0, 1/3).
        ((0, 0), {(2, 0): 1 / 12, (2, 1): 1 / 6, (0, 1): 3 / 4}),
        # w = (1/2, 1): h_2 = 1, the whole block is kept although x_1 alone would be at risk.
        ((0, 1), {(2, 0): 1 / 3, (2, 1): 2 / 3}),
        # w = (1, 1/2): h_2 = 1/2, h_1 = Z_1 / Z_1 = 1; tau = 1 repairs from max(p - q, 0) = (0, 1/3).
        ((1, 0), {(2, 0): 1 / 6, (2, 1): 1 / 3, (1, 1): 1 / 2}),
        ((1, 1), {(2, 0): 1 / 3, (2, 1): 2 / 3}),
    ],
)
def test_block_on_the_toy_rows(tokens, expected):
    p, q = TOY_P.expand(3, 2), TOY_Q.expand(2, 2)
    assert_same(verdicts(block, p, Draft(tokens, q)), expected)


def test_greedy_accepts_the_argmax_prefix_without_randomness():
    logits = torch.tensor([[0.0, 2.0, 1.0], [5.0, 0.0, 0.0], [0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    assert greedy(logits, Draft((1, 0, 2)), NoRandomness()) == Verdict(3, 0)
    assert greedy(logits, Draft((1, 0, 1)), NoRandomness()) == Verdict(2, 2)
    assert greedy(logits, Draft((1, 2, 2)), NoRandomness()) == Verdict(1, 0)
    assert greedy(logits, Draft((0, 0, 2)), NoRandomness()) == Verdict(0, 1)
    assert greedy(logits[:1], Draft(()), NoRandomness()) == Verdict(0, 1)


class OnlyCertain(NeverAccepts):
    """Accepts only what has probability exactly 1."""

    def bernoulli(self, prob: float) -> bool:
        return prob == 1.0


def test_block_h_is_exactly_one_when_the_prefix_weight_is_one():
    # x_1 = 1 with p_1 = q_1 = (0, 1): w_1 = 1, so h_1 = Z_1 / Z_1 = 1 and tau >= 1; tau = 0
    # would repair from max(p_1 - q_1, 0) = 0. Z_1 = 5/12 is where Z + 1 - 1 != Z in floats.
    p = torch.stack([row(0, 1), row("5/12", "7/12"), row(1, 0)])
    assert block(p, Draft((1, 1)), OnlyCertain()) == Verdict(1, 0)


# --- expected accepted drafts: the design's toy check ----------------------------------------


def accepted_drafts(rule, p_row, q_row, k):
    """E[n_accepted] when k drafts are sampled i.i.d. from q_row and every target row is p_row."""

    def run(rng):
        tokens = tuple(rng.categorical(q_row) for _ in range(k))
        return rule(p_row.expand(k + 1, -1), Draft(tokens, q_row.expand(k, -1)), rng).n_accepted

    return sum(prob * n for prob, n in outcomes(run))


def test_toy_expected_accepted_drafts_token_level_and_block():
    assert abs(accepted_drafts(token_level, TOY_P, TOY_Q, 2) - Fraction(10, 9)) < EXACT
    assert abs(accepted_drafts(block, TOY_P, TOY_Q, 2) - Fraction(11, 9)) < EXACT


# --- output distribution equals the target's --------------------------------------------------


def random_pair(seed: int, vocab: int, zeros: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rng = random.Random(seed)
    return tuple(torch.tensor([float(x) for x in random_row(vocab, rng, 12, zeros)], dtype=F64)
                 for _ in range(2))


ONE_STEP_CASES = [(SEED_P, SEED_Q), (SEED_P, SEED_P), (row(0, 1), row(1, 0)), (row(1, 0), row(1, 0))] + [
    random_pair(seed, vocab, zeros) for seed in range(12) for vocab in (2, 4) for zeros in (True, False)
]


def first_token(rule, p_row, q_row):
    """Distribution of the first emitted token of one round with k = 1, drafts ~ q_row."""
    bonus = torch.full_like(p_row, 1 / len(p_row))

    def run(rng):
        x = rng.categorical(q_row)
        verdict = rule(torch.stack([p_row, bonus]), Draft((x,), q_row.unsqueeze(0)), rng)
        return x if verdict.n_accepted else verdict.next_token

    return distribution(run)


@pytest.mark.parametrize(("p_row", "q_row"), ONE_STEP_CASES)
@pytest.mark.parametrize("rule", [token_level, block])
def test_one_step_output_is_distributed_as_p(rule, p_row, q_row):
    assert_same(first_token(rule, p_row, q_row), dict(enumerate(p_row.tolist())))


def test_resampling_p_on_rejection_is_caught():
    """Negative control (the seed's): repairing from p instead of the residual gives
    (.14, .42, .44), and the enumeration above sees it."""

    def biased(p, draft, rng):
        x, p_x, q_x = draft.tokens[0], float(p[0, draft.tokens[0]]), float(draft.q[0, draft.tokens[0]])
        if rng.bernoulli(min(1.0, p_x / q_x)):
            return Verdict(1, rng.categorical(p[1]))
        return Verdict(0, rng.categorical(p[0]))

    assert_same(first_token(biased, SEED_P, SEED_Q), {0: 0.14, 1: 0.42, 2: 0.44})


@pytest.mark.parametrize(("p_row", "q_row"), ONE_STEP_CASES)
def test_point_mass_output_is_distributed_as_p_for_every_chosen_token(p_row, q_row):
    bonus = torch.full_like(p_row, 1 / len(p_row))
    for x in range(len(p_row)):
        def run(rng):
            verdict = point_mass(torch.stack([p_row, bonus]), Draft((x,)), rng)
            return x if verdict.n_accepted else verdict.next_token

        assert_same(distribution(run), dict(enumerate(p_row.tolist())))


def probs_after(table, context) -> torch.Tensor:
    return torch.tensor([float(x) for x in table.distribution(context)], dtype=F64)


def round_then_target(rule, target, drafter, prompt, k, chosen):
    """One verified round over k drafts, then plain target sampling up to k + 1 tokens.

    The drafts come from `drafter`: sampled from it (q returned), or its most likely tokens
    (chosen, q = None). The result's distribution must be the target's over k + 1 tokens.
    """

    def run(rng):
        tokens, q_rows = [], []
        for _ in range(k):
            q = probs_after(drafter, [*prompt, *tokens])
            tokens.append(int(q.argmax()) if chosen else rng.categorical(q))
            q_rows.append(q)
        p = torch.stack([probs_after(target, [*prompt, *tokens[:i]]) for i in range(k + 1)])
        draft = Draft(tuple(tokens)) if chosen else Draft(tuple(tokens), torch.stack(q_rows))
        verdict = rule(p, draft, rng)
        out = [*tokens[: verdict.n_accepted], verdict.next_token]
        while len(out) < k + 1:
            out.append(rng.categorical(probs_after(target, [*prompt, *out])))
        return tuple(out)

    return run


CASES = [(seed, vocab, k) for seed in range(6) for vocab, k in ((2, 3), (3, 2), (3, 3))]


@pytest.mark.parametrize(("seed", "vocab", "k"), CASES)
@pytest.mark.parametrize(
    ("rule", "chosen"), [(token_level, False), (block, False), (point_mass, True), (block, True)]
)
def test_multi_position_output_is_distributed_as_the_target(exact_joint, rule, chosen, seed, vocab, k):
    target = random_table(vocab, 2, seed, zeros=seed % 2 == 0)
    drafter = random_table(vocab, 2, seed + 100, zeros=seed % 3 == 0)
    prompt = [seed % vocab]
    dist = distribution(round_then_target(rule, target, drafter, prompt, k, chosen))
    assert_same(dist, exact_joint(target, prompt, k + 1))


@pytest.mark.parametrize(("seed", "vocab", "k"), CASES)
def test_block_never_accepts_fewer_than_token_level(seed, vocab, k):
    target = random_table(vocab, 2, seed, zeros=seed % 2 == 0)
    drafter = random_table(vocab, 2, seed + 100, zeros=seed % 3 == 0)

    def accepted(rule):
        def run(rng):
            tokens, q_rows = [], []
            for _ in range(k):
                q_rows.append(probs_after(drafter, [0, *tokens]))
                tokens.append(rng.categorical(q_rows[-1]))
            p = torch.stack([probs_after(target, [0, *tokens[:i]]) for i in range(k + 1)])
            return rule(p, Draft(tuple(tokens), torch.stack(q_rows)), rng).n_accepted

        return sum(prob * n for prob, n in outcomes(run))

    assert accepted(block) >= accepted(token_level) - EXACT


# --- refusals ---------------------------------------------------------------------------------


class RecordsDraws(NeverAccepts):
    """Forces every rejection, and keeps the rows categorical draws come from."""

    def __init__(self) -> None:
        self.rows: list[torch.Tensor] = []

    def categorical(self, probs: torch.Tensor) -> int:
        self.rows.append(probs)
        return super().categorical(probs)


def one_ulp_above(p_row: torch.Tensor) -> torch.Tensor:
    """q >= p with q != p: every nonzero entry of p one ulp higher (p and q equal up to
    rounding, as for a draft that is the target with its logits shifted by a constant)."""
    return torch.where(p_row > 0, torch.nextafter(p_row, torch.tensor(math.inf, dtype=F64)), p_row)


@pytest.mark.parametrize("rule", [token_level, block])
def test_a_rejection_on_a_zero_residual_falls_back_to_p(rule):
    p_row = row(".5", ".5")
    p = p_row.expand(3, 2)
    q = one_ulp_above(p_row).expand(2, 2)
    rng = RecordsDraws()
    verdict = rule(p, Draft((1, 0), q), rng)
    assert verdict.fallback and verdict.n_accepted == 0
    assert torch.equal(rng.rows[-1], p_row)  # the repair token came from p itself


def test_block_falls_back_when_h_is_one_over_an_empty_residual():
    # Position 0 has p == q: w_1 = 1 and Z_1 = 0, so h_1 = 1 (0 / 0 taken as 1) and tau = 1
    # lands on the empty residual max(p_2 - q_2, 0) once h_2 = w_2 < 1 is rejected.
    p_row = row(".5", ".5")
    q = torch.stack([p_row, one_ulp_above(p_row)])

    class RejectsUnlessCertain(RecordsDraws):
        def bernoulli(self, prob: float) -> bool:
            return prob == 1

    rng = RejectsUnlessCertain()
    verdict = block(p_row.expand(3, 2), Draft((0, 1), q), rng)
    assert verdict.fallback and verdict.n_accepted == 1 and torch.equal(rng.rows[-1], p_row)


@pytest.mark.parametrize("rule", [token_level, block])
def test_the_fallback_probability_is_the_rejection_mass(rule):
    """The docstring's bound: with x ~ q, the fallback (the only place the law departs from the
    exact rule) happens with probability sum_x max(q(x) - p(x), 0) = sum q - sum p."""
    p_row = row(".5", ".5")
    q_row = one_ulp_above(row(".5", 0)) + row(0, ".5")  # q = (.5 + 1 ulp, .5)
    fallback = 0.0
    for x in range(2):
        def run(rng, x=x) -> bool:
            return rule(p_row.expand(2, 2), Draft((x,), q_row.unsqueeze(0)), rng).fallback

        fallback += float(q_row[x]) * sum(prob for prob, fell in outcomes(run) if fell)
    rejection_mass = float((q_row - p_row).clamp_min(0).sum())
    assert rejection_mass > 0 and math.isclose(fallback, rejection_mass, rel_tol=1e-6)
    exact_sums = sum(map(Fraction, q_row.tolist())) - sum(map(Fraction, p_row.tolist()))
    assert rejection_mass == exact_sums  # the rows' normalisation error, summed exactly


@pytest.mark.parametrize("rule", [token_level, block])
def test_over_two_positions_the_fallback_is_at_most_the_summed_rejection_masses(rule):
    p_row = row(".5", ".5")
    q_row = one_ulp_above(row(".5", 0)) + row(0, ".5")

    def run(rng) -> bool:  # x_1, x_2 ~ q, then the rule; True when it fell back
        tokens = (rng.categorical(q_row), rng.categorical(q_row))
        return rule(p_row.expand(3, 2), Draft(tokens, q_row.expand(2, 2)), rng).fallback

    fallback = sum(prob for prob, fell in outcomes(run) if fell)
    rejection_mass = float((q_row - p_row).clamp_min(0).sum())
    assert 0 < fallback <= 2 * rejection_mass * (1 + 1e-6)


def test_point_mass_falls_back_when_the_rest_of_p_is_empty():
    # p(x) = 1 - 1 ulp and nothing elsewhere: the rejection (probability 1 - sum p) leaves p
    # with x removed empty, so the repair token is x itself, drawn from p.
    p_row = torch.tensor([math.nextafter(1.0, 0.0), 0.0], dtype=F64)
    rng = RecordsDraws()
    verdict = point_mass(p_row.expand(2, 2), Draft((0,)), rng)
    assert verdict == Verdict(0, 0, fallback=True) and torch.equal(rng.rows[-1], p_row)


def test_point_mass_refuses_sampled_drafts():
    with pytest.raises(ValueError, match="sampled"):
        point_mass(SEED_P.expand(2, 3), Draft((0,), SEED_Q.unsqueeze(0)), NoRandomness())


@pytest.mark.parametrize("rule", [token_level, block])
def test_sampled_rules_refuse_a_draft_its_proposal_could_not_emit(rule):
    q = row(1, 0).unsqueeze(0)
    with pytest.raises(ValueError, match="token 1 at position 0"):
        rule(TOY_P.expand(2, 2), Draft((1,), q), NoRandomness())


def test_token_level_verifies_chosen_drafts_as_point_masses():
    p = torch.stack([SEED_P, row(0, 1, 0)])
    assert verdicts(token_level, p, Draft((1,))) == verdicts(point_mass, p, Draft((1,)))


def test_rule_chooser_and_rule_names():
    sampled, chosen = Draft((1,), SEED_Q.unsqueeze(0)), Draft((1,))
    assert rule_chooser("auto", greedy_sampling=True)(sampled) is greedy
    assert rule_chooser("auto", greedy_sampling=False)(chosen) is coupled
    assert rule_chooser("auto", greedy_sampling=False)(sampled) is coupled
    assert rule_chooser("point-mass", greedy_sampling=False)(chosen) is point_mass
    assert rule_chooser("block", greedy_sampling=False)(sampled) is block
    assert rule_chooser("token", greedy_sampling=False)(chosen) is token_level
    assert rule_chooser(block, greedy_sampling=True)(chosen) is block  # a function is used as given
    assert RULES == {"greedy": greedy, "token": token_level, "point-mass": point_mass, "block": block,
                     "coupled": coupled}
    assert keyed_rounds("auto", greedy_sampling=False) and keyed_rounds(coupled, greedy_sampling=True)
    assert not keyed_rounds("auto", greedy_sampling=True) and not keyed_rounds("block", greedy_sampling=False)
