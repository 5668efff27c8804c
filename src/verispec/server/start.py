"""The engine a server starts with: the batch `Scheduler` over a loaded model, its slots held,
the batched forward's cost measured for auto k per batch, and every slot warmed up, before the
first client waits for any of it.

    >>> scheduler = started_scheduler(loaded, served, max_slots=8, max_waiting=64)
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import TextIO

from verispec.batching import RegistryBuilder, Scheduler
from verispec.models.base import SlotScoring
from verispec.request import Request
from verispec.server.app import ServedModel

WARM_PROMPT = "Hello, how are you?"


def started_scheduler(
    loaded: object, served: ServedModel, *, max_slots: int, max_waiting: int, batch_costs: bool = True,
    log: TextIO | None = None,
) -> Scheduler:
    """A scheduler of `max_slots` slots over `loaded` (a `LoadedModel`) serving `served`, ready:
    the static runtime's cache holds every slot before anything measures a step; with
    `batch_costs` and k auto, v(n) of the batched forward is measured so each step's k suits
    its batch; then a short request in every slot (`warm_up`). Progress goes to `log` (default
    standard error)."""
    log = sys.stderr if log is None else log
    warm = loaded.encode(WARM_PROMPT, chat=loaded.chat_template is not None)
    if isinstance(loaded.lm, SlotScoring):
        loaded.lm.reserve_slots(max_slots)
    costs = None
    if batch_costs and served.k_label == "auto" and max_slots > 1:
        costs = measured_batch_costs(loaded.lm, warm, max_slots, log)
    scheduler = Scheduler(loaded.lm, RegistryBuilder(loaded), max_slots=max_slots, max_waiting=max_waiting,
                          batch_costs=costs, max_context=served.context)
    warm_up(scheduler, served, warm, log)
    return scheduler


def measured_batch_costs(lm: object, prompt_ids: Sequence[int], slots: int, log: TextIO) -> object | None:
    """v(n) of the batched forward, for auto k per batch; None where it cannot be measured."""
    try:
        from verispec.profile import measure_batch_costs
    except ImportError:
        return None
    print("measuring the batched forward's cost ...", end=" ", file=log, flush=True)
    start = time.perf_counter()
    # Only v(rows) plans k (no per-context timings); three repeats keep the start short.
    measured = measure_batch_costs(lm, prompt_ids, slots=slots, contexts=(), repeats=3)
    print(f"{time.perf_counter() - start:.0f} s", file=log, flush=True)
    return getattr(measured, "costs", measured)  # a profile with its costs, or the costs


def warm_up(scheduler: Scheduler, served: ServedModel, prompt_ids: Sequence[int], log: TextIO) -> None:
    """A short request in every slot before serving: it builds each slot's proposer and
    profiles the k policy (`--k auto`) as `verispec.runner` builds a request's, which the
    first clients would otherwise wait for."""
    print("warming up ...", end=" ", file=log, flush=True)
    start = time.perf_counter()
    for _ in range(scheduler.max_slots):
        scheduler.submit(Request(tuple(prompt_ids), 4, eos_token_ids=served.eos_token_ids, proposer=served.proposer,
                                 k=served.k))
    scheduler.run()
    print(f"{time.perf_counter() - start:.0f} s", file=log, flush=True)
