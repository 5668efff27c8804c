"""`HFCausalLM`: a Hugging Face causal LM behind the `CausalLM` protocol.

The cache is a transformers `DynamicCache` whose layers are all full attention, so any prefix
of it is exactly the cache of that prefix: `rollback` crops it and the next `extend` continues
from there. Sliding-window and recurrent layers keep only a suffix or a running state and
cannot go back to an arbitrary length, so such models are refused when the adapter is built.

Each layer keeps its keys and values in a buffer with room to spare (`BufferedLayer`):
appending writes in place and cropping only moves the end. transformers' own layer
concatenates, copying the whole cache on every forward, a tenth of a forward or more over a
long context (docs/results/implementation-choices.md).

Cost: only the rows the caller keeps go through the output head (`logits_to_keep`); with a
49k vocabulary and a small model that head is a large share of a forward. `prefill` keeps one
row and drops it. Returned logits are float32 [n, V] whatever the model's dtype; the engine
builds float64 p and q from them.

The wrapped model stays reachable as `.model` and the live cache as `.cache`, for proposers
that run part of the same network (layer skipping).

Feature channel (`FeatureChannel`): `record_features(taps)` puts forward hooks on the chosen
decoder layers and on the final norm; every forward of the adapter then copies those outputs
for all its rows into a `FeatureStore` that rolls back with the cache. The hooks read tensors
the forward computes anyway (no extra forward); they ignore forwards of other adapters that
share the same modules (a layer-skip draft).

Tree scoring (`TreeScoring`): `extend_tree` runs the nodes in one forward with a 4D additive
mask [1, 1, n, length + n] in the model's dtype (0 where a node sees a slot: the cached prefix,
its ancestors and itself; the dtype's minimum elsewhere, as transformers builds its own float
masks) and position_ids length + depth - 1. transformers passes a 4D mask to the attention
unchanged (`masking_utils._preprocess_mask_arguments`), and both its eager attention (which
adds the mask) and its SDPA attention (which takes a float mask as a bias) read it the same
way; a boolean mask would be added as 0/1 by the eager one. `keep_path` copies the kept nodes
that are not already in their slots (`ScoredTree.moves`) inside every `BufferedLayer` and the
feature store, then crops: no other row is copied.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from verispec.models.base import (
    FINAL,
    SlotScoring,
    Tap,
    check_extend,
    check_extend_tree,
    check_slots,
    check_score_ids,
    check_taps,
    check_token_ids,
)
from verispec.models.features import FeatureStore
from verispec.models.scored_tree import PendingTree, ScoredTree


class HFCausalLM(SlotScoring):
    """A transformers causal LM (e.g. `LlamaForCausalLM`) with a rollback-able KV cache.

    >>> lm = HFCausalLM(model)       # model: any *ForCausalLM with full attention
    >>> lm.prefill(prompt[:-1])      # cache the prompt but its last token
    >>> logits = lm.extend([prompt[-1], *drafted])   # float32 [1 + k, V]
    >>> lm.rollback(lm.length - 2)   # forget the last two processed tokens
    """

    def __init__(self, model: PreTrainedModel) -> None:
        model.eval()
        self.model = model
        head = model.get_output_embeddings()
        # A quantized head (`models.formats.quant`) has no float weight, only its output size.
        self.vocab_size = int(head.out_features if hasattr(head, "out_features") else head.weight.shape[0])
        self.cache = self._new_cache()
        self._length = 0
        self.hidden_size = int(model.config.hidden_size)
        self.num_layers = int(model.config.num_hidden_layers)
        self._features = FeatureStore(self.hidden_size)
        self._captured: dict[Tap, torch.Tensor] | None = None  # set while a forward records
        self._pending = PendingTree()  # the scored tree from extend_tree to keep_path

    def _new_cache(self) -> DynamicCache:
        cache = DynamicCache(config=self.model.config)
        refused = sorted({type(layer).__name__ for layer in cache.layers if not _full_attention(layer)})
        if refused or not cache.layers:
            kinds = ", ".join(refused) or "no per-layer cache"
            raise ValueError(
                f"{type(self.model).__name__} keeps {kinds}, which cannot roll back to an arbitrary "
                "length; verispec needs a model whose attention layers are all full attention"
            )
        cache.layers = [BufferedLayer() for _ in cache.layers]
        return cache

    @property
    def device(self) -> torch.device:
        """Where the model is now (read each time, so `model.to(device)` after wrapping works);
        token ids are built there, and the logits come back there."""
        return self.model.device

    @property
    def length(self) -> int:
        return self._length

    def reset(self) -> None:
        self.cache.reset()
        self._features.reset()
        self._length = 0
        self._pending.tree = None

    @torch.inference_mode()
    def prefill(self, ids: Sequence[int]) -> None:
        self.reset()
        if len(ids):
            self._forward(ids, keep=1)

    @torch.inference_mode()
    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        check_extend(tokens, keep, self.vocab_size)
        self._pending.refuse()
        return self._forward(tokens, keep=keep or 0)[0].float()  # [keep or n, V]

    @torch.inference_mode()
    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        check_extend_tree(tokens, parents, self.vocab_size)
        self._pending.refuse()
        tree = ScoredTree(self._length, tuple(parents))
        dtype = self.model.get_input_embeddings().weight.dtype  # the hidden states', so the scores'
        blocked = ~tree.allowed().to(self.device)  # [n, length + n]
        mask = torch.zeros(blocked.shape, dtype=dtype, device=self.device).masked_fill_(blocked, torch.finfo(dtype).min)
        positions = tree.positions().to(self.device)[None]  # [1, n]
        logits = self._forward(tokens, keep=0, attention_mask=mask[None, None], position_ids=positions)
        self._pending.tree = tree
        return logits[0].float()  # [n, V]

    @torch.inference_mode()
    def keep_path(self, path: Sequence[int]) -> None:
        start, sources, destinations = self._pending.kept(path)
        if sources:
            source = torch.tensor(sources, device=self.device)
            destination = torch.tensor(destinations, device=self.device)
            for layer in self.cache.layers:
                layer.move(source, destination)
        self._features.move(sources, destinations)
        self.rollback(start + len(path))

    def rollback(self, length: int) -> None:
        if not 0 <= length <= self._length:
            raise ValueError(f"cannot roll back to {length}; {self._length} tokens processed")
        self._pending.rolled_back(length)
        if length == 0:
            self.reset()
        elif length < self._length:
            # transformers >= 5 crops by a negative count of tokens to remove, not to a length.
            self.cache.crop(length - self._length)
            self._features.truncate(length)
            self._length = length

    def new_slot(self, capacity: int = 256) -> HFCausalLM:
        """An adapter over the same transformers model with a cache of its own."""
        return HFCausalLM(self.model)

    def extend_slots(self, slots: Sequence[HFCausalLM], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """Each slot's rows by its own `extend`, one forward per slot: a batch runs correctly on
        the transformers adapter, but only the fast runtime scores it in one forward."""
        check_slots(slots, tokens, HFCausalLM)
        return [slot.extend(rows) for slot, rows in zip(slots, tokens)]

    @torch.inference_mode()
    def score(self, ids: Sequence[int]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        return self.model(input_ids=input_ids, use_cache=False).logits[0].float()  # [T, V]

    def record_features(self, taps: Sequence[Tap]) -> None:
        self._pending.refuse()
        for tap in check_taps(taps, self.num_layers):
            if tap not in self._features.taps:
                self._tapped_module(tap).register_forward_hook(self._hook(tap))
                self._features.add(tap, self._length)

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        return self._features.read(taps, start, end)

    @torch.no_grad()  # not inference mode: a trainer may feed these rows to modules it trains
    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        check_score_ids(ids, self.vocab_size, "score_features")
        self._features.check_recorded(taps)
        input_ids = torch.tensor([list(ids)], dtype=torch.long, device=self.device)
        self._captured = {}
        try:
            self.model(input_ids=input_ids, use_cache=False, logits_to_keep=1)
            return torch.cat([self._captured[tap][0].float() for tap in taps], dim=-1)  # [T, F]
        finally:
            self._captured = None

    def input_embeddings(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight

    def output_embeddings(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight

    def _tapped_module(self, tap: Tap) -> torch.nn.Module:
        base = getattr(self.model, self.model.base_model_prefix, None)
        layers, norm = getattr(base, "layers", None), getattr(base, "norm", None)
        if not isinstance(layers, torch.nn.ModuleList) or not isinstance(norm, torch.nn.Module):
            raise ValueError(
                f"{type(self.model).__name__} does not keep `{self.model.base_model_prefix}.layers` and "
                f"`{self.model.base_model_prefix}.norm`; the feature channel supports Llama-style models"
            )
        return norm if tap == FINAL else layers[tap - 1]

    def _hook(self, tap: Tap):
        def keep_output(module: torch.nn.Module, args: object, output: torch.Tensor | tuple) -> None:
            if self._captured is not None:
                self._captured[tap] = output[0] if isinstance(output, tuple) else output  # [1, n, H]

        return keep_output

    def _forward(self, tokens: Sequence[int], keep: int, **tree: torch.Tensor) -> torch.Tensor:
        """Run `tokens` through the model on top of the cache; logits[1, keep or n, V] in the
        model's dtype (keep = 0 keeps every row, as transformers reads `logits_to_keep`); the
        recorded taps' features of all n rows go to the feature store. `tree`: a token tree's
        attention_mask [1, 1, n, length + n] and position_ids [1, n]."""
        check_token_ids(tokens, self.vocab_size)
        input_ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)
        self._captured = {} if self._features.taps else None
        try:
            out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=keep, **tree)
            if self._captured is not None:
                self._features.append({tap: rows[0] for tap, rows in self._captured.items()})
        finally:
            self._captured = None
        self._length += len(tokens)
        return out.logits


def _full_attention(layer: object) -> bool:
    return type(layer) is DynamicLayer


class BufferedLayer(DynamicLayer):
    """A full-attention cache layer for one sequence that rolls back by moving its end.

    Keys and values live in buffers [1, heads, capacity, head_dim]; `keys` and `values` are
    views of their first `end` positions. `update` writes new positions in place (the buffer
    doubles when full, so copying is amortised O(1) per token); `crop` moves `end` back.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.end = 0
        self._key_buffer = self._value_buffer = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.end, self.end + key_states.shape[-2]
        if self._key_buffer is None or end > self._key_buffer.shape[-2]:
            self._key_buffer = _grown(self._key_buffer, start, key_states, 2 * end)
            self._value_buffer = _grown(self._value_buffer, start, value_states, 2 * end)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self._set_end(end)
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.end if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Forget the last `-tokens_to_remove` positions (transformers 5 passes a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes minus the number of positions to remove, got {tokens_to_remove}")
        if self.is_initialized and tokens_to_remove:
            self._set_end(self.end + tokens_to_remove)

    def move(self, sources: torch.Tensor, destinations: torch.Tensor) -> None:
        """Copy the keys and values of positions `sources` to positions `destinations`
        (LongTensors [m], held positions); nothing else is written."""
        for buffer in (self._key_buffer, self._value_buffer):
            buffer[..., destinations, :] = buffer[..., sources, :]

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        self.end = 0
        super().reset()

    def _set_end(self, end: int) -> None:
        self.end = end
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]


def _grown(buffer: torch.Tensor | None, used: int, new: torch.Tensor, capacity: int) -> torch.Tensor:
    """A buffer [1, heads, capacity, head_dim] holding the first `used` positions of `buffer`."""
    grown = new.new_empty(*new.shape[:-2], capacity, new.shape[-1])
    if used:
        grown[..., :used, :] = buffer[..., :used, :]
    return grown
