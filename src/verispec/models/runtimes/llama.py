"""`LlamaRuntime`: a lean Llama forward behind the `CausalLM` protocol.

A forward of M new tokens on top of `start` cached positions, per layer:

    h = rms_norm(x)                      x[M, H] the residual stream, in the model's dtype
    q, k, v = qkv(h)                     one fused projection -> [M, Hq + 2 Hkv, D]
    q, k = rope(q, k)                    both at once, from precomputed tables
    K, V = cache.write(k, v)             in place at start..start+M-1; views [Hkv, width, D]
    x = x + o(attention(q, K, V))        causal among the M rows; grouped-query heads
    x = x + down(silu(gate) * up)        gate and up from one fused projection

then only the last `keep` rows go through the final norm and the output head. Against
transformers' eager Llama: 121 prepacked projections instead of 211 matrix products, RoPE in
four kernels instead of rotate_half's slicing and concatenation, no mask or cache rebuilt
per forward (measured per one-token forward, float32: ~4,450 op calls against ~6,200).
`deterministic` selects the attention whose rows do not depend on M
(`verispec.models.attention`).

Projections are modules from `verispec.models.formats.linear.projection`, chosen by weight format,
so quantized layouts drop in without touching this file. The runtime is built from a
transformers `LlamaForCausalLM` (a checkpoint directory or a converted GGUF file), read once
into the layout the static runtime builds from too (`models.formats.llama_weights`) and packed here.
By default the transformers model is left as it was, so both can run (at the cost of a
second copy of the projections); `consume=True` releases each
layer's projection weights from it as soon as they are packed (`load_model` does this), so
the weights are never held twice, not even while packing; `checkpoint` reads the weights to
pack from the model's files instead of its tensors (`from_hf` says why). Otherwise the
embedding, the norms and the dense head are the model's own tensors, shared, not copied.

Feature channel (`FeatureChannel`): after `record_features(taps)`, every forward also keeps,
for all its rows, the residual stream after the tapped decoder layers (layer taps 1..L) and
the final norm's output (FINAL), in a `FeatureStore` that rolls back with the cache. They are
tensors the forward computes anyway (FINAL only widens the final norm from the kept rows to
all rows), so no extra forward runs.

Tree scoring (`TreeScoring`): `extend_tree` is the same forward with the nodes laid out
depth first (`ScoredTree.depth_first`: the first-child path in the slots a chain would use),
each rotated at its depth position length + depth - 1, and an attention mask that shows each
node the cached prefix, its ancestors and itself (`attention` says what the deterministic
mode then guarantees for tree rows); the logits come back in the caller's node order.
`keep_path` copies, in every layer and in the feature store, only the kept nodes not yet in
their slots (`ScoredTree.moves`; none for the first-child path), then moves `length`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from verispec.checks import is_int
from verispec.models.attention import InvariantAttention, RowAttention, SdpaAttention
from verispec.models.base import (
    FINAL,
    SlotScoring,
    Tap,
    check_extend,
    check_extend_tree,
    check_score_ids,
    check_slots,
    prefill_shared,
    check_taps,
    check_token_ids,
)
from verispec.models.features import FeatureStore
from verispec.models.runtimes.kv_cache import KVArena, KVCache
from verispec.models.formats.gguf_blocks import GGUFWeight
from verispec.models.formats.linear import DenseLinear, projection
from verispec.models.formats.llama_weights import LlamaShape, Projection, read_llama, refusal
from verispec.models.norm import rms_norm
from verispec.models.formats.quant import linear_for
from verispec.models.rope import RopeTables
from verispec.models.runtime import Runtime
from verispec.models.scored_tree import PendingTree, ScoredTree
from verispec.models.weight_format import QUANTIZED  # the weight formats built by `models.formats.quant`


@dataclass
class LlamaLayer:
    attn_norm: torch.Tensor  # [H]
    qkv: nn.Module  # [M, H] -> [M, (Hq + 2 Hkv) D]
    o: nn.Module  # [M, Hq D] -> [M, H]
    mlp_norm: torch.Tensor  # [H]
    gate_up: nn.Module  # [M, H] -> [M, 2 I]
    down: nn.Module  # [M, I] -> [M, H]


class LlamaRuntime(SlotScoring):
    """A Llama-architecture model with a preallocated, position-indexed KV cache.

    >>> lm = LlamaRuntime.from_hf(model)   # model: a transformers LlamaForCausalLM
    >>> lm.prefill(prompt[:-1])
    >>> logits = lm.extend([prompt[-1], *drafted], keep=None)   # float32 [1 + k, V]
    >>> lm.rollback(lm.length - 2)          # moves the cache's position; copies nothing
    """

    def __init__(
        self,
        shape: LlamaShape,
        embed: torch.Tensor,
        layers: list[LlamaLayer],
        norm: torch.Tensor,
        head: nn.Module,
        rope: RopeTables,
        deterministic: bool = False,
        head_linear: nn.Linear | None = None,
    ) -> None:
        self.shape = shape
        self.vocab_size = shape.vocab_size
        self.embed = embed  # [V, H]
        self.layers = layers
        self.norm = norm  # [H]
        self.head = head  # [M, H] -> [M, V]
        self.head_linear = head_linear  # the dense head (weight [V, H]), for pruned heads
        self.hidden_size, self.num_layers = shape.hidden, shape.layers
        self.rope = rope
        self.deterministic = deterministic
        self.dtype = embed.dtype
        kind = SdpaAttention
        if deterministic:
            kind = InvariantAttention if self.dtype == torch.bfloat16 else RowAttention
        self.attention = kind(shape.heads, shape.kv_heads, shape.head_dim)
        # Float projections hold the model's weights in its dtype: exact in float32 only.
        self.exact_weights = self.dtype == torch.float32
        self.cache = self.new_cache()
        self._arena: KVArena | None = None  # the reserved slots' caches (`reserve_slots`)
        self._features = FeatureStore(shape.hidden)
        self._pending = PendingTree()  # the scored tree from extend_tree to keep_path

    @classmethod
    def from_hf(
        cls,
        model: nn.Module,
        weight_format: str = "float",
        deterministic: bool = False,
        blocks: Mapping[str, GGUFWeight] | None = None,
        exact: bool = True,
        consume: bool = False,
        checkpoint: Callable[[str], torch.Tensor | None] | None = None,
        dtype: torch.dtype | None = None,
    ) -> LlamaRuntime:
        """Build from a transformers `LlamaForCausalLM` or `Qwen2ForCausalLM`, read in the one
        layout (`llama_weights.read_llama`) and packed here (its weights are copied, see module
        doc; Qwen2's q, k and v biases are the fused qkv projection's bias).

        weight_format "float": prepacked oneDNN projections (`models.formats.linear.projection`);
        "dense": `F.linear` on the same weights, slower, but transformers' own products, so a
        float32 runtime then returns transformers' logits bit for bit (the tests' reference);
        "q4" or "int8": projections from `models.formats.quant.linear_for`, on `blocks`
        (the GGUF file's own codes, `gguf_blocks.gguf_weights`) where given, else quantized on
        load; `exact` as there (False: q4's cheaper single plane, for drafts). The runtime's
        `exact_weights` then says whether every projection holds its float32 weight bit for bit.
        consume: release each decoder layer's projection weights from `model` once packed
        (they become None), so the peak memory is one copy of the weights; `model` can no
        longer run afterwards.
        checkpoint: reads a tensor by parameter name from `model`'s checkpoint files
        (`load.checkpoint_tensors`: a tensor of its own, whose file mapping goes when it does);
        where it has a weight in the parameter's dtype and shape, that is used instead of the
        parameter. transformers maps its safetensors files into memory once, and every page
        read while packing would stay resident beside the packed copy as long as any of the
        model's tensors lives.
        dtype: what the runtime computes in (default: the model's); each float weight is cast
        to it as it is packed (torch's rounding, as transformers' own cast on load).
        """
        reason = fast_runtime_refusal(model, dtype)
        if reason:
            raise ValueError(reason)
        read = read_llama(model, Runtime.FAST, dtype=dtype, checkpoint=checkpoint, blocks=blocks, consume=consume)
        dtype = read.embed.dtype

        def pack(weights: Projection) -> nn.Module:
            # Biases (Qwen2's q, k and v) ride on the fused projection: the forward never sees them.
            if weight_format in QUANTIZED:
                return linear_for(weights.stored(), weight_format, exact, bias=weights.bias())
            return projection(weights.weight(), weights.bias(), weight_format)

        layers = []
        with torch.no_grad():
            # The head first: packing it (and probing its shape, `linear.row_blocks`)
            # takes several times its weight for a moment, best spent before the layers exist.
            # Read apart from the embedding even where tied: a file's page is resident once read,
            # and the embedding's are read only as tokens are looked up.
            head = pack(read.head)
            # The dense head [V, H] (pruned heads read it): the embedding itself where tied.
            shape = read.shape
            head_bias = read.head.bias()
            head_linear = nn.Linear(shape.hidden, shape.vocab_size, bias=head_bias is not None, device="meta")
            if read.tied:
                head_weight = read.embed
            elif isinstance(head, DenseLinear) and head.weight.dtype == dtype:
                head_weight = head.weight  # q4's float32 route for a head it cannot hold: the same values
            else:
                head_weight = read.head.weight()
            head_linear.weight = nn.Parameter(head_weight, requires_grad=False)
            head_linear.bias = None if head_bias is None else nn.Parameter(head_bias, requires_grad=False)
            for layer in read.layers():
                layers.append(
                    LlamaLayer(
                        attn_norm=layer.attn_norm,
                        qkv=pack(layer.qkv),
                        o=pack(layer.o),
                        mlp_norm=layer.mlp_norm,
                        gate_up=pack(layer.gate_up),
                        down=pack(layer.down),
                    )
                )
            norm = read.norm()
        model.eval()
        rope = RopeTables(*read.rope, dtype)
        runtime = cls(shape, read.embed, layers, norm, head, rope, deterministic, head_linear)
        if weight_format in QUANTIZED:
            runtime.exact_weights = all(p.exact for p in runtime.projections())
        return runtime

    def projections(self) -> list[nn.Module]:
        """The output head and every layer's projections."""
        return [self.head, *(p for layer in self.layers for p in (layer.qkv, layer.o, layer.gate_up, layer.down))]

    def projection_kernels(self) -> dict[str, int]:
        """How many projections compute on each kernel path (each module's `kernel`, e.g.
        "oneDNN prepacked float32": 121), as `profile` reports them."""
        return dict(Counter(getattr(p, "kernel", type(p).__name__) for p in self.projections()))

    def truncated(self, layers: int, head: nn.Module | None = None) -> LlamaRuntime:
        """A runtime of the first `layers` layers, then the final norm and `head` (default: this
        model's head), sharing every weight, with a cache of its own (layer skipping)."""
        total = self.shape.layers
        if not is_int(layers, 1, total):
            raise ValueError(f"the draft needs 1 <= layers <= {total} (the target has {total} layers), got {layers!r}")
        shape = replace(self.shape, layers=layers)
        return LlamaRuntime(
            shape, self.embed, self.layers[:layers], self.norm, head or self.head, self.rope,
            self.deterministic, self.head_linear,
        )

    def new_cache(self, capacity: int = 256, arena: KVArena | None = None) -> KVCache:
        """A cache of `capacity` positions: a free row of `arena` where it has one that large."""
        s = self.shape
        attention = self.attention
        return KVCache(s.layers, s.kv_heads, s.head_dim, self.dtype, capacity, attention.value_ones,
                       attention.keys_by_column, arena)

    # --- CausalLM -------------------------------------------------------------------------

    @property
    def length(self) -> int:
        return self.cache.length

    def reset(self) -> None:
        self.cache.length = 0
        self._features.reset()
        self._pending.tree = None

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> None:
        self.reset()
        if len(ids):
            check_token_ids(ids, self.vocab_size)
            self._live_forward(ids, keep=0)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._pending.refuse()
        return self._live_forward(tokens, keep or len(tokens))

    @torch.inference_mode()
    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        check_extend_tree(tokens, parents, self.vocab_size)
        self._pending.refuse()
        tree = ScoredTree.depth_first(self.length, parents)
        logits = self._live_forward([tokens[node] for node in tree.nodes], len(tokens), tree)  # float32 [n, V]
        self._pending.tree = tree
        return logits

    @torch.inference_mode()
    def keep_path(self, path: Sequence[int]) -> None:
        start, sources, destinations = self._pending.kept(path)
        if sources:
            self.cache.move(torch.tensor(sources), torch.tensor(destinations))
        self._features.move(sources, destinations)
        self.rollback(start + len(path))

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self.cache.length:
            raise ValueError(f"cannot roll back to {length}; {self.cache.length} tokens processed")
        self._pending.rolled_back(length)
        self.cache.length = length
        self._features.truncate(length)

    @torch.inference_mode()
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size)
        return self._forward(self.new_cache(len(ids)), ids, keep=len(ids))[0]

    # --- FeatureChannel -------------------------------------------------------------------

    def record_features(self, taps: Sequence[Tap]) -> None:
        self._pending.refuse()
        for tap in check_taps(taps, self.num_layers):
            self._features.add(tap, self.length)

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        return self._features.read(taps, start, end)

    @torch.no_grad()  # not inference mode: a trainer may feed these rows to modules it trains
    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size, "score_features")
        self._features.check_recorded(taps)
        captured = self._forward(self.new_cache(len(ids)), ids, keep=0, taps=tuple(taps))[1]
        return torch.cat([captured[tap].float() for tap in taps], dim=-1)  # [T, len(taps) H]

    def input_embeddings(self) -> torch.Tensor:
        return self.embed

    def output_embeddings(self) -> torch.Tensor:
        return self.head_linear.weight

    # --- the forward ----------------------------------------------------------------------

    def _live_forward(self, tokens: Sequence[int], keep: int, tree: ScoredTree | None = None) -> torch.Tensor | None:
        """A forward on the live cache; the recorded taps' rows go to the feature store."""
        logits, captured = self._forward(self.cache, tokens, keep, self._features.taps, tree)
        if captured:
            self._features.append(captured)
        return logits

    def _forward(
        self,
        cache: KVCache,
        tokens: Sequence[int],
        keep: int,
        taps: tuple[Tap, ...] = (),
        tree: ScoredTree | None = None,
    ) -> tuple[torch.Tensor | None, dict[Tap, torch.Tensor]]:
        """Run `tokens` after `cache.length` cached positions and advance the cache; logits
        of the last `keep` rows (float32 [keep, V]; None when keep = 0) and the features of
        all M rows at `taps` ({tap: [M, H]} in the model's dtype). With `tree` the rows are
        its nodes in its slot order: depth positions and an ancestor mask instead of a
        chain's; the logits come out in the caller's node order (`ScoredTree.by_node`)."""
        segment = self._segment(cache, 0, len(tokens), tree)
        x, captured = self._layers([segment], tokens, taps)
        m = len(tokens)
        if FINAL in taps:
            captured[FINAL] = normed = rms_norm(x, self.norm, self.shape.eps)  # [M, H]
            normed = normed[m - keep :]
        elif keep:
            normed = rms_norm(x[m - keep :], self.norm, self.shape.eps)  # [keep, H]
        if keep == 0:
            return None, captured
        if tree is not None:
            normed = tree.by_node(normed)  # a tree's logits in the caller's node order (rows are slots)
        return self.head(normed).float(), captured  # [keep, V]

    def _segment(self, cache: KVCache, offset: int, m: int, tree: ScoredTree | None = None) -> Segment:
        """The rows offset..offset+m-1 of a forward, after `cache.length` positions of `cache`:
        where they sit, what they see, and room made for them."""
        start = cache.length
        end = start + m
        width = self.attention.width(end)
        cache.ensure(width)
        self.rope.ensure(end)
        # Row i sees positions 0..start+i (a tree node: the prefix and its ancestors); a single
        # row sees everything, so needs no mask.
        if tree is None:
            positions: slice | torch.Tensor = slice(start, end)
            mask = self.attention.mask(start, m, self.dtype)
        else:
            positions = tree.positions()  # [M]
            mask = self.attention.mask(start, m, self.dtype, tree.visible())
        return Segment(cache, offset, m, width, positions, mask)

    def _layers(
        self, segments: Sequence[Segment], tokens: Sequence[int], taps: tuple[Tap, ...]
    ) -> tuple[torch.Tensor, dict[Tap, torch.Tensor]]:
        """The decoder layers over the rows of every segment at once (N = all their rows,
        `tokens` [N] in segment order): projections and MLPs on all N rows in one product each,
        attention over each segment's own cache only, one call for each run of consecutive
        segments of equal length and rows (`runs`). Advances each segment's cache; returns
        the residual stream x[N, H] after the last layer and the layer taps' rows {tap: [N, H]}."""
        s = self.shape
        n = len(tokens)
        groups = runs(segments)
        in_arena = [arena_rows(group) for group in groups]
        ids = torch.tensor(tokens, dtype=torch.long)  # [N]
        x = nn.functional.embedding(ids, self.embed)  # [N, H]
        if len(segments) == 1:
            positions = segments[0].positions
        else:
            positions = torch.cat([as_index(seg.positions) for seg in segments])  # [N]
        cos, sin = self.rope.at(positions)  # [N, 1, D] each
        captured = {}
        q_end, k_end = s.heads, s.heads + s.kv_heads
        for index, layer in enumerate(self.layers):
            h = rms_norm(x, layer.attn_norm, s.eps)
            qkv = layer.qkv(h).view(n, k_end + s.kv_heads, s.head_dim)  # [N, Hq + 2 Hkv, D]
            qk = self.rope.rotate(qkv[:, :k_end], cos, sin)  # [N, Hq + Hkv, D]
            parts = []
            for group, arena_index in zip(groups, in_arena):
                first, b = group[0], len(group)
                rows = slice(first.offset, first.offset + b * first.m)
                if arena_index is not None:  # [B, Hkv, width, D] gathered from the arena
                    keys, values = first.cache.arena.write(
                        index, arena_index, first.cache.length, qk[rows, q_end:], qkv[rows, k_end:], first.width
                    )
                else:
                    written = [
                        seg.cache.write(index, seg.cache.length, qk[seg.rows, q_end:], qkv[seg.rows, k_end:], seg.width)
                        for seg in group
                    ]  # per segment: keys, values [Hkv, width, D]
                    keys, values = (torch.stack(kv) if b > 1 else kv[0][None] for kv in zip(*written))  # [B, Hkv, width, D]
                q = qk[rows, :q_end].view(b, first.m, s.heads, s.head_dim).transpose(1, 2)  # [B, Hq, m, D]
                parts.append(self.attention(q, keys, values, first.mask))  # [B m, Hq D]
            attended = parts[0] if len(parts) == 1 else torch.cat(parts)  # [N, Hq D]
            x = x + layer.o(attended)
            gate_up = layer.gate_up(rms_norm(x, layer.mlp_norm, s.eps))  # [N, 2 I]
            x = x + layer.down(nn.functional.silu(gate_up[:, : s.intermediate]) * gate_up[:, s.intermediate :])
            if index + 1 in taps:
                captured[index + 1] = x
        for seg in segments:
            seg.cache.length += seg.m
        return x, captured

    # --- SlotScoring ----------------------------------------------------------------------

    def reserve_slots(self, slots: int) -> None:
        """The next `slots` slots' caches (of the default capacity) in one arena (`KVArena`; a
        new one unless the current has as many rows free), so that slots of equal length write
        and read their caches in one call per layer."""
        if self._arena is not None and len(self._arena.free) >= slots:
            return
        s, attention = self.shape, self.attention
        self._arena = KVArena(slots, s.layers, s.kv_heads, s.head_dim, self.dtype, attention.width(256),
                              attention.value_ones, attention.keys_by_column)

    def new_slot(self, capacity: int = 256) -> LlamaRuntime:
        """A runtime sharing every weight with this one, with a cache of its own preallocated
        for `capacity` positions (grown by doubling past it), for one request of a batch: a
        row of the reserved arena while it has one."""
        slot = self.truncated(self.shape.layers)
        slot.exact_weights = self.exact_weights
        slot.cache = slot.new_cache(self.attention.width(capacity), self._arena)
        return slot

    @torch.inference_mode()
    def extend_slots(self, slots: Sequence[LlamaRuntime], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """One forward over every slot's new rows (slot i gets tokens[i], n_i >= 1, after its
        own cached prefix, attending to that prefix only); per slot its logits float32 [n_i, V],
        as its own `extend(tokens[i])` would return them (bit for bit with deterministic
        scoring: each projection's rows and each slot's attention rows do not depend on the
        others). Each slot's cache and features advance as by `extend`."""
        self._check_slots(slots, tokens)
        for slot, rows in zip(slots, tokens):
            check_extend(rows, None, self.vocab_size)
            slot._pending.refuse()
        if len(slots) == 1:
            return [slots[0].extend(tokens[0])]
        return self._slots_forward(slots, tokens, logits=True)

    @torch.inference_mode()
    def prefill_slots(self, slots: Sequence[LlamaRuntime], prompts: Sequence[Sequence[int]]) -> None:
        """Every slot as its own `prefill(prompts[i])` leaves it: the distinct prompts in one
        forward without the head, a repeated one copied from its first slot (`BatchedPrefill`)."""
        self._check_slots(slots, prompts)

        def copy(slot: LlamaRuntime, source: LlamaRuntime) -> None:
            slot.cache.copy_prefix(source.cache, source.length)
            slot._features.copy_from(source._features)

        prefill_shared(slots, prompts, self.vocab_size, lambda slot: slot._features.taps,
                       lambda chosen, ids: self._slots_forward(chosen, ids, logits=False), copy)

    def _check_slots(self, slots: Sequence[LlamaRuntime], tokens: Sequence[Sequence[int]]) -> None:
        check_slots(slots, tokens, LlamaRuntime)
        for slot in slots:
            if slot.embed is not self.embed or len(slot.layers) != len(self.layers):
                raise ValueError("extend_slots takes slots made by this model's new_slot")

    def _slots_forward(
        self, slots: Sequence[LlamaRuntime], tokens: Sequence[Sequence[int]], logits: bool
    ) -> list[torch.Tensor] | None:
        """One forward over every slot's rows on its own cache; per slot its logits float32
        [n_i, V] (None without `logits`: no head), each slot's recorded features appended.
        The slots' rows go in order of length and row count, so that slots of equal length
        and rows sit together and attend in one call (`_layers`); each row's projections do
        not depend on where it sits."""
        order = sorted(range(len(slots)), key=lambda i: (slots[i].cache.length, len(tokens[i])))
        segments, offset, flat = [None] * len(slots), 0, []
        for i in order:
            segments[i] = self._segment(slots[i].cache, offset, len(tokens[i]))
            offset += len(tokens[i])
            flat.extend(tokens[i])
        taps = tuple(dict.fromkeys(tap for slot in slots for tap in slot._features.taps))
        x, captured = self._layers([segments[i] for i in order], flat, tuple(tap for tap in taps if tap != FINAL))
        if logits or FINAL in taps:
            normed = rms_norm(x, self.norm, self.shape.eps)  # [N, H]
            if FINAL in taps:
                captured[FINAL] = normed
        scored = self.head(normed).float() if logits else None  # [N, V]
        for slot, seg in zip(slots, segments):
            if slot._features.taps:
                slot._features.append({tap: captured[tap][seg.rows] for tap in slot._features.taps})
        if scored is None:
            return None
        return [scored[seg.rows] for seg in segments]

    def kv_bytes_per_token(self) -> int:
        """Cache bytes one position takes in every layer (keys and values, with the ones
        column of the invariant attention's values)."""
        s = self.shape
        width = s.head_dim + int(self.attention.value_ones)
        return s.layers * s.kv_heads * (s.head_dim + width) * self.dtype.itemsize


def runs(segments: Sequence[Segment]) -> list[list[Segment]]:
    """The segments in runs of consecutive chain segments of equal length and rows (each run
    attends in one call; a tree's segment is a run of its own)."""
    groups: list[list[Segment]] = []
    for seg in segments:
        last = groups[-1][-1] if groups else None
        if last is not None and seg.joins(last):
            groups[-1].append(seg)
        else:
            groups.append([seg])
    return groups


def arena_rows(group: list[Segment]) -> torch.Tensor | None:
    """The rows of a run of several segments whose caches are all in one arena (LongTensor
    [B]); None otherwise."""
    arena = group[0].cache.arena
    if len(group) == 1 or arena is None or any(seg.cache.arena is not arena for seg in group):
        return None
    return torch.tensor([seg.cache.row for seg in group])


def as_index(positions: slice | torch.Tensor) -> torch.Tensor:
    """A segment's positions as a LongTensor [m]."""
    return torch.arange(positions.start, positions.stop) if isinstance(positions, slice) else positions


@dataclass
class Segment:
    """One slot's rows in a forward over several: rows offset..offset+m-1 of the batch, their
    rotary positions, their attention mask, and how many cached positions they read."""

    cache: KVCache
    offset: int
    m: int
    width: int
    positions: slice | torch.Tensor
    mask: object

    @property
    def rows(self) -> slice:
        return slice(self.offset, self.offset + self.m)

    def joins(self, previous: Segment) -> bool:
        """Whether these rows attend in one call with `previous`'s, right before them: both a
        chain's rows, as many, after as many cached positions (so the same mask and width)."""
        return (
            isinstance(self.positions, slice) and isinstance(previous.positions, slice)
            and self.m == previous.m and self.cache.length == previous.cache.length
            and previous.offset + previous.m == self.offset
        )


def fast_runtime_refusal(model: nn.Module, dtype: torch.dtype | None = None) -> str | None:
    """Why the fast runtime cannot run this transformers model in `dtype` (default: the
    model's own) (None: it can)."""
    weight = model.get_output_embeddings().weight
    return config_refusal(model.config, dtype or weight.dtype, weight.device)


def config_refusal(config, dtype: torch.dtype, device: torch.device | str = "cpu") -> str | None:
    """Why the fast runtime cannot run a model of this transformers config in `dtype` on
    `device` (None: it can); read from the config alone, before any weight is loaded."""
    reason = refusal(config, Runtime.FAST)
    if reason:
        return reason
    if torch.device(device).type != "cpu":
        return f"the fast runtime runs on the CPU and this model is on {device}; use runtime 'hf'"
    if dtype not in (torch.float32, torch.bfloat16):
        return f"the fast runtime computes in float32 or bfloat16, not {str(dtype).removeprefix('torch.')}; use runtime 'hf'"
    return None
