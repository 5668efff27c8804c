"""Keyed sampling: the noise of a key is i.i.d. Exp(1) whatever the probabilities, the lazy race
is the race over the whole noise, a race's law is its row, and two races on one key follow the
exact joint law of `verispec.audit.coupling` (checked against Monte Carlo here, and exactly by
its marginals)."""

from __future__ import annotations

import math
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch
from scipy.stats import kstest, power_divergence

from verispec.audit.coupling import race_pair
from verispec.models.tables import random_row
from verispec.randomness import BLOCK, Round, TorchRandom, keyed_noise, keyed_race

F64 = torch.float64
ALPHA = 1e-6  # per test below; the seeds are fixed, so each outcome is deterministic


def row(values) -> torch.Tensor:
    return torch.tensor([float(x) for x in values], dtype=F64)


@pytest.mark.parametrize("vocab", [1, 5, BLOCK, 3 * BLOCK + 7])
def test_the_lazy_race_is_the_race_over_the_whole_noise(vocab):
    """Every block that could hold the winner is expanded: the race equals argmin E / p over
    the key's whole noise, on peaked, flat and sparse rows, across blocks and a partial one."""
    rng = np.random.default_rng(vocab)
    for position in range(60):
        logits = rng.normal(size=vocab) * rng.choice([0.5, 3.0, 8.0])
        p = np.exp(logits - logits.max())
        p[rng.random(vocab) < 0.3] = 0.0 if vocab > 1 else p[0]
        p /= p.sum()
        noise = keyed_noise(11, position, 0, vocab)
        with np.errstate(divide="ignore"):
            expected = int(np.argmin(np.where(p > 0, noise / np.where(p > 0, p, 1), np.inf)))
        assert keyed_race(11, position, 0, torch.from_numpy(p)) == expected


def test_the_noise_is_iid_exponential_and_keyed_by_seed_position_and_choice():
    noise = keyed_noise(3, 17, 0, 40 * BLOCK + 5)  # block minima and the values above them, pooled
    assert kstest(noise, "expon").pvalue > ALPHA
    assert np.array_equal(noise, keyed_noise(3, 17, 0, 40 * BLOCK + 5))
    for other in (keyed_noise(4, 17, 0, 40 * BLOCK + 5), keyed_noise(3, 18, 0, 40 * BLOCK + 5),
                  keyed_noise(3, 17, 1, 40 * BLOCK + 5)):
        assert not np.array_equal(noise, other)
        assert abs(np.corrcoef(noise, other)[0, 1]) < 0.05  # ~0.0035 standard deviation: 14 sigma


def test_a_race_follows_its_row():
    """G-test of 8,000 races (positions 0..7,999) against p over 7 ids, one a zero."""
    p = row([0.3, 0.0, 0.05, 0.15, 0.2, 0.25, 0.05])
    n = 8_000
    counts = Counter(keyed_race(5, t, 0, p) for t in range(n))
    assert counts[1] == 0
    observed = [counts[i] for i in range(7) if p[i] > 0]
    expected = [n * float(p[i]) for i in range(7) if p[i] > 0]
    assert power_divergence(observed, expected, lambda_="log-likelihood").pvalue > ALPHA


def test_the_joint_law_of_two_races_sums_to_both_rows():
    """Exactly, with Fractions, on random rational rows with zeros."""
    rng = random.Random(0)
    for _ in range(60):
        n = rng.randint(1, 5)
        p, q = (random_row(n, rng, 9, zeros=True) for _ in range(2))
        joint = race_pair(p, q)
        assert [sum(r) for r in joint] == list(p)
        assert [sum(joint[i][j] for i in range(n)) for j in range(n)] == list(q)
        for i in range(n):  # the closed form of agreement
            if p[i] and q[i]:
                assert joint[i][i] == 1 / sum(max(p[k] / p[i], q[k] / q[i]) for k in range(n))


def test_the_joint_law_matches_monte_carlo_races():
    """10,000 coupled race pairs of `TorchRandom` against `race_pair`'s 16 cells (G-test), and
    agreement against its closed form within 5 standard deviations (false failure < 6e-7)."""
    p = [Fraction(1, 10), Fraction(3, 10), Fraction(6, 10), Fraction(0)]
    q = [Fraction(4, 10), Fraction(4, 10), Fraction(1, 10), Fraction(1, 10)]
    joint = race_pair(p, q)
    rng, n = TorchRandom(9), 10_000
    counts = Counter((rng.race(t, row(p)), rng.race(t, row(q))) for t in range(n))
    cells = [(i, j) for i in range(4) for j in range(4) if joint[i][j] > 0]
    assert sum(counts[c] for c in cells) == n  # never a pair of probability 0
    statistic = power_divergence([counts[c] for c in cells], [n * float(joint[i][j]) for i, j in cells],
                                 lambda_="log-likelihood")
    assert statistic.pvalue > ALPHA
    agree = float(sum(joint[i][i] for i in range(4)))
    tv = float(sum(abs(a - b) for a, b in zip(p, q)) / 2)
    assert agree >= (1 - tv) / (1 + tv)  # the coupling's bound
    observed = sum(counts[i, i] for i in range(4)) / n
    assert abs(observed - agree) < 5 * math.sqrt(agree * (1 - agree) / n)


def test_a_round_counts_positions_from_its_first_token_and_keys_drafts_only_when_coupled():
    p = row([0.25, 0.25, 0.5])
    base = TorchRandom(2)
    assert Round(base, 40, keyed=True).race(3, p) == base.race(43, p) == Round(base, 40, keyed=True).draw(3, p)
    stream, keyed = TorchRandom(2), Round(TorchRandom(2), 40, keyed=False)
    assert [keyed.draw(0, p) for _ in range(30)] == [stream.categorical(p) for _ in range(30)]


@pytest.mark.parametrize("probs", [[0.0, 0.0], [math.nan, 1.0], [math.inf, 0.0]], ids=["no-mass", "nan", "inf"])
def test_a_race_over_no_distribution_raises(probs):
    with pytest.raises(ValueError, match="cannot draw from probabilities summing to"):
        TorchRandom().race(0, row(probs))
