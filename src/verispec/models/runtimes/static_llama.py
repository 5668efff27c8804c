"""`StaticLlama`: the Llama/Qwen2 forward in fixed shapes over a static KV cache, for GPUs.

The fast runtime (`models.runtimes.llama`) is built for a CPU, where a forward costs what its rows cost;
on a GPU a forward of 65 rows costs about what one row costs, and what sets the pace is the
host launching kernels one at a time. This runtime is built for that:

- one preallocated cache for every slot (`SlotCache`: per layer [slots, kv heads, width, D]):
  a step writes its rows by (slot, position); `rollback` moves a slot's length; nothing is
  copied or reallocated in a step;
- every step's forward has one of a few fixed shapes: each slot's rows padded to a row bucket
  R, the slots padded to a batch bucket B (the first B slots of the cache), so the forward is
  tokens [B, R] -> logits [B, R, V], with ONE attention call per layer over all B slots (each
  row masked to its own slot's positions 0..its position), no per-slot loop inside it, reading
  the narrowest width bucket W (256, 512, 1024, ...) that holds the B slots' positions
  (`width_bucket`), not the whole allocated width;
- on CUDA each shape's forward is captured once as a CUDA graph and replayed after
  (`cuda_graphs.ShapeGraphs`); on the CPU the same code runs eagerly (graphs off), so the
  tests run it;
- a step never waits for the device: its inputs go in one packed copy from pinned memory
  (`transfers.to_device`, non-blocking), and its logits stay on the device for the engine,
  which reads back only what the rule needs, once a round (`engine.arrive`).

A forward, per layer (N = B R rows):

    h = rms_norm(x)                      x[N, H]
    q, k, v = qkv(h)                     one fused product (Qwen2's biases ride on it)
    q, k = rope(q, k)                    tables on the device, looked up by position [B, R]
    K[b, :, pos], V[b, :, pos] = k, v    written in place: slot b, its positions
    x = x + o(sdpa(q, K[:B], V[:B], mask))   q grouped by kv head: [B, Hkv, G R, D]
    x = x + down(silu(gate) * up)

Padding rows: a slot's rows past its real ones, and every row of a slot with nothing to score,
sit at that slot's next positions (length + j) with token 0. They write keys and values past the
slot's length, which no real row sees (row j sees positions 0..length + j) and a later step
overwrites; so the cache must hold length + R positions for every slot in the forward
(`SlotCache.ensure`, before a step: growing drops the graphs). Masked positions get -inf, so
their weights are exact zeros: what a row reads past its position never changes its bits.

Deterministic scoring (the default): every step with logits has one shape, [slots, rows]
(all slots of the cache, the row bucket `rows`, 9 by default: auto's k_max + 1; longer inputs
run as several such forwards in a row), and every prompt (`prefill`, `prefill_slots`) the shape
[slots, prefill_rows] (64 by default), so every kernel is chosen for the same shape in every
step, and a row's bits depend only on its own token, position and the cached positions it sees,
never on how many rows or slots came with it, nor on the width its step reads (masked positions
are exact zeros in any width). Greedy speculative output then equals plain greedy output bit for
bit, for one request and for each request of a batch on the same runtime (plain and speculative
runs prefill alike). The cost: a plain step computes `rows` rows for every slot (v(rows) of a
one-row step), and a prompt goes in `prefill_rows` tokens a forward. The batch stays all slots:
a product's row bits change with how many rows it multiplies (measured on the CPU: float32
[n, 576] x [576, 1536] rows differ between n = 9 and 18), so a batch bucket from the slots in use
would make a row depend on the others. `deterministic=False` takes the smallest row bucket
(1, 2, 4, ..., 128) and batch bucket (a power of two) that hold the step: cheaper plain steps,
but a row's bits then depend on its step's shape, so greedy speculative output may part from
plain decoding at near ties.

The cache holds `slots` slots (the runtime itself is slot 0; `new_slot` takes the others and
grows the cache when all are taken, which in deterministic mode changes the shape of every
later forward: give `slots` at load for a batch, as `verispec serve` does).

`score` (the reference decoder's stateless full recomputation) runs on a scratch cache of the
same slots and at least the live width, eagerly.

Tree scoring (`TreeScoring`): `extend_tree` is a step of the same fixed shape in which one slot's
rows are the tree's nodes, laid out depth first (`ScoredTree.depth_first`: the first-child path
in the slots a chain would use), each written at slot length + row and rotated at its depth
position length + depth - 1. Every step carries an ancestry [B, R, TREE_SPAN] (which of the
positions after its slot's chain or tree start each row sees; a chain's is lower-triangular),
from which the forward builds its mask over the cache: a row sees its slot's positions before the tree and its ancestors' rows (and itself). A
tree of more rows than the bucket runs as several forwards of the same shape, as a long chain
does (a later forward's rows see their ancestors already in the cache); at most `TREE_SPAN`
nodes. `keep_path` copies, in every layer and in the feature
store, only the kept nodes not yet in their slots (none for the first-child path), then moves
the slot's length.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from verispec.models.base import (
    FINAL,
    Tap,
    check_extend,
    check_extend_tree,
    check_score_ids,
    check_slots,
    check_taps,
    check_token_ids,
    prefill_shared,
)
from verispec.models.runtimes.cuda_graphs import ShapeGraphs
from verispec.models.features import FeatureStore
from verispec.models.formats.llama_weights import LlamaShape, read_llama, refusal
from verispec.models.norm import rms_norm
from verispec.models.rope import RopeTables
from verispec.models.runtime import Runtime
from verispec.models.scored_tree import PendingTree, ScoredTree
from verispec.models.runtimes.slot_cache import SlotCache
from verispec.transfers import to_device

STATIC_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)  # without deterministic scoring: the smallest that holds a step
DEFAULT_ROWS = 9  # deterministic scoring's row bucket: k up to 8 (auto's k_max) in one forward
DEFAULT_PREFILL_ROWS = 64  # deterministic scoring's prompt shape: a prompt goes in 64 tokens a forward
DEFAULT_CONTEXT = 2048  # positions per slot allocated at load (grown when a request needs more)
TREE_SPAN = 128  # the most nodes of a token tree: the ancestry every step carries [B, R, TREE_SPAN]
WIDTH_STEP = 64  # the cache's width is a multiple of this (aligned rows for the attention kernels)
NARROWEST = 256  # attention's narrowest width bucket (then 512, 1024, ...: what the step's slots have cached)


@dataclass
class StaticLayer:
    attn_norm: torch.Tensor  # [H]
    qkv: torch.Tensor  # [(Hq + 2 Hkv) D, H]
    qkv_bias: torch.Tensor | None  # [(Hq + 2 Hkv) D] (Qwen2)
    o: torch.Tensor  # [H, Hq D]
    mlp_norm: torch.Tensor  # [H]
    gate_up: torch.Tensor  # [2 I, H]
    down: torch.Tensor  # [H, I]


def static_refusal(config, dtype: torch.dtype) -> str | None:
    """Why the static runtime cannot run a model of this transformers config in `dtype`
    (None: it can). It reads what the fast runtime reads (`llama_weights.refusal`), on any
    device, in float32, bfloat16 or float16."""
    reason = refusal(config, Runtime.STATIC)
    if reason:
        return reason
    if dtype not in STATIC_DTYPES:
        return f"the static runtime computes in float32, bfloat16 or float16, not {str(dtype).removeprefix('torch.')}; use runtime 'hf'"
    return None


def round_up(n: int, step: int) -> int:
    return -(-n // step) * step


def width_bucket(need: int, width: int) -> int:
    """The positions a step's attention reads: the narrowest of 256, 512, 1024, ... that holds
    `need` (the step's slots' longest length plus its rows), at most the cache's `width`.

    >>> width_bucket(100, 2048), width_bucket(300, 2048), width_bucket(300, 320)
    (256, 512, 320)
    """
    bucket = NARROWEST
    while bucket < need:
        bucket *= 2
    return min(bucket, width)


class StaticModel:
    """The weights, the slot cache, the graphs and the forward that every slot shares."""

    def __init__(
        self,
        shape: LlamaShape,
        embed: torch.Tensor,
        layers: list[StaticLayer],
        norm: torch.Tensor,
        head: torch.Tensor,
        rope: tuple[torch.Tensor, float],
        *,
        deterministic: bool,
        rows: int,
        prefill_rows: int,
        slots: int,
        context: int,
        graphs: bool | None,
        device: torch.device,
    ) -> None:
        self.shape, self.embed, self.layers, self.norm, self.head = shape, embed, layers, norm, head
        self.dtype, self.device = embed.dtype, device
        if graphs and self.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; this model is on {self.device}")
        self.use_graphs = self.device.type == "cuda" if graphs is None else graphs
        for name, value in (("rows", rows), ("prefill_rows", prefill_rows)):
            if not 1 <= value <= ROW_BUCKETS[-1]:
                raise ValueError(f"{name} must lie in 1..{ROW_BUCKETS[-1]}, got {value}")
        self.deterministic, self.rows, self.prefill_rows = deterministic, rows, prefill_rows
        self.inv_freq, self.scaling = rope
        self.cache = SlotCache(
            shape.layers, shape.kv_heads, shape.head_dim, self.dtype, self.device, slots, round_up(context, WIDTH_STEP)
        )
        self.graphs = ShapeGraphs()
        self.free = list(range(slots - 1, 0, -1))  # slot 0 is the runtime's own
        self._tables(self.cache.width)

    def _tables(self, width: int) -> None:
        """RoPE tables (cos, signed sin [width, D]) and column indices [width] on the device;
        the graphs read the old ones, so they go."""
        self.graphs.clear()
        tables = RopeTables(self.inv_freq, self.scaling, self.dtype, width)
        self.cos, self.sin = tables.cos.to(self.device), tables.sin.to(self.device)
        self.columns = torch.arange(tables.cos.shape[0], device=self.device)

    # --- slots ------------------------------------------------------------------------------

    def take_slot(self) -> int:
        if not self.free:
            old = self.cache.slots
            self._grow(old + 1, self.cache.width)
            self.free = list(range(self.cache.slots - 1, old - 1, -1))
        self.free.sort(reverse=True)  # the lowest free slot: the smallest batch bucket without deterministic scoring
        return self.free.pop()

    def release(self, index: int) -> None:
        self.cache.lengths[index] = 0
        self.free.append(index)

    def _grow(self, slots: int, width: int) -> None:
        if self.cache.ensure(slots, width):
            self.graphs.clear()
            if self.cos.shape[0] < self.cache.width:
                self._tables(self.cache.width)

    # --- the step ---------------------------------------------------------------------------

    def step(
        self, indices: Sequence[int], tokens: Sequence[Sequence[int]], taps: tuple[Tap, ...] = (),
        cache: SlotCache | None = None, logits: bool = True, tree: ScoredTree | None = None,
    ) -> tuple[list[torch.Tensor | None], list[dict[Tap, torch.Tensor]]]:
        """Process tokens[i] after slot indices[i]'s cached positions, in as many fixed-shape
        forwards as it takes; per slot its logits float32 [n_i, V] (None without `logits`) and
        its rows of every tap ({tap: [n_i, H]}). `cache`: another cache of the same slots
        (`score`'s scratch one; run eagerly). `tree`: the one slot's tokens are that tree's
        rows (in its row order), in as many forwards as a chain of as many rows."""
        live = cache is None
        cache = cache or self.cache
        fixed = self.rows if logits else self.prefill_rows  # deterministic: a prompt's shape, or a step's
        limit = fixed if self.deterministic else ROW_BUCKETS[-1]
        if tree is not None:
            if len(tree.parents) > TREE_SPAN:
                raise ValueError(
                    f"the static runtime scores token trees of at most {TREE_SPAN} nodes, and this one has "
                    f"{len(tree.parents)}; draft a smaller tree"
                )
            tree_positions, tree_visible = tree.positions(), tree.visible()  # [n], [n, n]
        done = [0] * len(indices)
        rows: list[list[torch.Tensor]] = [[] for _ in indices]
        tapped: list[dict[Tap, list[torch.Tensor]]] = [{tap: [] for tap in taps} for _ in indices]
        while any(d < len(t) for d, t in zip(done, tokens)):
            chunks = [list(t[d : d + limit]) for d, t in zip(done, tokens)]
            r = fixed if self.deterministic else next(b for b in ROW_BUCKETS if b >= max(map(len, chunks)))
            b = cache.slots if self.deterministic else min(cache.slots, 1 << max(indices).bit_length())
            need = max(cache.lengths[s] for s in range(b)) + r
            if need > cache.width:
                if live:
                    self._grow(cache.slots, need)
                else:
                    raise ValueError(f"the scratch cache holds {cache.width} positions, {need} needed")
            columns = self.columns[: width_bucket(need, cache.width)]  # [W]: the positions attention reads
            ids = torch.zeros(b, r, dtype=torch.long)
            for index, chunk in zip(indices, chunks):
                ids[index, : len(chunk)] = torch.tensor(chunk, dtype=torch.long)
            base = torch.tensor(cache.lengths[:b], dtype=torch.long)[:, None]  # [B, 1]
            written = base + torch.arange(r)  # [B, R]: each row's cache position
            positions = written.clone()  # [B, R]: its rotary position
            ancestry = (torch.arange(TREE_SPAN) <= torch.arange(r)[:, None]).expand(b, r, TREE_SPAN).clone()  # chains
            if tree is not None:
                index, first, m = indices[0], done[0], len(chunks[0])
                base[index] = tree.start
                positions[index, :m] = tree_positions[first : first + m]
                ancestry[index, :m] = False
                ancestry[index, :m, : len(tree.parents)] = tree_visible[first : first + m]
            inputs = to_device((ids, positions, written, base, ancestry), self.device)  # one copy, not waited for
            out = self._forward(cache, *inputs, columns, taps, live and self.use_graphs)
            for i, (index, chunk) in enumerate(zip(indices, chunks)):
                n = len(chunk)
                if n:
                    if logits:
                        rows[i].append(out[0][index, :n].to(torch.float32, copy=True))  # [n, V]
                    for tap, tensor in zip(taps, out[1:]):
                        tapped[i][tap].append(tensor.view(b, r, -1)[index, :n].clone())  # [n, H]
                    cache.lengths[index] += n
                    done[i] += n
        scored = [torch.cat(r) if logits else None for r in rows]
        features = [{tap: torch.cat(parts) for tap, parts in by_tap.items()} for by_tap in tapped]
        return scored, features

    def _forward(
        self, cache: SlotCache, tokens: torch.Tensor, positions: torch.Tensor, written: torch.Tensor,
        base: torch.Tensor, ancestry: torch.Tensor, columns: torch.Tensor, taps: tuple[Tap, ...], graphs: bool,
    ) -> tuple[torch.Tensor, ...]:
        def run(*inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return self._layers(cache, *inputs, taps)

        inputs = (tokens, positions, written, base, ancestry, columns)
        if graphs:
            return self.graphs(run, *inputs, key=taps)
        return run(*inputs)

    def _layers(
        self, cache: SlotCache, tokens: torch.Tensor, positions: torch.Tensor, written: torch.Tensor,
        base: torch.Tensor, ancestry: torch.Tensor, columns: torch.Tensor, taps: tuple[Tap, ...],
    ) -> tuple[torch.Tensor, ...]:
        """tokens [B, R], their rotary positions and the cache positions they are written at
        [B, R], and what each row sees: every position before base [B, 1] and position base + j
        where ancestry [B, R, TREE_SPAN] holds (a chain's row j: base + 0..j; a tree node: its
        ancestors and itself), among the positions 0..W-1 that attention reads (columns [W]),
        all on the device -> (logits [B, R, V] in the model's dtype, then each tap's rows
        [B R, H]); writes every row's keys and values into slots 0..B-1.
        Capturable: no host synchronisation, shapes from the inputs' shapes only."""
        s = self.shape
        b, r = tokens.shape
        n, group, width = b * r, s.heads // s.kv_heads, columns.shape[0]
        x = nn.functional.embedding(tokens.reshape(n), self.embed)  # [N, H]
        flat = positions.reshape(n)
        cos, sin = self.cos[flat][:, None], self.sin[flat][:, None]  # [N, 1, D]
        span = ancestry.shape[-1]
        offset = columns - base  # [B, W]: each position's place after base (< 0: before it)
        seen = ancestry.gather(2, offset.clamp(0, span - 1)[:, None, :].expand(b, r, width))  # [B, R, W]
        visible = (offset < 0)[:, None, :] | (seen & (offset < span)[:, None, :])  # [B, R, W]
        mask = torch.zeros(visible.shape, dtype=self.dtype, device=self.device).masked_fill_(~visible, float("-inf"))
        mask = mask[:, None, None].expand(b, 1, group, r, width).reshape(b, 1, group * r, width)  # [B, 1, G R, W]
        slot = torch.arange(b, device=self.device)[:, None].expand(b, r)  # [B, R]
        q_end, k_end = s.heads, s.heads + s.kv_heads
        captured: dict[Tap, torch.Tensor] = {}
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, s.eps)
            qkv = nn.functional.linear(h, layer.qkv, layer.qkv_bias).view(n, k_end + s.kv_heads, s.head_dim)
            qk = RopeTables.rotate(qkv[:, :k_end], cos, sin)  # [N, Hq + Hkv, D]
            keys, values = cache.keys[index], cache.values[index]  # [S, Hkv, W, D]
            keys[slot, :, written] = qk[:, q_end:].view(b, r, s.kv_heads, s.head_dim)
            values[slot, :, written] = qkv[:, k_end:].view(b, r, s.kv_heads, s.head_dim)
            q = qk[:, :q_end].reshape(b, r, s.kv_heads, group, s.head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(b, s.kv_heads, group * r, s.head_dim)  # [B, Hkv, G R, D]: a kv head's queries together
            attended = nn.functional.scaled_dot_product_attention(q, keys[:b, :, :width], values[:b, :, :width], attn_mask=mask)
            attended = attended.view(b, s.kv_heads, group, r, s.head_dim).permute(0, 3, 1, 2, 4).reshape(n, s.heads * s.head_dim)
            x = x + nn.functional.linear(attended, layer.o)
            gate_up = nn.functional.linear(rms_norm(x, layer.mlp_norm, s.eps), layer.gate_up)  # [N, 2 I]
            x = x + nn.functional.linear(nn.functional.silu(gate_up[:, : s.intermediate]) * gate_up[:, s.intermediate :], layer.down)
            if index + 1 in taps:
                captured[index + 1] = x
        normed = rms_norm(x, self.norm, s.eps)  # [N, H]
        captured[FINAL] = normed
        logits = nn.functional.linear(normed, self.head).view(b, r, -1)  # [B, R, V]
        return (logits, *(captured[tap] for tap in taps))


class StaticSlot:
    """One slot of a `StaticModel`: a `CausalLM` (and `FeatureChannel`, `TreeScoring`) with its
    own cache positions over the shared weights. Its slot returns to the model when it is dropped."""

    def __init__(self, model: StaticModel, index: int) -> None:
        self.model, self.index = model, index
        self.vocab_size = model.shape.vocab_size
        self.hidden_size, self.num_layers = model.shape.hidden, model.shape.layers
        self.deterministic = model.deterministic
        self.exact_weights = model.dtype == torch.float32
        self.device = model.device
        self._features = FeatureStore(model.shape.hidden)
        self._pending = PendingTree()  # the scored tree from extend_tree to keep_path

    # --- CausalLM ---------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self.model.cache.lengths[self.index]

    def reset(self) -> None:
        self.model.cache.lengths[self.index] = 0
        self._features.reset()
        self._pending.tree = None

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> None:
        self.reset()
        if len(ids):
            check_token_ids(ids, self.vocab_size)
            self._run([self], [ids], logits=False)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._pending.refuse()
        return self._run([self], [tokens])[0][len(tokens) - (keep or len(tokens)) :]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}; {self.length} tokens processed")
        self._pending.rolled_back(length)
        self.model.cache.lengths[self.index] = length
        self._features.truncate(length)

    # --- TreeScoring ------------------------------------------------------------------------

    @torch.inference_mode()
    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        check_extend_tree(tokens, parents, self.vocab_size)
        self._pending.refuse()
        tree = ScoredTree.depth_first(self.length, parents)
        logits = self._run([self], [[tokens[node] for node in tree.nodes]], tree=tree)[0]  # float32 [n, V], row order
        self._pending.tree = tree
        return tree.by_node(logits)

    @torch.inference_mode()
    def keep_path(self, path: Sequence[int]) -> None:
        start, sources, destinations = self._pending.kept(path)
        if sources:
            cache, device = self.model.cache, self.device
            source, destination = torch.tensor(sources, device=device), torch.tensor(destinations, device=device)
            for buffer in (*cache.keys, *cache.values):  # each [S, Hkv, W, D]
                buffer[self.index, :, destination] = buffer[self.index, :, source]
        self._features.move(sources, destinations)
        self.rollback(start + len(path))

    @torch.inference_mode()
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size)
        return self._score(ids, ())[0]

    # --- FeatureChannel ---------------------------------------------------------------------

    def record_features(self, taps: Sequence[Tap]) -> None:
        self._pending.refuse()
        for tap in check_taps(taps, self.num_layers):
            self._features.add(tap, self.length)

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        return self._features.read(taps, start, end)

    @torch.no_grad()
    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size, "score_features")
        self._features.check_recorded(taps)
        captured = self._score(ids, tuple(taps))[1]
        return torch.cat([captured[tap].float() for tap in taps], dim=-1)  # [T, len(taps) H]

    def input_embeddings(self) -> torch.Tensor:
        return self.model.embed

    def output_embeddings(self) -> torch.Tensor:
        return self.model.head

    # --- helpers ----------------------------------------------------------------------------

    def _run(
        self, slots: Sequence[StaticSlot], tokens: Sequence[Sequence[int]], logits: bool = True,
        tree: ScoredTree | None = None,
    ) -> list[torch.Tensor]:
        """One step of the model over these slots (`tree`: the one slot's rows are its nodes);
        each slot's recorded features appended."""
        taps = tuple(dict.fromkeys(tap for slot in slots for tap in slot._features.taps))
        scored, features = self.model.step([slot.index for slot in slots], tokens, taps, logits=logits, tree=tree)
        for slot, captured in zip(slots, features):
            if slot._features.taps:
                slot._features.append({tap: captured[tap] for tap in slot._features.taps})
        return scored

    def _score(self, ids: Sequence[int], taps: tuple[Tap, ...]) -> tuple[torch.Tensor, dict[Tap, torch.Tensor]]:
        model = self.model
        width = max(model.cache.width, round_up(len(ids) + model.rows + ROW_BUCKETS[-1], WIDTH_STEP))
        scratch = SlotCache(model.shape.layers, model.shape.kv_heads, model.shape.head_dim, model.dtype, model.device,
                            model.cache.slots, width)
        if model.cos.shape[0] < width:
            model._tables(width)
        scored, features = model.step([0], [ids], taps, cache=scratch)
        return scored[0], features[0]

    def kv_bytes_per_token(self) -> int:
        return self.model.cache.bytes_per_token()

    def weight_bytes(self) -> int:
        m = self.model
        tensors = [m.embed, m.norm, m.head, *(t for layer in m.layers for t in vars(layer).values() if t is not None)]
        return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


