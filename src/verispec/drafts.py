"""What crosses the seam between proposers and verification rules: a `Draft` (a chain of
drafted tokens and the q they were sampled from) or a `TreeDraft` (a token tree), and the
rule's `Verdict` / `TreeVerdict` on it. Plain data, so proposers, the rules and the engine all
depend on this module and none of them on another.

Both drafts answer the round's questions the same way (`accepted`, `offered`, `cut_after`,
`row_prefixes`, `depth`; `is_tree` for the forward that scores them), so the engine asks a
draft rather than testing its type; a chain walks as the tree it is (`parents`, `children`: each
token the only child of the one before), so code that walks a draft's tree takes either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property

import torch


ROOT = -1
"""The parent of a tree's first-level nodes: the pending token, whose target row is row 0."""


@dataclass(frozen=True)
class Draft:
    """Drafted tokens and, when they were sampled, the proposal distribution they came from.

    tokens: the k' <= k drafted token ids, in order.
    q: float64 [k', V], q[i] the proposal distribution that tokens[i] was sampled from (after
       the sampling transforms). None when the tokens were chosen, not sampled (prompt lookup,
       argmax of a draft model): then the verifier treats each as a point mass.
    """

    tokens: tuple[int, ...]
    q: torch.Tensor | None = None

    is_tree = False  # scored as a chain: each token after the one before it

    def __post_init__(self) -> None:
        if self.q is not None and tuple(self.q.shape[:1]) != (len(self.tokens),):
            raise ValueError(
                f"draft has {len(self.tokens)} tokens but q has {self.q.shape[0]} rows"
            )

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def depth(self) -> int:
        return len(self.tokens)

    def truncated(self, n: int) -> Draft:
        """The first n drafted tokens (and their q rows)."""
        return Draft(self.tokens[:n], None if self.q is None else self.q[:n])

    def accepted(self, verdict: Verdict) -> tuple[int, ...]:
        """The drafted tokens a verdict keeps: a prefix."""
        return self.tokens[: verdict.n_accepted]

    def offered(self, verdict: Verdict) -> None:
        """A chain offers one token per position (`Stats` counts it from the verdict alone)."""
        return None

    def cut_after(self, eos_ids: frozenset[int]) -> Draft:
        """Drafted tokens after an EOS can never be emitted: the draft without them."""
        end = through_first_eos(self.tokens, eos_ids)
        return self if end == len(self) else self.truncated(end)

    def row_prefixes(self) -> list[tuple[int, ...]]:
        """For each scored row, the drafted tokens between the context and it: row r follows
        the first r drafts."""
        return [self.tokens[:r] for r in range(len(self) + 1)]

    @property
    def parents(self) -> tuple[int, ...]:
        """A chain as a tree walks it (`TreeDraft.parents`): each token's parent is the token
        before it, the first token's the root."""
        return tuple(range(ROOT, len(self) - 1))

    def children(self, node: int) -> list[int]:
        """A chain as a tree walks it (`TreeDraft.children`): the token after `node` (ROOT: the
        first token), if any."""
        return [node + 1] if node + 1 < len(self) else []


EMPTY_DRAFT = Draft(())

