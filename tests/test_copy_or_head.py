"""`lookup+eagle` and `lookup+medusa` (`CopyOrHead`): the per-round choice, both sub-proposers
following the emitted prefix (the EAGLE head stays aligned over rounds it did not draft), the
engine equal to the full-recompute reference and greedy decoding equal to plain decoding on a
tiny random Llama with both branches drafting, the audit visiting both branches, and a negative
control: a choice that looks at the head's sampled token is biased, and the audit catches it.

The exhaustive audit itself runs both kinds through their registry entries
(`test_audit_exhaustive`); the reference-equality property test and the temperature-1 G-tests
include them too (`test_reference_property`, `test_statistical`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.clocks import TickClock
from verispec.cost import FixedCosts
from verispec.policies import AutoK
from verispec.randomness import NO_DRAWS
from verispec.audit.exhaustive import SCENARIOS, Configuration, audit_configuration
from verispec.drafts import Draft
from verispec.heads import save_head
from verispec.heads.config import FINAL
from verispec.heads.untrained import tiny_head
from verispec.models.runtimes.hf import HFCausalLM
from verispec.models.loading.load import LoadedModel
from verispec.models.tables import random_table
from verispec.proposers import PromptLookup
from verispec.proposers.copy_or_head import CopyOrHead
from verispec.proposers.eagle import EagleProposer
from verispec.proposers.medusa import MedusaProposer
from verispec.reference import reference_generate
from verispec.registry import PROPOSERS, ProposerKind, build_proposer

from test_heads import default_model_head, hf_head, tiny_llama

HEADS = {"eagle": EagleProposer, "medusa": MedusaProposer}
# Prompts whose text repeats (lookup has matches of two tokens) and then runs on (it has none).
PROMPTS = ([1, 2, 3, 4, 1, 2], [9, 8, 7, 9, 8, 7, 6], [5, 6, 7, 8, 9, 10, 11, 5, 6])


class Counted:
    """A proposer that counts the rounds in which it drafted something."""

    def __init__(self, proposer) -> None:
        self.proposer = proposer
        self.drafted = 0

    def begin(self, prompt_ids, sampling) -> None:
        self.proposer.begin(prompt_ids, sampling)

    def propose(self, context, k, rng) -> Draft:
        draft = self.proposer.propose(context, k, rng)
        self.drafted += len(draft) > 0
        return draft

    def commit(self, context) -> None:
        self.proposer.commit(context)

    def propose_stateless(self, context, k, rng) -> Draft:
        return self.proposer.propose_stateless(context, k, rng)


def counted(copy, head) -> CopyOrHead:
    return CopyOrHead(Counted(copy), Counted(head))


def test_copies_when_the_last_two_tokens_recur_else_asks_the_head():
    table = random_table(4, 2, seed=3)
    proposer = CopyOrHead(PromptLookup(min_ngram=2), EagleProposer(tiny_head("eagle", table), table))
    proposer.begin([1, 2, 0, 1, 2], SamplingParams())
    table.prefill([1, 2, 0, 1])
    copied = proposer.propose([1, 2, 0, 1, 2], 3, TorchRandom(0))
    assert copied.tokens == (0, 1, 2) and copied.q is None  # "1 2" recurs: its continuation, chosen
    table.reset()
    proposer.begin([3, 2, 0, 1], SamplingParams())
    table.prefill([3, 2, 0])
    sampled = proposer.propose([3, 2, 0, 1], 3, TorchRandom(0))
    assert len(sampled) == 3 and sampled.q.shape == (3, 4)  # "0 1" is new: the head's, with its q


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(), SamplingParams(0.7, top_p=0.9)], ids=str)
def test_engine_equals_reference_on_a_tiny_llama_with_both_branches(kind, sampling):
    """The EAGLE head skips the rounds lookup drafts and must catch up with the true features of
    every token emitted meanwhile: the reference recomputes it from scratch each round."""
    lm = HFCausalLM(tiny_llama())
    head = hf_head(kind, lm, taps=(FINAL, 2) if kind == "eagle" else (FINAL,)).double()
    copied = headed = 0
    for prompt in PROMPTS:
        proposer = counted(PromptLookup(min_ngram=2), HEADS[kind](head, lm))
        engine = generate(lm, proposer, prompt, max_new_tokens=20, sampling=sampling, k=3, seed=4)
        reference = reference_generate(lm, CopyOrHead(PromptLookup(min_ngram=2), HEADS[kind](head, lm)), prompt,
                                       max_new_tokens=20, sampling=sampling, k=3, rng=TorchRandom(4))
        assert engine.tokens == reference, prompt
        copied, headed = copied + proposer.copy.drafted, headed + proposer.head.drafted
    assert copied > 0 and headed > 0


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams()], ids=str)
def test_auto_k_per_source_equals_the_reference_and_reports_each_source(sampling):
    """With `--k auto` each source has its own policy (`PerSource`); the reference decoder,
    naming each round's source from the context alone, makes the same choices."""
    lm = HFCausalLM(tiny_llama())
    head = hf_head("eagle", lm, taps=(FINAL, 2)).double()
    costs = FixedCosts(c=0.05, v=[1.0, 1.05, 1.1, 1.15, 1.2])
    for prompt in PROMPTS:
        proposer = CopyOrHead(PromptLookup(min_ngram=2), EagleProposer(head, lm))
        engine = generate(lm, proposer, prompt, max_new_tokens=30, sampling=sampling, k=AutoK(costs), seed=2,
                          clock=TickClock())
        reference = reference_generate(lm, CopyOrHead(PromptLookup(min_ngram=2), EagleProposer(head, lm)), prompt,
                                       max_new_tokens=30, sampling=sampling, k=AutoK(costs), rng=TorchRandom(2),
                                       clock=TickClock())
        assert engine.tokens == reference, prompt
        by_source = engine.stats.by_source
        assert set(by_source) <= {"copy", "head"} and sum(s.rounds for s in by_source.values()) == engine.stats.rounds
        assert sum(sum(s.plans.values()) for s in by_source.values()) == sum(engine.stats.plans.values())


