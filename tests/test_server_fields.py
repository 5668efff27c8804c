"""The request fields `verispec serve` honours beyond OpenAI's core, on a tiny real Llama served
with `--k auto`: repetition_penalty, min_tokens, stop_token_ids, ignore_eos and
include_stop_str_in_output give the library's tokens under the same transforms and stops;
stop_reason names what stopped a reply; seeded sampled requests reproduce under auto k beside
other traffic; logprobs, the prompt's (echo, prompt_logprobs) and structured output (JSON
schema, regex, choice, Lark and GBNF grammars) are the library's; /tokenize, /detokenize and
/version; system_fingerprint; trailing slashes."""

from __future__ import annotations

import json
import random
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import verispec
from serving import NAME, running, save_tiny_model
from verispec.server import Limits
from verispec.engine import generate
from verispec.logprobs import token_logprobs
from verispec.request import Request
from verispec.models.loading.load import load_model
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


def rendered(loaded, messages, **options) -> list[int]:
    """The ids of `messages` through the chat template with these options."""
    text = loaded.tokenizer.apply_chat_template(messages, tokenize=False, **options)
    return loaded.tokenizer(text, add_special_tokens=False).input_ids


def plain_tokens(loaded, ids, n) -> list[int]:
    return generate(loaded.lm, None, ids, max_new_tokens=n, k=0, eos_token_id=set(loaded.eos_token_ids)).tokens


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


@pytest.fixture(scope="module")
def drafting(loaded, expected):
    """A server at a fixed k, for the tests that need rounds to draft: auto k on jittery
    timings may find that no k pays and draft nothing."""
    with running(loaded, k=3) as s:
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


def test_speculation_per_request_off_or_capped_keeps_the_tokens(drafting, expected):
    """`speculation: {"enabled": false}` decodes plainly, `max_k` caps every round's drafts; the
    greedy tokens are the library's either way, and the counts say what speculation did."""
    free = complete(drafting)
    off = complete(drafting, speculation={"enabled": False})
    capped = complete(drafting, speculation={"max_k": 1})
    for reply in (free, off, capped):
        assert reply["choices"][0]["token_ids"] == expected["greedy"]
    spec, vllm = off["speculative_decoding"], off["metrics"]["speculative_decoding"]
    assert spec["proposer"] is None and spec["k"] == 0 and spec["num_drafts"] == 0 == vllm["num_draft_tokens"]
    assert vllm["num_emitted_tokens"] == N and vllm["acceptance_histogram"] == []
    spec, vllm = capped["speculative_decoding"], capped["metrics"]["speculative_decoding"]
    assert spec["max_k"] == 1 and spec["num_draft_tokens"] <= spec["num_drafts"] and spec["num_drafts"] > 0
    assert len(vllm["acceptance_histogram"]) <= 2 and sum(vllm["acceptance_histogram"]) == vllm["num_spec_steps"]
    assert free["speculative_decoding"]["max_k"] is None


