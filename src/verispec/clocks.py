"""A reproducible clock for runs that must replay exactly (the exhaustive audit, tests).

A policy that learns from round timings (`AutoK`) chooses k from seconds read on the engine's
clock; on a real clock two replays of one request may then choose differently.
"""

from __future__ import annotations


class TickClock:
    """Advances by `tick` seconds at every read, so every interval timed by two consecutive
    reads lasts one tick, whatever ran between them: every replay of a request, and the engine
    and the reference decoder (which read it in different places), record the same round
    timings.

        >>> clock = TickClock(0.5)
        >>> start = clock(); clock() - start
        0.5
    """

    def __init__(self, tick: float = 0.001) -> None:
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now
