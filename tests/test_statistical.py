"""Statistical check of whole generations on a 64-token vocabulary, too large to enumerate:
the first two emitted tokens, over many seeded runs, against the target's exact marginals.

Each run asks for 3 new tokens with k = 2, so the first round drafts two tokens (with only 2
new tokens the exact budget would allow one draft, where block and token-level coincide).

The proposers: a draft table, and the EAGLE and Medusa head proposers (tiny float64 heads on
the table's deterministic features, vocabulary pruned to 63 of the 64 tokens, so q has an
exact zero where p does not); and lookup+eagle, lookup+medusa after a prompt that quotes
itself (`COPY_PROMPT`): the first round copies (chosen), a round after a rejection asks the
head (sampled), so one request mixes both (under auto, the coupled rule, and under token).
The coupled rule (keyed races, `verispec.verify.coupled`) is tested on the draft table's chains
and trees too.

Trees: the draft model's sampled tree (three siblings drawn from q at the root, SpecInfer's
recursive rule) and a chosen tree of the draft's top-ranked tokens (point-mass siblings), both
under `ConstantTree` with the same 3-token budget, so the first round's tree is two deep; and
the draft model's tree under the coupled rule.

Penalties: the draft proposer under a repetition penalty of 1.5 (not an integer, so outside the
exhaustive audit's rational arithmetic) with min_tokens 1 masking an EOS id, against marginals
penalised independently here.

Grammars: the draft proposer (which masks its q) and EAGLE (whose sampled drafts may leave the
grammar, to meet p = 0) under a grammar given as an automaton, against the target's marginals
masked to it and renormalised.

False-failure probability: every G-test below uses alpha = 1e-7 and a module run makes 54 of
them on a correct engine (3 per proposer and rule, the coupled rule, trees, penalties and grammars included), so a
correct engine fails this module with probability at most 5.4e-6 (union bound, asymptotic chi-square tail) for a
fresh seed list. The seed list is fixed, so the outcome is deterministic. The negative controls show the same test and sample
size reject an engine that repairs from p instead of the residual, and one whose sampled tree
siblings are tested against p instead of the residual the rejected ones leave.
"""

from __future__ import annotations

import random
from collections import Counter
from fractions import Fraction

import pytest
import torch

from verispec import SamplingParams, TorchRandom, generate
from verispec.audit.controls import stale_residual_siblings
from verispec.audit.trees import TopRankedDraft
from verispec.drafts import Verdict
from verispec.grammar import Automaton
from verispec.heads.untrained import tiny_head
from verispec.models.tables import random_table
from verispec.proposers import DraftModel, PromptLookup
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.statistics import g_test
from verispec.policies import ConstantTree
from verispec.tree_shape import TreeShape
from verispec.verify import token_level

VOCAB = 64
RUNS = 3000
CONTROL_RUNS = 1000  # the biased engine's p-value is ~1e-79 at 4000 runs: far fewer suffice
ALPHA = 1e-7
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
    "lookup+eagle": lambda: CopyOrHead(PromptLookup(min_ngram=2), PROPOSERS["eagle"]()),
    "lookup+medusa": lambda: CopyOrHead(PromptLookup(min_ngram=2), PROPOSERS["medusa"]()),
    "ranked": lambda: TopRankedDraft(DRAFT),
}
TREE = TreeShape.of([(0,), (1,), (2,), (0, 0), (1, 0)])  # 5 nodes: 3-2
# "5 0" recurs, so lookup drafts the target's likeliest token after 0, then 5. The table has
# order 1 and the prompt ends in PROMPT's token, so the exact marginals are PROMPT's.
_LIKELIEST = max(range(VOCAB), key=TARGET.distribution(PROMPT).__getitem__)
COPY_PROMPT = [5, *PROMPT, _LIKELIEST, 5, *PROMPT]


