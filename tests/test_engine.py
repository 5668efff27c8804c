"""The round loop, on the seed's list of edge cases: rejections at every position, all
accepted, the budget, EOS wherever it appears, successive rounds, per-request reset, greedy
identity, streaming, the statistics, and the errors for bad requests.

Accept/reject patterns are forced with a deterministic target (every row one-hot: the
successor of token a is a + 1 mod V) and a proposer that drafts its continuation with chosen
mistakes: then point-mass verification accepts with probability 0 or 1 and repairs with the
target's token, whatever the rng. The output distribution itself is checked by enumerating
every random branch of whole generations.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from fractions import Fraction

import pytest
import torch

from verispec import GREEDY, Decoding, SamplingParams, TorchRandom, generate, stream
from verispec.audit.enumerate import outcomes
from verispec.drafts import Draft
from verispec.models.tables import TableLM, bigram, random_table, seed_pair
from verispec.policies import HeuristicK
from verispec.proposers import DraftModel, PromptLookup
from verispec.reference import reference_generate
from verispec.request import Request
from verispec.sampling import probabilities

V = 6
EOS = 5
SAMPLED = SamplingParams()


class LoggedTable(TableLM):
    """A table that records every list of tokens the engine asks it to score."""

    def __init__(self, table: TableLM) -> None:
        super().__init__(table.rows, table.order)
        self.extended: list[list[int]] = []

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        self.extended.append(list(tokens))
        return super().extend(tokens, keep)


def cycle() -> LoggedTable:
    """Deterministic target: after token a comes (a + 1) mod V."""
    return LoggedTable(bigram([[int(b == (a + 1) % V) for b in range(V)] for a in range(V)]))


class Scripted:
    """Drafts the cycle's continuation of the context, wrong at the positions `mistakes(context)`
    names. Records what it was asked and what it was told."""

    def __init__(self, mistakes: Callable[[list[int]], set[int]] = lambda context: set(), length: int = 99):
        self.mistakes = mistakes
        self.length = length
        self.asked: list[tuple[int, int]] = []  # (len(context), k)
        self.committed: list[list[int]] = []
        self.begun = 0

    def begin(self, prompt_ids, sampling):
        self.begun += 1

    def propose(self, context, k, rng):
        self.asked.append((len(context), k))
        return self.propose_stateless(context, k, rng)

    def commit(self, context):
        self.committed.append(list(context))

    def propose_stateless(self, context, k, rng):
        wrong = self.mistakes(list(context))
        last, tokens = context[-1], []
        for i in range(min(k, self.length)):
            last = (last + 1) % V
            tokens.append((last + 2) % V if i in wrong else last)
        return Draft(tuple(tokens))


def cycle_after(token: int, n: int) -> list[int]:
    return [(token + 1 + i) % V for i in range(n)]


def run(proposer, prompt=(0,), max_new_tokens=8, k=3, sampling=SAMPLED, target=None, **options):
    target = target or cycle()
    out = generate(target, proposer, list(prompt), max_new_tokens=max_new_tokens, k=k, sampling=sampling,
                   seed=0, **options)
    ref = reference_generate(target, proposer, list(prompt), max_new_tokens=max_new_tokens, k=k,
                             sampling=sampling, rng=TorchRandom(0), **options)
    assert out.tokens == ref
    return out, target


BOTH = pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["point-mass", "greedy"])


@BOTH
@pytest.mark.parametrize("position", [0, 1, 2], ids=["first", "middle", "last"])
def test_rejection_at_each_position(sampling, position):
    proposer = Scripted(lambda context: {position})
    out, target = run(proposer, max_new_tokens=8, k=3, sampling=sampling)
    assert out.tokens == cycle_after(0, 8)
    # Round 1: the drafts before the mistake are accepted, the target's token repairs it.
    assert out.stats.drafted[0] == 3 and out.stats.accepted[0] == position
    drafted = cycle_after(0, 3)
    drafted[position] = (position + 3) % V  # the mistake
    assert target.extended[0] == [0, *drafted]
    assert proposer.committed[0] == [0, *cycle_after(0, position + 1)]


@BOTH
def test_all_accepted_gives_the_bonus_token(sampling):
    proposer = Scripted()
    out, _ = run(proposer, max_new_tokens=8, k=3, sampling=sampling)
    assert out.tokens == cycle_after(0, 8)
    assert proposer.committed[0] == [0, 1, 2, 3, 4]  # 3 accepted + the bonus
    assert out.stats.drafted == [3, 3] and out.stats.accepted == [3, 3]


@BOTH
def test_zero_new_tokens_touches_nothing(sampling):
    proposer, target = Scripted(), cycle()
    out = generate(target, proposer, [0], max_new_tokens=0, k=3, sampling=sampling)
    assert out.tokens == [] and out.stats.rounds == 0 and out.stats.new_tokens == 0
    assert proposer.asked == [] and proposer.begun == 0 and target.extended == []


@BOTH
@pytest.mark.parametrize("mistakes", [set(), {0}], ids=["accepting", "rejecting"])
@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 7])
def test_k_larger_than_the_remaining_budget(sampling, mistakes, max_new_tokens):
    proposer = Scripted(lambda context: mistakes)
    out, target = run(proposer, max_new_tokens=max_new_tokens, k=10, sampling=sampling)
    assert out.tokens == cycle_after(0, max_new_tokens)  # exactly the budget
    for context_length, k in proposer.asked:
        remaining = max_new_tokens - (context_length - 1)
        assert 1 <= k == min(10, remaining - 1)
    assert all(len(tokens) <= max_new_tokens for tokens in target.extended)


@BOTH
def test_eos_among_the_accepted_tokens_ends_the_output(sampling):
    # From 2 the cycle runs 3, 4, 5 = EOS; the drafts after EOS are never scored.
    proposer = Scripted()
    out, target = run(proposer, prompt=[2], max_new_tokens=20, k=5, sampling=sampling, eos_token_id=EOS)
    assert out.tokens == [3, 4, 5]
    assert target.extended == [[2, 3, 4, 5]]
    assert out.stats.accepted == [3]


@BOTH
def test_eos_as_the_repair_token_ends_the_output(sampling):
    proposer = Scripted(lambda context: {2})  # drafts 3, 4, 1: the target repairs 1 with EOS
    out, _ = run(proposer, prompt=[2], max_new_tokens=20, k=4, sampling=sampling, eos_token_id=EOS)
    assert out.tokens == [3, 4, 5]
    assert out.stats.drafted == [4] and out.stats.accepted == [2]


@BOTH
def test_eos_as_the_bonus_token_ends_the_output(sampling):
    proposer = Scripted()
    out, _ = run(proposer, prompt=[2], max_new_tokens=20, k=2, sampling=sampling, eos_token_id=EOS)
    assert out.tokens == [3, 4, 5]
    assert out.stats.drafted == [2] and out.stats.accepted == [2]


@BOTH
@pytest.mark.parametrize("eos", [(4, 5), [5, 4], {4, 1}, range(4, 6)])
def test_several_eos_ids_end_the_output_at_the_first_of_any(sampling, eos):
    # From 2 the cycle runs 3, 4, 5: 4 is the first EOS; the draft after it is never scored.
    proposer = Scripted()
    out, target = run(proposer, prompt=[2], max_new_tokens=20, k=5, sampling=sampling, eos_token_id=eos)
    assert out.tokens == [3, 4]
    assert target.extended == [[2, 3, 4]]


@BOTH
def test_eos_in_the_prompt_does_not_end_the_request(sampling):
    out, _ = run(Scripted(), prompt=[EOS], max_new_tokens=4, k=2, sampling=sampling, eos_token_id=EOS)
    assert out.tokens == [0, 1, 2, 3]


@BOTH
def test_several_successive_rounds(sampling):
    # Rounds alternate: from 0 a mistake at position 1 (emits 1, 2), from 2 all three accepted
    # plus the bonus (emits 3, 4, 5, 0), and again from 0.
    proposer = Scripted(lambda context: {1} if context[-1] == 0 else set())
    out, target = run(proposer, max_new_tokens=18, k=3, sampling=sampling)
    assert out.tokens == cycle_after(0, 18)
    assert out.stats.accepted == [1, 3, 1, 3, 1, 3] and out.stats.drafted == [3] * 6
    final = [0, *out.tokens]
    for before, after in itertools.pairwise(proposer.committed):
        assert len(before) < len(after) and after[: len(before)] == before
    assert proposer.committed[-1] == final
    assert target.length == len(final) - 1  # every emitted token but the pending one


def test_stats_of_a_scripted_run():
    # k = 3 with a mistake at position 1 in each round: 2 tokens per round. In the last round
    # only one token is left to draft (budget 10, 8 emitted), so it is accepted with a bonus.
    out, _ = run(Scripted(lambda context: {1}), max_new_tokens=10, k=3)
    stats = out.stats
    assert stats.drafted == [3, 3, 3, 3, 1] and stats.accepted == [1, 1, 1, 1, 1]
    assert stats.rounds == stats.speculative_rounds == 5 and stats.new_tokens == 10
    assert stats.accepted_histogram == {1: 5}
    assert stats.position_attempts == [5, 4, 0] and stats.position_accepts == [5, 0, 0]
    assert stats.survival() == [1.0, 0.0]
    assert stats.acceptance_rate == 5 / 13 and stats.mean_accepted == 2.0


def assert_consistent(stats, tokens: list[int], eos: int | None) -> None:
    """What every run's counters must satisfy, recomputed from the per-round lists."""
    rounds = len(stats.drafted)
    assert rounds == len(stats.accepted) == stats.rounds
    assert stats.new_tokens == len(tokens)
    assert all(0 <= a <= d for a, d in zip(stats.accepted, stats.drafted))
    if eos not in tokens:  # each round emits its accepted tokens and one more
        assert sum(stats.accepted) + rounds == len(tokens)
    width = max(stats.drafted, default=0)
    assert stats.position_attempts == [sum(d > i and a >= i for a, d in zip(stats.accepted, stats.drafted))
                                       for i in range(width)]
    assert stats.position_accepts == [sum(a > i for a in stats.accepted) for i in range(width)]
    assert stats.accepted_histogram == dict(Counter(a for a, d in zip(stats.accepted, stats.drafted) if d))
    survival, s = [], 1.0
    for attempts, accepts in zip(stats.position_attempts, stats.position_accepts):
        if not attempts:
            break
        s *= accepts / attempts
        survival.append(s)
    assert stats.survival() == survival
    assert stats.speculative_rounds == sum(d > 0 for d in stats.drafted)
    summary = stats.as_dict()
    assert (summary["rounds"], summary["drafted"], summary["accepted"]) == (
        rounds, sum(stats.drafted), sum(stats.accepted))
    assert summary["new_tokens"] == len(tokens)
    assert math.isclose(stats.mean_accepted, len(tokens) / rounds) if rounds else stats.mean_accepted == 0


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("eos", [None, 0])
def test_stats_are_consistent_on_random_runs(seed, eos):
    target = random_table(4, 2, seed=seed, eos_token_id=eos)
    for proposer, k in [(DraftModel(random_table(4, 2, seed=seed + 50)), 3),
                        (PromptLookup(2), HeuristicK(2)), (None, 0)]:
        out = generate(target, proposer, [1, 2, 3, 1, 2], max_new_tokens=25, k=k, seed=seed, eos_token_id=eos,
                       sampling=SAMPLED)
        assert_consistent(out.stats, out.tokens, eos)


