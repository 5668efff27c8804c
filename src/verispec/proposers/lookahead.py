"""Lookahead decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", 2402.02057): Jacobi iterations on a window of guessed tokens feed a pool
of n-grams, and the pool's continuations of the pending token are verified, with the window, as
a token tree of chosen candidates. No draft model: the target's own rows at the drafted
positions (`observe`) are the only source.

Positions are absolute: position p is index p of prompt + output, so with a context of c tokens
the pending token sits at c - 1 and the first drafted token at c.

State.
- window: W guesses for the positions c .. c + W - 1. A position entering the window is first
  guessed as the token W positions back (context[p - W], context[0] when p < W): a random-free
  copy of the recent text, so the first window is the prompt's last W tokens.
- levels: the last N - 1 observations, each the chain the round fed to the target (from the
  pending token at c - 1) and the target's argmax after each of its tokens.
- pool: first token -> up to G distinct (N - 1)-token continuations, most recently collected first.

Jacobi update (`observe`, every round, before the verdict). The observed chain is the draft's
first-child path (rank 0 at every depth): in a tree the window itself (it is always rank 0), in
a chain the whole draft. The argmax of the row after its token at p (the pending token
included) is the new guess for p + 1, kept while p + 1 lies in the window. These argmaxes are a
deterministic function of the context and the draft, never of a random draw.

N-gram collection, along the diagonals of successive levels (the paper's 2D window): after an
observation, for each of its guesses x_N at position e, the n-gram x_1..x_N at positions
e - N + 1 .. e is kept when N - 1 successive observations, the latest last, fed x_j at its
position and guessed x_{j+1} right after it. So each token of an n-gram is the target's argmax
after the one before it, each in its own round, as a Jacobi trajectory gives them. Worked
example, N = 3: round 1 feeds the pending 7 at position 9 and the guess 4 at 10, and the
target's argmaxes are 5 at 10 and 6 at 11; the round emits 5. Round 2 feeds the pending 5 at
10 and the updated guess 6 at 11, and its argmaxes are 8 at 11 and 9 at 12. The diagonals are
7 (fed by round 1 at 9), 5 (round 1's guess at 10, fed by round 2), 8 (round 2's guess at 11),
and 4, 6, 9: the pool offers 5 8 after a pending 7, and 6 9 after a 4.

Window shift (`commit`): the window follows the emitted prefix: emitted positions drop out (the
guesses there are confirmed or refuted), and the positions entering at the end get their first
guess. The levels keep their absolute positions, so diagonals cross round boundaries.

Drafts, chosen (q None; point masses, greedy at temperature 0; no randomness):
- `propose_tree`: a trie of the window (rank 0, so it is scored, and so iterated, every round)
  and the pool's continuations of the pending token (most recent first), filled into the shape;
  siblings are distinct tokens (the without-replacement rule needs them to be), deeper nodes
  follow their own branch.
- `propose(k)`: one chain: the pool's most recent continuation of the pending token when it
  has one, else the window (its first k tokens).
`propose_stateless` / `propose_tree_stateless` recompute the same draft from the context and the
log of observations alone: the window as each position's latest guess (or its first one), the
pool by collecting every observation's n-grams again and ranking them by recency.

What it costs: a tree of the window plus G continuations scores up to W + G (N - 1) positions
per forward for one round's accepted tokens; it pays only where v(n) is flat.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from verispec.checks import is_int
from verispec.drafts import ROOT, Draft, TreeDraft
from verispec.proposers.kind import ProposerKind
from verispec.proposers.options import integer
from verispec.randomness import Random
from verispec.sampling import SamplingParams
from verispec.tree_shape import TreeShape, fill

if TYPE_CHECKING:
    from verispec.models.loading.load import LoadedModel
    from verispec.models.table_pair import Tables


WINDOW, NGRAM, POOL = 5, 4, 5  # the defaults of `lookahead` (W, N, G)


@dataclass(frozen=True)
class Observation:
    """One round's Jacobi step: `fed[i]` the token fed at position start + i (fed[0] the pending
    token), `guessed[i]` the target's argmax after it, the guess for position start + i + 1."""

    start: int
    fed: tuple[int, ...]
    guessed: tuple[int, ...]

    def fed_at(self, position: int) -> int | None:
        i = position - self.start
        return self.fed[i] if 0 <= i < len(self.fed) else None

    def guessed_at(self, position: int) -> int | None:
        i = position - self.start - 1
        return self.guessed[i] if 0 <= i < len(self.guessed) else None


