"""Walk every branch of a computation's random choices.

`outcomes(run)` calls `run(rng)` once per path through its `bernoulli`/`categorical` calls and
yields (probability of the path, result). Zero-probability branches are skipped. Paths are
replayed depth-first from a script of choices, so `run` must be deterministic given its rng
(the engine is: randomness enters only through the injected rng).

    >>> sorted(outcomes(lambda rng: rng.bernoulli(0.25)))
    [(0.25, True), (0.75, False)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch

T = TypeVar("T")


class ScriptedRandom:
    """A `Random` that follows a script of branch choices and extends it at new calls."""

    def __init__(self, script: list[list[Any]]) -> None:
        self.script = script  # entries: [chosen index, [(value, probability), ...]]
        self.position = 0
        self.probability = 1.0

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
