"""`--dtype auto` and `--runtime auto` weigh each format's forward at the rows a step will score
(`models.loading.format_costs`), on injected curves: no timing is read here."""

from __future__ import annotations

import json

import pytest

from verispec.bench.methods import parse_methods
from verispec.bench.suite import expected_rows
from verispec.k_spec import parse_k
from verispec.models.loading import format_costs
from verispec.models.loading.format_costs import DEFAULTS, FormatCost, choose, hf_faster, step_rows
from verispec.models.runtime import Runtime
from verispec.models.weight_format import WeightFormat

Q4, BF16, FP32 = WeightFormat.Q4, WeightFormat.BFLOAT16, WeightFormat.FLOAT32


def curve(fmt, t1, v_at_8, runtime=Runtime.FAST):
    """A fake curve: t1 seconds for one row, linear to v(8) = v_at_8 and on beyond."""
    return FormatCost(runtime, fmt, t1, (1, 8), (1.0, v_at_8), "fake")


# q4: cheap for one row, cost growing with the rows (v(8) = 8); bfloat16: dearer, nearly flat.
STEEP_Q4, FLAT_BF16 = curve(Q4, 0.010, 8.0), curve(BF16, 0.020, 1.7)


def test_the_cheaper_forward_at_the_expected_rows_wins() -> None:
    # q4 costs 0.010 (1 + (n - 1)) = 0.010 n, bfloat16 0.020 (1 + 0.1 (n - 1)): equal at n = 2.25
    for rows, fmt in [(1, Q4), (2, Q4), (3, BF16), (64, BF16)]:
        choice = choose((Q4, BF16), rows, (STEEP_Q4, FLAT_BF16))
        assert choice.chosen.weight_format == fmt and choice.measured and choice.rows == rows
        assert [c.weight_format for c in choice.candidates] == [Q4, BF16]
    assert choose((Q4, BF16), 2, (STEEP_Q4, FLAT_BF16)).chosen.seconds(2) == pytest.approx(0.020)
    tie = curve(BF16, 0.010, 8.0)
    assert choose((Q4, BF16), 5, (STEEP_Q4, tie)).chosen is STEEP_Q4  # a tie goes to the earlier format


def test_the_reason_names_the_rows_each_cost_and_where_the_curves_come_from() -> None:
    choice = choose((Q4, BF16), 8, (STEEP_Q4, FLAT_BF16))
    assert choice.why() == ("at 8 row(s) per step a forward costs 34.00 ms in bfloat16 on the fast runtime "
                            "against 80.00 ms in q4 on the fast runtime, measured on this machine")
    shown = json.loads(json.dumps(choice.to_dict()))
    assert shown["rows"] == 8 and shown["measured"] is True
    assert [(c["format"], c["step_seconds"], c["row_seconds"]) for c in shown["candidates"]] == [
        ("q4", pytest.approx(0.080), pytest.approx(0.010)), ("bfloat16", pytest.approx(0.034), pytest.approx(0.00425))]


def test_measured_and_default_curves_are_never_mixed() -> None:
    only_q4 = choose((Q4, BF16), 1, (curve(Q4, 1.0, 8.0),))  # bfloat16 unmeasured: the defaults for both
    assert not only_q4.measured and set(only_q4.candidates) == set(DEFAULTS)
    assert "documented curves" in only_q4.why()
    nothing = choose((Q4, BF16), 1, ())
    assert not nothing.measured and nothing.chosen.weight_format == Q4  # the defaults: q4 for one request
    assert choose((Q4, BF16), 24, ()).chosen.weight_format == BF16  # and bfloat16 for 8 requests at k = 2
    with pytest.raises(ValueError, match="no cost curve for float32"):
        choose((FP32,), 1, ())
    with pytest.raises(ValueError, match="rows per step must be an integer >= 1, got 0"):
        choose((Q4, BF16), 0, ())


