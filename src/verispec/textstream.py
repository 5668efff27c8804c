"""Incremental detokenisation for streaming: text appears as tokens are committed.

Decoding token by token breaks multi-byte characters and merges (a token may only become a
whole character with the next one), so the running sequence is decoded and only the new,
complete suffix is released; a trailing U+FFFD (an unfinished UTF-8 sequence) is held back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.ids: list[int] = []
        self._released = 0

    def push(self, token: int) -> str:
        """Add one token; return the text it completes (possibly empty)."""
        self.ids.append(token)
        text = self.decode(self.ids)
        return "" if text.endswith("\ufffd") else self._release(text)

    def flush(self) -> str:
        """The text not released yet: at the end of an output, a character its last tokens
        left unfinished (decoded as U+FFFD), so the stream adds up to `text()`."""
        return self._release(self.decode(self.ids))

    def text(self) -> str:
        return self.decode(self.ids)

    def _release(self, text: str) -> str:
        new, self._released = text[self._released :], len(text)
        return new
