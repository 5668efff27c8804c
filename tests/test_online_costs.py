"""AutoK learns c and v(n) from its own rounds (`verispec.cost.OnlineCosts`).

The harness: a target whose forwards take a jagged v(n) on an exact fake clock (fp32 MKL on a
2-core AMD EPYC measured v(2) = 1.64, v(3) = 2.0, v(4) = 1.42, v(5) = 1.35; v(6..9) here are
made up, as jagged), a proposer whose drafts are each accepted with a known probability, and
start-up profiles that are wrong in different ways. Throughput is tokens per fake second, so
the numbers are exact for a given seed and the cost model gives the best fixed k's. A policy
run on a stopped clock sees no timings: that is AutoK as it was, on its profile alone, and the
harness shows it losing to plain decoding where the learning policy does not.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import pytest

from clocks import FakeClock
from verispec.cost import CLIP, FRESH, FixedCosts, OnlineCosts, speedup_by_k, survival_from_alpha
from verispec.drafts import Draft
from verispec.engine import generate
from verispec.models.tables import random_table
from verispec.policies import AutoK, ConstantK, KPolicy
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.stats import Stats

STEP = 0.05  # seconds of one plain target step
TRUE_V = [1.0, 1.64, 2.0, 1.42, 1.35, 1.6, 1.75, 2.1, 1.9]  # v(1..9) of the machine
PROFILES = {
    "flat": FixedCosts(c=0.0, v=[1.0] + [1.05] * 8, step_seconds=STEP),  # a noisy start-up profile
    "favours k=1": FixedCosts(c=0.0, v=[1.0, 1.02, 1.9, 2.2, 2.4, 2.6, 2.8, 3.0, 3.2], step_seconds=STEP),
    "correct": FixedCosts(c=0.0, v=TRUE_V, step_seconds=STEP),
}
ALPHAS = [0.0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 0.95]
TOKENS = 3000  # a long request


def best_fixed(alpha: float, c: float = 0.0) -> float:
    """The cost model's speedup of the best fixed k (0, plain, included) on the true costs."""
    return max(speedup_by_k(c, TRUE_V, survival_from_alpha(alpha, len(TRUE_V) - 1)))


def simulate(policy: KPolicy, alpha: float, *, c: float = 0.0, timed: bool = True, seed: int = 0) -> float:
    """Speedup over plain decoding (tokens per plain step) of a request of TOKENS tokens whose
    drafts are each accepted with probability alpha, on the true costs; `timed` False hides the
    round timings from the policy (a stopped clock)."""
    rng, stats, seconds = random.Random(seed), Stats(), 0.0
    policy.begin()
    while stats.new_tokens < TOKENS:
        k = policy.choose(stats).k
        accepted = 0
        while accepted < k and rng.random() < alpha:
            accepted += 1
        draft, target = k * c * STEP, TRUE_V[k] * STEP
        seconds += draft + target
        stats.record(k, accepted, accepted + 1, draft_seconds=draft * timed, target_seconds=target * timed)
    return stats.new_tokens / (seconds / STEP)


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("alpha", ALPHAS)
def test_autok_never_falls_below_plain_whatever_its_profile_says(alpha, profile):
    assert simulate(AutoK(PROFILES[profile]), alpha, seed=1) >= 0.97


@pytest.mark.parametrize("alpha", [0.0, 0.2, 0.6, 0.8, 0.95])
def test_autok_on_a_flat_profile_converges_to_the_best_fixed_k_of_a_jagged_machine(alpha):
    assert simulate(AutoK(PROFILES["flat"]), alpha) >= 0.95 * best_fixed(alpha)