def test_logprobs_under_speculation_are_plain_decodings(drafting, loaded):
    """Greedy at k = 3: each token's logprob and top alternatives are the library's
    plain decoding's, bit for bit (the runtime is deterministic: a row's logits do not depend on
    how many rows its forward scored); whole and streamed alike, chat and completions."""
    ids = loaded.encode(PROMPT, chat=False)
    plain = generate(loaded.lm, None, Request(tuple(ids), N, eos_token_ids=loaded.eos_token_ids, logprobs=3))
    text = loaded.tokenizer.decode
    reply = complete(drafting, logprobs=3)
    got = reply["choices"][0]["logprobs"]
    assert reply["choices"][0]["token_ids"] == plain.tokens and reply["speculative_decoding"]["num_drafts"] > 0
    assert got["token_logprobs"] == [t.logprob for t in plain.logprobs]
    assert got["tokens"] == [text([t]) for t in plain.tokens]
    assert got["top_logprobs"] == [{text([i]): v for i, v in t.top} for t in plain.logprobs]
    assert "".join(got["tokens"]) == reply["choices"][0]["text"] and got["text_offset"][1] == len(got["tokens"][0])
    status, streamed = drafting.request("POST", "/v1/completions", {
        "model": NAME, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "logprobs": 3, "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert [v for c in chunks for v in c["choices"][0]["logprobs"]["token_logprobs"]] == got["token_logprobs"]
    status, chat = drafting.request("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": N, "temperature": 0,
        "logprobs": True, "top_logprobs": 2, "return_token_ids": True})
    chat_ids = loaded.encode(PROMPT, chat=True)
    plain = generate(loaded.lm, None, Request(tuple(chat_ids), N, eos_token_ids=loaded.eos_token_ids, logprobs=2))
    content = chat["choices"][0]["logprobs"]["content"]
    assert chat["choices"][0]["token_ids"] == plain.tokens
    assert [(c["logprob"], [t["logprob"] for t in c["top_logprobs"]]) for c in content] == [
        (t.logprob, [v for _, v in t.top]) for t in plain.logprobs]
    assert content[0]["bytes"] == list(content[0]["token"].encode())


def test_sampled_logprobs_are_the_targets_rows(server, loaded):
    """Sampled under `--k auto`: each token's logprob is the full recompute's at its position,
    within float rounding (rows scored together and alone may differ in the last bit)."""
    reply = complete(server, temperature=1.0, seed=7, logprobs=0)
    tokens, got = reply["choices"][0]["token_ids"], reply["choices"][0]["logprobs"]["token_logprobs"]
    ids = loaded.encode(PROMPT, chat=False)
    loaded.lm.prefill(ids[:-1])
    rows = loaded.lm.extend([ids[-1], *tokens[:-1]])  # [N, V]: one forward over the reply
    expected = token_logprobs(rows, tokens, 0)
    assert got == pytest.approx([t.logprob for t in expected], abs=1e-4)


def test_whole_vocabulary_logprobs_where_the_server_allows_them(loaded):
    """`--max-logprobs -1` (vLLM's): chat's top_logprobs -1 lists every one of the vocabulary's
    259 tokens at each reply position, as the library's logprobs -1; prompt_logprobs -1 every
    token at each prompt position, each its row's log-softmax, ranked (1: the most likely; the
    prompt token's own rank, the tokens at least as likely; the float32 rows tie here and
    there, and tied tokens rank in id order)."""
    vocab = loaded.lm.vocab_size
    with running(loaded, k=3, limits=Limits(max_logprobs=-1)) as server:
        status, chat = server.request("POST", "/v1/chat/completions", {
            "model": NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 3, "temperature": 0,
            "logprobs": True, "top_logprobs": -1, "return_token_ids": True})
        assert status == 200, chat
        scored = choice_of(complete(server, prompt_logprobs=-1, max_tokens=1))["prompt_logprobs"]
        status, past = server.request("POST", "/v1/completions",
                                      {"model": NAME, "prompt": PROMPT, "prompt_logprobs": vocab + 1})
        assert status == 400 and f"ask for at most {vocab}" in past["error"]["message"], past
    chat_ids = loaded.encode(PROMPT, chat=True)
    plain = generate(loaded.lm, None, Request(tuple(chat_ids), 3, eos_token_ids=loaded.eos_token_ids, logprobs=-1))
    content = chat["choices"][0]["logprobs"]["content"]
    assert chat["choices"][0]["token_ids"] == plain.tokens and len(content) == 3
    for position, mine in zip(content, plain.logprobs):
        assert len(position["top_logprobs"]) == vocab
        assert [t["logprob"] for t in position["top_logprobs"]] == pytest.approx([v for _, v in mine.top], abs=1e-5)
    ids = loaded.encode(PROMPT, chat=False)
    logp = torch.log_softmax(loaded.lm.score(ids[:-1]).float(), dim=-1)  # [len(ids) - 1, V]
    assert len(scored) == len(ids) and scored[0] is None
    for token, position, row in zip(ids[1:], scored[1:], logp):
        assert sorted(map(int, position)) == list(range(vocab))
        got = {int(t): (e["logprob"], e["rank"]) for t, e in position.items()}
        assert [v for v, _ in got.values()] == pytest.approx([row[t].item() for t in got], abs=1e-5)
        assert got[token][1] == int((row >= row[token]).sum())
        others = [(t, rank) for t, (_, rank) in got.items() if t != token]  # most likely first, ties: the lower id
        assert [rank for _, rank in others] == sorted(rank for _, rank in others)
        assert all((row > row[t]).sum() < rank <= (row >= row[t]).sum() for t, rank in others)
        assert position[str(token)]["decoded_token"] == loaded.tokenizer.decode([token])


LARK = 'start: greeting " " NAME "!"\ngreeting: "Hello" | "Hi"\nNAME: /[a-z]{2,8}/'
GBNF = 'root ::= word (" " word)* "."\nword ::= [a-z]+'
def test_echo_and_prompt_logprobs_are_the_targets_scoring_of_the_prompt(server, loaded):
    """Completions' echo with logprobs: the prompt's text and tokens before the reply's, the
    first prompt token's logprob null, the rest the library's prompt logprobs (one forward over
    the prompt), the reply's as without echo; vLLM's prompt_logprobs (a completion choice's, a
    chat reply's) hold the prompt token and the most likely ones with their ranks; a streamed
    echo sends the prompt first."""
    ids = loaded.encode(PROMPT, chat=False)
    library = generate(loaded.lm, None, Request(tuple(ids), N, eos_token_ids=loaded.eos_token_ids, logprobs=2,
                                                prompt_logprobs=2))
    text = loaded.tokenizer.decode
    reply = complete(server, echo=True, logprobs=2)
    choice = choice_of(reply)
    got = choice["logprobs"]
    assert choice["token_ids"] == library.tokens and choice["text"] == PROMPT + text(library.tokens)
    assert got["tokens"] == [text([t]) for t in [*ids, *library.tokens]]
    assert got["token_logprobs"][0] is None and got["top_logprobs"][0] is None
    assert got["token_logprobs"][1:] == pytest.approx([t.logprob for t in [*library.prompt_logprobs[1:],
                                                                            *library.logprobs]], abs=1e-5)
    assert "prompt_logprobs" not in choice and reply["usage"]["completion_tokens"] == N
    scored = choice_of(complete(server, prompt_logprobs=3, max_tokens=1))["prompt_logprobs"]
    assert len(scored) == len(ids) and scored[0] is None
    for token, position, mine in zip(ids[1:], scored[1:], library.prompt_logprobs[1:]):
        entry = position[str(token)]
        assert entry["logprob"] == pytest.approx(mine.logprob, abs=1e-5) and entry["rank"] == mine.rank
        assert entry["decoded_token"] == text([token]) and 3 <= len(position) <= 4
        ranks = [e["rank"] for e in list(position.values())[1:]]  # the most likely, the prompt token's left out
        assert ranks == sorted(ranks) and set(ranks) <= {1, 2, 3}
    status, chat = server.request("POST", "/v1/chat/completions", {
        "model": NAME, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 2, "prompt_logprobs": 0})
    assert status == 200 and len(chat["prompt_logprobs"]) == len(loaded.encode(PROMPT, chat=True))
    assert all(len(p) == 1 for p in chat["prompt_logprobs"][1:])
    status, streamed = server.request("POST", "/v1/completions", {
        "model": NAME, "prompt": PROMPT, "max_tokens": N, "temperature": 0, "echo": True, "stream": True})
    chunks = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert "".join(c["choices"][0]["text"] for c in chunks) == PROMPT + text(library.tokens)


def choice_of(reply: dict) -> dict:
    return reply["choices"][0]


SCHEMA = {"type": "object", "properties": {"story": {"type": "string"}, "n": {"type": "integer"}},
          "required": ["story", "n"], "additionalProperties": False}


@pytest.mark.parametrize("fields, make", [
    ({"guided_choice": ["a story", "tell me", "Hello"]}, lambda g: g.choice(["a story", "tell me", "Hello"])),
    ({"guided_regex": "(Hello|there)[a-z ]{3,12}!"}, lambda g: g.regex("(Hello|there)[a-z ]{3,12}!")),
    ({"guided_json": SCHEMA}, lambda g: g.json_schema(SCHEMA)),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}}},
     lambda g: g.json_schema(SCHEMA)),
    ({"response_format": {"type": "json_object"}}, lambda g: g.json_object()),
    ({"guided_grammar": LARK}, lambda g: g.grammar(LARK)),
    ({"structured_outputs": {"grammar": GBNF}}, lambda g: g.grammar(GBNF)),
    ({"structured_outputs": {"json": SCHEMA}}, lambda g: g.json_schema(SCHEMA)),
], ids=["guided_choice", "guided_regex", "guided_json", "response_format json_schema", "response_format json_object",
        "guided_grammar lark", "structured_outputs grammar gbnf", "structured_outputs json"])
