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
- `HFBatchServer`: HF `generate` on a left-padded batch of every request submitted since its
  last step. HF cannot add a request to a batch that is decoding, so it serves whole batches:
  the loop submits c prompts, the step decodes them all to the end, then the next c come.
- `verispec.bench.llamacpp.LlamaCppBatchServer`: llama.cpp's batch API, continuous like
  verispec's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch
from transformers.generation.streamers import BaseStreamer

from verispec.batching import RegistryBuilder, Scheduler
from verispec.bench.methods import Method
from verispec.bench.runners import HFRunner
from verispec.request import Request
from verispec.sampling import GREEDY, SamplingParams
from verispec.stats import Stats

if TYPE_CHECKING:
    from verispec.cost import BatchCosts

Clock = Callable[[], float]


@dataclass
class Served:
    """One finished request. key: the caller's (the prompt's index). tokens: the new ids (EOS
    included when it ended the request). submitted, first_token, finished: the server's clock
    (first_token None when nothing was emitted). stats: the verispec engine's counters (None
    for peers). peer: what computed the tokens when it is not verispec's target itself
    (`runners.Outcome.peer`)."""

    key: int
    tokens: list[int]
    submitted: float
    first_token: float | None
    finished: float
    stats: Stats | None = None
    peer: str | None = None

    @property
    def ttft(self) -> float:
        """Seconds from submission to the first token (prefill, queueing and the first round)."""
        return (self.first_token if self.first_token is not None else self.finished) - self.submitted

    @property
    def tpot(self) -> float | None:
        """Seconds per output token after the first: (finished - first_token) / (n - 1)."""
        if self.first_token is None or len(self.tokens) < 2:
            return None
        return (self.finished - self.first_token) / (len(self.tokens) - 1)


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


class StepClock(BaseStreamer):
    """An HF streamer noting when each decoding step's tokens arrive (all rows of the batch at
    once); the first `put` is the prompt."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.prompt_seen = False
        self.times: list[float] = []

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        self.times.append(self.clock())

    def end(self) -> None:
        pass


class HFBatchServer:
    """HF `generate` over a left-padded batch of the requests submitted since the last step,
    greedy or sampled like `HFRunner` (the same GenerationConfig). Whole batches: a step decodes
    its batch to the end, so a request that finishes early waits for the batch (its `finished`
    time is still when its last token arrived). Left padding with an attention mask (pad = the
    first EOS id): HF derives each row's positions from the mask, so a padded row decodes what
    it would alone, up to the batched arithmetic's rounding (`peer` says so when c > 1)."""

    def __init__(
        self,
        model,
        eos_token_ids: Sequence[int],
        sampling: SamplingParams = GREEDY,
        seed: int = 0,
        clock: Clock = time.perf_counter,
    ) -> None:
        if not eos_token_ids:
            raise ValueError("a padded HF batch pads with the EOS id; the target names none")
        self.runner = HFRunner(model, eos_token_ids, sampling=sampling, seed=seed)
        self.clock = clock
        self.queue: list[tuple[int, list[int], int, float]] = []  # key, prompt, budget, submitted

    @property
    def in_flight(self) -> int:
        return len(self.queue)

    def submit(self, key: int, prompt_ids: Sequence[int], max_new_tokens: int) -> None:
        self.queue.append((key, [int(t) for t in prompt_ids], max_new_tokens, self.clock()))

    def step(self) -> list[Served]:
        if not self.queue:
            return []
        batch, self.queue = self.queue, []
        budget = max(b for _, _, b, _ in batch)
        width = max(len(ids) for _, ids, _, _ in batch)
        pad = self.runner.eos_token_ids[0]
        ids = torch.tensor([[pad] * (width - len(p)) + p for _, p, _, _ in batch])  # [B, T]
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for _, p, _, _ in batch])  # [B, T]
        steps = StepClock(self.clock)
        if not self.runner.sampling.greedy:
            torch.manual_seed(self.runner.seed)
        with torch.inference_mode():
            out = self.runner.model.generate(
                ids, attention_mask=mask, generation_config=self.runner.config(budget), streamer=steps
            )  # [B, T + n]
        eos = set(self.runner.eos_token_ids)
        peer = None if len(batch) == 1 else f"HF generate, a left-padded batch of {len(batch)} (batched arithmetic)"
        served = []
        for row, (key, _, max_new, submitted) in enumerate(batch):
            tokens = []
            for token in out[row, width:].tolist()[:max_new]:
                tokens.append(int(token))
                if token in eos:
                    break
            first = steps.times[0] if tokens else None
            finished = steps.times[len(tokens) - 1] if tokens else self.clock()
            served.append(Served(key, tokens, submitted, first, finished, peer=peer))
        return served
