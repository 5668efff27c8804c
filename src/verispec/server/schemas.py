"""The OpenAI request bodies the server accepts, validated by pydantic where they enter.

A body is parsed once, here, into typed values (`SamplingParams`, a stop list, a budget); only
those travel on to the engine. Every field is honoured, refused or ignored, and docs/serving.md
lists which:

- honoured: the sampling transforms (temperature, top_k, top_p, min_p, and vLLM's
  `repetition_penalty` and `min_tokens`, which the engine applies to the target's rows before
  verification, so the law stays exact), the seed, the stops (`stop`, `stop_token_ids`,
  `ignore_eos`, `include_stop_str_in_output`), the budget, streaming, and how the prompt is
  encoded (a message's `name`, `reasoning_effort`, vLLM's `add_generation_prompt`,
  `continue_final_message` and `add_special_tokens`), the reply's logprobs (the target's own,
  `verispec.logprobs`: plain decoding's under speculation too), the prompt's (vLLM's
  `prompt_logprobs`, and completions' `echo`), structured output (`response_format`, vLLM's
  `structured_outputs` and `guided_*`);
- refused with a 400 naming the field (`REFUSED`), at any value that would change the reply:
  several outputs, penalties whose law verispec does not keep, logit biases, constrained
  output in other forms, tools, audio;
- ignored, because they change nothing in the reply (`IGNORED`: `user`, `metadata`, ...).

Any other field is refused as unknown: a field the server does not know is never dropped
silently.

    >>> body = CompletionBody.model_validate_json('{"model": "m", "prompt": "Hi", "temperature": 0.7, "top_k": -1}')
    >>> body.sampling()
    SamplingParams(temperature=0.7, top_k=None, top_p=None, min_p=None, repetition_penalty=1.0, min_tokens=0)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    create_model,
    field_validator,
    model_validator,
)

from verispec.logprobs import ALL
from verispec.sampling import SamplingParams

MAX_STOPS = 4  # OpenAI's bound on stop strings
MAX_STOP_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
# Below this a temperature divides logits by so little that a whole row can underflow to -inf;
# such a request asks for greedy decoding, which temperature 0 gives exactly.
MIN_TEMPERATURE = 1e-3
MAX_SEED = 2**63 - 1  # the random source's seed is a signed 64-bit integer

FINITE = ConfigDict(strict=True, allow_inf_nan=False, extra="forbid")

CONSTRAINED = ("this form of constrained output is not served; send response_format (json_schema or json_object), "
               "structured_outputs, or guided_json, guided_regex, guided_choice or guided_grammar")
PENALTY = "this penalty changes the output distribution in a way verispec does not verify; drop it or send 0"
TOOLS = "tools are not served; drop it"
REFUSED: dict[str, tuple[str, tuple]] = {
    # name: (why it is refused, the values accepted: those that leave the reply as it is)
    "n": ("only n = 1 is served; send several requests for several outputs", (1,)),
    "best_of": ("only best_of = 1 is served", (1,)),
    "use_beam_search": ("beam search is not served", (False,)),
    "length_penalty": ("beam search is not served", (1,)),
    "frequency_penalty": (PENALTY, (0,)),
    "presence_penalty": (PENALTY, (0,)),
    "repeat_penalty": ("llama.cpp's repeat_penalty (over the last tokens only) is not served; send "
                       "repetition_penalty, which is", (1,)),
    "logit_bias": ("logit_bias changes the output distribution, which verispec keeps exact; drop it", ({},)),
    "allowed_token_ids": ("restricting the vocabulary changes the output distribution; drop it", ()),
    "bad_words": ("banning words changes the output distribution; drop it", ([],)),
    "typical_p": ("typical sampling is not served; drop it or send 1", (1,)),
    "mirostat": ("mirostat sampling is not served; drop it or send 0", (0,)),
    "mirostat_tau": ("mirostat sampling is not served; drop it", ()),
    "mirostat_eta": ("mirostat sampling is not served; drop it", ()),
    "tfs_z": ("tail-free sampling is not served; drop it or send 1", (1,)),
    "grammar": (CONSTRAINED, ()),
    "json_schema": (CONSTRAINED, ()),
    "suffix": ("suffix is not served", ()),
    "tools": (TOOLS, ([],)),
    "tool_choice": (TOOLS, ("none",)),
    "functions": ("functions (the legacy tools) are not served; drop it", ([],)),
    "function_call": ("functions (the legacy tools) are not served; drop it", ("none",)),
    "modalities": ("only text output is served", (["text"],)),
    "audio": ("audio output is not served", ()),
    "skip_special_tokens": ("special tokens are always left out of the text", (True,)),
}
# Fields clients send that change nothing in the reply: accepted and ignored (as by OpenAI for
# a model without the feature, and by vLLM and llama-server).
# spaces_between_special_tokens (vLLM's) only spaces special tokens, which the text leaves out;
# cache_prompt (llama-server's) is about reusing a cache, which the reply does not depend on.
IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
           "safety_identifier", "spaces_between_special_tokens", "cache_prompt")


def accepted(value: object, allowed: tuple) -> bool:
    """Whether `value` is null or one of `allowed`, booleans and numbers kept apart (`n: true`
    is not `n: 1`)."""
    if value is None:
        return True
    for choice in allowed:
        if isinstance(value, bool) or isinstance(choice, bool):
            if type(value) is type(choice) and value == choice:
                return True
        elif isinstance(choice, (int, float)):
            if isinstance(value, (int, float)) and value == choice:
                return True
        elif value == choice:
            return True
    return False


def _refuse(cls, value: object, info: ValidationInfo) -> None:
    why, allowed = REFUSED[info.field_name]
    if not accepted(value, allowed):
        raise ValueError(why)
    return None


Refusals = create_model(
    "Refusals",
    __config__=FINITE,
    __validators__={"refuse": field_validator(*REFUSED, mode="before")(_refuse)},
    **{name: (Any, None) for name in (*REFUSED, *IGNORED)},
)
Refusals.__doc__ = "Every refused and ignored field (`REFUSED`, `IGNORED`): checked, then dropped."


class StreamOptions(BaseModel):
    model_config = FINITE
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's; refused when true

    @field_validator("continuous_usage_stats")
    @classmethod
    def _continuous(cls, value: bool) -> bool:
        if value:
            raise ValueError("usage on every chunk is not served; usage comes once, with include_usage")
        return value


class SpeculationFields(BaseModel):
    """verispec's extension, in vLLM's style: this request's speculation. enabled: false decodes
    it plainly (no proposer); max_k: the most tokens a round drafts (`Request.max_k`). Either
    leaves the output law as it is: only the speed changes."""

    model_config = FINITE
    enabled: StrictBool = True
    max_k: Annotated[StrictInt, Field(ge=0)] | None = None


class JsonSchemaFormat(BaseModel):
    model_config = FINITE
    name: StrictStr | None = None
    description: StrictStr | None = None
    schema_: dict[str, Any] | StrictBool = Field(True, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: text, any JSON object, or JSON following a schema."""

    model_config = FINITE
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema goes with type 'json_schema', and only with it")
        return self


