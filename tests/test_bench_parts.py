"""The benchmark's parts without a model: method grammar, prompt files, rotation, the
identity diagnosis and the summary arithmetic."""

from __future__ import annotations

import json

import pytest
import torch

from verispec.identity import diagnose, first_mismatch
from verispec.bench.methods import HF_LOOKUP_TOKENS, PLAIN, Method, parse_method, parse_methods
from verispec.bench.protocol import engine_fields, rotated
from verispec.bench.report import (
    OVERALL,
    by_source,
    cost_model_section,
    fastest_plain_section,
    plans_section,
    quartiles,
    summarize,
)
from verispec.runner import emitted_per_round
from verispec.bench.workloads import (
    DATA_VARIABLE,
    HUMANEVAL,
    Workload,
    data_file,
    parse_row,
    read_workloads,
    select,
)
from verispec.stats import Stats


def test_method_grammar():
    assert parse_method("verispec-lookup-k4") == Method("verispec-lookup-k4", "verispec", "lookup", "k4", k=4)
    assert parse_method("verispec-layerskip:8:4096-auto").proposer == "layerskip:8:4096"
    draft = parse_method("verispec-draft:/models/small-llama-v2-heuristic")
    assert (draft.proposer, draft.policy, draft.k) == ("draft:/models/small-llama-v2", "heuristic", None)
    assert parse_method("hf-lookup").k == HF_LOOKUP_TOKENS
    assert parse_method("hf-lookup-k3").k == 3
    assert (parse_method("hf-early-exit:4").hf_arg, parse_method("hf-early-exit:4-k5").k) == ("4", 5)
    assert parse_method("hf-assisted:/m/draft-k2") == Method("hf-assisted:/m/draft-k2", "hf", hf_mode="assisted",
                                                              hf_arg="/m/draft", k=2)
    assert not parse_method(PLAIN).speculative and not parse_method("hf-generate").speculative
    assert parse_method("verispec-random-k1").speculative and parse_method("hf-lookup").speculative


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("verispec-lookup", "verispec-<proposer>-<kN|auto|heuristic|tree|tree:W1xW2x...>"),
        ("verispec-lookup-k0", "k must be an integer >= 1, got 0"),
        ("verispec-hydra-k4", "method 'verispec-hydra-k4': unknown proposer 'hydra'"),
        ("verispec-lookup:3-k4", "lookup takes no argument"),
        ("verispec-lookup-4", "not kN, auto, heuristic, tree or tree:W1xW2x..."),
        ("hf-lookup-4", "hf-lookup or hf-lookup-kN"),
        ("hf-early-exit", "layer L >= 1"),
        ("hf-early-exit:0", "layer L >= 1"),
        ("hf-assistedx", "unknown method"),
        ("medusa", "unknown method"),
    ],
)
def test_bad_method_names(name, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("|", r"\|")):
        parse_method(name)


def test_method_list_puts_plain_first_and_resolves_a_bare_assistant():
    methods = parse_methods("hf-assisted, verispec-draft:/d/x-k3 ,hf-generate")
    assert [m.name for m in methods] == [PLAIN, "hf-assisted", "verispec-draft:/d/x-k3", "hf-generate"]
    assert methods[1].hf_arg == "/d/x"
    with pytest.raises(ValueError, match="needs a draft model"):
        parse_methods("hf-assisted")
    with pytest.raises(ValueError, match="listed twice"):
        parse_methods("hf-generate,hf-generate")
    with pytest.raises(ValueError, match="no methods"):
        parse_methods(" , ")


def test_rotation_gives_every_method_every_position():
    names = ["a", "b", "c"]
    assert rotated(names, 1) == ["b", "c", "a"] and rotated(names, 4) == rotated(names, 1)
    positions = {name: {rotated(names, s).index(name) for s in range(3)} for name in names}
    assert all(p == {0, 1, 2} for p in positions.values())