def diagonal_ngrams(levels: Sequence[Observation], n: int) -> list[tuple[int, ...]]:
    """The n-grams along the diagonals that end in the last of `levels` (successive
    observations, oldest first), by end position: x_1..x_n at positions p..p + n - 1 where the
    j-th of the last n - 1 observations fed x_j at p + j - 1 and guessed x_{j+1} after it.

    >>> first, second = Observation(9, (7, 4), (5, 6)), Observation(10, (5, 6), (8, 9))
    >>> diagonal_ngrams([first, second], 3)
    [(7, 5, 8), (4, 6, 9)]
    """
    if len(levels) < n - 1:
        return []
    chain = list(levels)[len(levels) - (n - 1) :]
    grams = []
    for i in range(len(chain[-1].guessed)):
        p = chain[-1].start + 1 + i - (n - 1)
        tokens = [chain[0].fed_at(p)]
        for j, level in enumerate(chain):
            if tokens[j] is None or level.fed_at(p + j) != tokens[j]:
                break
            tokens.append(level.guessed_at(p + j + 1))
        else:
            grams.append(tuple(tokens))
    return grams


def first_child_path(draft: Draft | TreeDraft) -> list[int]:
    """The nodes of the draft's rank-0 path: a tree's first child at every depth (a chain's
    every token)."""
    path, children = [], draft.children(ROOT)
    while children:
        path.append(children[0])
        children = draft.children(children[0])
    return path


