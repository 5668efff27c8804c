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

Row-count dependence: llama.cpp computes a row through other kernels depending on how many rows
one forward decodes, and a row's difference then reaches every later row through its keys and
values. Measured here (2-core x86-64 with AVX-512, llama-cpp-python 0.3.36):
- one row: a forward of a single token takes another attention path than a forward of 2 or 3
  (without flash attention at any context; with it, from a few hundred cached positions on,
  where its one-query path splits the cache). Max |diff| 0.4-0.6 on the Qwen pair's 1.5B.
- four or more rows: a K-quant matrix (the 1.5B's Q4_K) is repacked on load for a kernel that
  takes 4 or more rows at once, which rounds otherwise than the vector kernel of 1-3 rows, in
  every row (max |diff| about 0.6).
- forwards of 2 and of 3 rows give every row the same bits, at every context length measured
  (60 to 1500 cached positions), with and without flash attention, on both the default model
  and the 1.5B.
So `deterministic` (the default) decodes every forward after the prompt (`extend`, and `score`'s
rows) in pieces of 2 or 3 tokens (`pieces`): a lone token is decoded with a second, padding row
(its cache cell removed right after), a longer input is cut into threes and twos. Every
position's logits are then a function of the prompt and the tokens before it alone, however
verification batched them, so greedy speculative output equals plain greedy output. The prompt
itself is decoded as llama.cpp decodes a prompt (`prefill`, up to `n_batch` tokens a forward),
the same way for every method. extend/rollback histories equal `score` bit for bit where the
prefill was at most 3 tokens (`score` has no prompt to batch; after a longer prefill they differ
by the prompt's rounding). The price: plain decoding's one-token step costs a two-row forward
(on the 1.5B about 50 ms against 33 ms), and a verification of 4 or more rows two forwards.
`deterministic=False` decodes as llama.cpp itself does (a lone token alone, up to `n_batch` a
forward): plain decoding at llama.cpp's own speed, but a row's logits then depend on how it
was batched, so the output is not one fixed target's: greedy speculative output may part from
plain decoding at a close choice, and a sampled token follows whichever forward scored it.
Flash attention is on either way (faster here, and one path for any forward size on short
contexts).

Returned logits are float32 [rows, V], one copy of the kept rows out of llama.cpp's output
buffer (read through a numpy view). The token, position and output-flag arrays of the batch
are written through numpy views too, so a forward costs no Python loop over its tokens.

llama-cpp-python is an optional extra, built from source for this CPU by `make llamacpp`
(`cmake_args`: llama.cpp's native build is off and this CPU's instruction sets named one by one,
AMX never: llama-cpp-python 0.3.36's native build on a Xeon with AMX segfaults in its first
decode). Importing this module does not need it; `require` says how to install it where it is
missing, and `probe` decodes a few tokens of a file in a child process before the first use
here, so a build that crashes costs one line (`LlamaCppUnavailable`), not the process.

    python -m verispec.models.llamacpp      # the CMAKE_ARGS `make llamacpp` builds with
"""

from __future__ import annotations

import functools
import importlib.util
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.machine import cpu_flags, cpuinfo
from verispec.models.base import check_extend, check_score_ids

INSTALL = "make llamacpp"  # the documented install: llama-cpp-python built with `cmake_args`
PROBE_SECONDS = 300  # a probe's load and decode of a small file take a few seconds

# llama.cpp's x86 instruction-set switches, each on where /proc/cpuinfo names its flag (AMX never).
X86_SETS = {
    "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX512": "avx512f",
    "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
}


class LlamaCppUnavailable(ValueError):
    """llama.cpp cannot run here: llama-cpp-python is missing, or its build crashed in a probe.
    The message says which and what to do."""


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def require(what: str) -> None:
    """Refuse `what` (e.g. "--runtime llamacpp") when llama-cpp-python is not installed."""
    if not installed():
        raise LlamaCppUnavailable(
            f"llama-cpp-python, needed by {what}, is not installed; install it with `{INSTALL}` in a verispec "
            "checkout (it builds llama.cpp for this CPU from source, about 5 minutes; docs/runtime.md)"
        )


def cmake_args(flags: set[str] | None = None) -> str:
    """The CMAKE_ARGS that build llama.cpp for a CPU with these /proc/cpuinfo `flags` (default:
    this one's): no native build, each x86 instruction set the CPU has switched on by name.

    >>> cmake_args({"avx", "avx2", "fma", "f16c"})
    '-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON'
    """
    flags = cpu_flags(cpuinfo()) if flags is None else flags
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{name}=ON" for name, flag in X86_SETS.items() if flag in flags)])


# A child process loads the file and decodes a few tokens as the runtime and the peer do.
PROBE = """
import sys
import llama_cpp
llama = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, logits_all=True, flash_attn=True, verbose=False)
llama.create_completion("Hello", max_tokens=4)
"""


@functools.cache
def probe(gguf: Path) -> None:
    """Decode a few tokens of `gguf` with llama.cpp in a child process, once per file and
    process; raise `LlamaCppUnavailable` with one line if it is missing or the child dies (a
    build for another CPU segfaults in its first decode)."""
    require("llama.cpp")
    try:
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(gguf)], capture_output=True, text=True, timeout=PROBE_SECONDS
        )
    except subprocess.TimeoutExpired:
        raise LlamaCppUnavailable(
            f"llama.cpp did not decode 4 tokens of {gguf} in {PROBE_SECONDS} s in a test run; rebuild it with "
            f"`{INSTALL}`, or choose another runtime (--runtime fast or hf) and no llamacpp methods"
        ) from None
    if done.returncode == 0:
        return
    if done.returncode < 0:
        how = f"crashed ({signal.Signals(-done.returncode).name})"
    else:
        last = (done.stderr.strip().splitlines() or ["no message"])[-1]
        how = f"failed ({last})"
    raise LlamaCppUnavailable(
        f"llama.cpp {how} decoding {gguf} in a test run, so it cannot run here; rebuild llama-cpp-python for "
        f"this CPU with `{INSTALL}` (docs/runtime.md), or choose another runtime (--runtime fast or hf) and no "
        "llamacpp methods"
    )


class LlamaCppLM:
    """A GGUF file decoded by llama.cpp, with a rollback-able cache.

    >>> lm = LlamaCppLM("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=4096, n_threads=2)
    >>> lm.prefill(prompt[:-1])
    >>> logits = lm.extend([prompt[-1], *drafted])   # float32 [1 + k, V]
    >>> lm.rollback(lm.length - 2)

    n_ctx: positions the cache holds (prompt and new tokens together). n_threads: llama.cpp's
    threads, for one-token and many-token forwards alike (default: torch's count). n_batch: the
    most tokens one `llama_decode` takes; longer inputs are decoded in pieces of that size.
    deterministic: decode every forward after the prompt in pieces of 2 or 3 tokens (`pieces`),
    so that every row takes the same kernels and its logits do not depend on how many rows are
    scored with it.
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        deterministic: bool = True,
    ) -> None:
        require("the llama.cpp runtime")
        import llama_cpp

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
            self._decode(ids, rows=0, sizes=pieces(len(ids), self.n_batch, deterministic=False))

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._check_room(len(tokens))
        sizes = pieces(len(tokens), self.n_batch, self.deterministic)
        return self._decode(tokens, rows=keep or len(tokens), sizes=sizes)  # [keep or n, V]

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
        sizes = pieces(len(ids), self.n_batch, self.deterministic)
        return self._scratch.decode(ids, 0, rows=len(ids), sizes=sizes)  # [T, V]

    def _decode(self, tokens: Sequence[int], rows: int, sizes: list[int]) -> torch.Tensor:
        try:
            logits = self._live.decode(tokens, self._length, rows, sizes)
        except BaseException:
            self._live.forget_from(self._length)  # a piece may have been written before the failure
            raise
        self._length += len(tokens)
        return logits

    def _check_room(self, n: int) -> None:
        if self._length + n + self.deterministic > self.n_ctx:  # room for a padding row
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

    def decode(self, tokens: Sequence[int], start: int, rows: int, sizes: list[int]) -> torch.Tensor:
        """Decode `tokens` at positions start.. in forwards of `sizes` tokens (`pieces`; a size
        one more than the tokens left pads them with a row that is decoded and then forgotten);
        the logits of the last `rows` tokens, float32 [rows, V]."""
        n = len(tokens)
        ids = np.asarray(tokens, dtype=np.int32)  # [n]
        logits = torch.empty(rows, self.vocab_size, dtype=torch.float32)  # [rows, V]
        written, begin = 0, 0
        for size in sizes:
            end = min(n, begin + size)
            real = end - begin
            self.token[:real] = ids[begin:end]
            self.pos[:real] = np.arange(start + begin, start + end, dtype=np.int32)
            self.wanted[:real] = np.arange(begin, end) >= n - rows
            if size > real:  # a padding row, never read, so that a lone token takes the two-row kernels
                self.token[real], self.pos[real], self.wanted[real] = ids[end - 1], start + end, 0
            self.batch.batch.n_tokens = size
            self.context.decode(self.batch)
            if size > real:
                self.forget_from(start + end)
            outputs = int(self.wanted[:real].sum())
            if outputs:
                buffer = np.ctypeslib.as_array(self.context.get_logits(), shape=(outputs, self.vocab_size))
                logits[written : written + outputs] = torch.from_numpy(buffer)
                written += outputs
            begin = end
        return logits


def pieces(n: int, n_batch: int, deterministic: bool) -> list[int]:
    """The forward sizes that decode n tokens: up to `n_batch` each, or, deterministic, only 2
    or 3 (threes, then twos for a remainder: 4 -> 2 + 2, 7 -> 3 + 2 + 2; a lone token -> 2,
    its second row a padding row).

    >>> pieces(1, 512, True), pieces(4, 512, True), pieces(7, 512, True), pieces(7, 512, False)
    ([2], [2, 2], [3, 2, 2], [7])
    """
    if not deterministic:
        return [min(n_batch, n - begin) for begin in range(0, n, n_batch)]
    if n <= 1:
        return [2] * n
    threes, rest = divmod(n, 3)
    return {0: [3] * threes, 1: [3] * (threes - 1) + [2, 2], 2: [3] * threes + [2]}[rest]


if __name__ == "__main__":
    print(cmake_args())
