"""Suffix index: draft the most frequent continuation of the context's longest recurring suffix
(SuffixDecoding, Oliaro et al. 2411.04975), over the request's own tokens and a corpus.

Counts. For a pattern s and a token x, N(s, x) is the number of places where s is followed by
x in the indexed text: the request's prompt and output, plus every corpus sequence (token-id
sequences given at construction, and with `remember_outputs` each earlier request's output).
Patterns never span two sequences.

Drafting, one token at a time on seq = context + drafted so far:
1. s = the longest suffix of seq, 1 <= |s| <= max_match, that has at least one continuation;
   none: stop.
2. x = argmax_x N(s, x); ties go to the continuation seen most recently (later in indexing
   order: corpus in the order given, then the request).
3. Stop before x if N(s, x) < min_count or if the path probability, the product of
   N(s, x) / sum_y N(s, y) over the drafted tokens so far and x, falls below min_prob
   (SuffixDecoding's path score). Else append x.

Worked example: context 5 6 7 5 6 8 5 6, max_match 3. The suffix 5 6 is followed by 7 once and
by 8 once; the tie goes to 8 (more recent), path probability 1/2. Then 5 6 8 is followed by 5
(1/1), then 6 8 5 by 6, then 8 5 6 has no continuation and 5 6 again gives 8: 8 5 6 8 ...

Index. A forward trie of n-grams up to depth max_match + 1 with an occurrence count and a
recency stamp per node: the child x of the node for s counts N(s, x). Appending a token walks
the max_match + 1 nodes for the suffixes ending before it, so `commit` costs O(max_match) per
emitted token, never a rescan. A bounded trie rather than a suffix automaton: its counts stay
exact online with one increment per node, where an automaton's occurrence counts (endpos sizes)
would change along whole suffix-link chains; matches longer than max_match add little to a
draft. The corpus trie persists across requests; the request trie is rebuilt by `begin`. Memory is O(max_match) nodes per indexed token: keep max_match modest for
a large corpus.

Trees (`propose_tree`, several continuations, SuffixDecoding's speculation tree): after a
drafted path, the candidates are the continuations of the longest suffix of context + path,
ranked as in step 2 (most frequent, ties to the most recent), each kept while it passes the
test of step 3 with the path probability of its own path; a shape node of rank r takes the
r-th. Rank 0 at every level is step 2's choice: `propose(k)` is the tree of the chain shape
of k nodes. In the worked example a tree of two first-level nodes offers 8 (rank 0) and 7 (rank 1,
path probability 1/2).

The drafts are chosen, not sampled (q = None): they are verified as point masses and consume
no randomness. `propose_stateless` recounts everything by brute force over the raw sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from verispec.checks import is_int, is_number
from verispec.drafts import Draft, TreeDraft
from verispec.proposers.kind import ProposerKind
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape, fill

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


# token -> (N(s, token), indexing position of its most recent occurrence after s)
Counts = dict[int, tuple[int, int]]


class _Node:
    __slots__ = ("children", "count", "stamp")

    def __init__(self) -> None:
        self.children: dict[int, _Node] = {}
        self.count = 0  # occurrences of this node's n-gram
        self.stamp = -1  # indexing position of its most recent occurrence's last token


class SuffixIndex:
    def __init__(
        self,
        corpus: Iterable[Sequence[int]] = (),
        *,
        max_match: int = 8,
        min_count: int = 1,
        min_prob: float = 0.1,
        remember_outputs: bool = False,
    ) -> None:
        if not is_int(max_match, least=1):
            raise ValueError(f"max_match must be an integer >= 1, got {max_match!r}")
        if not is_int(min_count, least=1):
            raise ValueError(f"min_count must be an integer >= 1, got {min_count!r}")
        if not is_number(min_prob, 0, 1):
            raise ValueError(f"min_prob must lie in [0, 1], got {min_prob!r}")
        self.max_match = max_match
        self.min_count = min_count
        self.min_prob = float(min_prob)
        self.remember_outputs = remember_outputs
        self.corpus: list[tuple[int, ...]] = []  # in indexing order
        self._clock = 0  # indexing positions, increasing across corpus and requests
        self._corpus_root = _Node()
        self._request_root = _Node()
        self._request_suffixes: list[_Node] = [self._request_root]
        self._corpus_suffixes: list[_Node] = [self._corpus_root]
        self._indexed = 0
        self._prompt_length = 0
        self._context: list[int] = []
        for sequence in corpus:
            self.add_to_corpus(sequence)

    def add_to_corpus(self, sequence: Sequence[int]) -> None:
        """Index a token-id sequence for all later requests (not the one in progress)."""
        tokens = tuple(int(t) for t in sequence)
        if any(t < 0 for t in tokens):
            raise ValueError(f"corpus token ids must be >= 0, got {min(tokens)}")
        self.corpus.append(tokens)
        suffixes = [self._corpus_root]
        for token in tokens:
            suffixes = self._append(suffixes, token)

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        if self.remember_outputs and len(self._context) > self._prompt_length:
            self.add_to_corpus(self._context[self._prompt_length :])
        self._request_root = _Node()
        self._request_suffixes = [self._request_root]
        self._corpus_suffixes = [self._corpus_root]
        self._indexed = 0
        self._prompt_length = len(prompt_ids)
        self._context = []
        self.commit(prompt_ids)

    def commit(self, context: Sequence[int]) -> None:
        for token in context[self._indexed :]:
            token = int(token)
            self._request_suffixes = self._append(self._request_suffixes, token)
            self._corpus_suffixes = _advance(self._corpus_suffixes, token, self._corpus_root, self.max_match)
            self._context.append(token)
        self._indexed = len(context)

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        return Draft(self.propose_tree(context, TreeShape.chain(k), rng).tokens)

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The same draft by brute force: rescan every sequence for each drafted token."""
        return Draft(self.propose_tree_stateless(context, TreeShape.chain(k), rng).tokens)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        suffixes = {(): (self._request_suffixes, self._corpus_suffixes)}  # path -> its suffix nodes

        def continuations(path: tuple[int, ...]) -> Counts:
            if path not in suffixes:
                request, corpus = suffixes[path[:-1]]
                suffixes[path] = (
                    _advance(request, path[-1], self._request_root, self.max_match),
                    _advance(corpus, path[-1], self._corpus_root, self.max_match),
                )
            return self._continuations(*suffixes[path])

        return self._tree(shape, continuations)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        """The same tree by brute force: rescan every sequence for each node's path."""
        texts = [*self.corpus, tuple(int(t) for t in context)]
        return self._tree(shape, lambda path: _recounted(texts, list(path), self.max_match))

    def _tree(self, shape: TreeShape, continuations: Callable[[tuple[int, ...]], Counts]) -> TreeDraft:
        """`shape` filled with the ranked continuations after each path (`continuations(path)`
        counts what follows the longest matching suffix of the context plus the path): steps 2
        and 3 of the walk, each candidate tested with the path probability of its own path (a
        chain shape is the greedy walk itself)."""
        path_prob: dict[tuple[int, ...], float] = {(): 1.0}

        def candidates(path: tuple[int, ...]) -> list[int]:
            counts = continuations(path)
            total = sum(c for c, _ in counts.values())
            ranked = []
            for token in sorted(counts, key=counts.__getitem__, reverse=True):
                count = counts[token][0]
                prob = path_prob[path] * (count / total)
                if count < self.min_count or prob < self.min_prob:
                    break  # every later candidate has no larger count, so no larger probability
                path_prob[(*path, token)] = prob
                ranked.append(token)
            return ranked

        return fill(shape, candidates)

    def _continuations(self, request: list[_Node], corpus: list[_Node]) -> Counts:
        """token -> (N(s, token), stamp) for the longest suffix s with any continuation."""
        for m in range(min(self.max_match, max(len(request), len(corpus)) - 1), 0, -1):
            counts: Counts = {}
            for suffixes in (corpus, request):
                if m < len(suffixes):
                    for token, child in suffixes[m].children.items():
                        count = counts.get(token, (0, 0))[0]
                        counts[token] = (count + child.count, child.stamp)
            if counts:
                return counts
        return {}

    def _append(self, suffixes: list[_Node], token: int) -> list[_Node]:
        """Count `token` after every suffix node (lengths 0..max_match); the new suffix nodes."""
        grown = [suffixes[0]]
        for node in suffixes:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node()
            child.count += 1
            child.stamp = self._clock
            grown.append(child)
        self._clock += 1
        return grown[: self.max_match + 1]


