"""`Plan`: what a k policy answers for the next round, and what the engine drafts to.

A plan is a chain of k drafted tokens (k = 0: a plain step) or a tree shape
(`verispec.tree_shape`) for a tree proposer to fill. It names the draft source it was chosen
for (a `SourcedProposer`'s, None for a proposer with one source), and an adaptive chain
policy lets a batch lower its k (`lowering`: what `verispec.policies.BatchK` weighs).

    >>> Plan(4).describe(), Plan(shape=TreeShape.of([(0,), (1,), (0, 0)])).describe()
    ('chain k = 4', 'tree 3 nodes: 2-1')
    >>> Plan(6).budgeted(remaining=3).k
    2
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from verispec.checks import is_int
from verispec.tree_shape import TreeShape, describe_plan


@dataclass(frozen=True)
class Plan:
    """k: the chain's drafted tokens (0: a plain step; 0 for a tree). shape: the tree shape, or
    None for a chain. source: the draft source it was chosen for. lowering: what a batch weighs
    to plan the chain's k (`verispec.policies.Adjustable`, from an adaptive policy), None when
    the k is the policy's to keep."""

    k: int = 0
    shape: TreeShape | None = None
    source: str | None = None
    lowering: object | None = None

    def __post_init__(self) -> None:
        if not is_int(self.k, least=0):
            raise ValueError(f"a plan's k must be an integer >= 0, got {self.k!r}")
        if self.shape is not None and (self.k or not isinstance(self.shape, TreeShape)):
            raise ValueError(f"a tree plan holds a TreeShape and k = 0, got k={self.k!r}, shape={self.shape!r}")

    @classmethod
    def of(cls, answer: int | TreeShape | Plan) -> Plan:
        """A policy's answer as a plan (a policy written against the older protocol answers an
        integer k or a `TreeShape`)."""
        if isinstance(answer, Plan):
            return answer
        return cls(shape=answer) if isinstance(answer, TreeShape) else cls(answer)

    @property
    def is_tree(self) -> bool:
        return self.shape is not None

    @property
    def nodes(self) -> int:
        """The most tokens the draft may hold (the forward scores nodes + 1 rows)."""
        return len(self.shape) if self.shape is not None else self.k

    @property
    def depth(self) -> int:
        """The longest root path: the proposer steps it takes (a chain's k)."""
        return self.shape.depth if self.shape is not None else self.k

    def budgeted(self, remaining: int) -> Plan:
        """Within the budget: at most `remaining - 1` tokens deep (the +1 is the repair or
        bonus token); a plan cut to nothing is a plain step."""
        if self.shape is not None:
            return replace(self, shape=self.shape.truncated(remaining - 1))
        return replace(self, k=max(0, min(self.k, remaining - 1)))

    def describe(self) -> str:
        """'plain step', 'chain k = 4' or 'tree 8 nodes: 3-3-2' (`Stats.plans`)."""
        return describe_plan(self.shape if self.shape is not None else self.k)