@pytest.mark.parametrize("alpha", [0.6, 0.8])
def test_autok_leaves_a_profile_that_holds_it_on_a_losing_k(alpha):
    """The profile says k = 1 is nearly free (v(2) = 1.02); it costs 1.64, so k = 1 runs at
    (1 + alpha) / 1.64: 0.98x plain at alpha 0.6. The rounds say so, and the other k's are
    tried in turn."""
    learned = simulate(AutoK(PROFILES["favours k=1"]), alpha)
    frozen = simulate(AutoK(PROFILES["favours k=1"]), alpha, timed=False)
    assert frozen <= 0.6 * best_fixed(alpha)  # on k = 1 or 2, as the profile says
    assert learned >= 0.95 * best_fixed(alpha)


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_the_harness_sees_a_frozen_profile_lose_to_plain(alpha):
    """A test that can fail: AutoK on its wrong profile alone falls below 0.97x plain here."""
    assert simulate(AutoK(PROFILES["flat"]), alpha, timed=False) < 0.93
    assert simulate(AutoK(PROFILES["favours k=1"]), alpha, timed=False) < 0.93
    assert simulate(ConstantK(1), alpha) == pytest.approx((1 + alpha) / 1.64, rel=0.02)


@pytest.mark.parametrize("alpha", ALPHAS)
def test_with_a_correct_profile_learning_costs_nothing(alpha):
    """Measured plain steps replace a few speculative rounds; nothing else changes."""
    learned = simulate(AutoK(PROFILES["correct"]), alpha)
    assert learned >= 0.99 * simulate(AutoK(PROFILES["correct"]), alpha, timed=False)


def test_a_costly_proposer_is_charged_what_it_costs():
    """The profile says drafting is free; it costs 0.3 of a step per token, so long drafts
    lose: at alpha 0.6 the best fixed k is 2 (1.08x)."""
    alpha = 0.6
    assert simulate(AutoK(PROFILES["correct"]), alpha, c=0.3, timed=False) < 0.9
    assert simulate(AutoK(PROFILES["correct"]), alpha, c=0.3) >= 0.97


# ---- the estimator ----------------------------------------------------------------------


def observe_rounds(costs: OnlineCosts, v: Sequence[float], rounds: int, step: float = STEP) -> None:
    """rounds rounds cycling over n = 1..len(v), each scoring n positions in v(n) * step."""
    for r in range(rounds):
        n = r % len(v) + 1
        costs.observe(n, v[n - 1] * step, n - 1, 0.0)


def test_before_any_timed_round_the_costs_are_the_profiles():
    prior = PROFILES["flat"]
    costs = OnlineCosts(prior)
    assert (costs.c, costs.v, costs.stale) == (prior.c, list(prior.v), False)
    costs.observe(3, 0.0, 2, 0.0)  # a round without timings (no clock) teaches nothing
    assert (costs.c, costs.v, costs.stale) == (prior.c, list(prior.v), False)


def test_the_estimates_converge_to_the_machines_v():
    costs = OnlineCosts(PROFILES["flat"])
    observe_rounds(costs, TRUE_V, 900)
    assert costs.v == pytest.approx(TRUE_V, rel=0.01)


def test_a_slower_machine_keeps_its_v_and_scales_what_it_has_not_measured():
    """Everything 1.5x slower than profiled: v(n) relative to the measured plain step stays."""
    costs = OnlineCosts(PROFILES["correct"])
    observe_rounds(costs, TRUE_V[:3], 600, step=1.5 * STEP)
    assert costs.v == pytest.approx(TRUE_V, rel=0.01)


def test_one_stall_moves_an_estimate_by_at_most_the_clip():
    costs = OnlineCosts(PROFILES["correct"], memory=1.0)
    observe_rounds(costs, TRUE_V[:2], 20)  # ten rounds each of n = 1 and n = 2
    before = costs.v[1]
    costs.observe(2, 100 * TRUE_V[1] * STEP, 1, 0.0)  # a 100x stall of the loaded machine
    assert math.log(costs.v[1] / before) <= math.log(CLIP) / (1 + 11) + 1e-12


def test_t1_goes_stale_without_plain_steps_and_costs_without_seconds_anchor_on_the_first_round():
    costs = OnlineCosts(FixedCosts(c=0.0, v=TRUE_V))  # no step_seconds
    costs.observe(5, TRUE_V[4] * STEP, 4, 0.0)
    assert costs.v == pytest.approx(TRUE_V) and costs.stale  # anchored, but t(1) unmeasured
    costs.observe(1, STEP, 0, 0.0)
    assert not costs.stale
    observe_rounds(costs, [TRUE_V[4]] * 1, 0)
    for _ in range(200):
        costs.observe(5, TRUE_V[4] * STEP, 4, 0.0)
    assert costs.stale


