"""Tree shapes: the static templates a policy asks a tree proposer to fill.

A shape is a set of rank paths closed under prefixes, as Medusa's `medusa_choices` and
Sequoia's trees are written: (0,) is the proposer's first-ranked token after the pending one,
(1,) its second, (0, 2) the third-ranked token after the first, and so on. A proposer fills a
node with the candidate of that rank after the node's ancestors, or leaves it out (with its
descendants) when it has no such candidate, so a drafted tree is never larger than its shape.
A chain of k tokens is the shape (0,), (0, 0), ..., (0,) * k.

Nodes are kept in the order a `TreeDraft` needs: by depth, then by rank path, so a parent
precedes its children and siblings come in rank order (the verifier's order).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from verispec.drafts import ROOT, TreeDraft
from verispec.randomness import Random

RankPath = tuple[int, ...]


@dataclass(frozen=True)
class TreeShape:
    """paths: the rank paths of the nodes (each closed under prefixes; rank r > 0 only beside
    rank r - 1 under the same parent), stored sorted by depth then path.

    >>> TreeShape.of([(0,), (1,), (0, 0)]).parents
    (-1, -1, 0)
    """

    paths: tuple[RankPath, ...]

    @classmethod
    def of(cls, paths: Iterable[Sequence[int]]) -> TreeShape:
        """The shape of these rank paths, checked and sorted."""
        unique = sorted({tuple(int(r) for r in path) for path in paths}, key=lambda path: (len(path), path))
        present = set(unique)
        for path in unique:
            if not path or min(path) < 0:
                raise ValueError(f"tree shape path {path} must be a nonempty tuple of ranks >= 0")
            if len(path) > 1 and path[:-1] not in present:
                raise ValueError(f"tree shape path {path} has no parent {path[:-1]}")
            if path[-1] > 0 and (*path[:-1], path[-1] - 1) not in present:
                raise ValueError(f"tree shape path {path} has no sibling of rank {path[-1] - 1} before it")
        return cls(tuple(unique))

    @classmethod
    def chain(cls, k: int) -> TreeShape:
        return cls(tuple((0,) * d for d in range(1, k + 1)))

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def depth(self) -> int:
        return max((len(path) for path in self.paths), default=0)

    @property
    def parents(self) -> tuple[int, ...]:
        """parents[i]: the index of node i's parent, ROOT for the first level."""
        index = {path: i for i, path in enumerate(self.paths)}
        return tuple(index[path[:-1]] if len(path) > 1 else ROOT for path in self.paths)

    @property
    def is_chain(self) -> bool:
        return all(rank == 0 for path in self.paths for rank in path)

    def truncated(self, depth: int) -> TreeShape:
        """The nodes at depth <= `depth` (the engine's budget: remaining tokens - 1)."""
        return TreeShape(tuple(path for path in self.paths if len(path) <= depth))

    def describe(self) -> str:
        """Nodes per depth, as in '9 nodes: 4-3-2'."""
        widths = [sum(1 for path in self.paths if len(path) == d) for d in range(1, self.depth + 1)]
        return f"{len(self)} nodes: " + "-".join(map(str, widths)) if widths else "0 nodes"


def describe_plan(plan: int | TreeShape) -> str:
    """A round's plan in words: 'plain step', 'chain k = 4' or 'tree 8 nodes: 3-3-2'.

    >>> describe_plan(0), describe_plan(4), describe_plan(TreeShape.of([(0,), (1,), (0, 0)]))
    ('plain step', 'chain k = 4', 'tree 3 nodes: 2-1')
    """
    shape = plan if isinstance(plan, TreeShape) else TreeShape.chain(plan)
    if not shape.paths:
        return "plain step"
    if shape.is_chain:
        return f"chain k = {len(shape)}"
    return f"tree {shape.describe()}"


Candidates = Callable[[tuple[int, ...]], Sequence[int]]
"""Ranked candidate tokens after a path of drafted tokens (() for the first level)."""


def fill(shape: TreeShape, candidates: Candidates) -> TreeDraft:
    """A chosen tree (q is None): each node of `shape` takes the candidate of its rank after
    its ancestors' tokens; a node without one is left out, with its descendants. `candidates`
    is called once per filled parent (and once for the root), level by level."""
    return fill_levels(shape, lambda parents: [candidates(path) for path in parents])


