"""The draft-model proposer: its incremental drafts equal a full recomputation, and its cache
follows the emitted prefix after every kind of round (rejections, repairs, bonus tokens)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest
import torch

from verispec.models.tables import TableLM, random_table
from verispec.proposers import DraftModel
from verispec.randomness import TorchRandom
from verispec.sampling import GREEDY, SamplingParams, penalised, probabilities


class Recording:
    """A CausalLM that delegates to a table and keeps the list of tokens it processed."""

    def __init__(self, model: TableLM) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.processed: list[int] = []

    @property
    def length(self) -> int:
        assert self.model.length == len(self.processed)
        return self.model.length

    def reset(self) -> None:
        self.processed = []
        self.model.reset()

    def prefill(self, ids: Sequence[int]) -> None:
        self.processed = list(ids)
        self.model.prefill(ids)

    def extend(self, tokens: Sequence[int], keep: int | None = None) -> torch.Tensor:
        assert len(tokens) >= 1, "extend needs at least one token"
        self.processed += tokens
        return self.model.extend(tokens, keep)

    def rollback(self, length: int) -> None:
        del self.processed[length:]
        self.model.rollback(length)

    def score(self, ids: Sequence[int]) -> torch.Tensor:
        return self.model.score(ids)


def test_greedy_drafts_the_argmax_chain():
    table = random_table(4, 2, seed=3)
    proposer = DraftModel(table)
    proposer.begin([0, 1], GREEDY)
    draft = proposer.propose([0, 1], 4, TorchRandom(0))
    assert draft.q is None
    context = [0, 1]
    for token in draft.tokens:
        assert token == int(table.score(context)[-1].argmax())
        context.append(token)


def test_sampled_drafts_carry_q_after_the_transforms():
    table = random_table(5, 2, seed=4, denominator=1000, zeros=False)  # rows without ties
    sampling = SamplingParams(temperature=0.8, top_k=3)
    proposer = DraftModel(table)
    proposer.begin([2], sampling)
    draft = proposer.propose([2], 3, TorchRandom(5))
    assert draft.q.dtype == torch.float64 and draft.q.shape == (3, 5)
    context = [2]
    for token, q in zip(draft.tokens, draft.q):
        assert torch.equal(q, probabilities(table.score(context)[-1:], sampling)[0])
        assert q[token] > 0 and int((q > 0).sum()) == 3  # top-k 3 was applied to q
        context.append(token)


def emitted_after(draft_tokens: tuple[int, ...], vocab: int, rng: random.Random) -> list[int]:
    """A plausible round outcome: an accepted prefix, then a repair or bonus token. The repair
    may equal the rejected draft token (block verification can emit it)."""
    n = rng.randint(0, len(draft_tokens))
    return [*draft_tokens[:n], rng.randrange(vocab)]


@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(), SamplingParams(temperature=1.5, top_p=0.9)])
@pytest.mark.parametrize("seed", range(6))
def test_cache_follows_the_emitted_prefix(sampling, seed):
    vocab = 4
    model = Recording(random_table(vocab, 2, seed=seed))
    proposer = DraftModel(model)
    rng = random.Random(seed)
    for request in range(2):  # a second request on the same object starts clean
        context = [rng.randrange(vocab) for _ in range(rng.randint(1, 4))]
        proposer.begin(context, sampling)
        assert model.length == 0
        for _ in range(15):
            k = rng.randint(1, 4)
            expected = proposer.propose_stateless(context, k, TorchRandom(seed * 100 + len(context)))
            draft = proposer.propose(context, k, TorchRandom(seed * 100 + len(context)))
            assert draft.tokens == expected.tokens
            assert (draft.q is None) == (expected.q is None) == sampling.greedy
            if draft.q is not None:
                assert torch.equal(draft.q, expected.q)
            # The cache holds the context and all but the last drafted token.
            assert model.processed == [*context, *draft.tokens[:-1]]
            context += emitted_after(draft.tokens, vocab, rng)
            proposer.commit(context)
            assert model.processed == context[: len(model.processed)]
            assert model.length == len(model.processed)


def test_the_drafts_q_carries_the_repetition_penalty_of_its_own_context():
    """q of each drafted token is the draft's row after the context and the tokens drafted
    before it, penalised as the target's rows are."""
    table = random_table(5, 1, seed=3, zeros=False)
    sampling = SamplingParams(repetition_penalty=2.0)
    draft = DraftModel(table)
    draft.begin([1, 2], sampling)
    proposed = draft.propose([1, 2], 2, TorchRandom(0))
    context = [1, 2, proposed.tokens[0]]
    row = table.score(context)[-1:]
    assert torch.equal(proposed.q[1], probabilities(penalised(row, sampling, context, [()], 0, ()), sampling)[0])
    assert not torch.equal(proposed.q[1], probabilities(row, sampling)[0])