class StaticLlama(StaticSlot):
    """A Llama or Qwen2 model in fixed-shape forwards over a static cache (CUDA graphs on CUDA);
    the runtime is slot 0 of its cache, and `new_slot` gives the others (`SlotScoring`); every
    slot scores token trees (`TreeScoring`) and records features (`FeatureChannel`).

    >>> lm = StaticLlama.from_hf(model, dtype=torch.bfloat16, device="cuda")
    >>> lm.prefill(prompt[:-1]); lm.extend([prompt[-1], *drafted])   # float32 [1 + k, V]
    >>> a, b = lm.new_slot(), lm.new_slot()
    >>> rows_a, rows_b = lm.extend_slots([a, b], [[x, y], [z]])        # one forward: [2, V], [1, V]
    """

    def __init__(self, model: StaticModel) -> None:
        super().__init__(model, 0)

    @classmethod
    def from_hf(
        cls,
        model: nn.Module,
        *,
        dtype: torch.dtype | None = None,
        device: str | torch.device = "cpu",
        deterministic: bool = True,
        rows: int = DEFAULT_ROWS,
        prefill_rows: int = DEFAULT_PREFILL_ROWS,
        slots: int = 1,
        context: int = DEFAULT_CONTEXT,
        graphs: bool | None = None,
        consume: bool = False,
    ) -> StaticLlama:
        """Build from a transformers `LlamaForCausalLM` or `Qwen2ForCausalLM` (on any device):
        q, k, v and gate, up fused, every weight cast to `dtype` (default: the model's) and
        put on `device`. slots: the cache's slots (the runtime's own and `slots - 1` for
        `new_slot`); context: positions per slot allocated now (both grow when needed);
        rows: deterministic scoring's row bucket for steps with logits, prefill_rows: for prompts
        (`prefill`, `prefill_slots`); graphs: CUDA graphs (default: on CUDA).
        consume: release each decoder layer's weights from `model` once copied (they become
        None), so the host holds one layer's copy at a time; `model` cannot run afterwards."""
        dtype, device = dtype or model.get_output_embeddings().weight.dtype, torch.device(device)
        reason = static_refusal(model.config, dtype)
        if reason:
            raise ValueError(reason)
        read = read_llama(model, Runtime.STATIC, dtype=dtype, device=device, consume=consume)
        unsupported = [name for name in read.biased if name != "qkv"]
        if unsupported:
            raise ValueError(
                f"the static runtime adds a bias to q, k and v only and this model's {', '.join(unsupported)} "
                "projections have one; use runtime 'hf'"
            )
        with torch.no_grad():
            head = read.embed if read.tied else read.head.weight()
            layers = [
                StaticLayer(
                    attn_norm=layer.attn_norm,
                    qkv=layer.qkv.weight(),
                    qkv_bias=layer.qkv.bias(),
                    o=layer.o.weight(),
                    mlp_norm=layer.mlp_norm,
                    gate_up=layer.gate_up.weight(),
                    down=layer.down.weight(),
                )
                for layer in read.layers()
            ]
            norm = read.norm()
        core = StaticModel(
            read.shape, read.embed, layers, norm, head, read.rope,
            deterministic=deterministic, rows=rows, prefill_rows=prefill_rows, slots=slots, context=context,
            graphs=graphs, device=device,
        )
        return cls(core)

    def variant(
        self, *, deterministic: bool | None = None, rows: int | None = None, prefill_rows: int | None = None,
        slots: int = 1, context: int = DEFAULT_CONTEXT, graphs: bool | None = None,
    ) -> StaticLlama:
        """A runtime over the same weights (shared, not copied) with a cache, graphs and
        settings of its own (default: this one's deterministic, rows and prefill_rows)."""
        m = self.model
        core = StaticModel(
            m.shape, m.embed, m.layers, m.norm, m.head, (m.inv_freq, m.scaling),
            deterministic=m.deterministic if deterministic is None else deterministic,
            rows=rows or m.rows, prefill_rows=prefill_rows or m.prefill_rows, slots=slots, context=context,
            graphs=graphs, device=m.device,
        )
        return StaticLlama(core)

    # --- SlotScoring ------------------------------------------------------------------------

    def reserve_slots(self, slots: int) -> None:
        """Hold `slots` slots for `new_slot` besides the runtime's own, allocated now: the
        `Scheduler` reserves its `max_slots` when it is built, so that with deterministic
        scoring every later step has the same shape, the one a request decoded alone on this
        runtime has too."""
        model = self.model
        if slots + 1 > model.cache.slots:
            old = model.cache.slots
            model._grow(slots + 1, model.cache.width)
            model.free += range(old, model.cache.slots)

    def new_slot(self, capacity: int = 256) -> StaticSlot:
        """A slot of this model's cache (with room for `capacity` positions), returned to the
        model when the slot is dropped."""
        model = self.model
        slot = StaticSlot(model, model.take_slot())
        model._grow(model.cache.slots, round_up(capacity, WIDTH_STEP))
        weakref.finalize(slot, model.release, slot.index)
        return slot

    @torch.inference_mode()
    def extend_slots(self, slots: Sequence[StaticSlot], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """One forward (or a few of the same shape, for rows beyond the bucket) over every
        slot's new rows; per slot its logits float32 [n_i, V], the bits `extend` gives it alone
        with deterministic scoring (the same shape either way)."""
        check_slots(slots, tokens, StaticSlot)
        for slot, rows in zip(slots, tokens):
            if slot.model is not self.model:
                raise ValueError("extend_slots takes slots made by this model's new_slot")
            check_extend(rows, None, self.vocab_size)
            slot._pending.refuse()
        return self._run(slots, tokens)

    @torch.inference_mode()
    def prefill_slots(self, slots: Sequence[StaticSlot], prompts: Sequence[Sequence[int]]) -> None:
        """Every slot as its own `prefill(prompts[i])` leaves it: the distinct prompts in steps of
        the one shape without the head, a repeated one copied from its first slot
        (`BatchedPrefill`)."""
        check_slots(slots, prompts, StaticSlot)
        if any(slot.model is not self.model for slot in slots):
            raise ValueError("prefill_slots takes slots made by this model's new_slot")

        def copy(slot: StaticSlot, source: StaticSlot) -> None:
            self.model.cache.copy_slot(source.index, slot.index)
            slot._features.copy_from(source._features)

        prefill_shared(slots, prompts, self.vocab_size, lambda slot: slot._features.taps,
                       lambda chosen, ids: self._run(chosen, ids, logits=False), copy)
