"""The sync budget: how often the host waits for the device, counted on a simulated accelerator.

On a GPU a decoding step is cheap only while the host never waits for the device: each wait
idles the GPU until the host has read the result and queued more. The static runtime on the
simulated device of `device_sim` (every synchronising call intercepted and counted) must stay
within: one synchronisation per round for plain and chain rounds (greedy and sampled), one per step for
the Scheduler at any concurrency, two per greedy EAGLE round (the head drafts on the device and
its k ids come back once). A new `.item()`, blocking copy or host read in a step fails here.
"""

from __future__ import annotations

import pytest
import torch
from device_sim import DEVICE, FakeDevice, OnDevice, counting_cuda_synchronize
from test_hf_adapter import tiny_llama

from verispec import GREEDY, SamplingParams, generate
from verispec.batching import Scheduler
from verispec.models.runtimes.static_llama import StaticLlama
from verispec.proposers import PromptLookup
from verispec.request import Request

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

PROMPT = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(0)


@pytest.fixture
def on_device(model, monkeypatch):
    """A static runtime on the simulated device, the counter reset after loading."""
    counting_cuda_synchronize(monkeypatch)
    with FakeDevice():
        lm = StaticLlama.from_hf(model, device=DEVICE, rows=4, slots=5, context=256)  # no growth in a step
        FakeDevice.reset()
        yield lm


def test_the_simulated_device_counts_every_wait(monkeypatch):
    counting_cuda_synchronize(monkeypatch)
    with FakeDevice():
        FakeDevice.reset()
        x = torch.arange(6, device=DEVICE).float()
        assert type(x) is OnDevice and FakeDevice.syncs == 0
        y = (x * 2).sum()
        float(y), y.item(), (x > 2).tolist(), x.cpu(), x[x > 2]
        torch.ones(3).to(DEVICE)
        torch.tensor([1, 2], device=DEVICE)
        torch.cuda.synchronize()
        assert FakeDevice.syncs == 8, FakeDevice.calls
        torch.ones(3).to(DEVICE, non_blocking=True)
        assert FakeDevice.syncs == 8
        with pytest.raises(RuntimeError, match="same device"):
            x + torch.ones(6)


@pytest.mark.parametrize(("proposer", "k"), [(None, 0), ("lookup", 3)], ids=["plain", "chain"])
def test_a_greedy_round_synchronises_once(model, on_device, proposer, k):
    def run(lm):
        return generate(lm, PromptLookup(2) if proposer else None, PROMPT, max_new_tokens=12, k=k, sampling=GREEDY)

    out = run(on_device)
    assert FakeDevice.syncs == out.stats.rounds, FakeDevice.calls
    assert out.tokens == run(StaticLlama.from_hf(model, rows=4, slots=5, context=64)).tokens  # the CPU's tokens


SAMPLED = [SamplingParams(), SamplingParams(temperature=0.8, top_p=0.9),
           SamplingParams(temperature=0.0, repetition_penalty=1.3, min_tokens=4),
           SamplingParams(temperature=0.7, top_k=5, repetition_penalty=1.2, min_tokens=4)]


@pytest.mark.parametrize("sampling", SAMPLED, ids=["T1", "top-p", "greedy-penalties", "sampled-penalties"])
def test_a_round_with_transforms_synchronises_once(on_device, sampling):
    """p is checked where it is made (NaN wherever a check would refuse) and crosses once; the
    penalties' masks go up in one copy the host does not wait for."""
    out = generate(on_device, PromptLookup(2), PROMPT, max_new_tokens=12, k=3, sampling=sampling, eos_token_id=7)
    assert FakeDevice.syncs == out.stats.rounds, FakeDevice.calls


@pytest.mark.parametrize("concurrency", [1, 3, 5])
def test_the_scheduler_synchronises_once_a_step(on_device, concurrency):
    scheduler = Scheduler(on_device, lambda request, slot: (PromptLookup(2), 3), max_slots=5)
    jobs = [scheduler.submit(Request(tuple(PROMPT[i:] + PROMPT[:i]), 10 + i, proposer="lookup", k=3))
            for i in range(concurrency)]
    scheduler.run()
    assert all(job.finish_reason == "length" for job in jobs)
    assert FakeDevice.syncs == scheduler.steps, FakeDevice.calls


