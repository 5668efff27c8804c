"""RandomTokens: a sampled proposer with uniform q; decoding with it stays exact."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.audit.enumerate import outcomes
from verispec.models.tables import random_table
from verispec.proposers.random_tokens import RandomTokens
from verispec.reference import reference_generate


def test_draws_every_draft_with_probability_one_over_v_to_the_k():
    proposer = RandomTokens(3)
    proposer.begin([0], SamplingParams())
    paths = list(outcomes(lambda rng: proposer.propose([0], 2, rng).tokens))
    assert sorted(tokens for _, tokens in paths) == [(a, b) for a in range(3) for b in range(3)]
    assert all(abs(prob - 1 / 9) < 1e-15 for prob, _ in paths)


def test_q_is_the_uniform_distribution_after_the_transforms():
    proposer = RandomTokens(4)
    proposer.begin([0], SamplingParams(temperature=0.7))
    draft = proposer.propose([0], 3, TorchRandom(1))
    assert draft.q.shape == (3, 4) and draft.q.dtype == torch.float64
    assert torch.equal(draft.q, torch.full((3, 4), 0.25, dtype=torch.float64))
    # A nucleus of mass 1/2 over four tied tokens keeps two of them, and only those are drafted.
    proposer.begin([0], SamplingParams(top_p=0.5))
    kept = proposer.propose([0], 1, TorchRandom(0)).q[0]
    assert sorted(kept.tolist()) == [0.0, 0.0, 0.5, 0.5]
    drafted = {t for _, d in outcomes(lambda rng: proposer.propose([0], 2, rng).tokens) for t in d}
    assert drafted == set(kept.nonzero().flatten().tolist())


def test_greedy_drafts_are_drawn_but_carry_no_q():
    proposer = RandomTokens(5)
    proposer.begin([0], GREEDY)
    draft = proposer.propose([0], 4, TorchRandom(3))
    assert draft.q is None and len(draft) == 4
    assert draft == proposer.propose_stateless([0], 4, TorchRandom(3))


def test_bad_vocabulary_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        RandomTokens(0)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(
    ("sampling", "verifier"),
    [
        (GREEDY, "auto"),
        (SamplingParams(), "auto"),
        (SamplingParams(), "token"),
        (SamplingParams(temperature=0.8, top_p=0.7), "block"),
    ],
)
def test_engine_equals_reference(seed, sampling, verifier):
    target = random_table(4, 2, seed, zeros=False, eos_token_id=3)
    options = dict(max_new_tokens=15, sampling=sampling, eos_token_id=3, k=3, verifier=verifier)
    engine = generate(target, RandomTokens(4), [1, 2], rng=TorchRandom(seed), **options)
    reference = reference_generate(target, RandomTokens(4), [1, 2], rng=TorchRandom(seed), **options)
    assert engine.tokens == reference


def test_greedy_speculative_equals_greedy_plain():
    target = random_table(5, 2, 4, zeros=False)
    plain = generate(target, None, [0, 1], max_new_tokens=25, sampling=GREEDY, k=0)
    fast = generate(target, RandomTokens(5), [0, 1], max_new_tokens=25, sampling=GREEDY, k=3, seed=9)
    assert fast.tokens == plain.tokens


@pytest.mark.parametrize("verifier", ["token", "block"])
def test_enumerated_output_distribution_is_the_targets(exact_joint, verifier):
    target = random_table(3, 1, 2, denominator=6, eos_token_id=2)
    total: dict[tuple[int, ...], float] = {}
    for prob, tokens in outcomes(
        lambda rng: tuple(
            generate(target, RandomTokens(3), [0], max_new_tokens=3, rng=rng, eos_token_id=2, k=2, verifier=verifier,
                     sampling=SamplingParams()).tokens
        )
    ):
        total[tokens] = total.get(tokens, 0.0) + prob
    exact = exact_joint(target, [0], 3, eos_token_id=2)
    assert total.keys() == exact.keys()
    assert max(abs(total[t] - float(exact[t])) for t in exact) < 1e-12
    assert sum(exact.values()) == Fraction(1)
