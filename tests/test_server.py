"""`verispec serve`'s protocol, through the real `openai` client and raw HTTP, on a tiny real
Llama (a checkpoint saved in the test, its byte-level tokenizer and chat template) served on a
free loopback port in a thread: replies whole and streamed equal the library's tokens, stop
strings cut and free the slot, every reply carries usage, speculation and timings, /metrics
counters are exactly the sums of the replies (bad input: tests/test_server_bad_input.py)."""

from __future__ import annotations

import math

import openai
import pytest

from serving import NAME, running, save_tiny_model
from verispec.engine import generate
from verispec.models.loading.load import load_model
from verispec.registry import build_proposer
from verispec.sampling import GREEDY, SamplingParams
from verispec.server import Limits

KEY = "test-key"
PROMPT = "Hello there, tell me a story"
K = 3


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))


def library_tokens(loaded, ids, n, sampling=GREEDY, seed=0) -> list[int]:
    """What the library emits for the prompt ids: lookup drafts, k = 3, the model's EOS ids."""
    proposer = build_proposer("lookup", loaded)
    run = generate(loaded.lm, proposer, ids, max_new_tokens=n, sampling=sampling, seed=seed, k=K,
                   eos_token_id=loaded.eos_token_ids)
    return run.tokens


@pytest.fixture(scope="module")
def expected(loaded):
    """The library's greedy tokens for PROMPT as plain text and as one chat turn, and a seeded
    sampled run's, computed before any server shares the model."""
    plain = loaded.encode(PROMPT, chat=False)
    chat = loaded.encode(PROMPT, chat=True)
    return {
        "plain": library_tokens(loaded, plain, 40),
        "chat": library_tokens(loaded, chat, 40),
        "sampled": library_tokens(loaded, chat, 40, SamplingParams(temperature=0.8), seed=1234),
    }


@pytest.fixture(scope="module")
def server(loaded, expected):
    with running(loaded, k=K, limits=Limits(api_key=KEY, max_body_bytes=64 << 10, head_seconds=1.0)) as s:
        yield s


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.base_url, api_key=KEY, max_retries=0, timeout=30)


def check_speculation(reply: dict, completion_tokens: int) -> None:
    spec, timings = reply["speculative_decoding"], reply["timings"]
    assert spec["proposer"] == "lookup" and spec["k"] == K
    assert sum(spec["num_accepted_tokens_per_pos"]) == spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert spec["num_draft_tokens"] <= K * spec["num_drafts"] and spec["num_drafts"] <= spec["rounds"]
    assert timings["predicted_n"] == completion_tokens and timings["draft_n"] == spec["num_draft_tokens"]
    assert timings["draft_n_accepted"] == spec["num_accepted_tokens"] and timings["prompt_ms"] > 0
    vllm = reply["metrics"]["speculative_decoding"]  # vLLM's per-request block, the same counts
    histogram = vllm["acceptance_histogram"]
    assert vllm["num_spec_steps"] == spec["num_drafts"] == sum(histogram) and vllm["num_spec_tokens"] == K
    assert vllm["num_accepted_draft_tokens"] == spec["num_accepted_tokens"] == sum(j * n for j, n in enumerate(histogram))
    assert vllm["num_draft_tokens"] == spec["num_draft_tokens"] and vllm["num_emitted_tokens"] >= completion_tokens
    assert vllm["mean_acceptance_length"] == spec["mean_acceptance_length"]


# --- the openai client ------------------------------------------------------------------------


def test_a_completion_whole_and_streamed_equals_the_library(client, loaded, expected):
    whole = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, temperature=0,
                                      extra_body={"return_token_ids": True})
    choice = whole.choices[0]
    assert choice.model_extra["token_ids"] == expected["plain"]
    assert choice.text == loaded.decode(expected["plain"])
    assert choice.finish_reason == ("stop" if len(expected["plain"]) < 40 else "length")
    assert whole.usage.prompt_tokens == len(loaded.encode(PROMPT, chat=False))
    assert whole.usage.completion_tokens == len(expected["plain"])
    check_speculation(whole.model_dump(), whole.usage.completion_tokens)

    chunks = list(client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == choice.finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_a_chat_whole_and_streamed_equals_the_library(client, loaded, expected):
    messages = [{"role": "user", "content": PROMPT}]
    whole = client.chat.completions.create(model=NAME, messages=messages, max_tokens=40, temperature=0,
                                           extra_body={"return_token_ids": True})
    assert whole.choices[0].model_extra["token_ids"] == expected["chat"]
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == loaded.decode(expected["chat"])
    assert whole.object == "chat.completion" and whole.id.startswith("chatcmpl-")

    stream = client.chat.completions.create(model=NAME, messages=messages, max_tokens=40, temperature=0, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    check_speculation(last.model_dump(), whole.usage.completion_tokens)
    assert chunks[-1].usage.model_dump() == whole.usage.model_dump()


def test_a_seeded_sampled_chat_equals_the_library_with_that_seed(client, expected):
    replies = [
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": PROMPT}], max_tokens=40,
                                       temperature=0.8, seed=1234, extra_body={"return_token_ids": True})
        for _ in range(2)
    ]
    assert [r.choices[0].model_extra["token_ids"] for r in replies] == [expected["sampled"]] * 2


def test_a_stop_string_cuts_the_text_and_frees_the_slot(client, server, loaded, expected):
    text = loaded.decode(expected["plain"])
    stop = text[10:13]
    cut = text.index(stop)
    whole = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, temperature=0, stop=[stop, "\x00zz"])
    assert whole.choices[0].text == text[:cut] and whole.choices[0].finish_reason == "stop"
    # the tokens counted are those up to the one that completed the stop string
    assert len(loaded.decode(expected["plain"][: whole.usage.completion_tokens - 1])) < cut + len(stop)
    assert len(loaded.decode(expected["plain"][: whole.usage.completion_tokens])) >= cut + len(stop)
    streamed = client.completions.create(model=NAME, prompt=PROMPT, max_tokens=40, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:cut]
    server.wait_idle()