def proposers_and_ks(vocab: int, seed: int):
    return [
        (DraftModel(random_table(vocab, 2, seed=seed + 1000)), 3),
        (DraftModel(random_table(vocab, 1, seed=seed + 2000)), HeuristicK(2)),
        (PromptLookup(3), 4),
        (PromptLookup(1), HeuristicK(1)),
    ]


@pytest.mark.parametrize("seed", range(8))
def test_greedy_speculation_equals_greedy_plain_decoding(seed):
    vocab = 3 + seed % 3
    target = random_table(vocab, 2, seed=seed, eos_token_id=0 if seed % 2 else None)
    eos = 0 if seed % 2 else None
    prompt = [(seed + i) % vocab for i in range(5)]
    plain = generate(target, None, prompt, max_new_tokens=30, k=0, sampling=GREEDY, eos_token_id=eos).tokens
    # Plain greedy decoding is the argmax chain of full recomputations.
    context = list(prompt)
    for token in plain:
        assert token == int(target.score(context)[-1].argmax())
        context.append(token)
    assert len(plain) == 30 or plain[-1] == eos
    for proposer, k in proposers_and_ks(vocab, seed):
        out = generate(target, proposer, prompt, max_new_tokens=30, k=k, sampling=GREEDY, eos_token_id=eos)
        assert out.tokens == plain


