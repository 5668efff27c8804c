"""The exact rational oracle: the verification rules restated on `Fraction`s.

One step (the seed lesson's identity): drafting x ~ q and accepting it with min(1, p(x)/q(x))
emits token j with probability min(p_j, q_j) + (1 - sum min(p, q)) * r_j / |r|, where
r = max(p - q, 0) and |r| = 1 - sum min(p, q). That equals p_j exactly; when |r| = 0 (p = q)
rejection never happens and the residual is never divided. `one_step_failures` checks it on
every pair of the quarter-grid simplex, zero support and identical p and q included.

One round: `round_distribution` enumerates every draft x_1..x_k (autoregressively from q) and
every verdict of a rule (`token_level_verdicts`, `block_verdicts`), giving the exact
distribution of what the round emits (accepted drafts, then the repair or bonus token). A rule
is exact when that output, continued by the target itself up to k + 1 tokens, has the target's
own distribution over k + 1 tokens (`round_is_exact`).

Rows are functions of the drafted prefix: p(prefix) is the target's next-token distribution
after the context and `prefix`, q(prefix) the proposal's. A context-free toy ignores the prefix:

    >>> third, two_thirds = Fraction(1, 3), Fraction(2, 3)
    >>> p, q = (lambda _: (third, two_thirds)), (lambda _: (two_thirds, third))
    >>> expected_accepted(round_distribution(p, q, 2, token_level_verdicts))
    Fraction(10, 9)
    >>> expected_accepted(round_distribution(p, q, 2, block_verdicts))
    Fraction(11, 9)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fractions import Fraction
from itertools import product

from verispec.audit.exact_target import autoregressive
from verispec.tree_shape import TreeShape

Distribution = tuple[Fraction, ...]
Rows = Callable[[tuple[int, ...]], Distribution]
# A rule's verdicts for one draft: (n_accepted, next_token) -> probability.
Verdicts = Callable[[Sequence[Distribution], Sequence[Distribution], tuple[int, ...]], dict[tuple[int, int], Fraction]]


def quarter_simplex(vocab: int = 3, denominator: int = 4) -> list[Distribution]:
    """Every distribution over `vocab` tokens whose entries are multiples of 1/denominator."""
    return [
        tuple(Fraction(c, denominator) for c in counts)
        for counts in product(range(denominator + 1), repeat=vocab)
        if sum(counts) == denominator
    ]


def token_level_step(p: Distribution, q: Distribution) -> Distribution:
    """What one token-level step emits: accepted mass min(p, q) plus the rejection mass spread
    over the normalised residual (not divided when it is empty)."""
    accepted = [min(a, b) for a, b in zip(p, q)]
    residual = [max(a - b, Fraction(0)) for a, b in zip(p, q)]
    rejected = 1 - sum(accepted)
    if sum(residual) != rejected:
        raise ArithmeticError(f"residual mass {sum(residual)} differs from rejection mass {rejected}")
    if rejected == 0:
        return tuple(accepted)
    return tuple(a + rejected * r / rejected for a, r in zip(accepted, residual))


def one_step_failures(
    step: Callable[[Distribution, Distribution], Distribution] = token_level_step,
    grid: Sequence[Distribution] | None = None,
) -> list[tuple[Distribution, Distribution]]:
    """Every (p, q) of the grid (default: the quarter-grid simplex over 3 tokens, 15 x 15
    pairs) whose one-step output differs from p; empty for an exact step."""
    grid = quarter_simplex() if grid is None else grid
    return [(p, q) for p in grid for q in grid if step(p, q) != p]


def round_distribution(p: Rows, q: Rows, k: int, verdicts: Verdicts) -> dict[tuple[int, ...], Fraction]:
    """Exact distribution of one round's output x_1..x_n, y over every draft and verdict."""
    vocab = len(p(()))
    out: dict[tuple[int, ...], Fraction] = {}
    for drafts in product(range(vocab), repeat=k):
        q_rows = [q(drafts[:i]) for i in range(k)]
        mass = Fraction(1)
        for row, x in zip(q_rows, drafts):
            mass *= row[x]
        if mass == 0:
            continue
        p_rows = [p(drafts[:i]) for i in range(k + 1)]
        for (n, y), chance in verdicts(p_rows, q_rows, drafts).items():
            emitted = (*drafts[:n], y)
            out[emitted] = out.get(emitted, Fraction(0)) + mass * chance
    return out