def test_a_prior_in_seconds_has_measured_t1_until_it_decays():
    """A profile measured t(1) in seconds: a request's speculative rounds do not send it back to
    a plain step until the prior's weight has decayed below a plain step's `FRESH` share."""
    costs = OnlineCosts(FixedCosts(c=0.0, v=TRUE_V, step_seconds=STEP))  # prior weight 1, memory 0.995
    rounds = 0
    while not costs.stale:
        costs.observe(3, TRUE_V[2] * STEP, 2, 0.0)
        rounds += 1
    assert rounds == math.ceil(math.log(FRESH) / math.log(0.995))  # 139: the prior's weight 0.995^r < 0.5
    costs.observe(1, STEP, 0, 0.0)
    assert not costs.stale


def test_c_is_the_proposers_seconds_per_drafted_token_over_a_plain_step():
    costs = OnlineCosts(FixedCosts(c=0.0, v=TRUE_V, step_seconds=STEP))
    for _ in range(300):
        costs.observe(1, STEP, 0, 0.0)
        costs.observe(5, TRUE_V[4] * STEP, 4, 4 * 0.2 * STEP)
    assert costs.c == pytest.approx(0.2, rel=0.01)


@pytest.mark.parametrize(
    "options, message",
    [({"cost_prior_weight": 0}, "cost_prior_weight"), ({"cost_memory": 1.5}, "cost_memory")],
)
def test_autok_rejects_bad_cost_settings(options, message):
    with pytest.raises(ValueError, match=message):
        AutoK(PROFILES["flat"], **options)


# ---- through the engine -------------------------------------------------------------------


class JaggedTarget:
    """A table model whose forward over n new tokens takes TRUE_V(n) plain steps on the clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.table = random_table(4, 2, seed=11, zeros=False)
        self.vocab_size, self.clock = self.table.vocab_size, clock

    @property
    def length(self) -> int:
        return self.table.length

    def prefill(self, ids: Sequence[int]) -> None:
        self.table.prefill(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None):
        self.clock.now += TRUE_V[len(tokens) - 1] * STEP
        return self.table.extend(tokens, keep)

    def rollback(self, length: int) -> None:
        self.table.rollback(length)

    def score(self, ids: Sequence[int]):
        return self.table.score(ids)


class CoinProposer:
    """Drafts the greedy target's next token with probability alpha and another token
    otherwise (its own seeded coin), so greedy verification accepts each with probability
    alpha."""

    def __init__(self, target: JaggedTarget, alpha: float, seed: int = 0) -> None:
        self.target, self.alpha, self.coin = target, alpha, random.Random(seed)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        pass

    def commit(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        ids = list(context)
        for _ in range(k):
            best = int(self.target.score(ids)[-1].argmax())
            right = self.coin.random() < self.alpha
            ids.append(best if right else (best + 1) % self.target.vocab_size)
        return Draft(tuple(ids[len(context) :]))


@pytest.mark.parametrize("alpha", [0.0, 0.8])
def test_engine_rounds_teach_autok_the_machines_costs(alpha):
    """The engine's per-round timings on the fake clock carry the jagged v(n) to AutoK."""
    results = {}
    for name, k in [("auto", AutoK(PROFILES["flat"])), ("plain", 0)]:
        clock = FakeClock()
        target = JaggedTarget(clock)
        run = generate(target, CoinProposer(target, alpha), [0, 1, 2], max_new_tokens=600,
                       sampling=SamplingParams(temperature=0), k=k, clock=clock)
        results[name] = (run, clock.now)
    (auto, auto_seconds), (plain, plain_seconds) = results["auto"], results["plain"]
    assert auto.tokens == plain.tokens  # greedy speculation is greedy decoding
    assert auto.stats.round_target_seconds == pytest.approx([TRUE_V[d] * STEP for d in auto.stats.drafted])
    speedup = plain_seconds / auto_seconds
    assert speedup >= 0.97 and speedup >= 0.93 * best_fixed(alpha)