def exact_marginals() -> dict[str, dict]:
    first = TARGET.distribution(PROMPT)
    pair = {(a, b): first[a] * p_b for a in range(VOCAB) for b, p_b in enumerate(TARGET.distribution([a]))}
    second = Counter()
    for (_, b), prob in pair.items():
        second[b] += prob
    return {"first": dict(enumerate(first)), "second": dict(second), "pair": pair}


def first_two_tokens(verifier, seeds: range, proposer_name: str = "draft", k=2) -> dict[str, Counter]:
    counts = {"first": Counter(), "second": Counter(), "pair": Counter()}
    proposer = PROPOSERS[proposer_name]()
    prompt = COPY_PROMPT if proposer_name.startswith("lookup+") else PROMPT
    for seed in seeds:
        a, b, _ = generate(TARGET, proposer, prompt, max_new_tokens=3, k=k, rng=TorchRandom(seed),
                           verifier=verifier, sampling=SamplingParams()).tokens
        counts["first"][a] += 1
        counts["second"][b] += 1
        counts["pair"][a, b] += 1
    return counts


def p_values(verifier, seeds: range, proposer_name: str = "draft", k=2) -> dict[str, float]:
    counts = first_two_tokens(verifier, seeds, proposer_name, k)
    exact = exact_marginals()
    return {name: g_test(counts[name], exact[name], len(seeds)) for name in exact}


@pytest.mark.parametrize("proposer_name", ["draft", "eagle", "medusa"])
@pytest.mark.parametrize(("verifier", "first_seed"), [("block", 0), ("token", 10**6)])
def test_first_two_tokens_follow_the_target(verifier, first_seed, proposer_name):
    assert min(p_values(verifier, range(first_seed, first_seed + RUNS), proposer_name).values()) > ALPHA


def test_coupled_first_two_tokens_follow_the_target():
    assert min(p_values("coupled", range(10 * 10**6, 10 * 10**6 + RUNS)).values()) > ALPHA


@pytest.mark.parametrize("proposer_name", ["lookup+eagle", "lookup+medusa"])
@pytest.mark.parametrize(("verifier", "first_seed"), [("auto", 3 * 10**6), ("token", 4 * 10**6)])
def test_copy_or_head_first_two_tokens_follow_the_target(verifier, first_seed, proposer_name):
    assert min(p_values(verifier, range(first_seed, first_seed + RUNS), proposer_name).values()) > ALPHA


@pytest.mark.parametrize(("proposer_name", "verifier", "first_seed"),
                         [("draft", "token", 5 * 10**6), ("ranked", "token", 6 * 10**6), ("draft", "coupled", 11 * 10**6)])
def test_tree_first_two_tokens_follow_the_target(proposer_name, verifier, first_seed):
    seeds = range(first_seed, first_seed + RUNS)
    assert min(p_values(verifier, seeds, proposer_name, ConstantTree(TREE)).values()) > ALPHA


PENALTY = 1.5
PENALTY_EOS = _LIKELIEST  # masked in the first row by min_tokens 1: the likeliest token, so the mask shows


def penalised_row(context: list[int], emitted: int) -> dict[int, float]:
    """The target's next-token distribution after context under repetition penalty PENALTY and
    min_tokens 1 with EOS PENALTY_EOS: log p * PENALTY for a token in the context (log p < 0),
    the EOS weighing 0 before the first token."""
    weights = [float(p) ** (PENALTY if token in context else 1.0) for token, p in
               enumerate(TARGET.distribution(context[-1:]))]
    if emitted < 1:
        weights[PENALTY_EOS] = 0.0
    total = sum(weights)
    return {token: w / total for token, w in enumerate(weights)}


