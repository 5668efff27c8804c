"""`--dtype auto` and `--runtime auto` weigh each format by the tokens per second the cost model
expects of it under a workload (`models.loading.format_costs`), on injected curves: no timing
is read here."""

from __future__ import annotations

import json

import pytest

from verispec.bench.suite import expected
from verispec.cost import PRIOR_RATE, expected_tokens
from verispec.k_spec import parse_k
from verispec.models import DEFAULT_MODEL
from verispec.models.loading import format_costs
from verispec.models.loading.format_costs import (
    DEFAULTS,
    PLAIN,
    Drafting,
    FormatCost,
    Workload,
    choose,
    hf_faster,
    scored_rows,
    tokens_per_round,
)
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat
from verispec.registry import parse_spec
from verispec.runner import workload

Q4, BF16, FP32 = WeightFormat.Q4, WeightFormat.BFLOAT16, WeightFormat.FLOAT32


def curve(fmt, t1, v_at_8, runtime=Runtime.FAST):
    """A fake curve: t1 seconds for one row, linear to v(8) = v_at_8 and on beyond."""
    return FormatCost(runtime, fmt, t1, (1, 8), (1.0, v_at_8), "fake")


# q4: cheap for one row, v(n) = n (every row costs another forward); bfloat16: dearer, nearly
# flat (v(n) = 1 + 0.05 (n - 1)).
STEEP_Q4, FLAT_BF16 = curve(Q4, 0.010, 8.0), curve(BF16, 0.012, 1.35)
CURVES = (STEEP_Q4, FLAT_BF16)


def drafting(k="auto", acceptance=0.8, draft=0.0):
    return Workload(1, Drafting("fake", parse_k(k), acceptance, draft))


def test_plain_decoding_of_one_request_takes_the_cheapest_one_row_forward() -> None:
    choice = choose((Q4, BF16), CURVES)
    assert choice.chosen.cost is STEEP_Q4 and choice.measured and choice.workload == PLAIN
    assert [(c.cost.weight_format, c.k) for c in choice.candidates] == [(Q4, "k = 0"), (BF16, "k = 0")]
    assert [c.tokens_per_s for c in choice.candidates] == [pytest.approx(100.0), pytest.approx(1 / 0.012)]
    # a proposer whose drafts are seldom accepted: no k pays, so both decode plainly and q4 still wins
    rare = choose((Q4, BF16), CURVES, workload=drafting(acceptance=0.1))
    assert rare.chosen.cost is STEEP_Q4 and [c.k for c in rare.candidates] == ["k = 0", "k = 0"]
    tie = curve(BF16, 0.010, 8.0)
    assert choose((Q4, BF16), (STEEP_Q4, tie)).chosen.cost is STEEP_Q4  # a tie goes to the earlier format


def test_bfloat16_wins_speculative_decoding_where_q4_wins_plain() -> None:
    # q4's v(n) = n: no k pays there (E(k) < k + 1), so at k auto it decodes plainly, 100 tok/s;
    # bfloat16's flat curve lets k = 8 pay: E(0.8, 8) / (0.012 v(9)) = 4.33 / 0.0168 = 257.7 tok/s
    choice = choose((Q4, BF16), CURVES, workload=drafting("auto"))
    q4, bf16 = choice.candidates
    assert choice.chosen is bf16 and (q4.k, bf16.k) == ("k = 0", "k = 8")
    assert q4.tokens_per_s == pytest.approx(100.0)
    assert bf16.tokens_per_s == pytest.approx(expected_tokens(0.8, 8) / (0.012 * 1.4))
    assert bf16.plain_tokens_per_s == pytest.approx(1 / 0.012)
    # a constant k is taken as given, even where it loses to plain decoding (q4 at k = 2: 2.44 / 0.03)
    fixed = choose((Q4, BF16), CURVES, workload=drafting("2"))
    assert [c.k for c in fixed.candidates] == ["k = 2", "k = 2"] and fixed.chosen.cost is FLAT_BF16
    assert fixed.candidates[0].tokens_per_s == pytest.approx(expected_tokens(0.8, 2) / 0.030)


