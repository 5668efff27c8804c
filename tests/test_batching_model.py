"""Batches on the default model: every request's greedy output is token for token what it
decodes alone, in float32, bfloat16 and q4 with deterministic scoring (its rows do not depend on
what else the forward scores), whatever proposers and k share its steps; the statistical test
at T = 1 with 4 requests at once; memory counted from the tensors."""

from __future__ import annotations

from collections import Counter

import pytest

from verispec import TorchRandom, generate
from verispec.batching import RegistryBuilder, Scheduler
from verispec.models.loading.memory import memory_report, tensor_bytes
from verispec.registry import build_proposer
from verispec.request import Request
from verispec.sampling import GREEDY, SamplingParams

PROMPTS = [
    "Repeat this sentence twice: the cat sat on the mat.",
    "What is the capital of France? Answer in one word.",
    "Write a Python function that returns the square of a number.",
    "List three colours.",
    "Summarise: The lighthouse was built in 1874 from granite. The lighthouse was automated in 1989.",
]
SPECS = [(None, 0), ("lookup", 4), ("lookup+eagle", 3), ("eagle", 2), ("lookup", 2)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "q4"])
def test_each_request_of_a_batch_decodes_as_alone(dtype):
    from verispec.models import load_model

    model = load_model(dtype=dtype, deterministic=True)
    scheduler = Scheduler(model.lm, RegistryBuilder(model), max_slots=4)
    requests = [
        Request(tuple(model.encode(prompt)), 16, proposer=spec, k=k, eos_token_ids=model.eos_token_ids)
        for prompt, (spec, k) in zip(PROMPTS, SPECS)
    ]
    jobs = [scheduler.submit(request) for request in requests[:3]]
    scheduler.step()
    scheduler.step()
    jobs += [scheduler.submit(request) for request in requests[3:]]  # join mid-flight; one waits for a slot
    scheduler.run()
    assert max(scheduler.step_rows) > 4  # steps really shared a forward
    for job, request in zip(jobs, requests):
        # each proposer alone already equals plain decoding (the greedy identity suite)
        plain = generate(model.lm, None, request.prompt_ids, max_new_tokens=16, k=0, sampling=GREEDY,
                         eos_token_id=model.eos_token_ids)
        assert job.tokens == plain.tokens, (dtype, request.proposer)


@pytest.mark.slow
def test_memory_follows_the_weight_format():
    from verispec.models import load_model

    full = load_model(dtype="float32")
    half = load_model(dtype="bfloat16")
    proposer = build_proposer("eagle", half)
    report = memory_report(half.lm, proposer, slots=8, context=512)
    # bfloat16 halves the cache (the invariant attention keeps one ones column beside the values)
    assert 0.5 <= report["kv_bytes_per_token"] / memory_report(full.lm)["kv_bytes_per_token"] < 0.52
    assert 0.45 < report["target_weight_bytes"] / memory_report(full.lm)["target_weight_bytes"] < 0.55
    # the head (int8 where the CPU computes bfloat16 natively, else float32: up to ~40 MB), not the
    # target it reads (~270 MB in bfloat16)
    assert 0 < report["proposer_bytes"] < 0.2 * report["target_weight_bytes"]
    assert report["kv_bytes_all_slots"] == 8 * 512 * report["kv_bytes_per_token"]
    assert tensor_bytes(proposer, exclude=[half.lm]) == report["proposer_bytes"]


def test_tensor_bytes_counts_each_storage_once():
    import torch

    a = torch.zeros(10, dtype=torch.float32)
    holder = {"a": a, "view": a[2:5], "again": [a], "b": torch.zeros(3, dtype=torch.bfloat16)}
    assert tensor_bytes(holder) == 40 + 6
    assert tensor_bytes(holder, exclude=[a]) == 6
