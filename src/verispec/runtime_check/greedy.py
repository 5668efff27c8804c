"""Greedy identity of an engine's speculative output with its own plain output.

Every method (and plain decoding itself at concurrency above 1, which tests the engine's
batching) is run greedily on the same prompts and compared token for token with the engine's
plain greedy output at one request. A divergence is located and diagnosed by verispec on the
same weights (`verispec.identity.diagnose`, a fresh full forward of the common prefix):
a near tie (both tokens within the dtype's rounding of the maximum, `NEAR_TIE`) is the
numerics of a different forward shape, not a bug; anything else fails.

An engine that shows its own logits (`GivesLogits`: hf, verispec) is read in its numerics too:
its logits after the common prefix give its own top-2 margin and how far each of the two
tokens lies below its maximum, and then the verdict is the engine's (a near tie in the logits
it decodes from), with verispec's margin beside it. Without them the verdict is verispec's,
and an engine whose numerics differ more than the tolerance (another quantisation) shows as
failures that are its rounding, saying so only through the margin reported.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verispec.identity import NEAR_TIE, diagnose, top2
from verispec.runtime_check.engines.base import Engine, GivesLogits, Refused
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
                divergences.append({"prompt": i} | found | engine_view(engine, list(prompt), list(expected), found))
        rows.append(row.compared(divergences))
    return rows


def engine_view(engine: Engine, prompt: list[int], expected: list[int], found: dict) -> dict:
    """The divergence `found` in the engine's own logits, where it gives them: its top-2 margin
    after the common prefix, how far the two tokens lie below its maximum, and then its
    verdict as `near_tie` (verispec's kept as `verispec_near_tie`). Empty otherwise."""
    if not isinstance(engine, GivesLogits) or found["behind_max"] is None:
        return {}
    row = engine.logits([*prompt, *expected[:found["position"]]])  # [V]
    if row is None:
        return {}
    row = row.double()
    (top1, second), margin = top2(row)
    behind = float(row.max() - row[[found["expected"], found["got"]]].min())
    return {"engine_top2": [top1, second], "engine_top2_margin": margin, "engine_behind_max": behind,
            "verispec_near_tie": found["near_tie"], "near_tie": behind <= NEAR_TIE.get(engine.dtype, NEAR_TIE["float32"])}
