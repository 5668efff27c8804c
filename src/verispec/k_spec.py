"""The k grammar: what a user may write for the number of tokens drafted per round, read once.

The CLI's `--k`, the benchmark's method names (`verispec-lookup-k4`, `-auto`, `-tree:3x2x1`)
and `verispec.request.Request` all read k here (`verispec.registry` re-exports it), so one
integer check holds one lower bound: a constant k >= `K_MIN` (1; k = 0 is plain decoding,
which only a request without a proposer and the cost model's formulas name).

    >>> parse_k("auto:fast.json")
    KSpec(kind='auto', k=None, profile='fast.json', widths=None)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from verispec.checks import is_int

# The least constant k a speculative method drafts.
K_MIN = 1
# The largest k a command's counts take (`cost --k`, `profile --k-max`, `export-head
# --speculative-tokens`). Even at alpha 0.99 and a free draft (c = 0) the expected tokens per
# round have nearly stopped growing: E(256) is within 8% of its limit 1 / (1 - alpha). A larger
# bound would only let a typo such as --k 100000000 run for minutes.
K_BOUND = 256


def check_k(k: object, *, minimum: int = K_MIN, name: str = "k (drafted tokens per round)") -> int:
    """k as an int >= minimum. Speculative commands need minimum 1: k = 0 would decode plainly
    while reporting itself as speculative; the cost model allows 0 (plain decoding)."""
    if not is_int(k, least=minimum):
        raise ValueError(f"{name} must be an integer >= {minimum}, got {k!r}")
    return k


K_POLICIES: dict[str, str] = {
    "N": "constant: N drafted tokens per round (an integer >= 1)",
    "auto": "AutoK: the cost model's best k per round (profiles first)",
    "auto:PROFILE.json": "AutoK on a profile from `verispec profile --out`",
    "heuristic": "HF's schedule: k + 2 after a full accept, else k - 1",
    "tree": "the cost model's best token tree, chain or plain step per round (profiles first)",
    "tree:PROFILE.json": "the tree policy on a profile from `verispec profile --out` (trees up to its k_max nodes)",
    "tree:W1xW2x...": "a constant tree: each node at depth d - 1 has the top W_d candidates as children",
}
K_GRAMMAR = "an integer >= 1, auto, auto:PROFILE.json, heuristic, tree, tree:PROFILE.json or tree:W1xW2x..."
K_HELP = f"Tokens drafted per round: {K_GRAMMAR} (trees need a proposer that fills them)."
# The most nodes a constant tree may have: a typo such as tree:9x9x9x9 (7380 nodes) is refused
# rather than scored.
TREE_SHAPE_BOUND = 256


@dataclass(frozen=True)
class KSpec:
    """A parsed k policy: kind "constant" (k), "heuristic", "auto" (profile: a file, or None to
    measure one now) or "tree" (widths: a constant tree's children per node at each depth; else
    the tree policy on `profile` or on one measured now)."""

    kind: Literal["constant", "heuristic", "auto", "tree"]
    k: int | None = None
    profile: str | None = None
    widths: tuple[int, ...] | None = None
    text: str = field(default="", compare=False, repr=False)  # as written, for messages


def parse_k(text: str | int, *, option: str = "--k") -> KSpec:
    """A k policy spec (`K_GRAMMAR`), or a constant k given as an integer.

        >>> parse_k("tree:2x2x1")
        KSpec(kind='tree', k=None, profile=None, widths=(2, 2, 1))
        >>> parse_k(4)
        KSpec(kind='constant', k=4, profile=None, widths=None)
    """
    if not isinstance(text, str):
        return KSpec("constant", k=check_k(text, name=option), text=str(text))
    spec = text.strip()
    if spec in ("heuristic", "auto", "tree"):
        return KSpec(spec, text=spec)
    for kind in ("auto", "tree"):
        if spec.startswith(f"{kind}:"):
            argument = spec.removeprefix(f"{kind}:")
            if not argument:
                what = "auto:PROFILE.json needs the profile's path" if kind == "auto" else (
                    "tree:PROFILE.json or tree:W1xW2x... needs a profile's path or the widths"
                )
                raise ValueError(f"{option} {what}, got {text!r}")
            if kind == "tree" and set(argument) <= set("0123456789x"):
                return KSpec("tree", widths=tree_widths(argument, option), text=spec)
            return KSpec(kind, profile=argument, text=spec)
    try:
        k = int(spec)
    except ValueError:
        raise ValueError(f"{option} must be {K_GRAMMAR}, got {text!r}") from None
    if k < K_MIN:
        raise ValueError(
            f"{option} must be {K_GRAMMAR}, got {text!r}; k = 0 would decode plainly "
            "(plain decoding is the baseline every comparison already runs)"
        )
    return KSpec("constant", k=k, text=spec)


def tree_widths(text: str, option: str = "--k") -> tuple[int, ...]:
    """The widths of `tree:W1xW2x...`: integers >= 1, at most TREE_SHAPE_BOUND nodes in all."""
    parts = text.split("x")
    if not all(part.isdigit() for part in parts) or any(int(part) < 1 for part in parts):
        raise ValueError(
            f"{option} tree:W1xW2x... needs widths that are integers >= 1 joined by 'x' (e.g. tree:3x2x1), "
            f"got tree:{text}"
        )
    widths = tuple(int(part) for part in parts)
    nodes, level = 0, 1
    for width in widths:
        level *= width
        nodes += level
        if nodes > TREE_SHAPE_BOUND:
            raise ValueError(
                f"{option} tree:{text} has more than {TREE_SHAPE_BOUND} nodes (each node at depth d - 1 has "
                f"W_d children); give smaller widths or fewer depths"
            )
    return widths
