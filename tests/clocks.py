"""A fake clock for tests that time things: exact seconds instead of a loaded machine's."""

from __future__ import annotations


class FakeClock:
    """Reads `now`, which the fakes being timed advance by what they cost."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
