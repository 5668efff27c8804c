"""Batch-invariant scoring on the fast runtime: a row's logits are the same bits whatever else a
forward scores (other slots, their row counts, slots joining and leaving), in float32,
bfloat16 and q4.

Projections: every row of a prepacked product keeps its bits at any row count, on rows whose
exact products cancel (pure rounding residue, so any other summation order shows). Slots: each
slot's logits in `extend_slots` steps of shifting company, and after `prefill_slots`, equal the
same rows extended alone. Model widths as the default model's (hidden 576, K = 576 and 1,536,
where oneDNN's bfloat16 kernel on AMX changes past 32 rows), two layers, so the forwards
cross those row counts in a second. The scheduler and the server: tests/test_batching_model.py
and tests/test_server_concurrency.py."""

from __future__ import annotations

import random

import pytest
import torch
from test_hf_adapter import tiny_llama
from transformers import LlamaConfig, LlamaForCausalLM

from verispec import GREEDY, SamplingParams, generate
from verispec.batching import Scheduler
from verispec.models.base import FINAL
from verispec.models.formats.linear import MAX_BLOCK, PackedLinear, row_blocks
from verispec.models.runtimes.llama import LlamaRuntime
from verispec.models.formats.quant import linear_for
from verispec.proposers import DraftModel
from verispec.request import Request

pytestmark = pytest.mark.usefixtures("one_thread_per_module")

VOCAB = 512
SHAPES = [(960, 576), (3072, 576), (576, 1536)]  # the default model's qkv, gate+up and down


