"""Speculation-length policies: the fixed and HF schedules, and AutoK's choices on synthetic
acceptance and on table models, where the engine must still equal the reference decoder."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest

from verispec.clocks import TickClock
from verispec.cost import FixedCosts, optimal_k, speedup_by_k, survival_from_alpha
from verispec.drafts import Draft
from verispec.engine import generate
from verispec.models.tables import TableLM, random_table, seed_pair
from verispec.plan import Plan
from verispec.policies import AutoK, ConstantK, HeuristicK, PerSource, as_policy
from verispec.registry import build_policy
from verispec.profile import measure_profile
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.randomness import Random, TorchRandom
from verispec.reference import reference_generate
from verispec.sampling import SamplingParams
from verispec.stats import Stats

FLAT = FixedCosts(c=0.1, v=[1.0] * 9)  # the seed's idealised costs, k up to 8
MEASURED_LIKE = FixedCosts(c=0.0, v=[1.0, 1.1, 1.2, 1.3, 1.45, 1.6, 1.75, 1.9, 2.05])


def simulate(policy: AutoK, rate: Callable[[int], float], rounds: int, seed: int = 0) -> list[int]:
    """The k chosen in each of `rounds` rounds when every drafted token of round r is accepted
    with probability rate(r), independently (the constant-alpha model)."""
    rng = random.Random(seed)
    stats = Stats()
    policy.begin()
    chosen = []
    for r in range(rounds):
        k = policy.choose(stats).k
        accepted = 0
        while accepted < k and rng.random() < rate(r):
            accepted += 1
        stats.record(k, accepted, accepted + 1)
        chosen.append(k)
    return chosen


def test_constant_and_heuristic_k():
    assert ConstantK(3).choose(Stats()) == Plan(3)
    policy, stats = HeuristicK(4), Stats()
    policy.begin()
    assert policy.choose(stats).k == 4
    stats.record(4, 4, 5)
    assert policy.choose(stats).k == 6
    stats.record(6, 1, 2)
    assert policy.choose(stats).k == 5
    with pytest.raises(ValueError, match="k must be an integer"):
        ConstantK(-1)
    with pytest.raises(ValueError, match="auto needs measured costs"):
        as_policy("auto")


def test_autok_decodes_plainly_when_drafts_are_garbage_and_probes_ever_more_rarely():
    chosen = simulate(AutoK(FLAT), lambda r: 0.0, 200)
    probes = [r for r, k in enumerate(chosen) if k > 0 and r > 10]
    assert len(probes) <= 0.05 * 190  # 4 + 8 + 16 + 32 + ... rounds between probes
    gaps = [b - a for a, b in zip(probes, probes[1:])]
    assert gaps == sorted(gaps) and gaps[-1] > gaps[0]  # the wait grows while probes fail
    assert max(gaps) <= 32 + 1  # ... up to the cap


def test_autok_does_not_collapse_after_one_unlucky_round():
    policy = AutoK(FLAT)
    stats = Stats()
    first = policy.choose(stats).k
    stats.record(first, 0, 1)
    assert policy.choose(stats).k >= 1


def test_autok_comes_back_when_acceptance_recovers():
    chosen = simulate(AutoK(FLAT), lambda r: 0.0 if r < 100 else 1.0, 160)
    assert all(k == 0 for k in chosen[60:100] if k == 0) and sum(chosen[60:100]) <= 2
    back = next(r for r in range(100, 160) if all(k > 0 for k in chosen[r : r + 10]))
    assert back <= 100 + 32 + 2  # within one (capped) probe wait
    assert chosen[-1] == 8  # all drafts accepted, cheap drafts, flat v: the longest k


def test_autok_goes_plain_again_when_acceptance_drops():
    chosen = simulate(AutoK(FLAT), lambda r: 1.0 if r < 50 else 0.0, 160)
    assert chosen[49] == 8
    # The evidence of 50 perfect rounds fades by `memory` per round: about 45 rounds to stop.
    assert all(k == 0 for k in chosen[100:] if k != 1) and sum(chosen[100:]) <= 3


def test_autok_picks_large_k_when_acceptance_is_near_one_and_v_is_flat():
    chosen = simulate(AutoK(FixedCosts(c=0.01, v=[1.0] * 9)), lambda r: 0.98, 60)
    assert min(chosen[20:]) >= 6


@pytest.mark.parametrize("alpha", [0.5, 0.7, 0.9])
def test_autok_settles_near_the_cost_model_optimum(alpha):
    """With steady constant acceptance the estimate settles, so the k it picks should be
    nearly as fast, by the cost model with the true alpha, as the best k. (The curve is flat
    near its peak, so the k itself may wander: at alpha .9, k = 5..8 are within 3%.)"""
    true = speedup_by_k(MEASURED_LIKE.c, MEASURED_LIKE.v, survival_from_alpha(alpha, 8))
    best = optimal_k(MEASURED_LIKE.c, MEASURED_LIKE.v, alpha=alpha)
    late = simulate(AutoK(MEASURED_LIKE), lambda r: alpha, 300, seed=3)[100:]
    assert sum(true[k] for k in late) / len(late) >= 0.95 * true[best]


def test_autok_is_a_function_of_the_stats_it_saw():
    a = simulate(AutoK(MEASURED_LIKE), lambda r: 0.6, 80, seed=5)
    policy = AutoK(MEASURED_LIKE)
    assert simulate(policy, lambda r: 0.6, 80, seed=5) == a
    assert simulate(policy, lambda r: 0.6, 80, seed=5) == a  # begin() resets it


@pytest.mark.parametrize(
    "options, message",
    [
        ({"k_max": 9}, "k_max must be an integer in \\[1, 8\\]"),
        ({"k_max": 0}, "k_max"),
        ({"prior_rate": 1.0}, "prior_rate"),
        ({"prior_weight": 0}, "prior_weight"),
        ({"memory": 0}, "memory"),
        ({"margin": -0.1}, "margin"),
        ({"probe_every": 0}, "probe_every"),
    ],
)
def test_autok_rejects_bad_settings(options, message):
    with pytest.raises(ValueError, match=message):
        AutoK(FLAT, **options)


def test_autok_needs_v_for_k_plus_one():
    with pytest.raises(ValueError, match="k_max"):
        AutoK(FixedCosts(c=0.1, v=[1.0]))


class SwitchingProposer:
    """Drafts the greedy target's own continuation once the context reaches `good_from`
    tokens, and a token the target never picks before that (acceptance 0, then 1)."""

    def __init__(self, target: TableLM, good_from: int) -> None:
        self.target = target
        self.good_from = good_from

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        pass

    def commit(self, context: Sequence[int]) -> None:
        pass

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        ids = list(context)
        for _ in range(k):
            best = int(self.target.score(ids)[-1].argmax())
            ids.append(best if len(context) >= self.good_from else (best + 1) % self.target.vocab_size)
        return Draft(tuple(ids[len(context) :]))

    propose_stateless = propose


def greedy_table() -> TableLM:
    return random_table(4, 2, seed=11, zeros=False)


def test_engine_with_autok_goes_plain_on_garbage_and_returns_on_good_drafts():
    target = greedy_table()
    proposer = SwitchingProposer(target, good_from=3 + 60)
    # A stopped clock: no timings, so the costs stay FLAT's (a table model's microseconds, where
    # drafting scores the table too, are not the costs under test).
    run = generate(
        target, proposer, [0, 1, 2], max_new_tokens=200, sampling=SamplingParams(temperature=0), k=AutoK(FLAT),
        clock=lambda: 0.0,
    )
    plain = generate(target, None, [0, 1, 2], max_new_tokens=200, sampling=SamplingParams(temperature=0), k=0)
    assert run.tokens == plain.tokens  # greedy speculation is greedy decoding
    drafted, accepted = run.stats.drafted, run.stats.accepted
    garbage = [r for r in range(run.stats.rounds) if sum(accepted[:r]) + r < 60]  # output < 60
    assert len(garbage) == 60 and sum(accepted[:60]) == 0
    assert sum(drafted[r] > 0 for r in garbage[12:]) <= 3  # stopped within a dozen rounds, then probes
    assert run.stats.rounds < 60 + 140 / 4  # the good stretch ran with long drafts
    assert max(drafted) == 8


@pytest.mark.parametrize("seed", range(4))
def test_engine_with_autok_equals_the_reference(seed):
    target, draft = seed_pair()
    sampling = SamplingParams(temperature=1.0)
    options = dict(max_new_tokens=40, sampling=sampling, eos_token_id=None)
    # AutoK learns from round timings: on tick clocks both sides record the same ones.
    run = generate(
        target, DraftModel(draft), [0], k=AutoK(MEASURED_LIKE), rng=TorchRandom(seed), clock=TickClock(), **options
    )
    again = reference_generate(
        target, DraftModel(draft), [0], k=AutoK(MEASURED_LIKE), rng=TorchRandom(seed), clock=TickClock(), **options
    )
    assert run.tokens == again
    assert len(set(run.stats.drafted)) > 1  # the policy did vary k


@pytest.mark.parametrize("seed", range(4))
def test_engine_with_autok_and_prompt_lookup_equals_the_reference(seed):
    target = random_table(3, 2, seed=seed, eos_token_id=2)
    prompt = [0, 1, 0, 1, 1, 0, 1]
    options = dict(max_new_tokens=30, sampling=SamplingParams(temperature=0.7), eos_token_id=2)
    policy = AutoK(FLAT)
    run = generate(target, PromptLookup(), prompt, k=policy, rng=TorchRandom(seed), clock=TickClock(), **options)
    again = reference_generate(
        target, PromptLookup(), prompt, k=policy, rng=TorchRandom(seed), clock=TickClock(), **options
    )
    assert run.tokens == again


def test_build_policy(tmp_path):
    target = random_table(3, 1, seed=0)
    prompt = [0, 1, 2, 0, 1]
    assert build_policy("3", target, PromptLookup(), prompt).choose(Stats()) == Plan(3)
    assert isinstance(build_policy("heuristic", target, PromptLookup(), prompt), HeuristicK)
    measured = build_policy("auto", target, PromptLookup(), prompt)
    assert isinstance(measured, AutoK) and measured.k_max == 8 and measured.v[0] == 1
    profile = measure_profile(target, PromptLookup(), prompt, k_max=3, repeats=1)
    profile.save(tmp_path / "p.json")
    from_file = build_policy(f"auto:{tmp_path / 'p.json'}", target, PromptLookup(), prompt)
    assert (from_file.k_max, from_file.c, from_file.v) == (3, profile.c, profile.v)
    with pytest.raises(ValueError, match="--k must be an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x..., got 'fast'"):
        build_policy("fast", target, PromptLookup(), prompt)
    with pytest.raises(ValueError, match="give a proposer"):
        build_policy("auto", target, None, prompt)
    with pytest.raises(FileNotFoundError):
        build_policy(f"auto:{tmp_path / 'absent.json'}", target, PromptLookup(), prompt)


def test_each_source_gets_its_own_policy_and_its_own_rounds():
    """Two sources interleaved: copies always accepted, head drafts never. One AutoK over the
    mixture drafts for both; per source, the head is turned off (plain rounds and rare probes)
    while the copies earn the longest k; one policy over the mixture keeps drafting on the head's
    rounds."""
    def run(policies, rounds=200):
        stats, chosen = Stats(), {"copy": [], "head": []}
        policies.begin()
        for r in range(rounds):
            source = ("copy", "head")[r % 2]
            plan = policies.choose(stats, source)
            assert plan.source == source
            k = plan.k
            accepted = k if source == "copy" else 0
            stats.record(k, accepted, accepted + 1, source=source)
            chosen[source].append(k)
        return stats, chosen

    stats, chosen = run(PerSource(AutoK(FLAT)))
    assert chosen["copy"][-20:] == [8] * 20
    assert sum(k > 0 for k in chosen["head"][20:]) <= 6  # probes, ever more rarely
    assert stats.by_source["copy"].rounds == stats.by_source["head"].rounds == 100
    assert stats.rounds == 200 and sum(stats.by_source["copy"].accepted) == sum(stats.accepted)
    assert stats.by_source["head"].position_accepts == [0] * len(stats.by_source["head"].position_accepts)
    mixed = PerSource(AutoK(FLAT))
    mixed_stats, mixed_chosen = Stats(), []
    mixed.begin()
    for r in range(200):  # the same rounds without sources: one policy for the mixture
        k = mixed.choose(mixed_stats, None).k
        accepted = k if r % 2 == 0 else 0
        mixed_stats.record(k, accepted, accepted + 1)
        mixed_chosen.append(k)
    assert sum(k > 0 for k in mixed_chosen[161::2]) >= 15 and not mixed_stats.by_source  # drafts on head rounds


def test_a_proposer_with_one_source_is_driven_by_the_policy_itself():
    policy, stats = AutoK(FLAT), Stats()
    policies = PerSource(policy)
    policies.begin()
    for _ in range(30):
        k = policies.choose(stats, None).k
        stats.record(k, k, k + 1)
    assert policies.by_source == {} and policy.survival()[0] > 0.85
