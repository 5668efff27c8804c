"""SuffixIndex: its incremental trie agrees with a brute-force recount, and decoding with it is
exact (enumerated output distribution == target's) and matches the full-recompute reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.audit.enumerate import outcomes
from verispec.models.tables import random_table
from verispec.proposers.suffix_index import SuffixIndex
from verispec.reference import reference_generate

RNG = TorchRandom(0)  # never consumed: the drafts are chosen


def draft_after(index: SuffixIndex, context: list[int], k: int) -> tuple[int, ...]:
    index.begin(context, SamplingParams())
    return index.propose(context, k, RNG).tokens


def test_docstring_example_ties_go_to_the_most_recent_and_path_probability_stops():
    context = [5, 6, 7, 5, 6, 8, 5, 6]
    # 5 6 -> {7, 8} tie, 8 is more recent (1/2); 5 6 8 -> 5 and 6 8 5 -> 6 are certain; then
    # 8 5 6 has no continuation, 5 6 -> 8 again (path 1/4), ... until the path falls below 0.1.
    assert draft_after(SuffixIndex(max_match=3), context, 20) == (8, 5, 6, 8, 5, 6, 8, 5, 6)
    assert draft_after(SuffixIndex(max_match=3, min_prob=0.3), context, 20) == (8, 5, 6)
    assert draft_after(SuffixIndex(max_match=3, min_prob=0.0), context, 4) == (8, 5, 6, 8)


def test_most_frequent_continuation_beats_the_most_recent():
    context = [1, 2, 1, 2, 1, 3, 1]
    assert draft_after(SuffixIndex(max_match=1, min_prob=0), context, 1) == (2,)


def test_min_count_stops_on_rare_matches():
    context = [1, 2, 3, 1]
    assert draft_after(SuffixIndex(min_count=2), context, 4) == ()
    # 1 -> 2, 1 2 -> 3, 1 2 3 -> 1; the drafted tokens are not indexed, so then 1 -> 2 again.
    assert draft_after(SuffixIndex(min_count=1, min_prob=0), context, 4) == (2, 3, 1, 2)


def test_corpus_supplies_continuations_and_patterns_never_span_sequences():
    index = SuffixIndex([[7, 8, 9], [4, 5]], min_prob=0)
    assert draft_after(index, [3, 7], 3) == (8, 9)
    # 9 ends one sequence and 4 starts the next: "9 4" never occurred.
    assert draft_after(index, [9], 3) == ()
    # The request's own tokens count together with the corpus: 8 -> 9 (corpus) and 8 -> 1 twice.
    assert draft_after(index, [8, 1, 8, 1, 8], 1) == (1,)


def test_the_request_part_resets_and_remembered_outputs_persist():
    index = SuffixIndex(remember_outputs=True, min_prob=0)
    index.begin([1, 2], SamplingParams())
    index.commit([1, 2, 3, 4])
    assert index.propose([1, 2, 3, 4], 3, RNG).tokens == ()
    # The next request sees the previous output (3 4), not its prompt (1 2).
    assert draft_after(index, [3], 2) == (4,)
    assert draft_after(index, [1], 2) == ()
    # Requests without output add nothing.
    assert index.corpus == [(3, 4)]
    forgetful = SuffixIndex()
    forgetful.begin([1, 2], SamplingParams())
    forgetful.commit([1, 2, 3, 4])
    assert draft_after(forgetful, [3], 2) == ()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_match": 0}, "max_match"),
        ({"min_count": 0}, "min_count"),
        ({"min_prob": 1.5}, "min_prob"),
        ({"corpus": [[1, -2]]}, "corpus token ids"),
    ],
)
def test_bad_options_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        SuffixIndex(**options)


sequences = st.lists(st.integers(0, 3), min_size=1, max_size=40)


@settings(max_examples=150, deadline=None)
@given(
    corpus=st.lists(st.lists(st.integers(0, 3), max_size=15), max_size=3),
    requests=st.lists(
        st.tuples(sequences, st.integers(1, 10), st.lists(st.integers(1, 5), max_size=8)), min_size=1, max_size=3
    ),
    max_match=st.integers(1, 5),
    min_count=st.integers(1, 3),
    min_prob=st.sampled_from([0.0, 0.1, 0.3]),
    remember=st.booleans(),
    k=st.integers(1, 8),
)
def test_incremental_index_equals_brute_force(corpus, requests, max_match, min_count, min_prob, remember, k):
    index = SuffixIndex(corpus, max_match=max_match, min_count=min_count, min_prob=min_prob, remember_outputs=remember)
    for sequence, prompt_length, chunks in requests:
        # The prompt, then the rest committed in chunks as the engine would.
        cuts = [min(prompt_length, len(sequence))]
        for size in chunks:
            cuts.append(min(len(sequence), cuts[-1] + size))
        cuts.append(len(sequence))
        index.begin(sequence[: cuts[0]], SamplingParams())
        for cut in cuts:
            context = sequence[:cut]
            index.commit(context)
            assert index.propose(context, k, RNG) == index.propose_stateless(context, k, RNG)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
def test_engine_equals_reference(seed, sampling):
    target = random_table(4, 2, seed, eos_token_id=3)
    prompt = [0, 1, 2, 0, 1]
    options = dict(max_new_tokens=20, sampling=sampling, eos_token_id=3, k=4)
    engine = generate(target, SuffixIndex(min_prob=0), prompt, rng=TorchRandom(seed), **options)
    reference = reference_generate(target, SuffixIndex(min_prob=0), prompt, rng=TorchRandom(seed), **options)
    assert engine.tokens == reference
    assert sum(engine.stats.drafted) > 0


def test_greedy_speculative_equals_greedy_plain():
    target = random_table(5, 2, 11, zeros=False)
    prompt = [1, 2, 3, 1, 2]
    plain = generate(target, None, prompt, max_new_tokens=30, sampling=GREEDY, k=0)
    fast = generate(target, SuffixIndex(min_prob=0), prompt, max_new_tokens=30, sampling=GREEDY, k=5)
    assert fast.tokens == plain.tokens
    assert sum(fast.stats.accepted) > 0


def test_enumerated_output_distribution_is_the_targets(exact_joint):
    target = random_table(3, 2, 5, denominator=6, eos_token_id=2)
    prompt = [0, 1, 0]
    total = {}
    for prob, tokens in outcomes(
        lambda rng: tuple(
            generate(target, SuffixIndex(min_prob=0), prompt, max_new_tokens=4, rng=rng, eos_token_id=2, k=3,
                     sampling=SamplingParams()).tokens
        )
    ):
        total[tokens] = total.get(tokens, 0.0) + prob
    exact = exact_joint(target, prompt, 4, eos_token_id=2)
    assert total.keys() == exact.keys()
    assert max(abs(total[t] - float(exact[t])) for t in exact) < 1e-12
