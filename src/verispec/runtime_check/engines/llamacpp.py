"""llama-cpp-python as an engine under check, in this process: its own speculative path against
its plain sampling, both through `Llama.generate`.

    lookup   `draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10)` (n-grams up to 2, its
             defaults): `generate` decodes the drafts in one forward with the last token, samples
             the target at each position through the request's sampler chain and keeps a draft
             while it equals the sampled token (a draft that is a function of the context, so the
             output law is the sampler's whatever it drafts)

The target: llama.cpp computing in float32. The file llama.cpp decodes is an F32 copy of the
GGUF file verispec loaded (`float32_copy`: llama.cpp's own converter dequantizes every block
once, as its kernels read it), with keys and values cached in F32, so llama.cpp multiplies the
same float32 weights verispec's exact law is computed from and the float32 near-tie tolerance
applies. Decoding the quantized file itself would be another target (Q4_1 weights times 8-bit
activations, `verispec.models.runtimes.llamacpp`), whose `exact` rows would fail by that rounding alone.

Parameters, mapped to `generate`'s sampler chain (custom logits processor, penalties, top-k,
typical-p, top-p, min-p, temperature, then a draw seeded per sample with `set_seed`):
- temperature, top_k (0 = off), top_p, min_p: as given; typical-p off. llama.cpp filters before
  the temperature, verispec's law after it, so top-p or min-p with a temperature other than 1 is
  refused (top-k keeps the same tokens either way);
- frequency and presence penalty: llama.cpp's penalties sampler counts the tokens it accepted,
  which in `generate` are the sampled output only (the prompt is never fed to it), in a window
  of the last `last_n_tokens_size` (64): OpenAI's definition for samples that fit the window
  (longer ones are refused);
- repetition penalty: refused. The same sampler applies llama.cpp's `repeat_penalty` to those
  tokens only, never the prompt's, so it is not CTRL's, HF's and vLLM's penalty over prompt
  and output;
- logit bias: a logits processor adding the bias, as `create_completion(logit_bias=)` builds it.

Greedy decoding is `temp=0` (llama.cpp's greedy sampler). `generate` serves one sequence: at
more than one request in flight plain decoding runs llama.cpp's own batch over sequences
(`verispec.peers.llamacpp.LlamaCppBatchServer`, one `llama_decode` over every sequence in
flight, as llama-server's parallel slots), and speculation is refused (llama-cpp-python has no
batched speculative path).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.models.loading.sources import converted_dir
from verispec.peers.llamacpp import GREEDY, LOOKUP_TOKENS, LlamaCppBatchServer
from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Refused

MIN_CONTEXT = 1024  # positions of the smallest context made; a longer request makes a larger one


def float32_copy(gguf: Path) -> Path:
    """An F32 copy of `gguf` (every tensor dequantized by llama.cpp's `llama_model_quantize`
    with ALL_F32, requantizing allowed), written once beside verispec's float32 conversion of
    the same file (`sources.converted_dir`) and reused while the file and llama-cpp-python's
    version are unchanged."""
    import llama_cpp

    base = converted_dir(gguf)
    out = base.with_name(f"{base.name}-llamacpp-{llama_cpp.__version__}-f32.gguf")
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + f".{os.getpid()}.partial")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_ALL_F32
    params.allow_requantize = True
    params.nthread = torch.get_num_threads()
    log = logging.getLogger("llama-cpp-python")  # llama.cpp's log, printed below its level (a line per tensor)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        status = llama_cpp.llama_model_quantize(str(gguf).encode(), str(partial).encode(), params)
    finally:
        log.setLevel(level)
    if status != 0:
        partial.unlink(missing_ok=True)
        raise ValueError(f"llama.cpp could not write an F32 copy of {gguf} (status {status})")
    partial.replace(out)
    return out


class Counted:
    """A llama-cpp-python draft model that counts the tokens it drafts."""

    def __init__(self, draft) -> None:
        self.draft = draft
        self.drafted = 0

    def __call__(self, input_ids, *args, **kwargs):
        drafted = self.draft(input_ids, *args, **kwargs)
        self.drafted += len(drafted)
        return drafted


def bias_processor(bias: Sequence[tuple[int, float]]):
    """llama-cpp-python's logits processor adding `bias` to the logits (as `create_completion`'s
    `logit_bias`)."""
    from llama_cpp import LogitsProcessorList

    def add(input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        out = np.copy(scores)  # [V]
        for token, value in bias:
            out[token] += value
        return out

    return LogitsProcessorList([add])


class LlamaCppEngine:
    """gguf: the file to decode (an F32 copy, `float32_copy`); eos_ids: the ids that end an
    output; vocab_size: the target's, checked against the file's; threads: llama.cpp's threads
    (default: torch's count)."""

    name = "llamacpp"
    methods = ("lookup",)
    dtype = "float32"

    def __init__(self, gguf: Path, eos_ids: Collection[int], vocab_size: int, threads: int | None = None) -> None:
        import llama_cpp

        self.api = llama_cpp
        self.gguf = Path(gguf)
        self.eos_ids = frozenset(eos_ids)
        self.vocab_size = vocab_size
        self.threads = threads or torch.get_num_threads()
        self._llamas: dict[str | None, object] = {}

    def drafts(self) -> tuple[int, None]:
        """Tokens its lookup drafted so far (`CountsDrafts`); how many `generate` kept is not
        exposed, so accepted is None."""
        return sum(llama.draft_model.drafted for llama in self._llamas.values() if llama.draft_model is not None), None

    def versions(self) -> dict[str, str]:
        return {"llama-cpp-python": self.api.__version__, "weights": f"{self.gguf.name} (F32, keys and values F32)"}

    def _llama(self, method: str | None, positions: int):
        """The `Llama` decoding `method` (None: plain), with room for `positions`."""
        if method is not None and method not in self.methods:
            raise ValueError(f"llamacpp has no method {method!r}; choose from {', '.join(self.methods)}")
        llama = self._llamas.get(method)
        if llama is None or llama.n_ctx() < positions:
            from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

            draft = Counted(LlamaPromptLookupDecoding(num_pred_tokens=LOOKUP_TOKENS)) if method else None
            llama = self.api.Llama(
                model_path=str(self.gguf),
                n_ctx=max(MIN_CONTEXT, -(-positions // MIN_CONTEXT) * MIN_CONTEXT),
                n_threads=self.threads,
                n_threads_batch=self.threads,
                # a draft model needs every row's logits; the argument also sizes the buffer they go to
                logits_all=draft is not None,
                draft_model=draft,
                type_k=self.api.GGML_TYPE_F32,
                type_v=self.api.GGML_TYPE_F32,
                verbose=False,
            )
            if llama.n_vocab() != self.vocab_size:
                raise ValueError(
                    f"llama.cpp reads a vocabulary of {llama.n_vocab()} from {self.gguf}, the target has {self.vocab_size}"
                )
            self._llamas[method] = llama
        return llama

    def options(self, case: SamplingCase, length: int, window: int) -> dict:
        """`generate`'s sampling arguments for `case`, or `Refused` where llama.cpp's definition
        is not the case's (module docstring). window: the penalties' `last_n_tokens_size`."""
        if case.repetition_penalty:
            raise Refused("llama-cpp-python's repeat_penalty counts only the tokens `generate` sampled (its sampler "
                          "is never fed the prompt), not the prompt and output as CTRL, HF and vLLM define it")
        if (case.frequency_penalty or case.presence_penalty) and length > window:
            raise Refused(f"llama-cpp-python's penalties count the last {window} tokens only; {length} new tokens "
                          "would leave the window")
        if case.temperature != 1.0 and (case.top_p is not None or case.min_p is not None):
            raise Refused("llama.cpp applies top-p and min-p before the temperature, the law checked after it")
        return dict(
            temp=case.temperature, top_k=case.top_k or 0, top_p=case.top_p or 1.0, min_p=case.min_p or 0.0,
            typical_p=1.0, repeat_penalty=1.0, frequency_penalty=case.frequency_penalty or 0.0,
            presence_penalty=case.presence_penalty or 0.0,
            logits_processor=bias_processor(case.logit_bias) if case.logit_bias else None,
        )

    def _generate(self, llama, prompt: Sequence[int], length: int, options: dict) -> list[int]:
        out: list[int] = []
        stream = llama.generate(list(prompt), **options)
        try:
            for token in stream:
                out.append(int(token))
                if out[-1] in self.eos_ids or len(out) == length:
                    break
        finally:
            stream.close()
        return out

    def sample(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None, seed: int
    ) -> list[list[int]]:
        llama = self._llama(method, len(prompt) + length + LOOKUP_TOKENS + 1)
        options = self.options(case, length, llama.last_n_tokens_size)
        out = []
        for i in range(n):
            llama.set_seed(seed + i)  # the seed of this sample's draw (`generate` builds its sampler from it)
            out.append(self._generate(llama, prompt, length, options))
        return out

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, method: str | None, concurrency: int
    ) -> list[list[int]]:
        positions = max(len(p) for p in prompts) + max_new_tokens + LOOKUP_TOKENS + 1
        if concurrency == 1:
            llama = self._llama(method, positions)
            return [self._generate(llama, prompt, max_new_tokens, GREEDY) for prompt in prompts]
        if method is not None:
            raise Refused("llama-cpp-python's speculative path (`Llama.generate` with a draft model) decodes one "
                          "sequence at a time; it has no batched form")
        return self._batched(prompts, max_new_tokens, concurrency, positions)

    def _batched(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, concurrency: int, positions: int
    ) -> list[list[int]]:
        """Plain greedy decoding with up to `concurrency` sequences in one llama.cpp batch."""
        server = LlamaCppBatchServer(self._llama(None, positions), self.eos_ids, concurrency, positions, self.threads)
        try:
            out: dict[int, list[int]] = {}
            waiting = list(enumerate(prompts))[::-1]
            while waiting or server.in_flight:
                while waiting and server.in_flight < concurrency:
                    key, prompt = waiting.pop()
                    server.submit(key, prompt, max_new_tokens)
                out |= {served.key: served.tokens for served in server.step()}
        finally:
            server.close()
        return [out[i] for i in range(len(prompts))]
