"""Continuous batching: the rounds of many requests in one target forward per step.

A `Scheduler` holds up to `max_slots` requests at once, each in a slot of the target (a cache of
its own over the shared weights, `SlotScoring`), and queues the rest. One `step`:

    admit   waiting requests take free slots: prefill (those admitted together in one forward
            where the target is `BatchedPrefill`, a prompt they share computed once), begin
            the proposer and the policy
    plan    each request's policy chooses (`Decoding.choose`); `BatchK` weighs the choices and
            passes each chain whose policy lets a batch choose (auto k) the batch's k, which
            the request's own `Decoding.plan` applies (fewer drafts as the batch's forward grows
            compute-bound, more where another row costs nothing)
    propose each request drafts with its own proposer state and its own random source
    score   one `extend_slots` forward over every request's [pending, drafts] rows (ragged:
            request i scores k_i + 1 rows, k_i may be 0), and what every request's rule reads
            back to the host in one copy (`engine.arrive`); a tree round scores on its own
    settle  each request observes, verifies with its own rng, commits or rolls back its slot
    retire  finished (EOS, budget) and cancelled requests free their slots

Each request runs the very stages of `verispec.engine.Decoding` (its `choose`, `plan`,
`propose` and `settle`), only the forward is shared, and a slot's rows attend to that slot's cache only, so a request's
output law is its target's whatever shares its steps. Its tokens are too, for a given seed:
greedy decoding always, and sampling under the coupled rule (the default at temperature > 0),
whose tokens are plain decoding's for the seed whatever k each round takes, so an auto k may
learn from the rounds' timings and plan for the batch. Under the token or block rule a
request's draws follow its rounds, so its tokens are fixed only where its k depends on nothing
but its own tokens (a constant or heuristic k).

    >>> scheduler = Scheduler(model.lm, RegistryBuilder(model), max_slots=8)
    >>> jobs = [scheduler.submit(Request(ids, 64, proposer="lookup", k=4)) for ids in prompts]
    >>> scheduler.run()            # or step() in a loop, submitting and cancelling between steps
    >>> jobs[0].tokens, jobs[0].finish_reason, jobs[0].stats.mean_accepted
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from verispec.checks import is_int
from verispec.cost import BatchCosts
from verispec.engine import Decoding, Proposal, Scored, arrive, check_request, timed
from verispec.models.base import BatchedPrefill, CausalLM, SlotScoring
from verispec.plan import Plan
from verispec.policies import BatchK, KPolicy
from verispec.proposers.base import Proposer
from verispec.randomness import Random, TorchRandom
from verispec.request import Request
from verispec.stats import Stats
from verispec.transfers import synchronize

Builder = Callable[[Request, CausalLM], tuple[Proposer | None, int | KPolicy]]
"""Builds a request's proposer and k (an integer or a policy) on its slot (a `CausalLM`)."""

FinishReason = Literal["stop", "length", "cancelled"]


class QueueFull(Exception):
    """The scheduler's slots and its waiting queue are all taken; try again later."""


@dataclass(eq=False)
class Job:
    """One submitted request and what it has produced so far.

    state: waiting (queued), running (in a slot), finished. finish_reason: stop (an EOS id),
    length (the budget), cancelled. Times are the scheduler's clock: submitted, admitted (its
    prefill began), first_token (its first token was committed), finished."""

    request: Request
    submitted: float
    state: Literal["waiting", "running", "finished"] = "waiting"
    finish_reason: FinishReason | None = None
    decoding: Decoding | None = None
    slot: Slot | None = None
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    cancel_requested: bool = False

    @property
    def tokens(self) -> list[int]:
        return self.decoding.tokens if self.decoding is not None else []

    @property
    def stats(self) -> Stats:
        return self.decoding.stats if self.decoding is not None else Stats()

    @property
    def done(self) -> bool:
        return self.state == "finished"


@dataclass(eq=False)
class Slot:
    """A cache of the target's (`lm`) and the proposers and policies built on it, by request
    spec, reused by the requests that take this slot after each other (`begin` resets them)."""

    lm: CausalLM
    built: dict[tuple[str, object], tuple[Proposer | None, int | KPolicy]] = field(default_factory=dict)