def _recounted(texts: Sequence[Sequence[int]], drafted: list[int], max_match: int) -> Counts:
    """Counts by brute force: what follows the longest suffix (up to max_match tokens) of
    texts[-1] + drafted anywhere in `texts`, with a stamp that grows along the texts."""
    seq = [*texts[-1], *drafted]
    for m in range(min(max_match, len(seq)), 0, -1):
        counts: Counts = {}
        pattern, stamp = seq[-m:], 0
        for text in texts:
            for t in range(len(text)):
                if t >= m and list(text[t - m : t]) == pattern:
                    counts[text[t]] = (counts.get(text[t], (0, 0))[0] + 1, stamp)
                stamp += 1
        if counts:
            return counts
    return {}


def _advance(suffixes: list[_Node], token: int, root: _Node, max_match: int) -> list[_Node]:
    """The suffix nodes (lengths 0..max_match) after `token`, without counting it: a suffix
    absent from the trie ends the list, since every longer one is absent too."""
    grown = [root]
    for node in suffixes[:max_match]:
        child = node.children.get(token)
        if child is None:
            break
        grown.append(child)
    return grown


def build(options: None, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> SuffixIndex:
    """`suffix`: the index over `corpus` (token-id sequences, e.g. encoded prompts)."""
    return SuffixIndex(corpus)


def audit_fixture(tables: Tables) -> SuffixIndex:
    # A corpus (the vocabulary descending, twice) makes its drafts differ from prompt
    # lookup's; min_prob 0 drafts whenever anything matched.
    return SuffixIndex([[*range(tables.target.vocab_size - 1, -1, -1)] * 2], min_prob=0)


KIND = ProposerKind(
    "suffix", "suffix", "chosen", build,
    "suffix index over the request and a corpus; drafts the most frequent continuation",
    audit=audit_fixture, example="suffix", trees=True,
    draft_cost=0.0,  # an index look-up, as lookup's
)
