"""`LlamaCppLM`: llama.cpp itself behind the `CausalLM` protocol, through llama-cpp-python.

The target is **the model as llama.cpp computes it**, not the GGUF file's float model: its CPU
kernels multiply the file's quantized blocks (Q4_1, Q4_K, ...) by activations quantized to 8
bits per block (Q8_0/Q8_1), keep keys and values in float16, and sum in their own orders. Its
logits differ from the float32 target's (`LlamaRuntime`, `HFCausalLM`) by that rounding, so its
greedy output may part from theirs at a close choice. verispec's verification is exact for
whichever target it is given: here, llama.cpp's numbers.

Cache: one llama.cpp context holding one sequence (id 0). `extend` writes the tokens at
positions length..length+n-1 and asks for logits of the last `keep` rows only (llama.cpp then
runs the output head on those rows alone); `rollback(length)` removes the cache cells of
positions length.. (`llama_memory_seq_rm`, what `Llama.eval` does before it decodes), and the
next `extend` fills them again. `score` decodes in a second context of its own (made on first
use), cleared before each call, so the live cache is never touched.

Row-count dependence: llama.cpp may compute a row through other kernels depending on how many
rows one forward decodes, and a row's difference then reaches every later row through its keys
and values. Measured here (2-core x86-64 with AVX-512, llama-cpp-python 0.3.36):
- attention: without flash attention, a forward of one token takes another attention path than
  a forward of several (on the default model, SmolLM2-135M Q4_1, a quarter of the rows differ,
  max |diff| 0.1-1.1). Flash attention, always on here, computes a row the same way whatever
  the forward's size: with it, the default model's rows are the same bits for forwards of 1 to
  16 rows and any prompt split.
- matrix products: a K-quant matrix (Qwen2.5-Coder's Q4_K) is repacked on load for a matrix
  kernel that takes 4 or more rows at a time; forwards of 1 to 3 rows take the vector kernel
  instead. Rows of forwards of 1, 2 and 3 tokens are the same bits; a forward of 4 or more
  differs from them in every row (max |diff| about 0.6 on the 1.5B).
So `deterministic` (the default) decodes every later forward (`extend`, and `score`'s rows) in
pieces of at most `DETERMINISTIC_ROWS` = 3 tokens, while `prefill` decodes the prompt in pieces
of `n_batch`, as llama.cpp decodes a prompt. The target is then what llama.cpp's own plain
decoding computes: the prompt in one batch, each later token through the one-to-three-row
kernels. Every position's logits are a function of the prompt and the tokens before it alone,
however verification batched them, so greedy speculative output equals plain greedy output
(and llama.cpp's own greedy decoding); extend/rollback histories equal `score` bit for bit where
the prefill was at most 3 tokens (`score` has no prompt to batch; after a longer prefill they
differ by the prompt's rounding). A verification of k + 1 > 3 rows costs two or more forwards
(on the 1.5B, 5 rows as 3 + 2 take about 110 ms against 100 ms in one).
`deterministic=False` decodes up to `n_batch` tokens per forward (faster long verifications); a
row's logits then depend on how it was batched, so greedy speculative output may part from plain
decoding at a close choice, and sampled output follows whichever forward's numbers scored the
position.

Returned logits are float32 [rows, V], one copy of the kept rows out of llama.cpp's output
buffer (read through a numpy view). The token, position and output-flag arrays of the batch
are written through numpy views too, so a forward costs no Python loop over its tokens.

llama-cpp-python is an optional extra (`pip install -e '.[llamacpp]'`); importing this module
does not need it, building a `LlamaCppLM` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
import torch

from verispec.models.base import check_extend, check_score_ids

INSTALL = "pip install -e '.[llamacpp]'"
DETERMINISTIC_ROWS = 3  # the most rows one forward takes through llama.cpp's vector kernels


class LlamaCppLM:
    """A GGUF file decoded by llama.cpp, with a rollback-able cache.

    >>> lm = LlamaCppLM("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=4096, n_threads=2)
    >>> lm.prefill(prompt[:-1])
    >>> logits = lm.extend([prompt[-1], *drafted])   # float32 [1 + k, V]
    >>> lm.rollback(lm.length - 2)

    n_ctx: positions the cache holds (prompt and new tokens together). n_threads: llama.cpp's
    threads, for one-token and many-token forwards alike (default: torch's count). n_batch: the
    most tokens one `llama_decode` takes; longer inputs are decoded in pieces of that size.
    deterministic: decode in pieces of at most `DETERMINISTIC_ROWS` tokens, so that every row
    takes the same kernels and its logits do not depend on how many rows are scored with it.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        deterministic: bool = True,
    ) -> None:
        try:
            import llama_cpp
        except ImportError as error:
            raise ImportError(f"the llama.cpp runtime needs llama-cpp-python; install it with `{INSTALL}`") from error
        threads = n_threads or torch.get_num_threads()
        self.api = llama_cpp
        self.llama = llama_cpp.Llama(
            model_path=str(model_path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            n_batch=n_batch,
            logits_all=True,
            flash_attn=True,  # the same attention for a forward of any size (module docstring)
            verbose=False,
        )
        self.vocab_size = int(self.llama.n_vocab())
        self.n_ctx = int(self.llama.n_ctx())
        self.deterministic = deterministic
        self.n_batch = int(self.llama.n_batch)
        self.piece = min(DETERMINISTIC_ROWS, self.n_batch) if deterministic else self.n_batch
        self._live = _Sequence(self.llama, self.llama._ctx, self.llama._batch, self.vocab_size)
        self._scratch: _Sequence | None = None  # score's own context, made on first use
        self._length = 0

    @property
    def length(self) -> int:
        return self._length

    def weight_bytes(self) -> int:
        """Bytes of the model's tensors as llama.cpp holds them (the file's blocks, mapped)."""
        return int(self.api.llama_model_size(self.llama.model))

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one position takes: keys and values of every layer in float16."""
        model = self.llama.model
        head_dim = self.api.llama_model_n_embd(model) // self.api.llama_model_n_head(model)
        return int(self.api.llama_model_n_layer(model) * 2 * self.api.llama_model_n_head_kv(model) * head_dim * 2)

    def reset(self) -> None:
        self._live.clear()
        self._length = 0

    def prefill(self, ids: Sequence[int]) -> None:
        self.reset()
        if len(ids):
            self._check_room(len(ids))
            check_score_ids(ids, self.vocab_size, "prefill")
            self._decode(ids, rows=0, piece=self.n_batch)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._check_room(len(tokens))
        return self._decode(tokens, rows=keep or len(tokens), piece=self.piece)  # [keep or n, V]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}; {self._length} tokens processed")
        if length < self._length:
            self._live.forget_from(length)
            self._length = length

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size)
        if len(ids) > self.n_ctx:
            raise ValueError(f"score got {len(ids)} tokens; the llama.cpp context holds {self.n_ctx}")
        if self._scratch is None:
            self._scratch = _Sequence.fresh(self.llama, self.vocab_size)
        self._scratch.clear()
        return self._scratch.decode(ids, 0, rows=len(ids), piece=self.piece)  # [T, V]

    def _decode(self, tokens: Sequence[int], rows: int, piece: int) -> torch.Tensor:
        try:
            logits = self._live.decode(tokens, self._length, rows, piece)
        except BaseException:
            self._live.forget_from(self._length)  # a piece may have been written before the failure
            raise
        self._length += len(tokens)
        return logits

    def _check_room(self, n: int) -> None:
        if self._length + n > self.n_ctx:
            raise ValueError(
                f"{self._length} cached and {n} new tokens exceed the llama.cpp context of {self.n_ctx} "
                "positions; build the model with a larger n_ctx"
            )


class _Sequence:
    """Sequence 0 of one llama.cpp context, decoded through one batch whose token, position
    and output-flag arrays are numpy views (written without a Python loop per token)."""

    def __init__(self, llama, context, batch, vocab_size: int) -> None:
        import llama_cpp

        self.api = llama_cpp
        self.llama = llama  # keeps the model alive as long as this context
        self.context, self.batch = context, batch
        self.memory = llama_cpp.llama_get_memory(context.ctx)
        self.vocab_size = vocab_size
        raw = batch.batch
        self.capacity = llama.n_batch
        self.token = np.ctypeslib.as_array(raw.token, shape=(self.capacity,))
        self.pos = np.ctypeslib.as_array(raw.pos, shape=(self.capacity,))
        self.wanted = np.ctypeslib.as_array(raw.logits, shape=(self.capacity,))
        np.ctypeslib.as_array(raw.n_seq_id, shape=(self.capacity,))[:] = 1
        for i in range(self.capacity):
            raw.seq_id[i][0] = 0

    @classmethod
    def fresh(cls, llama, vocab_size: int) -> _Sequence:
        """A second context over the same loaded model, with the same settings, and its batch."""
        from llama_cpp import _internals

        context = _internals.LlamaContext(model=llama._model, params=llama.context_params, verbose=False)
        batch = _internals.LlamaBatch(n_tokens=llama.n_batch, embd=0, n_seq_max=1, verbose=False)
        return cls(llama, context, batch, vocab_size)

    def clear(self) -> None:
        self.api.llama_memory_clear(self.memory, True)

    def forget_from(self, position: int) -> None:
        """Remove the cache cells of positions >= `position`."""
        self.api.llama_memory_seq_rm(self.memory, 0, position, -1)

    def decode(self, tokens: Sequence[int], start: int, rows: int, piece: int) -> torch.Tensor:
        """Decode `tokens` at positions start.. in pieces of at most `piece` tokens (at most the
        batch's capacity); the logits of the last `rows` tokens, float32 [rows, V]."""
        n = len(tokens)
        ids = np.asarray(tokens, dtype=np.int32)  # [n]
        logits = torch.empty(rows, self.vocab_size, dtype=torch.float32)  # [rows, V]
        written = 0
        for begin in range(0, n, piece):
            end = min(n, begin + piece)
            size = end - begin
            self.token[:size] = ids[begin:end]
            self.pos[:size] = np.arange(start + begin, start + end, dtype=np.int32)
            self.wanted[:size] = np.arange(begin, end) >= n - rows
            self.batch.batch.n_tokens = size
            self.context.decode(self.batch)
            outputs = int(self.wanted[:size].sum())
            if outputs:
                buffer = np.ctypeslib.as_array(self.context.get_logits(), shape=(outputs, self.vocab_size))
                logits[written : written + outputs] = torch.from_numpy(buffer)
                written += outputs
        return logits