def test_a_format_costs_its_cheapest_runtime_and_transformers_wins_only_where_faster() -> None:
    slow_fast, quick_hf = curve(BF16, 0.030, 1.0), curve(BF16, 0.025, 1.0, runtime=Runtime.HF)
    assert hf_faster(BF16, 4, (slow_fast, quick_hf)) == (quick_hf, slow_fast)
    assert hf_faster(BF16, 4, (curve(BF16, 0.020, 1.0), quick_hf)) is None
    assert hf_faster(BF16, 4, (quick_hf,)) is None  # the fast runtime unmeasured: nothing to compare
    assert hf_faster(Q4, 4, (slow_fast, quick_hf)) is None
    both = (STEEP_Q4, slow_fast, quick_hf)
    assert choose((Q4, BF16), 8, both, runtimes=(Runtime.FAST, Runtime.HF)).chosen is quick_hf
    assert choose((Q4, BF16), 8, both).chosen is slow_fast  # transformers not offered: the fast runtime's cost


@pytest.mark.parametrize("t1, rows, v, says", [
    (0.0, (1, 2), (1.0, 1.2), "t\\(1\\) must be a finite number of seconds > 0"),
    (float("nan"), (1, 2), (1.0, 1.2), "t\\(1\\) must be"),
    (0.01, (2, 4), (1.0, 1.2), "starting at 1 row"),
    (0.01, (1, 2), (1.0, -1.0), "must be > 0"),
])
def test_a_curve_that_is_no_curve_is_refused(t1, rows, v, says) -> None:
    with pytest.raises(ValueError, match=says):
        FormatCost(Runtime.FAST, Q4, t1, rows, v, "fake")


def test_the_rows_a_step_scores() -> None:
    assert step_rows(1, None) == 1 and step_rows(8, None) == 8  # plain decoding
    assert step_rows(1, parse_k("4")) == 5 and step_rows(8, parse_k("4")) == 40
    assert step_rows(1, parse_k("auto")) == 1 + format_costs.AUTO_DRAFTED
    assert step_rows(2, parse_k("tree:2x2")) == 2 * (1 + 2 + 4)
    with pytest.raises(ValueError, match="requests in flight must be an integer >= 1"):
        step_rows(0, None)
    methods = parse_methods("verispec-plain,verispec-lookup-k4,hf-generate")
    assert expected_rows(methods, (1, 4)) == 20  # the heaviest verispec method at the highest level
    assert expected_rows(parse_methods("hf-generate"), (1, 4)) == 4


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


@pytest.mark.parametrize("command, options, rows", [
    ("serve", [], 8 * (1 + format_costs.AUTO_DRAFTED)),  # 8 slots, k auto
    ("serve", ["--proposer", "none", "--max-slots", "4"], 4),
    ("serve", ["--proposer", "lookup", "--k", "3", "--max-slots", "2"], 8),
    ("generate", ["--proposer", "lookup", "--k", "4", "hi"], 5),
    ("generate", ["--proposer", "lookup", "hi"], 1 + format_costs.AUTO_DRAFTED),
    ("demo", ["--proposer", "lookup", "--k", "2"], 3),
])
def test_the_commands_plan_at_the_rows_their_steps_score(monkeypatch, capsys, command, options, rows) -> None:
    from verispec.cli import main
    from verispec.models.loading import load, load_plan

    asked = []

    def refuse(*args, **kwargs):
        asked.append(kwargs["rows"])
        raise ValueError("planned")

    monkeypatch.setattr(load_plan, "plan_load", refuse)
    monkeypatch.setattr(load, "load_model", refuse)
    assert main([command, *options]) == 2
    assert asked == [rows] and "error: planned" in capsys.readouterr().err


def test_bench_plans_at_its_highest_level_and_heaviest_method(tmp_path, monkeypatch, capsys) -> None:
    from verispec.bench import suite
    from verispec.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["Name three primary colours."]}) + "\n")
    asked = []

    def refuse(*args, **kwargs):
        asked.append(kwargs["rows"])
        raise ValueError("planned")

    monkeypatch.setattr(suite, "load_model", refuse)
    argv = ["bench", "--out", str(tmp_path / "out"), "--prompts", str(prompts), "--concurrency", "1,4",
            "--methods", "verispec-plain,verispec-lookup-k2"]
    assert main(argv) == 2
    assert asked == [4 * 3] and "error: planned" in capsys.readouterr().err
