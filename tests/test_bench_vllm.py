"""vLLM as a benchmark peer, without vLLM: method names, the speculative_config each becomes,
the rounds read from its proposer's drafts, the runner's pipe to a stand-in worker, and the
concurrency sweep's closed loop on a stand-in engine; with vLLM's venv, one closed loop of 4
on vLLM's CPU build (slow: its engine starts in minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verispec import generate
from verispec.bench.methods import parse_method
from verispec.bench.methods import vllm_method as parse
from verispec.peers.vllm import VENV_PYTHON, VllmRunner, require, speculative_config
from verispec.peers.vllm_worker import rounds
from verispec.models.loading.load import LoadedModel
from verispec.sampling import GREEDY, SamplingParams


def test_method_names_parse_into_vllm_methods():
    assert parse_method("vllm-plain").family == "vllm" and parse_method("vllm-plain").proposer is None
    ngram = parse_method("vllm-ngram-k5")
    assert (ngram.proposer, ngram.k, ngram.speculative) == ("ngram", 5, True)
    assert parse_method("vllm-ngram").k == 4
    eagle3 = parse_method("vllm-eagle3:out/my-head-k2")  # the policy splits at the last '-'
    assert (eagle3.proposer, eagle3.k) == ("eagle3:out/my-head", 2)
    assert parse_method("vllm-medusa:out/m").proposer == "medusa:out/m"
    schedule = parse_method("vllm-config:runs/vllm-lookup.json")  # the file's own k per batch size
    assert (schedule.proposer, schedule.k) == ("config:runs/vllm-lookup.json", None)
    assert parse_method("vllm-config:runs/my-lookup.json-k3").k == 3
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


def test_a_profiled_config_runs_as_written_or_at_a_fixed_k(tmp_path):
    schedule = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3, "num_speculative_tokens": 3,
                "num_speculative_tokens_per_batch_size": [[1, 3, 3], [4, 7, 2], [8, 64, 0]]}
    written = tmp_path / "vllm-lookup.json"
    written.write_text(json.dumps({"speculative_config": schedule, "verispec": {"k_per_batch_size": {"1": 3}}}))
    assert speculative_config(parse(f"vllm-config:{written}")) == schedule
    fixed = {key: value for key, value in schedule.items() if key != "num_speculative_tokens_per_batch_size"}
    assert speculative_config(parse(f"vllm-config:{written}-k2")) == fixed | {"num_speculative_tokens": 2}
    off = tmp_path / "off.json"
    off.write_text(json.dumps({"speculative_config": None, "verispec": {}}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"method": "ngram"}))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    for path, message in ((off, "serve without speculation"), (other, "has no speculative_config"),
                          (broken, "cannot read"), (tmp_path / "missing.json", "cannot read")):
        with pytest.raises(ValueError, match=message):
            speculative_config(parse(f"vllm-config:{path}"))


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
    started = []
    with pytest.raises(ValueError, match="cannot read"):  # refused before any worker starts
        VllmRunner(parse(f"vllm-config:{tmp_path / 'missing.json'}"), target, spawn=lambda *a, **k: started.append(a))
    assert started == []
    plain.close()


BATCH_STAND_IN = """
import json, sys
config = json.loads(sys.stdin.readline())
print(json.dumps({"ready": True, "vllm": "stand-in", "patches": [], "config": config}), flush=True)
flight = {}  # key -> [next token, left]
for line in sys.stdin:
    message = json.loads(line)
    if "add" in message:
        assert len(flight) < config["max_num_seqs"]
        flight[message["add"]] = [message["prompt"][-1] + 1, message["max_tokens"], True]
        continue
    outputs, verified = [], []
    for key, state in list(flight.items()):
        first = state[2]
        n = 1 if first else min(3, state[1])  # the prefill emits one token; each later step up to 3
        if not first:
            verified.append([key, 2, 2])
        tokens = list(range(state[0], state[0] + n))
        state[0], state[1], state[2] = state[0] + n, state[1] - n, False
        outputs.append({"key": key, "tokens": tokens, "finished": state[1] == 0})
        if state[1] == 0:
            del flight[key]
    print(json.dumps({"outputs": outputs, "verified": verified}), flush=True)
