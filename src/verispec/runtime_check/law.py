"""The target's exact law of a continuation's first tokens, computed by verispec, and the
prompts the sampled-law check uses.

A continuation (1 to `length` tokens, cut at EOS) is keyed by its first `DEPTH` = 2 tokens:
(t1, t2), or (t1,) when t1 ended it. Two tokens, because speculation changes the law
through the tokens after the first one too: an accepted draft at t1 and the tokens that follow
a rejection (a stale cache) show only in the pair.

`exact_cells` gives every key's probability under a `SamplingCase`: p(t1) from one forward
over the prompt, p(t2 | t1) from a forward over prompt + t1 for every t1 likely enough to
matter (its expected count at the check's N reaches `MIN_EXPECTED`); the rest of the mass is
kept in the cells (t1, OTHER) and (OTHER,), so the cells partition the outcomes exactly.

    >>> key([17, 4, 9], eos_ids={2})
    (17, 4)
    >>> key([2], eos_ids={2})
    (2,)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence

import torch

from verispec.runtime_check.cases import SamplingCase, next_token_law
from verispec.runtime_check.statistics import MIN_EXPECTED

DEPTH = 2
OTHER = -1

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


def key(tokens: Sequence[int], eos_ids: Collection[int]) -> tuple[int, ...]:
    """A continuation's cell key: its first DEPTH tokens, fewer when EOS ended it sooner."""
    head = []
    for token in tokens[:DEPTH]:
        head.append(int(token))
        if token in eos_ids:
            break
    return tuple(head)


def exact_cells(
    score: Score, prompt: Sequence[int], case: SamplingCase, n: int, eos_ids: Collection[int], length: int,
    cells: int | None = None,
) -> dict[tuple[int, ...], float]:
    """key -> exact probability (float64) under `case`, the keys covering every outcome of a
    continuation of `length` >= 1 tokens; n: the samples the check will draw (which t1 get
    their own t2 cells). cells: the test keeps only its `cells` - 1 most likely cells
    (`statistics`), so a t1 too unlikely for any of its pairs to be among them gets one cell
    (t1, OTHER) without a forward of its own, pooled by the test (None: every t1 likely enough
    gets its pairs)."""
    prompt = list(prompt)
    first = next_token_law(score(prompt)[-1], case, prompt, [])  # [V]
    keys: list[tuple[int, ...]] = []
    best: list[float] = []  # the largest cell probabilities so far, at most cells - 1
    likely = torch.nonzero(first * n >= MIN_EXPECTED).flatten().tolist()
    for t1 in sorted(likely, key=lambda t: (-float(first[t]), t)):
        p1 = float(first[t1])
        if cells is not None and len(best) >= cells - 1 and p1 < best[-1]:
            keys.append((t1, OTHER))  # below every kept cell: the test pools it, its pairs unneeded
            continue
        if t1 in eos_ids or length < DEPTH:
            keys.append((t1,))
            best = sorted([*best, p1], reverse=True)[: (cells or 1) - 1]
            continue
        second = next_token_law(score([*prompt, t1])[-1], case, [*prompt, t1], [t1])  # [V]
        pairs = torch.nonzero(second * p1 * n >= MIN_EXPECTED / 4).flatten().tolist()
        keys += [(t1, t2) for t2 in pairs]
        keys.append((t1, OTHER))
        found = [p1 * float(second[t2]) for t2 in pairs] + [p1 * max(0.0, 1.0 - float(second[pairs].sum()))]
        best = sorted([*best, *found], reverse=True)[: (cells or 1) - 1]
    keys.append((OTHER,))
    return law_on(score, prompt, case, keys)


def law_on(score: Score, prompt: Sequence[int], case: SamplingCase, keys: Sequence[tuple[int, ...]]) -> dict[tuple[int, ...], float]:
    """The exact probability under `case` of every cell of `keys` (as `exact_cells` builds
    them: (t1,), (t1, t2), (t1, OTHER) after a t1's pairs, and (OTHER,))."""
    prompt = list(prompt)
    first = next_token_law(score(prompt)[-1], case, prompt, [])  # [V]
    out: dict[tuple[int, ...], float] = {}
    listed_first = {cell[0] for cell in keys if cell[0] != OTHER}
    seconds: dict[int, torch.Tensor] = {}
    for cell in keys:
        if cell == (OTHER,):
            out[cell] = max(0.0, 1.0 - sum(float(first[t]) for t in listed_first))
            continue
        t1 = cell[0]
        p1 = float(first[t1])
        if len(cell) == 1:
            out[cell] = p1
            continue
        listed = [c[1] for c in keys if len(c) == 2 and c[0] == t1 and c[1] != OTHER]
        if not listed:  # (t1, OTHER) alone: every continuation after t1
            out[cell] = p1
            continue
        if t1 not in seconds:
            seconds[t1] = next_token_law(score([*prompt, t1])[-1], case, [*prompt, t1], [t1])  # [V]
        if cell[1] == OTHER:
            out[cell] = p1 * max(0.0, 1.0 - sum(float(seconds[t1][t]) for t in listed))
        else:
            out[cell] = p1 * float(seconds[t1][cell[1]])
    return out


def cell_of(sample_key: tuple[int, ...], cells: Collection[tuple[int, ...]]) -> tuple[int, ...]:
    """The exact law's cell a sample's key falls in."""
    if sample_key in cells:
        return sample_key
    if (sample_key[0], OTHER) in cells:
        return (sample_key[0], OTHER)
    if (sample_key[0],) in cells:  # t1 ended the sample in the law (EOS) yet the engine went on
        return (sample_key[0],)
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