class RegistryBuilder:
    """Builds each request's proposer from its registry spec on its slot, and its k policy;
    an `auto` or `tree` policy is profiled once per (proposer, k) spec and copied after that.
    model: the `LoadedModel` whose `lm` is the scheduler's target."""

    def __init__(self, model: object, corpus: Sequence[Sequence[int]] = ()) -> None:
        self.model = model
        self.corpus = corpus
        self._policies: dict[tuple[str, object], int | KPolicy] = {}

    def __call__(self, request: Request, slot: CausalLM) -> tuple[Proposer | None, int | KPolicy]:
        from verispec.runner import policy_for, proposer_for  # as `generate` builds its request's

        proposer = proposer_for(self.model, request, slot, self.corpus)
        key = (str(request.proposer), request.k_spec)  # an integer k is its spec's, a profile the spec's first
        if key not in self._policies:
            self._policies[key] = policy_for(request, slot, proposer)
        return proposer, copy.deepcopy(self._policies[key])


class Scheduler:
    """Continuous batching over a `SlotScoring` target (module docstring).

    build: a request's proposer and policy on its slot (`RegistryBuilder`, or any `Builder`).
    max_slots: requests decoded at once; max_waiting: queued beyond them (None: no bound), past
    which `submit` raises `QueueFull`. batch_costs: v(n) of the batched forward; with it, auto
    requests' k is planned per batch (`BatchK`); None: each request's own policy decides.
    max_context: the most positions a request may use, prompt plus budget (None: no check).
    random: a request's random source (default `TorchRandom(request.seed)`; the audit injects
        one that enumerates every branch). clock: reads seconds for the jobs' times and each
        request's `Stats`.
    """

    def __init__(
        self,
        target: SlotScoring,
        build: Builder,
        *,
        max_slots: int = 8,
        max_waiting: int | None = None,
        batch_costs: BatchCosts | None = None,
        max_context: int | None = None,
        random: Callable[[Request], Random] | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not isinstance(target, SlotScoring):
            raise ValueError(
                f"{type(target).__name__} holds one cache; batching needs a model with slots (SlotScoring): "
                "the fast or static runtime's (runtime 'fast', 'static' or 'auto')"
            )
        if not is_int(max_slots, least=1):
            raise ValueError(f"max_slots must be an integer >= 1, got {max_slots!r}")
        if max_waiting is not None and not is_int(max_waiting, least=0):
            raise ValueError(f"max_waiting must be an integer >= 0 or None, got {max_waiting!r}")
        self.target = target
        self._prefills_together = isinstance(target, BatchedPrefill)  # asked once: a protocol check is slow
        target.reserve_slots(max_slots)  # a static cache sized once, so that every step has one shape (`StaticLlama`)
        self.build = build
        self.max_slots = max_slots
        self.max_waiting = max_waiting
        self.batch_k = BatchK(batch_costs) if batch_costs is not None else None
        self.max_context = max_context
        self.random = random or (lambda request: TorchRandom(request.seed))
        self.clock = clock
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []
        self._free: list[Slot] = []
        self._slots = 0  # slots made so far (at most max_slots)
        self.steps = 0
        self.step_rows: list[int] = []  # rows each step's batched forward scored

    # --- submitting and cancelling ---------------------------------------------------------

    def submit(self, request: Request) -> Job:
        """Queue `request`; ValueError when the target cannot take it, `QueueFull` when the
        slots and the queue are all taken."""
        check_request(request, self.target.vocab_size)
        if self.max_context is not None and len(request.prompt_ids) + request.max_new_tokens > self.max_context:
            raise ValueError(
                f"the prompt ({len(request.prompt_ids)} tokens) and max_new_tokens ({request.max_new_tokens}) "
                f"exceed the context of {self.max_context} positions; shorten the prompt or the budget"
            )
        free = self.max_slots - len(self.running)
        if self.max_waiting is not None and len(self.waiting) >= self.max_waiting + free:
            raise QueueFull(f"{len(self.running)} requests running and {len(self.waiting)} waiting")
        job = Job(request, self.clock())
        self.waiting.append(job)
        return job

    def cancel(self, job: Job) -> None:
        """Stop `job` at the next step (its slot is freed then); a finished job stays as it is."""
        job.cancel_requested = True

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    @property
    def slots_in_use(self) -> int:
        return len(self.running)

    # --- the step ----------------------------------------------------------------------------

    def step(self) -> list[tuple[Job, list[int]]]:
        """One step of every running request; (job, tokens it committed) for each, in order."""
        self._retire_cancelled()
        self._admit()
        if not self.running:
            return []
        jobs = list(self.running)
        proposals = [job.decoding.propose(plan) for job, plan in zip(jobs, self._plans(jobs))]
        out = []
        for job, proposal, scored in zip(jobs, proposals, self._score(jobs, proposals)):
            tokens = job.decoding.settle(proposal, scored)
            now = self.clock()
            if job.first_token is None and tokens:
                job.first_token = now
            out.append((job, tokens))
            if job.decoding.done:
                self._finish(job, "stop" if tokens and tokens[-1] in job.decoding.eos_ids else "length")
        self.steps += 1
        return out

    def run(self, max_steps: int | None = None) -> None:
        """Step until every submitted request has finished (or `max_steps` steps)."""
        steps = 0
        while not self.idle and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1

    def _room(self) -> bool:
        return len(self.running) < self.max_slots

    def _admit(self) -> None:
        """Waiting jobs take the free slots; their prompts are prefilled together."""
        admitted = []
        while self.waiting and self._room():
            job = self.waiting.popleft()
            slot = self._take_slot()
            job.slot, job.state, job.admitted = slot, "running", self.clock()
            key = (str(job.request.proposer), job.request.k_spec)
            if key not in slot.built:
                slot.built[key] = self.build(job.request, slot.lm)
            proposer, policy = slot.built[key]
            job.decoding = Decoding(
                slot.lm, proposer, job.request, policy=policy, rng=self.random(job.request), clock=self.clock
            )
            self.running.append(job)
            if job.request.max_new_tokens == 0:
                self._finish(job, "length")
                continue
            admitted.append(job)
        if self._prefills_together and len(admitted) > 1:
            def prefill() -> None:
                self.target.prefill_slots([job.slot.lm for job in admitted], [job.decoding.prefix for job in admitted])
                synchronize()  # its work is the prompts', not the step's forward's

            _, seconds = timed(self.clock, prefill)
            for job in admitted:
                job.decoding.begin(prefilled=seconds)
        else:
            for job in admitted:
                job.decoding.begin()

    def _take_slot(self) -> Slot:
        if self._free:
            return self._free.pop()
        self._slots += 1
        return Slot(self.target.new_slot())

    def _plans(self, jobs: list[Job]) -> list[Plan]:
        """Each job's round plan: its policy's choice, with `BatchK`'s adjustment for the batch
        (None: as chosen) when several requests share the step."""
        chosen = [job.decoding.choose() for job in jobs]
        adjust: list[int | None] = [None] * len(jobs)
        if self.batch_k is not None and len(jobs) > 1:
            adjust = self.batch_k.adjust(chosen, [job.stats.mean_accepted or 1.0 for job in jobs])
        return [job.decoding.plan(choice, k) for job, choice, k in zip(jobs, chosen, adjust)]

    def _score(self, jobs: list[Job], proposals: list[Proposal]) -> list[Scored]:
        """The rows of every job's round: chains in one `extend_slots` forward, trees alone."""
        scored: list[Scored | None] = [None] * len(jobs)
        chains = [i for i, proposal in enumerate(proposals) if not proposal.draft.is_tree]
        for i, proposal in enumerate(proposals):
            if proposal.draft.is_tree:
                scored[i] = jobs[i].decoding.score(proposal)
        if chains:
            rows = []
            for i in chains:
                jobs[i].decoding.check_cache()
                rows.append(jobs[i].decoding.scored_tokens(proposals[i].draft))
            decodings, drafts = [jobs[i].decoding for i in chains], [proposals[i].draft for i in chains]

            def forward() -> tuple[list, list]:
                logits = self.target.extend_slots([jobs[i].slot.lm for i in chains], rows)
                return logits, arrive(decodings, drafts, logits)  # the step's one copy to the host

            (logits, rule_rows), seconds = timed(self.clock, forward)
            total = sum(len(r) for r in rows)
            self.step_rows.append(total)
            for i, rows_i, rule_i in zip(chains, logits, rule_rows):
                scored[i] = Scored(rows_i, seconds, total, rule_i)
        return scored

    def _retire_cancelled(self) -> None:
        for job in [job for job in self.waiting if job.cancel_requested]:
            self.waiting.remove(job)
            job.state, job.finish_reason, job.finished = "finished", "cancelled", self.clock()
        for job in [job for job in self.running if job.cancel_requested]:
            self._finish(job, "cancelled")

    def _finish(self, job: Job, reason: FinishReason) -> None:
        job.state, job.finish_reason, job.finished = "finished", reason, self.clock()
        self.running.remove(job)
        self._free.append(job.slot)