"""


@pytest.fixture
def batch_target(tmp_path):
    checkpoint = tmp_path / "model"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    script = tmp_path / "worker.py"
    script.write_text(BATCH_STAND_IN)
    target = LoadedModel(name="tiny", lm=None, model=None, tokenizer=None, eos_token_ids=(2,), dtype=torch.float32,
                         source=checkpoint)

    def spawn(command, **kwargs):
        return subprocess.Popen([sys.executable, str(script)], **kwargs)

    return target, spawn


def test_the_batch_server_keeps_c_requests_in_flight_on_vllms_engine(batch_target):
    from verispec.bench.closed_loop import closed_loop
    from verispec.peers.vllm import VllmBatchServer

    target, spawn = batch_target
    runner = VllmRunner(parse("vllm-ngram-k2"), target, max_num_seqs=4, spawn=spawn)
    ticks = iter(range(1000))
    server = VllmBatchServer(runner, 3, clock=lambda: float(next(ticks)))
    prompts = [[10 * i] for i in range(1, 8)]
    loop = closed_loop(server, prompts, 3, 6)
    assert loop.most_in_flight == 3 and sorted(s.key for s in loop.served) == list(range(7))
    for s in loop.served:
        assert s.tokens == list(range(prompts[s.key][0] + 1, prompts[s.key][0] + 7))  # each request its own tokens
        assert s.submitted < s.first_token < s.finished and s.ttft > 0 and s.tpot > 0
        # the prefill's token, then 3 + 2: vLLM's counters say 2 drafts verified and accepted each step
        assert s.stats.drafted == [0, 2, 2] and s.stats.accepted == [0, 2, 2] and s.stats.new_tokens == 6
        assert dict(s.stats.plans) == {"plain step": 1, "chain k = 2": 2} and s.peer.startswith("vLLM stand-in")
    assert server.in_flight == 0
    with pytest.raises(ValueError, match="batches at most 4"):
        VllmBatchServer(runner, 5)
    runner.close()
    assert runner.process.returncode == 0


def test_the_sweep_serves_vllm_methods_at_every_level(batch_target, monkeypatch):
    from verispec.peers import vllm
    from verispec.bench.protocol import Protocol
    from verispec.bench.sweep import Servers, check_methods, run_sweep
    from verispec.bench.workloads import Workload

    target, spawn = batch_target
    method = parse("vllm-ngram-k2")
    check_methods([method], (1, 4, 8))  # vLLM batches: no refusal above 1
    servers = Servers(target, GREEDY, 0, 64, None, 4)
    made = []

    def runner(method, target, **options):
        made.append(options)
        return VllmRunner(method, target, spawn=spawn, **options)

    monkeypatch.setattr(vllm, "VllmRunner", runner)
    workloads = [(Workload(f"p{i}", "cat", f"prompt {i}", False), [10 * i]) for i in range(1, 6)]
    try:
        requests, loops = run_sweep(servers.get, [method], workloads, (1, 4), Protocol(4, 1, 0))
    finally:
        servers.close()
    assert made == [{"max_model_len": 2048, "max_num_seqs": 4}]  # one engine for both levels
    # 4 tokens: the prefill's, then 3 (2 drafts accepted): 2 rounds
    assert {(r["rounds"], r["drafted"], r["accepted"], r["new_tokens"]) for r in requests} == {(2, 2, 2, 4)}
    assert [(loop["concurrency"], loop["most_in_flight"], loop["requests"]) for loop in loops] == [(1, 1, 5), (4, 4, 5)]
    assert all(r["peer"].startswith("vLLM stand-in") for r in requests)
    assert all(engine.process.returncode == 0 for engine in servers.engines.values())


@pytest.mark.slow
@pytest.mark.skipif(not VENV_PYTHON.is_file(), reason="vLLM's CPU build is not installed: make vllm-env")
def test_vllm_serves_a_closed_loop_of_four_with_its_own_batching():
    """vLLM's CPU build on the default model in float32 (its engine starts in a minute or
    more): 6 requests, 4 in flight, ngram drafts. Each request's output is what the same engine
    decodes for it alone (batching changes nothing in it) and verispec's plain greedy decoding
    of the same float32 weights, and vLLM's counters verified drafts."""
    from verispec.bench.closed_loop import closed_loop
    from verispec.peers.vllm import VllmBatchServer
    from verispec.models.loading.load import load_model

    target = load_model("smollm2-135m-instruct", dtype="float32")
    texts = ["Count from one to twenty: one, two, three,", "The capital of France is",
             "Repeat after me: the cat sat on the mat. The cat sat on the mat.", "def add(a, b):\n    return",
             "List the days of the week: Monday, Tuesday,", "Water boils at"]
    prompts = [target.encode(text) for text in texts]
    plain = [generate(target.lm, None, prompt, max_new_tokens=16, sampling=GREEDY, eos_token_id=target.eos_token_ids, k=0).tokens
             for prompt in prompts]
    runner = VllmRunner(parse("vllm-ngram-k3"), target, max_num_seqs=4)
    try:
        loop = closed_loop(VllmBatchServer(runner, 4), prompts, 4, 16)
        alone = [runner(prompt, 16).tokens for prompt in prompts]
    finally:
        runner.close()
    assert loop.most_in_flight == 4 and sorted(s.key for s in loop.served) == list(range(6))
    for s in loop.served:
        assert s.tokens == alone[s.key] == plain[s.key], texts[s.key]
        assert s.stats.new_tokens == len(s.tokens) and sum(s.stats.accepted) <= sum(s.stats.drafted)
        assert s.submitted < s.first_token <= s.finished
    assert sum(sum(s.stats.accepted) for s in loop.served) > 0