def test_models_health_and_metrics(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    assert server.request("GET", "/health") == (200, {"status": "ok"})
    metrics = server.metrics()
    assert metrics[("verispec:kv_slots_total", ())] == 4


def test_metrics_counters_are_the_sums_of_the_replies(loaded):
    with running(loaded, k=K) as fresh:
        client = openai.OpenAI(base_url=fresh.base_url, api_key="none", max_retries=0, timeout=30)
        replies = []
        for i, prompt in enumerate(["abcabcabc", "the cat sat on the mat, the cat", "xyz", PROMPT]):
            if i % 2:
                chunks = list(client.completions.create(model=NAME, prompt=prompt, max_tokens=10 + 7 * i, stream=True,
                                                        temperature=0, stream_options={"include_usage": True}))
                last = [c for c in chunks if c.choices][-1].model_dump()
                replies.append({**last, "usage": chunks[-1].usage.model_dump()})
            else:
                replies.append(client.completions.create(model=NAME, prompt=prompt, max_tokens=10 + 7 * i,
                                                         temperature=0.7, seed=i).model_dump())
        fresh.wait_idle()
        m = fresh.metrics()
    total = {key: sum(r["speculative_decoding"][key] for r in replies)
             for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens")}
    assert m[("verispec:spec_decode_num_drafts_total", ())] == total["num_drafts"]
    assert m[("verispec:spec_decode_num_draft_tokens_total", ())] == total["num_draft_tokens"]
    assert m[("verispec:spec_decode_num_accepted_tokens_total", ())] == total["num_accepted_tokens"]
    positions = max(len(r["speculative_decoding"]["num_accepted_tokens_per_pos"]) for r in replies)
    for position in range(positions):
        by_reply = sum(r["speculative_decoding"]["num_accepted_tokens_per_pos"][position]
                       for r in replies if position < len(r["speculative_decoding"]["num_accepted_tokens_per_pos"]))
        assert m[("verispec:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(position)),))] == by_reply
    assert m[("verispec:generation_tokens_total", ())] == sum(r["usage"]["completion_tokens"] for r in replies)
    assert m[("verispec:prompt_tokens_total", ())] == sum(r["usage"]["prompt_tokens"] for r in replies)
    assert m[("verispec:e2e_request_latency_seconds_count", ())] == len(replies)
    assert sum(v for (name, _), v in m.items() if name == "verispec:request_success_total") == len(replies)


def test_the_api_key(server):
    body = {"model": NAME, "prompt": "Hi", "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}):
        status, reply = server.request("POST", "/v1/completions", body, headers)
        assert status == 401 and reply["error"]["code"] == "invalid_api_key", reply
    assert server.request("GET", "/v1/models")[0] == 401
    assert server.request("GET", "/health")[0] == 200
    status, reply = server.request("POST", "/v1/completions", body, {"Authorization": f"Bearer {KEY}"})
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


def test_a_finite_reply_has_finite_numbers(client):
    reply = client.completions.create(model=NAME, prompt="Hi", max_tokens=3, temperature=0).model_dump()
    numbers = [*reply["timings"].values(), *[v for v in reply["speculative_decoding"].values()
                                              if isinstance(v, float)]]
    assert all(math.isfinite(v) for v in numbers if isinstance(v, (int, float)))


# --- the command line ------------------------------------------------------------------------


def one_error_line(capsys, argv: list[str]) -> str:
    from verispec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


def test_serve_refuses_a_taken_port_before_loading(capsys, monkeypatch):
    from verispec.models.loading import load
    from verispec.server.run import loopback_socket

    def no_load(*args, **kwargs):
        raise AssertionError("serve loaded the model before binding its port")

    monkeypatch.setattr(load, "build", no_load)

    taken = loopback_socket()
    taken.listen()
    try:
        err = one_error_line(capsys, ["serve", "--port", str(taken.getsockname()[1])])
    finally:
        taken.close()
    assert "cannot listen on 127.0.0.1:" in err and "choose another --host or --port" in err


def test_serve_refuses_a_bad_k_and_a_bad_port(capsys):
    assert "--k must be an integer >= 1" in one_error_line(capsys, ["serve", "--k", "many"])
    assert "--port" in one_error_line(capsys, ["serve", "--port", "70000"])
