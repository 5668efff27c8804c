"""Log probabilities under speculation are plain decoding's: each emitted token's is the
target's own distribution at its position whatever the round accepted, bit for bit on exact
tables (chains and trees, greedy and sampled), and on the tiny real model within float rounding.
The prompt's log probabilities (one forward over the prompt) are what decoding reports for the
same tokens when they are generated, and asking for them changes nothing else."""

from __future__ import annotations

import pytest
import torch

from verispec import SamplingParams, generate
from verispec.audit.trees import TopRankedDraft
from verispec.logprobs import TokenLogprob, token_logprobs
from verispec.models.tables import random_table
from verispec.policies import ConstantTree
from verispec.proposers import DraftModel
from verispec.proposers.prompt_lookup import PromptLookup
from verispec.request import Request
from verispec.tree_shape import TreeShape

PROMPT = (0, 1, 2, 3, 0, 1, 2)


def recomputed(target, prompt, tokens, top):
    """Each token's log probabilities from a full recompute: the target's row after the
    prompt and the tokens before it, one forward each."""
    rows = []
    for j in range(len(tokens)):
        context = [*prompt, *tokens[:j]]
        target.prefill(context[:-1])
        rows.append(target.extend([context[-1]])[-1])
    return token_logprobs(torch.stack(rows), tokens, top)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_speculative_logprobs_are_plain_decodings_bit_for_bit(seed):
    target = random_table(5, 2, seed)
    plain = generate(target, None, Request(PROMPT, 16, logprobs=3))
    for proposer, k in [(PromptLookup(), 3), (DraftModel(random_table(5, 2, seed + 9)), 2),
                        (TopRankedDraft(random_table(5, 2, seed + 9)), ConstantTree(TreeShape.of([(0,), (0, 0), (0, 1), (1,)])))]:
        spec = generate(target, proposer, Request(PROMPT, 16, logprobs=3), policy=k)
        assert spec.tokens == plain.tokens and spec.stats.speculative_rounds > 0
        assert spec.logprobs == plain.logprobs  # floats compared exactly
    assert len(plain.logprobs) == 16 and all(len(t.top) == 3 for t in plain.logprobs)
    assert [t.token for t in plain.logprobs] == plain.tokens
    for t in plain.logprobs:  # greedy: the emitted token is the most likely, listed first, ranked after its ties
        assert t.top[0] == (t.token, t.logprob) and t.rank == sum(v == t.logprob for _, v in t.top) and [v for _, v in t.top] == sorted((v for _, v in t.top), reverse=True)


@pytest.mark.parametrize("seed", range(4))
def test_sampled_speculative_logprobs_are_the_targets_rows(seed):
    """Sampled, drafts rejected and repaired: every token's log probabilities are the full
    recompute's at its position, exactly."""
    target, draft = random_table(5, 2, seed), random_table(5, 2, seed + 17)
    sampling = SamplingParams(temperature=1.0)
    for proposer, k in [(DraftModel(draft), 3), (TopRankedDraft(draft), ConstantTree(TreeShape.of([(0,), (0, 0), (1,), (2,)])))]:
        run = generate(target, proposer, Request(PROMPT, 12, sampling=sampling, seed=seed, logprobs=2), policy=k)
        assert run.stats.speculative_rounds > 0
        assert run.logprobs == recomputed(target.new_slot(), PROMPT, run.tokens, 2)


def test_no_logprobs_unless_asked_and_bounds():
    target = random_table(5, 2, 0)
    assert generate(target, PromptLookup(), Request(PROMPT, 4), policy=2).logprobs == []
    only = generate(target, PromptLookup(), Request(PROMPT, 4, logprobs=0), policy=2).logprobs
    assert len(only) == 4 and all(t.top == () for t in only)
    for bad in (-2, 1.5, True):
        with pytest.raises(ValueError, match=r"logprobs must be an integer >= 0, -1 \(the whole vocabulary\) or None"):
            Request(PROMPT, 4, logprobs=bad)
        with pytest.raises(ValueError, match=r"prompt_logprobs must be an integer >= 0, -1 \(the whole vocabulary\)"):
            Request(PROMPT, 4, prompt_logprobs=bad)
    for name in ("logprobs", "prompt_logprobs"):  # past the vocabulary: refused where it is known, never clipped
        with pytest.raises(ValueError, match=f"^{name} 6 asks for more tokens a position than the vocabulary's 5"):
            generate(target, None, Request(PROMPT, 4, **{name: 6}))