class Constraint(BaseModel):
    """A request's structured output, once validated: its kind (json_schema, json_object, regex,
    choice, grammar), the value, and the field that named it."""

    kind: Literal["json_schema", "json_object", "regex", "choice", "grammar"]
    value: Any = None
    param: str


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its `StructuredOutputsParams`): one of a JSON schema, any
    JSON object, a regular expression, a choice of strings or a grammar (Lark or GBNF)."""

    model_config = FINITE
    json_: dict[str, Any] | StrictStr | None = Field(None, alias="json")
    json_object: StrictBool | None = None
    regex: StrictStr | None = None
    choice: list[StrictStr] | None = None
    grammar: StrictStr | None = None

    def given(self) -> list[Constraint]:
        param = "structured_outputs"
        found = [Constraint(kind=kind, value=value, param=param)
                 for kind, value in (("json_schema", self.json_), ("regex", self.regex), ("choice", self.choice),
                                     ("grammar", self.grammar)) if value is not None]
        return found + ([Constraint(kind="json_object", param=param)] if self.json_object else [])


class SamplingFields(Refusals):
    """What completions and chat completions share: the budget, the sampling transforms
    (temperature, top_k, top_p, min_p, repetition_penalty, min_tokens, as `SamplingParams`
    applies them), the seed, the stops and streaming; and every refused and ignored field."""

    model_config = FINITE

    model: StrictStr
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: StrictInt | None = None
    min_p: Annotated[float, Field(ge=0, lt=1)] | None = None
    repetition_penalty: Annotated[float, Field(gt=0)] | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0)] = 0
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    stop_token_ids: list[Annotated[StrictInt, Field(ge=0)]] | None = None
    ignore_eos: StrictBool = False
    include_stop_str_in_output: StrictBool = False
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # vLLM's: the prompt tokens' logprobs with this many alternatives, -1 all of them (not with
    # stream, as vLLM's; at most the server's --max-logprobs)
    prompt_logprobs: Annotated[StrictInt, Field(ge=ALL)] | None = None
    # verispec's extension (as vLLM's `return_token_ids`): each choice carries its token ids.
    return_token_ids: StrictBool = False
    speculation: SpeculationFields = SpeculationFields()
    # structured output: OpenAI's response_format, vLLM's structured_outputs and guided_* fields
    # (at most one constraint in all)
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | StrictStr | None = None
    guided_regex: StrictStr | None = None
    guided_choice: list[StrictStr] | None = None
    guided_grammar: StrictStr | None = None

    def constraint(self) -> Constraint | None:
        """The one structured-output constraint asked for (ValueError for several), or None."""
        given = []
        form = self.response_format
        if form is not None and form.type == "json_object":
            given.append(Constraint(kind="json_object", param="response_format"))
        if form is not None and form.type == "json_schema":
            given.append(Constraint(kind="json_schema", value=form.json_schema.schema_, param="response_format"))
        if self.guided_json is not None:
            given.append(Constraint(kind="json_schema", value=self.guided_json, param="guided_json"))
        if self.guided_regex is not None:
            given.append(Constraint(kind="regex", value=self.guided_regex, param="guided_regex"))
        if self.guided_choice is not None:
            given.append(Constraint(kind="choice", value=self.guided_choice, param="guided_choice"))
        if self.guided_grammar is not None:
            given.append(Constraint(kind="grammar", value=self.guided_grammar, param="guided_grammar"))
        if self.structured_outputs is not None:
            given.extend(self.structured_outputs.given())
        if len(given) > 1:
            raise ValueError(f"give one structured-output constraint, got {', '.join(c.param for c in given)}")
        return given[0] if given else None

    @field_validator("temperature")
    @classmethod
    def _temperature(cls, t: float | None) -> float | None:
        if t is not None and 0 < t < MIN_TEMPERATURE:
            raise ValueError(f"a temperature in (0, {MIN_TEMPERATURE}) is refused; use 0 for greedy decoding")
        return t

    @field_validator("top_k")
    @classmethod
    def _top_k(cls, k: int | None) -> int | None:
        if k is not None and k < -1:
            raise ValueError("top_k must be -1 or 0 (no top-k filter) or an integer >= 1")
        return k

    @field_validator("stop", mode="before")
    @classmethod
    def _stop(cls, stop: object) -> list[str]:
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise ValueError("stop must be a string or a list of up to 4 strings")
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not s for s in stops) or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return stops

    @field_validator("stop_token_ids")
    @classmethod
    def _stop_token_ids(cls, ids: list[int] | None) -> list[int] | None:
        if ids is not None and len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"at most {MAX_STOP_TOKEN_IDS} stop token ids, got {len(ids)}")
        return ids

    @field_validator("stream_options")
    @classmethod
    def _stream_options(cls, options: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        if options is not None and not info.data.get("stream", False):
            raise ValueError("stream_options is only allowed with stream: true")
        return options

    @field_validator("prompt_logprobs")
    @classmethod
    def _prompt_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and info.data.get("stream", False):
            raise ValueError("the prompt's logprobs are not served with stream: true (as vLLM's); send the request "
                             "whole, or drop prompt_logprobs")
        return top

    def top_logprobs_count(self) -> int | None:
        """How many of the most likely tokens each position reports (`Request.logprobs`);
        None: no logprobs."""
        raise NotImplementedError

    def prompt_logprobs_count(self) -> int | None:
        """How many of the most likely tokens each prompt position reports
        (`Request.prompt_logprobs`); None: the prompt is not scored."""
        return self.prompt_logprobs

    def sampling(self) -> SamplingParams:
        """The transforms shared by p and q (greedy when temperature is 0; default 1, as OpenAI's)."""
        temperature = 1.0 if self.temperature is None else float(self.temperature)
        top_k = None if self.top_k in (None, -1, 0) else self.top_k
        penalty = 1.0 if self.repetition_penalty is None else float(self.repetition_penalty)
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=penalty, min_tokens=self.min_tokens)

    @property
    def stops(self) -> list[str]:
        return self.stop or []  # the validator made it a list

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingFields):
    """`POST /v1/completions`: one prompt, as text or as token ids."""

    prompt: StrictStr | list[StrictInt]
    add_special_tokens: StrictBool = True  # vLLM's: the tokenizer's special tokens (BOS) before a text prompt
    # OpenAI's legacy form: the emitted tokens' logprobs with this many alternatives (OpenAI's
    # bound is 5; vLLM's and verispec's, the server's --max-logprobs, 20 by default)
    logprobs: Annotated[StrictInt, Field(ge=0)] | None = None
    echo: StrictBool | None = None  # OpenAI's: the reply begins with the prompt (and its logprobs)

    @field_validator("logprobs", mode="before")
    @classmethod
    def _logprobs(cls, top: object) -> object:
        if top == ALL and type(top) is int:
            raise ValueError(f"{ALL} (the whole vocabulary) is not served on completions' logprobs, as vLLM's; send "
                             f"a count, or ask for the whole vocabulary with chat's top_logprobs: {ALL} or "
                             f"prompt_logprobs: {ALL}")
        return top

    def top_logprobs_count(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_count(self) -> int | None:
        """vLLM's rule: prompt_logprobs when given, else echo's (logprobs' count)."""
        if self.prompt_logprobs is not None or not self.echo:
            return self.prompt_logprobs
        return self.logprobs

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, prompt: object) -> object:
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise ValueError("one prompt per request is served; send a request for each prompt")
        if not isinstance(prompt, (str, list)) or (isinstance(prompt, list) and not all(
                isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            raise ValueError("the prompt must be a string or a list of token ids (integers)")
        if not prompt:
            raise ValueError("the prompt is empty; give at least one character or token id")
        if isinstance(prompt, list) and any(t < 0 for t in prompt):
            raise ValueError("prompt token ids must be integers >= 0")
        return prompt


class TextPart(BaseModel):
    model_config = FINITE
    type: StrictStr
    text: StrictStr


class Message(BaseModel):
    """One chat message: its role, its content and OpenAI's optional `name` of the participant,
    which the chat template receives (a template that does not read it renders as without)."""

    model_config = FINITE
    role: StrictStr
    content: StrictStr | list[TextPart]
    name: StrictStr | None = None

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, role: object) -> object:
        if role in ("tool", "function"):
            raise ValueError(f"role {role!r} is not served: tools are not served")
        if role not in ("system", "developer", "user", "assistant"):
            raise ValueError(f"role must be system, developer, user or assistant, got {role!r}")
        return role

    @field_validator("content", mode="before")
    @classmethod
    def _content(cls, content: object) -> object:
        if isinstance(content, str):
            return content
        if not isinstance(content, list):
            raise ValueError("content must be a string or a list of text parts (assistant tool calls are not served)")
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise ValueError(f"only text parts are served, got a part of type {kind!r}")
        return content

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")  # OpenAI's values


@dataclass(frozen=True)
class ChatPrompt:
    """What the chat template renders, and how (vLLM's options): messages as the template reads
    them; add_generation_prompt: end with the assistant's header; continue_final_message: leave
    the last (assistant) message open, to be continued; add_special_tokens: the tokenizer adds
    its special tokens (BOS) to the rendered text, which the template usually writes itself;
    reasoning_effort: OpenAI's, passed to the template (which a reasoning model's reads)."""

    messages: list[dict[str, str]]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    reasoning_effort: str | None = None


class ChatFields(BaseModel):
    """The chat template's options that vLLM's chat endpoints share (`ChatPrompt`)."""

    model_config = FINITE
    add_generation_prompt: StrictBool = True
    continue_final_message: StrictBool = False
    reasoning_effort: Literal[REASONING_EFFORTS] | None = None

    def chat_prompt(self, messages: list[Message], add_special_tokens: bool) -> ChatPrompt:
        """The prompt to render; ValueError for options that contradict each other or the messages."""
        if self.continue_final_message and self.add_generation_prompt:
            raise ValueError("continue_final_message continues the last message, so it needs "
                             "add_generation_prompt: false")
        if self.continue_final_message and messages[-1].role != "assistant":
            raise ValueError("continue_final_message continues the last message, which must be the assistant's")
        return ChatPrompt(conversation(messages), self.add_generation_prompt, self.continue_final_message,
                          add_special_tokens, self.reasoning_effort)


class ChatBody(SamplingFields, ChatFields):
    """`POST /v1/chat/completions`: the messages, rendered by the model's chat template."""

    messages: list[Message]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    add_special_tokens: StrictBool = False  # vLLM's, for chat
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=ALL)] | None = None  # -1: all (vLLM's); at most --max-logprobs
    echo: StrictBool | None = None  # vLLM's chat echo (the last message prepended): refused

    @field_validator("echo")
    @classmethod
    def _echo(cls, echo: bool | None) -> bool | None:
        if echo:
            raise ValueError("echo in chat (vLLM's: the last message prepended to the reply) is not served; drop it")
        return echo

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs(cls, top: int | None, info: ValidationInfo) -> int | None:
        if top is not None and not info.data.get("logprobs", False):
            raise ValueError("top_logprobs needs logprobs: true")
        return top

    def top_logprobs_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[Message]) -> list[Message]:
        if not messages:
            raise ValueError("messages is empty; give at least one message")
        return messages

    @model_validator(mode="after")
    def _one_budget(self) -> ChatBody:
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self

    def chat(self) -> ChatPrompt:
        return self.chat_prompt(self.messages, self.add_special_tokens)


