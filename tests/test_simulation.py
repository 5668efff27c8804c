"""The policies on simulated costs (`verispec.simulation`): the clock charges exactly what the
curve says, the controlled drafts have the acceptance asked for, and on a small grid the auto
policy keeps its targets: >= 0.95x the best fixed k (chosen after the fact) and >= 0.97x plain.
Every number here is exact for its seed (no real clock is read)."""

from __future__ import annotations

import pytest

from verispec.cost import BatchCosts
from verispec.engine import generate
from verispec.policies import AcceptanceCounts, Adjustable, AutoK, BatchK, pooled
from verispec.proposers.controlled import ControlledAcceptance
from verispec.sampling import GREEDY, SamplingParams
from verispec.simulation import (
    CURVES,
    STEP,
    VOCAB,
    ChargedProposer,
    SimulatedClock,
    SimulatedTarget,
    chain_acceptance,
    cycle_table,
    greedy_continuation,
    grid_cell,
)
from verispec.stats import Stats
from verispec.tree_shape import TreeShape


def run(k, alpha: float, tokens: int = 200, curve: str = "gpu-flat", c: float = 0.05):
    clock, table = SimulatedClock(), cycle_table()
    target = SimulatedTarget(table, CURVES[curve], clock)
    proposer = ChargedProposer(ControlledAcceptance.alpha(greedy_continuation(table, tokens), alpha, VOCAB), clock, c)
    out = generate(target, proposer if k != 0 else None, [1, 2], max_new_tokens=tokens, sampling=GREEDY, k=k, clock=clock)
    return out, clock.now


def test_the_clock_charges_each_forward_and_each_draft_what_the_curve_says():
    out, seconds = run(3, 0.6)
    curve = CURVES["gpu-flat"]
    assert out.stats.round_target_seconds == pytest.approx([STEP * curve.at(d + 1) for d in out.stats.drafted])
    assert out.stats.round_draft_seconds == pytest.approx([0.05 * STEP * d for d in out.stats.drafted])
    assert seconds == pytest.approx(out.stats.target_seconds + out.stats.draft_seconds)


def test_speculation_on_the_table_is_plain_greedy_decoding():
    plain, _ = run(0, 0.6)
    assert plain.tokens == greedy_continuation(cycle_table(), 200)([1, 2])
    for k in (1, 4):
        assert run(k, 0.6)[0].tokens == plain.tokens


def test_controlled_drafts_are_accepted_at_the_rate_asked():
    """Rounds of k = 1 see fresh coins: 2,000 of them at alpha = 0.6, so the measured rate lies
    within 0.6 +- 0.05 but with probability about 5e-6 (normal approximation, 4.6 sd)."""
    out, _ = run(1, 0.6, tokens=3200)
    assert sum(out.stats.drafted) > 1900
    assert out.stats.acceptance_rate == pytest.approx(0.6, abs=0.05)


def test_controlled_trees_put_the_right_token_at_the_rank_its_coin_gives():
    continuation = [3, 4, 5, 6]
    oracle = ControlledAcceptance(lambda prompt: continuation, [[0.0, 1.0]], vocab_size=VOCAB)
    oracle.begin([1], SamplingParams(temperature=0))
    tree = oracle.propose_tree([1], TreeShape.of([(0,), (1,), (1, 0), (1, 1)]), None)
    assert tree.tokens[1] == 3 and tree.tokens[0] != 3  # rank 1 holds the continuation's token
    assert tree.tokens[3] == 4 and tree.tokens[2] != 4  # and again below it
    assert oracle.propose([1], 2, None).tokens[0] != 3  # a chain drafts rank 0: never right here
    with pytest.raises(ValueError, match="greedily"):
        oracle.begin([1], SamplingParams(temperature=1.0))


def counted(attempts: float, accepts: float, depth: int = 1) -> Adjustable:
    """A request's batch entry whose counts at position 1 are these (none deeper), with AutoK's
    prior (0.5, four rounds)."""
    counts = AcceptanceCounts((attempts,) + (0.0,) * (depth - 1), (accepts,) + (0.0,) * (depth - 1), 0.5, 4.0)
    return Adjustable(depth, counts.survival(), 0.05, counts=counts)


def test_pooling_plans_alike_requests_alike_and_leaves_different_ones_apart():
    a, b = (entry.survival[0] for entry in pooled([counted(20, 10), counted(20, 14)]))
    assert abs(a - b) < 0.5 * (0.7 - 0.5)  # a gap within the chance of 20 rounds shrinks
    a, b = (entry.survival[0] for entry in pooled([counted(20, 1), counted(20, 19)]))
    assert a == pytest.approx((1 + 2) / (20 + 4)) and b == pytest.approx((19 + 2) / (20 + 4))  # as if alone
    unknown = [Adjustable(8, [0.45], 0.05), Adjustable(8, [0.75], 0.05)]
    assert pooled(unknown) == unknown


