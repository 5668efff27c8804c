"""The token tree's shape from the cost model: each round, the tree (or chain, or plain step)
predicted to emit the most tokens per unit of time.

A round that drafts the tree `shape` (n nodes, depth D) costs, in plain target steps,

    cost(shape) = c D + v*(n + 1),   v*(n + 1) = max of v(m + 1) over m <= n:

the proposer's c per level of depth (a chain of k tokens is k levels, so this is the chain
model's k c; a head proposer expanding a tree level by level pays about one head step per
level, lookup about nothing), then one target forward scoring the pending token and the
nodes. A proposer may fill any part of a branching shape, so the forward scores some m <= n
nodes: the dearest of those v's prices it (the same as v(n + 1) where v(n) grows with n, as it
does except for kernel quirks and noise). A chain is priced as `AutoK` prices it, c k +
v(k + 1), so where no tree pays the policy makes AutoK's choices: the running maximum of a noisy
v(n) would price every chain above its measured cost and push the policy to short chains. It emits E(shape) = 1 + sum over nodes of P(node accepted) tokens in expectation, where
a node with rank path (r_1..r_d) is accepted with

    P = a(1, r_1) a(2, r_2) ... a(d, r_d),

a(d, r) = P(the rank-r child at depth d is accepted | its parent was): Sequoia's positional
acceptance (Chen et al. 2024, 2402.12374). Siblings are tried in rank order and at most one is
accepted, so sum_r a(d, r) <= 1, and a node's P does not depend on the rest of the tree.
Against plain decoding (one token per step) the predicted speedup is E(shape) / cost(shape).

Shape search. If P never increases from a node to its child (a <= 1) nor from a sibling to
the next rank (a(d, r + 1) <= a(d, r), which the estimates below enforce), then the n nodes of
highest P among those of depth <= D form a valid shape (closed under parents and lower ranks),
and no shape of n nodes and depth <= D has a larger E. Greedy expansion by marginal P, adding
the best node of the frontier (EAGLE-2's expansion by confidence, Li et al. 2024, 2406.16858;
Sequoia's optimal trees under positional acceptance) finds them. `search` runs it for every
depth limit D and keeps every prefix size n <= max_nodes; the best of these maximises
E / (c depth + v(n + 1)) over all shapes: the best shape S has size n and depth D, the greedy
tree of size n and depth <= D has E >= E(S) at cost <= cost(S).

Estimates. a(d, r) is learned online from `Stats.rank_attempts` / `rank_accepts` (chain rounds
count rank 0, so they inform trees), with counts that decay and pseudo-counts as `AutoK`'s chain
acceptance:

    a(d, r) = (accepts + w m) / (attempts + w),

m(1, 0) = prior_rate, m(d, 0) = a(d - 1, 0) (a depth no round reached inherits the one above
it), and for r > 0 the prior continues the sibling before it geometrically: if rank r - 1 was
accepted with conditional rate rho given ranks < r - 1 rejected, rank r is assumed to be too,
m(d, r) = (1 - sum_{s<r} a(d, s)) rho. Each estimate is then capped by a(d, r - 1) and by the
mass its lower siblings leave, so the search's premise holds. A sibling slot that the shape
asked for but the proposer left empty beside filled siblings counts as rejected (lookup may
have one continuation where the shape had room for three); a depth it did not reach counts as
nothing, as for chains.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from verispec.checks import is_int, is_number
from verispec.cost import Costs, FixedCosts, check_costs, check_v_curve
from verispec.plan import Plan, smoothed_rate
from verispec.policies import AutoK, checked_limit, counter_growth, decayed
from verispec.stats import Stats
from verispec.tree_shape import RankPath, TreeShape, describe_plan

if TYPE_CHECKING:
    from verispec.models.base import CausalLM
    from verispec.proposers.base import Proposer
    from verispec.sampling import SamplingParams

# The widest sibling rank a tree policy considers by default: enough for lookup's and suffix's
# continuations and for the top-k of a head, few enough that unreached ranks' priors stay cheap.
MAX_WIDTH = 4
# A tree must beat the best chain by this factor: its round also builds a tree mask and keeps
# one path of the cache, which the cost model's v(n) and c do not see.
TREE_MARGIN = 0.02
# The largest tree a measured tree policy considers (`--k tree`): the profile measures v(n) for
# n = 1..TREE_NODES + 1.
TREE_NODES = 16

Acceptance = Sequence[Sequence[float]]
"""a[d][r]: P(the rank-r child at depth d + 1 is accepted | its parent was accepted)."""


@dataclass(frozen=True)
class Candidate:
    """A candidate round of the search: `shape` (empty: a plain step), its expected tokens and its cost in
    plain target steps."""

    shape: TreeShape
    expected: float
    cost: float

    @property
    def speedup(self) -> float:
        return self.expected / self.cost

    @property
    def choice(self) -> int | TreeShape:
        """What a policy answers: k for a chain (0: plain), else the shape."""
        return len(self.shape) if self.shape.is_chain else self.shape

    @property
    def kind(self) -> str:
        return "plain" if not self.shape.paths else "chain" if self.shape.is_chain else "tree"

    def as_dict(self) -> dict:
        return {
            "kind": self.kind,
            "nodes": len(self.shape),
            "depth": self.shape.depth,
            "paths": [list(path) for path in self.shape.paths],
            "expected_tokens": self.expected,
            "cost": self.cost,
            "speedup": self.speedup,
        }

    def describe(self) -> str:
        return describe_plan(self.shape)


PLAIN = Candidate(TreeShape(()), 1.0, 1.0)


@dataclass(frozen=True)
class TreeChoice:
    """The search's answer: the best plan of each kind and the overall choice.

    best_tree: the best shape of all (a chain when no branching pays); best_chain: the best
    chain; speculative: best_tree if it beats best_chain by the tree margin, else best_chain;
    chosen: speculative if it beats plain decoding by the margin, else plain.
    """

    best_tree: Candidate
    best_chain: Candidate
    speculative: Candidate
    chosen: Candidate


def check_acceptance(acceptance: Acceptance) -> None:
    """Each a(d, r) is a probability, the ranks of a depth sum to at most 1."""
    if not acceptance or not all(acceptance):
        raise ValueError("acceptance a(d, r) needs at least one depth with at least one rank")
    for d, row in enumerate(acceptance, start=1):
        for r, a in enumerate(row):
            if not is_number(a, 0, 1):
                raise ValueError(f"acceptance a({d}, {r}) must be a probability in [0, 1], got {a!r}")
        if math.fsum(row) > 1 + 1e-9:
            raise ValueError(
                f"the acceptances of depth {d}'s ranks sum to {math.fsum(row):.4g} > 1; at most one "
                "sibling is accepted, so they must sum to at most 1"
            )


def rate_at(acceptance: Acceptance, depth: int, rank: int) -> float:
    """a(depth + 1, rank); 0 beyond the table (a slot the search never fills)."""
    if depth >= len(acceptance) or rank >= len(acceptance[depth]):
        return 0.0
    return float(acceptance[depth][rank])


def node_probability(acceptance: Acceptance, path: RankPath) -> float:
    """P(the node at rank path `path` is accepted) = prod_j a(j, r_j)."""
    return math.prod(rate_at(acceptance, d, r) for d, r in enumerate(path))


def expected_tokens(shape: TreeShape, acceptance: Acceptance) -> float:
    """E = 1 + sum over the shape's nodes of P(node accepted)."""
    return 1.0 + math.fsum(node_probability(acceptance, path) for path in shape.paths)


