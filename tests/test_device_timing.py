"""Timings that are true on a device: the forward's seconds include the device's work on it.

On a GPU `extend` returns once its kernels are queued; the device's work is paid when the host
next waits (the round's one copy to the host). A `DeviceClock` models that: the host's clock
does not move while work is queued, and jumps by the queued work when the host reads device
data. The engine times a forward until what the rule reads is on the host (`engine.arrive`),
so each round's target seconds are the device's cost of its rows, and `AutoK` chooses k from
that cost, not from the microseconds it takes to queue it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from verispec import GREEDY, generate
from verispec.batching import Scheduler
from verispec.cost import FixedCosts
from verispec.models.tables import TableLM, random_table
from verispec.policies import AutoK
from verispec.proposers import DraftModel
from verispec.request import Request


def device_seconds(rows: int) -> float:
    """The simulated device's forward: 1 ms, and 2 ms more per row after the first (rows are
    dear: with every draft accepted, no k pays for itself)."""
    return 0.001 * (1 + 2 * (rows - 1))


class DeviceClock:
    """Host seconds; device work queued by `launch` is paid when the host `wait`s for it."""

    def __init__(self) -> None:
        self.now, self.queued = 0.0, 0.0

    def __call__(self) -> float:
        return self.now

    def launch(self, seconds: float) -> None:
        self.queued += seconds

    def wait(self) -> None:
        self.now, self.queued = self.now + self.queued, 0.0


class Queued(torch.Tensor):
    """Logits whose forward is still running: reading them on the host waits for the device."""

    clock: DeviceClock

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func in (torch.Tensor.cpu, torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__float__, torch.Tensor.__bool__):
            cls.clock.wait()
        return super().__torch_function__(func, types, args, kwargs or {})


class QueuedTable(TableLM):
    """A table whose forwards queue `device_seconds(rows)` of device work on the clock."""

    def __init__(self, table: TableLM) -> None:
        super().__init__(table.rows, table.order)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        Queued.clock.launch(device_seconds(len(tokens)))
        return super().extend(tokens, keep).as_subclass(Queued)

    def extend_slots(self, slots, tokens) -> list[torch.Tensor]:
        """One forward of every slot's rows (its slots are `QueuedTable`s too: `new_slot` copies)."""
        Queued.clock.launch(device_seconds(sum(map(len, tokens))))
        return [TableLM.extend(slot, rows).as_subclass(Queued) for slot, rows in zip(slots, tokens)]


@pytest.fixture
def clock() -> DeviceClock:
    Queued.clock = DeviceClock()
    return Queued.clock


def test_a_round_is_charged_the_device_work_of_its_forward(clock):
    table = random_table(6, 2, seed=3)
    out = generate(QueuedTable(table), DraftModel(table), [0, 1, 2], max_new_tokens=20, k=3, sampling=GREEDY,
                   clock=clock)
    rows = [drafted + 1 for drafted in out.stats.drafted]
    assert out.stats.round_target_seconds == pytest.approx([device_seconds(n) for n in rows])


def test_auto_k_chooses_from_the_forward_s_device_cost(clock):
    """Every draft is accepted (the draft is the target) and drafting is free, so on a flat
    prior (a profile that timed only the queueing) auto starts at its k_max; the rounds then
    measure v(n) = 1 + 2 (n - 1) on the device,
    under which no k pays (tau / v(k + 1) = (k + 1) / (1 + 2 k) < 1), and auto decodes plainly
    but for its probes. Had the forward's seconds stopped before the wait, every round would
    have measured nothing and auto would stay at k_max."""
    table = random_table(6, 2, seed=3)
    policy = AutoK(FixedCosts(c=0.0, v=[1.0] * 5, step_seconds=device_seconds(1)))
    out = generate(QueuedTable(table), DraftModel(table), [0, 1, 2], max_new_tokens=200, k=policy, sampling=GREEDY,
                   clock=clock)
    assert out.stats.drafted[0] == 4  # the flat prior's choice
    true_v = [device_seconds(n) / device_seconds(1) for n in range(1, 6)]  # 1, 3, 5, 7, 9
    assert all(0.5 * v <= learned <= v for learned, v in zip(policy.v[1:], true_v[1:]))  # the prior's 1 blended in
    late = out.stats.drafted[len(out.stats.drafted) // 2 :]
    assert sum(1 for drafted in late if drafted == 0) >= 0.8 * len(late)


def test_a_scheduler_step_is_charged_the_device_work_of_its_forward(clock):
    table = random_table(6, 2, seed=3)
    scheduler = Scheduler(QueuedTable(table), lambda request, slot: (DraftModel(TableLM(table.rows, table.order)), 2),
                          max_slots=3, clock=clock)
    jobs = [scheduler.submit(Request((0, 1, i), 8)) for i in range(3)]
    scheduler.run()
    for job in jobs:
        assert job.stats.round_target_seconds == pytest.approx(
            [device_seconds(rows) for rows in job.stats.round_batch_rows])
