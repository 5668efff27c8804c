"""`Plan`: what a k policy answers for the next round, and what the engine drafts to.

A plan is a chain of k drafted tokens (k = 0: a plain step) or a tree shape
(`verispec.tree_shape`) for a tree proposer to fill. It names the draft source it was chosen
for (a `SourcedProposer`'s, None for a proposer with one source), and an adaptive chain
policy's plan carries what a batch weighs to choose its k instead (`adjustable`, an
`Adjustable`: `verispec.policies.BatchK` may lower the k or raise it up to the policy's k_max;
the engine applies the batch's k with `adjusted`).

    >>> Plan(4).describe(), Plan(shape=TreeShape.of([(0,), (1,), (0, 0)])).describe()
    ('chain k = 4', 'tree 3 nodes: 2-1')
    >>> Plan(6).budgeted(remaining=3).k
    2
    >>> Plan(2, adjustable=Adjustable(most=8, survival=[0.9] * 8, c=0.05)).adjusted(5).k
    5
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from verispec.checks import is_int
from verispec.tree_shape import TreeShape, describe_plan


@dataclass(frozen=True)
class AcceptanceCounts:
    """The decayed counts behind a chain's survival estimate: per position i, the rounds that
    reached it (`attempts`) and those that accepted it (`accepts`), and the prior they are
    smoothed with (`AutoK`): r_i = (accepts_i + w m_i) / (attempts_i + w), m_1 = prior_rate,
    m_i = r_(i-1), w = prior_weight; s_i = r_1 ... r_i."""

    attempts: Sequence[float]
    accepts: Sequence[float]
    prior_rate: float
    prior_weight: float

    def survival(self) -> list[float]:
        return list(itertools.accumulate(self.rates(), lambda s, r: s * r))

    def rates(self) -> list[float]:
        """r_1..r_K."""
        return chained_rates(self.accepts, self.attempts, self.prior_rate, self.prior_weight)


def chained_rates(accepts: Sequence[float], attempts: Sequence[float], prior: float, weight: float) -> list[float]:
    """Each position's rate smoothed towards the one before it (the first towards `prior`)."""
    out = []
    for a, n in zip(accepts, attempts):
        prior = smoothed_rate(a, n, prior, weight)
        out.append(prior)
    return out


def smoothed_rate(accepts: float, attempts: float, prior: float, weight: float) -> float:
    """(accepts + w m) / (attempts + w): a rate pulled towards its prior m by w pseudo-counts."""
    return (accepts + weight * prior) / (attempts + weight)


@dataclass(frozen=True)
class Adjustable:
    """What a batch (`verispec.policies.BatchK`) knows of a request whose k it may choose: the
    most drafts its policy allows (`most`, the policy's k_max), its survival estimate
    s_1..s_K and its cost per drafted token c (relative to one row); `probe`: it drafts one
    token when that is cheap, whatever the batch; `counts`: the evidence behind the survival
    (None: unknown, and the batch is not pooled) (`verispec.policies.AutoK.adjustable`)."""

    most: int
    survival: Sequence[float]
    c: float
    probe: bool = False
    counts: AcceptanceCounts | None = None


@dataclass(frozen=True)
class Plan:
    """k: the chain's drafted tokens (0: a plain step; 0 for a tree). shape: the tree shape, or
    None for a chain. source: the draft source it was chosen for. adjustable: what a batch
    weighs to choose the chain's k instead (from an adaptive policy), None when the k is the
    policy's to keep."""

    k: int = 0
    shape: TreeShape | None = None
    source: str | None = None
    adjustable: Adjustable | None = None

    def __post_init__(self) -> None:
        if not is_int(self.k, least=0):
            raise ValueError(f"a plan's k must be an integer >= 0, got {self.k!r}")
        if self.shape is not None and (self.k or not isinstance(self.shape, TreeShape)):
            raise ValueError(f"a tree plan holds a TreeShape and k = 0, got k={self.k!r}, shape={self.shape!r}")
        if self.shape is not None and self.adjustable is not None:
            raise ValueError("a batch adjusts a chain's k; a tree plan is kept whole")

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

    def adjusted(self, k: int) -> Plan:
        """This chain at the k a batch chose for it: ValueError unless its policy lets a batch
        choose (`adjustable`) and k is within what the policy allows (0..`adjustable.most`)."""
        if self.adjustable is None:
            raise ValueError(f"{self.describe()} is its policy's to keep; a batch adjusts only plans that carry `adjustable`")
        if not is_int(k, 0, self.adjustable.most):
            raise ValueError(f"a batch's k must be an integer in [0, {self.adjustable.most}], got {k!r}")
        return replace(self, k=k)

    def budgeted(self, remaining: int) -> Plan:
        """Within the budget: at most `remaining - 1` tokens deep (the +1 is the repair or
        bonus token); a plan cut to nothing is a plain step."""
        if self.shape is not None:
            return replace(self, shape=self.shape.truncated(remaining - 1))
        k = max(0, min(self.k, remaining - 1))
        return self if k == self.k else replace(self, k=k)  # frozen: the same plan where nothing is cut

    def describe(self) -> str:
        """'plain step', 'chain k = 4' or 'tree 8 nodes: 3-3-2' (`Stats.plans`)."""
        return describe_plan(self.shape if self.shape is not None else self.k)