@pytest.mark.parametrize("seed", range(4))
def test_stream_yields_what_generate_returns(seed):
    target = random_table(4, 2, seed=seed, eos_token_id=3)
    for proposer, k in proposers_and_ks(4, seed):
        options = dict(max_new_tokens=20, k=k, seed=seed, eos_token_id=3,
                       sampling=SamplingParams(temperature=0.9))
        decoding = stream(target, proposer, [0, 1, 2, 0], **options)
        streamed = list(decoding)
        assert streamed == decoding.tokens == generate(target, proposer, [0, 1, 2, 0], **options).tokens


def test_decoding_is_greedy_unless_sampling_says_otherwise():
    """The keyword form builds a `Request`: one default (greedy, as the CLI's and HF's), one
    validation; a `Request` runs the same."""
    target = random_table(4, 2, seed=7)
    options = dict(max_new_tokens=12, k=3)
    default = generate(target, DraftModel(random_table(4, 2, seed=8)), [0, 1], seed=3, **options)
    greedy = generate(target, DraftModel(random_table(4, 2, seed=8)), [0, 1], sampling=GREEDY, **options)
    sampled = [generate(target, DraftModel(random_table(4, 2, seed=8)), [0, 1], seed=s, sampling=SAMPLED, **options)
               for s in range(4)]
    assert default.tokens == greedy.tokens and any(run.tokens != greedy.tokens for run in sampled)
    assert stream(target, None, [0, 1], max_new_tokens=2, k=0).request.sampling.greedy
    request = Request((0, 1), 12, sampling=SAMPLED, seed=2, proposer="draft", k=3)
    by_request = generate(target, DraftModel(random_table(4, 2, seed=8)), request)
    by_keywords = generate(target, DraftModel(random_table(4, 2, seed=8)), [0, 1], sampling=SAMPLED, seed=2, **options)
    assert by_request.tokens == by_keywords.tokens
    with pytest.raises(TypeError, match="not both"):
        generate(target, DraftModel(random_table(4, 2, seed=8)), request, max_new_tokens=3)
    with pytest.raises(TypeError, match="max_new_tokens"):  # the keyword form is generate's and stream's
        Decoding(target, None, [0, 1], max_new_tokens=3, k=0)
    with pytest.raises(TypeError, match="takes a Request"):
        Decoding(target, None, [0, 1])