def token_level_verdicts(
    p: Sequence[Distribution], q: Sequence[Distribution], drafts: tuple[int, ...]
) -> dict[tuple[int, int], Fraction]:
    """Token-level rule (Leviathan et al. 2211.17192): accept x_i with min(1, p_i/q_i); at the
    first rejection y ~ norm(max(p_i - q_i, 0)); all accepted: y ~ p_k."""
    out: dict[tuple[int, int], Fraction] = {}
    reach = Fraction(1)
    for i, x in enumerate(drafts):
        accept = min(Fraction(1), p[i][x] / q[i][x])
        if accept < 1:
            _spread(out, i, reach * (1 - accept), [max(a - b, Fraction(0)) for a, b in zip(p[i], q[i])])
        reach *= accept
    _spread(out, len(drafts), reach, p[len(drafts)])
    return out


def block_verdicts(
    p: Sequence[Distribution], q: Sequence[Distribution], drafts: tuple[int, ...]
) -> dict[tuple[int, int], Fraction]:
    """Block rule (Sun et al. 2403.10444, Alg. 2): weights w_0 = 1, w_i = min(1, w_{i-1} p_i/q_i);
    h_i = Z_i / (Z_i + 1 - w_i) for i < k (1 if that is 0/0), Z_i = |max(w_i p_{i+1} - q_{i+1}, 0)|,
    h_k = w_k. tau = the last i with eta_i <= h_i (0 if none), so P(tau = i) = h_i prod_{j>i}
    (1 - h_j). Then y ~ p_{k+1} if tau = k, else y ~ norm(max(w_tau p_{tau+1} - q_{tau+1}, 0))."""
    k = len(drafts)
    w = [Fraction(1)]
    for i, x in enumerate(drafts):
        w.append(min(Fraction(1), w[-1] * p[i][x] / q[i][x]))
    residuals = [[max(w[i] * a - b, Fraction(0)) for a, b in zip(p[i], q[i])] for i in range(k)]
    h = [Fraction(0)] * (k + 1)
    h[k] = w[k]
    for i in range(1, k):
        denominator = sum(residuals[i]) + 1 - w[i]
        h[i] = sum(residuals[i]) / denominator if denominator else Fraction(1)
    out: dict[tuple[int, int], Fraction] = {}
    none_later = Fraction(1)  # P(eta_j > h_j for every j > tau)
    for tau in range(k, -1, -1):
        chance = none_later * (h[tau] if tau else 1)
        _spread(out, tau, chance, p[k] if tau == k else residuals[tau])
        none_later *= 1 - h[tau]
    return out


def expected_accepted(outputs: dict[tuple[int, ...], Fraction]) -> Fraction:
    """Expected accepted drafts of a round: every output ends with one repair or bonus token."""
    return sum((mass * (len(seq) - 1) for seq, mass in outputs.items()), Fraction(0))


def round_is_exact(p: Rows, q: Rows, k: int, verdicts: Verdicts) -> bool:
    """Whether one round of the rule, continued by the target, is distributed as the target."""
    target = autoregressive({(): Fraction(1)}, p, k + 1)
    return autoregressive(round_distribution(p, q, k, verdicts), p, k + 1) == target


def repair_by_resampling_p(p: Distribution, q: Distribution) -> Distribution:
    """Negative control, the seed's: repairing a rejection by sampling p again instead of the
    residual emits min(p, q) + (1 - sum min(p, q)) p, which is not p.
    p = (.1, .3, .6), q = (.4, .4, .2) gives (.14, .42, .44)."""
    rejected = 1 - sum(min(a, b) for a, b in zip(p, q))
    return tuple(min(a, b) + rejected * a for a, b in zip(p, q))