LevelCandidates = Callable[[list[tuple[int, ...]]], Sequence[Sequence[int]]]
"""Candidates after each of several paths of drafted tokens of one depth, at once, ranked (or
drawn: a sampled tree's siblings, whose q `with_q` attaches): for a proposer that runs one
batched forward per level, as EAGLE-2 expands its tree."""


def fill_levels(shape: TreeShape, level_candidates: LevelCandidates) -> TreeDraft:
    """`fill`, asking for a whole level at a time: `level_candidates(parents)` gets the path
    tokens of every filled node of depth d - 1 with children in `shape` (in shape order; [()]
    for the root) and answers their ranked candidates, once per depth d."""
    tokens: list[int] = []
    parents: list[int] = []
    node_of: dict[RankPath, int] = {(): ROOT}
    prefix_tokens: dict[RankPath, tuple[int, ...]] = {(): ()}
    for depth in range(1, shape.depth + 1):
        level = [path for path in shape.paths if len(path) == depth and path[:-1] in node_of]
        parent_paths = list(dict.fromkeys(path[:-1] for path in level))
        if not parent_paths:
            break
        answers = level_candidates([prefix_tokens[parent] for parent in parent_paths])
        ranked = dict(zip(parent_paths, answers, strict=True))
        for path in level:
            options = ranked[path[:-1]]
            if path[-1] >= len(options):
                continue
            token = int(options[path[-1]])
            node_of[path] = len(tokens)
            prefix_tokens[path] = (*prefix_tokens[path[:-1]], token)
            tokens.append(token)
            parents.append(node_of[path[:-1]])
    return TreeDraft(tuple(tokens), tuple(parents))


def with_q(tree: TreeDraft, q_after: Callable[[tuple[int, ...]], torch.Tensor]) -> TreeDraft:
    """`tree` as a sampled tree: node i's q row is `q_after(tokens of its parent's path)`, the
    float64 [V] distribution it was drawn from (() for the first level)."""
    if not len(tree):
        return tree
    rows = [q_after(tree.path_tokens(tree.path_to(parent))) for parent in tree.parents]
    return TreeDraft(tree.tokens, tree.parents, torch.stack(rows))


def widest(shape: TreeShape) -> int:
    """The most children any node of `shape` has (0 for an empty shape): how many ranked
    candidates a proposer needs after any path."""
    return max((path[-1] + 1 for path in shape.paths), default=0)


def ranked_top(row: torch.Tensor, width: int) -> list[int]:
    """The `width` highest-probability token ids of one distribution row [V], best first, ties
    to the lower id, zeros left out (a chosen candidate with no mass is never worth a slot)."""
    values, ids = torch.sort(row, descending=True, stable=True)
    return [int(i) for v, i in zip(values[:width].tolist(), ids[:width].tolist()) if v > 0]


Proposal = Callable[[tuple[int, ...]], torch.Tensor]
"""The proposal q float64 [V] after a path of drafted tokens (() for the first level)."""


def sample(shape: TreeShape, proposal: Proposal, rng: Random) -> TreeDraft:
    """A sampled tree (SpecInfer 2305.09781): every node of `shape` is an independent draw,
    with replacement, from the proposal after its ancestors' tokens, and q[node] records that
    row, so `verify.tree_recursive` applies its residual rule. A rank is only a draw's number
    among its siblings here. Randomness: one `rng.draw` per node, in the shape's order (by
    depth, then rank path), at the node's depth - 1 with its rank as the choice (in a keyed
    round the first child races with the target's noise, its siblings with noise of their own);
    `proposal` is called once per parent, when its first child is drawn.

    >>> from verispec.randomness import TorchRandom
    >>> tree = sample(TreeShape.of([(0,), (1,), (0, 0)]), lambda path: torch.tensor([0.0, 1.0]), TorchRandom(0))
    >>> tree.tokens, tree.parents, tree.q.shape
    ((1, 1, 1), (-1, -1, 0), torch.Size([3, 2]))
    """
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    prefix_tokens: dict[RankPath, tuple[int, ...]] = {(): ()}
    q_after: dict[RankPath, torch.Tensor] = {}
    for path in shape.paths:
        parent = path[:-1]
        if parent not in q_after:
            q_after[parent] = proposal(prefix_tokens[parent])
        token = rng.draw(len(parent), q_after[parent], path[-1])
        prefix_tokens[path] = (*prefix_tokens[parent], token)
        tokens.append(token)
        rows.append(q_after[parent])
    q = torch.stack(rows) if rows else None
    return TreeDraft(tuple(tokens), shape.parents, q)