def test_a_drafted_token_costs_its_share_of_the_fastest_one_row_forward_beside_every_format() -> None:
    # draft 0.1 of q4's 10 ms: 1 ms a drafted token, beside bfloat16 too (a head drafts in its own format)
    choice = choose((Q4, BF16), CURVES, workload=drafting("2", draft=0.1))
    assert choice.draft_seconds == pytest.approx(0.001)
    assert choice.candidates[1].tokens_per_s == pytest.approx(expected_tokens(0.8, 2) / (2 * 0.001 + 0.012 * 1.1))
    assert choice.candidates[0].tokens_per_s == pytest.approx(expected_tokens(0.8, 2) / (2 * 0.001 + 0.010 * 3))
    # dear drafts: auto keeps to plain decoding in both, and the cheaper one-row forward wins again
    dear = choose((Q4, BF16), CURVES, workload=drafting("auto", draft=2.0))
    assert dear.chosen.cost is STEEP_Q4 and [c.k for c in dear.candidates] == ["k = 0", "k = 0"]


def test_auto_drafts_only_where_a_k_beats_plain_decoding_by_autoks_margin() -> None:
    # one draft of acceptance a on a flat curve: (1 + a) / v(2) against 1; v(2) = 1.5 makes a = 0.55
    # gain 3% (under the 5% margin: plain) and a = 0.65 gain 10% (k = 1)
    flat_then_dear = FormatCost(Runtime.FAST, BF16, 0.010, (1, 2, 3), (1.0, 1.5, 3.0), "fake")
    near = choose((BF16,), (flat_then_dear,), workload=drafting(acceptance=0.55))
    assert near.chosen.k == "k = 0" and near.chosen.tokens_per_s == pytest.approx(100.0)
    assert choose((BF16,), (flat_then_dear,), workload=drafting(acceptance=0.65)).chosen.k == "k = 1"


def test_requests_in_flight_share_each_forward_and_draft_one_after_another() -> None:
    eight = choose((Q4, BF16), CURVES, workload=Workload(8))  # plain: 8 rows a forward
    assert [c.tokens_per_s for c in eight.candidates] == [pytest.approx(8 / 0.080), pytest.approx(8 / (0.012 * 1.35))]
    assert eight.chosen.cost is FLAT_BF16
    busy = choose((Q4, BF16), CURVES, workload=Workload(8, Drafting("fake", parse_k("2"), 0.8, 0.1)))
    e = expected_tokens(0.8, 2)
    assert busy.candidates[1].tokens_per_s == pytest.approx(8 * e / (8 * 2 * 0.001 + 0.012 * (1 + 0.05 * 23)))


def test_a_tree_emits_what_its_levels_hold_and_scores_every_node() -> None:
    assert tokens_per_round((1, 1, 1), 0.6) == pytest.approx(expected_tokens(0.6, 3))
    assert tokens_per_round((2, 2), 0.5) == pytest.approx(1 + 0.75 + 0.75**2)
    assert scored_rows(()) == 1 and scored_rows((1, 1, 1)) == 4 and scored_rows((2, 2)) == 7
    tree = choose((BF16,), (FLAT_BF16,), workload=drafting("tree:2x2", acceptance=0.5))
    assert tree.chosen.k == "tree 2x2"
    assert tree.chosen.tokens_per_s == pytest.approx((1 + 0.75 + 0.75**2) / (0.012 * 1.3))


def test_the_reason_names_each_candidates_expectation_and_where_the_curves_come_from() -> None:
    choice = choose((Q4, BF16), CURVES, workload=drafting("4", acceptance=0.5, draft=0.0))
    assert choice.why().startswith("bfloat16 on the fast runtime is expected to decode 134.5 tok/s at k = 4 against "
                                   "38.8 in q4 on the fast runtime at k = 4 (for fake at k 4, 1 request in flight;")
    assert choice.why().endswith("measured on this machine")
    shown = json.loads(json.dumps(choice.to_dict()))
    assert shown["workload"] == {"slots": 1, "proposer": "fake", "k": "4", "acceptance": 0.5, "draft": 0.0, "note": ""}
    assert [(c["format"], c["k"], round(c["tokens_per_s"], 1), c["t1"]) for c in shown["candidates"]] == [
        ("q4", "k = 4", 38.8, 0.010), ("bfloat16", "k = 4", 134.5, 0.012)]


