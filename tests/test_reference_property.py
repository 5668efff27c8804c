"""The engine (caches, pending token, proposer state, k policy, budget, EOS) emits exactly the
tokens of the slow full-recompute reference for the same random stream, over random tables,
prompts, budgets, sampling settings (penalties included), proposers (a draft model, prompt lookup, and EAGLE and
Medusa heads: tiny float64 heads on the table's features, whose incremental KV cache and
rollback the reference replaces by a fresh recomputation; and lookup+eagle, lookup+medusa,
whose head skips the rounds lookup drafts), policies and every valid verifier."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.clocks import TickClock
from verispec import SamplingParams, TorchRandom, generate
from verispec.heads.untrained import tiny_head
from verispec.models.tables import random_table
from verispec.cost import FixedCosts
from verispec.policies import AutoK, ConstantTree, HeuristicK
from verispec.proposers import DraftModel, PromptLookup
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.reference import reference_generate
from verispec.tree_shape import TreeShape

VERIFIERS = {
    # (greedy sampling, proposer kind) -> the rules that are valid for it
    (True, "draft"): ["auto", "greedy"],
    (True, "lookup"): ["auto", "greedy"],
    (False, "draft"): ["auto", "token", "block"],
    (False, "lookup"): ["auto", "point-mass", "token", "block"],
    (True, "eagle"): ["auto", "greedy"],
    (True, "medusa"): ["auto", "greedy"],
    (False, "eagle"): ["auto", "token", "block"],
    (False, "medusa"): ["auto", "token", "block"],
    (True, "lookup+eagle"): ["auto", "greedy"],
    (True, "lookup+medusa"): ["auto", "greedy"],
    (False, "lookup+eagle"): ["auto", "token", "block"],
    (False, "lookup+medusa"): ["auto", "token", "block"],
}
HEADS = {"eagle": EagleProposer, "medusa": MedusaProposer}


@st.composite
def requests(draw):
    vocab = draw(st.integers(2, 5))
    token = st.integers(0, vocab - 1)
    eos = draw(st.none() | token | st.lists(token, min_size=1, max_size=2))  # one id or several
    first_eos = eos[0] if isinstance(eos, list) else eos
    zeros = draw(st.booleans())
    target = random_table(vocab, draw(st.integers(1, 2)), draw(st.integers(0, 10**6)),
                          zeros=zeros, eos_token_id=first_eos)
    # min_tokens masks the EOS ids: only where some other token keeps every row possible
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    min_tokens = draw(st.sampled_from([0, 0, 1, 3])) if not zeros and len(eos_ids) < vocab else 0
    sampling = SamplingParams(
        temperature=draw(st.sampled_from([0, 1, 0.5, 1.7])),
        top_k=draw(st.none() | st.integers(1, vocab)),
        top_p=draw(st.none() | st.sampled_from([0.3, 0.8, 0.95, 1.0])),
        min_p=draw(st.none() | st.sampled_from([0.0, 0.1, 0.4])),
        repetition_penalty=draw(st.sampled_from([1.0, 1.0, 1.3, 2.0])),
        min_tokens=min_tokens,
    )
    kind = draw(st.sampled_from(["draft", "lookup", "eagle", "medusa", "lookup+eagle", "lookup+medusa"]))
    if kind.removeprefix("lookup+") in HEADS:
        # a tiny float64 head (untrained, seeded) reading the table's deterministic features
        head_kind = kind.removeprefix("lookup+")
        head = tiny_head(head_kind, target, seed=draw(st.integers(0, 100)), heads=draw(st.integers(1, 4)))
        if kind == head_kind:
            make_proposer = lambda: HEADS[head_kind](head, target)  # noqa: E731
        else:
            min_match = draw(st.integers(1, 3))
            make_proposer = lambda: CopyOrHead(PromptLookup(min_ngram=min_match),  # noqa: E731
                                               HEADS[head_kind](head, target))
    elif kind == "draft":
        draft_table = random_table(vocab, draw(st.integers(1, 2)), draw(st.integers(0, 10**6)),
                                   zeros=draw(st.booleans()))
        make_proposer = lambda: DraftModel(draft_table)  # noqa: E731
    else:
        ngrams = draw(st.tuples(st.integers(1, 3), st.integers(1, 3)).map(sorted))
        make_proposer = lambda: PromptLookup(max_ngram=ngrams[1], min_ngram=ngrams[0])  # noqa: E731
    policy = draw(st.sampled_from(["constant", "heuristic", "auto"]))
    k = draw(st.integers(0, 5) if policy == "constant" else st.integers(1, 5))
    # AutoK's costs: a profile it learns away from, the rounds timed on a tick clock (below)
    v = draw(st.lists(st.sampled_from([1.0, 1.2, 1.6, 2.0]), min_size=k, max_size=k))
    costs = FixedCosts(c=draw(st.sampled_from([0.0, 0.1, 0.5])), v=[1.0, *v], step_seconds=0.001)
    make_k = {
        "constant": lambda: k,
        "heuristic": lambda: HeuristicK(k),
        "auto": lambda: AutoK(costs, probe_every=1),
    }[policy]
    return dict(
        target=target,
        make_proposer=make_proposer,
        make_k=make_k,
        prompt=draw(st.lists(token, min_size=1, max_size=8)),
        max_new_tokens=draw(st.integers(0, 10)),
        sampling=sampling,
        eos_token_id=eos,
        verifier=draw(st.sampled_from(VERIFIERS[sampling.greedy, kind])),
        seed=draw(st.integers(0, 2**31 - 1)),
    )


@settings(max_examples=200, deadline=None)
@given(request=requests())
def test_engine_equals_the_full_recompute_reference(request):
    options = {key: request[key] for key in ("max_new_tokens", "sampling", "eos_token_id", "verifier")}
    target, prompt, seed = request["target"], request["prompt"], request["seed"]
    # Fresh proposers, policies and clocks for each side, so no state is shared between them;
    # on tick clocks both record the same round timings, which AutoK learns its costs from.
    engine = generate(target, request["make_proposer"](), prompt, k=request["make_k"](), seed=seed,
                      clock=TickClock(), **options)
    reference = reference_generate(target, request["make_proposer"](), prompt, k=request["make_k"](),
                                   rng=TorchRandom(seed), clock=TickClock(), **options)
    assert engine.tokens == reference
    eos = options["eos_token_id"]
    eos_ids = set() if eos is None else {eos} if isinstance(eos, int) else set(eos)
    assert len(reference) == options["max_new_tokens"] or reference[-1] in eos_ids
    assert not eos_ids & set(reference[:-1])


class Recording:
    """A k policy that notes the round counters it chooses from (the engine's `Stats` or the
    reference's) and defers to `policy`. `note` is a closure, so the copies a per-source policy
    makes note into the same list."""

    def __init__(self, policy, note) -> None:
        self.policy, self.note = policy, note

    @property
    def trees(self) -> bool:
        return getattr(self.policy, "trees", False)

    def begin(self) -> None:
        self.policy.begin()

    def choose(self, stats):
        self.note((stats.new_tokens, stats.drafted, stats.accepted, stats.position_attempts, stats.position_accepts,
                   stats.rank_attempts, stats.rank_accepts, stats.tree_rounds, stats.fallbacks,
                   [round(s, 9) for s in stats.round_draft_seconds + stats.round_target_seconds], dict(stats.plans)))
        return self.policy.choose(stats)


def test_the_engine_and_the_reference_record_each_round_alike():
    """`Stats.record`, one call a round in both: every policy of the request (one per draft
    source for lookup+eagle, and a tree's) sees the same counters and tick-clock seconds before
    each round in the engine as in the reference."""
    target = random_table(5, 2, seed=3)
    eagle = tiny_head("eagle", target, seed=1)
    cases = [
        (lambda: CopyOrHead(PromptLookup(min_ngram=1), EagleProposer(eagle, target)), lambda: HeuristicK(3), [0, 1, 2, 0, 1]),
        (lambda: DraftModel(random_table(5, 1, seed=4)), lambda: ConstantTree(TreeShape.of([(0,), (1,), (0, 0)])), [2]),
    ]
    for make_proposer, make_policy, prompt in cases:
        for temperature in (0.0, 1.0):
            options = dict(max_new_tokens=12, sampling=SamplingParams(temperature=temperature), eos_token_id=None)
            seen_engine, seen_reference = [], []
            engine_policy = Recording(make_policy(), lambda counts: seen_engine.append(counts))
            reference_policy = Recording(make_policy(), lambda counts: seen_reference.append(counts))
            engine = generate(target, make_proposer(), prompt, k=engine_policy, seed=5, clock=TickClock(), **options)
            reference = reference_generate(target, make_proposer(), prompt, k=reference_policy, rng=TorchRandom(5),
                                           clock=TickClock(), **options)
            assert engine.tokens == reference
            assert len(seen_engine) == engine.stats.rounds > 1 and seen_engine == seen_reference
            assert engine.stats.new_tokens == len(engine.tokens) == sum(engine.stats.accepted) + engine.stats.rounds
