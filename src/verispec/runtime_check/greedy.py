"""Greedy identity of an engine's speculative output with its own plain output.

Every method (and plain decoding itself at concurrency above 1, which tests the engine's
batching) is run greedily on the same prompts and compared token for token with the engine's
plain greedy output at one request. A divergence is located and diagnosed by verispec on the
same weights (`verispec.identity.diagnose`, a fresh full forward of the common prefix):
a near tie (both tokens within the dtype's rounding of the maximum, `NEAR_TIE`) is the
numerics of a different forward shape, not a bug; anything else fails. The diagnosis reads
verispec's logits, not the engine's own: an engine whose numerics differ more than the
tolerance (another quantisation) shows as failures that are its rounding, and says so only
through the margin reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verispec.identity import diagnose
from verispec.runtime_check.engines.base import Engine, Refused
from verispec.runtime_check.law import Score
from verispec.runtime_check.report import GreedyRow

PLAIN = "plain"

def check(
    engine: Engine, methods: Sequence[str], prompts: Sequence[Sequence[int]], reference: Sequence[Sequence[int]],
    max_new_tokens: int, concurrency: int, score: Score, progress: Callable[[str], None] = lambda line: None,
) -> list[GreedyRow]:
    """The greedy rows of one concurrency level: plain (above 1 only) and every method, each
    against `reference`, the engine's plain greedy outputs at one request."""
    rows = []
    for method in ([None] if concurrency > 1 else []) + list(methods):
        row = GreedyRow(engine.name, method or PLAIN, concurrency, len(prompts), max_new_tokens)
        progress(f"{engine.name} greedy {row.method} at {concurrency} in flight")
        try:
            outputs = engine.greedy(prompts, max_new_tokens, method, concurrency)
        except Refused as refusal:
            rows.append(row.refused(refusal))
            continue
        divergences = []
        for i, (prompt, expected, got) in enumerate(zip(prompts, reference, outputs)):
            found = diagnose(list(prompt), list(expected), list(got), score, engine.dtype)
            if found is not None:
                divergences.append({"prompt": i} | found)
        rows.append(row.compared(divergences))
    return rows
