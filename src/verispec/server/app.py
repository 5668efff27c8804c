"""The HTTP application: OpenAI's completions and chat completions over the batched engine.

Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (whole or streamed as
server-sent events), `GET /v1/models`, vLLM's `POST /tokenize` and `POST /detokenize`,
`GET /version`, `GET /health`, `GET /metrics`; a path may end with a slash. Every reply
carries `usage`, a `system_fingerprint` (the version, model and speculation it was decoded
with), each choice's `stop_reason` (vLLM's: the stop string or stop token id that ended it),
the request's `speculative_decoding` (vLLM's counts: drafts, drafted and accepted tokens,
accepted by position), vLLM's per-request `metrics.speculative_decoding` (its acceptance
histogram) and llama-server's `timings`; a streamed reply carries them on its last chunk (and
`usage` on a chunk of its own with `stream_options.include_usage`). A request may turn its
speculation off or cap it (`speculation`), ask for logprobs (the target's own, plain
decoding's) and constrain its output to a grammar (`response_format`, `structured_outputs`,
`guided_*`).

Seeds: a sampled reply's tokens are plain decoding's for its seed whatever the speculation
(the coupled rule), so a seeded request reproduces with the k policy adapting freely; one
without a seed gets a fresh seed, and every reply reports its `seed` (as vLLM's sampling
parameters name it), so any reply can be replayed.

Every refusal is one OpenAI-style JSON error, `{"error": {"message", "type", "param", "code"}}`:
400 a bad field or too long a prompt, 401 a missing or wrong key (`api_key`), 404 an unknown
model or path, 405 a wrong method, 408 a body that did not arrive in time, 413 a body over
`max_body_bytes`, 429 every slot and the queue taken, 503 shutting down (the server keeps
listening while it drains, so a new client is answered rather than refused); a step that fails
inside the engine ends its requests with a 500 (or finish_reason "error" mid-stream) and the
server serves on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import hashlib
import hmac
import itertools
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from verispec import __version__
from verispec.batching import QueueFull, Scheduler
from verispec.k_spec import KSpec, parse_k
from verispec.grammar import GrammarCompiler
from verispec.logprobs import ALL, MAX_TOP, TokenLogprob
from verispec.registry import ProposerSpec, parse_spec
from verispec.request import Request
from verispec.sampling import SamplingParams
from verispec.server.engine_thread import Closed, EngineThread, Finished, Speculation
from verispec.server.metrics import CONTENT_TYPE, Metrics
from verispec.server.output import Output
from verispec.server.schemas import (
    ChatBody,
    ChatPrompt,
    CompletionBody,
    DetokenizeBody,
    SamplingFields,
    TokenizeBody,
    first_error,
)

log = logging.getLogger("verispec.server")


@dataclass
class ServedModel:
    """What the server needs of a model. name: the `model` requests must name. encode: text and
    whether to add the tokenizer's special tokens -> prompt ids; encode_chat: a `ChatPrompt` ->
    prompt ids through the chat template (None: the model has none); decode: ids -> text;
    token_strs: ids -> each one's token as the vocabulary spells it; token_text: one id -> its
    text (special tokens spelled out), as logprobs name tokens. vocab_size: the
    target's (token ids at or past it are refused). context: the most positions a request may
    use (None: no bound). proposer, k: the parsed specs every request drafts with (None and 0:
    plain decoding; reported in `speculative_decoding`). grammars: compiles structured-output
    constraints for the tokenizer (None: not served). fingerprint: `system_fingerprint`, which
    changes with the version, the weights and the speculation."""

    name: str
    encode: Callable[[str, bool], list[int]]
    encode_chat: Callable[[ChatPrompt], list[int]] | None
    decode: Callable[[Sequence[int]], str]
    token_strs: Callable[[Sequence[int]], list[str]]
    token_text: Callable[[int], str]
    eos_token_ids: frozenset[int]
    vocab_size: int
    context: int | None
    proposer: ProposerSpec | None
    k: KSpec | int
    grammars: GrammarCompiler | None = None
    fingerprint: str = ""

    @property
    def k_label(self) -> int | str:
        """k as the replies report it: the constant, or the spec's text (`auto`)."""
        if isinstance(self.k, int):
            return self.k
        return self.k.k if self.k.kind == "constant" else self.k.text

    @classmethod
    def of(cls, loaded: object, name: str, proposer: str | ProposerSpec | None, k: int | str | KSpec) -> ServedModel:
        """From a `LoadedModel` (`verispec.models.load_model`) and the proposer and k specs,
        parsed here unless already parsed."""
        tokenizer = loaded.tokenizer
        spec = None if proposer is None else parse_spec(proposer)
        k_spec = k if isinstance(k, KSpec) or k == 0 else parse_k(k, option="k")
        identity = f"{__version__} {loaded.source} {getattr(loaded, 'dtype_name', '')} {loaded.runtime} {spec} {k_spec}"

        def encode_chat(chat: ChatPrompt) -> list[int]:
            effort = {} if chat.reasoning_effort is None else {"reasoning_effort": chat.reasoning_effort}
            formatted = tokenizer.apply_chat_template(
                chat.messages, add_generation_prompt=chat.add_generation_prompt,
                continue_final_message=chat.continue_final_message, tokenize=False, **effort)
            # the template writes its own special tokens (BOS, turn markers) as text, as `LoadedModel.encode`
            return list(tokenizer(formatted, add_special_tokens=chat.add_special_tokens).input_ids)

        return cls(
            name=name,
            encode=lambda text, special=True: list(tokenizer(text, add_special_tokens=special).input_ids),
            encode_chat=encode_chat if loaded.chat_template is not None else None,
            decode=loaded.decode,
            token_strs=lambda ids: list(tokenizer.convert_ids_to_tokens(list(ids))),
            # cached: logprobs -1 name every token of the vocabulary at each position
            token_text=functools.lru_cache(maxsize=None)(lambda token: tokenizer.decode([token])),
            eos_token_ids=frozenset(loaded.eos_token_ids),
            vocab_size=loaded.lm.vocab_size,
            context=getattr(loaded.config, "max_position_embeddings", None),
            proposer=spec,
            k=k_spec,
            grammars=GrammarCompiler(tokenizer, loaded.lm.vocab_size),
            fingerprint="fp_" + hashlib.sha256(identity.encode()).hexdigest()[:12],
        )