@pytest.mark.parametrize("seed", range(4))
def test_two_requests_in_a_row_equal_two_fresh_runs(seed):
    options = dict(max_new_tokens=15, eos_token_id=2, sampling=SamplingParams(temperature=1.2, top_k=3))
    requests = [([0, 1, 2, 0, 1], seed), ([3, 3, 2], seed + 1)]

    def make():
        return random_table(4, 2, seed=seed, eos_token_id=2), proposers_and_ks(4, seed)

    target, shared = make()
    for index in range(len(shared)):
        proposer, k = shared[index]
        reused = [generate(target, proposer, prompt, k=k, seed=s, **options) for prompt, s in requests]
        for (prompt, s), again in zip(requests, reused):
            fresh_target, fresh = make()
            fresh_proposer, fresh_k = fresh[index]
            first = generate(fresh_target, fresh_proposer, prompt, k=fresh_k, seed=s, **options)
            assert (again.tokens, again.stats.drafted, again.stats.accepted) == (
                first.tokens, first.stats.drafted, first.stats.accepted)


def distribution(run_once) -> dict:
    dist: dict = defaultdict(float)
    for prob, result in outcomes(run_once):
        dist[result] += prob
    return dist


@pytest.mark.parametrize(
    ("proposer", "k", "verifier"),
    [
        (lambda draft: DraftModel(draft), 2, "block"),
        (lambda draft: DraftModel(draft), 3, "token"),
        (lambda draft: DraftModel(draft), HeuristicK(1), "auto"),
        (lambda draft: PromptLookup(2), 2, "point-mass"),
        (lambda draft: PromptLookup(2), 3, "block"),
    ],
    ids=["draft-block", "draft-token", "draft-heuristic", "lookup-point-mass", "lookup-block"],
)
@pytest.mark.parametrize("eos", [None, 2, (2, 0)], ids=["no-eos", "eos-2", "eos-2-and-0"])
def test_output_distribution_is_the_targets(exact_joint, proposer, k, verifier, eos):
    """Every random branch of whole generations (3 new tokens, seed tables), weighed exactly."""
    target, draft = seed_pair()
    prompt = [0, 1, 0]
    options = dict(max_new_tokens=3, k=k, verifier=verifier, eos_token_id=eos, sampling=SAMPLED)

    def run_once(rng):
        return tuple(generate(target, proposer(draft), prompt, rng=rng, **options).tokens)

    dist = distribution(run_once)
    expected = exact_joint(target, prompt, 3, eos)
    assert set(dist) == set(expected)
    for tokens, prob in expected.items():
        assert abs(dist[tokens] - prob) < 1e-12