def test_structured_output_is_plain_constrained_decoding(server, loaded, fields, make):
    """Greedy under `--k auto` with a grammar: the library's plain decoding under the same
    grammar, token for token, and the text keeps to the grammar."""
    reply = complete(server, prompt=PROMPT * 3, max_tokens=40, **fields)
    ids = loaded.encode(PROMPT * 3, chat=False)
    grammar = make(server.app.served.grammars)
    plain = generate(loaded.lm, None, Request(tuple(ids), 40, sampling=SamplingParams(temperature=0, grammar=grammar),
                                              eos_token_ids=loaded.eos_token_ids))
    assert reply["choices"][0]["token_ids"] == plain.tokens
    text = reply["choices"][0]["text"]
    if "guided_choice" in fields:
        assert text in fields["guided_choice"]
    elif "guided_regex" in fields:
        assert reply["choices"][0]["finish_reason"] == "length" or re.fullmatch(fields["guided_regex"], text)
    elif "guided_grammar" in fields:
        assert reply["choices"][0]["finish_reason"] == "length" or re.fullmatch("(Hello|Hi) [a-z]{2,8}!", text)
    elif "grammar" in fields.get("structured_outputs", {}):
        assert re.fullmatch("[a-z]+( [a-z]+)*" + ("[.]" if reply["choices"][0]["finish_reason"] == "stop" else ""), text)
    elif reply["choices"][0]["finish_reason"] == "stop":
        assert isinstance(json.loads(text), dict)


