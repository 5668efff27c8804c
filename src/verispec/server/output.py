"""One request's reply on the event loop: its text as the engine commits tokens, cut at the
first stop string.

Stop strings are found on the decoded text, not on tokens (a stop string may span tokens, or
end inside one), once `min_tokens` tokens have been emitted (vLLM's rule). When one appears,
the text is cut where it begins (or, with `include_stop`, where it ends), the job is cancelled
(`tokens` returns True, and the engine frees its slot at the next step) and the reply ends with finish_reason "stop"; the
tokens counted are those up to the one that completed the stop string. While streaming, the
end of the text that could still grow into a stop string is held back, so a client never
receives text that is later cut.

    >>> out = Output(lambda ids: "".join(chr(i) for i in ids), ["cd"])
    >>> out.tokens([97, 98, 99]), out.text, out.sent   # 'c' may begin 'cd': held back
    (False, 'abc', 2)
    >>> out.tokens([100, 101]), out.text, out.completion_tokens
    (True, 'ab', 4)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection, Sequence

from verispec.logprobs import TokenLogprob
from verispec.server.engine_thread import Finished
from verispec.textstream import TextStream

FINISH_REASONS = {"stop": "stop", "length": "length", "cancelled": "abort", "error": "error"}


class Output:
    """A `Sink` for one request (`verispec.server.engine_thread`): decodes its tokens, watches
    for `stops`, and tells the handler through `deltas` (text to stream, then the `Finished`)
    and `wait`. stop_token_ids: the request's own stop ids (the engine ends at them; named in
    `stop_reason`). min_tokens: stop strings count from this many tokens on. include_stop: keep
    the stop string in the text. on_finish: records the request's metrics, whether or not
    anyone still waits for the reply."""

    def __init__(
        self,
        decode: Callable[[Sequence[int]], str],
        stops: Sequence[str] = (),
        *,
        stop_token_ids: Collection[int] = (),
        min_tokens: int = 0,
        include_stop: bool = False,
        on_finish: Callable[[Output], None] = lambda output: None,
    ) -> None:
        self.stream = TextStream(decode)
        self.stops = list(stops)
        self.longest_stop = max((len(s) for s in self.stops), default=0)
        self.stop_token_ids = frozenset(stop_token_ids)
        self.min_tokens = min_tokens
        self.include_stop = include_stop
        self.matched: str | None = None  # the stop string that ended the reply
        self.on_finish = on_finish
        self.text = ""  # the reply so far, cut at a stop string
        self.sent = 0  # characters of `text` handed to the handler
        self.token_ids: list[int] = []  # the reply's tokens (through the one completing a stop string)
        self.logprobs: list[TokenLogprob] = []  # theirs, one a token, when the request asked
        self.logprobs_sent = 0  # of `logprobs`, those a streamed chunk has carried
        self.prompt_logprobs: list[TokenLogprob | None] = []  # one a prompt token, when the request asked
        self.stopped = False
        self.finished: Finished | None = None
        self.deltas: asyncio.Queue[str | Finished] | None = None  # made on first use, on the loop
        self._done: asyncio.Future[Finished] | None = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def stop_reason(self) -> str | int | None:
        """vLLM's: the stop string or the request's stop token id that ended the reply; None
        when an EOS id, the budget or anything else ended it."""
        if self.stopped:
            return self.matched
        if self.token_ids and self.token_ids[-1] in self.stop_token_ids and self.finish_reason == "stop":
            return self.token_ids[-1]
        return None

    @property
    def finish_reason(self) -> str:
        if self.stopped:
            return "stop"
        return FINISH_REASONS.get(self.finished.reason, self.finished.reason) if self.finished else "abort"

    def tokens(self, tokens: list[int], logprobs: list[TokenLogprob] | None = None,
               prompt_logprobs: list[TokenLogprob | None] | None = None) -> bool:
        """Take the tokens of a step (and their logprobs, and with the first the prompt's); True
        when they completed a stop string (cancel the job)."""
        if prompt_logprobs is not None:
            self.prompt_logprobs = list(prompt_logprobs)
        if self.stopped:
            return False  # committed in a step before the cancel took
        for i, token in enumerate(tokens):
            self.token_ids.append(token)
            if logprobs is not None:
                self.logprobs.append(logprobs[i])
            if self._add(self.stream.push(token), check=len(self.token_ids) >= self.min_tokens):
                break
        self._release(self.releasable())
        return self.stopped

    def finish(self, finished: Finished) -> None:
        if not self.stopped:
            self._add(self.stream.flush())
        self.finished = finished
        self._release(self.text[self.sent :])
        self.queue().put_nowait(finished)
        if self._done is not None and not self._done.done():
            self._done.set_result(finished)
        self.on_finish(self)

    def unsent_logprobs(self) -> list[TokenLogprob]:
        """The logprobs no streamed chunk has carried yet (marked sent)."""
        unsent = self.logprobs[self.logprobs_sent :]
        self.logprobs_sent = len(self.logprobs)
        return unsent

    def releasable(self) -> str:
        """The text not yet handed out that can no longer become part of a stop string."""
        end = len(self.text)
        if not self.stopped:
            end -= held_back(self.text, self.stops)
        return self.text[self.sent : max(end, self.sent)]

    async def wait(self) -> Finished:
        """The request's end (for a reply sent whole)."""
        if self.finished is not None:
            return self.finished
        if self._done is None:
            self._done = asyncio.get_running_loop().create_future()
        return await self._done

    def queue(self) -> asyncio.Queue:
        """The handler's events: text deltas, then the `Finished` (made on first use, on the loop)."""
        if self.deltas is None:
            self.deltas = asyncio.Queue()
        return self.deltas

    def _add(self, piece: str, check: bool = True) -> bool:
        """Append `piece`; True when that completed a stop string (and `check`: the text is
        cut there)."""
        if not piece:
            return False
        start = max(0, len(self.text) - self.longest_stop + 1)
        self.text += piece
        if not check:
            return False
        found = [(i, stop) for i, stop in ((self.text.find(stop, start), stop) for stop in self.stops) if i >= 0]
        if not found:
            return False
        at, self.matched = min(found)
        self.text = self.text[: at + (len(self.matched) if self.include_stop else 0)]
        self.stopped = True
        return True

    def _release(self, piece: str) -> None:
        if piece:
            self.sent += len(piece)
            self.queue().put_nowait(piece)


def held_back(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of `text` that begins some stop string (and is shorter).

    >>> held_back("hello wor", ["world", "x"])
    3
    """
    best = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:n]):
                best = n
                break
    return best