def _spread(out: dict[tuple[int, int], Fraction], n: int, mass: Fraction, weights: Sequence[Fraction]) -> None:
    """Add `mass` to the verdicts (n, y), y ~ weights normalised; an empty residual may carry
    no mass (it would need a division by zero)."""
    if mass == 0:
        return
    total = sum(weights)
    if total == 0:
        raise ArithmeticError(f"a rejection at draft position {n} with mass {mass} has an empty residual")
    for y, weight in enumerate(weights):
        if weight:
            out[(n, y)] = out.get((n, y), Fraction(0)) + mass * weight / total

def tree_round_distribution(p: Rows, q: Rows, shape: TreeShape, chosen: bool) -> dict[tuple[int, ...], Fraction]:
    """Exact distribution of one tree round's output (the accepted path's tokens, then the
    repair or bonus token), a restatement of `verify.tree_recursive` on Fractions. The tree
    fills `shape`: chosen, a node's children are q's top-ranked tokens after its path (ties to
    the lower id, zeros left out); sampled, each child is an independent draw from that q.

        >>> half = lambda prefix: (Fraction(1, 2), Fraction(1, 2))
        >>> tree_round_distribution(half, half, TreeShape.of([(0,), (1,)]), chosen=True)[(1, 0)]
        Fraction(1, 4)
    """
    out: dict[tuple[int, ...], Fraction] = {}
    for tokens, mass in _trees(q, shape, chosen):
        children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
        for path in tokens:
            children.setdefault(path[:-1], []).append(path)
        for emitted, chance in _recursive(p, q, tokens, children, (), chosen).items():
            out[emitted] = out.get(emitted, Fraction(0)) + mass * chance
    return {emitted: chance for emitted, chance in out.items() if chance}


def tree_round_is_exact(p: Rows, q: Rows, shape: TreeShape, chosen: bool) -> bool:
    """Whether one tree round, continued by the target, is distributed as the target."""
    length = shape.depth + 1
    target = autoregressive({(): Fraction(1)}, p, length)
    return autoregressive(tree_round_distribution(p, q, shape, chosen), p, length) == target


def _trees(q: Rows, shape: TreeShape, chosen: bool):
    """Every drafted tree as ({rank path: token} for the filled nodes, its probability)."""
    drafts: list[tuple[dict[tuple[int, ...], int], Fraction]] = [({}, Fraction(1))]
    for path in shape.paths:
        grown = []
        for tokens, mass in drafts:
            if len(path) > 1 and path[:-1] not in tokens:
                grown.append((tokens, mass))
                continue
            row = q(tuple(tokens[path[:d]] for d in range(1, len(path))))
            if chosen:
                ranked = [x for x in sorted(range(len(row)), key=lambda x: (-row[x], x)) if row[x] > 0]
                options = [(ranked[path[-1]], Fraction(1))] if path[-1] < len(ranked) else []
            else:
                options = [(x, row[x]) for x in range(len(row)) if row[x] > 0]
            if not options:
                grown.append((tokens, mass))
            grown.extend(({**tokens, path: x}, mass * chance) for x, chance in options)
        drafts = grown
    return drafts


def _recursive(p: Rows, q: Rows, tokens: dict, children: dict, node: tuple[int, ...], chosen: bool):
    """The law of what the recursive rule emits from `node` (a rank path, () the root):
    emitted tokens -> probability."""
    prefix = tuple(tokens[node[:d]] for d in range(1, len(node) + 1))
    p_u = p(prefix)
    kids = children.get(node, [])
    out: dict[tuple[int, ...], Fraction] = {}
    r, reach = list(p_u), Fraction(1)
    for child in kids:
        x = tokens[child]
        q_s = q(prefix)
        accept = r[x] if chosen else min(Fraction(1), r[x] / q_s[x])
        for emitted, chance in _recursive(p, q, tokens, children, child, chosen).items():
            out[(x, *emitted)] = out.get((x, *emitted), Fraction(0)) + reach * accept * chance
        reach *= 1 - accept
        if reach == 0:
            return out
        r = [0 if y == x else v for y, v in enumerate(r)] if chosen else [max(a - b, Fraction(0)) for a, b in zip(r, q_s)]
        r = [v / sum(r) for v in r]
    for y, v in enumerate(r if kids else p_u):
        if v:
            out[(y,)] = out.get((y,), Fraction(0)) + reach * v
    return out