def round_cost(shape: TreeShape, c: float, v: Sequence[float]) -> float:
    """c depth + v*(n + 1), in plain target steps (v[n - 1] = v(n)), where v*(n + 1) is the
    dearest v(m + 1), m <= n: a proposer may fill any part of a branching shape (lookup often
    fills five of eleven nodes), so the round scores an unknown m <= n nodes, and a v(n + 1)
    that noise or a kernel quirk made cheap must not draw the policy to a size its rounds never
    reach (and so never measure). A chain of k costs c k + v(k + 1), as `AutoK` prices it."""
    if len(shape) >= len(v):
        raise ValueError(f"a shape of {len(shape)} nodes needs v({len(shape) + 1}); the costs reach v({len(v)})")
    forward = v[len(shape)] if shape.is_chain else max(v[: len(shape) + 1])
    return c * shape.depth + forward


def plan_of(shape: TreeShape, acceptance: Acceptance, c: float, v: Sequence[float]) -> Candidate:
    return Candidate(shape, expected_tokens(shape, acceptance), round_cost(shape, c, v))


def greedy_order(acceptance: Acceptance, max_nodes: int, max_depth: int) -> list[tuple[RankPath, float]]:
    """Nodes of depth <= max_depth in order of decreasing P, each added from the frontier of
    the nodes before it (so every prefix is a valid shape), at most `max_nodes`; nodes with
    P = 0 are left out. Ties go to the shallower node, then the lower ranks."""
    order: list[tuple[RankPath, float]] = []
    frontier: list[tuple[float, int, RankPath, float]] = []

    def push(path: RankPath, parent_p: float) -> None:
        p = parent_p * rate_at(acceptance, len(path) - 1, path[-1])
        if p > 0 and len(path) <= max_depth:
            heapq.heappush(frontier, (-p, len(path), path, parent_p))

    push((0,), 1.0)
    while frontier and len(order) < max_nodes:
        minus_p, _, path, parent_p = heapq.heappop(frontier)
        order.append((path, -minus_p))
        push((*path[:-1], path[-1] + 1), parent_p)  # the next sibling
        push((*path, 0), -minus_p)  # the first child
    return order


