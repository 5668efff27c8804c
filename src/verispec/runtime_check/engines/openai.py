"""Any OpenAI-compatible server on this machine as an engine under check (`verispec serve`,
`vllm serve`, llama-server): `POST /v1/completions` with the prompt as token ids.

    openai:URL              one server; its replies are checked against the exact law only
    openai:URL,PLAIN_URL    the same model served with speculation (URL) and without it

A prompt is token ids, or raw text the server encodes itself (`--model none`: a model verispec
cannot load, checked by its replies alone).

The one method is `served` (whatever speculation the server at URL runs). Every sampling field
is sent as OpenAI and vLLM name it (`top_k`, `min_p` and `repetition_penalty` are the usual
extensions); a 400 is reported as the server refusing that parameter. The token ids come back
through `return_token_ids` (verispec and vLLM: `token_ids` in each choice; a `tokens` list is
read too); a server that returns neither cannot be checked. Each request carries its own `seed`,
`IN_FLIGHT` of them sent at once; the shared-stream probe sends requests without one.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Refused, Unavailable

SERVED = "served"
TIMEOUT = 600.0
IN_FLIGHT = 8  # seeded samples sent at once


def parse_urls(spec: str) -> tuple[str, str | None]:
    """'URL[,PLAIN_URL]' -> (URL, PLAIN_URL or None), each without a trailing slash.

    >>> parse_urls("http://127.0.0.1:8000/,http://127.0.0.1:8001")
    ('http://127.0.0.1:8000', 'http://127.0.0.1:8001')
    """
    parts = [part.strip().rstrip("/") for part in spec.split(",")]
    if not 1 <= len(parts) <= 2 or not all(p.startswith(("http://", "https://")) for p in parts):
        raise ValueError(f"openai engine {spec!r}: write openai:URL or openai:URL,PLAIN_URL with http(s) URLs")
    return parts[0], parts[1] if len(parts) == 2 else None


class OpenAIEngine:
    name = "openai"
    methods = (SERVED,)

    def __init__(self, url: str, plain_url: str | None, model: str | None, dtype: str, api_key: str | None = None) -> None:
        """model: the name sent in each request (None: the first the server at `url` lists)."""
        self.url, self.plain_url, self.dtype, self.api_key = url, plain_url, dtype, api_key
        self._models = {u: self._get(u + "/v1/models") for u in (url, plain_url) if u is not None}
        listed = [m.get("id") for m in self._models[url].get("data", [])]
        if model is None and not listed:
            raise Unavailable(f"{url}/v1/models lists no model; give --model the name it serves")
        self.model = listed[0] if model is None else model

    def versions(self) -> dict[str, str]:
        out = {}
        for label, url in (("served", self.url), ("plain", self.plain_url)):
            if url is None:
                continue
            owned = {m.get("id"): m.get("owned_by") for m in self._models[url].get("data", [])}
            out[f"{label} server"] = f"{url} ({', '.join(f'{k} owned by {v}' for k, v in owned.items())})"
        return out

    def _server(self, method: str | None) -> str:
        if method is None:
            if self.plain_url is None:
                raise Refused("no plain server was given (openai:URL,PLAIN_URL)")
            return self.plain_url
        if method != SERVED:
            raise ValueError(f"openai has the one method {SERVED!r}, got {method!r}")
        return self.url

    def body(self, prompt: Sequence[int], case: SamplingCase | None, length: int, seed: int) -> dict:
        body = {"model": self.model, "prompt": prompt if isinstance(prompt, str) else list(prompt), "max_tokens": length,
                "seed": seed,
                "return_token_ids": True}
        if case is None:
            return body | {"temperature": 0}
        settings = case.settings()
        if "logit_bias" in settings:
            settings["logit_bias"] = {str(token): bias for token, bias in case.logit_bias}
        return body | {"temperature": case.temperature} | settings

    def complete(self, url: str, body: dict) -> list[int]:
        reply = self._post(url + "/v1/completions", body)
        choice = reply["choices"][0]
        tokens = choice.get("token_ids") or choice.get("tokens")
        if tokens is None:
            raise Unavailable(f"{url} returns no token ids for return_token_ids; it cannot be checked")
        return [int(t) for t in tokens]

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        """n requests, `IN_FLIGHT` at a time, sample i seeded `seed` + i."""
        url = self._server(method)
        with ThreadPoolExecutor(min(n, IN_FLIGHT)) as pool:
            return list(pool.map(lambda i: self.complete(url, self.body(prompt, case, length, seed + i)), range(n)))

    def sample_unseeded(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None
    ) -> list[list[int]]:
        """n requests without a seed, all in flight at once (`SamplesUnseeded`)."""
        url = self._server(method)
        body = {key: value for key, value in self.body(prompt, case, length, 0).items() if key != "seed"}
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lambda _: self.complete(url, body), range(n)))

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        url = self._server(method)
        with ThreadPoolExecutor(concurrency) as pool:
            return list(pool.map(lambda p: self.complete(url, self.body(p, None, max_new_tokens, 0)), prompts))

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    def _get(self, url: str) -> dict:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=self._headers()), timeout=30) as reply:
                return json.load(reply)
        except (urllib.error.URLError, OSError) as error:
            raise Unavailable(f"no OpenAI-compatible server answers at {url}: {error}") from None

    def _post(self, url: str, body: dict) -> dict:
        request = urllib.request.Request(url, json.dumps(body).encode(), headers=self._headers(), method="POST")
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT) as reply:
                return json.load(reply)
        except urllib.error.HTTPError as error:
            text = error.read().decode(errors="replace")
            try:
                message = json.loads(text)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = text[:300]
            if error.code == 400:
                raise Refused(f"the server answers 400: {message}") from None
            raise RuntimeError(f"{url} answered {error.code}: {message}") from None