def tree_depths(parents: Sequence[int]) -> list[int]:
    """depths[i] >= 1 of each node of a tree given by its parents (ROOT for a first-level node)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(1 if parent == ROOT else depths[parent] + 1)
    return depths


@dataclass(frozen=True)
class TreeDraft:
    """A token tree drafted after the pending token (SpecInfer 2305.09781, Medusa, EAGLE-2).

    tokens: node i's token id.
    parents: node i's parent node, or ROOT (-1) for a child of the pending token; parents[i] < i,
       so a parent precedes its children. Siblings appear in the order the verifier tries them.
    q: float64 [n, V], q[i] the proposal that node i was sampled from: the proposer's
       distribution after the context and node i's ancestors (siblings sampled from the same
       parent share the row's values). None when every node was chosen, not sampled (lookup
       continuations, top-k picks): the verifier then treats each sibling as a point mass.

    Scored in one target forward as rows [n + 1, V]: row 0 after the pending token, row i + 1
    after node i (each node attends to its own ancestor path only).

    >>> tree = TreeDraft(tokens=(5, 7, 9), parents=(ROOT, ROOT, 0))
    >>> tree.children(ROOT), tree.depths, tree.path_to(2)
    ([0, 1], (1, 1, 2), (0, 2))
    """

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    q: torch.Tensor | None = None

    is_tree = True  # scored in one forward with each node seeing its own ancestors

    def __post_init__(self) -> None:
        if len(self.parents) != len(self.tokens):
            raise ValueError(f"tree has {len(self.tokens)} tokens but {len(self.parents)} parents")
        for i, parent in enumerate(self.parents):
            if not ROOT <= parent < i:
                raise ValueError(f"tree node {i} has parent {parent}; a parent must be -1 (root) or an earlier node")
        if self.q is not None and tuple(self.q.shape[:1]) != (len(self.tokens),):
            raise ValueError(f"tree has {len(self.tokens)} nodes but q has {self.q.shape[0]} rows")

    @classmethod
    def chain(cls, draft: Draft) -> TreeDraft:
        """A chain as a tree: node i's parent is node i - 1."""
        return cls(draft.tokens, draft.parents, draft.q)

    def __len__(self) -> int:
        return len(self.tokens)

    @cached_property
    def _children(self) -> dict[int, list[int]]:
        children: dict[int, list[int]] = {ROOT: []}
        for i, parent in enumerate(self.parents):
            children.setdefault(parent, []).append(i)
        return children

    def children(self, node: int) -> list[int]:
        """Node's children (ROOT for the first level), in verification order."""
        return self._children.get(node, [])

    @cached_property
    def depths(self) -> tuple[int, ...]:
        """depths[i]: node i's depth, 1 for a child of the root."""
        return tuple(tree_depths(self.parents))

    @property
    def depth(self) -> int:
        """The longest root path (0 for an empty tree)."""
        return max(self.depths, default=0)

    def path_to(self, node: int) -> tuple[int, ...]:
        """The nodes from the root's child down to `node` (() for ROOT)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return tuple(reversed(path))

    def path_tokens(self, path: Sequence[int]) -> tuple[int, ...]:
        return tuple(self.tokens[i] for i in path)

    def accepted(self, verdict: TreeVerdict) -> tuple[int, ...]:
        """The drafted tokens a verdict keeps: its accepted root path's."""
        return self.path_tokens(verdict.path)

    def offered(self, verdict: TreeVerdict) -> tuple[list[int], list[int]]:
        """What the round tried along the accepted path (`offers`), for `Stats`."""
        return self.offers(verdict.path)

    def cut_after(self, eos_ids: frozenset[int]) -> TreeDraft:
        """Every node below an EOS node dropped: it can never be emitted."""
        return self.pruned(lambda node: self.parents[node] == ROOT or self.tokens[self.parents[node]] not in eos_ids)

    def row_prefixes(self) -> list[tuple[int, ...]]:
        """For each scored row, the drafted tokens between the context and it: row 0 follows
        none, row i + 1 node i's root path."""
        return [(), *(self.path_tokens(self.path_to(node)) for node in range(len(self)))]

    def offers(self, path: Sequence[int]) -> tuple[list[int], list[int]]:
        """What a round with accepted root path `path` tried, for per-rank acceptance counts:
        offered[d], the number of children of the path's node at depth d (d = 0 the root; one
        entry per accepted node and one for the last), and ranks[d], the sibling rank of the
        accepted node at depth d + 1."""
        offered, ranks, node = [], [], ROOT
        for child in path:
            siblings = self.children(node)
            offered.append(len(siblings))
            ranks.append(siblings.index(child))
            node = child
        offered.append(len(self.children(node)))
        return offered, ranks

    def pruned(self, keep: Callable[[int], bool]) -> TreeDraft:
        """The subtree of nodes for which `keep` holds and for all of whose ancestors it holds,
        renumbered in the same order."""
        index: dict[int, int] = {ROOT: ROOT}
        for i, parent in enumerate(self.parents):
            if parent in index and keep(i):
                index[i] = len(index) - 1
        kept = [i for i in range(len(self)) if i in index]
        if len(kept) == len(self):
            return self
        return TreeDraft(
            tuple(self.tokens[i] for i in kept),
            tuple(index[self.parents[i]] for i in kept),
            None if self.q is None else self.q[kept],
        )


@dataclass(frozen=True)
class Verdict:
    """A rule's decision on a round: `n_accepted` drafted tokens kept (a prefix of the draft),
    then `next_token`, the repair token (after a rejection) or the bonus token (all accepted).
    `fallback`: the repair token came from p because rounding left the residual with no mass
    (see `verispec.verify`); False in every round that exact arithmetic can produce."""

    n_accepted: int
    next_token: int
    fallback: bool = False


@dataclass(frozen=True)
class TreeVerdict:
    """A tree rule's decision: the accepted root path `path` (node indices, each the parent of
    the next, the first a child of the root), then `next_token` (repair after the last node's
    children were all rejected, or bonus after an accepted leaf). `fallback` as in `Verdict`."""

    path: tuple[int, ...]
    next_token: int
    fallback: bool = False

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def through_first_eos(tokens: Sequence[int], eos_ids: frozenset[int]) -> int:
    """How many of `tokens` to keep: through the first EOS, or all of them."""
    return next((i + 1 for i, token in enumerate(tokens) if token in eos_ids), len(tokens))