def search(
    acceptance: Acceptance,
    c: float,
    v: Sequence[float],
    *,
    max_nodes: int | None = None,
    margin: float = 0.0,
    tree_margin: float = TREE_MARGIN,
) -> TreeChoice:
    """The best tree, the best chain and the choice between them and plain decoding, for
    acceptance a(d, r), draft cost c per level and v(n) (v[n - 1]; trees of up to
    max_nodes <= len(v) - 1 nodes, default all the curve covers).

        >>> flat = search([[0.6, 0.2]] * 8, 0.0, [1.0] + [1.02] * 8)  # v(n) flat: a tree
        >>> flat.chosen.describe(), round(flat.chosen.speedup, 2), round(flat.best_chain.speedup, 2)
        ('tree 8 nodes: 2-3-1-1-1', 2.77, 2.43)
        >>> steep = search([[0.6, 0.2]] * 8, 0.0, [1.0 + 0.4 * n for n in range(9)])  # v steep
        >>> steep.chosen.describe(), round(steep.chosen.speedup, 2)
        ('chain k = 1', 1.14)
    """
    top = _checked(acceptance, c, v, max_nodes)
    n, (_, limit) = max(_best_by_size(acceptance, c, v, top).items(), key=lambda item: item[1][0], default=(0, (0, 0)))
    chain_expected = list(itertools.accumulate(node_probability(acceptance, (0,) * k) for k in range(1, top + 1)))
    k = max(range(1, top + 1), key=lambda k: (1 + chain_expected[k - 1]) / (c * k + v[k]))
    best_chain = plan_of(TreeShape.chain(k), acceptance, c, v)
    best_tree = _greedy_plan(acceptance, c, v, n, limit) if n else best_chain
    if best_tree.speedup < best_chain.speedup:  # a chain's nodes of P = 0, on a jagged v(n)
        best_tree = best_chain
    speculative = best_tree if best_tree.speedup > best_chain.speedup * (1 + tree_margin) else best_chain
    chosen = speculative if speculative.speedup > 1 + margin else PLAIN
    return TreeChoice(best_tree, best_chain, speculative, chosen)


def best_of_each_size(
    acceptance: Acceptance, c: float, v: Sequence[float], *, max_nodes: int | None = None
) -> list[Candidate]:
    """The shape of the best speedup among those of n nodes, for each n = 1..max_nodes (sizes
    whose every node would have P = 0 left out): what `verispec cost --ranks` tabulates."""
    top = _checked(acceptance, c, v, max_nodes)
    best = _best_by_size(acceptance, c, v, top)
    return [_greedy_plan(acceptance, c, v, n, best[n][1]) for n in sorted(best)]


def _checked(acceptance: Acceptance, c: float, v: Sequence[float], max_nodes: int | None) -> int:
    """The checked inputs' largest tree size."""
    check_acceptance(acceptance)
    check_v_curve(v)
    check_costs(c, v[0])
    return checked_limit(max_nodes, len(v) - 1, "max_nodes")


def _best_by_size(acceptance: Acceptance, c: float, v: Sequence[float], top: int) -> dict[int, tuple[float, int]]:
    """n -> (the best speedup of a greedy tree of n nodes, the depth limit that gives it)."""
    best: dict[int, tuple[float, int]] = {}
    dearest = list(itertools.accumulate(v, max))  # v*(n) of `round_cost`
    for limit in range(1, top + 1):
        expected, depth = 1.0, 0
        for n, (path, p) in enumerate(greedy_order(acceptance, top, limit), start=1):
            expected += p
            depth = max(depth, len(path))
            ratio = expected / (c * depth + dearest[n])
            if n not in best or ratio > best[n][0]:
                best[n] = (ratio, limit)
        if depth < limit:  # no node reached the limit: deeper limits grow the same tree
            break
    return best


def _greedy_plan(acceptance: Acceptance, c: float, v: Sequence[float], nodes: int, limit: int) -> Candidate:
    order = greedy_order(acceptance, nodes, limit)
    return plan_of(TreeShape.of(path for path, _ in order), acceptance, c, v)