def test_a_greedy_eagle_round_synchronises_twice(model, on_device):
    """The head drafts its chain on the device from the target's features there; only its k
    ids come back (once), then the round's rows (once). Same tokens as the CPU's. A request's
    one-time costs (the head's cache's first allocation) cancel in the difference of two runs."""
    from test_heads import hf_head

    from verispec.heads.config import FINAL
    from verispec.proposers.eagle import EagleProposer

    on_host = StaticLlama.from_hf(model, rows=4, slots=5, context=256)
    with torch.random.fork_rng():
        torch.manual_seed(0)
        head = hf_head("eagle", on_host, taps=(FINAL, 2))  # built on the host
    expected = generate(on_host, EagleProposer(head, on_host), PROMPT, max_new_tokens=24, k=3, sampling=GREEDY).tokens
    head.to(DEVICE).embedding = on_device.input_embeddings()  # the frozen embedding is the target's own
    drafter = EagleProposer(head, on_device)

    def run(new: int) -> tuple[list[int], int, int]:
        FakeDevice.reset()
        out = generate(on_device, drafter, PROMPT, max_new_tokens=new, k=3, sampling=GREEDY)
        return out.tokens, FakeDevice.syncs, out.stats.rounds + sum(1 for drafted in out.stats.drafted if drafted)

    _, short, short_budget = run(8)
    tokens, long, long_budget = run(24)
    assert long_budget > short_budget and long - short == long_budget - short_budget, FakeDevice.calls
    assert tokens == expected


@pytest.mark.parametrize(("row", "sampling", "message"), [
    ([0.0, float("nan")], GREEDY, "NaN"),
    ([0.0, float("inf")], SamplingParams(), r"\+inf"),
    ([float("-inf"), float("-inf")], SamplingParams(top_p=0.9), "entirely -inf"),
    ([3e38, 0.0], SamplingParams(temperature=1e-300), "overflows"),
    ([-3e38, -3e38], SamplingParams(temperature=1e-300), "underflows"),
])
def test_what_the_checks_refused_is_still_refused_after_one_copy(row, sampling, message):
    """The checks ride along as flags computed where the rows are; a flagged round reads the
    rows again to say what is wrong, with the message the host's check gives."""
    from verispec.sampling import rule_rows

    with pytest.raises(ValueError, match=message):
        rule_rows(torch.tensor([[1.0, 0.0], row]), sampling)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_greedy_host_rows_refuse_what_the_check_refuses_and_take_the_first_maximum(dtype):
    """On the host greedy's argmax and finiteness come from numpy (torch's for bfloat16): the
    same first index on ties, and NaN, +inf and a row entirely -inf still refused."""
    from verispec.sampling import rule_rows

    rows = torch.tensor([[1.0, 3.0, 3.0, float("-inf")], [2.0, 0.0, 2.0, 1.0]], dtype=dtype)
    assert rule_rows(rows, GREEDY).tolist() == [1, 0]
    nan, inf = float("nan"), float("inf")
    for bad, message in (([0.0, nan, 1.0], "NaN"), ([nan, 2.0, 1.0], "NaN"), ([2.0, inf, nan], "NaN"),
                         ([0.0, inf, 1.0], r"\+inf"), ([inf, 2.0, 1.0], r"\+inf"), ([-inf] * 3, "entirely -inf")):
        with pytest.raises(ValueError, match=message):
            rule_rows(torch.tensor([[1.0, 0.0, 0.0], bad], dtype=dtype), GREEDY)


def test_legal_masks_pass_the_check():
    from verispec.sampling import rule_rows

    masked = torch.tensor([[0.0, float("-inf"), 1.0]])
    assert rule_rows(masked, GREEDY).tolist() == [2]
    assert rule_rows(masked, SamplingParams())[0, 1] == 0


def test_a_prefill_is_waited_for_once_so_its_work_is_not_the_first_round_s(on_device, monkeypatch):
    """On CUDA the engine waits for a prefill (nothing of it comes back): one more
    synchronisation per request, and in the scheduler per admission of several together."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    out = generate(on_device, PromptLookup(2), PROMPT, max_new_tokens=12, k=3, sampling=GREEDY)
    assert FakeDevice.syncs == out.stats.rounds + 1 and FakeDevice.calls[0] == "torch.cuda.synchronize"
    FakeDevice.reset()
    scheduler = Scheduler(on_device, lambda request, slot: (PromptLookup(2), 3), max_slots=5)
    for i in range(3):
        scheduler.submit(Request(tuple(PROMPT[i:]), 8, proposer="lookup", k=3))
    scheduler.run()
    assert FakeDevice.syncs == scheduler.steps + 1, FakeDevice.calls  # the three admitted together