def test_prompt_rows(tmp_path):
    spec = {"question_id": 7, "category": "qa", "turns": ["first?", "second?"]}
    assert parse_row(spec, "x") == Workload("7", "qa", "first?", chat=True)
    assert parse_row({"task_id": "HumanEval/3", "prompt": "def f():\n"}, "x") == Workload(
        "HumanEval/3", HUMANEVAL, "def f():\n", chat=False
    )
    for bad, message in [({"turns": []}, "non-empty list"), ({"turns": ["q"]}, "needs 'question_id'"),
                         ({"prompt": "p"}, "task_id"), ({"text": "t"}, "neither a Spec-Bench row")]:
        with pytest.raises(ValueError, match=message):
            parse_row(bad, "row")
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(spec) + "\n\n" + "{not json\n")
    with pytest.raises(ValueError, match=r"p.jsonl:3: not valid JSON"):
        read_workloads(path)
    with pytest.raises(FileNotFoundError):
        read_workloads(tmp_path / "absent.jsonl")


def test_data_files_lie_beside_the_repository_unless_the_variable_says(tmp_path, monkeypatch):
    repository = tmp_path / "verispec"
    monkeypatch.delenv(DATA_VARIABLE, raising=False)
    assert data_file("specbench_dev.jsonl", repository) == tmp_path / "shared" / "data" / "specbench_dev.jsonl"
    monkeypatch.setenv(DATA_VARIABLE, str(tmp_path / "elsewhere"))
    assert data_file("specbench_dev.jsonl", repository) == tmp_path / "elsewhere" / "specbench_dev.jsonl"


def test_select_keeps_file_order_per_category():
    rows = [Workload(str(i), c, "t", True) for i, c in enumerate(["a", "b", "a", "a", "b", "c"])]
    assert [w.id for w in select(rows, None, 2)] == ["0", "1", "2", "4", "5"]
    assert [w.id for w in select(rows, ["b", "c"], None)] == ["1", "4", "5"]
    with pytest.raises(ValueError, match=r"no prompts in categories \['z'\]"):
        select(rows, ["z"], None)
    with pytest.raises(ValueError, match="limit-per-category"):
        select(rows, None, 0)


def test_emitted_per_round_cuts_only_the_last_round():
    assert emitted_per_round([0, 3, 1], 7) == [1, 4, 2]
    assert emitted_per_round([2, 3], 4) == [3, 1]  # EOS was the first token of the second round
    assert emitted_per_round([], 0) == []


def test_first_mismatch():
    assert first_mismatch([1, 2, 3], [1, 2, 3]) is None
    assert first_mismatch([1, 2, 3], [1, 5, 3]) == 1
    assert first_mismatch([1, 2, 3], [1, 2]) == 2


def fake_score(last_row):
    """A target whose full forward ends in `last_row` (logits[V]) whatever the ids."""
    return lambda ids: torch.stack([torch.zeros_like(last_row)] * (len(ids) - 1) + [last_row])


def test_diagnosis_tells_a_near_tie_from_a_wrong_token():
    prompt, plain = [5, 6], [1, 2, 3]
    assert diagnose(prompt, plain, plain, fake_score(torch.zeros(4)), "float32") is None
    tie = diagnose(prompt, plain, [1, 2, 0], fake_score(torch.tensor([4.0, 0.0, 0.0, 4.001])), "float32")
    assert tie["position"] == 2 and (tie["expected"], tie["got"]) == (3, 0)
    assert tie["fresh_top2"] == [3, 0] and tie["top2_margin"] == pytest.approx(0.001, abs=1e-5)
    assert tie["near_tie"] and tie["diagnosis"].startswith("near tie")
    wrong = diagnose(prompt, plain, [1, 2, 0], fake_score(torch.tensor([1.0, 0.0, 2.0, 9.0])), "float32")
    assert not wrong["near_tie"] and "not a near tie" in wrong["diagnosis"]
    # the same margin is rounding in bfloat16
    assert diagnose(prompt, plain, [1, 2, 0], fake_score(torch.tensor([4.0, 0.0, 0.0, 4.2])), "bfloat16")["near_tie"]


