"""The context gate: the cost model's costs by context length (`ContextCosts`), measured by the
profiler (`measure_context_costs`), saved with the profile, and read by `AutoK` at the
request's current context every round, so speculation stops where a long context makes it
lose and drafts again where it pays.

Costs are simulated: a table whose forwards charge an exact fake clock what a cost curve
says (`verispec.simulation`, a curve whose every scored row reads the whole cache), so every
throughput here is exact for its seed."""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import SimpleNamespace

import pytest
import torch

from clocks import FakeClock
from test_cli_errors import error_line, no_model  # noqa: F401 (no_model: a fixture)
from verispec.cli import main
from verispec.cost import ContextCosts, FixedCosts, OnlineCosts, speedup_by_k
from verispec.engine import generate
from verispec.models.tables import random_table
from verispec.plan import Plan
from verispec.policies import AutoK, KPolicy
from verispec.profile import Profile, measure_context_costs, measure_profile
from verispec.profiling import ProfileSettings, check_room
from verispec.proposers.controlled import ControlledAcceptance
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.randomness import TorchRandom
from verispec.reference import reference_generate
from verispec.sampling import GREEDY, SamplingParams
from verispec.simulation import VOCAB, ChargedProposer, Curve, SimulatedClock, SimulatedTarget, cycle_table, greedy_continuation
from verispec.stats import Stats

# Drafting pays at short contexts, loses from about 1,000 tokens (each scored row reads the
# cache: v(2) = 1.68 after 600 tokens, 1.84 after 1,500), then pays again past 3,000 (a cheaper
# kernel for long contexts: a made-up curve, to see the policy come back).
LOSES = ContextCosts(
    contexts=(0, 1000, 2000, 3000),
    seconds=(
        (0.010, 0.0105, 0.011, 0.0115),  # flat: k = 3 at acceptance 0.8
        (0.020, 0.040, 0.060, 0.080),  # v(n) = n: nothing pays
        (0.030, 0.060, 0.090, 0.120),
        (0.030, 0.031, 0.032, 0.033),  # flat again
    ),
    draft=(0.0005, 0.0005, 0.0005, 0.0005),
)


def test_the_table_is_linear_between_its_points_flat_before_and_rising_beyond():
    seconds, draft = LOSES.at(500)
    assert seconds == pytest.approx([0.015, 0.02525, 0.0355, 0.04575]) and draft == 0.0005
    assert LOSES.at(0) == LOSES.at(-5) == (list(LOSES.seconds[0]), 0.0005)
    rising = ContextCosts((10, 20), ((1.0, 2.0), (2.0, 3.0)), (0.1, 0.3))
    assert rising.at(40) == (pytest.approx([4.0, 5.0]), pytest.approx(0.7))
    falling = ContextCosts((10, 20), ((2.0, 3.0), (1.5, 3.5)), (0.1, 0.1))
    assert falling.at(40)[0] == pytest.approx([1.5, 4.5])  # a fall is not extended, a rise is


@pytest.mark.parametrize(
    "contexts, seconds, draft, message",
    [
        ((), (), (), "as many rows"),
        ((5, 5), ((1.0,), (1.0,)), (0.0, 0.0), "increasing"),
        ((5, 9), ((1.0, 2.0), (1.0,)), (0.0, 0.0), "same n"),
        ((5,), ((0.0,),), (0.0,), "t\\(n\\) > 0"),
    ],
)
def test_a_bad_table_is_refused(contexts, seconds, draft, message):
    with pytest.raises(ValueError, match=message):
        ContextCosts(contexts, seconds, draft)


def test_online_costs_read_the_table_at_the_current_context():
    costs = OnlineCosts(FixedCosts.of(LOSES))
    for context in (0, 500, 1000, 2500, 5000):
        costs.at(context)
        seconds, draft = LOSES.at(context)
        assert costs.v == pytest.approx([t / seconds[0] for t in seconds])
        assert costs.c == pytest.approx(draft / seconds[0])