def cancelling(rows: int, width: int, sign: float, generator: torch.Generator) -> torch.Tensor:
    """[rows, width]: (a, sign * a permuted), so x . w cancels exactly between two such."""
    a = torch.randn(rows, width // 2, generator=generator)
    order = torch.randperm(width // 2, generator=torch.Generator().manual_seed(1))
    return torch.cat((a, sign * a[:, order]), 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_a_projection_row_keeps_its_bits_at_any_row_count(dtype, shape) -> None:
    out, width = shape
    generator = torch.Generator().manual_seed(0)
    layer = PackedLinear(cancelling(out, width, -1, generator).to(dtype))
    x = cancelling(300, width, 1, generator).to(dtype)  # [300, in]
    alone = torch.cat([layer(x[i : i + 1]) for i in range(300)])  # [300, out]
    for m in (2, 3, 17, 32, 33, 40, 64, 65, 100, 128, 129, 200, 300):
        assert torch.equal(layer(x[:m]), alone[:m]), (m, layer.blocks)
        assert torch.equal(layer(x[300 - m :]), alone[300 - m :]), (m, layer.blocks)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_probe_blocks_rows_only_where_the_kernel_would_change_them(dtype) -> None:
    """Where the probe chose blocks smaller than it can, an unblocked product of the probe's
    rows must really differ from the blocked one (else the blocks only cost time). K = 8,960
    (a 1.5B model's down projection) takes blocks of 32 rows in bfloat16 on AMX."""
    generator = torch.Generator().manual_seed(0)
    for out, width in [*SHAPES, (1536, 8960)]:
        layer = PackedLinear(cancelling(out, width, -1, generator).to(dtype))
        assert layer.blocks == row_blocks(out, width, dtype) and layer.blocks.size >= 2
        if layer.blocks.size < MAX_BLOCK:
            x = cancelling(MAX_BLOCK, width, 1, generator).to(dtype)
            assert not torch.equal(layer._linear(x), layer(x)), layer.blocks


def test_q4_rows_keep_their_bits_at_any_row_count() -> None:
    generator = torch.Generator().manual_seed(0)
    layer = linear_for(torch.randn(3072, 576, generator=generator) * 0.05, "q4", exact=False)
    x = torch.randn(200, 576, generator=generator)
    alone = torch.cat([layer(x[i : i + 1]) for i in range(200)])
    for m in (2, 5, 33, 64, 65, 129, 200):
        assert torch.equal(layer(x[:m]), alone[:m]), m


def default_widths() -> LlamaForCausalLM:
    """Two layers of the default model's widths, random weights, a small vocabulary."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=1024,
                         initializer_range=0.05)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return default_widths()


RUNTIMES = {
    "float32": lambda model: LlamaRuntime.from_hf(model, deterministic=True),
    "bfloat16": lambda model: LlamaRuntime.from_hf(model, deterministic=True, dtype=torch.bfloat16),
    "q4": lambda model: LlamaRuntime.from_hf(model, "q4", deterministic=True),
}


@pytest.mark.parametrize("dtype", list(RUNTIMES))
def test_a_slot_scores_the_same_bits_whatever_slots_share_its_steps(model, dtype) -> None:
    """Six requests, each a prompt then steps of 1 to 9 rows (one of 80), join and leave a
    shifting batch; every step's logits equal the same rows of that request extended alone."""
    lm = RUNTIMES[dtype](model)
    rng = random.Random(0)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 40, 70, 9, 130, 20)]
    steps = [[[rng.randrange(VOCAB) for _ in range(rng.choice((1, 2, 4, 5, 9, 80)))] for _ in range(5)]
             for _ in prompts]
    for i in (0, 1):  # the second step: 160 rows and more together
        steps[i][1] = [rng.randrange(VOCAB) for _ in range(80)]
    alone = []
    for prompt, rows in zip(prompts, steps):
        slot = lm.new_slot()
        slot.prefill(prompt)
        alone.append([slot.extend(step) for step in rows])  # [n_i, V] per step
    batch = [lm.new_slot() for _ in prompts]
    done = [0] * len(prompts)
    lm.prefill_slots(batch[:4], prompts[:4])  # four join at once; the others later, alone
    joined = [True] * 4 + [False] * 2
    largest = 0
    for step in range(12):
        if step == 2:
            lm.prefill_slots(batch[4:], prompts[4:])
            joined[4:] = [True, True]
        active = [i for i in range(len(prompts)) if joined[i] and done[i] < 5 and (step < 2 or rng.random() < 0.8)]
        if not active:
            continue
        rows = [steps[i][done[i]] for i in active]
        largest = max(largest, sum(map(len, rows)))
        for i, logits in zip(active, lm.extend_slots([batch[i] for i in active], rows)):
            assert torch.equal(logits, alone[i][done[i]]), (dtype, i, done[i], [len(r) for r in rows])
            done[i] += 1
    assert largest > 129 and sum(done) >= 20  # steps crossed every block size, most rows were scored


class Counted:
    """An attention that notes how many slots each call scores together (q [B, Hq, m, D])."""

    def __init__(self, inner) -> None:
        self.inner, self.slots = inner, []

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def __call__(self, q: torch.Tensor, *rest) -> torch.Tensor:
        self.slots.append(q.shape[0])
        return self.inner(q, *rest)


@pytest.mark.parametrize("reserved", [False, True], ids=["own caches", "arena"])
@pytest.mark.parametrize("dtype", list(RUNTIMES))
def test_slots_of_equal_length_attend_together_and_a_reused_slot_is_fresh(model, dtype, reserved) -> None:
    """Seven slots, five of one length (one attention call over them, then runs of equal
    length but other row counts) beside two of other lengths, with caches of their own or in
    one reserved arena (one write and read per layer for a run); slot 0 is reused after a
    longer request (200 positions), slot 6 after one of 300 (its cache grew past a fresh
    slot's, out of the arena), and every slot records features. Each slot's logits and
    features equal a fresh slot's extended alone, bit for bit."""
    lm = RUNTIMES[dtype](model)
    taps = [1, FINAL]
    rng = random.Random(2)
    prompts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (12, 12, 12, 12, 12, 5, 30)]
    counts = [(4, 4, 1, 3)] * 4 + [(4, 2, 3, 3), (4, 1, 2, 2), (1, 4, 4, 1)]
    steps = [[[rng.randrange(VOCAB) for _ in range(m)] for m in rows] for rows in counts]

    def fresh() -> LlamaRuntime:
        slot = lm.new_slot()
        slot.record_features(taps)
        return slot

    alone = []
    for prompt, rows in zip(prompts, steps):
        slot = fresh()
        slot.prefill(prompt)
        alone.append([(slot.extend(step), slot.features(taps, 0, slot.length)) for step in rows])
    if reserved:
        lm.reserve_slots(len(prompts))
    batch = [fresh() for _ in prompts]
    for slot, longer in ((batch[0], 200), (batch[6], 300)):
        slot.prefill([rng.randrange(VOCAB) for _ in range(longer)])
        slot.extend([rng.randrange(VOCAB) for _ in range(5)])
    assert [slot.cache.arena is not None for slot in batch] == [reserved] * 6 + [False]
    if reserved:  # the row slot 6 left is free again, and so is a row whose slot goes
        rows = [lm.new_slot().cache.row for _ in range(2)]
        assert rows == [6, 6]
    lm.attention = counted = Counted(lm.attention)
    lm.prefill_slots(batch, prompts)
    for step in range(4):
        rows = [steps[i][step] for i in range(len(batch))]
        for i, logits in enumerate(lm.extend_slots(batch, rows)):
            expected, features = alone[i][step]
            assert torch.equal(logits, expected), (dtype, i, step)
            assert torch.equal(batch[i].features(taps, 0, batch[i].length), features), (dtype, i, step)
    assert max(counted.slots) == 5 and 4 in counted.slots  # five prefilled together, then four of equal rows


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_each_request_of_a_mixed_batch_decodes_as_alone(model, dtype) -> None:
    """The Scheduler over the same model: seven requests (greedy and seeded, plain and drafted
    by a small draft model at k up to 15, so steps score up to ~50 rows), five at once then two
    joining as others leave; each request's tokens equal the same request decoded alone."""
    lm = RUNTIMES[dtype](model)
    draft = LlamaRuntime.from_hf(tiny_llama(1, layers=1, vocab=VOCAB))
    rng = random.Random(1)
    requests = []
    for i in range(7):
        prompt = tuple(rng.randrange(VOCAB) for _ in range(rng.randint(1, 40)))
        sampling = GREEDY if i % 3 else SamplingParams(temperature=0.9)
        k = (0, 15, 8, 12, 3, 15, 10)[i]
        requests.append(Request(prompt, rng.randint(6, 20), sampling=sampling, seed=i, proposer="draft" if k else None, k=k))

    def proposer(request: Request) -> DraftModel | None:
        return DraftModel(draft.new_slot()) if request.k else None

    scheduler = Scheduler(lm, lambda request, slot: (proposer(request), request.k), max_slots=5)
    jobs = [scheduler.submit(request) for request in requests]
    scheduler.run()
    assert max(scheduler.step_rows) > 32
    for job, request in zip(jobs, requests):
        alone = generate(lm, proposer(request), list(request.prompt_ids),
                         max_new_tokens=request.max_new_tokens, sampling=request.sampling, k=request.k, seed=request.seed)
        assert job.tokens == alone.tokens, (dtype, request.k, request.sampling)
