"""A closed loop of requests: c in flight, each finished one replaced by the next prompt.

A `Server` takes requests (`submit`) and advances every one in flight by one `step`, returning
those that finished in it. `closed_loop` keeps exactly `concurrency` requests in flight while
prompts remain (each prompt served once, in order) and times every request on one clock:
submitted (when it entered the server), first_token (its first committed token or tokens),
finished.

    >>> loop = closed_loop(VerispecServer(target, method, max_slots=4), prompts, 4, 128)
    >>> loop.tokens_per_second, loop.most_in_flight, loop.served[0].ttft
    (412.0, 4, 0.081)

Servers:
- `VerispecServer`: verispec's continuous batching (`verispec.batching.Scheduler`): a finished
  request's slot takes the next request at the following step.
- `verispec.peers.hf.HFBatchServer`: HF `generate` on a left-padded batch of every request submitted since its
  last step. HF cannot add a request to a batch that is decoding, so it serves whole batches:
  the loop submits c prompts, the step decodes them all to the end, then the next c come.
- `verispec.peers.llamacpp.LlamaCppBatchServer`: llama.cpp's batch API, continuous like
  verispec's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from verispec.batching import RegistryBuilder, Scheduler
from verispec.bench.methods import Method
from verispec.peers.outcome import Served
from verispec.request import Request
from verispec.sampling import GREEDY, SamplingParams

if TYPE_CHECKING:
    from verispec.cost import BatchCosts

Clock = Callable[[], float]


class Server(Protocol):
    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished."""
        ...

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None: ...

    def step(self) -> list[Served]:
        """Advance every request in flight; those that finished."""
        ...


@dataclass
class Loop:
    """One closed loop: every request served, the wall time from the first submission to the
    last finish, and the most requests that were in flight at once."""

    served: list[Served]
    wall_seconds: float
    most_in_flight: int

    @property
    def new_tokens(self) -> int:
        return sum(len(s.tokens) for s in self.served)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.wall_seconds if self.wall_seconds > 0 else 0.0


def closed_loop(
    server: Server,
    prompts: Sequence[Sequence[int]],
    concurrency: int,
    max_new_tokens: int,
    on_served: Callable[[Served], None] = lambda _: None,
    clock: Clock = time.perf_counter,
) -> Loop:
    """Serve every prompt once with `concurrency` requests in flight: submit until c are in
    flight (or the prompts run out), step, repeat. on_served(s) is called as each finishes."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    queue = deque(range(len(prompts)))
    served: list[Served] = []
    most = 0
    start = clock()
    while queue or server.in_flight:
        while queue and server.in_flight < concurrency:
            key = queue.popleft()
            server.submit(key, prompts[key], max_new_tokens)
        most = max(most, server.in_flight)
        for done in server.step():
            served.append(done)
            on_served(done)
    return Loop(served, clock() - start, most)


def request_k(method: Method) -> int | str:
    """The `Request.k` of a verispec method: its fixed k, its policy spec, or 0 (plain)."""
    if method.proposer is None:
        return 0
    return method.k if method.k is not None else method.policy


class VerispecServer:
    """verispec's continuous batching: one `Scheduler` over `max_slots` slots of the target.

    builder: the `RegistryBuilder` of the method (shared across concurrency levels, so an auto
    policy is profiled once). batch_costs: v(n) of the batched forward, with which auto requests'
    k is planned per batch (`BatchK`); None: each request's own policy decides."""

    def __init__(
        self,
        builder: RegistryBuilder,
        method: Method,
        eos_token_ids: Sequence[int],
        max_slots: int,
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
        batch_costs: BatchCosts | None = None,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.method = method
        self.eos_token_ids = frozenset(eos_token_ids)
        self.sampling = sampling
        self.seed = seed
        self.scheduler = Scheduler(builder.model.lm, builder, max_slots=max_slots,
                                   batch_costs=batch_costs, clock=clock)
        self.keys: dict[object, int] = {}  # job -> key, for the jobs in flight

    @property
    def in_flight(self) -> int:
        return len(self.keys)

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        request = Request(
            tuple(prompt_ids), max_new_tokens, sampling=self.sampling, eos_token_ids=self.eos_token_ids,
            seed=self.seed, proposer=self.method.proposer, k=request_k(self.method),
        )
        self.keys[self.scheduler.submit(request)] = key

    def step(self) -> list[Served]:
        self.scheduler.step()
        done = [(job, key) for job, key in self.keys.items() if job.done]
        for job, _ in done:
            del self.keys[job]
        return [Served(key, list(job.tokens), job.submitted, job.first_token, job.finished, job.stats)
                for job, key in done]

    @property
    def steps(self) -> int:
        return self.scheduler.steps

    @property
    def step_rows(self) -> list[int]:
        return self.scheduler.step_rows


