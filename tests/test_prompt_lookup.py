"""Prompt lookup: the incremental n-gram index proposes exactly what the seed's rescan of the
whole context proposes, on the seed's examples and on many random token sequences."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verispec.proposers import PromptLookup
from verispec.sampling import SamplingParams


def seed_prompt_lookup(tokens, k=4, max_ngram=8):
    """The lesson's bounded proposal exercise, verbatim: an independent oracle."""
    for n in range(min(max_ngram, len(tokens) - 1), 0, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            end = start + n
            if tokens[start:end] == suffix and end < len(tokens):
                return tokens[end:min(end + k, len(tokens))]
    return []


def proposed(context, k, max_ngram=8, min_ngram=1):
    lookup = PromptLookup(max_ngram, min_ngram)
    lookup.begin(context, SamplingParams())
    draft = lookup.propose(context, k, rng=None)
    assert draft.q is None  # chosen, not sampled: verified as point masses
    assert draft == lookup.propose_stateless(context, k, rng=None)
    return list(draft.tokens)


def test_seed_examples():
    assert proposed([1, 2, 3, 4, 1, 2], k=2) == [3, 4]
    assert proposed([1, 2, 3], k=2) == []


def test_longest_suffix_first_then_most_recent_match():
    # [5, 1] occurs once (followed by 7); the unigram [1] last occurred before 9.
    assert proposed([5, 1, 7, 2, 1, 9, 5, 1], k=3) == [7, 2, 1]
    assert proposed([5, 1, 7, 2, 1, 9, 5, 1], k=3, max_ngram=1) == [9, 5, 1]
    # The continuation is cut by the end of the context, not padded.
    assert proposed([4, 4], k=5) == [4]
    # min_ngram: no match of length >= 2 means no draft, even if a unigram matches.
    assert proposed([3, 1, 2, 1], k=2, min_ngram=2) == []
    assert proposed([3, 1, 2, 1], k=2, min_ngram=1) == [2, 1]


def test_begin_forgets_the_previous_request():
    lookup = PromptLookup()
    lookup.begin([1, 2, 3, 4, 1, 2], SamplingParams())
    assert lookup.propose([1, 2, 3, 4, 1, 2], 2, rng=None).tokens == (3, 4)
    lookup.begin([3, 9, 1, 2], SamplingParams())
    assert lookup.propose([3, 9, 1, 2], 2, rng=None).tokens == ()


def test_invalid_ngram_bounds():
    with pytest.raises(ValueError, match="1 <= min_ngram <= max_ngram, got 3, 2"):
        PromptLookup(max_ngram=2, min_ngram=3)
    with pytest.raises(ValueError, match="got 0, 2"):
        PromptLookup(max_ngram=2, min_ngram=0)


@settings(max_examples=300, deadline=None)
@given(
    tokens=st.lists(st.integers(0, 3), min_size=1, max_size=40),
    prompt_length=st.integers(1, 40),
    chunks=st.lists(st.integers(1, 5), min_size=1, max_size=40),
    ngrams=st.tuples(st.integers(1, 4), st.integers(1, 4)).map(sorted),
    k=st.integers(1, 6),
)
def test_incremental_index_equals_the_rescan(tokens, prompt_length, chunks, ngrams, k):
    """The context grows in rounds of 1..5 tokens, as the engine commits them; after every
    commit the index's draft equals the rescan's (and, with min_ngram 1, the seed's)."""
    min_ngram, max_ngram = ngrams
    lookup = PromptLookup(max_ngram, min_ngram)
    length = min(prompt_length, len(tokens))
    lookup.begin(tokens[:length], SamplingParams())
    chunks = iter(chunks)
    while True:
        context = tokens[:length]
        draft = lookup.propose(context, k, rng=None)
        assert draft == lookup.propose_stateless(context, k, rng=None)
        if min_ngram == 1:
            assert list(draft.tokens) == seed_prompt_lookup(context, k, max_ngram)
        length += next(chunks, 1)
        if length > len(tokens):
            return
        lookup.commit(tokens[:length])