def run_record(method, prompt, repeat, seconds, tokens=8, rounds=8, category="c"):
    return {"method": method, "prompt_id": prompt, "category": category, "repeat": repeat, "new_tokens": tokens,
            "wall_seconds": seconds, "tokens_per_second": tokens / seconds, "first_token_seconds": 0.1,
            "decode_tokens_per_second": None, "rounds": rounds, "engine": None, "peak_rss_mb": 1.0,
            "matches_plain": True, "mismatch": None, "peer": None}


def test_speedup_is_paired_per_repeat_then_median_and_quartiles_across_prompts():
    records = []
    # plain: 1 s on every run; "fast": per prompt, repeats take (0.5, 0.25, 1.0) s, i.e.
    # speedups 2, 4, 1 -> median 2 for prompt p0; prompt p1: 1 s -> 1; p2: 0.2 s -> 5.
    for prompt, times in [("p0", (0.5, 0.25, 1.0)), ("p1", (1.0,) * 3), ("p2", (0.2,) * 3)]:
        for repeat, seconds in enumerate(times):
            records.append(run_record(PLAIN, prompt, repeat, 1.0))
            records.append(run_record("fast", prompt, repeat, seconds, rounds=4))
    methods = parse_methods(PLAIN) + [Method("fast", "verispec", "lookup", "k4", k=4)]
    summary = summarize(records, methods, {"command": "x"})
    fast = summary["results"]["fast"]["overall"]
    assert (fast["speedup_q1"], fast["speedup_median"], fast["speedup_q3"]) == quartiles([2.0, 1.0, 5.0])
    assert fast["speedup_median"] == 2.0 and fast["speedup_q1"] == 1.5 and fast["speedup_q3"] == 3.5
    assert fast["tokens_per_round"] == 2.0 and fast["prompts"] == 3 and fast["runs"] == 9
    assert summary["results"][PLAIN]["c"]["speedup_median"] == 1.0


def engine(rounds: list[tuple[int, int, float]], seconds_per_draft: float = 0.0) -> dict:
    """A run's engine counters from its rounds, (drafted, accepted, target seconds) each."""
    stats = Stats()
    for drafted, accepted, seconds in rounds:
        stats.record(drafted, accepted, accepted + 1, draft_seconds=drafted * seconds_per_draft, target_seconds=seconds)
    return engine_fields(stats)


def test_the_cost_model_predicts_from_the_runs_own_acceptance_c_and_v():
    # plain: 0.1 s a forward, t(1). The draft method: rounds of k = 2, 2, 1 accepting 2, 0, 1,
    # so position 1 accepted 2 of 3 times and position 2 1 of 1: s = (2/3, 2/3), E(1) = 5/3,
    # E(2) = 7/3. c = 0.05 s / 0.1 s = 0.5; v(3) = 0.15 / 0.1 = 1.5, v(2) = 0.12 / 0.1 = 1.2.
    # Predicted: (7/3 + 7/3 + 5/3) / ((2 c + v(3)) 2 + c + v(2)) = (19/3) / 6.7.
    plain = run_record(PLAIN, "p0", 0, 0.8, tokens=8, rounds=8) | {"engine": engine([(0, 0, 0.1)] * 8)}
    fast = run_record("fast", "p0", 0, 0.5, tokens=6, rounds=3) | {
        "engine": engine([(2, 2, 0.15), (2, 0, 0.15), (1, 1, 0.12)], seconds_per_draft=0.05)}
    methods = parse_methods(PLAIN) + [Method("fast", "verispec", "draft:d", "k2", k=2)]
    summary = summarize([plain, fast, run_record("hf-generate", "p0", 0, 1.0)], methods + parse_methods("hf-generate")[1:], {})
    overall = summary["results"]["fast"][OVERALL]
    assert overall["position_acceptance"] == [2 / 3, 1.0]
    model = overall["cost_model"]
    assert model["step_seconds"] == pytest.approx(0.1) and model["c"] == pytest.approx(0.5)
    assert model["v"] == pytest.approx({2: 1.2, 3: 1.5})
    assert model["expected_tokens_per_round"] == pytest.approx(19 / 9)
    assert model["predicted_speedup"] == pytest.approx(19 / 3 / 6.7)
    assert summary["results"][PLAIN][OVERALL]["cost_model"] is None
    assert summary["results"]["hf-generate"][OVERALL]["cost_model"] is None
    lines = cost_model_section(summary, ["fast", "hf-generate"])
    assert "| fast | 0.67 1.00 | 0.500 | v(2) 1.20, v(3) 1.50 | 2.11 | 2.00 | 0.95x | 1.20x |" in lines
    assert not any("hf-generate" in line for line in lines)