def test_the_source_comes_from_the_context_without_drawing():
    table = random_table(4, 2, seed=3)
    proposer = CopyOrHead(PromptLookup(min_ngram=2), EagleProposer(tiny_head("eagle", table), table))
    proposer.begin([1, 2, 0, 1, 2], SamplingParams())
    assert proposer.source([1, 2, 0, 1, 2]) == proposer.source_stateless([1, 2, 0, 1, 2]) == "copy"
    assert proposer.source_stateless([3, 2, 0, 1]) == "head"
    with pytest.raises(RuntimeError, match="must not draw"):
        NO_DRAWS.categorical(torch.tensor([0.5, 0.5], dtype=torch.float64))


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_greedy_reproduces_plain_decoding_on_a_tiny_llama(kind):
    lm = HFCausalLM(tiny_llama(seed=5))
    head = hf_head(kind, lm)  # float32, untrained
    proposer = counted(PromptLookup(min_ngram=2), HEADS[kind](head, lm))
    for prompt in PROMPTS:
        plain = generate(lm, None, prompt, max_new_tokens=24, sampling=GREEDY, k=0).tokens
        for k in (1, 3, 5):
            assert generate(lm, proposer, prompt, max_new_tokens=24, sampling=GREEDY, k=k).tokens == plain, (prompt, k)
    assert proposer.copy.drafted > 0 and proposer.head.drafted > 0


@pytest.mark.parametrize("name", ["lookup+eagle", "lookup+medusa"])
def test_the_audit_builder_visits_both_branches(name):
    """The audit's scenarios make lookup match and fail: both sub-proposers draft there."""
    copied = headed = 0
    for scenario in SCENARIOS:
        tables = scenario.tables()
        built = PROPOSERS[name].audit(tables)
        proposer = counted(built.copy, built.head)
        for seed in range(4):
            tables.target.reset()
            generate(tables.target, proposer, scenario.prompt, max_new_tokens=scenario.max_new_tokens,
                     sampling=scenario.sampling, eos_token_id=scenario.eos_token_id, k=scenario.policy(), seed=seed)
        copied, headed = copied + proposer.copy.drafted, headed + proposer.head.drafted
    assert copied > 20 and headed > 20, (copied, headed)


class ConfirmedHead(CopyOrHead):
    """A plausible but biased choice: the head's draft only when its sampled first token confirms
    lookup's first token. The chosen draft's law is then q conditioned on that event, not q."""

    def propose(self, context, k, rng) -> Draft:
        copied = self.copy.propose(context, k, rng)
        drafted = self.head.propose(context, k, rng)
        return drafted if len(copied) and drafted.tokens[:1] == copied.tokens[:1] else copied

    propose_stateless = propose


def test_a_choice_that_reads_the_head_s_sampled_token_is_caught():
    def build(tables):
        return ConfirmedHead(PromptLookup(max_ngram=2, min_ngram=1), MedusaProposer(tiny_head("medusa", tables.target),
                                                                                   tables.target))

    kind = ProposerKind("confirmed", "confirmed", "mixed", lambda *args: None, "biased control", audit=build)
    # the token rule (point-mass on lookup's rounds): under the coupled rule a biased choice of
    # drafts moves the acceptance, never a token, so there it is exact
    results = [audit_configuration(Configuration(scenario, kind, "token"))
               for scenario in SCENARIOS if not scenario.sampling.greedy]
    assert all(r.error is None for r in results)
    assert max(r.max_abs_diff for r in results) > 1e-3


def test_specs_build_lookup_and_a_head_directory(tmp_path):
    model = tiny_llama()
    target = LoadedModel(name="tiny", lm=HFCausalLM(model), model=model, tokenizer=None, eos_token_ids=(),
                         dtype=torch.float32, source=Path("tiny"))
    for kind in HEADS:
        save_head(hf_head(kind, target.lm), tmp_path / kind)
        proposer = build_proposer(f"lookup+{kind}:{tmp_path / kind}", target)
        assert isinstance(proposer, CopyOrHead) and isinstance(proposer.head, HEADS[kind])
        assert isinstance(proposer.copy, PromptLookup) and proposer.copy.min_ngram == 1
    with pytest.raises(ValueError, match="holds a medusa head, not a eagle head"):
        build_proposer(f"lookup+eagle:{tmp_path / 'medusa'}", target)
    assert PROPOSERS["lookup+eagle"].rules_for(SamplingParams()) == ("auto", "token", "block")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_on_the_default_model_greedy_equals_plain(kind):
    """The shipped head when this installation has one, else an untrained head of its shape, on
    a prompt that quotes itself (lookup drafts) and runs on (the head drafts)."""
    loaded, head = default_model_head(kind)
    lm = loaded.lm
    proposer = counted(PromptLookup(min_ngram=2), HEADS[kind](head, lm))
    options = dict(max_new_tokens=32, sampling=GREEDY, eos_token_id=loaded.eos_token_id)
    for text in ("Repeat exactly: the quick brown fox jumps over the lazy dog. Then explain it.",
                 "Translate to French: 'The meeting is on Monday at ten in room 4B.'"):
        prompt = loaded.encode(text)
        plain = generate(lm, None, prompt, k=0, **options)
        assert generate(lm, proposer, prompt, k=4, **options).tokens == plain.tokens
    assert proposer.copy.drafted > 0 and proposer.head.drafted > 0