def tree_costs(costs: Costs) -> Costs:
    """The costs a tree policy prices its rounds with: a profile that timed tree rounds gives
    their curve (`tree_v`: v(nodes + 1) of a tree forward with its mask and its compaction, for
    as many nodes as it timed); otherwise the chains' v(n), which is what a tree forward of
    nodes + 1 positions costs to first order. Either prices chains too (one curve per n, as the
    rounds then refine it)."""
    curve = getattr(costs, "tree_v", None)
    if not curve:
        return costs
    return FixedCosts(costs.c, list(curve), getattr(costs, "step_seconds", None))


def estimated_acceptance(
    attempts: Acceptance, accepts: Acceptance, prior_rate: float, prior_weight: float
) -> list[list[float]]:
    """a(d, r) from decayed counts [d][r] with the priors of the module docstring."""
    table: list[list[float]] = []
    for d, (tried, won) in enumerate(zip(attempts, accepts)):
        row: list[float] = []
        for r, (n, k) in enumerate(zip(tried, won)):
            if r == 0:
                prior, cap = (prior_rate if d == 0 else table[d - 1][0]), 1.0
            else:
                left_before = 1.0 - math.fsum(row[:-1])
                left = max(0.0, 1.0 - math.fsum(row))
                rho = row[-1] / left_before if left_before > 0 else 0.0
                prior, cap = left * rho, min(row[-1], left)
            row.append(min(smoothed_rate(k, n, prior, prior_weight), cap))
        table.append(row)
    return table


class TreePolicy(AutoK):
    """Each round, the tree shape, chain k or plain step with the best predicted speedup
    (`search`), from acceptance and costs learned online.

    As `AutoK` for chains (whose probing, margins, cost learning and options it shares): c and
    v(n) come from the round timings (`OnlineCosts`, the profile `costs` as their prior, its
    tree rounds' curve when it timed them, `tree_costs`; a tree round's forward scores nodes + 1
    positions, and its proposer time is per level of depth), and a(d, r) from the decayed per-depth, per-rank counts of `Stats`. It considers
    trees of up to `max_nodes` nodes (default: the largest the costs' v(n) covers) and
    `max_width` siblings, answers a chain as an integer k (a tree only when it beats the best
    chain by `tree_margin`) and 0 when nothing beats plain decoding by `margin`. It reads only
    past rounds, deterministically, so the verifier's exactness is untouched and the engine
    and the reference decoder agree on a fake clock.

        >>> from verispec.cost import FixedCosts
        >>> TreePolicy(FixedCosts(c=0.0, v=[1.0] * 5)).choose(Stats()).describe()  # free and flat
        'tree 4 nodes: 3-1'
    """

    trees = True

    def __init__(
        self,
        costs: Costs,
        *,
        max_nodes: int | None = None,
        max_width: int = MAX_WIDTH,
        tree_margin: float = TREE_MARGIN,
        **options,
    ) -> None:
        if not is_int(max_width, least=1):
            raise ValueError(f"max_width (siblings per node) must be an integer >= 1, got {max_width!r}")
        if not is_number(tree_margin, least=0):
            raise ValueError(f"tree_margin must be a finite number >= 0, got {tree_margin!r}")
        costs = tree_costs(costs)
        checked_limit(max_nodes, len(costs.v) - 1, "max_nodes")  # named as the caller named it
        self.max_width = max_width
        self.tree_margin = tree_margin
        super().__init__(costs, k_max=max_nodes, **options)

    @property
    def max_nodes(self) -> int:
        return self.k_max

    def _as_plan(self, choice: int | TreeShape) -> Plan:
        """The chosen tree or chain, kept whole in a batch (`BatchK` adjusts the k of `AutoK`'s chains only)."""
        plan = Plan.of(choice)
        self._plans.append(plan)
        return plan

    def acceptance(self) -> list[list[float]]:
        """The current estimate a(d, r), d = 1..max_nodes, r = 0..max_width - 1 (as [d - 1][r])."""
        return estimated_acceptance(self._attempts, self._accepts, self.prior_rate, self.prior_weight)

    def explain(self) -> TreeChoice:
        """The search on the current estimates (what the next round would be, before probing)."""
        return search(
            self.acceptance(), self.c, self.v, max_nodes=self.max_nodes, margin=self.margin,
            tree_margin=self.tree_margin,
        )

    def survival(self) -> list[float]:
        """The chain survival s_i = a(1, 0) ... a(i, 0) the current estimates imply."""
        acceptance = self.acceptance()
        return [node_probability(acceptance, (0,) * i) for i in range(1, self.k_max + 1)]

    def _best(self) -> tuple[int | TreeShape, float]:
        speculative = self.explain().speculative
        return speculative.choice, speculative.speedup

    def _draft_levels(self, stats: Stats, r: int) -> int:
        """A tree round's proposer steps: the depth asked for, at most the nodes it drafted."""
        depth = self._plans[r].depth if r < len(self._plans) else stats.drafted[r]
        return min(depth, stats.drafted[r])

    def _forget_acceptance(self) -> None:
        # [d][r]: decayed rounds whose path reached depth d and offered rank r, and accepted it
        self._attempts = [[0.0] * self.max_width for _ in range(self.k_max)]
        self._accepts = [[0.0] * self.max_width for _ in range(self.k_max)]
        self._seen_attempts: list[list[int]] = []
        self._seen_accepts: list[list[int]] = []
        self._plans: list[Plan] = []  # what this policy answered for each round

    def _absorb_acceptance(self, stats: Stats, new_rounds: int) -> tuple[list[list[float]], list[list[float]]]:
        """Decay the counts and add the rank counters' growth since the last call; return it."""
        new_attempts = _table_growth(stats.rank_attempts, self._seen_attempts, self.k_max, self.max_width)
        new_accepts = _table_growth(stats.rank_accepts, self._seen_accepts, self.k_max, self.max_width)
        self._seen_attempts = [list(row) for row in stats.rank_attempts]
        self._seen_accepts = [list(row) for row in stats.rank_accepts]
        if new_rounds == 1 and stats.drafted[-1] > 0 and stats.rounds - 1 < len(self._plans):
            _count_empty_siblings(self._plans[stats.rounds - 1], new_attempts, new_accepts)
        if any(map(any, new_attempts)):
            self._attempts = [decayed(old, new, self.memory) for old, new in zip(self._attempts, new_attempts)]
            self._accepts = [decayed(old, new, self.memory) for old, new in zip(self._accepts, new_accepts)]
        return new_attempts, new_accepts


