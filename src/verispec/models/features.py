"""`FeatureStore`: per-tap feature rows that follow a model's cache, for `FeatureChannel`s.

A model appends the rows of every forward (`append`) and moves the end back when its cache
rolls back (`truncate`), exactly like its KV cache, so the rows always belong to the tokens
processed. Rows live in buffers [capacity, H] that double when full (amortised O(1) per row).
Taps recorded while a sequence is under way start at its current length: earlier positions
have no rows, and reading them is refused rather than answered with zeros. After a scored
token tree keeps one root path, `move` copies the kept nodes' rows to the path's positions
(the same moves as the KV cache, `ScoredTree.moves`), so the rows are those of the kept path.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.models.base import Tap


class FeatureStore:
    """Rows of width `hidden_size` (H) per recorded tap."""

    def __init__(self, hidden_size: int) -> None:
        self.hidden_size = hidden_size
        self._rows: dict[Tap, torch.Tensor] = {}  # tap -> float32 [capacity, H]
        self._first: dict[Tap, int] = {}  # tap -> first position held
        self.length = 0

    @property
    def taps(self) -> tuple[Tap, ...]:
        return tuple(self._first)

    def check_recorded(self, taps: Sequence[Tap]) -> None:
        """Refuse a request for a tap that is not recorded."""
        missing = [tap for tap in taps if tap not in self._first]
        if missing:
            raise ValueError(f"feature tap {missing[0]!r} is not recorded; call record_features first")

    def add(self, tap: Tap, length: int) -> None:
        """Record `tap` from position `length` on (the model's current length)."""
        if not self._first:
            self.length = length  # nothing was stored so far: catch up with the model
        if tap not in self._first:
            self._first[tap] = self.length

    def reset(self) -> None:
        self._rows.clear()
        self._first = dict.fromkeys(self._first, 0)
        self.length = 0

    def copy_from(self, source: FeatureStore) -> None:
        """Hold what `source` holds (recording the same taps), as after the same forwards."""
        if self.taps != source.taps:
            raise ValueError(f"copying features recorded at {source.taps} into a store recording {self.taps}")
        self._first = dict(source._first)
        self._rows = {tap: rows[: source.length - source._first[tap]].clone() for tap, rows in source._rows.items()}
        self.length = source.length

    def append(self, rows: dict[Tap, torch.Tensor]) -> None:
        """Rows of the next n positions for every recorded tap: rows[tap] [n, H]."""
        n = None
        for tap in self._first:
            new = rows[tap].detach().float()  # [n, H]
            n = new.shape[0]
            buffer = self._rows.get(tap)
            used = self.length - self._first[tap]
            if buffer is None or used + n > buffer.shape[0]:
                grown = new.new_empty(2 * (used + n), new.shape[-1])
                if used:
                    grown[:used] = buffer[:used]
                self._rows[tap] = buffer = grown
            buffer[used : used + n] = new
        if n is not None:
            self.length += n

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (a cache rollback)."""
        self.length = min(self.length, length)
        for tap, first in self._first.items():
            self._first[tap] = min(first, length)

    def move(self, sources: Sequence[int], destinations: Sequence[int]) -> None:
        """Copy the rows of positions `sources` to positions `destinations` (held positions,
        as `ScoredTree.moves` lists them); rows of other positions are untouched."""
        if not sources:
            return
        for tap, first in self._first.items():
            rows = self._rows.get(tap)
            if rows is not None:
                rows[torch.tensor(destinations) - first] = rows[torch.tensor(sources) - first]

    def read(self, taps: Sequence[Tap], start: int, end: int) -> torch.Tensor:
        """float32 [end - start, len(taps) * H]: positions start..end-1, taps concatenated."""
        if not 0 <= start <= end <= self.length:
            raise ValueError(f"features of positions {start}..{end - 1} asked, {self.length} positions processed")
        parts = []
        for tap in taps:
            if tap not in self._first:
                raise ValueError(f"feature tap {tap!r} is not recorded; call record_features([{tap!r}]) before prefill")
            first = self._first[tap]
            if start < first:
                raise ValueError(
                    f"feature tap {tap!r} was recorded from position {first} on, position {start} was asked; "
                    "call record_features before prefill"
                )
            rows = self._rows.get(tap)
            parts.append(rows[start - first : end - first] if rows is not None else torch.empty(0, self.hidden_size))
        return torch.cat(parts, dim=-1)