# --- a zero residual -------------------------------------------------------------------------


class UlpAboveTarget:
    """A sampled proposer whose q is the target's p with every nonzero entry one ulp higher:
    q >= p everywhere and q != p, the rounding picture of a draft that is the target with its
    logits shifted by a constant. Every rejection then meets a residual of zero mass."""

    def __init__(self, target: TableLM) -> None:
        self.target = target
        self.sampling = SamplingParams()

    def begin(self, prompt_ids, sampling):
        self.sampling = sampling

    def commit(self, context):
        pass

    def propose(self, context, k, rng):
        ids, rows = list(context), []
        for _ in range(k):
            p = probabilities(self.target.score(ids)[-1:], self.sampling)[0]
            q = torch.where(p > 0, torch.nextafter(p, torch.tensor(math.inf, dtype=p.dtype)), p)
            rows.append(q)
            ids.append(rng.categorical(q))
        return Draft(tuple(ids[len(context):]), torch.stack(rows))

    propose_stateless = propose


class Rejecting(TorchRandom):
    """Every Bernoulli fails: each round rejects, so each round meets the zero residual."""

    def bernoulli(self, prob: float) -> bool:
        return False


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_a_zero_residual_falls_back_to_p_and_is_counted(verifier):
    target = random_table(4, 2, seed=5, zeros=False)
    options = dict(max_new_tokens=12, k=3, verifier=verifier, sampling=SAMPLED)
    out = generate(target, UlpAboveTarget(target), [0, 1], rng=Rejecting(3), **options)
    reference = reference_generate(target, UlpAboveTarget(target), [0, 1], rng=Rejecting(3), **options)
    assert out.tokens == reference and len(out.tokens) == 12
    # Every round that drafted fell back (the last one, at the budget, drafted nothing).
    assert out.stats.fallbacks == out.stats.speculative_rounds == 11 and sum(out.stats.accepted) == 0
    assert out.stats.as_dict()["fallbacks"] == 11


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_with_real_randomness_a_draft_equal_to_the_target_up_to_rounding_decodes(verifier):
    target = random_table(4, 2, seed=5, zeros=False)
    out = generate(target, UlpAboveTarget(target), [0, 1], max_new_tokens=40, k=3, verifier=verifier, seed=1,
                   sampling=SAMPLED)
    assert len(out.tokens) == 40 and out.stats.acceptance_rate > 0.99