class TokenizeBody(ChatFields):
    """`POST /tokenize` (vLLM's): a prompt's ids as `/v1/completions` reads it, or messages' as
    `/v1/chat/completions` renders them, with vLLM's options: add_special_tokens (default true
    for a prompt, false for messages), return_token_strs (each id's token as the vocabulary
    spells it) and the chat template's (`ChatFields`)."""

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[Message] | None = None
    add_special_tokens: StrictBool | None = None
    return_token_strs: StrictBool = False

    @model_validator(mode="after")
    def _one_input(self) -> TokenizeBody:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self

    @property
    def special_tokens(self) -> bool:
        return self.add_special_tokens if self.add_special_tokens is not None else self.prompt is not None

    def chat(self) -> ChatPrompt:
        return self.chat_prompt(self.messages, self.special_tokens)


def conversation(messages: list[Message]) -> list[dict[str, str]]:
    """The messages as the chat template reads them (`developer` is OpenAI's new name for
    `system`; a `name` only where given)."""
    return [{"role": "system" if m.role == "developer" else m.role, "content": m.text,
             **({"name": m.name} if m.name is not None else {})} for m in messages]


class DetokenizeBody(BaseModel):
    """`POST /detokenize` (vLLM's): the text of token ids."""

    model_config = FINITE
    model: StrictStr | None = None
    tokens: list[Annotated[StrictInt, Field(ge=0)]]


def first_error(error: ValidationError) -> tuple[str, str | None]:
    """One line for a validation error: where and what (`temperature: Input should be a finite
    number`), and the top-level field it concerns (OpenAI's `param`)."""
    detail = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in detail["loc"])
    param = str(detail["loc"][0]) if detail["loc"] else None
    message = detail["msg"].removeprefix("Value error, ")
    if detail["type"] == "json_invalid":
        return f"the body is not valid JSON: {detail['ctx']['error']}", None
    if detail["type"] == "model_type" and not detail["loc"]:
        return "the body must be a JSON object", None
    if detail["type"] == "missing":
        return f"{where} is required", param
    if detail["type"] == "extra_forbidden":
        return (f"{where}: unknown field; this server does not serve it (docs/serving.md lists every field it "
                "honours, refuses or ignores); drop it"), param
    return (f"{where}: {message}" if where else message), param
