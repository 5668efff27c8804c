"""The request fields `verispec serve` honours beyond OpenAI's core, on a tiny real Llama served
with `--k auto`: repetition_penalty, min_tokens, stop_token_ids, ignore_eos and
include_stop_str_in_output give the library's tokens under the same transforms and stops;
stop_reason names what stopped a reply; seeded sampled requests reproduce under auto k beside
other traffic; /tokenize, /detokenize and /version; system_fingerprint; trailing slashes."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor

import pytest

import verispec
from serving import NAME, running, save_tiny_model
from verispec.engine import generate
from verispec.models.load import load_model
from verispec.sampling import SamplingParams

PROMPT = "Hello there, tell me a story"
N = 20


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))


def plain(loaded, ids, eos, **sampling) -> list[int]:
    """The library's plain decoding of N tokens (greedy unless told) with these transforms."""
    params = SamplingParams(**{"temperature": 0.0, **sampling})
    return generate(loaded.lm, None, ids, max_new_tokens=N, k=0, sampling=params, eos_token_id=eos).tokens


@pytest.fixture(scope="module")
def expected(loaded):
    """The library's tokens, computed before any server shares the model."""
    ids = loaded.encode(PROMPT, chat=False)
    eos = set(loaded.eos_token_ids)
    greedy = plain(loaded, ids, eos)
    stop_id = greedy[1]
    return {
        "greedy": greedy,
        "penalised": plain(loaded, ids, eos, repetition_penalty=2.0),
        "stop_id": stop_id,
        "min_tokens": plain(loaded, ids, eos | {stop_id}, min_tokens=5),
        "no_eos": plain(loaded, ids, ()),
    }


class JitteryClock:
    """Seconds that advance by a random amount at every reading: round timings that differ
    from run to run, as a loaded machine's do, so an auto k that learns from them varies."""

    def __init__(self) -> None:
        self.now, self.random = 0.0, random.Random()

    def __call__(self) -> float:
        self.now += self.random.expovariate(1000.0)
        return self.now


@pytest.fixture(scope="module")
def server(loaded, expected):
    with running(loaded, k="auto", clock=JitteryClock()) as s:
        yield s


def complete(server, **fields) -> dict:
    status, reply = server.request("POST", "/v1/completions", {"model": NAME, "prompt": PROMPT, "max_tokens": N,
                                                               "temperature": 0, "return_token_ids": True, **fields})
    assert status == 200, reply
    return reply


def test_repetition_penalty_is_the_library_penalised_decoding(server, expected):
    assert expected["penalised"] != expected["greedy"]  # the penalty changes this prompt's reply
    assert complete(server, repetition_penalty=2.0)["choices"][0]["token_ids"] == expected["penalised"]


def test_stop_token_ids_end_the_reply_and_name_themselves(server, expected):
    choice = complete(server, stop_token_ids=[expected["stop_id"]])["choices"][0]
    assert choice["token_ids"] == expected["greedy"][:2]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == expected["stop_id"]


def test_min_tokens_masks_the_stops_until_then(server, expected):
    choice = complete(server, stop_token_ids=[expected["stop_id"]], min_tokens=5)["choices"][0]
    assert choice["token_ids"] == expected["min_tokens"] and len(choice["token_ids"]) >= 5


def test_ignore_eos_decodes_past_the_eos_ids(server, expected):
    choice = complete(server, ignore_eos=True)["choices"][0]
    assert choice["token_ids"] == expected["no_eos"] and len(choice["token_ids"]) == N
    assert choice["finish_reason"] == "length" and choice["stop_reason"] is None


def test_a_stop_string_is_named_and_kept_when_asked(server, loaded, expected):
    text = loaded.decode(expected["greedy"])
    stop = text[6:9]
    cut = text.index(stop)
    choice = complete(server, stop=stop)["choices"][0]
    assert choice["text"] == text[:cut] and choice["stop_reason"] == stop
    kept = complete(server, stop=stop, include_stop_str_in_output=True)["choices"][0]
    assert kept["text"] == text[: cut + len(stop)] and kept["stop_reason"] == stop
    late = complete(server, stop=stop, min_tokens=N)["choices"][0]  # stop strings count from min_tokens on
    assert late["text"][: cut + len(stop)] == text[: cut + len(stop)] and len(late["token_ids"]) == N


def test_a_seeded_sampled_request_reproduces_under_auto_k_beside_other_traffic(server):
    seeded = {"temperature": 0.9, "seed": 7, "repetition_penalty": 1.2}
    with ThreadPoolExecutor(max_workers=6) as pool:
        others = [pool.submit(complete, server, temperature=1.0, max_tokens=N - i) for i in range(3)]
        replies = list(pool.map(lambda _: complete(server, **seeded)["choices"][0]["token_ids"], range(3)))
        for other in others:
            other.result()
    assert replies[0] == replies[1] == replies[2]
    again = complete(server, **seeded)
    assert again["choices"][0]["token_ids"] == replies[0]
    assert again["speculative_decoding"]["k"] == "auto" and again["seed"] == 7


def test_a_reply_reports_the_seed_it_drew_and_that_seed_replays_it(server):
    first = complete(server, temperature=0.9)
    assert isinstance(first["seed"], int)
    again = complete(server, temperature=0.9, seed=first["seed"])
    assert again["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]


def test_tokenize_detokenize_and_version(server, loaded):
    status, reply = server.request("POST", "/tokenize", {"model": NAME, "prompt": PROMPT})
    assert status == 200 and reply["tokens"] == loaded.encode(PROMPT, chat=False)
    assert reply["count"] == len(reply["tokens"]) and reply["max_model_len"] == 2048
    status, chat = server.request("POST", "/tokenize", {"messages": [{"role": "user", "content": PROMPT}]})
    assert status == 200 and chat["tokens"] == loaded.encode(PROMPT, chat=True)
    status, back = server.request("POST", "/detokenize", {"tokens": reply["tokens"]})
    assert status == 200 and back == {"prompt": loaded.decode(reply["tokens"])}
    assert server.request("GET", "/version") == (200, {"version": verispec.__version__})


def test_a_trailing_slash_is_the_same_path(server):
    status, models = server.request("GET", "/v1/models/")
    assert status == 200 and models["data"][0]["id"] == NAME
    status, reply = server.request("POST", "/v1/completions/", {"model": NAME, "prompt": "Hi", "max_tokens": 2})
    assert status == 200 and reply["usage"]["completion_tokens"] == 2


def test_every_reply_carries_one_system_fingerprint(server):
    whole = complete(server, max_tokens=2)
    status, streamed = server.request("POST", "/v1/completions", {"model": NAME, "prompt": "Hi", "max_tokens": 2,
                                                                  "stream": True})
    chunks = [line for line in streamed.splitlines() if line.startswith("data: {")]
    assert whole["system_fingerprint"].startswith("fp_")
    assert all(f'"system_fingerprint":"{whole["system_fingerprint"]}"' in chunk for chunk in chunks)