@pytest.mark.parametrize("seed", range(3))
def test_all_logprobs_list_the_whole_vocabulary_ranked(seed):
    """logprobs and prompt_logprobs -1 (vLLM's: the whole vocabulary) list every token at each
    position, most likely first (ties: the lower id first), each its row's log-softmax exactly,
    at a position between the tokens more likely and those at least as likely; the token's own
    rank is the count at least as likely. Sampled speculation with rejections reports plain
    decoding's, and -1 is the vocabulary's size spelled out."""
    target, draft = random_table(5, 2, seed), random_table(5, 2, seed + 17)
    ask = dict(sampling=SamplingParams(temperature=1.0), seed=seed, logprobs=-1, prompt_logprobs=-1)
    plain = generate(target, None, Request(PROMPT, 12, **ask))
    spec = generate(target, DraftModel(draft), Request(PROMPT, 12, **ask), policy=3)
    assert spec.stats.speculative_rounds > 0 and spec.stats.accepted != [3] * len(spec.stats.accepted)
    assert (spec.tokens, spec.logprobs, spec.prompt_logprobs) == (plain.tokens, plain.logprobs, plain.prompt_logprobs)
    spelled = generate(target, None, Request(PROMPT, 12, **{**ask, "logprobs": 5, "prompt_logprobs": 5}))
    assert (spelled.logprobs, spelled.prompt_logprobs) == (plain.logprobs, plain.prompt_logprobs)
    context = [*PROMPT, *plain.tokens]
    logp = torch.log_softmax(target.new_slot().score(context[:-1]).float(), dim=-1)  # [len(context) - 1, V]
    entries = [*plain.prompt_logprobs[1:], *plain.logprobs]  # context[i + 1]'s under row i
    assert plain.prompt_logprobs[0] is None and len(entries) == len(context) - 1
    for row, entry, token in zip(logp, entries, context[1:]):
        assert entry.token == token and entry.logprob == row[token].item()
        assert entry.rank == int((row >= row[token]).sum())
        assert sorted(t for t, _ in entry.top) == list(range(5))
        assert all(v == row[t].item() for t, v in entry.top)
        assert [(-v, t) for t, v in entry.top] == sorted((-v, t) for t, v in entry.top)
        assert all((row > v).sum() < place <= (row >= v).sum() for place, (_, v) in enumerate(entry.top, start=1))


@pytest.mark.parametrize("seed", range(3))
def test_prompt_logprobs_are_what_decoding_reports_for_the_same_tokens(seed):
    """Decode a reply with its logprobs, then score prompt + reply as a prompt: its tokens after
    the prompt have exactly the logprobs decoding reported (ranks and alternatives included);
    the first prompt token has none; speculation and the prompt's logprobs change nothing else."""
    target = random_table(5, 2, seed)
    sampling = SamplingParams(temperature=1.0)
    plain = generate(target, None, Request(PROMPT, 8, sampling=sampling, seed=seed, logprobs=2))
    spec = generate(target, DraftModel(random_table(5, 2, seed + 9)),
                    Request(PROMPT, 8, sampling=sampling, seed=seed, logprobs=2, prompt_logprobs=2), policy=3)
    assert spec.tokens == plain.tokens and spec.logprobs == plain.logprobs and spec.stats.speculative_rounds > 0
    scored = generate(target, None, Request((*PROMPT, *plain.tokens), 0, prompt_logprobs=2))
    assert scored.tokens == [] and len(scored.prompt_logprobs) == len(PROMPT) + 8
    assert scored.prompt_logprobs[0] is None and all(isinstance(t, TokenLogprob) for t in scored.prompt_logprobs[1:])
    assert scored.prompt_logprobs[len(PROMPT):] == plain.logprobs
    assert spec.prompt_logprobs == scored.prompt_logprobs[: len(PROMPT)]
    assert [t.token for t in spec.prompt_logprobs[1:]] == list(PROMPT[1:]) and plain.prompt_logprobs == []


def test_a_one_token_prompt_has_one_null_logprob():
    run = generate(random_table(5, 2, 0), None, Request((3,), 2, prompt_logprobs=1))
    assert run.prompt_logprobs == [None] and len(run.tokens) == 2
