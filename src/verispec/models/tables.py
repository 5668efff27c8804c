"""Tiny table language models with exact rational probabilities.

A `TableLM` looks its next-token distribution up from the last `order` tokens of the context
(the whole context while it is shorter). Probabilities are `Fraction`s, so the audit can
compute the exact autoregressive distribution of sequences; the logits handed to the engine
are their float64 logarithms (-inf for exact zeros).

The cache is the list of processed tokens: `extend` answers from it, `rollback` truncates it,
exactly as the protocol demands of a real KV cache. A scored tree (`extend_tree`) is held as
each node's own context until `keep_path` appends the kept path.

Slots (`SlotScoring`): `new_slot` is a table sharing the rows with a processed-token list of
its own, and `extend_slots` answers each slot from its own list, so the audit runs batched
steps on exact tables.

Feature channel: a table also has deterministic features, so trained-head proposers run on it
in the audit and the property tests. The feature of a position is a fixed float64 vector
[hidden_size] per (tap, context key): a function of the same last `order` tokens the row is,
drawn from a generator seeded by them. Embedding and output weight are one fixed matrix
[V, hidden_size] (tied, seeded by `feature_seed`).
"""

from __future__ import annotations

import copy
import math
import random
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from itertools import product

import torch

from verispec.models.base import FINAL, ROOT, SlotScoring, Tap, check_extend_tree, check_slots, check_taps
from verispec.models.scored_tree import PendingTree, ScoredTree

Row = tuple[Fraction, ...]


