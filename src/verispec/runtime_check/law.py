"""The target's exact law of a continuation's tokens, computed by verispec, and the prompts
the sampled-law check uses.

A continuation (1 to `length` tokens, cut at EOS) is keyed by every token it emits
(`key`): the drafted tokens a round accepts, its repair or bonus token, and the rounds after,
so a wrong acceptance test, a wrong repair row at any position, a wrong bonus row and a wrong
row after a full acceptance all change the keyed law. An engine whose first round drafts k
tokens emits its bonus at token k + 1, so `length` >= k + 1 puts the bonus under test.

`exact_cells` partitions the continuations into at most `cells` cells, best first: starting
from the empty prefix, the most likely prefix not yet split is split by its next token (one
forward over prompt + prefix), each of its `BRANCH` most likely next tokens expected at least
`MIN_EXPECTED` times at the check's N becoming a child and the rest of the prefix's mass one
cell (prefix, OTHER) (without a cap, every next token expected that often is a child); a
child at `length` tokens or ending in EOS is a cell of its own. So the cells refine deep where
the mass is, and a prefix never split is one cell (prefix, OTHER) holding every continuation
of it. The cells partition the outcomes exactly, and the number of forwards is at most the
number of cells.

    >>> key([17, 4, 9], eos_ids={2}, depth=3)
    (17, 4, 9)
    >>> key([2, 5], eos_ids={2}, depth=3)
    (2,)
    >>> cell_of((17, 4, 9), {(17, 4, OTHER): 0.5, (17, OTHER): 0.25, (OTHER,): 0.25})
    (17, 4, -1)
"""

from __future__ import annotations

import functools
import heapq
import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence

import torch

from verispec.runtime_check.cases import SamplingCase, next_token_law
from verispec.statistics import MIN_EXPECTED

OTHER = -1
BRANCH = 4  # the most next tokens a split lists under a cap (the rest stay in its rest cell), so 24 cells reach 3 tokens deep

# Raw-text prompts whose next token is uncertain (no chat template: the spread is the point),
# each a statement and the start of its echo, so that a method drafting from the context
# (prompt lookup, n-grams) drafts there too: on the default model verispec's lookup drafts
# two tokens on every sample of these (and none after the bare openings, "My brother plays
# the"). The check keeps those it can test best under the target's own law (`spread_prompts`).
SPREAD_TEXTS = (
    "Coffee or tea? I prefer coffee. Tea or coffee? I prefer",
    "My favourite colour is blue. Her favourite colour is",
    "My brother plays the guitar. My sister plays the",
    "The name of my dog is Max. The name of my cat is",
    "I went to the market and bought some apples. Then I went to the market and bought some",
    "He opened the box and found a key. She opened the box and found a",
    "The weather today is sunny. The weather tomorrow is",
    "Her favourite animal was the cat. His favourite animal was the",
    "The best thing about summer is the sun. The best thing about winter is",
    "The word I think of first is home. The word she thinks of first is",
)

Score = Callable[[list[int]], torch.Tensor]  # ids -> logits[len(ids), V], a fresh full forward
REMEMBERED_ROWS = 512  # last rows `remembered` keeps (V floats each: 100 MB at V = 49,152)


def remembered(score: Score, rows: int = REMEMBERED_ROWS) -> Score:
    """`score` giving the last row only (logits[1, V]), each call's kept (the latest `rows`):
    the exact law, the dropped parameter's law, the power model and the N a TV needs read the
    same prefixes' rows, under every parameter (the logits do not depend on the parameter)."""
    last = functools.lru_cache(maxsize=rows)(lambda ids: score(list(ids))[-1:])
    return lambda ids: last(tuple(ids))


def key(tokens: Sequence[int], eos_ids: Collection[int], depth: int) -> tuple[int, ...]:
    """A continuation's cell key: its first `depth` tokens, fewer when EOS ended it sooner."""
    head = []
    for token in tokens[:depth]:
        head.append(int(token))
        if token in eos_ids:
            break
    return tuple(head)


Split = Callable[[tuple[int, ...], float, int], list[tuple[int, float]]]  # (prefix, mass, room) -> children


