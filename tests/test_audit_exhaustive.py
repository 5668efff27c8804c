"""The exhaustive audit: the exact target distribution (an implementation independent of
`verispec.sampling`), every default configuration of the real engine against it, and the
negative controls that it must catch."""

from __future__ import annotations

import dataclasses
import math
import random
from fractions import Fraction

import pytest
import torch

from verispec.audit.controls import (
    NEGATIVE_CONTROLS,
    UncroppedCacheTableLM,
    ratio_shortcut,
    resampling_p_verifier,
)
from verispec.audit.exact_target import exact_penalised, exact_probabilities, greedy_token, target_sequences
from verispec.audit.exhaustive import (
    SCENARIOS,
    TOLERANCE,
    Configuration,
    Scenario,
    audit_configuration,
    default_configurations,
    max_abs_difference,
    audited_proposers,
    select_proposers,
)
from verispec.models.tables import bigram, random_row
from verispec.registry import PROPOSERS
from verispec.sampling import GREEDY, SamplingParams, penalised, probabilities

F = Fraction
CONFIGURATIONS = default_configurations()
DRAFT, LOOKUP = PROPOSERS["draft"], PROPOSERS["lookup"]


# --- the exact target -------------------------------------------------------------------------

SAMPLINGS = [
    SamplingParams(),
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=0.25),
    SamplingParams(top_k=1),
    SamplingParams(top_k=2),
    SamplingParams(temperature=0.5, top_k=3, min_p=0.2),
    SamplingParams(min_p=0.35),
]


@pytest.mark.parametrize("sampling", SAMPLINGS, ids=str)
def test_exact_transforms_agree_with_the_float_transforms(sampling):
    rng = random.Random(3)
    for _ in range(40):
        row = random_row(4, rng, 12, zeros=True)
        logits = torch.tensor([[math.log(x) if x else -math.inf for x in row]], dtype=torch.float64)
        try:
            exact = exact_probabilities(row, sampling)
        except ValueError:  # a threshold too close to call; the audit refuses such scenarios
            continue
        assert sum(exact) == 1
        assert probabilities(logits, sampling)[0].tolist() == pytest.approx([float(x) for x in exact], abs=1e-12)


def test_exact_top_p_agrees_on_rows_without_ties():
    rng = random.Random(5)
    checked = 0
    for _ in range(60):
        row = random_row(4, rng, 20, zeros=False)
        if len(set(row)) < len(row):
            continue
        for top_p in (0.33, 0.61, 0.87):
            logits = torch.tensor([[math.log(x) for x in row]], dtype=torch.float64)
            exact = exact_probabilities(row, SamplingParams(top_p=top_p))
            expected = [float(x) for x in exact]
            assert probabilities(logits, SamplingParams(top_p=top_p))[0].tolist() == pytest.approx(expected, abs=1e-12)
            checked += 1
    assert checked > 50


def test_temperature_must_be_one_over_an_integer():
    with pytest.raises(ValueError, match="1/m"):
        exact_probabilities((F(1, 2), F(1, 2)), SamplingParams(temperature=0.7))


def test_thresholds_on_a_boundary_are_refused():
    row = (F(1, 2), F(1, 4), F(1, 4))
    with pytest.raises(ValueError, match="boundary"):
        exact_probabilities(row, SamplingParams(top_p=0.5))  # the prefix (1/2) reaches top_p exactly
    with pytest.raises(ValueError, match="tied"):
        exact_probabilities(row, SamplingParams(top_p=0.6))  # keeps one of the two 1/4s
    with pytest.raises(ValueError, match="min_p"):
        exact_probabilities(row, SamplingParams(min_p=0.5))  # floor 1/4 equals two entries


def test_greedy_token_breaks_ties_like_torch_argmax():
    rng = random.Random(11)
    for _ in range(50):
        row = random_row(4, rng, 6, zeros=True)
        logits = torch.tensor([math.log(x) if x else -math.inf for x in row], dtype=torch.float64)
        assert greedy_token(row) == int(logits.argmax())


