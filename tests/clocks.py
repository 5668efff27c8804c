"""Fake clocks for tests that time things: exact seconds instead of a loaded machine's."""

from __future__ import annotations


class FakeClock:
    """Reads `now`, which the fakes being timed advance by what they cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TickClock:
    """Advances by `tick` seconds at every read, so every interval timed by two consecutive
    reads lasts one tick, whatever ran between them: the engine and the reference decoder,
    which read it in different places, then record the same round timings."""

    def __init__(self, tick: float = 0.001) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now
