"""vLLM as a benchmark peer, without vLLM: method names, the speculative_config each becomes,
the rounds read from its proposer's drafts, and the runner's pipe to a stand-in worker."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verispec.bench.methods import parse_method
from verispec.bench.vllm import VllmRunner, parse, require, speculative_config
from verispec.bench.vllm_worker import rounds
from verispec.models.load import LoadedModel
from verispec.sampling import GREEDY, SamplingParams


def test_method_names_parse_into_vllm_methods():
    assert parse_method("vllm-plain").family == "vllm" and parse_method("vllm-plain").proposer is None
    ngram = parse_method("vllm-ngram-k5")
    assert (ngram.proposer, ngram.k, ngram.speculative) == ("ngram", 5, True)
    assert parse_method("vllm-ngram").k == 4
    eagle3 = parse_method("vllm-eagle3:out/my-head-k2")  # the policy splits at the last '-'
    assert (eagle3.proposer, eagle3.k) == ("eagle3:out/my-head", 2)
    assert parse_method("vllm-medusa:out/m").proposer == "medusa:out/m"
    for bad, message in (("vllm-lookup", "write vllm-plain"), ("vllm-eagle3", "write vllm-plain"),
                         ("vllm-medusa:m-k3", "drafts its own K tokens")):
        with pytest.raises(ValueError, match=message):
            parse_method(bad)


def test_each_method_becomes_vllms_speculative_config(tmp_path):
    (tmp_path / "e3").mkdir()
    (tmp_path / "e3" / "config.json").write_text("{}")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"num_heads": 4}))
    assert speculative_config(parse("vllm-plain")) is None
    assert speculative_config(parse("vllm-ngram-k3")) == {"method": "ngram", "num_speculative_tokens": 3,
                                                          "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    assert speculative_config(parse(f"vllm-eagle3:{tmp_path / 'e3'}")) == {
        "method": "eagle3", "model": str((tmp_path / "e3").resolve()), "num_speculative_tokens": 3}
    assert speculative_config(parse(f"vllm-medusa:{tmp_path / 'm'}"))["num_speculative_tokens"] == 4
    with pytest.raises(ValueError, match="has no config.json; export a head there"):
        speculative_config(parse(f"vllm-eagle3:{tmp_path / 'nowhere'}"))


def test_rounds_follow_the_drafts_along_the_greedy_output():
    output = [10, 11, 12, 13, 14, 15]
    assert rounds(output, []) == [1] * 6  # plain decoding
    assert rounds(output, [[11, 12, 13], [9, 9, 9], [15, 16, 17]]) == [1, 4, 1]  # a cut last round
    assert sum(rounds(output, [[11, 9, 9], [13, 14, 9], [9, 9, 9]])) == len(output)
    assert rounds([], [[1, 2, 3]]) == []


def test_vllm_methods_are_refused_without_the_venv_or_when_sampling(tmp_path):
    require([], SamplingParams(), tmp_path / "nowhere")
    with pytest.raises(ValueError, match="run `make vllm-env`"):
        require(["vllm-plain"], GREEDY, tmp_path / "nowhere")
    python = Path(sys.executable)
    with pytest.raises(ValueError, match="decode greedily only"):
        require(["vllm-plain"], SamplingParams(), python)


STAND_IN = """
import json, sys
config = json.loads(sys.stdin.readline())
print(json.dumps({"ready": True, "vllm": "stand-in", "patches": [], "config": config}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    tokens = [t + 1 for t in request["prompt"][-1:]] * request["max_tokens"]
    drafts = [[tokens[0]] * 3, [9, 9, 9]] if config["speculative_config"] else []
    print(json.dumps({"tokens": tokens, "drafts": drafts, "seconds": 0.0, "stop": request["stop"]}), flush=True)
"""


def test_the_runner_talks_to_its_worker_over_json_lines(tmp_path):
    checkpoint = tmp_path / "model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    target = LoadedModel(name="tiny", lm=None, model=None, tokenizer=None, eos_token_ids=(2,), dtype=torch.float32,
                         source=checkpoint)
    script = tmp_path / "worker.py"
    script.write_text(STAND_IN)

    def spawn(command, **kwargs):
        return subprocess.Popen([sys.executable, str(script)], **kwargs)

    runner = VllmRunner(parse("vllm-ngram-k3"), target, spawn=spawn)
    seen = []
    outcome = runner([5, 6, 7], 5, on_token=seen.append)
    assert outcome.tokens == seen == [8] * 5 and outcome.peer.startswith("vLLM stand-in")
    assert outcome.tokens_per_round == [1, 4] and sum(outcome.tokens_per_round) == 5
    runner.close()
    assert runner.process.returncode == 0
    plain = VllmRunner(parse("vllm-plain"), target, spawn=spawn)
    assert plain([1], 3).tokens_per_round == [1, 1, 1]
    plain.close()