def test_measured_and_default_curves_are_never_mixed() -> None:
    only_q4 = choose((Q4, BF16), (curve(Q4, 1.0, 8.0),))  # bfloat16 unmeasured: the defaults for both
    assert not only_q4.measured and {c.cost for c in only_q4.candidates} == set(DEFAULTS)
    assert "documented curves" in only_q4.why()
    assert choose((Q4, BF16), ()).chosen.cost.weight_format == Q4  # the defaults: q4 for plain decoding
    server = Workload(8, Drafting("lookup", parse_k("2")))
    assert choose((Q4, BF16), (), workload=server).chosen.cost.weight_format == BF16  # bfloat16 for 8 requests
    with pytest.raises(ValueError, match="no cost curve for float32"):
        choose((FP32,), ())


def test_transformers_wins_only_where_it_is_expected_to_decode_faster() -> None:
    slow_fast, quick_hf = curve(BF16, 0.030, 1.0), curve(BF16, 0.025, 1.0, runtime=Runtime.HF)
    hf, fast = hf_faster(BF16, (slow_fast, quick_hf))
    assert (hf.cost, fast.cost) == (quick_hf, slow_fast)
    assert hf_faster(BF16, (curve(BF16, 0.020, 1.0), quick_hf)) is None
    assert hf_faster(BF16, (quick_hf,)) is None  # the fast runtime unmeasured: nothing to compare
    assert hf_faster(Q4, (slow_fast, quick_hf)) is None
    both = (STEEP_Q4, slow_fast, quick_hf)
    assert choose((Q4, BF16), both, (Runtime.FAST, Runtime.HF), Workload(8)).chosen.cost is quick_hf
    assert choose((Q4, BF16), both, workload=Workload(8)).chosen.cost is slow_fast  # transformers not offered


@pytest.mark.parametrize("acceptance, draft, says", [
    (1.5, 0.0, "alpha \\(per-token acceptance\\) must be a number in \\[0, 1\\]"),
    (0.5, -0.1, "c \\(draft step / target step\\) must be a finite number >= 0"),
])
def test_a_drafting_that_is_no_drafting_is_refused(acceptance, draft, says) -> None:
    with pytest.raises(ValueError, match=says):
        Drafting("fake", parse_k("2"), acceptance, draft)
    with pytest.raises(ValueError, match="requests in flight must be an integer >= 1"):
        Workload(0)


def test_a_proposers_workload_comes_from_autoks_prior_and_its_kinds_draft_cost() -> None:
    head = workload(parse_spec("lookup+eagle"), parse_k("auto"))
    assert head.drafting == Drafting("lookup+eagle", parse_k("auto"), PRIOR_RATE, 0.035) and head.slots == 1
    assert "expected acceptance 0.50 per drafted token (AutoK's prior)" in head.describe()
    assert workload(parse_spec("lookup"), parse_k("3"), 4).drafting.draft == 0.0
    assert workload(None, 0, 8) == Workload(8) and workload(parse_spec("lookup"), 0) == PLAIN
    unknown = workload(parse_spec("random"), parse_k("2"))
    assert unknown.drafting is None and "no draft cost is known for random" in unknown.note
    # the bench weighs what generate weighs, at its highest concurrency level
    assert expected(DEFAULT_MODEL, (1, 4)) == workload(parse_spec("lookup+eagle"), parse_k("auto"), 4)