def _table_growth(now: list[list[int]], before: list[list[int]], depths: int, width: int) -> list[list[float]]:
    """`counter_growth` for every depth's rank counters, as a depths x width table."""
    def row(counters: list[list[int]], d: int) -> list[int]:
        return counters[d] if d < len(counters) else []

    return [counter_growth(row(now, d), row(before, d), width) for d in range(depths)]


def _count_empty_siblings(plan: Plan, attempts: list[list[float]], accepts: list[list[float]]) -> None:
    """Add, along one round's accepted path (read off its accept counts), the sibling slots its
    shape asked for and the proposer left empty beside filled ones, as rejected attempts."""
    if plan.shape is None:
        return  # a chain asks for one child per depth: nothing to leave empty beside it
    path: RankPath = ()
    for d, (tried, won) in enumerate(zip(attempts, accepts)):
        offered = sum(1 for x in tried if x > 0)
        if offered == 0:
            return
        asked = sum(1 for p in plan.shape.paths if len(p) == d + 1 and p[:d] == path)
        for r in range(offered, min(asked, len(tried))):
            tried[r] += 1
        ranks = [r for r, x in enumerate(won) if x > 0]
        if not ranks:
            return
        path = (*path, ranks[0])


def shape_from_widths(widths: Sequence[int]) -> TreeShape:
    """The constant tree `tree:W1xW2x...`: every node at depth d - 1 (the pending token at
    d = 1) has the top W_d candidates as children.

        >>> shape_from_widths([2, 1]).paths
        ((0,), (1,), (0, 0), (1, 0))
    """
    paths: list[RankPath] = [()]
    level: list[RankPath] = [()]
    for width in widths:
        if not is_int(width, least=1):
            raise ValueError(f"tree widths must be integers >= 1, got {width!r}")
        level = [(*parent, r) for parent in level for r in range(width)]
        paths.extend(level)
    return TreeShape.of(paths[1:])


def measured_tree_policy(
    target: CausalLM,
    proposer: Proposer,
    prompt_ids: Sequence[int],
    *,
    max_nodes: int = TREE_NODES,
    sampling: SamplingParams | None = None,
    **options,
) -> TreePolicy:
    """A TreePolicy from a brief profile of this target and proposer after this prompt: v(n)
    for n = 1..max_nodes + 1 and c per drafted token (= per level), two timed repeats after a
    warm-up; `options` go to `TreePolicy`. The profile is its prior, as for `measured_autok`."""
    from verispec.profile import measure_profile

    profile = measure_profile(target, proposer, prompt_ids, k_max=max_nodes, repeats=2, warmup=1, sampling=sampling)
    return TreePolicy(profile, **options)
