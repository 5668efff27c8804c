"""The OpenAI request bodies the server accepts, validated by pydantic where they enter.

A body is parsed once, here, into typed values (`SamplingParams`, a stop list, a budget); only
those travel on to the engine. What verispec cannot do exactly is refused with a 400 that says
so, never ignored: n > 1, logprobs, penalties and logit biases change the output law or ask for
several outputs. Fields OpenAI clients send that do not change the output (`user`, `metadata`,
`parallel_tool_calls` unset, ...) are accepted and ignored, as vLLM and llama-server do.

    >>> body = CompletionBody.model_validate_json('{"model": "m", "prompt": "Hi", "temperature": 0.7, "top_k": -1}')
    >>> body.sampling()
    SamplingParams(temperature=0.7, top_k=None, top_p=None, min_p=None)
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError, field_validator, model_validator

from verispec.sampling import SamplingParams

MAX_STOPS = 4  # OpenAI's bound on stop strings
MAX_STOP_CHARS = 256
# Below this a temperature divides logits by so little that a whole row can underflow to -inf;
# such a request asks for greedy decoding, which temperature 0 gives exactly.
MIN_TEMPERATURE = 1e-3
MAX_SEED = 2**63 - 1  # the random source's seed is a signed 64-bit integer

FINITE = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")


class StreamOptions(BaseModel):
    model_config = FINITE
    include_usage: bool = False


class SamplingFields(BaseModel):
    """What completions and chat completions share: the budget, the sampling transforms
    (temperature, top_k, top_p, min_p, as `SamplingParams` applies them), the seed, the stop
    strings and streaming, and the refusals of what cannot be served exactly."""

    model_config = FINITE

    model: StrictStr
    max_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: StrictInt | None = None
    min_p: Annotated[float, Field(ge=0, lt=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=0, le=MAX_SEED)] | None = None
    stop: StrictStr | list[StrictStr] | None = None
    n: Literal[1] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # verispec's extension (as vLLM's `return_token_ids`): each choice carries its token ids.
    return_token_ids: bool = False
    # Accepted only at the values that leave the output law alone.
    frequency_penalty: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: Literal[False] | None = None
    best_of: Literal[1] | None = None

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

    @field_validator("stop")
    @classmethod
    def _stop(cls, stop: str | list[str] | None) -> list[str]:
        stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
        if any(not s for s in stops) or any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"each stop string must have 1 to {MAX_STOP_CHARS} characters")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, bias: dict[str, float] | None) -> None:
        if bias:
            raise ValueError("logit_bias changes the output distribution, which verispec keeps exact; drop it")
        return None

    def sampling(self) -> SamplingParams:
        """The transforms shared by p and q (greedy when temperature is 0; default 1, as OpenAI's)."""
        temperature = 1.0 if self.temperature is None else float(self.temperature)
        top_k = None if self.top_k in (None, -1, 0) else self.top_k
        return SamplingParams(temperature=temperature, top_k=top_k, top_p=self.top_p, min_p=self.min_p)

    @property
    def stops(self) -> list[str]:
        return self.stop or []  # the validator made it a list

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionBody(SamplingFields):
    """`POST /v1/completions`: one prompt, as text or as token ids."""

    prompt: StrictStr | list[StrictInt]
    echo: Literal[False] | None = None
    suffix: None = None

    @field_validator("prompt")
    @classmethod
    def _prompt(cls, prompt: str | list[int]) -> str | list[int]:
        if not prompt:
            raise ValueError("the prompt is empty; give at least one character or token id")
        if isinstance(prompt, list) and any(t < 0 for t in prompt):
            raise ValueError("prompt token ids must be integers >= 0")
        return prompt


class TextPart(BaseModel):
    model_config = FINITE
    type: Literal["text"]
    text: StrictStr


class Message(BaseModel):
    model_config = FINITE
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(part.text for part in self.content)


class ChatBody(SamplingFields):
    """`POST /v1/chat/completions`: the messages, rendered by the model's chat template."""

    messages: list[Message]
    max_completion_tokens: Annotated[StrictInt, Field(ge=1)] | None = None
    tools: None = None
    tool_choice: Literal["none"] | None = None
    response_format: dict | None = None
    top_logprobs: None = None

    @field_validator("messages")
    @classmethod
    def _messages(cls, messages: list[Message]) -> list[Message]:
        if not messages:
            raise ValueError("messages is empty; give at least one message")
        return messages

    @field_validator("response_format")
    @classmethod
    def _response_format(cls, value: dict | None) -> None:
        if value is not None and value.get("type", "text") != "text":
            raise ValueError("only response_format {'type': 'text'} is served; constrained output changes the law")
        return None

    @model_validator(mode="after")
    def _one_budget(self) -> ChatBody:
        if self.max_tokens is None:
            self.max_tokens = self.max_completion_tokens
        return self

    def conversation(self) -> list[dict[str, str]]:
        """The messages as the chat template reads them (`developer` is OpenAI's new name for
        `system`)."""
        return [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in self.messages]


def first_error(error: ValidationError) -> tuple[str, str | None]:
    """One line for a validation error: where and what (`temperature: Input should be a finite
    number`), and the top-level field it concerns (OpenAI's `param`)."""
    detail = error.errors(include_url=False)[0]
    where = ".".join(str(part) for part in detail["loc"])
    message = detail["msg"].removeprefix("Value error, ")
    if detail["type"] == "json_invalid":
        return f"the body is not valid JSON: {detail['ctx']['error']}", None
    if detail["type"] == "model_type":
        return "the body must be a JSON object", None
    if detail["type"] == "missing":
        return f"{where} is required", where
    if where in REFUSED:
        return f"{where}: {REFUSED[where]}", where
    return (f"{where}: {message}" if where else message), (str(detail["loc"][0]) if detail["loc"] else None)


REFUSED = {
    "n": "only n = 1 is served; send several requests for several outputs",
    "best_of": "only best_of = 1 is served",
    "frequency_penalty": "penalties change the output distribution, which verispec keeps exact; drop it or send 0",
    "presence_penalty": "penalties change the output distribution, which verispec keeps exact; drop it or send 0",
    "logprobs": "logprobs are not served",
    "echo": "echo is not served",
    "tools": "tools are not served",
    "tool_choice": "tools are not served",
    "suffix": "suffix is not served",
    "top_logprobs": "logprobs are not served",
}