class LookaheadProposer:
    """Lookahead decoding's proposer: `window` W Jacobi guesses, n-grams of `ngram` N tokens,
    a pool of `pool` G continuations per first token (G = 0: Jacobi decoding alone)."""

    def __init__(self, window: int = WINDOW, ngram: int = NGRAM, pool: int = POOL) -> None:
        check_options(window, ngram, pool)
        self.window, self.ngram, self.pool = window, ngram, pool
        self._start = 0  # the window's first position (the context's length)
        self._guesses: list[int] = []  # the window: guesses for positions _start .. _start + W - 1
        self._levels: deque[Observation] = deque(maxlen=ngram - 1)
        self._pool: dict[int, list[tuple[int, ...]]] = {}
        # every observation of the request (a few ints per round), for the stateless drafts
        self._log: list[Observation] = []

    def begin(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> None:
        self._start, self._guesses = len(prompt_ids), []
        self._levels.clear()
        self._pool = {}
        self._log = []
        self.commit(prompt_ids)

    def commit(self, context: Sequence[int]) -> None:
        """Shift the window to the emitted prefix: drop the emitted positions, guess the new ones."""
        kept = self._guesses[len(context) - self._start :]
        entering = range(len(context) + len(kept), len(context) + self.window)
        self._guesses = kept + [self._first_guess(context, p) for p in entering]
        self._start = len(context)

    def observe(self, context: Sequence[int], draft: Draft | TreeDraft, logits: torch.Tensor) -> None:
        """One Jacobi step from the target's logits[n + 1, V] for [pending, *draft.tokens]."""
        path = first_child_path(draft)
        guessed = logits[[0, *(node + 1 for node in path)]].argmax(dim=-1).tolist()
        fed = (int(context[-1]), *(draft.tokens[node] for node in path))
        observation = Observation(len(context) - 1, fed, tuple(guessed))
        self._log.append(observation)
        self.commit(context)  # the reference decoder observes without committing
        for position, token in enumerate(guessed, start=len(context)):
            if position < self._start + self.window:
                self._guesses[position - self._start] = token
        self._levels.append(observation)
        for gram in diagonal_ngrams(self._levels, self.ngram):
            self._collect(gram)

    @property
    def guesses(self) -> tuple[int, ...]:
        """The window: the guesses for the positions from the context's length on."""
        return tuple(self._guesses)

    def continuations(self, token: int) -> list[tuple[int, ...]]:
        """The pool's continuations of `token`, most recently collected first."""
        return list(self._pool.get(token, []))

    def propose(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        return _chain(self._guesses, self.continuations(context[-1]), k)

    def propose_tree(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        return _trie(shape, [tuple(self._guesses), *self.continuations(context[-1])])

    def propose_stateless(self, context: Sequence[int], k: int, rng: Random) -> Draft:
        """The same chain from the context and the observation log alone."""
        return _chain(self._recomputed_guesses(context), self._recollected(context[-1]), k)

    def propose_tree_stateless(self, context: Sequence[int], shape: TreeShape, rng: Random) -> TreeDraft:
        """The same tree from the context and the observation log alone."""
        return _trie(shape, [self._recomputed_guesses(context), *self._recollected(context[-1])])

    def _collect(self, gram: tuple[int, ...]) -> None:
        """Put the n-gram's continuation first among its first token's (at most G kept)."""
        if not self.pool:
            return
        kept = self._pool.setdefault(gram[0], [])
        if gram[1:] in kept:
            kept.remove(gram[1:])
        kept.insert(0, gram[1:])
        del kept[self.pool :]

    def _first_guess(self, context: Sequence[int], position: int) -> int:
        return int(context[max(position - self.window, 0)])

    def _recomputed_guesses(self, context: Sequence[int]) -> tuple[int, ...]:
        """Each window position's latest guess from an observation that had it in its window,
        else its first guess."""
        guesses = {}
        for observation in self._log:
            first = observation.start + 1  # the window's first position in that round
            for position in range(first, first + min(len(observation.guessed), self.window)):
                guesses[position] = observation.guessed_at(position)
        window = range(len(context), len(context) + self.window)
        return tuple(guesses.get(p, self._first_guess(context, p)) for p in window)

    def _recollected(self, token: int) -> list[tuple[int, ...]]:
        """The pool's continuations of `token`, recollected from every observation: the G
        distinct ones collected most recently, most recent first."""
        if not self.pool:
            return []
        collected = [
            gram
            for t in range(len(self._log))
            for gram in diagonal_ngrams(self._log[max(t - self.ngram + 2, 0) : t + 1], self.ngram)
        ]
        last_seen = {gram: i for i, gram in enumerate(collected)}  # a later collection overwrites
        latest = sorted((gram for gram in last_seen if gram[0] == token), key=last_seen.__getitem__, reverse=True)
        return [gram[1:] for gram in latest[: self.pool]]


def _chain(guesses: Sequence[int], continuations: Sequence[tuple[int, ...]], k: int) -> Draft:
    """`propose`'s chain: the most recent continuation when there is one, else the window."""
    best = continuations[0] if continuations else guesses
    return Draft(tuple(best[:k]))


def _trie(shape: TreeShape, sequences: Sequence[Sequence[int]]) -> TreeDraft:
    """`shape` filled from the trie of `sequences` (each continuing the pending token): after a
    path, the distinct next tokens of the sequences that begin with it, in the order of the
    first sequence that has each."""

    def candidates(path: tuple[int, ...]) -> list[int]:
        depth = len(path)
        return list(dict.fromkeys(s[depth] for s in sequences if len(s) > depth and tuple(s[:depth]) == path))

    return fill(shape, candidates)


OPTIONS = {"W": "window", "N": "ngram", "G": "pool"}


def check_options(window: int, ngram: int, pool: int) -> None:
    """Each option an integer with its lower bound: W >= 1, N >= 2, G >= 0."""
    for name, value, least in (("window W", window, 1), ("n-gram size N", ngram, 2), ("pool width G", pool, 0)):
        if not is_int(value, least=least):
            raise ValueError(f"lookahead's {name} must be an integer >= {least}, got {value!r}")


@dataclass(frozen=True)
class LookaheadSpec:
    """`lookahead[:W=5:N=4:G=5]`: window W, n-gram size N, pool width G."""

    window: int = WINDOW
    ngram: int = NGRAM
    pool: int = POOL

    def __post_init__(self) -> None:
        check_options(self.window, self.ngram, self.pool)


def parse(argument: str) -> LookaheadSpec:
    """The options of `lookahead:W=5:N=4:G=5` (any of the three, in any order).

    >>> parse("N=3:W=8")
    LookaheadSpec(window=8, ngram=3, pool=5)
    """
    options: dict[str, int] = {}
    for part in argument.split(":") if argument else []:
        key, equals, value = part.partition("=")
        if not equals or key not in OPTIONS:
            raise ValueError(
                f"lookahead options are W=window, N=n-gram size and G=pool width joined by ':' "
                f"(e.g. lookahead:W=5:N=4:G=5), got {part!r} in 'lookahead:{argument}'"
            )
        if OPTIONS[key] in options:
            raise ValueError(f"lookahead option {key} is given twice in 'lookahead:{argument}'")
        options[OPTIONS[key]] = integer(value, f"lookahead option {key} needs an integer")
    return LookaheadSpec(**options)


def build(spec: LookaheadSpec, target: LoadedModel, corpus: Sequence[Sequence[int]]) -> LookaheadProposer:
    return LookaheadProposer(spec.window, spec.ngram, spec.pool)


def audit_fixture(tables: Tables) -> LookaheadProposer:
    # Bigrams, so the pool offers continuations from the second round of a 3-4 token request.
    return LookaheadProposer(window=3, ngram=2, pool=2)


KIND = ProposerKind(
    "lookahead", "lookahead[:W=5:N=4:G=5]", "chosen", build,
    "lookahead decoding: Jacobi guesses on a window of W tokens feed a pool of N-grams (G per first token)",
    audit=audit_fixture, example="lookahead", trees=True, parse=parse,
)