def test_target_sequences_follow_the_table():
    half = [F(1, 2), F(1, 2)]
    model = bigram([half, half])
    assert target_sequences(model, [0], sampling=SamplingParams(), max_new_tokens=2) == {
        seq: F(1, 4) for seq in [(0, 0), (0, 1), (1, 0), (1, 1)]
    }
    # EOS (token 1) ends a sequence early: (1,) has the mass of every continuation after it.
    with_eos = target_sequences(model, [0], sampling=SamplingParams(), max_new_tokens=3, eos_token_id=1)
    assert with_eos == {(1,): F(1, 2), (0, 1): F(1, 4), (0, 0, 1): F(1, 8), (0, 0, 0): F(1, 8)}
    assert target_sequences(model, [0], sampling=GREEDY, max_new_tokens=3) == {(0, 0, 0): F(1)}


def test_max_abs_difference_counts_missing_sequences():
    assert max_abs_difference({(0,): F(1, 2), (1,): F(1, 2)}, {(0,): 1.0}) == 0.5
    assert max_abs_difference({(0,): F(1)}, {(0,): 0.75, (2,): 0.25}) == 0.25


# --- the configuration list -------------------------------------------------------------------


def test_scenarios_cover_the_required_ranges():
    sampled = [s for s in SCENARIOS if not s.sampling.greedy]
    assert {s.vocab for s in SCENARIOS} >= {2, 3, 4} and max(s.vocab for s in SCENARIOS) <= 4
    assert {s.k for s in SCENARIOS if s.k_policy == "constant"} >= {1, 2, 3}
    assert max(s.max_new_tokens for s in SCENARIOS) <= 4 and {3, 4} <= {s.max_new_tokens for s in SCENARIOS}
    assert {s.order for s in SCENARIOS} == {1, 2}
    for group in (sampled, [s for s in SCENARIOS if s.sampling.greedy]):
        assert {s.eos_token_id is None for s in group} == {True, False}
    assert {s.sampling.temperature for s in sampled} >= {1.0, 0.5}
    assert all(any(getattr(s.sampling, f) is not None for s in sampled) for f in ("top_k", "top_p", "min_p"))
    assert any(s.k_policy == "heuristic" for s in sampled) and any(s.k_policy == "heuristic" for s in SCENARIOS if s.sampling.greedy)
    assert any(s.k >= s.max_new_tokens for s in SCENARIOS)  # k larger than the remaining budget


def test_every_proposer_meets_every_valid_rule():
    assert DRAFT.rules_for(GREEDY) == LOOKUP.rules_for(GREEDY) == ("greedy",)
    assert DRAFT.rules_for(SamplingParams()) == ("coupled", "token", "block")
    assert LOOKUP.rules_for(SamplingParams()) == ("coupled", "point-mass", "token", "block")
    audited = [kind.name for kind in audited_proposers()]
    assert {"lookup", "suffix", "draft", "random"} <= set(audited) and "layerskip" not in audited
    for kind in audited_proposers():
        for scenario in SCENARIOS:
            rules = {c.verifier for c in CONFIGURATIONS if c.proposer is kind and c.scenario is scenario}
            assert rules == set(kind.rules_for(scenario.sampling))


def test_select_proposers_by_name():
    assert select_proposers(["lookup", "draft"]) == [LOOKUP, DRAFT]
    with pytest.raises(ValueError, match="unknown proposer 'nope'; choose from lookup, suffix, lookahead, draft, random"):
        select_proposers(["nope"])
    with pytest.raises(ValueError, match="proposer 'layerskip' is not audited \\(it needs a transformer's layers"):
        select_proposers(["layerskip"])


# --- the engine against the exact target ------------------------------------------------------


@pytest.mark.parametrize("config", CONFIGURATIONS, ids=lambda c: c.name)
def test_engine_output_distribution_is_the_target_distribution(config):
    result = audit_configuration(config)
    assert result.error is None
    assert result.max_abs_diff <= TOLERANCE
    assert result.drafted > 0  # speculation happened on some branch
    assert result.paths >= 1 and result.sequences >= 1


def test_an_exception_is_reported_as_a_failure():
    bad = Configuration(dataclasses.replace(SCENARIOS[3], sampling=SamplingParams(temperature=0.7)), DRAFT, "token")
    result = audit_configuration(bad)
    assert not result.passed and "1/m" in result.error


