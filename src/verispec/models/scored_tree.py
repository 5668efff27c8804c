"""`ScoredTree`: what a model's cache needs to know about a token tree it has just scored.

A tree of n nodes after `start` cached positions is scored in one forward (`TreeScoring`):
node i is written to cache slot start + i, but sits at rotary position start + depth(i) - 1
and attends to the cached prefix and its own ancestors only. Afterwards the cache keeps one
root path: path[j] (depth j + 1) must end in slot start + j, where a chain would have put it.

Because parents precede children, path[j] >= j: a kept node never moves right, and a node
already in its slot (path[j] == j, e.g. the first-child chain of a depth-first tree) is not
copied at all. `moves` lists only the others; copying them in ascending order never
overwrites a row still to be read (every later source lies right of every earlier slot).

    >>> tree = ScoredTree(start=10, parents=(-1, 0, 0, 1, 2))
    >>> tree.positions().tolist()          # depths 1, 2, 2, 3, 3
    [10, 11, 11, 12, 12]
    >>> tree.moves([0, 2, 4])              # node 2 -> slot 11, node 4 -> slot 12
    ([12, 14], [11, 12])
    >>> tree.moves([0, 1])                 # the first-child chain: nothing to copy
    ([], [])
    >>> tree.moves([0, 1, 3])              # node 3 -> slot 12
    ([13], [12])
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
    parents: tuple[int, ...]  # [n], as `extend_tree` took them

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
        """(sources, destinations): the cache slots of the kept nodes that are not yet where
        `path` puts them, and those slots, in ascending order (`path` is checked first)."""
        check_path(path, self.parents)
        moved = [(self.start + node, self.start + j) for j, node in enumerate(path) if node != j]
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
