"""The `CausalLM` protocol: a causal language model with a cache that can roll back.

The engine, the reference decoder and the audit talk to models only through this protocol,
so the same engine is proved on tiny rational tables and runs unchanged on real models.

Cache contract: `length` is the number of tokens processed into the cache. `extend(tokens)`
processes `tokens` after them and returns the logits at each new position (row i is the
next-token distribution after `tokens[i]`). `rollback(length)` forgets every token after the
first `length`. After any sequence of extend/rollback calls the logits equal those of a fresh
full recomputation of the same prefix (`score`).

Feature channel (optional, `FeatureChannel`): a model that also implements it keeps, beside
its cache, the hidden states a trained head reads (EAGLE, Medusa) for every processed position,
from the same forward that computed the logits: no extra forward. `features(taps, start, end)`
reads them for processed positions, `rollback` forgets them with the cache, `prefill` records
the prompt's. Models without it keep working; head proposers refuse them.

Tree scoring (optional, `TreeScoring`): a model that implements it scores a token tree in one
forward (each node attends to the cached prefix and its own ancestors only) and then keeps the
accepted root path. The engine refuses a tree round on a model without it.

Slot scoring (optional, `SlotScoring`): a model that holds several caches at once (slots, one
per request of a batch) and scores every slot's new rows in one forward, each attending to its
own slot's prefix only. The batch scheduler (`verispec.batching`) needs it. With
`BatchedPrefill` too, the scheduler prefills the requests it admits together in one forward,
and requests with the same prompt compute it once.

`ForwardingLM` is the base of wrappers that pass a model's calls on and change a few.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, Protocol, TypeVar, runtime_checkable

import torch

from verispec.checks import is_int
from verispec.drafts import ROOT

S = TypeVar("S")  # a slot

FINAL: Literal["final"] = "final"
"""The tap of the final norm's output: the input of the output head, [H] per position."""

Tap = int | Literal["final"]
"""Where a feature is read: `FINAL`, or a decoder layer number 1..L (that layer's output, the
residual stream before the next layer; EAGLE-3 reads three of them: low, middle, high)."""


class CausalLM(Protocol):
    vocab_size: int

    @property
    def length(self) -> int:
        """Tokens processed into the cache."""
        ...

    def reset(self) -> None:
        """Forget every processed token (a new request)."""
        ...

    def prefill(self, ids: Sequence[int]) -> None:
        """Reset, then process `ids` (possibly empty) without returning logits."""
        ...

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        """Process `tokens` (n >= 1) after the cached prefix; logits[n, V], or only the last
        `keep` rows (a model may then skip computing the others)."""
        ...

    def rollback(self, length: int) -> None:
        """Keep only the first `length` processed tokens (0 <= length <= self.length)."""
        ...

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        """Stateless full recomputation: logits[len(ids), V]; the cache is not touched."""
        ...


