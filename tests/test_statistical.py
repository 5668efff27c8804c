"""Statistical check of whole generations on a 64-token vocabulary, too large to enumerate:
the first two emitted tokens, over many seeded runs, against the target's exact marginals.

Each run asks for 3 new tokens with k = 2, so the first round drafts two tokens (with only 2
new tokens the exact budget would allow one draft, where block and token-level coincide).

The proposers: a draft table, and the EAGLE and Medusa head proposers (tiny float64 heads on
the table's deterministic features, vocabulary pruned to 63 of the 64 tokens, so q has an
exact zero where p does not).

False-failure probability: every G-test below uses alpha = 1e-7 and a module run makes 18 of
them on a correct engine (3 per proposer and rule), so a correct engine fails this module with
probability at most 1.8e-6 (union bound, asymptotic chi-square tail) for a fresh seed list. The seed list is
fixed, so the outcome is deterministic. The negative control shows the same test and sample
size reject an engine that repairs from p instead of the residual.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest
import torch
from scipy.stats import power_divergence

from verispec import TorchRandom, generate
from verispec.drafts import Verdict
from verispec.heads.untrained import tiny_head
from verispec.models.tables import random_table
from verispec.proposers import DraftModel
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.verify import token_level

VOCAB = 64
RUNS = 3000
CONTROL_RUNS = 1000  # the biased engine's p-value is ~1e-79 at 4000 runs: far fewer suffice
ALPHA = 1e-7
MIN_EXPECTED = 5.0
PROMPT = [0]


def peaked_row(rng: random.Random) -> tuple[Fraction, ...]:
    """Every token possible, six of them (a different six per row) carrying most of the mass."""
    weights = [rng.randint(1, 3) for _ in range(VOCAB)]
    for token in rng.sample(range(VOCAB), 6):
        weights[token] += rng.randint(20, 60)
    total = sum(weights)
    return tuple(Fraction(w, total) for w in weights)


TARGET = random_table(VOCAB, 1, seed=1, row=peaked_row)
DRAFT = random_table(VOCAB, 1, seed=2, row=peaked_row)
PROPOSERS = {
    "draft": lambda: DraftModel(DRAFT),
    "eagle": lambda: EagleProposer(tiny_head("eagle", TARGET, seed=3), TARGET),
    "medusa": lambda: MedusaProposer(tiny_head("medusa", TARGET, seed=4), TARGET),
}


def exact_marginals() -> dict[str, dict]:
    first = TARGET.distribution(PROMPT)
    pair = {(a, b): first[a] * p_b for a in range(VOCAB) for b, p_b in enumerate(TARGET.distribution([a]))}
    second = Counter()
    for (_, b), prob in pair.items():
        second[b] += prob
    return {"first": dict(enumerate(first)), "second": dict(second), "pair": pair}


def g_test_p_value(observed: Counter, expected_probs: dict, runs: int) -> float:
    """G-test of observed counts against exact probabilities; cells expecting fewer than
    MIN_EXPECTED observations are pooled into one."""
    big = [cell for cell, prob in expected_probs.items() if prob * runs >= MIN_EXPECTED]
    small = [cell for cell in expected_probs if cell not in big]
    assert set(observed) <= set(expected_probs), "a token the target cannot emit was emitted"
    f_obs = [observed[cell] for cell in big]
    f_exp = [float(expected_probs[cell]) * runs for cell in big]
    if small:
        f_obs.append(sum(observed[cell] for cell in small))
        f_exp.append(float(sum(expected_probs[cell] for cell in small)) * runs)
    return float(power_divergence(f_obs, f_exp, lambda_="log-likelihood").pvalue)


def first_two_tokens(verifier, seeds: range, proposer_name: str = "draft") -> dict[str, Counter]:
    counts = {"first": Counter(), "second": Counter(), "pair": Counter()}
    proposer = PROPOSERS[proposer_name]()
    for seed in seeds:
        a, b, _ = generate(TARGET, proposer, PROMPT, max_new_tokens=3, k=2, rng=TorchRandom(seed),
                           verifier=verifier).tokens
        counts["first"][a] += 1
        counts["second"][b] += 1
        counts["pair"][a, b] += 1
    return counts


def p_values(verifier, seeds: range, proposer_name: str = "draft") -> dict[str, float]:
    counts = first_two_tokens(verifier, seeds, proposer_name)
    exact = exact_marginals()
    return {name: g_test_p_value(counts[name], exact[name], len(seeds)) for name in exact}


@pytest.mark.parametrize("proposer_name", list(PROPOSERS))
@pytest.mark.parametrize(("verifier", "first_seed"), [("block", 0), ("token", 10**6)])
def test_first_two_tokens_follow_the_target(verifier, first_seed, proposer_name):
    assert min(p_values(verifier, range(first_seed, first_seed + RUNS), proposer_name).values()) > ALPHA


def resample_from_p(p: torch.Tensor, draft, rng) -> Verdict:
    """The seed's negative control: token-level acceptance, but the repair drawn from p."""
    verdict = token_level(p, draft, rng)
    if verdict.n_accepted == len(draft):
        return verdict
    return Verdict(verdict.n_accepted, rng.categorical(p[verdict.n_accepted]))


def test_a_biased_repair_is_detected():
    assert p_values(resample_from_p, range(2 * 10**6, 2 * 10**6 + CONTROL_RUNS))["first"] < ALPHA
