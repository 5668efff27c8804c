"""Greedy identity: every method's output must equal plain decoding's, token for token.

At temperature 0 speculative decoding is exact when it emits the target's argmax at every
position. Two correct implementations can still part at a near tie: scoring 5 tokens in one
forward and 1 token at a time round differently, and when the target's top two logits are
closer than that rounding, either token is "the argmax". A mismatch is therefore reported with
the target's top-2 logit margin at the first differing position, from a fresh full forward of
the common prefix: a margin at rounding level is a near tie, a large one a real bug. Where the
runs kept the logits they decided from (`passes`: the speculative round's scoring forward,
plain decoding's single-step forward), their margins at that position are reported too, and a
near tie must be one in every pass.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

# How far below the maximum logit a token may lie and still be "the argmax" after rounding
# across forward shapes. float32: one step of the grid is ~2e-6 at the top logits (16-32);
# on SmolLM2-135M a token's logit differed by up to 8e-5 between two passes over the same
# prefix, so a tie flips only within ~2e-4, far inside 1e-2. bfloat16 keeps 8 significant
# bits: one step is 0.125 at 16-32 and 0.25 above 32; two passes differed by 0.25 (two steps),
# flipping ties within 0.5, so 1.0 leaves room for logits above 32 and longer runs.
# q4's projections compute in bfloat16 (`models.formats.quant`), so its logits round like bfloat16's.
NEAR_TIE = {"float32": 1e-2, "float64": 1e-6, "bfloat16": 1.0, "float16": 0.1, "q4": 1.0}
FRESH = "fresh full forward"


def first_mismatch(reference: Sequence[int], tokens: Sequence[int]) -> int | None:
    """The first position where the outputs differ (a length difference counts), or None."""
    for i, (a, b) in enumerate(zip(reference, tokens)):
        if a != b:
            return i
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def diagnose(
    prompt_ids: Sequence[int],
    reference: Sequence[int],
    tokens: Sequence[int],
    score: Callable[[list[int]], torch.Tensor],
    dtype: str,
    passes: Mapping[str, torch.Tensor] | None = None,
    peer: str | None = None,
) -> dict | None:
    """None when `tokens` equals `reference` (plain decoding's output); else what differs.

    score(ids) -> logits[len(ids), V]: the target's stateless full forward.
    passes: name -> logits[n, V], the rows a run itself chose its new tokens from (row i: new
    token i); a pass with no row at the mismatch is left out.
    peer: what computed `tokens` when it was not the target itself (`Outcome.peer`); such a
    difference is described, with the target's margin there, but is no exactness failure.
    """
    position = first_mismatch(reference, tokens)
    if position is None:
        return None
    expected = reference[position] if position < len(reference) else None
    got = tokens[position] if position < len(tokens) else None
    rows = {FRESH: score([*prompt_ids, *reference[:position]])[-1]}  # name -> logits[V]
    rows |= {name: logits[position] for name, logits in (passes or {}).items() if position < len(logits)}
    margins = {name: top2(row) for name, row in rows.items()}
    (top1, second), margin = margins[FRESH]
    tolerance = NEAR_TIE.get(dtype, NEAR_TIE["float32"])
    # A near tie: in every pass both tokens lie within `tolerance` of the maximum. Not "both
    # in the top 2": bfloat16's coarse grid makes three-way exact ties common.
    behind = None if None in (expected, got) else {
        name: float(row.max() - row[[expected, got]].min()) for name, row in rows.items()
    }
    near_tie = behind is not None and max(behind.values()) <= tolerance
    margins_text = ", ".join(f"{gap:.3g} ({name})" for name, (_, gap) in margins.items())
    if peer is not None:
        diagnosis = (
            f"a peer ({peer}), not required to equal plain decoding; the target's top-2 margin there "
            f"{margin:.3g} ({'a near tie' if near_tie else 'not a near tie'} for the target)"
        )
    elif behind is None:
        diagnosis = f"lengths differ ({len(reference)} vs {len(tokens)}) with equal tokens up to there"
    elif near_tie:
        diagnosis = (
            f"near tie: top-2 logit margins {margins_text}; in every pass both tokens lie within "
            f"{max(behind.values()):.3g} <= {tolerance:g} of the maximum ({dtype} rounding across forward "
            "shapes), so both are its argmax"
        )
    else:
        behind_text = ", ".join(f"{gap:.3g} ({name})" for name, gap in behind.items())
        diagnosis = (
            f"not a near tie: fresh argmax {top1}, top-2 margins {margins_text}; the lower of the two "
            f"tokens lies {behind_text} below the maximum, beyond the tolerance {tolerance:g}: the "
            "method did not emit the target's greedy token"
        )
    return {
        "position": position,
        "expected": expected,
        "got": got,
        "fresh_top2": [top1, second],
        "top2_margin": margin,
        "pass_margins": {name: gap for name, (_, gap) in margins.items()},
        "behind_max": behind,
        "near_tie": near_tie,
        "peer": peer,
        "diagnosis": diagnosis,
    }


def verdict(mismatch: dict | None) -> str:
    """A short cell for a table: `yes` (identical), `tie@i` (a near tie at new token i) or
    `FAIL@i`."""
    if mismatch is None:
        return "yes"
    return f"{'tie' if mismatch['near_tie'] else 'FAIL'}@{mismatch['position']}"


def explain(mismatch: dict) -> str:
    """One sentence for a user: where the outputs first differ, the top-2 logit margin there,
    and whether that is a near tie within the dtype's rounding or a real failure."""
    where = f"differs from plain decoding at new token {mismatch['position']}"
    if mismatch["behind_max"] is None:
        return f"{where}: {mismatch['diagnosis']}; a real failure"
    if mismatch["near_tie"]:
        return (f"{where}, a near tie (top-2 logit margin {mismatch['top2_margin']:.3g}, within the "
                f"dtype's rounding), not a failure of exactness")
    return (f"{where}: FAILURE, not a near tie (top-2 logit margin {mismatch['top2_margin']:.3g}, beyond "
            "the dtype's rounding): the method did not emit the target's greedy token")


def top2(logits: torch.Tensor) -> tuple[tuple[int, int], float]:
    """logits[V] -> ((argmax, runner-up), their logit difference)."""
    top = torch.topk(logits.double(), 2)
    return (int(top.indices[0]), int(top.indices[1])), float(top.values[0] - top.values[1])