def test_the_plans_section_lists_each_source_of_a_combined_proposer():
    runs = [
        {"copy": {"rounds": 3, "new_tokens": 9, "drafted": 8, "accepted": 6, "plans": {"chain k = 4": 2, "chain k = 2": 1}},
         "head": {"rounds": 4, "new_tokens": 4, "drafted": 0, "accepted": 0, "plans": {"plain step": 4}}},
        {"head": {"rounds": 2, "new_tokens": 3, "drafted": 2, "accepted": 1, "plans": {"chain k = 2": 1, "plain step": 1}}},
    ]
    merged = by_source(runs)
    assert merged["head"] == {"rounds": 6, "new_tokens": 7, "drafted": 2, "accepted": 1,
                              "plans": {"plain step": 5, "chain k = 2": 1}}
    summary = {"results": {"verispec-lookup+eagle-auto": {OVERALL: {
        "plans": {"plain step": 5, "chain k = 4": 2, "chain k = 2": 2}, "by_source": merged}}}}
    lines = plans_section(summary, ["verispec-lookup+eagle-auto"])
    assert any("copy rounds | 3 | 3.00 | chain k = 4 67%" in line for line in lines)
    assert any("head rounds | 6 | 1.17 | plain step 83%" in line for line in lines)


def test_plain_decoding_in_another_format_is_a_method_and_the_fastest_plain_a_second_baseline():
    assert parse_method("verispec-plain@bfloat16") == Method("verispec-plain@bfloat16", "verispec", dtype="bfloat16")
    with pytest.raises(ValueError, match="the format 'int8' is not float32, bfloat16, float16, q4"):
        parse_method("verispec-plain@int8")
    records = []
    # plain in the bench's format: 1 s; plain in q4: 0.5 s on p0 and 2 s on p1; "fast": 0.25 s
    for prompt, q4_seconds in [("p0", 0.5), ("p1", 2.0)]:
        records += [run_record(PLAIN, prompt, 0, 1.0), run_record("verispec-plain@q4", prompt, 0, q4_seconds),
                    run_record("fast", prompt, 0, 0.25)]
    methods = parse_methods(f"{PLAIN},verispec-plain@q4") + [Method("fast", "verispec", "lookup", "k4", k=4)]
    summary = summarize(records, methods, {})
    fast = summary["results"]["fast"][OVERALL]
    assert fast["speedup_median"] == 4.0  # over plain in the same format on both prompts
    # over the fastest plain format: q4's 16 tok/s on p0 (2x), the bench's own 8 tok/s on p1 (4x)
    assert (fast["over_fastest_plain_q1"], fast["over_fastest_plain_median"], fast["over_fastest_plain_q3"]) == (
        2.5, 3.0, 3.5)
    section = fastest_plain_section(summary)
    assert section[1] == "## Speedup over the fastest plain format"
    assert "(verispec-plain, verispec-plain@q4)" in section[3]
    assert section[-1] == "| overall | 0.75x (0.62-0.88) | 0.75x (0.62-0.88) | 3.00x (2.50-3.50) |"
    # only the bench's own format decoded plainly: no second baseline, no section
    alone = summarize([r for r in records if r["method"] != "verispec-plain@q4"], [methods[0], methods[2]], {})
    assert alone["results"]["fast"][OVERALL]["over_fastest_plain_median"] is None and fastest_plain_section(alone) == []