# --- bad requests -------------------------------------------------------------------------------


class Overdrafting:
    """A proposer that drafts one token more than it is asked for."""

    def begin(self, prompt_ids, sampling):
        pass

    def propose(self, context, k, rng):
        return Draft(tuple([0] * (k + 1)))

    def commit(self, context):
        pass

    propose_stateless = propose


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(prompt=[]), "prompt is empty"),
        (dict(prompt=[0, V]), rf"prompt token id {V} is outside the vocabulary \[0, {V}\)"),
        (dict(prompt=[-1]), r"prompt token ids must be integers >= 0, got -1"),
        (dict(eos_token_id=V), f"eos_token_id {V} is outside"),
        (dict(eos_token_id=[EOS, V]), f"eos_token_id {V} is outside"),
        (dict(eos_token_id=[EOS, "5"]), "eos_token_ids must be token ids"),
        (dict(max_new_tokens=-1), "max_new_tokens must be an integer >= 0, got -1"),
        (dict(proposer=None, k=2), "without a proposer, k must be 0"),
        (dict(proposer=None, k=HeuristicK()), "without a proposer, k must be 0"),
        (dict(proposer=Overdrafting(), k=2), "drafted 3 tokens when asked for at most 2"),
        (dict(verifier="greedy"), "greedy rule is exact only at temperature 0"),
        (dict(verifier="token", sampling=GREEDY), "'token' needs temperature > 0"),
        (dict(verifier="block", sampling=GREEDY), "'block' needs temperature > 0"),
        (dict(verifier="point-mass", sampling=GREEDY), "'point-mass' needs temperature > 0"),
        (dict(verifier="typical"), "unknown verifier 'typical'"),
        (dict(), None),  # the valid request the cases above spoil: a control
    ],
)
def test_bad_requests_raise_value_error(kwargs, message):
    options = dict(target=cycle(), proposer=Scripted(), prompt=[0], max_new_tokens=4, k=2, sampling=SAMPLED)
    options.update(kwargs)
    target, proposer, prompt = options.pop("target"), options.pop("proposer"), options.pop("prompt")
    if message is None:
        assert len(generate(target, proposer, prompt, **options).tokens) == 4
        return
    with pytest.raises(ValueError, match=message):
        generate(target, proposer, prompt, **options)


def test_drafts_outside_the_target_vocabulary_are_refused():
    class OutOfVocabulary(Overdrafting):
        def propose(self, context, k, rng):
            return Draft((V,))

    with pytest.raises(ValueError, match=f"drafted token id {V} is outside"):
        generate(cycle(), OutOfVocabulary(), [0], max_new_tokens=3, k=2)

    class WrongWidth(Overdrafting):
        def propose(self, context, k, rng):
            return Draft((1,), torch.full((1, V + 1), 1 / (V + 1), dtype=torch.float64))

    with pytest.raises(ValueError, match=f"q has vocabulary {V + 1}, the target {V}"):
        generate(cycle(), WrongWidth(), [0], max_new_tokens=3, k=2)


def test_exact_probabilities_of_the_cycle_are_one_hot():
    # The forcing above relies on this: one-hot rows make point-mass verification certain.
    assert all(sorted(row) == [Fraction(0)] * (V - 1) + [Fraction(1)] for row in cycle().rows.values())


class Broken(LoggedTable):
    """A target whose scores after token 2 are NaN."""

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        logits = super().extend(tokens, keep).clone()
        logits[torch.tensor(tokens[-len(logits):]) == 2] = math.nan
        return logits


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
def test_invalid_target_scores_are_refused_not_decoded(sampling):
    with pytest.raises(ValueError, match="NaN"):
        generate(Broken(cycle()), Scripted(), [0], max_new_tokens=6, k=2, sampling=sampling)