@dataclass(frozen=True)
class Limits:
    """api_key: the bearer token /v1/ requires (None: none). max_body_bytes: the largest
    request body (413 past it). body_seconds: how long a body may take to arrive (408).
    default_max_tokens: the budget of a request that names none (cut to the context).
    grace_seconds: at shutdown, how long requests in flight may run before they are cancelled.
    head_seconds: how long a connection may take to send a request's head before it is closed
    (`verispec.server.run.HeadTimeoutH11`). max_logprobs: vLLM's, the most alternatives a
    position's logprobs may list (a 400 past it); -1: the whole vocabulary, so that a request's
    -1 (all of it) is served."""

    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    body_seconds: float = 30.0
    head_seconds: float = 10.0
    default_max_tokens: int = 256
    grace_seconds: float = 10.0
    max_logprobs: int = MAX_TOP


class ApiError(Exception):
    """A request refused: its HTTP status and OpenAI's error fields."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = status, message, kind, param, code

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}
        headers = {"Retry-After": "1"} if self.status == 429 else None
        return JSONResponse(body, status_code=self.status, headers=headers)


HTTP_ERRORS = {404: ("not_found_error", "not_found"), 405: ("invalid_request_error", "method_not_allowed")}


class ServerApp:
    """The server: `asgi` (the Starlette app) over `engine` (the scheduler on its thread),
    with `metrics`. `begin_shutdown` (thread-safe, from a signal handler) drains the engine:
    no new requests, those in flight finish or, after the grace period, end with
    finish_reason "abort"."""

    def __init__(
        self, served: ServedModel, scheduler: Scheduler, limits: Limits = Limits(), *, engine_thread: bool = True
    ) -> None:
        """engine_thread: step the scheduler on a thread of its own; False: the caller runs it
        (`EngineThread.run_here`, `verispec serve` on the main thread)."""
        self.served = served
        self.limits = limits
        self.engine = EngineThread(scheduler, own_thread=engine_thread)
        self.created = int(time.time())
        self.loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task | None = None
        self.metrics = Metrics(
            served.name,
            {
                "num_requests_running": lambda: self.engine.running,
                "num_requests_waiting": lambda: self.engine.waiting,
                "kv_slots_in_use": lambda: self.engine.slots_in_use,
                "kv_slots_total": lambda: self.engine.max_slots,
            },
        )
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/tokenize", self.tokenize, methods=["POST"]),
            Route("/detokenize", self.detokenize, methods=["POST"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.prometheus, methods=["GET"]),
        ]
        self.starlette = Starlette(
            routes=routes,
            exception_handlers={ApiError: lambda _, error: error.response(), HTTPException: http_error,
                                Exception: internal_error},
            lifespan=self._lifespan,
        )

    async def asgi(self, scope: dict, receive: Callable, send: Callable) -> None:
        """The application, a path's trailing slash dropped (`/v1/models/` is `/v1/models`)."""
        path = scope.get("path", "")
        if scope["type"] == "http" and len(path) > 1 and path.endswith("/"):
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.starlette(scope, receive, send)

    # --- life -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = asyncio.get_running_loop()
        self.engine.start(self.loop)
        try:
            yield
        finally:
            await self.drained()

    def begin_shutdown(self) -> None:
        """Start draining (any thread, a signal handler included); idempotent."""
        if self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        if self._drain is None:
            self._drain = asyncio.ensure_future(self.engine.drain(self.limits.grace_seconds))

    async def drained(self) -> None:
        """Drain (if not begun) and return once the engine has stopped."""
        self._start_drain()
        await self._drain

    # --- small endpoints ---------------------------------------------------------------------

    async def health(self, request: HTTPRequest) -> Response:
        if not self.engine.accepting:
            return JSONResponse({"status": "shutting down"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def prometheus(self, request: HTTPRequest) -> Response:
        return Response(self.metrics.exposition(), media_type=CONTENT_TYPE)

    async def version(self, request: HTTPRequest) -> Response:
        return JSONResponse({"version": __version__})

    async def tokenize(self, request: HTTPRequest) -> Response:
        """vLLM's `/tokenize`: the ids a prompt (as `/v1/completions` reads it) or messages (as
        `/v1/chat/completions` renders them) become, with their tokens' strings when asked
        (`token_strs`, null otherwise, as vLLM's)."""
        body = await self._parse(request, TokenizeBody)
        if body.prompt is not None:
            ids = await run_in_threadpool(self.served.encode, body.prompt, body.special_tokens)
        else:
            ids = await self._chat_ids(chat_prompt(body))
        strs = await run_in_threadpool(self.served.token_strs, ids) if body.return_token_strs else None
        return JSONResponse({"count": len(ids), "max_model_len": self.served.context, "tokens": ids,
                             "token_strs": strs})

    async def detokenize(self, request: HTTPRequest) -> Response:
        """vLLM's `/detokenize`: the text of token ids."""
        body = await self._parse(request, DetokenizeBody)
        self._check_ids(body.tokens, "tokens")
        return JSONResponse({"prompt": await run_in_threadpool(self.served.decode, body.tokens)})

    async def models(self, request: HTTPRequest) -> Response:
        self._check_key(request)
        card = {"id": self.served.name, "object": "model", "created": self.created, "owned_by": "verispec",
                "max_model_len": self.served.context}
        return JSONResponse({"object": "list", "data": [card]})

    # --- completions -------------------------------------------------------------------------

    async def completions(self, request: HTTPRequest) -> Response:
        arrival = time.perf_counter()
        body = await self._parse(request, CompletionBody)
        if isinstance(body.prompt, str):
            ids = await run_in_threadpool(self.served.encode, body.prompt, body.add_special_tokens)
        else:
            ids = list(body.prompt)
            self._check_ids(ids, "prompt")
        echo = None
        if body.echo:  # the prompt as given, or its ids' text
            echo = body.prompt if isinstance(body.prompt, str) else await run_in_threadpool(self.served.decode, ids)
        return await self._generate(request, body, ids, arrival, chat=False, echo=echo)

    async def chat_completions(self, request: HTTPRequest) -> Response:
        arrival = time.perf_counter()
        body = await self._parse(request, ChatBody)
        ids = await self._chat_ids(chat_prompt(body))
        return await self._generate(request, body, ids, arrival, chat=True)

    async def _chat_ids(self, chat: ChatPrompt) -> list[int]:
        if self.served.encode_chat is None:
            raise ApiError(400, f"{self.served.name} has no chat template; use /v1/completions", param="messages")
        try:
            return await run_in_threadpool(self.served.encode_chat, chat)
        except Exception as error:  # the template refused the conversation (roles out of order, ...)
            raise ApiError(400, f"the chat template cannot render these messages: {error}", param="messages") from None

    def _check_ids(self, ids: Sequence[int], param: str) -> None:
        vocab = self.served.vocab_size
        bad = [t for t in ids if t >= vocab]
        if bad:
            raise ApiError(400, f"{param}: token id {bad[0]} is outside the vocabulary [0, {vocab})", param=param)

    async def _parse(self, request: HTTPRequest, schema: type) -> object:
        self._check_key(request)
        raw = await self._body(request)
        try:
            body = schema.model_validate_json(raw)
        except ValidationError as error:
            message, param = first_error(error)
            raise ApiError(400, message, param=param) from None
        if body.model is not None and body.model != self.served.name:
            raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {self.served.name!r}",
                           param="model", code="model_not_found")
        return body

    def _check_key(self, request: HTTPRequest) -> None:
        key = self.limits.api_key
        if key is None:
            return
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), key.encode()):
            raise ApiError(401, "a valid API key is required: send the header 'Authorization: Bearer KEY'",
                           kind="authentication_error", code="invalid_api_key")

    async def _body(self, request: HTTPRequest) -> bytes:
        limit = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        too_large = ApiError(413, f"the request body is larger than the limit of {limit} bytes", code="body_too_large")
        if declared.isdigit() and int(declared) > limit:
            raise too_large
        chunks, size = [], 0
        try:
            async with asyncio.timeout(self.limits.body_seconds):
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > limit:
                        raise too_large
                    chunks.append(chunk)
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {self.limits.body_seconds:g} s",
                           code="body_timeout") from None
        return b"".join(chunks)

    def _budget(self, requested: int | None, prompt_tokens: int, chat: bool) -> int:
        context = self.served.context
        if context is not None and prompt_tokens >= context:
            raise ApiError(400, f"the prompt has {prompt_tokens} tokens, but this model's context is {context} "
                           "tokens in all; shorten the prompt", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if requested is None:
            room = self.limits.default_max_tokens
            return room if context is None else min(room, context - prompt_tokens)
        if context is not None and prompt_tokens + requested > context:
            raise ApiError(400, f"this model's context is {context} tokens; the prompt has {prompt_tokens} and "
                           f"max_tokens asks for {requested} more; ask for at most {context - prompt_tokens}",
                           param="max_tokens", code="context_length_exceeded")
        return requested

    def _check_logprobs(self, body: SamplingFields, chat: bool) -> None:
        """A 400 for logprobs or prompt logprobs that ask for more alternatives a position than
        `Limits.max_logprobs` allows (vLLM's rule: -1 asks for the whole vocabulary)."""
        vocab = self.served.vocab_size
        most = vocab if self.limits.max_logprobs == ALL else min(self.limits.max_logprobs, vocab)
        for param, top in (("top_logprobs" if chat else "logprobs", body.top_logprobs_count()),
                           ("prompt_logprobs", body.prompt_logprobs_count())):
            asked = vocab if top == ALL else top
            if top is not None and asked > most:
                wider = "" if self.limits.max_logprobs == ALL else \
                    ", or start the server with --max-logprobs -1 to serve up to the whole vocabulary (-1)"
                raise ApiError(400, f"{param} {top} asks for {asked} tokens a position, more than this server "
                               f"serves ({most}); ask for at most {most}{wider}", param=param)

    async def _constrained(self, body: SamplingFields, sampling: SamplingParams) -> SamplingParams:
        """`sampling` with the request's grammar, compiled (a 400 with the reason when it cannot
        be, or goes with a field that could leave it without a way to end)."""
        try:
            constraint = body.constraint()
        except ValueError as error:
            raise ApiError(400, str(error), param="response_format") from None
        if constraint is None:
            return sampling
        if self.served.grammars is None:
            raise ApiError(400, "structured output is not served for this model", param=constraint.param)
        for field, on in (("min_tokens", body.min_tokens > 0), ("ignore_eos", body.ignore_eos)):
            if on:  # the grammar ends the reply with EOS: masking or ignoring it could leave no token
                raise ApiError(400, f"{field} with structured output is not served: the grammar ends the reply "
                               "with EOS; drop one of them", param=field)
        compile_one = {"json_schema": self.served.grammars.json_schema, "regex": self.served.grammars.regex,
                       "choice": self.served.grammars.choice, "grammar": self.served.grammars.grammar}
        try:
            if constraint.kind == "json_object":
                grammar = await run_in_threadpool(self.served.grammars.json_object)
            else:
                grammar = await run_in_threadpool(compile_one[constraint.kind], constraint.value)
        except ValueError as error:
            raise ApiError(400, f"{constraint.param}: {error}", param=constraint.param) from None
        return dataclasses.replace(sampling, grammar=grammar)

    async def _generate(self, http: HTTPRequest, body: SamplingFields, ids: list[int], arrival: float,
                        chat: bool, echo: str | None = None) -> Response:
        """Decode a request of `ids`; echo: the prompt's text, which the reply begins with
        (completions' `echo`)."""
        served = self.served
        stop_ids = frozenset(body.stop_token_ids or ())
        self._check_ids(sorted(stop_ids), "stop_token_ids")
        budget = self._budget(body.max_tokens, len(ids), chat)
        if body.min_tokens > budget:
            raise ApiError(400, f"min_tokens ({body.min_tokens}) is more than the budget of {budget} tokens; "
                           "lower min_tokens or raise max_tokens", param="min_tokens")
        self._check_logprobs(body, chat)
        sampling = await self._constrained(body, body.sampling())
        speculates = body.speculation.enabled and served.proposer is not None
        try:
            request = Request(
                tuple(ids), budget, sampling=sampling,
                eos_token_ids=(frozenset() if body.ignore_eos else served.eos_token_ids) | stop_ids,
                seed=body.seed,  # None: the Request draws one, and the reply reports it
                proposer=served.proposer if speculates else None, k=served.k if speculates else 0,
                max_k=body.speculation.max_k if speculates else None,
                logprobs=body.top_logprobs_count(),
                prompt_logprobs=body.prompt_logprobs_count(),
                request_id=("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex,
            )
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        reply = Reply(self, body, request, arrival, chat, echo)
        output = Output(served.decode, body.stops, stop_token_ids=stop_ids, min_tokens=body.min_tokens,
                        include_stop=body.include_stop_str_in_output, on_finish=reply.record)
        try:
            job = await self.engine.submit(request, output)
        except QueueFull:
            raise ApiError(429, f"all {self.engine.max_slots} slots and the queue are taken; retry later",
                           kind="rate_limit_error", code="server_busy") from None
        except Closed:
            raise ApiError(503, "the server is shutting down", kind="server_error", code="shutting_down") from None
        except ValueError as error:
            raise ApiError(400, str(error)) from None
        if body.stream:
            return StreamingResponse(
                reply.events(output, lambda: self.engine.cancel(job)), media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        try:
            finished = await until_done_or_gone(http, output)
        finally:
            if output.finished is None:
                self.engine.cancel(job)  # the client left, or the server cancelled this handler
        if finished is None:
            return Response(status_code=499)  # nobody reads it
        if finished.reason == "error":
            raise ApiError(500, "decoding this request failed inside the engine; see the server's log",
                           kind="server_error", code="engine_error")
        return JSONResponse(reply.whole(output))


class Reply:
    """The JSON of one reply, whole or as chunks, and its record in the metrics. echo: the
    prompt's text, which a completion's text begins with (None: no echo)."""

    def __init__(self, app: ServerApp, body: SamplingFields, request: Request, arrival: float, chat: bool,
                 echo: str | None = None) -> None:
        self.app, self.body, self.request, self.arrival, self.chat = app, body, request, arrival, chat
        self.echo = echo
        self.created = int(time.time())

    def record(self, output: Output) -> None:
        self.app.metrics.record(
            arrival=self.arrival, finished=output.finished, prompt_tokens=len(self.request.prompt_ids),
            completion_tokens=output.completion_tokens, finish_reason=output.finish_reason,
        )

    def _head(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.chat else "text_completion") + (".chunk" if chunk and self.chat else "")
        return {"id": self.request.request_id, "object": kind, "created": self.created, "model": self.app.served.name,
                "system_fingerprint": self.app.served.fingerprint}

    def _extras(self, output: Output) -> dict:
        prompt = len(self.request.prompt_ids)
        request, spec = self.request, output.finished.speculation
        k = self.app.served.k_label if request.speculative else 0
        return {
            "usage": usage(prompt, output.completion_tokens),
            "seed": request.seed,
            "speculative_decoding": speculative_decoding(spec, request.proposer, k, request.max_k),
            "metrics": {"speculative_decoding": spec_metrics(spec, k)},
            "timings": timings(prompt, output.completion_tokens, output.finished),
        }

    def _choice(self, output: Output, text: str, finish_reason: str | None, delta: dict | None = None,
                logprobs: list[TokenLogprob] | None = None, echoed: bool = False) -> dict:
        """One choice; logprobs: those it carries (default: the whole reply's, when asked);
        echoed: `text` begins with the prompt, whose logprobs go before them."""
        choice: dict = {"index": 0}
        if self.chat:
            if delta is not None:
                choice["delta"] = delta
            else:
                choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = None
        if self.request.logprobs is not None:
            entries = output.logprobs if logprobs is None else logprobs
            text_of = self.app.served.token_text
            if self.chat:
                choice["logprobs"] = chat_logprobs(entries, text_of)
            else:
                tokens = [e.token for e in entries]
                if echoed:
                    tokens, entries = [*self.request.prompt_ids, *tokens], [*self._prompt_logprobs(output), *entries]
                choice["logprobs"] = completion_logprobs(tokens, entries, text_of)
        if not self.chat and self.body.prompt_logprobs is not None:  # vLLM's place: the choice's (chat: the reply's)
            choice["prompt_logprobs"] = vllm_prompt_logprobs(self._prompt_logprobs(output), self.app.served.token_text)
        choice["finish_reason"] = finish_reason
        if finish_reason is not None:
            choice["stop_reason"] = output.stop_reason
        if finish_reason is not None and self.body.return_token_ids:
            choice["token_ids"] = list(output.token_ids)
        return choice

    def _prompt_logprobs(self, output: Output) -> list[TokenLogprob | None]:
        """The prompt's logprobs, one a prompt token (all None where the request ended before
        its first token brought them)."""
        return output.prompt_logprobs or [None] * len(self.request.prompt_ids)

    def whole(self, output: Output) -> dict:
        echoed = self.echo is not None
        text = self.echo + output.text if echoed else output.text
        reply = {**self._head(False), "choices": [self._choice(output, text, output.finish_reason, echoed=echoed)]}
        if self.chat and self.body.prompt_logprobs is not None:
            reply["prompt_logprobs"] = vllm_prompt_logprobs(self._prompt_logprobs(output), self.app.served.token_text)
        return {**reply, **self._extras(output)}

    async def events(self, output: Output, cancel: Callable[[], None]) -> AsyncIterator[str]:
        """The server-sent events of a streamed reply; the job is cancelled if they stop early
        (the client left: Starlette cancels this generator)."""
        deltas = output.queue()
        try:
            if self.chat:
                yield sse({**self._head(True), "choices": [self._choice(output, "", None, {"role": "assistant",
                                                                                        "content": ""})]})
            echo = self.echo
            while True:
                item = await deltas.get()
                if echo is not None:  # the prompt first, once its logprobs have come with the first tokens
                    yield sse({**self._head(True), "choices": [self._choice(output, echo, None, logprobs=[],
                                                                            echoed=True)]})
                    echo = None
                if isinstance(item, Finished):
                    break
                delta = {"content": item} if self.chat else None
                yield sse({**self._head(True), "choices": [self._choice(output, item, None, delta,
                                                                        output.unsent_logprobs())]})
            extras = self._extras(output)
            last = {**self._head(True), "choices": [self._choice(output, "", output.finish_reason, {} if self.chat
                                                                 else None, output.unsent_logprobs())]}
            last.update(seed=extras["seed"], speculative_decoding=extras["speculative_decoding"], metrics=extras["metrics"],
                        timings=extras["timings"])
            yield sse(last)
            if self.body.include_usage:
                yield sse({**self._head(True), "choices": [], "usage": extras["usage"]})
            yield "data: [DONE]\n\n"
        finally:
            if output.finished is None:
                cancel()


async def until_done_or_gone(http: HTTPRequest, output: Output) -> Finished | None:
    """The request's end, or None if the client disconnects first."""
    done = asyncio.ensure_future(output.wait())
    gone = asyncio.ensure_future(disconnected(http))
    try:
        await asyncio.wait({done, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not done.done():
            done.cancel()
    return done.result() if done.done() and not done.cancelled() else None


async def disconnected(http: HTTPRequest) -> None:
    while (await http.receive())["type"] != "http.disconnect":
        pass


def chat_prompt(body: ChatBody | TokenizeBody) -> ChatPrompt:
    """The body's messages and template options; a 400 where the options contradict them."""
    try:
        return body.chat()
    except ValueError as error:
        raise ApiError(400, str(error), param="continue_final_message") from None


def sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def speculative_decoding(spec: Speculation, proposer: ProposerSpec | None, k: int | str, max_k: int | None) -> dict:
    """A request's speculation, in vLLM's `SpecDecodingStats` terms plus the means read from
    them: mean_acceptance_length = 1 + accepted / drafts (vLLM's), tokens_per_round = tokens /
    rounds (plain steps included), acceptance_rate = accepted / drafted. proposer, k: the
    request's (None and 0 when it decoded plainly); max_k: its cap (`speculation.max_k`)."""
    return {
        "proposer": None if proposer is None else str(proposer),
        "k": k,
        "max_k": max_k,
        "num_drafts": spec.num_drafts,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_accepted_tokens": spec.num_accepted_tokens,
        "num_accepted_tokens_per_pos": list(spec.num_accepted_tokens_per_pos),
        "rounds": spec.rounds,
        "mean_acceptance_length": spec.mean_acceptance_length,
        "tokens_per_round": spec.new_tokens / spec.rounds if spec.rounds else 0.0,
        "acceptance_rate": spec.acceptance_rate,
    }


def chat_logprobs(entries: list[TokenLogprob], text_of: Callable[[int], str]) -> dict:
    """OpenAI's chat `logprobs`: each token's text, logprob, UTF-8 bytes and top alternatives."""

    def one(token: int, logprob: float) -> dict:
        text = text_of(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

    return {"content": [{**one(e.token, e.logprob), "top_logprobs": [one(t, v) for t, v in e.top]}
                        for e in entries]}


def completion_logprobs(tokens: Sequence[int], entries: Sequence[TokenLogprob | None],
                        text_of: Callable[[int], str]) -> dict:
    """OpenAI's legacy completions `logprobs` of `tokens` (entries[i] token i's; None, the
    first prompt token's under `echo`, gives nulls): tokens, token_logprobs, top_logprobs
    (text -> logprob) and text_offset (where each token's text begins in the reply's, counted
    from the tokens' texts)."""
    texts = [text_of(t) for t in tokens]
    offsets = [0, *itertools.accumulate(len(t) for t in texts)][: len(texts)]
    return {"tokens": texts, "token_logprobs": [None if e is None else e.logprob for e in entries],
            "top_logprobs": [None if e is None else {text_of(t): v for t, v in e.top} for e in entries],
            "text_offset": offsets}


def vllm_prompt_logprobs(entries: Sequence[TokenLogprob | None], text_of: Callable[[int], str]) -> list:
    """vLLM's `prompt_logprobs`: null for the first prompt token, then for each one {token id:
    {logprob, rank, decoded_token}} holding the prompt token and the most likely tokens (rank
    1, 2, ... in order)."""

    def one(logprob: float, rank: int, token: int) -> dict:
        return {"logprob": logprob, "rank": rank, "decoded_token": text_of(token)}

    out: list = []
    for e in entries:
        if e is None:
            out.append(None)
            continue
        position = {str(e.token): one(e.logprob, e.rank, e.token)}
        position.update((str(t), one(v, r, t)) for r, (t, v) in enumerate(e.top, start=1) if t != e.token)
        out.append(position)
    return out


def spec_metrics(spec: Speculation, k: int | str) -> dict:
    """vLLM's per-request `metrics.speculative_decoding` (`--per-request-spec-decode-metrics
    summary`), under its names: num_spec_steps (rounds that drafted), num_draft_tokens,
    num_accepted_draft_tokens, draft_acceptance_rate, mean_acceptance_length (1 + accepted per
    step), acceptance_histogram[j] (steps that accepted exactly j drafts), num_spec_tokens (k);
    and num_emitted_tokens, the tokens every round committed (plain steps included)."""
    return {
        "mean_acceptance_length": spec.mean_acceptance_length,
        "draft_acceptance_rate": spec.acceptance_rate,
        "acceptance_histogram": list(spec.acceptance_histogram),
        "num_spec_steps": spec.num_drafts,
        "num_accepted_draft_tokens": spec.num_accepted_tokens,
        "num_draft_tokens": spec.num_draft_tokens,
        "num_emitted_tokens": spec.new_tokens,
        "num_spec_tokens": k,
    }


def timings(prompt_tokens: int, completion_tokens: int, finished: Finished) -> dict:
    """llama-server's `timings`: the prompt's forward (prompt_ms) and the decoding after it
    (predicted_ms: from the end of the prefill to the last token, in steps shared with the
    other requests of the batch), and the drafts (draft_n drafted, draft_n_accepted)."""
    prompt_ms = finished.speculation.prefill_seconds * 1000
    start = finished.admitted if finished.admitted is not None else finished.submitted
    predicted_ms = max(0.0, (finished.finished - start) * 1000 - prompt_ms)
    return {
        "prompt_n": prompt_tokens,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_tokens if prompt_tokens else 0.0,
        "prompt_per_second": 1000 * prompt_tokens / prompt_ms if prompt_ms else 0.0,
        "predicted_n": completion_tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / completion_tokens if completion_tokens else 0.0,
        "predicted_per_second": 1000 * completion_tokens / predicted_ms if predicted_ms else 0.0,
        "draft_n": finished.speculation.num_draft_tokens,
        "draft_n_accepted": finished.speculation.num_accepted_tokens,
    }


async def http_error(request: HTTPRequest, error: HTTPException) -> Response:
    kind, code = HTTP_ERRORS.get(error.status_code, ("invalid_request_error", None))
    message = f"{request.method} {request.url.path}: {error.detail}"
    return ApiError(error.status_code, message, kind=kind, code=code).response()


async def internal_error(request: HTTPRequest, error: Exception) -> Response:
    log.error("request %s %s failed", request.method, request.url.path, exc_info=error)
    return ApiError(500, "the server failed on this request; see its log", kind="server_error").response()