def test_what_the_rounds_teach_holds_at_every_context():
    """A machine 1.5x slower than profiled, measured at 500 tokens: v(n) keeps the table's
    shape at 2,500 tokens, and c (the same seconds per draft) halves against a dearer step."""
    costs = OnlineCosts(FixedCosts.of(LOSES))
    costs.at(500)
    seconds, _ = LOSES.at(500)
    for r in range(400):
        n = r % 4 + 1
        costs.observe(n, 1.5 * seconds[n - 1], n - 1, (n - 1) * 0.0005)
    costs.at(2500)
    there, draft = LOSES.at(2500)
    assert costs.v == pytest.approx([t / there[0] for t in there], rel=5e-3)
    assert costs.c == pytest.approx(draft / (1.5 * there[0]), rel=1e-2)


def test_flat_costs_are_the_same_at_every_context():
    costs = OnlineCosts(FixedCosts(c=0.01, v=[1.0, 1.2, 1.3], step_seconds=0.02))
    costs.at(7000)
    assert (costs.c, costs.v) == (0.01, [1.0, 1.2, 1.3])


def accepted_everything(policy: AutoK, rounds: int, context: int) -> Stats:
    """`rounds` untimed rounds at k_max whose every draft was accepted, at `context`."""
    stats = Stats(context_tokens=context)
    for _ in range(rounds):
        stats.record(policy.k_max, policy.k_max, policy.k_max + 1)
        policy.choose(stats)
    return stats


def test_auto_drafts_where_it_pays_stops_where_a_long_context_makes_it_lose_and_comes_back():
    """Untimed rounds: the costs are the table's at each context, and the choice is the best
    k of the table there for the policy's own survival estimate (or a probe where only a better
    acceptance could make one pay); where nothing could pay no round drafts, probes included,
    and speculation resumes at once where it pays again."""
    policy = AutoK(FixedCosts.of(LOSES))
    stats = accepted_everything(policy, 30, 0)
    chosen = {}
    for context in range(0, 4000, 25):
        stats.context_tokens = context
        k = policy.choose(stats).k
        seconds, draft = LOSES.at(context)
        c, v = draft / seconds[0], [t / seconds[0] for t in seconds]
        ratios = speedup_by_k(c, v, policy.survival())
        best = max(range(1, len(ratios)), key=ratios.__getitem__)
        expected = best if ratios[best] > 1 + policy.margin else 0
        could_pay = max(speedup_by_k(c, v, [1.0] * 3)) > 1 + policy.margin  # were every draft accepted
        assert k == expected or (expected == 0 and could_pay), context  # a probe, where one could pay
        stats.record(k, k, k + 1)  # accepted whatever it drafts
        chosen[context] = k
    assert chosen[0] == 3 and chosen[3500] == 3
    assert all(chosen[n] == 0 for n in range(1000, 2000, 25))  # no probe in 40 rounds of losing
    assert max(n for n in chosen if n < 1000 and chosen[n]) > 500  # drafting until it stops paying


# Each scored row reads the cache at 1/300 of a one-row forward per token: at alpha 0.8 drafting
# pays for the first few hundred tokens and loses beyond about 1,000.
ROWS = Curve((1, 2, 16), (1.0, 1.05, 1.75), "made up: v(n) nearly flat without context", attention=1 / 300)
ALPHA = 0.8
TOKENS = 1500


def decode(policy, *, sampling: SamplingParams = GREEDY, seed: int = 0, tokens: int = TOKENS):
    """Tokens, tokens per simulated second and the run's stats of one request of `tokens` tokens:
    greedy, drafts of acceptance ALPHA; sampled, a draft model (another table)."""
    clock, table = SimulatedClock(), cycle_table()
    target = SimulatedTarget(table, ROWS, clock)
    drafter = (
        ControlledAcceptance.alpha(greedy_continuation(table, tokens), ALPHA, VOCAB) if sampling.greedy
        else DraftModel(random_table(VOCAB, 1, seed=3))
    )
    proposer = ChargedProposer(drafter, clock, 0.05)
    run = generate(
        target, proposer if policy != 0 else None, [1, 2], max_new_tokens=tokens, sampling=sampling, k=policy,
        clock=clock, seed=seed,
    )
    return run.tokens, len(run.tokens) / clock.now, run.stats


