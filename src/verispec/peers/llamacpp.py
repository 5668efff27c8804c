"""llama.cpp as a peer: llama-cpp-python decoding the target's own GGUF file, for the benchmark
(`verispec bench`) and the runtime check (`verispec check-runtime`).

`llamacpp-plain` is llama.cpp's greedy decoding, one token per forward; `llamacpp-lookup[-kN]`
is llama-cpp-python's own prompt-lookup decoding (`LlamaPromptLookupDecoding`: n-grams up to
2, N drafted tokens, 10 by default), which `Llama.generate` verifies greedily. Both are timed by
the same `Clock` as every other runner, on the same prompt token ids (fed as ids, so no second
tokenizer is involved), with the same thread count, the same budget and the same EOS ids. They
decode greedily only: llama.cpp's sampler chain applies top-k, top-p and min-p before the
temperature, verispec after it, so a sampled run would draw from a different distribution.

They are a peer, not a verispec method: llama.cpp computes with the GGUF's quantized blocks
(Q4_1 weights times Q8-quantized activations, its own kernels), while verispec's target is the
same weights dequantized to float32 (or cast to bfloat16). So their greedy output may part from
verispec-plain's where the two computations round a close choice differently; each `Outcome`
says so (`peer`), and the benchmark reports those differences apart from verispec's own.

Against `--runtime llamacpp` they decode like for like: the same ids, the same context settings
(flash attention on, as llama.cpp's own tools have it on a CPU and as the runtime decodes; off,
llama-cpp-python's default, takes another attention path whose logits differ by up to ~1 here),
a truly greedy sampler (`GREEDY`). What still parts them is the forward shapes, which llama.cpp
rounds differently (docs/runtime.md, "Determinism"): llama.cpp decodes the whole prompt in one
forward (64 rows or more take flash attention's tiled kernel) where verispec decodes the last
prompt token in the first round's forward, and from 256 cached positions on llama.cpp splits a
lone row's attention across threads where deterministic verispec pads it to two rows. Below
both (a prompt under 64 tokens, a context under 256) their greedy output is the same, token for
token (`tests/test_llamacpp.py`).

llama-cpp-python is an optional extra (`pip install -e '.[llamacpp]'`, a source build of
llama.cpp); everything else in verispec runs without it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from typing import TYPE_CHECKING

from verispec.models.runtimes.llamacpp import (  # the runtime's settings: like for like
    CACHE_TYPES_V, FLASH_ATTENTION, cache_bytes_per_position, probe,
)
from verispec.models.runtimes.llamacpp import require as require_installed
from verispec.peers.outcome import Clock, Outcome, Served
from verispec.sampling import SamplingParams

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel

LOOKUP_TOKENS = 10  # LlamaPromptLookupDecoding's default num_pred_tokens

# With temp == 0 llama-cpp-python builds only its penalties sampler (a no-op at these values)
# and the greedy sampler; top-k, top-p, min-p and typical-p are added only when temp > 0, and
# are given their neutral values here all the same.
GREEDY = {
    "temp": 0.0,
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "repeat_penalty": 1.0,
    "frequency_penalty": 0.0,
    "presence_penalty": 0.0,
}


def require(names: Sequence[str], sampling: SamplingParams) -> None:
    """Refuse llamacpp methods up front (before any model loads) when llama-cpp-python is
    missing (the message says how to install it) or the benchmark samples."""
    if not names:
        return
    require_installed(f"the llamacpp methods ({', '.join(names)})")
    if not sampling.greedy:
        raise ValueError(
            f"{', '.join(names)} decode greedily only (llama.cpp filters before the temperature, verispec "
            "after it, so they would sample another distribution); drop --temperature or these methods"
        )


class Rounds:
    """A draft model for `Llama.generate` that also marks where each round ends.

    `generate` asks its draft model for the next drafts exactly once per target forward, right
    after it yielded that forward's tokens, so the tokens yielded between two calls are one
    round's: accepted drafts + 1.
    """

    def __init__(self, draft) -> None:
        self.draft = draft
        self.clock: Clock | None = None
        self.pending = 0

    def start(self, clock: Clock) -> None:
        self.clock, self.pending = clock, 0

    def token(self) -> None:
        self.clock.arrived()
        self.pending += 1

    def close(self) -> None:
        if self.pending:
            self.clock.emitted(self.pending)
            self.pending = 0

    def __call__(self, input_ids, /, **kwargs):
        self.close()
        return self.draft(input_ids, **kwargs)


class LlamaCppRunner:
    """llama-cpp-python's `Llama.generate` on a GGUF file, greedy; with prompt lookup when
    `lookup_tokens` is given (its `num_pred_tokens`).

    eos_token_ids: the ids that end a request (the engine's). threads: llama.cpp's threads for
    decoding and for the prompt (the benchmark passes torch's count). vocab_size: the target's, checked against the file's. The context is the model's
    trained length; every request starts from an empty cache (no reuse of the previous
    request's prompt), as the other runners do.
    """

    def __init__(
        self,
        gguf: Path,
        eos_token_ids: Sequence[int],
        threads: int,
        vocab_size: int,
        lookup_tokens: int | None = None,
        cache_type_v: str = "f16",
    ) -> None:
        import llama_cpp
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.rounds = (
            Rounds(LlamaPromptLookupDecoding(num_pred_tokens=lookup_tokens)) if lookup_tokens else None
        )
        # n_ctx = 0: the model's trained context. Verifying drafts needs every row's logits;
        # llama-cpp-python switches that on by itself for a draft model, but sizes its logits
        # buffer from the argument (n_batch rows), which overflows past 512 tokens of context.
        self.llama = llama_cpp.Llama(
            model_path=str(gguf),
            n_ctx=0,
            n_threads=threads,
            n_threads_batch=threads,
            logits_all=self.rounds is not None,
            draft_model=self.rounds,
            flash_attn=FLASH_ATTENTION,
            type_v=CACHE_TYPES_V[cache_type_v],
            verbose=False,
        )
        if self.llama.n_vocab() != vocab_size:
            raise ValueError(
                f"llama.cpp reads a vocabulary of {self.llama.n_vocab()} from {gguf}, the target has {vocab_size}"
            )
        self.eos_token_ids = frozenset(eos_token_ids)
        values = "" if cache_type_v == "f16" else f", values {cache_type_v}"
        self.peer = f"llama-cpp-python {llama_cpp.__version__} on the GGUF's quantized blocks{values}"

    def __call__(self, prompt_ids: Sequence[int], max_new_tokens: int) -> Outcome:
        context = self.llama.n_ctx()
        if len(prompt_ids) + max_new_tokens > context:
            raise ValueError(
                f"a {len(prompt_ids)}-token prompt and {max_new_tokens} new tokens exceed llama.cpp's context "
                f"of {context} tokens for this model"
            )
        clock = Clock()
        self.llama.reset()  # otherwise generate reuses the cached prefix of the last request
        if self.rounds is not None:
            self.rounds.start(clock)
        tokens: list[int] = []
        stream = self.llama.generate(list(prompt_ids), **GREEDY)
        try:
            for token in stream:
                tokens.append(int(token))
                if self.rounds is None:
                    clock.emitted(1)
                else:
                    self.rounds.token()
                if tokens[-1] in self.eos_token_ids or len(tokens) == max_new_tokens:
                    break
        finally:
            stream.close()
        if self.rounds is not None:
            self.rounds.close()
        outcome = clock.outcome(tokens)
        outcome.peer = self.peer
        return outcome


def make_runner(name: str, target: LoadedModel, lookup_tokens: int | None = None, cache_type_v: str = "f16") -> LlamaCppRunner:
    """The runner of the method `name` on the file `target` was loaded from, with torch's
    current thread count; with prompt lookup when `lookup_tokens` is given; on a value cache of
    `cache_type_v` (`CACHE_TYPES_V`)."""
    return LlamaCppRunner(gguf_file(name, target), target.eos_token_ids, torch.get_num_threads(), target.lm.vocab_size,
                          lookup_tokens, cache_type_v)


def gguf_file(name: str, target: LoadedModel) -> Path:
    """The GGUF file `target` was loaded from, which the llamacpp methods decode, after a probe
    decoded a few tokens of it (a llama.cpp build that crashes is refused in one line before
    any measurement, `models.runtimes.llamacpp.probe`)."""
    if not (target.source.is_file() and target.source.suffix == ".gguf"):
        raise ValueError(
            f"{name} decodes the target's own GGUF file, but {target.name} was not loaded from a .gguf "
            f"file ({target.source}); give --model a .gguf file or an embedded name"
        )
    probe(target.source)
    return target.source


class LlamaCppBatchServer:
    """llama.cpp decoding several sequences at once through llama-cpp-python's low-level API:
    continuous batching as llama.cpp's own server does it with parallel slots, without HTTP.

    One context holds `slots` sequences (`n_seq_max`, a KV cache split per sequence, as
    llama.cpp advises when sequences share no prefix), each with `context` positions. A step
    is one `llama_decode` of one `llama_batch` holding, for every sequence in flight, either its
    whole prompt (just admitted; logits of its last position only) or its last token, each
    under its own sequence id; every sequence then takes the argmax of its row (greedy). A
    finished sequence's cache cells are removed (`llama_memory_seq_rm`) and its id serves the
    next request at the following step. Timed on the same clock as every server
    (`verispec.peers.outcome.Served`).

    llama: a `llama_cpp.Llama` that loaded the GGUF file (its model is shared; this server makes
    and frees its own context). threads: llama.cpp's threads for decoding and prompts.
    """

    def __init__(
        self,
        llama,
        eos_token_ids: Sequence[int],
        slots: int,
        context: int,
        threads: int,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        import llama_cpp

        self.api = llama_cpp
        self.llama = llama  # holds the model this server's context decodes with
        self.clock = clock
        self.eos_token_ids = frozenset(eos_token_ids)
        model = llama._model.model
        context = -(-context // 256) * 256  # llama.cpp pads a context to 256 positions a sequence
        # The Llama's own context settings (its flash attention and cache types, the model's rope
        # scaling): `load_batch_model`'s are `LlamaCppRunner`'s, so that one sequence decodes here
        # what it decodes there.
        params = type(llama.context_params).from_buffer_copy(llama.context_params)
        params.n_ctx = slots * context
        params.n_batch = slots * context  # a step may hold every slot's whole prompt
        params.n_ubatch = min(512, slots * context)
        params.n_seq_max = slots
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        if not self.ctx:
            raise ValueError(f"llama.cpp could not make a context of {slots} sequences x {context} positions")
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.kv_bytes = cache_bytes_per_position(model, params.type_v)
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.batch = llama_cpp.llama_batch_init(slots * context, 0, 1)
        self.context = context
        self.free = list(range(slots))[::-1]
        self.sequences: dict[int, dict] = {}  # seq id -> key, prompt, tokens, budget, times
        self.peer = (
            f"llama-cpp-python {llama_cpp.__version__}, llama_decode over {slots} sequence{'s' if slots != 1 else ''}, on the GGUF's "
            "quantized blocks"
        )

    def close(self) -> None:
        if self.ctx:
            self.api.llama_batch_free(self.batch)
            self.api.llama_free(self.ctx)
            self.ctx = None

    def __del__(self) -> None:
        self.close()

    @property
    def in_flight(self) -> int:
        return len(self.sequences)

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        if len(prompt_ids) + max_new_tokens > self.context:
            raise ValueError(
                f"a {len(prompt_ids)}-token prompt and {max_new_tokens} new tokens exceed the {self.context} "
                "positions of a llama.cpp sequence"
            )
        if not self.free:
            raise ValueError("every llama.cpp sequence is in flight; wait for one to finish")
        self.sequences[self.free.pop()] = {
            "key": key, "prompt": [int(t) for t in prompt_ids], "tokens": [], "budget": max_new_tokens,
            "submitted": self.clock(), "first": None,
        }

    def step(self) -> list[Served]:
        batch, rows = self.batch, {}
        batch.n_tokens = 0
        for seq, s in self.sequences.items():
            fed = s["prompt"] if not s["tokens"] else s["tokens"][-1:]
            start = 0 if not s["tokens"] else len(s["prompt"]) + len(s["tokens"]) - 1
            for i, token in enumerate(fed):
                j = batch.n_tokens
                batch.token[j], batch.pos[j], batch.n_seq_id[j] = token, start + i, 1
                batch.seq_id[j][0] = seq
                batch.logits[j] = i == len(fed) - 1
                batch.n_tokens += 1
            rows[seq] = batch.n_tokens - 1
        if not rows:
            return []
        status = self.api.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} over {batch.n_tokens} tokens")
        finished = []
        for seq, row in rows.items():
            logits = np.ctypeslib.as_array(self.api.llama_get_logits_ith(self.ctx, row), shape=(self.n_vocab,))
            s = self.sequences[seq]
            s["tokens"].append(int(logits.argmax()))
            now = self.clock()
            if s["first"] is None:
                s["first"] = now
            if s["tokens"][-1] in self.eos_token_ids or len(s["tokens"]) == s["budget"]:
                finished.append(seq)
                s["finished"] = now
        served = []
        for seq in finished:
            s = self.sequences.pop(seq)
            self.api.llama_memory_seq_rm(self.memory, seq, -1, -1)
            self.free.append(seq)
            served.append(Served(s["key"], s["tokens"], s["submitted"], s["first"], s["finished"], peer=self.peer))
        return served

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one position of one sequence takes: n_layer x n_head_kv x head size x
        (2 bytes of float16 key, and 2 of float16 value or 34/32 of a Q8_0 one)."""
        return self.kv_bytes


def load_batch_model(name: str, target: LoadedModel, cache_type_v: str = "f16"):
    """A `llama_cpp.Llama` on the file `target` was loaded from, for `LlamaCppBatchServer`s (a
    small context of its own: each server makes the context it decodes in, with this one's
    settings, its value cache type `cache_type_v` among them)."""
    import llama_cpp

    gguf = gguf_file(name, target)
    llama = llama_cpp.Llama(model_path=str(gguf), n_ctx=64, flash_attn=FLASH_ATTENTION, type_v=CACHE_TYPES_V[cache_type_v],
                            verbose=False)
    if llama.n_vocab() != target.lm.vocab_size:
        raise ValueError(f"llama.cpp reads a vocabulary of {llama.n_vocab()} from {gguf}, the target has {target.lm.vocab_size}")
    return llama
