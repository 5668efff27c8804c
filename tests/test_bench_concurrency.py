"""`verispec bench --concurrency`: the closed loop, the sweep on the quick target end to end
through the CLI, its summary, plots and greedy identity, and bad input."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from verispec import profile
from verispec.bench.closed_loop import closed_loop
from verispec.bench.methods import PLAIN
from verispec.bench.sweep import QUICK_SWEEP_METHODS, parse_concurrency
from verispec.cli import main
from verispec.models.runtimes import llamacpp as runtime
from verispec.peers import llamacpp
from verispec.peers.outcome import Served

LEVELS = (1, 3)  # the quick workload has 4 prompts: at c = 3 the 4th replaces the first to finish
MAX_NEW = 10
REPEATS = 2
CELL_FIELDS = {
    "mode", "loops", "requests", "most_in_flight", "tokens_per_second", "over_plain", "ttft_seconds", "tpot_seconds",
    "acceptance_rate", "tokens_per_round", "drafted_per_round", "peak_rss_mb", "kv_bytes_per_token",
    "kv_bytes_per_slot", "kv_bytes_in_flight", "matching_requests", "compared_requests",
}
REQUEST_FIELDS = {
    "method", "concurrency", "repeat", "order", "prompt_id", "category", "prompt_tokens", "new_tokens",
    "ttft_seconds", "tpot_seconds", "rounds", "drafted", "accepted", "plans", "matches_plain", "mismatch", "peer",
    "tokens",
}
LOOP_FIELDS = {
    "method", "concurrency", "repeat", "order", "mode", "requests", "new_tokens", "wall_seconds",
    "tokens_per_second", "most_in_flight", "peak_rss_mb",
}


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """One --quick sweep at c = 1 and 3 (verispec plain, lookup k2 and auto, HF padded), shared."""
    out = tmp_path_factory.mktemp("sweep")
    argv = ["bench", "--quick", "--concurrency", ",".join(map(str, LEVELS)), "--max-new-tokens", str(MAX_NEW),
            "--repeats", str(REPEATS), "--out", str(out)]
    assert main(argv) == 0
    requests = [json.loads(line) for line in (out / "runs.jsonl").read_text().splitlines()]
    loops = [json.loads(line) for line in (out / "loops.jsonl").read_text().splitlines()]
    summary = json.loads((out / "summary.json").read_text())
    return out, requests, loops, summary


# --- the closed loop on a scripted server ------------------------------------------------------


class ScriptedServer:
    """Request `key` takes `lengths[key]` steps; records how many were in flight at each step
    and when each was submitted."""

    def __init__(self, lengths):
        self.lengths = lengths
        self.left: dict[int, int] = {}
        self.time = 0.0
        self.in_flight_at_steps: list[int] = []
        self.submitted_at: dict[int, int] = {}

    @property
    def in_flight(self):
        return len(self.left)

    def submit(self, key, prompt_ids, max_new_tokens):
        self.left[key] = self.lengths[key]
        self.submitted_at[key] = len(self.in_flight_at_steps)

    def step(self):
        self.in_flight_at_steps.append(len(self.left))
        self.time += 1.0
        done = []
        for key in list(self.left):
            self.left[key] -= 1
            if self.left[key] == 0:
                del self.left[key]
                done.append(Served(key, [key] * self.lengths[key], self.submitted_at[key], self.submitted_at[key] + 1.0,
                                   self.time))
        return done


@pytest.mark.parametrize("concurrency", [1, 2, 3, 8])
def test_a_closed_loop_serves_every_prompt_once_with_c_in_flight(concurrency):
    lengths = [3, 1, 4, 1, 5, 2, 6]
    server = ScriptedServer(lengths)
    ticks = iter(range(100))
    loop = closed_loop(server, [[k] for k in range(len(lengths))], concurrency, 8, clock=lambda: float(next(ticks)))
    assert sorted(s.key for s in loop.served) == list(range(len(lengths)))
    assert max(server.in_flight_at_steps) == loop.most_in_flight == min(concurrency, len(lengths))
    # a finished request is replaced before the next step while prompts remain: c in flight
    for step, in_flight in enumerate(server.in_flight_at_steps):
        if any(submitted > step for submitted in server.submitted_at.values()):
            assert in_flight == concurrency
    # prompts enter in order
    assert sorted(server.submitted_at, key=lambda k: (server.submitted_at[k], k)) == list(range(len(lengths)))
    assert loop.new_tokens == sum(lengths) and loop.wall_seconds == 1.0


def test_served_latencies():
    s = Served(0, [5, 6, 7], submitted=1.0, first_token=1.5, finished=2.5)
    assert s.ttft == 0.5 and s.tpot == 0.5
    assert Served(0, [5], 1.0, 1.5, 1.5).tpot is None


# --- the sweep through the CLI ------------------------------------------------------------------


def test_every_prompt_is_served_once_per_repeat_with_at_most_c_in_flight(sweep_run):
    _, requests, loops, summary = sweep_run
    methods = list(summary["methods"])
    assert methods == QUICK_SWEEP_METHODS.split(",")
    prompts = {r["prompt_id"] for r in requests}
    assert len(prompts) == 4
    served = Counter((r["method"], r["concurrency"], r["repeat"], r["prompt_id"]) for r in requests)
    assert set(served.values()) == {1}
    assert len(served) == len(methods) * len(LEVELS) * REPEATS * len(prompts)
    assert len(loops) == len(methods) * len(LEVELS) * REPEATS
    for loop in loops:
        assert LOOP_FIELDS <= set(loop)
        assert loop["requests"] == len(prompts)
        assert loop["most_in_flight"] == min(loop["concurrency"], len(prompts))
        assert loop["tokens_per_second"] == pytest.approx(loop["new_tokens"] / loop["wall_seconds"])
        assert loop["mode"] == ("whole batches" if loop["method"] == "hf-generate" else "closed loop")
    # methods interleaved within a level, the order rotated per repeat
    for c in LEVELS:
        orders = [tuple(loop["method"] for loop in sorted((x for x in loops if x["concurrency"] == c and
                                                          x["repeat"] == r), key=lambda x: x["order"]))
                  for r in range(REPEATS)]
        assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1]) == sorted(methods)


def test_records_are_consistent(sweep_run):
    _, requests, _, _ = sweep_run
    for r in requests:
        assert REQUEST_FIELDS <= set(r)
        assert 1 <= r["new_tokens"] == len(r["tokens"]) <= MAX_NEW
        assert r["ttft_seconds"] > 0 and (r["tpot_seconds"] is None or r["tpot_seconds"] > 0)
        assert r["accepted"] <= r["drafted"] and r["rounds"] >= 1
        if r["method"] == PLAIN or r["method"] == "hf-generate":
            assert r["drafted"] == 0 and r["rounds"] == r["new_tokens"]


def test_batched_greedy_outputs_equal_plain_decoding_alone(sweep_run):
    """Every request, at every level, equals verispec-plain's output for its prompt at c = 1:
    the quick model's top-2 logits are far apart, so HF's padded batches must agree too."""
    _, requests, _, summary = sweep_run
    alone = {r["prompt_id"]: r["tokens"] for r in requests
             if r["method"] == PLAIN and r["concurrency"] == 1 and r["repeat"] == 0}
    assert summary["mismatches"] == [] and summary["peer_differences"] == []
    for r in requests:
        assert r["matches_plain"] is True and r["tokens"] == alone[r["prompt_id"]], (r["method"], r["concurrency"])


def test_summary_fields(sweep_run):
    _, requests, _, summary = sweep_run
    header = summary["header"]
    assert header["concurrency"] == list(LEVELS) == summary["levels"]
    assert "--concurrency 1,3" in header["command"]
    if hasattr(profile, "measure_batch_costs"):  # auto k per batch, planned from v(n)
        assert header["batch_costs"]["rows"][0] == 1 and header["batch_costs"]["v"][0] == 1.0
    assert header["longest_request_tokens"] > MAX_NEW
    for name, cells in summary["results"].items():
        assert set(cells) == {str(c) for c in LEVELS}
        for c, cell in cells.items():
            assert CELL_FIELDS <= set(cell)
            assert cell["requests"] == 4 * REPEATS and cell["loops"] == REPEATS
            assert cell["most_in_flight"] <= int(c)
            t = cell["tokens_per_second"]
            assert 0 < t["min"] <= t["median"] <= t["max"]
            for key in ("ttft_seconds", "tpot_seconds"):
                p = cell[key]
                assert 0 < p["p50"] <= p["p90"] <= p["p99"]
            assert cell["kv_bytes_per_token"] > 0
            assert cell["kv_bytes_in_flight"] == cell["kv_bytes_per_slot"] * int(c)
            assert cell["matching_requests"] == cell["compared_requests"] == 4 * REPEATS
    for cell in summary["results"][PLAIN].values():
        assert cell["over_plain"] == {"median": 1.0, "min": 1.0, "max": 1.0}
        assert cell["acceptance_rate"] is None and cell["drafted_per_round"] == 0.0 and cell["tokens_per_round"] == 1.0
    lookup = summary["results"]["verispec-lookup-k2"]["1"]
    assert lookup["drafted_per_round"] > 0 and lookup["acceptance_rate"] > 0 and lookup["tokens_per_round"] > 1
    assert set(summary["crossover"]) == {"verispec-lookup-k2", "verispec-lookup-auto"}
    for x in summary["crossover"].values():
        assert x["concurrency"] in (None, *LEVELS)


def test_the_plots_and_the_report_are_written(sweep_run):
    out, _, _, summary = sweep_run
    assert summary["plots"] == ["throughput_vs_concurrency.png", "speedup_vs_concurrency.png"]
    for plot in summary["plots"]:
        assert (out / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (out / "report.md").read_text()
    for heading in ("Aggregate output tokens per second", "Latency per request", "Memory",
                    "Greedy identity with verispec-plain at c = 1", "Where speculation stops paying", "whole batches"):
        assert heading in report
    for method in summary["methods"]:
        assert method in report


def test_concurrency_1_is_the_single_request_benchmark(tmp_path):
    assert main(["bench", "--quick", "--concurrency", "1", "--methods", "verispec-plain,verispec-lookup-k2",
                 "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert "overall" in summary["results"][PLAIN] and not (tmp_path / "loops.jsonl").exists()
    assert "--concurrency" not in summary["header"]["command"]


def test_a_sampled_sweep_reports_no_identity(tmp_path):
    assert main(["bench", "--quick", "--concurrency", "2", "--methods", "verispec-plain,verispec-lookup-k2",
                 "--temperature", "0.8", "--max-new-tokens", "4", "--warmup", "0", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert all(cell["compared_requests"] == 0 for cells in summary["results"].values() for cell in cells.values())
    assert "Sampled decoding" in (tmp_path / "report.md").read_text()


# --- bad input ----------------------------------------------------------------------------------


def test_levels_parse():
    assert parse_concurrency("8, 1,2") == (1, 2, 8)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--concurrency", "0"], "--concurrency takes integers >= 1 separated by commas, e.g. 1,2,4,8; '0' in '0'"),
        (["--concurrency", "1,x"], "'x' in '1,x' is not one"),
        (["--concurrency", ""], "--concurrency is empty; give it a value"),
        (["--concurrency", "2,2"], "lists a level twice"),
        (["--concurrency", "1,2", "--methods", "verispec-plain,hf-lookup"],
         "hf-lookup decode one request at a time here (HF's assisted generation refuses batches"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert main(["bench", "--quick", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


# --- llama.cpp's batch API ------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.skipif(not runtime.installed(), reason=f"needs llama-cpp-python: {runtime.INSTALL}")
def test_llamacpp_batches_several_sequences():
    """llama.cpp's batch server serves every prompt once with at most c sequences in flight,
    reusing freed sequence ids; one sequence at a time it decodes exactly what llama-cpp-python's
    own `generate` does (positions, logits rows and cache removal right). With two in flight
    its kernels see other row counts and may part at a near tie, as any peer may."""
    import torch

    from verispec.bench.methods import parse_method
    from verispec.models.loading.load import load_model

    target = load_model(dtype="float32", runtime="hf")
    method = parse_method("llamacpp-plain")
    prompts = [target.encode(text, chat=False) for text in
               ("def add(a, b):\n", "The capital of France is", "Once upon a time", "import numpy as np\n")]
    single = llamacpp.make_runner(method.name, target, method.k)
    alone = [single(p, 6).tokens for p in prompts]
    llama = llamacpp.load_batch_model(method.name, target)
    for concurrency in (1, 2):
        server = llamacpp.LlamaCppBatchServer(llama, target.eos_token_ids, concurrency, 64, torch.get_num_threads())
        try:
            loop = closed_loop(server, prompts, concurrency, 6)
        finally:
            server.close()
        served = sorted(loop.served, key=lambda s: s.key)
        assert loop.most_in_flight == concurrency and [s.key for s in served] == [0, 1, 2, 3]
        assert all(len(s.tokens) == 6 or s.tokens[-1] in target.eos_token_ids for s in served)
        assert all(s.submitted < s.first_token <= s.finished for s in served)
        if concurrency == 1:
            assert [s.tokens for s in served] == alone
    assert server.kv_bytes_per_token() == 30 * 2 * 64 * 3 * 2  # SmolLM2-135M: 30 layers, 3 KV heads of 64
    q8 = llamacpp.LlamaCppBatchServer(llamacpp.load_batch_model(method.name, target, "q8_0"), target.eos_token_ids, 1, 64, 1)
    try:
        assert q8.kv_bytes_per_token() == 30 * 64 * 3 * 2 + 30 * 64 * 3 // 32 * 34  # float16 keys, Q8_0 values
    finally:
        q8.close()