@pytest.mark.parametrize("t1, rows, v, says", [
    (0.0, (1, 2), (1.0, 1.2), "t\\(1\\) must be a finite number of seconds > 0"),
    (float("nan"), (1, 2), (1.0, 1.2), "t\\(1\\) must be"),
    (0.01, (2, 4), (1.0, 1.2), "starting at 1 row"),
    (0.01, (1, 2), (1.0, -1.0), "must be > 0"),
])
def test_a_curve_that_is_no_curve_is_refused(t1, rows, v, says) -> None:
    with pytest.raises(ValueError, match=says):
        FormatCost(Runtime.FAST, Q4, t1, rows, v, "fake")


def test_measured_curves_are_kept_per_file_cpu_and_threads(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    assert format_costs.measured(model, "cpu A", 2) == ()
    path = format_costs.record(model, STEEP_Q4, "cpu A", 2)
    format_costs.record(model, FLAT_BF16, "cpu A", 2)
    format_costs.record(model, curve(Q4, 0.5, 2.0), "cpu B", 2)
    assert path.parent == tmp_path / "cache" / "costs"
    assert format_costs.measured(model, "cpu A", 2) == (STEEP_Q4, FLAT_BF16)
    assert format_costs.measured(model, "cpu A", 1) == ()  # another thread count: another machine
    again = curve(Q4, 0.011, 7.0)
    format_costs.record(model, again, "cpu A", 2)  # a new measurement replaces the old one
    assert format_costs.measured(model, "cpu A", 2) == (FLAT_BF16, again)
    model.write_bytes(b"GGUF, changed")  # a changed file gets a new key: stale timings are not read
    assert format_costs.measured(model, "cpu A", 2) == ()
    format_costs.costs_file(model).parent.mkdir(parents=True, exist_ok=True)
    format_costs.costs_file(model).write_text("{not json")
    assert format_costs.measured(model, "cpu A", 2) == ()  # unreadable: as if nothing was measured


@pytest.mark.parametrize("command, options, slots, proposer, k", [
    ("serve", [], 1, "lookup+eagle", "auto"),  # a server weighs one request, as generate does
    ("serve", ["--concurrency", "8"], 8, "lookup+eagle", "auto"),  # unless told how many to expect
    ("serve", ["--proposer", "none", "--max-slots", "4"], 1, None, None),
    ("serve", ["--proposer", "lookup", "--k", "3", "--max-slots", "2"], 1, "lookup", "3"),
    ("generate", ["--proposer", "lookup", "--k", "3", "hi"], 1, "lookup", "3"),
    ("generate", ["hi"], 1, "lookup+eagle", "auto"),
    ("demo", ["--proposer", "lookup", "--k", "2"], 1, "lookup", "2"),
    ("load-plan", [], 1, "lookup+eagle", "auto"),
    ("load-plan", ["--proposer", "none", "--concurrency", "4"], 4, None, None),
])
def test_the_commands_plan_for_the_workload_they_expect(monkeypatch, capsys, command, options, slots, proposer, k) -> None:
    from verispec.cli import main
    from verispec.models.loading import load_plan

    asked = []

    def refuse(*args, **kwargs):
        asked.append(kwargs["workload"])
        raise ValueError("planned")

    monkeypatch.setattr(load_plan, "plan_load", refuse)
    assert main([command, *options]) == 2
    assert "error: planned" in capsys.readouterr().err
    drafting = None if proposer is None else Drafting(proposer, parse_k(k), PRIOR_RATE, 0.0 if proposer == "lookup" else 0.035)
    assert asked == [Workload(slots, drafting)]


def test_generate_and_serve_plan_the_same_target_for_the_same_model(monkeypatch, capsys) -> None:
    """Both plan through `runner.load_plan` with one request expected, so the plan (and so the
    target: q4 or bfloat16) is the same on any machine and any curves."""
    from verispec.cli import main
    from verispec.models.loading import load_plan

    asked = {}

    def refuse(*args, **kwargs):
        asked.setdefault(args, []).append(kwargs)
        raise ValueError("planned")

    monkeypatch.setattr(load_plan, "plan_load", refuse)
    assert main(["generate", "hi"]) == 2 and main(["serve", "--max-slots", "8"]) == 2
    (calls,) = asked.values()
    assert len(calls) == 2 and calls[0] == calls[1]