@pytest.mark.parametrize(("verifier", "first_seed"), [("block", 8 * 10**6), ("token", 9 * 10**6)])
def test_penalised_first_two_tokens_follow_the_penalised_target(verifier, first_seed):
    sampling = SamplingParams(repetition_penalty=PENALTY, min_tokens=1)
    first = penalised_row(PROMPT, 0)
    pair = {(a, b): first[a] * p_b for a in first for b, p_b in penalised_row([*PROMPT, a], 1).items()}
    second = Counter()
    for (_, b), prob in pair.items():
        second[b] += prob
    counts = {"first": Counter(), "second": Counter(), "pair": Counter()}
    proposer = PROPOSERS["draft"]()
    for seed in range(first_seed, first_seed + RUNS):
        tokens = generate(TARGET, proposer, PROMPT, max_new_tokens=3, k=2, rng=TorchRandom(seed), verifier=verifier,
                          sampling=sampling, eos_token_id=PENALTY_EOS).tokens
        counts["first"][tokens[0]] += 1
        counts["second"][tokens[1]] += 1
        counts["pair"][tokens[0], tokens[1]] += 1
    exact = {"first": first, "second": dict(second), "pair": pair}
    assert min(g_test(counts[name], exact[name], RUNS) for name in exact) > ALPHA


# A grammar over the 64 tokens: an even token first, then one not divisible by 3, then any.
GRAMMAR = Automaton(VOCAB, {0: {t: 1 for t in range(0, VOCAB, 2)}, 1: {t: 2 for t in range(VOCAB) if t % 3},
                            2: dict.fromkeys(range(VOCAB), 2)}, accepting=set(), eos_token_id=0)


def masked_row(context: list[int], output: list[int]) -> dict[int, float]:
    """The target's next-token distribution after context, masked to GRAMMAR after output and
    renormalised (plain constrained decoding's)."""
    allowed = GRAMMAR.allowed(output)
    weights = [float(p) if allowed[token] else 0.0 for token, p in enumerate(TARGET.distribution(context[-1:]))]
    total = sum(weights)
    return {token: w / total for token, w in enumerate(weights) if w}


@pytest.mark.parametrize(("proposer_name", "first_seed"), [("draft", 11 * 10**6), ("eagle", 12 * 10**6)])
def test_constrained_first_two_tokens_follow_the_masked_target(proposer_name, first_seed):
    """A grammar: the draft model masks its q, EAGLE's head does not (its drafts outside the
    grammar meet p = 0); either way the tokens follow the target masked to the grammar."""
    first = masked_row(PROMPT, [])
    pair = {(a, b): first[a] * p_b for a in first for b, p_b in masked_row([*PROMPT, a], [a]).items()}
    second = Counter()
    for (_, b), prob in pair.items():
        second[b] += prob
    counts = {"first": Counter(), "second": Counter(), "pair": Counter()}
    proposer = PROPOSERS[proposer_name]()
    for seed in range(first_seed, first_seed + RUNS):
        tokens = generate(TARGET, proposer, PROMPT, max_new_tokens=3, k=2, rng=TorchRandom(seed),
                          sampling=SamplingParams(grammar=GRAMMAR)).tokens
        counts["first"][tokens[0]] += 1
        counts["second"][tokens[1]] += 1
        counts["pair"][tokens[0], tokens[1]] += 1
    exact = {"first": first, "second": dict(second), "pair": pair}
    assert min(g_test(counts[name], exact[name], RUNS) for name in exact) > ALPHA


def test_a_stale_tree_residual_is_detected():
    seeds = range(7 * 10**6, 7 * 10**6 + CONTROL_RUNS)
    assert min(p_values(stale_residual_siblings, seeds, "draft", ConstantTree(TREE)).values()) < ALPHA


def resample_from_p(p: torch.Tensor, draft, rng) -> Verdict:
    """The seed's negative control: token-level acceptance, but the repair drawn from p."""
    verdict = token_level(p, draft, rng)
    if verdict.n_accepted == len(draft):
        return verdict
    return Verdict(verdict.n_accepted, rng.categorical(p[verdict.n_accepted]))


def test_a_biased_repair_is_detected():
    assert p_values(resample_from_p, range(2 * 10**6, 2 * 10**6 + CONTROL_RUNS))["first"] < ALPHA
