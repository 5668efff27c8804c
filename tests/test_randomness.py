"""Randomness enters only through the injected rng: the same seed gives the same output, from a
single draw up to whole generations."""

from __future__ import annotations

import math

import pytest
import torch

from verispec import SamplingParams, TorchRandom, generate
from verispec.models.tables import random_table
from verispec.proposers import DraftModel, PromptLookup

PROBS = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64)


def draws(rng: TorchRandom, n: int = 200) -> list:
    return [(rng.bernoulli(0.4), rng.categorical(PROBS)) for _ in range(n)]


def test_same_seed_same_stream_different_seed_different_stream():
    assert draws(TorchRandom(7)) == draws(TorchRandom(7))
    assert draws(TorchRandom(7)) != draws(TorchRandom(8))
    assert TorchRandom().seed == 0


def test_certain_and_impossible_events():
    rng = TorchRandom(3)
    assert all(rng.bernoulli(1.0) for _ in range(500))
    assert not any(rng.bernoulli(0.0) for _ in range(500))
    assert 1 not in {rng.categorical(PROBS) for _ in range(500)}


@pytest.mark.parametrize("probs", [[0.0, 0.0], [math.nan, 1.0], [math.inf, 0.0]], ids=["no-mass", "nan", "inf"])
def test_a_draw_from_no_distribution_raises_instead_of_returning_index_v(probs):
    with pytest.raises(ValueError, match="cannot draw from probabilities summing to"):
        TorchRandom().categorical(torch.tensor(probs, dtype=torch.float64))


def test_a_temperature_that_underflows_the_target_stops_the_request_with_the_reason():
    target = random_table(4, 2, seed=11, zeros=False)  # every probability < 1: every logit < 0
    with pytest.raises(ValueError, match="underflows a whole row"):
        generate(target, DraftModel(random_table(4, 2, seed=12)), [0, 1], max_new_tokens=3, k=2,
                 sampling=SamplingParams(temperature=1e-320))


def run(seed: int, proposer_kind: str, rng: TorchRandom | None = None) -> list[int]:
    target = random_table(4, 2, seed=11, eos_token_id=3)
    proposer = DraftModel(random_table(4, 2, seed=12)) if proposer_kind == "draft" else PromptLookup(2)
    options = {"rng": rng} if rng is not None else {"seed": seed}
    return generate(target, proposer, [0, 1, 2, 0, 1], max_new_tokens=30, k=3,
                    sampling=SamplingParams(temperature=1.3, top_p=0.95), **options).tokens


@pytest.mark.parametrize("proposer_kind", ["draft", "lookup"])
def test_same_seed_same_generation(proposer_kind):
    outputs = {seed: run(seed, proposer_kind) for seed in range(8)}
    for seed, tokens in outputs.items():
        assert run(seed, proposer_kind) == tokens
        assert run(0, proposer_kind, rng=TorchRandom(seed)) == tokens  # seed= is TorchRandom(seed)
    assert len({tuple(t) for t in outputs.values()}) > 1  # the seed does reach the output
