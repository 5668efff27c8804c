"""Continuous batching (`verispec.batching`) on exact tables: each request of a batch emits what it
would emit alone, its law is its target's whatever shares its steps (exhaustive, on the joint
random choices of every request), the negative controls are caught, and the scheduler's own
bookkeeping (joins, leaves, cancellation, queue bound, slots reused, k per batch)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import SamplingParams
from verispec.audit.enumerate import outcomes
from verispec.audit.exact_target import target_sequences
from verispec.batching import QueueFull, Scheduler
from verispec.clocks import TickClock
from verispec.cost import BatchCosts, FixedCosts
from verispec.engine import generate, stream
from verispec.models.table_pair import Tables
from verispec.models.tables import TableLM, random_table
from verispec.plan import Plan
from verispec.policies import Adjustable, AutoK, BatchK, HeuristicK
from verispec.proposers.draft_model import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.reference import reference_request
from verispec.registry import PROPOSERS
from verispec.request import Request
from verispec.sampling import GREEDY
from verispec.tree_shape import TreeShape

T1 = SamplingParams(temperature=1.0)

AUDITED = [name for name, kind in PROPOSERS.items() if kind.audit is not None]


def audit_builder(draft: TableLM, policies: dict[str, Callable[[], object]] | None = None):
    """Builds a request's proposer on its slot from the registry's audit fixture named by
    `request.proposer` (with a draft table of the slot's own), and its policy:
    `policies[request.k]()` for a named one, else the k."""

    def build(request: Request, slot: TableLM):
        tables = Tables(slot, draft.new_slot())  # a draft model's cache is its slot's own
        proposer = None if request.proposer is None else PROPOSERS[request.proposer].audit(tables)
        k = request.k
        return proposer, (policies[k]() if isinstance(k, str) else k)

    return build


def auto_policy(k: int = 3) -> AutoK:
    return AutoK(FixedCosts(c=0.15, v=[1.0, 1.0, 1.1, 1.3, 1.6][: k + 1]), margin=0.1, probe_every=1)


# --- equal to the reference, request by request, under random joins ----------------------------


@st.composite
def batches(draw):
    vocab = draw(st.integers(2, 4))
    target = random_table(vocab, draw(st.integers(1, 2)), draw(st.integers(0, 10**6)), zeros=draw(st.booleans()))
    draft = random_table(vocab, 2, draw(st.integers(0, 10**6)))
    token = st.integers(0, vocab - 1)
    requests = []
    for _ in range(draw(st.integers(1, 4))):
        greedy = draw(st.booleans())
        kind = draw(st.sampled_from([None, *AUDITED]))
        rules = ["auto"] if kind is None else PROPOSERS[kind].rules_for(GREEDY if greedy else T1)
        verifier = draw(st.sampled_from(["auto", *rules])) if kind is not None else "auto"
        k = 0 if kind is None else draw(st.sampled_from([1, 2, 3, "heuristic"]))
        requests.append((
            draw(st.integers(0, 3)),  # the step before which it is submitted
            Request(
                tuple(draw(st.lists(token, min_size=1, max_size=6))),
                draw(st.integers(0, 6)),
                sampling=GREEDY if greedy else SamplingParams(temperature=draw(st.sampled_from([1.0, 0.6]))),
                eos_token_ids=draw(st.none() | token.map(lambda t: {t})) or frozenset(),
                seed=draw(st.integers(0, 2**31 - 1)),
                proposer=kind,
                k=k,
                verifier=verifier if verifier in ("auto", "greedy", "token", "block", "point-mass") else "auto",
                max_k=None if kind is None else draw(st.none() | st.integers(0, 2)),
            ),
            draw(st.none() | st.integers(1, 4)),  # cancelled after this many of its steps
        ))
    return target, draft, requests, draw(st.integers(1, 3))


@settings(max_examples=120, deadline=None)
@given(batch=batches())
def test_each_request_of_a_batch_emits_the_reference_tokens(batch):
    """Joins, leaves and cancellations between steps, 1-3 slots: a finished request's tokens are
    the full-recompute reference's for its seed; a cancelled one's are a prefix of them."""
    target, draft, entries, slots = batch
    policies = {"heuristic": lambda: HeuristicK(2)}
    scheduler = Scheduler(target, audit_builder(draft, policies), max_slots=slots, clock=TickClock())
    jobs, pending = [], sorted(entries, key=lambda e: e[0])
    step = 0
    while pending or not scheduler.idle:
        while pending and pending[0][0] <= step:
            _, request, cancel_after = pending.pop(0)
            jobs.append((scheduler.submit(request), cancel_after, step))
        for job, cancel_after, submitted in jobs:
            if cancel_after is not None and step - submitted >= cancel_after:
                scheduler.cancel(job)
        scheduler.step()
        step += 1
        assert step < 500
    for job, cancel_after, _ in jobs:
        r = job.request
        proposer = None if r.proposer is None else PROPOSERS[r.proposer].audit(Tables(target, draft))
        expected = reference_request(target, proposer, r, policy=policies[r.k]() if isinstance(r.k, str) else None)
        if job.finish_reason == "cancelled":
            assert job.tokens == expected[: len(job.tokens)]
        else:
            assert job.tokens == expected and job.finish_reason == ("stop" if expected and expected[-1] in r.eos_token_ids else "length")


def test_max_k_caps_every_round_and_keeps_the_greedy_tokens():
    target = random_table(4, 2, 11)
    prompt = (0, 1, 2, 0, 1, 2, 0, 1)
    plain = generate(target, None, Request(prompt, 12)).tokens
    for max_k in (0, 1, 2):
        request = Request(prompt, 12, proposer="lookup", k=4, max_k=max_k)
        run = generate(target, PromptLookup(), request)
        assert run.tokens == plain and max(run.stats.drafted) <= max_k
    assert max(generate(target, PromptLookup(), Request(prompt, 12, proposer="lookup", k=4)).stats.drafted) > 2
    with pytest.raises(ValueError, match="max_k must be an integer >= 0"):
        Request(prompt, 12, proposer="lookup", k=4, max_k=-1)


# --- the exhaustive audit of batched steps --------------------------------------------------------


def joint_law(target: TableLM, draft: TableLM, requests: list[tuple[int, Request]], *, policies=None,
              batch_costs=None, slots: int = 3) -> dict[tuple, float]:
    """The scheduler's joint output distribution over every path of the requests' random
    choices (one enumerating source shared by all: the product of their own streams), each
    request submitted before its step."""

    def run(rng):
        scheduler = Scheduler(target, audit_builder(draft, policies), max_slots=slots, batch_costs=batch_costs,
                              random=lambda request: rng.seeded(request.seed), clock=TickClock())
        jobs, step = {}, 0
        while len(jobs) < len(requests) or not scheduler.idle:
            for i, (when, request) in enumerate(requests):
                if when == step:
                    jobs[i] = scheduler.submit(request)
            scheduler.step()
            step += 1
        return tuple(tuple(jobs[i].tokens) for i in range(len(requests)))

    law: dict[tuple, float] = {}
    for probability, outputs in outcomes(run):
        law[outputs] = law.get(outputs, 0.0) + probability
    return law


def product_of_exact_laws(target: TableLM, requests: list[Request]) -> dict[tuple, Fraction]:
    """Independent requests, each with its own plain-decoding law."""
    joint: dict[tuple, Fraction] = {(): Fraction(1)}
    for r in requests:
        own = target_sequences(target, r.prompt_ids, sampling=r.sampling, max_new_tokens=r.max_new_tokens,
                               eos_token_id=r.eos_token_ids)
        joint = {(*outs, seq): p * q for outs, p in joint.items() for seq, q in own.items()}
    return joint


def distance(exact: dict, observed: dict) -> float:
    return max(abs(float(exact.get(key, 0)) - observed.get(key, 0.0)) for key in exact.keys() | observed.keys())


TOP_P = SamplingParams(temperature=0.5, top_k=2)
BATCHED_AUDIT = {
    # name: (order, [(step submitted, request)], k policies by name, batch costs)
    "draft+eagle+plain": (2, [
        (0, Request((0, 1, 0), 3, sampling=T1, proposer="draft", k=2, verifier="token", seed=1)),
        (0, Request((2,), 2, sampling=T1, proposer="eagle", k=2, verifier="block", seed=2)),
        (1, Request((1, 1), 1, sampling=T1, seed=3)),
    ], None, None),
    "lookup+medusa auto, lookup, medusa": (1, [
        (0, Request((0, 1, 0, 1), 3, sampling=T1, proposer="lookup+medusa", k="auto", seed=4)),
        (1, Request((1, 2, 1, 2), 2, sampling=TOP_P, proposer="lookup", k=2, verifier="point-mass", seed=5)),
        (0, Request((2, 0), 2, sampling=T1, proposer="medusa", k=1, verifier="token", seed=6)),
    ], {"auto": lambda: auto_policy(2)}, BatchCosts((1, 2, 4, 8), (1.0, 1.3, 1.9, 3.5))),
    "two draft models side by side": (1, [  # distinct seeds: one seed would give one sample
        (0, Request((0,), 2, sampling=T1, proposer="draft", k=1, seed=0)),
        (0, Request((0,), 2, sampling=T1, proposer="draft", k=1, seed=10)),
    ], None, None),
    "suffix, lookahead, random with EOS": (1, [
        (0, Request((0, 2, 0, 2), 3, sampling=T1, proposer="suffix", k=2, eos_token_ids={1}, seed=7)),
        (0, Request((1, 0), 2, sampling=T1, proposer="lookahead", k=2, eos_token_ids={1}, seed=8)),
        (1, Request((2, 2), 2, sampling=T1, proposer="random", k=2, eos_token_ids={1}, seed=9)),
    ], None, None),
}


@pytest.mark.parametrize("name", BATCHED_AUDIT)
def test_batched_steps_keep_each_requests_exact_law(name):
    """The joint law of requests that share steps (joining at different steps, different
    proposers, rules, k policies, sampling) is the product of each one's exact target law:
    each request's law is its own, and does not change with its neighbours."""
    order, requests, policies, costs = BATCHED_AUDIT[name]
    target = random_table(3, order, seed=11, eos_token_id=1)
    draft = random_table(3, 2, seed=12)
    exact = product_of_exact_laws(target, [r for _, r in requests])
    observed = joint_law(target, draft, requests, policies=policies, batch_costs=costs)
    assert distance(exact, observed) <= 1e-12
    assert abs(sum(observed.values()) - 1) <= 1e-12


class SwappedSlots(TableLM):
    """Negative control: a batched forward that hands two requests each other's rows."""

    def extend_slots(self, slots, tokens):
        out = super().extend_slots(slots, tokens)
        return out[::-1] if len(out) == 2 and len(out[0]) == len(out[1]) else out


class StaleSlot(TableLM):
    """Negative control: a slot whose rollback moves its length but keeps the rejected rows in the
    context its next forward reads (the cache is not rolled back)."""

    def new_slot(self, capacity: int = 256):
        slot = super().new_slot(capacity)
        slot._logical = 0
        return slot

    @property
    def length(self) -> int:
        return getattr(self, "_logical", len(self._processed))

    def prefill(self, ids):
        super().prefill(ids)
        self._logical = len(ids)

    def extend(self, tokens, keep=None):
        self._logical = self.length + len(tokens)
        return super().extend(tokens, keep)

    def rollback(self, length: int) -> None:
        self._logical = length


@pytest.mark.parametrize("control", [SwappedSlots, StaleSlot])
def test_the_batched_audit_catches_a_broken_batch(control):
    base = random_table(3, 2, seed=11)
    target = control(base.rows, base.order)
    draft = random_table(3, 2, seed=12)
    requests = [
        (0, Request((0, 1), 3, sampling=T1, proposer="draft", k=2, verifier="token", seed=1)),
        (0, Request((2, 2), 3, sampling=T1, proposer="draft", k=2, verifier="token", seed=2)),
    ]
    if control is SwappedSlots:
        requests = [(0, Request((0, 1), 2, sampling=T1, seed=1)), (0, Request((2, 2), 2, sampling=T1, seed=2))]
    exact = product_of_exact_laws(base, [r for _, r in requests])
    assert distance(exact, joint_law(target, draft, requests)) > 1e-3


def test_a_draft_model_shared_by_two_slots_is_refused():
    """Two slots drafting with one draft model move each other's cache, and each request's draws
    would come from the other's context: the draft proposer refuses it at its next draft."""
    target, draft = random_table(3, 1, seed=0), random_table(3, 2, seed=7)
    scheduler = Scheduler(target, lambda request, slot: (DraftModel(draft), 1), max_slots=2, clock=TickClock())
    for seed in (0, 1):
        scheduler.submit(Request((0,), 3, sampling=T1, proposer="draft", k=1, seed=seed))
    with pytest.raises(RuntimeError, match="a draft model of its own"):
        for _ in range(4):
            scheduler.step()


# --- the scheduler's bookkeeping ------------------------------------------------------------------


def small_scheduler(**options) -> tuple[Scheduler, TableLM]:
    target = random_table(4, 1, seed=3)
    return Scheduler(target, audit_builder(random_table(4, 1, seed=4)), **options), target


def test_slots_bound_the_batch_and_queue_the_rest():
    scheduler, _ = small_scheduler(max_slots=2, max_waiting=1)
    jobs = [scheduler.submit(Request((0, 1), 5, proposer="lookup", k=2)) for _ in range(3)]
    with pytest.raises(QueueFull):
        scheduler.submit(Request((0,), 2))
    scheduler.step()
    assert [job.state for job in jobs] == ["running", "running", "waiting"] and scheduler.slots_in_use == 2
    scheduler.run()
    assert all(job.done and len(job.tokens) == 5 for job in jobs) and scheduler.idle
    assert scheduler._slots == 2  # the third request reused a freed slot


def test_cancelling_frees_the_slot_at_the_next_step():
    scheduler, _ = small_scheduler(max_slots=1)
    first = scheduler.submit(Request((0,), 50))
    second = scheduler.submit(Request((1,), 3))
    scheduler.step()
    scheduler.cancel(first)
    scheduler.step()
    assert first.finish_reason == "cancelled" and first.done and second.state == "running"
    scheduler.run()
    assert len(second.tokens) == 3 and second.finish_reason == "length"
    waiting = scheduler.submit(Request((1,), 3))
    scheduler.cancel(waiting)
    scheduler.step()
    assert waiting.finish_reason == "cancelled" and waiting.tokens == []


def test_zero_budget_and_bad_requests():
    scheduler, _ = small_scheduler(max_context=8)
    job = scheduler.submit(Request((0,), 0))
    scheduler.run()
    assert job.done and job.tokens == [] and job.finish_reason == "length"
    with pytest.raises(ValueError, match="outside the vocabulary"):
        scheduler.submit(Request((9,), 2))
    with pytest.raises(ValueError, match="exceed the context of 8"):
        scheduler.submit(Request((0,) * 5, 4))
    with pytest.raises(ValueError, match="batching needs a model with slots"):
        Scheduler(object(), audit_builder(random_table(4, 1, seed=4)))
    with pytest.raises(ValueError, match="max_slots"):
        small_scheduler(max_slots=0)


def test_a_step_scores_every_requests_rows_in_one_forward():
    scheduler, target = small_scheduler(max_slots=3)
    calls = []
    original = target.extend_slots
    target.extend_slots = lambda slots, tokens: calls.append([len(t) for t in tokens]) or original(slots, tokens)
    for prompt, k in (((0, 1, 0, 1), 2), ((2,), 0), ((1, 3), 3)):
        scheduler.submit(Request(prompt, 4, proposer="draft" if k else None, k=k))
    scheduler.step()
    assert calls == [[3, 1, 4]] and scheduler.step_rows == [8]


# --- k per batch --------------------------------------------------------------------------------


def test_batch_k_drafts_as_alone_when_v_is_flat_and_less_when_it_rises():
    entry = Adjustable(most=4, survival=[0.8, 0.6, 0.45, 0.3], c=0.02)
    flat = BatchK(BatchCosts((1, 64), (1.0, 1.0)))
    assert flat.plan([entry] * 4, 0) == [4, 4, 4, 4]
    linear = BatchK(BatchCosts((1, 2, 64), (1.0, 2.0, 64.0)))  # every row costs a whole forward
    assert linear.plan([entry] * 4, 0) == [0, 0, 0, 0]
    bent = BatchK(BatchCosts((1, 8, 16, 64), (1.0, 1.2, 2.0, 8.0)))  # cheap to 8 rows, then steep
    ks = bent.plan([entry] * 4, 0)
    assert 4 < sum(ks) + 4 <= 10 and max(ks) - min(ks) <= 1
    # fixed-k requests already use the cheap rows: the auto ones draft less
    assert sum(bent.plan([entry] * 4, fixed_rows=12, fixed_tokens=9.0)) < sum(ks)
    assert linear.plan([entry] * 2, fixed_rows=8, fixed_tokens=6.0) == [0, 0]


def test_batch_k_adjusts_only_the_plans_that_let_it():
    """`BatchK.adjust` gives the chains whose policy lets a batch choose their k (auto k's plans
    carry an `adjustable`) the k `plan` would, None for the others (kept whole, their rows, a
    tree's nodes + 1, and their tokens counted); the plan applies it, within its bounds."""
    entry = Adjustable(4, (0.8, 0.6, 0.45, 0.3), 0.02)
    adjustable = Plan(4, source="copy", adjustable=entry)
    tree = Plan(shape=TreeShape.of([(0,), (1,), (0, 0)]))
    plans, tokens = [adjustable, Plan(3), tree, adjustable], [1.0, 2.5, 1.5, 1.0]
    for costs in ((1, 64), (1.0, 1.0)), ((1, 2, 64), (1.0, 2.0, 64.0)), ((1, 8, 16, 64), (1.0, 1.2, 2.0, 8.0)):
        batch_k = BatchK(BatchCosts(*costs))
        first, last = batch_k.plan([entry, entry], fixed_rows=4 + 4, fixed_tokens=4.0)
        assert batch_k.adjust(plans, tokens) == [first, None, None, last]
        assert adjustable.adjusted(first) == replace(adjustable, k=first)
    assert BatchK(BatchCosts((1, 64), (1.0, 1.0))).adjust(plans, tokens) == [4, None, None, 4]  # flat: as alone
    for plan, k in ((Plan(3), 2), (tree, 1), (adjustable, 5), (adjustable, -1), (adjustable, 1.0)):
        with pytest.raises(ValueError):
            plan.adjusted(k)
    with pytest.raises(ValueError, match="tree plan is kept whole"):
        Plan(shape=tree.shape, adjustable=entry)


def test_a_decoding_plans_its_round_with_a_batch_adjustment():
    """`Decoding.plan` owns the round's plan: the policy's choice, the batch's k where the choice
    lets a batch choose (up to the policy's k_max, above its own choice too), within the budget."""
    target, prompt = random_table(6, 2, seed=11), [0, 1, 2, 0, 1]
    decoding = stream(target, PromptLookup(), prompt, max_new_tokens=4, k=auto_policy(3))
    decoding.begin()
    chosen = decoding.choose()
    assert chosen.adjustable is not None and chosen.adjustable.most == 3
    assert decoding.plan(chosen) == chosen
    assert decoding.plan(chosen, 0).k == 0 and decoding.plan(chosen, 3).k == 3  # budget 4: at most 3 drafts
    with pytest.raises(ValueError, match="integer in"):
        decoding.plan(chosen, 4)
    fixed = stream(target, PromptLookup(), prompt, max_new_tokens=3, k=5)
    fixed.begin()
    assert fixed.plan(fixed.choose()).k == 2
    with pytest.raises(ValueError, match="its policy's to keep"):
        fixed.plan(fixed.choose(), 1)


def test_batch_k_is_not_stopped_short_by_a_step_in_v():
    """A kernel's row blocking makes v(N) a staircase (measured, float32, this model: 2 rows
    1.21, 3 rows 1.58, 4 rows 1.59): a second draft alone does not pay, the eight a copying
    request's survival supports do (E / T 1.41 / 1.21 = 1.17 at k = 1, 4.28 / 2.42 = 1.77 at k = 8)."""
    staircase = BatchK(BatchCosts((1, 2, 3, 4, 8, 12), (1.0, 1.21, 1.58, 1.59, 2.30, 2.79)))
    copying = Adjustable(most=8, survival=[0.41] * 8, c=0.0)
    assert staircase.plan([copying]) == [8]
    assert staircase.plan([Adjustable(most=1, survival=[0.41], c=0.0)]) == [1]  # never past its own k
    assert staircase.plan([Adjustable(most=8, survival=[0.1] * 8, c=0.0)]) == [0]  # nowhere along the path pays


def test_batch_costs_interpolate_and_refuse_bad_points():
    costs = BatchCosts((1, 4, 8), (1.0, 1.3, 2.1))
    assert costs.at(1) == 1.0 and costs.at(4) == pytest.approx(1.3) and costs.at(6) == pytest.approx(1.7)
    assert costs.at(12) == pytest.approx(2.9)
    for rows, v in (((2, 4), (1.0, 1.0)), ((1, 1), (1.0, 1.0)), ((1, 2), (1.0, 0.0)), ((1,), (1.0,))):
        with pytest.raises(ValueError):
            BatchCosts(rows, v)


def test_auto_k_in_a_compute_bound_batch_drafts_less_than_alone():
    """Same requests, same per-request policy: a batch whose forward grows steeply with rows
    drafts fewer tokens per step than the same requests' own policies would."""
    def drafted(costs):
        scheduler, _ = small_scheduler(max_slots=4, batch_costs=costs, clock=TickClock())
        scheduler.build = audit_builder(random_table(4, 1, seed=4), {"auto": lambda: auto_policy(3)})
        jobs = [scheduler.submit(Request((i % 4, 1, 2, 3, 1, 2), 12, sampling=T1, proposer="lookup", k="auto", seed=i))
                for i in range(4)]
        scheduler.run()
        return sum(sum(job.stats.drafted) for job in jobs)

    steep = drafted(BatchCosts((1, 2, 64), (1.0, 2.0, 64.0)))
    alone = drafted(None)
    assert steep == 0 < alone


def test_a_shared_forward_does_not_teach_auto_k_its_cost():
    """A round whose forward scored other requests' rows too is skipped by AutoK's cost
    estimates (their seconds are the batch's), its acceptance still counts."""
    policy = auto_policy(2)
    scheduler, _ = small_scheduler(max_slots=2, clock=TickClock())
    scheduler.build = audit_builder(random_table(4, 1, seed=4), {"auto": lambda: policy})
    job = scheduler.submit(Request((0, 1, 0, 1), 6, sampling=T1, proposer="lookup", k="auto"))
    scheduler.submit(Request((2,), 6, sampling=T1))
    scheduler.run()
    assert job.stats.round_batch_rows[0] > job.stats.drafted[0] + 1
    before = policy.costs.v
    assert before == auto_policy(2).costs.v  # nothing learnt from shared forwards


# --- slots of the HF adapter ----------------------------------------------------------------------


def test_the_hf_adapter_runs_a_batch_slot_by_slot():
    from transformers import LlamaConfig, LlamaForCausalLM

    from verispec.models.runtimes.hf import HFCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    lm = HFCausalLM(LlamaForCausalLM(config))
    scheduler = Scheduler(lm, lambda request, slot: (None, 0), max_slots=2)
    prompts = [(1, 2, 3), (4, 5), (6,)]
    jobs = [scheduler.submit(Request(p, 5)) for p in prompts]
    scheduler.run()
    for job, prompt in zip(jobs, prompts):
        assert job.tokens == generate(lm, None, prompt, max_new_tokens=5, k=0, sampling=GREEDY).tokens


# --- the statistical test, 4 requests at a time ----------------------------------------------------


def test_four_concurrent_requests_follow_the_target_at_temperature_1():
    """The statistical module's setting (64-token peaked tables, 3 new tokens, k = 2): 4 requests
    at a time share every step, each with its own proposer (a draft table, EAGLE and Medusa
    heads, lookup+EAGLE after a self-quoting prompt) and its own seed. Each proposer's first
    token, second token and pair are G-tested against the exact marginals at alpha = 1e-7:
    12 tests, so a correct engine fails with probability at most 1.2e-6 (union bound, asymptotic
    chi-square tail); the seeds are fixed, so the outcome is deterministic."""
    from collections import Counter

    from test_statistical import ALPHA, COPY_PROMPT, DRAFT, PROMPT, TARGET, exact_marginals

    from verispec.statistics import g_test

    from verispec.heads.untrained import tiny_head
    from verispec.proposers import DraftModel, PromptLookup
    from verispec.proposers.copy_or_head import CopyOrHead
    from verispec.proposers.eagle import EagleProposer
    from verispec.proposers.medusa import MedusaProposer

    eagle, medusa = tiny_head("eagle", TARGET, seed=3), tiny_head("medusa", TARGET, seed=4)
    factories = {
        "draft": lambda slot: DraftModel(DRAFT),
        "eagle": lambda slot: EagleProposer(eagle, slot),
        "medusa": lambda slot: MedusaProposer(medusa, slot),
        "lookup+eagle": lambda slot: CopyOrHead(PromptLookup(min_ngram=2), EagleProposer(eagle, slot)),
    }
    scheduler = Scheduler(TARGET, lambda request, slot: (factories[request.proposer](slot), request.k), max_slots=4)
    runs = 2000
    jobs = {name: [] for name in factories}
    for run in range(runs):
        for i, name in enumerate(factories):
            prompt = COPY_PROMPT if name.startswith("lookup+") else PROMPT
            jobs[name].append(scheduler.submit(Request(tuple(prompt), 3, sampling=T1, proposer=name, k=2,
                                                       verifier="block" if i % 2 else "token", seed=4 * run + i)))
        scheduler.run()
    exact = exact_marginals()
    for name, done in jobs.items():
        counts = {"first": Counter(), "second": Counter(), "pair": Counter()}
        for job in done:
            a, b, _ = job.tokens
            counts["first"][a] += 1
            counts["second"][b] += 1
            counts["pair"][a, b] += 1
        assert max(job.stats.rounds for job in done) >= 1
        for marginal in exact:
            assert g_test(counts[marginal], exact[marginal], runs) > ALPHA, (name, marginal)


def test_a_request_keeps_the_parsed_specs():
    from verispec.registry import parse_k, parse_spec

    request = Request((1, 2), 4, proposer=parse_spec("lookup"), k=parse_k("auto"))
    assert request.k_spec.kind == "auto" and str(request.proposer) == "lookup"
    with pytest.raises(ValueError, match="build its policy"):
        request.k_for_decoding()
    assert Request((1, 2), 4, proposer=parse_spec("lookup"), k=parse_k("3")).k_for_decoding() == 3
