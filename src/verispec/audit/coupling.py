"""The exact joint law of two exponential races that share their noise.

A keyed sample is the winner of the race argmin_x E_x / p_x over i.i.d. Exp(1) noise E
(`verispec.randomness`). A draft sampled from q and the target's sample from p at the same
position run on the same E, so their winners are coupled; their joint law is rational in p and q:

- both choose i: 1 / sum_j max(p_j / p_i, q_j / q_i);
- p chooses i and q chooses j != i: with a = E_i / p_i and b = E_j / q_j, the others must
  satisfy E_k >= max(a p_k, b q_k), so with r = b / a the probability is
  the integral over r in (p_j / q_j, p_i / q_i) of p_i q_j / L(r)^2 dr, where
  L(r) = p_i + q_j r + sum_{k != i, j} max(p_k, q_k r). L is linear between the breakpoints
  p_k / q_k, and over a linear piece the integral of 1 / L^2 from r1 to r2 is
  (r2 - r1) / (L(r1) L(r2)) (to infinity: 1 / (slope L(r1))), so it sums in closed form.

Computed with `Fraction`s from the given values, so a float64 row is taken exactly as it is.

    >>> half = (Fraction(1, 2), Fraction(1, 2))
    >>> race_pair(half, half)[0][0], race_pair(half, half)[0][1]
    (Fraction(1, 2), Fraction(0, 1))
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction


def race_pair(p: Sequence[Fraction], q: Sequence[Fraction]) -> list[list[Fraction]]:
    """joint[i][j] = P(the race under p picks i and the race under q picks j), both on one
    noise vector; rows sum to p, columns to q."""
    n = len(p)
    return [[_joint(p, q, i, j) for j in range(n)] for i in range(n)]


def conditional(p: Sequence[Fraction], q: Sequence[Fraction], i: int) -> list[Fraction]:
    """P(the race under q picks j | the race under p picked i) for every j (p_i > 0)."""
    return [_joint(p, q, i, j) / p[i] for j in range(len(q))]


def _joint(p: Sequence[Fraction], q: Sequence[Fraction], i: int, j: int) -> Fraction:
    if p[i] == 0 or q[j] == 0:
        return Fraction(0)
    if i == j:
        return 1 / sum(max(p[k] / p[i], q[k] / q[i]) for k in range(len(p)))
    low = p[j] / q[j]  # r >= p_j / q_j, so that E_j / p_j >= a
    high = None if q[i] == 0 else p[i] / q[i]  # r <= p_i / q_i, so that E_i / q_i >= b; None: no bound
    if high is not None and high <= low:
        return Fraction(0)
    others = [k for k in range(len(p)) if k not in (i, j)]
    cuts = sorted({p[k] / q[k] for k in others if q[k] > 0 and low < p[k] / q[k] and (high is None or p[k] / q[k] < high)})
    points = [low, *cuts] + ([high] if high is not None else [])

    def L(r: Fraction) -> Fraction:
        return p[i] + q[j] * r + sum(max(p[k], q[k] * r) for k in others)

    total = sum((r2 - r1) / (L(r1) * L(r2)) for r1, r2 in zip(points, points[1:]))
    if high is None:  # the last piece runs to infinity with slope q_j + sum of q_k past their breakpoints
        slope = q[j] + sum(q[k] for k in others if q[k] > 0 and p[k] / q[k] <= points[-1])
        total += 1 / (slope * L(points[-1]))
    return p[i] * q[j] * total
