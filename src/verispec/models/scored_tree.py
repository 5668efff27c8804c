"""`ScoredTree`: what a model's cache needs to know about a token tree it has just scored.

A tree of n nodes after `start` cached positions is scored in one forward (`TreeScoring`):
the node in row (and cache slot) start + j sits at rotary position start + depth - 1 and
attends to the cached prefix and its own ancestors only. Afterwards the cache keeps one root
path: path[j] (depth j + 1) must end in slot start + j, where a chain would have put it.

Rows follow the caller's node order, or with `depth_first` a depth-first (pre-order) layout:
then the first-child path, each node's first child after it (the drafter's best guesses, and
the chain `propose` would have drafted), fills slots start, start + 1, ... exactly as a chain
does, so keeping it copies nothing, and a model whose rows are only promised a chain's bits
where the ancestors sit in the chain's slots (bfloat16's `InvariantAttention`) gets them all
along that path. `nodes[j]` is the caller's node in row j; `by_node` puts rows back in the
caller's order, and `moves` takes the caller's node indices.

Parents precede children in either layout, so a kept node never moves right, and a node
already in its slot is not copied at all. `moves` lists only the others; copying them in
ascending order never overwrites a row still to be read (every later source lies right of
every earlier slot).

    >>> tree = ScoredTree(start=10, parents=(-1, 0, 0, 1, 2))
    >>> tree.positions().tolist()          # depths 1, 2, 2, 3, 3
    [10, 11, 11, 12, 12]
    >>> tree.moves([0, 2, 4])              # node 2 -> slot 11, node 4 -> slot 12
    ([12, 14], [11, 12])
    >>> tree.moves([0, 1])                 # the first-child chain: nothing to copy
    ([], [])
    >>> tree.moves([0, 1, 3])              # node 3 -> slot 12
    ([13], [12])
    >>> laid = ScoredTree.depth_first(10, (-1, 0, 0, 1, 2))
    >>> laid.nodes, laid.parents           # rows: nodes 0, 1, 3, 2, 4
    ((0, 1, 3, 2, 4), (-1, 0, 1, 0, 3))
    >>> laid.moves([0, 1, 3])              # the first-child path is in place
    ([], [])
"""


from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.drafts import ROOT, tree_depths
from verispec.models.base import check_path

PENDING_TREE = "a scored token tree is pending: call keep_path first, or roll back to the length before it"


@dataclass(frozen=True)
class ScoredTree:
    start: int  # cache length before the tree
    parents: tuple[int, ...]  # [n]: row j's parent row (ROOT for a first-level node)
    nodes: tuple[int, ...] | None = None  # [n]: the caller's node in row j (None: rows are the caller's nodes)

    @classmethod
    def depth_first(cls, start: int, parents: Sequence[int]) -> ScoredTree:
        """The tree of the caller's `parents` laid out in depth-first pre-order, each node's
        children in the caller's order."""
        children: list[list[int]] = [[] for _ in parents]
        roots = []
        for node, parent in enumerate(parents):
            (roots if parent == ROOT else children[parent]).append(node)
        order: list[int] = []
        stack = roots[::-1]
        while stack:
            node = stack.pop()
            order.append(node)
            stack.extend(children[node][::-1])
        row = {node: j for j, node in enumerate(order)}
        laid = tuple(ROOT if parents[node] == ROOT else row[parents[node]] for node in order)
        return cls(start, laid, tuple(order))

    def _rows(self) -> list[int]:
        """rows[node]: the row (slot - start) of each of the caller's nodes."""
        if self.nodes is None:
            return list(range(len(self.parents)))
        rows = [0] * len(self.nodes)
        for j, node in enumerate(self.nodes):
            rows[node] = j
        return rows

    def by_node(self, rows: torch.Tensor) -> torch.Tensor:
        """rows [n, ...] in row order -> the same in the caller's node order."""
        return rows if self.nodes is None else rows[torch.tensor(self._rows())]

    def caller_parents(self) -> tuple[int, ...]:
        """The parents as the caller gave them (node indices)."""
        if self.nodes is None:
            return self.parents
        parents = [ROOT] * len(self.nodes)
        for j, node in enumerate(self.nodes):
            parents[node] = ROOT if self.parents[j] == ROOT else self.nodes[self.parents[j]]
        return tuple(parents)

    def positions(self) -> torch.Tensor:
        """LongTensor [n]: rotary position start + depth(i) - 1 of each node."""
        return torch.tensor(tree_depths(self.parents), dtype=torch.long) + (self.start - 1)

    def visible(self) -> torch.Tensor:
        """bool [n, n]: visible[i, j] when node j is node i or one of its ancestors."""
        n = len(self.parents)
        visible = torch.eye(n, dtype=torch.bool)
        for node, parent in enumerate(self.parents):
            if parent != ROOT:
                visible[node] |= visible[parent]
        return visible

    def allowed(self) -> torch.Tensor:
        """bool [n, start + n]: which cache slots each node attends to (the prefix, then its
        ancestors and itself)."""
        n = len(self.parents)
        return torch.cat((torch.ones(n, self.start, dtype=torch.bool), self.visible()), dim=1)

    @property
    def is_chain(self) -> bool:
        """Every node under the previous one: the mask is the ordinary causal one."""
        return all(parent == node - 1 for node, parent in enumerate(self.parents))

    def moves(self, path: Sequence[int]) -> tuple[list[int], list[int]]:
        """(sources, destinations): the cache slots of the kept nodes (the caller's indices)
        that are not yet where `path` puts them, and those slots, in ascending order (`path`
        is checked first)."""
        check_path(path, self.caller_parents())
        rows = self._rows()
        moved = [(self.start + rows[node], self.start + j) for j, node in enumerate(path) if rows[node] != j]
        return [source for source, _ in moved], [slot for _, slot in moved]


class PendingTree:
    """The one scored tree a model holds between `extend_tree` and `keep_path`, and the checks
    every tree-scoring model makes around it."""

    def __init__(self) -> None:
        self.tree: ScoredTree | None = None

    def refuse(self) -> None:
        """Before an extend, extend_tree or record_features: nothing may come between a tree
        and its keep_path."""
        if self.tree is not None:
            raise ValueError(PENDING_TREE)

    def kept(self, path: Sequence[int]) -> tuple[int, list[int], list[int]]:
        """keep_path: close the pending tree; (its start, the slots to copy, their targets)."""
        if self.tree is None:
            raise ValueError("keep_path needs a tree scored by extend_tree first")
        sources, destinations = self.tree.moves(path)
        start, self.tree = self.tree.start, None
        return start, sources, destinations

    def rolled_back(self, length: int) -> None:
        """A rollback to `length`: past a pending tree's start it is refused; to at most its
        start it forgets the tree."""
        if self.tree is not None:
            if length > self.tree.start:
                raise ValueError(PENDING_TREE)
            self.tree = None
