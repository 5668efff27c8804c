"""`verispec serve` under load: 8 concurrent streaming `openai` clients for a bounded time
(VERISPEC_SERVE_LOAD_SECONDS, default 10; docs/serving.md runs it for 60), each request a
random prompt and budget, greedy. No request fails, no token is lost or duplicated (each
reply's streamed text is its token ids' text, and the ids are the library's greedy output cut
to the budget), every slot is free at the end, and /metrics is the sum of the replies."""

from __future__ import annotations

import os
import random
import threading
import time

import openai
import pytest

from serving import NAME, running, save_tiny_model
from verispec.engine import generate
from verispec.models.loading.load import load_model
from verispec.registry import build_proposer
from verispec.sampling import GREEDY

CLIENTS = 8
SECONDS = float(os.environ.get("VERISPEC_SERVE_LOAD_SECONDS", "10"))
MAX_REQUESTS = 5000  # per client, a bound beside the time
PROMPTS = ["Hello there", "the cat sat on the mat and the cat", "def add(a, b):", "abcabcabcabc", "Rain, rain, rain",
           "Write a short poem about the sea."]
MOST = 48


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))


def test_eight_streaming_clients_lose_nothing(loaded):
    lookup = build_proposer("lookup", loaded)
    expected = {}
    for prompt in PROMPTS:  # the library's greedy tokens, before the server shares the model
        ids = loaded.encode(prompt, chat=True)
        expected[prompt] = generate(loaded.lm, lookup, ids, max_new_tokens=MOST, k=3, sampling=GREEDY,
                                    eos_token_id=loaded.eos_token_ids).tokens
    replies: list[dict] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    with running(loaded, k=3, max_slots=CLIENTS, max_waiting=CLIENTS) as server:
        deadline = time.monotonic() + SECONDS

        def client(seed: int) -> None:
            rng = random.Random(seed)
            api = openai.OpenAI(base_url=server.base_url, api_key="none", max_retries=0, timeout=60)
            try:
                for _ in range(MAX_REQUESTS):
                    if time.monotonic() > deadline:
                        return
                    prompt, budget = rng.choice(PROMPTS), rng.randint(1, MOST)
                    text, last, usage = "", None, None
                    for chunk in api.chat.completions.create(
                        model=NAME, messages=[{"role": "user", "content": prompt}], max_tokens=budget, temperature=0,
                        stream=True, stream_options={"include_usage": True}, extra_body={"return_token_ids": True},
                    ):
                        if chunk.usage is not None:
                            usage = chunk.usage.model_dump()
                        if chunk.choices:
                            text += chunk.choices[0].delta.content or ""
                            last = chunk if chunk.choices[0].finish_reason else last
                    reply = last.model_dump()
                    reply.update(prompt=prompt, budget=budget, text=text, usage=usage)
                    with lock:
                        replies.append(reply)
            except BaseException as error:  # the test fails on it below
                with lock:
                    errors.append(error)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=SECONDS + 60)
        assert not any(thread.is_alive() for thread in threads)
        server.wait_idle()
        metrics = server.metrics()

    assert not errors, errors[:3]
    assert len(replies) >= CLIENTS
    for reply in replies:
        ids = reply["choices"][0]["token_ids"]
        assert ids == expected[reply["prompt"]][: reply["budget"]]
        assert reply["text"] == loaded.decode(ids)
        assert reply["usage"]["completion_tokens"] == len(ids)
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert metrics[(f"verispec:spec_decode_{key}_total", ())] == sum(r["speculative_decoding"][key] for r in replies)
    assert metrics[("verispec:generation_tokens_total", ())] == sum(r["usage"]["completion_tokens"] for r in replies)
    assert metrics[("verispec:e2e_request_latency_seconds_count", ())] == len(replies)
    assert metrics[("verispec:num_requests_running", ())] == 0 and metrics[("verispec:kv_slots_in_use", ())] == 0