class TableLM(SlotScoring):
    """rows: context key (the last `order` tokens, or the whole shorter context) -> the exact
    next-token distribution. hidden_size, num_layers, feature_seed: the shape and seed of the
    table's deterministic features (`FeatureChannel`)."""

    def __init__(
        self,
        rows: Mapping[tuple[int, ...], Sequence[Fraction]],
        order: int,
        *,
        hidden_size: int = 4,
        num_layers: int = 2,
        feature_seed: int = 0,
    ) -> None:
        if order < 1:
            raise ValueError(f"order must be >= 1, got {order}")
        sizes = {len(row) for row in rows.values()}
        if len(sizes) != 1:
            raise ValueError(f"every row needs the same vocabulary size, got sizes {sorted(sizes)}")
        for key, row in rows.items():
            if any(x < 0 for x in row) or sum(row) != 1:
                raise ValueError(f"row {key} is not a probability distribution: {row}")
        self.rows: dict[tuple[int, ...], Row] = {k: tuple(Fraction(x) for x in r) for k, r in rows.items()}
        self.order = order
        self.vocab_size = sizes.pop()
        self._logits = {
            key: torch.tensor([math.log(x) if x > 0 else -math.inf for x in row], dtype=torch.float64)
            for key, row in self.rows.items()
        }
        self._processed: list[int] = []
        self._pending = PendingTree()  # the scored tree from extend_tree to keep_path
        self._tree_tokens: list[int] = []  # its tokens
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.feature_seed = feature_seed
        generator = torch.Generator().manual_seed(feature_seed)
        self._embeddings = torch.randn(self.vocab_size, hidden_size, generator=generator, dtype=torch.float64)
        self._feature_cache: dict[tuple[Tap, tuple[int, ...]], torch.Tensor] = {}

    def distribution(self, context: Sequence[int]) -> Row:
        """The exact next-token distribution after `context` (nonempty)."""
        key = tuple(context[-self.order:])
        if key not in self.rows:
            raise KeyError(f"table has no row for context suffix {key}")
        return self.rows[key]

    @property
    def length(self) -> int:
        return len(self._processed)

    def reset(self) -> None:
        self._processed = []
        self._pending.tree = None

    def prefill(self, ids: Sequence[int]) -> None:
        self._processed = list(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self._pending.refuse()
        start = len(self._processed)
        self._processed.extend(tokens)
        rows = self._rows_for(self._processed, start)
        return rows if keep is None else rows[-keep:]

    def rollback(self, length: int) -> None:
        if not 0 <= length <= len(self._processed):
            raise ValueError(f"cannot roll back to {length}; {len(self._processed)} tokens processed")
        self._pending.rolled_back(length)
        del self._processed[length:]

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        check_extend_tree(tokens, parents, self.vocab_size)
        self._pending.refuse()
        contexts: list[list[int]] = []
        for token, parent in zip(tokens, parents):
            contexts.append((self._processed if parent == ROOT else contexts[parent]) + [token])
        self._pending.tree = ScoredTree(len(self._processed), tuple(parents))
        self._tree_tokens = list(tokens)
        self._processed = self._processed + list(tokens)
        return torch.stack([self._logits[tuple(context[-self.order:])] for context in contexts])

    def keep_path(self, path: Sequence[int]) -> None:
        start, _, _ = self._pending.kept(path)
        self._processed[start:] = [self._tree_tokens[node] for node in path]

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self._rows_for(list(ids), 0)

    def new_slot(self, capacity: int = 256) -> TableLM:
        """A table with the same rows and features and an empty cache of its own."""
        slot = copy.copy(self)
        slot._processed = []
        slot._pending = PendingTree()
        slot._tree_tokens = []
        return slot

    def extend_slots(self, slots: Sequence[TableLM], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        check_slots(slots, tokens, TableLM)
        return [slot.extend(rows) for slot, rows in zip(slots, tokens)]

    def _rows_for(self, ids: list[int], start: int) -> torch.Tensor:
        return torch.stack([self._logits[tuple(ids[: t + 1][-self.order:])] for t in range(start, len(ids))])

    def record_features(self, taps: Sequence[Tap]) -> None:
        """A table computes any tap at any time; only the taps are checked."""
        check_taps(taps, self.num_layers)

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        if not 0 <= start <= end <= len(self._processed):
            raise ValueError(f"features of positions {start}..{end - 1} asked, {len(self._processed)} processed")
        return self._features_for(self._processed[:end], start, taps)

    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        return self._features_for(list(ids), 0, taps)

    def input_embeddings(self) -> torch.Tensor:
        return self._embeddings

    def output_embeddings(self) -> torch.Tensor:
        return self._embeddings

    def _features_for(self, ids: list[int], start: int, taps: Sequence[Tap]) -> torch.Tensor:
        """float64 [len(ids) - start, len(taps) * H] for positions start.. of `ids`."""
        taps = check_taps(taps, self.num_layers)
        rows = [
            torch.cat([self._feature(tap, tuple(ids[: t + 1][-self.order:])) for tap in taps])
            for t in range(start, len(ids))
        ]
        return torch.stack(rows) if rows else torch.empty(0, len(taps) * self.hidden_size, dtype=torch.float64)

    def _feature(self, tap: Tap, key: tuple[int, ...]) -> torch.Tensor:
        """The fixed vector [H] of (tap, key), seeded by their digits (no Python hash: stable)."""
        cached = self._feature_cache.get((tap, key))
        if cached is not None:
            return cached
        seed = self.feature_seed
        for digit in (0 if tap == FINAL else tap, len(key), *key):
            seed = (seed * 1_000_003 + digit + 1) % (1 << 61)
        vector = torch.randn(self.hidden_size, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        self._feature_cache[tap, key] = vector
        return vector


def bigram(rows: Sequence[Sequence[Fraction | float | str]]) -> TableLM:
    """A bigram table from its rows: rows[a] is the distribution after token a."""
    return TableLM({(a,): [Fraction(x) for x in row] for a, row in enumerate(rows)}, order=1)


def seed_pair() -> tuple[TableLM, TableLM]:
    """The seed lesson's 3x3 bigram target and draft."""
    target = bigram([["1/10", "3/10", "6/10"], ["6/10", "3/10", "1/10"], ["2/10", "7/10", "1/10"]])
    draft = bigram([["4/10", "4/10", "2/10"], ["2/10", "5/10", "3/10"], ["4/10", "4/10", "2/10"]])
    return target, draft


def random_row(vocab: int, rng: random.Random, denominator: int, zeros: bool) -> Row:
    """A random rational distribution with the given denominator; zeros allowed or not."""
    while True:
        cuts = sorted(rng.randint(0, denominator) for _ in range(vocab - 1))
        counts = [b - a for a, b in zip([0, *cuts], [*cuts, denominator])]
        if zeros or min(counts) > 0:
            return tuple(Fraction(c, denominator) for c in counts)


def random_table(
    vocab: int,
    order: int,
    seed: int,
    *,
    denominator: int = 12,
    zeros: bool = True,
    eos_token_id: int | None = None,
    row: Callable[[random.Random], Row] | None = None,
) -> TableLM:
    """A random table over contexts of length 1..order. With `eos_token_id`, every row gives EOS
    some positive probability, so sequences can end early."""
    rng = random.Random(seed)
    make = row or (lambda r: random_row(vocab, r, denominator, zeros))
    rows = {}
    for length in range(1, order + 1):
        for key in product(range(vocab), repeat=length):
            dist = make(rng)
            if eos_token_id is not None and dist[eos_token_id] == 0:
                dist = _with_eos(dist, eos_token_id)
            rows[key] = dist
    return TableLM(rows, order, feature_seed=seed)


def _with_eos(dist: Row, eos_token_id: int) -> Row:
    """Move a quarter of the largest entry's mass to EOS."""
    big = max(range(len(dist)), key=lambda i: dist[i])
    moved = dist[big] / 4
    return tuple(
        x - moved if i == big else moved if i == eos_token_id else x for i, x in enumerate(dist)
    )
