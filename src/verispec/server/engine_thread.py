"""The engine thread: the batch `Scheduler` stepped on a thread of its own, so the event loop
never waits for a forward.

The scheduler is single-threaded by design; only this thread touches it. Handlers hand it
submissions and cancellations through a thread-safe inbox, drained between steps (and waited
on while there is nothing to step); after each step the tokens every request committed, and
the end of each request that finished, go back to the event loop in one
`call_soon_threadsafe`, to each request's `Sink` (`verispec.server.output.Output`).

    >>> engine = EngineThread(scheduler)
    >>> engine.start(asyncio.get_running_loop())

Where the engine runs: on a thread of its own by default, or (`EngineThread(scheduler,
own_thread=False)`, what `verispec serve` does) on the thread that calls `run_here`, the
process's main thread, with the event loop on another. torch's CPU kernels run markedly slower
from a thread other than the one that first used them (docs/results/implementation-choices.md), so the forwards stay on the
main thread.

    >>> job = await engine.submit(request, sink)     # ValueError, QueueFull or Closed, at once
    >>> engine.cancel(job)                           # its slot is freed at the next step
    >>> await engine.drain(grace=10.0)               # at shutdown: finish or cancel, then stop
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

from verispec.batching import Job, Scheduler
from verispec.logprobs import TokenLogprob
from verispec.request import Request
from verispec.stats import Stats

log = logging.getLogger("verispec.server")


class Closed(Exception):
    """The server is shutting down and takes no new requests."""


@dataclass(frozen=True)
class Speculation:
    """What one request's speculation did, in vLLM's terms (`SpecDecodingStats`).

    num_drafts: rounds that drafted at least one token; num_draft_tokens, num_accepted_tokens:
    their drafted and accepted tokens; num_accepted_tokens_per_pos[i]: rounds that accepted the
    draft token at position i (depth i of a tree), so these sum to num_accepted_tokens.
    acceptance_histogram[j]: drafting rounds that accepted exactly j draft tokens (vLLM's).
    rounds: every round, plain steps included; new_tokens: the tokens they committed (a stop
    string may cut the reply before the last of them); prefill_seconds: the prompt's forward."""

    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: tuple[int, ...]
    acceptance_histogram: tuple[int, ...]
    rounds: int
    new_tokens: int
    prefill_seconds: float

    @property
    def mean_acceptance_length(self) -> float:
        """vLLM's: 1 + accepted per drafting round (1 when none drafted)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / draft tokens (0 when none were drafted)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @classmethod
    def of(cls, stats: Stats) -> Speculation:
        return cls(
            num_drafts=stats.speculative_rounds,
            num_draft_tokens=sum(stats.drafted),
            num_accepted_tokens=sum(stats.accepted),
            # rank_accepts[d][r]: rounds that accepted the rank-r child at depth d (a chain's is
            # rank 0), for chains and trees alike.
            num_accepted_tokens_per_pos=tuple(sum(ranks) for ranks in stats.rank_accepts),
            acceptance_histogram=dense(stats.accepted_histogram),
            rounds=stats.rounds,
            new_tokens=stats.new_tokens,
            prefill_seconds=stats.prefill_seconds,
        )


def dense(histogram: dict[int, int]) -> tuple[int, ...]:
    """{accepted: rounds} as a list indexed by the accepted count.

    >>> dense({0: 3, 2: 1})
    (3, 0, 1)
    """
    return tuple(histogram.get(j, 0) for j in range(max(histogram, default=-1) + 1))


@dataclass(frozen=True)
class Finished:
    """How a request ended, read on the engine thread when it did. reason: the scheduler's
    (stop, length, cancelled) or error (a step failed). Times are `time.perf_counter` seconds:
    submitted, admitted (its prefill began), first_token, finished (None where it never got
    there)."""

    reason: str
    speculation: Speculation
    submitted: float
    admitted: float | None
    first_token: float | None
    finished: float

    @classmethod
    def of(cls, job: Job, reason: str | None = None) -> Finished:
        return cls(
            reason or job.finish_reason or "cancelled",
            Speculation.of(job.stats),
            job.submitted,
            job.admitted,
            job.first_token,
            job.finished if job.finished is not None else job.submitted,
        )


class Sink(Protocol):
    """Where a request's tokens go, called on the event loop."""

    def tokens(self, tokens: list[int], logprobs: list[TokenLogprob] | None = None,
               prompt_logprobs: list[TokenLogprob | None] | None = None) -> bool:
        """Take tokens the job committed (and their logprobs, one a token, when the request asked;
        with its first tokens, the prompt's, when asked); True asks to cancel the job (a stop
        string appeared)."""
        ...

    def finish(self, finished: Finished) -> None: ...


class EngineThread:
    """Steps `scheduler` on its own thread (module docstring). Its counts (`running`,
    `waiting`, `slots_in_use`) are written after every step and read by /metrics."""

    def __init__(self, scheduler: Scheduler, *, own_thread: bool = True) -> None:
        self.scheduler = scheduler
        self.inbox: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=self._run, name="verispec-engine", daemon=True) if own_thread else None
        self.started = threading.Event()  # the event loop is known: the engine may run
        self.stopped = threading.Event()  # the engine's loop has ended
        self.sinks: dict[Job, Sink] = {}  # the engine thread's: every job not yet reported finished
        self.failed: set[Job] = set()  # cancelled because a step raised
        self.accepting = True
        self.stopping = False
        self.running = 0
        self.waiting = 0
        self.idle = threading.Event()
        self.idle.set()

    @property
    def slots_in_use(self) -> int:
        return self.running

    @property
    def max_slots(self) -> int:
        return self.scheduler.max_slots

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.started.set()
        if self.thread is not None:
            self.thread.start()

    def run_here(self, until: threading.Event) -> None:
        """Run the engine on the calling thread (`own_thread=False`) once the event loop has
        started it, until it stops, or `until` is set first (the server ended without it)."""
        while not self.started.wait(0.1):
            if until.is_set():
                return
        self._run()

    # --- the event loop's side -------------------------------------------------------------

    async def submit(self, request: Request, sink: Sink) -> Job:
        """Queue `request`; its job, or the scheduler's ValueError or QueueFull, or Closed."""
        if not self.accepting:
            raise Closed("the server is shutting down")
        answer = self.loop.create_future()
        self.inbox.put(("submit", request, sink, answer))
        return await answer

    def cancel(self, job: Job) -> None:
        """Stop `job` at the next step (nothing happens to a finished one)."""
        self.inbox.put(("cancel", job))

    async def drain(self, grace: float) -> None:
        """Take no more requests, let those in flight finish for up to `grace` seconds, cancel
        the rest, and stop the thread once each has been reported finished."""
        self.accepting = False
        self.inbox.put(("close",))
        await asyncio.get_running_loop().run_in_executor(None, self.idle.wait, grace)
        self.inbox.put(("stop",))
        await asyncio.get_running_loop().run_in_executor(None, self.stopped.wait, grace + 10.0)

    # --- the engine thread ---------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        finally:
            self.stopped.set()

    def _loop(self) -> None:
        scheduler = self.scheduler
        while not (self.stopping and scheduler.idle):
            self._take_commands(block=scheduler.idle and not self.stopping)
            if scheduler.idle:
                continue
            try:
                committed = scheduler.step()
            except Exception:  # a request the checks let through, or a bug: fail this batch, serve on
                log.exception("a decoding step failed; its requests end with an error")
                committed = []
                for job in [job for job in self.sinks if job not in scheduler.waiting]:
                    self.failed.add(job)
                    scheduler.cancel(job)
            self._publish(committed)
        self.idle.set()

    def _take_commands(self, block: bool) -> None:
        commands = []
        if block:
            self.idle.set()
            while True:  # in slices, so a signal handler on the main thread runs meanwhile
                try:
                    commands.append(self.inbox.get(timeout=0.2))
                    break
                except queue.Empty:
                    continue
        while True:
            try:
                commands.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for command in commands:
            kind = command[0]
            if kind == "submit":
                self._submit(*command[1:])
            elif kind == "cancel":
                self.scheduler.cancel(command[1])
            elif kind == "close":
                self.accepting = False
            elif kind == "stop":
                self.stopping, self.accepting = True, False
                for job in self.sinks:
                    self.scheduler.cancel(job)
        if not self.scheduler.idle:
            self.idle.clear()
        self._count()

    def _submit(self, request: Request, sink: Sink, answer: asyncio.Future) -> None:
        try:
            if not self.accepting:
                raise Closed("the server is shutting down")
            job = self.scheduler.submit(request)
        except Exception as error:  # ValueError, QueueFull, Closed: the handler answers it
            self._call(_reject, answer, error)
            return
        self.sinks[job] = sink
        self._call(_accept, answer, job, self)

    def _publish(self, committed: list[tuple[Job, list[int]]]) -> None:
        tokens = [(job, self.sinks[job], list(new), new_logprobs(job, len(new)), first_prompt_logprobs(job, len(new)))
                  for job, new in committed if new and job in self.sinks]
        ended = []
        for job in [job for job in self.sinks if job.done or self._lost(job)]:
            reason = "error" if job in self.failed else None
            self.failed.discard(job)
            ended.append((self.sinks.pop(job), Finished.of(job, reason)))
        self._count()
        if tokens or ended:
            self._call(_deliver, self, tokens, ended)

    def _lost(self, job: Job) -> bool:
        """A job that a failed step left neither running, waiting nor finished."""
        return job in self.failed and job not in self.scheduler.running and job not in self.scheduler.waiting

    def _count(self) -> None:
        self.running = len(self.scheduler.running)
        self.waiting = len(self.scheduler.waiting)

    def _call(self, function, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(function, *args)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass


def new_logprobs(job: Job, n: int) -> list[TokenLogprob] | None:
    """The logprobs of the `n` tokens `job` just committed (None: the request asked for none)."""
    if job.request.logprobs is None:
        return None
    return job.decoding.logprobs[len(job.decoding.logprobs) - n:]


def first_prompt_logprobs(job: Job, n: int) -> list[TokenLogprob | None] | None:
    """The prompt's logprobs with `job`'s first `n` committed tokens (None: not the first, or
    the request asked for none)."""
    if job.request.prompt_logprobs is None or len(job.decoding.tokens) != n:
        return None
    return job.decoding.prompt_logprobs


def _accept(answer: asyncio.Future, job: Job, engine: EngineThread) -> None:
    if answer.cancelled():  # the client left while its request was being queued
        engine.cancel(job)
    else:
        answer.set_result(job)


def _reject(answer: asyncio.Future, error: Exception) -> None:
    if not answer.cancelled():
        answer.set_exception(error)


def _deliver(
    engine: EngineThread,
    tokens: list[tuple[Job, Sink, list[int], list[TokenLogprob] | None, list[TokenLogprob | None] | None]],
    ended: list[tuple[Sink, Finished]],
) -> None:
    for job, sink, new, logprobs, prompt_logprobs in tokens:
        if sink.tokens(new, logprobs, prompt_logprobs):
            engine.cancel(job)
    for sink, finished in ended:
        sink.finish(finished)
