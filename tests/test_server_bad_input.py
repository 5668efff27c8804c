"""`verispec serve` against bad input, one request per case on one tiny-model server: every
field the server does not honour is refused with a 400 in OpenAI's error shape naming the field
in `param`, every malformed body gets one line saying what was wrong, harmless fields pass, and
the server serves on after all of them."""

from __future__ import annotations

import json

import pytest

from serving import NAME, running, save_tiny_model
from verispec.models.loading.load import load_model
from verispec.server import Limits

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    return load_model(save_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def server(loaded):
    with running(loaded, k=3, limits=Limits(max_body_bytes=64 << 10)) as s:
        yield s


def chat(**fields):
    return {"model": NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **fields}


def completion(**fields):
    return {"model": NAME, "prompt": "Hi", "max_tokens": 4, **fields}


def user(content):
    return [{"role": "user", "content": content}]


# (case, path, body, status, words in the message)
MALFORMED = [
    ("invalid JSON", COMPLETIONS, '{"model": "tiny", "prompt": ', 400, "not valid JSON"),
    ("not an object", COMPLETIONS, "[1, 2]", 400, "must be a JSON object"),
    ("empty body", COMPLETIONS, "", 400, "not valid JSON"),
    ("unknown model", COMPLETIONS, completion(model="gpt-4"), 404, "does not exist"),
    ("temperature NaN", COMPLETIONS, '{"model": "tiny", "prompt": "Hi", "temperature": NaN}', 400, "temperature"),
    ("prompt over the context", COMPLETIONS, completion(prompt="a" * 3000), 400, "context is 2048 tokens"),
    ("prompt and budget over the context", COMPLETIONS, completion(prompt="a" * 2000, max_tokens=100), 400,
     "ask for at most 48"),
]

# (case, path, body, the param named, words in the message): each a 400
REFUSED = [
    # wrong types and ranges
    ("no model", COMPLETIONS, {"prompt": "Hi"}, "model", "model is required"),
    ("max_tokens a string", COMPLETIONS, completion(max_tokens="ten"), "max_tokens", "integer"),
    ("max_tokens a bool", COMPLETIONS, completion(max_tokens=True), "max_tokens", "integer"),
    ("max_tokens negative", COMPLETIONS, completion(max_tokens=-1), "max_tokens", "greater than or equal to 1"),
    ("max_tokens zero", COMPLETIONS, completion(max_tokens=0), "max_tokens", "greater than or equal to 1"),
    ("max_tokens huge", COMPLETIONS, completion(max_tokens=10**12), "max_tokens", "context is 2048 tokens"),
    ("temperature -1", CHAT, chat(temperature=-1), "temperature", "greater than or equal to 0"),
    ("temperature a string", CHAT, chat(temperature="hot"), "temperature", "number"),
    ("temperature tiny", CHAT, chat(temperature=1e-9), "temperature", "use 0 for greedy"),
    ("top_p 0", CHAT, chat(top_p=0), "top_p", "greater than 0"),
    ("top_p 2", CHAT, chat(top_p=2), "top_p", "less than or equal to 1"),
    ("top_k -5", CHAT, chat(top_k=-5), "top_k", "-1 or 0"),
    ("min_p 1", CHAT, chat(min_p=1), "min_p", "less than 1"),
    ("seed negative", CHAT, chat(seed=-1), "seed", "greater than or equal to 0"),
    ("seed huge", CHAT, chat(seed=2**70), "seed", "less than or equal to"),
    ("stream a string", CHAT, chat(stream="yes"), "stream", "boolean"),
    ("stream 1", CHAT, chat(stream=1), "stream", "boolean"),
    ("repetition_penalty 0", CHAT, chat(repetition_penalty=0), "repetition_penalty", "greater than 0"),
    ("repetition_penalty a string", CHAT, chat(repetition_penalty="high"), "repetition_penalty", "number"),
    ("min_tokens negative", CHAT, chat(min_tokens=-1), "min_tokens", "greater than or equal to 0"),
    ("min_tokens over the budget", CHAT, chat(min_tokens=10, max_tokens=4), "min_tokens", "lower min_tokens"),
    ("ignore_eos a string", CHAT, chat(ignore_eos="yes"), "ignore_eos", "boolean"),
    ("stop_token_ids negative", CHAT, chat(stop_token_ids=[-1]), "stop_token_ids", "greater than or equal to 0"),
    ("stop_token_ids a string", CHAT, chat(stop_token_ids="2"), "stop_token_ids", "valid array"),
    ("stop_token_ids outside the vocabulary", CHAT, chat(stop_token_ids=[10**6]), "stop_token_ids",
     "outside the vocabulary"),
    ("five stop strings", CHAT, chat(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4 stop strings"),
    ("an empty stop string", CHAT, chat(stop=""), "stop", "stop string"),
    ("stop a number", CHAT, chat(stop=5), "stop", "a string or a list"),
    # prompts and messages
    ("empty prompt", COMPLETIONS, completion(prompt=""), "prompt", "prompt is empty"),
    ("empty prompt ids", COMPLETIONS, completion(prompt=[]), "prompt", "prompt is empty"),
    ("prompt id outside the vocabulary", COMPLETIONS, completion(prompt=[1, 10**6]), "prompt",
     "outside the vocabulary"),
    ("several prompts", COMPLETIONS, completion(prompt=["a", "b"]), "prompt", "one prompt per request"),
    ("several prompts of ids", COMPLETIONS, completion(prompt=[[1, 2], [3]]), "prompt", "one prompt per request"),
    ("prompt a number", COMPLETIONS, completion(prompt=5), "prompt", "a string or a list of token ids"),
    ("prompt ids with a bool", COMPLETIONS, completion(prompt=[1, True]), "prompt", "a list of token ids"),
    ("empty messages", CHAT, chat(messages=[]), "messages", "messages is empty"),
    ("messages a string", CHAT, chat(messages="Hi"), "messages", "valid array"),
    ("unknown role", CHAT, chat(messages=[{"role": "wizard", "content": "Hi"}]), "messages", "role must be"),
    ("a tool message", CHAT, chat(messages=[{"role": "tool", "content": "42", "tool_call_id": "x"}]), "messages",
     "tools are not served"),
    ("content missing", CHAT, chat(messages=[{"role": "user"}]), "messages", "content is required"),
    ("content null", CHAT, chat(messages=[{"role": "assistant", "content": None}]), "messages",
     "tool calls are not served"),
    ("image content", CHAT, chat(messages=user([{"type": "image_url", "image_url": {"url": "x"}}])), "messages",
     "only text parts are served, got a part of type 'image_url'"),
    ("reasoning_effort unknown", CHAT, chat(reasoning_effort="extreme"), "reasoning_effort",
     "Input should be 'none', 'minimal', 'low', 'medium', 'high' or 'xhigh'"),
    ("continue_final_message with the generation prompt", CHAT, chat(continue_final_message=True),
     "continue_final_message", "needs add_generation_prompt: false"),
    ("continue_final_message after a user message", CHAT,
     chat(continue_final_message=True, add_generation_prompt=False), "continue_final_message",
     "must be the assistant's"),
    ("speculation enabled a string", CHAT, chat(speculation={"enabled": "no"}), "speculation", "boolean"),
    ("speculation max_k negative", CHAT, chat(speculation={"max_k": -1}), "speculation",
     "greater than or equal to 0"),
    ("speculation unknown", CHAT, chat(speculation={"k": 2}), "speculation", "speculation.k: unknown field"),
    ("top_logprobs without logprobs", CHAT, chat(top_logprobs=2), "top_logprobs", "needs logprobs: true"),
    ("top_logprobs 21", CHAT, chat(logprobs=True, top_logprobs=21), "top_logprobs",
     "top_logprobs 21 asks for 21 tokens a position, more than this server serves (20)"),
    ("top_logprobs all (-1) past --max-logprobs", CHAT, chat(logprobs=True, top_logprobs=-1), "top_logprobs",
     "start the server with --max-logprobs -1"),
    ("top_logprobs -2", CHAT, chat(logprobs=True, top_logprobs=-2), "top_logprobs", "greater than or equal to -1"),
    ("completion logprobs a bool", COMPLETIONS, completion(logprobs=True), "logprobs", "valid integer"),
    ("completion logprobs 21", COMPLETIONS, completion(logprobs=21), "logprobs", "more than this server serves (20)"),
    ("completion logprobs all (-1)", COMPLETIONS, completion(logprobs=-1), "logprobs",
     "not served on completions' logprobs, as vLLM's"),
    ("add_special_tokens a string", COMPLETIONS, completion(add_special_tokens="no"), "add_special_tokens", "boolean"),
    # fields that would change the output or ask for more than one text
    ("n 2", CHAT, chat(n=2), "n", "only n = 1"),
    ("n true", CHAT, chat(n=True), "n", "only n = 1"),
    ("best_of true", COMPLETIONS, completion(best_of=True), "best_of", "only best_of = 1"),
    ("best_of 2", COMPLETIONS, completion(best_of=2), "best_of", "only best_of = 1"),
    ("use_beam_search", COMPLETIONS, completion(use_beam_search=True), "use_beam_search", "beam search"),
    ("presence_penalty", CHAT, chat(presence_penalty=0.5), "presence_penalty", "penalty changes the output"),
    ("frequency_penalty", CHAT, chat(frequency_penalty=-1), "frequency_penalty", "penalty changes the output"),
    ("repeat_penalty", CHAT, chat(repeat_penalty=1.1), "repeat_penalty", "send repetition_penalty"),
    ("logit_bias", CHAT, chat(logit_bias={"5": 10}), "logit_bias", "logit_bias"),
    ("allowed_token_ids", CHAT, chat(allowed_token_ids=[1, 2]), "allowed_token_ids", "restricting the vocabulary"),
    ("bad_words", CHAT, chat(bad_words=["x"]), "bad_words", "banning words"),
    ("typical_p", CHAT, chat(typical_p=0.5), "typical_p", "typical sampling"),
    ("mirostat", CHAT, chat(mirostat=2), "mirostat", "mirostat"),
    ("guided_choice empty", CHAT, chat(guided_choice=[]), "guided_choice", "the choice is empty"),
    ("guided_json an invalid schema", CHAT, chat(guided_json={"type": "frob"}), "guided_json", "Invalid type"),
    ("guided_json unsatisfiable", CHAT, chat(guided_json={"type": "integer", "minimum": 5, "maximum": 3}),
     "guided_json", "Unsatisfiable schema"),
    ("guided_regex invalid", COMPLETIONS, completion(guided_regex="a("), "guided_regex", "invalid regular expression"),
    ("two constraints", CHAT, chat(guided_regex="a+", guided_choice=["a"]), "response_format",
     "give one structured-output constraint"),
    ("a grammar and min_tokens", CHAT, chat(guided_choice=["a"], min_tokens=2), "min_tokens", "with structured output"),
    ("a grammar and ignore_eos", CHAT, chat(guided_choice=["a"], ignore_eos=True), "ignore_eos",
     "with structured output"),
    ("response_format json_schema without a schema", CHAT, chat(response_format={"type": "json_schema"}),
     "response_format", "json_schema goes with type"),
    ("structured_outputs an unknown key", CHAT, chat(structured_outputs={"structural_tag": "x"}), "structured_outputs",
     "unknown field"),
    ("structured_outputs a bad Lark grammar", CHAT, chat(structured_outputs={"grammar": 'start: "a" | b_rule'}),
     "structured_outputs", "invalid grammar"),
    ("guided_grammar bad GBNF", COMPLETIONS, completion(guided_grammar='root ::= "a" ('), "guided_grammar",
     "invalid grammar"),
    ("guided_grammar unsatisfiable", COMPLETIONS, completion(guided_grammar="start: /[^\\s\\S]/"), "guided_grammar",
     "cannot be satisfied"),
    ("grammar", COMPLETIONS, completion(grammar="root ::= 'a'"), "grammar", "this form of constrained output"),
    ("json_schema", COMPLETIONS, completion(json_schema={"type": "object"}), "json_schema", "constrained output"),
    ("response_format unknown", CHAT, chat(response_format={"type": "yaml"}), "response_format",
     "Input should be 'text', 'json_object' or 'json_schema'"),
    ("prompt_logprobs streamed", COMPLETIONS, completion(prompt_logprobs=1, stream=True), "prompt_logprobs",
     "not served with stream: true"),
    ("prompt_logprobs all (-1) past --max-logprobs", CHAT, chat(prompt_logprobs=-1), "prompt_logprobs",
     "prompt_logprobs -1 asks for 259 tokens a position, more than this server serves (20); ask for at most 20, or "
     "start the server with --max-logprobs -1"),
    ("prompt_logprobs -2", COMPLETIONS, completion(prompt_logprobs=-2), "prompt_logprobs",
     "greater than or equal to -1"),
    ("prompt_logprobs 21", CHAT, chat(prompt_logprobs=21), "prompt_logprobs", "more than this server serves (20)"),
    ("completion echo 0", COMPLETIONS, completion(echo=0), "echo", "echo"),
    ("chat echo", CHAT, chat(echo=True), "echo", "echo in chat"),
    ("suffix", COMPLETIONS, completion(suffix="end"), "suffix", "suffix"),
    ("tools", CHAT, chat(tools=[{"type": "function", "function": {"name": "f"}}]), "tools", "tools are not served"),
    ("tool_choice", CHAT, chat(tool_choice="auto"), "tool_choice", "tools are not served"),
    ("functions", CHAT, chat(functions=[{"name": "f"}]), "functions", "legacy tools"),
    ("function_call", CHAT, chat(function_call="auto"), "function_call", "legacy tools"),
    ("audio modality", CHAT, chat(modalities=["text", "audio"]), "modalities", "only text output"),
    ("audio", CHAT, chat(audio={"voice": "alloy", "format": "wav"}), "audio", "audio"),
    ("skip_special_tokens false", CHAT, chat(skip_special_tokens=False), "skip_special_tokens", "special tokens"),
    ("stream_options without stream", CHAT, chat(stream_options={"include_usage": True}), "stream_options",
     "only allowed with stream: true"),
    ("continuous usage", CHAT, chat(stream=True, stream_options={"continuous_usage_stats": True}), "stream_options",
     "usage on every chunk"),
    ("an unknown field", CHAT, chat(frobnicate=1), "frobnicate", "frobnicate: unknown field"),
]


@pytest.mark.parametrize("path, body, status, words", [case[1:] for case in MALFORMED],
                         ids=[case[0] for case in MALFORMED])
def test_a_malformed_request_gets_one_openai_error(server, path, body, status, words):
    got, reply = server.request("POST", path, body)
    assert got == status, reply
    error = reply["error"]
    assert words in error["message"], error
    assert set(error) == {"message", "type", "param", "code"} and "\n" not in error["message"]


@pytest.mark.parametrize("path, body, param, words", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_a_field_not_served_is_refused_by_name(server, path, body, param, words):
    got, reply = server.request("POST", path, body)
    assert got == 400, reply
    error = reply["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "invalid_request_error" and "\n" not in error["message"]
    assert "Input should be a valid string" not in error["message"]  # a union's error is never the answer


HARMLESS = [
    ("user and metadata", CHAT, chat(user="ann", metadata={"team": "a"}, store=False, service_tier="auto")),
    ("the defaults of refused fields", CHAT, chat(n=1, presence_penalty=0, frequency_penalty=0.0, logit_bias={},
                                                  logprobs=False, tool_choice="none", tools=[], echo=False,
                                                  response_format={"type": "text"}, modalities=["text"],
                                                  repetition_penalty=1, typical_p=1.0, best_of=1)),
    ("nulls", COMPLETIONS, completion(suffix=None, logprobs=None, echo=None, seed=None, stop=None, user=None)),
]


@pytest.mark.parametrize("path, body", [case[1:] for case in HARMLESS], ids=[case[0] for case in HARMLESS])
def test_harmless_fields_are_accepted(server, path, body):
    got, reply = server.request("POST", path, body)
    assert got == 200, reply
    assert reply["usage"]["completion_tokens"] >= 1


def test_unknown_paths_and_methods_get_json_errors(server):
    status, reply = server.request("GET", "/v1/nothing")
    assert status == 404 and reply["error"]["code"] == "not_found"
    status, reply = server.request("GET", "/v1/completions")
    assert status == 405 and reply["error"]["code"] == "method_not_allowed"


def test_detokenize_names_an_id_outside_the_vocabulary(server):
    status, reply = server.request("POST", "/detokenize", {"tokens": [1, 10**6]})
    assert status == 400 and reply["error"]["param"] == "tokens" and "outside the vocabulary" in reply["error"]["message"]
    status, reply = server.request("POST", "/tokenize", {"prompt": "a", "messages": user("b")})
    assert status == 400 and "either prompt or messages" in reply["error"]["message"]
    status, reply = server.request("POST", "/tokenize", {"prompt": "a", "return_token_strs": "yes"})
    assert status == 400 and reply["error"]["param"] == "return_token_strs"


def test_an_oversized_body_gets_413_and_the_server_serves_on(server):
    """A 10 MB body: refused from its Content-Length, before it is read; then every slot is
    free and a request succeeds."""
    big = json.dumps(completion(prompt="a" * (10 << 20)))
    status, reply = server.request("POST", COMPLETIONS, big)
    assert status == 413 and "larger than the limit of 65536 bytes" in reply["error"]["message"]
    server.wait_idle()
    status, reply = server.request("POST", COMPLETIONS, completion(max_tokens=2))
    assert status == 200 and reply["usage"]["completion_tokens"] == 2