def exact_cells(
    score: Score, prompt: Sequence[int], case: SamplingCase, n: int, eos_ids: Collection[int], length: int,
    cells: int | None = None,
) -> dict[tuple[int, ...], float]:
    """cell -> exact probability (float64) under `case` of a continuation of `length` >= 1
    tokens, the cells partitioning every outcome, best first (module docstring); n: the
    samples the check will draw (a next token gets a cell when expected `MIN_EXPECTED` times);
    cells: the most cells (None: split every prefix likely enough)."""
    prompt = list(prompt)

    def split(prefix: tuple[int, ...], mass: float, room: int) -> list[tuple[int, float]]:
        row = next_token_law(score([*prompt, *prefix])[-1], case, [*prompt, *prefix], prefix)  # [V]
        likely = torch.nonzero(row * mass * n >= MIN_EXPECTED).flatten().tolist()
        ranked = sorted(likely, key=lambda t: (-float(row[t]), t))[: min(room, BRANCH) if cells else None]
        return [(t, mass * float(row[t])) for t in ranked]

    return best_first(split, 1.0, eos_ids, length, cells)


def sampled_cells(keys: Counter, eos_ids: Collection[int], length: int, cells: int | None = None) -> dict[tuple[int, ...], float]:
    """Cells chosen best first as `exact_cells` chooses them, from counts of sample keys
    instead of the exact law (an engine whose model verispec cannot load): a next token gets a
    cell when the samples hold it `MIN_EXPECTED` times; cell -> its count. Built from the two
    samples together, the cells do not depend on which sample a count came from."""

    def split(prefix: tuple[int, ...], mass: float, room: int) -> list[tuple[int, float]]:
        following: Counter = Counter()
        for key_, count in keys.items():
            if len(key_) > len(prefix) and key_[: len(prefix)] == prefix:
                following[key_[len(prefix)]] += count
        ranked = sorted((t for t, c in following.items() if c >= MIN_EXPECTED), key=lambda t: (-following[t], t))
        return [(t, float(following[t])) for t in ranked[: min(room, BRANCH) if cells else None]]

    return best_first(split, float(sum(keys.values())), eos_ids, length, cells)


def best_first(split: Split, total: float, eos_ids: Collection[int], length: int, cells: int | None) -> dict[tuple[int, ...], float]:
    """The partition of continuations of `length` tokens into at most `cells` cells, the most
    likely prefix split first by `split` (its children and their masses); cell -> mass."""
    cap = cells or math.inf
    out: dict[tuple[int, ...], float] = {}
    frontier: list[tuple[float, tuple[int, ...]]] = [(-total, ())]  # (-mass, prefix) not yet split
    count = 1  # cells so far: every one in `out` and every prefix on the frontier
    while frontier:
        negative, prefix = heapq.heappop(frontier)
        mass, room = -negative, cap - count  # splitting adds one cell per child (the prefix's turns into its rest)
        children = split(prefix, mass, int(min(room, 1 << 30))) if room >= 1 else []
        for token, child_mass in children:
            child = (*prefix, token)
            if len(child) == length or token in eos_ids:
                out[child] = child_mass
            else:
                heapq.heappush(frontier, (-child_mass, child))
        out[(*prefix, OTHER)] = max(0.0, mass - sum(m for _, m in children)) if children else mass
        count += len(children)
    return out


def most_likely(
    score: Score, prompt: Sequence[int], case: SamplingCase, eos_ids: Collection[int], length: int, forwards: int = 32,
) -> float:
    """An upper bound on the probability of the most likely continuation of `length` tokens
    under `case`: best first over prefixes, exact when the most likely prefix on the frontier
    is a whole continuation within `forwards` forwards, else that prefix's probability."""
    prompt = list(prompt)
    frontier: list[tuple[float, tuple[int, ...]]] = [(-1.0, ())]  # (-probability, prefix)
    for _ in range(forwards):
        negative, prefix = heapq.heappop(frontier)
        if len(prefix) == length or (prefix and (prefix[-1] == OTHER or prefix[-1] in eos_ids)):
            return -negative  # a whole continuation (or a bound on the unlisted ones), none on the frontier likelier
        row = next_token_law(score([*prompt, *prefix])[-1], case, [*prompt, *prefix], prefix)  # [V]
        top = torch.topk(row, min(8, row.numel()))
        for p, token in zip(top.values.tolist(), top.indices.tolist()):
            heapq.heappush(frontier, (negative * p, (*prefix, token)))
        if top.values.numel() < row.numel():  # every other token: no likelier than the last listed
            heapq.heappush(frontier, (negative * float(top.values[-1]), (*prefix, OTHER)))
    return -frontier[0][0]