def gated() -> AutoK:
    return AutoK(ROWS.profile(0.05, 9), k_max=8)


def flat() -> AutoK:
    """The same profile measured at one context only (before the context axis)."""
    profile = ROWS.profile(0.05, 9)
    return AutoK(FixedCosts(profile.c, profile.v, profile.step_seconds), k_max=8)


def test_on_a_request_that_outgrows_speculation_auto_keeps_its_targets_and_without_the_gate_it_does_not():
    """Tokens per simulated second: auto 29.43, plain 28.56, k = 1..4 29.53, 27.63, 26.03,
    24.13; auto on the same profile without its context axis 25.47 (0.89x plain): its rounds
    alone follow the rising costs too slowly."""
    plain = decode(0)[1]
    fixed = {k: decode(k)[1] for k in (1, 2, 3, 4)}
    auto, stats = decode(gated())[1:]
    assert auto >= 0.97 * plain and auto >= 0.95 * max(fixed.values())
    assert stats.drafted[:20].count(0) <= 2  # drafts early
    assert stats.drafted[-200:].count(0) >= 150  # and late mostly not (probes, where k = 1 is marginal)
    assert decode(flat())[1] < 0.97 * plain


def test_the_gate_changes_k_and_never_the_tokens_of_a_seed():
    """Sampled (T = 1): the coupled rule, the default at T > 0, gives a seed's tokens whatever k
    each round drafted, so plain decoding, fixed k and auto with and without the gate agree."""
    sampling = SamplingParams(temperature=1.0)
    runs = {name: decode(policy, sampling=sampling, seed=7, tokens=800) for name, policy in
            (("plain", 0), ("k3", 3), ("gated", gated()), ("flat", flat()))}
    assert runs["gated"][2].plans != runs["flat"][2].plans
    assert runs["plain"][0] == runs["k3"][0] == runs["gated"][0] == runs["flat"][0]


