"""Batched prefill (`BatchedPrefill`) on the fast and the static runtime, on a tiny random Llama:
every slot ends as its own `prefill` leaves it (bit for bit with deterministic scoring: the
next rows' logits and the recorded features), a repeated prompt is computed once and copied,
and the scheduler prefills what it admits together in one call, each request's tokens those
it decodes alone."""

from __future__ import annotations

import pytest
import torch
from test_hf_adapter import tiny_llama

from verispec import GREEDY, SamplingParams, generate
from verispec.batching import Scheduler
from verispec.models.base import FINAL, BatchedPrefill, shared_prompts
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.proposers import PromptLookup
from verispec.request import Request

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

RUNTIMES = {
    "fast": lambda model: LlamaRuntime.from_hf(model, deterministic=True),
    "static": lambda model: StaticLlama.from_hf(model, deterministic=True, rows=4, slots=5, context=32),
}
P, R = [3, 9, 4, 1, 5, 9, 2, 6], [7, 7]


@pytest.fixture(scope="module", params=list(RUNTIMES))
def target(request):
    return RUNTIMES[request.param](tiny_llama(0))


def test_each_slot_ends_as_its_own_prefill_leaves_it(target) -> None:
    assert isinstance(target, BatchedPrefill)
    batch = [target.new_slot() for _ in range(4)]
    alone = [target.new_slot() for _ in range(4)]
    prompts = [P, R, P, []]
    for slot in [*batch, *alone]:
        slot.record_features([1, FINAL])
    batch[0].prefill([1, 2, 3])  # a slot that held something is reset
    target.prefill_slots(batch, prompts)
    for slot, ids in zip(alone, prompts):
        slot.prefill(ids)
    for a, b, ids in zip(batch, alone, prompts):
        assert a.length == b.length == len(ids)
        if ids:
            assert torch.equal(a.features([1, FINAL], 0, len(ids)), b.features([1, FINAL], 0, len(ids)))
        assert torch.equal(a.extend([4, 2]), b.extend([4, 2]))
        assert torch.equal(a.features([1, FINAL], len(ids), len(ids) + 2), b.features([1, FINAL], len(ids), len(ids) + 2))


def test_a_repeated_prompt_is_computed_once(target) -> None:
    slots = [target.new_slot() for _ in range(3)]
    rows = []
    forward = target._slots_forward if isinstance(target, LlamaRuntime) else target.model.step
    name = "_slots_forward" if isinstance(target, LlamaRuntime) else "step"
    owner = target if isinstance(target, LlamaRuntime) else target.model
    setattr(owner, name, lambda slots_or_indices, tokens, *args, **kwargs: rows.append(sum(map(len, tokens)))
            or forward(slots_or_indices, tokens, *args, **kwargs))
    try:
        target.prefill_slots(slots, [P, P, P])
    finally:
        delattr(owner, name)
    assert sum(rows) == len(P)
    assert all(torch.equal(slot.extend([1]), slots[0].score([*P, 1])[-1:]) for slot in slots[1:])


def test_prompts_are_shared_only_with_the_same_feature_taps() -> None:
    computed, copies = shared_prompts(["a", "b", "c"], [[1], [1], [1]], {"a": (), "b": (FINAL,), "c": ()}.get)
    assert computed == [("a", [1]), ("b", [1])] and copies == [("c", "a")]


def test_the_scheduler_prefills_what_it_admits_in_one_call(target) -> None:
    calls = []
    original = target.prefill_slots
    target.prefill_slots = lambda slots, prompts: calls.append(len(slots)) or original(slots, prompts)
    try:
        scheduler = Scheduler(target, lambda request, slot: (PromptLookup(), 3) if request.proposer else (None, 0),
                              max_slots=4)
        requests = [Request(tuple(P), 12, sampling=SamplingParams(temperature=0.8), seed=i, proposer="lookup" if i % 2 else None,
                            k=3 if i % 2 else 0) for i in range(3)]
        requests.append(Request(tuple(R), 12, sampling=GREEDY))
        jobs = [scheduler.submit(request) for request in requests]
        scheduler.run()
    finally:
        del target.prefill_slots
    assert calls == [4]
    for job, request in zip(jobs, requests):
        proposer = PromptLookup() if request.proposer else None
        alone = generate(target, proposer, list(request.prompt_ids), max_new_tokens=12, sampling=request.sampling,
                         k=request.k, seed=request.seed)
        assert job.tokens == alone.tokens
