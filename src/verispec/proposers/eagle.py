"""The EAGLE-style head as a proposer (Li et al. 2401.15077, 2503.01840): it drafts k tokens
autoregressively in feature space, reading the target's features of the emitted prefix.

Where the features come from (the seam): the proposer holds the target it drafts for, which
must be a `FeatureChannel`, and asks it at construction to record the head's taps. The engine
drives that same target (prefill, extend, rollback), so when `propose(context)` is called the
target has processed every emitted token but the pending one and its feature store holds
exactly their features: positions 0..n-2 of a context of n tokens. Rejected rows were rolled
back with the target's cache, so no feature of a rejected draft is ever read.

The head's KV cache holds pairs (feature of position j, token j + 1). Pairs made from the
target's true features (j = s..n-2, the last one pairs with the pending token) are kept across
rounds; pairs made from the head's own predicted features while drafting are rolled back at
`commit`, and the next `propose` appends the new true pairs, as EAGLE re-processes accepted
tokens with the target's real features.

The first pair s: the head reads at most the last `prompt_window` positions of the prompt,
s = max(0, len(prompt) - 1 - prompt_window), and every position after them. The target's
features already carry the whole prompt; the head's own attention over a long one only costs
its first draft a head forward over every prompt position, which on a long prompt costs more
than a target step (docs/results/implementation-choices.md). s depends on the prompt alone, so the stateless path reads the
same pairs.

Drafts are sampled from q, the head's distribution over its pruned vocabulary spread to the
full vocabulary with zeros elsewhere, after the request's sampling transforms (`HeadVocab`),
and verified by the token-level or block rule; at temperature 0 the draft is the head's argmax
(chosen, q None) and the greedy rule applies. A context of one token has no feature yet: the
draft is empty and the round decodes plainly.

Trees (`propose_tree`, EAGLE-2's top-k expansion, Li et al. 2406.16858): the tree grows level
by level in one head forward per level. Every node of the previous level that has children in
the shape is fed as a pair (its parent's predicted feature, its token) at the position of its
depth, attending to the true pairs and to its own ancestors' pairs only (a tree mask over the
head's cache), and its children are the top-ranked tokens of the head's distribution after
it: a shape node of rank r takes the r-th. At temperature 0 they are the head's best tokens,
chosen (`HeadVocab.ranked`, q None), and the rank-0 chain is `propose`'s argmax chain. At
temperature > 0 they are independent draws from the head's q after the node, with replacement
(SpecInfer's sampled siblings, q rows given: `tree_recursive`'s min(1, r/q) with the residual
updated between siblings): measured on Spec-Bench dev with the shipped head
(`benchmarks/tree_acceptance.py --sampled`, T = 1, depth 1), w sampled siblings accept more
than the head's top w tokens as point masses (0.214 vs 0.185 at w = 1, 0.357 vs 0.350 at
w = 4): a head far from p gains more from min(p, q) over its whole q than from p's mass on its
top tokens. The drafted pairs are rolled back at `commit`, as a chain's are.

The shape is the policy's. With `dynamic=True` only its size, depth and widest node are: the
nodes are EAGLE-2's own choice by path confidence (`_confident_tree`), chosen (q None) at every
temperature from the context alone, so exactness is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache

from verispec.checks import is_int
from verispec.drafts import ROOT, Draft, TreeDraft
from verispec.heads.eagle import EagleHead
from verispec.models.base import CausalLM
from verispec.proposers.head import HeadProposer
from verispec.randomness import Random
from verispec.sampling import SamplingParams, to_host
from verispec.transfers import to_device
from verispec.tree_shape import TreeShape, fill_levels, widest, with_q

# path tokens -> (head logits [N] after the path on the host, predicted feature [H] on the head's
# device, cache slots of the path's pairs)
Expanded = dict[tuple[int, ...], tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]]

PROMPT_WINDOW = 128  # the prompt positions the head reads at most (module docstring)


class EagleProposer(HeadProposer):
    """Drafts with `head` for `target` (a `CausalLM` with a `FeatureChannel`: the very object
    the engine drives).

    >>> proposer = EagleProposer(load_head("heads/eagle", target), target)
    >>> generate(target, proposer, prompt_ids, max_new_tokens=64, k=4)
    """

    def __init__(
        self, head: EagleHead, target: CausalLM, *, dynamic: bool = False, prompt_window: int | None = PROMPT_WINDOW
    ) -> None:
        super().__init__(head, target)
        whole = prompt_window is None
        if not whole and not is_int(prompt_window, least=1):
            raise ValueError(f"prompt_window must be an integer >= 1 or None (the whole prompt), got {prompt_window!r}")
        self.dynamic = dynamic
        self.prompt_window = prompt_window
        self._cache = head.new_cache()
        self._first = 0  # s: the position of the first true pair the head reads
        self._pairs = 0  # true pairs read so far: those of positions s.._pairs - 1 are cached
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None  # logits [N], predicted [H] of the last

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        super().begin(prompt_ids, sampling)
        self._cache = self.head.new_cache()
        last = len(prompt_ids) - 1  # the prompt's positions with a feature paired: 0..last - 1
        self._first = 0 if self.prompt_window is None else max(0, last - self.prompt_window)
        self._pairs = self._first
        self._last = None

    def commit(self, context: Sequence[int]) -> None:
        """Forget the pairs of predicted features; the true pairs all lie in the emitted prefix."""
        extra = self._cache.get_seq_length() - (self._pairs - self._first)
        if extra:
            self._cache.crop(-extra)

    def _state(self, context: Sequence[int]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """The head's cache brought to `context`'s true pairs, and the logits [N] and predicted
        feature [H] after the last of them."""
        return self._cache, *self._follow(context)

    def _follow(self, context: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Bring the cache to the true pairs of `context` (n >= 2 tokens): the head's logits
        [N] and predicted feature [H] after the last of them."""
        self.commit(context)
        self.check_target_follows(context)
        n = len(context)
        if self._pairs < n - 1:
            features = self.target.features(self.taps, self._pairs, n - 1)  # [new, F]
            self._last = self._pairs_forward(self._cache, context[self._pairs + 1 : n], features)
            self._pairs = n - 1
        return self._last

    def _recomputed(self, context: Sequence[int]) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
        """A fresh cache of `context`'s true pairs, from the target's stateless features, and
        the logits [N] and predicted feature [H] after the last."""
        features = self.target.score_features(list(context[:-1]), self.taps)  # [n - 1, F]
        cache = self.head.new_cache()
        return cache, *self._pairs_forward(cache, context[self._first + 1 :], features[self._first :])

    def _pairs_forward(
        self, cache: DynamicCache, tokens: Sequence[int], features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append pairs (features[j], tokens[j]) to the cache: the logits [N] and predicted
        feature [H] after the last (the output layer runs on that pair only), on the device."""
        ids = to_device([torch.tensor([list(tokens)], dtype=torch.long)], self.device)[0]  # [1, n], not waited for
        fused = self.head.fuse(features[None].to(self.head.dtype))  # [1, n, H]
        logits, predicted = self.head(ids, fused, cache, logits_to_keep=1)  # [1, 1, N], [1, n, H]
        return logits[0, -1], predicted[0, -1]

    def _draft(self, state: tuple[DynamicCache, torch.Tensor, torch.Tensor], k: int, rng: Random) -> Draft:
        """k tokens after the state's cache: draw from its logits [N], then feed (predicted [H],
        token) back for the next (greedy: on the device, `_greedy_chain`)."""
        cache, logits, predicted = state
        if self.sampling.greedy:
            return Draft(tuple(self._greedy_chain(cache, logits, predicted, k)))
        logits = to_host(logits)
        tokens, q_rows = [], []
        for i in range(k):
            token, q = self.vocab.draw(logits, self.sampling, rng, i)
            tokens.append(token)
            q_rows.append(q)
            if i < k - 1:
                ids = torch.tensor([[token]], device=self.device)  # [1, 1]
                step_logits, step_predicted = self.head(ids, predicted[None, None], cache)
                logits, predicted = to_host(step_logits[0, -1]), step_predicted[0, -1]
        return self.as_draft(tokens, q_rows)

    def _greedy_chain(self, cache: DynamicCache, logits: torch.Tensor, predicted: torch.Tensor, k: int) -> list[int]:
        """The head's argmax chain of k tokens after logits [N] and predicted [H], drafted on
        the device: each token (d2t of the argmax, as `HeadVocab.draw` takes it) is fed back
        without the host reading it, and the k ids are copied to the host once."""
        d2t = self.head.d2t  # [N] on the device
        tokens = [d2t[logits.float().argmax()]]  # each a 0-dim id on the device
        for _ in range(k - 1):
            step_logits, step_predicted = self.head(tokens[-1].view(1, 1), predicted[None, None], cache)
            predicted = step_predicted[0, -1]
            tokens.append(d2t[step_logits[0, -1].float().argmax()])
        return torch.stack(tokens).tolist()  # the round's one copy of the drafts

    def _tree(self, state: tuple[DynamicCache, torch.Tensor, torch.Tensor], shape: TreeShape, rng: Random) -> TreeDraft:
        """The tree after the true pairs in the state's cache (with the logits [N] and predicted
        [H] after the last of them): `shape` filled by EAGLE-2's top-k expansion, one head forward per level
        (sampled siblings at temperature > 0), or with `dynamic`, EAGLE-2's own choice of
        nodes within the shape's size."""
        cache, logits, predicted = state
        after: Expanded = {(): (to_host(logits), predicted, ())}
        if self.dynamic:
            return self._confident_tree(cache, after, shape)
        true_pairs, width = cache.get_seq_length(), widest(shape)
        q_after: dict[tuple[int, ...], torch.Tensor] = {}  # path tokens -> q [V] its children were drawn from

        def level(parents: list[tuple[int, ...]]) -> list[list[int]]:
            self._feed(cache, true_pairs, after, list(dict.fromkeys(path for path in parents if path not in after)))
            children = []
            for path in parents:
                tokens, q = self.vocab.siblings(after[path][0], self.sampling, rng, width, len(path))
                if q is not None:
                    q_after[path] = q
                children.append(tokens)
            return children

        tree = fill_levels(shape, level)
        return tree if self.sampling.greedy else with_q(tree, q_after.__getitem__)

    def _confident_tree(self, cache: DynamicCache, after: Expanded, shape: TreeShape) -> TreeDraft:
        """EAGLE-2's dynamic tree (2406.16858, Sec. 4): each level, the w most confident nodes
        of the last level (confidence: the product of the head's probabilities along the path,
        its softmax over the logits at temperature 1) are expanded into their top w tokens (w:
        the shape's widest node, as `ranked` picks them); after `shape.depth` levels the
        len(shape) most confident nodes are kept. A node is never more confident than its parent,
        so the kept nodes are closed under prefixes (ties: the earlier-made node first)."""
        true_pairs, width = cache.get_seq_length(), widest(shape)
        confidence: dict[tuple[int, ...], float] = {(): 0.0}  # path -> log confidence
        made: list[tuple[int, ...]] = []
        frontier: list[tuple[int, ...]] = [()]
        for _ in range(shape.depth):
            self._feed(cache, true_pairs, after, [path for path in frontier if path not in after])
            level = []
            for parent in frontier:
                log_probs = torch.log_softmax(after[parent][0].double(), dim=-1)  # [N]
                for token in self.vocab.ranked(after[parent][0], self.sampling, width):
                    path = (*parent, token)
                    head_index = int(torch.searchsorted(self.vocab.d2t, token))  # d2t ascends
                    confidence[path] = confidence[parent] + float(log_probs[head_index])
                    level.append(path)
            made += level
            frontier = sorted(level, key=lambda path: -confidence[path])[:width]
        kept = sorted(sorted(range(len(made)), key=lambda i: -confidence[made[i]])[: len(shape)])
        node_of = {(): ROOT} | {made[i]: n for n, i in enumerate(kept)}
        return TreeDraft(tuple(made[i][-1] for i in kept), tuple(node_of[made[i][:-1]] for i in kept))

    def _feed(self, cache: DynamicCache, true_pairs: int, after: Expanded, paths: list[tuple[int, ...]]) -> None:
        """Append the pairs (parent's predicted feature, last token) of the nodes at `paths`
        (their parents in `after`) in one head forward, each at the position of its depth and
        attending to the true pairs, its ancestors' pairs and itself only; record in `after`."""
        if not paths:
            return
        start = cache.get_seq_length()
        allowed = torch.zeros(len(paths), start + len(paths), dtype=torch.bool)  # [T, P + T]
        allowed[:, :true_pairs] = True
        for i, path in enumerate(paths):
            allowed[i, list(after[path[:-1]][2])] = True
            allowed[i, start + i] = True
        ids = torch.tensor([[path[-1] for path in paths]], device=self.device)  # [1, T]
        hidden = torch.stack([after[path[:-1]][1] for path in paths])[None]  # [1, T, H]
        positions = torch.tensor([[true_pairs + len(path) - 1 for path in paths]], device=self.device)  # [1, T]
        logits, predicted = self.head(ids, hidden, cache, positions=positions, allowed=allowed.to(self.device))
        logits = to_host(logits[0])  # [T, N]
        for i, path in enumerate(paths):
            after[path] = logits[i], predicted[0, i], (*after[path[:-1]][2], start + i)
