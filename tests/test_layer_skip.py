"""LayerSkip on a tiny random Llama built in code: its own cache follows any extend/rollback
history, at full depth it is the target, the pruned head keeps q a distribution over the whole
vocabulary, and decoding with it equals the full-recompute reference and plain greedy.

Cached and uncached forwards sum attention in different orders, so logits agree up to float32
rounding (ATOL on logits of magnitude ~3). Engine and reference draw from the same random
stream; a float32-sized difference in p or q could flip a draw only if the uniform landed
within ~1e-6 of a threshold, so a false failure has probability well under 1e-4 here.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec import GREEDY, SamplingParams, TorchRandom, generate
from verispec.models.runtimes.hf import HFCausalLM
from verispec.proposers.layer_skip import LayerSkip, PrunedHead, frequent_tokens, truncated_model
from verispec.reference import reference_generate
from verispec.sampling import probabilities

ATOL = 1e-4
VOCAB = 96
LAYERS = 4


@pytest.fixture(scope="module")
def target() -> HFCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=0.2,  # spread logits: argmax gaps dwarf float32 rounding
        tie_word_embeddings=True,
    )
    return HFCausalLM(LlamaForCausalLM(config))


@pytest.mark.parametrize(("layers", "head_tokens"), [(1, None), (2, 40), (3, [5, 1, 77, 60])])
def test_random_histories_match_fresh_recomputation(target, layers, head_tokens):
    draft = LayerSkip(target, layers, head_tokens).model
    assert len(draft.cache.layers) == layers and draft.cache is not target.cache
    rng = random.Random(layers)
    context = [rng.randrange(VOCAB) for _ in range(5)]
    draft.prefill(context)
    target.prefill([7, 8, 9])
    for _ in range(30):
        if rng.random() < 0.5:
            keep = rng.randint(max(1, len(context) - 6), len(context))
            draft.rollback(keep)
            del context[keep:]
        tokens = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 5))]
        logits = draft.extend(tokens)  # [n, V]
        context += tokens
        assert draft.length == len(context)
        fresh = draft.score(context)[-len(tokens):]
        assert torch.equal(logits.isinf(), fresh.isinf())
        assert torch.allclose(logits, fresh, atol=ATOL)
    assert target.length == 3  # the target's cache was never touched


def test_at_full_depth_without_pruning_it_is_the_target(target):
    draft = LayerSkip(target, LAYERS).model
    ids = [3, 14, 15, 92, 65, 35]
    assert torch.equal(draft.score(ids), target.score(ids))
    draft.prefill(ids[:2])
    target.prefill(ids[:2])
    assert torch.equal(draft.extend(ids[2:]), target.extend(ids[2:]))


def test_views_share_the_targets_weights(target):
    view = truncated_model(target.model, 2)
    assert len(view.model.layers) == 2 and len(target.model.model.layers) == LAYERS
    assert view.model.layers[1] is target.model.model.layers[1]
    assert view.model.embed_tokens is target.model.model.embed_tokens
    assert view.lm_head is target.model.lm_head


def test_pruned_head_keeps_the_full_heads_logits_on_its_tokens_and_q_exact_elsewhere(target):
    keep = torch.tensor([2, 9, 40, 41, 90])
    full = LayerSkip(target, 2).model.score([4, 5, 6])  # [3, V]
    pruned = LayerSkip(target, 2, keep).model.score([4, 5, 6])
    assert torch.allclose(pruned[:, keep], full[:, keep], atol=ATOL)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[keep] = False
    assert bool(pruned[:, outside].isneginf().all())
    q = probabilities(pruned, SamplingParams(temperature=0.9))  # [3, V]
    assert q.shape == (3, VOCAB)
    assert bool((q[:, outside] == 0).all()) and torch.allclose(q.sum(-1), torch.ones(3, dtype=torch.float64))
    assert PrunedHead(target.model.lm_head, keep).weight.shape == (VOCAB, 32)


def test_frequent_tokens_ranks_by_count_then_id():
    assert frequent_tokens([[5, 3, 5], [3, 5, 7]], 2, 8).tolist() == [3, 5]
    assert frequent_tokens([[6, 6]], 3, 8).tolist() == [0, 1, 6]
    with pytest.raises(ValueError, match="outside the vocabulary"):
        frequent_tokens([[8]], 2, 8)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"layers": 0}, "1 <= layers <= 4"),
        ({"layers": 5}, "the target has 4 layers"),
        ({"layers": 2, "head_tokens": 0}, "1 <= N <= 96"),
        ({"layers": 2, "head_tokens": [3, 3]}, "distinct"),
        ({"layers": 2, "head_tokens": [96]}, "outside the vocabulary"),
        ({"layers": 2, "head_tokens": []}, "at least one"),
    ],
)
def test_bad_options_are_refused(target, options, message):
    with pytest.raises(ValueError, match=message):
        LayerSkip(target, **options)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("sampling", [GREEDY, SamplingParams(temperature=1.0)])
@pytest.mark.parametrize(("layers", "head_tokens"), [(2, None), (1, 48)])
def test_engine_equals_reference(target, seed, sampling, layers, head_tokens):
    corpus = [list(range(0, VOCAB, 2))]
    prompt = [1, 17, 33, 49, 65]
    options = dict(max_new_tokens=16, sampling=sampling, k=3)
    engine = generate(target, LayerSkip(target, layers, head_tokens, corpus), prompt, rng=TorchRandom(seed), **options)
    fresh = LayerSkip(target, layers, head_tokens, corpus)
    reference = reference_generate(target, fresh, prompt, rng=TorchRandom(seed), **options)
    assert engine.tokens == reference


@pytest.mark.parametrize("head_tokens", [None, 32])
def test_greedy_speculative_equals_greedy_plain(target, head_tokens):
    prompt = [4, 8, 15, 16, 23, 42]
    plain = generate(target, None, prompt, max_new_tokens=24, sampling=GREEDY, k=0)
    fast = generate(target, LayerSkip(target, 3, head_tokens), prompt, max_new_tokens=24, sampling=GREEDY, k=4)
    assert fast.tokens == plain.tokens
    assert sum(fast.stats.accepted) > 0


@pytest.fixture
def one_thread():
    # On a busy 2-core machine two torch threads wait on each other (measured 5-15x slower).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_on_the_default_model_greedy_speculative_equals_greedy_plain(one_thread):
    from verispec import load_model

    loaded = load_model("smollm2-135m-instruct", dtype="float32")
    prompt = loaded.encode("List three primary colours.")
    proposer = LayerSkip(loaded.lm, 2, 8192, corpus=[prompt])
    assert len(proposer.model.layers) == 2 and proposer.head_tokens.numel() == 8192  # on the fast runtime
    options = dict(max_new_tokens=16, sampling=GREEDY, eos_token_id=loaded.eos_token_id)
    plain = generate(loaded.lm, None, prompt, k=0, **options)
    fast = generate(loaded.lm, proposer, prompt, k=3, **options)
    assert fast.tokens == plain.tokens
    assert sum(fast.stats.drafted) > 0