def test_tokenize_takes_vllms_options(server, loaded):
    tokenizer = loaded.tokenizer
    status, reply = server.request("POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False,
                                                         "return_token_strs": True})
    assert status == 200 and reply["tokens"] == tokenizer(PROMPT, add_special_tokens=False).input_ids
    assert reply["token_strs"] == tokenizer.convert_ids_to_tokens(reply["tokens"])
    status, plain = server.request("POST", "/tokenize", {"prompt": PROMPT})
    assert plain["token_strs"] is None
    turns = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Once upon"}]
    status, bare = server.request("POST", "/tokenize", {"messages": turns[:1], "add_generation_prompt": False})
    assert status == 200 and bare["tokens"] == rendered(loaded, turns[:1], add_generation_prompt=False)
    body = {"messages": turns, "add_generation_prompt": False, "continue_final_message": True}
    status, open_turn = server.request("POST", "/tokenize", body)
    assert status == 200 and open_turn["tokens"] == rendered(loaded, turns, continue_final_message=True)
    assert loaded.decode(open_turn["tokens"]).endswith("Once upon")


def test_chat_takes_names_reasoning_effort_and_a_final_message_to_continue(server, loaded):
    """OpenAI's `name` and `reasoning_effort` reach the chat template (this one reads neither,
    so the reply is the plain one); continue_final_message decodes after the open turn."""
    user = {"role": "user", "content": PROMPT}
    ask = {"model": NAME, "max_tokens": 6, "temperature": 0, "return_token_ids": True}
    status, plain = server.request("POST", "/v1/chat/completions", {**ask, "messages": [user]})
    status, named = server.request("POST", "/v1/chat/completions", {
        **ask, "messages": [{**user, "name": "ann"}], "reasoning_effort": "low"})
    assert status == 200 and named["choices"][0]["token_ids"] == plain["choices"][0]["token_ids"]
    turns = [user, {"role": "assistant", "content": "Once"}]
    status, reply = server.request("POST", "/v1/chat/completions", {
        **ask, "messages": turns, "add_generation_prompt": False, "continue_final_message": True})
    ids = rendered(loaded, turns, continue_final_message=True)
    assert status == 200 and reply["usage"]["prompt_tokens"] == len(ids)
    assert reply["choices"][0]["token_ids"] == plain_tokens(loaded, ids, 6)


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