def test_pooling_counts_the_prior_once():
    """Eight requests that each accepted their 3 probes: alone each estimates (3 + 2) / (3 + 4)
    = 0.71, the batch's 24 of 24 give (24 + 2) / (24 + 4) = 0.93 to every one of them. Where a
    row is dear (`cpu-q4`) that is the difference between drafting 2 each and not at all. And a
    request just admitted beside requests that accept 4 of 20 plans from their rate, not from
    the prior's 0.5."""
    probed = [counted(3, 3, depth=8)] * 8
    assert all(entry.survival[0] == pytest.approx(26 / 28) for entry in pooled(probed))
    batch = BatchK(CURVES["cpu-q4"].costs)
    assert batch.plan(probed) == [2] * 8
    assert batch.plan([Adjustable(8, entry.survival, 0.05) for entry in probed]) == [0] * 8  # each alone
    admitted = pooled([counted(20, 4)] * 7 + [counted(0, 0)])[-1]
    assert admitted.survival[0] == pytest.approx((7 * 4 + 2) / (7 * 20 + 4))


def test_a_probe_is_drafted_where_a_row_is_cheap_and_not_where_it_is_dear():
    entries = [Adjustable(8, [0.1] * 8, 0.05, probe=True), Adjustable(8, [0.1] * 8, 0.05)]
    assert BatchK(BatchCosts((1, 64), (1.0, 1.1))).plan(entries) == [1, 0]
    assert BatchK(BatchCosts((1, 2), (1.0, 2.0))).plan(entries) == [0, 0]


def test_a_request_the_batch_holds_at_zero_asks_for_a_probe():
    policy = AutoK(CURVES["cpu-q4"].profile(0.05, 9))
    stats = Stats()
    probes = []
    for _ in range(12):
        policy.choose(stats)
        probes.append(policy.adjustable(0).probe)
        stats.record(0, 0, 1, batch_rows=8)  # the batch drafted nothing for it
    assert probes.index(True) == 4  # after probe_every steps held
    assert policy.adjustable(0).most == policy.k_max  # the batch's v(N) decides how far


@pytest.mark.parametrize(
    "curve, alpha, concurrency, ks",
    [
        ("gpu-flat", 0.6, 1, (3, 4, 5)),
        ("gpu-flat", 0.9, 1, (6, 8)),
        ("cpu-bf16", 0.6, 1, (2, 3, 4)),
        ("compute-bound", 0.2, 1, (1,)),
        ("gpu-graph-8b", 0.9, 8, (4, 6)),
        ("cpu-q4", 0.9, 8, (2,)),
        ("gpu-flat", 0.2, 8, (1,)),
    ],
)
def test_auto_keeps_its_targets_on_a_small_grid(curve, alpha, concurrency, ks):
    """ks: the best fixed k's of the cell (the grid in docs/cost-model.md tried k = 1..8). The
    last two cells missed before the batch's evidence was pooled with its prior counted once
    (0.928x the best k and 0.944x plain at these 512 tokens)."""
    cell = grid_cell(curve, alpha, concurrency, tokens=1024 if concurrency == 1 else 512, ks=ks)
    assert cell.over_best >= 0.95
    assert cell.over_plain >= 0.97


# ---- the bench's controlled-acceptance method on a real (tiny) model -------------------------


def test_the_oracle_method_drafts_the_greedy_continuation_at_the_acceptance_asked(tmp_path):
    """verispec-oracle:ALPHA on the tiny random Llama: every run is plain greedy decoding, and
    at alpha 1 every drafted token is accepted, at alpha 0 none."""
    from verispec.bench.methods import parse_method
    from verispec.bench.quick import quick_workloads
    from verispec.bench.suite import make_runner, quick_target

    target = quick_target(tmp_path)
    prompt = quick_workloads()[0].token_ids(target)
    plain = make_runner(parse_method("verispec-plain"), target, prompt)(prompt, 24).tokens
    for alpha, accepted in ((1.0, 1.0), (0.0, 0.0)):
        method = parse_method(f"verispec-oracle:{alpha}-k4")
        assert method.oracle == alpha and method.k == 4
        outcome = make_runner(method, target, prompt)(prompt, 24)
        assert outcome.tokens == plain
        assert outcome.stats.acceptance_rate == accepted


@pytest.mark.parametrize("name", ["verispec-oracle:1.5-k4", "verispec-oracle:x-k4", "verispec-oracle:0.5-k"])
def test_a_bad_oracle_method_is_refused(name):
    from verispec.bench.methods import parse_method

    with pytest.raises(ValueError, match="verispec-oracle|policy"):
        parse_method(name)
