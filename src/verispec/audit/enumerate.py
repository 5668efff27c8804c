"""Walk every branch of a computation's random choices.

`outcomes(run)` calls `run(rng)` once per path through its `bernoulli`/`categorical` calls and
yields (probability of the path, result). Zero-probability branches are skipped. Paths are
replayed depth-first from a script of choices, so `run` must be deterministic given its rng
(the engine is: randomness enters only through the injected rng).

Keyed races (`race(position, probs, choice)`) share their noise per key, so their outcomes are
coupled: the first race at a key branches on each id i with probs[i]; a later race at the
same key with the same probabilities repeats the outcome; one with other probabilities branches
on j with the exact conditional law given the key's latest race (`verispec.audit.coupling`:
rational in both rows). That is the engine's law whenever a key's earlier races no longer
steer the run, as for a chain's discarded drafts (a position drafted again after a rejection
before it) and for every key of a rule that emits the target's keyed samples; a key whose
races steer the run through three or more distinct rows is out of this model's reach.

    >>> sorted(outcomes(lambda rng: rng.bernoulli(0.25)))
    [(0.25, True), (0.75, False)]
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from fractions import Fraction
from typing import Any, TypeVar

import torch

from verispec.audit.coupling import conditional

T = TypeVar("T")


class ScriptedRandom:
    """A `Random` that follows a script of branch choices and extends it at new calls."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = script  # entries: [chosen index, [(value, probability), ...]]
        self.position = 0
        self.probability = 1.0
        self.races: dict[tuple, tuple[tuple[float, ...], int]] = {}  # key -> (row, outcome), the latest

    def seeded(self, seed: int) -> Seeded:
        """This script as the `Random` of a request with `seed`, for requests that share one
        enumeration (a batch): their races are keyed by (seed, position, choice), so requests
        with distinct seeds race on independent noise and requests with one seed on the same."""
        return Seeded(self, seed)

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.keyed_race((None, position, choice), probs)

    def keyed_race(self, key: tuple, probs: torch.Tensor) -> int:
        row = tuple(probs.tolist())
        if key not in self.races:
            outcome = self._choose(list(enumerate(row)))
        elif self.races[key][0] == row:
            return self.races[key][1]
        else:
            earlier, picked = self.races[key]
            outcome = self._choose(list(enumerate(_conditional_law(earlier, row, picked))))
        self.races[key] = (row, outcome)
        return outcome

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.categorical(probs)

    def bernoulli(self, prob: float) -> bool:
        return self._choose([(True, prob), (False, 1.0 - prob)])

    def categorical(self, probs: torch.Tensor) -> int:
        return self._choose(list(enumerate(probs.tolist())))

    def _choose(self, options: list[tuple[Any, float]]) -> Any:
        options = [(value, p) for value, p in options if p > 0]
        if self.position == len(self.script):
            self.script.append([0, options])
        entry = self.script[self.position]
        if [v for v, _ in entry[1]] != [v for v, _ in options]:
            raise RuntimeError("the computation is not deterministic given its random choices")
        value, p = entry[1][entry[0]]
        self.probability *= p
        self.position += 1
        return value


class Seeded:
    """A `ScriptedRandom` seen by the request with `seed` (`ScriptedRandom.seeded`)."""

    def __init__(self, script: ScriptedRandom, seed: int) -> None:
        self.script, self.seed = script, seed

    def bernoulli(self, prob: float) -> bool:
        return self.script.bernoulli(prob)

    def categorical(self, probs: torch.Tensor) -> int:
        return self.script.categorical(probs)

    def race(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.script.keyed_race((self.seed, position, choice), probs)

    def draw(self, position: int, probs: torch.Tensor, choice: int = 0) -> int:
        return self.script.categorical(probs)


@functools.lru_cache(maxsize=65536)
def _conditional_law(earlier: tuple[float, ...], row: tuple[float, ...], picked: int) -> tuple[float, ...]:
    """P(the race under `row` picks j | the race under `earlier` picked `picked`), as floats;
    every replay of an enumeration asks for the same few laws again, so they are kept."""
    law = conditional([Fraction(x) for x in earlier], [Fraction(x) for x in row], picked)
    return tuple(float(x) for x in law)


def outcomes(run: Callable[[ScriptedRandom], T]) -> Iterator[tuple[float, T]]:
    script: list[list[Any]] = []
    while True:
        rng = ScriptedRandom(script)
        result = run(rng)
        if rng.position != len(script):
            raise RuntimeError("the computation made fewer random choices on replay")
        yield rng.probability, result
        while script and script[-1][0] + 1 >= len(script[-1][1]):
            script.pop()
        if not script:
            return
        script[-1][0] += 1
