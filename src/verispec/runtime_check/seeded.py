"""Seeded identity and the shared-stream probe: what a seed fixes, and whether unseeded
requests are independent.

Seeded identity: for each prompt, `count` seeds s, s + 1, ... are sampled with speculation off
one request at a time (the reference), then again the same way (does a seed reproduce at
all?), with speculation off `count` at once, and per method one at a time and `count` at once.
Each row counts the samples equal token for token to the reference. An engine whose samples
depend on the seed alone (position-keyed sampling, arXiv 2408.07978) has every row identical;
one that draws its randomness per round (token-level speculative sampling) gives other tokens
with speculation on, which is exact in law and no bug. So a row is a property (`holds` or
`lacks`) unless the engine claims the identity (`claims_seeded_identity`), where a difference
fails; a seed that does not reproduce alone (`again`) is reported the same way. "In flight" is
what the `Engine` protocol can ask: `count` samples in one call, which an engine that batches
decodes together (verispec's scheduler, a server sent them at once).

Shared-stream probe (TensorRT-LLM #19487: unseeded requests share one random stream, so
requests in flight together return the same sample): `count` unseeded requests at once per
prompt (`SamplesUnseeded`), and the largest group of identical samples among them. g given
independent samples are identical with probability at most m^(g - 1), m the probability of
the prompt's most likely continuation (bounded by `law.most_likely`), so a group of g or more
on any prompt has probability at most sum over prompts of C(count, g) m^(g - 1).
The probe fails at the smallest g where that bound is at most alpha. It runs on the prompts
where even `count` identical samples are rare (m^(count - 1) <= alpha / prompts; chosen from
the law, before sampling); where none is (one continuation too likely) it cannot see the bug
and says so.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

from verispec.runtime_check import law
from verispec.runtime_check.cases import SamplingCase
from verispec.runtime_check.engines.base import Engine, Refused
from verispec.runtime_check.report import ProbeRow, SeededRow

PLAIN, AGAIN = "plain", "plain, again"


@runtime_checkable
class SamplesUnseeded(Protocol):
    """An engine that can send requests without a seed (optional beside `Engine`)."""

    def sample_unseeded(
        self, prompt: Sequence[int], case: SamplingCase, n: int, length: int, method: str | None
    ) -> list[list[int]]:
        """n continuations requested at once, none with a seed: each should be an independent
        draw."""
        ...


def identity(
    engine: Engine, methods: Sequence[str], prompts: Sequence[Sequence[int]], case: SamplingCase, length: int,
    count: int, seed: int, progress: Callable[[str], None] = lambda line: None,
) -> list[SeededRow]:
    """The seeded-identity rows: plain again, plain `count` at once, each method at 1 and at
    `count` at once, each against plain one at a time."""
    claimed = bool(getattr(engine, "claims_seeded_identity", False))
    seeds = [seed + i for i in range(count)]

    def alone(method: str | None) -> list[list[int]]:
        return [engine.sample(p, case, 1, length, method, s)[0] for p in prompts for s in seeds]

    def together(method: str | None) -> list[list[int]]:
        return [sample for p in prompts for sample in engine.sample(p, case, count, length, method, seed)]

    progress(f"{engine.name} seeded identity: plain, {len(prompts)} prompts x {count} seeds one at a time")
    reference = alone(None)
    runs = [(AGAIN, 1, lambda: alone(None)), (PLAIN, count, lambda: together(None))]
    runs += [run for m in methods for run in ((m, 1, lambda m=m: alone(m)), (m, count, lambda m=m: together(m)))]
    rows = []
    for method, in_flight, draw in runs:
        row = SeededRow(engine.name, method, in_flight, len(reference), claimed)
        progress(f"{engine.name} seeded identity: {method} at {in_flight} in flight")
        try:
            got = draw()
        except Refused as refusal:
            rows.append(row.refused(refusal))
            continue
        rows.append(row.compared(sum(a == b for a, b in zip(reference, got))))
    return rows


def shared_stream_probe(
    engine: Engine, methods: Sequence[str], prompts: Sequence[Sequence[int]], largest: Sequence[float],
    case: SamplingCase, length: int, count: int, alpha: float, eos_ids: Collection[int] = (),
) -> list[ProbeRow]:
    """One row per method (plain first): the largest group of identical samples among `count`
    unseeded requests at once per prompt; largest: per prompt, an upper bound on its most
    likely continuation's probability (`law.most_likely`)."""
    usable = [i for i, m in enumerate(largest) if m ** (count - 1) <= alpha / len(largest)]  # chosen before sampling
    bound = lambda g: sum(math.comb(count, g) * largest[i] ** (g - 1) for i in usable)  # noqa: E731
    threshold = next((g for g in range(2, count + 1) if bound(g) <= alpha), None) if usable else None
    prompts = [prompts[i] for i in usable] or prompts
    rows = []
    for method in [None, *methods]:
        row = ProbeRow(engine.name, method or PLAIN, count, len(prompts), threshold or 0,
                       bound(threshold) if threshold else 1.0)
        if not isinstance(engine, SamplesUnseeded):
            rows.append(row.skipped(f"{engine.name} cannot send unseeded requests here"))
            continue
        if threshold is None:
            rows.append(row.skipped(f"every prompt has a continuation of probability {min(largest):.2g} or more: even "
                                    f"{count} identical samples are not rare enough to fail at alpha {alpha:g}"))
            continue
        try:
            group = 0
            for prompt in prompts:
                keys = Counter(law.key(s, eos_ids, length) for s in engine.sample_unseeded(prompt, case, count, length, method))
                group = max(group, max(keys.values()))
        except Refused as refusal:
            rows.append(row.refused(refusal))
            continue
        rows.append(row.counted(group))
    return rows