def law_on(score: Score, prompt: Sequence[int], case: SamplingCase, keys: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], float]:
    """The exact probability under `case` of every cell of `keys` (a partition `exact_cells`
    built, under any case): a leaf (t1, ..., tj) is the product of its tokens' rows; a rest
    cell (prefix, OTHER) is the prefix's mass less that of its listed next tokens."""
    prompt = list(prompt)
    rows: dict[tuple[int, ...], torch.Tensor] = {}

    def row(prefix: tuple[int, ...]) -> torch.Tensor:  # [V]
        if prefix not in rows:
            rows[prefix] = next_token_law(score([*prompt, *prefix])[-1], case, [*prompt, *prefix], prefix)
        return rows[prefix]

    def mass(prefix: tuple[int, ...]) -> float:
        return math.prod(float(row(prefix[:i])[t]) for i, t in enumerate(prefix))

    listed: dict[tuple[int, ...], set[int]] = {}  # prefix -> the next tokens some cell names after it
    for cell in keys:
        for i in range(len(cell)):
            if cell[i] != OTHER:
                listed.setdefault(cell[:i], set()).add(cell[i])
    out = {}
    for cell in keys:
        if cell[-1] != OTHER:
            out[cell] = mass(cell)
            continue
        prefix = cell[:-1]
        named = sorted(listed.get(prefix, ()))
        out[cell] = mass(prefix) * max(0.0, 1.0 - float(row(prefix)[named].sum())) if named else mass(prefix)
    return out


def cell_of(sample_key: tuple[int, ...], cells: Collection[tuple[int, ...]]) -> tuple[int, ...]:
    """The cell a sample's key falls in: the key itself, else the rest cell of its longest
    prefix the cells split (a shorter leaf where the law ended at EOS and the engine went on)."""
    if (*sample_key, OTHER) in cells:  # a sample that ended where the cells go on (EOS unknown to them)
        return (*sample_key, OTHER)
    for j in range(len(sample_key), 0, -1):
        if sample_key[:j] in cells:
            return sample_key[:j]
        if (*sample_key[: j - 1], OTHER) in cells:
            return (*sample_key[: j - 1], OTHER)
    return (OTHER,)


def entropy(score: Score, prompt: Sequence[int]) -> float:
    """The target's next-token entropy after `prompt`, in nats (temperature 1)."""
    p = torch.softmax(score(list(prompt))[-1].double(), dim=-1)
    return float(-(p * torch.log(p.clamp_min(1e-300))).sum())


def spread_prompts(
    score: Score, encode: Callable[[str], list[int]], count: int, samples: int
) -> list[tuple[str, list[int], float]]:
    """The `count` of `SPREAD_TEXTS` whose first token the check can test best with `samples`
    samples each: the most mass on tokens expected at least `MIN_EXPECTED` times, times
    1 - the largest probability (spread, yet not so flat that every token pools into the rare
    cell). (text, ids, entropy in nats), best first."""
    ranked = []
    for text in SPREAD_TEXTS:
        ids = encode(text)
        p = torch.softmax(score(list(ids))[-1].double(), dim=-1)  # [V]
        testable = float(p[p * samples >= MIN_EXPECTED].sum())
        ranked.append((testable * (1 - float(p.max())), text, ids, entropy(score, ids)))
    ranked.sort(key=lambda item: -item[0])
    return [(text, ids, h) for _, text, ids, h in ranked[:count]]


def likely_tokens(score: Score, prompt: Sequence[int], count: int) -> list[int]:
    """The target's `count` most likely next tokens after `prompt`."""
    return torch.topk(score(list(prompt))[-1], count).indices.tolist()


def distance(a: dict[tuple[int, ...], float], b: dict[tuple[int, ...], float]) -> float:
    """Total variation between two laws on the same cells."""
    return 0.5 * sum(abs(a.get(cell, 0.0) - b.get(cell, 0.0)) for cell in a.keys() | b.keys())


def finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