class ForwardingLM:
    """A `CausalLM` that passes every call and `vocab_size` to `inner`: a wrapper (one that
    charges a clock, taps or records logits) subclasses it and overrides only what it changes.

    It forwards exactly the `CausalLM` members, never an optional protocol's, and has no
    `__getattr__`: an `isinstance` check of a runtime-checkable protocol asks only whether the
    methods exist, so a wrapper claims `TreeScoring`, `SlotScoring`, `FeatureChannel` or
    `BatchedPrefill` only by defining that protocol's methods itself, where it keeps them.
    """

    def __init__(self, inner: CausalLM) -> None:
        self.inner = inner

    @property
    def vocab_size(self) -> int:
        return self.inner.vocab_size

    @property
    def length(self) -> int:
        return self.inner.length

    def reset(self) -> None:
        self.inner.reset()

    def prefill(self, ids: Sequence[int]) -> None:
        self.inner.prefill(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        return self.inner.extend(tokens, keep)

    def rollback(self, length: int) -> None:
        self.inner.rollback(length)

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self.inner.score(ids)


@runtime_checkable
class FeatureChannel(Protocol):
    """The hidden states a head reads, kept for every processed position of the cache.

    The feature of position t comes from the forward that processed token t: it was computed
    from tokens 0..t, and it is what the row predicting token t + 1 was made of. A feature of
    several taps is their concatenation: [len(taps) * H], in the order of `taps`.

    >>> target.record_features([FINAL])               # before prefill: the prompt's are kept
    >>> target.prefill(prompt[:-1]); target.extend([prompt[-1]])
    >>> target.features([FINAL], 0, target.length)    # [len(prompt), H]

    FINAL is the output of the final norm (exactly what the output head multiplies), as EAGLE-1
    and Medusa read it; layer taps are decoder-layer outputs before any norm, as EAGLE-3 fuses.
    Rows of rejected drafts are computed by the same forward but forgotten by `rollback`.
    """

    hidden_size: int  # H
    num_layers: int  # L: decoder layers, so layer taps lie in 1..L

    def record_features(self, taps: Sequence[Tap]) -> None:
        """From the next prefill on, keep these taps' features for every processed position."""
        ...

    def features(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        """Features of processed positions start..end-1 (0 <= start <= end <= length):
        float [end - start, len(taps) * H]. Taps must have been recorded before the prefill."""
        ...

    def score_features(self, ids: Sequence[int], taps: Sequence[Tap]) -> torch.Tensor:
        """Stateless full recomputation: features [len(ids), len(taps) * H] of every position of
        `ids`; the cache is not touched (the reference decoder's path)."""
        ...

    def input_embeddings(self) -> torch.Tensor:
        """The token embedding matrix [V, H] (shared, not copied: heads read it frozen)."""
        ...

    def output_embeddings(self) -> torch.Tensor:
        """The output head's weight [V, H]: logits = FINAL feature @ weight.T."""
        ...


@runtime_checkable
class TreeScoring(Protocol):
    """One forward over a token tree, then the cache compacted to one root path.

    >>> logits = target.extend_tree([pending, a, b, c], parents=[-1, 0, 0, 1])  # [4, V]
    >>> target.keep_path([0, 1, 3])   # the cache now ends with pending, a, c

    Node i sits at position length + depth(i) - 1 (a root node, parent -1, right after the
    cached prefix) and sees the cached prefix and its ancestors; its logits row is the
    next-token distribution after that path, equal (up to the dtype's rounding) to what
    `extend` of the same path returns. Between `extend_tree` and `keep_path` the cache holds
    the whole tree (`length` counts every node); only `keep_path`, or `rollback` to at most
    the length before the tree, may come next. Features (`FeatureChannel`) follow the cache:
    after `keep_path` they are those of the kept path.
    """

    def extend_tree(self, tokens: Sequence[int], parents: Sequence[int]) -> torch.Tensor:
        """Process a tree of n >= 1 nodes after the cached prefix; logits [n, V]."""
        ...

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep, after the prefix cached before `extend_tree`, only the nodes of `path` (a root
        path, as `check_path` accepts), in order; rows of other nodes are forgotten."""
        ...


@runtime_checkable
class SlotScoring(Protocol):
    """Several requests' caches over one model's weights, scored together.

    >>> a, b = target.new_slot(), target.new_slot()     # each a CausalLM with its own cache
    >>> a.prefill(p[:-1]); b.prefill(r[:-1])
    >>> rows_a, rows_b = target.extend_slots([a, b], [[p[-1], x1, x2], [r[-1]]])  # [3, V], [1, V]
    >>> a.rollback(a.length - 2)                          # each slot rolls back on its own

    Ragged: slot i scores n_i >= 1 rows (its pending token and k_i >= 0 drafts) after its own
    cached prefix. Slot i's logits equal what `slots[i].extend(tokens[i])` returns (up to the
    dtype's rounding; bit for bit where the model says its rows are row-invariant), whatever
    the other slots hold: no row attends to another slot's positions. Each slot's cache and
    features advance as by `extend`.
    """

    def new_slot(self, capacity: int = 256) -> CausalLM:
        """A `CausalLM` sharing this model's weights, with a cache of its own (empty)."""
        ...

    def extend_slots(self, slots: Sequence[CausalLM], tokens: Sequence[Sequence[int]]) -> list[torch.Tensor]:
        """One forward over every slot's new rows; per slot its logits float [n_i, V]."""
        ...

    def reserve_slots(self, slots: int) -> None:
        """Hold room for `slots` slots besides this model's own before any is made (the
        `Scheduler` reserves its `max_slots` when it is built), where one cache holds every
        slot (the static runtime: so every later step has one shape; llama.cpp). A model whose
        slots each own a cache has nothing to hold: this default, which a model inherits by
        subclassing `SlotScoring`."""


@runtime_checkable
class BatchedPrefill(Protocol):
    """A `SlotScoring` model that prefills many slots at once (optional: the `Scheduler`
    prefills each slot on its own otherwise).

    >>> target.prefill_slots([a, b, c], [p[:-1], p[:-1], r[:-1]])   # p computed once, copied to b

    Each slot ends as its own `prefill(prompts[i])` leaves it (cache and recorded features; up
    to the dtype's rounding, bit for bit where the model says its rows are row-invariant), the
    distinct prompts in one forward (or a few of one shape) without the head, and a slot whose
    prompt and feature taps equal an earlier slot's copies that slot's cache and features
    instead of computing them again (`shared_prompts`).
    """

    def prefill_slots(self, slots: Sequence[CausalLM], prompts: Sequence[Sequence[int]]) -> None:
        ...


def shared_prompts(
    slots: Sequence[S], prompts: Sequence[Sequence[int]], taps: Callable[[S], tuple]
) -> tuple[list[tuple[S, list[int]]], list[tuple[S, S]]]:
    """Split a batched prefill: (slot, prompt) for the first slot of each distinct (prompt,
    taps), and (slot, source) for every later one, which copies its source's cache.

    >>> shared_prompts(["a", "b", "c"], [[1, 2], [3], [1, 2]], lambda slot: ())
    ([('a', [1, 2]), ('b', [3])], [('c', 'a')])
    """
    first: dict[tuple, S] = {}
    computed, copies = [], []
    for slot, prompt in zip(slots, prompts):
        key = (tuple(prompt), taps(slot))
        if key in first:
            copies.append((slot, first[key]))
        else:
            first[key] = slot
            computed.append((slot, list(prompt)))
    return computed, copies


def prefill_shared(
    slots: Sequence[S],
    prompts: Sequence[Sequence[int]],
    vocab_size: int,
    taps: Callable[[S], tuple],
    forward: Callable[[list[S], list[list[int]]], object],
    copy: Callable[[S, S], None],
) -> None:
    """`BatchedPrefill.prefill_slots` on a model's two primitives: every slot reset, the
    distinct non-empty prompts through `forward(slots, prompts)` (one forward, no head), each
    repeat through `copy(slot, source)` (its source's cache and features)."""
    for slot, ids in zip(slots, prompts):
        if len(ids):
            check_token_ids(ids, vocab_size)
        slot.reset()
    computed, copies = shared_prompts(slots, prompts, taps)
    computed = [(slot, ids) for slot, ids in computed if ids]
    if computed:
        forward([slot for slot, _ in computed], [ids for _, ids in computed])
    for slot, source in copies:
        copy(slot, source)


def check_slots(slots: Sequence[object], tokens: Sequence[Sequence[int]], slot_type: type) -> None:
    """Refuse what `SlotScoring.extend_slots` does not accept: unequal lengths, a slot given
    twice, a slot of another kind of model."""
    if len(slots) != len(tokens):
        raise ValueError(f"extend_slots got {len(slots)} slots but {len(tokens)} token lists")
    if len({id(slot) for slot in slots}) != len(slots):
        raise ValueError("extend_slots got the same slot twice; a slot scores one request's rows")
    for slot in slots:
        if not isinstance(slot, slot_type):
            raise ValueError(f"extend_slots takes slots made by this model's new_slot, got {type(slot).__name__}")


def check_extend_tree(tokens: Sequence[int], parents: Sequence[int], vocab_size: int) -> None:
    """Refuse what `TreeScoring.extend_tree` does not accept."""
    if not len(tokens):
        raise ValueError("extend_tree needs at least one node")
    if len(parents) != len(tokens):
        raise ValueError(f"extend_tree got {len(tokens)} tokens but {len(parents)} parents")
    for i, parent in enumerate(parents):
        if not ROOT <= parent < i:
            raise ValueError(f"tree node {i} has parent {parent}; a parent must be -1 or an earlier node")
    check_token_ids(tokens, vocab_size)


def check_path(path: Sequence[int], parents: Sequence[int]) -> None:
    """Refuse a `keep_path` argument that is not a root path of the tree with these parents."""
    previous = ROOT
    for node in path:
        if not 0 <= node < len(parents) or parents[node] != previous:
            raise ValueError(f"keep_path {list(path)} is not a root path of the scored tree (parents {list(parents)})")
        previous = node


def check_taps(taps: Sequence[Tap], num_layers: int) -> tuple[Tap, ...]:
    """Taps as a tuple, refused unless each is FINAL or a layer number in 1..num_layers, once."""
    taps = tuple(taps)
    if not taps:
        raise ValueError("a feature needs at least one tap: 'final' or a layer number")
    for tap in taps:
        if tap != FINAL and not is_int(tap, 1, num_layers):
            raise ValueError(f"feature tap {tap!r} is neither 'final' nor a layer number in 1..{num_layers}")
    if len(set(taps)) != len(taps):
        raise ValueError(f"feature taps repeat: {list(taps)}")
    return taps


def check_score_ids(ids: Sequence[int], vocab_size: int, method: str = "score") -> None:
    """Refuse what a stateless recomputation (`score`, `score_features`) cannot take."""
    if not len(ids):
        raise ValueError(f"{method} needs at least one token")
    check_token_ids(ids, vocab_size)


def check_token_ids(ids: Sequence[int], vocab_size: int) -> None:
    """Refuse ids outside [0, vocab_size). Models check before a forward: an embedding lookup
    failing half-way through the layers would leave the cache longer in some than in others."""
    low, high = min(ids), max(ids)
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"token id {bad} is outside the model's vocabulary [0, {vocab_size})")


def check_extend(tokens: Sequence[int], keep: int | None, vocab_size: int) -> None:
    """Refuse what `CausalLM.extend` does not accept: no tokens, keep outside [1, n], bad ids."""
    n = len(tokens)
    if n == 0:
        raise ValueError("extend needs at least one token")
    if keep is not None and not 1 <= keep <= n:
        raise ValueError(f"keep must lie in [1, {n}] for {n} tokens, got {keep}")
    check_token_ids(tokens, vocab_size)