# --- the negative controls --------------------------------------------------------------------


@pytest.mark.parametrize("name", NEGATIVE_CONTROLS)
def test_negative_controls_are_caught(name):
    control = NEGATIVE_CONTROLS[name]
    broken = audit_configuration(control)
    assert broken.error is None  # caught by the distribution, not by a crash
    assert not broken.passed and broken.max_abs_diff > 1e-3
    repaired = Configuration(control.scenario, DRAFT, "token")
    assert audit_configuration(repaired).passed  # the broken part, not the scenario, is at fault


KEYED_CONTROLS = [name for name, control in NEGATIVE_CONTROLS.items() if getattr(control.verifier, "keyed", False)]


@pytest.mark.parametrize("name", KEYED_CONTROLS)
def test_keyed_controls_also_break_the_identity_with_plain_decoding(name):
    """The coupled rule's controls are caught path by path too: some path's tokens are not
    plain decoding's with the same noise."""
    assert audit_configuration(NEGATIVE_CONTROLS[name]).unlike_plain > 0


def test_the_ratio_shortcut_is_exact_when_the_draft_races_on_the_targets_noise():
    control = NEGATIVE_CONTROLS["draft noise not the target's where the rule assumes it"]
    shared = audit_configuration(Configuration(control.scenario, DRAFT, ratio_shortcut))
    assert shared.passed and shared.drafted > 0  # only the draft's independent noise breaks it
    assert audit_configuration(Configuration(control.scenario, control.proposer, "coupled")).passed


def test_resampling_verifier_is_the_only_change_in_its_control():
    assert NEGATIVE_CONTROLS["repair by resampling p"].verifier is resampling_p_verifier


def test_uncropped_cache_needs_an_order_two_table_to_show():
    control = NEGATIVE_CONTROLS["target cache not cropped"]
    assert control.target_model is UncroppedCacheTableLM and control.scenario.order == 2
    order_one = dataclasses.replace(control, scenario=dataclasses.replace(control.scenario, order=1))
    assert audit_configuration(order_one).passed  # rows depend on the pending token alone


def test_scenario_tables_are_rational_and_reproducible():
    scenario = Scenario(3, 2, 2, 3, SamplingParams(), (1, 2, 0), eos_token_id=0, seed=4)
    a, b = scenario.tables(), scenario.tables()
    assert a.target.rows == b.target.rows and a.draft.rows == b.draft.rows
    assert a.target.rows != a.draft.rows
    assert all(row[0] > 0 for row in a.target.rows.values())  # EOS always possible


@pytest.mark.parametrize("sampling", [SamplingParams(repetition_penalty=2.0), SamplingParams(temperature=0.5,
                                      repetition_penalty=3.0, min_tokens=2)], ids=str)
def test_exact_penalties_agree_with_the_float_penalties(sampling):
    rng = random.Random(7)
    for emitted in range(4):
        row = random_row(4, rng, 12, zeros=True)
        context = [rng.randrange(4) for _ in range(3)]
        logits = torch.tensor([[math.log(x) if x else -math.inf for x in row]], dtype=torch.float64)
        weights = exact_penalised(row, sampling, context, emitted, {0})
        if not any(weights):
            continue  # min_tokens masked the only possible token: no distribution
        exact = exact_probabilities(weights, sampling)
        floats = probabilities(penalised(logits, sampling, context, [()], emitted, {0}), sampling)
        assert floats[0].tolist() == pytest.approx([float(x) for x in exact], abs=1e-12)


def test_a_penalty_that_ignores_the_drafts_before_a_row_is_caught(monkeypatch):
    """The negative control of the penalties: every row penalised after the round's context
    alone (not the drafts before it) changes the output law, and the audit sees it."""
    from verispec.drafts import Draft

    scenario = next(s for s in SCENARIOS if s.sampling.repetition_penalty != 1 and not s.sampling.greedy)
    assert audit_configuration(Configuration(scenario, DRAFT, "token")).passed
    monkeypatch.setattr(Draft, "row_prefixes", lambda draft: [()] * (len(draft) + 1))
    assert not audit_configuration(Configuration(scenario, DRAFT, "token")).passed
