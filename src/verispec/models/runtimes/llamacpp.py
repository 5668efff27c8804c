"""`LlamaCppLM`: llama.cpp itself behind the `CausalLM` protocol, through llama-cpp-python.

The target is **the model as llama.cpp computes it**, not the GGUF file's float model: its CPU
kernels multiply the file's quantized blocks (Q4_1, Q4_K, ...) by activations quantized to 8
bits per block (Q8_0/Q8_1), keep keys and values in float16, and sum in their own orders. Its
logits differ from the float32 target's (`LlamaRuntime`, `HFCausalLM`) by that rounding, so its
greedy output may part from theirs at a close choice. verispec's verification is exact for
whichever target it is given: here, llama.cpp's numbers.

Cache: one llama.cpp context whose unified cache holds several sequences: the model itself is
one, and `new_slot` makes others, one per request of a batch (`SlotScoring`). `extend` writes a
sequence's tokens at positions length..length+n-1 and asks for logits of the last `keep` rows
only (llama.cpp then runs the output head on those rows alone); `rollback(length)` removes the
sequence's cells of positions length.. (`llama_memory_seq_rm`, what `Llama.eval` does before it
decodes), and the next `extend` fills them again. `extend_slots` decodes every slot's rows in
one `llama_decode`, each row under its own sequence id, so it attends to its own sequence's
cells only (flash attention skips the cells its mask hides). `score` decodes in a second context
of its own (made on first use), cleared before each call, so the live cache is never touched.
A slot no longer referenced gives its cells and its sequence id back.

Trees (`TreeScoring`): `extend_tree` decodes a token tree as the rows of one forward (per piece,
`pieces`), laid out depth first (`ScoredTree.depth_first`), each node at position length +
depth - 1 in the sequence set of every root-to-leaf path through it (`llama_batch.seq_id[i]`):
the first-child path's is the model's own sequence, every other path's a sequence borrowed from
the free ids, given the prefix's cells first (`llama_memory_seq_cp`, shared, not copied).
llama.cpp masks a row by its sequence, so a node sees the prefix and its ancestors only, in the
chain's cell order. `keep_path` removes its own sequence from the tree's cells past the kept
path's head on the first-child path, removes the borrowed sequences and gives them back; the
kept nodes past that head are owed: the next forward (`extend`, `extend_slots`, `extend_tree`)
decodes them again as a chain in front of its own rows. Left in their tree cells they would
leave free cells before them, which llama.cpp fills first, and flash attention sums a row's
cells in cell order. Their features are the tree rows' (a chain's bits where the rows are). A
tree needs one sequence per leaf; a wider one than the free sequences allow is refused.

Features (`FeatureChannel`), from the forward that scores the rows: the final norm's output
(`FINAL`) is llama.cpp's embeddings output, switched on (`llama_set_embeddings`) for a forward
where a sequence records it (llama.cpp then writes the logits and the embedding of every row);
a decoder layer's output (layer tap i) is the graph tensor `l_out-(i-1)`, copied as the graph
computes it by an eval callback (`cb_eval`, which llama.cpp calls for every graph node, so a
context has it only where some sequence records a layer tap: a context is remade for new taps,
the tokens its sequences hold decoded into it again as a prompt is). The last layer's output
exists for output rows only, so a sequence recording it (or FINAL) makes every row an output.
The heads' frozen embedding is the file's token embedding dequantized (`gguf_embeddings`): the
rows llama.cpp's embedding lookup gives, bit for bit the fast runtime's.

Row-count dependence: llama.cpp computes a row through other kernels depending on how many rows
one forward decodes, and a row's difference then reaches every later row through its keys and
values. Measured here (2-core x86-64 with AVX-512, llama-cpp-python 0.3.36), and read in ggml's
CPU kernels:
- one row: a forward of a single token takes another attention path than a forward of 2 or 3:
  without flash attention at any context; with it, where the one-query path splits the cache
  across threads, which it does for a KV view of 512 cells or more (llama.cpp pads the view to
  multiples of 256, so from `LONE_ROW_CELLS` cached positions on) on more than one thread. Max
  |diff| 0.4-0.6 on the Qwen pair's 1.5B.
- four or more rows: a K-quant matrix (the 1.5B's Q4_K) is repacked on load for a kernel that
  takes 4 or more rows at once, which rounds otherwise than the vector kernel of 1-3 rows, in
  every row (max |diff| about 0.6). Q4_0/Q4_1/Q8_0 products compute every row alone.
- built with AMX, one row's products (AVX-512 VNNI) and several rows' (the tiles) give a row
  the same bits, the 1.5B's Q4_K/Q6_K included (docs/runtime.md, "Determinism"); several rows
  cost about 1.5 one-row forwards. K-quant files keep pieces of 3 there: a matrix whose shape
  AMX refuses is repacked.
- 64 or more rows: flash attention's tiled kernel (a prompt's forward).
- forwards of 2 and of 3 rows give every row the same bits, at every context length measured
  (60 to 1500 cached positions), with and without flash attention, on both the default model
  and the 1.5B.
So `deterministic` (the default) decodes every forward after the prompt (`extend`, and `score`'s
rows) in pieces of 2 to `widest_piece` tokens (`pieces`: up to 63 for a file of Q4_1/Q8_0
matrices, else 3), and a lone token alone where its forward takes the
per-row attention anyway (`_Shared.pads_a_lone_row`: one thread, or below `LONE_ROW_CELLS`
positions of a cache no other sequence shares), else with a second, padding row (its cache
cell removed right after). Every position's logits are then a function of the prompt and the
tokens before it alone, however verification batched them, so greedy speculative output equals
plain greedy output. The prompt itself is decoded as llama.cpp decodes a prompt (`prefill`, up
to `n_batch` tokens a forward), the same way for every method. extend/rollback histories equal
`score` bit for bit where the prefill was at most 3 tokens (`score` has no prompt to batch;
after a longer prefill they differ by the prompt's rounding). The price: from `LONE_ROW_CELLS`
positions on (on 2 or more threads), plain decoding's one-token step costs a two-row forward
(docs/results/implementation-choices.md), and on a K-quant file a verification of 4 or more rows
two forwards.
Slots share the cache, whose cells a sequence holds in the order they were free: a slot's rows
equal its rows alone up to flash attention's summation order (bit for bit in the tests here,
not promised), so batched requests are not batch-invariant as on the fast runtime.
`deterministic=False` decodes as llama.cpp itself does (a lone token alone, up to `n_batch` a
forward): plain decoding at llama.cpp's own speed, but a row's logits then depend on how it
was batched, so the output is not one fixed target's: greedy speculative output may part from
plain decoding at a close choice, and a sampled token follows whichever forward scored it.
Flash attention is on either way (faster here, and one path for any forward size on short
contexts).

Returned logits are float32 [rows, V], one copy of the kept rows out of llama.cpp's output
buffer (read through a numpy view). The token, position and output-flag arrays of the batch
are written through numpy views too.

llama-cpp-python is an optional extra, built from source for this CPU by `make llamacpp`
(`cmake_args`: llama.cpp's native build is off and this CPU's instruction sets named one by one,
AMX's too, with GCC's dead-store elimination off where AMX is on: GCC 12's `_tile_loadconfig`
declares that it reads 8 bytes of the 64-byte tile configuration, so the stores of the tile
shapes are dropped as dead and the first tile load dies with SIGILL). Importing this module does
not need it; `require` says how to install it where it is missing, and `probe` decodes a
several-token prompt (a forward of several rows, which takes the AMX tiles where they are built
in) and a few tokens of a file in a child process before the first use here, so a build that
crashes costs one line (`LlamaCppUnavailable`), not the process.

    python -m verispec.models.runtimes.llamacpp      # the CMAKE_ARGS `make llamacpp` builds with
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import importlib
import importlib.util
import os
import signal
import subprocess
import sys
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from verispec.machine import cpu_flags, cpuinfo
from verispec.drafts import ROOT
from verispec.models.base import FINAL, Tap, check_extend, check_extend_tree, check_score_ids, check_slots, check_taps
from verispec.models.features import FeatureStore
from verispec.models.formats.gguf_blocks import stored_matrix_types
from verispec.models.runtimes import llamacpp_taps
from verispec.models.scored_tree import PENDING_TREE, PendingTree, ScoredTree

# A lone row's forward takes the many-row attention while the cache's KV view stays 256 cells:
# llama.cpp pads the view to 256 and splits a one-query flash attention over 512 or more.
LONE_ROW_CELLS = 256
# Block types whose llama.cpp CPU product computes every row alone, whatever the forward's row
# count (measured: no repacked kernel for them on x86-64 with AVX-512); a K-quant (Q4_K) has one.
ROWS_ALONE = frozenset({"Q4_1", "Q8_0"})
# Flash attention on: the same attention for a forward of any size (module docstring), as
# llama.cpp's own tools have it on a CPU; the llama.cpp peer decodes with it too, like for like.
FLASH_ATTENTION = True
# Flash attention computes each query row alone up to this many rows a forward; 64 or more tile.
FLASH_ROWS = 63
# The value cache's number types (llama.cpp's `type_v`, its ggml type ids): float16, llama.cpp's
# default, or Q8_0 (8-bit blocks of 32 with a float16 scale), which flash attention reads through
# its per-row kernel for a forward of any size, so no forward shape changes a row's bits.
CACHE_TYPES_V = {"f16": 1, "q8_0": 8}
# The sequences one request's tree round takes at most: a `--k tree` tree's 16 drafted nodes
# under the pending token have at most 16 leaves, a sequence each (its own, 15 borrowed).
TREE_SEQUENCES = 16
MAX_SEQUENCES = 256  # llama.cpp's LLAMA_MAX_SEQ: a context of more sequences is refused
INSTALL = "make llamacpp"  # the documented install: llama-cpp-python built with `cmake_args`
PROBE_SECONDS = 300  # a probe's load and decode of a small file take a few seconds

# llama.cpp's x86 instruction-set switches, each on where /proc/cpuinfo names its flag.
X86_SETS = {
    "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX512": "avx512f",
    "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
    "GGML_AMX_TILE": "amx_tile", "GGML_AMX_INT8": "amx_int8", "GGML_AMX_BF16": "amx_bf16",
}
# With AMX on: keep the stores of the tile configuration that GCC 12's `_tile_loadconfig` hides
# from it (module docstring). Without them llama.cpp's AMX products die with SIGILL.
AMX_COMPILER_FLAGS = "-DCMAKE_CXX_FLAGS='-fno-tree-dse -fno-dse'"


class LlamaCppUnavailable(ValueError):
    """llama.cpp cannot run here: llama-cpp-python is missing, or its build crashed in a probe.
    The message says which and what to do."""


def installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def require(what: str) -> None:
    """Refuse `what` (e.g. "--runtime llamacpp") when llama-cpp-python is not installed, or is
    installed but cannot be imported (its shared library missing or built for another machine:
    llama-cpp-python raises RuntimeError, OSError or ImportError then)."""
    if not installed():
        raise LlamaCppUnavailable(
            f"llama-cpp-python, needed by {what}, is not installed; install it with `{INSTALL}` in a verispec "
            "checkout (it builds llama.cpp for this CPU from source, about 5 minutes; docs/runtime.md)"
        )
    error = import_failure()
    if error is None:
        return
    why = (str(error).strip().splitlines() or [type(error).__name__])[0]
    missing = getattr(error, "name", None)
    if isinstance(error, ModuleNotFoundError) and missing and not missing.startswith("llama_cpp"):
        raise LlamaCppUnavailable(
            f"llama-cpp-python, needed by {what}, is installed but cannot be imported: it needs {missing}, which is "
            f"not installed; install it (`pip install {missing}`; `{INSTALL}` installs every dependency)"
        )
    raise LlamaCppUnavailable(
        f"llama-cpp-python, needed by {what}, is installed but cannot be imported ({why}); rebuild it with "
        f"`{INSTALL}` in a verispec checkout (docs/runtime.md)"
    )


def import_failure() -> Exception | None:
    """Why an installed llama-cpp-python fails to import (its shared library missing or built
    for another machine, a dependency missing); None where it imports, or is not there at all
    (`installed` says that)."""
    if importlib.util.find_spec("llama_cpp") is None:
        return None
    try:
        importlib.import_module("llama_cpp")
    except (ImportError, OSError, RuntimeError) as error:
        return error
    return None


def cmake_args(flags: set[str] | None = None) -> str:
    """The CMAKE_ARGS that build llama.cpp for a CPU with these /proc/cpuinfo `flags` (default:
    this one's): no native build, each x86 instruction set the CPU has switched on by name, and
    where AMX is among them, the compiler flags its tile configuration needs (`AMX_COMPILER_FLAGS`).

    >>> cmake_args({"avx", "avx2", "fma", "f16c"})
    '-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON'
    """
    flags = cpu_flags(cpuinfo()) if flags is None else flags
    switches = [name for name, flag in X86_SETS.items() if flag in flags]
    amx = [AMX_COMPILER_FLAGS] if any(name.startswith("GGML_AMX") for name in switches) else []
    return " ".join(["-DGGML_NATIVE=OFF", *(f"-D{name}=ON" for name in switches), *amx])


# A child process loads the file and decodes a prompt of several tokens (one forward of several
# rows: the AMX tiles where they are built in) and a few tokens more, as the runtime and the peer do.
PROBE = """
import sys
import llama_cpp
llama = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_threads=1, logits_all=True, flash_attn=True, verbose=False)
llama.create_completion("Hello, how are you today? Tell me about the sea.", max_tokens=4)
"""


@functools.cache
def probe(gguf: Path) -> None:
    """Decode a prompt and a few tokens of `gguf` with llama.cpp in a child process, once per file
    and process; raise `LlamaCppUnavailable` with one line if it is missing or the child dies (a
    build for another CPU segfaults in its first decode, a broken AMX build at its first forward
    of several rows)."""
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
    """A GGUF file decoded by llama.cpp: one sequence of a shared llama.cpp context, with a
    rollback-able cache, the features a head reads (`FeatureChannel`), slots (`SlotScoring`)
    and token trees (`TreeScoring`).

    >>> lm = LlamaCppLM("SmolLM2-135M-Instruct.Q4_1.gguf", n_ctx=4096, n_threads=2)
    >>> lm.prefill(prompt[:-1])
    >>> logits = lm.extend([prompt[-1], *drafted])   # float32 [1 + k, V]
    >>> lm.rollback(lm.length - 2)
    >>> a, b = lm.new_slot(), lm.new_slot()           # sequences of the same cache
    >>> rows_a, rows_b = lm.extend_slots([a, b], [[x], [y, z]])
    >>> tree = lm.extend_tree([x, y, z], [-1, 0, 0])  # float32 [3, V]: z's path is [x, z]
    >>> lm.keep_path([0, 2])

    n_ctx: positions one request may hold; the cache holds that many for this sequence and for
    each slot `reserve_slots` makes room for, every sequence's together. n_threads: llama.cpp's
    threads, for one-token and many-token forwards alike (default: torch's count). n_batch: the
    most tokens one `llama_decode` takes; longer inputs are decoded in pieces of that size.
    deterministic: decode every forward after the prompt in pieces of 2 to `widest_piece` tokens (`pieces`),
    a lone token alone only where its forward takes the many-row attention too (`LONE_ROW_CELLS`),
    so that a row's logits do not depend on how many rows are scored with it. sequences: the
    most sequences (this one, its slots, and a scored tree's paths) the cache holds at once. matrices: the block types of
    the file's matrices, which set `widest_piece` (default: read from the file's tensor table;
    the loader passes its cached copy's, `sources.matrix_types`). cache_type_v: the value
    cache's type, "f16" (llama.cpp's default) or "q8_0": values rounded to 8-bit blocks, a
    different target, whose attention gives a row the same bits in a forward of any size, so
    deterministic decoding needs no padding row and no cap on a forward's rows (`CACHE_TYPES_V`).
    """

    def __init__(
        self,
        model_path: str | os.PathLike,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        n_batch: int = 512,
        deterministic: bool = True,
        sequences: int = TREE_SEQUENCES,
        matrices: set[str] | None = None,
        cache_type_v: str = "f16",
    ) -> None:
        require("the llama.cpp runtime")
        if cache_type_v not in CACHE_TYPES_V:
            raise ValueError(f"cache_type_v {cache_type_v!r} is not one of {', '.join(CACHE_TYPES_V)}")
        path = Path(model_path)
        widest = widest_piece(stored_matrix_types(path) if matrices is None else matrices, cache_type_v, n_batch)
        self._shared = _Shared(path, n_ctx, n_threads or torch.get_num_threads(), n_batch, deterministic, sequences, widest,
                               cache_type_v)
        self._join()

    def _join(self) -> None:
        self.vocab_size = self._shared.vocab_size
        self.hidden_size = self._shared.hidden_size
        self.num_layers = self._shared.num_layers
        self.n_ctx = self._shared.context
        self.deterministic = self._shared.deterministic
        self.cache_type_v = self._shared.cache_type_v
        self.seq = self._shared.join(self)
        self._features = FeatureStore(self.hidden_size)
        self._tokens: list[int] = []  # what the cache holds (a remade context decodes them again)
        self._pending = PendingTree()  # the scored tree from extend_tree to keep_path
        self._branches: list[int] = []  # the sequences borrowed for its other root-to-leaf paths
        self._owed: list[int] = []  # the last tokens, kept off a tree's first-child path: no cells yet

    @property
    def cached(self) -> int:
        """Tokens whose cells the cache holds: all but the kept tree nodes owed to the next forward."""
        return len(self._tokens) - len(self._owed)

    @property
    def length(self) -> int:
        return len(self._tokens)

    @property
    def llama(self):
        """The `llama_cpp.Llama` that loaded the file (its model is every context's)."""
        return self._shared.llama

    def weight_bytes(self) -> int:
        """Bytes of the model's tensors as llama.cpp holds them (the file's blocks, mapped)."""
        return int(self._shared.api.llama_model_size(self.llama.model))

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one position takes: keys of every layer in float16, values in float16 or
        Q8_0 (34 bytes a block of 32)."""
        return cache_bytes_per_position(self.llama.model, CACHE_TYPES_V[self.cache_type_v])

    def reset(self) -> None:
        if self._tokens:
            self._shared.forget(self.seq, 0)
        self._release_branches()
        self._pending.tree = None
        self._tokens.clear()
        self._owed.clear()
        self._features.reset()

    def prefill(self, ids: Sequence[int]) -> None:
        self.reset()
        if len(ids):
            check_score_ids(ids, self.vocab_size, "prefill")
            self._shared.check_room(len(ids))
            sizes = pieces(len(ids), self._shared.n_batch, deterministic=False)
            self._shared.run([[self._rows(ids[b : b + n], b, keep=0, size=n)] for b, n in _starts(sizes)])

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._pending.refuse()
        return self._shared.extend_slots([self], [tokens], [keep or len(tokens)])[0]  # [keep or n, V]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}; {self.length} tokens processed")
        self._pending.rolled_back(length)
        self._release_branches()  # a tree rolled back whole: its other paths' sequences go back
        if length < self.length:
            del self._owed[max(0, len(self._owed) - (self.length - length)) :]
            self._shared.forget(self.seq, length)
            del self._tokens[length:]
            self._features.truncate(length)

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size)
        return self._shared.score(ids, ())[0]  # [T, V]

    def _rows(self, tokens: Sequence[int], start: int, keep: int, size: int, tree: _TreeRows | None = None) -> _Rows:
        """This sequence's piece of a forward: `tokens` at positions start.. (or a tree's rows
        at their own positions, each in the sequences of its paths), the logits of the last
        `keep`, in a forward of `size` rows (one more than the tokens: a padding row)."""
        return _Rows(self, self.seq, np.asarray(tokens, dtype=np.int32), start, keep, size > len(tokens),
                     self._features.taps, tree)

    def _advance(self, tokens: list[int], features: dict[Tap, torch.Tensor]) -> None:
        """These tokens of this sequence were decoded, the owed ones first (already counted,
        their features kept); their recorded features."""
        owed, self._owed = len(self._owed), []
        self._tokens += tokens[owed:]
        if self._features.taps:
            self._features.append({tap: rows[owed:] for tap, rows in features.items()})

    # --- FeatureChannel -------------------------------------------------------------------

    def record_features(self, taps: Sequence[Tap]) -> None:
        self._pending.refuse()
        taps = check_taps(taps, self.num_layers)
        self._shared.observe([tap for tap in taps if tap != FINAL])
        for tap in taps:
            self._features.add(tap, self.length)

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        return self._features.read(taps, start, end)

    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size, "score_features")
        self._features.check_recorded(taps)
        captured = self._shared.score(ids, tuple(taps))[1]
        return torch.cat([captured[tap] for tap in taps], dim=-1)  # [T, len(taps) H]

    def input_embeddings(self) -> torch.Tensor:
        return self._shared.embeddings()

    def output_embeddings(self) -> torch.Tensor:
        return self._shared.output_embeddings()

    # --- TreeScoring ----------------------------------------------------------------------

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """The tree's nodes in one `llama_decode` (deterministic: one per piece, `pieces`), laid
        out depth first, each at position length + depth - 1 in the sequences of the root-to-leaf
        paths through it: the first-child path's in this sequence, every other path's in a
        sequence borrowed for it (holding this one's prefix too); logits float32 [n, V] in the
        caller's node order."""
        check_extend_tree(tokens, parents, self.vocab_size)
        self._pending.refuse()
        tree = ScoredTree.depth_first(self.length, parents)
        logits = self._shared.extend_tree(self, [tokens[node] for node in tree.nodes], tree)  # [n, V], rows
        self._pending.tree = tree
        return tree.by_node(logits)

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep the path's nodes in this sequence, its other cells and the borrowed sequences
        gone. The nodes already in a chain's cells (the first-child path's head) stay; the rest
        lose their tree cells and are owed: the next forward decodes them again in front of its
        own rows (no logits), so that this sequence's cells stay in position order, which flash
        attention sums in. Their features are the tree rows', kept now."""
        start, sources, destinations = self._pending.kept(path)
        in_place = len(path) - len(sources)
        self._owed = [self._tokens[source] for source in sources]
        self._shared.forget(self.seq, start + in_place)
        self._release_branches()
        self._tokens[start + in_place :] = self._owed
        self._features.move(sources, destinations)
        self._features.truncate(start + len(path))

    def _release_branches(self) -> None:
        """Give back the sequences a scored tree borrowed, their cells removed."""
        while self._branches:
            self._shared.leave(self._branches.pop())

    # --- SlotScoring ----------------------------------------------------------------------

    def new_slot(self, capacity: int = 256) -> LlamaCppLM:
        """Another sequence of the same llama.cpp cache (empty), for one request of a batch; the
        cache's positions are shared by every sequence (capacity is not reserved: `reserve_slots`
        sizes the cache)."""
        slot = object.__new__(LlamaCppLM)
        slot._shared = self._shared
        slot._join()
        return slot

    def extend_slots(self, slots: Sequence[LlamaCppLM], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Every slot's new rows in one `llama_decode` (deterministic: one per piece, `pieces`),
        each slot a sequence attending to its own cells only; per slot its logits
        float32 [n_i, V], equal to its own `extend` up to rounding (module docstring)."""
        check_slots(slots, tokens, LlamaCppLM)
        for slot, rows in zip(slots, tokens):
            if slot._shared is not self._shared:
                raise ValueError("extend_slots takes slots made by this model's new_slot")
            check_extend(rows, None, self.vocab_size)
            slot._pending.refuse()
        return self._shared.extend_slots(slots, tokens, [len(rows) for rows in tokens])

    def reserve_slots(self, slots: int) -> None:
        """Make room for `slots` requests besides this one (the scheduler's slots), each with the
        sequences of a `--k tree` round's paths (`TREE_SEQUENCES`, up to llama.cpp's
        `MAX_SEQUENCES` in all) and n_ctx positions: the cache is remade for more while none
        holds tokens."""
        self._shared.reserve(min(MAX_SEQUENCES, (slots + 1) * TREE_SEQUENCES), (slots + 1) * self.n_ctx)

    def __del__(self) -> None:
        """A slot no longer referenced gives its sequence id and cache cells back."""
        shared = getattr(self, "_shared", None)
        if shared is not None and hasattr(self, "seq"):
            shared.leave(self.seq)
            for branch in getattr(self, "_branches", ()):
                shared.leave(branch)


@dataclasses.dataclass(frozen=True)
class _TreeRows:
    """Where a piece of a token tree's rows sit: each row's position, and the sequence ids of
    the root-to-leaf paths through it (the row's first attends: all of them hold its ancestors)."""

    positions: np.ndarray  # [n] int32
    seqs: tuple[tuple[int, ...], ...]  # [n]


@dataclasses.dataclass
class _Rows:
    """One sequence's part of a forward: tokens [n] at positions start..start+n-1 of sequence
    `seq` (or a tree's, `tree`), the logits of the last `keep`, a padding row after them
    (decoded, then forgotten) where `pad`, and the taps whose features the sequence records."""

    owner: LlamaCppLM
    seq: int
    tokens: np.ndarray  # [n] int32
    start: int
    keep: int
    pad: bool
    taps: tuple[Tap, ...]
    tree: _TreeRows | None = None

    @property
    def size(self) -> int:
        return len(self.tokens) + self.pad

    def positions(self) -> np.ndarray:
        """[size] int32: each row's position (a padding row's one after the last token's)."""
        if self.tree is None:
            return np.arange(self.start, self.start + self.size, dtype=np.int32)
        return np.append(self.tree.positions, self.tree.positions[-1:] + 1)[: self.size]

    def seqs(self) -> list[tuple[int, ...]]:
        """[size]: each row's sequence ids (a padding row's those of the last token)."""
        if self.tree is None:
            return [(self.seq,)] * self.size
        return [*self.tree.seqs, *self.tree.seqs[-1:]][: self.size]

    @property
    def outputs(self) -> int:
        """Rows whose logits (and final-norm features) llama.cpp writes: every real row where
        the final norm's features, or the last layer's (computed for output rows only), are kept."""
        return len(self.tokens) if self.every_row else self.keep

    @property
    def every_row(self) -> bool:
        return FINAL in self.taps or self.owner.num_layers in self.taps


class _Shared:
    """What the sequences of one loaded file share: the model, the live context whose cache
    holds every sequence, score's context, the token embedding; and how forwards are cut."""

    def __init__(
        self, path: Path, n_ctx: int, threads: int, n_batch: int, deterministic: bool, sequences: int, widest: int, cache_type_v: str
    ) -> None:
        import llama_cpp

        self.api = llama_cpp
        self.path = path
        # The model, and the context settings every context copies; its own context is small and unused.
        self.llama = llama_cpp.Llama(
            model_path=str(path), n_ctx=256, n_threads=threads, n_threads_batch=threads, n_batch=256,
            logits_all=True, flash_attn=FLASH_ATTENTION,
            verbose=False,
        )
        model = self.llama.model
        self.vocab_size = int(self.llama.n_vocab())
        self.hidden_size = int(llama_cpp.llama_model_n_embd(model))
        self.num_layers = int(llama_cpp.llama_model_n_layer(model))
        self.n_batch, self.sequences, self.threads = n_batch, sequences, threads
        self.context = n_ctx  # positions one request may hold
        self.n_ctx = n_ctx  # positions the live cache holds, every sequence's (`reserve`)
        self.widest = widest
        self.deterministic = deterministic
        self.cache_type_v = cache_type_v
        self.free = list(range(sequences))[::-1]  # sequence ids not taken
        self.members: weakref.WeakValueDictionary[int, LlamaCppLM] = weakref.WeakValueDictionary()
        self.layers: set[int] = set()  # layer taps some sequence records
        self._live: _Context | None = None
        self._scratch: _Context | None = None
        self._embeddings: torch.Tensor | None = None
        self.slotted = False  # a second sequence was made: cells are no longer one sequence's in order

    def join(self, member: LlamaCppLM) -> int:
        if not self.free:
            raise ValueError(f"the llama.cpp context holds {self.sequences} sequences at once, all taken; close a slot first")
        seq = self.free.pop()
        self.members[seq] = member
        self.slotted = len(self.members) > 1 or self.slotted
        return seq

    def leave(self, seq: int) -> None:
        """Sequence `seq` is no longer used: its cells removed, its id free for another."""
        self.forget(seq, 0)
        self.members.pop(seq, None)
        if seq not in self.free:
            self.free.append(seq)

    def live(self) -> _Context:
        """The live context, made for the recorded layer taps and the sequences reserved:
        remade where it lacks them, and then every sequence's cached tokens decoded into it again as a prompt is (no logits;
        their kept features stay: the same numbers up to the prompt's rounding)."""
        live = self._live
        if live is None or not self.layers <= live.layers or live.sequences < self.sequences or live.n_ctx < self.n_ctx:
            if any(member._pending.tree is not None for member in list(self.members.values())):
                raise ValueError(PENDING_TREE)  # its other paths live in this context's cells only
            self._live = live = None  # freed before its successor is made
            self._live = _Context(self, self.n_ctx, self.sequences, frozenset(self.layers))
            for member in list(self.members.values()):
                sizes = pieces(member.length, self.n_batch, deterministic=False)
                for begin, size in _starts(sizes):
                    tokens = np.asarray(member._tokens[begin : begin + size], dtype=np.int32)
                    self._live.decode([_Rows(member, member.seq, tokens, begin, 0, False, ())])
                member._owed = []  # decoded with the rest
        return self._live

    def forget(self, seq: int, position: int) -> None:
        if self._live is not None:
            self._live.forget(seq, position)

    def observe(self, layers: Sequence[int]) -> None:
        """Keep layer outputs at these taps from now on (`live` remakes the context for them)."""
        self.layers |= set(layers)

    def reserve(self, sequences: int, positions: int) -> None:
        """Hold at least this many sequences and cached positions at once (`live` remakes the
        context for them)."""
        if sequences > self.sequences:
            self.free = list(range(sequences - 1, self.sequences - 1, -1)) + self.free
            self.sequences = sequences
        self.n_ctx = max(self.n_ctx, positions)

    def check_room(self, n: int) -> None:
        used = sum(member.length for member in list(self.members.values()))
        if used + n + self.deterministic > self.n_ctx:  # room for a padding row
            raise ValueError(
                f"{used} cached and {n} new tokens exceed the llama.cpp cache of {self.n_ctx} positions ({self.context} "
                "a request reserved); build the model with a larger n_ctx or reserve more slots"
            )

    def pads_a_lone_row(self, start: int) -> bool:
        """Whether a forward of one row at position `start` needs a padding row to take the
        many-row attention: deterministic, on a float16 value cache (a Q8_0 one never takes the
        split path), on more than one thread (one thread's split of the cache is one piece, the
        many-row arithmetic), where its KV view may reach 512 cells (past `LONE_ROW_CELLS`
        positions, or once other sequences share the cache)."""
        return (self.deterministic and self.cache_type_v == "f16" and self.threads > 1
                and (self.slotted or start >= LONE_ROW_CELLS))

    def extend_slots(self, members: Sequence[LlamaCppLM], tokens: Sequence[Sequence[int]], keeps: Sequence[int]) -> list[torch.Tensor]:
        """Each member's tokens after its cache, cut into pieces (`pieces`), the members' j-th
        pieces in one forward; per member the logits of its last keep rows, float32 [keep, V]. A
        member's lone token is padded only where it would be its forward's one row: beside
        another member's rows the forward takes the many-row attention already."""
        self.check_room(sum(map(len, tokens)))
        tokens = [[*member._owed, *rows] for member, rows in zip(members, tokens)]  # owed tree nodes first
        shared = len(members) > 1  # every member's first piece then shares forward 0 with another's rows
        cut = [pieces(len(rows), self.n_batch, self.deterministic, shared or not self.pads_a_lone_row(member.cached), self.widest)
               for member, rows in zip(members, tokens)]
        forwards: list[list[_Rows]] = []
        for member, rows, keep, sizes in zip(members, tokens, keeps, cut):
            for j, (begin, size) in enumerate(_starts(sizes)):
                piece = rows[begin : begin + size]
                if j == len(forwards):
                    forwards.append([])
                forwards[j].append(member._rows(piece, member.cached + begin, _kept(keep, len(rows), begin, len(piece)), size))
        logits = self.run(forwards)
        return [rows[0] if len(rows) == 1 else torch.cat(rows) for rows in (logits[id(member)] for member in members)]

    def extend_tree(self, member: LlamaCppLM, tokens: Sequence[int], tree: ScoredTree) -> torch.Tensor:
        """A tree's rows (`tokens` in `tree`'s row order) after the member's cache, cut into
        pieces as a chain's (parents precede children, so a piece's rows see their ancestors in
        its own cells or earlier pieces'); their logits float32 [n, V]. Every root-to-leaf path
        is a sequence: the first (the first-child path) the member's own, each other one
        borrowed from the free ids, after a copy of the member's prefix."""
        self.check_room(len(tokens))
        leaves = tree_leaves(tree.parents)
        if len(leaves) - 1 > len(self.free):
            raise ValueError(
                f"a token tree of {len(leaves)} leaves needs {len(leaves)} llama.cpp sequences (one a root-to-leaf "
                f"path) and {len(self.free) + 1} are free of the context's {self.sequences}; draft a narrower tree, "
                "or build the model with more sequences"
            )
        context = self.live()
        member._branches = [self.free.pop() for _ in leaves[1:]]
        for branch in member._branches:
            context.copy(member.seq, branch)
        paths = path_sequences(tree.parents, leaves, [member.seq, *member._branches])
        owed = len(member._owed)  # a chain in front of the tree, in every path's sequence
        rows = [*member._owed, *tokens]
        seqs = [(member.seq, *member._branches)] * owed + paths
        positions = np.concatenate([np.arange(member.cached, tree.start), tree.positions().numpy()]).astype(np.int32)  # [owed + n]
        sizes = pieces(len(rows), self.n_batch, self.deterministic, not self.pads_a_lone_row(member.cached), self.widest)
        forwards = [[member._rows(rows[begin : begin + size], member.cached + begin, _kept(len(tokens), len(rows), begin, size), size,
                                  _TreeRows(positions[begin : begin + size], tuple(seqs[begin : begin + size])))]
                    for begin, size in _starts(sizes)]
        try:
            logits = self.run(forwards)[id(member)]
        except BaseException:
            member._release_branches()
            raise
        return logits[0] if len(logits) == 1 else torch.cat(logits)

    def run(self, forwards: list[list[_Rows]]) -> dict[int, list[torch.Tensor]]:
        """Decode the forwards in order on the live context, then advance each member by its
        rows (a failure forgets every cell the call wrote and re-raises, nothing advanced); per
        member (by id) the logits rows of every forward it took part in."""
        context = self.live()
        members = {id(part.owner): part.owner for parts in forwards for part in parts}
        logits: dict[int, list[torch.Tensor]] = {key: [] for key in members}
        features: dict[int, list[dict[Tap, torch.Tensor]]] = {key: [] for key in members}
        decoded: dict[int, list[int]] = {key: [] for key in members}
        try:
            for parts in forwards:
                for part, rows, captured in zip(parts, *context.decode(parts)):
                    logits[id(part.owner)].append(rows)
                    features[id(part.owner)].append(captured)
                    decoded[id(part.owner)] += part.tokens.tolist()
        except BaseException:
            for member in members.values():
                context.forget(member.seq, member.cached)
            raise
        for key, member in members.items():
            taps = member._features.taps
            member._advance(decoded[key], {tap: torch.cat([f[tap] for f in features[key]]) for tap in taps})
        return logits

    def score(self, ids: Sequence[int], taps: tuple[Tap, ...]) -> tuple[torch.Tensor, dict[Tap, torch.Tensor]]:
        """A fresh recomputation in score's own context (its cache cleared first): the logits
        [T, V] and the features {tap: [T, H]} of every position of `ids`, the same pieces as
        `extend` of them after an empty cache."""
        if len(ids) > self.context:
            raise ValueError(f"score got {len(ids)} tokens; a llama.cpp request holds {self.context}")
        layers = frozenset(tap for tap in taps if tap != FINAL)
        if self._scratch is None or not layers <= self._scratch.layers:
            self._scratch = _Context(self, self.context, 1, layers | (self._scratch.layers if self._scratch else frozenset()))
        context = self._scratch
        context.forget(0, 0)
        owner = _Scorer(self.num_layers, taps)
        logits, features = [], {tap: [] for tap in taps}
        sizes = pieces(len(ids), self.n_batch, self.deterministic, True, self.widest)  # position 0: lone is safe
        for begin, size in _starts(sizes):
            piece = np.asarray(ids[begin : begin + size], dtype=np.int32)
            part = _Rows(owner, 0, piece, begin, len(piece), size > len(piece), taps)
            rows, captured = context.decode([part])
            logits.append(rows[0])
            for tap in taps:
                features[tap].append(captured[0][tap])
        return torch.cat(logits), {tap: torch.cat(rows) for tap, rows in features.items()}

    def embeddings(self) -> torch.Tensor:
        """The token embedding [V, H] float32, the file's blocks dequantized (the rows llama.cpp's
        lookup gives, and the fast runtime's embedding of the same file, bit for bit), read once."""
        if self._embeddings is None:
            self._embeddings, self._output = gguf_embeddings(self.path)
        return self._embeddings

    def output_embeddings(self) -> torch.Tensor:
        self.embeddings()
        return self._output


def gguf_embeddings(gguf: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """A GGUF file's token embedding and output head, float32 [V, H] each (the same tensor
    where the file ties them: no `output.weight`)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {tensor.name: tensor for tensor in GGUFReader(gguf).tensors}

    def read(name: str) -> torch.Tensor:
        tensor = tensors[name]
        return torch.from_numpy(np.ascontiguousarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))

    embedding = read("token_embd.weight")  # [V, H]
    return embedding, read("output.weight") if "output.weight" in tensors else embedding


class _Scorer:
    """The owner of score's rows: what `_Rows` reads of a sequence (its layer count)."""

    def __init__(self, num_layers: int, taps: tuple[Tap, ...]) -> None:
        self.num_layers = num_layers
        self.taps = taps


class _Context:
    """One llama.cpp context over the shared model: `sequences` sequences in one unified cache,
    one batch written through numpy views, and the features of a forward: the final norm's
    output through llama.cpp's embeddings output, decoder-layer outputs through an eval
    callback that copies the tensors `l_out-i` as the graph computes them (`layers`)."""

    def __init__(self, shared: _Shared, n_ctx: int, sequences: int, layers: frozenset[int]) -> None:
        from llama_cpp import _ggml, _internals, _utils

        api = shared.api
        self.api = api
        self.shared = shared
        self.layers, self.sequences, self.n_ctx = layers, sequences, n_ctx
        self.vocab_size, self.hidden_size = shared.vocab_size, shared.hidden_size
        params = type(shared.llama.context_params).from_buffer_copy(shared.llama.context_params)
        params.n_ctx = n_ctx
        params.n_batch = params.n_ubatch = shared.n_batch
        params.n_seq_max = sequences
        params.kv_unified = True  # one cache: a forward of several sequences is one ubatch, as one sequence's is
        params.type_v = CACHE_TYPES_V[shared.cache_type_v]
        self.names = {f"l_out-{layer - 1}".encode(): layer for layer in layers}
        self.tapping = bool(layers)  # whether this forward copies the layer taps (`decode`: where a part records them)
        self.captured: dict[int, list[np.ndarray]] = {layer: [] for layer in layers}
        self.native = False  # the C callback copies the taps (`llamacpp_taps`), else the Python one
        if layers:
            ggml = _ggml.libggml
            library = llamacpp_taps.library()
            self.native = library is not None
            # kept: llama.cpp holds a pointer to the callback and to its data
            if library is None:  # Python reads the nodes' names and data through ctypes
                ggml.ggml_get_name.restype, ggml.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
                ggml.ggml_get_data_f32.restype = ctypes.POINTER(ctypes.c_float)
                ggml.ggml_get_data_f32.argtypes = [ctypes.c_void_p]
                ggml.ggml_nelements.restype, ggml.ggml_nelements.argtypes = ctypes.c_int64, [ctypes.c_void_p]
                self.ggml = ggml
                self.callback = api.ggml_backend_sched_eval_callback(self._observe)
                params.cb_eval = self.callback
            else:  # a forward's rows of each tap, at most n_batch, copied in C
                buffers = [np.empty((shared.n_batch, self.hidden_size), dtype=np.float32) for _ in self.names]
                self.callback = llamacpp_taps.NativeCallback(library, ggml, list(self.names), buffers,
                                                             api.ggml_backend_sched_eval_callback)
                params.cb_eval, params.cb_eval_user_data = self.callback.pointer, self.callback.user_data
        # Quiet: llama.cpp warns of "training context overflow" when n_ctx, every sequence's
        # positions together, exceeds the trained context, which no one sequence does.
        with _utils.suppress_stdout_stderr(disable=False):
            self.context = _internals.LlamaContext(model=shared.llama._model, params=params, verbose=False)
        self.memory = api.llama_get_memory(self.context.ctx)
        self.embedding = False
        # A row may belong to every sequence (a tree's root: every root-to-leaf path's).
        self.batch = _internals.LlamaBatch(n_tokens=shared.n_batch, embd=0, n_seq_max=sequences, verbose=False)
        raw = self.batch.batch
        capacity = shared.n_batch
        self.token = np.ctypeslib.as_array(raw.token, shape=(capacity,))
        self.pos = np.ctypeslib.as_array(raw.pos, shape=(capacity,))
        self.wanted = np.ctypeslib.as_array(raw.logits, shape=(capacity,))
        self.n_seq_id = np.ctypeslib.as_array(raw.n_seq_id, shape=(capacity,))
        self.seq_ids = [raw.seq_id[i] for i in range(capacity)]

    def _observe(self, tensor: int, ask: bool, user_data) -> bool:
        """The eval callback in Python, where the C one (`llamacpp_taps`) was not built."""
        if not self.tapping or self.ggml.ggml_get_name(tensor) not in self.names:
            return False
        return True if ask else self._copy(tensor)

    def _copy(self, tensor: int) -> bool:
        """A wanted node, computed: keep its rows [n_tokens, H], float32, in the batch's order."""
        layer = self.names[self.ggml.ggml_get_name(tensor)]
        data = np.ctypeslib.as_array(self.ggml.ggml_get_data_f32(tensor), shape=(self.ggml.ggml_nelements(tensor),))
        self.captured[layer].append(data.reshape(-1, self.hidden_size).copy())
        return True

    def _tap(self, tapping: bool) -> None:
        """Copy the layer taps in the next forward or not: in a forward none of whose parts records
        them (slots decoding without a head, beside one whose head reads them) the callback
        answers no to every node, so llama.cpp computes the graph whole, as without a callback."""
        if tapping != self.tapping:
            self.tapping = tapping
            if self.native:
                self.callback.listen(tapping)

    def forget(self, seq: int, position: int) -> None:
        """Remove sequence `seq`'s cache cells of positions >= `position` (none once the context
        is freed: the garbage collector may free it before a slot's `__del__` gives its cells back)."""
        if self.context.ctx is not None:
            self.api.llama_memory_seq_rm(self.memory, seq, position, -1)

    def copy(self, source: int, seq: int) -> None:
        """Put every cell of sequence `source` in sequence `seq` too (shared, not copied)."""
        self.api.llama_memory_seq_cp(self.memory, source, seq, -1, -1)

    def decode(self, parts: Sequence[_Rows]) -> tuple[list[torch.Tensor], list[dict[Tap, torch.Tensor]]]:
        """One `llama_decode` of every part's rows; per part its logits float32 [keep, V] and
        its recorded taps' features {tap: [n, H]} (padding rows dropped, their cells forgotten)."""
        row = 0
        for part in parts:
            n = len(part.tokens)
            self.token[row : row + n] = part.tokens
            self.pos[row : row + part.size] = part.positions()
            self.wanted[row : row + n] = np.arange(n) >= n - part.outputs
            if part.pad:  # never read: a lone token then takes the many-row kernels
                self.token[row + n], self.wanted[row + n] = part.tokens[-1], 0
            for i, seqs in enumerate(part.seqs(), start=row):
                self.n_seq_id[i] = len(seqs)
                for j, seq in enumerate(seqs):
                    self.seq_ids[i][j] = seq
            row += part.size
        self._tap(any(tap in self.layers for part in parts for tap in part.taps))
        embedding = any(FINAL in part.taps for part in parts)
        if embedding:  # llama.cpp writes the embeddings of every row then, padding rows too
            self.wanted[:row] = 1
        if embedding != self.embedding:
            self.api.llama_set_embeddings(self.context.ctx, embedding)
            self.embedding = embedding
        self.batch.batch.n_tokens = row
        for kept in self.captured.values():
            kept.clear()
        if self.native:
            self.callback.start()
        try:
            self.context.decode(self.batch)
        except RuntimeError as error:
            raise ValueError(f"llama.cpp could not decode {row} rows ({error}); its context may be full") from None
        finally:
            for part in parts:
                if part.pad:
                    self.forget(part.seq, int(part.positions()[-1]))
        if self.native:
            for layer, rows in zip(self.names.values(), self.callback.copied()):
                if len(rows):  # a view of the callback's buffer: concatenated (copied) below, before the next forward
                    self.captured[layer].append(rows)
        wanted = self.wanted[:row].astype(np.int64)  # [rows]
        index = np.cumsum(wanted) - wanted  # [rows]: each output row's place among the outputs
        outputs = int(wanted.sum())
        logits = np.ctypeslib.as_array(self.context.get_logits(), shape=(outputs, self.vocab_size)) if outputs else None
        normed = (np.ctypeslib.as_array(self.api.llama_get_embeddings(self.context.ctx), shape=(outputs, self.hidden_size))
                  if embedding else None)
        layers = {layer: np.concatenate(kept) for layer, kept in self.captured.items() if kept}
        scored, features, row = [], [], 0
        for part in parts:
            n = len(part.tokens)
            real = index[row : row + n]  # the outputs of its rows (where they are outputs)
            scored.append(torch.from_numpy(logits[real[n - part.keep :]]) if part.keep else torch.empty(0, self.vocab_size))
            captured = {}
            for tap in part.taps:
                if tap == FINAL:
                    captured[tap] = torch.from_numpy(normed[real])
                elif tap == self.shared.num_layers:  # computed for the output rows only, which its rows all are
                    captured[tap] = torch.from_numpy(layers[tap][real])
                else:
                    captured[tap] = torch.from_numpy(layers[tap][row : row + n])
            features.append(captured)
            row += part.size
        return scored, features


def pieces(n: int, n_batch: int, deterministic: bool, lone: bool = False, widest: int = 3) -> list[int]:
    """The forward sizes that decode n tokens: up to `n_batch` each, or, deterministic, between 2
    and `widest` (`widest`s, then the remainder, or two pieces for a remainder of one: with
    widest 3, 4 -> 2 + 2, 7 -> 3 + 2 + 2; a lone token -> 2, its second row a padding row, or 1
    where `lone` says its forward takes the many-row path).

    >>> pieces(1, 512, True), pieces(4, 512, True), pieces(7, 512, True), pieces(7, 512, False)
    ([2], [2, 2], [3, 2, 2], [7])
    >>> pieces(1, 512, True, lone=True), pieces(5, 512, True, widest=63), pieces(64, 512, True, widest=63)
    ([1], [5], [62, 2])
    """
    if not deterministic:
        return [min(n_batch, n - begin) for begin in range(0, n, n_batch)]
    if n <= 1:
        return [1 if lone else 2] * n
    whole, rest = divmod(n, widest)
    if rest == 1:
        return [widest] * (whole - 1) + [widest - 1, 2]
    return [widest] * whole + [rest] * (rest > 0)


def cache_bytes_per_position(model, type_v: int) -> int:
    """Bytes one cached position takes in every layer of a llama.cpp model: its keys in float16,
    its values in `type_v` (a ggml type id of `CACHE_TYPES_V`: float16, or Q8_0 at 34 bytes a
    block of 32)."""
    import llama_cpp

    width = (llama_cpp.llama_model_n_layer(model) * llama_cpp.llama_model_n_head_kv(model)
             * (llama_cpp.llama_model_n_embd(model) // llama_cpp.llama_model_n_head(model)))  # values a position holds
    return int(width * 2 + (width * 2 if type_v == CACHE_TYPES_V["f16"] else width // 32 * 34))


def tree_leaves(parents: Sequence[int]) -> list[int]:
    """The nodes without children, in order.

    >>> tree_leaves([-1, 0, 1, 0, 3, -1])
    [2, 4, 5]
    """
    inner = set(parents)
    return [node for node in range(len(parents)) if node not in inner]


def path_sequences(parents: Sequence[int], leaves: Sequence[int], ids: Sequence[int]) -> list[tuple[int, ...]]:
    """Each node's sequence ids: ids[i] for every node on the root path of leaves[i].

    >>> path_sequences([-1, 0, 1, 0, 3, -1], [2, 4, 5], [7, 8, 9])
    [(7, 8), (7,), (7,), (8,), (8,), (9,)]
    """
    seqs: list[list[int]] = [[] for _ in parents]
    for leaf, seq in zip(leaves, ids):
        node = leaf
        while node != ROOT:
            seqs[node].append(seq)
            node = parents[node]
    return [tuple(node) for node in seqs]


def widest_piece(matrices: set[str], cache_type_v: str = "f16", n_batch: int = 512) -> int:
    """The most rows a deterministic forward decodes where every matrix of the file is of a
    block type whose product computes each row alone (`ROWS_ALONE`): `FLASH_ROWS` on a float16
    value cache (64 rows and more take the tiled attention), n_batch on a Q8_0 one (its
    attention is the per-row kernel for any forward); else 3 (a K-quant's repacked kernel takes
    4 rows and more otherwise).

    >>> widest_piece({"Q4_1", "Q8_0"}), widest_piece({"Q4_1"}, "q8_0"), widest_piece({"Q4_K", "Q6_K"}, "q8_0")
    (63, 512, 3)
    """
    if not matrices <= ROWS_ALONE:
        return 3
    return n_batch if cache_type_v == "q8_0" else FLASH_ROWS


def _kept(keep: int, n: int, begin: int, size: int) -> int:
    """How many of the real rows of a piece of `size` rows from row `begin` of n lie among the
    last `keep` (the piece's own last ones, as `_Rows.keep` counts them).

    >>> _kept(3, 5, 0, 2), _kept(3, 5, 2, 3), _kept(1, 1, 0, 2)
    (0, 3, 1)
    """
    real = min(size, n - begin)
    return max(0, min(real, keep - (n - begin - real)))


def _starts(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(first token, forward size) of each piece `pieces` cut."""
    return [(sum(sizes[:i]), size) for i, size in enumerate(sizes)]


if __name__ == "__main__":
    print(cmake_args())