class ContextTable:
    """A table model whose `extend(n tokens)` after a cache of L tokens takes
    0.01 + 0.002 n + 0.00001 n L seconds on the clock; `prefilled` counts the tokens it was
    given by `prefill` and `extend` in all."""

    def __init__(self, clock: FakeClock) -> None:
        self.table = random_table(5, 1, seed=0)
        self.vocab_size = self.table.vocab_size
        self.clock, self.prefilled = clock, 0

    @property
    def length(self) -> int:
        return self.table.length

    def prefill(self, ids: Sequence[int]) -> None:
        self.prefilled += len(ids)
        self.table.prefill(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self.clock.now += self.seconds(len(tokens), self.length)
        self.prefilled += len(tokens)
        return self.table.extend(tokens, keep)

    def rollback(self, length: int) -> None:
        self.table.rollback(length)

    @staticmethod
    def seconds(n: int, cached: int) -> float:
        return 0.01 + 0.002 * n + 0.00001 * n * cached


def test_the_profile_times_every_context_after_one_prefill_and_round_trips(tmp_path):
    clock = FakeClock()
    target = ContextTable(clock)
    prompt = [0, 1, 2, 3, 4, 0, 1]
    profile = measure_profile(target, PromptLookup(), prompt, k_max=3, repeats=2, warmup=1, clock=clock)
    options = dict(k_max=3, repeats=2, warmup=1, clock=clock)
    target.prefilled = 0
    profile.contexts = measure_context_costs(target, PromptLookup(), prompt, (400, 100, 1000), **options)
    assert target.prefilled <= 1000 + 3 * 10 * 3  # the longest context once, and the timed rounds
    assert target.length == 99  # left at the shortest
    assert [p.context_tokens for p in profile.contexts] == [100, 400, 1000]
    for point in profile.contexts:
        cached = point.context_tokens - 1
        assert point.v == pytest.approx([target.seconds(n, cached) / target.seconds(1, cached) for n in range(1, 5)])
    table = profile.context_table
    assert table.contexts == (7, 100, 400, 1000)
    assert table.at(700)[0][1] == pytest.approx((target.seconds(2, 399) + target.seconds(2, 999)) / 2)
    path = tmp_path / "p.json"
    profile.save(path)
    assert Profile.load(path) == profile and Profile.load(path).context_table == table
    old = json.loads(path.read_text())
    del old["contexts"]  # a profile written before the context axis
    path.write_text(json.dumps(old))
    assert Profile.load(path).context_table is None
    policy = AutoK(Profile.load(path))
    policy.costs.at(100_000)
    assert policy.v == pytest.approx(profile.v)  # flat in context


def test_cost_prices_a_profile_at_a_context_from_its_axis(tmp_path, capsys):
    clock = FakeClock()
    target = ContextTable(clock)
    profile = measure_profile(target, PromptLookup(), [0, 1, 2, 3], k_max=3, repeats=1, clock=clock)
    profile.contexts = measure_context_costs(target, PromptLookup(), [0, 1, 2, 3], (100, 1000), k_max=3, repeats=1, clock=clock)
    path = tmp_path / "p.json"
    profile.save(path)
    assert main(["cost", "--profile", str(path), "--context", "700", "--alpha", "0.8", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    c, v = profile.context_table.costs_at(700)
    assert [row["v"] for row in printed["per_k"]] == pytest.approx(v[1:]) and printed["c"] == pytest.approx(c)
    assert v[1] == pytest.approx((target.seconds(2, 399) + target.seconds(2, 999)) / (target.seconds(1, 399) + target.seconds(1, 999)))
    assert "--context reads a profile's context axis" in error_line(capsys, ["cost", "--c", "0.1", "--alpha", "0.5", "--context", "9"])


def test_a_profile_whose_contexts_time_other_n_is_refused():
    clock = FakeClock()
    profile = measure_profile(ContextTable(clock), PromptLookup(), [0, 1, 2], k_max=2, repeats=1, clock=clock)
    data = profile.to_dict()
    point = {**data, "context_tokens": 50}
    data["contexts"] = [{key: point[key] for key in ("context_tokens", "v", "c", "draft")} | {"score": point["score"][:2]}]
    with pytest.raises(ValueError, match="after 50 tokens time n = 1..2"):
        Profile.from_dict(data)


def test_bad_context_lengths_are_refused():
    with pytest.raises(ValueError, match="integers >= 2"):
        measure_context_costs(ContextTable(FakeClock()), PromptLookup(), [0, 1], (1, 10))


@pytest.mark.parametrize("value", ["1024,abc", "1", "512,,2048", "-5"])
def test_profile_refuses_bad_context_lengths_before_loading(capsys, no_model, value):
    line = error_line(capsys, ["profile", "--contexts", value])
    assert "--contexts takes context lengths (integers >= 2) joined by commas" in line


def test_profile_refuses_a_context_past_the_models_before_timing():
    with pytest.raises(ValueError, match=r"the longest of the contexts and k_max \+ 1 scored tokens \(9009 tokens\)"):
        check_room(SimpleNamespace(context_limit=8192), 200, 200, ProfileSettings(contexts=(1024, 9000)), 0, 0)


class Recorder(KPolicy):
    """A policy drafting 2 tokens a round that records the context each choice saw."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def begin(self) -> None:
        self.seen = []

    def choose(self, stats: Stats) -> Plan:
        self.seen.append(stats.context_tokens)
        return Plan(2)


def test_the_engine_and_the_reference_show_the_policy_the_same_context_each_round():
    target = random_table(3, 2, seed=4)
    prompt = [0, 1, 0, 1, 1, 0, 1]
    options = dict(max_new_tokens=30, sampling=GREEDY)
    engine, reference = Recorder(), Recorder()
    run = generate(target, PromptLookup(), prompt, k=engine, rng=TorchRandom(0), **options)
    reference_generate(target, PromptLookup(), prompt, k=reference, rng=TorchRandom(0), **options)
    emitted = [a + 1 for a in run.stats.accepted]
    assert engine.seen == reference.seen == [len(prompt) + sum(emitted[:r]) for r in range(run.stats.rounds)]


def test_each_source_sees_the_requests_context():
    stats = Stats(context_tokens=500)
    assert stats.source("copy").context_tokens == 500
    stats.context_tokens = 900
    assert stats.source("copy").context_tokens == stats.source("head").context_tokens == 900
